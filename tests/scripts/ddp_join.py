"""DDP's join mode (uneven inputs) traced: rank 0 trains STEPS steps, rank 1 fewer; after its
last step rank 1's DDP shadows rank 0's gradient all-reduces (``_match_all_reduce_for_bwd_pass``
runs the comm hook through ``Reducer._run_comm_hook`` and waits for its future in Python, so
DDP never reads the result through the hook's ``parseHookResult``). Prints one JSON line per
rank: the steps it ran, the hook kind commtrace registered and its training thread."""

import gc
import json
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 6
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 10))
ddp = DDP(model, bucket_cap_mb=1)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(rank)
steps = STEPS if rank == 0 else 2
with ddp.join():
    for _ in range(steps):
        x = torch.randn(8, 32, generator=gen)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
print("DDPJOIN " + json.dumps({"rank": rank, "steps": steps, "thread": threading.get_ident(),
                               "hook_kind": ddp.__dict__.get("_commtrace_hook_kind")}),
      flush=True)
# Free DDP before the group goes (docs/faq.md: torch 2.13 gloo can abort at interpreter exit
# while a DDP model, in reference cycles, still holds the group).
del ddp, model, opt, loss
gc.collect()
dist.barrier()
dist.destroy_process_group()
