"""commtrace bootstrap, put first on PYTHONPATH by `commtrace run`.

Arms tracing (commtrace.capture.autostart) and then runs the sitecustomize that would have run
without us, if any. Never raises: a failure prints one line and the program runs untraced.
"""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))


def _commtrace_bootstrap():
    try:
        from commtrace.capture import autostart
    except ImportError:
        pkg = os.environ.get("COMMTRACE_PKG_PATH")
        if not pkg:
            raise
        sys.path.append(pkg)
        from commtrace.capture import autostart
    autostart.bootstrap()


try:
    _commtrace_bootstrap()
except Exception as _e:  # pragma: no cover - depends on the child's interpreter
    sys.stderr.write(f"commtrace: tracing not armed in pid {os.getpid()}: {_e!r}\n")


def _chain():
    """Import the next `sitecustomize` on sys.path (ours shadows it)."""
    import importlib

    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError as e:
        if e.name != "sitecustomize":
            sys.stderr.write(f"commtrace: the existing sitecustomize failed: {e!r}\n")
    except Exception as e:
        sys.stderr.write(f"commtrace: the existing sitecustomize failed: {e!r}\n")
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours


_chain()
