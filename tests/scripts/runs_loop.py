"""A 2-rank loop that runs until interrupted (Ctrl-C test): all_reduce, then a short sleep."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(64)
print("started", flush=True)
for _ in range(100_000):
    dist.all_reduce(t)
    time.sleep(0.02)
dist.destroy_process_group()
