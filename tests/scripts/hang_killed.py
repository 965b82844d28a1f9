"""Rank 1 is killed with SIGKILL after 20 all_reduces (OOM killer, node failure): its parts
written before stay readable. Rank 0 goes on to its 21st all_reduce, which never completes.

    commtrace run -o OUT --flush-interval 0.2 -- torchrun --nproc-per-node 2 tests/scripts/hang_killed.py
"""

import os
import signal
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(256)
for i in range(20):
    dist.all_reduce(t)
time.sleep(1.0)  # a few flushes: the 20 ops are on disk
if rank == 1:
    print("rank 1 killing itself", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
try:
    dist.all_reduce(t)  # the peer is gone: gloo fails (or torchrun ends this rank)
except Exception as e:  # noqa: BLE001
    print(f"rank 0 all_reduce failed: {type(e).__name__}", flush=True)
dist.destroy_process_group()
