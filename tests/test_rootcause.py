"""Issue 18: delay analysis (Scalasca's delay costs, direct and propagated), the critical path
across ranks and what-if by replay, on synthetic runs with planted delays whose answers are
known analytically (a 2-group TP x DP layout and a pipeline), and in the report.

The synthetic layouts (commtrace.analysis.synth.synth_layout) use the replay model's own timing
rules, without jitter, so the expected figures follow from the layout by hand: see each test.
"""

from __future__ import annotations

import json

import pyarrow as pa

import pytest

import commtrace
from commtrace.analysis import critical_path as CP
from commtrace.analysis import delay as D
from commtrace.analysis import replay as RP
from commtrace.analysis import rootcause as RC
from commtrace.analysis.model import build_model
from commtrace.analysis.synth import LAYOUT_RET_NS, layout_tcomm_ns, synth_layout
from commtrace.cli import main

DELTA = 20_000_000          # planted delay, ns
STEPS = 6
MB = 1 << 20


@pytest.fixture(scope="module")
def tpdp(tmp_path_factory):
    """TP 2 x DP 4 (8 ranks): rank 5 (TP group tp2 = {4, 5}, DP group dp1 = {1, 3, 5, 7})
    works DELTA longer before its TP all_reduce of step 3."""
    out = str(tmp_path_factory.mktemp("rc") / "tpdp")
    synth_layout(out, "tpdp", tp=2, dp=4, steps=STEPS, delays=[(5, 3, DELTA)])
    return commtrace.load(out)


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    """A 5-stage pipeline, 3 microbatches per step: stage 1 works DELTA longer before its send
    of microbatch 0 in step 2."""
    out = str(tmp_path_factory.mktemp("rc") / "pipe")
    synth_layout(out, "pipeline", stages=5, steps=4, microbatches=3, delays=[(1, 2, DELTA)])
    return commtrace.load(out)


@pytest.fixture(scope="module")
def dp_only(tmp_path_factory):
    """One DP group of 4 (tp=1): rank 2 works DELTA longer in step 3."""
    out = str(tmp_path_factory.mktemp("rc") / "dp")
    synth_layout(out, "tpdp", tp=1, dp=4, steps=STEPS, delays=[(2, 3, DELTA)])
    return commtrace.load(out)


def _top(run):
    return D.delays(run).to_pylist()[0]


def test_tpdp_delay_costs_direct_and_propagated(tpdp):
    # rank 5's delay makes rank 4 wait at the TP all_reduce (direct, 1 x DELTA) and, in the
    # DP group's interval that also holds it, ranks 1, 3 and 7 wait at the DP all_reduce
    # (direct, 3 x DELTA); rank 4, which waited, arrives late at its DP all_reduce so ranks
    # 0, 2 and 6 wait (propagated, 3 x DELTA). Nothing else waits.
    top = _top(tpdp)
    assert (top["rank"], top["step"], top["op"], top["site"]) == (5, 3, "all_reduce", "model.py:40")
    assert top["delay_s"] * 1e9 == pytest.approx(DELTA, rel=0.01)
    assert top["direct_cost_s"] * 1e9 == pytest.approx(4 * DELTA, rel=0.01)
    assert top["propagated_cost_s"] * 1e9 == pytest.approx(3 * DELTA, rel=0.01)
    a = D.attribution(tpdp)
    assert a["total_wait"] == pytest.approx(7 * DELTA, rel=0.01)
    # every waiting second is attributed once
    assert a["ev_direct"].sum() + a["ev_prop"].sum() == pytest.approx(a["total_wait"], rel=1e-9)


def test_pipeline_delay_costs_direct_and_propagated(pipe):
    # stage 2 waits for stage 1's send (direct); stages 3 and 4 wait because the stage before
    # them waited (propagated, 2 x DELTA). The balanced pipeline has no other waits after the
    # first microbatch.
    top = _top(pipe)
    assert (top["rank"], top["step"], top["op"], top["site"]) == (1, 2, "send", "pipe.py:12")
    assert top["delay_s"] * 1e9 == pytest.approx(DELTA, rel=0.01)
    assert top["direct_cost_s"] * 1e9 == pytest.approx(DELTA, rel=0.01)
    assert top["propagated_cost_s"] * 1e9 == pytest.approx(2 * DELTA, rel=0.01)


