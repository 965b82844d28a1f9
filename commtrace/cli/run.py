"""`commtrace run [options] -- CMD [ARGS...]`: run any command with tracing on in every Python
process of it that creates a process group (torchrun workers, mp.spawn children, ...).

It reaches them through the environment: ``commtrace/capture/bootstrap`` goes first on
``PYTHONPATH`` (its ``sitecustomize`` chains to any existing one) and the capture options travel
as ``COMMTRACE_*`` variables built from :class:`commtrace.config.Config`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import click

from ..config import ENV_ENABLE, Config
from ..errors import OutputError, UsageError

EPILOG = """\b
Examples:
  commtrace run -- torchrun --nproc-per-node 8 train.py
  commtrace run -o traces/run1 -- torchrun --nproc-per-node 2 samples/ddp_mlp.py
  commtrace run --flush-interval 5 --no-stack -- python -m my_launcher train.py
  commtrace run --steps 100:110 -- torchrun --nproc-per-node 8 train.py   (10 steps exactly)
  commtrace run --schedule wait=50,active=5 --max-size 500MB -- torchrun ... train.py
  commtrace run --on-demand --trigger-steps 20 -- torchrun ... train.py
      (then `commtrace trigger OUT --steps 20`, or `kill -USR2 <pid of commtrace run>`)
  commtrace run -- bash launch.sh        (any command; Python ranks inside are traced)
