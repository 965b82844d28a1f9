"""A DDP model whose comm hook is built like torch's mixed-precision and optimizer-in-backward
hooks (which need an accelerator): it has DDP's Reducer issue the bucket's all-reduce
(Reducer._run_allreduce_hook, C++), waits, divides by the world size. Writes OUT.rank<r> with
the parameters' sum (to compare traced against untraced) and the hook's call count."""

import gc
import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

calls = [0]


def reducer_hook(ddp_ref, bucket):
    calls[0] += 1
    ddp = ddp_ref()
    fut = ddp.reducer._run_allreduce_hook(bucket)
    fut.wait()
    bucket.buffer().div_(ddp.process_group.size())
    out = torch.futures.Future()
    out.set_result(bucket.buffer())
    return out


def main():
    import weakref

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    m = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)),
            bucket_cap_mb=0.01)
    m.register_comm_hook(weakref.ref(m), reducer_hook)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(4):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 16, generator=g)
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
    total = sum(float(p.detach().double().sum()) for p in m.parameters())
    with open(f"{sys.argv[1]}.rank{rank}", "w") as f:
        json.dump({"calls": calls[0], "sum": total, "params": [p.detach().flatten().tolist() for p in m.parameters()]}, f)
    # Free DDP before the group goes (docs/faq.md: torch 2.13 gloo can abort at interpreter exit
    # while a DDP model, in reference cycles, still holds the group).
    del m, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
