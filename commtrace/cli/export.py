"""`commtrace export DIR`: write a run as Perfetto/Chrome JSON, CSV or Parquet."""

from __future__ import annotations

import time

import click

EPILOG = """\b
Examples:
  commtrace export commtrace-traces/<run> --format perfetto -o run.json.gz
  commtrace export RUN --format csv -o ops.csv
  commtrace export RUN --format parquet -o ops.parquet
Open a Perfetto export at https://ui.perfetto.dev (or chrome://tracing).
"""


@click.command("export", epilog=EPILOG)
@click.argument("run_dir", metavar="DIR", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["perfetto", "csv", "parquet"]), default="perfetto",
              show_default=True, help="perfetto: Chrome Trace Event JSON; csv/parquet: the analysed per-op table.")
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False),
              help="Output file; a name ending in .gz is gzip-compressed (perfetto, csv).")
@click.option("--run", "run_id", default=None, metavar="ID|latest",
              help="When DIR holds several runs: the one to use (its id, or latest).")
def command(run_dir, fmt, output, run_id):
    """Export a run for other tools.

    perfetto writes one process per rank, tracks for host calls, in-flight communication,
    wait() and synchronize(), findings as instant events and flow arrows between the ranks'
    copies of each collective, on aligned clocks. csv and parquet write one row per op with
    its wait state and its collective's t_comm and busbw."""
    from ..analysis.run import load
    from ..export import export

    t0 = time.perf_counter()
    run = load(run_dir, run=run_id)
    try:
        res = export(run, output, fmt)
    finally:
        run.close()
    what = ", ".join(f"{v:,} {k}" for k, v in res.items())
    click.echo(f"wrote {output} ({what}) in {time.perf_counter() - t0:.1f} s", err=True)
    if fmt == "perfetto":
        click.echo("next: open it at https://ui.perfetto.dev", err=True)
    return 0
