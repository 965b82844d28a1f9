"""Collectives commtrace does not see, planted between recorded ones (issue 13, item 2): torch's
own unwrapped functions (commtrace's registry gives them back) and the ProcessGroup's C++ entry
points (``pg.allreduce([t])``). Prints one result line per rank (compared with and without
commtrace) and, with --plan FILE, the planted gaps in torch's numbering, as this script counts
them (its own independent count, not read from torch)."""

import argparse
import gc
import json
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

ap = argparse.ArgumentParser()
ap.add_argument("--plan", default="")
args = ap.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
world = dist.group.WORLD


def unwrapped(fn):
    """torch's own function under commtrace's wrapper (itself without commtrace)."""
    return getattr(fn, "__commtrace_original__", fn)


n = 0          # collectives issued on WORLD so far: torch numbers them 1, 2, ...
plan = []      # (group, first, last, what follows) of each planted run of unrecorded ones


def plant(k, group=None, what=""):
    """k collectives nobody records: torch's unwrapped all_reduce, then the C++ entry point."""
    global n
    first = n + 1
    for i in range(k):
        y = torch.full((4,), float(rank + i))
        if i % 2 == 0:
            unwrapped(dist.all_reduce)(y, group=group)
        else:
            (group or world).allreduce([y]).wait()
    n += k
    plan.append(["0" if group is None else "sub", first, n, what])


x = torch.arange(4, dtype=torch.float32) + rank
dist.all_reduce(x)                          # recorded (C fast path): 1
n += 1
plant(2, what="broadcast")                  # 2, 3
dist.broadcast(x, 0)                        # recorded: 4
n += 1
w = dist.all_reduce(x, async_op=True)       # recorded async: 5
w.wait()
n += 1
plant(3, what="p2p")                        # 6, 7, 8
if rank == 0:                               # gloo numbers point-to-point ops too: 9
    dist.send(x, 1)
else:
    dist.recv(x, 0)
n += 1
y = funcol.all_reduce(x, "sum", world)      # recorded (functional collective): 10
x = y.wait() if hasattr(y, "wait") else y
x = x * 1
n += 1
objs = [None, None]
dist.all_gather_object(objs, {"r": rank})   # recorded, two collectives inside: 11, 12
n += 2
plant(1, what="end")                        # 13: found when the group is destroyed
sub = dist.new_group([0, 1])
z = x.clone()
dist.all_reduce(z, group=sub)               # recorded on sub: 1
m = n
n = 1
plant(1, group=sub, what="end")             # sub 2
n = m
os.write(1, f"RESULT {rank} {x.tolist()} {z.tolist()} {objs}\n".encode())
if args.plan and rank == 0:
    with open(args.plan, "w") as f:
        json.dump(plan, f)
# Nothing may hold a group past destroy_process_group(): a gloo group freed at interpreter exit
# can end the process with "terminate called without an active exception" (3 of 8 plain runs
# of this script did, with no commtrace anywhere, while `sub` and `world` were still held here).
del sub, world
gc.collect()
dist.destroy_process_group()
