#!/usr/bin/env python
"""Every GPU check of commtrace's NCCL/CUDA path in one call (issue 4, item 9).

    python scripts/gpu_check.py [--json OUT.json] [--quick] [--no-samples]
    bash scripts/gpu_check.sh          # the same, with carried wheels on PYTHONPATH

One GPU, NCCL at world size 1 (two NCCL ranks cannot share a GPU), a few minutes. Parts:

A. Device timer alone (commtrace.capture.device, no recorder, no pyarrow needed):
   all_reduce, all_gather_into_tensor, broadcast, reduce_scatter_tensor, sync and async, 4 KB to
   256 MB, with a matmul between issue and wait. Asserts that ``t_end_ns - t_start_ns`` agrees
   within 10% or 20 us with an independent CUDA event pair around the same op, that the mapped
   times fall inside the host window of the call (calibration), that the host returns long
   before completion for large transfers and for an op queued behind a long matmul, that the
   timer adds at most 10 us of host time per op, and that a CUDA graph capture records no
   event, counts the op, and survives the writer polling during the capture.
   Also: synchronize() capture (a stand-in recorder), first-op stall and wait() vs
   synchronize() figures, the TORCH_NCCL_ENABLE_TIMING cross-check (figures only), the timer's
   cost per call (A6), what a completion hook receives (A7), and the device time of an op
   against the NCCL kernel's own time in torch.profiler's CUDA trace (A8, asserted).
B. End to end through the recorder (needs pyarrow): a traced run writes CUDA ops with device
   times and stream_wait_ns, a sync row counting the async op in flight at
   torch.cuda.synchronize(), a use-before-wait hazard on a CUDA tensor, NVML/NCCL metadata;
   the whole capture adds at most 10 us of host time per op.
C. ``samples/*.py --backend nccl`` at world size 1, plain and under ``commtrace run``.
D. NCCL completion hook (``commtrace run --completion-hook``, TORCH_NCCL_ENABLE_TIMING=1):
   wrapped ops carry NCCL's own seq; all_reduces issued through ``torch.ops._c10d_functional``
   (below commtrace's wrappers, as compiled graphs issue them) become ``api="c++"`` rows with
   their seq, device duration and host times, and no wrapped op gets a twin.
E. ``commtrace accel build`` on this machine (started in the background at the beginning), then
   the DDP sample under ``commtrace run`` with the built module: the C++ recording group or its
   fallback records the Reducer's bucket all-reduces with device times.
F. ``torch.compile`` (inductor) of a function issuing functional collectives and an in-place
   c10d all_reduce on CUDA, ``fullgraph`` on and off, without commtrace and under
   ``commtrace run``: the same graphs, graph breaks and output bytes.

Before importing commtrace it builds the C extensions (the capture fast path, the replay) in
place for this interpreter with the C compiler when they are missing (the device machine's Python
differs from the development one's), and says which capture path ran. Samples (C) and the two
compile jobs (F) run side by side: each is a world-size-1 NCCL job of its own.

Prints PASS / FAIL / SKIP per check and the measured figures; exits 1 if any check failed.
``--json`` also writes everything (for docs/gpu-validation.md).
"""

from __future__ import annotations

import argparse
import faulthandler
import glob
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
warnings.simplefilter("ignore")

RESULTS: list[dict] = []
FIGURES: dict = {}
JSON_PATH: list = []   # --json: rewritten after every check, so a watchdog's end keeps them


def save_json():
    if JSON_PATH:
        with open(JSON_PATH[0], "w") as f:
            json.dump({"results": RESULTS, "figures": FIGURES}, f, indent=1, default=str)


def report(name, status, detail=""):
    RESULTS.append({"check": name, "status": status, "detail": detail})
    print(f"[{status}] {name}: {detail}", flush=True)
    save_json()


def check(name, ok, detail=""):
    report(name, "PASS" if ok else "FAIL", detail)
    return ok


def figure(name, value, unit=""):
    FIGURES[name] = value if not unit else f"{value} {unit}"
    print(f"    {name}: {value}{(' ' + unit) if unit else ''}", flush=True)


def guarded(name):
    """Run a part; an unexpected exception is a FAIL of that part, not the end of the script."""
    def deco(fn):
        def run(*a, **k):
            try:
                return fn(*a, **k)
            except Exception as e:
                report(name, "FAIL", f"{type(e).__name__}: {e}")
                traceback.print_exc()
                return None
        return run
    return deco


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def us(ns):
    return round(ns / 1e3, 1)


# --------------------------------------------------------------------------------------------

def new_timer(D, python=False):
    """The device timer commtrace uses on CUDA (device.get_device_timer's choice): the C timer
    (_devtimer) where built, else the Python EventTimer; `python` forces the latter."""
    if not python and getattr(D, "c_timer_available", lambda: False)():
        try:
            return D.CudaCTimer()
        except Exception as e:
            figure("C device timer unavailable", repr(e))
    return D.CudaTimer()


class Poller(threading.Thread):
    """The writer thread's role: poll() every 0.5 ms, collect rows by op id."""

    def __init__(self, timer):
        super().__init__(daemon=True, name="poller")
        self.timer = timer
        self.rows = {}
        self.stop = threading.Event()
        self.polls = 0

    def run(self):
        while not self.stop.is_set():
            for row in self.timer.poll():
                self.rows[row[0]] = row
            self.polls += 1
            time.sleep(0.0005)

    def wait_for(self, op_id, timeout=20.0):
        end = time.monotonic() + timeout
        while op_id not in self.rows:
            if time.monotonic() > end:
                raise TimeoutError(f"device times of op {op_id} not read back in {timeout} s")
            time.sleep(0.0005)
        return self.rows.pop(op_id)


class StubRecorder:
    """The recorder hooks that sync capture uses (docs/dev/interfaces.md)."""

    def __init__(self):
        self.rows = []
        self.inflight = []

    def now_ns(self):
        return time.time_ns()

    def inflight_ids(self):
        return list(self.inflight)

    def emit(self, **f):
        self.rows.append(f)


SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def make_ops(torch, dist, dev, sizes):
    """name -> size -> fn(async_op) issuing the op on preallocated float32 tensors."""
    ops = {}
    for size in sizes:
        n = size // 4
        a = torch.ones(n, device=dev)
        b = torch.empty(n, device=dev)
        c = torch.empty(n, device=dev)
        ops.setdefault("all_reduce", {})[size] = lambda x, a=a: dist.all_reduce(a, async_op=x)
        ops.setdefault("all_gather_into_tensor", {})[size] = \
            lambda x, a=a, b=b: dist.all_gather_into_tensor(b, a, async_op=x)
        ops.setdefault("broadcast", {})[size] = lambda x, a=a: dist.broadcast(a, 0, async_op=x)
        ops.setdefault("reduce_scatter_tensor", {})[size] = \
            lambda x, a=a, c=c: dist.reduce_scatter_tensor(c, a, async_op=x)
    return ops


# --------------------------------------------------------------------------------------------
# Part A
# --------------------------------------------------------------------------------------------


