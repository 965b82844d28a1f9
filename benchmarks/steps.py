"""Step time of real training loops, traced against untraced, in one run (issue 20).

    python benchmarks/steps.py                          # every workload, ~10 minutes on 2 cores
    python benchmarks/steps.py --workloads ddp fsdp2 pipeline --budget 120   # A/A +-1%, ~8 min
    python benchmarks/steps.py --workloads ddp async_loop --rounds 60 --json steps.json

What users see is the time of a training step, not the cost of one op. Each workload runs on
2 ranks (gloo, two processes forked from this one after torch is imported):

- ``ddp``: samples/ddp_mlp.py's setup and train_step (its straggler sleep off);
- ``fsdp2``: samples/fsdp2.py (fully_shard, all-gather and reduce-scatter per layer);
- ``pipeline``: samples/pipeline.py (send/recv per micro-batch, isend + wait);
- ``async_loop``: many small async collectives: 8 all_reduces of 256 float32 issued with
  ``async_op=True``, then waited, per step;
- ``soak``: the soak's tight loop (benchmarks/soak.py): 200 blocking all_reduces of 1 float
  per step.

Method (the machine is shared and noisy): tracing is on in both ranks (``commtrace.enable()``
before the process group exists, with `commtrace run`'s defaults: call sites, hazard
detection, 2 s flushes). Three modes: "untraced" (a copy of the workload built, warmed up
and run with tracing off), "traced" (the same copy run with tracing on; for DDP, since session
24, one copy built with tracing on whose Reducer is handed commtrace's recording group for the
traced rounds and DDP's own group for the others, where the C++ module is built; else, or with
``--ddp-copies``, a second copy built with tracing on, since commtrace's comm hook replaces
DDP's C++ all-reduce, the untraced copy keeping the latter) and "control", untraced again, run the way traced is: on the
untraced copy, on a second copy for DDP (``--control copy``: always a second copy). Two copies
of one workload in one process do not run equally fast (memory placement): in runs of this
benchmark two untraced copies of the FSDP2 sample differed by up to 15%, with intervals that
excluded 1, which is why traced runs on the untraced copy wherever it can, and why the
control does too: control / untraced then shows what the comparison itself gives with no
tracing (the run's resolution), not a difference between copies that traced / untraced does
not have. Each set of rounds runs K steps of each mode, with a barrier before each round, in
a balanced order (``ORDERS``: over six sets each mode is first, second and last twice and
follows each other mode equally often). K is calibrated after the warm-up so that a round
lasts ``--duration`` (0.1 s by default under SCHED_FIFO, 0.4 s with ``--rt 0``: K = duration
/ the untraced step time of the slower rank, at least 1), and the number of sets follows from
``--budget`` (90 s of rounds per workload: 300 sets of 0.1 s rounds, 72 of 0.4 s; the sets'
orders are drawn, see Scheduling below). The first version ran a fixed small K (rounds of 5-50 ms, at the scale of
the scheduler's time slices on 2 cores): two untraced copies then differed by up to 5-9% at
the 95% bound. During an untraced or control round the recorder is off and its write lock is
held. By default
(``--writer sync``) the traced rounds write their rows themselves, on the training thread and
inside their time: a part at the end of the round in which a flush interval (2 s) of traced
time has passed, and one at the end of the last traced round; the writer thread writes no
part on its own schedule then (``Recorder.auto_flush``; it still polls and releases the
pending ops), so the parts are those of a traced run of the same traced time. The writer's work
(Parquet encoding) is thus charged in full to the traced rounds (an upper bound). ``--writer
async`` leaves the flushes to the writer thread, whose work then lands in traced rounds or
between rounds (a part per flush interval of wall time, untraced rounds included).

Figures, each with a 95% percentile-bootstrap interval over the sets (distribution-free):
- traced / untraced: the ratio of the total traced to the total untraced step time (each
  round's mean step time, both ranks' means averaged); a median of per-set ratios would skip
  the few rounds that write a part (it is printed too, with its binomial interval);
- control / untraced, the same ratio between the two untraced copies: 1 up to the resolution
  this run has on this machine now (and any difference between two copies of one workload);
  a traced / untraced interval is only as good as this one;
- the process CPU time per step (all threads of the rank: training, gloo's, the writer),
  traced / untraced and control / untraced: less sensitive to other jobs than wall time;
- the load average (``uptime``) at the start and end of each workload, the untraced baseline,
  and the writer's CPU per op (its thread's CPU time over the rounds plus the flushes written
  by traced rounds, per op recorded in traced rounds), and the writer thread's wake-ups per
  second of the rounds with their causes (its counters, ``Recorder.writer_stats``).

Paired robust estimator (added in session 12; printed after the figures above, with its own
verdict, and its A/A check on the control). On this 2-core machine shared by several people a
few rounds of every run take 2-10 times their neighbours' time, in every mode (other processes
took the CPU): the ratio of totals above then swings with where those rounds fell, and its
interval is as wide as +-13% at load 5 (+-2-4% on a quiet machine). The robust estimator is
``median_i((x_i - f_i) / u_i) + sum(f) / sum(u)`` over the sets i, x the traced (or control)
round's step time, u the same set's untraced one, f the wall time per step of the flush that
traced round wrote (0 for the control and for the rounds without one), with a percentile
bootstrap over the sets. The median is not moved by the disturbed rounds; the flushes (the
writer's work, in a few traced rounds with ``--writer sync``) are not skipped with them but
charged in full at their measured time. What it would miss: a cost tracing adds to a few
rounds other than the flush (a pause in under half the rounds); the ratio of totals keeps
it, so both are printed, and the robust one holds only where they agree within their
intervals. The A/A intervals on the same rounds, three pipeline runs at load 4-5 (2026-12-02
13:55-14:08 UTC, docs/performance.md, session 12): ratio of totals +-10-16%, robust +-2.5-5%
(e.g. 0.985 [0.864, 1.133] against 1.000 [0.973, 1.023]).

Scheduling (session 14): ``--rt 1`` (the default) runs the ranks, and every thread they start
(gloo's, the writer), under SCHED_FIFO, with a pause after each round (``--gap``, an eighth of
the round). Under the fair scheduler the rounds' spread came from other jobs, not from
sampling: on the shared 2-core machine a round's step time followed the other processes' CPU
over it (correlation 0.8-0.99, /proc/stat), 60-85% of the DDP step (2.2 ms undisturbed, 5.4 ms
at load 5) was the waiting of a woken rank for the task that held its CPU to finish its slice,
and a set's control / untraced ratio had a spread of 20-60% at load 3-7. The rounds' step times
are not heavy-tailed then but uniformly slowed, so no per-step or robust statistic helped (the
median of a round's steps was as spread as their mean); neither did ``--nice`` (with the
kernel's autogroups on, a nice value counts only within its session, and each engineer's shell
is a session: ``--group-nice`` sets a session's, and -20 did not narrow the intervals either:
the cost is wake-up latency, not CPU share). Under SCHED_FIFO a woken rank takes its CPU at
once: the spread of a set's ratio fell to ~4% at load 6-11 and the A/A (control / untraced)
intervals to +-1.1-1.3% in 48 sets of 0.4 s rounds, +-0.4-1.0% in 198-402 sets of 0.1 s
rounds (the default; docs/performance.md, session 14). Without the gaps the
kernel's RT throttling (0.95 s of each second for RT tasks, sched_rt_runtime_us) stopped the
ranks for ~55 ms once a second, in whatever round that fell (a set's spread of 12-16%); with
them the ranks use at most ~8/9 of a CPU and other jobs run in the gaps. The writer thread's
CPU in a gap (and in the barrier after it) is charged to the round before it, in every mode: it
is work that round left (the design without gaps left it to the next round, an untraced or
control one as often as a traced one). What SCHED_FIFO changes in what is measured: the
writer thread, at the training threads' priority, no longer yields to them by its nice value
(FIFO threads of one priority do not preempt each other); with ``--writer sync`` its work in the
rounds is polling and servicing pending ops, the flushes being on the training thread. Where
SCHED_FIFO is not permitted (no CAP_SYS_NICE) the ranks stay under the fair scheduler, and the
report says so. ``--rt 0`` gives the fair scheduler (the design up to session 13).

``--aa`` runs the "traced" arm with tracing off too (as the control: a second A/A comparison
per run), and ``--plant F`` adds to each step of the traced arm a busy loop of F times the
calibrated step time in thread CPU (a known slowdown): the checks of the estimator's coverage
and of its recovery of a known effect. ``--per-step`` keeps every step's wall time in the JSON.

``--nice N`` gives the ranks (and every thread they start; the writer thread's
COMMTRACE_WRITER_NICE is added to it, as in any run) nice value N: a negative one puts the
timed processes ahead of the niced tests and other jobs on the machine, which take fewer
rounds from them (root or CAP_SYS_NICE; unchanged where not permitted). Both modes run at the
same priority: it changes what disturbs the rounds, not what is measured. In its one loaded
run (--nice -10, load 5) it did not narrow the intervals, hence the default 0.

``--pin one`` puts both ranks (and every thread they start) on the first CPU, ``--pin each``
rank r on CPU r; ``--pin none`` (the default) leaves placement to the scheduler. On the loaded
2-core machine (2026-12-02 14:23-14:32 UTC, load 7-11, pipeline, --budget 90) ``--pin each``
gave A/A intervals 4-8 times narrower than ``none`` at the same load (ratio of totals
+-2.5-5.4% against +-20%, robust +-1.5-2.8% against +-8%): use it for the pipeline's verdict.
It is not the default: not measured for the other workloads yet (docs/performance.md).
``--duration 0`` gives the first version's fixed steps per round (``DEFAULTS``) and 90 sets.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

from common import (bootstrap_ratio_ci, free_port, load_of, median_ci, pin_cpus, thread_cpu_s,
                    traced_gloo_rank, uptime, warn_without_accel)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: workload -> (warm-up steps, steps per round with --duration 0: the rounds of the first
#: version, 5-50 ms here, at the scale of the scheduler's time slices: too short to resolve 2%)
DEFAULTS = {"ddp": (10, 8), "fsdp2": (4, 2), "pipeline": (5, 3), "async_loop": (20, 25),
            "soak": (2, 1)}
WORKLOADS = list(DEFAULTS)
#: target wall time of one round (s): the steps per round are calibrated to it from the
#: untraced copy's step time after the warm-up (both ranks' slower), at least 1
DURATION = 0.1
#: ... with --rt 0 (the fair scheduler): 0.4 s, the design of sessions 7-13 (shorter rounds
#: were at the scale of its time slices there)
DURATION_FAIR = 0.4
#: wall time of the rounds per workload (s) that sets the default number of sets:
#: BUDGET / (3 * DURATION), a multiple of 6 (the balanced order below), at least 6
BUDGET = 90.0
ROUNDS = 90   # sets of rounds when neither --rounds nor a duration is given (--duration 0)
#: the order of the three rounds in six consecutive sets (cycling): each mode first, second and
#: last twice, and each mode right after each other mode 3 times in the chain of 18 rounds
#: (cyclically), so whatever a round leaves behind (the writer's polling after a traced round,
#: caches) lands on the untraced and the control rounds alike. The first version rotated three
#: orders (u t c, t c u, c u t): control followed traced in 2 sets of 3, untraced in 1.
ORDERS = (("untraced", "traced", "control"), ("untraced", "control", "traced"),
          ("control", "traced", "untraced"), ("traced", "untraced", "control"),
          ("traced", "control", "untraced"), ("control", "untraced", "traced"))
#: workloads whose traced copy must be built with tracing on (DDP: commtrace's comm hook)
SEPARATE_COPY = ("ddp",)
PIN = "none"
NICE = 0
GROUP_NICE = 0
#: SCHED_FIFO priority of the ranks (0: the fair scheduler, the design before session 14)
RT = 1
SEED = 20261203
TARGET_RATIO = 1.02   # issue 20: DDP, FSDP2 and pipeline traced <= 2% over untraced (upper bound)
SOAK_TARGET = 1.05    # the soak's tight loop: <= +5%


def _sample(name: str):
    spec = importlib.util.spec_from_file_location(f"_sample_{name}",
                                                  os.path.join(ROOT, "samples", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _build(workload: str, rank: int, world: int):
    """(state, step function) of one workload on this rank, after init_process_group."""
    import torch
    import torch.distributed as dist

    dev = torch.device("cpu")
    if workload == "ddp":
        m = _sample("ddp_mlp")
        return m.setup(m.parse_args(["--straggler-ms", "0"]), rank, world, dev), m.train_step
    if workload == "fsdp2":
        m = _sample("fsdp2")
        return m.setup(m.parse_args([]), rank, world, dev), m.train_step
    if workload == "pipeline":
        m = _sample("pipeline")
        return m.setup(m.parse_args([]), rank, world, dev), m.train_step
    if workload == "async_loop":
        ts = [torch.ones(256) for _ in range(8)]

        def step(state, i):
            works = [dist.all_reduce(t, async_op=True) for t in ts]
            for w in works:
                w.wait()
        return None, step
    if workload == "soak":
        t = torch.ones(1)

        def step(state, i):
            for _ in range(200):
                dist.all_reduce(t)
        return None, step
    raise ValueError(f"unknown workload {workload!r}")


def _ddp_group_setter(state):
    """For the DDP sample's copy built with tracing on: a function `set(mode)` that hands its
    Reducer commtrace's recording group for "traced" and DDP's own group for any other mode,
    or None where commtrace did not record it through that group (no C++ module: a comm hook,
    which cannot be taken off a model; separate copies then)."""
    ddp = state.get("ddp") if isinstance(state, dict) else None
    gpg = getattr(ddp, "__dict__", {}).get("_commtrace_pg") if ddp is not None else None
    upd = getattr(getattr(ddp, "reducer", None), "_update_process_group", None)
    if gpg is None or upd is None:
        return None
    own = ddp.process_group
    return lambda mode: upd(gpg if mode == "traced" else own)


def _set_nice(nice: int):
    """Give this rank (its main thread, before it starts any: gloo's and the writer thread
    inherit it) the nice value `nice`; the nice value it has after, None where not permitted
    (a negative one needs CAP_SYS_NICE) or not 0 asked. Linux nice values are per thread."""
    if not nice or not hasattr(os, "setpriority"):
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        return os.getpriority(os.PRIO_PROCESS, 0)
    except OSError:
        return None


def _set_group_nice(nice: int):
    """Put this rank (a forked child, before it starts any thread) in a session of its own and
    give that session's autogroup the nice value `nice`; the autogroup line it has after
    (/proc/self/autogroup, e.g. "/autogroup-4188 nice -20"), None where not asked or not
    possible. With the kernel's autogroups on (/proc/sys/kernel/sched_autogroup_enabled; cgroup
    v1 cpu at the root, as on the 2-core machine of these figures) the scheduler shares a CPU
    fairly between sessions first, and a thread's nice value counts only within its session:
    other people's tests under `nice -n 10` took a full session's share from the ranks, and
    --nice (per thread) did nothing against them. A session's nice weighs it against the
    other sessions; the threads of a rank keep their nice values relative to each other (the
    writer thread's COMMTRACE_WRITER_NICE too). A negative value needs CAP_SYS_NICE."""
    if not nice:
        return None
    try:
        os.setsid()
    except OSError:
        pass   # already a session leader
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
        with open("/proc/self/autogroup") as f:
            return f.read().strip()
    except OSError:
        return None


def _set_rt(prio: int):
    """Run this rank (a forked child, before it starts any thread: gloo's and the writer thread
    inherit it) under SCHED_FIFO at priority `prio`: a rank that wakes (its peer's message
    arrived) then takes a CPU from any ordinary task at once, where the fair scheduler lets
    the task running there finish its slice first. The policy after, None where not asked or
    not permitted (CAP_SYS_NICE). The kernel's RT throttling (sched_rt_runtime_us, 0.95 s of
    each second by default) still leaves other tasks a share."""
    if not prio or not hasattr(os, "sched_setscheduler"):
        return None
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
        return f"SCHED_FIFO {os.sched_getparam(0).sched_priority}"
    except OSError:
        return None


def _rt_permitted(prio: int) -> bool:
    """Whether this process may run under SCHED_FIFO at `prio` (tried on this thread, then
    put back to what it was)."""
    if not hasattr(os, "sched_setscheduler"):
        return False
    try:
        pol, par = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
        os.sched_setscheduler(0, pol, par)
        return True
    except OSError:
        return False


def _nice_of(thread):
    try:
        return os.getpriority(os.PRIO_PROCESS, thread.native_id)
    except Exception:
        return None


def _policy_of(thread):
    """The scheduling policy of `thread` ("SCHED_OTHER", "SCHED_FIFO", ...), None if unknown:
    under --rt the ranks run SCHED_FIFO, where nice values mean nothing; commtrace's writer
    thread leaves it for SCHED_OTHER (session 25)."""
    try:
        pol = os.sched_getscheduler(thread.native_id)
    except Exception:
        return None
    names = {getattr(os, n): n for n in ("SCHED_OTHER", "SCHED_FIFO", "SCHED_RR", "SCHED_BATCH",
                                          "SCHED_IDLE") if hasattr(os, n)}
    return names.get(pol, str(pol))


MODES = ("untraced", "traced", "control")

#: --control variant:NAME (session 29): the control's rounds traced too, with one of the C fast
#: path's switches set to its earlier behaviour for the round (`name(on)` -> the previous
#: setting): traced / control is then what that change gives, in one run, on the same copy,
#: free of the run-to-run drift of two traced / untraced figures (+-1 point here). The
#: switch is the fast path's, so the variant needs the C module.
VARIANTS = {
    # the step marker sets the step through the recorder's property (five Python frames per
    # step, as before session 29) instead of behind it in C
    "step-property": ("step_direct", False),
    # a C++ hook's op released at the writer's next service, not at its stamp (session 17)
    "stamp-hold": ("stamp_release", False),
    # DDP's buckets as pending ops with Python rows on the training thread (as before session
    # 30), not as C records whose rows the writer builds
    "ddp-pending": ("ddp_direct", False),
}


def _variant_switch(control: str):
    """For --control variant:NAME: a function `use(on)` that sets the variant for a round
    (True) and restores the default (False); None for the other controls."""
    if not control.startswith("variant:"):
        return None
    from commtrace.capture import recorder as R

    fname, value = VARIANTS[control.split(":", 1)[1]]
    f = getattr(R._cfast, fname, None) if R._cfast is not None else None
    if f is None:
        raise RuntimeError(f"--control {control}: the C fast path's {fname}() is not here")
    default = f(value)
    f(default)

    def use(on: bool) -> None:
        f(value if on else default)
    return use


def _calibrate(fn, st, duration: float) -> float:
    """Seconds per step of `fn` on the slower rank: the median of single steps' times, over 4,
    8, 16, ... steps (after 4 untimed ones) until they take a quarter of `duration` there and
    at least 0.1 s. The median, not the mean: timed right after the copies were built, a few
    slow steps (the writer's first part, a rank's caches cold) made the DDP step come out at
    1.4-3 times its time in the rounds. Every rank runs the same steps (the decision to go on
    is taken on the ranks' maximum): a step's collectives must match across ranks."""
    import torch
    import torch.distributed as dist

    n = 4
    for i in range(n):
        fn(st, i)   # not timed: the copies built after this one left its caches cold
    while True:
        dist.barrier()
        stamps = _steps(fn, st, n)
        el = torch.tensor([stamps[-1] - stamps[0]], dtype=torch.float64)
        dist.all_reduce(el, op=dist.ReduceOp.MAX)
        if el.item() >= max(duration / 4, 0.1) or n >= 4096:
            med = torch.tensor([statistics.median(b - a for a, b in zip(stamps, stamps[1:]))],
                               dtype=torch.float64)
            dist.all_reduce(med, op=dist.ReduceOp.MAX)
            return med.item()
        n *= 2


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_ticks() -> tuple:
    """(busy, steal) CPU time of the whole machine since boot, s, from /proc/stat's first line:
    busy is all but idle and iowait (steal included); (0, 0) where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        v = v[:8]   # user .. steal (guest time is counted in user already)
        return ((sum(v) - v[3] - v[4]) / _CLK_TCK, (v[7] if len(v) > 7 else 0) / _CLK_TCK)
    except Exception:
        return (0.0, 0.0)


def _steps(fn, st, steps: int, plant_s: float = 0.0) -> list:
    """Run `steps` steps of `fn`; the perf_counter before the first and after each step. With
    plant_s > 0 each step is followed by a busy loop of plant_s s of this thread's CPU time (a
    known slowdown planted in one arm, to check that an estimator recovers it)."""
    pc = time.perf_counter
    stamps = [pc()]
    if plant_s > 0:
        tt = time.thread_time
        for i in range(steps):
            fn(st, i)
            end = tt() + plant_s
            while tt() < end:
                pass
            stamps.append(pc())
    else:
        for i in range(steps):
            fn(st, i)
            stamps.append(pc())
    return stamps


def _rank(rank, world, port, workload, out, warmup, steps, rounds, sync, q, pin="none",
          duration=0.0, control="mirror", nice=0, aa=False, plant=0.0, per_step=False,
          group_nice=0, rt=0, gap=0.0, seed=None, ddp_copies=False) -> None:
    """One rank (a forked child): puts its round times and writer figures on `q`.

    Modes: "untraced" (a copy of the workload built, warmed up and run with the recorder off),
    "traced" (run with the recorder on: the same copy, except for DDP, whose traced copy is
    built with the recorder on so that it gets commtrace's comm hook) and "control", a second
    untraced copy: control / untraced is what the comparison of two copies gives with no
    tracing at all (this run's resolution, and the difference between two copies).

    With control="mirror" the control is run the way the traced mode is: on the untraced
    copy where traced is, a second copy for DDP; control="copy" always builds a second copy
    (the first version's design: it shows the difference between two copies).
    steps=None: calibrated, duration / the untraced copy's step time (the slower rank's)."""
    same_copy = workload not in SEPARATE_COPY
    same_control = same_copy and (control == "mirror" or control.startswith("variant:"))
    try:
        import threading

        import torch.distributed as dist

        import commtrace
        from commtrace.capture import recorder as R

        group = _set_group_nice(group_nice)
        policy = _set_rt(rt)
        cpus = pin_cpus(rank, pin)
        nice_got = _set_nice(nice)
        rec = traced_gloo_rank(out, rank, world, port)
        copies = {}
        for mode in ("untraced", "traced", "control"):
            if mode == "traced" and aa:
                continue   # --aa: the "traced" arm is a second control (set below)
            if (mode == "traced" and same_copy) or (mode == "control" and same_control):
                # the untraced copy, with the recorder on: no difference between two copies
                # of the workload enters the comparison (wrappers with the recorder off call
                # torch's function at once: about 0.1 us per op); the control mirrors it
                copies[mode] = copies["untraced"]
                continue
            R._set_recorder(rec if mode == "traced" else None)
            st, fn = _build(workload, rank, world)
            for i in range(warmup):
                fn(st, i)
            copies[mode] = (st, fn)
        if aa:
            copies["traced"] = copies["control"]
        # DDP with commtrace's recording group (its C++ module built): one copy for every mode,
        # its Reducer handed the recording group for the traced rounds and DDP's own group for
        # the others, so that no difference between two copies of the model enters the
        # comparison (session 24: copies differ by up to 5%); separate copies otherwise
        set_group = None if aa or ddp_copies else _ddp_group_setter(copies["traced"][0])
        if set_group is None and (control == "group" or (
                control.startswith("variant:") and not same_copy)):
            raise RuntimeError(f"--control {control}: this DDP copy is not recorded through "
                               "commtrace's recording group")
        if set_group is not None:
            copies["untraced"] = copies["control"] = copies["traced"]
            set_group("untraced")
        variant = _variant_switch(control)
        writer = next((t for t in threading.enumerate() if t.name == "commtrace-writer"), None)
        R._set_recorder(None)
        # the warm-ups' rows written now, before the calibration (the first part's writing,
        # pyarrow's import with it, on a CPU the ranks share, made it slow: a DDP step of
        # 7.2 ms calibrated for 2.4 ms in the rounds), and the writer's CPU below is the rounds'
        rec.flush()
        dist.barrier()
        calib_s = None
        if steps is None:
            st, fn = copies["untraced"]
            calib_s = _calibrate(fn, st, duration)
            steps = max(1, round(duration / calib_s))
            dist.barrier()
        elif plant:
            st, fn = copies["untraced"]
            calib_s = _calibrate(fn, st, 0.4)
            dist.barrier()
        plant_s = plant * calib_s if plant else 0.0
        step_walls = []
        if sync:
            # The traced rounds write a part per flush interval of traced time, as the writer
            # thread of a traced run does per interval of its time; the writer thread here
            # writes none on its own schedule (its interval would run in untraced rounds too:
            # three times the parts per traced second, each a third of the rows). It still
            # polls, releases and services the pending ops.
            rec.auto_flush = False
            rec.wake()
        ws0 = dict(getattr(rec, "writer_stats", {}))
        t_rounds0 = time.perf_counter()
        w_cpu0 = thread_cpu_s(writer) if writer is not None else None
        pc, cpu = time.perf_counter, time.process_time
        times = {m: [] for m in MODES}
        cpus_s = {m: [] for m in MODES}   # the process's CPU time (all its threads) per step
        sync_cpu = 0.0
        n_sync = 0
        interval = max(0.05, float(rec.config.flush_interval))
        since = 0.0   # traced time since the last flush
        windows = []
        cwindows = []   # the control's rounds where they are traced too (variant:NAME)
        # every round in the order run: (mode, start s from the first round, wall per step,
        # process CPU per step, wall of the flush it wrote, s); the paired estimator uses it
        chain = []
        lock = rec._write_lock
        set_orders = _set_orders(rounds, seed)
        wc_start, wc_end = [], []

        def wcpu():
            return (thread_cpu_s(writer) or 0.0) if writer is not None else 0.0
        for r in range(rounds):
            for mode in set_orders[r]:   # balanced and randomized: see _set_orders
                st, fn = copies[mode]
                if set_group is not None:
                    # (--control group: the control on the recording group, recorder off)
                    set_group("traced" if mode == "control" and (control == "group" or variant)
                              else mode)
                R._set_recorder(None)
                dist.barrier()
                fw = 0.0
                k0 = _cpu_ticks()
                wc_start.append(wcpu())
                if (mode != "traced" and not (mode == "control" and variant)) or aa:
                    lock.acquire()   # no flush during an untraced round (it waits for a traced one)
                    try:
                        c0, t0 = cpu(), pc()
                        stamps = _steps(fn, st, steps, plant_s if mode == "traced" else 0.0)
                        t1, c1 = pc(), cpu()
                    finally:
                        lock.release()
                else:
                    if variant:   # --control variant:NAME: the control traced, with the variant
                        variant(mode == "control")
                    R._set_recorder(rec)
                    w0 = time.time_ns()
                    c0, t0 = cpu(), pc()
                    stamps = _steps(fn, st, steps, plant_s)
                    w1 = time.time_ns()
                    since += pc() - t0
                    if sync and (since >= interval or r == rounds - 1):
                        # a part per flush interval of traced time, and the last round's, all
                        # written inside a traced round's time (on the training thread)
                        s0, f0 = time.thread_time(), pc()
                        rec.flush()
                        fw = pc() - f0
                        sync_cpu += time.thread_time() - s0
                        n_sync += 1
                        since = 0.0
                    t1, c1 = pc(), cpu()
                    if mode == "traced":   # (the ops per step: the traced rounds')
                        windows.append((w0, w1))
                    else:
                        cwindows.append((w0, w1))
                    R._set_recorder(None)
                    if variant:
                        variant(False)
                k1 = _cpu_ticks()
                times[mode].append((t1 - t0) / steps)
                cpus_s[mode].append((c1 - c0) / steps)
                # ... and the machine's busy and steal CPU time over the round (/proc/stat, s)
                chain.append([mode, t0 - t_rounds0, (t1 - t0) / steps, (c1 - c0) / steps, fw,
                              k1[0] - k0[0], k1[1] - k0[1], 0.0])
                if per_step:
                    step_walls.append([b - a for a, b in zip(stamps, stamps[1:])])
                # the writer thread's CPU from the end of this round to the start of the next
                # (the gap, the barrier) is charged to this round below, whatever its mode
                wc_end.append(wcpu())
                if gap > 0:
                    # under SCHED_FIFO at least an eighth of the round: RT throttling (0.95 s
                    # of each second, sched_rt_runtime_us) stops the ranks for 50 ms otherwise
                    time.sleep(max(gap, (t1 - t0) / 8) if policy else gap)
        wc_end.append(wcpu())
        chain = _charge_spill(chain, wc_start, wc_end, steps)
        times = {m: [c[2] for c in chain if c[0] == m] for m in MODES}
        w_cpu = thread_cpu_s(writer) if writer is not None else None
        t_rounds = time.perf_counter() - t_rounds0
        ws = {k: v - ws0.get(k, 0) for k, v in getattr(rec, "writer_stats", {}).items()}
        nice = _nice_of(writer)
        wpolicy = _policy_of(writer)
        nice_added = None if nice is None else nice - os.getpriority(os.PRIO_PROCESS, 0)
        c0 = time.thread_time()
        rec.flush()   # what the rounds left queued, written on this thread (counted below)
        final_cpu = time.thread_time() - c0
        R._set_recorder(rec)
        commtrace.disable()
        dist.barrier()
        dist.destroy_process_group()
        q.put({"rank": rank, "times": times, "cpu": cpus_s, "windows": windows,
               "cwindows": cwindows,
               "sync_cpu_s": sync_cpu, "sync_flushes": n_sync, "cpus": cpus,
               "writer_cpu_s": (w_cpu - w_cpu0) if w_cpu is not None and w_cpu0 is not None
               else None, "final_flush_cpu_s": final_cpu, "writer_nice": nice, "writer_policy": wpolicy,
               "writer_nice_added": nice_added, "writer_stats": ws, "rounds_s": t_rounds,
               "traced_s": sum(times["traced"]) * steps, "steps": steps, "calib_s": calib_s,
               "chain": chain, "nice": nice_got, "plant_s": plant_s, "step_walls": step_walls,
               "autogroup": group, "policy": policy})
    except BaseException as e:  # the parent reports it
        q.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})
        raise


def _set_orders(rounds: int, seed: int | None) -> list:
    """The order of the three rounds of each set: ORDERS in a random order within each block of
    six sets (seeded: every rank draws the same), or cycling through them with seed=None (the
    design up to session 13). Within a block each mode is first, second and last twice, as in
    the cycle; the draw makes whatever a round leaves to the next one, two, ... (the writer's
    after-effects, a periodic job elsewhere in step with the cycle) fall on the untraced and
    control rounds alike in distribution, at any lag: the cycle balanced the lag of one round
    only (a traced round came two rounds before an untraced one twice as often as before a
    control one), and in two runs of 0.1 s rounds the control's interval excluded 1."""
    if seed is None:
        return [ORDERS[r % len(ORDERS)] for r in range(rounds)]
    import random

    rng = random.Random(seed)
    out = []
    while len(out) < rounds:
        block = list(ORDERS)
        rng.shuffle(block)
        out.extend(block)
    return out[:rounds]


def _charge_spill(chain: list, wc_start: list, wc_end: list, steps: int) -> list:
    """The rounds of `chain` (lists: mode, start, wall per step, ..., index 7 the spill) with
    the writer thread's CPU time from the end of each round to the start of the next (the
    last: to `wc_end[-1]`, read after the last gap) charged to it: added to its wall time per
    step and kept at index 7 (s). wc_start[j] / wc_end[j]: the writer's CPU clock at round j's
    start and end (len(wc_end) == len(chain) + 1)."""
    out = []
    for j, c in enumerate(chain):
        nxt = wc_start[j + 1] if j + 1 < len(wc_start) else wc_end[-1]
        spill = max(0.0, nxt - wc_end[j])
        c = list(c)
        c[7] = spill
        c[2] += spill / steps
        out.append(tuple(c))
    return out


def robust_ratio(x: list, u: list, f: list | None = None) -> float:
    """The paired robust ratio of sets' rounds: the median over the sets of x_i' / u_i, where
    x_i' is the round's step time less its flush (f_i: the flush's wall time per step of that
    round, 0 for the control), plus the flushes' total time over the untraced total:
    ``median((x_i - f_i) / u_i) + sum(f) / sum(u)``. The median is not moved by the rounds that
    other processes slowed (on this 2-core machine a few rounds of every run take 2-10 times
    their neighbours' time, in any mode); the flushes, which land in a few traced rounds, are
    charged in full, at their measured time, not skipped with those rounds."""
    f = f or [0.0] * len(x)
    return (statistics.median((a - b) / c for a, b, c in zip(x, f, u))
            + sum(f) / sum(u))


def robust_ratio_ci(x: list, u: list, f: list | None = None, n: int = 2000,
                    seed: int = 20261202) -> list:
    """95% percentile-bootstrap interval of :func:`robust_ratio`, resampling the sets."""
    import random

    rng = random.Random(seed)
    k = len(x)
    f = f or [0.0] * k
    st = []
    for _ in range(n):
        idx = [rng.randrange(k) for _ in range(k)]
        st.append(robust_ratio([x[i] for i in idx], [u[i] for i in idx], [f[i] for i in idx]))
    st.sort()
    return [st[int(0.025 * n)], st[min(n - 1, int(0.975 * n))]]


def _flush_per_step(res: list, rounds: int, steps: int) -> list:
    """Per set: the wall time per step of the flush its traced round wrote (both ranks'
    mean; 0 where none), from the ranks' chains."""
    out = []
    for r in res:
        fl = [c[4] / steps for c in r.get("chain") or [] if c[0] == "traced"]
        out.append(fl if len(fl) == rounds else [0.0] * rounds)
    return [statistics.mean(v) for v in zip(*out)]


def _ops_in_windows(out: str, res: list, key: str = "windows") -> int:
    """Op rows enqueued in the traced rounds (all ranks; key "cwindows": the control's
    rounds, where they are traced too)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    t = ds.dataset(out, format="parquet", partitioning="hive").to_table(
        columns=["kind", "rank", "t_enqueue_ns"])
    ops = t.filter(pc.equal(t["kind"], "op"))
    n = 0
    for r in res:
        e = ops.filter(pc.equal(ops["rank"], r["rank"]))["t_enqueue_ns"]
        for lo, hi in r.get(key, ()):
            n += pc.sum(pc.and_(pc.greater_equal(e, lo), pc.less(e, hi))).as_py() or 0
    return n


def run_workload(workload: str, rounds: int, warmup: int, steps: int | None, timeout: float,
                 sync: bool = True, pin: str = "none", duration: float = 0.0,
                 control: str = "mirror", nice: int = 0, aa: bool = False, plant: float = 0.0,
                 keep_steps: bool = False, group_nice: int = 0, rt: int = 0,
                 gap: float = 0.0, seed: int | None = None, ddp_copies: bool = False) -> dict:
    """One 2-rank job of `rounds` sets of rounds (untraced, traced, control); the paired ratios
    and figures. steps=None: calibrated to rounds of `duration` seconds."""
    import multiprocessing as mp
    import shutil

    up0 = uptime()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    out = tempfile.mkdtemp(prefix="commtrace-steps-")
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, workload, out, warmup, steps, rounds,
                                             sync, q, pin, duration, control, nice, aa, plant,
                                             keep_steps, group_nice, rt, gap, seed,
                                             ddp_copies or control == "copy"))
             for r in range(2)]
    t_start = time.perf_counter()
    for p in procs:
        p.start()
    res = []
    try:
        for _ in procs:
            res.append(q.get(timeout=timeout))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errs = [r["error"] for r in res if "error" in r]
    if errs:
        raise RuntimeError(f"{workload}: {errs[0]}")
    up1 = uptime()
    wall_s = time.perf_counter() - t_start
    res.sort(key=lambda r: r["rank"])
    steps = res[0]["steps"]
    n_ops = 0 if aa else _ops_in_windows(out, res)
    # the writer's CPU serves every traced round's rows: the control's too with variant:NAME
    n_written = n_ops + (_ops_in_windows(out, res, "cwindows")
                         if control.startswith("variant:") and not aa else 0)
    shutil.rmtree(out, ignore_errors=True)
    per = {m: [statistics.mean(r["times"][m][i] for r in res) for i in range(rounds)]
           for m in MODES}
    pcpu = {m: [statistics.mean(r["cpu"][m][i] for r in res) for i in range(rounds)]
            for m in MODES}
    ratios = [t / u for t, u in zip(per["traced"], per["untraced"])]
    vr = ([t / c for t, c in zip(per["traced"], per["control"])]
          if control.startswith("variant:") else None)
    flush = _flush_per_step(res, rounds, steps)
    med = statistics.median(ratios)
    # The figure: total traced over total untraced time (the writer's flushes land in a few
    # rounds, which a median of per-pair ratios would skip), CI by resampling the pairs.
    total = sum(per["traced"]) / sum(per["untraced"])
    total_ci = bootstrap_ratio_ci(per["traced"], per["untraced"])
    u_ms = statistics.median(per["untraced"]) * 1e3
    per_step = n_ops / (len(res) * rounds * steps)
    cpu = [(r.get("writer_cpu_s") or 0.0) + r.get("final_flush_cpu_s", 0.0)
           + r.get("sync_cpu_s", 0.0) for r in res]
    return {
        "workload": workload, "rounds": rounds, "writer": "sync" if sync else "async",
        "warmup_steps": warmup, "steps_per_round": steps, "pin": pin,
        # the ranks' nice value asked for, and what each got (None: not permitted, unchanged)
        "nice": nice, "nice_got": [r.get("nice") for r in res],
        # the round's target wall time (0: steps per round fixed), the step time the steps
        # were calibrated from (the slower rank's, s; None when --steps was given), the
        # control's copy ("mirror": as traced, "copy": a second copy) and the job's wall time
        "round_target_s": duration if res[0].get("calib_s") is not None else 0.0, "calibrated_step_s":
        res[0].get("calib_s"), "control": control, "wall_s": wall_s,
        "round_ms": statistics.median(per["untraced"]) * steps * 1e3,
        "cpus": [r.get("cpus") for r in res],
        "untraced_step_ms": u_ms, "traced_step_ms": statistics.median(per["traced"]) * 1e3,
        "control_step_ms": statistics.median(per["control"]) * 1e3,
        "ratio": total, "ratio_ci95": total_ci,
        "median_ratio": med, "median_ratio_ci95": median_ci(ratios), "ratios": ratios,
        # the same comparison between two untraced copies: 1 up to this run's resolution
        "control_ratio": sum(per["control"]) / sum(per["untraced"]),
        "control_ratio_ci95": bootstrap_ratio_ci(per["control"], per["untraced"]),
        # the per-set control / untraced ratios (the spread the interval above comes from)
        "control_ratios": [c / u for c, u in zip(per["control"], per["untraced"])],
        # --control variant:NAME: traced / control, what the change gives over its variant (both
        # traced, in one run), and the median of the per-set ratios [median, lo, hi]; None for
        # the other controls
        "variant_ratio": sum(per["traced"]) / sum(per["control"]) if vr else None,
        "variant_ratio_ci95": bootstrap_ratio_ci(per["traced"], per["control"]) if vr else None,
        "variant_median_ratio_ci95": [statistics.median(vr), *median_ci(vr)] if vr else None,
        # the paired robust estimator (robust_ratio: median over the sets of the step time
        # less the flush, plus the flushes in full) and its A/A check on the control
        "robust_ratio": robust_ratio(per["traced"], per["untraced"], flush),
        "robust_ratio_ci95": robust_ratio_ci(per["traced"], per["untraced"], flush),
        "robust_control_ratio": robust_ratio(per["control"], per["untraced"]),
        "robust_control_ratio_ci95": robust_ratio_ci(per["control"], per["untraced"]),
        "flush_share": sum(flush) / sum(per["untraced"]),
        # the process's CPU time (training, backend and writer threads) per step, both ranks
        "untraced_cpu_ms": sum(pcpu["untraced"]) / rounds * 1e3,
        "cpu_ratio": sum(pcpu["traced"]) / sum(pcpu["untraced"]),
        "cpu_ratio_ci95": bootstrap_ratio_ci(pcpu["traced"], pcpu["untraced"]),
        "control_cpu_ratio": sum(pcpu["control"]) / sum(pcpu["untraced"]),
        "control_cpu_ratio_ci95": bootstrap_ratio_ci(pcpu["control"], pcpu["untraced"]),
        "added_us_per_step": (total - 1.0) * u_ms * 1e3,
        "ops_per_step_per_rank": per_step,
        "added_us_per_op": (total - 1.0) * u_ms * 1e3 / per_step if per_step else None,
        "writer_cpu_us_per_op": sum(cpu) / n_written * 1e6 if n_written else None,
        # its parts: the writer thread's CPU, the flushes of traced rounds (count, CPU), the last
        "writer_thread_cpu_s": [r.get("writer_cpu_s") for r in res],
        "sync_flushes": [r.get("sync_flushes") for r in res],
        "sync_flush_cpu_s": [r.get("sync_cpu_s") for r in res],
        "final_flush_cpu_s": [r.get("final_flush_cpu_s") for r in res],
        "writer_nice": [r.get("writer_nice") for r in res],
        "writer_policy": [r.get("writer_policy") for r in res],
        # the writer thread's own counters over the rounds (wake-ups, of them rung, polling
        # cycles, services, timed flushes), each rank, and the rounds' wall and traced time
        "writer_stats": [r.get("writer_stats") for r in res],
        "rounds_s": [r.get("rounds_s") for r in res],
        "traced_s": [r.get("traced_s") for r in res],
        "writer_nice_added": [r.get("writer_nice_added") for r in res],
        # each rank's rounds in the order run (mode, start s, wall per step, CPU per step, wall
        # of its flush s): the raw data of every figure above, for other estimators
        "chain": [r.get("chain") for r in res],
        # --aa: the "traced" arm untraced too (a second A/A comparison); --plant: the busy loop
        # per step of that arm (s of thread CPU, each rank) and its share of the calibrated step
        "group_nice": group_nice, "autogroup": [r.get("autogroup") for r in res],
        "rt": rt, "policy": [r.get("policy") for r in res], "gap_s": gap,
        # the seed of the sets' orders (None: the fixed cycle of ORDERS)
        "order_seed": seed,
        # the writer thread's CPU between rounds charged to the round before (s, all rounds)
        "spill_s": {m: sum(c[7] for r in res for c in r["chain"] if c[0] == m) for m in MODES},
        "aa": aa, "plant": plant, "plant_s": res[0].get("plant_s", 0.0),
        "step_walls": [r.get("step_walls") for r in res] if keep_steps else None,
        "load_start": load_of(up0), "load_end": load_of(up1), "uptime_start": up0, "uptime_end": up1,
    }


def report(r: dict) -> list[str]:
    """The lines printed for one workload, with the verdict on its target."""
    lo, hi = r["ratio_ci95"]
    target = SOAK_TARGET if r["workload"] == "soak" else (
        TARGET_RATIO if r["workload"] in ("ddp", "fsdp2", "pipeline") else None)
    verdict = ""
    if target is not None:
        verdict = (f"; target <= {100 * (target - 1):.0f}%: "
                   + ("met" if hi <= target else "NOT shown" if lo <= target else "missed"))
        if hi < 1.0:
            # tracing cannot make a step faster: noise, or a difference between the two copies
            verdict += " (but traced ran faster than untraced: not resolved by this run)"
    per_op = r["added_us_per_op"]
    w = r["writer_cpu_us_per_op"]
    clo, chi = r["control_ratio_ci95"]
    plo, phi = r["cpu_ratio_ci95"]
    qlo, qhi = r["control_cpu_ratio_ci95"]
    return [
        f"{r['workload']}: {r['rounds']} sets of rounds x {r['steps_per_round']} steps "
        + (f"(calibrated to {1e3 * r['round_target_s']:.0f} ms rounds from a "
           f"{1e3 * r['calibrated_step_s']:.3f} ms step) " if r.get("calibrated_step_s") else "")
        + f"(untraced, traced, control{' = a second copy' if r.get('control') == 'copy' else ' = the recording group, recorder off' if r.get('control') == 'group' else ''}; "
        f"2 ranks, gloo, rows written by "
        f"{'the traced rounds' if r['writer'] == 'sync' else 'the writer thread'}; pinned: "
        f"{r['pin']}; {_sched_text(r)}), load average {r['load_start']} -> {r['load_end']}, "
        f"{r.get('wall_s', 0):.0f} s" + (" [A/A: tracing off in every arm" + (
            f", traced arm planted with {100 * r['plant']:g}% of the step in busy CPU"
            if r.get("plant") else "") + "]" if r.get("aa") else
            f" [traced arm planted with {100 * r['plant']:g}% of the step in busy CPU]"
            if r.get("plant") else ""),
        f"  untraced step {r['untraced_step_ms']:.3f} ms, traced {r['traced_step_ms']:.3f} ms, "
        f"control {r['control_step_ms']:.3f} ms (medians of the rounds); "
        f"{r['ops_per_step_per_rank']:.1f} ops per step per rank",
        f"  traced / untraced step time: {r['ratio']:.4f} [95% CI {lo:.4f}, {hi:.4f}] "
        f"({100 * (r['ratio'] - 1):+.2f}%, {r['added_us_per_step']:+.1f} us per step"
        + (f", {per_op:+.1f} us per op" if per_op is not None else "") + ")" + verdict,
        (f"  control / untraced step time (the recording group's path, no row recorded): "
         if r.get("control") == "group" else
         f"  control / untraced step time (traced with {r['control']}): "
         if str(r.get("control")).startswith("variant:") else
         f"  control / untraced step time (untraced twice: this run's resolution): ")
        + f"{r['control_ratio']:.4f} [95% CI {clo:.4f}, {chi:.4f}]",
    ] + _variant_lines(r) + [
        f"  process CPU per step (all threads): untraced {r['untraced_cpu_ms']:.3f} ms; traced / "
        f"untraced {r['cpu_ratio']:.4f} [95% CI {plo:.4f}, {phi:.4f}]; control / untraced "
        f"{r['control_cpu_ratio']:.4f} [{qlo:.4f}, {qhi:.4f}]",
        f"  (median of the per-pair ratios {r['median_ratio']:.4f} [95% CI "
        f"{r['median_ratio_ci95'][0]:.4f}, {r['median_ratio_ci95'][1]:.4f}])",
    ] + _robust_lines(r, target) + [
        "  writer thread CPU per op: " + (f"{w:.2f} us" if w is not None else "n/a")
        + f" (writer nice {r['writer_nice']}, policy {r.get('writer_policy')})",
    ] + _wakeup_lines(r)


def _variant_lines(r: dict) -> list[str]:
    """--control variant:NAME: the change's own figure, traced / control (both traced)."""
    if r.get("variant_ratio") is None:
        return []
    lo, hi = r["variant_ratio_ci95"]
    m, mlo, mhi = r["variant_median_ratio_ci95"]
    return [f"  traced / control (this code over {r['control']}, both traced): "
            f"{r['variant_ratio']:.4f} [95% CI {lo:.4f}, {hi:.4f}] "
            f"({1e3 * (r['variant_ratio'] - 1) * r['control_step_ms']:+.1f} us per step); "
            f"median of the per-set ratios {m:.4f} [{mlo:.4f}, {mhi:.4f}]"]


def _sched_text(r: dict) -> str:
    """How the ranks were scheduled, for the report's first line."""
    pol = [p for p in r.get("policy") or [] if p]
    if r.get("rt") and len(pol) == len(r.get("policy") or []):
        text = f"{pol[0]}, {1e3 * r.get('gap_s', 0):.0f} ms gaps"
    elif r.get("rt"):
        text = f"fair scheduler (SCHED_FIFO {r['rt']} not permitted)"
    else:
        text = "fair scheduler"
    sp = r.get("spill_s") or {}
    if any(sp.values()):
        text += (", writer CPU between rounds charged to the round before: " + ", ".join(
            f"{m} {1e3 * sp.get(m, 0.0):.1f} ms" for m in MODES))
    return text


def _robust_lines(r: dict, target) -> list[str]:
    """The paired robust estimator's figures (robust_ratio), with its own verdict."""
    if r.get("robust_ratio") is None:
        return []
    lo, hi = r["robust_ratio_ci95"]
    clo, chi = r["robust_control_ratio_ci95"]
    verdict = ""
    if target is not None:
        verdict = (f"; target <= {100 * (target - 1):.0f}%: "
                   + ("met" if hi <= target else "NOT shown" if lo <= target else "missed"))
    return [
        f"  paired robust (median over the sets of the step time less the flushes, plus the "
        f"flushes in full, {100 * r['flush_share']:.2f}% of the untraced time): traced / "
        f"untraced {r['robust_ratio']:.4f} [95% CI {lo:.4f}, {hi:.4f}]{verdict}; control / "
        f"untraced {r['robust_control_ratio']:.4f} [{clo:.4f}, {chi:.4f}]"]


def _wakeup_lines(r: dict) -> list[str]:
    """The writer thread's wake-ups per second of the rounds, by rank and cause."""
    out = []
    for i, (ws, t) in enumerate(zip(r.get("writer_stats") or [], r.get("rounds_s") or [])):
        if not ws or not t:
            continue
        out.append(f"  rank {i} writer wake-ups: {ws.get('wakeups', 0) / t:.1f}/s over {t:.1f} s "
                   f"of rounds (rung {ws.get('rung', 0)}, polling cycles {ws.get('polls', 0)}, "
                   f"services {ws.get('services', 0)}, timed flushes {ws.get('flushes', 0)})")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Warm-up steps, and steps per round with --duration 0: " + ", ".join(
            f"{w} {a}+{b}" for w, (a, b) in DEFAULTS.items()) + ".\n\nExamples:\n"
        "  python benchmarks/steps.py\n"
        "  python benchmarks/steps.py --workloads ddp fsdp2 --rounds 60 --json steps.json\n"
        "  python benchmarks/steps.py --workloads ddp fsdp2 pipeline --budget 120   # +-1%\n"
        "  python benchmarks/steps.py --workloads ddp --aa --plant 0.01   # check the estimator\n"
        "  python benchmarks/steps.py --workloads pipeline --rt 0   # the fair scheduler\n"
        "  python benchmarks/steps.py --workloads pipeline --duration 1 --budget 300\n"
        "  python benchmarks/steps.py --workloads pipeline --control copy   # two copies\n"
        "  python benchmarks/steps.py --workloads ddp --control variant:step-property   # A/B\n"
        "  COMMTRACE_WRITER_NICE=0 python benchmarks/steps.py --workloads soak\n"
        "  COMMTRACE_PURE_PYTHON=1 python benchmarks/steps.py --workloads async_loop")
    ap.add_argument("--workloads", nargs="*", default=WORKLOADS, choices=WORKLOADS)
    ap.add_argument("--rounds", type=int, default=None,
                    help="sets of rounds (untraced, traced, control) per workload (default: "
                    f"--budget / (3 x --duration), a multiple of 6; {ROUNDS} with --duration 0)")
    ap.add_argument("--duration", type=float, default=None,
                    help="target wall time of a round, s: the steps per round are calibrated "
                    f"to it after the warm-up (default {DURATION} under SCHED_FIFO, "
                    f"{DURATION_FAIR} with --rt 0; 0: the fixed steps per round of the first "
                    "version, below)")
    ap.add_argument("--budget", type=float, default=BUDGET,
                    help=f"wall time of the rounds per workload, s, that sets the default "
                    f"--rounds (default {BUDGET:.0f})")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per round (default: calibrated to --duration)")
    ap.add_argument("--control", choices=["mirror", "copy", "group"]
                    + [f"variant:{k}" for k in VARIANTS], default="mirror",
                    help="mirror (default): the control runs as the traced mode does, on the "
                    "untraced copy (a second copy for DDP); copy: always a second copy; group "
                    "(DDP through commtrace's recording group only): the control's rounds run "
                    "with the Reducer on the recording group and the recorder off (the group's "
                    "path without a row recorded: control / untraced is what that path costs, "
                    "traced / control what recording adds to it); variant:NAME: the control's "
                    "rounds traced too, with one of the C fast path's switches set to its "
                    "earlier behaviour (" + ", ".join(VARIANTS) + "): traced / control is what "
                    "that change gives, both traced, in one run")
    ap.add_argument("--ddp-copies", action="store_true",
                    help="DDP on separate copies (traced, untraced, control), the design up to "
                    "session 23; by default, where commtrace records DDP through its recording "
                    "group, one copy whose Reducer is handed that group for the traced rounds and "
                    "DDP's own group for the others")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps of each copy")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per workload")
    ap.add_argument("--writer", choices=["sync", "async"], default="sync",
                    help="sync (default, an upper bound): each traced round ends with a flush "
                    "of its rows on the training thread, inside the round's time; async: the "
                    "writer thread flushes on its own schedule (held off during untraced rounds)")
    ap.add_argument("--pin", choices=["none", "one", "each"], default=PIN,
                    help="CPU affinity of the ranks (and their threads): none, one (both ranks on "
                    "the first CPU), each (rank r on CPU r)" + f" (default {PIN})")
    ap.add_argument("--nice", type=int, default=NICE,
                    help="nice value of the ranks (all their threads; the writer thread's "
                    "COMMTRACE_WRITER_NICE is added to it as in any run): a negative one puts "
                    "the timed processes ahead of other jobs on the machine (root or "
                    f"CAP_SYS_NICE; unchanged where not permitted); 0: unchanged (default {NICE})")
    ap.add_argument("--group-nice", type=int, default=GROUP_NICE,
                    help="each rank in a session of its own whose autogroup gets this nice value "
                    "(where the kernel's autogroups are on, sessions share the CPUs first: a "
                    "negative value puts the ranks ahead of other sessions' jobs; root or "
                    f"CAP_SYS_NICE); 0: unchanged (default {GROUP_NICE})")
    ap.add_argument("--rt", type=int, default=RT,
                    help="run the ranks (all their threads) under SCHED_FIFO at this priority "
                    "(1-99; root or CAP_SYS_NICE; unchanged where not permitted): a waking rank "
                    f"takes a CPU from other jobs at once; 0: the fair scheduler (default {RT})")
    ap.add_argument("--gap", type=float, default=None,
                    help="pause after each round, s (default: 0 with --rt 0; under SCHED_FIFO "
                    "an eighth of --duration, and at least an eighth of the round: the ranks then "
                    "use at most ~89%% of a CPU, under the kernel's RT throttling limit, which "
                    "otherwise stops them for 50 ms each second)")
    ap.add_argument("--seed", type=int, default=SEED,
                    help="seed of the sets' orders (ORDERS shuffled within each block of six "
                    f"sets); -1: the fixed cycle of sessions 7-13 (default {SEED})")
    ap.add_argument("--aa", action="store_true",
                    help="tracing off in every arm: the traced arm runs as the control does (a "
                    "second A/A comparison per run, to check the estimators' coverage)")
    ap.add_argument("--plant", type=float, default=0.0,
                    help="a known slowdown in the traced arm: after each step a busy loop of "
                    "this share of the calibrated step time, in thread CPU (e.g. 0.01; with "
                    "--aa: the traced / untraced ratio should come out at 1 + this)")
    ap.add_argument("--per-step", action="store_true",
                    help="keep every step's wall time in the JSON (step_walls: per rank, per round)")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args(argv)
    if a.rounds is not None and a.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not 0 <= a.rt <= 99:
        ap.error("--rt must be in [0, 99]")
    if a.rt and not _rt_permitted(a.rt):
        print(f"steps: SCHED_FIFO {a.rt} not permitted here (root or CAP_SYS_NICE): the fair "
              "scheduler (--rt 0)", file=sys.stderr)
        a.rt = 0
    if a.duration is None:
        a.duration = DURATION if a.rt else DURATION_FAIR
    if a.duration < 0 or a.budget <= 0:
        ap.error("--duration must be >= 0 and --budget > 0")
    if not 0 <= a.plant < 1:
        ap.error("--plant must be in [0, 1)")
    if a.steps is not None and a.steps < 1:
        ap.error("--steps must be at least 1")
    if a.control == "group" and (a.workloads != ["ddp"] or a.ddp_copies or a.aa):
        ap.error("--control group needs --workloads ddp alone, without --ddp-copies or --aa")
    if a.control.startswith("variant:") and (a.ddp_copies or a.aa):
        ap.error(f"--control {a.control} cannot be used with --ddp-copies or --aa")
    if a.gap is None:
        a.gap = a.duration / 8 if a.rt and a.duration > 0 else 0.05 if a.rt else 0.0
    if a.gap < 0:
        ap.error("--gap must be >= 0")
    if a.rounds is None:
        a.rounds = (max(6, 6 * round(a.budget / (3 * a.duration) / 6)) if a.duration > 0
                    and a.steps is None else ROUNDS)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Warm the parent: the forked ranks start with torch, the samples' imports and DDP loaded.
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    from commtrace.capture import accel, wrappers

    # How DDP's all-reduce is recorded: where `commtrace accel build` built the module for this
    # torch, no hook (the recording group) or, with COMMTRACE_DDP_GROUP=0, the C++ hook; else C
    mod = accel.load()
    ddp_hook = ("python" if wrappers._cfast is None or os.environ.get("COMMTRACE_DDP_C") == "0"
                else "c" if mod is None
                else "group" if hasattr(mod, "wrap_group")
                and os.environ.get("COMMTRACE_DDP_GROUP", "1") not in ("0", "") else "c++")
    warn_without_accel(mod is not None)
    if a.control == "group" and ddp_hook != "group":
        print("steps: --control group needs DDP recorded through commtrace's recording group "
              f"(here: {ddp_hook}; `python -m commtrace accel build`)", file=sys.stderr)
        return 2
    print(f"steps: torch {torch.__version__}, C fast path "
          f"{'on' if wrappers._cfast is not None else 'OFF'}, DDP comm hook {ddp_hook}"
          f"{' (one copy, its Reducer group swapped per round)' if ddp_hook == 'group' and not (a.ddp_copies or a.aa or a.control == 'copy') else ' (separate copies)'}; "
          f"{uptime()}", flush=True)
    results = []
    for w in a.workloads:
        dw, ds_ = DEFAULTS[w]
        steps = a.steps if a.steps is not None else (None if a.duration > 0 else ds_)
        r = run_workload(w, a.rounds, a.warmup if a.warmup is not None else dw, steps,
                         a.timeout, a.writer == "sync", a.pin, a.duration, a.control, a.nice,
                         a.aa, a.plant, a.per_step, a.group_nice, a.rt, a.gap,
                         None if a.seed < 0 else a.seed, a.ddp_copies)
        r["c_fast_path"] = wrappers._cfast is not None
        r["ddp_comm_hook"] = ddp_hook
        results.append(r)
        print("\n".join(report(r)), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
