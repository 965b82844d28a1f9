"""The writer's CPU per part, stage by stage, on the DDP sample (issue 20, session 15): world
size 1 (gloo), N steps of ``samples/ddp_mlp.py`` with the writer held off (3 rows per step:
2 bucket all-reduces of the C++ hook and the optimizer-step mark, ~1,000 rows per 330 steps,
what a rank writes per 2 s part), then ``rec.flush()`` on this thread, its thread CPU split
by stage. ``--ab`` alternates the part's arrays built in C (``recorder.C_COLUMNS``, this
version) with the numpy route (before) from one part to the next.

    python benchmarks/flush_stages.py [--steps 330] [--parts 12] [--ab]

Prints the median and range of each stage (ms of thread CPU) and the load average before and
after. Stages: ``arrays`` (recorder.arrays_of_rows / arrays_of_records), ``parquet``
(format.writer.write_parquet), ``check`` (the complete-part check), ``inflight``
(_inflight.json's atomic write), ``rest`` (the rest of flush: queue, snapshot, metadata,
directories, the part's rename).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

from common import ddp_sample_one_rank, uptime

STAGES = ("total", "arrays", "parquet", "check", "inflight", "rest")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=330)
    ap.add_argument("--parts", type=int, default=12)
    ap.add_argument("--ab", action="store_true", help="alternate C-built and numpy-built arrays")
    args = ap.parse_args(argv)
    print("load before:", uptime())
    import torch.distributed as dist

    from commtrace.capture import recorder as R
    from commtrace.format import writer as W

    rec, m, st = ddp_sample_one_rank("commtrace-stages-")
    acc: dict = {}

    def timed(mod, name, key):
        f = getattr(mod, name)

        def g(*a, **k):
            t0 = time.thread_time_ns()
            try:
                return f(*a, **k)
            finally:
                acc[key] = acc.get(key, 0) + time.thread_time_ns() - t0
        setattr(mod, name, g)

    timed(R, "arrays_of_rows", "arrays")
    timed(R, "arrays_of_records", "arrays")
    timed(W, "write_parquet", "parquet")
    timed(W, "_check_complete", "check")
    timed(W, "atomic_write_text", "inflight")
    for i in range(30):
        m.train_step(st, i)
    res: dict = {}
    rows = []
    for part in range(args.parts + 2):
        mode = ("c" if part % 2 else "numpy") if args.ab else "c"
        R.C_COLUMNS = mode == "c"
        with rec._write_lock:   # the writer thread writes no part meanwhile
            for i in range(args.steps):
                m.train_step(st, i)
            time.sleep(0.6)     # its services release the steps' ops into the queue
            acc.clear()
            rows.append(rec.queued())
            t0 = time.thread_time_ns()
            rec.flush()
            acc["total"] = time.thread_time_ns() - t0
        acc["rest"] = acc["total"] - sum(acc.get(k, 0) for k in STAGES[1:-1])
        if part >= 2:
            res.setdefault(mode, []).append(dict(acc))
    print(f"{args.steps} steps per part, rows per part {rows[2:]}")
    for mode, parts in res.items():
        print(f"arrays built by {mode} ({len(parts)} parts): ms of thread CPU, median [min, max]")
        for k in STAGES:
            v = [p.get(k, 0) / 1e6 for p in parts]
            print(f"  {k:9s} {statistics.median(v):6.3f} [{min(v):.3f}, {max(v):.3f}]")
    print("load after:", uptime())
    del st
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
