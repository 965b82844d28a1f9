"""The writer thread's CPU per op in the soak's tight loop (issue 20, session 21): 2 ranks
(gloo, forked from this process), each running ``benchmarks/steps.py``'s soak step (200
blocking all_reduces of one float) traced with `commtrace run`'s defaults, the writer thread
writing its parts on its own schedule as in any run (a part per 2 s flush interval). Its
thread CPU is read per part and split by stage (the drain of the C path's records, their
arrays, Parquet, the complete-part check, ``_inflight.json``, the rest of the flush; the
services and wake-ups between parts); ``--ab`` alternates, part by part in the same threads,
the replaced paths (A) with the current ones (B): ``format.writer.BUFFERED_WRITE`` (a part
encoded in memory, one write) and ``format.writer.LEAN_CODECS`` (A: "s16", session 16's
columns without zstd in mid-size parts), both session 21's, and
``capture.recorder.RECORDS_BATCH`` (session 22: the calls' arrays built in one C call);
``--toggle`` picks which.

    python benchmarks/writer_soak.py [--parts 10] [--ab] [--toggle RECORDS_BATCH]

Prints, per variant and rank, the median [min, max] over the parts of the writer's thread
CPU per op and per part, by stage, the training thread's CPU per op over the same
intervals, the rows per part and the load average before and after. The first two parts
(imports, caches) are not counted."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time

from common import free_port, uptime

STAGES = ("drain", "arrays", "parquet", "check", "inflight", "rest", "flush", "between")
#: --ab's switches: name -> (module: "W" format.writer, "R" capture.recorder; value in A, in B)
TOGGLES = {"BUFFERED_WRITE": ("W", False, True), "LEAN_CODECS": ("W", "s16", True),
           "RECORDS_BATCH": ("R", False, True)}


def _rank(rank, world, port, out, parts, ab, toggles, q):
    import torch
    import torch.distributed as dist

    import commtrace
    from commtrace.capture import recorder as R
    from commtrace.format import writer as W

    torch.set_num_threads(1)
    commtrace.enable(output=out)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    rec = R.get_recorder()
    acc: dict = {}
    res: list = []
    state = {"part": 0, "mode": "B", "last_end": None, "train0": None, "rows": 0}

    def on_writer():
        return threading.current_thread().name == "commtrace-writer"

    depth = {}   # key -> calls of its stage in progress: a stage called inside itself counts once

    def timed(obj, name, key, count=None):
        f = getattr(obj, name)

        def g(*a, **k):
            if not on_writer() or depth.get(key):
                return f(*a, **k)
            depth[key] = 1
            t0 = time.thread_time_ns()
            out = None
            try:
                out = f(*a, **k)
                return out
            finally:
                depth[key] = 0
                acc[key] = acc.get(key, 0) + time.thread_time_ns() - t0
                if count is not None and out is not None:   # None: another route builds them
                    state["rows"] += count(a)
        setattr(obj, name, g)

    timed(R, "arrays_of_records", "arrays", lambda a: a[1][0])
    timed(R, "batch_of_records", "arrays", lambda a: a[1][0])
    timed(R, "arrays_of_rows", "arrays", lambda a: len(a[1]))
    timed(W, "write_parquet", "parquet")
    timed(W, "_check_complete", "check")
    timed(W, "atomic_write_text", "inflight")
    c = R._cfast

    class Drain:   # the C module's drain_records, timed; every other name passes through
        def __getattr__(self, name):
            return getattr(c, name)

        def drain_records(self, *a):
            t0 = time.thread_time_ns()
            try:
                return c.drain_records(*a)
            finally:
                if on_writer():
                    acc["drain"] = acc.get("drain", 0) + time.thread_time_ns() - t0
    if c is not None and hasattr(c, "drain_records"):
        R._cfast = Drain()
    train_tid = threading.get_ident()
    train_clk = time.pthread_getcpuclockid(train_tid)
    flush = rec.flush

    def measured_flush(final=False):
        if not on_writer() or final:
            return flush(final)
        t0 = time.thread_time_ns()
        between = t0 - state["last_end"] if state["last_end"] is not None else 0
        train = time.clock_gettime_ns(train_clk)
        try:
            return flush(final)
        finally:
            t1 = time.thread_time_ns()
            acc["flush"] = t1 - t0
            acc["between"] = between
            acc["rest"] = acc["flush"] - sum(acc.get(k, 0) for k in STAGES[:5])
            if state["train0"] is not None and state["part"] >= 2:
                res.append({"mode": state["mode"], "rows": state["rows"],
                            "train": train - state["train0"], **acc})
            state["train0"] = train
            state["part"] += 1
            state["mode"] = ("A" if state["part"] % 2 else "B") if ab else "B"
            for name in toggles:
                mod, *vals = TOGGLES[name]
                setattr(W if mod == "W" else R, name, vals[state["mode"] == "B"])
            acc.clear()
            state["rows"] = 0
            state["last_end"] = time.thread_time_ns()
    rec.flush = measured_flush
    t = torch.ones(1)
    stop = torch.zeros(1)
    while True:   # both ranks stop after the same step
        for _ in range(200):
            dist.all_reduce(t)
        stop[0] = 1.0 if len(res) >= 2 * parts + (1 if ab else 0) else 0.0
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
    q.put((rank, res))
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", type=int, default=10, help="parts per variant (after 2 uncounted)")
    ap.add_argument("--ab", action="store_true", help="alternate the replaced paths (A) and these (B)")
    ap.add_argument("--toggle", default=",".join(TOGGLES),
                    help="the switches --ab sets to their old value in A (comma-separated; "
                         "default: all of " + ", ".join(TOGGLES) + ")")
    args = ap.parse_args(argv)
    toggles = [t for t in args.toggle.split(",") if t]
    unknown = [t for t in toggles if t not in TOGGLES]
    if unknown:
        ap.error(f"--toggle: unknown {unknown}; known: {', '.join(TOGGLES)}")
    print("load before:", uptime())
    print("A:", ", ".join(f"{t}={TOGGLES[t][1]!r}" for t in toggles) if args.ab else "(no --ab)")
    import torch  # noqa: F401 - imported once, before the fork

    out = tempfile.mkdtemp(prefix="commtrace-wsoak-")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    ps = [ctx.Process(target=_rank, args=(r, 2, port, out, args.parts, args.ab, toggles, q))
          for r in range(2)]
    for p in ps:
        p.start()
    got = dict(q.get() for _ in ps)
    for p in ps:
        p.join()
    for rank in sorted(got):
        by: dict = {}
        for r in got[rank]:
            by.setdefault(r["mode"], []).append(r)
        for mode, rs in sorted(by.items()):
            rows = [r["rows"] for r in rs]
            print(f"rank {rank} {mode} ({len(rs)} parts, rows per part median {statistics.median(rows):.0f} "
                  f"[{min(rows)}, {max(rows)}]): us of thread CPU per op, median [min, max]; ms per part")
            for k in STAGES + ("total",):
                v = [((r.get("flush", 0) + r.get("between", 0)) if k == "total" else r.get(k, 0))
                     / 1e3 / max(1, r["rows"]) for r in rs]
                ms = statistics.median([(r.get("flush", 0) + r.get("between", 0)) if k == "total"
                                        else r.get(k, 0) for r in rs]) / 1e6
                print(f"  {k:9s} {statistics.median(v):6.3f} [{min(v):.3f}, {max(v):.3f}]   {ms:6.3f} ms")
            tr = [r["train"] / 1e3 / max(1, r["rows"]) for r in rs]
            print(f"  (training thread: {statistics.median(tr):.1f} [{min(tr):.1f}, {max(tr):.1f}] "
                  "us of CPU per op over the part's interval)")
    print("load after:", uptime())
    return 0


if __name__ == "__main__":
    sys.exit(main())
