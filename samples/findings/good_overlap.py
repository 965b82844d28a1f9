"""Good overlap: DDP all-reduces gradient buckets asynchronously while backward() computes the
remaining gradients, and waits for them only at the end of backward.

    commtrace run -o traces/good -- torchrun --nproc-per-node 2 samples/findings/good_overlap.py
    commtrace diff traces/good traces/bad      # against bad_overlap.py

Compare with bad_overlap.py: same model, same data, the all-reduces waited one by one.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

# 40 steps, not fewer: on a shared CPU host one rank can trail the other by a few ms for
# several steps in a row (scheduling, measured without commtrace too), and 8 steps were short
# enough for such a streak to read as a straggler.
STEPS, BATCH, HIDDEN, LAYERS = 40, 64, 256, 4


def model():
    torch.manual_seed(0)
    layers = [nn.Linear(128, HIDDEN), nn.ReLU()]
    for _ in range(LAYERS):
        layers += [nn.Linear(HIDDEN, HIDDEN), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(HIDDEN, 10))


dist.init_process_group("gloo")
rank = dist.get_rank()
ddp = DDP(model(), bucket_cap_mb=1)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(rank)
for step in range(STEPS):
    x = torch.randn(BATCH, 128, generator=gen)
    y = torch.randint(0, 10, (BATCH,), generator=gen)
    loss = nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()  # bucket all-reduces overlap the rest of backward
    opt.step()
dist.destroy_process_group()
