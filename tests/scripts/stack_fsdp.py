"""FSDP2 (fully_shard): --tp adds tensor parallelism on a 2x2 (dp, tp) mesh (4 ranks);
without it, 2 ranks train one step and save a checkpoint by full_tensor() over every parameter
and every optimizer state (the counted window is the save)."""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)
from torch.profiler import ProfilerActivity, profile

from stack_common import finish, shutdown

ap = argparse.ArgumentParser()
ap.add_argument("--tp", action="store_true")
ap.add_argument("--counts", default="")
args = ap.parse_args()
dist.init_process_group("gloo")
r = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 8))
x = torch.randn(4, 16)
extra = {}
if args.tp:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    extra = {"dp": [mesh["dp"].get_group().group_name, mesh["dp"].size()],
             "tp": [mesh["tp"].get_group().group_name, mesh["tp"].size()]}
    x = x + mesh["dp"].get_local_rank()      # each dp replica its own batch
else:
    mesh = init_device_mesh("cpu", (2,))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
opt = torch.optim.Adam(model.parameters(), lr=0.01)


def step():
    model(x).pow(2).sum().backward()
    opt.step()
    opt.zero_grad()


def save():
    """A full checkpoint: every parameter and optimizer state as a full tensor."""
    out = [v.full_tensor() for v in model.state_dict().values()]
    for st in opt.state.values():
        out += [v.full_tensor() for v in st.values() if isinstance(v, DTensor)]
    return out


step()                 # not counted: the first step (lazy init)
t0 = time.time_ns()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    if args.tp:
        step()
        step()
        results = [p.full_tensor().detach() for p in model.parameters()]
    else:
        results = save()
t1 = time.time_ns()
extra["window"] = [t0, t1]
extra["saved"] = len(results)
finish(r, results, prof, args.counts, extra)
del model, opt, results, mesh, prof
shutdown()
