"""`commtrace synth OUT`: write a synthetic run with planted anomalies."""

from __future__ import annotations

import contextlib

import click

from ..errors import OutputError, UsageError

EPILOG = """\b
Examples:
  commtrace synth /tmp/clean --ranks 8 --ops 2000
  commtrace synth /tmp/slow --ranks 4 --ops 500 --straggler 1:20ms
  commtrace synth /tmp/hang --ranks 4 --ops 500 --skip 2:40
  commtrace synth /tmp/bad --ranks 4 --ops 500 --mismatch 3:25 --skew 1:50ms
  commtrace report /tmp/slow
  commtrace synth /tmp/tpdp --layout tpdp --tp 2 --dp 4 --steps 8 --delay 5:3:20ms
  commtrace synth /tmp/pipe --layout pipeline --stages 4 --steps 4 --delay 1:2:20ms
"""


@contextlib.contextmanager
def _errors(out):
    """The generator's errors as the CLI's: bad parameters are usage errors, a failed write an
    output error, each one line."""
    try:
        yield
    except ValueError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise OutputError(f"cannot write {out}: {e}") from None


def _pair(value: str, opt: str, duration: bool):
    from ..analysis.synth import parse_duration_ns
    try:
        r, v = value.split(":", 1)
        return int(r), (parse_duration_ns(v) if duration else int(v))
    except ValueError:
        raise UsageError(f"{opt} expects RANK:{'DURATION' if duration else 'SEQ'}, got {value!r}") from None


@click.command("synth", epilog=EPILOG)
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--ranks", "-n", type=click.IntRange(1, 1 << 16), default=4, show_default=True, help="World size.")
@click.option("--ops", "-m", type=click.IntRange(1), default=1000, show_default=True, help="Ops per rank.")
@click.option("--straggler", multiple=True, metavar="R:DELAY",
              help="Rank R arrives DELAY late at every op (20ms, 500us, bare number = ns).")
@click.option("--late-send", multiple=True, metavar="R:DELAY", help="Rank R posts its ring isend DELAY late.")
@click.option("--skip", metavar="R:SEQ", help="Rank R never issues collective SEQ of pg 0; the job hangs there.")
@click.option("--mismatch", multiple=True, metavar="R:SEQ", help="Rank R passes twice the count at collective SEQ.")
@click.option("--skew", multiple=True, metavar="R:NS", help="Rank R's clock runs NS ahead (units allowed).")
@click.option("--no-offsets", is_flag=True, help="Do not record the measured clock offsets (gives clock violations with --skew).")
@click.option("--hazards", is_flag=True, help="Plant host hazards on rank 0 (use-before-wait, synchronize() misuse, immediate wait).")
@click.option("--init-stall", default="0", metavar="DURATION", help="Extra host block of the first op per group / peer pair.")
@click.option("--parts", type=click.IntRange(1), default=1, show_default=True, help="Parquet parts per rank.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--force", "-f", is_flag=True, help="Replace OUT if it exists.")
@click.option("--layout", type=click.Choice(["tpdp", "pipeline"]), default=None,
              help="Instead of the default loop: a TP x DP layout (TP all_reduce then DP all_reduce per "
                   "step) or a pipeline (recv, work, isend per microbatch), for delay analysis and what-if.")
@click.option("--tp", type=click.IntRange(1), default=2, show_default=True, help="--layout tpdp: TP group size.")
@click.option("--dp", type=click.IntRange(1), default=2, show_default=True, help="--layout tpdp: DP group size.")
@click.option("--stages", type=click.IntRange(2), default=4, show_default=True, help="--layout pipeline: stages.")
@click.option("--steps", type=click.IntRange(1), default=8, show_default=True, help="--layout: steps.")
@click.option("--microbatches", type=click.IntRange(1), default=4, show_default=True,
              help="--layout pipeline: microbatches per step.")
@click.option("--delay", "delays", multiple=True, metavar="R:STEP:DELAY[:WHERE]",
              help="--layout: rank R works DELAY longer in STEP (tpdp: before its TP all_reduce, or WHERE=dp; "
                   "pipeline: before its send of microbatch WHERE, default 0).")
