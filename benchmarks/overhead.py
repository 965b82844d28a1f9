"""Host time commtrace adds per op, against no tracing and against torch.profiler (CPU).

    python benchmarks/overhead.py                 # world size 1 and 2 (gloo), ~2.5 minutes
    python benchmarks/overhead.py --world-size 2 --rounds 150 --ops 200 --json out.json
    python benchmarks/overhead.py --world-size 1 --pin one --sweep-kb 2048   # cold caches

Method (the machine is noisy):
- Rounds. In each of many short rounds the same K small all_reduces run four times: untraced
  (torch's original function), through commtrace's wrapper with a recorder on, untraced under
  ``torch.profiler.profile(activities=[CPU])``, and through a bare Python wrapper that only
  reads the clock twice (the floor of any Python-level tracer on this machine at this moment),
  in a rotating order. Per round we take the differences traced - untraced of the mean time per
  op, and report the median of these paired differences (not a difference of medians) with a
  distribution-free 95% confidence interval of that median.
- Per op. The profiler cannot be switched per op, commtrace and the bare wrapper can: blocks
  of one untraced, one commtrace and one bare-wrapper op in a shuffled order, each op timed on
  its own, paired within the block. Drift of the machine cancels within a block.
  Each mode runs on a process group of its own (untraced, bare and commtrace: since session 13
  of issue 20 the bare wrapper no longer shares the untraced mode's group). At 2 ranks every op
  starts with cold caches (its previous wait slept while gloo's threads and the other rank
  ran), and an op on a group another mode of the same block just used finds that group's
  state warmer: the bare wrapper on the untraced group cost 0.8 us less than on a group of
  its own (`--ab shared_bare`), which read as 0.8 us of commtrace's cost.
- `--ab`: more per-op modes in the same blocks, each paired with its reference: commtrace
  with one part of its work switched off (the C++ tensor / group reads, the gap check, the
  prefetch at entry; switched by the same calls before every mode's op, which also warm
  commtrace's module: compare these modes with each other, not with the bare wrapper), the
  bare wrapper on the untraced mode's group (the layout before), and a second bare wrapper on
  a fourth group (A/A: the pairing's resolution); and two diagnostics, commtrace's op after a
  call into `_fastpath` (`--ab warm_module`) or after reading the dicts its entry checks read
  (`--ab warm_state`), made before that mode's op only: how much of its cost is cold code or
  state. `--ab hot` runs a second commtrace op right after commtrace's, and a second bare one
  right after the bare one, in every block: "commtrace: first - right after" is what the
  coldness of commtrace's own code and state costs its first op, and "right after: commtrace
  - bare" the wrapper's distance to the floor when both are hot. At 2 ranks the plain figure
  depends on how much other work ran since commtrace's previous op (session 13: +4.2 us with
  one commtrace op among 5 per block, -2.4 with three of 5, runs 10 minutes apart).
- Both clocks: wall time, and the calling thread's CPU time (at 2 ranks the wall time of an op
  is mostly waiting for the other process; its CPU time is the host's own work).
With 2 ranks both run the same schedule in lockstep and rank 0 reports. The last lines say
whether the issue's target (at most 5 us per op, and less than the profiler adds) is shown.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from common import accel_built, c_fast_path, free_port, median_ci, pin_cpus, thread_cpu_ns, warn_without_accel


def _bench(rank: int, world: int, init: str, args, out_q=None) -> dict:
    import torch
    import torch.distributed as dist

    import commtrace
    from commtrace.capture import recorder as R
    from commtrace.capture import registry

    cpus = pin_cpus(rank, args.pin)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    tmp = tempfile.mkdtemp(prefix="commtrace-bench-")
    commtrace.enable(output=tmp, stack=True, nvtx=True)
    rec = R.get_recorder()
    ct_all_reduce = dist.all_reduce
    torch_all_reduce = registry.original_of(ct_all_reduce)
    # Each mode on a group of its own. torch numbers each group's collectives, and an untraced
    # op between two traced ones on one group is a collective the trace did not record: since
    # commtrace reads torch's numbers it writes a `gap` row for it (about 10 us), which the
    # interleaved per-op blocks would otherwise pay at every traced op.
    # The bare wrapper has a group of its own too (issue 20, session 13): sharing the untraced
    # mode's group, the bare op found that group's state (torch's and gloo's objects for it)
    # touched by the untraced op of the same block, while commtrace's group was touched once
    # per block. At 2 ranks, where each op starts with cold caches, that asymmetry alone moved
    # commtrace - bare (`--ab shared_bare` measures it in one run).
    ranks = list(range(world))
    g_traced, g_untraced = dist.new_group(ranks), dist.new_group(ranks)
    g_bare = dist.new_group(ranks)
    ab = set(args.ab)
    g_bare2 = dist.new_group(ranks) if "aa" in ab else None

    def on(group, fn):
        if args.async_op:
            # the op is an async all_reduce and its wait(), through the same function per mode
            def op(x):
                fn(x, group=group, async_op=True).wait()
        else:
            def op(x):
                fn(x, group=group)
        return op

    wrapped = on(g_traced, ct_all_reduce)
    original = on(g_untraced, torch_all_reduce)
    original_b = on(g_bare, torch_all_reduce)
    t = torch.ones(args.numel)
    k = args.ops

    cpu_of = {}

    def loop(fn):
        c0 = thread_cpu_ns()
        t0 = time.perf_counter_ns()
        for _ in range(k):
            fn(t)
        wall = (time.perf_counter_ns() - t0) / k / 1000.0  # us per op
        cpu_of[fn] = (thread_cpu_ns() - c0) / k / 1000.0
        return wall

    def untraced():
        R._set_recorder(None)
        return loop(original)

    def traced():
        R._set_recorder(rec)
        try:
            return loop(wrapped)
        finally:
            R._set_recorder(None)

    def profiled():
        from torch.profiler import ProfilerActivity, profile

        R._set_recorder(None)
        with profile(activities=[ProfilerActivity.CPU]):
            return loop(original)

    _time_ns = time.time_ns

    def two_clocks(inner):
        def bare_wrapper(tensor, *a, **kw):
            t0 = _time_ns()
            r = inner(tensor, *a, **kw)
            t1 = _time_ns()
            return r
        return bare_wrapper

    bare_wrapper = two_clocks(original_b)

    def bare():
        R._set_recorder(None)
        return loop(bare_wrapper)

    modes = {"untraced": untraced, "commtrace": traced, "profiler": profiled, "bare": bare}
    names = list(modes)
    for name in names:  # warm-up
        modes[name]()
    fn_of = {"untraced": original, "commtrace": wrapped, "profiler": original,
             "bare": bare_wrapper}
    res = {n: [] for n in names}
    cpu = {n: [] for n in names}
    for i in range(args.rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            dist.barrier()
            res[name].append(modes[name]())
            cpu[name].append(cpu_of[fn_of[name]])
    fns = {"untraced": original, "commtrace": wrapped, "bare": bare_wrapper}
    fns.update(_ab_modes(ab, wrapped, two_clocks(original), two_clocks(on(g_bare2, torch_all_reduce))
                         if g_bare2 is not None else None, bare_wrapper))
    prep, restore = _ab_prep(ab, fns, rec, g_traced)
    per_op = _per_op(args.blocks, fns, t, rec, dist, args.sweep_kb,
                     prep) if args.blocks else None
    restore()
    R._set_recorder(rec)
    commtrace.disable()
    # The paired differences per round (wall, then the calling thread's CPU time: the host's
    # own work; at 2 ranks the wall time is dominated by waiting for the other process).
    pairs = {"commtrace_added_us": ("commtrace", "untraced"),
             "profiler_added_us": ("profiler", "untraced"),
             "bare_wrapper_added_us": ("bare", "untraced"),
             "commtrace_minus_profiler_us": ("commtrace", "profiler")}
    diffs = {}
    for key, (a, b) in pairs.items():
        for pre, data in (("", res), ("cpu_", cpu)):
            diffs[pre + key] = [x - y for x, y in zip(data[a], data[b])]
    out = {
        "world_size": world, "async_op": bool(args.async_op), "rounds": args.rounds,
        "ops_per_round": k, "numel": args.numel,
        "untraced_us": statistics.median(res["untraced"]),
        "cpu_untraced_us": statistics.median(cpu["untraced"]),
        **{key: statistics.median(d) for key, d in diffs.items()},
        **{key.replace("_added_us", "_added_iqr_us"): _iqr(diffs[key])
           for key in ("commtrace_added_us", "profiler_added_us", "cpu_commtrace_added_us",
                       "cpu_profiler_added_us")},
        "ci95": {key: median_ci(d) for key, d in diffs.items()},
        "per_op": per_op,
        "rows_recorded": None,
        "c_fast_path": c_fast_path(),
        "accel": accel_built(),
        "pin": args.pin, "cpus": cpus,
        # per-op layout: untraced, bare and commtrace each on a group of its own (since
        # session 13; the bare wrapper shared the untraced group before), --ab's modes
        "groups": "own", "ab": sorted(ab),
    }
    try:
        import pyarrow.dataset as ds

        kinds = ds.dataset(tmp, partitioning="hive").to_table(columns=["kind"])["kind"].to_pylist()
        out["rows_recorded"] = len(kinds)
        out["op_rows_recorded"] = kinds.count("op")
        # unrecorded collectives (schema v3): the untraced modes' group, and the barriers of
        # the rounds (issued with the recorder off) before the per-op blocks' barrier
        out["gap_rows_recorded"] = kinds.count("gap")
    except Exception:
        pass
    dist.destroy_process_group()
    if out_q is not None and rank == 0:
        out_q.put(out)
    return out


#: --ab: per-op modes added to the blocks, each paired with its reference mode in the same
#: block: the same wrapper with one part of its work switched off (switched outside the op's
#: timing, by the same calls before every mode's op), or the bare wrapper in another layout.
AB_MODES = {
    # name: (mode, reference, label: what "reference - mode" is)
    "meta": ("commtrace_no_cxx_reads", "commtrace", "C++ reads - accessors"),
    "gap": ("commtrace_no_gap_check", "commtrace", "gap check's cost (seq read)"),
    "prefetch": ("commtrace_no_prefetch", "commtrace", "prefetch at entry's effect"),
    "shared_bare": ("bare_shared_group", "bare", "bare: own - shared group"),
    "aa": ("bare2", "bare", "A/A: bare - bare2"),
    # diagnostics (not switches: only the mode's own op gets the call before it, outside
    # its timing): how much of commtrace's cost is the coldness of what the call warms
    "warm_module": ("commtrace_warm_module", "commtrace",
                    "cold - after a call into _fastpath"),
    "warm_state": ("commtrace_warm_state", "commtrace",
                   "cold - after reading its dicts"),
    # a second op right after commtrace's (and one right after the bare wrapper's), in every
    # block: the same wrapper with its code and state just used (hot) against its first op
    "hot": ("commtrace_hot", "commtrace", "commtrace: first - right after"),
}
#: --ab hot: these modes run right after the mode they follow, not in the shuffled order
FOLLOW = {"commtrace": "commtrace_hot", "bare": "bare_hot"}


def _ab_modes(ab, wrapped, bare_on_untraced, bare2, bare=None) -> dict:
    out = {}
    for name in [k for k in AB_MODES if k in ab]:   # one order on every rank (not a set's)
        mode = AB_MODES[name][0]
        if name in ("meta", "gap", "prefetch", "warm_module", "warm_state"):
            out[mode] = wrapped
        elif name == "hot":
            out["commtrace_hot"] = wrapped
            out["bare_hot"] = bare
        elif name == "shared_bare":
            out[mode] = bare_on_untraced
        elif name == "aa":
            out[mode] = bare2
    return out


def _ab_prep(ab, fns, rec, g_traced):
    """{mode: call before each of its ops} for the switched modes of `ab`, and a function that
    puts every switch back. Every mode makes the same calls (with its own values), so that
    none finds commtrace's module warmer than another."""
    from commtrace.capture import wrappers as W

    cf = W._cfast
    sets = []   # (setter(mode) -> None) per switch
    if "meta" in ab:
        cap = _meta_capsule()
        if cap is None:
            raise SystemExit("--ab meta: the C++ reads are not built or not in use "
                             "(commtrace accel build)")
        sets.append(lambda m: cf.set_meta_api(None if m == "commtrace_no_cxx_reads" else cap))
    if "prefetch" in ab:
        sets.append(lambda m: cf.set_prefetch(m != "commtrace_no_prefetch"))
    if "gap" in ab:
        from commtrace.capture import torchseq

        info = W.pg_info(g_traced)
        if cf is None or not info.tseq:
            raise SystemExit("--ab gap: no gap check on the C fast path here")
        k, slot, fn = rec._tseqs, info.seq_slot, torchseq.on_gap

        def gap(m):
            off = m == "commtrace_no_gap_check"
            cf.set_tseq(None if off else fn)
            # The op with the check off claims no number: its group's last claimed number is
            # moved past the one torch gives it (a blocking all_reduce takes exactly one), so
            # the next checked op finds no gap; the other modes make the same two calls.
            k.set(slot, k.get(slot) + (1 if off else 0))
        sets.append(gap)
    own = {}   # mode: its own call (the warm_* diagnostics)
    if "warm_module" in ab:
        # a C function of the module (its code, the thread's TLS), nothing of the wrapper's
        own["commtrace_warm_module"] = cf.depth
    if "warm_state" in ab:
        # the recorder's and the thread state's dicts (the entry checks'), from Python
        tls = W.tls

        def warm_state():
            rec.step
            tls.__dict__.get("depth")
        own["commtrace_warm_state"] = warm_state
    if not sets and not own:
        return {}, lambda: None

    def one(m):
        extra = own.get(m)
        if extra is None:
            return lambda: [f(m) for f in sets]
        return lambda: ([f(m) for f in sets], extra())
    return {m: one(m) for m in fns}, lambda: [f("commtrace") for f in sets]


