"""How a job ended (or that it still runs), and the state of each of its ranks.

Pure functions of what the run directory holds (:class:`commtrace.format.reader.RunFiles`):
each rank's ``_inflight.json`` (``final``, ``exit``, how fresh the file is), its crash file
(``_crash-<pid>.txt``, faulthandler's dump at a fatal signal), the run's manifest and the
session manifest `commtrace run` wrote above it (the launcher's exit code and the signal it
forwarded). The report's ``job`` key, ``commtrace ls`` and the hang findings all use these, so
that a rank is called alive, crashed or finished in one place.

Rank states:

``exited``       exit flush with ``exit.how == "ok"`` (a normal exit) or ``"exit"`` (an
                 uncaught ``sys.exit(n)`` or ``os._exit(n)``: ``exit_code`` n, a failure
                 when n != 0);
``exception``    exit flush after an uncaught exception (``exit.error``);
``signalled``    exit flush on SIGTERM / SIGINT (``exit.signal``);
``crashed``      a crash file: a fatal signal (``signal``: SIGABRT, SIGSEGV, ...);
``alive``        no exit flush and its snapshot was rewritten within
                 :data:`FRESH_FLUSHES` flush intervals (+ :data:`FRESH_SLACK_S`), while the
                 launcher (if any) has not finished;
``killed``       no exit flush and a stale snapshot (SIGKILL, OOM killer, a lost node, or a
                 crash commtrace could not record);
``unknown``      parts but no snapshot (version-1 traces of other writers, ``commtrace synth``);
``no_trace``     a member of the world that wrote nothing.
"""

from __future__ import annotations

import os
import re
import time

#: A snapshot rewritten within this many flush intervals (plus the slack) is fresh: its rank is
#: alive (the writer thread rewrites it at every flush, even while the rank hangs in C++).
FRESH_FLUSHES = 2
FRESH_SLACK_S = 1.0
#: How far the rank's clock (the snapshot's ``t_ns``) may be from the reader's.
CLOCK_TOLERANCE_S = 30.0
DEFAULT_FLUSH_INTERVAL_S = 2.0

FAILED_STATES = ("exception", "crashed", "killed")
#: Exit codes of a command stopped by a signal on purpose: 128 + SIGINT, 128 + SIGTERM.
INTERRUPT_CODES = {130: "SIGINT", 143: "SIGTERM"}
JOB_STATES = ("completed", "failed", "interrupted", "running", "unknown")

_FATAL = {
    "Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV", "Floating point exception": "SIGFPE",
    "Bus error": "SIGBUS", "Illegal instruction": "SIGILL",
}
_FATAL_RE = re.compile(r"Fatal Python error: (.+)")


