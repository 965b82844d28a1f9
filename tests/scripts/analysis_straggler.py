"""Rank 1 sleeps 20 ms before each of 30 all_reduces (issue 3 acceptance: straggler).

    commtrace run -o OUT -- torchrun --nproc-per-node 2 tests/scripts/analysis_straggler.py
"""

import time

import torch
import torch.distributed as dist

N, DELAY = 30, 0.020

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1 << 12)
for i in range(N):
    if rank == 1:
        time.sleep(DELAY)
    dist.all_reduce(t)
dist.destroy_process_group()
