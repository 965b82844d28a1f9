"""What the report says about delays that are no finding, tied arrivals, and `commtrace synth`'s
mode options (found by running user-style jobs: a GAN-style job whose rank 1 sleeps 50 ms in 3
of 30 steps got "No findings" and nothing else; a layout run with exact ties named a false
straggler)."""

from __future__ import annotations

import json

from commtrace.analysis.synth import synth_layout
from commtrace.cli import main

MS = 1_000_000


def _run(capsys, *args):
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_rare_costly_delays_are_named_without_a_finding(tmp_path, capsys):
    # 4 ranks (TP 2 x DP 2), 20 steps, no jitter: rank 1 works 20 ms longer in steps 3 and 13.
    path = str(tmp_path / "tpdp")
    synth_layout(path, "tpdp", steps=20, delays=[(1, 3, 20 * MS), (1, 13, 20 * MS)])
    rc, out, _ = _run(capsys, "report", path, "--format", "json")
    assert rc == 0
    rep = json.loads(out)
    # two delays in twenty steps: too rare for a straggler, and nobody else is one
    assert rep["findings"] == []
    # Tied latest entries (no jitter) are no last arrival: rank 0 arrived last only at the two
    # DP collectives it reached late after waiting for rank 1 (it was "last" at 36 of 38 by the
    # lowest-rank tie break before); rank 1 at its TP and DP collectives of steps 3 and 13.
    last = {r["rank"]: r["last_count"] for r in rep["per_rank"]}
    assert last == {0: 2, 1: 4, 2: 0, 3: 0}
    # what the hint quotes is the what-if's own scenario: rank 1 as fast as the median saves
    # both delays (40 ms)
    sc = [x for x in rep["what_if"]["scenarios"] if x["kind"] == "rank_median" and x["params"]["rank"] == 1]
    assert abs(sc[0]["gain_s"] - 0.040) < 0.0004
    tr = rep["what_if"]["top_rank"]
    assert (tr["rank"], tr["steps"], tr["n_delays"], tr["op"], tr["site"]) == (1, [3, 13], 2, "all_reduce", "model.py:40")
    assert tr["gain_s"] == sc[0]["gain_s"]
    # the dashboard's overview (and the report's `overview` key) carries the same, and shows it
    assert rep["overview"]["top_rank"] == tr
    import commtrace
    from commtrace.analysis import overview as O
    from commtrace.dashboard import app as A

    run = commtrace.load(path)
    ov = O.overview(run)
    assert ov["top_rank"] == tr
    assert tr["text"] in str(A.overview_children(ov, None))
    run.close()
    rc, out, _ = _run(capsys, "report", path)
    assert rc == 0
    text = " ".join(out.split())
    assert "No findings" in text
    assert ("Delays still cost time: Making rank 1 as fast as the median rank would save 40 ms of "
            in text)
    assert "its 2 delay(s) of 1% of the run or more (steps 3, 13), the costliest before all_reduce at model.py:40" in text


def test_no_hint_without_costly_delays(tmp_path, capsys):
    path = str(tmp_path / "clean")
    synth_layout(path, "tpdp", steps=8)
    rc, out, _ = _run(capsys, "report", path)
    assert rc == 0 and "No findings" in out and "Delays still cost time" not in out


def test_synth_rejects_options_of_the_other_mode(tmp_path, capsys):
    out = str(tmp_path / "x")
    rc, _, err = _run(capsys, "synth", out, "--layout", "tpdp", "--straggler", "1:20ms", "--skew", "1:2")
    assert rc != 0 and err.count("\n") == 1
    assert err.startswith("commtrace: error: --straggler and --skew do not apply with --layout tpdp")
    rc, _, err = _run(capsys, "synth", out, "--delay", "1:2:3ms")
    assert rc != 0 and err == "commtrace: error: --delay needs --layout tpdp or --layout pipeline\n"
    # each mode with its own options still works
    assert _run(capsys, "synth", out, "--layout", "pipeline", "--delay", "1:2:3ms", "--steps", "4")[0] == 0
    assert _run(capsys, "synth", out, "--ops", "40", "--straggler", "1:2ms", "-f")[0] == 0


def test_failed_job_names_its_exceptions(tmp_path, capsys):
    # The `clean` fixture with exit flushes: ranks 1 and 3 raised the same error, rank 2
    # another, rank 0 exited normally. The header counts them; the lines below say what failed.
    import os
    import shutil
    import time

    from commtrace.format import schema as S

    d = tmp_path / "run"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "data", "clean"), d)
    errs = {1: "RuntimeError: Expected to have finished reduction in the prior iteration",
            2: "ValueError: bad\n  batch", 3: "RuntimeError: Expected to have finished reduction in the prior iteration"}
    for r in range(4):
        ex = {"how": "ok"} if r == 0 else {"how": "exception", "error": errs[r], "exit_code": 1}
        (d / f"rank={r}" / S.INFLIGHT_NAME).write_text(json.dumps(
            {"rank": r, "t_ns": time.time_ns(), "final": True, "ops": [], "flush_interval_s": 0.5, "exit": ex}))
    rc, out, _ = _run(capsys, "report", str(d))
    assert rc == 0
    lines = [ln for ln in out.splitlines() if ln.startswith("  rank")]
    assert lines[:2] == ["  ranks 1 and 3: RuntimeError: Expected to have finished reduction in the prior iteration",
                         "  rank 2: ValueError: bad batch"], lines
    assert "job: failed (exit code 1; ranks 1, 2, 3 exited on an exception)" in out
    assert out.index("job: failed") < out.index(lines[0]) < out.index("clock:")
    # the dashboard shows the same lines (one source: analysis.job.rank_errors / error_lines)
    import commtrace
    from commtrace.analysis import overview as O
    from commtrace.dashboard import app as A
    from commtrace.dashboard import overview as DO

    run = commtrace.load(str(d))
    ov = O.overview(run)
    assert ov["job"]["errors"] == [{"ranks": [1, 3], "error": errs[1]}, {"ranks": [2], "error": "ValueError: bad batch"}]
    assert ["  " + x for x in DO.error_lines(ov["job"])] == lines[:2]
    shown = str(A.overview_children(ov, None))
    assert "ranks 1 and 3: RuntimeError: Expected to have finished reduction" in shown
    assert "rank 2: ValueError: bad batch" in shown
    run.close()
