"""Benchmark of the analysis at scale: a full `commtrace report` on synthetic runs, three sizes
side by side in one run.

    python benchmarks/analysis.py                          # 64x20000, 512x20000, 2048x50000
    python benchmarks/analysis.py --cases 64x20000 --repeat 3
    python benchmarks/analysis.py --dir /tmp/bench --keep  # reuse / keep the synthetic runs

Each case synthesises a run (`commtrace synth`'s generator: all_reduce buckets, all_gather,
reduce_scatter, broadcast, isend/irecv pairs, step markers, a planted straggler and host
hazards) unless it is already in --dir, then runs `commtrace report DIR --format json` in a
fresh process (imports included) and reads its wall time, CPU time and peak RSS (ru_maxrss of
the child). The largest case runs once (it takes minutes), the others --repeat times (best
wall, highest RSS). Also printed: the generator's time and peak RSS, the bytes per op on disk,
the load average before and after (`uptime`), and the targets of issue 17:

    64 x 20,000     1.28 M ops   <= 3 s wall, <= 500 MB peak
    512 x 20,000    10.2 M ops   <= 20 s wall, <= 3 GB peak
    2,048 x 50,000  102 M ops    within a 6 GB memory limit, <= 10 min
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TARGETS = {"64x20000": (3.0, 500), "512x20000": (20.0, 3000), "2048x50000": (600.0, 6144)}
#: DuckDB memory limit passed to `commtrace report` per case (the 6 GB case leaves room for
#: Python, numpy chunks and Arrow results).
MEMORY_LIMITS = {"2048x50000": "4GB"}
LARGE_OPS = 50_000_000


def _measured(argv: list[str]) -> tuple[float, float, float, str]:
    """Run `argv` under a fresh wrapper so that its peak RSS is its own."""
    wrapper = ("import json, resource, subprocess, sys, time\n"
               "t0 = time.perf_counter(); p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, text=True)\n"
               "w = time.perf_counter() - t0; u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
               "print(json.dumps({'rc': p.returncode, 'wall': w, 'cpu': u.ru_utime + u.ru_stime,"
               " 'rss_mb': u.ru_maxrss / 1024, 'tail': p.stdout[-300:]}))\n")
    p = subprocess.run([sys.executable, "-c", wrapper] + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        d = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SystemExit(f"measurement failed: {p.stderr.strip()[-2000:]}")
    if d["rc"] != 0:
        raise SystemExit(f"{' '.join(argv[:5])} failed (rc {d['rc']}): {p.stderr.strip()[-2000:]}")
    return d["wall"], d["cpu"], d["rss_mb"], d["tail"]


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs if f.endswith(".parquet"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="64x20000,512x20000,2048x50000",
                    help="comma list of RANKSxOPS (default: the three of issue 17)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per case below 50M ops (best wall)")
    ap.add_argument("--dir", default=None, help="directory of the synthetic runs (kept with --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic runs")
    ap.add_argument("--nice", type=int, default=0, help="niceness of the child processes")
    a = ap.parse_args()

    base = a.dir or tempfile.mkdtemp(prefix="commtrace-bench-")
    os.makedirs(base, exist_ok=True)
    pre = ["nice", "-n", str(a.nice)] if a.nice else []
    load0 = os.getloadavg()
    rows = []
    try:
        for case in [c.strip() for c in a.cases.split(",") if c.strip()]:
            ranks, ops = (int(x) for x in case.lower().split("x"))
            path = os.path.join(base, f"r{ranks}x{ops}")
            gen = None
            if not os.path.exists(os.path.join(path, "_manifest.json")):
                code = ("from commtrace.analysis.synth import synth_run\n"
                        f"synth_run({path!r}, ranks={ranks}, ops={ops}, straggler=[({ranks // 3}, 2_000_000)], "
                        "hazards=True, init_stall_ns=50_000_000)\n")
                gen = _measured(pre + [sys.executable, "-c", code])
                print(f"synth {case}: {gen[0]:.1f} s wall, peak RSS {gen[2]:.0f} MB", flush=True)
            total_ops = ranks * ops
            cmd = pre + [sys.executable, "-m", "commtrace", "report", path, "--format", "json", "--no-progress"]
            if case in MEMORY_LIMITS:
                cmd += ["--memory-limit", MEMORY_LIMITS[case]]
            n = 1 if total_ops >= LARGE_OPS else max(1, a.repeat)
            runs = []
            for _ in range(n):
                runs.append(_measured(cmd))
                print(f"report {case}: {runs[-1][0]:.2f} s wall, {runs[-1][1]:.2f} s cpu, "
                      f"{runs[-1][2]:.0f} MB peak (load {os.getloadavg()[0]:.1f})", flush=True)
            rows.append((case, total_ops, _size(path), gen, runs))
    finally:
        if not a.keep and a.dir is None:
            shutil.rmtree(base, ignore_errors=True)

    print()
    print(f"machine: {os.cpu_count()} cpus; load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
          f"after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    hdr = ("case", "ops", "B/op", "synth s", "synth MB", "report wall s (runs)", "cpu s", "peak MB", "target", "met")
    print(" | ".join(hdr))
    for case, total_ops, size, gen, runs in rows:
        best = min(r[0] for r in runs)
        peak = max(r[2] for r in runs)
        cpu = min(r[1] for r in runs)
        tw, tm = TARGETS.get(case, (None, None))
        met = "" if tw is None else ("yes" if best <= tw and peak <= tm else "no")
        print(" | ".join([
            case, f"{total_ops / 1e6:.2f}M", f"{size / total_ops:.1f}",
            "-" if gen is None else f"{gen[0]:.0f}", "-" if gen is None else f"{gen[2]:.0f}",
            f"{best:.2f} ({', '.join(f'{r[0]:.2f}' for r in runs)})", f"{cpu:.1f}", f"{peak:.0f}",
            "-" if tw is None else f"<= {tw:g} s, <= {tm} MB", met]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
