"""Bad overlap: the same training as good_overlap.py, but gradients are all-reduced by hand
after backward(), each one issued asynchronously and waited at once: nothing overlaps, all the
communication is exposed.

    commtrace run -o traces/bad -- torchrun --nproc-per-node 2 samples/findings/bad_overlap.py
    commtrace diff traces/good traces/bad
"""

import torch
import torch.distributed as dist
import torch.nn as nn

STEPS, BATCH, HIDDEN, LAYERS = 40, 64, 256, 4


def model():
    torch.manual_seed(0)
    layers = [nn.Linear(128, HIDDEN), nn.ReLU()]
    for _ in range(LAYERS):
        layers += [nn.Linear(HIDDEN, HIDDEN), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(HIDDEN, 10))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
net = model()
for p in net.parameters():
    dist.broadcast(p.data, src=0)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(rank)
for step in range(STEPS):
    x = torch.randn(BATCH, 128, generator=gen)
    y = torch.randint(0, 10, (BATCH,), generator=gen)
    loss = nn.functional.cross_entropy(net(x), y)
    opt.zero_grad()
    loss.backward()  # all the compute is done before any communication starts
    for p in net.parameters():
        work = dist.all_reduce(p.grad, async_op=True)
        work.wait()  # waited eagerly, one gradient at a time
        p.grad /= world
    opt.step()
dist.destroy_process_group()
