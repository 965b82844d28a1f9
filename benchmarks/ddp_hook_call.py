"""CPU per bucket of commtrace's DDP comm hooks, the hook alone (issue 20, hook interface v2).

    python benchmarks/ddp_hook_call.py                  # world size 1, 60 rounds of 200 calls
    python benchmarks/ddp_hook_call.py --world 2 --rounds 40

A DDP step's cost (benchmarks/ddp_hooks.py) holds the hook's few microseconds per bucket among
milliseconds of backward, which this machine's noise (+-30-50 us per step under load) hides.
Here each rank (gloo, forked from this process) builds the DDP sample's model
(samples/ddp_mlp.py) once per hook, takes its buckets as the join mode does
(``Reducer._get_zeros_like_grad_buckets``) and calls the registered hook on them through
``Reducer._run_comm_hook``, waiting for each bucket's future, in rounds of --calls calls per
copy in rotating order with a barrier before each round. Copies: "floor" (torch's builtin C++
ALLREDUCE hook, untraced: what any C++ hook costs through this call), "cxx" (commtrace's C++
hook, interface v2: scaling and all-reduce through ATen and c10d's C++ API), "cxx_v1" (the same
hook with ``COMMTRACE_DDP_V2=0``: both through Python's calls) and "c" (commtrace's C hook, which
DDP calls through torch's PythonCommHook). Tracing is on for all but floor: every commtrace call
records its row as in training. Printed per copy: the median over rounds of the training
thread's CPU per call, and the median of the per-round differences to floor with a 95% interval
of that median (order statistics). Needs the C++ hook built (``commtrace accel build``;
``COMMTRACE_CACHE_DIR`` is honoured).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
MODES = ("floor", "cxx", "cxx_v1", "c")


def _rank(rank, world, port, rounds, calls, out, q, modes):
    import threading

    import torch
    import torch.distributed as dist

    import commtrace
    from commtrace.capture import accel
    from commtrace.capture import recorder as R

    sys.path.insert(0, os.path.join(ROOT, "samples"))
    import ddp_mlp

    torch.set_num_threads(1)
    # comm hooks only: not the recording group (capture/ddp.py _install_group), which runs none
    os.environ["COMMTRACE_DDP_GROUP"] = "0"
    commtrace.enable(output=out)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    rec = R.get_recorder()
    args = ddp_mlp.parse_args(["--straggler-ms", "0"])
    copies, kinds = {}, {}
    cxx_mod = accel.load()
    for mode in modes:
        R._set_recorder(None if mode == "floor" else rec)
        accel._loaded = cxx_mod if mode.startswith("cxx") else None
        if mode == "cxx_v1":
            os.environ["COMMTRACE_DDP_V2"] = "0"   # read when the hook registers
        st = ddp_mlp.setup(args, rank, world, torch.device("cpu"))
        if mode == "floor":
            st["ddp"]._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        for i in range(3):   # registers commtrace's hook (first forward), rebuilds buckets
            ddp_mlp.train_step(st, i)
        os.environ.pop("COMMTRACE_DDP_V2", None)
        d = st["ddp"]
        kinds[mode] = d.__dict__.get("_commtrace_hook_kind", "c" if mode == "c" else None)
        if d.__dict__.get("_commtrace_hook_v2"):
            kinds[mode] += " v2"
        copies[mode] = (d.reducer, d.reducer._get_zeros_like_grad_buckets())
    accel._loaded = cxx_mod
    res = {m: [] for m in modes}
    for r in range(rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            red, buckets = copies[mode]
            R._set_recorder(None if mode == "floor" else rec)
            dist.barrier()
            n = 0
            t0 = time.thread_time_ns()
            while n < calls:
                for b in buckets:
                    red._run_comm_hook(b).wait()
                    n += 1
            t1 = time.thread_time_ns()
            res[mode].append((t1 - t0) / n / 1e3)
    R._set_recorder(rec)
    q.put((rank, kinds, res, {m: len(copies[m][1]) for m in modes}))
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    from ddp_hooks import _median_ci, parse_modes, run_ranks

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--calls", type=int, default=200, help="hook calls per round and copy")
    ap.add_argument("--world", type=int, default=1, help="ranks (default 1)")
    ap.add_argument("--modes", default=",".join(MODES[1:]),
                    help="copies besides floor, comma-separated (default: %(default)s)")
    a = ap.parse_args(argv)
    modes = parse_modes(ap, a.modes, MODES)
    t0 = time.time()
    got = run_ranks(_rank, a.world, (a.rounds, a.calls), modes, "ddp-hook-call-")
    print(f"ddp_hook_call: {a.rounds} rounds x {a.calls} hook calls per copy, {a.world} "
          f"rank(s), gloo, {time.strftime('%H:%M', time.gmtime(t0))}-"
          f"{time.strftime('%H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}")
    for rank, kinds, res, nb in sorted(got, key=lambda g: g[0]):
        print(f"rank {rank}: hooks {kinds}, buckets {nb}")
        base = res["floor"]
        parts = [f"floor {_median_ci(base)[0]:.1f} us"]
        for m in modes[1:]:
            d = [x - y for x, y in zip(res[m], base)]
            med, lo, hi = _median_ci(d)
            parts.append(f"{m} {_median_ci(res[m])[0]:.1f} ({med:+.1f} [{lo:+.1f}, {hi:+.1f}])")
        print("  thread CPU per bucket (over floor): " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
