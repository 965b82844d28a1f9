"""DDP traced computes what DDP computes untraced, bit for bit, in the modes where DDP's
Reducer scales gradients in ways a comm hook cannot see (capture/ddp.py): each case trains the
same model on the same data untraced (recorder unset: DDP's own C++ all-reduce) and traced
(commtrace's hook: C++ where built, else C, handing the Python hook what only it can do).

- "plain", "static_graph", "find_unused" (a layer used every other step), "no_sync"
  (accumulation over 2 steps), "broadcast_buffers_off";
- gradient_as_bucket_view: DDP multiplies a gradient that is not yet a view of its bucket by
  1/n as it copies it in (every step under zero_grad's default set_to_none) and divides one
  that is, in place: "bview" (default zero_grad), "bview_keep" (set_to_none=False),
  "bview_nosync", "bview_nosync_keep", "bview_mixed" (set_to_none=False, then the first
  layer's weight's .grad set to None, not its bias's: both kinds in one bucket), "bview_static";
- join with uneven inputs (rank r: 3 + 2 r steps): "join_static"
  (divide_by_initial_world_size=True), "join_dynamic" (False: DDP divides by the ranks not
  yet joined), "join_dynamic_late" (one even step first: the hook registered before the join),
  "join_dynamic_bview" (the count and gradient_as_bucket_view together);
- "double": "plain" with a float64 model (the C++ hook's mul_ by a 0-dim tensor of the
  bucket's dtype, as for float32 buckets: _ddp_hook.cpp ScaleCache).

Prints one JSON line per rank (NUMERICS {...}): per case whether the traced parameters equal the
untraced ones, which hook ran and how the Python hook scaled its buckets (all multiplied,
all divided, per gradient: ddp.SCALED), and how many gradient elements the traced models' DDP
all-reduces should hold in all (every synced step's buckets; a joined rank all-reduces zeros in
step with the others)."""

import gc
import json

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from commtrace.capture import ddp as D
from commtrace.capture import recorder as R

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rec = R.get_recorder()
assert rec is not None, "run under commtrace run"
STEPS = 6


class Net(nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 128), nn.Linear(128, 128), nn.Linear(128, 10)
        if unused:
            self.unused = nn.Linear(128, 128)

    def forward(self, x, use=False):
        h = torch.relu(self.b(torch.relu(self.a(x))))
        return self.c(self.unused(h) if use else h)


def build(kw):
    kw = dict(kw)
    dtype = kw.pop("_dtype", torch.float32)
    torch.manual_seed(0)
    m = DDP(Net(kw.get("find_unused_parameters", False)).to(dtype), bucket_cap_mb=0.05, **kw)
    return m, torch.optim.SGD(m.parameters(), lr=0.3)


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def train(m, opt, accum=1, use_every=0, keep=False, mixed=False, join=None, warm=False):
    """Returns the number of synced steps (steps whose buckets DDP all-reduced)."""
    gen = torch.Generator().manual_seed(100 + rank)
    dtype = next(m.parameters()).dtype

    def step(i, sync=True):
        x = (torch.randn(8, 16, generator=gen) * 3).to(dtype)
        y = torch.randint(0, 10, (8,), generator=gen)
        use = bool(use_every) and i % use_every == 0
        if not sync:
            with m.no_sync():
                nn.functional.cross_entropy(m(x, use), y).backward()
            return
        nn.functional.cross_entropy(m(x, use), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=not keep)
        if mixed:
            m.module.a.weight.grad = None   # its bias stays a view of the same bucket

    if join is None:
        for i in range(STEPS):
            step(i, accum == 1 or i % accum == accum - 1)
        return STEPS // accum
    if warm:
        step(0)
    with m.join(divide_by_initial_world_size=join):
        for i in range(3 + 2 * rank):
            step(i)
    return 3 + 2 * (world - 1) + warm


BV = {"gradient_as_bucket_view": True}
CASES = {
    "plain": ({}, {}),
    "static_graph": ({"static_graph": True}, {}),
    "find_unused": ({"find_unused_parameters": True}, {"use_every": 2}),
    "no_sync": ({}, {"accum": 2}),
    "broadcast_buffers_off": ({"broadcast_buffers": False}, {}),
    "bview": (BV, {}),
    "bview_keep": (BV, {"keep": True}),
    "bview_nosync": (BV, {"accum": 2}),
    "bview_nosync_keep": (BV, {"accum": 2, "keep": True}),
    "bview_mixed": (BV, {"keep": True, "mixed": True}),
    "bview_static": ({**BV, "static_graph": True}, {}),
    "join_static": ({}, {"join": True}),
    "join_dynamic": ({}, {"join": False}),
    "join_dynamic_late": ({}, {"join": False, "warm": True}),
    "join_dynamic_bview": (BV, {"join": False, "keep": True}),
    "double": ({"_dtype": torch.float64}, {}),
}
out = {"rank": rank, "world": world, "equal": {}, "hook_kind": {}, "elements": 0, "scaled": {}}
for name, (kw, tkw) in CASES.items():
    R._set_recorder(None)
    ref = build(kw)
    train(*ref, **tkw)
    R._set_recorder(rec)
    tr = build(kw)
    before = list(D.SCALED)
    synced = train(*tr, **tkw)
    out["scaled"][name] = [a - b for a, b in zip(D.SCALED, before)]
    out["equal"][name] = bool(torch.equal(flat(tr[0]), flat(ref[0])))
    out["hook_kind"][name] = tr[0].__dict__.get("_commtrace_hook_kind")
    out["elements"] += synced * int(flat(tr[0]).numel())
print("NUMERICS " + json.dumps(out), flush=True)
# Free DDP before the group goes (docs/faq.md: torch 2.13 gloo can abort at interpreter exit
# while a DDP model, in reference cycles, still holds the group).
del ref, tr
gc.collect()
dist.barrier()
dist.destroy_process_group()
