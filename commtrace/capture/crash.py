"""How a rank's process ended, for the report's ``job`` verdict (docs/troubleshooting.md).

* **Fatal signals** (SIGABRT from a C++ ``std::terminate``, SIGSEGV, SIGFPE, SIGBUS, SIGILL):
  :func:`faulthandler.enable` writes the Python stacks of every thread into
  ``rank=<r>/_crash-<pid>.txt``, opened empty at start. faulthandler's fatal-signal handler is
  async-signal-safe (``write(2)`` of frames it reads without the GIL), then re-raises the
  signal, so the process still dies of it with its usual exit status. A non-empty crash file
  tells the reader that the rank crashed and of which signal; an empty one is removed at a
  normal exit.

  The rows still in the C buffer are **not** written at that point: they are Python objects
  (tuples, strings, ints) whose conversion to Arrow needs the interpreter, allocation and
  pyarrow, none of which may run in a signal handler (the crashing thread may hold the
  allocator's or the GIL's lock). Instead the first flush comes 0.2 s after tracing starts
  (``recorder.FIRST_FLUSH_S``) and then every ``--flush-interval``; what a peer recorded (the
  crashed rank's last joined collective) fills in the rest.
* **Uncaught exceptions** (``sys.excepthook``, chained) and **SIGINT / SIGTERM** (the
  recorder's handlers) set :attr:`Recorder.exit_info`, which the exit flush writes as ``exit``
  in ``_inflight.json``; a normal exit writes ``{"how": "ok"}``.
* **``sys.exit(n)``**: an uncaught ``SystemExit`` reaches neither ``sys.excepthook`` nor any
  hook the interpreter offers, and its code is not readable at exit (Python 3.11 does not even
  keep the full traceback on the exception). ``sys.exit`` is wrapped: in the main thread, with
  n != 0, it notes n and the last instruction of every frame of its caller's stack, up to the
  outermost (the script's ``<module>``, runpy's ``_run_module_as_main``). At the exit flush, if
  each of those frames stopped at that call, or at the ``RERAISE`` that ends a ``finally:``, a
  ``with`` block's exit or a non-matching ``except``, the exception unwound all of them and n is
  the process's exit status, written as ``{"how": "exit", "exit_code": n, "via": "sys.exit"}``.
  A ``SystemExit`` caught on the way (pytest, ``multiprocessing``'s bootstrap, a ``try``
  anywhere) leaves its catcher running on past the handler, and is ignored.
* **``os._exit(n)``** skips ``atexit``: ``os._exit`` is wrapped to write the exit flush with
  ``{"how": "exit", "exit_code": n, "via": "os._exit"}`` first, then exit as asked.

Not seen (the rank then reads as exited normally, or as killed when no exit flush ran):
``raise SystemExit(n)`` and ``exit(n)`` / ``quit(n)`` (they do not go through ``sys.exit``),
``sys.exit`` bound under another name before tracing started (``from sys import exit``), the
same for ``os._exit``, and ``exit()`` / ``_exit()`` called from C or C++ code.

When faulthandler is already enabled in the process (``PYTHONFAULTHANDLER``, the user's own
call), it is left alone: the crash is then only known from the missing exit flush.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import sys

from . import log

_state: dict = {}


def _error_text(exc) -> str:
    try:
        msg = str(exc).splitlines()[0] if str(exc) else ""
    except Exception:
        msg = ""
    return f"{type(exc).__name__}: {msg}"[:300] if msg else type(exc).__name__


#: commtrace's package directory: frames from files under it are ours.
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _without_own_frames(tb):
    """The traceback `tb` minus commtrace's own frames (the SIGINT handler that flushed before
    the user's KeyboardInterrupt was raised, a wrapper it passed through), or `tb` itself when
    nothing else would be left."""
    kept = []
    t = tb
    while t is not None:
        if not t.tb_frame.f_code.co_filename.startswith(_OWN_DIR):
            kept.append(t)
        t = t.tb_next
    if not kept or len(kept) == _tb_len(tb):
        return tb
    for a, b in zip(kept, kept[1:]):
        a.tb_next = b
    kept[-1].tb_next = None
    return kept[0]


def _tb_len(tb) -> int:
    n = 0
    while tb is not None:
        n, tb = n + 1, tb.tb_next
    return n


def _strip_interrupt(value, tb):
    """A user's Ctrl-C is not commtrace's doing: its printed traceback (and those of the
    exceptions it interrupted) shows no commtrace frame."""
    try:
        tb = _without_own_frames(tb)
        seen, e = {id(value)}, value.__context__
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            e.__traceback__ = _without_own_frames(e.__traceback__)
            e = e.__cause__ or e.__context__
    except Exception:
        pass
    return tb


def _excepthook(etype, value, tb):
    if isinstance(etype, type) and issubclass(etype, KeyboardInterrupt):
        tb = _strip_interrupt(value, tb)
    rec = _state.get("rec")
    if rec is not None:
        try:
            if issubclass(etype, KeyboardInterrupt):
                rec.exit_info = {"how": "signal", "signal": "SIGINT", "exit_code": 130}
            else:
                rec.exit_info = {"how": "exception", "exit_code": 1, "error": _error_text(value)}
        except Exception:
            pass
    prev = _state.get("prev_hook") or sys.__excepthook__
    return prev(etype, value, tb)


def _exit_status(code) -> int:
    """The process exit status `sys.exit(code)` / `os._exit(code)` leads to (CPython: None is
    0, an int is itself modulo 256, anything else is printed and gives 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code) & 0xFF
    return 1


