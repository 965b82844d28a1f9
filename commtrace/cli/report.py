"""`commtrace report DIR`: analyse a run and print a text or JSON report."""

from __future__ import annotations

import json
import os
import sys

import click

from ..errors import UsageError

EPILOG = """\b
Examples:
  commtrace report commtrace-traces/<run>
  commtrace report RUN --format json > report.json
  commtrace report RUN --top 20 --rank 3
  commtrace report RUN --all-ranks          # every rank in the per-rank table
  commtrace report RUN --steps 100:200      # steps 100..199
  commtrace report RUN --busbw-ref 180      # what-if: every collective at 180 GB/s busbw
  commtrace report traces --run latest      # traces holds several runs (commtrace ls traces)
  commtrace report RUN --memory-limit 4GB --temp-dir /scratch   # a 10^8-op run
  commtrace report RUN --engine spark                  # cross-rank stages on Spark (local[*])
  commtrace report RUN --engine spark --spark-master spark://head:7077 --temp-dir /shared/scratch
  commtrace report /mnt/traces/run42 --engine spark --spark-parts-url s3a://bucket/traces/run42
"""

#: Rows above which a progress bar is shown on stderr.
PROGRESS_ROWS = 200_000


class _Bar:
    """A rich progress bar on stderr, started once the run turns out large (PROGRESS_ROWS) and
    stderr is a terminal, or when forced with --progress."""

    def __init__(self, force):
        self.force = force
        self.bar = None
        self.task = None

    def __call__(self, stage, frac, rows=None):
        if self.bar is None and rows is not None and (
                self.force or (self.force is None and rows >= PROGRESS_ROWS and sys.stderr.isatty())):
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            self.bar = Progress(TextColumn("[bold]{task.description:<24}"), BarColumn(), TimeElapsedColumn(),
                                console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(f"{stage} ({rows:,} rows)", total=1.0)
        if self.bar is not None:
            self.bar.update(self.task, completed=frac, description=stage)

    def close(self):
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _memory(value):
    """Check a --memory-limit value (DuckDB syntax: a number and KB/MB/GB/TB, or KiB/MiB/GiB)."""
    if value is None:
        return None
    import re
    if not re.fullmatch(r"\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*", value, re.IGNORECASE):
        raise UsageError(f"--memory-limit expects a size such as 4GB or 512MB, got {value!r}")
    return value.strip()


def _steps(value):
    if not value:
        return None
    try:
        a, b = value.split(":", 1)
        return (int(a) if a.strip() else None, int(b) if b.strip() else None)
    except ValueError:
        raise UsageError(f"--steps expects A:B (half-open, either side optional), got {value!r}") from None


@click.command("report", epilog=EPILOG)
@click.argument("run_dir", metavar="DIR", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--top", type=click.IntRange(0), default=10, show_default=True,
              help="Rows in the top tables; the per-rank table shows the N ranks that waited most.")
@click.option("--all-ranks", is_flag=True, help="Every rank in the per-rank table (default: the top N by wait).")
@click.option("--rank", type=int, default=None, help="Focus per-rank rows and findings on this rank.")
@click.option("--steps", default=None, metavar="A:B", help="Only steps A..B-1.")
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr (default: on large runs).")
@click.option("--busbw-ref", type=click.FloatRange(min=0, min_open=True), default=None, metavar="GB/s",
              help="What-if: every collective of a kind at this nccl-tests bus bandwidth (e.g. 180).")
@click.option("--run", "run_id", default=None, metavar="ID|latest",
              help="When DIR holds several runs: the one to use (its id, or latest).")
@click.option("--what-if/--no-what-if", "what_if", default=None,
              help="Root cause (delay costs), critical path and what-if by replay "
                   "(default: on up to 250,000 ops).")
@click.option("--in-memory/--no-in-memory", "in_memory", default=None,
              help="Hold a run of over 200,000 rows in memory where it fits in half the memory limit "
                   "(faster, about 300 bytes a row more) instead of a database file under --temp-dir "
                   "(default: with --what-if, whose model holds more than that anyway).")
@click.option("--memory-limit", default=None, metavar="SIZE",
              help="Memory for the query engine, e.g. 4GB (default: 40% of RAM, at most 4 GB); "
                   "beyond it, work spills to --temp-dir.")
@click.option("--temp-dir", default=None, type=click.Path(file_okay=False),
              help="Where large runs are held and spill (default: $COMMTRACE_TMPDIR or the system's).")
@click.option("--engine", type=click.Choice(["duckdb", "spark"]), default="duckdb", show_default=True,
              help="Where the cross-rank stages run (matching, wait states, p2p, per-rank and per-step "
                   "figures): in-process DuckDB, or Spark (needs the spark extra and Java 17).")
@click.option("--spark-master", default=None, metavar="URL",
              help="With --engine spark: the Spark master (local[4], spark://host:7077, yarn, k8s://...; "
                   "default $COMMTRACE_SPARK_MASTER or local[*]).")
@click.option("--spark-parts-url", default=None, metavar="URL",
              help="With --engine spark: the run directory as the executors read it (e.g. "
                   "s3a://bucket/traces/run42) when DIR is a local mount or copy of it.")
def command(run_dir, fmt, top, all_ranks, rank, steps, progress, busbw_ref, run_id, memory_limit, temp_dir, what_if,
            in_memory, engine, spark_master, spark_parts_url):
    """Analyse a run: who waited for whom, stragglers, overlap, bandwidth and findings.

    Exits 0 whenever a report was produced, whatever it found."""
    from ..analysis.run import load

    rng = _steps(steps)
    bar = _Bar(progress)
    try:
        if engine != "spark" and (spark_master or spark_parts_url):
            raise UsageError("--spark-master and --spark-parts-url need --engine spark")
        if engine == "spark" and in_memory:
            raise UsageError("--in-memory is for --engine duckdb (Spark holds the run itself)")
        # (by default with --what-if: a large run held in memory where it fits, as the model's
        # arrays are anyway; docs/performance.md, session 28)
        run = load(run_dir, progress=bar, run=run_id, memory_limit=_memory(memory_limit), temp_dir=temp_dir,
                   engine=engine, spark_master=spark_master, spark_parts_url=spark_parts_url,
                   in_memory=bool(what_if) if in_memory is None else in_memory)
        bar("matching", 0.05)
        rep = run.report(top=top, rank=rank, steps=rng, progress=bar, busbw_ref=busbw_ref, what_if=what_if)
    finally:
        bar.close()
    if fmt == "json":
        click.echo(json.dumps(rep, indent=1, default=str))
    else:
        render(rep, top=top, all_ranks=all_ranks)
    run.close()
    return 0


def _s(v, unit="s"):
    """One number format for the report (the findings' messages use the same, fmt_ns): durations
    to 3 significant digits (1.23 s, 20.1 ms, 350 us), thousands separators from 1,000 s on;
    other numbers to 3 significant digits, never in e-notation."""
    if v is None:
        return "-"
    v = float(v)
    if unit == "s":
        if v == 0:
            return "0"
        from ..analysis.findings import fmt_ns

        return fmt_ns(v * 1e9)
    return _num(v)


def _num(v) -> str:
    """3 significant digits without e-notation (12,300, 0.526, 0.0000097 -> <0.001)."""
    if v is None:
        return "-"
    v = float(v)
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{v:,.0f}"
    if a < 0.001:
        return "<0.001" if v > 0 else ">-0.001"
    return f"{v:.3g}"


def _list(items, none="none") -> str:
    """A human-readable list: 'a, b and c'."""
    items = [str(x) for x in items or []]
    if not items:
        return none
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _site(site, width: int | None = None) -> str:
    """A call site `path:line` for the terminal: relative to the working directory when inside
    it, and shortened from the left to `width` (with a leading '…') without ever losing the file
    name or its `:line`."""
    if not site:
        return ""
    site = str(site)
    path, sep, line = site.rpartition(":")
    if not sep or not line.isdigit():
        path, line = site, ""
    try:
        cwd = os.getcwd()
        if os.path.isabs(path) and path.startswith(cwd.rstrip(os.sep) + os.sep):
            path = os.path.relpath(path, cwd)
    except OSError:
        pass
    full = path + (f":{line}" if line else "")
    if width is None or len(full) <= width:
        return full
    tail = os.path.basename(path) + (f":{line}" if line else "")
    if width - 1 <= len(tail):
        return tail
    cut = full[-(width - 1):]
    slash = cut.find(os.sep)
    if 0 <= slash < len(cut) - len(tail):  # cut at a directory boundary where one is in reach
        cut = cut[slash:]
    return "…" + cut




def _rel_sites(text: str) -> str:
    """`text` with the paths inside the working directory written relative to it (as `_site`)."""
    try:
        cwd = os.getcwd().rstrip(os.sep) + os.sep
    except OSError:
        return text
    return text.replace(cwd, "") if cwd != os.sep else text


def _fit_sites(con, make_table, sites, floor: int = 12):
    """`make_table(shown_sites)` with each site shortened from the left (`_site`) just enough for
    the table to fit the console's width; the sites keep their `:line` at any width."""
    from rich.measure import Measurement

    width = max((len(_site(x)) for x in sites), default=0)
    table = make_table([_site(x) for x in sites])
    for _ in range(8):
        need = Measurement.get(con, con.options.update_width(100_000), table).maximum
        if need <= con.width or width <= floor:
            break
        width = max(floor, width - (need - con.width))
        table = make_table([_site(x, width) for x in sites])
    if Measurement.get(con, con.options.update_width(100_000), table).maximum > con.width:
        # Even file:line does not fit: fold the site over two lines rather than cut it.
        for c in table.columns:
            if c.header == "site":
                c.no_wrap, c.overflow = False, "fold"
    return table


def _console():
    """The report's console: the terminal's width; in a pipe, $COLUMNS or 120."""
    from rich.console import Console

    width = None
    if not sys.stdout.isatty():
        try:
            width = int(os.environ.get("COLUMNS", "")) or None
        except ValueError:
            width = None
        width = width or 120
    return Console(highlight=False, soft_wrap=False, width=width)


def describe_unrecorded(u: dict) -> str:
    """One line for an entry of the report's `unrecorded` list."""
    def op(o):
        return f"seq {o['seq']} ({o['op']}{' at ' + _site(o['site']) if o.get('site') else ''})"
    a, b = u.get("after"), u.get("before")
    where = (f"between {op(a)} and {op(b)}" if a and b else f"before {op(b)}" if b
             else f"after {op(a)}, before the group ended" if a else "before the group ended")
    why = ORIGINS.get(u.get("origin") or "", "issued from C++, a compiled graph or an unwrapped function")
    return (f"{u['count']} collective(s) on group {u['pg']} not recorded on rank(s) "
            f"{_list(u['ranks'])}, {where} (torch seq {u['torch_seq_first']}.."
            f"{u['torch_seq_last']}): {why}")


#: What issued the unrecorded collectives of an `unrecorded` entry with an `origin`.
ORIGINS = {
    "ddp_rebuild_buckets": ("DDP's bucket rebuild at the forward after the first backward "
                            "(its Reducer broadcasts the new bucket order from rank 0, in C++; "
                            "timed as one call, not one by one)"),
}


def render(rep: dict, top: int = 10, console=None, all_ranks: bool = False) -> None:
    """Print the report dict as a readable terminal report (rich). The per-rank table shows the
    `top` ranks that waited most (all of them with `all_ranks`, or when they are no more)."""
    from rich.table import Table
    from rich.text import Text

    con = console or _console()
    sev_style = {"error": "bold red", "warning": "yellow", "info": "cyan"}
    con.rule(f"[bold]commtrace report[/bold]  {rep.get('path', '')}")
    miss = rep.get("missing_ranks") or []
    early = [e["rank"] for e in rep.get("ended_early") or []]
    con.print(f"world size {rep['world_size']}, {len(rep['ranks'])} rank(s) traced"
              + (f", [red]missing rank(s) {_list(miss)}[/red]" if miss else "")
              + (f", [red]ended early: rank(s) {', '.join(map(str, early))}[/red]" if early else "")
              + f"; {rep['ops']:,} ops, {rep.get('collectives', 0):,} collectives over {_s(rep.get('duration_s'))}"
              + (f"; steps {rep['steps'][0]}:{rep['steps'][1]}" if rep.get("steps") else ""))
    job = rep.get("job")
    if job:
        from ..analysis.job import describe

        style = {"completed": "green", "failed": "bold red", "interrupted": "yellow",
                 "running": "cyan"}.get(job.get("state"), "")
        con.print(f"[{style}]{describe(job)}[/{style}]" if style else describe(job))
        for line in _rank_errors(rep.get("rank_states") or {}):
            con.print(line, soft_wrap=True, markup=False, highlight=False)
    ck = rep.get("clock") or {}
    if ck:
        con.print(f"clock: offsets applied: {_list(ck.get('methods'), 'none recorded')}; "
                  f"{ck.get('violations', 0)} violation(s) in {ck.get('matched', 0)} matched collectives")
    for w in rep.get("warnings") or []:
        con.print(f"[yellow]warning:[/yellow] {w}")
    unrec = rep.get("unrecorded") or []
    for u in unrec[:3]:
        # (explained ones, such as DDP's bucket rebuild, are not a warning)
        style = "cyan" if u.get("origin") in ORIGINS else "yellow"
        con.print(f"[{style}]unrecorded:[/{style}] {describe_unrecorded(u)}")
    if len(unrec) > 3:
        con.print(f"[yellow]unrecorded:[/yellow] {len(unrec) - 3:,} more run(s) of unrecorded "
                  f"collectives, {sum(u['count'] for u in unrec[3:]):,} in all (--format json: "
                  "`unrecorded`)")
    counts = rep.get("finding_counts") or {}
    con.print("findings: " + (", ".join(f"{k} x{v:,}" for k, v in counts.items()) or "[green]none[/green]"))

    pr = rep.get("per_rank") or []
    worst = max((r.get("wait_s") or 0 for r in pr), default=0)
    shown = pr
    if not all_ranks and len(pr) > max(top, 1):
        shown = sorted(pr, key=lambda r: (-(r.get("wait_s") or 0), r["rank"]))[: max(top, 1)]
    title = "Per rank" if len(shown) == len(pr) else f"Per rank: the {len(shown)} of {len(pr):,} that waited most"
    t = Table(title=title, title_justify="left", show_edge=False)
    for col in ("rank", "ops", "blocked", "in flight", "exposed", "overlap", "wait", "last arrivals"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in shown:
        style = "bold" if worst and (r.get("wait_s") or 0) == worst else None
        ov = r.get("overlap_ratio")
        t.add_row(str(r["rank"]), f"{r['ops']:,}", _s(r.get("blocked_s")), _s(r.get("inflight_s")),
                  _s(r.get("exposed_s")), "-" if ov is None else f"{ov:.0%}", _s(r.get("wait_s")),
                  f"{r.get('straggler_share', 0):.0%}", style=style)
    con.print(t)
    if len(shown) < len(pr):
        rest = [r for r in pr if r not in shown]
        waits = [r.get("wait_s") or 0 for r in rest]
        con.print(f"... and {len(rest):,} more rank(s), waiting {_s(min(waits))} to {_s(max(waits))} each "
                  "(--all-ranks shows them)")

    cs = rep.get("collectives_summary") or []
    if cs:
        t = Table(title="Collectives by group, op and size", title_justify="left", show_edge=False)
        for col in ("pg", "op", "size", "count", "mean t_comm", "busbw GB/s"):
            t.add_column(col, justify="right" if col not in ("pg", "op") else "left")
        for r in sorted(cs, key=lambda r: -(r.get("count") or 0))[: max(top, 1) * 2]:
            t.add_row(str(r["pg"]), r["op"], r.get("size_label") or str(r.get("size_bucket")), f"{r['count']:,}",
                      _s(r.get("t_comm_s")), _num(r.get("busbw_gbps")))
        con.print(t)

    tc = [r for r in rep.get("top_collectives") or [] if (r.get("total_wait_s") or 0) > 0]
    if tc and top:
        rows = tc[:top]

        def table(sites):
            t = Table(title=f"Top {len(rows)} collectives by wait time (exposed to the waiting ranks)",
                      title_justify="left", show_edge=False)
            for col in ("pg", "seq", "op", "step", "wait", "skew", "last", "site"):
                t.add_column(col, justify="left" if col in ("op", "site", "pg") else "right", no_wrap=True)
            for r, site in zip(rows, sites):
                t.add_row(str(r["pg"]), str(r["seq"]), r["op"], str(r.get("step")), _s(r.get("total_wait_s")),
                          _s(r.get("arrival_skew_s")), str(r.get("last_rank")), site)
            return t

        con.print(_fit_sites(con, table, [r.get("site") for r in rows]))
        con.print("  wait: total over the waiting ranks; skew: first to last arrival; last: the rank that arrived last")

    _render_hang(con, rep)

    _render_what_if(con, rep, top)

    fs = rep.get("findings") or []
    con.rule("Findings")
    if not fs:
        con.print("[green]No findings: no straggler, mismatch, hang or synchronisation misuse.[/green]")
        tr = (rep.get("what_if") or {}).get("top_rank")
        if tr:
            con.print(tr["text"], markup=False, highlight=False)
    for f in fs[: max(top, 1) * 3]:
        head = Text()
        head.append(f"{f['severity'].upper():7} ", style=sev_style.get(f["severity"], ""))
        head.append(f["kind"], style="bold")
        where = []
        if f.get("rank") is not None:
            where.append(f"rank {f['rank']}")
        if f.get("pg") is not None:
            where.append(f"pg {f['pg']}")
        if f.get("seq") is not None:
            where.append(f"seq {f['seq']}")
        if where:
            head.append("  " + ", ".join(where))
        if f.get("site"):
            head.append(f"  at {_site(f['site'])}", style="magenta")
        con.print(head)
        con.print(Text("        " + _rel_sites(f["message"])))
        rc = f.get("root_cause") or {}
        if rc.get("text"):
            con.print(Text("        " + _rel_sites(rc["text"]), style="green"))
    if len(fs) > max(top, 1) * 3:
        con.print(f"... {len(fs) - max(top, 1) * 3} more (use --top or --format json)")


def _rank_errors(states: dict) -> list[str]:
    """The exceptions the ranks exited on, one line per distinct message with the ranks that
    raised it, under the header that counted them: a user's first question about a failed job
    is what failed."""
    from ..analysis.job import error_lines, rank_errors

    return ["  " + line for line in error_lines(rank_errors(states))]


def _render_what_if(con, rep: dict, top: int) -> None:
    """Root causes (delay costs), the critical path and the replay's what-if figures."""
    from rich.table import Table

    wi = rep.get("what_if")
    if not wi:
        return
    con.rule("Root cause and what-if")
    err = wi.get("replay_error") or 0.0
    con.print(f"replay of the unchanged trace: {_s(wi.get('replayed_s'))} against {_s(wi.get('run_time_s'))} "
              f"measured (error {err * 100:+.2f}%"
              + (f", worst step {wi['max_step_error'] * 100:.2f}%" if wi.get("max_step_error") is not None else "")
              + f"); waiting {_s(wi.get('wait_total_s'))} in all")
    dl = [d for d in wi.get("delays") or [] if (d.get("cost_s") or 0) > 0]
    if dl and top:
        t = Table(title="Root causes: delays and the waiting they caused", title_justify="left", show_edge=False)
        for col in ("rank", "step", "before", "after", "delay", "direct cost", "propagated", "if fixed, saves"):
            t.add_column(col, justify="left" if col in ("before", "after") else "right",
                         overflow="fold" if col in ("before", "after") else "ellipsis")
        for d in dl[:top]:
            before = (d.get("op") or "") + (f" at {_site(d.get('site'), 30)}" if d.get("site") else "")
            after = (d.get("prev_op") or "") + (f" at {_site(d.get('prev_site'), 30)}" if d.get("prev_site") else "")
            t.add_row(str(d["rank"]), str(d.get("step")), before, after, _s(d.get("delay_s")),
                      _s(d.get("direct_cost_s")), _s(d.get("propagated_cost_s")), _s(d.get("gain_s")))
        con.print(t)
        if any(not d.get("delay_s") for d in dl[:top]):
            con.print("  delay 0: no gap of that rank there was longer than the same gap on the other ranks; its "
                      "extra time was spread (host time in its calls, several slightly longer gaps), and the "
                      "waiting it caused is placed at its gaps in proportion to their length (no single fix to "
                      "replay: 'if fixed, saves' -)")
        for d in dl[: min(top, 3)]:
            if d.get("text"):
                when = d.get("when") or (f"step {d['step']}" if d.get("step") is not None else None)
                con.print(f"  {d['text']}" + (f" ({when})" if when else ""))
    cp = rep.get("critical_path") or {}
    pr = cp.get("per_rank") or []
    if pr:
        con.print("critical path: " + ", ".join(f"rank {r['rank']} {r['share']:.0%}" for r in pr[:5])
                  + (" ..." if len(pr) > 5 else ""))
        ops = [o for o in cp.get("per_op") or [] if (o.get("on_path_s") or 0) + (o.get("off_path_s") or 0) > 0]
        if ops:
            con.print("communication on the critical path (exposed) / off it (hidden): "
                      + ", ".join(f"{o['op']} {_s(o['on_path_s'])} / {_s(o['off_path_s'])}" for o in ops[:5]))
    sc = wi.get("scenarios") or []
    if sc:
        t = Table(title="What-if (replay)", title_justify="left", show_edge=False)
        for col in ("scenario", "projected run", "saves", "%"):
            t.add_column(col, justify="left" if col == "scenario" else "right")
        for x in sc[: max(top, 1)]:
            t.add_row(x["name"], _s(x.get("projected_s")), _s(x.get("gain_s")), f"{x.get('gain_pct', 0):.1f}")
        con.print(t)


def _render_hang(con, rep: dict) -> None:
    """For a hung or partial run (stack dumps, missing ranks, not_joined / not_completed): the
    last op each rank completed and the stack dumps to read next."""
    from rich.table import Table

    stacks = rep.get("stacks") or {}
    hang_kinds = {"not_joined", "not_completed"}
    hung = any(f.get("kind") in hang_kinds for f in rep.get("findings") or [])
    early = rep.get("ended_early") or []
    if not (stacks or hung or rep.get("missing_ranks") or early):
        return
    last = rep.get("last_completed") or {}
    t = Table(title="Last completed op per rank (hung or partial run)", title_justify="left", show_edge=False)
    for col in ("rank", "op", "pg", "seq", "site"):
        t.add_column(col, justify="right" if col in ("rank", "seq") else "left")
    for r in sorted(set(map(str, rep.get("ranks") or [])) | set(last), key=lambda x: int(x)):
        lc = last.get(r) or last.get(int(r)) if isinstance(last, dict) else None
        if lc:
            t.add_row(r, str(lc.get("op")), str(lc.get("pg")), str(lc.get("seq")), _site(lc.get("site"), 60))
        else:
            t.add_row(r, "none completed", "", "", "")
    states = rep.get("rank_states") or {}
    for r in rep.get("missing_ranks") or []:
        st = states.get(str(r)) or {}
        what = {"crashed": f"crashed ({st.get('signal') or 'fatal signal'}) before its first flush",
                "killed": "died before its first flush", "alive": "alive, nothing flushed yet",
                "exception": "exited on an exception before its first flush"}.get(st.get("state"), "no trace at all")
        t.add_row(str(r), what, "", "", "")
    con.print(t)
    for e in early:
        lo = e.get("last_op") or {}
        when = f" {_s(e['last_t_s'])} into the run" if e.get("last_t_s") is not None else ""
        last_op = (f"; last op issued: {lo.get('op')} seq {lo.get('seq')} on pg {lo.get('pg')}"
                   + (f" at {_site(lo.get('site'), 60)}" if lo.get("site") else "")
                   + ("" if lo.get("t_end_ns") is not None else " (never completed)")) if lo else ""
        con.print(f"[red]rank {e['rank']} ended early[/red] (last sign of life{when}): "
                  f"{e.get('reason')}{last_op}", soft_wrap=True)
    for r, files in sorted(stacks.items(), key=lambda kv: int(kv[0])):
        for f in files:
            con.print(f"stacks of rank {r}: {f}")
