"""What root cause, critical path and what-if (issue 18) add to `commtrace report`.

    python benchmarks/rootcause.py                       # 64 ranks x 20,000 ops, 3 pairs
    python benchmarks/rootcause.py --dir /tmp/b64 --keep # reuse / keep the synthetic run
    python benchmarks/rootcause.py --before /tmp/old     # also time `--what-if` with the
                                                         # commtrace package under /tmp/old
    python benchmarks/rootcause.py --no-in-memory-base   # skip the base report held in memory

Synthesises the same run as benchmarks/analysis.py (`commtrace synth`, a planted straggler and
host hazards) and times, in fresh processes and alternating, `commtrace report DIR --format
json --no-what-if` (the baseline) and `... --what-if`, reading each child's wall time, CPU time
and peak RSS (and `... --no-what-if --in-memory`: `--what-if` holds a large run in memory where it
fits, the base report in a database file; the base held the same way shows what root cause
itself adds): `--repeat` pairs, each back to back, in alternating order. Prints the best of each
side by side, the difference, the medians, the median of the pairs' ratios with its distribution-free 95%
interval (common.median_ci: the figure least moved by the machine's drift) and the load
average. Then times the stages in one process (user + system CPU, page faults): model, delay
analysis, critical path, replay (with `--before`, `--repeat` times, alternating with the older tree's),
with the `commtrace` command's malloc tuning (model._retain_freed_memory) on, as in the reports.
`--before DIR` adds, in the same alternation, `... --what-if` run with DIR first on PYTHONPATH
(an older tree, e.g. `git archive REV commtrace | tar -x -C DIR` plus the built extensions):
before and after side by side under the same load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from analysis import _measured  # noqa: E402  (benchmarks/analysis.py)
from common import median_ci  # noqa: E402

# (the stages run as the `commtrace` command runs them: its malloc tuning on, cli.main's flag)
STAGES = r"""
import resource, sys, time
import commtrace, commtrace.analysis
commtrace.analysis.TUNE_MALLOC = True
from commtrace.analysis import model as M, delay as D, critical_path as CP, rootcause as RC
try:                 # (held as `report --what-if` holds it; an older tree has no in_memory)
    run = commtrace.load(sys.argv[1], in_memory=True)
except TypeError:
    run = commtrace.load(sys.argv[1])
run.collectives(); run.waits()
out, tot = [], 0.0
for name, f in (("model", lambda: M.build_model(run)), ("delay analysis", lambda: D.attribution(run)),
                ("critical path", lambda: CP.summary(run)), ("what-if replay", lambda: RC.what_if(run))):
    r0 = resource.getrusage(resource.RUSAGE_SELF); w = time.perf_counter(); f()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    u, s = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    tot += u + s
    out.append(f"{name} {u + s:.2f} s cpu ({u:.2f} user + {s:.2f} sys, {r1.ru_minflt - r0.ru_minflt} page faults)"
               f" / {time.perf_counter() - w:.2f} s wall")