def _meta_capsule():
    """The built C++ tensor / group reads in use by the C fast path (commtrace accel build), or
    None where they are not built or not in use."""
    try:
        from commtrace.capture import accel
        from commtrace.capture import wrappers as W

        if W._cfast is None or not W._meta_set:
            return None
        return accel.meta_api()
    except Exception:
        return None


def _mean_ci(d) -> list:
    """Normal-approximation 95% interval of the mean of `d`."""
    m = statistics.fmean(d)
    h = 1.96 * statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else 0.0
    return [m - h, m + h]


def _per_op(blocks: int, fns: dict, t, rec, dist, sweep_kb: int = 0, prep=None) -> dict:
    """The finest pairing: blocks of one op per mode, in a shuffled order, each op timed alone.

    Slow drifts of the machine (another process waking, a frequency change, the other rank
    falling behind) move a whole round of K ops; here each difference pairs two ops a few
    microseconds (world size 1) or milliseconds (2 ranks) apart, so drift cancels and only the
    per-op scatter is left, which the median over many blocks narrows. The recorder stays on
    throughout; the untraced and bare modes call torch's function without commtrace's wrapper.

    The median leaves out what a tracer costs only some of its ops (a GIL hand-over with the
    backend's thread, the writer thread's turn, a GC collection): the mean of the same paired
    differences is printed too. `sweep_kb` > 0 writes that much memory (one byte per 64-byte
    line) before each op, outside its timing: the caches are then as cold as after a wait
    that let other threads and processes run on the CPU (what an op at 2 ranks meets).
    `prep`: {mode: a function called before each of its ops, outside the timing}.
    """
    import random

    from commtrace.capture import recorder as R

    R._set_recorder(rec)
    names = list(fns)
    rng = random.Random(20261201)
    cpu = {n: [] for n in names}
    wall = {n: [] for n in names}
    tcpu, pc = thread_cpu_ns, time.perf_counter_ns
    junk = bytearray(sweep_kb * 1024) if sweep_kb > 0 else None
    ones = b"\x01" * (len(junk) // 64) if junk is not None else b""
    prep = prep or {}
    for _ in range(200):  # warm-up
        for name in names:
            if name in prep:
                prep[name]()
            fns[name](t)
    dist.barrier()
    follow = {a: b for a, b in FOLLOW.items() if a in fns and b in fns}
    for _ in range(blocks):
        order = [n for n in names if n not in follow.values()]
        rng.shuffle(order)
        order = [m for n in order for m in ((n, follow[n]) if n in follow else (n,))]
        for name in order:
            fn = fns[name]
            if junk is not None:
                junk[::64] = ones
            if name in prep:
                prep[name]()
            c0 = tcpu()
            w0 = pc()
            fn(t)
            w1 = pc()
            c1 = tcpu()
            cpu[name].append(c1 - c0)
            wall[name].append(w1 - w0)
    R._set_recorder(None)
    out = {"blocks": blocks, "sweep_kb": sweep_kb}
    for kind, data in (("cpu", cpu), ("wall", wall)):
        out[f"{kind}_untraced_us"] = statistics.median(data["untraced"]) / 1000.0
        for name in names[1:]:
            d = [(a - b) / 1000.0 for a, b in zip(data[name], data["untraced"])]
            out[f"{kind}_{name}_added_us"] = statistics.median(d)
            out[f"{kind}_{name}_added_ci95_us"] = median_ci(d)
            out[f"{kind}_{name}_added_mean_us"] = statistics.fmean(d)
            out[f"{kind}_{name}_added_mean_ci95_us"] = _mean_ci(d)
        if "bare_hot" in data and "commtrace_hot" in data:
            # --ab hot: each right after its own first op, paired within each block
            d = [(a - b) / 1000.0 for a, b in zip(data["commtrace_hot"], data["bare_hot"])]
            out[f"{kind}_hot_commtrace_minus_bare_us"] = statistics.median(d)
            out[f"{kind}_hot_commtrace_minus_bare_ci95_us"] = median_ci(d)
            out[f"{kind}_hot_commtrace_minus_bare_mean_us"] = statistics.fmean(d)
            out[f"{kind}_hot_commtrace_minus_bare_mean_ci95_us"] = _mean_ci(d)
        if "bare" in data and "commtrace" in data:
            # commtrace against the bare two-clock wrapper, paired within each block (issue 20:
            # within 1 us of that floor)
            d = [(a - b) / 1000.0 for a, b in zip(data["commtrace"], data["bare"])]
            out[f"{kind}_commtrace_minus_bare_us"] = statistics.median(d)
            out[f"{kind}_commtrace_minus_bare_ci95_us"] = median_ci(d)
            out[f"{kind}_commtrace_minus_bare_mean_us"] = statistics.fmean(d)
            out[f"{kind}_commtrace_minus_bare_mean_ci95_us"] = _mean_ci(d)
        for ab, (mode, ref, _label) in AB_MODES.items():
            if mode not in data:
                continue
            # --ab: reference - switched mode, paired within each block (meta: with the
            # built C++ reads minus without them, the key of the first version)
            key = "cxx_reads_gain" if ab == "meta" else f"ab_{ab}"
            d = [(a - b) / 1000.0 for a, b in zip(data[ref], data[mode])]
            out[f"{kind}_{key}_us"] = statistics.median(d)
            out[f"{kind}_{key}_ci95_us"] = median_ci(d)
            out[f"{kind}_{key}_mean_us"] = statistics.fmean(d)
            out[f"{kind}_{key}_mean_ci95_us"] = _mean_ci(d)
    return out


def _iqr(xs):
    q = statistics.quantiles(xs, n=4)
    return [q[0], q[2]]


def _worker(rank, world, init, args, q):
    _bench(rank, world, init, args, q if rank == 0 else None)


def run(world: int, args) -> dict:
    init = f"tcp://127.0.0.1:{free_port()}"
    if world == 1:
        keep = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        try:
            return _bench(0, 1, init, args)
        finally:  # world size 1 runs in this process: the next world size's ranks start unpinned
            if keep is not None:
                os.sched_setaffinity(0, keep)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(_worker, args=(world, init, args, q), nprocs=world)
    return q.get(timeout=10)


#: rounds x ops per round by world size: enough rounds that the 95% CI of the median paired
#: difference is a fraction of a microsecond at world size 1 (about 15 s) and about +-1 us of
#: thread CPU at 2 ranks (about 2 minutes on 2 cores)
DEFAULTS = {1: (300, 300), 2: (150, 200)}
TARGET_US = 5.0


def _fmt(v, ci=None) -> str:
    return f"{v:8.2f}" + (f" [{ci[0]:6.2f}, {ci[1]:6.2f}]" if ci else " " * 17)


def report(r: dict) -> list[str]:
    """The lines printed for one world size (and the verdict on the issue's target)."""
    ci = r["ci95"]
    out = [f"world size {r['world_size']}: {r['rounds']} rounds x {r['ops_per_round']} ops "
           f"({'async all_reduce + wait' if r.get('async_op') else 'all_reduce'} of "
           f"{r['numel']} float32, gloo), C fast path "
           f"{'on' if r['c_fast_path'] else 'OFF'}, C++ module (accel) "
           f"{'built' if r.get('accel') else 'NOT BUILT'}, pinned: {r.get('pin', 'none')}, "
           f"load average {r.get('load', '?')}",
           f"  {'us per op, median [95% CI]':<34} {'wall':>26} {'thread CPU':>26}",
           f"  {'untraced':<34} {_fmt(r['untraced_us']):>26} {_fmt(r['cpu_untraced_us']):>26}"]
    rows = [("commtrace adds", "commtrace_added_us"), ("torch.profiler adds", "profiler_added_us"),
            ("bare two-clock wrapper adds", "bare_wrapper_added_us"),
            ("commtrace - profiler (paired)", "commtrace_minus_profiler_us")]
    for label, key in rows:
        out.append(f"  {label:<34} {_fmt(r[key], ci.get(key)):>26} "
                   f"{_fmt(r['cpu_' + key], ci.get('cpu_' + key)):>26}")
    p = r.get("per_op")
    if p:
        sweep = (f", {p['sweep_kb']} KB of memory written before each op"
                 if p.get("sweep_kb") else "")
        out.append(f"  per op, interleaved ({p['blocks']} blocks of one op per mode, shuffled"
                   f"{sweep}):")
        labels = [("commtrace adds", "commtrace"), ("bare two-clock wrapper adds", "bare")]
        if "cpu_commtrace_no_cxx_reads_added_us" in p:
            labels.append(("commtrace, no C++ reads, adds", "commtrace_no_cxx_reads"))
        def row(label, key):   # one figure's line: wall and thread CPU, each with its CI
            out.append(f"  {label:<34} "
                       f"{_fmt(p[f'wall_{key}_us'], p[f'wall_{key}_ci95_us']):>26} "
                       f"{_fmt(p[f'cpu_{key}_us'], p[f'cpu_{key}_ci95_us']):>26}")
        for label, name in labels:
            row(label, f"{name}_added")
        if "cpu_commtrace_minus_bare_us" in p:
            row("commtrace - bare wrapper (paired)", "commtrace_minus_bare")
        if "cpu_hot_commtrace_minus_bare_us" in p:
            row("right after: commtrace - bare", "hot_commtrace_minus_bare")
            row("  mean", "hot_commtrace_minus_bare_mean")
        if "cpu_cxx_reads_gain_us" in p:
            row("C++ reads - accessors (paired)", "cxx_reads_gain")
            row("C++ reads - accessors, mean", "cxx_reads_gain_mean")
        for ab, (_mode, _ref, label) in AB_MODES.items():
            if ab != "meta" and f"cpu_ab_{ab}_us" in p:
                row(f"{label} (paired)", f"ab_{ab}")
                row("  mean", f"ab_{ab}_mean")
        if "cpu_commtrace_added_mean_us" in p:
            # the mean of the same paired differences: what the median leaves out (costs that
            # land on some ops only) is in it, as it is in the rounds above
            row("commtrace adds, mean", "commtrace_added_mean")
            row("commtrace - bare, mean", "commtrace_minus_bare_mean")
    # The verdict on the target, on both clocks. At 2 ranks the wall time of an op is
    # mostly waiting for the other rank, so there the thread CPU time is the host's own work.
    for clock, name in (("wall", "wall time"), ("cpu", "thread CPU")):
        pre = "cpu_" if clock == "cpu" else ""
        if p:
            added, hi = p[f"{clock}_commtrace_added_us"], p[f"{clock}_commtrace_added_ci95_us"][1]
        else:
            added, hi = r[pre + "commtrace_added_us"], ci[pre + "commtrace_added_us"][1]
        d, dci = r[pre + "commtrace_minus_profiler_us"], ci[pre + "commtrace_minus_profiler_us"]
        out.append(f"  target, {name:<10}: commtrace adds {added:5.2f} us (CI up to {hi:5.2f}): "
                   f"{'<= 5 us' if hi <= TARGET_US else 'NOT shown <= 5 us'}; vs profiler "
                   f"{d:+6.2f} us [{dci[0]:+.2f}, {dci[1]:+.2f}]: "
                   + ("below it" if dci[1] < 0 else "above it" if dci[0] > 0 else
                      "NOT shown below it"))
    if p:
        # The rounds (means over consecutive traced ops, as a loop pays them) include what
        # the per-op median leaves out: the verdict on them too (docs/performance.md, "Rounds
        # or per op: which is right").
        for clock, name in (("wall", "wall time"), ("cpu", "thread CPU")):
            pre = "cpu_" if clock == "cpu" else ""
            added, hi = r[pre + "commtrace_added_us"], ci[pre + "commtrace_added_us"][1]
            out.append(f"  target (rounds), {name:<10}: commtrace adds {added:5.2f} us (CI up "
                       f"to {hi:5.2f}): "
                       f"{'<= 5 us' if hi <= TARGET_US else 'NOT shown <= 5 us'}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Defaults (rounds x ops): " + ", ".join(
            f"world size {w}: {a} x {b}" for w, (a, b) in DEFAULTS.items()) + "; about 2.5 "
        "minutes for both on 2 cores. Examples: `overhead.py --world-size 1 --pin one`, "
        "`overhead.py --world-size 2 --pin each`, `overhead.py --world-size 1 --pin one "
        "--async-op`, `overhead.py --world-size 1 --pin one --sweep-kb 2048` (cold caches "
        "before each op, as at 2 ranks).")
    ap.add_argument("--world-size", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default: by world size)")
    ap.add_argument("--ops", type=int, default=None, help="ops per mode per round")
    ap.add_argument("--numel", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=20000,
                    help="blocks of the per-op interleaved measurement (0: skip it)")
    ap.add_argument("--async-op", action="store_true",
                    help="time all_reduce(async_op=True).wait() instead of the blocking call")
    ap.add_argument("--pin", choices=["none", "one", "each"], default="none",
                    help="CPU affinity of the ranks and their threads: none (the scheduler's), one "
                    "(all on the first CPU), each (rank r on CPU r). At world size 1 'one' keeps "
                    "gloo's thread on the caller's CPU: the untraced baseline is then stable")
    ap.add_argument("--sweep-kb", type=int, default=0,
                    help="per-op blocks: write this much memory before each op (outside its "
                    "timing), so that each op finds cold caches, as one at 2 ranks does after "
                    "its wait (default 0: none)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--meta-ab", action="store_true",
                    help="per op, also the wrapper with the C fast path's tensor / group reads "
                         "through torch's Python-level accessors instead of the C++ ones of "
                         "`commtrace accel build` (issue 20), paired (needs them built); the "
                         "same as --ab meta")
    ap.add_argument("--ab", default="",
                    help="comma-separated per-op modes to add, each paired with its reference "
                         "in the same blocks: " + "; ".join(
                             f"{k}: {v[0]} ({v[2]})" for k, v in AB_MODES.items()))
    args = ap.parse_args(argv)
    args.ab = [a for a in args.ab.split(",") if a] + (["meta"] if args.meta_ab else [])
    bad = [a for a in args.ab if a not in AB_MODES]
    if bad:
        ap.error(f"--ab: unknown {bad}; choose from {sorted(AB_MODES)}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = []
    for w in args.world_size:
        a = argparse.Namespace(**vars(args))
        dr, do = DEFAULTS.get(w, DEFAULTS[2])
        a.rounds = args.rounds or dr
        a.ops = args.ops or do
        load0 = os.getloadavg()[0]
        r = run(w, a)
        r["load"] = f"{load0:.1f}-{os.getloadavg()[0]:.1f}"
        results.append(r)
        warn_without_accel(r.get("accel", True))
        print("\n".join(report(r)), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
