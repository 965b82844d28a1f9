"""Issue 7: `commtrace diff` on synthetic runs (fast); the real good/bad overlap comparison is
in tests/test_samples_findings.py."""

from __future__ import annotations

import json

import pytest

import commtrace
from commtrace.analysis.synth import synth_run
from commtrace.cli import main
from commtrace.export.diff import diff_runs, summarize


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")
    synth_run(str(d / "a"), ranks=4, ops=400, seed=3)
    synth_run(str(d / "b"), ranks=4, ops=400, seed=3, straggler=[(2, 10_000_000)])
    return d / "a", d / "b"


def test_summary_matches_the_run(runs):
    a = commtrace.load(str(runs[0]))
    s = summarize(a)
    assert sum(v["calls"] for v in s["ops"].values()) == a.ops().num_rows == s["totals"]["ops"]
    cs = a.collectives_summary().to_pylist()
    assert sum(v["collectives"] for v in s["ops"].values()) == sum(r["count"] for r in cs)
    # count-weighted t_comm over all buckets of an op equals the collectives' mean
    for op in {r["op"] for r in cs}:
        rows = [v for v in s["ops"].values() if v["op"] == op and v["t_comm_s"] is not None]
        coll = [c for c in a.collectives().to_pylist() if c["op"] == op and c["t_comm_ns"] is not None]
        if coll:
            got = sum(v["t_comm_s"] * v["collectives"] for v in rows) / sum(v["collectives"] for v in rows)
            assert got == pytest.approx(sum(c["t_comm_ns"] for c in coll) / len(coll) / 1e9, rel=1e-6)
    pr = a.per_rank().to_pylist()
    assert s["totals"]["exposed_s"] == pytest.approx(sum(r["exposed_s"] for r in pr))
    for v in s["ops"].values():
        assert 0 <= v["exposed_s"] <= v["blocked_s"] + 1e-9
    a.close()


def test_diff_shows_the_planted_straggler(runs, capsys):
    a, b = commtrace.load(str(runs[0])), commtrace.load(str(runs[1]))
    d = diff_runs(a, b)
    assert d["totals"]["wait_s"]["delta"] > 0.5 * 400 * 0.010  # the other ranks wait ~10 ms per collective
    st = {f["kind"]: f for f in d["findings"]}["straggler"]
    assert (st["a"], st["b"], st["delta"]) == (0, 1, 1)
    assert all(r["calls_a"] == r["calls_b"] for r in d["ops"])  # same program, same ops
    a.close()
    b.close()
    assert main(["diff", str(runs[0]), str(runs[1]), "--format", "json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["totals"]["wait_s"]["delta"] == pytest.approx(d["totals"]["wait_s"]["delta"])
    assert main(["diff", str(runs[0]), str(runs[1])]) == 0
    out = capsys.readouterr().out
    assert "straggler" in out and "Per op and size bucket" in out and "all_reduce" in out


def test_diff_errors_are_one_line(runs, tmp_path, capsys):
    assert main(["diff", str(runs[0]), str(tmp_path / "missing")]) != 0
    err = capsys.readouterr().err
    assert err.startswith("commtrace: error:") and "Traceback" not in err
