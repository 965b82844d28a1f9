"""A few all_reduces with a little compute between them; run by two torchrun agents as two
simulated nodes (tests/test_robustness_multinode.py).

    torchrun --nnodes 2 --node-rank I --nproc-per-node 1 --master-addr 127.0.0.1 --master-port P \
        tests/scripts/robust_multinode.py
"""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1 << 12)
for i in range(30):
    time.sleep(0.005 * (1 + rank))  # rank 1 a little slower: a real arrival order to align
    dist.all_reduce(t)
dist.barrier()
print(f"rank {rank} of {dist.get_world_size()} done: {float(t[0]):g}", flush=True)
dist.destroy_process_group()
