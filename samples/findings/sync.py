"""Findings `sync_while_inflight` and `redundant_sync` (GPU, NCCL): `torch.cuda.synchronize()`
while an async all_reduce is in flight drains every stream, so the communication can no longer
overlap with compute; a `synchronize()` right after `work.wait()` is a full device drain the
wait already made unnecessary.

    commtrace run -- torchrun --nproc-per-node 2 samples/findings/sync.py

Without CUDA the sample runs the same loop on gloo without the synchronize() calls (there is
no device to drain) and commtrace reports no synchronisation finding: see samples/README.md.
"""

import os

import torch
import torch.distributed as dist

STEPS = 10
cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("WORLD_SIZE", "1"))

dist.init_process_group("nccl" if cuda else "gloo")
rank = dist.get_rank()
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
else:
    print(f"rank {rank}: no CUDA device per rank; running on gloo without synchronize()", flush=True)
x = torch.randn(1024, 1024, device=device)
grad = torch.ones(1 << 22, device=device)
for step in range(STEPS):
    work = dist.all_reduce(grad, async_op=True)
    y = x @ x
    if cuda:
        torch.cuda.synchronize()  # BUG 1: drains the comm stream while the all_reduce is in flight
    work.wait()
    if cuda:
        torch.cuda.synchronize()  # BUG 2: redundant right after wait()
    y = y @ x
dist.destroy_process_group()
