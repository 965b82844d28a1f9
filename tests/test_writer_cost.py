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
