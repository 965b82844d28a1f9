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
# Start together (a barrier through the rendezvous store, not a traced op): otherwise on a loaded
# machine one rank's start-up can lag the other's by 100 ms, and which rank reaches the first
# all_reduce last decides whether its one-off set-up cost shows (first_op_init_stall) or hides
# in a wait. Aligned, rank 0 always arrives first, by rank 1's 20 ms sleep.
store = dist.distributed_c10d._get_default_store()
store.add("analysis_straggler/ready", 1)
while store.add("analysis_straggler/ready", 0) < dist.get_world_size():
    time.sleep(0.001)
for i in range(N):
    if rank == 1:
        time.sleep(DELAY)
    dist.all_reduce(t)
dist.destroy_process_group()
