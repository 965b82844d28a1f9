"""Analysis on the small committed sample traces of tests/data/ (made by make_samples.py)."""

import json
import os

import pytest

import commtrace
from commtrace.errors import CommtraceError, EmptyTraceError, SchemaVersionError, TraceFormatError

DATA = os.path.join(os.path.dirname(__file__), "data")


def load(name):
    return commtrace.load(os.path.join(DATA, name))


def kinds(run):
    return [f.kind for f in run.findings()]


def test_clean_has_no_findings_and_sane_tables():
    run = load("clean")
    assert run.world_size == 4 and run.ranks == [0, 1, 2, 3] and run.missing_ranks == []
    assert run.findings() == []
    ops = run.ops()
    assert ops.num_rows == 4 * 150
    assert {"blocked_ns", "inflight_ns", "step"} <= set(ops.column_names)
    from commtrace.format import schema as S
    assert ops.column_names[: len(S.COLUMNS)] == S.COLUMNS
    assert None not in ops.column("api").to_pylist() and set(ops.column("device").to_pylist()) == {"cpu"}
    assert not run.warnings
    coll = run.collectives()
    assert coll.num_rows > 0 and all(coll.column("complete").to_pylist())
    assert run.clock()["violations"] == 0
    pr = run.per_rank().to_pylist()
    for r in pr:
        assert r["ops"] == 150
        assert 0 <= r["exposed_s"] <= r["inflight_s"] + 1e-12
        assert abs(r["exposed_s"] + r["overlapped_s"] - r["inflight_s"]) < 1e-9
        assert 0 <= r["overlap_ratio"] <= 1


def test_busbw_follows_nccl_tests_factors():
    run = load("clean")
    for c in run.collectives().to_pylist():
        if c["t_comm_ns"]:
            n = c["pg_size"]
            f = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
                 "broadcast": 1.0}[c["op"]]
            assert c["algbw_gbps"] == pytest.approx(c["bytes"] / c["t_comm_ns"])
            assert c["busbw_gbps"] == pytest.approx(c["algbw_gbps"] * f)
    # synth moves S bytes at 5 GB/s plus 20 us latency; all_gather (S = 4 MiB) never queues
    # behind async buckets, so its algbw is close to 5 GB/s
    big = [c for c in run.collectives().to_pylist() if c["op"] == "all_gather"]
    assert big and all(4.0 < c["algbw_gbps"] <= 5.0 for c in big)


def test_straggler_sample():
    run = load("straggler")
    f = [x for x in run.findings() if x.kind == "straggler"]
    assert len(f) == 1 and f[0].rank == 1
    assert f[0].evidence["mean_late_ns"] == pytest.approx(5e6, rel=0.1)


def test_hang_sample_names_culprit_and_merges_inflight():
    run = load("hang")
    nj = [x for x in run.findings() if x.kind == "not_joined"]
    assert [(x.rank, x.seq, x.pg) for x in nj] == [(2, 40, "0")]
    assert nj[0].evidence["last_completed"]["seq"] == 39
    assert sorted(nj[0].evidence["issued_by"]) == [0, 1, 3]
    # two of the waiting ranks have the pending op only in _inflight.json
    ops = run.ops().to_pylist()
    pending = [o for o in ops if o["seq"] == 40 and o["op"] in ("all_reduce", "all_gather", "broadcast", "reduce_scatter")]
    assert sorted(o["rank"] for o in pending) == [0, 1, 3]
    assert all(o["t_end_ns"] is None for o in pending)
    assert "not_completed" not in kinds(run)


def test_mismatch_sample():
    run = load("mismatch")
    f = [x for x in run.findings() if x.kind == "collective_mismatch"]
    assert [(x.rank, x.seq) for x in f] == [(3, 25)]
    e = {d["rank"]: d for d in f[0].evidence["entries"]}
    assert e[3]["count"] == 2 * e[0]["count"]


def test_skew_is_aligned_and_unrecorded_skew_is_flagged():
    a, b = load("clean"), load("skew")
    assert b.clock()["violations"] == 0 and b.findings() == []
    wa = {r["rank"]: r["wait_s"] for r in a.per_rank().to_pylist()}
    wb = {r["rank"]: r["wait_s"] for r in b.per_rank().to_pylist()}
    # same seed, same waits: the 50 ms skew is removed by the recorded offset (estimate error ~us)
    bad = load("skew_unrecorded")
    ck = bad.clock()
    assert ck["violations"] > 0 and ck["max_violation_ns"] == pytest.approx(50e6, rel=0.1)
    assert "clock_violation" in kinds(bad)
    assert wa.keys() == wb.keys()


def test_hazard_sample_gives_each_host_rule():
    run = load("hazards")
    ks = kinds(run)
    for k in ("use_before_wait", "sync_while_inflight", "redundant_sync", "wait_immediately", "first_op_init_stall"):
        assert k in ks, (k, ks)
    ubw = next(f for f in run.findings() if f.kind == "use_before_wait")
    assert ubw.site == "train.py:88" and ubw.rank == 0 and ubw.op == "all_reduce"
    assert ubw.evidence["method"] == "item"
    assert "straggler" not in ks and "not_joined" not in ks
    assert not [w for w in run.warnings if "detector" in w]
    # severity order: errors first
    sev = [f.severity for f in run.findings()]
    assert sev == sorted(sev, key=["error", "warning", "info"].index)


