"""CPU per DDP step of commtrace's comm hooks against DDP's own all-reduce (issue 20).

    python benchmarks/ddp_hooks.py                      # 2 ranks, 60 rounds of 20 steps
    python benchmarks/ddp_hooks.py --rounds 100 --steps 30
    python benchmarks/ddp_hooks.py --world 1 --modes floor,cxx_v1,cxx

Each rank (gloo, forked from this process) builds the DDP sample (samples/ddp_mlp.py) four
times: "builtin" (built and run with tracing off: DDP's C++ all-reduce, no hook),
"builtin_traced" (the same, run with tracing on but commtrace's hook kept off the model: what
tracing costs a DDP step besides the hook, e.g. the step marker), "c" (built
with tracing on and the C++ hook hidden: commtrace's C hook, ``_fastpath.ddp_hook``, which DDP
calls through torch's PythonCommHook) and "cxx" (tracing on, the C++ hook of
``commtrace accel build``, registered on DDP's C++ Reducer; hook interface v2: the bucket's
scaling and all-reduce issued through c10d's C++ API), "cxx_v1" (the same hook built with
``COMMTRACE_DDP_V2=0``: scaling and all-reduce through Python's calls), "group" (tracing on, no
hook: DDP's Reducer issues its all-reduces on commtrace's recording group, the default where the
module is built; capture/ddp.py ``_install_group``), and "floor" (built and run
with tracing off, with torch's builtin C++ ALLREDUCE comm hook: what any comm hook costs a
DDP step before commtrace does anything -- the Reducer copies each gradient into its bucket
instead of scaling it on the way; that hook sums without dividing by the world size, so the
copy's training differs, not its cost per step). Each round runs K steps of each
copy in a rotating order (tracing on for c and cxx), with a barrier before each. Printed per
mode: the median over rounds of the training thread's CPU per step, the process's CPU per step
(all threads: gloo's, the writer's) and the wall time per step, each as the median of the
per-round differences to builtin with a 95% interval of that median (order statistics).
The process's CPU is also split by thread (Linux: each thread's run time in
``/proc/self/task/<tid>/schedstat``, nanoseconds): "backend" is every thread but the training
thread and commtrace's writer thread (gloo's or NCCL's, autograd's), per step as above; the
writer thread works on its own schedule (services, flushes), so its CPU is summed over the
whole loop and given per traced step (the steps of the modes with tracing on).
Two copies of a model in one process do not run equally fast (docs/performance.md): the
figures compare hooks, not a traced model with its own untraced self (benchmarks/steps.py).
Needs the C++ hook built (``commtrace accel build``; ``COMMTRACE_CACHE_DIR`` is honoured).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
MODES = ("builtin", "builtin_traced", "c", "cxx_v1", "cxx", "floor", "group")


def _median_ci(xs):
    """Median and a distribution-free 95% interval of it (binomial order statistics)."""
    import math

    xs = sorted(xs)
    n = len(xs)
    k = max(0, int(math.floor(n / 2 - 0.98 * math.sqrt(n))))
    return xs[n // 2], xs[k], xs[min(n - 1, n - 1 - k)]


def thread_cpu_ns() -> dict:
    """{thread id: CPU time run so far, ns} for every thread of this process (Linux's
    schedstat; {} where it cannot be read)."""
    out = {}
    base = "/proc/self/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def _rank(rank, world, port, rounds, steps, out, q, modes=MODES):
    import threading

    import torch
    import torch.distributed as dist

    import commtrace
    from commtrace.capture import accel
    from commtrace.capture import recorder as R

    sys.path.insert(0, os.path.join(ROOT, "samples"))
    import ddp_mlp

    torch.set_num_threads(1)
    commtrace.enable(output=out)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    rec = R.get_recorder()
    args = ddp_mlp.parse_args(["--straggler-ms", "0"])
    copies, kinds = {}, {}
    cxx_mod = accel.load()
    for mode in modes:   # builtin first: the others are differences to it
        R._set_recorder(None if mode.startswith("builtin") or mode == "floor" else rec)
        accel._loaded = cxx_mod if mode.startswith("cxx") or mode == "group" else None
        if mode == "cxx_v1":
            os.environ["COMMTRACE_DDP_V2"] = "0"   # read when the hook registers
        if mode != "group":
            os.environ["COMMTRACE_DDP_GROUP"] = "0"   # the hook, not the recording group
        st = ddp_mlp.setup(args, rank, world, torch.device("cpu"))
        if mode == "builtin_traced":
            st["ddp"].__dict__["_commtrace_foreign_hook"] = True   # no hook of commtrace's
        if mode == "floor":   # torch's C++ hook, untraced (commtrace's hook kept off)
            st["ddp"]._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        for i in range(5):
            ddp_mlp.train_step(st, i)
        os.environ.pop("COMMTRACE_DDP_V2", None)
        os.environ.pop("COMMTRACE_DDP_GROUP", None)
        copies[mode] = st
        kinds[mode] = st["ddp"].__dict__.get("_commtrace_hook_kind", "c" if mode == "c" else None)
        if st["ddp"].__dict__.get("_commtrace_hook_v2"):
            kinds[mode] += " v2"
    accel._loaded = cxx_mod
    R._set_recorder(None)
    res = {m: {"thread": [], "process": [], "wall": [], "backend": []} for m in modes}
    main_tid = threading.get_native_id()
    writer = next((t for t in threading.enumerate() if t.name == "commtrace-writer"), None)
    writer_tid = getattr(writer, "native_id", None)
    traced_steps = 0
    w_all0 = thread_cpu_ns().get(writer_tid, 0)
    for r in range(rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            st = copies[mode]
            R._set_recorder(None if mode in ("builtin", "floor") else rec)
            dist.barrier()
            a = thread_cpu_ns()
            t0, c0, w0 = time.thread_time_ns(), time.process_time_ns(), time.perf_counter_ns()
            for i in range(steps):
                ddp_mlp.train_step(st, i)
            t1, c1, w1 = time.thread_time_ns(), time.process_time_ns(), time.perf_counter_ns()
            b = thread_cpu_ns()
            R._set_recorder(None)
            if mode not in ("builtin", "floor"):
                traced_steps += steps
            res[mode]["backend"].append(sum(v - a.get(t, 0) for t, v in b.items()
                                            if t not in (main_tid, writer_tid)) / steps / 1e3)
            res[mode]["thread"].append((t1 - t0) / steps / 1e3)
            res[mode]["process"].append((c1 - c0) / steps / 1e3)
            res[mode]["wall"].append((w1 - w0) / steps / 1e3)
    w_all = thread_cpu_ns().get(writer_tid, 0) - w_all0
    res["_writer_us_per_traced_step"] = w_all / traced_steps / 1e3 if traced_steps else None
    R._set_recorder(rec)
    q.put((rank, kinds, res, threading.get_ident()))
    dist.barrier()
    dist.destroy_process_group()


def parse_modes(ap, text, known):
    """``known[0]`` (the reference) and the comma-separated modes of `text`, in that order;
    an unknown one is the parser's error (exit 2)."""
    modes = (known[0],) + tuple(m for m in text.split(",") if m and m != known[0])
    bad = [m for m in modes if m not in known]
    if bad:
        ap.error(f"unknown mode(s) {bad}; known: {', '.join(known)}")
    return modes


