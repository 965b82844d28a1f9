"""Soak benchmark (issue 6): 2 ranks x N tiny all_reduces (default 200,000), untraced and under
`commtrace run`. Checks every op is in the trace, the traced ranks' peak resident memory stays
within 50 MB of the untraced run's, and the trace takes at most 40 bytes per op on disk.

    python benchmarks/soak.py [--ops 200000] [--out DIR] [--without-memory-fixes]

Prints the figures, where rank 0's extra resident memory sits at the end (per mapping of
/proc/self/smaps, traced - untraced), and a JSON line; exits 1 when a target is missed.
`--without-memory-fixes` traces as commtrace did before the soak's memory fixes, for a
before/after comparison on one tree: mimalloc's default arena commit instead of the setting
`commtrace run` passes (commtrace/capture/memory.py), and parts written through
pyarrow.parquet (which imports pyarrow.fs) instead of the lean writer (commtrace/format/writer.py). Not part
of CI: it runs for minutes on a 2-core machine. Figures: the Soak section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RSS_BUDGET_MB = 50.0
BYTES_PER_OP_BUDGET = 40.0


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _smaps_mb() -> dict[str, float]:
    """Resident MB per mapping (shared library name, [heap], [anon], ...), for finding where a
    traced rank's extra memory lives."""
    agg: dict[str, float] = {}
    cur = "[anon]"
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                p = line.split()
                if p and not p[0].endswith(":"):
                    cur = p[5].rsplit("/", 1)[-1] if len(p) > 5 else "[anon]"
                elif p and p[0] == "Rss:":
                    agg[cur] = agg.get(cur, 0.0) + int(p[1]) / 1024
    except OSError:
        pass
    return {k: round(v, 2) for k, v in agg.items() if v >= 0.05}


def worker(n: int, out: str, without_fixes: bool = False) -> None:
    """One rank: n all_reduces of one float; peak RSS sampled along the way."""
    import torch
    import torch.distributed as dist

    if without_fixes and os.environ.get("COMMTRACE_ENABLE"):
        # the writer as it was: through pyarrow.parquet (and so pyarrow.fs)
        import pyarrow.parquet  # noqa: F401

        from commtrace.format import writer

        writer._lean_ok = False

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(1)
    rss_after_init = _status_kb("VmRSS")
    t0 = time.perf_counter()
    samples = []
    for i in range(n):
        dist.all_reduce(t)
        if i % 20000 == 0:
            samples.append(_status_kb("VmRSS"))
    elapsed = time.perf_counter() - t0
    dist.barrier()
    res = {"rank": rank, "ops": n, "elapsed_s": elapsed, "us_per_op": elapsed / n * 1e6,
           "rss_after_init_mb": rss_after_init / 1024, "rss_end_mb": _status_kb("VmRSS") / 1024,
           "rss_peak_mb": _status_kb("VmHWM") / 1024, "rss_samples_mb": [s / 1024 for s in samples],
           "rss_anon_mb": _status_kb("RssAnon") / 1024, "rss_file_mb": _status_kb("RssFile") / 1024,
           "smaps_mb": _smaps_mb()}
    dist.destroy_process_group()
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(res, f)


def _torchrun(n: int, res: str, without_fixes: bool = False) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            os.path.abspath(__file__), "--worker", "--ops", str(n), "--res", res,
            *(["--without-memory-fixes"] if without_fixes else [])]


