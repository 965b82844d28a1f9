"""The analysis of traces a GPU user's run writes (tests/data/gpu_h200: recorded on an H200 by
scripts/gpu_check.py, NCCL at world size 1): device times on every CUDA op but object and
coalesced ones, DDP's bucket all-reduces timed through their futures, c++ rows from NCCL's
completion hook on the trace's clock, and the report's sections over them."""

from __future__ import annotations

import json
import os

import pyarrow.dataset as pads
import pytest

import commtrace
from commtrace.cli import main

DATA = os.path.join(os.path.dirname(__file__), "data", "gpu_h200")
OBJECT_APIS = {"all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"}


def _ops(name):
    rows = pads.dataset(os.path.join(DATA, name), format="parquet",
                        partitioning="hive").to_table().to_pylist()
    return [r for r in rows if r["kind"] == "op"]


def test_cuda_ops_carry_device_times_but_object_and_coalesced_ones():
    every = _ops("all_collectives")
    ops = [r for r in every if (r["device"] or "").startswith("cuda")]
    # the rest: barriers (no tensor of the user's)
    assert len(ops) == 39 and {r["op"] for r in every if r not in ops} == {"barrier"}
    host = [r for r in ops if r["api"] in OBJECT_APIS or "coalesced" in (r["detail"] or "")]
    dev = [r for r in ops if r not in host]
    assert len(host) == 6 and all(r["t_end_ns"] is not None and r["t_start_ns"] is None
                                  for r in host)
    assert len(dev) == 33
    for r in dev:
        assert r["completion"] == "device", r
        assert r["t_enqueue_ns"] <= r["t_start_ns"] <= r["t_end_ns"], r
    # async ops waited in Python: the exposed part of the wait measured on the device
    waited = [r for r in dev if r["async_op"]]
    assert len(waited) >= 15 and all(r["stream_wait_ns"] is not None for r in waited)
    # functional collectives: end recorded at wait_tensor, after the wait began
    fc = [r for r in dev if r["api"].startswith("funcol.")]
    assert len(fc) == 5 and all(r["t_wait_ns"] <= r["t_end_ns"] for r in fc)


def test_wait_immediately_counts_only_the_flight_after_the_return():
    """The first functional all_reduce held the host 4.1 s inside the call (torch's first
    funcol call) and was in flight 0.3 ms after it: only that could overlap with work."""
    run = commtrace.load(os.path.join(DATA, "all_collectives"))
    f = [f for f in run.findings() if f.kind == "wait_immediately"
         and f.site.endswith("all_collectives.py:134")]
    assert len(f) == 1, [(x.kind, x.site) for x in run.findings()]
    r = next(r for r in _ops("all_collectives") if r["api"] == "funcol.all_reduce")
    assert r["t_return_ns"] - r["t_enqueue_ns"] > 4e9
    assert f[0].evidence["inflight_ns"] == r["t_end_ns"] - r["t_return_ns"] < 1_000_000
    run.close()


def test_ddp_bucket_all_reduces_are_timed_through_their_futures():
    ops = _ops("ddp_accel")
    ddp = [r for r in ops if r["api"] == "ddp_comm_hook"]
    assert len(ddp) == 39
    # DDP's Reducer waits in C++: no wait through Python, the end from the future's callback
    assert all(r["completion"] == "device" and r["t_wait_ns"] is None for r in ddp)
    assert all(r["t_enqueue_ns"] <= r["t_start_ns"] < r["t_end_ns"] for r in ddp)


def test_completion_hook_rows_sit_between_the_wrapped_ops_around_them():
    ops = sorted(_ops("hook"), key=lambda r: r["torch_seq"])
    assert [(r["api"] == "c++", r["torch_seq"]) for r in ops] == \
        [(False, k) for k in range(1, 7)] + [(True, k) for k in (7, 8, 9)] + [(False, 10)]
    lo, hi = ops[5]["t_enqueue_ns"], ops[9]["t_enqueue_ns"]
    for r in ops[6:9]:
        assert r["completion"] == "hook" and lo <= r["t_enqueue_ns"] <= r["t_end_ns"]
        assert r["t_enqueue_ns"] <= hi
        assert json.loads(r["detail"])["active_duration_ns"] > 0


@pytest.mark.parametrize("name", ["all_collectives", "ddp_accel", "hook"])
def test_report_json_over_gpu_traces(name, capsys):
    assert main(["report", os.path.join(DATA, name), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["world_size"] == 1
    # the replay of the unchanged trace reproduces it exactly (one rank, no waiting)
    assert abs(d["what_if"]["replay_error"]) < 0.02, d["what_if"]
