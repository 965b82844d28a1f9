"""Instructions per training step, traced against untraced, per thread, counted under callgrind:
what commtrace adds to the training thread of a real loop, the same on a loaded machine as on a
quiet one.

    python benchmarks/stepcount.py                     # the DDP sample; needs valgrind, ~4 minutes
    python benchmarks/stepcount.py --workloads ddp soak --steps 20
    python benchmarks/stepcount.py --keep /tmp/sc      # keep callgrind's files (callgrind_annotate)
    python benchmarks/stepcount.py --cache-sim         # also the training thread's missed lines
    python benchmarks/stepcount.py --world-size 2      # DDP at 2 ranks: every thread of each
                                                       # rank, gloo's included (~7 minutes)

Issue 20, session 25. `benchmarks/steps.py` times steps on this shared 2-core machine, where two
untraced copies of the same loop differ by 1-2% between runs (its control): a traced / untraced
ratio of 1.015 +- 0.017 cannot say whether commtrace costs 0.2% or 2% of a DDP step. Counting
instructions can: callgrind runs the loop in one process and counts every instruction of each
thread, whatever else runs on the machine.

Method: world size 1 (gloo), one process per mode, both under callgrind with
`--separate-threads=yes`. Each builds the workload as `benchmarks/steps.py` does, with commtrace
on (DDP's copy built while tracing, so that its Reducer gets commtrace's recording group), runs
the warm-up steps, then sets its mode as steps.py's rounds do -- traced: the recorder on and, for
DDP, the recording group in the Reducer; untraced: the recorder off and DDP's own group -- runs 3
more steps, writes what is queued, and only then has callgrind zero its counters
(`callgrind_control -z`), runs `--steps` steps (the writer thread writes no part on its own
schedule during them; it still services the pending ops) and dumps (`callgrind_control -d`). Printed: the
instructions per step of each thread in each mode, and the training thread's traced / untraced
ratio. The training thread (callgrind's thread 1) is the figure to read: the other threads'
counts include work that runs per second of wall time (the writer thread's parts every
`flush_interval`, the hang watchdog's checks every second), and under callgrind a step takes
50-100 times as long as it does natively, so per step they are that much larger than in a real
run; steps.py measures the writer thread's CPU per op in real time.

`--world-size 2` (DDP only; session 26) runs two ranks per mode, each under callgrind, gloo over
loopback, both zeroing their counters between two barriers before the counted steps: the
training thread, gloo's threads and the writer of each rank, in the job steps.py times. gloo's
threads' counts move by tens of thousands between threads from run to run (which thread
serves which piece of the work depends on how callgrind interleaves the ranks): read their sum.

Instructions are not time: a cache miss costs no instruction. benchmarks/footprint.py counts
the cold-cache lines of one op.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # this checkout's commtrace, installed or not
#: workloads that run at world size 1 (steps.py's pipeline needs 2 ranks, FSDP2's sample a mesh)
WORKLOADS = ("ddp", "soak", "async_loop")


def _child(workload: str, mode: str, steps: int, warmup: int, rank: int = 0, world: int = 1,
           port: int | None = None) -> None:
    sys.path.insert(0, HERE)
    from common import free_port, traced_gloo_rank
    from steps import _build, _ddp_group_setter

    import torch.distributed as dist

    import commtrace
    from commtrace.capture import recorder as R

    rec = traced_gloo_rank(tempfile.mkdtemp(prefix="commtrace-stepcount-"), rank, world, port or free_port())
    st, fn = _build(workload, rank, world)
    for i in range(warmup):
        fn(st, i)
    set_group = _ddp_group_setter(st) if workload == "ddp" else None
    if workload == "ddp" and set_group is None:
        print("stepcount: DDP is not recorded through commtrace's recording group here (no "
              "C++ module: `commtrace accel build`); its copy keeps commtrace's comm hook in "
              "both modes", file=sys.stderr)
    if set_group is not None:
        set_group(mode)
    R._set_recorder(rec if mode == "traced" else None)
    for i in range(3):
        fn(st, i)
    rec.flush()
    # no part written on the writer's schedule during the counted steps (its flush interval
    # is wall time, 50-100x as many steps under callgrind: its parts, and what they evict from
    # the simulated caches the threads share, would be counted that much more per step);
    # the writer still services the pending ops. steps.py measures the parts in real time.
    rec.auto_flush = False
    rec.wake()
    pid = str(os.getpid())
    if world > 1:   # both ranks zero their counters before either starts the counted steps
        dist.barrier()
    subprocess.run(["callgrind_control", "-z", pid], capture_output=True)
    if world > 1:
        dist.barrier()
    for i in range(steps):
        fn(st, i)
    subprocess.run(["callgrind_control", "-d", "steps", pid], capture_output=True)
    if world > 1:
        dist.barrier()
    rec.auto_flush = True
    if set_group is not None:
        set_group("untraced")
    R._set_recorder(rec)
    commtrace.disable()
    dist.destroy_process_group()


def _thread_events(prefix: str) -> dict:
    """{thread number: {event: count}} of the dump callgrind_control -d wrote (files
    `<prefix>.N-TT`, N the dump's number; `Ir` alone, or with `--cache-sim` the cache events)."""
    out = {}
    for path in glob.glob(prefix + ".*-*"):
        m = re.search(r"\.(\d+)-(\d+)$", path)
        if not m or m.group(1) == "0":
            continue
        events = ["Ir"]
        with open(path) as f:
            for line in f:
                if line.startswith("events:"):
                    events = line.split()[1:]
                elif line.startswith(("summary:", "totals:")):
                    out[int(m.group(2))] = dict(zip(events, map(int, line.split()[1:])))
                    break
    return out


def _threads(prefix: str) -> dict:
    """{thread number: instructions} of the dump (see _thread_events)."""
    return {t: ev.get("Ir", 0) for t, ev in _thread_events(prefix).items()}


def _label(prefix: str, t: int) -> str:
    if t == 1:
        return "training thread"
    for path in glob.glob(f"{prefix}.*-{t:02d}"):
        if re.search(r"\.(\d+)-\d+$", path).group(1) == "0":
            continue
        with open(path, errors="replace") as f:
            text = f.read()
        if "ParquetWriter" in text or "_parquet" in text:
            return f"thread {t} (writer: parts)"
    return f"thread {t}"


#: callgrind's cache model with --cache-sim (benchmarks/footprint.py's)
CACHE_SIM = ["--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=4194304,16,64"]


def run(workload: str, steps: int, warmup: int, d: str, cache_sim: bool = False, world: int = 1) -> dict:
    """{mode: {thread: instructions per step}, ...} of rank 0's process (world 1), or with
    `world` 2 of each rank's (keys "traced", "traced_r1", ...): the ranks of a mode run side by
    side, each under callgrind, their counted steps bracketed by barriers."""
    sys.path.insert(0, HERE)
    from common import free_port
    procs = {}
    for mode in ("traced", "untraced"):
        port = free_port() if world > 1 else None
        for rank in range(world):
            tag = mode if rank == 0 else f"{mode}_r{rank}"
            prefix = os.path.join(d, f"callgrind.{workload}.{tag}")
            cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", *(CACHE_SIM if cache_sim else []),
                   f"--callgrind-out-file={prefix}", sys.executable, os.path.abspath(__file__),
                   "--child", workload, mode, "--steps", str(steps), "--warmup", str(warmup)]
            if world > 1:
                cmd += ["--rank", str(rank), "--world-size", str(world), "--port", str(port)]
            procs[tag] = (prefix, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE, text=True))
    res = {}
    for tag, (prefix, p) in procs.items():
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"stepcount: callgrind run of {workload} ({tag}) failed "
                             f"({p.returncode}): {err[-2000:]}")
        ev = _thread_events(prefix)
        if 1 not in ev:
            raise SystemExit(f"stepcount: no dump of the counted steps under {prefix}")
        res[tag] = {t: e.get("Ir", 0) / steps for t, e in ev.items()}
        res[tag + "_events"] = {k: v / steps for k, v in ev[1].items()}
        res[tag + "_labels"] = {t: _label(prefix, t) for t in ev}
    return res


