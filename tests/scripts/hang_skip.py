"""Rank 1 skips the 6th all_reduce and then sleeps: rank 0 hangs in its 6th all_reduce (seq 5)
until the job is ended (issue 6 acceptance).

    commtrace run -o OUT --hang-timeout 5 -- torchrun --nproc-per-node 2 tests/scripts/hang_skip.py
"""

import time

import torch
import torch.distributed as dist

N, SKIP = 6, 5

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1 << 10)
for i in range(N):
    if rank == 1 and i == SKIP:
        continue  # the bug: this rank skips the 6th all_reduce
    dist.all_reduce(t)  # HANG-LINE: rank 0 waits here in its 6th call
print(f"rank {rank} done issuing", flush=True)
if rank == 1:
    time.sleep(600)  # stuck elsewhere (a data loader, a deadlock): never joins again
dist.destroy_process_group()
