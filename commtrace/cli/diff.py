"""`commtrace diff RUN_A RUN_B`: compare two runs per op, size bucket and finding kind."""

from __future__ import annotations

import json
import sys

import click

from .report import _s  # one duration formatter for both commands

EPILOG = """\b
Examples:
  commtrace diff traces/before traces/after
  commtrace diff traces/good traces/bad --format json > diff.json
  commtrace diff traces traces --run-a 20260101-120000-a1b2c3 --run-b latest
"""


def _signed(v, fmt):
    if v is None:
        return "-"
    return ("+" if v > 0 else "") + fmt(v)


def render(d: dict, console=None) -> None:
    """Print the diff dict as terminal tables (rich)."""
    from rich.console import Console
    from rich.table import Table

    con = console or Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 150)
    con.rule("[bold]commtrace diff[/bold]")
    con.print(f"A: {d['a']}\nB: {d['b']}")
    t = Table(title="Totals (summed over ranks)", title_justify="left", show_edge=False)
    for c in ("figure", "A", "B", "B - A", "change"):
        t.add_column(c, justify="left" if c == "figure" else "right")
    for k, v in d["totals"].items():
        is_t = k.endswith("_s")
        f = _s if is_t else (lambda x: f"{x:,.0f}")
        t.add_row(k, f(v["a"]), f(v["b"]), _signed(v["delta"], f),
                  "-" if v["rel"] is None else f"{v['rel']:+.0%}")
    con.print(t)
    t = Table(title="Per op and size bucket", title_justify="left", show_edge=False)
    for c in ("op", "size", "calls A", "calls B", "t_comm A", "t_comm B", "busbw A", "busbw B",
              "exposed A", "exposed B", "exposed B - A"):
        t.add_column(c, justify="left" if c in ("op",) else "right", no_wrap=True)
    bw = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731
    for r in d["ops"]:
        t.add_row(r["op"], r["size_label"], str(r["calls_a"] or 0), str(r["calls_b"] or 0),
                  _s(r["t_comm_s_a"]), _s(r["t_comm_s_b"]), bw(r["busbw_gbps_a"]), bw(r["busbw_gbps_b"]),
                  _s(r["exposed_s_a"]), _s(r["exposed_s_b"]), _signed(r["exposed_s_delta"], _s))
    con.print(t)
    if d["findings"]:
        t = Table(title="Findings by kind", title_justify="left", show_edge=False)
        for c in ("kind", "severity", "A", "B", "B - A"):
            t.add_column(c, justify="left" if c in ("kind", "severity") else "right")
        for f in d["findings"]:
            t.add_row(f["kind"], f["severity"] or "", str(f["a"]), str(f["b"]), f"{f['delta']:+d}")
        con.print(t)
    else:
        con.print("findings: none in either run")


@click.command("diff", epilog=EPILOG)
@click.argument("run_a", metavar="RUN_A", type=click.Path())
@click.argument("run_b", metavar="RUN_B", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--run-a", "run_a_id", default=None, metavar="ID|latest", help="When RUN_A holds several runs: the one to use.")
@click.option("--run-b", "run_b_id", default=None, metavar="ID|latest", help="When RUN_B holds several runs: the one to use.")
def command(run_a, run_b, fmt, run_a_id, run_b_id):
    """Compare two runs: per op and size bucket (calls, t_comm, busbw, exposed time), totals
    over ranks (exposed, in flight, blocked, wait) and findings per kind. B - A < 0 on
    exposed or wait time means B is better."""
    from ..analysis.run import load
    from ..export.diff import diff_runs

    a = load(run_a, run=run_a_id)
    b = load(run_b, run=run_b_id)
    try:
        d = diff_runs(a, b)
    finally:
        a.close()
        b.close()
    if fmt == "json":
        click.echo(json.dumps(d, indent=1, default=str))
    else:
        render(d)
    return 0
