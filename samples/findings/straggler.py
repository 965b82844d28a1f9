"""Finding `straggler`: rank 1 does 20 ms of extra work before each of 30 all_reduces, so it
arrives last every time and rank 0 waits for it.

    commtrace run -- torchrun --nproc-per-node 2 samples/findings/straggler.py

STRAGGLER_MS sets the extra work (0: none; the same loop without the straggler, to compare the
report's what-if figure with the run it projects).
"""

import os
import time

import torch
import torch.distributed as dist

STEPS, EXTRA_S = 30, float(os.environ.get("STRAGGLER_MS", "20")) / 1000

dist.init_process_group("gloo")
rank = dist.get_rank()
grad = torch.ones(1 << 14)
for step in range(STEPS):
    if rank == 1 and EXTRA_S > 0:
        time.sleep(EXTRA_S)  # the slow rank: a bigger batch, a slower disk, a hot GPU
    dist.all_reduce(grad)
dist.destroy_process_group()
