"""Host synchronisation calls as ``kind="sync"`` rows (issue 4, item 3).

``torch.cuda.synchronize()`` drains every stream of the device, ``Stream.synchronize()`` and
``Event.synchronize()`` block the host on one stream or event, ``Work.synchronize()`` makes the
current stream wait for a collective. Each call made while tracing gives one row with its host
begin (``t_enqueue_ns``) and end (``t_return_ns``), the number and op ids of the async ops in
flight at the call (``inflight``, ``inflight_ids``) and the user's call site. Analysis turns
these into ``sync_while_inflight`` and ``redundant_sync`` (``shared/reference/metrics.md``,
"Synchronisation rules").

Outside CUDA the wrappers are not installed at all (zero cost); with no active recorder an
installed wrapper is one function call and one ``None`` test. Nothing here raises into user
code: the original's own exceptions pass through unchanged, ours are logged once.
"""

from __future__ import annotations

import threading

from . import registry
from .log import warn_once
from .sites import user_site

_tls = threading.local()
_installed: list[tuple[object, str]] = []
_lock = threading.Lock()
_get_recorder = None  # set by install(); defaults to commtrace.capture.recorder.get_recorder

def _recorder():
    g = _get_recorder
    if g is None:
        return None
    try:
        return g()
    except Exception:
        return None


def _default_get_recorder():
    try:
        from .recorder import get_recorder
    except Exception as e:
        warn_once("sync-no-recorder", "sync capture: no recorder module", e)
        return None
    return get_recorder


def _make_wrapper(orig, api: str):
    def wrapper(*args, **kwargs):
        rec = _recorder()
        if rec is None or getattr(_tls, "busy", False):
            return orig(*args, **kwargs)
        try:
            ids = list(rec.inflight_ids())
            site = user_site(2)
            begin = rec.now_ns()
        except Exception as e:
            warn_once(("sync-pre", api), f"sync capture of {api} failed", e)
            return orig(*args, **kwargs)
        _tls.busy = True  # e.g. a Stream.synchronize inside a user's Event.synchronize override
        try:
            return orig(*args, **kwargs)
        finally:
            _tls.busy = False
            try:
                end = rec.now_ns()
                rec.emit(kind="sync", api=api, t_enqueue_ns=begin, t_return_ns=end,
                         inflight=len(ids), inflight_ids=ids, site=site)
            except Exception as e:
                warn_once(("sync-emit", api), f"sync capture of {api} failed", e)

    setattr(wrapper, registry.ORIGINAL_ATTR, orig)
    wrapper.__name__ = getattr(orig, "__name__", "synchronize")
    wrapper.__qualname__ = getattr(orig, "__qualname__", wrapper.__name__)
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    return wrapper


def targets(cuda=None, work_cls=None, accelerator=None) -> list[tuple[object, str, str]]:
    """(owner, attribute, api name) of every synchronisation call wrapped."""
    if cuda is None:
        import torch

        cuda = torch.cuda
        if accelerator is None:
            accelerator = getattr(torch, "accelerator", None)
    if work_cls is None:
        try:
            from torch.distributed.distributed_c10d import Work as work_cls
        except Exception:
            work_cls = None
    out = [(cuda, "synchronize", "torch.cuda.synchronize")]
    if getattr(cuda, "Stream", None) is not None:
        out.append((cuda.Stream, "synchronize", "torch.cuda.Stream.synchronize"))
    if getattr(cuda, "Event", None) is not None:
        out.append((cuda.Event, "synchronize", "torch.cuda.Event.synchronize"))
    if work_cls is not None and hasattr(work_cls, "synchronize"):
        out.append((work_cls, "synchronize", "Work.synchronize"))
    if accelerator is not None and hasattr(accelerator, "synchronize"):
        out.append((accelerator, "synchronize", "torch.accelerator.synchronize"))
    return out


def install(get_recorder=None, cuda=None, work_cls=None, accelerator=None,
            force: bool = False) -> bool:
    """Wrap the synchronisation calls (idempotent). Off CUDA nothing is installed unless
    `force` (tests pass fake `cuda` / `work_cls` namespaces). Returns whether wrappers are in."""
    global _get_recorder
    try:
        if not force:
            import torch

            if not torch.cuda.is_available():
                return False
        with _lock:
            _get_recorder = get_recorder or _default_get_recorder()
            for owner, name, api in targets(cuda, work_cls, accelerator):
                if registry.patched(owner, name):
                    continue
                orig = registry.get_original(owner, name)
                if registry.patch(owner, name, _make_wrapper(orig, api)):
                    _installed.append((owner, name))
        return bool(_installed)
    except Exception as e:
        warn_once("sync-install", "could not install synchronize capture", e)
        return False


def uninstall() -> None:
    """Restore every wrapped synchronisation call."""
    global _get_recorder
    with _lock:
        for owner, name in _installed:
            registry.restore(owner, name)
        _installed.clear()
        _get_recorder = None


def installed() -> bool:
    return bool(_installed)
