"""The writer off the training cores (issue 20): the writer thread runs at a lower priority
(per-thread nice, Linux), and the Arrow arrays built from buffers by the lean writer's fast
routes equal pyarrow's own conversion, for every type and null pattern the recorder hands it."""

from __future__ import annotations

import os
import random
import sys
import threading
import time

import pyarrow as pa
import pytest

from commtrace.capture import recorder as R
from commtrace.config import Config
from commtrace.format import writer as W

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")


def _writer_nice(rec, expect) -> int:
    """The writer thread's nice value once it equals `expect` (it sets it when it starts), or
    after 30 s."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = rec._thread
        if t is not None and t.native_id is not None:
            n = os.getpriority(os.PRIO_PROCESS, t.native_id)
            if n == expect:
                return n
        time.sleep(0.01)
    return os.getpriority(os.PRIO_PROCESS, rec._thread.native_id)


@linux
@pytest.mark.parametrize("nice", [10, 0])
def test_writer_thread_runs_at_a_lower_priority(tmp_path, nice):
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    rec = R.Recorder(Config(output=str(tmp_path), writer_nice=nice), rank=0, world_size=1)
    try:
        if nice == 0:
            rec.flush()  # the writer thread has started (a part of nothing): still unchanged
            time.sleep(0.3)
        assert _writer_nice(rec, min(19, mine + nice)) == min(19, mine + nice)
        # only the writer thread: this (the training) thread keeps its priority
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
    finally:
        rec.close()


def test_writer_nice_travels_in_the_environment():
    assert Config().writer_nice == 10
    env = Config(writer_nice=3).to_env()
    assert env["COMMTRACE_WRITER_NICE"] == "3" and Config.from_env(env).writer_nice == 3


_GEN = {
    pa.int64(): lambda r: r.choice([None, 0, 3, -5, 2 ** 40]),
    pa.int32(): lambda r: r.choice([None, 1, 7]),
    pa.bool_(): lambda r: r.choice([None, True, False]),
    pa.string(): lambda r: r.choice([None, "a", "h\u00e9llo", "", "x" * 10, "f.py:12"]),
    pa.list_(pa.int64()): lambda r: r.choice([None, [], [1, 2], [5]]),
}


@pytest.mark.parametrize("typ", list(_GEN), ids=str)
def test_arrays_from_buffers_equal_pyarrows_conversion(typ):
    rng = random.Random(20)
    for n in (0, 1, 7, 8, 9, 63, 64, 65, 200, 1000):
        for mode in ("mixed", "no nulls", "all null"):
            vals = [_GEN[typ](rng) for _ in range(n)]
            if mode == "no nulls":
                vals = [v for v in vals if v is not None]
            elif mode == "all null":
                vals = [None] * n
            got = W.array_from_list(list(vals), typ)
            got.validate(full=True)
            assert got.type == typ and got.to_pylist() == vals, (n, mode)
            assert got.null_count == vals.count(None)


def test_arrays_from_buffers_odd_values():
    # bools in an int column, many distinct strings (encoded one by one), non-str values
    assert W.array_from_list([True, 2, None], pa.int64()).to_pylist() == [1, 2, None]
    u = [f"site{i}" for i in range(300)]
    assert W.array_from_list(u, pa.string()).to_pylist() == u
    assert W.array_from_list([1, None] * 40, pa.string()).to_pylist() == ["1", None] * 40


class _Work:
    """A stand-in for a Work object with a future (weakly referenced by its pending op)."""

    def is_completed(self):
        return True


@pytest.mark.skipif(R._service_pass is None, reason="the C fast path is not built here")
def test_service_in_c_releases_what_the_python_loop_releases(tmp_path, monkeypatch):
    """The writer's service (Recorder._service) decides in C (``_fastpath.service_pass``) for the
    ops whose end is known: each case below ends the same with SERVICE_C on and off (released
    rows, ops still pending, their t_done_seen)."""
    from commtrace.capture import wrappers as Wr

    was_on = R._cfast.async_counts()[0]
    Wr._set_async()
    if not R._cfast.async_counts()[0]:
        pytest.skip("the C async path is off here")
    try:
        outcomes = {}
        for c in (True, False):
            monkeypatch.setattr(R, "SERVICE_C", c)
            rec = R.Recorder(Config(output=str(tmp_path / str(c))), 0, 1, start_thread=False)
            keep = []   # Works kept alive during the service
            hold = int(R.HOLD_FLUSHES * rec.config.flush_interval * 1e9)
            now = rec.now_ns()

            def op(op_id, t_end, alive, waited=False, t_done=None, token=None, future=True):
                row = [None] * R.NCOL
                row[R.I_KIND], row[R.I_OP], row[R.I_BACKEND] = "op", "all_reduce", "gloo"
                row[R.I_OP_ID], row[R.I_T_END] = op_id, t_end
                w = _Work()
                if alive:
                    keep.append(w)
                p = rec.add_pending(row, key_obj=w, work=w, has_future=future,
                                    device_token=token)
                p.waited, p.t_done_seen = waited, t_done
                return p

            op(1, now, alive=False)                      # done, Work gone: released
            op(2, now, alive=True)                       # done, Work held: stays, seen now
            op(3, now, alive=True, waited=True)          # done and waited: released
            op(4, now, alive=True, t_done=now - hold)    # done for HOLD_FLUSHES: released
            op(5, now, alive=True, t_done=now - 5)       # done lately: stays
            op(6, None, alive=True)                      # in flight: stays
            op(7, None, alive=False)                     # in flight, Work gone: stays (future)
            op(8, now, alive=False, token=object())      # device token: the Python loop's
            row = [None] * R.NCOL
            row[R.I_KIND], row[R.I_OP_ID] = "op", 9
            rec.add_pending_tensors(row, [])             # no Work at all, in flight: stays
            rec._service(final=False)
            outcomes[c] = (sorted(r[R.I_OP_ID] for r in rec._ready),
                           {i: (p.t_done_seen is not None, p.t_done_seen == now - 5)
                            for i, p in rec._pending.items()},
                           sorted(rec._by_key.values(), key=id) == sorted(
                               rec._pending.values(), key=id))
            keep.clear()
        assert outcomes[True] == outcomes[False]
        released, pending, _ = outcomes[True]
        assert released == [1, 3, 4, 8]
        assert set(pending) == {2, 5, 6, 7, 9}
        assert pending[2] == (True, False) and pending[5] == (True, True)
        assert pending[6] == (False, False)
        # and the C pass decided them itself: only the ops it leaves come back to Python
        rec = R.Recorder(Config(output=str(tmp_path / "direct")), 0, 1, start_thread=False)
        kept = []
        for i, t_end in enumerate((5, 5, None)):
            row = [None] * R.NCOL
            row[R.I_KIND], row[R.I_OP_ID], row[R.I_T_END] = "op", i, t_end
            kept.append(rec.add_pending(row, key_obj=_Work(), work=_Work(), has_future=True))
        left = R._service_pass(rec, list(rec._pending.values()), 10, 100)
        assert [p.op_id for p in left] == [2]
        assert [r[R.I_OP_ID] for r in rec._ready] == [0, 1] and list(rec._pending) == [2]
    finally:
        if not was_on:
            R._cfast.async_off()


@pytest.mark.slow
@pytest.mark.skipif(R._cfast is None or not hasattr(R._cfast, "stamp_release"),
                    reason="the C fast path is not built here")
@pytest.mark.parametrize("hazards", ["basic", "full"])
def test_ddp_bucket_ops_released_at_their_stamp_write_the_same_rows(tmp_path, hazards):
    """A DDP bucket's op recorded by the C++ hook or recording group is released when its
    completion stamp is written on the training thread, where its Work is gone (session 17):
    with the writer's service held off, only the last step's buckets (whose stamps the next
    step writes) and a few more stay pending with ``stamp_release`` on (hazards' basic mode takes a late
    "nothing pending"; in full mode a release that would tell its listener is the service's),
    all stay pending with it off; a service then leaves nothing in either, and both phases
    write the same rows."""
    import json

    from conftest import ROOT, load_rows, run_plain, torchrun_cmd

    out = tmp_path / "job"
    run_plain(torchrun_cmd(os.path.join(ROOT, "tests", "scripts", "ddp_stamp_release.py"), out,
                           hazards), timeout=240)
    rows = load_rows(str(out) + ".trace")
    for rank in (0, 1):
        res = json.loads((tmp_path / f"job.rank{rank}").read_text())
        on, off = res["phases"]["on"], res["phases"]["off"]
        assert on["left"] == 0 and off["left"] == 0   # a service releases the rest, as before
        n = len(off["pending"])
        assert off["queued"] == 0 and n >= 6 and {tuple(p) for p in off["pending"]} == {("all_reduce", "ddp_comm_hook")}
        if res["cxx"]:   # the stamps are the C++ hook's (commtrace accel build)
            # the last step's buckets wait for the next step to write their stamps (and a
            # bucket still running when the next one was issued, for DDP's own wait)
            assert on["queued"] + len(on["pending"]) == n
            assert len(on["pending"]) <= n // 2 if hazards == "basic" else on["queued"] > 0
        ddp = sorted((r for r in rows if r["rank"] == rank and r["kind"] == "op"
                      and r["api"] == "ddp_comm_hook"), key=lambda r: r["op_id"])[-2 * n:]

        def same(r):
            return (r["op"], r["pg"], r["count"], r["bytes"], r["dtype"], r["detail"],
                    r["async_op"], r["t_end_ns"] is not None, r["t_end_ns"] >= r["t_return_ns"])

        assert [same(r) for r in ddp[:n]] == [same(r) for r in ddp[n:]]
        # ("observed": a bucket already done when its continuation was attached, either way)
        assert {r["completion"] for r in ddp} <= {"callback", "observed"}
        seqs = [r["seq"] for r in ddp]
        assert seqs == sorted(set(seqs))   # each bucket once (the barriers between take seqs too)


_RT_CHILD = r"""
import os, sys, threading, time
from commtrace.capture import recorder as R
from commtrace.config import Config
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except OSError:
    print("not permitted"); sys.exit(0)
nice = int(sys.argv[2])
rec = R.Recorder(Config(output=sys.argv[1], writer_nice=nice), rank=0, world_size=1)
rec.flush()
t = rec._thread
deadline = time.monotonic() + 30
want = os.SCHED_OTHER if nice else os.SCHED_FIFO
while time.monotonic() < deadline and (t.native_id is None or os.sched_getscheduler(t.native_id) != want):
    time.sleep(0.01)
time.sleep(0.2)
print(os.sched_getscheduler(t.native_id), os.getpriority(os.PRIO_PROCESS, t.native_id),
      os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
rec.close()
"""


@linux
@pytest.mark.parametrize("nice", [10, 0])
def test_writer_thread_leaves_a_real_time_policy(tmp_path, nice):
    """A rank run under SCHED_FIFO (`chrt -f`): nice values mean nothing there, so the writer
    thread first leaves the real-time policy for SCHED_OTHER, then lowers its nice; the
    training thread keeps SCHED_FIFO. With writer_nice 0 the writer keeps the rank's policy."""
    import subprocess

    p = subprocess.run([sys.executable, "-c", _RT_CHILD, str(tmp_path), str(nice)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    if p.stdout.strip() == "not permitted":
        pytest.skip("SCHED_FIFO not permitted here (CAP_SYS_NICE)")
    w_pol, w_nice, m_pol, m_nice = map(int, p.stdout.split())
    assert m_pol == os.SCHED_FIFO
    if nice:
        assert w_pol == os.SCHED_OTHER and w_nice == min(19, m_nice + nice)
    else:
        assert w_pol == os.SCHED_FIFO and w_nice == m_nice
