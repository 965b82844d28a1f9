"""NVTX: one range per op in the domain "commtrace", named after the op and its size.

On by default (``--no-nvtx`` turns it off). NVTX calls only reach a tool through the injection
library that a profiler such as Nsight Systems names in ``NVTX_INJECTION64_PATH`` when it
starts the process; without it every range is a no-op, so commtrace does not even make the
calls then (``active`` stays False) and the ranges cost nothing.
"""

from __future__ import annotations

import os

from . import log

active = False
_domain = None
_attrs: dict = {}
_MAX_ATTRS = 4096


def _size(n) -> str:
    if n is None:
        return ""
    for unit, f in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= f:
            return f" {n / f:.1f}{unit}"
    return f" {n}B"


def profiler_attached(environ=None) -> bool:
    """Whether an NVTX tool is injected into this process (or forced by COMMTRACE_NVTX_FORCE)."""
    env = os.environ if environ is None else environ
    return bool(env.get("NVTX_INJECTION64_PATH") or env.get("NVTX_INJECTION32_PATH")
                or env.get("COMMTRACE_NVTX_FORCE") == "1")


def install(enabled: bool = True) -> bool:
    """Turn ranges on when `enabled` and a tool is attached. Idempotent; never raises."""
    global active, _domain
    if not enabled or not profiler_attached():
        active = False
        return False
    try:
        import nvtx

        _domain = nvtx.get_domain("commtrace")
        active = True
    except Exception as e:
        log.warn_once("nvtx", "NVTX ranges unavailable", e)
        active = False
    return active


def uninstall() -> None:
    global active
    active = False


def push(op: str, nbytes) -> None:
    try:
        key = (op, nbytes)
        a = _attrs.get(key)
        if a is None:
            a = _domain.get_event_attributes(op + _size(nbytes))
            if len(_attrs) < _MAX_ATTRS:
                _attrs[key] = a
        _domain.push_range(a)
    except Exception as e:
        log.warn_once("nvtx-push", "NVTX range failed", e)


def pop() -> None:
    try:
        _domain.pop_range()
    except Exception:
        pass
