"""What the unrecorded-collective check (torch's per-group seq read after each call) costs per op.

    python benchmarks/gapcheck.py                  # ~30 s: gloo, world size 1
    python benchmarks/gapcheck.py --rounds 200 --ops 200 --async-op

In each short round the same K small all_reduces run three times, in a rotating order: untraced
(torch's own function), traced with the check off, traced with the check on (the default). Per
round we take the paired differences of the mean time per op and print their medians, with the
load (``uptime``) before and after. The difference "check on - check off" is the check's cost
(one ``_get_sequence_number_for_group()`` call and a compare, from C on the fast path).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n  python benchmarks/gapcheck.py\n"
                                        "  python benchmarks/gapcheck.py --rounds 200 --async-op")
    ap.add_argument("--rounds", type=int, default=120, help="rounds (default 120)")
    ap.add_argument("--ops", type=int, default=200, help="ops per mode per round (default 200)")
    ap.add_argument("--async-op", action="store_true", help="async_op=True, then wait()")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    import commtrace
    from commtrace.capture import recorder as R
    from commtrace.capture import registry, torchseq

    up0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as port_dir:
        dist.init_process_group("gloo", init_method=f"file://{port_dir}/init", rank=0,
                                world_size=1)
    t = torch.ones(16)
    orig = registry.original_of(dist.all_reduce)
    cfast = R._cfast
    out = tempfile.mkdtemp(prefix="commtrace-gapcheck-")
    asyn = args.async_op

    def run(fn, k):
        t0 = time.perf_counter_ns()
        if asyn:
            for _ in range(k):
                fn(t, async_op=True).wait()
        else:
            for _ in range(k):
                fn(t)
        return (time.perf_counter_ns() - t0) / k

    on_off, on_plain, off_plain = [], [], []
    with commtrace.trace(output=out):
        wrapped = dist.all_reduce
        for _ in range(20):   # warm-up: first sightings, caches
            wrapped(t)

        def check(on):
            if cfast is not None:
                cfast.set_tseq(torchseq.on_gap if on else None)
            for info in list(__import__("commtrace.capture.wrappers",
                                        fromlist=["_pg_cache"])._pg_cache.values()):
                info.tseq = bool(on) and info.member
            if cfast is not None:
                cfast.invalidate()   # the C path re-reads PgInfo.tseq
            if on:   # what ran unchecked is not a gap
                torchseq.baseline(R.get_recorder())

        for r in range(args.rounds):
            res = {}
            for mode in [("plain", "off", "on"), ("off", "on", "plain"),
                         ("on", "plain", "off")][r % 3]:
                if mode == "plain":
                    res[mode] = run(orig, args.ops)
                else:
                    check(mode == "on")
                    res[mode] = run(wrapped, args.ops)
            on_off.append(res["on"] - res["off"])
            on_plain.append(res["on"] - res["plain"])
            off_plain.append(res["off"] - res["plain"])
        check(True)
        gaps = torchseq.n_gaps
    dist.destroy_process_group()
    up1 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    med = statistics.median
    print(f"gap check cost: gloo world size 1, {args.rounds} rounds x {args.ops} "
          f"{'async' if asyn else 'blocking'} all_reduce (16 floats), "
          f"capture path {'c' if cfast is not None else 'python'}")
    print(f"load before: {up0}\nload after:  {up1}")
    print(f"  traced, check off - untraced   median {med(off_plain) / 1000:7.2f} us/op")
    print(f"  traced, check on  - untraced   median {med(on_plain) / 1000:7.2f} us/op")
    print(f"  check on - check off (paired)  median {med(on_off) / 1000:7.2f} us/op  "
          f"(p25 {statistics.quantiles(on_off, n=4)[0] / 1000:.2f}, "
          f"p75 {statistics.quantiles(on_off, n=4)[2] / 1000:.2f})")
    print(f"  gap rows written: {gaps} (none expected: every op is recorded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