def crash_signal(path: str) -> str | None:
    """The fatal signal named in a faulthandler crash file ("SIGABRT", ...), else None."""
    try:
        with open(path, errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return None
    m = _FATAL_RE.search(head)
    if not m:
        return None
    text = m.group(1).strip()
    return _FATAL.get(text, text)


def _flush_s(rf, r: int) -> float:
    for src in ((rf.inflight.get(r) or {}), (rf.meta.get(r) or {})):
        v = src.get("flush_interval_s")
        try:
            if v:
                return float(v)
        except (TypeError, ValueError):
            pass
    return DEFAULT_FLUSH_INTERVAL_S


def launcher(rf) -> dict:
    """What the `commtrace run` that wrote this run recorded (``command``, ``exit_code``,
    ``signal``, ``end_ns``, ``runs``): since schema v2 the invocation in the manifest above the
    run (:func:`commtrace.format.runs.session_manifest`); for version-1 traces the run's own
    manifest, when `commtrace run` wrote its end there (it has ``end_ns``); else empty."""
    if rf.session:
        return rf.session
    m = getattr(rf, "manifest", None) or {}
    if not m.get("run_id") and m.get("end_ns") is not None:
        return m
    return {}


def launcher_ended(rf) -> bool:
    """True when the `commtrace run` that wrote this run has finished (its session manifest
    has ``end_ns``)."""
    return bool(launcher(rf).get("end_ns"))


def failed(state: dict) -> bool:
    """A rank that failed: it crashed, was killed, ended on an uncaught exception, or exited
    with a non-zero code."""
    return state.get("state") in FAILED_STATES or (
        state.get("state") == "exited" and state.get("exit_code") not in (None, 0))


def from_poll(rf, poll: dict, now_s: float | None = None):
    """`rf` (what a run was loaded from) with the newer facts a live view re-read
    (:func:`commtrace.format.reader.poll_run`): snapshots and their modification times, crash
    files, rank directories, the manifest and the launcher's record. A poll given as plain
    dicts (``{"manifest": ..., "snapshots": ...}``) replaces what it names; a snapshot without
    a modification time is aged by its own ``t_ns``. `now_s`: when it was read (default: its
    ``scan_time``, else now). Pure: `rf` is not changed."""
    import dataclasses

    snaps = poll.get("snapshots")
    kw = {"scan_time": now_s if now_s is not None else (poll.get("scan_time") or time.time())}
    if snaps is not None:
        kw["inflight"] = dict(snaps)
        mt = poll.get("mtimes")
        if mt is None:  # ages from the snapshots' own clocks
            mt = {}
            for r, sn in snaps.items():
                try:
                    mt[r] = int(sn.get("t_ns")) / 1e9
                except (TypeError, ValueError):
                    pass
        kw["inflight_mtime"] = dict(mt)
    for k in ("crash", "rank_dirs"):
        if poll.get(k) is not None:
            kw[k] = poll[k]
    if poll.get("manifest"):  # an unreadable one (being replaced) keeps what was loaded
        kw["manifest"] = dict(getattr(rf, "manifest", {}) or {}, **poll["manifest"])
    if poll.get("session") is not None:
        kw["session"] = dict(poll["session"])
    return dataclasses.replace(rf, **kw)


def rank_states(rf, world_size: int | None = None, now_s: float | None = None) -> dict[int, dict]:
    """rank -> {"state": ..., "signal", "error", "exit_code", "snapshot_age_s", "crash_file"}
    for every rank of the run (see the module docstring for the states)."""
    if now_s is None:  # the snapshots' age when they were read
        now_s = getattr(rf, "scan_time", None) or time.time()
    ended = launcher_ended(rf)
    ranks = set(rf.rank_dirs) | set(rf.meta) | set(rf.inflight) | set(rf.crash)
    if world_size:
        ranks |= set(range(int(world_size)))
    out: dict[int, dict] = {}
    for r in sorted(ranks):
        snap = rf.inflight.get(r)
        crash = rf.crash.get(r) or []
        d = {"state": "unknown", "signal": None, "error": None, "exit_code": None,
             "snapshot_age_s": None, "crash_file": crash[-1] if crash else None,
             "pid": (snap or {}).get("pid") or (rf.meta.get(r) or {}).get("pid"),
             "host": (snap or {}).get("host") or (rf.meta.get(r) or {}).get("host")}
        mt = rf.inflight_mtime.get(r)
        if mt is not None:
            d["snapshot_age_s"] = round(max(0.0, now_s - mt), 3)
        if crash:
            d.update(state="crashed", signal=crash_signal(crash[-1]))
        elif snap is not None and snap.get("final"):
            ex = snap.get("exit") or {}
            how = ex.get("how")
            if how == "exception":
                d.update(state="exception", error=ex.get("error"), exit_code=ex.get("exit_code"))
            elif how == "signal":
                d.update(state="signalled", signal=ex.get("signal"), exit_code=ex.get("exit_code"))
            else:  # "ok", or "exit": sys.exit(n) / os._exit(n) (capture/crash.py)
                d.update(state="exited", exit_code=ex.get("exit_code", 0 if how == "ok" else None))
                if ex.get("via"):
                    d["via"] = ex["via"]
        elif snap is not None:
            age = d["snapshot_age_s"]
            limit = FRESH_FLUSHES * _flush_s(rf, r) + FRESH_SLACK_S
            fresh = age is not None and age <= limit
            try:  # and its own time stamp agrees (a copied or rewritten file has a new mtime)
                fresh = fresh and now_s - int(snap.get("t_ns")) / 1e9 <= limit + CLOCK_TOLERANCE_S
            except (TypeError, ValueError):
                pass
            d["state"] = "alive" if fresh and not ended else "killed"
        elif r in rf.meta:
            d["state"] = "unknown"
        elif r in rf.rank_dirs and rf.manifest.get("run_id"):
            # v2: the directory is made when tracing starts (the group exists), the snapshot at
            # the first flush: the rank joined and died before it (unless it just started).
            try:
                age = now_s - os.stat(os.path.join(rf.path, f"rank={r}")).st_mtime
            except OSError:
                age = None
            young = age is not None and age <= FRESH_FLUSHES * DEFAULT_FLUSH_INTERVAL_S + FRESH_SLACK_S
            d["state"] = "alive" if young and not ended else "killed"
        else:
            d["state"] = "no_trace"
        out[r] = d
    return out


def job_state(rf, world_size: int | None = None, states: dict | None = None,
              now_s: float | None = None) -> dict:
    """The report's ``job`` key: ``{"state": completed|failed|interrupted|running|unknown,
    "exit_code": int|None, "failed_ranks": [...], "signal": str|None}``, with
    ``ranks_by_state`` (state -> ranks) and ``rank_exit_codes`` (``[{"rank", "exit_code"}]``:
    the ranks that exited with a non-zero code of their own, ``sys.exit(n)`` / ``os._exit(n)``).

    * running: some rank is alive and the launcher has not finished;
    * interrupted: the launcher forwarded SIGINT/SIGTERM (Ctrl-C); or, before (or without) a
      launcher's record, every rank ended and some on SIGINT/SIGTERM, none failed;
    * failed: a rank crashed, was killed, ended on an uncaught exception or exited with a
      non-zero code, or the launcher
      exited non-zero (its exit code is given when this run is its last job);
    * completed: every rank exited normally (and the launcher, if any, with 0);
    * unknown: nothing says (traces without snapshots)."""
    states = rank_states(rf, world_size, now_s) if states is None else states
    sess = launcher(rf)
    runs = sess.get("runs") or []
    rid = os.path.basename(rf.path.rstrip(os.sep))
    last_of_session = bool(sess) and (not runs or runs[-1] == rid)
    exit_code = sess.get("exit_code") if last_of_session else None
    bad = sorted(r for r, s in states.items() if failed(s))
    codes = [{"rank": r, "exit_code": int(states[r]["exit_code"])} for r in bad
             if states[r]["state"] == "exited"]
    if exit_code is None and bad:
        known = [states[r].get("exit_code") for r in bad if states[r].get("exit_code")]
        exit_code = known[0] if known else None
    sig = None
    alive = [r for r, s in states.items() if s["state"] == "alive"]
    if alive and not launcher_ended(rf):
        state = "running"
        exit_code = None
    elif sess.get("signal") in ("SIGINT", "SIGTERM") and (last_of_session or not sess.get("end_ns")):
        state, sig = "interrupted", sess.get("signal")
    elif not launcher_ended(rf) and not bad and states and all(
            s["state"] in ("exited", "signalled", "no_trace") for s in states.values()) and any(
            s["state"] == "signalled" and s.get("signal") in ("SIGINT", "SIGTERM") for s in states.values()):
        # every rank ended, some on SIGINT / SIGTERM, and no launcher recorded (yet) how it ended
        state = "interrupted"
        sig = next(s["signal"] for r, s in sorted(states.items())
                   if s["state"] == "signalled" and s.get("signal") in ("SIGINT", "SIGTERM"))
    elif exit_code in INTERRUPT_CODES and not any(states[r]["state"] in ("crashed", "exception") for r in bad):
        # the launcher's command ended on SIGINT / SIGTERM that someone sent it directly
        state, sig = "interrupted", INTERRUPT_CODES[exit_code]
    elif bad or (exit_code not in (None, 0)):
        state = "failed"
        sigs = [states[r]["signal"] for r in bad if states[r].get("signal")]
        sig = sigs[0] if sigs else None
    elif states and all(s["state"] == "exited" for s in states.values() if s["state"] != "no_trace") \
            and any(s["state"] == "exited" for s in states.values()):
        state = "completed"
    elif exit_code == 0:
        state = "completed"
    else:
        state = "unknown"
    by_state: dict[str, list[int]] = {}
    for r, s in sorted(states.items()):
        by_state.setdefault(s["state"], []).append(r)
    # The launcher failed although every traced rank's exit flush says it ended normally: a
    # rank died after commtrace's last write, e.g. torch 2.13's gloo abort at interpreter exit
    # ("terminate called without an active exception", docs/faq.md). Its trace is complete.
    traced = [s for s in states.values() if s["state"] != "no_trace"]
    after = (state == "failed" and not bad and exit_code not in (None, 0) and bool(traced)
             and all(s["state"] == "exited" and not s.get("exit_code") for s in traced))
    return {"state": state, "exit_code": exit_code, "failed_ranks": bad, "signal": sig,
            "ranks_by_state": by_state, "rank_exit_codes": codes, "ended_after_trace": after}


_STATE_WORDS = {"crashed": "crashed", "killed": "died without an exit flush",
                "exception": "exited on an exception", "alive": "alive", "signalled": "ended on a signal"}


def rank_errors(states: dict) -> list[dict]:
    """The exceptions ranks exited on: ``[{"ranks": [...], "error": msg}]``, one per distinct
    message (whitespace folded), ordered by their lowest rank. `states` is :func:`rank_states`'
    dict (int or str keys). One source for the text report and the dashboard."""
    by: dict[str, list[int]] = {}
    for r, st in (states or {}).items():
        st = st or {}
        if st.get("state") == "exception" and st.get("error"):
            by.setdefault(" ".join(str(st["error"]).split()), []).append(int(r))
    return [{"ranks": sorted(rs), "error": e} for e, rs in sorted(by.items(), key=lambda kv: min(kv[1]))]


def error_lines(errors: list[dict], width: int = 240) -> list[str]:
    """"ranks 0 and 1: RuntimeError: ..." for each of :func:`rank_errors`' entries, the message
    cut to `width` characters (the text report and the dashboard)."""
    out = []
    for e in errors or []:
        rs = [str(r) for r in e["ranks"]]
        who = f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(rs[:-1]) + " and " + rs[-1]
        err = e["error"]
        out.append(f"{who}: {err if len(err) <= width else err[: width - 3] + '...'}")
    return out


def describe(job: dict) -> str:
    """One line for the text report's header, e.g. ``job: failed (exit code 1; rank 0 crashed,
    SIGABRT; ranks 1, 2 exited on an exception)``."""
    st = job.get("state") or "unknown"
    bits = []
    if job.get("exit_code") is not None:
        bits.append(f"exit code {job['exit_code']}")
    if job.get("signal") and st == "interrupted":
        bits.append(str(job["signal"]))
    by = job.get("ranks_by_state") or {}
    def who(rs):
        return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))}"

    for k in ("crashed", "killed", "exception") if st != "running" else ("alive",):
        rs = by.get(k) or []
        if rs:
            extra = f", {job['signal']}" if k == "crashed" and job.get("signal") else ""
            bits.append(f"{who(rs)} {_STATE_WORDS[k]}{extra}")
    if st != "running":
        by_code: dict[int, list[int]] = {}
        for e in job.get("rank_exit_codes") or []:
            by_code.setdefault(int(e["exit_code"]), []).append(int(e["rank"]))
        for code, rs in sorted(by_code.items(), key=lambda kv: min(kv[1])):
            bits.append(f"{who(sorted(rs))} exited with code {code}")
    if not by and job.get("failed_ranks"):
        bits.append(f"rank(s) {', '.join(map(str, job['failed_ranks']))} failed")
    if job.get("ended_after_trace"):
        bits.append("every rank's trace ended normally: a rank failed after its last write, "
                    "e.g. torch's abort at interpreter exit, see docs/faq.md")
    return f"job: {st}" + (f" ({'; '.join(bits)})" if bits else "")


