"""Finding `use_before_wait`: the loss is all-reduced asynchronously and then read with
`.item()` before `work.wait()`: the value read may be the local one, not the sum.

    commtrace run -- torchrun --nproc-per-node 2 samples/findings/use_before_wait.py
"""

import torch
import torch.distributed as dist

STEPS = 6

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.randn(64, 64)
for step in range(STEPS):
    loss = (x * step).mean().reshape(1)
    work = dist.all_reduce(loss, async_op=True)
    logged = loss.item()  # BUG: read before wait(); may print this rank's loss, not the sum
    y = x @ x  # some independent work that overlaps the all_reduce
    work.wait()
dist.destroy_process_group()
