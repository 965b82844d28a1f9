"""Steps without changing the script: each ``optimizer.step()`` of the first optimizer seen
advances the recorder's step (a "mark" row with ``detail="optimizer.step"``), until the user
calls :func:`commtrace.mark_step`, which takes over. Ops before the first step are step 0.

With the C module the hook is ``_fastpath.step_hook``, which does what :func:`_hook` does
(``COMMTRACE_PURE_PYTHON=1``: :func:`_hook` itself)."""

from __future__ import annotations

import sys
import weakref

from . import log
from . import recorder as _R

_handle = None
_opt_ref = None


def _hook(optimizer, args, kwargs) -> None:
    global _opt_ref
    rec = _R._recorder
    if rec is None or rec.manual_steps:
        return
    try:
        if _opt_ref is None or _opt_ref() is None:
            _opt_ref = weakref.ref(optimizer)
        elif _opt_ref() is not optimizer:
            return
        rec.step = (rec.step or 0) + 1
        rec.emit(kind="mark", step=rec.step, detail="optimizer.step")
    except Exception as e:
        log.warn_once("steps", "step marker failed", e)


def _warn(e) -> None:
    """The C hook's error path (it logs as :func:`_hook` does)."""
    log.warn_once("steps", "step marker failed", e)


def _c_hook():
    """``_fastpath.step_hook`` (the same checks and the same "mark" row as :func:`_hook`, with
    no Python frame per step; issue 20), or None without the C module. It hands a recorder
    the C async path does not know to :func:`_hook`."""
    cf = _R._cfast
    if cf is None or getattr(cf, "step_hook", None) is None:
        return None
    try:
        from ..format import schema as S
        from . import sites

        cf.steps_setup(sys.modules[__name__], _R, S.KIND_MARK, "optimizer.step",
                       sites.site_of_frame, sites._code_internal, sites._site_pairs)
        return cf.step_hook
    except Exception as e:
        log.warn_once("steps-c", "step marker in C not used", e)
        return None


def install() -> bool:
    """Register the global optimizer step post-hook; idempotent."""
    global _handle
    if _handle is not None:
        return True
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _handle = register_optimizer_step_post_hook(_c_hook() or _hook)
        return True
    except Exception as e:
        log.warn_once("steps-install", "optimizer steps not tracked", e)
        return False


def uninstall() -> None:
    global _handle, _opt_ref
    if _handle is not None:
        _handle.remove()
    _handle = None
    _opt_ref = None
