"""Shared by the tests/scripts/stack_*.py scenarios (issue 13, item 4): an independent count of
the collectives a rank issued, from torch.profiler, and a digest of the results.

The count: every ``c10d::*`` and ``_c10d_functional::*`` op event of the profiler whose parent is
not itself such an event (a functional collective dispatches a ``c10d::`` op inside: counted
once), without ``wait_tensor`` / ``_wrap_tensor_autograd`` (no communication), by canonical op.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

SKIP = ("wait_tensor", "_wrap_tensor_autograd")
#: substrings of op names -> canonical op (first match wins: reduce_scatter before scatter)
CANON = (("reduce_scatter", "reduce_scatter"), ("allreduce", "all_reduce"),
         ("all_reduce", "all_reduce"), ("allgather", "all_gather"), ("all_gather", "all_gather"),
         ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"), ("broadcast", "broadcast"),
         ("scatter", "scatter"), ("gather", "gather"), ("barrier", "barrier"),
         ("recv", "recv"), ("send", "send"), ("reduce", "reduce"))


def _comm(name: str) -> bool:
    return name.startswith("c10d::") or name.startswith("_c10d_functional::")


def canonical(name: str) -> str | None:
    base = name.split("::", 1)[1]
    if any(s in base for s in SKIP):
        return None
    for sub, op in CANON:
        if sub in base:
            return op
    return base


def comm_counts(prof) -> dict:
    """op -> number of collectives issued, from a finished torch.profiler.profile."""
    out: dict = {}
    for e in prof.events():
        if not _comm(e.name):
            continue
        p = e.cpu_parent
        if p is not None and _comm(p.name):
            continue
        op = canonical(e.name)
        if op is not None:
            out[op] = out.get(op, 0) + 1
    return out


def digest(tensors) -> str:
    """sha256 of the tensors' bytes (DTensors as their full value), in order."""
    h = hashlib.sha256()
    for t in tensors:
        full = getattr(t, "full_tensor", None)
        t = full() if full is not None else t
        t = t.detach().contiguous().cpu()
        h.update(bytes(t.view(-1).view(__import__("torch").uint8).tolist()))
    return h.hexdigest()


def finish(rank: int, results, prof, counts_path: str, extra: dict | None = None) -> None:
    """Print this rank's result line; write the profiler's count (and `extra`) when asked."""
    # one write (atomic on a pipe): the ranks share torchrun's stdout
    sys.stdout.flush()
    os.write(1, f"RESULT {rank} {digest(results)}\n".encode())
    if counts_path:
        d = {"ops": comm_counts(prof)}
        d.update(extra or {})
        with open(f"{counts_path}.{rank}", "w") as f:
            json.dump(d, f)


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def shutdown() -> None:
    """destroy_process_group() once nothing of the script can hold a group any more: a gloo
    group freed at interpreter exit can end the process with "terminate called without an
    active exception"."""
    import gc

    import torch.distributed as dist

    gc.collect()
    dist.destroy_process_group()
