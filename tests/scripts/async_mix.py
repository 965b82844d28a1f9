"""Async ops of the shapes the C async path records (issue 20), for the test that the C and
the Python paths write the same rows: every tensor collective with async_op=True and wait(),
several in flight waited out of order, isend / irecv, a host read before wait (a hazard row), Works dropped
unwaited, DDP's gradient all-reduce through commtrace's comm hook, and optimizer steps (step
marks) with host reads after waited point-to-point ops, as in samples/pipeline.py."""

import gc
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(16)
for i in range(4):
    dist.all_reduce(t, async_op=True).wait()
    dist.broadcast(t, src=i % 2, async_op=True).wait()
    dist.all_gather_into_tensor(torch.empty(32), t, async_op=True).wait()
    dist.reduce_scatter_tensor(torch.empty(8), t, async_op=True).wait()
    dist.all_to_all_single(torch.empty(16), t, async_op=True).wait()
    dist.reduce(t, dst=i % 2, async_op=True).wait()
# several in flight, waited in reverse order
ts = [torch.full((8,), float(k)) for k in range(6)]
ws = [dist.all_reduce(x, async_op=True) for x in ts]
for w in reversed(ws):
    w.wait()
# a host read of a pending tensor (use before wait: a hazard row), then the wait
x = torch.ones(4)
w = dist.all_reduce(x, async_op=True)
x.tolist()
w.wait()
# not waited: the Works are dropped at once (written when complete)
for _ in range(3):
    dist.all_reduce(torch.ones(3), async_op=True)
# point-to-point (gloo: Works without a future, ended only by wait()), then several in
# flight waited in reverse order
peer = 1 - rank
for i in range(3):
    if rank == 0:
        dist.isend(torch.full((5,), float(i)), dst=peer).wait()
        dist.irecv(torch.empty(5), src=peer).wait()
    else:
        dist.irecv(torch.empty(5), src=peer).wait()
        dist.isend(torch.full((5,), float(i)), dst=peer).wait()
ws = [dist.isend(torch.ones(7), dst=peer) for _ in range(3)]
ws += [dist.irecv(torch.empty(7), src=peer) for _ in range(3)]
for w in reversed(ws):
    w.wait()
# DDP's gradient all-reduce (commtrace's comm hook: api ddp_comm_hook, detail names the bucket)
torch.manual_seed(0)
m = DDP(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)))
for step in range(3):
    m(torch.ones(4, 8)).sum().backward()
# the pipeline sample's per-step Python work (issue 20), in C with the C module: the optimizer
# step marker (the first optimizer's steps only), and host reads while hazard detection is
# active with every pending op waited (torch's method at once), or with one not waited
# (the Python reader checks: disjoint memory, no row; the pending tensor itself, a row)
# (DDP's ops, complete but never waited, are left to the writer: a read then has an op to
# check; waited for here so that the count of reads made in C below does not depend on it)
from commtrace.capture import recorder as R  # noqa: E402

rec = R.get_recorder()
deadline = time.monotonic() + 60
while any(not p.waited for p in list(rec._pending.values())) and time.monotonic() < deadline:
    time.sleep(0.01)
pm = nn.Linear(8, 2)
opt = torch.optim.SGD(pm.parameters(), lr=0.01)
other = torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.1)
for step in range(3):
    opt.zero_grad()
    loss = pm(torch.ones(4, 8)).sum()
    loss.backward()
    g = torch.full((6,), float(step))
    if rank == 0:
        dist.isend(g, dst=peer).wait()
    else:
        dist.irecv(g, src=peer).wait()
    loss.item()
    g.tolist()
    repr(g)
    f"{loss:.3f}"
    g.cpu()
    g.numpy()
    y = torch.ones(4)
    w = dist.all_reduce(y, async_op=True)
    loss.item()        # disjoint from the pending y: checked, no row
    y.tolist()         # y itself: a hazard row
    w.wait()
    opt.step()
    other.step()
# Free DDP before the group goes (docs/faq.md: torch 2.13 gloo can abort at interpreter exit
# while a DDP model, in reference cycles, still holds the group).
del m
gc.collect()
dist.barrier()
from commtrace.capture import wrappers as W  # noqa: E402

c = W._cfast
n = c.async_counts()[1] if c is not None and hasattr(c, "async_counts") else 0
print(f"rank{rank} async ops recorded in C: {n}", flush=True)
pc = c.pipe_counts() if c is not None and hasattr(c, "pipe_counts") else {}
print(f"rank{rank} marks in C: {pc.get('marks', 0)} in Python: {pc.get('marks_python', 0)} "
      f"reads in C: {pc.get('reads', 0)}", flush=True)
dist.destroy_process_group()
