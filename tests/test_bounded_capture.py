"""Bounded capture (issue 17): --steps and --schedule windows and --max-size ring retention on
real 2-rank gloo runs: exact op rows inside the windows, the same collectives on both ranks (no
not_joined at the window's edges), per-step counters complete outside them, retention under its
cap with what it dropped on record."""

from __future__ import annotations

import glob
import json
import os

import pyarrow.parquet as pq
import pytest

import commtrace
from conftest import ROOT, load_rows, run_path, run_traced, torchrun_cmd

SCRIPT = os.path.join(ROOT, "tests", "scripts", "bounded_steps.py")
#: per step and rank: 3 all_reduce (1, 4, 16 KiB) + 1 broadcast (256 B); a barrier after step 7
PER_STEP = {"all_reduce": (3, 4 * (256 + 1024 + 4096)), "broadcast": (1, 256)}
STEPS = 8


def _check_window(out, recorded: set[int]):
    rows = load_rows(out)
    for r in (0, 1):
        ops = [x for x in rows if x["rank"] == r and x["kind"] == "op"]
        # exact op rows: the window's steps only, 4 ops each
        assert sorted({x["step"] for x in ops}) == sorted(recorded)
        assert len(ops) == 4 * len(recorded)
        for s in recorded:
            mine = [x for x in ops if x["step"] == s]
            assert sorted(x["op"] for x in mine) == ["all_reduce"] * 3 + ["broadcast"]
        # counters: every other step, complete (ops and bytes per kind)
        cnt = [x for x in rows if x["rank"] == r and x["kind"] == "counter"]
        by = {}
        for x in cnt:
            d = json.loads(x["detail"])
            k = (x["step"], x["op"])
            n, b, bl = by.get(k, (0, 0, 0))
            by[k] = (n + d["ops"], b + x["bytes"], bl + d["blocked_ns"])
        for s in range(STEPS):
            if s in recorded:
                assert not any(k[0] == s for k in by), s
                continue
            for op, (n, b) in PER_STEP.items():
                assert by[(s, op)][:2] == (n, b), (r, s, op, by.get((s, op)))
                assert by[(s, op)][2] > 0
        assert by[(STEPS, "barrier")][0] == 1
        # step markers are kept for every step
        assert sorted(x["step"] for x in rows if x["rank"] == r and x["kind"] == "mark") == list(range(1, STEPS + 1))
    # the same collectives on both ranks: nothing half in the window
    keys = [{(x["pg"], x["seq"]) for x in rows if x["rank"] == r and x["kind"] == "op"} for r in (0, 1)]
    assert keys[0] == keys[1]
    run = commtrace.load(run_path(out))
    try:
        rep = run.report()
        assert not [f for f in rep["findings"] if f["kind"] in ("not_joined", "not_completed", "collective_mismatch")]
        c = run.collectives()
        assert c.num_rows == 4 * len(recorded) and all(c["complete"].to_pylist())
        sc = {(x["step"], x["op"]): x for x in rep["step_counters"]}
        for s in range(STEPS):
            if s not in recorded:
                assert sc[(s, "all_reduce")]["ops"] == 2 * 3 and sc[(s, "broadcast")]["ops"] == 2
    finally:
        run.close()


@pytest.mark.slow
def test_steps_window(tmp_path):
    out = tmp_path / "w"
    run_traced(str(out), torchrun_cmd(SCRIPT, "--steps", STEPS), opts=("--steps", "2:5"))
    _check_window(out, {2, 3, 4})


@pytest.mark.slow
def test_schedule_window(tmp_path):
    out = tmp_path / "s"
    # cycles of 3 steps (1 skipped, 2 recorded), twice: steps 1, 2, 4, 5
    run_traced(str(out), torchrun_cmd(SCRIPT, "--steps", STEPS), opts=("--schedule", "wait=1,active=2,repeat=2"))
    _check_window(out, {1, 2, 4, 5})


@pytest.mark.slow
def test_max_size_ring_retention(tmp_path):
    out = tmp_path / "m"
    cap = 12_000
    run_traced(str(out), torchrun_cmd(SCRIPT, "--steps", 40, "--sleep", 0.05),
               opts=("--max-size", str(cap), "--flush-interval", "0.1"))
    d = run_path(out)
    rows = load_rows(out)
    for r in (0, 1):
        parts = sorted(glob.glob(os.path.join(d, f"rank={r}", "part-*.parquet")))
        sizes = [os.path.getsize(p) for p in parts]
        # the cap holds but for the newest part, which always stays
        assert sum(sizes[:-1]) <= cap, sizes
        ret = json.loads(open(os.path.join(d, f"rank={r}", "_retention.json")).read())
        dropped = ret["dropped"]
        assert dropped["parts"] >= 1 and dropped["rows"] >= 1
        kept = sum(pq.read_metadata(p).num_rows for p in parts)
        total_ops = 40 * 4 + 1
        mine = [x for x in rows if x["rank"] == r and x["kind"] != "mark"]
        assert len(mine) == kept - sum(1 for x in rows if x["rank"] == r and x["kind"] == "mark")
        # the oldest went first: what is kept is the end of the run
        assert max(x["step"] for x in mine) == 40
        assert min(x["step"] for x in mine) > dropped["last_step"] - 1
        assert len([x for x in mine if x["kind"] == "op"]) + dropped["rows"] >= total_ops
        # the run's manifest says what was dropped, rank by rank
        man = json.loads(open(os.path.join(d, "_manifest.json")).read())
        assert man["retention"][str(r)] == dropped
    run = commtrace.load(d)
    try:
        assert any("--max-size" in w for w in run.warnings)
    finally:
        run.close()


