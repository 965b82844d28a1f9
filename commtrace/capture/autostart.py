"""Turning tracing on in every Python process of a command, through the environment.

``commtrace run`` puts ``commtrace/capture/bootstrap`` first on ``PYTHONPATH`` and sets
``COMMTRACE_ENABLE=1`` plus the :class:`~commtrace.config.Config` variables. The bootstrap's
``sitecustomize`` calls :func:`bootstrap`, which only installs an import hook: when
``torch.distributed.distributed_c10d`` finishes executing (torch is still half-initialised
then, ``shared/reference/torch-notes.md``), the torch.distributed functions are wrapped and
``init_process_group`` is hooked; the recorder, DDP and functional collectives follow when a
process group is created. A process that never creates one writes nothing.
"""

from __future__ import annotations

import os
import sys

TARGET = "torch.distributed.distributed_c10d"


def _on_loaded(module) -> None:
    try:
        from . import api

        api.install_c10d_hooks(module)
    except Exception as e:
        from . import log

        log.warn_once("bootstrap-hook", "cannot hook torch.distributed", e)


def bootstrap(environ=None) -> bool:
    """Arm tracing in this process when ``COMMTRACE_ENABLE=1`` (idempotent). Returns whether
    armed."""
    env = os.environ if environ is None else environ
    if env.get("COMMTRACE_ENABLE", "") != "1":
        return False
    mod = sys.modules.get(TARGET)
    if mod is not None and getattr(mod, "init_process_group", None) is not None:
        _on_loaded(mod)  # already imported (e.g. bootstrap called late)
        return True
    from .importhook import on_import

    on_import(TARGET, _on_loaded)
    return True
