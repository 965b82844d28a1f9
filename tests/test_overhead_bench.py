"""benchmarks/overhead.py still runs and reports what docs/performance.md quotes (a tiny run:
the figures themselves are measured by the benchmark, not asserted here)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # issue 14: main suite within 8 minutes; CI's slow stage runs it
def test_overhead_benchmark_small_run(tmp_path):
    out = tmp_path / "o.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"),
                        "--world-size", "1", "--rounds", "4", "--ops", "20", "--blocks", "60",
                        "--pin", "one", "--sweep-kb", "64", "--ab", "gap,prefetch,shared_bare,aa,hot",
                        "--json", str(out)], capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    (r,) = json.loads(out.read_text())
    assert r["world_size"] == 1 and r["rounds"] == 4 and r["ops_per_round"] == 20
    if hasattr(os, "sched_setaffinity"):  # pinned to one CPU of those this test may use
        assert r["pin"] == "one" and len(r["cpus"]) == 1 and r["cpus"][0] in os.sched_getaffinity(0)
    # every traced call is a row: warm-up (20) + rounds (4 x 20) + per-op warm-up and blocks
    # (four traced modes: commtrace, and --ab's gap check off, prefetch off and the op right
    # after commtrace's), and the barrier that starts the per-op blocks (the recorder is on)
    assert r["op_rows_recorded"] == 20 + 4 * 20 + 4 * (200 + 60) + 1
    # the untraced modes run on groups of their own (untraced, bare, --ab aa's bare2), so no
    # traced op is preceded by an unrecorded one on its group: the only gap rows are the
    # default group's barriers of the rounds (recorder off) and those three groups, each
    # reported once. The ops with the gap check switched off leave no gap behind either.
    assert r["groups"] == "own" and r["ab"] == ["aa", "gap", "hot", "prefetch", "shared_bare"]
    assert r["gap_rows_recorded"] == 4 and r["rows_recorded"] == r["op_rows_recorded"] + 4
    assert r["untraced_us"] > 0 and r["cpu_untraced_us"] > 0
    for k in ("commtrace_added_us", "cpu_commtrace_added_us", "cpu_commtrace_minus_profiler_us"):
        lo, hi = r["ci95"][k]
        assert lo <= r[k] <= hi
    po = r["per_op"]
    assert po["blocks"] == 60
    lo, hi = po["cpu_commtrace_added_ci95_us"]
    assert lo <= po["cpu_commtrace_added_us"] <= hi
    for ab in ("gap", "prefetch", "shared_bare", "aa", "hot"):   # each paired with its reference
        lo, hi = po[f"cpu_ab_{ab}_ci95_us"]
        assert lo <= po[f"cpu_ab_{ab}_us"] <= hi
    assert "gap check's cost (seq read) (paired)" in p.stdout and "A/A: bare - bare2" in p.stdout
    lo, hi = po["cpu_hot_commtrace_minus_bare_ci95_us"]   # both right after their first op
    assert lo <= po["cpu_hot_commtrace_minus_bare_us"] <= hi
    assert "right after: commtrace - bare" in p.stdout
    lines = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("target,")]
    assert [ln.split(":")[0].split(",")[1].strip() for ln in lines] == ["wall time", "thread CPU"]
    # the per-op means (what the median leaves out) and the verdict on the rounds too
    lo, hi = po["cpu_commtrace_added_mean_ci95_us"]
    assert lo <= po["cpu_commtrace_added_mean_us"] <= hi and po["sweep_kb"] == 64
    assert "commtrace adds, mean" in p.stdout and "64 KB of memory written before each op" in p.stdout
    lines = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("target (rounds),")]
    assert [ln.split(":")[0].split(",")[1].strip() for ln in lines] == ["wall time", "thread CPU"]


@pytest.mark.slow
def test_gapcheck_benchmark_small_run():
    """benchmarks/gapcheck.py (2 ranks, per-op blocks) runs, prints every pairing on both
    clocks, and every traced op is recorded: no gap row on a fully traced loop."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gapcheck.py"), "--blocks", "40"],
                       capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert "world size 2, 40 blocks" in out and "capture path c" in out
    for label in ("check off - bare", "read after - check off", "read at wait - check off",
                  "read after - read at wait"):
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(label))
        med, lo, hi = (float(x) for x in line[len(label) + 2:].replace("[", " ").replace(
            "]", " ").replace(",", " ").split()[:3])
        assert lo <= med <= hi
    assert "gap rows written: 0 " in out
