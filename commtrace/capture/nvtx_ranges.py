"""NVTX: ranges per op in the domain "commtrace" (issue 4, item 7).

Each recorded op gets a range spanning the host call, named ``"{op} {size} pg={pg} seq={seq}"``
with ``payload=seq``, pushed before the call and popped after it. An async op gets a second
range, started when the call returns (``domain.start_range``) and ended when ``Work.wait()``
returns, or when the recorder writes the op if it was never waited, so that Nsight Systems shows
both the issue and the time until the wait.

On by default (``--no-nvtx`` turns it off). NVTX calls only reach a tool through the injection
library that a profiler such as Nsight Systems names in ``NVTX_INJECTION64_PATH`` when it
starts the process; without it every range is a no-op, so commtrace does not even make the
calls then (``active`` stays False: the wrappers read one module attribute and the ranges cost
nothing). Without the ``nvtx`` package, ranges are off (logged once), never an error.
"""

from __future__ import annotations

import os
import sys

from . import log

DOMAIN = "commtrace"

active = False
_domain = None


def size_text(n) -> str:
    """Human size of a byte count: ``512B``, ``4.0KB``, ``1.5MB``; ``?`` when unknown."""
    if n is None:
        return "?"
    for unit, f in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= f:
            return f"{n / f:.1f}{unit}"
    return f"{n}B"


def message(op: str, nbytes, pg, seq) -> str:
    """The range name: ``"{op} {size} pg={pg} seq={seq}"``."""
    return f"{op} {size_text(nbytes)} pg={pg} seq={seq}"


def profiler_attached(environ=None) -> bool:
    """Whether an NVTX tool is injected into this process (or forced by COMMTRACE_NVTX_FORCE)."""
    env = os.environ if environ is None else environ
    return bool(env.get("NVTX_INJECTION64_PATH") or env.get("NVTX_INJECTION32_PATH")
                or env.get("COMMTRACE_NVTX_FORCE") == "1")


def _entry_changed() -> None:
    # The C fast path keeps `active` seen False until told it changed (recorder._entry_changed):
    # every assignment of `active` after import is followed by this call.
    m = sys.modules.get("commtrace.capture._fastpath")
    f = getattr(m, "entry_changed", None)
    if f is not None:
        f()


def install(enabled: bool = True) -> bool:
    """Turn ranges on when `enabled` and a tool is attached. Idempotent; never raises."""
    try:
        return _install(enabled)
    finally:
        _entry_changed()


def _install(enabled: bool) -> bool:
    global active, _domain
    if not enabled or not profiler_attached():
        active = False
        return False
    try:
        import nvtx

        _domain = nvtx.get_domain(DOMAIN)
        active = True
    except Exception as e:  # ImportError without the package, or a broken install
        log.warn_once("nvtx", "NVTX ranges unavailable", e)
        _domain = None
        active = False
    return active


def uninstall() -> None:
    global active
    active = False
    _entry_changed()


def _attrs(op, nbytes, pg, seq):
    return _domain.get_event_attributes(message=message(op, nbytes, pg, seq), payload=seq)


def push(op: str, nbytes, pg=None, seq=None) -> None:
    """Open the host-call range of one op (closed by :func:`pop`)."""
    try:
        _domain.push_range(_attrs(op, nbytes, pg, seq))
    except Exception as e:
        log.warn_once("nvtx-push", "NVTX range failed", e)


def pop() -> None:
    try:
        _domain.pop_range()
    except Exception:
        pass


def start(op: str, nbytes, pg=None, seq=None):
    """Start the issue-to-wait range of an async op; returns its id (None on failure)."""
    try:
        return _domain.start_range(_attrs(op, nbytes, pg, seq))
    except Exception as e:
        log.warn_once("nvtx-start", "NVTX range failed", e)
        return None


def end(range_id) -> None:
    """End a range opened by :func:`start` (at wait(), or when the op is written unwaited)."""
    if range_id is None:
        return
    try:
        _domain.end_range(range_id)
    except Exception:
        pass
