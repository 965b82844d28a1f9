"""An async all_reduce whose tensor is read with .item() before wait() (use_before_wait)."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1 << 14)
for i in range(3):
    w = dist.all_reduce(t, async_op=True)
    x = t[0].item()  # USE-BEFORE-WAIT
    w.wait()
dist.destroy_process_group()
