"""Parts of capture built on demand against the installed torch: today DDP's comm hook in C++
(``_ddp_hook.cpp``; docs/performance.md, "DDP's comm hook in C++").

torch is not a build dependency of commtrace, so nothing here is built at ``pip install``
time: ``commtrace accel build`` (or :func:`build`) compiles the hook with
``torch.utils.cpp_extension`` into a cache directory, under a name keyed by the torch build,
the Python version, commtrace's version and the source; a rank only looks for that file
(:func:`load`) and, where it is missing or does not match, uses the C hook
(``_fastpath.ddp_hook``) as before, without an error. The same module carries the C fast
path's per-call tensor and group reads through torch's C++ API (``_accel_meta.cpp``,
:func:`meta_api`), used where it is built and the Python-level accessors otherwise. Importing this module imports nothing
heavy; :func:`load` needs torch imported already (it is, in a rank that wraps a DDP model).
"""

from __future__ import annotations

import hashlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
#: The C++ source, shipped in the package.
SOURCE = os.path.join(_HERE, "_ddp_hook.cpp")
#: All the sources of the built module: the DDP hook and the C fast path's tensor / group
#: reads through torch's C++ API (``_accel_meta.cpp``; :func:`meta_api`).
SOURCES = [SOURCE, os.path.join(_HERE, "_accel_meta.cpp")]


def cache_dir() -> str:
    """Where built parts live: ``$COMMTRACE_CACHE_DIR``, else ``$XDG_CACHE_HOME/commtrace``,
    else ``~/.cache/commtrace``."""
    d = os.environ.get("COMMTRACE_CACHE_DIR")
    if d:
        return os.path.abspath(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "commtrace")


def module_name() -> str:
    """The built module's name for the torch imported in this process: ``commtrace_ddp_hook_``
    and a hash of what it must match (torch's version and commit, Python's version,
    commtrace's version, the source's bytes)."""
    import torch

    from .. import __version__

    h = hashlib.sha256()
    for src in SOURCES:
        try:
            with open(src, "rb") as f:
                h.update(f.read())
        except OSError as e:
            from ..errors import CommtraceError

            raise CommtraceError(f"this commtrace install lacks {os.path.basename(src)} "
                                 f"(reinstall commtrace): {e.strerror or e}") from e
    for part in (torch.__version__, getattr(torch.version, "git_version", ""),
                 sys.implementation.cache_tag, sys.version, __version__):
        h.update(b"\0" + str(part).encode())
    return "commtrace_ddp_hook_" + h.hexdigest()[:16]


#: Written into the build directory once a build has compiled, linked and imported: a ``.so``
#: without it is a build that was killed (a linker stopped half way leaves a truncated file).
MARKER = "commtrace-built"


def _built_file(name: str) -> str | None:
    bdir = os.path.join(cache_dir(), name)
    try:
        with open(os.path.join(bdir, MARKER)) as f:
            so = os.path.join(bdir, os.path.basename(f.read().strip()))
    except OSError:
        return None
    return so if so.endswith(".so") and os.path.isfile(so) else None


def _exclusive(path: str):
    """An exclusive ``flock`` on ``path`` (a context manager), held until the block ends or the
    process dies: the kernel releases it with the process, so unlike torch's build baton (a
    file that a killed build leaves behind) it cannot go stale."""
    import contextlib

    @contextlib.contextmanager
    def held():
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock, torch's baton only
            yield
            return
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    return held()


