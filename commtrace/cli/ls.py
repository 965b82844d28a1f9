"""`commtrace ls [DIR]`: the runs a directory holds, one line each."""

from __future__ import annotations

import json
import os
import sys
import time

import click

EPILOG = """\b
Examples:
  commtrace ls                       (./commtrace-traces)
  commtrace ls traces/exp1
  commtrace ls traces --format json
  commtrace report traces --run latest   (then: one of them)
"""


def _size(n: int) -> str:
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def _short(arg) -> str:
    """A command's argument as typed from here: an absolute path under the current directory
    relative to it."""
    a = str(arg)
    if os.path.isabs(a):
        rel = os.path.relpath(a)
        if not rel.startswith(".."):
            return rel
    return a


def list_runs(path: str) -> list[dict]:
    """One dict per run below `path`: id, path, start, command, world size, ranks present,
    how the job ended (the report's ``job``: its own exit code, its ranks' own exit codes),
    size on disk, and ``launcher``: the `commtrace run` invocation that wrote it (id, command,
    exit code, signal) when known. Reads manifests, snapshots and
    Parquet footers only."""
    from ..analysis.job import job_state, rank_states
    from ..errors import TraceFormatError
    from ..format import reader as R
    from ..format import runs as RUNS

    out = []
    for d in RUNS.find_runs(path):
        m = RUNS.read_manifest(d)
        entry = {"id": RUNS.run_id(d), "path": d, "label": RUNS.label(path, d),
                 "start_ns": RUNS.start_ns(d), "command": m.get("command"),
                 "world_size": m.get("world_size"), "ranks": [], "job": None,
                 "size_bytes": RUNS.dir_size(d)}
        try:
            rf = R.scan_run(d)
            ws = m.get("world_size") or max((int(x.get("world_size") or 0) for x in rf.meta.values()), default=0) or None
            entry["world_size"] = ws
            entry["ranks"] = sorted(set(rf.meta) | set(rf.inflight))
            entry["job"] = job_state(rf, ws, rank_states(rf, ws))
            if rf.session:  # the `commtrace run` invocation that wrote it (its own entry)
                entry["launcher"] = {k: rf.session.get(k) for k in
                                     ("id", "command", "exit_code", "signal", "start_ns", "end_ns")}
            if entry["command"] is None and rf.session:
                entry["command"] = rf.session.get("command")
        except TraceFormatError as e:
            entry["job"] = {"state": "unknown", "exit_code": None, "failed_ranks": [], "signal": None}
            entry["error"] = str(e)
        out.append(entry)
    return out


@click.command("ls", epilog=EPILOG)
@click.argument("path", metavar="[DIR]", required=False, default="commtrace-traces", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def command(path, fmt):
    """List the runs under DIR (default ./commtrace-traces): id, start time, command, world
    size, ranks present, how the job ended, size on disk.

    Exits 1 when DIR holds no run."""
    from ..errors import TraceFormatError

    if not os.path.isdir(path):
        raise TraceFormatError(f"{path}: no such directory")
    runs = list_runs(path)
    if fmt == "json":
        click.echo(json.dumps(runs, indent=1, default=str))
        return 0 if runs else 1
    if not runs:
        click.echo(f"commtrace: no run under {path}", err=True)
        return 1
    from rich.console import Console
    from rich.table import Table

    con = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)
    t = Table(title=f"{len(runs)} run(s) under {path}", title_justify="left", show_edge=False)
    for col in ("run", "start", "command", "world", "ranks", "job", "size"):
        t.add_column(col, justify="right" if col in ("world", "size") else "left",
                     no_wrap=col not in ("command", "job"), min_width=24 if col == "command" else None)
    from ..analysis.job import describe

    for r in runs:
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["start_ns"] / 1e9)) if r["start_ns"] else "-"
        cmd = r.get("command")
        cmd = " ".join(map(_short, cmd)) if isinstance(cmd, list) else (cmd or "-")
        ranks = r["ranks"]
        rtxt = (f"{len(ranks)}" + (f" of {r['world_size']}" if r["world_size"] and r["world_size"] != len(ranks) else ""))
        t.add_row(r["label"], start, cmd[:60], str(r["world_size"] or "-"), rtxt,
                  describe(r["job"] or {})[5:], _size(r["size_bytes"]))
    con.print(t)
    return 0
