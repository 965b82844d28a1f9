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


def _fake_cuda_timer(**kw):
    """The C timer's CUDA backend (driver calls, poll with the GIL released) over a fake driver
    in C whose events complete 20 us after they are recorded."""
    return D.CEventTimer(fns=D._cdt._fake_driver(), get_device=lambda: 0,
                         raw_stream=lambda dev: 7, clock=None, **kw)


def test_c_timer_cuda_backend_under_threads():
    """A training thread issuing ops (blocking, async waited, abandoned) while a writer thread
    polls with the GIL released: every op not abandoned is read back once, with t_start <=
    t_end, and the events all come back to the pool."""
    import threading
    import time

    t = _fake_cuda_timer(calibration_interval_s=0.01)
    n = 6000
    rows, issued, abandoned = {}, set(), set()
    done = threading.Event()
    errors = []

    def writer():
        try:
            while not done.is_set() or t.pending():
                for r in t.poll():
                    assert r[0] not in rows
                    rows[r[0]] = r
                time.sleep(0.0002)
        except BaseException as e:   # (reported below)
            errors.append(e)

    w = threading.Thread(target=writer)
    w.start()
    most = 0   # the most ops in flight at once
    try:
        for i in range(n):
            tok = t.on_issue(i)
            assert tok is not None
            if i % 7 == 3:
                t.abandon(tok)
                abandoned.add(i)
                continue
            issued.add(i)
            if i % 3 == 0:
                t.on_return(tok, False)
                t.on_wait_begin(tok)
                t.on_wait(tok)
            else:
                t.on_return(tok, True)
            most = max(most, t.pending())
            if i % 50 == 49:
                time.sleep(0.001)   # (a step's compute: the writer reads back meanwhile)
    finally:
        done.set()
        w.join(30)
    assert not w.is_alive() and not errors
    assert set(rows) == issued and not (set(rows) & abandoned)
    for op_id, t0, t1, sw in rows.values():
        assert t0 is not None and t1 is not None and 0 <= t1 - t0 < 1_000_000_000
        assert (sw is not None) == (op_id % 3 == 0) and (sw is None or sw >= 0)
    st = t.stats()
    assert st["errors"] == 0 and st["device_timer"] == "c" and st["calibrations"] >= 1
    assert t.pending() == 0 and t.pooled() == st["events_created"] - 1   # the latest calibration
    # reused: bounded by the ops in flight at once (at most three events each), plus the
    # calibrations' tries, not one pair per op
    assert st["events_created"] <= 3 * (most + 1) + 3 * st["calibrations"] + 5
    assert most < n


def test_c_timer_cuda_backend_maps_through_the_host_clock():
    """One blocking op on the fake driver: its device times land inside the host window of the
    call (the calibration maps the device clock, CLOCK_MONOTONIC here, onto CLOCK_REALTIME)."""
    import time

    t = _fake_cuda_timer()
    h0 = time.time_ns()
    tok = t.on_issue(1)
    t.on_return(tok, True)
    h1 = time.time_ns()
    rows = []
    deadline = time.monotonic() + 5
    while not rows and time.monotonic() < deadline:
        rows = t.poll()
        time.sleep(0.001)
    ((op, t0, t1, sw),) = rows
    assert op == 1 and sw is None
    # within the host window but for the calibration's error: at most half its host bracket
    # (its event's device time is taken as the bracket's midpoint), however loaded the machine
    ((_, _, _, _, bracket, latest),) = t.calibrations()
    assert latest and h0 - bracket <= t0 <= t1 <= h1 + bracket
