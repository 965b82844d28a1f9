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

import importlib.abc
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


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader and runs our hook after the module executed."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _on_loaded(module)

    def __getattr__(self, name):  # get_source, get_filename, ... (inspect, linecache)
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_finder: _Finder | None = None


def bootstrap(environ=None) -> bool:
    """Arm tracing in this process when ``COMMTRACE_ENABLE=1`` (idempotent). Returns whether
    armed."""
    global _finder
    env = os.environ if environ is None else environ
    if env.get("COMMTRACE_ENABLE", "") != "1":
        return False
    mod = sys.modules.get(TARGET)
    if mod is not None and getattr(mod, "init_process_group", None) is not None:
        _on_loaded(mod)  # already imported (e.g. bootstrap called late)
        return True
    if _finder is None:
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)
    return True
