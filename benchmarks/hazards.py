"""Overhead of use-before-wait detection (commtrace.capture.hazards), basic vs full mode.

    python benchmarks/hazards.py [--rounds 15] [--n 20000] [--e2e]

Measures, per call, medians over rounds (each round times `n` calls):

- ``Tensor.item()`` and a small torch op (``x + y``, 16 floats) on tensors that are *not*
  pending: with detection off, with detection installed and nothing pending, while an async
  op is pending in basic mode, and in full mode;
- a hazard hit (``.item()`` on a pending tensor, deduplicated after the first row);
- the pending-listener toggle: patch + restore of the host-read methods (plus push/pop of the
  torch-function mode in full mode), paid once each time the pending count leaves and
  returns to 0.

The recorder is a minimal stand-in with the hooks of docs/dev/interfaces.md, so the figures
are those of the hazard module alone. ``--e2e`` also times async gloo all_reduce + wait at
world size 1 under the real recorder (commtrace.trace) with hazards off / basic / full, when
the capture core's API is importable.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from commtrace.capture import hazards  # noqa: E402


class StubRecorder:
    def __init__(self):
        self.rows = []
        self.pending = {}
        self.listeners = []
        self.lock = threading.Lock()

    def emit(self, **f):
        self.rows.append(f)

    def pending_ops(self):
        return dict(self.pending)

    def add_pending_listener(self, fn):
        self.listeners.append(fn)

    def issue(self, op_id, tensors):
        with self.lock:
            n0 = len(self.pending)
            self.pending[op_id] = types.SimpleNamespace(op_id=op_id, op="all_reduce",
                                                        tensors=tensors, waited=False)
        if n0 == 0:
            for fn in self.listeners:
                fn(1)

    def done(self, op_id):
        with self.lock:
            self.pending.pop(op_id, None)
            n = len(self.pending)
        if n == 0:
            for fn in self.listeners:
                fn(0)


def timed(fn, n):
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


CONFIGS = ("off", "basic, nothing pending", "basic, op pending", "full, nothing pending",
           "full, op pending")


def bench(n, rounds):
    """Each round measures every configuration back to back; the overhead reported is the
    median over rounds of (configuration - off) in the same round, which cancels the drift of
    a shared machine better than a difference of medians."""
    s = torch.ones(1)
    x, y = torch.ones(16), torch.ones(16)
    pend = torch.ones(1024)

    def item(k):
        for _ in range(k):
            s.item()

    def add(k):
        for _ in range(k):
            x + y

    def hit(k):
        for _ in range(k):
            pend[0].item()

    samples = {}

    def put(key, v):
        samples.setdefault(key, []).append(v)

    for _ in range(rounds):
        for cfg in CONFIGS:
            rec = StubRecorder()
            mode = cfg.split(",")[0]
            if mode != "off":
                hazards.install(rec, mode)
            try:
                if cfg.endswith("op pending"):
                    rec.issue(1, [pend])
                put(("item", cfg), timed(item, n))
                put(("x + y", cfg), timed(add, n))
                if cfg.endswith("op pending"):
                    put(("item on the pending tensor (a hit)", cfg), timed(hit, n // 4))
                    rec.done(1)

                def toggle(k, rec=rec):
                    for i in range(k):
                        rec.issue(i + 10, [pend])
                        rec.done(i + 10)

                if cfg.endswith("nothing pending") or cfg == "off":
                    put(("async op cycle: pending 0 -> 1 -> 0", cfg), timed(toggle, n // 10))
            finally:
                hazards.uninstall()
    res = []
    for (what, cfg), vals in samples.items():
        base = samples.get((what, "off"))
        if base is None and what.startswith("item on the pending"):
            base = samples[("item", "off")]
        over = statistics.median(v - b for v, b in zip(vals, base)) if cfg != "off" else 0.0
        res.append((what, cfg, statistics.median(vals), over))
    return res


def per_call_ns(fn, n, rounds):
    return statistics.median(timed(fn, n) for _ in range(rounds))


def e2e(n, rounds):
    try:
        import torch.distributed as dist

        from commtrace import trace
    except Exception as e:  # pragma: no cover
        return {"e2e": f"skipped ({e})"}
    out = {}
    tmp = tempfile.mkdtemp(prefix="ct-hz-")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    t = torch.ones(1024)
    other = torch.ones(16)

    def step(k):
        for _ in range(k):
            w = dist.all_reduce(t, async_op=True)
            for _ in range(10):
                other + other
            w.wait()

    try:
        out["async all_reduce + 10 adds + wait, untraced"] = per_call_ns(step, n // 10, rounds)
        for mode in ("off", "basic", "full"):
            try:
                with trace(output=os.path.join(tmp, mode), hazards=mode):
                    out[f"async all_reduce + 10 adds + wait, traced, hazards {mode}"] = \
                        per_call_ns(step, n // 10, rounds)
            except Exception as e:
                out[f"traced, hazards {mode}"] = f"failed: {type(e).__name__}: {e}"
    finally:
        dist.destroy_process_group()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--e2e", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs; median ns per call over {a.rounds} rounds of {a.n}")
    res = bench(a.n, a.rounds)
    print(f"  {'call':<40} {'configuration':<24} {'ns/call':>9} {'overhead':>9}")
    for what, cfg, med, over in res:
        print(f"  {what:<40} {cfg:<24} {med:>9.0f} {over:>+9.0f}")
    if a.e2e:
        for k, v in e2e(a.n, a.rounds).items():
            print(f"  {k}: {v:.0f} ns" if isinstance(v, float) else f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
