"""One stored part written again and again, the writer's variants interleaved (issue 20,
session 21): ``format.writer.write_parquet`` on the table of a part, thread CPU per write,
variant A (pyarrow's file sink, ``BUFFERED_WRITE = False``; session 16's mid-size codecs,
``LEAN_CODECS = "s16"``) against B (this version), and each switch alone, in rotation (each
variant first, second, ... in turn) so that the machine's load falls on all alike. Between writes an 8 MB buffer is walked (the
caches cold, as after 2 s of training).

    python benchmarks/part_write.py PART.parquet [PART.parquet ...] [--reps 100]

Prints per part and variant the median [p25, p75] of the thread CPU of a write (ms) and the
file's bytes, and the load average before and after."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from common import uptime

VARIANTS = {"A": (False, "s16"), "buffered only": (True, "s16"), "codecs only": (False, True),
            "B": (True, True)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="+")
    ap.add_argument("--reps", type=int, default=100)
    args = ap.parse_args(argv)
    import pyarrow.parquet as pq

    from commtrace.format import writer as W

    print("load before:", uptime())
    d = tempfile.mkdtemp(prefix="commtrace-partwrite-")
    junk = bytearray(8 << 20)
    for part in args.parts:
        t = pq.read_table(part)
        res = {k: [] for k in VARIANTS}
        size = {}
        for i in range(args.reps):
            names = list(VARIANTS)
            for k in names[i % len(names):] + names[:i % len(names)]:   # each in every place
                buffered, codecs = VARIANTS[k]
                W.BUFFERED_WRITE, W.LEAN_CODECS = buffered, codecs
                junk[::4096] = bytes([i & 255]) * len(junk[::4096])
                path = os.path.join(d, f"{i % 2}.parquet")
                if os.path.exists(path):
                    os.unlink(path)
                t0 = time.thread_time_ns()
                W.write_parquet(t, path, W.part_compression(t))
                res[k].append(time.thread_time_ns() - t0)
                size[k] = os.path.getsize(path)
        W.BUFFERED_WRITE, W.LEAN_CODECS = True, True
        print(f"{part}: {t.num_rows} rows; thread CPU per write, ms, median [p25, p75] of {args.reps}")
        for k, v in res.items():
            q = statistics.quantiles(v, n=4)
            print(f"  {k:14s} {statistics.median(v) / 1e6:6.3f} [{q[0] / 1e6:.3f}, {q[2] / 1e6:.3f}]"
                  f"   {size[k]} bytes")
    print("load after:", uptime())
    return 0


if __name__ == "__main__":
    sys.exit(main())