def test_required_columns_only_and_no_metadata():
    run = load("required_only")
    assert run.world_size == 4 and not any(run.clock_offsets.values())
    ref = load("clean")
    assert run.ops().num_rows == ref.ops().num_rows
    assert run.findings() == []
    # the reference applies its recorded offsets (a few us each); nothing else differs
    assert [r["wait_s"] for r in run.per_rank().to_pylist()] == pytest.approx(
        [r["wait_s"] for r in ref.per_rank().to_pylist()], abs=1e-3)
    assert run.collectives().num_rows == ref.collectives().num_rows


def test_damaged_run_loads_with_warnings():
    run = load("damaged")
    assert run.ranks == [0, 1, 2] and run.missing_ranks == [3]
    assert any("rank=1/part-" in w and "truncated or corrupt" in w for w in run.warnings)
    rep = run.report()
    assert rep["missing_ranks"] == [3]
    json.dumps(rep)


def test_newer_schema_is_refused():
    from commtrace.format.schema import SCHEMA_VERSION

    # the message names the newest version this reader reads
    with pytest.raises(SchemaVersionError, match=f"up to v{SCHEMA_VERSION}"):
        load("newer_schema")


def test_unreadable_inputs(tmp_path):
    with pytest.raises(TraceFormatError):
        commtrace.load(str(tmp_path / "nope"))
    with pytest.raises(EmptyTraceError):
        commtrace.load(str(tmp_path))
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(CommtraceError):
        commtrace.load(str(tmp_path / "x.txt"))


def test_timeline_bins_conserve_time():
    run = load("clean")
    tb = run.timeline_bins(nbins=37).to_pylist()
    assert len(tb) == 4 * 37
    ops = run.ops().to_pylist()
    for r in range(4):
        mine = [o for o in ops if o["rank"] == r]
        blocked = sum(o["blocked_ns"] for o in mine if o["blocked_ns"] is not None)
        inflight = sum(o["inflight_ns"] for o in mine if o["inflight_ns"] is not None)
        rows = [b for b in tb if b["rank"] == r]
        assert sum(b["blocked_ns"] for b in rows) == blocked
        assert sum(b["inflight_ns"] for b in rows) == inflight
        assert sum(b["ops"] for b in rows) == len(mine)
    # a window gives clipped sums
    t0, t1 = run.t_min_ns, run.t_min_ns + (run.t_max_ns - run.t_min_ns) // 3
    w = run.timeline_bins(t0, t1, 10, ranks=[2]).to_pylist()
    assert len(w) == 10 and all(b["rank"] == 2 for b in w)
    assert all(b["inflight_ns"] >= 0 for b in w)


def test_per_step_sums_to_per_rank():
    run = load("clean")
    ps = run.per_step().to_pylist()
    pr = {r["rank"]: r for r in run.per_rank().to_pylist()}
    for r in range(4):
        mine = [p for p in ps if p["rank"] == r]
        for k in ("ops", "inflight_s", "exposed_s", "wait_s", "blocked_s"):
            assert sum(p[k] for p in mine) == pytest.approx(pr[r][k], rel=1e-9, abs=1e-12), k


def test_inflight_snapshot_merge(tmp_path):
    """Snapshot ops with a row in the parts are dropped (by op_id, or by pg+seq+op without
    op_id); the others read as pending with t_end_ns null."""
    import shutil

    from commtrace.analysis.synth import synth_run

    d = tmp_path / "run"
    synth_run(str(d), ranks=2, ops=30, seed=2)
    done = [o for o in commtrace.load(str(d)).ops(ranks=[1]).to_pylist() if o["op"] == "all_reduce"]
    snap = {"rank": 1, "t_ns": done[-1]["t_end_ns"] + 10**9, "ops": [
        {"op_id": done[0]["op_id"], "op": "all_reduce", "pg": "0", "seq": done[0]["seq"]},  # has a row
        {"op": "all_reduce", "pg": "0", "seq": done[1]["seq"]},                           # has a row, no op_id
        {"op_id": 9999, "op": "all_reduce", "pg": "0", "seq": 9999, "t_enqueue_ns": done[-1]["t_end_ns"] + 5,
         "t_end_ns": 123, "site": "x.py:1"},                                               # pending
    ]}
    (d / "rank=1" / "_inflight.json").write_text(json.dumps(snap))
    run = commtrace.load(str(d))
    rows = run.ops(ranks=[1]).to_pylist()
    assert len(rows) == 30 + 1
    pend = [o for o in rows if o["op_id"] == 9999]
    assert len(pend) == 1 and pend[0]["t_end_ns"] is None and pend[0]["site"] == "x.py:1"
    nj = [f for f in run.findings() if f.kind == "not_joined"]
    assert [(f.rank, f.seq) for f in nj] == [(0, 9999)]
    assert nj[0].evidence["waiting"] == [1]
    # the pending time runs to the snapshot's t_ns
    assert nj[0].evidence["waited_ns"] == pytest.approx(10**9, rel=0.01)
    shutil.rmtree(d)


def test_init_stall_names_the_same_rank_every_load(tmp_path):
    """Every rank's first p2p op stalls exactly as long (a synthetic run): the finding names the
    lowest of the tied ranks, the same on every load (DuckDB's parallel arg_max picked any)."""
    from commtrace.analysis.synth import synth_run

    synth_run(str(tmp_path / "r"), ranks=64, ops=400, init_stall_ns=50_000_000, seed=3)
    seen = set()
    for _ in range(4):
        run = commtrace.load(str(tmp_path / "r"))
        f = next(f for f in run.findings() if f.kind == "first_op_init_stall" and f.evidence["p2p"])
        assert f.impact_ns == 50_000_000 and len(f.evidence["ranks"]) == 64
        seen.add(f.rank)
        run.close()
    assert seen == {0}
