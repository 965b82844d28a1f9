"""Which run directories a path holds, and picking one (``--run <id|latest>``).

A *run directory* holds one job's trace: ``rank=<r>/`` directories (or, for other writers,
Parquet files). Since schema v2 `commtrace run -o OUT` and ``commtrace.trace(output=OUT)``
write each job into ``OUT/<run-id>/``, so ``OUT`` is a parent of runs; a version-1 trace is a
run directory itself. Readers never merge runs: given a parent of several runs they ask which
one (:class:`MultipleRunsError`, exit code 2) unless told with ``run``.
"""

from __future__ import annotations

import json
import os
import re

from ..errors import CommtraceError, UsageError
from . import schema as S

_RANK_DIR_RE = re.compile(r"^rank=(-?\d+)$")
#: How deep below the given directory runs are looked for (OUT/<run-id>: 1;
#: commtrace-traces/<time>/<run-id>: 2).
MAX_DEPTH = 3


class MultipleRunsError(CommtraceError):
    """A directory holds several runs and none was chosen."""

    exit_code = 2


def is_run_dir(path: str) -> bool:
    """True when `path` is one run: it has ``rank=<r>`` directories."""
    try:
        with os.scandir(path) as it:
            return any(e.is_dir() and _RANK_DIR_RE.match(e.name) for e in it)
    except OSError:
        return False


def find_runs(path: str, max_depth: int = MAX_DEPTH) -> list[str]:
    """Run directories at or below `path` (absolute paths, sorted by start time, then name).
    A run directory's own subdirectories are not searched."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isdir(path):
        return []
    if is_run_dir(path):
        return [path]
    out: list[str] = []

    def walk(d: str, depth: int) -> None:
        try:
            entries = sorted(e.path for e in os.scandir(d) if e.is_dir() and not e.name.startswith((".", "_")))
        except OSError:
            return
        for sub in entries:
            if is_run_dir(sub):
                out.append(sub)
            elif depth < max_depth:
                walk(sub, depth + 1)

    walk(path, 1)
    return sorted(out, key=lambda p: (start_ns(p) or 0, p))


def read_manifest(run_dir: str) -> dict:
    """The run's ``_manifest.json`` (empty dict when absent or unreadable)."""
    try:
        with open(os.path.join(run_dir, S.MANIFEST_NAME)) as f:
            m = json.load(f)
        return m if isinstance(m, dict) else {}
    except (OSError, ValueError):
        return {}


#: Lock file of the output directory's manifest (flock): `commtrace run -o D` invocations
#: running at the same time each add their entry without losing the others'.
SESSION_LOCK_NAME = "_manifest.lock"
#: Fields of an invocation repeated at the top level of the output directory's manifest (those
#: of the invocation started last), as schema v2 readers before ``invocations`` read them.
_TOP_FIELDS = ("command", "start_ns", "start_time", "cwd", "commtrace_version", "end_ns",
               "exit_code", "signal", "runs", "ranks_written")


def invocations(m: dict) -> list[dict]:
    """The `commtrace run` invocations an output directory's manifest records, oldest first:
    its ``invocations`` list, or (written before it existed) the top-level fields as one."""
    if m.get("kind") != "session":
        return []
    inv = m.get("invocations")
    if isinstance(inv, list):
        return [i for i in inv if isinstance(i, dict)]
    return [{k: m[k] for k in _TOP_FIELDS if k in m}]


