"""Run a function right after a module finishes executing, through one meta-path finder.

Used by :mod:`.autostart` (wrap torch.distributed when ``distributed_c10d`` is imported) and by
:mod:`.compile` (Dynamo's and funcol's remaps). The finder delegates to the rest of
``sys.meta_path`` and only wraps the loader of a module that has hooks, so every other import is
untouched. Import-light: nothing here imports torch or the rest of commtrace at import time.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading

_hooks: dict[str, list] = {}
_lock = threading.Lock()
_finder: "_Finder | None" = None


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader and runs the hooks after the module executed."""

    def __init__(self, inner, hooks):
        self._inner, self._hooks = inner, hooks

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        for hook in self._hooks:
            try:
                hook(module)
            except Exception as e:  # never into the user's import
                from . import log

                log.warn_once(f"import-hook-{module.__name__}", "an import hook failed", e)

    def __getattr__(self, name):  # get_source, get_filename, ... (inspect, linecache)
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        hooks = _hooks.get(fullname)
        if not hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, tuple(hooks))
                return spec
        return None


def on_import(name: str, hook) -> None:
    """Call ``hook(module)`` each time module ``name`` finishes executing from now on
    (idempotent per hook; the caller handles a module that is already imported)."""
    global _finder
    with _lock:
        hooks = _hooks.setdefault(name, [])
        if hook not in hooks:
            hooks.append(hook)
        if _finder is None:
            _finder = _Finder()
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