def test_replay_reproduces_the_synthetic_runs(tpdp, pipe, dp_only):
    for run in (tpdp, pipe, dp_only):
        v = RP.validate(run)
        assert abs(v["error"]) < 1e-9 and v["max_step_error"] < 1e-9
        assert v["run_time_s"] > 0.02


def test_tpdp_what_if_gains_are_analytic(tpdp):
    m = build_model(tpdp)
    top = _top(tpdp)
    ref = 10.0   # GB/s
    scs = [RP.baseline(), RP.fix_delay(m, top["event"]), RP.rank_median(m, 5), RP.comm_hidden(m),
           RP.busbw_ref(m, "all_reduce", ref)]
    res = RP.replay(m, scs)
    gain = [(res.t_end[0] - t) for t in res.t_end]
    assert gain[1] == pytest.approx(DELTA, rel=0.02)
    assert gain[2] == pytest.approx(DELTA, rel=0.02)
    # every step runs gap, TP all_reduce, gap, DP all_reduce back to back on the path: fully
    # overlapped communication saves both transfers of every step, except the first TP
    # all_reduce's: the window (run_time_s) opens at its release (the ranks' first release
    # after a wait), and no scenario changes what lies before the window
    tc_tp, tc_dp = layout_tcomm_ns(4 * MB), layout_tcomm_ns(16 * MB)
    assert m.t_begin == pytest.approx(tc_tp + LAYOUT_RET_NS, abs=1)
    assert gain[3] == pytest.approx(STEPS * (tc_tp + tc_dp) - tc_tp, rel=0.02)
    # nccl-tests: t = S x F / busbw, F = 2(n-1)/n: 1 for the TP pairs, 1.5 for DP groups of 4
    d_tp, d_dp = tc_tp - 4 * MB * 1.0 / ref, tc_dp - 16 * MB * 1.5 / ref
    want = STEPS * (d_tp + d_dp) - d_tp
    assert gain[4] == pytest.approx(want, rel=0.02)
    # no scenario saves more than the window
    assert max(gain) < res.t_end[0] - m.t_begin


def test_pipeline_what_if_gain_is_analytic(pipe):
    m = build_model(pipe)
    top = _top(pipe)
    res = RP.replay(m, [RP.baseline(), RP.fix_delay(m, top["event"]), RP.rank_median(m, 1)])
    # the last stage finishes DELTA earlier without the delay
    assert res.t_end[0] - res.t_end[1] == pytest.approx(DELTA, rel=0.02)
    assert res.t_end[0] - res.t_end[2] == pytest.approx(DELTA, rel=0.02)


def test_remove_rank_from_group(dp_only):
    m = build_model(dp_only)
    res = RP.replay(m, [RP.baseline(), RP.remove_rank(m, 2, "dp0"), RP.rank_median(m, 2)])
    assert res.t_end[0] - res.t_end[1] == pytest.approx(DELTA, rel=0.02)
    assert res.t_end[0] - res.t_end[2] == pytest.approx(DELTA, rel=0.02)
    top = _top(dp_only)
    assert (top["rank"], top["step"]) == (2, 3)
    # three ranks wait DELTA at the DP all_reduce: direct
    assert top["direct_cost_s"] * 1e9 == pytest.approx(3 * DELTA, rel=0.01)
    assert top["propagated_cost_s"] == pytest.approx(0.0, abs=1e-6)


