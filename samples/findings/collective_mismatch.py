"""Finding `collective_mismatch`: at step 3 rank 1 all-reduces a float64 tensor where rank 0
uses float32. The byte counts agree, so gloo does not notice and silently sums garbage; commtrace
compares op, dtype and count per (group, seq) across ranks and flags it.

    commtrace run -- torchrun --nproc-per-node 2 samples/findings/collective_mismatch.py
"""

import torch
import torch.distributed as dist

STEPS, BAD_STEP, N = 6, 3, 1 << 12

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(STEPS):
    if rank == 1 and step == BAD_STEP:
        t = torch.ones(N // 2, dtype=torch.float64)  # BUG: wrong dtype (same number of bytes)
    else:
        t = torch.ones(N, dtype=torch.float32)
    dist.all_reduce(t)
dist.destroy_process_group()
