"""Finding `wait_immediately`: an async all_reduce waited right after it is issued, with nothing
in between: `async_op=True` bought no overlap.

    commtrace run -- torchrun --nproc-per-node 2 samples/findings/wait_immediately.py
"""

import torch
import torch.distributed as dist

STEPS = 6

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.randn(256, 256)
grad = torch.ones(1 << 16)
for step in range(STEPS):
    work = dist.all_reduce(grad, async_op=True)
    work.wait()  # waited at once: the independent matmul below could have run meanwhile
    y = x @ x
dist.destroy_process_group()
