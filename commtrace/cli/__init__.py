"""`commtrace` command line: a thin click group whose subcommands live one per module and are
imported only when invoked (so `commtrace run` never imports the analysis side).

Every :class:`~commtrace.errors.CommtraceError` and every usage error becomes one line on
stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import click

from ..errors import CommtraceError

#: command name -> (module, one-line help). Each module defines `command`, a click.Command.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("commtrace.cli.run", "Run a command with tracing on in every rank."),
    "report": ("commtrace.cli.report", "Analyse a run: waits, stragglers, overlap, findings."),
    "synth": ("commtrace.cli.synth", "Write a synthetic run with planted anomalies."),
    "dashboard": ("commtrace.cli.dashboard", "Serve the interactive dashboard of a run."),
    "export": ("commtrace.cli.export", "Export a run to Perfetto/Chrome JSON, CSV or Parquet."),
    "diff": ("commtrace.cli.diff", "Compare two runs per op, size and finding."),
    "ls": ("commtrace.cli.ls", "List the runs under a directory and how each job ended."),
    "trigger": ("commtrace.cli.trigger", "Make a running job record its next N steps exactly."),
    "accel": ("commtrace.cli.accel", "Build the parts of capture compiled against your torch."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return [n for n, (mod, _) in COMMANDS.items() if importlib.util.find_spec(mod)]

    def get_command(self, ctx, name):
        entry = COMMANDS.get(name)
        if entry is None:
            return None
        try:
            mod = importlib.import_module(entry[0])
        except ModuleNotFoundError as e:
            if e.name == entry[0]:
                return None
            raise
        return mod.command

    def format_commands(self, ctx, formatter):
        rows = [(n, COMMANDS[n][1]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


EPILOG = """\b
Examples:
  commtrace run -- torchrun --nproc-per-node 8 train.py
  commtrace report commtrace-traces/<run>
  commtrace dashboard commtrace-traces/<run>
  commtrace export commtrace-traces/<run> --format perfetto -o run.json.gz
"""


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="commtrace", prog_name="commtrace")
def cli():
    """commtrace: which op, on which rank, waited for whom, for how long, and why."""


#: Commands that start the user's program: its environment is left exactly as it was.
USER_PROGRAM_COMMANDS = ("run",)


def _one_blas_thread(argv) -> None:
    """Give numpy's OpenBLAS one thread in the analysis commands, unless the user chose a number.

    Importing numpy starts OpenBLAS's thread pool, one thread per CPU but one, and each new
    thread spins about 0.1 s before it sleeps: 0.1 s of CPU per command on a 2-CPU machine,
    several seconds on a 64-CPU node, taken from DuckDB's and the analysis' own threads while
    the command starts (docs/performance.md, session 24). The analysis makes no BLAS call
    (no matrix products or solvers). Only in this process: `commtrace run` (the user's program)
    keeps its environment as it was."""
    args = list(sys.argv[1:] if argv is None else argv)
    cmd = next((a for a in args if not a.startswith("-")), None)
    if cmd in USER_PROGRAM_COMMANDS or "numpy" in sys.modules:
        return
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv=None) -> int:
    """Entry point of the `commtrace` command; returns the exit code."""
    _one_blas_thread(argv)
    import commtrace.analysis  # an empty package: cheap, and never a rank's import
    commtrace.analysis.TUNE_MALLOC = True  # this process is commtrace's own (model.py)
    try:
        rv = cli.main(args=argv, prog_name="commtrace", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("commtrace: aborted", err=True)
        return 130
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e))
        return 0
    except click.exceptions.UsageError as e:
        hint = f" (see 'commtrace {e.ctx.info_name} --help')" if e.ctx and e.ctx.parent else " (see 'commtrace --help')"
        click.echo(f"commtrace: error: {e.format_message()}{hint}", err=True)
        return 2
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.ClickException as e:
        click.echo(f"commtrace: error: {e.format_message()}", err=True)
        return e.exit_code
    except CommtraceError as e:
        click.echo(f"commtrace: error: {e}", err=True)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