def report(workload: str, res: dict, steps: int, rank: int = 0, world: int = 1) -> list[str]:
    sfx = "" if rank == 0 else f"_r{rank}"
    tr, un = res["traced" + sfx], res["untraced" + sfx]
    labels = {**res["untraced" + sfx + "_labels"], **res["traced" + sfx + "_labels"]}
    where = "world size 1, gloo" if world == 1 else f"rank {rank} of {world}, gloo"
    lines = [f"{workload}: instructions per step, {steps} steps counted ({where}; "
             "callgrind, every instruction of each thread)"]
    for t in sorted(set(tr) | set(un)):
        a, b = tr.get(t, 0.0), un.get(t, 0.0)
        if a < 1 and b < 1:
            continue
        lines.append(f"  {labels.get(t, f'thread {t}'):<28} traced {a:14,.0f}  untraced {b:14,.0f}"
                     f"  traced - untraced {a - b:+12,.0f}")
    if world > 1:
        a, b = sum(tr.values()), sum(un.values())
        lines.append(f"  all threads                  traced {a:14,.0f}  untraced {b:14,.0f}"
                     f"  traced - untraced {a - b:+12,.0f}")
    a, b = tr[1], un.get(1, 0.0)
    if b > 0:
        lines.append(f"  training thread: traced / untraced {a / b:.4f} ({100 * (a / b - 1):+.2f}%, "
                     f"{a - b:+,.0f} instructions per step)")
    et, eu = res.get("traced" + sfx + "_events") or {}, res.get("untraced" + sfx + "_events") or {}
    if "D1mr" in et and "D1mr" in eu:
        def lines_of(e, lvl):   # data lines missed at that level, reads and writes
            return e.get(f"{lvl}mr", 0) + e.get(f"{lvl}mw", 0)
        for lvl, what in (("D1", "data lines missed in L1 (32 KB)"),
                          ("DL", "data lines from memory (LL 4 MB missed)")):
            x, y = lines_of(et, lvl), lines_of(eu, lvl)
            lines.append(f"  training thread, {what}: traced {x:,.0f}  untraced {y:,.0f}  "
                         f"traced - untraced {x - y:+,.0f} per step")
        x, y = et.get("I1mr", 0), eu.get("I1mr", 0)
        lines.append(f"  training thread, instruction lines missed in L1: traced {x:,.0f}  "
                     f"untraced {y:,.0f}  traced - untraced {x - y:+,.0f} per step")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workloads", nargs="*", default=["ddp"], choices=WORKLOADS)
    ap.add_argument("--steps", type=int, default=20, help="steps counted per mode (default 20)")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up steps (default 10)")
    ap.add_argument("--keep", default=None, metavar="DIR",
                    help="keep callgrind's output files in DIR (callgrind_annotate)")
    ap.add_argument("--cache-sim", action="store_true",
                    help="also simulate the caches (footprint.py's model; about twice as slow) and "
                         "print the training thread's missed lines per step")
    ap.add_argument("--world-size", type=int, default=1, choices=(1, 2),
                    help="1 (default): one process per mode; 2: two ranks per mode, each under "
                         "callgrind (gloo over loopback; about 4 processes on the machine's CPUs at "
                         "once, several times as slow), every thread of each rank counted, gloo's "
                         "included")
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        _child(args.child[0], args.child[1], args.steps, args.warmup, args.rank, args.world_size, args.port)
        return 0
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    if args.world_size > 1 and any(w != "ddp" for w in args.workloads):
        ap.error("--world-size 2 counts the DDP sample only (--workloads ddp)")
    for tool in ("valgrind", "callgrind_control"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            print(f"stepcount: {tool} not found (Debian: apt install valgrind)", file=sys.stderr)
            return 2
    sys.path.insert(0, HERE)
    from common import accel_built, warn_without_accel
    built = accel_built()
    print(f"stepcount: C++ module (accel) {'built' if built else 'NOT BUILT'}")
    warn_without_accel(built)
    with tempfile.TemporaryDirectory() as tmp:
        d = args.keep or tmp
        os.makedirs(d, exist_ok=True)
        for w in args.workloads:
            res = run(w, args.steps, args.warmup, d, cache_sim=args.cache_sim, world=args.world_size)
            for r in range(args.world_size):
                print("\n".join(report(w, res, args.steps, r, args.world_size)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
