"""The C fast path's calls of a 2-rank gloo job, for tests/test_accel_meta.py (issue 20): run
with the tensor / group reads through torch's C++ API (`commtrace accel build`) and without
(COMMTRACE_ACCEL_META=0, or COMMTRACE_PURE_PYTHON=1), the rows must be the same.

Covers float / bfloat16 / integer dtypes, an nn.Parameter, non-contiguous, zero-size and 2-D
tensors, output tensors (byte sizes), tensor lists, point-to-point ops (blocking, async,
batched), async collectives, a subgroup, a call that raises, calls under a torch function
mode, and ops torch issued that commtrace did not record (gap rows: torch's sequence numbers).
Prints one line per rank: "ACCELMETA <rank> <meta on> <tensor reads> <seq reads> <C calls>",
and "ACCELATTACH <rank> <async completions attached in C++>"."""

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from commtrace.capture import registry
from commtrace.capture import wrappers as W

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
peer = 1 - rank


class Passthrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def tensors():
    yield torch.ones(16)
    yield torch.ones(7, dtype=torch.bfloat16)
    yield torch.arange(5, dtype=torch.int64)
    yield torch.ones(3, dtype=torch.int32)
    yield torch.ones(4, 6)
    yield torch.empty(0)
    yield torch.nn.Parameter(torch.ones(9), requires_grad=False)


for rep in range(2):   # first sightings go to the Python path; later calls take the C path
    for t in tensors():
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
    x = torch.ones(6, 4)
    for nc in (x.t(), x[:, 1]):   # non-contiguous
        try:
            dist.all_reduce(nc)
        except Exception:
            pass
    dist.all_reduce(x[1])   # a contiguous view
    try:
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)   # a recorded error
    except RuntimeError:
        pass
    out = torch.empty(8 * world, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, torch.ones(8, dtype=torch.bfloat16))
    dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * world))
    dist.all_to_all_single(torch.empty(2 * world, dtype=torch.int64),
                           torch.arange(2 * world, dtype=torch.int64))
    dist.all_to_all_single(torch.empty(0), torch.empty(0))
    lst = [torch.empty(5, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(lst, torch.ones(5, dtype=torch.int32))
    dist.all_gather([torch.empty(0) for _ in range(world)], torch.empty(0))
    dist.reduce_scatter(torch.empty(3), [torch.ones(3) for _ in range(world)])
    # point to point
    a, b = torch.full((4,), float(rank)), torch.empty(4)
    if rank == 0:
        dist.send(a, peer); dist.recv(b, peer)
    else:
        dist.recv(b, peer); dist.send(a, peer)
    reqs = [dist.isend(torch.ones(3, dtype=torch.bfloat16), peer),
            dist.irecv(torch.empty(3, dtype=torch.bfloat16), peer)]
    for r in reqs:
        r.wait()
    # async collectives with a future, in flight together and waited in reverse (FSDP2's
    # pattern): where the module is built their completion is stamped by its C++ callback
    works = [dist.all_gather_into_tensor(torch.empty(4 * world), torch.ones(4), async_op=True),
             dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world), async_op=True),
             dist.all_reduce(torch.ones(5), async_op=True)]
    for w in reversed(works):
        w.wait()
    del works, w
    ops = [dist.P2POp(dist.isend, torch.ones(2, dtype=torch.int64), peer),
           dist.P2POp(dist.irecv, torch.empty(2, dtype=torch.int64), peer)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    # a subgroup, and a torch function mode (the accessors go through it)
    g = dist.new_group(list(range(world))) if rep == 0 else g
    dist.all_reduce(torch.ones(11, dtype=torch.float64), group=g)
    with Passthrough():
        dist.all_reduce(torch.ones(12))
        dist.all_gather_into_tensor(torch.empty(3 * world), torch.ones(3))
    # ops torch issues that commtrace does not see: gap rows from torch's numbers
    registry.original_of(dist.all_reduce)(torch.ones(2))
    registry.original_of(dist.all_reduce)(torch.ones(2))
    dist.all_reduce(torch.ones(13))

dist.barrier()
cf = W._cfast
meta = cf.meta_counts() if cf is not None and hasattr(cf, "meta_counts") else (0, 0)
print(f"ACCELMETA {rank} {int(W._meta_set)} {meta[0]} {meta[1]} "
      f"{cf.counts()[0] if cf is not None else 0}", flush=True)
att = cf.attach_counts() if cf is not None and hasattr(cf, "attach_counts") else 0
print(f"ACCELATTACH {rank} {att}", flush=True)
dist.destroy_process_group()