def build(verbose: bool = False) -> str:
    """Build the C++ DDP hook for the installed torch (if not built already) and return the
    path of the built module. Needs a C++ compiler (g++ or ``$CXX``) and ninja; raises
    :class:`~commtrace.errors.CommtraceError` with the compiler's message otherwise."""
    from ..errors import CommtraceError

    try:
        import torch  # noqa: F401
        from torch.utils import cpp_extension
    except Exception as e:
        raise CommtraceError(f"building the C++ DDP hook needs torch: {e}") from e
    name = module_name()
    have = _built_file(name)
    if have:
        return have
    import shutil

    cxx = os.environ.get("CXX", "c++")
    if not (shutil.which(cxx) or shutil.which("g++")):
        raise CommtraceError(f"building the C++ DDP hook needs a C++ compiler ({cxx} or g++ "
                             "on PATH, or $CXX)")
    if shutil.which("ninja") is None:
        # pip's ninja installs next to this interpreter, which need not be on PATH
        here = os.path.dirname(sys.executable)
        if os.path.exists(os.path.join(here, "ninja")):
            os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
        else:
            raise CommtraceError("building the C++ DDP hook needs ninja (pip install ninja)")
    bdir = os.path.join(cache_dir(), name)
    try:
        os.makedirs(bdir, exist_ok=True)
    except OSError as e:
        raise CommtraceError(f"cannot create the cache directory {bdir} "
                             f"(set COMMTRACE_CACHE_DIR): {e.strerror or e}") from e
    with _exclusive(bdir + ".build-lock"):
        have = _built_file(name)  # built by another process while this one waited
        if have:
            return have
        # Every builder holds the flock above, so torch's baton file here is one that a killed
        # build left behind (torch would wait on it for ever), and a module here without the
        # marker is one a killed link may have cut short (ninja could take it as up to date):
        # remove both; the compiled objects stay and only the link runs again.
        for left in ["lock"] + [f for f in os.listdir(bdir) if f.endswith(".so")]:
            try:
                os.remove(os.path.join(bdir, left))
            except FileNotFoundError:
                pass
        try:
            mod = cpp_extension.load(name=name, sources=SOURCES, build_directory=bdir,
                                     extra_cflags=["-O2"], verbose=verbose, with_cuda=False,
                                     is_python_module=True)
        except Exception as e:
            raise CommtraceError(f"building the C++ DDP hook failed ({type(e).__name__}): "
                                 f"{str(e)[-2000:]}") from e
        so = getattr(mod, "__file__", None) or ""
        if not (so.endswith(".so") and os.path.isfile(so)):
            raise CommtraceError(f"building the C++ DDP hook left no module in {bdir}")
        tmp = os.path.join(bdir, MARKER + ".tmp")
        with open(tmp, "w") as f:
            f.write(os.path.basename(so) + "\n")
        os.replace(tmp, os.path.join(bdir, MARKER))
    return _built_file(name)


_loaded = False   # the module once looked for (None: not built or not loadable)


def load():
    """The built C++ DDP hook module for this process's torch, or None where it is not built,
    does not match, ``COMMTRACE_DDP_CXX=0``, or fails to load (never raises). Looked for
    once per process."""
    if os.environ.get("COMMTRACE_DDP_CXX", "1") in ("0", ""):
        return None
    return _module()


def meta_api():
    """The capsule of the C fast path's tensor and group reads through torch's C++ API
    (``_accel_meta.cpp``, for ``_fastpath.set_meta_api``), or None where the module is not
    built for this torch, ``COMMTRACE_ACCEL_META=0``, or torch is not fully imported yet
    (never raises)."""
    if os.environ.get("COMMTRACE_ACCEL_META", "1") in ("0", ""):
        return None
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "__version__") or "torch.version" not in sys.modules:
        return None   # torch half-imported: asked again at the next install()
    try:
        mod = _module()
        f = getattr(mod, "meta_api", None)
        return f() if f is not None else None
    except Exception as e:
        from . import log

        log.warn_once("accel-meta", "the built tensor reads did not load; using the accessors", e)
        return None


def _module():
    """The built module (the DDP hook, the tensor reads) or None; looked for once per process."""
    global _loaded
    if _loaded is not False:
        return _loaded
    if "torch" not in sys.modules:
        return None   # not looked for: asked again once torch is imported (not cached as None)
    _loaded = None
    try:
        name = module_name()
        path = _built_file(name)
        if path is None:
            return None
        import importlib.machinery
        import importlib.util

        loader = importlib.machinery.ExtensionFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        _loaded = mod
    except Exception as e:
        from . import log

        log.warn_once("ddp-cxx-load", "the built C++ DDP hook did not load; using the C one", e)
    return _loaded
