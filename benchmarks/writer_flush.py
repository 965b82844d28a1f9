"""The writer's CPU per trace part in one traced process (issue 20): ``rec.flush()`` after N
blocking ``all_reduce`` calls on the C fast path (world size 1, gloo), three ways interleaved
in one run:

- ``before``: the calls drained as Python column lists (``drain_columns``) and every column
  zstd-compressed (the writer up to commit 101a2ed);
- ``lists``: the same lists, with this version's compression (small parts uncompressed, no
  codec on all-null columns; ``format.writer.part_compression``);
- ``buffers``: this version: typed buffers (``drain_records``) turned into Arrow arrays with
  numpy over whole columns, and the same compression.

With ``--ops async`` the N calls are async ``all_reduce`` + ``wait()`` (the C async path: one
full row per op in the write queue) and the modes switch how the writer turns those rows
into arrays: ``before`` and ``lists`` one Python list per column (``recorder.ROW_BUFFERS``
off; zstd throughout / this version's compression), ``buffers`` the rows packed into typed
buffers in C (``_fastpath.pack_rows``) and built with numpy.

    python benchmarks/writer_flush.py
    python benchmarks/writer_flush.py --rows 10 800 5000 --reps 25 --json flush.json
    python benchmarks/writer_flush.py --ops async --rows 100 5000

It prints, per part size, the median thread CPU per flush (ms) and per row (us), with a 95%
interval, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from common import free_port, median_ci, uptime

MODES = ("before", "lists", "buffers")


def measure(sizes, reps: int, ops: str = "blocking") -> dict:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    import torch
    import torch.distributed as dist

    import commtrace
    from commtrace.capture import recorder as R
    from commtrace.format import writer as W

    if R._cfast is None:
        raise SystemExit("writer_flush.py: the C fast path is not built or is turned off")
    dist.init_process_group("gloo", rank=0, world_size=1)
    out = tempfile.mkdtemp(prefix="commtrace-flush-")
    commtrace.enable(out, flush_interval=3600)
    rec = R.get_recorder()
    t = torch.ones(16)
    new_comp = W.part_compression
    res = {}
    try:
        for n in sizes:
            cpu = {m: [] for m in MODES}
            for rep in range(reps + 2):
                for k in range(len(MODES)):
                    mode = MODES[(rep + k) % len(MODES)]
                    if ops == "async":
                        R.ROW_BUFFERS = mode == "buffers"
                    else:
                        R.RECORD_BUFFERS = mode == "buffers"
                    W.part_compression = (lambda tab: "zstd") if mode == "before" else new_comp
                    with rec._write_lock:   # the writer thread held off: this part has n rows
                        if ops == "async":
                            for _ in range(n):
                                dist.all_reduce(t, async_op=True).wait()
                        else:
                            for _ in range(n):
                                dist.all_reduce(t)
                        c0 = time.thread_time()
                        rec.flush()
                        c1 = time.thread_time()
                    if rep >= 2:   # the first two rounds warm up
                        cpu[mode].append(c1 - c0)
            res[n] = {m: {"ms_per_part": [x * 1e3 for x in [statistics.median(v), *median_ci(v)]],
                          "us_per_row": [x * 1e6 / n for x in [statistics.median(v), *median_ci(v)]]}
                      for m, v in cpu.items()}
    finally:
        R.RECORD_BUFFERS = R.ROW_BUFFERS = True
        W.part_compression = new_comp
        commtrace.disable()
        dist.destroy_process_group()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n  python benchmarks/writer_flush.py\n"
               "  python benchmarks/writer_flush.py --rows 10 800 5000 --reps 25 --json flush.json\n"
               "  python benchmarks/writer_flush.py --ops async --rows 100 5000")
    ap.add_argument("--rows", type=int, nargs="+", default=[10, 100, 800, 5000],
                    help="rows per part (default 10 100 800 5000)")
    ap.add_argument("--reps", type=int, default=15, help="parts per mode and size (default 15)")
    ap.add_argument("--ops", choices=("blocking", "async"), default="blocking",
                    help="blocking all_reduce (default) or async all_reduce + wait()")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args(argv)
    if any(n < 1 for n in a.rows) or a.reps < 3:
        ap.error("--rows must be >= 1 and --reps >= 3")
    load0 = uptime()
    print(f"writer_flush ({a.ops} ops): {load0}", flush=True)
    res = measure(a.rows, a.reps, a.ops)
    load1 = uptime()
    print("rows/part  mode      CPU per part ms [95% CI]      CPU per row us")
    for n, by in res.items():
        for m in MODES:
            p, r = by[m]["ms_per_part"], by[m]["us_per_row"]
            print(f"{n:>9}  {m:<8}  {p[0]:7.2f} [{p[1]:6.2f}, {p[2]:6.2f}]      {r[0]:8.2f}")
    print(f"load: {load0} -> {load1}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ops": a.ops, "results": res, "load": [load0, load1]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