def test_bad_bounded_options_are_one_line_errors(tmp_path):
    from commtrace.cli import main

    for opt, val in (("--steps", "5:2"), ("--schedule", "wait=1"), ("--max-size", "lots")):
        assert main(["run", "-o", str(tmp_path / "x"), opt, val, "--", "true"]) == 2


def test_window_unit():
    from commtrace.capture.window import Window, parse_schedule, parse_size, parse_steps

    w = Window(None, parse_schedule("wait=1,active=2,repeat=2"))
    assert [s for s in range(10) if w.recorded(s)] == [1, 2, 4, 5]
    w = Window(parse_steps("3:"), parse_schedule("wait=0,active=1,repeat=0"))
    assert [s for s in range(6) if w.recorded(s)] == [3, 4, 5]
    assert parse_size("500MB") == 500_000_000 and parse_size("2GiB") == 2 << 30


def _start_on_demand(out, n_steps, *opts):
    """Start `commtrace run --on-demand` over the 2-rank step script and wait until rank 0's
    counters show step 5 or later: (the process, the last step seen)."""
    import subprocess
    import sys
    import time

    from conftest import clean_env

    cmd = [sys.executable, "-m", "commtrace", "run", "-o", str(out), "--on-demand", *opts, "--flush-interval", "0.1",
           "--", *torchrun_cmd(SCRIPT, "--steps", n_steps, "--sleep", 0.1)]
    p = subprocess.Popen(cmd, env=clean_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, read = -1, set()
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        # each part once: re-reading every part each time took longer than the job under load,
        # and the trigger then came after its last step
        for f in sorted(set(glob.glob(str(out / "*" / "rank=0" / "counters-*.parquet"))) - read):
            try:
                seen = max([seen] + [s for s in pq.read_table(f, columns=["step"])["step"].to_pylist() if s is not None])
                read.add(f)
            except Exception:  # noqa: BLE001 -- a part being renamed
                pass
        if seen >= 5:
            break
        time.sleep(0.1)
    if not (seen >= 5 and p.poll() is None):
        p.kill()
        raise AssertionError("the job did not get going")
    return p, seen


@pytest.mark.slow
def test_on_demand_trigger_records_the_same_next_steps_on_every_rank(tmp_path):
    """`commtrace run --on-demand` writes counters only; `commtrace trigger DIR --steps 4` on the
    running job makes both ranks record the same 4 consecutive steps exactly, agreed through
    the store, starting after the step the job was at."""
    import subprocess
    import sys
    import time

    from commtrace.cli import main
    from conftest import clean_env

    out = tmp_path / "t"
    n_steps = 80
    p, seen = _start_on_demand(out, n_steps)
    try:
        assert main(["trigger", str(out), "--steps", "4"]) == 0
        stdout, stderr = p.communicate(timeout=180)
        assert p.returncode == 0, stderr[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
    rows = load_rows(out)
    steps = []
    for r in (0, 1):
        ops = [x for x in rows if x["rank"] == r and x["kind"] == "op"]
        st = sorted({x["step"] for x in ops})
        assert len(st) == 4 and st == list(range(st[0], st[0] + 4)), st
        assert st[0] > seen and len(ops) == 16
        steps.append(st)
        cnt = {}
        for x in rows:
            if x["rank"] == r and x["kind"] == "counter":
                cnt[x["step"]] = cnt.get(x["step"], 0) + json.loads(x["detail"])["ops"]
        assert all(cnt[s] == 4 for s in range(n_steps) if s not in st) and not set(cnt) & set(st)
    assert steps[0] == steps[1]
    run = commtrace.load(run_path(out))
    try:
        rep = run.report()
        assert not [f for f in rep["findings"] if f["kind"] in ("not_joined", "not_completed")]
        assert run.collectives().num_rows == 16
    finally:
        run.close()


@pytest.mark.slow
def test_on_demand_sigusr2_to_commtrace_run_triggers(tmp_path):
    """SIGUSR2 sent to `commtrace run` (not the ranks) writes the same trigger as `commtrace
    trigger OUT --steps N`, with N from --trigger-steps: both ranks record the same 3 steps."""
    import signal

    out = tmp_path / "t"
    p, seen = _start_on_demand(out, 80, "--trigger-steps", "3")
    try:
        p.send_signal(signal.SIGUSR2)
        stdout, stderr = p.communicate(timeout=180)
        assert p.returncode == 0, stderr[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
    assert f"kill -USR2 {p.pid}" in stderr and "SIGUSR2: trigger" in stderr, stderr[-2000:]
    rows = load_rows(out)
    steps = []
    for r in (0, 1):
        st = sorted({x["step"] for x in rows if x["rank"] == r and x["kind"] == "op"})
        assert len(st) == 3 and st == list(range(st[0], st[0] + 3)) and st[0] > seen, st
        steps.append(st)
    assert steps[0] == steps[1]


def test_trigger_needs_a_directory(tmp_path):
    from commtrace.cli import main

    assert main(["trigger", str(tmp_path / "nope"), "--steps", "3"]) == 2
    assert main(["trigger", str(tmp_path), "--steps", "0"]) == 2