print("; ".join(out) + f"; total {tot:.2f} s cpu, peak RSS "
      f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
"""


def _stages(path: str, tree: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = tree + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    lines = subprocess.run([sys.executable, "-c", STAGES, path], capture_output=True, text=True,
                           env=env).stdout.strip().splitlines()
    return lines[-1] if lines else "?"   # (DuckDB's own progress bar may precede it)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--ops", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--before", default=None, help="directory holding an older commtrace package")
    ap.add_argument("--no-in-memory-base", dest="in_memory_base", action="store_false",
                    help="skip the base report held in memory (--no-what-if --in-memory)")
    a = ap.parse_args()
    tmp = None
    path = a.dir
    if path is None:
        tmp = tempfile.mkdtemp(prefix="commtrace-bench-")
        path = os.path.join(tmp, "run")
    if not os.path.exists(os.path.join(path, "_manifest.json")):
        from commtrace.analysis.synth import synth_run
        synth_run(path, ranks=a.ranks, ops=a.ops, straggler=[(a.ranks // 3, 2_000_000)], hazards=True,
                  init_stall_ns=50_000_000)
    path = os.path.abspath(path)
    # `python -m` puts the working directory first on sys.path: run the reports from an empty
    # one, so that the code timed is the installed tree's (or --before's, on PYTHONPATH)
    os.chdir(tempfile.mkdtemp(prefix="commtrace-bench-cwd-"))
    load0 = os.getloadavg()
    cmd = [sys.executable, "-m", "commtrace", "report", path, "--format", "json", "--no-progress"]
    try:
        base, full, before, mem = [], [], [], []
        # (`--what-if` holds the run in memory where it fits, the base report in the database
        # file: `--no-what-if --in-memory` is the base held as the what-if's is, timed too)
        sides = [(base, ["--no-what-if"]), (full, ["--what-if"])] + ([(mem, ["--no-what-if", "--in-memory"])]
                                                                     if a.in_memory_base else [])
        for i in range(max(1, a.repeat)):
            # each pair back to back, its order alternating: a drift of the machine's speed
            # (which moved the medians by 10-30% within a run) falls on both sides alike
            for out, flag in (sides if i % 2 == 0 else sides[::-1]):
                out.append(_measured(cmd + flag)[:3])
            if a.before:
                old = os.environ.get("PYTHONPATH")
                os.environ["PYTHONPATH"] = os.path.abspath(a.before) + (os.pathsep + old if old else "")
                try:
                    before.append(_measured(cmd + ["--what-if"])[:3])
                finally:
                    if old is None:
                        os.environ.pop("PYTHONPATH", None)
                    else:
                        os.environ["PYTHONPATH"] = old
        # the stages in fresh processes, alternating with --before's when given (from the empty
        # working directory, the tree's code on PYTHONPATH)
        st_after, st_before = [], []
        for _ in range(max(1, a.repeat) if a.before else 1):
            st_after.append(_stages(path, ROOT))
            if a.before:
                st_before.append(_stages(path, os.path.abspath(a.before)))
    finally:
        if tmp and not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    b, f = min(base), min(full)
    print(f"{a.ranks} ranks x {a.ops} ops, best of {len(base)} (wall / cpu / peak RSS):")
    print(f"  report --no-what-if: {b[0]:.2f} s / {b[1]:.2f} s / {max(x[2] for x in base):.0f} MB  "
          f"(runs: {', '.join(f'{x[0]:.2f}' for x in base)} s)")
    print(f"  report --what-if:    {f[0]:.2f} s / {f[1]:.2f} s / {max(x[2] for x in full):.0f} MB  "
          f"(runs: {', '.join(f'{x[0]:.2f}' for x in full)} s)")
    print(f"  added: {f[0] - b[0]:+.2f} s wall ({100 * (f[0] - b[0]) / b[0]:+.0f}%), "
          f"{f[1] - b[1]:+.2f} s cpu ({100 * (f[1] - b[1]) / b[1]:+.0f}%)")
    med = lambda xs: statistics.median(x[0] for x in xs)   # noqa: E731
    mb, mf = med(base), med(full)
    print(f"  medians: --no-what-if {mb:.2f} s, --what-if {mf:.2f} s: added {mf - mb:+.2f} s "
          f"({100 * (mf - mb) / mb:+.0f}%)" + (f"; before {med(before):.2f} s: added {med(before) - mb:+.2f} s "
                                                f"({100 * (med(before) - mb) / mb:+.0f}%)" if before else ""))
    ratios = [f_[0] / b_[0] for f_, b_ in zip(full, base)]
    mid, (lo, hi) = statistics.median(ratios), median_ci(ratios)
    print(f"  paired: --what-if / --no-what-if, median of the {len(base)} back-to-back pairs' ratios "
          f"{mid:.3f} [95% CI {lo:.3f}, {hi:.3f}] ({100 * (mid - 1):+.0f}%; target <= +30%: "
          f"{'met' if hi <= 1.30 else 'NOT shown' if mid <= 1.30 else 'missed'})")
    if mem:
        m_ = min(mem)
        print(f"  report --no-what-if --in-memory (held as --what-if holds it): {m_[0]:.2f} s / {m_[1]:.2f} s / "
              f"{max(x[2] for x in mem):.0f} MB  (runs: {', '.join(f'{x[0]:.2f}' for x in mem)} s)")
        r2 = [f_[0] / m2[0] for f_, m2 in zip(full, mem)]
        mid2, (lo2, hi2) = statistics.median(r2), median_ci(r2)
        print(f"  paired: --what-if / --no-what-if --in-memory, median of the pairs' ratios {mid2:.3f} "
              f"[95% CI {lo2:.3f}, {hi2:.3f}] (+{100 * (mid2 - 1):.0f}%: what root cause adds on the same storage)")
    print(f"  --what-if within 3 s: best {f[0]:.2f} s, median {mf:.2f} s "
          f"({'met at the median' if mf <= 3.0 else 'met at the best run' if f[0] <= 3.0 else 'missed'})")
    if before:
        o = min(before)
        print(f"  report --what-if, before ({a.before}): {o[0]:.2f} s / {o[1]:.2f} s / "
              f"{max(x[2] for x in before):.0f} MB  (runs: {', '.join(f'{x[0]:.2f}' for x in before)} s)")
        print(f"  added before: {o[0] - b[0]:+.2f} s wall ({100 * (o[0] - b[0]) / b[0]:+.0f}%), "
              f"{o[1] - b[1]:+.2f} s cpu ({100 * (o[1] - b[1]) / b[1]:+.0f}%)")
    for x in st_after:
        print(f"  stages (one process): {x}")
    for x in st_before:
        print(f"  stages, before (one process): {x}")
    print(f"machine: {os.cpu_count()} cpus, load average {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
