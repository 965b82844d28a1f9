"""What the unrecorded-collective check (torch's per-group seq, read per recorded op) costs.

    python benchmarks/gapcheck.py                  # 2 ranks (gloo), 6,000 blocks, ~1 minute
    python benchmarks/gapcheck.py --world-size 1 --blocks 20000
    python benchmarks/gapcheck.py --async-op

Per-op blocks, as in benchmarks/overhead.py: in each block one op of each mode runs, in a
shuffled order, each timed alone on the wall clock and the calling thread's CPU clock, and the
differences are paired within the block (a drift of the machine moves the whole block). Every
mode runs on a process group of its own, so that no traced op follows an untraced one on its
group (that would be a real unrecorded collective, a ``gap`` row) and every op finds its
group's state equally cold:
- ``untraced``: torch's own function;
- ``bare``: torch's function inside a Python wrapper that reads the clock twice (the floor);
- ``check off``: commtrace, the check off for that group;
- ``read after``: commtrace, torch's seq read after the call returns (before commit 2026-12-02);
- ``read at wait``: commtrace, the seq of a blocking call read inside it, at its ``wait()``
  (the default; an async op's is read after the call returns in both modes).
It prints the medians of the paired differences with a distribution-free 95% CI, the load
(``uptime``) before and after, and the number of gap rows written (none expected). With 2
ranks both run the same schedule in lockstep and rank 0 reports.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

from common import free_port, median_ci, thread_cpu_ns, uptime

MODES = ["untraced", "bare", "check off", "read after", "read at wait"]


def _bench(rank: int, world: int, init: str, args, q=None) -> dict | None:
    import torch
    import torch.distributed as dist

    import commtrace
    from commtrace.capture import recorder as R
    from commtrace.capture import registry, torchseq, wrappers

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    commtrace.enable(output=tempfile.mkdtemp(prefix="commtrace-gapcheck-"), stack=True)
    cf = R._cfast
    at_wait = getattr(cf, "set_tseq_at_wait", None)
    ar = dist.all_reduce
    orig = registry.original_of(ar)
    ranks = list(range(world))
    groups = {m: dist.new_group(ranks) for m in MODES}
    t = torch.ones(args.numel)
    asyn = args.async_op
    _ns = time.perf_counter_ns

    def call(fn, g):
        if asyn:
            return lambda: fn(t, group=g, async_op=True).wait()
        return lambda: fn(t, group=g)

    def bare_of(g):
        def bare():
            t0 = _ns()
            r = orig(t, group=g, async_op=True).wait() if asyn else orig(t, group=g)
            t1 = _ns()
            return r
        return bare

    fns = {"untraced": call(orig, groups["untraced"]), "bare": bare_of(groups["bare"]),
           "check off": call(ar, groups["check off"]), "read after": call(ar, groups["read after"]),
           "read at wait": call(ar, groups["read at wait"])}
    flag = {"read after": False, "read at wait": True}
    for m in MODES[2:]:
        fns[m]()   # first sight of the group (the Python path caches its facts)
    wrappers.pg_info(groups["check off"]).tseq = False
    if cf is not None:
        cf.invalidate()   # the C path re-reads PgInfo.tseq

    def run(m):
        if at_wait is not None and m in flag:
            at_wait(flag[m])
        fns[m]()

    for _ in range(200):   # warm-up
        for m in MODES:
            run(m)
    cpu = {m: [] for m in MODES}
    wall = {m: [] for m in MODES}
    rng = random.Random(20261202)
    tc = thread_cpu_ns
    dist.barrier()
    for _ in range(args.blocks):
        order = MODES[:]
        rng.shuffle(order)
        for m in order:
            if at_wait is not None and m in flag:
                at_wait(flag[m])
            fn = fns[m]
            c0 = tc()
            w0 = _ns()
            fn()
            w1 = _ns()
            c1 = tc()
            cpu[m].append(c1 - c0)
            wall[m].append(w1 - w0)
    if at_wait is not None:
        at_wait(True)
    gaps = torchseq.n_gaps   # (at close, the untraced modes' groups are gaps: not counted)
    commtrace.disable()
    out = {"world_size": world, "blocks": args.blocks, "async_op": asyn,
           "c_fast_path": cf is not None, "gap_rows": gaps,
           "has_at_wait": at_wait is not None}
    for kind, data in (("cpu", cpu), ("wall", wall)):
        out[f"{kind}_untraced_us"] = statistics.median(data["untraced"]) / 1000.0
        pairs = [(m, "bare") for m in MODES if m != "bare"] + [
            ("read after", "check off"), ("read at wait", "check off"),
            ("read after", "read at wait")]
        for a, b in pairs:
            d = [(x - y) / 1000.0 for x, y in zip(data[a], data[b])]
            out[f"{kind}: {a} - {b}"] = [statistics.median(d), *median_ci(d)]
    dist.destroy_process_group()
    if q is not None:
        q.put(out)
    return out


def _worker(rank, world, init, args, q):
    _bench(rank, world, init, args, q if rank == 0 else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python benchmarks/gapcheck.py\n"
               "  python benchmarks/gapcheck.py --world-size 1 --blocks 20000\n"
               "  python benchmarks/gapcheck.py --async-op --blocks 3000")
    ap.add_argument("--world-size", type=int, default=2, choices=(1, 2), help="ranks (default 2)")
    ap.add_argument("--blocks", type=int, default=6000, help="per-op blocks (default 6000)")
    ap.add_argument("--numel", type=int, default=16, help="floats per all_reduce (default 16)")
    ap.add_argument("--async-op", action="store_true", help="async_op=True, then wait()")
    args = ap.parse_args(argv)
    if args.blocks < 10:
        ap.error("--blocks must be at least 10")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    up0 = uptime()
    init = f"tcp://127.0.0.1:{free_port()}"
    if args.world_size == 1:
        r = _bench(0, 1, init, args)
    else:
        import torch.multiprocessing as mp

        q = mp.get_context("spawn").Queue()
        mp.spawn(_worker, args=(2, init, args, q), nprocs=2)
        r = q.get(timeout=10)
    up1 = uptime()
    print(f"gap check cost: gloo, world size {r['world_size']}, {r['blocks']} blocks of one "
          f"{'async all_reduce + wait' if r['async_op'] else 'blocking all_reduce'} "
          f"({args.numel} floats) per mode, capture path {'c' if r['c_fast_path'] else 'python'}")
    print(f"load before: {up0}\nload after:  {up1}")
    if not r["has_at_wait"]:
        print("  (this build has no read at wait(): both commtrace modes read after the call)")
    print(f"  {'us per op, median [95% CI]':<34} {'thread CPU':>24} {'wall':>24}")
    print(f"  {'untraced op':<34} {r['cpu_untraced_us']:>8.2f}{'':16} {r['wall_untraced_us']:>8.2f}")
    for k in [k[5:] for k in r if k.startswith("cpu: ")]:
        c, w = r["cpu: " + k], r["wall: " + k]
        print(f"  {k:<34} {c[0]:8.2f} [{c[1]:6.2f}, {c[2]:6.2f}] {w[0]:8.2f} [{w[1]:6.2f}, {w[2]:6.2f}]")
    print(f"  gap rows written: {r['gap_rows']} (none expected: every traced op is recorded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