def test_critical_path(tpdp, pipe):
    s = CP.summary(tpdp)
    # the path covers the run without gaps or overlaps
    assert s["length_s"] == pytest.approx(s["run_time_s"], rel=1e-9)
    seg = CP.segments(tpdp)
    t0, t1 = seg.column("t0_ns").to_pylist(), seg.column("t1_ns").to_pylist()
    assert all(b >= a for a, b in zip(t0, t1)) and all(abs(t0[i + 1] - t1[i]) <= 1 for i in range(len(t0) - 1))
    # step 3: rank 5's delay is on the path
    st3 = [x for x in s["per_step"] if x["step"] == 3][0]
    assert st3["top_rank"] == 5
    assert {"rank", "t0_ns", "t1_ns", "kind", "op", "pg", "seq", "step"} <= set(seg.column_names)
    # all transfers of a fully synchronous layout are on the path: each step has one TP and
    # one DP all_reduce, each on the path once, after t_begin
    per_op = {o["op"]: o for o in s["per_op"]}
    on = per_op["all_reduce"]["on_path_s"] * 1e9
    tc_tp, tc_dp = layout_tcomm_ns(4 * MB), layout_tcomm_ns(16 * MB)
    assert on == pytest.approx((STEPS - 1) * (tc_tp + tc_dp) + tc_dp, rel=0.01)
    sp = CP.summary(pipe)
    assert sp["length_s"] == pytest.approx(sp["run_time_s"], rel=1e-9)
    assert sp["per_rank"][0]["rank"] == 1


def test_report_json_what_if_and_findings(tpdp, tmp_path, capsys):
    rep = tpdp.report(busbw_ref=10.0)
    wi = rep["what_if"]
    assert abs(wi["replay_error"]) < 1e-9
    kinds = {s["kind"] for s in wi["scenarios"]}
    assert {"rank_median", "fix_delay", "comm_hidden", "busbw_ref", "remove_rank"} <= kinds
    d0 = wi["delays"][0]
    assert (d0["rank"], d0["step"]) == (5, 3) and d0["gain_s"] * 1e9 == pytest.approx(DELTA, rel=0.02)
    assert d0["text"].startswith("Fixing rank 5's delay before all_reduce at model.py:40 would save 20 ms of ")
    gains = [s["gain_s"] for s in wi["scenarios"]]
    assert gains == sorted(gains, reverse=True)
    assert rep["critical_path"]["per_rank"]
    json.dumps(rep)


def test_findings_gain_cost_and_are_ordered_by_gain():
    import os
    run = commtrace.load(os.path.join(os.path.dirname(__file__), "data", "straggler"))
    fs = run.findings()
    st = [f for f in fs if f.kind == "straggler"]
    assert st and st[0].rank == 1
    f = st[0]
    # rank 1 arrives ~5 ms late at every collective: its delay costs are the others' waits
    a = D.attribution(run)
    assert f.cost_s == pytest.approx(D.cost_by_rank(run)[1][0] + D.cost_by_rank(run)[1][1])
    assert f.cost_s > 0.9 * a["total_wait"] / 1e9
    assert f.gain_s > 0.1 and f.root_cause["rank"] == 1
    d = f.to_dict()
    assert {"cost_s", "gain_s", "root_cause"} <= set(d)
    with_gain = [x.gain_s for x in fs if x.gain_s is not None]
    assert with_gain == sorted(with_gain, reverse=True)
    assert all(x.gain_s is not None for x in fs[: len(with_gain)])


