"""`site`: the first user frame outside torch and commtrace, as ``file:line``.

The walk is a few attribute reads per frame; whether a file is internal is cached per file
name, so the cost per op is that of the frames between the user and our wrapper.
"""

from __future__ import annotations

import os
import sys

_internal: dict[str, bool] = {}
_prefixes: tuple[str, ...] | None = None


def _compute_prefixes() -> tuple[str, ...]:
    pre = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep]
    mod = sys.modules.get("torch")
    tf = getattr(mod, "__file__", None) if mod is not None else None
    if tf:
        pre.append(os.path.dirname(os.path.abspath(tf)) + os.sep)
    import contextlib
    import functools

    for m in (contextlib, functools):
        pre.append(os.path.abspath(m.__file__))
    return tuple(pre)


def _is_internal(fn: str) -> bool:
    global _prefixes
    if _prefixes is None:
        _prefixes = _compute_prefixes()
    b = fn.startswith(_prefixes) or fn.startswith("<frozen")
    if not b and not os.path.isabs(fn) and not fn.startswith("<"):
        b = os.path.abspath(fn).startswith(_prefixes)
    _internal[fn] = b
    return b


def user_site(depth: int = 2) -> str | None:
    """``file:line`` of the first frame, starting `depth` frames above the caller, that lies
    outside torch and commtrace; None when there is none."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return None
    get = _internal.get
    while f is not None:
        fn = f.f_code.co_filename
        b = get(fn)
        if b is None:
            b = _is_internal(fn)
        if not b:
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return None
