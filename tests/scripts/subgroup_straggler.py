"""A straggler behind a subgroup (4 gloo ranks): groups {0, 1} and {2, 3} all-reduce first, then
the world all-gathers and all-reduces. Rank 3 works SLEEP_MS longer in every step: rank 2 waits
for it in their pair, so at the world's collectives ranks 2 and 3 arrive late together and
which of them is last is chance. Steps come from optimizer.step()."""

import os
import time

import torch
import torch.distributed as dist

SLEEP_MS = float(os.environ.get("SLEEP_MS", "40"))
STEPS = int(os.environ.get("STEPS", "8"))

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
pair = pairs[rank // 2]
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(STEPS):
    model(torch.ones(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    if rank == 3:
        time.sleep(SLEEP_MS / 1e3)
    x = torch.full((2048,), float(rank))
    dist.all_reduce(x, group=pair)
    out = torch.empty(2048 * world)
    dist.all_gather_into_tensor(out, x)
    dist.all_reduce(x)
dist.destroy_process_group()