# ----------------------------------------------------------------------------------------------
# Where a rank is: its innermost user frame in a stack dump (stacks-*.txt, _crash-*.txt)
# ----------------------------------------------------------------------------------------------

_THREAD_RE = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME_RE = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')
_MAIN_RE = re.compile(r"^# main thread:? (0x[0-9a-fA-F]+)")
_LIB_RE = re.compile(r"[/\\](torch|commtrace|_pytest|pluggy)[/\\]|[/\\]lib[/\\]python3[.0-9]*[/\\](?!site-packages|dist-packages)[^/\\]+")


def _is_user_file(fn: str) -> bool:
    return not (fn.startswith("<") or _LIB_RE.search(fn))


def parse_stacks(text: str) -> tuple[str | None, dict[str, list[tuple[str, int, str]]]]:
    """(main thread id or None, thread id -> frames innermost first as (file, line, function))
    of a faulthandler dump."""
    main = None
    threads: dict[str, list] = {}
    cur = None
    for line in text.splitlines():
        m = _MAIN_RE.match(line)
        if m:
            main = m.group(1).lower()
            continue
        m = _THREAD_RE.match(line)
        if m:
            cur = threads.setdefault(m.group(2).lower(), [])
            continue
        m = _FRAME_RE.match(line)
        if m and cur is not None:
            cur.append((m.group(1), int(m.group(2)), m.group(3).strip()))
        elif not line.strip():
            cur = None
    return main, threads


def innermost_user_frame(path: str) -> dict | None:
    """The innermost user frame (outside torch, commtrace and the standard library) of the main
    thread in the stack dump `path`: ``{"function", "file", "line", "site", "stacks"}``. The
    main thread is the one the dump's header names, else the one whose outermost frame is a
    module (``<module>``)."""
    try:
        with open(path, errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return None
    main, threads = parse_stacks(text)
    order = []
    if main and main in threads:
        order.append(threads[main])
    order += [fr for tid, fr in threads.items() if fr and fr[-1][2] == "<module>" and tid != main]
    for frames in order:
        for fn, line, func in frames:
            if _is_user_file(fn):
                return {"function": func, "file": fn, "line": line, "site": f"{fn}:{line}",
                        "stacks": path}
    return None
