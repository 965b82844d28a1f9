"""Rank 1 skips one all_reduce, then is stuck elsewhere: rank 0 hangs in its last all_reduce
until the job is terminated (issue 3 acceptance: not_joined names rank 1 and the seq).

    commtrace run -o OUT -- torchrun --nproc-per-node 2 tests/scripts/analysis_skip.py N SKIP
"""

import sys
import time

import torch
import torch.distributed as dist

N, SKIP = int(sys.argv[1]), int(sys.argv[2])

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1 << 10)
for i in range(N):
    if rank == 1 and i == SKIP:
        continue  # the bug: this rank skips one all_reduce
    dist.all_reduce(t)
print(f"rank {rank} done issuing", flush=True)
if rank == 1:
    time.sleep(600)  # stuck elsewhere (a data loader, a deadlock): never joins again
dist.destroy_process_group()
