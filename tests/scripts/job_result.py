"""Shared by the tests/scripts/writer_*.py jobs: how a rank ends and hands its figures to the
test (``result-<rank>.json`` in the run directory)."""

import json
import os

import torch.distributed as dist

import commtrace


def finish(out: str, rank: int, res: dict) -> None:
    """Stop tracing (the final part is written), write this rank's ``result-<rank>.json``
    and leave the process group."""
    commtrace.disable()
    with open(os.path.join(out, f"result-{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()
