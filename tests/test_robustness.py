"""Capture robustness (issue 6): one 2-rank job runs every case of tests/scripts/robust_cases.py
with and without commtrace; what the training code observed must be identical, and the trace
must hold the right rows. Cases: group=None and subgroups (new_group, new_subgroups,
DeviceMesh), ops that raise, collectives from several threads, torch.profiler alongside, a user
who monkeypatches torch.distributed (after and before init), fork after init, and
destroy_process_group + init again."""

from __future__ import annotations

import collections
import glob
import json
import os

import pyarrow.parquet as pq
import pytest

from conftest import SCRIPTS, launch_cmd, load_rows, run_path, run_plain, run_traced, torchrun_cmd

SCRIPT = os.path.join(SCRIPTS, "robust_cases.py")
#: fields that differ between any two runs (a pid) or that a known capture bug changes (below)
VOLATILE = {"child_pid"}
USER_PATCH_BEFORE_INIT = {"user_patch_kept", "user_calls"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("robust")
    # the reference without commtrace through the light launcher (tests/launch_ranks.py); the
    # traced job as a user runs it, through torchrun
    run_plain(launch_cmd(SCRIPT, d / "plain"), timeout=150)
    p = run_traced(d / "trace", torchrun_cmd(SCRIPT, d / "traced"), opts=("--flush-interval", "0.5"),
                   timeout=150)
    res = {}
    for kind in ("plain", "traced"):
        res[kind] = {r: json.load(open(d / f"{kind}.rank{r}.json")) for r in (0, 1)}
    return d, res, p


def _ops(d):
    by = collections.defaultdict(list)
    for r in load_rows(d / "trace"):
        if r["kind"] == "op":
            by[(r["op"], r["count"])].append(r)
    return by


def test_training_sees_the_same_results(runs):
    _, res, p = runs
    for r in (0, 1):
        plain = {k: v for k, v in res["plain"][r].items() if k not in VOLATILE | USER_PATCH_BEFORE_INIT}
        traced = {k: v for k, v in res["traced"][r].items() if k not in VOLATILE | USER_PATCH_BEFORE_INIT}
        assert traced == plain
    r0 = res["traced"][0]
    assert r0["world"] == [3.0] * 3 and r0["mesh_dp"] == [1.0] * 10 and r0["after_reinit"] == [3.0] * 7
    assert r0["band_on_float"] == ["builtins.RuntimeError", "Cannot use ReduceOp.BAND with non-integral dtype"]
    assert r0["bad_src"][0] == "builtins.RuntimeError" and "invalid root rank: 7" in r0["bad_src"][1]
    assert r0["threads"] == {"a": sum(2 * i for i in range(20)) + 20, "b": sum(2 * i for i in range(20)) + 20}
    assert r0["fork_child_exit"] == 0 and r0["profiler_ok"] and r0["profiler_allreduce_events"]
    assert r0["user_broadcast"] == [2, [1.0] * 16]
    assert "Traceback" not in p.stderr


def test_user_monkeypatch_before_init_is_kept(runs):
    _, res, _ = runs
    for r in (0, 1):
        for k in USER_PATCH_BEFORE_INIT:
            assert res["traced"][r][k] == res["plain"][r][k]


def test_groups_and_subgroups_rows(runs):
    d, _, _ = runs
    by = _ops(d)
    pg_of = {}
    for count, size in ((3, 2), (5, 2), (6, 2), (9, 2), (10, 1)):
        rows = by[("all_reduce", count)]
        assert sorted(r["rank"] for r in rows) == [0, 1], count
        assert {r["pg_size"] for r in rows} == {size}
        assert all(r["t_end_ns"] is not None and r["error"] is None for r in rows)
        pg_of[count] = {r["rank"]: r["pg"] for r in rows}
    assert pg_of[3] == {0: "0", 1: "0"}                        # group=None: the default group
    assert pg_of[5][0] == pg_of[5][1] != "0"                   # new_group
    assert pg_of[6][0] == pg_of[6][1] not in ("0", pg_of[5][0])  # new_subgroups
    assert pg_of[9] == {0: "0", 1: "0"}  # DeviceMesh's tp dim spans the world: torch reuses it
    assert pg_of[10][0] != pg_of[10][1]  # its dp dim: one single-rank group per rank


def test_ops_that_raise_record_the_error(runs):
    d, _, _ = runs
    by = _ops(d)
    band = by[("all_reduce", 11)]
    assert len(band) == 2 and {r["error"] for r in band} == {
        "RuntimeError: Cannot use ReduceOp.BAND with non-integral dtype"}
    bad = by[("broadcast", 12)]
    assert len(bad) == 2 and all("invalid root rank: 7" in r["error"] for r in bad)
    assert all(r["t_end_ns"] is None and r["t_return_ns"] is not None for r in band + bad)


def test_threads_profiler_fork_and_reinit_rows(runs):
    d, res, _ = runs
    by = _ops(d)
    th = by[("all_reduce", 13)]
    for rank in (0, 1):
        mine = [r for r in th if r["rank"] == rank]
        assert len(mine) == 40 and len({r["thread"] for r in mine}) == 2
        per_pg = collections.defaultdict(list)
        for r in mine:
            per_pg[r["pg"]].append(r["seq"])
        assert sorted(sorted(v) for v in per_pg.values()) == [list(range(20))] * 2
    assert sorted(r["rank"] for r in by[("all_reduce", 14)]) == [0, 0, 0, 1, 1, 1]  # under the profiler
    assert sorted(r["rank"] for r in by[("broadcast", 16)]) == [0, 0, 1, 1]  # user wrapper after init
    reinit = by[("all_reduce", 7)]
    assert sorted(r["rank"] for r in reinit) == [0, 1] and all(r["t_end_ns"] is not None for r in reinit)
    # the forked child wrote nothing: every part belongs to a rank's own process (the parts lie
    # in the job's run directory, OUT/<run-id>/rank=<r>/, since issue 15)
    run_dir = run_path(d / "trace")
    for rank in (0, 1):
        parts = glob.glob(os.path.join(run_dir, f"rank={rank}", "*.parquet"))
        assert parts, run_dir
        pids = {json.loads(pq.read_schema(f).metadata[b"commtrace.meta"])["pid"] for f in parts}
        assert len(pids) == 1 and res["traced"][rank]["child_pid"] not in pids


def test_report_of_the_robust_run_is_clean(runs):
    import commtrace

    d, _, _ = runs
    run = commtrace.load(str(d / "trace"))
    assert run.ranks == [0, 1] and run.missing_ranks == [] and run.warnings == []
    kinds = [f.kind for f in run.findings()]
    assert not {"not_joined", "not_completed", "collective_mismatch", "clock_violation"} & set(kinds), kinds