def update_session(out: str, change) -> dict | None:
    """Read, change and rewrite ``out/_manifest.json`` under an exclusive lock
    (:data:`SESSION_LOCK_NAME`, ``flock``); the rewrite is atomic (a reader never sees half a
    file). `change(invocations) -> invocations` gets the list of invocations (oldest first)
    and returns the new one; an empty list removes the manifest. Returns the manifest written
    (None when removed)."""
    from . import writer as W

    os.makedirs(out, exist_ok=True)
    fd = os.open(os.path.join(out, SESSION_LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover (not POSIX: no lock)
            pass
        m = read_manifest(out)
        invs = change([dict(i) for i in invocations(m)])
        if not invs:
            try:
                os.unlink(os.path.join(out, S.MANIFEST_NAME))
            except OSError:
                pass
            return None
        latest = max(invs, key=lambda i: (i.get("start_ns") or 0))
        new = {"kind": "session", **{k: latest[k] for k in _TOP_FIELDS if k in latest},
               "invocations": invs}
        W.write_manifest(out, new)
        return new
    finally:
        os.close(fd)  # releases the lock


def record_invocation(out: str, inv: dict) -> dict | None:
    """Add the invocation `inv` (its ``id`` names it) to ``out/_manifest.json``, or update the
    one with that id (:func:`update_session`)."""
    def change(invs):
        for i in invs:
            if i.get("id") == inv.get("id"):
                i.update(inv)
                return invs
        return invs + [dict(inv)]
    return update_session(out, change)


def forget_invocation(out: str, inv_id: str) -> dict | None:
    """Remove the invocation `inv_id` from ``out/_manifest.json`` (it traced nothing)."""
    return update_session(out, lambda invs: [i for i in invs if i.get("id") != inv_id])


def session_manifest(run_dir: str) -> dict:
    """What `commtrace run` recorded about the invocation that wrote the v2 run `run_dir`, from
    the manifest of the directory above (``{"kind": "session", "command", "start_ns",
    "end_ns", "exit_code", "signal", "runs", ...}``): the invocation whose id the run's own
    manifest names (``session``), else the one listing the run in its ``runs``, else (a run of
    an older writer) the latest invocation still running that started before the run; else
    an empty dict."""
    parent = os.path.dirname(os.path.abspath(run_dir))
    invs = invocations(read_manifest(parent))
    if not invs:
        return {}
    own = read_manifest(run_dir)
    rid = os.path.basename(os.path.abspath(run_dir))
    sid = own.get("session")
    found = None
    if sid:
        found = next((i for i in invs if i.get("id") == sid), None)
    if found is None:
        found = next((i for i in reversed(invs) if rid in (i.get("runs") or [])), None)
    if found is None and not sid:
        t0 = own.get("start_ns") or 0
        live = [i for i in invs if not i.get("end_ns") and (not t0 or (i.get("start_ns") or 0) <= t0)]
        found = live[-1] if live else None  # its list of runs is written at the end
    return dict(found, kind="session") if found else {}


def snapshot_sessions(run_dir: str) -> set[str]:
    """The `commtrace run` invocation ids the ranks' snapshots of `run_dir` name."""
    out = set()
    try:
        names = os.listdir(run_dir)
    except OSError:
        return out
    for n in names:
        if _RANK_DIR_RE.match(n):
            try:
                with open(os.path.join(run_dir, n, S.INFLIGHT_NAME)) as f:
                    sid = json.load(f).get("session")
                if sid:
                    out.add(str(sid))
            except (OSError, ValueError, AttributeError):
                pass
    return out


def run_id(run_dir: str) -> str:
    """The run id: the manifest's ``run_id``, else the directory name."""
    return str(read_manifest(run_dir).get("run_id") or os.path.basename(os.path.abspath(run_dir)))


def start_ns(run_dir: str) -> int | None:
    """Start time of a run (manifest ``start_ns``, else the directory's modification time)."""
    v = read_manifest(run_dir).get("start_ns")
    try:
        return int(v)
    except (TypeError, ValueError):
        try:
            return int(os.stat(run_dir).st_mtime * 1e9)
        except OSError:
            return None


def label(path: str, run_dir: str) -> str:
    """How to name `run_dir` relative to the directory the user gave."""
    rel = os.path.relpath(run_dir, os.path.abspath(path))
    return os.path.basename(run_dir) if rel == "." else rel


def resolve(path, run: str | None = None, command: str = "report") -> str:
    """The one run directory `path` designates. `path` may be a run directory, a Parquet file,
    or a directory holding runs below it; `run` picks one by id (or a path relative to `path`)
    or ``"latest"``. Raises :class:`MultipleRunsError` when several runs are found and `run` is
    not given, :class:`UsageError` when `run` names none of them. A directory with no run below
    is returned as is (the reader then says what is wrong with it)."""
    path = os.fspath(path)
    if os.path.isfile(path) or not os.path.isdir(path):
        if run:
            raise UsageError(f"--run {run}: {path} is not a directory of runs")
        return path
    runs = find_runs(path)
    if not runs:
        if run:
            raise UsageError(f"--run {run}: no run found under {path}")
        return path
    if run is None:
        if len(runs) == 1:
            return runs[0]
        names = [label(path, r) for r in runs]
        shown = ", ".join(names[:8]) + (f", ... ({len(names) - 8} more)" if len(names) > 8 else "")
        raise MultipleRunsError(
            f"{path} holds {len(runs)} runs ({shown}); pick one: commtrace {command} "
            f"{os.path.join(path, names[-1])}, or --run <id|latest> (commtrace ls {path} lists them)")
    if run == "latest":
        return runs[-1]
    for r in runs:
        if run in (os.path.basename(r), label(path, r), run_id(r)) or os.path.abspath(run) == r:
            return r
    names = ", ".join(label(path, r) for r in runs[:8])
    raise UsageError(f"--run {run}: no such run under {path} (runs: {names}; or --run latest)")


def dir_size(path: str) -> int:
    """Bytes of the files below `path`."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total
