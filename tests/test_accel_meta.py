"""The C fast path's tensor and group reads through torch's C++ API (issue 20;
commtrace/capture/_accel_meta.cpp, built by `commtrace accel build`): a real 2-rank gloo job
records the same rows with them, without them (COMMTRACE_ACCEL_META=0: torch's Python-level
accessors called from C), and on the pure Python path (COMMTRACE_PURE_PYTHON=1)."""

import json
import os
import re

import pytest

from conftest import SCRIPTS, launch_cmd, run_path, run_traced

# times, ids and threads differ between any two runs; so does how an async op's completion
# was seen (its callback on gloo's thread, or its wait() first)
VOLATILE = {"t_enqueue_ns", "t_return_ns", "t_end_ns", "t_wait_ns", "t_wait_end_ns",
            "t_start_ns", "op_id", "thread", "site", "detail", "completion"}


def _rows(out):
    import pyarrow.dataset as ds

    rows = ds.dataset(run_path(out), partitioning="hive").to_table().to_pylist()
    keep = []
    for r in rows:
        r = {k: v for k, v in r.items() if k not in VOLATILE}
        keep.append(r)
    return sorted(keep, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def _unequal(a, b) -> str:
    """The rows only one side has (pytest shows only the first differing index of a long
    list): what a failure must show to be understood."""
    import collections

    ca = collections.Counter(json.dumps(r, sort_keys=True, default=str) for r in a)
    cb = collections.Counter(json.dumps(r, sort_keys=True, default=str) for r in b)
    return ("only left:\n" + "\n".join(ca - cb) + "\nonly right:\n" + "\n".join(cb - ca))


MODES = {"cxx": {}, "accessors": {"COMMTRACE_ACCEL_META": "0"},
         "pure": {"COMMTRACE_PURE_PYTHON": "1"}}


def _run(tmp_path_factory, accel_cache, mode):
    """The job under `commtrace run` in `mode`: (its rows less the volatile fields, {rank:
    (meta on, tensor reads, seq reads, C calls)}, {rank: async completions attached in C++},
    its async op rows whole)."""
    d = tmp_path_factory.mktemp(f"accel-meta-{mode}") / "run"
    # the light launcher (tests/launch_ranks.py): the accel module under `commtrace run --
    # torchrun` is test_ddp_hook's recording-group job
    p = run_traced(d, launch_cmd(os.path.join(SCRIPTS, "accel_meta_equal.py")),
                   env={"COMMTRACE_CACHE_DIR": accel_cache, **MODES[mode]}, timeout=240)
    stats = {int(m[0]): tuple(map(int, m[1:]))
             for m in re.findall(r"ACCELMETA (\d) (\d+) (\d+) (\d+) (\d+)", p.stdout)}
    assert sorted(stats) == [0, 1], p.stdout[-2000:]
    attach = {int(r): int(n) for r, n in re.findall(r"ACCELATTACH (\d) (\d+)", p.stdout)}
    import pyarrow.dataset as ds

    raw = [r for r in ds.dataset(run_path(d), partitioning="hive").to_table().to_pylist()
           if r["kind"] == "op" and r["async_op"]]
    return _rows(d), stats, attach, raw


@pytest.fixture(scope="module")
def runs(tmp_path_factory, accel_cache):
    return {mode: _run(tmp_path_factory, accel_cache, mode) for mode in ("cxx", "accessors")}


def test_the_cxx_reads_are_used(runs):
    for rank, (on, t_reads, s_reads, n_c) in runs["cxx"][1].items():
        assert on == 1 and n_c > 30
        assert t_reads > 30 and s_reads > 30, runs["cxx"][1]
    for rank, (on, t_reads, s_reads, n_c) in runs["accessors"][1].items():
        assert (on, t_reads, s_reads) == (0, 0, 0) and n_c > 30


def test_async_completion_through_the_cxx_callback(runs):
    # Collectives with a future (all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
    # async) complete through the module's C++ callback, with no Python on gloo's thread; the
    # accessors' run attaches Python callbacks. Either way every async row has its end, seen
    # no later than its wait() returned, and after the call was issued.
    assert runs["cxx"][2] == {0: runs["cxx"][2][0], 1: runs["cxx"][2][1]}
    assert min(runs["cxx"][2].values()) >= 6, runs["cxx"][2]
    assert runs["accessors"][2] == {0: 0, 1: 0}
    for mode in ("cxx", "accessors"):
        raw = runs[mode][3]
        assert len(raw) > 20
        for r in raw:
            assert r["t_end_ns"] is not None and r["completion"] in (
                "callback", "observed", "wait"), r
            assert r["t_end_ns"] >= r["t_enqueue_ns"], r
            if r["t_wait_end_ns"] is not None:
                assert r["t_end_ns"] <= r["t_wait_end_ns"], r


def test_rows_are_the_same_with_and_without_the_cxx_reads(runs):
    rows = runs["cxx"][0]
    ops = [r for r in rows if r["kind"] == "op"]
    assert len(ops) > 100
    # what the job covers made it into the rows
    assert {"float32", "bfloat16", "int64", "int32", "float64"} <= {r["dtype"] for r in ops}
    assert any(r["count"] == 0 for r in ops)
    assert any(r["error"] for r in ops)
    assert any(r["count"] == 6 and r["op"] == "all_reduce" for r in ops)   # x.t(), x[:, 1]
    assert {"send", "recv", "isend", "irecv", "batch_isend_irecv", "all_gather",
            "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"} <= \
        {r["api"] for r in ops}
    assert any(r["async_op"] and r["api"] == "all_reduce" for r in ops)
    assert sum(r["kind"] == "gap" for r in rows) >= 2 * 2
    assert rows == runs["accessors"][0], _unequal(rows, runs["accessors"][0])


@pytest.mark.slow  # issue 14: main suite within 8 minutes; CI's slow stage runs it
def test_rows_are_the_same_on_the_pure_python_path(runs, tmp_path_factory, accel_cache):
    rows, stats, _, _ = _run(tmp_path_factory, accel_cache, "pure")
    for rank, (on, t_reads, s_reads, n_c) in stats.items():
        assert (on, t_reads, s_reads, n_c) == (0, 0, 0, 0)
    assert rows == runs["cxx"][0], _unequal(rows, runs["cxx"][0])