"""


def bootstrap_dir() -> str:
    """Directory holding the bootstrap ``sitecustomize.py``."""
    from .. import capture

    return os.path.join(os.path.dirname(os.path.abspath(capture.__file__)), "bootstrap")


def child_env(config: Config, base=None) -> dict[str, str]:
    """Environment of the traced command: ours first on PYTHONPATH, tracing armed."""
    from ..capture import memory

    env = dict(os.environ if base is None else base)
    env.update(config.to_env())
    env.update(memory.allocator_env(env))  # before any rank loads pyarrow (capture/memory.py)
    env[ENV_ENABLE] = "1"
    boot = bootstrap_dir()
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot]
    env["PYTHONPATH"] = os.pathsep.join([boot] + parts)
    import commtrace

    env["COMMTRACE_PKG_PATH"] = os.path.dirname(os.path.dirname(os.path.abspath(commtrace.__file__)))
    return env


def default_output() -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = os.path.join("commtrace-traces", stamp)
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path


def _ranks_written(run_dir: str) -> list[int]:
    ranks = []
    try:
        for name in os.listdir(run_dir):
            if name.startswith("rank="):
                try:
                    ranks.append(int(name[5:]))
                except ValueError:
                    pass
    except OSError:
        pass
    return sorted(ranks)


def _runs_in(out: str) -> list[str]:
    from ..format import runs

    return runs.find_runs(out, max_depth=1)


def _check_bounded(steps, schedule, max_size) -> None:
    """One-line usage errors for the bounded-capture options (capture/window.py)."""
    from ..capture import window as WIN

    for opt, fn, v in (("--steps", WIN.parse_steps, steps), ("--schedule", WIN.parse_schedule, schedule),
                       ("--max-size", WIN.parse_size, max_size)):
        try:
            fn(v)
        except ValueError as e:
            raise UsageError(f"{opt}: {e}") from None


@click.command(name="run", epilog=EPILOG,
               context_settings={"help_option_names": ["-h", "--help"],
                                 "ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              help="Output directory; each job traced gets its own run directory OUT/<run-id> "
              "(default: a new ./commtrace-traces/<time>).")
@click.option("--nvtx/--no-nvtx", default=True, show_default=True,
              help="NVTX range per op (domain 'commtrace'); free without a profiler attached.")
@click.option("--stack/--no-stack", default=True, show_default=True,
              help="Record the user call site (file:line) of each op.")
@click.option("--flush-interval", type=click.FloatRange(min=0.05), default=2.0, show_default=True,
              metavar="SECONDS", help="Write a Parquet part this often.")
@click.option("--buffer-ops", type=click.IntRange(min=1000), default=200_000, show_default=True,
              metavar="N", help="Rows buffered in memory per rank; beyond, rows are dropped "
              "and counted.")
@click.option("--hang-timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
              metavar="SECONDS", help="An op in flight this long counts as a hang.")
@click.option("--dump-on-hang/--no-dump-on-hang", default=True, show_default=True,
              help="Dump Python stacks of a rank that hangs.")
@click.option("--hazards", type=click.Choice(["off", "basic", "full"]), default="basic",
              show_default=True, help="Host-side hazard checks (use before wait, ...).")
@click.option("--cuda-events/--no-cuda-events", default=True, show_default=True,
              help="Time ops on the GPU with CUDA events (NCCL).")
@click.option("--async-completion", type=click.Choice(["callback", "wait"]), default="callback",
              show_default=True, help="Completion time of async ops: the future's callback "
              "(exact; takes the GIL on the backend's thread per op) or wait()/polling "
              "(cheaper; late when an op is waited long after it completed).")
@click.option("--writer-nice", type=click.IntRange(min=0, max=19), default=10, show_default=True,
              metavar="N", help="Lower the trace writer thread's priority by N (Linux; under a "
              "real-time policy such as chrt -f, the writer first leaves it for the normal one).")
@click.option("--completion-hook/--no-completion-hook", default=False, show_default=True,
              help="NCCL: record ops issued below Python (DDP's reducer, compiled graphs) from "
              "ProcessGroup's completion hook, as rows with api=\"c++\" (needs "
              "TORCH_NCCL_ENABLE_TIMING=1).")
@click.option("--steps", "steps", default="", metavar="A:B",
              help="Record ops of steps A..B-1 only (optimizer.step or mark_step); the other "
              "steps keep one counter row per op kind (ops, bytes, blocked time).")
@click.option("--schedule", default="", metavar="wait=W,active=A,repeat=R",
              help="Like torch.profiler's schedule: record A steps after every W skipped, R "
              "times (0: forever); counters for the others.")
@click.option("--max-size", default="", metavar="SIZE",
              help="Per rank, at most this much of op parts (e.g. 500MB): the oldest are "
              "deleted (ring retention), rank=<r>/_retention.json says what was dropped.")
@click.option("--on-demand", is_flag=True, default=False,
              help="Record counters only until `commtrace trigger DIR --steps N` asks for N "
              "steps op by op.")
@click.option("--trigger-steps", type=click.IntRange(min=1), default=10, show_default=True,
              metavar="N", help="With --on-demand, --steps or --schedule: SIGUSR2 sent to "
              "commtrace run (not to the ranks) triggers N steps op by op, as `commtrace "
              "trigger OUT --steps N` does (`kill -USR2 <pid>`; the pid is printed at start).")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def command(output, nvtx, stack, flush_interval, buffer_ops, hang_timeout, dump_on_hang,
            hazards, cuda_events, async_completion, writer_nice, completion_hook, steps,
            schedule, max_size, on_demand, trigger_steps, cmd):
    """Run CMD with tracing on in every rank; write the trace to one run directory.

    Options of commtrace run go before CMD (or before `--`); an unknown one is an error.
    Everything from CMD on, options included, is passed to CMD unchanged."""
    cmd = list(cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    elif cmd and cmd[0].startswith("-") and cmd[0] != "-":
        # Unknown options are kept as arguments (so that `commtrace run python x.py --lr 1`
        # passes --lr to the script), which would make one before CMD the command itself.
        _no_such_option(cmd[0])
    if not cmd:
        raise UsageError("no command given (usage: commtrace run [OPTIONS] -- CMD [ARGS...])")
    out = os.path.abspath(output or default_output())
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create the output directory {out}: {e.strerror}") from e
    if not os.access(out, os.W_OK):
        raise OutputError(f"output directory {out} is not writable")
    _check_bounded(steps, schedule, max_size)
    from .. import __version__

    from ..format import runs as RUNS

    if RUNS.is_run_dir(out):
        raise OutputError(f"{out} is the run directory of an earlier trace (schema v1); give "
                          "-o an empty or new directory, or a directory of runs")
    before = set(_runs_in(out))
    start_ns = time.time_ns()
    inv_id = f"{start_ns:x}-{os.getpid()}"
    config = Config(output=out, nvtx=nvtx, stack=stack, flush_interval=flush_interval,
                    buffer_ops=buffer_ops, hazards=hazards, hang_timeout=hang_timeout,
                    dump_on_hang=dump_on_hang, cuda_events=cuda_events,
                    async_completion=async_completion, writer_nice=writer_nice,
                    completion_hook=completion_hook, steps=steps, schedule=schedule,
                    max_size=max_size, on_demand=on_demand, session=inv_id,
                    # no flag: COMMTRACE_GAP_CHECK=0 in the environment turns it off
                    gap_check=Config.from_env().gap_check)
    # The output directory's manifest lists the invocations of `commtrace run -o OUT`
    # ("kind": "session", "invocations"), each with its command, exit code and runs; each job
    # writes its own run directory OUT/<run-id>/, whose manifest names its invocation
    # ("session"). Updated under a lock: invocations running at once keep each other's entry
    # (docs/trace-format.md).
    inv = dict(id=inv_id, command=cmd, start_ns=start_ns,
               start_time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), cwd=os.getcwd(),
               commtrace_version=__version__, pid=os.getpid(), runs=[])
    try:
        RUNS.record_invocation(out, inv)
    except OSError as e:
        raise OutputError(f"cannot write the manifest in {out}: {e.strerror}") from e
    got_signals: list[str] = []
    on_signal = None
    if (on_demand or steps or schedule) and hasattr(signal, "SIGUSR2"):
        on_signal = {signal.SIGUSR2: lambda: _signal_trigger(out, trigger_steps)}
        click.echo(f"commtrace: on demand: `commtrace trigger {os.path.relpath(out)} --steps N` or "
                   f"`kill -USR2 {os.getpid()}` ({trigger_steps} steps)", err=True)
    rc = run_child(cmd, child_env(config), signals=got_signals, on_signal=on_signal)

    def ours(d: str) -> bool:
        # rank 0 names its invocation in the run's manifest; a rank launched by this
        # invocation while rank 0 was another's (one job, two nodes' launchers) in its snapshot
        sid = RUNS.read_manifest(d).get("session")
        if sid == inv_id or (not sid and d not in before):
            return True
        return inv_id in RUNS.snapshot_sessions(d)

    new = [r for r in _runs_in(out) if ours(r)]
    echo = lambda s: click.echo(s, err=True)  # noqa: E731
    if not new:
        try:
            if RUNS.forget_invocation(out, inv_id) is None:
                os.unlink(os.path.join(out, RUNS.SESSION_LOCK_NAME))
                os.rmdir(out)
        except OSError:
            pass
        echo("commtrace: no process created a process group; nothing was traced.")
        return rc
    ranks = sorted({r for d in new for r in _ranks_written(d)})
    for d in new:
        _record_retention(d)
    RUNS.record_invocation(out, dict(id=inv_id, end_ns=time.time_ns(), exit_code=rc,
                                     signal=got_signals[0] if got_signals else None,
                                     runs=[os.path.basename(d) for d in new], ranks_written=ranks))
    shown = os.path.relpath(out) if not os.path.relpath(out).startswith("..") else out
    alone = len(_runs_in(out)) == 1
    for d in new:
        echo(f"commtrace: trace of {len(_ranks_written(d))} rank(s) written to "
             f"{os.path.join(shown, os.path.basename(d))}")
    if len(new) > 1:
        echo(f"commtrace: {len(new)} jobs traced, one run each (commtrace ls {shown})")
    target = shown if alone else os.path.join(shown, os.path.basename(new[-1]))
    echo("commtrace: next:")
    echo(f"  commtrace report {target}")
    echo(f"  commtrace dashboard {target}")
    return rc


def _record_retention(run_dir: str) -> None:
    """--max-size: put what each rank's ring retention deleted (its rank=<r>/_retention.json)
    in the run's manifest under "retention" ({rank: dropped}), so that the manifest says what
    was dropped. Nothing when no rank dropped anything."""
    import glob
    import json

    from ..capture.window import RETENTION_NAME
    from ..format import writer as W

    dropped = {}
    for p in sorted(glob.glob(os.path.join(run_dir, "rank=*", RETENTION_NAME))):
        try:
            with open(p) as f:
                d = json.load(f)
            dropped[str(d.get("rank", os.path.basename(os.path.dirname(p))[5:]))] = d.get("dropped")
        except (OSError, ValueError, AttributeError):
            continue
    if not dropped:
        return
    mpath = os.path.join(run_dir, "_manifest.json")
    try:
        with open(mpath) as f:
            m = json.load(f)
    except (OSError, ValueError):
        m = {}
    m["retention"] = dropped
    try:
        W.atomic_write_text(mpath, json.dumps(m, indent=2, default=str))
    except OSError:
        pass


def _no_such_option(arg: str) -> None:
    """Raise click's usage error for an unknown option of `commtrace run` (exit 2, one line)."""
    ctx = click.get_current_context()
    name = arg.split("=", 1)[0]
    known = [o for p in ctx.command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]
    import difflib

    raise click.NoSuchOption(name, possibilities=difflib.get_close_matches(name, known), ctx=ctx)