def command(out, ranks, ops, straggler, late_send, skip, mismatch, skew, no_offsets, hazards, init_stall, parts, seed,
            force, layout, tp, dp, stages, steps, microbatches, delays):
    """Write a synthetic run in the public trace format, with planted anomalies.

    The run mixes broadcast, all_gather, async all_reduce buckets, reduce_scatter, isend/irecv
    pairs and step markers, so that every analysis path has something to chew on."""
    import os
    import sys
    import time

    from ..analysis.synth import parse_duration_ns, synth_run

    if os.path.exists(out) and os.listdir(out) and not force:
        raise OutputError(f"{out} exists and is not empty (use --force to replace it)")
    try:
        stall = parse_duration_ns(init_stall)
    except ValueError:
        raise UsageError(f"--init-stall expects a duration, got {init_stall!r}") from None
    _check_mode(layout)
    t0 = time.perf_counter()
    if layout:
        from ..analysis.synth import synth_layout
        plan = []
        for d in delays:
            parts_ = d.split(":")
            try:
                if len(parts_) not in (3, 4):
                    raise ValueError
                item = [int(parts_[0]), int(parts_[1]), parse_duration_ns(parts_[2])]
                if len(parts_) == 4:
                    item.append(parts_[3] if layout == "tpdp" else int(parts_[3]))
                    if layout == "tpdp" and item[3] not in ("tp", "dp"):
                        raise ValueError
            except ValueError:
                raise UsageError(f"--delay expects R:STEP:DELAY[:WHERE] (WHERE: tp or dp for tpdp, a microbatch "
                                 f"for pipeline), got {d!r}") from None
            plan.append(tuple(item))
        with _errors(out):
            res = synth_layout(out, layout, tp=tp, dp=dp, stages=stages, steps=steps, microbatches=microbatches,
                               delays=plan, seed=seed, command="commtrace " + " ".join(sys.argv[1:]))
        click.echo(f"wrote {res.world_size} ranks ({layout}, {res.rows} rows) to {out} "
                   f"in {time.perf_counter() - t0:.1f} s", err=True)
        click.echo(f"next: commtrace report {out}", err=True)
        return 0
    with _errors(out):
        res = synth_run(
            out, ranks=ranks, ops=ops,
            straggler=[_pair(s, "--straggler", True) for s in straggler],
            late_send=[_pair(s, "--late-send", True) for s in late_send],
            skip=_pair(skip, "--skip", False) if skip else None,
            mismatch=[_pair(s, "--mismatch", False) for s in mismatch],
            skew=[_pair(s, "--skew", True) for s in skew],
            hazards=hazards, init_stall_ns=stall, record_offsets=not no_offsets,
            parts_per_rank=parts, seed=seed, command="commtrace " + " ".join(sys.argv[1:]))
    click.echo(f"wrote {res.world_size} ranks x {res.ops_per_rank} ops ({res.rows} rows) to {out} "
               f"in {time.perf_counter() - t0:.1f} s", err=True)
    click.echo(f"next: commtrace report {out}", err=True)
    return 0


#: Options of the default loop, and of --layout only: given with the other mode they would be
#: ignored without a word (a `--straggler` on a layout run planted nothing).
LOOP_ONLY = ("ranks", "ops", "straggler", "late_send", "skip", "mismatch", "skew", "no_offsets", "hazards",
             "init_stall", "parts")
LAYOUT_ONLY = ("tp", "dp", "stages", "steps", "microbatches", "delays")


def _check_mode(layout) -> None:
    """A one-line error when an option of the other mode was given on the command line."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = [p for p in ctx.params if ctx.get_parameter_source(p) == ParameterSource.COMMANDLINE]
    names = {p.name: p.opts[0] for p in ctx.command.params}
    if layout:
        wrong = [names[p] for p in given if p in LOOP_ONLY]
        if wrong:
            raise UsageError(f"{_listed(wrong)} {'does' if len(wrong) == 1 else 'do'} not apply with --layout "
                             f"{layout} (plant delays with "
                             "--delay R:STEP:DELAY; size the layout with --tp/--dp or --stages, and --steps)")
    else:
        wrong = [names[p] for p in given if p in LAYOUT_ONLY]
        if wrong:
            raise UsageError(f"{_listed(wrong)} {'needs' if len(wrong) == 1 else 'need'} --layout tpdp or "
                             "--layout pipeline")


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
