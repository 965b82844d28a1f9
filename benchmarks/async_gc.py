"""What the cyclic GC costs a loop of async collectives, traced (issue 20): world size 1, gloo,
``all_reduce(async_op=True).wait()`` in rounds of N ops, three modes interleaved in one run:

- ``untraced``: tracing off;
- ``traced, rows tracked``: tracing on, the C path's async rows left to the cyclic GC (the
  capture up to this version);
- ``traced``: this version: the rows, which hold only atomic values, untracked
  (``_fastpath.set_untrack_rows``).

The rows of async ops wait in the write queue for up to a flush interval; tracked, they are
visited by every young collection and push the GC into full collections of the whole heap
(torch's objects). Each round starts with an empty write queue (flushed, untimed); within a
round the rows accumulate as they do between two flushes. The figures are *means* over whole rounds (thread CPU per op, and the CPU
of the GC's collections per op, from ``gc.callbacks``): a full collection is rare and long,
so a median per op (``benchmarks/overhead.py``) does not show it.

    python benchmarks/async_gc.py
    python benchmarks/async_gc.py --rounds 20 --ops 80000 --json gc.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

from common import free_port, median_ci, uptime

MODES = ("untraced", "traced, rows tracked", "traced")


def measure(rounds: int, ops: int) -> dict:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    import torch
    import torch.distributed as dist

    import commtrace
    from commtrace.capture import recorder as R

    if R._cfast is None or not hasattr(R._cfast, "set_untrack_rows"):
        raise SystemExit("async_gc.py: the C fast path is not built or is turned off")
    dist.init_process_group("gloo", rank=0, world_size=1)
    commtrace.enable(tempfile.mkdtemp(prefix="commtrace-gc-"))
    rec = R.get_recorder()
    t = torch.ones(16)
    gc_cpu = [0.0]
    start = [0.0]

    def cb(phase, info):
        if phase == "start":
            start[0] = time.thread_time()
        else:
            gc_cpu[0] += time.thread_time() - start[0]

    cpu = {m: [] for m in MODES}
    gcs = {m: [] for m in MODES}
    try:
        for _ in range(200):
            dist.all_reduce(t, async_op=True).wait()
        gc.callbacks.append(cb)
        for r in range(rounds + 1):
            for k in range(len(MODES)):
                mode = MODES[(r + k) % len(MODES)]
                R._set_recorder(None if mode == "untraced" else rec)
                R._cfast.set_untrack_rows(mode == "traced")
                rec.flush()   # (untimed) each round starts with an empty write queue
                gc.collect()
                g0 = gc_cpu[0]
                c0 = time.thread_time()
                for _ in range(ops):
                    dist.all_reduce(t, async_op=True).wait()
                c1 = time.thread_time()
                if r:   # the first set warms up
                    cpu[mode].append((c1 - c0) / ops * 1e6)
                    gcs[mode].append((gc_cpu[0] - g0) / ops * 1e6)
    finally:
        if cb in gc.callbacks:
            gc.callbacks.remove(cb)
        R._cfast.set_untrack_rows(True)
        R._set_recorder(rec)
        commtrace.disable()
        dist.destroy_process_group()
    return {m: {"cpu_us_per_op": [statistics.mean(cpu[m]), *median_ci(cpu[m])],
                "gc_us_per_op": [statistics.mean(gcs[m]), *median_ci(gcs[m])]} for m in MODES}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n  python benchmarks/async_gc.py\n"
               "  python benchmarks/async_gc.py --rounds 20 --ops 80000 --json gc.json")
    ap.add_argument("--rounds", type=int, default=10, help="sets of rounds (default 10)")
    ap.add_argument("--ops", type=int, default=40000, help="ops per round (default 40000: about the rows of one 2 s flush interval here)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args(argv)
    if a.rounds < 3 or a.ops < 100:
        ap.error("--rounds must be >= 3 and --ops >= 100")
    load0 = uptime()
    print(f"async_gc: {load0}", flush=True)
    res = measure(a.rounds, a.ops)
    load1 = uptime()
    print("thread CPU per op, mean over rounds [95% CI of the median round], world size 1:")
    print(f"  {'mode':<22} {'all':>24} {'of which GC':>26}")
    for m, v in res.items():
        c, g = v["cpu_us_per_op"], v["gc_us_per_op"]
        print(f"  {m:<22} {c[0]:7.2f} us [{c[1]:6.2f}, {c[2]:6.2f}]   {g[0]:6.2f} us [{g[1]:5.2f}, {g[2]:5.2f}]")
    base = res["untraced"]["cpu_us_per_op"][0]
    for m in MODES[1:]:
        print(f"  {m}: adds {res[m]['cpu_us_per_op'][0] - base:+.2f} us per op (means)")
    print(f"load: {load0} -> {load1}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": res, "load": [load0, load1], "rounds": a.rounds, "ops": a.ops},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
