"""Where a trace part's cost goes on the writer thread, and what a separate writer process over
shared memory (issue 20, route 3) would take out of the rank: a prototype measurement.

    python benchmarks/writer_split.py                      # rows of tests/data/clean
    python benchmarks/writer_split.py --trace RUN --rows 300 5000 40000

For parts of N op rows (the op rows of a trace, repeated), the thread CPU time per row of:
1. building the part's columns and Arrow arrays from Python rows (``rows_to_table_nopandas``:
   it holds the GIL throughout); the rank pays it whatever route is taken, unless rows were
   handed over as raw buffers;
2. writing the Parquet part (encoding, zstd, the file, its footer and metadata): what a writer
   process would take off the rank;
3. what the rank would do instead with a writer process: the table serialised with Arrow IPC
   into a ``multiprocessing.shared_memory`` block.
And whether 2 lets another Python thread run meanwhile (pyarrow releases the GIL while it
encodes): how far a thread counting in a loop got during the part, against the same time
alone. Medians of 7 repetitions; the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

from common import uptime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _spin_during(fn, seconds=None) -> int:
    """Loop iterations a second Python thread gets through while `fn` runs (or for `seconds`)."""
    cnt = [0]
    stop = [False]

    def spin():
        while not stop[0]:
            cnt[0] += 1

    th = threading.Thread(target=spin)
    th.start()
    time.sleep(0.01)
    c0 = cnt[0]
    if fn is not None:
        fn()
    else:
        time.sleep(seconds)
    got = cnt[0] - c0
    stop[0] = True
    th.join()
    return got


def measure(trace: str, sizes, reps: int = 7) -> list[dict]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    from multiprocessing import shared_memory

    from commtrace.format import schema as S
    from commtrace.format import writer as W

    t = ds.dataset(trace, format="parquet", partitioning="hive").to_table()
    base = t.filter(pc.equal(t["kind"], "op")).to_pylist()
    cols = [f.name for f in S.SCHEMA]
    out = tempfile.mkdtemp(prefix="commtrace-split-")
    tc = time.thread_time
    res = []
    for n in sizes:
        rows = [base[i % len(base)] for i in range(n)]
        fig = {"build": [], "parquet": [], "ipc": []}
        table = None
        for rep in range(reps):
            c0 = tc()
            table = W.rows_to_table_nopandas({c: [r.get(c) for r in rows] for c in cols})
            fig["build"].append(tc() - c0)
            c0 = tc()
            W.write_part(out, 0, table, {"schema_version": S.SCHEMA_VERSION}, index=rep)
            fig["parquet"].append(tc() - c0)
            c0 = tc()
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
            buf = sink.getvalue()
            shm = shared_memory.SharedMemory(create=True, size=buf.size)
            shm.buf[:buf.size] = memoryview(buf).cast("B")
            shm.close()
            shm.unlink()
            fig["ipc"].append(tc() - c0)
        w0 = time.perf_counter()
        during = _spin_during(lambda: W.write_part(out, 0, table, {"schema_version": S.SCHEMA_VERSION},
                                                   index=reps))
        alone = _spin_during(None, time.perf_counter() - w0)
        res.append({"rows": n, **{k + "_us_per_row": statistics.median(v) * 1e6 / n
                                  for k, v in fig.items()},
                    "parquet_ms_per_part": statistics.median(fig["parquet"]) * 1e3,
                    "other_thread_progress": during / max(1, alone)})
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n  python benchmarks/writer_split.py\n"
        "  python benchmarks/writer_split.py --trace RUN --rows 300 5000 40000")
    ap.add_argument("--trace", default=os.path.join(ROOT, "tests", "data", "clean"),
                    help="a run whose op rows make the parts (default: tests/data/clean)")
    ap.add_argument("--rows", type=int, nargs="*", default=[300, 5000, 40000])
    a = ap.parse_args(argv)
    if not os.path.isdir(a.trace):
        print(f"writer_split: no such run directory: {a.trace}", file=sys.stderr)
        return 2
    print(f"writer_split: {uptime()}")
    for r in measure(a.trace, a.rows):
        print(f"{r['rows']:>6} rows per part, thread CPU per row: build columns + Arrow (GIL "
              f"held) {r['build_us_per_row']:.2f} us; Parquet part {r['parquet_us_per_row']:.2f} "
              f"us ({r['parquet_ms_per_part']:.1f} ms a part); Arrow IPC into shared memory "
              f"{r['ipc_us_per_row']:.2f} us; another Python thread ran "
              f"{100 * r['other_thread_progress']:.0f}% as fast during the Parquet part")
    print(f"writer_split: {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
