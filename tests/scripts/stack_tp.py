"""Tensor parallel (parallelize_module, ColwiseParallel + RowwiseParallel) on a small MLP,
2 ranks, 3 training steps (the last 2 counted); --compile runs the TP block under torch.compile(fullgraph=True)."""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)
from torch.profiler import ProfilerActivity, profile

from stack_common import finish, shutdown

ap = argparse.ArgumentParser()
ap.add_argument("--counts", default="")
ap.add_argument("--compile", action="store_true")
args = ap.parse_args()
dist.init_process_group("gloo")
r = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step_model = torch.compile(model, backend="aot_eager", fullgraph=True) if args.compile else model
x = torch.randn(4, 16)
outs = []


def step():
    out = step_model(x)
    out.pow(2).sum().backward()
    opt.step()
    opt.zero_grad()
    outs.append(out.detach())


step()   # the first step (and the compilation) outside the counted window
t0 = time.time_ns()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(2):
        step()
t1 = time.time_ns()
finish(r, outs + [p.detach() for p in model.parameters()], prof, args.counts,
       {"tp_group": mesh.get_group().group_name, "window": [t0, t1]})
del model, step_model, opt, outs, mesh, prof
shutdown()
