"""Finding `late_sender`: a two-stage pipeline where stage 0 (rank 0) computes 20 ms before
each send, while stage 1 (rank 1) posts its receive at once and blocks waiting for the data.

    commtrace run -- torchrun --nproc-per-node 2 samples/findings/late_sender.py
"""

import time

import torch
import torch.distributed as dist

MICROBATCHES, STAGE0_S = 20, 0.020

dist.init_process_group("gloo")
rank = dist.get_rank()
act = torch.zeros(1 << 14)
for mb in range(MICROBATCHES):
    if rank == 0:
        time.sleep(STAGE0_S)  # stage 0's forward pass
        dist.send(act + mb, dst=1)
    else:
        dist.recv(act, src=0)  # waits for rank 0: the late sender
dist.destroy_process_group()