def _env(without_fixes: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMTRACE_")}
    if without_fixes:
        # mimalloc's own default (2: eager when the OS overcommits), i.e. commtrace before it set
        # MIMALLOC_ARENA_EAGER_COMMIT=0 for the traced command (commtrace/capture/memory.py).
        env["MIMALLOC_ARENA_EAGER_COMMIT"] = "2"
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _results(res: str) -> dict[int, dict]:
    return {r: json.load(open(f"{res}.rank{r}.json")) for r in (0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=200_000)
    ap.add_argument("--out", default=None, help="directory for the trace (default: a temp dir)")
    ap.add_argument("--without-memory-fixes", action="store_true",
                    help="trace with mimalloc's default arena commit and pyarrow.parquet's "
                    "writer (commtrace before the soak's memory fixes), for a before/after comparison")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--res", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.ops, a.res, a.without_memory_fixes)
        return 0

    work = a.out or tempfile.mkdtemp(prefix="commtrace-soak-")
    os.makedirs(work, exist_ok=True)
    trace = os.path.join(work, "trace")
    t0 = time.time()
    subprocess.run(_torchrun(a.ops, os.path.join(work, "plain")), env=_env(), check=True, cwd=ROOT)
    t_plain = time.time() - t0
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "commtrace", "run", "-o", trace, "--",
                    *_torchrun(a.ops, os.path.join(work, "traced"), a.without_memory_fixes)],
                   env=_env(a.without_memory_fixes), check=True, cwd=ROOT)
    t_traced = time.time() - t0
    plain, traced = _results(os.path.join(work, "plain")), _results(os.path.join(work, "traced"))

    import pyarrow.dataset as ds
    import pyarrow.compute as pc

    from commtrace.format import runs

    trace = runs.resolve(trace)  # the job's run directory, trace/<run-id> (schema v2)
    tbl = ds.dataset(trace, format="parquet", partitioning="hive").to_table(
        columns=["kind", "rank", "op", "seq", "count"])
    ok_ops = True
    per_rank_ops = {}
    for r in (0, 1):
        m = pc.and_(pc.and_(pc.equal(tbl["rank"], r), pc.equal(tbl["kind"], "op")),
                    pc.and_(pc.equal(tbl["op"], "all_reduce"), pc.equal(tbl["count"], 1)))
        seqs = tbl.filter(m)["seq"]
        n, nu = len(seqs), len(pc.unique(seqs))
        per_rank_ops[r] = n
        ok_ops &= n == a.ops and nu == a.ops
    # rank=<r>/ directly under the run directory, or under a run id (trace/<run>/rank=<r>/)
    parts = glob.glob(os.path.join(trace, "**", "rank=*", "*.parquet"), recursive=True)
    disk = sum(os.path.getsize(p) for p in parts)
    bytes_per_op = disk / (2 * a.ops)
    rss_delta = {r: traced[r]["rss_peak_mb"] - plain[r]["rss_peak_mb"] for r in (0, 1)}
    ok_rss = all(d <= RSS_BUDGET_MB for d in rss_delta.values())
    ok_disk = bytes_per_op <= BYTES_PER_OP_BUDGET
    dropped = []
    for p in sorted(parts)[-2:]:
        import pyarrow.parquet as pq

        dropped.append(json.loads(pq.read_schema(p).metadata[b"commtrace.meta"]).get("dropped_rows"))

    print(f"soak: 2 ranks x {a.ops:,} all_reduce of 1 float (gloo)"
          + (" [without the memory fixes]" if a.without_memory_fixes else ""))
    print(f"  wall: untraced {t_plain:.1f} s, traced {t_traced:.1f} s (incl. start-up)")
    for r in (0, 1):
        print(f"  rank {r}: {plain[r]['us_per_op']:.1f} -> {traced[r]['us_per_op']:.1f} us/op; "
              f"peak RSS {plain[r]['rss_peak_mb']:.1f} -> {traced[r]['rss_peak_mb']:.1f} MB "
              f"(+{rss_delta[r]:.1f} MB); ops in trace {per_rank_ops[r]:,}")
    sp, st = plain[0].get("smaps_mb", {}), traced[0].get("smaps_mb", {})
    grew = sorted(((st.get(k, 0) - sp.get(k, 0), k) for k in set(sp) | set(st)), reverse=True)
    print("  rank 0 resident at the end, traced - untraced (MB): "
          + ", ".join(f"{k} {d:+.1f}" for d, k in grew[:8] if abs(d) >= 0.5))
    print(f"  trace: {len(parts)} parts, {disk / 1e6:.2f} MB = {bytes_per_op:.1f} B/op; dropped_rows {dropped}")
    print(f"  every op present: {ok_ops}; RSS within {RSS_BUDGET_MB:g} MB: {ok_rss}; "
          f"<= {BYTES_PER_OP_BUDGET:g} B/op: {ok_disk}")
    print(json.dumps({"ops": a.ops, "without_memory_fixes": a.without_memory_fixes, "plain": plain, "traced": traced, "t_plain_s": t_plain,
                      "t_traced_s": t_traced, "disk_bytes": disk, "bytes_per_op": bytes_per_op,
                      "ops_in_trace": per_rank_ops, "rss_delta_mb": rss_delta, "parts": len(parts)}))
    return 0 if ok_ops and ok_rss and ok_disk else 1


if __name__ == "__main__":
    sys.exit(main())
