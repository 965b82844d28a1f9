"""DDP's buckets recorded as C records (issue 20, session 30; _fastpath.c "DDP's buckets as C
records"): where the recording group issues a bucket, no Python row, in-flight entry or
pending op is made on the training thread; the writer builds the rows. The rows equal the
Python path's (tests/test_ddp_hook.py's equality jobs, which run this route by default and the
pending-op route with COMMTRACE_DDP_DIRECT=0); here, on real 2-rank gloo jobs, the guarantees
of the pending-op route: a bucket in flight is listed (``inflight_ids``, ``blocking_rows``,
the hang watchdog's ``hung_ops``, ``_inflight.json``) and not written before it completes; a
final flush writes it as never completed and its late completion touches nothing; the records
kept are bounded by ``buffer_ops``, the rest counted as dropped; a forked child drops its copy
of the parent's records; a bucket whose issue raises reaches the user's ``backward()`` with its
error and is written once as a raising call's row."""

from __future__ import annotations

import json
import os

import pytest

from commtrace.capture import wrappers as Wr
from conftest import ROOT, load_rows, run_plain, torchrun_cmd

pytestmark = pytest.mark.skipif(Wr._cfast is None or not hasattr(Wr._cfast, "ddp_direct"),
                                reason="the C fast path is not built here")

SCRIPT = os.path.join(ROOT, "tests", "scripts", "ddp_direct.py")


def _job(tmp_path, mode, accel_cache):
    out = tmp_path / "job"
    run_plain(torchrun_cmd(SCRIPT, out, mode), env={"COMMTRACE_CACHE_DIR": accel_cache},
              timeout=240)
    res = [json.loads((tmp_path / f"job.rank{r}").read_text()) for r in (0, 1)]
    return res, load_rows(str(out) + ".trace"), str(out) + ".trace"


def _ddp(rows, rank):
    return sorted((r for r in rows if r["rank"] == rank and r["kind"] == "op"
                   and r["api"] == "ddp_comm_hook"), key=lambda r: r["op_id"])


def test_bucket_in_flight_is_listed_then_written_once_completed(tmp_path, accel_cache):
    res, rows, _ = _job(tmp_path, "inflight", accel_cache)
    r0 = res[0]
    assert r0["kind"] == "group", r0
    n0 = r0["counts0"][0]
    # 4 steps of 2 buckets (1 in the first, before DDP rebuilds them), all written
    assert r0["per_step"] == 2 and n0 >= 7 and r0["counts0"][1] == n0, r0
    assert r0["counts0"][3] == 0, r0
    seen = r0["seen"]
    # rank 0 waited inside backward(): its first bucket (at least) in flight, listed everywhere
    ids = [x["op_id"] for x in seen["rows"]]
    assert ids and all(x["t_end"] is None and x["t_ret"] is not None for x in seen["rows"])
    assert set(ids) <= set(seen["ids"]) and set(ids) <= set(seen["hung"]), seen
    assert all(json.loads(x["detail"])["ddp_bucket"] in (0, 1, 2) for x in seen["rows"])
    assert seen["listed_after_service"] == len(ids)   # a service does not write them
    # the part written then lists them in _inflight.json
    assert set(seen["inflight_json"]) >= set(ids), seen
    # after the step: all completed and written, once, with their completion
    assert r0["listed_end"] == 0 and r0["after"][2] == 0, r0
    d = _ddp(rows, 0)
    assert len(d) == r0["end"][0] == r0["end"][1] == n0 + 2, (len(d), r0)
    assert len({x["op_id"] for x in d}) == len(d)
    by_id = {x["op_id"]: x for x in d}
    for i in ids:
        x = by_id[i]
        assert x["t_end_ns"] is not None and x["completion"] == "callback"
        # it waited for rank 1's sleep (>= 1 s after its issue)
        assert x["t_end_ns"] - x["t_enqueue_ns"] > 0.5e9, x
    seqs = [x["seq"] for x in d]
    assert seqs == sorted(seqs) and all(x["t_enqueue_ns"] <= x["t_return_ns"] <= x["t_end_ns"]
                                        for x in d)


def test_final_flush_writes_bucket_in_flight_as_never_completed(tmp_path, accel_cache):
    res, rows, _ = _job(tmp_path, "close", accel_cache)
    r0 = res[0]
    seen = r0["seen"]
    assert seen.get("closed") and seen["rows"], seen
    ids = {x["op_id"] for x in seen["rows"]}
    d = {x["op_id"]: x for x in _ddp(rows, 0)}
    for i in ids:   # written by the final flush, never completed (the late stamp changed nothing)
        assert d[i]["t_end_ns"] is None and d[i]["completion"] is None, d[i]
        assert d[i]["t_return_ns"] is not None
    # nothing listed or kept afterwards; rank 0 went on untraced (its step completed)
    assert r0["after"][3] == 0, r0


def test_records_bounded_by_buffer_ops(tmp_path, accel_cache):
    res, rows, _ = _job(tmp_path, "cap", accel_cache)
    for rank in (0, 1):
        r = res[rank]
        n0 = r["counts0"][0]
        held, after = r["held"], r["after"]
        assert r["per_step"] == 2, r
        issued = 700 * 2
        # with the service held off: 1000 records kept, the rest counted as dropped
        assert held[3] == 1000 and held[2] == issued - 1000, r
        assert held[0] == n0 + 1000
        assert r["dropped_rows"] >= issued - 1000
        # a forked child lists none of its parent's records; the parent still has them
        assert r["child_listed"] == 0 and r["parent_listed"] == 1000, r
        # the service then wrote the 1000 kept ones
        assert after[3] == 0 and after[1] == n0 + 1000, r
        assert len(_ddp(rows, rank)) == n0 + 1000


def test_bucket_whose_issue_raises_is_written_as_an_error_row(tmp_path, accel_cache):
    """The route without a Python call (``direct_pre`` / ``direct_post``): an all-reduce that
    throws at its issue (injected in the C++ module, on both ranks) raises in the user's
    ``backward()`` with its message, and its record is written once, as a raising call's row
    (the error, its return time, no completion), nothing left listed or in flight; the
    step's bucket issued before it completes and is written with its completion."""
    res, rows, _ = _job(tmp_path, "raise", accel_cache)
    for rank in (0, 1):
        r = res[rank]
        assert r["kind"] == "group" and r["prev"] == 0, r
        assert r["error"] is not None and "commtrace's test injection" in r["error"], r
        assert r["left"] == 0, r   # the one failure injected was the one taken
        # the failing bucket was taken by the route without a Python call
        assert r["route"][0] >= 1, r
        assert r["after"][3] == 0 and r["listed"] == 0 and r["inflight_ids"] == [], r
        d = _ddp(rows, rank)
        bad = [x for x in d if x["error"] is not None]
        assert len(bad) == 1, bad
        b = bad[0]
        assert b["error"].startswith("RuntimeError: ") and "commtrace's test injection" in b["error"]
        assert b["t_end_ns"] is None and b["completion"] is None, b
        assert b["t_enqueue_ns"] <= b["t_return_ns"], b
        assert json.loads(b["detail"])["ddp_bucket"] in (0, 1), b
        # its seq follows the completed buckets' (the rows before it are all complete)
        good = [x for x in d if x["error"] is None]
        assert good and all(x["t_end_ns"] is not None for x in good)
        assert b["seq"] == max(x["seq"] for x in good) + 1, (b, good[-1])
        assert b["op_id"] == max(x["op_id"] for x in d)
