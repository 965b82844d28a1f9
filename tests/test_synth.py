"""Planted anomalies of `commtrace synth` come back with the right ranks, seqs and magnitudes."""

import json
import os

import pyarrow.dataset as ds
import pytest

import commtrace
from commtrace.analysis.synth import parse_duration_ns, synth_run
from commtrace.cli import main
from commtrace.format import schema as S


def findings(run, kind):
    return [f for f in run.findings() if f.kind == kind]


@pytest.mark.parametrize("n,delay_ms,rank", [(2, 20, 1), (8, 3, 5)])
def test_straggler_rank_and_magnitude(tmp_path, n, delay_ms, rank):
    synth_run(str(tmp_path), ranks=n, ops=200, straggler=[(rank, delay_ms * 1_000_000)], seed=3)
    run = commtrace.load(str(tmp_path))
    st = findings(run, "straggler")
    assert [f.rank for f in st] == [rank]
    assert st[0].evidence["mean_late_ns"] == pytest.approx(delay_ms * 1e6, rel=0.1)
    # every other rank waits ~delay at each complete collective but the first
    coll = run.collectives().to_pylist()
    n_coll = sum(1 for c in coll if c["complete"])
    w = {r["rank"]: r for r in run.per_rank().to_pylist()}
    other = 0 if rank != 0 else 1
    waits = [x for x in run.waits().to_pylist() if x["rank"] == other and x["pattern"] == "nxn"]
    assert sum(x["wait_ns"] for x in waits) / len(waits) == pytest.approx(delay_ms * 1e6, rel=0.1)
    assert w[rank]["straggler_share"] > 0.95 and n_coll > 100
    assert not findings(run, "late_sender") and not findings(run, "late_receiver")


def test_straggler_evidence_counts_steps_not_buckets(tmp_path):
    """Collectives of one step share their arrival order (a step's buckets wait for the same
    backward), so the count evidence is also taken over steps: last at every collective of 8
    steps (z over steps = sqrt(8) = 2.83) is not yet a finding, of 9 steps (3.0) it is."""
    for ops, steps, found in ((64, 8, False), (80, 9, True)):
        d = tmp_path / str(ops)
        synth_run(str(d), ranks=2, ops=ops, straggler=[(1, 2_000_000)], seed=3)
        run = commtrace.load(str(d))
        st = {s["rank"]: s for s in run.stragglers().to_pylist()}
        assert st[1]["share"] == 1.0 and st[1]["n_collectives"] > 40  # last every time
        from commtrace.analysis.findings import _straggler_step_z
        assert _straggler_step_z(run, 1, st[1]["n_collectives"]) == pytest.approx(steps ** 0.5)
        got = findings(run, "straggler")
        assert [f.rank for f in got] == ([1] if found else [])
        if found:
            assert got[0].evidence["z_steps"] == pytest.approx(3.0)
            assert got[0].evidence["z"] > 7  # counted per collective, the evidence looked far stronger


def test_clean_runs_report_nothing(tmp_path):
    for n, ops in ((2, 5), (4, 5), (2, 300), (16, 300)):
        d = tmp_path / f"c{n}_{ops}"
        synth_run(str(d), ranks=n, ops=ops, seed=n + ops)
        run = commtrace.load(str(d))
        assert run.findings() == [], (n, ops, [f.message for f in run.findings()])


def test_skip_gives_not_joined(tmp_path):
    synth_run(str(tmp_path), ranks=6, ops=400, skip=(4, 77), seed=2)
    run = commtrace.load(str(tmp_path))
    nj = findings(run, "not_joined")
    assert [(f.rank, f.seq) for f in nj] == [(4, 77)]
    lc = nj[0].evidence["last_completed"]
    assert lc == run.last_completed()[4]
    # its last completed op is the ring send/recv issued after reduce_scatter seq 76
    assert lc["op"] in ("send", "recv") and lc["t_end_ns"] < nj[0].t_ns + 10**9
    assert sorted(nj[0].evidence["waiting"]) == [0, 1, 2, 3, 5]
    assert nj[0] is run.findings()[0]


def test_mismatch_each_planted(tmp_path):
    synth_run(str(tmp_path), ranks=4, ops=300, mismatch=[(2, 10), (1, 33)], seed=5)
    run = commtrace.load(str(tmp_path))
    got = sorted((f.rank, f.seq) for f in findings(run, "collective_mismatch"))
    assert got == [(1, 33), (2, 10)]


