"""Hang watchdog of a rank: flush the trace and dump every thread's Python stack when an op stays
in flight longer than ``--hang-timeout``, and on demand with SIGUSR1.

A hung rank's main thread is usually blocked inside C++ (a gloo or NCCL wait) with the GIL
released, where Python-level signal handlers never run (``shared/reference/torch-notes.md``).
So nothing here relies on them:

* a daemon thread (``commtrace-watchdog``) wakes every ``min(1 s, timeout / 4)`` and looks for
  ops in flight longer than the timeout: async ops through :meth:`Recorder.pending_ops`, and the
  blocking calls in progress through :meth:`Recorder.blocking_rows` (with an older recorder
  without it, by finding the capture wrapper's frame in :func:`sys._current_frames` and reading
  its ``row`` local). For each new hung op it writes
  ``rank=<r>/stacks-<time>.txt`` (a header naming the op, then
  :func:`faulthandler.dump_traceback` of all threads, which reads the frames at C level) and
  forces :meth:`Recorder.flush`, so that the parts and ``_inflight.json`` hold everything up to
  the hang even if the rank is later killed with SIGKILL;
* SIGUSR1: with the C extension, a C-level handler only counts the signal (chained to the
  handler it replaced, never to the default action, which would kill the process); the watchdog
  thread sees the count change at its next wake-up and writes ``stacks-<time>.txt`` with
  :func:`faulthandler.dump_traceback` of all threads, holding the GIL, then flushes the trace.
  This works whatever the main thread is doing, because it never needs the main thread.
  Without the C extension, :func:`faulthandler.register` dumps from inside the signal handler
  into a scratch file of the rank directory, unlinked as soon as it is opened, and the watchdog
  copies each new dump. That dump reads the frames of threads that may be running at that moment,
  and can crash the process (CPython gh-116008; once here, a rank blocked in gloo died with
  SIGSEGV). (A rank whose main thread holds the GIL forever stops the watchdog thread too;
  ``py-spy dump --pid`` is the tool there.)

Timeout 0 (or ``--no-dump-on-hang`` for the stacks part) turns the hang check off; SIGUSR1 dumps
stay on. Nothing here raises into user code: failures are logged once.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time

from . import log
from . import recorder as _R

THREAD_NAME = "commtrace-watchdog"
#: At most this many hang dumps per process (a job hung on many ops must not fill the disk).
MAX_DUMPS = 16
#: Scratch file faulthandler writes SIGUSR1 dumps into (unlinked right after it is opened).
USR1_FMT = ".sigusr1-{pid}.tmp"

_lock = threading.Lock()
_active: "_Watchdog | None" = None


def _wrapper_code_names():
    """(filename, function names) of the capture frames a blocking op is in."""
    try:
        from . import wrappers

        return os.path.abspath(wrappers.__file__), ("_call",)
    except Exception:  # pragma: no cover
        return None, ()


def _describe(row) -> str:
    """One line naming an op row: `all_reduce seq 5 on pg 0 (api all_reduce) at f.py:12`."""
    I = _R.IDX
    op = row[I["op"]] or row[I["api"]] or "op"
    parts = [str(op)]
    if row[I["seq"]] is not None:
        parts.append(f"seq {row[I['seq']]}")
    if row[I["pg"]] is not None:
        parts.append(f"on pg {row[I['pg']]}")
    if row[I["api"]] and row[I["api"]] != op:
        parts.append(f"(api {row[I['api']]})")
    site = row[I["site"]]
    if site:
        try:
            from .sites import format_site  # the row may hold a raw site, formatted on demand

            site = format_site(site)
        except ImportError:
            pass
        except Exception:
            site = str(site)
        parts.append(f"at {site}")
    return " ".join(parts)


class _Watchdog:
    def __init__(self, rec):
        self.rec = rec
        cfg = rec.config
        self.timeout_s = max(0.0, float(getattr(cfg, "hang_timeout", 600.0) or 0.0))
        self.dump_stacks = bool(getattr(cfg, "dump_on_hang", True))
        self.interval_s = min(1.0, max(0.05, self.timeout_s / 4)) if self.timeout_s > 0 else 0.5
        self.stop = threading.Event()
        self.seen: set = set()       # op ids already reported as hung
        self.asked: set = set()      # (rank, pg, seq) already asked for their stacks
        self.dumps = 0
        self.usr1_file = None
        self.usr1_size = 0
        self.usr1_registered = False
        self.usr1_c = None           # the C module counting SIGUSR1, when it is used
        self.usr1_seen = 0
        self.thread: threading.Thread | None = None
        self.code_file, self.code_names = _wrapper_code_names()

    # -------------------------------------------------------------- paths

    def rank_dir(self) -> str:
        from ..format import writer as W

        d = W.rank_dir(self.rec.run_dir, self.rec.rank)
        os.makedirs(d, exist_ok=True)
        return d

    def _stacks_path(self) -> str:
        d = self.rank_dir()
        now = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
        path = os.path.join(d, f"stacks-{stamp}.txt")
        n = 1
        while os.path.exists(path):
            n += 1
            path = os.path.join(d, f"stacks-{stamp}-{n}.txt")
        return path

    # -------------------------------------------------------------- SIGUSR1

    def register_usr1(self) -> None:
        if not hasattr(signal, "SIGUSR1"):
            return
        try:
            prev = signal.getsignal(signal.SIGUSR1)
        except Exception:
            prev = signal.SIG_DFL
        # Chaining to SIG_DFL would re-raise SIGUSR1 with its default action: terminate.
        chain = prev not in (signal.SIG_DFL, signal.SIG_IGN)
        c = _R._cfast
        if c is not None and hasattr(c, "usr1_install"):
            try:
                self.usr1_seen = c.usr1_install()
                self.usr1_c = c
                return
            except Exception as e:
                log.warn_once("watchdog-usr1-c", "C SIGUSR1 handler unavailable; using faulthandler", e)
        try:
            path = os.path.join(self.rank_dir(), USR1_FMT.format(pid=os.getpid()))
            self.usr1_file = open(path, "w+b")
            try:
                os.unlink(path)
            except OSError:
                pass
            faulthandler.register(signal.SIGUSR1, file=self.usr1_file, all_threads=True,
                                  chain=chain)
            self.usr1_registered = True
        except Exception as e:
            log.warn_once("watchdog-usr1", "SIGUSR1 stack dumps unavailable", e)
            self._close_usr1()

    def _close_usr1(self) -> None:
        c, self.usr1_c = self.usr1_c, None
        if c is not None:
            try:
                c.usr1_uninstall()
            except Exception:
                pass
        if self.usr1_registered:
            try:
                faulthandler.unregister(signal.SIGUSR1)
            except Exception:
                pass
            self.usr1_registered = False
        f, self.usr1_file = self.usr1_file, None
        if f is not None:
            try:
                f.close()
            except Exception:
                pass

    def _check_usr1(self) -> None:
        c = self.usr1_c
        if c is not None:
            n = c.usr1_count()
            if n == self.usr1_seen:
                return
            self.usr1_seen = n
            path = self._dump("SIGUSR1 received", self.hung_ops(0))
            self._flush()
            log.info(f"rank {self.rec.rank}: SIGUSR1: stacks written to {path}")
            return
        f = self.usr1_file
        if f is None:
            return
        try:
            size = os.fstat(f.fileno()).st_size
        except (OSError, ValueError):
            return
        if size <= self.usr1_size:
            return
        for _ in range(20):  # let faulthandler finish writing this dump
            time.sleep(0.05)
            new = os.fstat(f.fileno()).st_size
            if new == size:
                break
            size = new
        data = os.pread(f.fileno(), size - self.usr1_size, self.usr1_size)
        self.usr1_size = size
        path = self._stacks_path()
        with open(path, "wb") as out:
            out.write(self._header("SIGUSR1 received", self.hung_ops(0)).encode())
            out.write(data)
        self._flush()
        log.info(f"rank {self.rec.rank}: SIGUSR1: stacks written to {path}")

    # -------------------------------------------------------------- hang detection

    def hung_ops(self, min_age_ns: int) -> list[tuple[int, int, list]]:
        """(op_id, age_ns, row) of ops in flight for at least `min_age_ns`: async ops not
        completed, and the blocking call any thread is inside of."""
        rec = self.rec
        now = rec.now_ns()
        I_END, I_ENQ, I_ID = _R.I_T_END, _R.I_T_ENQ, _R.I_OP_ID
        out: dict = {}
        for p in list(rec.pending_ops().values()):
            row = p.row
            t = row[I_ENQ]
            if row[I_END] is None and t is not None and now - t >= min_age_ns:
                out[row[I_ID]] = (row[I_ID], now - t, row)
        blocking = getattr(rec, "blocking_rows", None)  # the recorder's own registry, when it has one
        rows = []
        if callable(blocking):
            try:
                rows = list(blocking())
            except Exception:
                rows = []
        else:
            rows = self._blocking_rows()
        for row in rows:
            try:
                t = row[I_ENQ]
                if row[I_END] is None and t is not None and now - t >= min_age_ns:
                    out.setdefault(row[I_ID], (row[I_ID], now - t, row))
            except Exception:
                continue
        return sorted(out.values(), key=lambda x: -x[1])

    def _blocking_rows(self) -> list:
        """Rows of the blocking calls the threads are inside of, from the wrapper frames."""
        rows = []
        me = threading.get_ident()
        for tid, frame in sys._current_frames().items():
            if tid == me:
                continue
            f = frame
            while f is not None:
                co = f.f_code
                if co.co_name in self.code_names and co.co_filename == self.code_file:
                    try:
                        row = f.f_locals.get("row")
                    except Exception:
                        row = None
                    if isinstance(row, list) and len(row) == _R.NCOL:
                        rows.append(row)
                f = f.f_back
        del frame, f
        return rows

    def _header(self, reason: str, ops) -> str:
        rec = self.rec
        lines = [f"# commtrace: rank {rec.rank} (pid {os.getpid()}, host {rec.meta.get('host')}): {reason}",
                 f"# at {time.strftime('%Y-%m-%dT%H:%M:%S%z')} (t_ns {rec.now_ns()})",
                 f"# main thread: 0x{threading.main_thread().ident or 0:016x}"]
        for _, age, row in ops[:20]:
            lines.append(f"# in flight {age / 1e9:.1f} s: {_describe(row)}")
        if not ops:
            lines.append("# no op in flight")
        return "\n".join(lines) + "\n\n"

    def _dump(self, reason: str, ops) -> str:
        """Write a new stacks-<time>.txt: the header, then every thread's Python stack, read by
        faulthandler on this thread while it holds the GIL (no thread runs Python meanwhile)."""
        path = self._stacks_path()
        with open(path, "w") as f:
            f.write(self._header(reason, ops))
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        return path

    def _flush(self) -> None:
        try:
            self.rec.flush()
        except Exception as e:  # flush never raises, but be sure
            log.warn_once("watchdog-flush", "watchdog could not flush the trace", e)

    def check_hang(self) -> None:
        if self.timeout_s <= 0:
            return
        ops = self.hung_ops(int(self.timeout_s * 1e9))
        new = [o for o in ops if o[0] not in self.seen]
        if not new:
            return
        self.seen.update(o[0] for o in new)
        path = None
        if self.dump_stacks and self.dumps < MAX_DUMPS:
            self.dumps += 1
            path = self._dump(f"op in flight longer than --hang-timeout {self.timeout_s:g} s", ops)
        self._flush()
        self._ask_culprits(new)
        log.warn_once(("hang", new[0][0]),
                      f"rank {self.rec.rank}: {_describe(new[0][2])} in flight for "
                      f"{new[0][1] / 1e9:.1f} s (possible hang); trace flushed"
                      + (f", stacks written to {path}" if path else ""))

    # -------------------------------------------------------------- the culprit's stacks

    def _ask_culprits(self, ops) -> None:
        """For each hung collective, ask the members of its group that are not inside it (their
        ``_inflight.json`` does not list it) for their stacks: a request file in their rank
        directory, which their own watchdog answers with a ``stacks-*.txt`` at its next wake-up.
        The hang culprit (a rank busy elsewhere) then has its current stack in the run without
        anyone sending SIGUSR1. Ranks whose directory is not visible from here (another node's
        local disk) are not asked."""
        import json

        from ..format import schema as S

        rec = self.rec
        try:
            pg_ranks = rec._collect_pg_ranks()
        except Exception:
            pg_ranks = {}
        I = _R.IDX
        for _, age, row in ops:
            pg, seq, op = row[I["pg"]], row[I["seq"]], row[I["op"]]
            if pg is None or seq is None or row[I["peer"]] is not None:
                continue
            members = pg_ranks.get(pg) or (list(range(rec.world_size)) if str(pg) == "0" else [])
            for m in members:
                if m == rec.rank or (m, pg, seq) in self.asked:
                    continue
                d = os.path.join(rec.run_dir, S.RANK_DIR_FMT.format(rank=m))
                if not os.path.isdir(d):
                    continue
                try:
                    with open(os.path.join(d, S.INFLIGHT_NAME)) as f:
                        snap = json.load(f)
                    if any(o.get("pg") == pg and o.get("seq") == seq for o in snap.get("ops") or []
                           if isinstance(o, dict)):
                        continue  # it is inside the collective too: a waiter, not the culprit
                except (OSError, ValueError, AttributeError):
                    pass
                self.asked.add((m, pg, seq))
                req = {"from_rank": rec.rank, "pg": pg, "seq": seq, "op": op, "t_ns": rec.now_ns(),
                       "waited_s": round(age / 1e9, 3)}
                try:
                    path = os.path.join(d, S.STACKS_REQUEST_NAME)
                    tmp = os.path.join(d, f".tmp-req-{os.getpid()}")
                    with open(tmp, "w") as f:
                        json.dump(req, f)
                    os.replace(tmp, path)
                except OSError as e:
                    log.warn_once(("ask", m), f"cannot ask rank {m} for its stacks", e)

    def _check_request(self) -> None:
        """Answer a stacks request a waiting rank left in this rank's directory."""
        import json

        from ..format import schema as S

        try:
            path = os.path.join(self.rank_dir(), S.STACKS_REQUEST_NAME)
            if not os.path.exists(path):
                return
            with open(path) as f:
                req = json.load(f)
            os.unlink(path)
        except (OSError, ValueError):
            return
        if self.dumps >= MAX_DUMPS:
            return
        self.dumps += 1
        reason = (f"stacks requested by rank {req.get('from_rank')}, waiting {req.get('waited_s')} s "
                  f"in {req.get('op')} seq {req.get('seq')} on pg {req.get('pg')} that this rank "
                  "has not issued")
        path = self._dump(reason, self.hung_ops(0))
        self._flush()
        log.info(f"rank {self.rec.rank}: {reason}: stacks written to {path}")

    # -------------------------------------------------------------- thread

    def alive(self) -> bool:
        rec = self.rec
        return (not self.stop.is_set() and _R.get_recorder() is rec
                and not getattr(rec, "_closed", False))

    def run(self) -> None:
        try:
            while not self.stop.wait(self.interval_s):
                if not self.alive():
                    break
                try:
                    self._check_usr1()
                    self._check_request()
                    self.check_hang()
                except Exception as e:
                    log.warn_once("watchdog", "hang watchdog error", e)
        finally:
            self._close_usr1()


def install(rec) -> bool:
    """Start the watchdog of recorder `rec` (idempotent; replaces one of an older recorder).
    Returns whether a watchdog runs. Never raises."""
    global _active
    try:
        with _lock:
            w = _active
            if w is not None and w.rec is rec and w.thread is not None and w.thread.is_alive():
                return True
            if w is not None:
                w.stop.set()
            w = _Watchdog(rec)
            w.register_usr1()
            w.thread = threading.Thread(target=w.run, name=THREAD_NAME, daemon=True)
            w.thread.start()
            _active = w
            return True
    except Exception as e:
        log.warn_once("watchdog-install", "hang watchdog unavailable", e)
        return False


def uninstall(timeout: float = 2.0) -> None:
    """Stop the watchdog thread and the SIGUSR1 dump (idempotent; never raises)."""
    global _active
    try:
        with _lock:
            w, _active = _active, None
        if w is None:
            return
        w.stop.set()
        t = w.thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
    except Exception:  # pragma: no cover
        pass


def active() -> "_Watchdog | None":
    """The running watchdog, if any (tests)."""
    return _active


def _forget_after_fork() -> None:
    # The child has no watchdog thread; its recorder is dropped too (recorder.py).
    global _active
    _active = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
