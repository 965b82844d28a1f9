"""A 2-rank gloo job for tests/test_writer_wakeups.py (issue 20): the writer thread's own
counters (``Recorder.writer_stats``: wake-ups, rung, polling cycles, services, timed flushes)
over three phases, each measured over a number of the writer's own timed flushes (counted,
not timed):

1. idle: blocking all_reduces only, nothing pending: the writer sleeps from flush to flush;
2. pending: async all_reduces kept unwaited (their Work alive, complete through their
   future): the writer looks at them every ``IDLE_WAKE_S``, no polling;
3. gloo point-to-point: rank 1 issues 8 isends to rank 0, which receives them 0.3 s later;
   rank 1 reads ``is_completed()`` after rank 0 has them all, then waits them. gloo completes
   these Works in wait() only (``recorder.WAIT_ONLY``): the writer does not poll them;
4. idle again;
5. (a second recorder, ``--async-completion wait``) an async all_reduce without a completion
   callback, which rank 0 joins 0.3 s after rank 1 issued it and rank 1 waits 0.9 s after:
   the writer polls it every ``POLL_INTERVAL_S`` and sees it end before the wait.
Each rank writes ``result-<rank>.json`` with the counters of each phase.

    torchrun --nproc-per-node 2 writer_wakeups.py OUT
"""

import sys
import time

import torch
import torch.distributed as dist

import commtrace
from commtrace.capture import recorder as R
from job_result import finish

INTERVAL = 0.5


def snap(rec):
    return dict(rec.writer_stats)


def diff(a, b):
    return {k: b[k] - a[k] for k in b}


def agree(flag: bool) -> bool:
    """True on both ranks as soon as it is on either (the loops stay in step: the same
    collectives on both ranks)."""
    x = torch.tensor([int(flag)])
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return bool(x.item())


def agree_all(flag: bool) -> bool:
    """True on both ranks once it is on both (MIN), the loops staying in step likewise."""
    x = torch.tensor([int(flag)])
    dist.all_reduce(x, op=dist.ReduceOp.MIN)
    return bool(x.item())


def until_flushes(rec, n, work):
    """Run `work()` until the writer thread has written `n` more timed flushes on both ranks
    (they stop together; on a loaded machine one rank's writer can lag the other's by two
    flushes: CI saw 1 against 3); the counters from just after a flush to the end."""
    f0 = rec.writer_stats["flushes"]
    while True:                         # start right after a flush
        work()
        if agree(rec.writer_stats["flushes"] != f0):
            break
    a = snap(rec)
    t0 = time.monotonic()
    while True:
        work()
        if agree_all(rec.writer_stats["flushes"] >= a["flushes"] + n):
            break
    out = diff(a, snap(rec))
    out["wall_s"] = time.monotonic() - t0
    return out


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    commtrace.enable(out, flush_interval=INTERVAL, hazards="off")
    rec = R.get_recorder()
    t = torch.ones(4)
    res = {"rank": rank, "idle_wake_s": R.IDLE_WAKE_S, "poll_interval_s": R.POLL_INTERVAL_S,
           "idle_after_s": R.IDLE_AFTER_S, "interval_s": INTERVAL}

    def blocking():
        dist.all_reduce(t)
        time.sleep(0.005)

    # the first part written (early flushes every 0.2 s until then), then 1 s with nothing
    # pending (IDLE_AFTER_S): the writer is asleep from flush to flush from there on
    until_flushes(rec, 2, blocking)
    time.sleep(R.IDLE_AFTER_S + 0.1)
    dist.barrier()
    res["idle"] = until_flushes(rec, 4, blocking)

    # 2. pending: unwaited async ops kept alive (held HOLD_FLUSHES intervals, then released)
    kept = []

    issued = [0]

    def pending():
        kept.append(dist.all_reduce(torch.ones(4), async_op=True))
        issued[0] += 1
        if len(kept) > 200:
            kept.pop(0)
        time.sleep(0.005)

    # the writer sleeps from flush to flush now; the first op that becomes pending rings it
    # (issued just after a flush, once the writer is asleep again: its next flush is a flush
    # interval away, no timed wake-up can see the op first; the peer joins when it gets here)
    dist.barrier()
    f0 = rec.writer_stats["flushes"]
    t_end = time.monotonic() + 30
    while rec.writer_stats["flushes"] == f0 and time.monotonic() < t_end:
        time.sleep(0.002)
    while not rec._deep and time.monotonic() < t_end:
        time.sleep(0.002)
    res["deep_before_first_op"] = rec._deep
    a = snap(rec)
    res["pending_t0_ns"] = time.time_ns()
    pending()
    t_end = time.monotonic() + 30
    while rec.writer_stats["rung"] == a["rung"] and time.monotonic() < t_end:
        time.sleep(0.01)
    res["first_op"] = diff(a, snap(rec))
    dist.barrier()
    res["pending"] = until_flushes(rec, 4, pending)
    res["pending_t1_ns"] = time.time_ns()
    res["pending_issued"] = issued[0]
    for w in kept:
        w.wait()
    kept.clear()
    dist.barrier()

    # 3. gloo isends (Works without a future that only wait() completes: not polled), in
    # flight while rank 0 receives them 0.3 s later; rank 1 looks at is_completed() after
    # rank 0 has them all, then waits
    store = dist.distributed_c10d._get_default_store()
    a = snap(rec)
    n_send = 8
    if rank == 1:
        bufs = [torch.full((64,), float(i)) for i in range(n_send)]
        works = [dist.isend(b, dst=0) for b in bufs]
        store.wait(["received"])
        time.sleep(0.2)                     # GIL released: the writer may run meanwhile
        res["p2p_completed_before_wait"] = [w.is_completed() for w in works]
        res["p2p_t_wait_ns"] = time.time_ns()
        for w in works:
            w.wait()
        res["p2p_completed_after_wait"] = [w.is_completed() for w in works]
    else:
        time.sleep(0.3)
        for i in range(n_send):
            b = torch.empty(64)
            dist.recv(b, src=1)
            assert float(b[0]) == float(i)
        res["p2p_received_ns"] = time.time_ns()
        store.set("received", "1")
    res["p2p"] = diff(a, snap(rec))
    dist.barrier()

    # 4. idle again: nothing in flight, no polling
    time.sleep(R.IDLE_AFTER_S + 0.1)
    res["idle_after"] = until_flushes(rec, 3, blocking)
    dist.barrier()
    commtrace.disable()

    # 5. Works without a future that polling does see end: --async-completion wait (no
    # callback; gloo's collectives finish their Work on gloo's thread). Rank 1's all_reduce
    # ends when rank 0 joins, 0.3 s later; rank 1 waits it only 0.9 s after issuing it.
    commtrace.enable(out.rstrip("/") + "_wait", flush_interval=INTERVAL, hazards="off",
                     async_completion="wait")
    rec = R.get_recorder()
    dist.barrier()
    a = snap(rec)
    x = torch.ones(4)
    if rank == 1:
        w = dist.all_reduce(x, async_op=True)
        time.sleep(0.9)
        res["poll_t_wait_ns"] = time.time_ns()
        w.wait()
    else:
        time.sleep(0.3)
        res["poll_t_join_ns"] = time.time_ns()
        dist.all_reduce(x)
    res["poll"] = diff(a, snap(rec))
    res["poll_value"] = float(x[0])
    dist.barrier()
    finish(out, rank, res)


if __name__ == "__main__":
    main()
