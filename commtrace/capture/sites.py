"""`site`: the first user frame outside torch and commtrace, as ``file:line``.

The walk is a few attribute reads per frame; whether a frame is internal is cached per code
object (and per file name behind it), so the cost per op is one dict lookup per frame between
the user and our wrapper. On the hot path the wrappers keep the raw ``(file, line)`` pair
(:func:`user_site_raw`) and the writer thread formats it (:func:`format_site`): no string is
built on the training thread.
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


#: id(code) -> bool. Keyed by id, not by the code object: hashing a code object hashes its
#: contents (0.1-0.7 us for a training loop's function, on every op). The code objects are kept
#: alive in _codes_kept, so an id is never reused for another code object while cached.
_code_internal: dict = {}
_codes_kept: dict = {}      # id(code) -> code
_MAX_CODES = 100_000


def _keep(code) -> bool:
    """Keep `code` alive (its id stays its own); False when the cache is full."""
    k = id(code)
    if k in _codes_kept:
        return True
    if len(_codes_kept) >= _MAX_CODES:
        return False
    _codes_kept[k] = code
    return True


def _code_is_internal(code) -> bool:
    fn = code.co_filename
    b = _internal.get(fn)
    if b is None:
        b = _is_internal(fn)
    if _keep(code):
        _code_internal[id(code)] = b
    return b


#: (id(code), f_lasti) -> (file, line): one shared pair per call site, so recording a site
#: allocates nothing that lives on (and computes no line number) after the first time.
_site_pairs: dict = {}
_MAX_SITES = 1 << 16


def site_pair(f) -> tuple:
    """``(file, line)`` of frame `f`, shared per call site."""
    code = f.f_code
    k = (id(code), f.f_lasti)
    s = _site_pairs.get(k)
    if s is None:
        s = (code.co_filename, f.f_lineno)
        if len(_site_pairs) < _MAX_SITES and _keep(code):
            _site_pairs[k] = s
    return s


def site_of_frame(f) -> tuple | None:
    """``(file, line)`` of the first frame from `f` outwards that lies outside torch and
    commtrace; None when there is none."""
    get = _code_internal.get
    while f is not None:
        code = f.f_code
        b = get(id(code))
        if b is None:
            b = _code_is_internal(code)
        if not b:
            return site_pair(f)
        f = f.f_back
    return None


def user_site_raw(depth: int = 2) -> tuple | None:
    """Like :func:`user_site`, but the raw ``(file, line)`` pair (format it off the hot path
    with :func:`format_site`)."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return None
    return site_of_frame(f)


def format_site(v) -> str | None:
    """``file:line`` from a raw site pair; strings and None pass through."""
    if v is None or isinstance(v, str):
        return v
    return f"{v[0]}:{v[1]}"


def user_site(depth: int = 2) -> str | None:
    """``file:line`` of the first frame, starting `depth` frames above the caller, that lies
    outside torch and commtrace; None when there is none."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return None
    v = site_of_frame(f)
    if v is None or isinstance(v, str):
        return v
    # One string object per site, not one per call: the writer encodes each distinct string
    # object of a part once (``_fastpath.pack_rows``), so a mark row per step with a string of
    # its own costs the flush a Python format and encode per row (as _fastpath's mark_site).
    s = _SITE_STR.get(v)
    if s is None:
        if len(_SITE_STR) >= _SITE_STR_MAX:
            _SITE_STR.clear()
        s = _SITE_STR[v] = format_site(v)
    return s


#: site pair -> its ``file:line`` string (:func:`user_site`), bounded
_SITE_STR: dict = {}
_SITE_STR_MAX = 4096
