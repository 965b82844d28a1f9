"""`commtrace accel build|status`: the parts of capture compiled against the installed torch
(DDP's recording group and C++ comm hook, the tensor reads; commtrace/capture/accel.py)."""

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
    """Build or inspect commtrace's C++ module for the installed torch (DDP, tensor reads).

    Built, DDP's gradient all-reduces are recorded by a process group handed to DDP's
    Reducer (no comm hook, no Python and no GIL on the backend's thread; DDP runs its own
    kernels, bit for bit; COMMTRACE_DDP_GROUP=0 records through a C++ comm hook instead),
    each bucket as a C record whose row the writer thread builds (COMMTRACE_DDP_DIRECT=0:
    as a pending op with its row built on the training thread). Not built, or built for another torch, commtrace records DDP through its C comm hook, with
    no error. The same build gives the C fast path its per-op reads of the tensor (count,
    dtype, device) and of torch's sequence number through torch's C++ API instead of its
    Python-level accessors (about 2 us of CPU less per op at 2 ranks; COMMTRACE_ACCEL_META=0
    turns them off); docs/performance.md. The build goes to $COMMTRACE_CACHE_DIR (default
    ~/.cache/commtrace) and needs a C++ compiler and ninja."""


@command.command("build", epilog=EPILOG)
@click.option("--verbose", is_flag=True, help="Show the compiler's commands.")
def build(verbose):
    """Compile the C++ module (DDP recording, tensor reads) for the installed torch (nothing
    to do if built already)."""
    from ..capture import accel

    t0 = time.monotonic()
    path = accel.build(verbose=verbose)
    click.echo(f"C++ module (DDP recording, tensor reads): {path} ({time.monotonic() - t0:.0f} s)")
    return 0


@command.command("status", epilog=EPILOG)
def status():
    """Say whether the C++ module is built for the installed torch, and where."""
    import torch

    from ..capture import accel

    name = accel.module_name()
    path = accel._built_file(name)
    if path:
        click.echo(f"C++ module (DDP recording, tensor reads): built for torch {torch.__version__}: {path}")
    else:
        click.echo(f"C++ module (DDP recording, tensor reads): not built for torch "
                   f"{torch.__version__} in {accel.cache_dir()} (commtrace accel build); DDP is "
                   "recorded through the C comm hook and tensors read through torch's "
                   "Python-level accessors")
    return 0
