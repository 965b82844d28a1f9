"""Use-before-wait on gloo: host reads and torch ops on tensors of async ops not waited yet.

Run by tests/test_hazards_gloo.py under torchrun (2 ranks): first a trace with
``hazards="basic"`` then one with ``hazards="full"`` in the same process. Lines marked
``# HAZARD:<name>`` must give a hazard row at that line; lines marked ``# CLEAN`` must not.
"""

import os
import sys

import torch
import torch.distributed as dist

from commtrace import trace

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()

with trace(output=os.path.join(out, "basic"), hazards="basic", flush_interval=0.2):
    t = torch.ones(1) * (rank + 1)
    w = dist.all_reduce(t, async_op=True)
    early = t.item()  # HAZARD:item
    w.wait()
    late = t.item()  # CLEAN
    assert late == 3.0, late
    bucket = torch.ones(1 << 16)
    w = dist.all_reduce(bucket, async_op=True)
    text = repr(bucket[:3])  # HAZARD:repr
    other = torch.zeros(4).tolist()  # CLEAN
    w.wait()
    text = repr(bucket[:3])  # CLEAN

with trace(output=os.path.join(out, "full"), hazards="full", flush_interval=0.2):
    t = torch.ones(8)
    w = dist.all_reduce(t, async_op=True)
    n = t.numel()  # CLEAN
    u = t * 2  # HAZARD:mul
    w.wait()
    u = t * 2  # CLEAN

dist.destroy_process_group()
