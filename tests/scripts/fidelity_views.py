"""Async results waited through a view, a slice, a chunk and a DTensor local shard, a Python
process group and a registered one: prints one line of results per rank (the test compares it
with and without commtrace) and, with --counts FILE, the ops issued, counted by this script."""

import argparse
import gc
import json
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed.tensor import DTensor, Partial, Replicate, init_device_mesh

ap = argparse.ArgumentParser()
ap.add_argument("--counts", default="")
args = ap.parse_args()


def done_work(result):
    f = torch.futures.Future()
    f.set_result(result)
    return _create_work_from_future(f)


class LocalPG(dist.ProcessGroup):
    """A one-rank group implemented in Python (as PyTorch's test_c10d_pypg.py builds them)."""

    def __init__(self):
        super().__init__(0, 1)

    def allreduce(self, tensors, opts):
        return done_work(tensors)

    def getBackendName(self):
        return "local-py"


dist.init_process_group("gloo")
r = dist.get_rank()
W = dist.group.WORLD
x = torch.arange(4, dtype=torch.float32) + r
out = []
out.append(funcol.all_reduce(x, "sum", W).view(2, 2) + 1)           # a view
out.append(funcol.all_reduce(x, "sum", W)[1:3] * 2)                  # a slice
out.append(funcol.all_gather_tensor(x, 0, W).chunk(2)[1] + 0)        # a chunk of the output
mesh = init_device_mesh("cpu", (2,))
dt = DTensor.from_local(x * 10, mesh, [Partial()])
rep = dt.redistribute(mesh, [Replicate()], async_op=True)            # funcol.all_reduce
out.append(rep.to_local().view(-1)[:3] + 1)                          # the local shard, viewed
a, b = LocalPG(), LocalPG()                                          # two unregistered Python groups
y = torch.ones(3)
for _ in range(3):
    dist.all_reduce(y, group=a)
for _ in range(2):
    dist.all_reduce(y, group=b)
out.append(y.clone())
# one write(2) per line: print() writes its parts separately and the two ranks share the pipe
# (seen interleaved: "RESULTRESULT 0  1[[...")
os.write(1, f"RESULT {r} {json.dumps([t.tolist() for t in out])}\n".encode())
if args.counts:
    # Issued on this rank: 4 funcol calls on the world group (3 + the DTensor redistribute),
    # 3 and 2 all_reduce on the two Python groups.
    with open(f"{args.counts}.{r}", "w") as f:
        json.dump({"world": {"all_reduce": 3, "all_gather": 1}, "py": [3, 2]}, f)
# Nothing may hold a group past destroy_process_group(): a gloo group freed at interpreter
# exit can end the process with "terminate called without an active exception".
del out, mesh, dt, rep, a, b
gc.collect()
dist.destroy_process_group()