def _sys_exit(*args, **kwargs):
    """sys.exit, noting its exit status and where each frame of the caller's stack was (read
    at the exit flush: :func:`exit_info`)."""
    try:
        _state.pop("system_exit", None)
        st = _exit_status(args[0] if args else kwargs.get("status"))
        import threading

        if st != 0 and threading.current_thread() is threading.main_thread():
            chain, f = [], sys._getframe(1)
            while f is not None:
                chain.append((f, f.f_lasti))
                f = f.f_back
            _state["system_exit"] = (st, chain)
    except Exception:
        pass
    return _state["orig_sys_exit"](*args, **kwargs)


def _os_exit(*args, **kwargs):
    """os._exit, after the exit flush of this process's recorder (os._exit skips atexit)."""
    rec = _state.get("rec")
    if rec is not None and _state.get("pid") == os.getpid():
        try:
            code = args[0] if args else kwargs.get("status")
            if rec.exit_info is None:
                st = _exit_status(code)
                rec.exit_info = ({"how": "ok", "exit_code": 0} if st == 0 else
                                 {"how": "exit", "exit_code": st, "via": "os._exit"})
            rec.close()
        except Exception:
            pass
    return _state["orig_os_exit"](*args, **kwargs)


def exit_info() -> dict | None:
    """``{"how": "exit", "exit_code": n, "via": "sys.exit"}`` when the process is ending on
    an uncaught ``sys.exit(n)`` with n != 0 (see the module docstring); else None. Called by
    the exit flush; never raises."""
    try:
        se = _state.get("system_exit")
        if se is None:
            return None
        st, chain = se
        # A frame the SystemExit unwound through stopped at the call for good, or at the
        # RERAISE that ends a `finally:`, a `with` block's exit or an `except` that did not
        # match; a frame that caught it went on past its handler (elsewhere for good).
        if any(f.f_lasti != lasti and not _at_reraise(f) for f, lasti in chain):
            return None
        return {"how": "exit", "exit_code": st, "via": "sys.exit"}
    except Exception:
        return None


def _at_reraise(frame) -> bool:
    """True when `frame` stopped at a RERAISE (an exception went on through it)."""
    import dis

    try:
        return frame.f_code.co_code[frame.f_lasti] == dis.opmap.get("RERAISE", -1)
    except (IndexError, AttributeError):
        return False


def _hook_exits() -> None:
    if sys.exit is not _sys_exit:
        _state["orig_sys_exit"] = sys.exit
        sys.exit = _sys_exit
    if os._exit is not _os_exit:
        _state["orig_os_exit"] = os._exit
        os._exit = _os_exit


def _unhook_exits() -> None:
    if sys.exit is _sys_exit and _state.get("orig_sys_exit"):
        sys.exit = _state["orig_sys_exit"]
    if os._exit is _os_exit and _state.get("orig_os_exit"):
        os._exit = _state["orig_os_exit"]


def install(rec) -> None:
    """Open the crash file of `rec`'s rank and hook uncaught exceptions, ``sys.exit`` and
    ``os._exit`` (idempotent)."""
    if _state.get("rec") is rec:
        return
    uninstall()
    _state["rec"] = rec
    _state["pid"] = os.getpid()
    if sys.excepthook is not _excepthook:
        _state["prev_hook"] = sys.excepthook
        sys.excepthook = _excepthook
    _hook_exits()
    if faulthandler.is_enabled():
        return  # someone else's: leave it
    try:
        from ..format import schema as S

        d = os.path.join(rec.run_dir, S.RANK_DIR_FMT.format(rank=rec.rank))
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, S.CRASH_FMT.format(pid=os.getpid()))
        f = open(path, "w")
        faulthandler.enable(file=f, all_threads=True)
        _state["file"], _state["path"] = f, path
    except Exception as e:
        log.warn_once("crash-file", "cannot arm the crash dump", e)
    if not _state.get("atexit"):
        atexit.register(uninstall)
        _state["atexit"] = True


def uninstall() -> None:
    """Stop the crash dump; remove the crash file when nothing was written to it."""
    if sys.excepthook is _excepthook:
        sys.excepthook = _state.get("prev_hook") or sys.__excepthook__
    _state.pop("prev_hook", None)
    _state.pop("rec", None)
    _state.pop("pid", None)
    _unhook_exits()
    f = _state.pop("file", None)
    path = _state.pop("path", None)
    if f is None:
        return
    try:
        faulthandler.disable()
    except Exception:
        pass
    try:
        f.close()
        if path and os.path.getsize(path) == 0:
            os.unlink(path)
    except OSError:
        pass


def closed(rec) -> None:
    """`rec` wrote its exit flush: stop its crash dump (never raises)."""
    try:
        if _state.get("rec") is rec:
            uninstall()
    except Exception:
        pass


def _forget_after_fork() -> None:
    # A forked child has no recorder of its own; its parent's crash file is not its own.
    f = _state.pop("file", None)
    _state.pop("path", None)
    _state.pop("rec", None)
    _state.pop("system_exit", None)
    if f is not None:
        try:
            faulthandler.disable()
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