def test_skew_recovered_within_1ms(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    synth_run(str(a), ranks=4, ops=300, straggler=[(2, 4_000_000)], seed=9)
    synth_run(str(b), ranks=4, ops=300, straggler=[(2, 4_000_000)], skew=[(1, 50_000_000)], seed=9)
    ra, rb = commtrace.load(str(a)), commtrace.load(str(b))
    assert rb.clock()["violations"] == 0
    assert [(f.kind, f.rank) for f in ra.findings()] == [(f.kind, f.rank) for f in rb.findings()]
    for x, y in zip(ra.per_rank().to_pylist(), rb.per_rank().to_pylist()):
        assert abs(x["wait_s"] - y["wait_s"]) < 1e-3


def test_synth_format_is_public(tmp_path):
    res = synth_run(str(tmp_path), ranks=3, ops=40, parts_per_rank=2)
    t = ds.dataset(str(tmp_path), partitioning="hive").to_table()
    assert set(S.COLUMNS) <= set(t.column_names)
    assert json.load(open(tmp_path / S.MANIFEST_NAME))["world_size"] == 3
    assert sorted(os.listdir(tmp_path / "rank=0")) == ["part-10000-000000.parquet", "part-10000-000001.parquet"]
    assert res.ops_per_rank == 40


def test_parse_duration():
    assert parse_duration_ns("20ms") == 20_000_000
    assert parse_duration_ns("1.5s") == 1_500_000_000
    assert parse_duration_ns("500us") == 500_000
    assert parse_duration_ns("42") == 42


def test_synth_cli(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["synth", str(out), "--ranks", "4", "--ops", "120", "--straggler", "3:4ms",
                 "--skip", "1:50", "--hazards"]) == 0
    err = capsys.readouterr().err
    assert "commtrace report" in err
    assert main(["synth", str(out), "--ranks", "2", "--ops", "10"]) != 0  # exists, no --force
    assert "--force" in capsys.readouterr().err
    assert main(["synth", str(out), "--skip", "x"]) == 2
    run = commtrace.load(str(out))
    assert ("not_joined", 1, 50) in [(f.kind, f.rank, f.seq) for f in run.findings()]
    assert main(["synth", "--help"]) == 0
    assert "Examples:" in capsys.readouterr().out


def test_late_sender_pair(tmp_path):
    synth_run(str(tmp_path), ranks=4, ops=300, late_send=[(2, 3_000_000)], seed=4)
    run = commtrace.load(str(tmp_path))
    ls = findings(run, "late_sender")
    assert [(f.rank, f.evidence["src"], f.evidence["dst"]) for f in ls] == [(2, 2, 3)]
    # the receiver waits from its wait() until the late send: the planted 3 ms minus the time
    # between an on-time send (rank 1's, same step) and rank 3's wait()
    ops = run.ops().to_pylist()
    on_time = {o["step"]: o["t_enqueue_ns"] for o in ops if o["rank"] == 1 and o["op"] == "send"}
    waits = {o["step"]: o["t_wait_ns"] for o in ops if o["rank"] == 3 and o["op"] == "recv"}
    expect = [on_time[k] + 3_000_000 - waits[k] for k in waits if k > 0]
    assert ls[0].evidence["mean_ns"] == pytest.approx(sum(expect) / len(expect), rel=0.1)
    p2p = [p for p in run.p2p().to_pylist() if p["src"] == 2 and p["pair_seq"] > 1]
    assert all(p["late_sender_ns"] > 2e6 for p in p2p)
    pr = {r["rank"]: r for r in run.per_rank().to_pylist()}
    assert pr[3]["late_sender_s"] == pytest.approx(sum(p["late_sender_ns"] for p in p2p) / 1e9, rel=0.05)
    assert not findings(run, "straggler")


def test_steps_detected_without_markers(tmp_path):
    import pyarrow.parquet as pq
    import shutil

    synth_run(str(tmp_path / "a"), ranks=2, ops=9 * 20, seed=6)
    b = tmp_path / "b"
    for r in range(2):
        os.makedirs(b / f"rank={r}")
        t = pq.read_table(str(tmp_path / "a" / f"rank={r}"))
        t = t.filter(pa_compute_not_mark(t)).drop_columns(["step"])
        pq.write_table(t, str(b / f"rank={r}" / "part-0.parquet"))
    shutil.copy(tmp_path / "a" / S.MANIFEST_NAME, b / S.MANIFEST_NAME)
    run = commtrace.load(str(b))
    assert any("steps detected" in w for w in run.warnings)
    ops = run.ops().to_pylist()
    ref = {(o["rank"], o["op_id"]): o["step"] for o in commtrace.load(str(tmp_path / "a")).ops().to_pylist()}
    same = sum(ref[(o["rank"], o["op_id"])] == o["step"] for o in ops)
    assert same / len(ops) > 0.9  # boundaries at the broadcast that opens each step
    assert len({o["step"] for o in ops}) == 20


def pa_compute_not_mark(t):
    import pyarrow.compute as pc

    return pc.not_equal(t.column("kind"), "mark")
