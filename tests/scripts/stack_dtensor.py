"""DTensor on a 1-D CPU DeviceMesh (2 ranks): distribute, redistribute both ways, full_tensor."""

import argparse
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import (DTensor, Partial, Replicate, Shard, distribute_tensor,
                                      init_device_mesh)
from torch.profiler import ProfilerActivity, profile

from stack_common import finish, shutdown

ap = argparse.ArgumentParser()
ap.add_argument("--counts", default="")
args = ap.parse_args()
dist.init_process_group("gloo")
r = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))
torch.manual_seed(0)
x = torch.randn(8, 6)
t0 = time.time_ns()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    d = distribute_tensor(x, mesh, [Shard(0)])              # scatter from rank 0
    rep = d.redistribute(mesh, [Replicate()])               # Shard -> Replicate: all_gather
    back = rep.redistribute(mesh, [Shard(0)])               # Replicate -> Shard: local chunk
    s1 = d.redistribute(mesh, [Shard(1)])                   # Shard(0) -> Shard(1)
    p = DTensor.from_local(torch.ones(8, 6) * (r + 1), mesh, [Partial()])
    pr = p.redistribute(mesh, [Replicate()])                # Partial -> Replicate: all_reduce
    ps = p.redistribute(mesh, [Shard(0)])                   # Partial -> Shard: reduce_scatter
    full = ps.full_tensor()                                 # all_gather
    y = (rep.to_local() * 2 + back.to_local().sum()).clone()
t1 = time.time_ns()
finish(r, [d.to_local(), rep.to_local(), back.to_local(), s1.to_local(), pr.to_local(),
           ps.to_local(), full, y], prof, args.counts, {"window": [t0, t1]})
del d, rep, back, s1, p, pr, ps, full, mesh, prof
shutdown()
