"""All-reduce in a loop for --seconds; --kill-rank R SIGKILLs rank R after --kill-after s."""

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--seconds", type=float, default=1.0)
ap.add_argument("--kill-rank", type=int, default=-1)
ap.add_argument("--kill-after", type=float, default=1.0)
args = ap.parse_args()
dist.init_process_group("gloo")
r = dist.get_rank()
t0 = time.time()
t = torch.ones(256)
try:
    while time.time() - t0 < args.seconds:
        if r == args.kill_rank and time.time() - t0 > args.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(t)
        time.sleep(0.005)
    dist.barrier()
finally:
    pass
dist.destroy_process_group()
