"""Rank 2 sits in a user function (a stuck data loader) instead of joining the 4th all_reduce:
ranks 0 and 1 wait in it until the job is ended."""

import sys
import time

import torch
import torch.distributed as dist


def data_loader_stuck():
    time.sleep(float(sys.argv[1]))  # STUCK-LINE


dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(256)
for i in range(4):
    if rank == 2 and i == 3:
        data_loader_stuck()
    dist.all_reduce(t)
dist.destroy_process_group()
