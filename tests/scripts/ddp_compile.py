"""``torch.compile`` of a DDP model (aot_eager), as users write it, 3 steps on 2 ranks (gloo).
Writes OUT_JSON.<rank>: Dynamo's graph and graph-break counts and the trained parameters
(identical with and without commtrace).

Usage: ddp_compile.py OUT_JSON
"""

from __future__ import annotations

import gc
import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    dist.init_process_group("gloo")
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4)))
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step + dist.get_rank()))
        compiled(x).sum().backward()
        opt.step()
        opt.zero_grad()
    res = {"graphs": counters["stats"]["unique_graphs"],
           "breaks": sum(counters["graph_break"].values()),
           "params": [p.detach().flatten().tolist() for p in model.parameters()]}
    with open(f"{sys.argv[1]}.{dist.get_rank()}", "w") as f:
        json.dump(res, f)
    # Free DDP before the group goes (docs/faq.md: torch 2.13 gloo can abort at interpreter exit
    # while a DDP model, in reference cycles, still holds the group).
    del model, compiled, opt
    torch._dynamo.reset()   # its caches hold the compiled module
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
