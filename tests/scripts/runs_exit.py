"""Ranks that end with their own exit codes: after 4 all_reduces and a barrier, rank 1 calls
sys.exit(3) and rank 2 os._exit(4); rank 0 returns normally (exit code 0)."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(256)
for _ in range(4):
    dist.all_reduce(t)
dist.barrier()
if rank == 1:
    sys.exit(3)
if rank == 2:
    os._exit(4)
dist.destroy_process_group()