def test_cli_busbw_ref(tpdp, capsys):
    assert main(["report", tpdp.path, "--busbw-ref", "10", "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert any(s["kind"] == "busbw_ref" and s["params"]["busbw_gbps"] == 10.0 for s in rep["what_if"]["scenarios"])
    assert main(["report", tpdp.path]) == 0
    out = capsys.readouterr().out
    assert "Root cause and what-if" in out and "replay of the unchanged trace" in out
    assert "Fixing rank 5's delay before all_reduce at model.py:40 would save 20 ms of" in out
    rc = main(["report", tpdp.path, "--busbw-ref", "0"])
    err = capsys.readouterr().err
    assert rc != 0 and "busbw-ref" in err and "Traceback" not in err


@pytest.mark.parametrize("fixture", ["tpdp", "pipe", "dp_only"])
def test_c_and_numpy_replays_agree(fixture, request):
    run = request.getfixturevalue(fixture)
    m = build_model(run)
    top = _top(run)
    scs = [RP.baseline(), RP.fix_delay(m, top["event"]), RP.rank_median(m, top["rank"]), RP.comm_hidden(m),
           RP.busbw_ref(m, "all_reduce", 3.0), RP.remove_rank(m, top["rank"], str(m.cm_pg[0]))]
    a = RP.replay(m, scs, keep_events=True, engine="numpy")
    if RP._C is None:
        pytest.skip("C replay not built (no compiler at install time)")
    b = RP.replay(m, scs, keep_events=True, engine="c")
    assert a.ev_rel == pytest.approx(b.ev_rel, abs=1e-3)
    assert list(a.t_end) == pytest.approx(list(b.t_end), abs=1e-3)


def test_no_what_if_leaves_the_sections_out(tpdp, capsys):
    assert main(["report", tpdp.path, "--no-what-if", "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["what_if"] is None and rep["critical_path"] is None
    assert all(f.get("gain_s") is None for f in rep["findings"])


def test_large_runs_skip_what_if_unless_asked(tmp_path, monkeypatch, capsys):
    out = str(tmp_path / "small")
    synth_layout(out, "tpdp", tp=2, dp=2, steps=3, delays=[(1, 1, DELTA)])
    monkeypatch.setattr(RC, "AUTO_MAX_OPS", 10)
    assert main(["report", out, "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["what_if"] is None and any("root cause and what-if skipped" in w for w in rep["warnings"])
    assert main(["report", out, "--format", "json", "--what-if"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["what_if"]["delays"][0]["rank"] == 1


def test_synth_cli_layouts(tmp_path, capsys):
    out = str(tmp_path / "pipe")
    assert main(["synth", out, "--layout", "pipeline", "--stages", "4", "--steps", "3", "--microbatches", "2",
                 "--delay", "1:1:20ms"]) == 0
    top = D.delays(commtrace.load(out)).to_pylist()[0]
    assert (top["rank"], top["step"], top["op"]) == (1, 1, "send")
    assert top["direct_cost_s"] == pytest.approx(0.020, rel=0.01)
    assert top["propagated_cost_s"] == pytest.approx(0.020, rel=0.01)   # stage 3 waits for stage 2
    capsys.readouterr()
    assert main(["synth", str(tmp_path / "x"), "--layout", "tpdp", "--delay", "1:2:5ms:dq"]) != 0
    err = capsys.readouterr().err
    assert "--delay expects" in err and "Traceback" not in err


def test_findings_skip_the_what_if_on_large_runs(monkeypatch):
    import os
    monkeypatch.setattr(RC, "AUTO_MAX_OPS", 10)
    run = commtrace.load(os.path.join(os.path.dirname(__file__), "data", "straggler"))
    st = [f for f in run.findings() if f.kind == "straggler"]
    assert st and st[0].gain_s is None      # Run.findings() (the dashboard) does not pay for it
    run2 = commtrace.load(os.path.join(os.path.dirname(__file__), "data", "straggler"))
    rep = run2.report(what_if=True)
    assert [f for f in rep["findings"] if f["kind"] == "straggler"][0]["gain_s"] > 0


_MALLOC_PROBE = """
import sys
import commtrace
from commtrace.analysis import model as M
from commtrace.analysis.synth import synth_layout
out = sys.argv[1]
synth_layout(out, "tpdp", tp=2, dp=2, steps=3)
M.build_model(commtrace.load(out))
lib = M._MALLOC_TUNED
if sys.argv[2] == "cli":
    from commtrace.cli import main
    M._CACHE.clear()
    rc = main(["report", out, "--what-if", "--format", "json"])
    assert rc == 0, rc
print("TUNED", lib, M._MALLOC_TUNED)
"""


@pytest.mark.parametrize("how,env,expected", [
    ("lib", None, "False False"),      # a program importing the analysis keeps its malloc
    ("cli", None, "False True"),       # the commtrace command's own process is tuned
    ("cli", "0", "False False"),       # COMMTRACE_MALLOC_TUNE=0 leaves it alone everywhere
    ("lib", "1", "True True"),         # =1 opts a library user in
])
def test_malloc_tuned_only_in_commtraces_own_process(tmp_path, how, env, expected):
    import os
    import subprocess
    import sys
    e = {k: v for k, v in os.environ.items() if k != "COMMTRACE_MALLOC_TUNE"}
    if env is not None:
        e["COMMTRACE_MALLOC_TUNE"] = env
    p = subprocess.run([sys.executable, "-c", _MALLOC_PROBE, str(tmp_path / "r"), how],
                       capture_output=True, text=True, env=e, timeout=300)
    assert p.returncode == 0, p.stderr
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("TUNED ")]
    assert line == ["TUNED " + expected]


def test_start_up_skew_is_outside_every_what_if(tmp_path):
    """One TP group of 4 (dp=1): rank 2 reaches the first all_reduce SKEW late (start-up: loading,
    compiling) and works DELTA longer in step 3. The window opens at that all_reduce's release,
    so the skew is not in the run time, and no scenario may save it: rank 2 made as fast as the
    median gains DELTA, not SKEW + DELTA; taken off the group's critical path it gains its
    step-3 delay, not the skew; every projected run time is positive and within the window
    (before this, a failed 2-rank run's report claimed savings of 2086% of its run time)."""
    skew = 5 * DELTA
    synth_layout(str(tmp_path / "skew"), "tpdp", tp=4, dp=1, steps=STEPS, delays=[(2, 0, skew), (2, 3, DELTA)])
    run = commtrace.load(str(tmp_path / "skew"))
    m = build_model(run)
    assert m.t_begin > skew
    res = RP.replay(m, [RP.baseline(), RP.rank_median(m, 2), RP.remove_rank(m, 2, "tp0"), RP.comm_hidden(m)])
    window = res.t_end[0] - m.t_begin
    gain = res.t_end[0] - res.t_end
    assert gain[1] == pytest.approx(DELTA, rel=0.02)
    assert gain[2] == pytest.approx(DELTA, rel=0.02)
    assert all(0 <= g < window for g in gain[1:])
    wi = RC.what_if(run)
    assert wi["run_time_s"] == pytest.approx(window / 1e9, rel=1e-9)
    assert wi["scenarios"]
    for sc in wi["scenarios"]:
        assert 0 < sc["projected_s"] <= wi["run_time_s"], sc
        assert 0 <= sc["gain_pct"] < 100, sc


def test_text_report_explains_a_delay_of_zero(tpdp):
    """A root cause whose rank's extra time was spread (no gap longer than the same gap on the
    other ranks: `delay_s` 0, a cost all the same) gets a footnote in the text report saying
    so; the planted delays (each a longer gap) do not."""
    import io

    from rich.console import Console

    from commtrace.cli.report import render

    rep = tpdp.report(what_if=True)
    dl = rep["what_if"]["delays"]
    assert dl and all(d["delay_s"] > 0 for d in dl if d["cost_s"] > 0)

    def text(r):
        buf = io.StringIO()
        render(r, console=Console(file=buf, width=200))
        return buf.getvalue()

    assert "delay 0:" not in text(rep)
    spread = dict(dl[0], delay_s=0.0, gain_s=None)
    rep["what_if"]["delays"] = [spread] + dl[1:]
    out = text(rep)
    assert "delay 0: no gap of that rank there was longer than the same gap on the other ranks" in out


def test_delays_say_when_by_step_or_by_time(tpdp, tmp_path):
    """A delay's texts place it by step where the run has steps, and by its time since the first
    op where it has none (every row of such a run is in step 0, which says nothing)."""
    wi = RC.what_if(tpdp)
    d = wi["delays"][0]
    assert d["when"] == f"step {d['step']}" == "step 3"
    assert any(s["name"].endswith("(step 3) removed") for s in wi["scenarios"] if s["kind"] == "fix_delay")
    # the same layout without step numbers: one step for every row
    import pyarrow.parquet as pq

    src = str(tmp_path / "nosteps")
    synth_layout(src, "tpdp", tp=2, dp=4, steps=STEPS, delays=[(5, 3, DELTA)])
    import glob
    for f in glob.glob(f"{src}/**/*.parquet", recursive=True):
        t = pq.read_table(f)
        if "step" in t.column_names:
            i = t.column_names.index("step")
            t = t.set_column(i, "step", pa.array([0] * len(t), t.schema.field("step").type))
            pq.write_table(t, f)
    run = commtrace.load(src)
    d2 = RC.what_if(run)["delays"][0]
    assert (d2["rank"], d2["step"]) == (5, 0)
    m = build_model(run)
    want = (d2["t_ns"] - (m.base_ns + float(m.ev_start.min()))) / 1e9
    assert d2["when"] == f"at +{RC._fmt_s(want)}" and want > 3 * 2e-3   # after three steps of two 1 ms gaps
    run.close()


def test_delay_straggler_beside_one_long_stall_of_another_rank(tmp_path):
    """A rank that trails in 7 of 8 steps (40 ms before its TP all_reduce) is a straggler by
    delay analysis although another rank stalled once for 600 ms and that one stall cost more
    waiting than all of its delays: the stall is neither the other ranks' typical delay (the
    median over them of each rank's median excess: 0 here) nor enough to push the straggler's
    share of the waiting under the threshold (a quarter: here 31%). CI met the real-run form of
    this (tests/test_findings_subgroup.py: rank 3 at 44% of the waiting behind one 1 s stall of
    rank 1 on a loaded host) when the threshold was a half and "typical" the median of the other
    ranks' delays, which one stall sets."""
    out = tmp_path / "t"
    synth_layout(out, "tpdp", tp=2, dp=2, steps=8,
                 delays=[(3, s, 40_000_000) for s in range(8)] + [(1, 4, 600_000_000)])
    run = commtrace.load(str(out))
    da = RC.delay_stragglers(run)
    assert [f.rank for f in da] == [3], [(f.rank, f.message) for f in da]
    ev = da[0].evidence
    assert ev["typical_delay_s"] == 0.0 and ev["recurs_in"] >= 7
    assert 0.25 <= ev["share_of_wait"] < 0.5, ev
    assert abs(ev["mean_delay_s"] - 0.040) < 1e-6, ev
    # rank 1's single stall is no straggler: one delay, no recurrence
    assert 1 not in [f.rank for f in run.findings() if f.kind == "straggler"]
    run.close()


def test_delay_straggler_named_where_its_delays_cost_most(tmp_path):
    """A straggler's finding names the op and site where its delays cost most together, not its
    costliest single delay: 40 ms before its TP all_reduce in every step, once 100 ms before its
    DP all_reduce. CI met the real-run form (a loaded host's stall of rank 3 before the world's
    all_gather outweighed any one of its planted sleeps)."""
    out = tmp_path / "t"
    synth_layout(out, "tpdp", tp=2, dp=2, steps=8,
                 delays=[(3, s, 40_000_000) for s in range(8)] + [(3, 5, 100_000_000, "dp")])
    run = commtrace.load(str(out))
    [f] = RC.delay_stragglers(run)
    rows = [d for d in D.delays(run).to_pylist() if d["rank"] == 3]
    costliest = rows[0]
    assert costliest["delay_s"] > 0.09 and costliest["step"] == 5    # the single DP delay
    tp_rows = [d for d in rows if (d["op"], d["site"]) != (costliest["op"], costliest["site"])]
    assert len(tp_rows) >= 6
    assert (f.rank, f.op, f.site) == (3, tp_rows[0]["op"], tp_rows[0]["site"])
    assert f.site != costliest["site"]
    assert "most before all_reduce at " + f.site in f.message
    run.close()
