"""Benchmark of the analysis at scale: a full `commtrace report` on synthetic runs, three sizes
side by side in one run.

    python benchmarks/analysis.py                          # 64x20000, 512x20000, 2048x50000
    python benchmarks/analysis.py --cases 64x20000 --repeat 3
    python benchmarks/analysis.py --dir /tmp/bench --keep  # reuse / keep the synthetic runs
    python benchmarks/analysis.py --cases 64x20000 --against /tmp/base   # before / after

With `--against CHECKOUT` (another copy of the repository, e.g. `git worktree add /tmp/base
main` or `git archive main | tar -x -C /tmp/base`), each report runs with that checkout's
`commtrace` (PYTHONPATH) and with this one, alternately on the same run, and the table has a
row for each; the two report JSONs are compared (every value identical, numbers within 1e-9
relative: DuckDB's parallel float sums differ in the last bits between two runs of one
checkout; the first differences are printed otherwise).

Each case synthesises a run (`commtrace synth`'s generator: all_reduce buckets, all_gather,
reduce_scatter, broadcast, isend/irecv pairs, step markers, a planted straggler and host
hazards) unless it is already in --dir, then runs `commtrace report DIR --format json` in a
fresh process (imports included) and reads its wall time, CPU time and peak RSS (ru_maxrss of
the child). The largest case runs once (it takes minutes), the others --repeat times (best
wall, highest RSS). The 102 M case runs, generator and report, inside a memory cgroup of
--memory-cap (6 GB: a cgroup v1 or v2 memory controller writable here, as root in a
container; else the cap is not enforced and the table says so), with the query engine's
`--memory-limit` at 4 GB. Also printed: the generator's time and peak RSS, the bytes per op on disk,
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


def make_cgroup(limit_bytes: int) -> tuple[str | None, str]:
    """A new memory cgroup capped at `limit_bytes` (v1 `memory.limit_in_bytes` or v2
    `memory.max`), or (None, why not)."""
    name = f"commtrace-bench-{os.getpid()}"
    why = "no memory cgroup on this machine"
    for root, limit_file, probe in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.limit_in_bytes"),
                                    ("/sys/fs/cgroup", "memory.max", "cgroup.controllers")):
        if not os.path.exists(os.path.join(root, probe)):
            continue
        path = os.path.join(root, name)
        try:
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, limit_file), "w") as f:
                f.write(str(int(limit_bytes)))
            return path, f"cgroup {path} ({limit_file} {limit_bytes >> 20} MB)"
        except OSError as e:
            remove_cgroup(path)
            why = f"no writable memory cgroup ({e.strerror})"
    return None, why


def cgroup_peak(path: str) -> tuple[int | None, int | None]:
    """(peak bytes charged, times the OOM killer ran) of a cgroup made by make_cgroup."""
    def read(name):
        try:
            with open(os.path.join(path, name)) as f:
                return f.read()
        except OSError:
            return None
    peak = read("memory.max_usage_in_bytes") or read("memory.peak")
    oom = None
    ev = read("memory.oom_control") or read("memory.events") or ""
    for line in ev.splitlines():
        k, _, v = line.partition(" ")
        if k in ("oom_kill", "oom"):
            oom = (oom or 0) + int(v)
    return (int(peak) if peak else None), oom


def remove_cgroup(path: str | None) -> None:
    if path:
        try:
            os.rmdir(path)
        except OSError:
            pass


def _measured(argv: list[str], cgroup: str | None = None, code: str | None = None,
              out: str | None = None) -> tuple[float, float, float, str]:
    """Run `argv` under a fresh wrapper so that its peak RSS is its own (inside memory cgroup
    `cgroup` when given: the wrapper joins it before starting the child). `code`: the checkout
    whose `commtrace` the child imports (PYTHONPATH, working directory); `out`: a file that
    receives the child's whole stdout."""
    join = (f"open({os.path.join(cgroup, 'cgroup.procs')!r}, 'w').write(str(__import__('os').getpid()))\n"
            if cgroup else "")
    wrapper = ("import json, resource, subprocess, sys, time\n" + join +
               "t0 = time.perf_counter(); p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, text=True)\n"
               "w = time.perf_counter() - t0; u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
               + (f"open({out!r}, 'w').write(p.stdout)\n" if out else "") +
               "print(json.dumps({'rc': p.returncode, 'wall': w, 'cpu': u.ru_utime + u.ru_stime,"
               " 'rss_mb': u.ru_maxrss / 1024, 'tail': p.stdout[-300:]}))\n")
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = os.path.abspath(code) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run([sys.executable, "-c", wrapper] + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=env, cwd=os.path.abspath(code) if code else None)
    try:
        d = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SystemExit(f"measurement failed: {p.stderr.strip()[-2000:]}")
    if d["rc"] != 0:
        raise SystemExit(f"{' '.join(argv[:5])} failed (rc {d['rc']}): {p.stderr.strip()[-2000:]}")
    return d["wall"], d["cpu"], d["rss_mb"], d["tail"]


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs if f.endswith(".parquet"))


