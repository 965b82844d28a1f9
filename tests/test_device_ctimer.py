"""The device timer in C (commtrace/capture/_devtimer.c) against the Python EventTimer.

Every test of the fake layer (tests/test_device_fake.py) runs here again with the C timer in
place of EventTimer: the same exact times, counters, pool and calibration choices. The C timer
is what `commtrace run` uses on CUDA (device.get_device_timer); the Python one stays for
COMMTRACE_PURE_PYTHON=1 and where the module is not built.
"""

from __future__ import annotations

import random

import pytest

from commtrace.capture import device as D

pytestmark = pytest.mark.skipif(D.FakeCTimer is None, reason="_devtimer not built")

# the fake-layer tests, collected again in this module with the C timer (autouse fixture below)
from tests.test_device_fake import *  # noqa: F401,F403,E402
from tests.test_device_fake import OFF, T0  # noqa: E402


@pytest.fixture(autouse=True)
def _c_timer(monkeypatch):
    monkeypatch.setattr(D, "FakeTimer", D.FakeCTimer)


def _scenario(timer_cls, seed, n=300):
    """A random mix of blocking ops, async ops waited or not, completions in callbacks, stream
    waits, abandoned calls, drift and polls: the rows each timer reads back, in order."""
    rnd = random.Random(seed)
    clock = D.FakeClock(T0)
    dev = D.FakeDevice(clock, offset_ns=OFF, launch_latency_ns=rnd.choice([0, 1_500]))
    t = timer_cls(dev, calibration_interval_s=0.002, done_grace_s=0.0005,
                  unwaited_timeout_s=0.004, max_pending=40)
    comm = D.FakeStream(dev, "comm")
    out, live = [], []
    for op in range(n):
        r = rnd.random()
        if r < 0.4:
            tok = t.on_issue(op)
            dev.current.launch(rnd.randrange(1_000, 300_000))
            t.on_return(tok, True)
        elif r < 0.8:
            tok = t.on_issue(op)
            t.on_return(tok, False)
            if tok is not None:
                comm.wait_event(tok.start)
            comm.launch(rnd.randrange(1_000, 500_000))
            if rnd.random() < 0.3:
                t.on_done(tok)
            live.append(tok)
        elif r < 0.85:
            tok = t.on_issue(op)
            t.abandon(tok)
        if live and rnd.random() < 0.5:
            tok = live.pop(rnd.randrange(len(live)))
            dev.current.launch(rnd.randrange(0, 50_000))
            if rnd.random() < 0.8:
                t.on_wait_begin(tok)
            t.on_wait(tok)
        if rnd.random() < 0.05:
            dev.offset_ns += rnd.randrange(-2_000, 2_000)
        clock.advance(rnd.randrange(0, 200_000))
        if rnd.random() < 0.3:
            out.append(t.poll())
    for _ in range(20):
        clock.advance(1_000_000)
        out.append(t.poll())
    stats = t.stats()
    assert stats.pop("device_timer") == ("c" if isinstance(t, D.CEventTimer) else "python")
    return out, stats, t.pending(), t.pooled(), dev.events_created


@pytest.mark.parametrize("seed", range(8))
def test_c_timer_reads_back_what_the_python_timer_does(seed, monkeypatch):
    monkeypatch.undo()   # (the autouse fixture: the Python timer first)
    py = _scenario(D.FakeTimer, seed)
    c = _scenario(D.FakeCTimer, seed)
    rows = [r for batch in py[0] for r in batch]
    assert len(rows) > 100 and any(r[3] is not None for r in rows)   # (the mix ran)
    assert c == py


def test_c_timer_tokens_and_counters():
    clock = D.FakeClock(T0)
    dev = D.FakeDevice(clock, offset_ns=OFF)
    t = D.FakeCTimer(dev, calibration_interval_s=1000.0)
    tok = t.on_issue(5)
    assert (tok.op_id, tok.device, tok.blocking, tok.end, tok.calib) == (5, 0, None, None, None)
    dev.current.launch(10_000)
    t.on_return(tok, True)
    assert tok.blocking is True and tok.end_same and t.pending() == 1
    clock.advance(20_000)
    (row,) = t.poll()
    assert row[0] == 5 and row[2] - row[1] == 10_000 and row[3] is None
    assert t.pending() == 0 and t.stats()["events_created"] == 5   # 2 + 3 calibration tries
    assert t.on_return(None, True) is None and t.on_wait(object()) is None
    t.done_grace_ns = 0
    assert t.done_grace_ns == 0


def test_c_timer_api_choice_is_checked():
    with pytest.raises(ValueError, match="api must be 'driver' or 'runtime'"):
        D._cdt.Timer(None, (1,) * 8, print, print, None, 1, 1, 1, 1, None, "cudart")
    if D.CudaCTimer is not None:
        with pytest.raises(ValueError, match="COMMTRACE_DEVICE_TIMER_API"):
            D.CudaCTimer(api="cudart")
