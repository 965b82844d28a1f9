"""Steps without changing the script: each ``optimizer.step()`` of the first optimizer seen
advances the recorder's step (a "mark" row with ``detail="optimizer.step"``), until the user
calls :func:`commtrace.mark_step`, which takes over. Ops before the first step are step 0."""

from __future__ import annotations

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


def install() -> bool:
    """Register the global optimizer step post-hook; idempotent."""
    global _handle
    if _handle is not None:
        return True
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _handle = register_optimizer_step_post_hook(_hook)
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