def first_op_stall(torch, dist):
    """Host block of the first collective on a communicator (lazy NCCL init) vs the next."""
    x = torch.ones(1024, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    dist.all_reduce(x)
    t1 = time.perf_counter_ns()
    dist.all_reduce(x)
    t2 = time.perf_counter_ns()
    torch.cuda.synchronize()
    figure("first all_reduce on the default group, host-blocked", round((t1 - t0) / 1e6, 2), "ms")
    figure("second all_reduce, host-blocked", us(t2 - t1), "us")
    g = dist.new_group([0])
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    dist.all_reduce(x, group=g)
    t1 = time.perf_counter_ns()
    dist.all_reduce(x, group=g)
    t2 = time.perf_counter_ns()
    torch.cuda.synchronize()
    figure("first all_reduce on a new group, host-blocked", round((t1 - t0) / 1e6, 2), "ms")
    figure("second all_reduce on that group, host-blocked", us(t2 - t1), "us")
    return g


@guarded("A1 timer accuracy")
def timer_accuracy(torch, dist, D, quick):
    timer = new_timer(D)
    poller = Poller(timer)
    poller.start()
    sizes = SIZES[::2] if quick else SIZES
    ops = make_ops(torch, dist, "cuda", sizes)
    mm = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    lead = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ref0 = torch.cuda.Event(enable_timing=True)
    ref1 = torch.cuda.Event(enable_timing=True)
    for name in ops:  # warm-up: communicator, kernels
        for x in (False, True):
            w = ops[name][sizes[0]](x)
            if w is not None and x:
                w.wait()
    torch.cuda.synchronize()
    op_id = 0
    worst = {}
    idle_worst = {}
    window_bad = []
    table = []
    for name, by_size in ops.items():
        for size, fn in by_size.items():
            for async_op in (False, True):
                # idle: the stream is empty at the call, so each event completes as soon as
                # it is recorded and both pairs include host time (figures only); busy: a
                # ~1.4 ms matmul ahead of everything, so the device runs the events and the op
                # back to back and both pairs measure the device (asserted)
                for busy in (False, True):
                    op_id += 1
                    torch.cuda.synchronize()
                    if busy:
                        pre = lead @ lead
                    ref0.record()
                    h0 = time.time_ns()
                    tok = timer.on_issue(op_id)
                    w = fn(async_op)
                    h1 = time.time_ns()
                    timer.on_return(tok, not async_op)
                    if async_op:
                        y = mm @ mm
                        timer.on_wait_begin(tok)
                        w.wait()
                        timer.on_wait(tok)
                    ref1.record()
                    torch.cuda.synchronize()
                    h2 = time.time_ns()
                    _, t_start, t_end, sw = poller.wait_for(op_id)
                    ref_ns = ref0.elapsed_time(ref1) * 1e6
                    dur = t_end - t_start
                    dev = abs(dur - ref_ns)
                    tol = max(0.1 * ref_ns, 20_000)
                    key = (name, async_op)
                    w_ = worst if busy else idle_worst
                    if key not in w_ or dev / tol > w_[key][0]:
                        w_[key] = (dev / tol, dev, ref_ns, size)
                    # Calibration: the device ran the op inside the host window of the call.
                    slack = 100_000
                    if not (h0 - slack <= t_start <= t_end <= h2 + slack):
                        window_bad.append((name, size, async_op, t_start - h0, h2 - t_end))
                    table.append({"op": name, "bytes": size, "async": async_op, "busy": busy,
                                  "host_block_us": us(h1 - h0), "device_us": us(dur),
                                  "ref_us": us(ref_ns), "stream_wait_us":
                                  None if sw is None else us(sw),
                                  "end_after_return_us": us(t_end - h1)})
    for (name, async_op), (ratio, dev, ref_ns, size) in idle_worst.items():
        figure(f"A1 idle stream, {name} {'async' if async_op else 'sync'}: worst deviation from "
               "the independent pair", f"{us(dev)} of {us(ref_ns)} at {size} B", "us")
    for (name, async_op), (ratio, dev, ref_ns, size) in worst.items():
        check(f"A1 t_end-t_start vs independent events (busy stream): {name} "
              f"{'async' if async_op else 'sync'}",
              ratio <= 1.0, f"worst deviation {us(dev)} us of {us(ref_ns)} us at {size} B "
              f"(ratio to tolerance {ratio:.2f})")
    check("A1 calibration: device times inside the host window (+-100 us)", not window_bad,
          f"{len(window_bad)} outside" + (f", first: {window_bad[0]}" if window_bad else ""))
    FIGURES["per-op table"] = table
    print("    op                      bytes       mode  stream host_block_us  device_us  ref_us "
          "stream_wait_us  end_after_return_us")
    for r in table:
        print(f"    {r['op']:<22} {r['bytes']:>10}  {'async' if r['async'] else 'sync ':<5} "
              f"{'busy' if r['busy'] else 'idle':<6}"
              f"{r['host_block_us']:>13} {r['device_us']:>10} {r['ref_us']:>7} "
              f"{str(r['stream_wait_us']):>15} "
              f"{r['end_after_return_us']:>20}")
    # Large messages: the host returns at enqueue, long before completion. At world size 1
    # NCCL moves no data for in-place ops, and 256 MB copies in ~0.1 ms on an H200, about the
    # host's launch time: the check uses 2 GiB out-of-place transfers (~1 ms on the device).
    n = (2 << 30) // 4
    src = torch.ones(n, device="cuda")
    dst = torch.empty(n, device="cuda")
    big_ops = {"all_gather_into_tensor": lambda: dist.all_gather_into_tensor(dst, src),
               "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(dst, src)}
    for name, fn in big_ops.items():
        fn()
        for rep in range(2):
            torch.cuda.synchronize()
            op_id += 1
            h0 = time.time_ns()
            tok = timer.on_issue(op_id)
            fn()
            h1 = time.time_ns()
            timer.on_return(tok, True)
            torch.cuda.synchronize()
            _, t_start, t_end, _ = poller.wait_for(op_id)
        figure(f"{name} 2 GiB: host-blocked / device / completed after return",
               f"{us(h1 - h0)} / {us(t_end - t_start)} / {us(t_end - h1)}", "us")
        check(f"A1 host returns before completion: {name} 2 GiB",
              (h1 - h0) < 0.5 * (t_end - t_start) and t_end > h1,
              f"host blocked {us(h1 - h0)} us, device {us(t_end - t_start)} us")
    del src, dst
    # Queued behind a long matmul chain (~15 ms): enqueue returns at once, completion after it.
    big_mm = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    fn = ops["all_reduce"][sizes[0]]
    torch.cuda.synchronize()
    op_id += 1
    for _ in range(10):
        y = big_mm @ big_mm
    h0 = time.time_ns()
    tok = timer.on_issue(op_id)
    fn(False)
    h1 = time.time_ns()
    timer.on_return(tok, True)
    torch.cuda.synchronize()
    _, t_start, t_end, _ = poller.wait_for(op_id)
    figure("all_reduce 4 KB behind ten 8192^3 bf16 matmuls: host-blocked", us(h1 - h0), "us")
    figure("  ... completed after host return", us(t_end - h1), "us")
    check("A1 enqueue vs completion behind a matmul", (t_end - h1) > 4 * (h1 - h0),
          f"host {us(h1 - h0)} us, completion {us(t_end - h1)} us after return")
    poller.stop.set()
    poller.join()
    check("A1 event pool bounded", timer.events_created <= 16 + 4 * 4,
          f"{timer.events_created} events created for {op_id} ops")
    del y


@guarded("A2 synchronize capture")
def sync_capture(torch, dist, sync):
    stub = StubRecorder()
    assert sync.install(get_recorder=lambda: stub)
    try:
        x = torch.ones(64 << 20, device="cuda")
        big_mm = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        stub.rows.clear()
        # An async op in flight (queued behind a matmul) when synchronize() is called.
        y = big_mm @ big_mm
        w = dist.all_reduce(x, async_op=True)
        stub.inflight = [42]
        h0 = time.perf_counter_ns()
        torch.cuda.synchronize()
        h1 = time.perf_counter_ns()
        stub.inflight = []
        w.wait()
        row = [r for r in stub.rows if r["api"] == "torch.cuda.synchronize"]
        check("A2 torch.cuda.synchronize() with an async op in flight gives a sync row counting it",
              len(row) == 1 and row[0]["inflight"] == 1 and row[0]["inflight_ids"] == [42]
              and 0.5 * (h1 - h0) <= row[0]["t_return_ns"] - row[0]["t_enqueue_ns"] <= h1 - h0,
              f"{row}, host {us(h1 - h0)} us")
        # wait() vs synchronize(): the first orders streams, the second drains the device.
        y = big_mm @ big_mm
        w = dist.all_reduce(x, async_op=True)
        h0 = time.perf_counter_ns()
        w.wait()
        h1 = time.perf_counter_ns()
        torch.cuda.synchronize()
        h2 = time.perf_counter_ns()
        figure("wait() on an async all_reduce queued behind a matmul, host", us(h1 - h0), "us")
        figure("torch.cuda.synchronize() right after it, host", us(h2 - h1), "us")
        stub.rows.clear()
        torch.cuda.current_stream().synchronize()
        ev = torch.cuda.Event()
        ev.record()
        ev.synchronize()
        w = dist.all_reduce(x, async_op=True)
        w.synchronize()
        w.wait()
        apis = [r["api"] for r in stub.rows]
        check("A2 Stream/Event/Work.synchronize rows",
              apis == ["torch.cuda.Stream.synchronize", "torch.cuda.Event.synchronize",
                       "Work.synchronize"], f"{apis}")
        del y
    finally:
        sync.uninstall()
    check("A2 uninstall restores torch.cuda.synchronize",
          not hasattr(torch.cuda.synchronize, "__commtrace_original__"))


@guarded("A3 CUDA graph capture")
def graph_capture(torch, dist, D):
    x = torch.ones(1 << 20, device="cuda")
    s = torch.cuda.Stream()

    def capture(with_timer):
        timer = new_timer(D) if with_timer else None
        poller = None
        pend = None
        if with_timer:
            D.install()
            # An op pending across the capture, so that the poller has events to query.
            pend = timer.on_issue(10_000)
            w = dist.all_reduce(x, async_op=True)
            timer.on_return(pend, False)
            poller = Poller(timer)
            poller.start()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                dist.all_reduce(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        tok = "unset"
        with torch.cuda.graph(g):
            if with_timer:
                tok = timer.on_issue(10_001)
            dist.all_reduce(x)
            if with_timer:
                timer.on_return(tok, True)
                time.sleep(0.01)  # let the poller run during the capture
        g.replay()
        torch.cuda.synchronize()
        if with_timer:
            w.wait()
            timer.on_wait(pend)
            poller.wait_for(10_000)
            poller.stop.set()
            poller.join()
        return timer, tok

    try:
        capture(False)
    except Exception as e:
        report("A3 CUDA graph capture", "SKIP",
               f"NCCL graph capture fails here without commtrace: {type(e).__name__}: {e}")
        return
    timer, tok = capture(True)
    check("A3 graph capture: no event recorded, op counted, capture intact",
          tok is None and timer.graph_captured_ops == 1,
          f"token {tok!r}, graph_captured_ops {timer.graph_captured_ops}")


@guarded("A4 timer host overhead")
def timer_overhead(torch, dist, D):
    timer = new_timer(D)
    kind = type(timer).__name__
    med = _timer_overhead(torch, dist, timer)
    figure(f"device timer ({kind}) added host time per op (median of paired rounds)", us(med),
           "us")
    check("A4 device timer adds <= 10 us host time per op", med <= 10_000,
          f"{us(med)} us ({kind})")
    if kind != "CudaTimer":   # the Python timer and the C one on the runtime API, as figures
        med_py = _timer_overhead(torch, dist, new_timer(D, python=True))
        figure("device timer (Python EventTimer, COMMTRACE_DEVICE_TIMER_C=0) added host time "
               "per op", us(med_py), "us")
        try:
            med_rt = _timer_overhead(torch, dist, D.CudaCTimer(api="runtime"))
            figure("device timer (C, COMMTRACE_DEVICE_TIMER_API=runtime) added host time per op",
                   us(med_rt), "us")
        except Exception as e:
            figure("device timer (C, runtime API): unavailable", repr(e))


def _timer_overhead(torch, dist, timer, rounds=15, n=200):
    poller = Poller(timer)
    poller.start()
    x = torch.ones(1024, device="cuda")
    all_reduce = dist.all_reduce
    for _ in range(50):
        all_reduce(x)
    diffs = []
    op = [0]

    def base():
        t0 = time.perf_counter_ns()
        for _ in range(n):
            all_reduce(x)
        return (time.perf_counter_ns() - t0) / n

    def timed():
        t0 = time.perf_counter_ns()
        for _ in range(n):
            op[0] += 1
            tok = timer.on_issue(op[0])
            all_reduce(x)
            timer.on_return(tok, True)
        return (time.perf_counter_ns() - t0) / n

    bases = []
    for r in range(rounds):
        torch.cuda.synchronize()
        if r % 2:
            b, t = base(), timed()
        else:
            t, b = timed(), base()
        bases.append(b)
        diffs.append(t - b)
    torch.cuda.synchronize()
    poller.stop.set()
    poller.join()
    figure("blocking all_reduce 4 KB, host time untraced (median)", us(statistics.median(bases)),
           "us")
    if timer.pending():
        figure("A4 ops not read back by the poller", timer.pending())
    return statistics.median(diffs)



@guarded("A6 timer cost breakdown")
def timer_costs(torch, dist, D, n=2000, rounds=5):
    """Host ns per call of what the device timer does per op (figures; where A4's time goes)."""
    timer = new_timer(D)
    pytimer = new_timer(D, python=True)
    s = torch.cuda.current_stream()
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for e in evs:
        e.record(s)
    torch.cuda.synchronize()
    x = torch.ones(1024, device="cuda")
    w = dist.all_reduce(x, async_op=True)
    w.wait()
    fut = w.get_future()
    lock = threading.Lock()
    op = [10 ** 6]

    def issue_return(timer=timer):
        op[0] += 1
        tok = timer.on_issue(op[0])
        timer.on_return(tok, True)

    def done_cb():
        fut.add_done_callback(lambda f: None)

    def issue_async_wait(timer=timer):
        # an async op's events: start, completion in the future's callback, wait begin/end
        op[0] += 1
        tok = timer.on_issue(op[0])
        timer.on_return(tok, False)
        fut.add_done_callback(lambda f, tok=tok: timer.on_done(tok))
        timer.on_wait_begin(tok)
        timer.on_wait(tok)

    cases = {
        "time.time_ns()": time.time_ns,
        "threading.Lock acquire+release": lambda: (lock.acquire(), lock.release()),
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "torch.cuda.is_current_stream_capturing()": torch.cuda.is_current_stream_capturing,
        "stream.device_index": lambda: s.device_index,
        "Event.record(stream)": lambda: evs[0].record(s),
        "Event.query() (completed)": evs[1].query,
        "torch.cuda.Event(enable_timing=True)": lambda: torch.cuda.Event(enable_timing=True),
        "torch._C._cuda_getCurrentRawStream(0)": lambda: torch._C._cuda_getCurrentRawStream(0),
        "Future.add_done_callback (completed NCCL future)": done_cb,
        f"timer ({type(timer).__name__}).on_issue + on_return(blocking)": issue_return,
        f"timer ({type(timer).__name__}), async op: issue, return, done callback, wait begin + "
        "end": issue_async_wait,
    }
    if type(pytimer) is not type(timer):
        cases["timer (Python EventTimer).on_issue + on_return(blocking)"] = \
            lambda: issue_return(pytimer)
        cases["timer (Python EventTimer), async op: issue, return, done callback, wait begin + "
              "end"] = lambda: issue_async_wait(pytimer)
    out = {}
    for name, fn in cases.items():
        best = None
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            dt = (time.perf_counter_ns() - t0) / n
            best = dt if best is None else min(best, dt)
            if name.startswith("timer"):
                # read back (events to the pool) between rounds: later rounds reuse events
                torch.cuda.synchronize()
                timer.poll()
                pytimer.poll()
        out[name] = round(best / 1e3, 2)
        figure(f"A6 {name}", out[name], "us/call (best of 5 x 2000)")
    # the writer's side: poll() reading back 2000 completed blocking ops, per op
    for tm in (timer, pytimer) if type(pytimer) is not type(timer) else (timer,):
        best = None
        for _ in range(rounds):
            for _ in range(n):
                issue_return(tm)
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            got = len(tm.poll())
            dt = (time.perf_counter_ns() - t0) / max(1, got)
            best = dt if best is None else min(best, dt)
        name = f"timer ({type(tm).__name__}).poll(), per blocking op read back"
        out[name] = round(best / 1e3, 2)
        figure(f"A6 {name}", out[name], "us/op (best of 5 x 2000)")
    torch.cuda.synchronize()
    FIGURES["timer_costs_us"] = out
    report("A6 timer cost breakdown", "INFO", "figures above (not asserted)")


@guarded("A8 torch.profiler cross-check")
def profiler_crosscheck(torch, dist, D, n=5):
    """commtrace's device time of an op against the NCCL kernel's own time in torch.profiler's
    CUDA trace (CUPTI), on a busy stream: an independent truth for t_end - t_start."""
    timer = new_timer(D)
    durs, kdur, names, host, cals = _profiled_ops(torch, dist, timer, n, first=True)
    figure("A8 commtrace device time, 64 MB all_gather (us)", [round(d, 1) for d in durs])
    figure("A8 NCCL kernel time in torch.profiler (us)", [round(k, 1) for k in kdur])
    figure("A8 host time per op inside the profiler: on_issue / the call / on_return (us)", host)
    figure("A8 calibrations during the profiled ops", cals)
    diffs = [d - k for d, k in zip(durs, kdur)]
    check("A8 device time vs torch.profiler's NCCL kernel (busy stream), within 10% or 20 us",
          len(kdur) == n and all(abs(x) <= max(0.1 * k, 20) for x, k in zip(diffs, kdur)),
          f"differences {[round(x, 1) for x in diffs]} us ({type(timer).__name__}); "
          f"kernels {names}")
    if type(timer).__name__ != "CudaTimer":
        # the Python timer the same way, as figures: is a late first op the C timer's? (runs
        # 6, 7 and 9 of the C timer: 1.5-3.2 ms; the Python timer in runs 1-5: never)
        durs, kdur, _, host, _ = _profiled_ops(torch, dist, new_timer(D, python=True), n,
                                               first=True)
        figure("A8 (Python EventTimer) device time minus the kernel's (us)",
               [round(d - k, 1) for d, k in zip(durs, kdur)])
        figure("A8 (Python EventTimer) host time per op: on_issue / the call / on_return (us)",
               host)
        try:   # and the C timer on the CUDA runtime's calls (COMMTRACE_DEVICE_TIMER_API=runtime)
            rt = D.CudaCTimer(api="runtime")
        except Exception as e:
            figure("A8 C timer on the runtime API: unavailable", repr(e))
        else:
            durs, kdur, _, host, _ = _profiled_ops(torch, dist, rt, n, first=True)
            figure("A8 (C timer, runtime API) device time minus the kernel's (us)",
                   [round(d - k, 1) for d, k in zip(durs, kdur)])


def _profiled_ops(torch, dist, timer, n, first):
    """n 64 MB all_gathers, each behind a matmul, timed by `timer` inside a fresh
    torch.profiler: (commtrace's device times, the NCCL kernels' times, the kernels' names,
    host times per op, calibrations taken meanwhile). `first`: the timer's first op runs
    before the profiler (its host time a figure: the C timer makes its calibration stream and
    events at a device's first op)."""
    from torch.profiler import ProfilerActivity, profile

    poller = Poller(timer)
    poller.start()
    a = torch.ones((64 << 20) // 4, device="cuda")
    b = torch.empty_like(a)
    lead = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    dist.all_gather_into_tensor(b, a)
    torch.cuda.synchronize()
    if first:
        h0 = time.perf_counter_ns()
        tok = timer.on_issue(499_999)
        h1 = time.perf_counter_ns()
        dist.all_gather_into_tensor(b, a)
        h2 = time.perf_counter_ns()
        timer.on_return(tok, True)
        h3 = time.perf_counter_ns()
        torch.cuda.synchronize()
        poller.wait_for(499_999)
        figure(f"A8 ({type(timer).__name__}) the timer's first op: on_issue / on_return host "
               "time (us)", [us(h1 - h0), us(h3 - h2)])
    cal0 = timer.stats().get("calibrations", 0)
    durs, host = [], []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            y = lead @ lead
            h0 = time.perf_counter_ns()
            tok = timer.on_issue(500_000 + i)
            h1 = time.perf_counter_ns()
            dist.all_gather_into_tensor(b, a)
            h2 = time.perf_counter_ns()
            timer.on_return(tok, True)
            h3 = time.perf_counter_ns()
            host.append((us(h1 - h0), us(h2 - h1), us(h3 - h2)))
            torch.cuda.synchronize()
    for i in range(n):
        _, t0, t1, _ = poller.wait_for(500_000 + i)
        durs.append((t1 - t0) / 1e3)
    cals = timer.stats().get("calibrations", 0) - cal0
    poller.stop.set()
    poller.join()
    kern = sorted((e for e in prof.events() if e.device_type.name == "CUDA"
                   and "nccl" in e.name.lower()), key=lambda e: e.time_range.start)
    kdur = [e.time_range.end - e.time_range.start for e in kern][-n:]   # us
    del y
    return durs, kdur, [e.name[:40] for e in kern[:1]], host, cals


def timing_group(dist, D):
    """A new group whose NCCL backend times its ops (TORCH_NCCL_ENABLE_TIMING=1 at creation)."""
    os.environ[D.NCCL_TIMING_ENV] = "1"
    try:
        return dist.new_group([0])
    finally:
        os.environ.pop(D.NCCL_TIMING_ENV, None)


@guarded("A7 WorkInfo probe")
def workinfo_probe(torch, dist, D):
    """What ProcessGroupNCCL hands a completion hook in this torch (figures; part D reads it)."""
    g = timing_group(dist, D)
    seen = []
    backend = g._get_backend(torch.device("cuda"))
    try:
        g._register_on_completion_hook(lambda info: seen.append(info))
        where = "ProcessGroup"
    except Exception as e:
        backend._register_on_completion_hook(lambda info: seen.append(info))
        where = f"backend ({type(e).__name__} on the ProcessGroup)"
    x = torch.ones(1024, device="cuda")
    for _ in range(3):
        dist.all_reduce(x, group=g)
    torch.cuda.synchronize()
    end = time.monotonic() + 10
    while len(seen) < 3 and time.monotonic() < end:
        time.sleep(0.01)
    desc = []
    for info in seen[:2]:
        d = {}
        for k in ("op_type", "seq", "time_started", "time_finished", "active_duration"):
            v = getattr(info, k, "<missing>")
            d[k] = f"{type(v).__name__}: {v!r}"[:120]
        desc.append(d)
    figure("A7 hook registered on", where)
    figure("A7 WorkInfo records after 3 all_reduces", len(seen))
    figure("A7 WorkInfo fields", desc)
    report("A7 WorkInfo probe", "INFO", "figures above (not asserted)")

@guarded("A5 NCCL timing cross-check")
def nccl_crosscheck(torch, dist, D):
    g = timing_group(dist, D)
    timer = new_timer(D)
    poller = Poller(timer)
    poller.start()
    for size in (16 << 20, 256 << 20):
        a = torch.ones(size // 4, device="cuda")
        b = torch.empty_like(a)
        dist.all_gather_into_tensor(b, a, group=g)
        torch.cuda.synchronize()
        tok = timer.on_issue(size)
        w = dist.all_gather_into_tensor(b, a, group=g, async_op=True)
        timer.on_return(tok, False)
        timer.on_wait_begin(tok)
        w.wait()
        timer.on_wait(tok)
        torch.cuda.synchronize()
        _, t0, t1, sw = poller.wait_for(size)
        nccl = D.nccl_duration_ms(w)
        figure(f"all_gather {size >> 20} MB: commtrace device time", us(t1 - t0), "us")
        figure(f"all_gather {size >> 20} MB: ProcessGroupNCCL Work._get_duration()",
               "unavailable" if nccl is None else round(nccl * 1e3, 1), "" if nccl is None else "us")
    poller.stop.set()
    poller.join()
    report("A5 NCCL timing cross-check", "INFO", "figures above (not asserted)")


# --------------------------------------------------------------------------------------------
# Part B
# --------------------------------------------------------------------------------------------


@guarded("B end to end")
def end_to_end(torch, dist, tmp):
    try:
        import pyarrow.dataset as pads
    except Exception as e:
        report("B end to end", "SKIP", f"pyarrow missing ({e}); carry it (docs/gpu-validation.md)")
        return
    from commtrace.capture import registry
    from commtrace.capture.api import trace  # not commtrace.trace: see docs/gpu-validation.md
    from commtrace.capture.recorder import get_recorder

    out = os.path.join(tmp, "e2e")
    x = torch.ones(1 << 20, device="cuda")
    big = torch.ones(64 << 20, device="cuda")
    s1 = torch.ones(1, device="cuda")
    mm = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ids = {}
    with trace(output=out, flush_interval=0.2, hazards="basic"):
        rec = get_recorder()
        check("B recorder has a CUDA device timer", rec is not None and rec.device_timer is not None,
              f"{rec and rec.device_timer}")
        w = dist.all_reduce(x, async_op=True)
        y = mm @ mm
        w.wait()
        dist.all_reduce(x)
        y = mm @ mm
        w2 = dist.all_reduce(big, async_op=True)
        ids["inflight_at_sync"] = list(rec.inflight_ids())
        torch.cuda.synchronize()
        w2.wait()
        w3 = dist.all_reduce(s1, async_op=True)
        s1.item()
        w3.wait()
        # Added host time of the whole capture: wrapped vs original all_reduce, paired rounds.
        orig = registry.original_of(dist.all_reduce)
        small = torch.ones(1024, device="cuda")
        diffs, n = [], 200
        for r in range(15):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            for _ in range(n):
                orig(small)
            t1 = time.perf_counter_ns()
            for _ in range(n):
                dist.all_reduce(small)
            t2 = time.perf_counter_ns()
            diffs.append(((t2 - t1) - (t1 - t0)) / n)
        torch.cuda.synchronize()
        del y
    t = pads.dataset(out, format="parquet", partitioning="hive").to_table()
    rows = t.to_pylist()
    ops = [r for r in rows if r["kind"] == "op" and (r["device"] or "").startswith("cuda")]
    check("B CUDA op rows carry device times",
          len(ops) >= 5 and all(r["t_start_ns"] is not None and r["t_end_ns"] is not None
                                and r["t_start_ns"] <= r["t_end_ns"] for r in ops[:5]),
          f"{len(ops)} CUDA op rows; first: {ops[0] if ops else None}")
    first_async = next((r for r in ops if r["async_op"]), None)
    check("B async op waited: stream_wait_ns recorded",
          first_async is not None and first_async["stream_wait_ns"] is not None,
          f"{first_async and first_async['stream_wait_ns']}")
    syncs = [r for r in rows if r["kind"] == "sync" and r["api"] == "torch.cuda.synchronize"]
    check("B torch.cuda.synchronize() with an async op in flight: sync row counts it",
          len(syncs) >= 1 and syncs[0]["inflight"] >= 1
          and set(ids["inflight_at_sync"]) <= set(syncs[0]["inflight_ids"] or []),
          f"{[(s['inflight'], s['inflight_ids']) for s in syncs]} vs {ids['inflight_at_sync']}")
    hz = [r for r in rows if r["kind"] == "hazard"]
    check("B use-before-wait on a CUDA tensor", len(hz) == 1 and hz[0]["api"] == "Tensor.item",
          f"{[(h['api'], h['site']) for h in hz]}")
    meta = {}
    try:
        import pyarrow.parquet as pq

        from commtrace.format import runs as _runs

        part = sorted(glob.glob(os.path.join(_runs.resolve(out), "rank=0", "*.parquet")))[-1]
        meta = json.loads(pq.read_schema(part).metadata[b"commtrace.meta"])
    except Exception as e:
        meta = {"error": repr(e)}
    figure("rank metadata nvml", meta.get("nvml"))
    figure("rank metadata nccl_version", meta.get("nccl_version"))
    check("B metadata: NCCL version and NVML", meta.get("nccl_version") not in (None, "unavailable")
          and isinstance(meta.get("nvml"), dict), f"nccl {meta.get('nccl_version')}")
    med = statistics.median(diffs)
    figure("whole capture added host time per blocking all_reduce (median of paired rounds)",
           us(med), "us")
    check("B capture adds <= 10 us host time per op", med <= 10_000, f"{us(med)} us")


# --------------------------------------------------------------------------------------------
# Part C
# --------------------------------------------------------------------------------------------


HOOK_WORKER = r"""
import torch, torch.distributed as dist
dist.init_process_group("nccl")
torch.cuda.set_device(0)
t = torch.ones(1 << 20, device="cuda")
for _ in range(5):
    dist.all_reduce(t)                                                   # torch seqs 1-5
w = dist.all_reduce(t, async_op=True)                                    # 6
w.wait()
name = dist.group.WORLD.group_name
for _ in range(3):                                                       # 7-9: below Python
    y = torch.ops._c10d_functional.all_reduce(t, "sum", name)
    torch.ops._c10d_functional.wait_tensor(y)
out = torch.empty(1 << 20, device="cuda")
dist.all_gather_into_tensor(out, t)                                      # 10
torch.cuda.synchronize()
dist.destroy_process_group()
"""


def completion_hook_merge(tmp, timeout):
    """D. NCCL completion hook (issue 13, item 2): ops issued through torch.ops, below the
    wrappers, become api="c++" rows with NCCL's seq; the wrapped ones claim theirs (no twin)."""
    path = os.path.join(tmp, "hook_worker.py")
    with open(path, "w") as f:
        f.write(HOOK_WORKER)
    out = os.path.join(tmp, "hook_run")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TORCH_NCCL_ENABLE_TIMING="1")
    cmd = [sys.executable, "-m", "commtrace", "run", "-o", out, "--completion-hook", "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           path]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        check("D completion hook run", False, f"rc {p.returncode}: {p.stderr[-800:]}")
        return
    import pyarrow.dataset as pads

    rows = [r for r in pads.dataset(out, format="parquet", partitioning="hive").to_table()
            .to_pylist() if r["kind"] == "op"]
    FIGURES["D rows"] = [{k: r[k] for k in ("api", "op", "torch_seq", "seq", "completion",
                                             "t_enqueue_ns", "t_end_ns", "detail")}
                         for r in rows]
    FIGURES["D stderr tail"] = p.stderr[-3000:]
    print("    D rows (api, op, torch_seq, seq, completion, has t_end, detail):")
    for r in rows:
        print(f"      {r['api']} {r['op']} {r['torch_seq']} {r['seq']} {r['completion']} "
              f"{r['t_end_ns'] is not None} {(r['detail'] or '')[:160]}")
    print("    D stderr tail: " + p.stderr[-1500:].replace("\n", "\n      "))
    shim = sorted((r for r in rows if r["api"] != "c++"), key=lambda r: r["t_enqueue_ns"])
    cpp = sorted((r for r in rows if r["api"] == "c++"), key=lambda r: r["torch_seq"])
    check("D wrapped ops carry NCCL's seq",
          [(r["torch_seq"], r["seq"]) for r in shim] == [(k, k) for k in (1, 2, 3, 4, 5, 6, 10)],
          f"{[(r['api'], r['torch_seq'], r['seq']) for r in shim]}")
    check("D ops below Python are c++ rows, no twin",
          [(r["op"], r["torch_seq"], r["seq"], r["completion"]) for r in cpp]
          == [("all_reduce", k, k, "hook") for k in (7, 8, 9)],
          f"{[(r['op'], r['torch_seq'], r['seq'], r['completion']) for r in cpp]}")
    durs = [json.loads(r["detail"] or "{}").get("active_duration_ns") or 0 for r in cpp]
    check("D c++ rows have device durations and host times",
          len(cpp) == 3 and all(d > 0 for d in durs)
          and all(r["t_enqueue_ns"] is not None and r["t_end_ns"] is not None
                  and r["t_enqueue_ns"] <= r["t_end_ns"] for r in cpp),
          f"active_duration_ns {durs}")
    # their host times are on the trace's clock: between the wrapped ops issued around them
    # (seq 6 before, 10 after; WorkInfo's time_started is when the Work was created)
    before = [r for r in shim if r["torch_seq"] == 6]
    after = [r for r in shim if r["torch_seq"] == 10]
    if before and after and len(cpp) == 3:
        lo, hi = before[0]["t_enqueue_ns"], after[0]["t_enqueue_ns"]
        got = [r["t_enqueue_ns"] for r in cpp]
        check("D c++ rows' host times on the trace's clock (between the ops around them)",
              all(t is not None and lo <= t <= hi for t in got),
              f"{[None if t is None else us(t - lo) for t in got]} us after seq 6's enqueue, "
              f"seq 10 at {us(hi - lo)} us")
    FIGURES["completion_hook_active_duration_ns"] = durs


#: samples that need two ranks (pipeline stages): not run at world size 1
TWO_RANK_SAMPLES = {"pipeline.py"}
#: object collectives: rows with host times (their inner calls carry the tensors)
OBJECT_APIS = {"all_gather_object", "broadcast_object_list", "gather_object",
               "scatter_object_list", "send_object_list", "recv_object_list"}
#: samples that issue no collective at world size 1
NO_OPS_AT_WS1 = {"fsdp2.py": "FSDP2 issues no collective on one rank; its ops need two GPUs"}


def run_samples(tmp, timeout):
    samples = sorted(glob.glob(os.path.join(ROOT, "samples", "*.py")))
    if not samples:
        report("C samples", "SKIP", "no samples/*.py")
        return
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "1"]
    try:
        import click  # noqa: F401

        have_cli = True
    except Exception:
        have_cli = False
    import concurrent.futures as cf

    for path in [p for p in samples if os.path.basename(p) in TWO_RANK_SAMPLES]:
        report(f"C {os.path.basename(path)}", "SKIP", "runs on exactly 2 ranks; two NCCL ranks "
               "cannot share the one GPU")
    samples = [p for p in samples if os.path.basename(p) not in TWO_RANK_SAMPLES]
    jobs = {}
    for path in samples:
        name = os.path.basename(path)
        cmd = torchrun + [path, "--backend", "nccl"]
        jobs[(name, "plain")] = cmd
        if have_cli:
            jobs[(name, "traced")] = [sys.executable, "-m", "commtrace", "run", "-o",
                                      os.path.join(tmp, "samples", name), "--"] + cmd

    def one(cmd):
        try:
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            return subprocess.CompletedProcess(cmd, -9, "", f"timed out after {timeout} s: "
                                               f"{(e.stderr or b'')[-400:]!r}")

    # every job is a world-size-1 NCCL job of its own: side by side on the one GPU
    with cf.ThreadPoolExecutor(len(jobs)) as ex:
        done = dict(zip(jobs, ex.map(one, jobs.values())))
    for path in samples:
        name = os.path.basename(path)
        p = done[(name, "plain")]
        check(f"C {name} --backend nccl (plain torchrun)", p.returncode == 0,
              f"rc {p.returncode}" + ("" if p.returncode == 0 else f": {p.stderr[-800:]}"))
        if not have_cli:
            report(f"C {name} under commtrace run", "SKIP", "click missing")
            continue
        out = os.path.join(tmp, "samples", name)
        p = done[(name, "traced")]
        detail = f"rc {p.returncode}"
        ok = p.returncode == 0
        try:
            import pyarrow.dataset as pads

            rows = pads.dataset(out, format="parquet", partitioning="hive").to_table().to_pylist()
            cuda = [r for r in rows if r["kind"] == "op" and (r["device"] or "").startswith("cuda")]
            timed = [r for r in cuda if r["t_start_ns"] is not None]
            detail += f", {len(rows)} rows, {len(cuda)} CUDA ops, {len(timed)} with device times"
            # object collectives (the device is known only after their inner calls, and they
            # return once the result is on the host) and ops inside _coalescing_manager
            # (enqueued at the block's exit) keep host times: docs/concepts-gpu.md
            host_timed = [r for r in cuda if r["api"] in OBJECT_APIS
                          or "coalesced" in (r["detail"] or "")]
            cuda = [r for r in cuda if r not in host_timed]
            timed = [r for r in cuda if r["t_start_ns"] is not None]
            if host_timed:
                detail += (f"; {len(host_timed)} object / coalesced ops with host times "
                           f"({sum(r['t_end_ns'] is not None for r in host_timed)} with t_end)")
                ok = ok and all(r["t_end_ns"] is not None for r in host_timed)
            untimed = sorted({(r["api"], r["async_op"], r["completion"]) for r in cuda
                              if r["t_start_ns"] is None or r["t_end_ns"] is None})
            if untimed:
                detail += f"; without device times (api, async, completion): {untimed}"
            if name in NO_OPS_AT_WS1:
                # FSDP2 does not communicate on one rank (gloo at world size 1 records none
                # either): the run must succeed; its ops need two GPUs
                ok = ok and not cuda
                detail += f" ({NO_OPS_AT_WS1[name]})"
            else:
                ok = ok and len(cuda) > 0 and len(timed) == len(cuda)
        except Exception as e:
            detail += f", trace unreadable: {e}"
            ok = False
        if p.returncode != 0:
            detail += ": " + p.stderr[-800:]
        check(f"C {name} under commtrace run", ok, detail)



# --------------------------------------------------------------------------------------------
# Set-up: C extensions for this interpreter, the C++ accel build in the background
# --------------------------------------------------------------------------------------------

C_EXTENSIONS = [("commtrace/capture/_fastpath.c", "commtrace/capture/_fastpath"),
                ("commtrace/analysis/_replay.c", "commtrace/analysis/_replay"),
                ("commtrace/capture/_devtimer.c", "commtrace/capture/_devtimer")]


def build_c_extensions():
    """Compile commtrace's optional C extensions in place for this interpreter, where missing
    (what ``pip install .`` does with a compiler), and report which capture path runs."""
    import sysconfig

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    inc = sysconfig.get_paths()["include"]
    cc = os.environ.get("CC", "cc")
    built = []
    for src, mod in C_EXTENSIONS:
        target = os.path.join(ROOT, mod + suffix)
        if os.path.exists(target) and os.path.getmtime(target) >= os.path.getmtime(
                os.path.join(ROOT, src)):
            built.append(f"{os.path.basename(target)} (present)")
            continue
        cmd = [cc, "-O2", "-shared", "-fPIC", "-I", inc, os.path.join(ROOT, src), "-o", target]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except Exception as e:
            report(f"A-1 build {os.path.basename(src)}", "SKIP", f"{type(e).__name__}: {e}")
            continue
        if p.returncode != 0:
            report(f"A-1 build {os.path.basename(src)}", "SKIP", f"rc {p.returncode}: "
                   f"{p.stderr[-400:]}")
        else:
            built.append(os.path.basename(target))
    FIGURES["c_extensions"] = built


def start_accel_build(tmp):
    """``commtrace accel build`` into tmp/cache in the background (part E waits for it)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               COMMTRACE_CACHE_DIR=os.path.join(tmp, "cache"), MAX_JOBS="4")
    log = open(os.path.join(tmp, "accel_build.log"), "w")
    try:
        return subprocess.Popen([sys.executable, "-m", "commtrace", "accel", "build"], env=env,
                                stdout=log, stderr=subprocess.STDOUT), env
    except Exception as e:
        report("E accel build", "SKIP", f"could not start: {e}")
        return None, env


def accel_ddp(tmp, build, env, timeout):
    """E. The DDP sample on NCCL under ``commtrace run`` with ``commtrace accel build``'s
    module."""
    if build is None:
        return
    try:
        rc = build.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        build.kill()
        report("E accel build", "FAIL", f"not done in {timeout} s")
        return
    with open(os.path.join(tmp, "accel_build.log")) as f:
        log = f.read()
    if not check("E commtrace accel build", rc == 0, f"rc {rc}: {log[-600:]}"):
        return
    st = subprocess.run([sys.executable, "-m", "commtrace", "accel", "status"], env=env,
                        capture_output=True, text=True, timeout=60)
    figure("commtrace accel status", st.stdout.strip()[-300:])
    out = os.path.join(tmp, "accel_ddp")
    cmd = [sys.executable, "-m", "commtrace", "run", "-o", out, "--", sys.executable, "-m",
           "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           os.path.join(ROOT, "samples", "ddp_mlp.py"), "--backend", "nccl"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if not check("E ddp_mlp.py --backend nccl under commtrace run, accel built", p.returncode == 0,
                 f"rc {p.returncode}" + ("" if p.returncode == 0 else f": {p.stderr[-800:]}")):
        return
    import pyarrow.dataset as pads

    rows = pads.dataset(out, format="parquet", partitioning="hive").to_table().to_pylist()
    ddp = [r for r in rows if r["kind"] == "op" and r["op"] == "all_reduce"
           and r["api"] == "ddp_comm_hook"]
    timed = [r for r in ddp if r["t_start_ns"] is not None and r["t_end_ns"] is not None]
    check("E DDP bucket all-reduces recorded with device times",
          len(ddp) > 0 and len(timed) == len(ddp),
          f"{len(ddp)} bucket all-reduces, {len(timed)} with device times; apis "
          f"{sorted({(r['api'], r['op']) for r in rows if r['kind'] == 'op'})}")


COMPILE_WORKER = r"""
import hashlib, json, sys, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch._dynamo
from torch._dynamo.utils import counters
dist.init_process_group("nccl")
torch.cuda.set_device(0)
group = dist.group.WORLD


def f(x):
    a = funcol.all_reduce(x, "sum", group)
    b = funcol.all_gather_tensor(x * 2, 0, group)        # (names in torch 2.11 and 2.13)
    c = funcol.reduce_scatter_tensor(x + 1, "sum", 0, group)
    y = torch.relu(a @ a.T) + b.sum() + c.sum()
    z = y.clone()
    dist.all_reduce(z)                     # the in-place c10d form Dynamo rewrites to funcol
    return funcol.wait_tensor(funcol.all_reduce(z * 3, "max", group)) + 1


def digest(t):
    return hashlib.sha256(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()) \
        .hexdigest()[:16]


res = {}
for fullgraph in (True, False):
    torch._dynamo.reset()
    counters.clear()
    g = torch.compile(f, backend="inductor", fullgraph=fullgraph)
    x = torch.arange(64 * 64, dtype=torch.float32, device="cuda").reshape(64, 64) / 4096
    r = {}
    try:
        outs = [digest(g(x)) for _ in range(2)]
        dist.all_reduce(torch.ones(13, device="cuda"))        # eager, between compiled calls
        outs.append(digest(g(x)))
        r.update(out=outs, graphs=counters["stats"]["unique_graphs"],
                 breaks=sum(counters["graph_break"].values()), eager=digest(f(x)))
    except Exception as e:
        r.update(error=f"{type(e).__name__}: {str(e)[:300]}")
    res["fullgraph" if fullgraph else "graphs"] = r
torch.cuda.synchronize()
with open(sys.argv[1], "w") as fh:
    json.dump(res, fh, sort_keys=True)
torch._dynamo.reset()
dist.destroy_process_group()
"""


def compile_check(tmp, timeout):
    """F. torch.compile(inductor) over NCCL functional collectives, with and without commtrace:
    the two jobs side by side, then their results compared."""
    import concurrent.futures as cf

    path = os.path.join(tmp, "compile_worker.py")
    with open(path, "w") as f:
        f.write(COMPILE_WORKER)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "1", path]
    jobs = {"plain": torchrun + [os.path.join(tmp, "compile_plain.json")],
            "traced": [sys.executable, "-m", "commtrace", "run", "-o",
                       os.path.join(tmp, "compile_trace"), "--"] + torchrun
            + [os.path.join(tmp, "compile_traced.json")]}
    with cf.ThreadPoolExecutor(2) as ex:
        futs = {k: ex.submit(subprocess.run, cmd, env=env, capture_output=True, text=True,
                             timeout=timeout) for k, cmd in jobs.items()}
        procs = {k: fu.result() for k, fu in futs.items()}
    res = {}
    for k, p in procs.items():
        if not check(f"F compile job {k}", p.returncode == 0,
                     f"rc {p.returncode}" + ("" if p.returncode == 0 else
                                             f": {p.stderr[-800:]}")):
            return
        with open(os.path.join(tmp, f"compile_{k}.json")) as f:
            res[k] = json.load(f)
    FIGURES["compile"] = res
    for mode in ("fullgraph", "graphs"):
        a, b = res["plain"][mode], res["traced"][mode]
        check(f"F torch.compile(inductor, {mode}) over NCCL funcol: same as without commtrace",
              a == b and "error" not in a and len(set(a["out"])) == 1,
              f"plain {a}, traced {b}")
    import pyarrow.dataset as pads

    rows = pads.dataset(os.path.join(tmp, "compile_trace"), format="parquet",
                        partitioning="hive").to_table().to_pylist()
    eager = [r for r in rows if r["kind"] == "op" and r["op"] == "all_reduce" and r["count"] == 13]
    check("F the eager all_reduce between compiled calls is recorded", len(eager) == 2,
          f"{len(eager)} rows of 13 elements; ops {sorted({r['op'] for r in rows if r['kind'] == 'op'})}")


def save_traces(tmp, path):
    """The traces recorded by the check, in one archive (trace folders only)."""
    import tarfile

    names = ["e2e", "hook_run", "samples", "accel_ddp", "compile_trace"]
    try:
        with tarfile.open(path, "w:gz") as tf:
            for n in names:
                if os.path.isdir(os.path.join(tmp, n)):
                    tf.add(os.path.join(tmp, n), arcname=n)
        figure("traces archived", f"{path} ({os.path.getsize(path) >> 10} KiB)")
    except Exception as e:
        report("traces archive", "FAIL", repr(e))


# --------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write results and figures to this file")
    ap.add_argument("--quick", action="store_true", help="fewer sizes")
    ap.add_argument("--no-samples", action="store_true")
    ap.add_argument("--sample-timeout", type=float, default=120.0)
    ap.add_argument("--no-accel", action="store_true", help="skip part E (commtrace accel build)")
    ap.add_argument("--no-compile", action="store_true", help="skip part F (torch.compile)")
    ap.add_argument("--traces-out", default=None, metavar="FILE.tar.gz",
                    help="also write the traces the check recorded (end to end, hook, samples, "
                         "accel DDP, compile) into this archive, for `commtrace report` elsewhere")
    ap.add_argument("--watchdog", type=float, default=570.0,
                    help="end the script (with every thread's traceback) after this many "
                         "seconds (default 570)")
    a = ap.parse_args(argv)
    faulthandler.dump_traceback_later(a.watchdog, exit=True)  # never hang the one device call
    if a.json:
        JSON_PATH.append(a.json)

    import torch

    t_begin = time.time()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing to check", file=sys.stderr)
        return 2
    build_c_extensions()
    tmp = tempfile.mkdtemp(prefix="commtrace-gpu-check-")
    accel_build, accel_env = (None, None) if a.no_accel else start_accel_build(tmp)
    import torch.distributed as dist

    from commtrace.capture import device as D
    from commtrace.capture import nvml, sync

    FIGURES["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    FIGURES["torch"] = torch.__version__
    FIGURES["cuda"] = torch.version.cuda
    FIGURES["nccl"] = nvml.nccl_version()
    FIGURES["gpu"] = torch.cuda.get_device_name(0)
    try:
        from commtrace.capture import _fastpath  # noqa: F401

        FIGURES["capture path"] = "C fast path (_fastpath)"
    except ImportError:
        FIGURES["capture path"] = "Python (no _fastpath for this interpreter)"
    for k in ("date", "torch", "cuda", "nccl", "gpu", "capture path", "c_extensions"):
        print(f"{k}: {FIGURES.get(k)}")
    torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        try:
            first_op_stall(torch, dist)
        except Exception as e:
            report("A0 first-op stall figures", "FAIL", repr(e))
        info = nvml.collect()
        if str(info["nvml"]).endswith("pynvml not installed"):
            report("A0 NVML facts for this GPU", "SKIP", "pynvml (nvidia-ml-py) not installed")
        else:
            check("A0 NVML facts for this GPU", isinstance(info["nvml"], dict), f"{info['nvml']}")
        FIGURES["nvml"] = info["nvml"]
        timer_accuracy(torch, dist, D, a.quick)
        sync_capture(torch, dist, sync)
        graph_capture(torch, dist, D)
        timer_overhead(torch, dist, D)
        timer_costs(torch, dist, D)
        profiler_crosscheck(torch, dist, D)
        nccl_crosscheck(torch, dist, D)
        workinfo_probe(torch, dist, D)
        end_to_end(torch, dist, tmp)
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    try:
        completion_hook_merge(tmp, a.sample_timeout)
    except Exception as e:
        report("D completion hook", "FAIL", repr(e))
    if not a.no_samples:
        try:
            run_samples(tmp, a.sample_timeout)
        except Exception as e:
            report("C samples", "FAIL", repr(e))
    if not a.no_compile:
        try:
            compile_check(tmp, max(a.sample_timeout, 240.0))
        except Exception as e:
            report("F compile", "FAIL", repr(e))
    if not a.no_accel:
        try:
            accel_ddp(tmp, accel_build, accel_env, max(a.sample_timeout, 240.0))
        except Exception as e:
            report("E accel", "FAIL", repr(e))
    if a.traces_out:
        save_traces(tmp, a.traces_out)
    failed = [r for r in RESULTS if r["status"] == "FAIL"]
    FIGURES["wall_s"] = round(time.time() - t_begin, 1)
    print(f"\n{len(RESULTS)} checks: {sum(r['status'] == 'PASS' for r in RESULTS)} passed, "
          f"{len(failed)} failed, {sum(r['status'] == 'SKIP' for r in RESULTS)} skipped "
          f"in {FIGURES['wall_s']} s")
    save_json()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
