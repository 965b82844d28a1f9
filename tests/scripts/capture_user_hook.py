"""Two DDP models with a user comm hook: model "before" registers it before the first forward,
model "after" after a warm-up forward (when commtrace's own hook is already in place). The hook
really all-reduces, then returns zeros, so parameters must stay unchanged if DDP used the user's
result. Writes OUT_JSON.rank<r> with the hook call counts and that check."""

import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

calls = {"before": 0, "after": 0}


def user_hook(state, bucket):
    calls[state] += 1
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: torch.zeros_like(f.value()[0]))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    models = {k: DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
              for k in ("before", "after")}
    models["before"].register_comm_hook("before", user_hook)
    x = torch.randn(8, 16)
    models["after"](x)  # warm-up forward, no backward
    models["after"].register_comm_hook("after", user_hook)
    init = {k: [p.detach().clone() for p in m.parameters()] for k, m in models.items()}
    for k, m in models.items():
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
    unchanged = all(torch.equal(a, b) for k, m in models.items()
                    for a, b in zip(init[k], m.parameters()))
    with open(f"{sys.argv[1]}.rank{rank}", "w") as f:
        json.dump({"calls": calls, "unchanged": unchanged}, f)
    # Free DDP before the group goes (docs/faq.md: torch 2.13 gloo can abort at interpreter exit
    # while a DDP model, in reference cycles, still holds the group).
    del models, m, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
