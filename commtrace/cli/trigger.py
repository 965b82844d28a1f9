"""`commtrace trigger DIR --steps N`: make a running job record its next N steps exactly."""

from __future__ import annotations

import os

import click

from ..errors import UsageError

EPILOG = """\b
Examples:
  commtrace run --on-demand -o traces -- torchrun --nproc-per-node 8 train.py &
  commtrace trigger traces --steps 20        # the next 20 steps, op by op, on every rank
  commtrace trigger traces/<run-id> --steps 5
"""


@click.command("trigger", epilog=EPILOG)
@click.argument("run_dir", metavar="DIR", type=click.Path())
@click.option("--steps", "steps", type=click.IntRange(min=1), required=True, metavar="N",
              help="How many steps to record.")
def command(run_dir, steps):
    """Make the job writing DIR record its next N steps op by op.

    For a job started with `commtrace run --on-demand` (or with --steps / --schedule): each
    rank reads the request at its next flush; rank 0 picks the first step (its current step
    + 3) and shares it through the job's store, so every rank records the same steps."""
    from ..capture.window import TRIGGER_MARGIN_STEPS, write_trigger

    if not os.path.isdir(run_dir):
        raise UsageError(f"{run_dir}: no such directory (give the -o of commtrace run, or a run directory)")
    trig = write_trigger(run_dir, steps)
    click.echo(f"trigger {trig['id']}: the job records {steps} step(s) op by op, from rank 0's "
               f"step + {TRIGGER_MARGIN_STEPS} (within a flush interval)")
    return 0
