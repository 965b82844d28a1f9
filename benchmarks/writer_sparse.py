"""The writer's CPU per op in a sparse loop (issue 20, session 16): world size 1 (gloo), the
DDP sample (``samples/ddp_mlp.py``, 2 bucket all-reduces and the optimizer-step mark per step),
the writer thread's own work done on this thread instead, where its thread CPU is read:
``--steps`` steps per part (830: a 2 s part at 2.4 ms per step), a service of the pending ops
(``Recorder._service``) every ``--every`` steps (100: the writer's 0.25 s service period), then
the part (``rec.flush()``), thread CPU per stage. ``--ab`` alternates this version (B) with
the code paths it replaced (A: ``recorder.SERVICE_C = False``, ``format.writer.LEAN_CODECS =
False``, ``_fastpath.stamp_release(False)``; ``--toggle`` picks which) part by part; the rows
written are the same in both.

    python benchmarks/writer_sparse.py [--steps 830] [--every 100] [--parts 8] [--ab]
                                       [--toggle STAMP_RELEASE]
                                       [--toggle BUFFERED_WRITE,LEAN_S21]

Prints, per variant, the median and range over the parts of the thread CPU per op (services,
flush, its stages) and per part, and the load average before and after."""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time

from common import ddp_sample_one_rank, uptime

STAGES = ("service", "flush", "arrays", "parquet", "check", "inflight", "rest")
#: --ab's switches (True in B, False in A): the service in C (``recorder.SERVICE_C``) and the
#: lean codecs (``format.writer.LEAN_CODECS``) of session 16, the release of a DDP bucket's op
#: at its stamp (``_fastpath.stamp_release``) of session 17; the default of --toggle
TOGGLES = ("SERVICE_C", "LEAN_CODECS", "STAMP_RELEASE")
#: more switches, by name: (module, attribute, value in A, value in B): session 21's part
#: written with one write (``format.writer.BUFFERED_WRITE``) and its lean columns
#: (``LEAN_S21``: A writes with session 16's, ``LEAN_CODECS = "s16"``)
MORE = {"BUFFERED_WRITE": ("W", "BUFFERED_WRITE", False, True),
        "LEAN_S21": ("W", "LEAN_CODECS", "s16", True)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=830)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--parts", type=int, default=8)
    ap.add_argument("--ab", action="store_true", help="alternate the replaced paths (A) and these (B)")
    ap.add_argument("--toggle", default=",".join(TOGGLES),
                    help="the switches --ab turns off in A (comma-separated; default: all of "
                         + ", ".join(TOGGLES) + "; also " + ", ".join(MORE) + ")")
    args = ap.parse_args(argv)
    print("load before:", uptime())
    import torch.distributed as dist

    from commtrace.capture import recorder as R
    from commtrace.format import writer as W

    rec, m, st = ddp_sample_one_rank("commtrace-sparse-", threads=1)
    acc: dict = {}
    me = threading.get_ident()

    def timed(obj, name, key):
        f = getattr(obj, name)

        def g(*a, **k):
            if threading.get_ident() != me:
                return f(*a, **k)
            t0 = time.thread_time_ns()
            try:
                return f(*a, **k)
            finally:
                acc[key] = acc.get(key, 0) + time.thread_time_ns() - t0
        setattr(obj, name, g)

    service = rec._service
    # the writer thread services nothing (this thread does, timed): its wake-ups stay
    rec._service = lambda final: service(final) if threading.get_ident() == me or final else None
    timed(R, "arrays_of_rows", "arrays")
    timed(R, "arrays_of_records", "arrays")
    timed(W, "write_parquet", "parquet")
    timed(W, "_check_complete", "check")
    timed(W, "atomic_write_text", "inflight")
    for i in range(30):
        m.train_step(st, i)
    rec.flush()
    res: dict = {}
    rows = []
    toggles = [t for t in args.toggle.split(",") if t]
    unknown = [t for t in toggles if t not in TOGGLES and t not in MORE]
    if unknown:
        ap.error(f"--toggle: unknown {unknown}; known: {', '.join(TOGGLES + tuple(MORE))}")
    print("A turns off:", ", ".join(toggles) if args.ab else "(no --ab)")
    for part in range(args.parts + 2):
        mode = ("A" if part % 2 else "B") if args.ab else "B"
        for name in toggles:
            if name in MORE:
                mod, attr, a, b = MORE[name]
                setattr({"R": R, "W": W}[mod], attr, b if mode == "B" else a)
                continue
            if name == "STAMP_RELEASE":
                if hasattr(R._cfast, "stamp_release"):
                    R._cfast.stamp_release(mode == "B")
                continue
            for mod in (R, W):
                if hasattr(mod, name):
                    setattr(mod, name, mode == "B")
        acc.clear()
        with rec._write_lock:   # the writer thread writes no part meanwhile
            for i in range(args.steps):
                t0 = time.thread_time_ns()
                m.train_step(st, i)
                acc["train"] = acc.get("train", 0) + time.thread_time_ns() - t0
                if (i + 1) % args.every == 0:
                    t0 = time.thread_time_ns()
                    service(False)
                    acc["service"] = acc.get("service", 0) + time.thread_time_ns() - t0
            t0 = time.thread_time_ns()
            service(False)
            acc["service"] = acc.get("service", 0) + time.thread_time_ns() - t0
            n = rec.queued()
            t0 = time.thread_time_ns()
            rec.flush()
            acc["flush"] = time.thread_time_ns() - t0
        acc["rest"] = acc["flush"] - sum(acc.get(k, 0) for k in STAGES[2:-1])
        rows.append(n)
        if part >= 2:
            res.setdefault(mode, []).append(dict(acc))
    ops = 2 * args.steps
    print(f"{args.steps} steps ({ops} ops) per part, a service every {args.every} steps; "
          f"rows per part {rows[2:]}")
    for mode, parts in sorted(res.items()):
        print(f"{mode} ({len(parts)} parts): us of thread CPU per op, median [min, max]; "
              "ms per part")
        for k in STAGES:
            v = [p.get(k, 0) / 1e3 / ops for p in parts]
            print(f"  {k:9s} {statistics.median(v):6.3f} [{min(v):.3f}, {max(v):.3f}]"
                  f"   {statistics.median(v) * ops / 1e3:6.3f} ms")
        tot = [(p.get("service", 0) + p.get("flush", 0)) / 1e3 / ops for p in parts]
        print(f"  {'total':9s} {statistics.median(tot):6.3f} [{min(tot):.3f}, {max(tot):.3f}]")
        tr = [p.get("train", 0) / 1e3 / args.steps for p in parts]
        print(f"  (the training steps: {statistics.median(tr):.1f} [{min(tr):.1f}, {max(tr):.1f}] us "
              "of thread CPU per step, where a release at the stamp is paid)")
    print("load after:", uptime())
    rec._service = service
    del st
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
