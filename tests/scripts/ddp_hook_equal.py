"""DDP traced through commtrace's comm hook computes the gradients of untraced DDP, bit for bit
(issue 20): the same model and data trained four times in one job, under `commtrace run`:

- "untraced": tracing off (commtrace's recorder unset): DDP's own C++ all-reduce, which divides
  each gradient by the world size as it copies it into the bucket;
- "traced_c": tracing on: where commtrace's module is built for this torch (_ddp_hook.cpp,
  `commtrace accel build`), no hook: DDP's Reducer issues its all-reduces on commtrace's
  recording group (unless COMMTRACE_DDP_GROUP=0), else commtrace's hook, in C++ (its bucket
  scaling and all-reduce in C++ too, hook interface v2, unless COMMTRACE_DDP_V2=0), else in C
  where built (_fastpath.ddp_hook);
- "traced_py": tracing on, the C path told to hand every bucket to Python (the dispatcher, or
  the recording group's Python fallback);
- "torch_hook": tracing off, torch's ``allreduce_hook`` registered by hand (``div_`` by the world
  size): the planted difference, which at 3 ranks rounds differently from DDP's own.

With DDPEQ_BUCKET_VIEW=1 the models are built with gradient_as_bucket_view=True.

Prints one JSON line per rank: whether each model's parameters equal the untraced model's after
the last step, the time window of each traced model's steps, and the C hook's counts."""

import gc
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from commtrace.capture import accel
from commtrace.capture import recorder as R
from commtrace.capture import wrappers as W

STEPS = 4
# DDPEQ_BUCKET_VIEW=1: gradients as views of their buckets (under zero_grad's set_to_none DDP
# still copies and multiplies them; tests/test_ddp_numerics.py covers the in-place div_ cases)
BUCKET_VIEW = os.environ.get("DDPEQ_BUCKET_VIEW") == "1"
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rec = R.get_recorder()
assert rec is not None, "run under commtrace run"
cf = W._cfast if W._cfast is not None and hasattr(W._cfast, "ddp_hook") else None


def build():
    torch.manual_seed(0)
    # ~550k parameters: three gradient buckets of at most 1 MB
    model = nn.Sequential(nn.Linear(32, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    ddp = DDP(model, bucket_cap_mb=1, gradient_as_bucket_view=BUCKET_VIEW)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.5)


def train(ddp, opt):
    gen = torch.Generator().manual_seed(1000 + rank)
    t0 = time.time_ns()
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=gen) * 3
        y = torch.randint(0, 10, (16,), generator=gen)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [t0, time.time_ns()]


def flat(ddp):
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])


out = {"rank": rank, "world": world, "thread": __import__("threading").get_ident(),
       "c_hook": cf is not None}
R._set_recorder(None)
ref = build()
train(*ref)
R._set_recorder(rec)
c = build()
out["window_c"] = train(*c)
out["counts_c"] = list(cf.ddp_counts()) if cf is not None else None
out["hook_kind"] = c[0].__dict__.get("_commtrace_hook_kind")
out["hook_v2"] = c[0].__dict__.get("_commtrace_hook_v2")
_mod = accel.load()
out["cxx_counts"] = list(_mod.counts()) if _mod is not None and hasattr(_mod, "counts") else None
_gc = getattr(_mod, "group_counts", None) if _mod is not None else None
_dc = getattr(cf, "ddp_direct_counts", None) if cf is not None else None
out["direct_counts"] = list(_dc()) if _dc is not None else None
out["group_dr"] = (_mod.group_dr_count() if _mod is not None and hasattr(_mod, "group_dr_count")
                   else None)
out["group_direct"] = (_mod.group_direct_count()
                       if _mod is not None and hasattr(_mod, "group_direct_count") else None)
out["hook_dr"] = (_mod.hook_dr_count() if _mod is not None and hasattr(_mod, "hook_dr_count")
                 else None)
out["route_counts"] = list(cf.ddp_direct_route_counts()) if cf is not None else None
py = build()
if cf is not None:
    cf.ddp_off()   # every bucket to the Python dispatcher (ddp._dispatch)
out["window_py"] = train(*py)
out["counts_py"] = list(cf.ddp_counts()) if cf is not None else None
out["group_counts"] = list(_gc()) if _gc is not None else None
R._set_recorder(None)
th = build()
th[0].register_comm_hook(th[0].process_group, default_hooks.allreduce_hook)
train(*th)
R._set_recorder(rec)
want = flat(ref[0])
out["equal"] = {name: bool(torch.equal(flat(m[0]), want))
                for name, m in (("traced_c", c), ("traced_py", py), ("torch_hook", th))}
out["n_params"] = int(want.numel())
print("DDPEQ " + json.dumps(out), flush=True)
# Free DDP before the group goes (docs/faq.md: torch 2.13 gloo can abort at interpreter exit
# while a DDP model, in reference cycles, still holds the group).
del ref, c, py, th
gc.collect()
dist.barrier()
dist.destroy_process_group()