def _compare(a: str, b: str) -> str:
    """'identical', or how two report JSON files differ (the first differences)."""
    with open(a) as f:
        x = json.load(f)
    with open(b) as f:
        y = json.load(f)
    if x == y:
        return "identical"
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from report_compare import differences

    # DuckDB's parallel float sums and averages differ in the last bits from one run to the next
    # (the same code twice does too): numbers compare within 1e-9 relative, as the tests do.
    for r in (x, y):  # seconds since the last snapshot, as of the time of the report
        for st in (r.get("rank_states") or {}).values():
            if isinstance(st, dict):
                st.pop("snapshot_age_s", None)
    d = differences(x, y)
    exact = len(differences(x, y, rel=0.0, abs_=0.0))
    if not d:
        return f"identical within 1e-9 relative ({exact} float(s) differ in the last bits)"
    return f"DIFFER in {len(d)} place(s): " + "; ".join(d[:8])


def _compare_samples(against: str) -> None:
    """The report JSON of each committed sample run (tests/data) from both checkouts, compared."""
    data = os.path.join(ROOT, "tests", "data")
    tmp = tempfile.mkdtemp(prefix="commtrace-bench-samples-")
    try:
        for name in sorted(os.listdir(data)):
            path = os.path.join(data, name)
            if not os.path.isfile(os.path.join(path, "_manifest.json")):
                continue
            outs = []
            for code in (os.path.abspath(against), ROOT):
                out = os.path.join(tmp, f"{name}-{len(outs)}.json")
                env = dict(os.environ, PYTHONPATH=code)
                p = subprocess.run([sys.executable, "-m", "commtrace", "report", path, "--format", "json", "--no-progress"],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=code, env=env)
                with open(out, "w") as f:
                    f.write(p.stdout if p.returncode == 0 else json.dumps({"exit": p.returncode}))
                outs.append(out)
            print(f"sample {name}: JSON of previous and this {_compare(*outs)}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="64x20000,512x20000,2048x50000",
                    help="comma list of RANKSxOPS (default: the three of issue 17)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per case below 50M ops (best wall)")
    ap.add_argument("--dir", default=None, help="directory of the synthetic runs (kept with --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic runs")
    ap.add_argument("--nice", type=int, default=0, help="niceness of the child processes")
    ap.add_argument("--memory-cap", type=float, default=6.0,
                    help="GB: memory cgroup of the cases that have a DuckDB memory limit (the 102 M case)")
    ap.add_argument("--against", default=None, metavar="CHECKOUT",
                    help="also run every report with this checkout's commtrace, alternately, and compare the JSON")
    a = ap.parse_args()
    if a.against and not os.path.isfile(os.path.join(a.against, "commtrace", "analysis", "run.py")):
        raise SystemExit(f"--against {a.against}: not a commtrace checkout")
    codes = [(os.path.abspath(a.against), "previous"), (ROOT, "this")] if a.against else [(None, "")]
    if a.against:
        _compare_samples(a.against)

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
            cg, cap = None, "-"
            if case in MEMORY_LIMITS and a.memory_cap:
                cg, cap = make_cgroup(int(a.memory_cap * (1 << 30)))
                print(f"{case}: memory cap {a.memory_cap:g} GB: {cap if cg else 'NOT enforced, ' + cap}", flush=True)
                cap = f"{a.memory_cap:g} GB cgroup" if cg else "not enforced"
            if not os.path.exists(os.path.join(path, "_manifest.json")):
                code = ("from commtrace.analysis.synth import synth_run\n"
                        f"synth_run({path!r}, ranks={ranks}, ops={ops}, straggler=[({ranks // 3}, 2_000_000)], "
                        "hazards=True, init_stall_ns=50_000_000)\n")
                gen = _measured(pre + [sys.executable, "-c", code], cg)
                print(f"synth {case}: {gen[0]:.1f} s wall, peak RSS {gen[2]:.0f} MB", flush=True)
            total_ops = ranks * ops
            cmd = pre + [sys.executable, "-m", "commtrace", "report", path, "--format", "json", "--no-progress"]
            if case in MEMORY_LIMITS:
                cmd += ["--memory-limit", MEMORY_LIMITS[case]]
            n = 1 if total_ops >= LARGE_OPS else max(1, a.repeat)
            runs = {label: [] for _, label in codes}
            outs = {}
            try:
                for _ in range(n):
                    for code, label in codes:
                        outs[label] = os.path.join(base, f"report-{case}-{label or 'this'}.json") if a.against else None
                        r = _measured(cmd, cg, code=code, out=outs[label])
                        runs[label].append(r)
                        print(f"report {case}{' ' + label if label else ''}: {r[0]:.2f} s wall, {r[1]:.2f} s cpu, "
                              f"{r[2]:.0f} MB peak (load {os.getloadavg()[0]:.1f})", flush=True)
                if cg:
                    peak, oom = cgroup_peak(cg)
                    cap += f" (charged peak {peak / (1 << 30):.2f} GB incl. page cache, OOM kills {oom})" if peak else ""
            finally:
                remove_cgroup(cg)
            if a.against:
                same = _compare(outs["previous"], outs["this"])
                print(f"report {case}: JSON of previous and this {same}", flush=True)
            for _, label in codes:
                rows.append((case + (f" {label}" if label else ""), total_ops, _size(path), gen, runs[label], cap))
    finally:
        if not a.keep and a.dir is None:
            shutil.rmtree(base, ignore_errors=True)

    print()
    print(f"machine: {os.cpu_count()} cpus; load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
          f"after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    hdr = ("case", "ops", "B/op", "synth s", "synth MB", "report wall s (runs)", "cpu s", "peak MB", "memory cap",
           "target", "met")
    print(" | ".join(hdr))
    for case, total_ops, size, gen, runs, cap in rows:
        best = min(r[0] for r in runs)
        peak = max(r[2] for r in runs)
        cpu = min(r[1] for r in runs)
        tw, tm = TARGETS.get(case.split()[0], (None, None))
        met = "" if tw is None else ("yes" if best <= tw and peak <= tm else "no")
        print(" | ".join([
            case, f"{total_ops / 1e6:.2f}M", f"{size / total_ops:.1f}",
            "-" if gen is None else f"{gen[0]:.0f}", "-" if gen is None else f"{gen[2]:.0f}",
            f"{best:.2f} ({', '.join(f'{r[0]:.2f}' for r in runs)})", f"{cpu:.1f}", f"{peak:.0f}", cap,
            "-" if tw is None else f"<= {tw:g} s, <= {tm} MB", met]))
    if max(load0[0], os.getloadavg()[0]) > (os.cpu_count() or 1):
        print(f"note: the load average exceeded the {os.cpu_count()} CPUs: the wall times include waiting for "
              "other processes; the CPU time (user + sys of the report process) is the figure to compare")
    return 0


if __name__ == "__main__":
    sys.exit(main())