def run_ranks(target, world, args, modes, prefix):
    """Fork `world` gloo ranks running ``target(rank, world, port, *args, out, q, modes)``;
    the list of what each put on ``q``."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import multiprocessing as mp

    import torch  # noqa: F401  (forked ranks inherit it)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    out = tempfile.mkdtemp(prefix=prefix)
    ps = [ctx.Process(target=target, args=(r, world, port, *args, out, q, modes))
          for r in range(world)]
    for p in ps:
        p.start()
    got = [q.get() for _ in ps]
    for p in ps:
        p.join()
    return got


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n  python benchmarks/ddp_hooks.py --rounds 100")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--steps", type=int, default=20, help="steps per round and copy")
    ap.add_argument("--world", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--modes", default=",".join(MODES[1:]),
                    help="copies besides builtin, comma-separated (default: all: %(default)s)")
    a = ap.parse_args(argv)
    modes = parse_modes(ap, a.modes, MODES)
    t0 = time.time()
    got = run_ranks(_rank, a.world, (a.rounds, a.steps), modes, "ddp-hooks-")
    print(f"ddp_hooks: {a.rounds} rounds x {a.steps} steps per copy, {a.world} rank(s), gloo, "
          f"{time.strftime('%H:%M', time.gmtime(t0))}-{time.strftime('%H:%M UTC', time.gmtime())}, "
          f"load {os.getloadavg()[0]:.1f}")
    for rank, kinds, res, _ in sorted(got, key=lambda g: g[0]):
        print(f"rank {rank}: hooks {kinds}")
        base = res["builtin"]
        for what in ("thread", "backend", "process", "wall"):
            b = _median_ci(base[what])[0]
            parts = [f"builtin {b:.0f} us"]
            for m in modes[1:]:
                d = [x - y for x, y in zip(res[m][what], base[what])]
                med, lo, hi = _median_ci(d)
                parts.append(f"{m} {med:+.0f} [{lo:+.0f}, {hi:+.0f}]")
            label = {"thread": "  training thread CPU per step", "backend":
                     "  backend threads' CPU per step", "process": "  process CPU per step",
                     "wall": "  wall per step"}[what]
            print(label, ": ", "; ".join(parts), sep="")
        w = res.get("_writer_us_per_traced_step")
        print("  writer thread CPU per traced step (the whole loop's): "
              + (f"{w:.1f} us" if w is not None else "n/a"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
