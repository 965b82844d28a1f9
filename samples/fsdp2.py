"""FSDP2 (``fully_shard``) training of a small MLP: parameters are all-gathered before each
layer's forward/backward and gradients reduce-scattered after. A plain torch script.

    torchrun --nproc-per-node 2 samples/fsdp2.py [--steps 6] [--backend gloo|nccl]
"""

import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn as nn

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import fully_shard


def setup(args, rank, world, dev):
    """The sharded model, optimiser and data generator of one rank (after
    init_process_group). benchmarks/steps.py times :func:`train_step` on this state."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(dev.type, (world,))
    torch.manual_seed(0)
    H = args.hidden
    model = nn.Sequential(*[nn.Sequential(nn.Linear(H, H), nn.ReLU()) for _ in range(4)],
                          nn.Linear(H, 10)).to(dev)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    return {"args": args, "dev": dev, "model": model, "opt": opt, "gen": gen}


def train_step(state, step):
    """One training step; returns the loss."""
    args, dev, model, opt, gen = (state[k] for k in ("args", "dev", "model", "opt", "gen"))
    x = torch.randn(32, args.hidden, generator=gen).to(dev)
    y = torch.randint(0, 10, (32,), generator=gen).to(dev)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    return ap.parse_args(argv)


def main():
    args = parse_args()
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    if args.backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    state = setup(args, rank, dist.get_world_size(), dev)
    for step in range(args.steps):
        loss = train_step(state, step)
    if rank == 0:
        print(f"fsdp2: {args.steps} steps, loss {loss.item():.4f}")
    # Free the model and optimiser now, not while the interpreter finalises (see
    # samples/ddp_mlp.py; docs/faq.md: torch 2.13 gloo can abort the process at exit).
    del loss
    state.clear()
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