def _signal_trigger(out: str, n: int) -> None:
    """SIGUSR2 to commtrace run: the trigger file that `commtrace trigger OUT --steps n` writes
    (the ranks read it at their next flush and agree on the first step through the store)."""
    from ..capture.window import write_trigger

    try:
        trig = write_trigger(out, n)
        click.echo(f"commtrace: SIGUSR2: trigger {trig['id']}: recording {n} step(s) op by op", err=True)
    except OSError as e:
        click.echo(f"commtrace: SIGUSR2: cannot write the trigger in {out}: {e.strerror}", err=True)


def run_child(cmd: list[str], env: dict[str, str], signals: list | None = None,
              on_signal: dict | None = None) -> int:
    """Run `cmd` in its own process group, forward SIGINT/SIGTERM to it, return its exit code:
    128 + the signal's number when a signal ended it, or when one was forwarded (Ctrl-C: 130)
    and it then exited with the generic 1 (torchrun's answer to a forwarded signal); any other
    code the child chose itself is returned as it is. The names of the signals forwarded are
    appended to `signals`. `on_signal`: signal -> function, run in commtrace run itself (not
    forwarded) while the child runs."""
    forwarded, pending = [], []
    child = None

    def forward(signum, frame):
        forwarded.append(signum)
        if signals is not None:
            try:
                signals.append(signal.Signals(signum).name)
            except ValueError:
                signals.append(str(signum))
        if child is None:
            pending.append(signum)
            return
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    # The handlers go in before the child starts: a signal that arrives while Popen returns (a
    # loaded machine can deschedule us there after the child is already running) is forwarded
    # once the child exists, instead of killing commtrace run with the child left running.
    prev = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        prev[sig] = signal.signal(sig, forward)
    for sig, fn in (on_signal or {}).items():
        prev[sig] = signal.signal(sig, lambda signum, frame, fn=fn: fn())
    try:
        child = subprocess.Popen(cmd, env=env, preexec_fn=os.setpgrp)
    except (FileNotFoundError, PermissionError) as e:
        for sig, h in prev.items():
            signal.signal(sig, h)
        if isinstance(e, FileNotFoundError):
            click.echo(f"commtrace: error: command not found: {cmd[0]}", err=True)
            return 127
        click.echo(f"commtrace: error: cannot execute: {cmd[0]}", err=True)
        return 126
    while pending:
        try:
            child.send_signal(pending.pop(0))
        except ProcessLookupError:
            pass

    try:
        while True:
            try:
                rc = child.wait()
                break
            except InterruptedError:  # pragma: no cover
                continue
    finally:
        for sig, h in prev.items():
            signal.signal(sig, h)
    if rc < 0:
        return 128 + (-rc)
    if rc == 1 and forwarded:
        # Interrupted (Ctrl-C) or terminated: torchrun exits with the generic 1 after shutting its
        # workers down on a forwarded SIGINT/SIGTERM, so use the shell's convention, 128 + the
        # signal. Any other code is the child's own answer to the signal (a handler that calls
        # sys.exit(7)) and is passed through unchanged.
        return 128 + int(forwarded[0])
    return rc
