"""A loop of --steps training steps on gloo, each: 3 all_reduce (1 KiB, 4 KiB, 16 KiB) and a
broadcast (256 B) from rank 0, then optimizer.step() (commtrace's step marker); a barrier after
the loop. --sleep S between steps (several flushes per run for the retention test)."""

import argparse
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--sleep", type=float, default=0.0)
args = ap.parse_args()
dist.init_process_group("gloo")
p = torch.nn.Parameter(torch.zeros(4))
opt = torch.optim.SGD([p], lr=0.1)
bufs = [torch.ones(256), torch.ones(1024), torch.ones(4096)]
b = torch.zeros(64)
for i in range(args.steps):
    for t in bufs:
        dist.all_reduce(t)
    dist.broadcast(b, src=0)
    p.grad = torch.ones(4)
    opt.step()
    if args.sleep:
        time.sleep(args.sleep)
dist.barrier()
dist.destroy_process_group()
