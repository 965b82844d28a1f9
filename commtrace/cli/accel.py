"""`commtrace accel build|status`: the parts of capture compiled against the installed torch
(today DDP's comm hook in C++; commtrace/capture/accel.py)."""

from __future__ import annotations

import time

import click

EPILOG = """\b
Examples:
  commtrace accel build              # once per torch install (about 1-2 minutes)
  commtrace accel status
  COMMTRACE_CACHE_DIR=/shared/cache commtrace accel build
"""


@click.group("accel", epilog=EPILOG)
def command():
    """Build or inspect the C++ DDP comm hook for the installed torch.

    DDP's gradient all-reduces are recorded through a comm hook. Built, the hook is C++ to
    DDP's Reducer: no GIL on the backend's thread, and about half the training-thread CPU
    that commtrace's C hook (which DDP calls through Python) adds per step
    (docs/performance.md). Not built, or built for another torch,
    commtrace uses its C hook, as before, with no error. The same build gives the C fast path
    its per-op reads of the tensor (count, dtype, device) and of torch's sequence number
    through torch's C++ API instead of its Python-level accessors (about 2 us of CPU less
    per op at 2 ranks; COMMTRACE_ACCEL_META=0 turns them off). The build goes to
    $COMMTRACE_CACHE_DIR (default ~/.cache/commtrace) and needs a C++ compiler and ninja."""


@command.command("build", epilog=EPILOG)
@click.option("--verbose", is_flag=True, help="Show the compiler's commands.")
def build(verbose):
    """Compile the C++ DDP hook for the installed torch (nothing to do if built already)."""
    from ..capture import accel

    t0 = time.monotonic()
    path = accel.build(verbose=verbose)
    click.echo(f"C++ DDP comm hook: {path} ({time.monotonic() - t0:.0f} s)")
    return 0


@command.command("status", epilog=EPILOG)
def status():
    """Say whether the C++ DDP hook is built for the installed torch, and where."""
    import torch

    from ..capture import accel

    name = accel.module_name()
    path = accel._built_file(name)
    if path:
        click.echo(f"C++ DDP comm hook: built for torch {torch.__version__}: {path}")
        click.echo("tensor and group reads through torch's C++ API: built (same module)")
    else:
        click.echo(f"C++ DDP comm hook: not built for torch {torch.__version__} in "
                   f"{accel.cache_dir()} (commtrace accel build); the C hook is used")
        click.echo("tensor and group reads through torch's C++ API: not built; torch's "
                   "Python-level accessors are used")
    return 0
