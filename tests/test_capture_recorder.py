"""Recorder internals: in-flight snapshot of blocking calls, buffer-full drops, write failures
that never raise, never-completing ops written with t_end_ns null (issue 2, item 7)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import pyarrow.dataset as ds
import pytest

from commtrace.capture import recorder as R
from commtrace.capture import wrappers as Wr
from commtrace.capture.api_table import API_TABLE
from commtrace.config import Config
from commtrace.format import schema as S


def make_rec(tmp_path, **cfg):
    cfg.setdefault("flush_interval", 1000.0)
    return R.Recorder(Config(output=str(tmp_path), **cfg), rank=0, world_size=1,
                      backend="gloo", run_dir=str(tmp_path), start_thread=False)


def op_row(rec, op_id=None, t_end=None, **fields):
    row = [None] * R.NCOL
    row[R.I_KIND] = S.KIND_OP
    row[R.I_RANK] = rec.rank
    row[R.I_PG] = "0"
    row[R.I_SEQ] = 9
    row[R.I_OP] = "all_reduce"
    row[R.I_API] = "all_reduce"
    row[R.I_ASYNC] = False
    row[R.I_T_ENQ] = 1_000
    row[R.I_OP_ID] = rec.new_op_id() if op_id is None else op_id
    row[R.I_T_END] = t_end
    for k, v in fields.items():
        row[R.IDX[k]] = v
    return row


def rows_of(path):
    return ds.dataset(str(path), partitioning="hive").to_table().to_pylist()


def inflight(path, rank=0):
    with open(os.path.join(str(path), f"rank={rank}", S.INFLIGHT_NAME)) as f:
        return json.load(f)


def test_blocking_call_listed_in_snapshot_then_written_on_return(tmp_path):
    rec = make_rec(tmp_path)
    row = op_row(rec)
    rec.begin_blocking(row)
    rec.flush()
    snap = inflight(tmp_path)
    assert snap["final"] is False
    assert [(o["op_id"], o["seq"], o["op"], o["pending"]) for o in snap["ops"]] == \
        [(row[R.I_OP_ID], 9, "all_reduce", True)]
    assert "t_end_ns" not in snap["ops"][0]
    # the call returns: no longer in flight, written once with its completion
    assert rec.end_blocking(row) is True
    row[R.I_T_END] = 2_000
    rec.append_row(row)
    rec.close()
    assert inflight(tmp_path)["ops"] == []
    assert [(r["op_id"], r["t_end_ns"]) for r in rows_of(tmp_path)] == [(row[R.I_OP_ID], 2_000)]


def test_final_flush_writes_hung_blocking_call_once_with_null_end(tmp_path):
    rec = make_rec(tmp_path)
    row = op_row(rec)
    rec.begin_blocking(row)
    rec.close()                       # e.g. SIGTERM handled, or a flush from another thread
    rows = rows_of(tmp_path)
    assert [(r["op_id"], r["t_end_ns"], r["t_return_ns"]) for r in rows] == \
        [(row[R.I_OP_ID], None, None)]
    snap = inflight(tmp_path)
    assert snap["final"] is True and [o["op_id"] for o in snap["ops"]] == [row[R.I_OP_ID]]
    # the call returns later: the wrapper must not queue it a second time
    assert rec.end_blocking(row) is False


def test_never_completing_async_op_written_with_null_end(tmp_path):
    rec = make_rec(tmp_path)

    class Work:  # a Work without a future that never completes
        def is_completed(self):
            return False

    w = Work()
    row = op_row(rec, async_op=True, t_return_ns=1_500)
    rec.add_pending(row, key_obj=w, work=w, strong=True)
    rec._service(final=False)
    rec.flush()
    assert [o["op_id"] for o in inflight(tmp_path)["ops"]] == [row[R.I_OP_ID]]
    assert not os.path.exists(os.path.join(str(tmp_path), "rank=0")) or rows_of(tmp_path) == []
    rec.close()
    (r,) = rows_of(tmp_path)
    assert (r["op_id"], r["t_return_ns"], r["t_end_ns"], r["t_wait_ns"]) == \
        (row[R.I_OP_ID], 1_500, None, None)
    assert [o["op_id"] for o in inflight(tmp_path)["ops"]] == [row[R.I_OP_ID]]


def test_buffer_full_drops_are_counted_in_metadata(tmp_path):
    rec = make_rec(tmp_path, buffer_ops=1000)   # the minimum capacity
    for i in range(1_250):
        rec.append_row(op_row(rec, t_end=5))
    rec.close()
    assert len(rows_of(tmp_path)) == 1000
    (frag,) = ds.dataset(str(tmp_path), partitioning="hive").get_fragments()
    meta = json.loads(frag.physical_schema.metadata[S.META_JSON])
    assert meta["dropped_rows"] == 250


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.msgs = []

    def emit(self, record):
        self.msgs.append(record.getMessage())


def test_write_failure_logged_once_never_raised(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")           # a file where the run directory should be: makedirs fails
    out = blocker / "run"
    rec = R.Recorder(Config(output=str(out), flush_interval=1000.0), rank=0, world_size=1,
                     run_dir=str(out), start_thread=False)
    h = _Collect()
    logging.getLogger("commtrace").addHandler(h)
    try:
        _flush_three_times(rec)
    finally:
        logging.getLogger("commtrace").removeHandler(h)
    assert len([m for m in h.msgs if "cannot write trace" in m]) == 1, h.msgs
    assert rec._dropped == 30 and rec._write_failed


def _flush_three_times(rec):
    for _ in range(3):
        for _ in range(10):
            rec.append_row(op_row(rec, t_end=5))
        rec.flush()                   # must not raise
    rec.close()


# ------------------------------------------------------------------ through a real wrapper


@pytest.fixture
def gloo1():
    import torch.distributed as dist

    from conftest import free_port

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    Wr.install()
    try:
        yield dist
    finally:
        dist.destroy_process_group()
        Wr.reset_caches()


def test_wrapper_lists_the_blocking_collective_it_is_stuck_in(tmp_path, gloo1):
    import torch

    release = threading.Event()
    entered = threading.Event()

    def all_reduce(tensor, op=None, group=None, async_op=False):  # a peer that never joins
        entered.set()
        release.wait(10)

    w = Wr.make_wrapper("all_reduce", all_reduce, API_TABLE["all_reduce"])
    rec = make_rec(tmp_path)
    R._set_recorder(rec)
    try:
        th = threading.Thread(target=w, args=(torch.ones(4),))
        th.start()
        assert entered.wait(10)
        rec.flush()
        (o,) = inflight(tmp_path)["ops"]
        assert (o["op"], o["api"], o["seq"], o["async_op"], o["bytes"], o["pending"]) == \
            ("all_reduce", "all_reduce", 0, False, 16, True)
        assert "t_return_ns" not in o and o["t_enqueue_ns"] > 0
        release.set()
        th.join(10)
        rec.flush()
        assert inflight(tmp_path)["ops"] == []
        rec.close()
        (r,) = rows_of(tmp_path)
        assert r["op_id"] == o["op_id"] and r["t_end_ns"] == r["t_return_ns"] >= r["t_enqueue_ns"]
    finally:
        release.set()
        R._set_recorder(None)
        rec.close()


def test_pending_listener_lazy_idle_and_added_once(tmp_path):
    """Pending-op listeners (issue 20): told at once by default; with set_lazy_idle the >0 -> 0
    is owed and paid by the writer thread's next turn, and a 0 -> >0 while it is owed tells
    nothing (a loop of one async op and its wait() calls no listener per op). A listener
    added twice is called once (hazards re-installed on the same recorder)."""
    from commtrace.capture import hazards

    rec = make_rec(tmp_path)
    calls = []
    rec.add_pending_listener(calls.append)
    rec.add_pending_listener(calls.append)
    assert len(rec._listeners) == 1
    rec._release(rec.add_pending(op_row(rec)))
    assert calls == [1, 0]
    rec.set_lazy_idle(True)
    for _ in range(5):
        rec._release(rec.add_pending(op_row(rec)))
    assert calls == [1, 0, 1] and rec._idle_owed
    p = rec.add_pending(op_row(rec))  # the listener still holds "pending": nothing owed
    assert calls == [1, 0, 1] and not rec._idle_owed
    rec._service(final=False)
    assert calls == [1, 0, 1]
    rec._release(p)
    rec._service(final=False)         # the writer's turn pays the owed 0
    assert calls == [1, 0, 1, 0] and not rec._idle_owed
    rec._listeners.clear()
    try:
        for mode in ("basic", "off", "basic", "full", "basic"):
            hazards.install(rec, mode)      # "off" uninstalls
            assert rec._listeners == [hazards._on_pending]
            if mode != "off":
                assert rec.lazy_idle == (mode == "basic")
    finally:
        hazards.uninstall()
