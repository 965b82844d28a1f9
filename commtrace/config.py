"""Capture configuration: one dataclass, carried to child processes in environment variables.

`commtrace run` builds a :class:`Config` from its flags and exports it with :meth:`Config.to_env`;
the bootstrap ``sitecustomize`` inside every child rebuilds it with :meth:`Config.from_env`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields

ENV_PREFIX = "COMMTRACE_"
#: Set by `commtrace run` so that the bootstrap knows to turn tracing on.
ENV_ENABLE = "COMMTRACE_ENABLE"
#: Test hook: "RANK:NANOSECONDS" adds a fixed skew to that rank's recorded clock, so that tests
#: can show that the clock offset to rank 0 is really measured.
ENV_CLOCK_SKEW = "COMMTRACE_CLOCK_SKEW"


@dataclass
class Config:
    """Options of a capture session (the flags of `commtrace run`)."""

    output: str = ""
    nvtx: bool = True
    stack: bool = True
    flush_interval: float = 2.0
    buffer_ops: int = 200_000
    hazards: str = "basic"  # off | basic | full
    hang_timeout: float = 600.0
    dump_on_hang: bool = True
    cuda_events: bool = True
    #: bounded capture (capture/window.py): "A:B" steps recorded op by op; a torch.profiler-like
    #: schedule "wait=W,active=A,repeat=R"; a per-rank cap on op parts ("500MB"), ring retention
    steps: str = ""
    schedule: str = ""
    max_size: str = ""
    #: record no op rows (counters only) until `commtrace trigger DIR --steps N`
    on_demand: bool = False
    #: Added to the writer thread's nice value (Linux: per thread), so that Parquet encoding
    #: yields the CPU to the training thread and the backend's threads. 0: unchanged.
    writer_nice: int = 10
    #: Completion time of async ops with a future (gloo collectives): "callback" (the future's
    #: done-callback: exact, but it takes the GIL on the backend's thread for every op) or
    #: "wait" (no callback: the return of wait(), or the writer thread's is_completed() poll
    #: for ops not waited; late by up to the gap between completion and wait).
    async_completion: str = "callback"
    #: Register ProcessGroup._register_on_completion_hook on NCCL groups: ops issued below
    #: Python become rows with api="c++" (needs TORCH_NCCL_ENABLE_TIMING=1; commtrace.capture.
    #: completion_hook). Off by default: torch runs the Python hook on NCCL's watchdog thread.
    completion_hook: bool = False
    #: Read torch's per-group sequence number after each recorded call and write ``gap`` rows
    #: for collectives no recorded call issued (commtrace.capture.torchseq). torch's getter
    #: releases the GIL, so each read is a point where another Python thread may take it;
    #: COMMTRACE_GAP_CHECK=0 turns it off (no gap rows: unrecorded collectives unknown).
    gap_check: bool = True
    #: Id of the `commtrace run` invocation (set by it, not a flag): rank 0 writes it in its
    #: run's manifest (``session``), which ties the run to its entry in the output directory's
    #: manifest even when several invocations write under one -o at the same time.
    session: str = ""

    def to_env(self) -> dict[str, str]:
        """Environment variables that carry this config to child processes."""
        env = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool):
                v = "1" if v else "0"
            env[ENV_PREFIX + f.name.upper()] = str(v)
        return env

    @classmethod
    def from_env(cls, environ=None, **overrides) -> "Config":
        """Rebuild a config from environment variables; explicit overrides win."""
        environ = os.environ if environ is None else environ
        kw = {}
        for f in fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is None:
                continue
            default = f.default
            try:
                if isinstance(default, bool):
                    kw[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
                elif isinstance(default, int):
                    kw[f.name] = int(raw)
                elif isinstance(default, float):
                    kw[f.name] = float(raw)
                else:
                    kw[f.name] = raw
            except ValueError:
                continue  # a malformed variable keeps the default; never raise in a rank
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)

    def replace(self, **kw) -> "Config":
        return dataclasses.replace(self, **kw)


def clock_skew_for(rank: int, environ=None) -> int:
    """Injected test skew in ns for this rank (0 when none)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_CLOCK_SKEW, "")
    for part in raw.split(","):
        if ":" in part:
            r, ns = part.split(":", 1)
            try:
                if int(r) == rank:
                    return int(ns)
            except ValueError:
                pass
    return 0
