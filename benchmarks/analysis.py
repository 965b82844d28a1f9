"""Benchmark of the analysis: a full `commtrace report` on synthetic runs.

    python benchmarks/analysis.py                       # 64 ranks x 20,000 ops (1.28M ops)
    python benchmarks/analysis.py --ranks 512 --ops 20000
    python benchmarks/analysis.py --dir /tmp/b64 --keep  # reuse / keep the synthetic run

Each measurement runs `commtrace report DIR --format json` in a fresh process (imports
included) and reads its wall time and peak RSS (ru_maxrss of the child); the best of
--repeat runs is reported with all runs listed. Targets (issue 3): 64 x 20,000 in <= 5 s and
<= 1.5 GB peak on the 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def child_report(path: str, extra: tuple = ()) -> tuple[float, float, float]:
    """(wall s, cpu s, peak RSS MB) of one `commtrace report` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "commtrace", "report", path, "--format", "json",
                        "--no-progress", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"report failed: {p.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--ops", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="run directory (synthesised if missing)")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic run")
    ap.add_argument("--what-if-cost", action="store_true",
                    help="also time `report --no-what-if`, alternating, and print the root cause / "
                         "what-if share (issue 18)")
    a = ap.parse_args()

    from commtrace.analysis.synth import synth_run

    tmp = None
    path = a.dir
    if path is None:
        tmp = tempfile.mkdtemp(prefix="commtrace-bench-")
        path = os.path.join(tmp, "run")
    if not os.path.exists(os.path.join(path, "_manifest.json")):
        t0 = time.perf_counter()
        synth_run(path, ranks=a.ranks, ops=a.ops, straggler=[(a.ranks // 3, 2_000_000)],
                  hazards=True, init_stall_ns=50_000_000)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
        print(f"synth: {a.ranks} ranks x {a.ops} ops in {time.perf_counter() - t0:.1f} s, "
              f"{size / 1e6:.0f} MB on disk", flush=True)
    load0 = os.getloadavg()[0]
    try:
        runs, bare = [], []
        for _ in range(max(1, a.repeat)):
            runs.append(child_report(path))
            if a.what_if_cost:
                bare.append(child_report(path, ("--no-what-if",)))
    finally:
        if tmp and not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    best = min(runs)
    print(f"report: {a.ranks} ranks x {a.ops} ops ({a.ranks * a.ops / 1e6:.2f}M ops): "
          f"best {best[0]:.2f} s wall, {best[1]:.2f} s cpu, peak RSS {max(r[2] for r in runs):.0f} MB")
    print("runs: " + "; ".join(f"{w:.2f} s wall / {c:.2f} s cpu / {m:.0f} MB" for w, c, m in runs))
    if bare:
        b = min(bare)
        print(f"report --no-what-if: best {b[0]:.2f} s wall, {b[1]:.2f} s cpu, peak RSS "
              f"{max(r[2] for r in bare):.0f} MB; runs: " + "; ".join(f"{w:.2f} s / {c:.2f} s cpu" for w, c, _ in bare))
        print(f"root cause + critical path + what-if add {best[0] - b[0]:+.2f} s wall "
              f"({100 * (best[0] - b[0]) / b[0]:+.0f}%), {best[1] - b[1]:+.2f} s cpu "
              f"({100 * (best[1] - b[1]) / b[1]:+.0f}%) (best against best)")
    print(f"machine: {os.cpu_count()} cpus, load average {load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
