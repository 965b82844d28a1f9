"""DDP's join mode (uneven inputs) traced computes what it computes untraced, bit for bit.

Each rank has a different number of batches (rank r: 3 + 2 r) and trains inside
``ddp.join(divide_by_initial_world_size=...)``. Without a comm hook DDP's Reducer divides the
gradients by the world size, or, with ``divide_by_initial_world_size=False``, by the number of
ranks not yet joined (the result of the join context's all-reduce in each forward); commtrace's
hook must do the same. Cases, each trained untraced (recorder unset) and traced:

- "static": ``divide_by_initial_world_size=True`` (torch's default);
- "dynamic": ``divide_by_initial_world_size=False``, commtrace's hook registered at the first
  forward, inside the join context;
- "dynamic_late": the same, but one even warm-up step first, outside any join context, so that
  commtrace's hook is registered before DDP knows of the join;
- "dynamic_py": "dynamic" with the C hook told to hand every bucket to the Python dispatcher
  (last: it stays so).

Prints one JSON line per rank: per case whether the traced parameters equal the untraced ones
and which hook ran, and how many steps' buckets the traced models all-reduced (a joined rank
all-reduces zeros in step with the others: every rank as many as the last one to join)."""

import json

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from commtrace.capture import recorder as R
from commtrace.capture import wrappers as W

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rec = R.get_recorder()
assert rec is not None, "run under commtrace run"
cf = W._cfast if W._cfast is not None and hasattr(W._cfast, "ddp_hook") else None


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    ddp = DDP(model, bucket_cap_mb=0.1)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.3)


def step(ddp, opt, gen):
    x = torch.randn(8, 16, generator=gen) * 3
    y = torch.randint(0, 10, (8,), generator=gen)
    loss = nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def train(ddp, opt, static, warm):
    gen = torch.Generator().manual_seed(1000 + rank)
    if warm:
        step(ddp, opt, gen)
    with ddp.join(divide_by_initial_world_size=static):
        for _ in range(3 + 2 * rank):
            step(ddp, opt, gen)


def flat(ddp):
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])


out = {"rank": rank, "world": world, "equal": {}, "hook_kind": {}, "steps": 0}
for name, static, warm, py in (("static", True, False, False), ("dynamic", False, False, False),
                               ("dynamic_late", False, True, False),
                               ("dynamic_py", False, False, True)):
    R._set_recorder(None)
    ref = build()
    train(*ref, static, warm)
    R._set_recorder(rec)
    if py and cf is not None:
        cf.ddp_off()
    tr = build()
    train(*tr, static, warm)
    out["equal"][name] = bool(torch.equal(flat(tr[0]), flat(ref[0])))
    out["hook_kind"][name] = tr[0].__dict__.get("_commtrace_hook_kind")
    out["steps"] += 3 + 2 * (world - 1) + warm   # the last rank's steps: each rank's buckets
    out["n_params"] = int(flat(ref[0]).numel())
print("DDPJOIN " + json.dumps(out), flush=True)
dist.barrier()
dist.destroy_process_group()
