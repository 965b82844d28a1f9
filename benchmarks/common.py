"""What the timing benchmarks share (overhead.py, steps.py): confidence intervals, the
machine's load, a free port, CPU clocks. Imported as ``common`` (a benchmark runs as a script,
with this folder first on ``sys.path``)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time


def median_ci(xs) -> list:
    """Distribution-free 95% confidence interval of the median (binomial order statistics)."""
    s = sorted(xs)
    n = len(s)
    half = 1.96 * (n ** 0.5) / 2
    lo = max(0, int(n / 2 - half))
    hi = min(n - 1, int(n / 2 + half + 1))
    return [s[lo], s[hi]]


def bootstrap_ratio_ci(num: list, den: list, n: int = 5000, seed: int = 20261201) -> list:
    """95% percentile-bootstrap interval of sum(num) / sum(den), resampling the pairs."""
    rng = random.Random(seed)
    k = len(num)
    stats = []
    for _ in range(n):
        idx = [rng.randrange(k) for _ in range(k)]
        stats.append(sum(num[i] for i in idx) / sum(den[i] for i in idx))
    stats.sort()
    return [stats[int(0.025 * n)], stats[min(n - 1, int(0.975 * n))]]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def uptime() -> str:
    """The time and `uptime`'s load averages, as printed next to every figure."""
    try:
        return time.strftime("%H:%M:%S UTC", time.gmtime()) + ", " + subprocess.run(
            ["uptime"], capture_output=True, text=True, timeout=5).stdout.strip().split(",  ", 1)[-1]
    except Exception:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def load_of(text: str) -> str:
    """The load averages of an :func:`uptime` line."""
    return text.rsplit("load average:", 1)[-1].strip()


def thread_cpu_ns() -> int:
    """CPU time of the calling thread (user + system), ns."""
    return time.clock_gettime_ns(time.CLOCK_THREAD_CPUTIME_ID)


def thread_cpu_s(thread) -> float | None:
    """CPU time of another thread of this process (a `threading.Thread`), s; None if unknown."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except Exception:
        return None


def pin_cpus(rank: int, how: str) -> list | None:
    """Pin this process (and the threads it starts after: gloo's, the writer) to CPUs: "one"
    puts every rank on the first CPU, "each" rank r on CPU r, "none" leaves placement to the
    scheduler. Returns the CPUs, None when not pinned.

    Why it matters at world size 1 (measured 2026-12-02 05:30 UTC, 2 cores, load 1.6): a
    blocking gloo all_reduce of 16 floats cost the caller 7.2-7.8 us of thread CPU with the
    process on one CPU, and 24-43 us when the scheduler put gloo's thread on the other core
    (the caller waits across cores): more than tracing costs, and it changes from one process
    to the next."""
    if how == "none" or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    mine = {cpus[0]} if how == "one" else {cpus[rank % len(cpus)]}
    os.sched_setaffinity(0, mine)
    return sorted(mine)


def c_fast_path() -> bool:
    """Whether commtrace's C capture path is in use in this process."""
    from commtrace.capture import wrappers

    return getattr(wrappers, "_cfast", None) is not None


ACCEL_MISSING = ("commtrace's C++ module is NOT built for this torch (`commtrace accel build`): DDP is "
                 "recorded through the C comm hook and each op's tensor is read through torch's Python "
                 "accessors, about 2 us more per op at 2 ranks than a user who built it (docs/performance.md, "
                 "session 24)")


def accel_built() -> bool:
    """Whether the C++ module of `commtrace accel build` loads for this process's torch
    (imported here: the module is built for one torch): the set-up every figure of
    docs/performance.md assumes."""
    try:
        import torch  # noqa: F401

        from commtrace.capture import accel

        return accel.load() is not None
    except Exception:
        return False


def warn_without_accel(built: bool) -> None:
    """One line on stderr when the C++ module is not built (the figures then are not a user's)."""
    if not built:
        import sys
        print("warning: " + ACCEL_MISSING, file=sys.stderr, flush=True)


def traced_gloo_rank(out: str, rank: int, world: int, port: int):
    """One torch thread, commtrace tracing into `out`, then the gloo group of `world` ranks on
    127.0.0.1:`port`: returns the recorder (RuntimeError where tracing did not start). The
    set-up of steps.py's and stepcount.py's ranks."""
    import torch
    import torch.distributed as dist

    import commtrace
    from commtrace.capture import recorder as R

    torch.set_num_threads(1)
    commtrace.enable(output=out)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    rec = R.get_recorder()
    if rec is None:
        raise RuntimeError("tracing did not start")
    return rec


def ddp_sample_one_rank(prefix: str, threads: int | None = None):
    """The DDP sample (samples/ddp_mlp.py, no straggler) at world size 1 on gloo, traced into a
    new temporary directory with flushes only when asked (flush_interval 3600 s): returns
    (recorder, the sample module, its state) for the one-process writer probes
    (flush_stages.py, writer_sparse.py). `threads`: torch.set_num_threads first."""
    import importlib.util
    import tempfile

    import torch
    import torch.distributed as dist

    import commtrace
    from commtrace.capture import recorder as R

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    if threads is not None:
        torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=0, world_size=1)
    commtrace.enable(tempfile.mkdtemp(prefix=prefix), flush_interval=3600)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("ddp_mlp", os.path.join(root, "samples", "ddp_mlp.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    st = m.setup(m.parse_args(["--straggler-ms", "0"]), 0, 1, torch.device("cpu"))
    return R.get_recorder(), m, st
