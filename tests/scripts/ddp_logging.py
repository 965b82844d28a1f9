"""DDP as a user writes it, without a comm hook (2 ranks, gloo): a few steps, then what DDP says
about itself: its logging data (without the fields that are timings or addresses), its
comm-hook list and the parameters after training. funcol_all.py runs it in its job; alone, the
script writes them to OUT_JSON.<rank>.

Usage: ddp_logging.py OUT_JSON
"""

from __future__ import annotations

import gc
import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

#: logging-data fields that differ between any two runs (times, rates, addresses, pids).
VOLATILE = ("time", "rate", "avg_", "unused_parameter_size", "master_addr", "master_port")


def train_and_describe() -> dict:
    """3 steps of a small DDP model (the group exists), then DDP's description of itself."""
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step + dist.get_rank()))
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    data = model._get_ddp_logging_data()
    kept = {k: v for k, v in data.items() if not any(p in k for p in VOLATILE)}
    out = {"logging": kept, "comm_hook": data.get("comm_hook"),
           "comm_hooks": len(model._comm_hooks),
           "params": [p.detach().flatten().tolist() for p in model.parameters()]}
    # Free DDP now, not at interpreter exit, and let every rank's gloo threads finish first: a
    # gloo group still alive while Python finalizes can abort the process (torch 2.13, about 1
    # plain run in 4, without commtrace: a gloo worker thread frees a finished all_reduce whose
    # saved thread-local state holds a Python object, cannot take the GIL of a finalizing
    # interpreter, and std::terminate follows; tests/conftest.py's run_plain).
    del model, opt
    gc.collect()
    dist.barrier()
    return out


def main() -> int:
    dist.init_process_group("gloo")
    out = train_and_describe()
    with open(f"{sys.argv[1]}.{dist.get_rank()}", "w") as f:
        json.dump(out, f, sort_keys=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
