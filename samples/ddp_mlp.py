"""DDP training of a small MLP on random data: a plain torch script (no commtrace import).

    torchrun --nproc-per-node 2 samples/ddp_mlp.py [--steps 20] [--backend gloo|nccl]
    commtrace run -- torchrun --nproc-per-node 2 samples/ddp_mlp.py

With ``bucket_cap_mb=1`` DDP splits the ~1.6 MB of gradients into buckets, and rebuilds them
after the first step (so the number of gradient all-reduces is not buckets x steps). The last
rank sleeps ``--straggler-ms`` (40 ms) before each step's forward, so it arrives last at every
step's gradient all-reduces while the others wait for it: a planted straggler, which
`commtrace report` finds (the demo's finding; ``--straggler-ms 0`` gives a clean run).
"""

import argparse
import gc
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(args, rank, world, device):
    """The model, its DDP wrapper and optimiser, and the data generator of one rank (after
    init_process_group). benchmarks/steps.py times :func:`train_step` on this state."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(128, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, 10),
    ).to(device)
    ddp = DDP(model, bucket_cap_mb=1, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    return {"args": args, "rank": rank, "world": world, "device": device, "ddp": ddp,
            "opt": opt, "gen": gen}


def train_step(state, step):
    """One training step; returns the (detached) loss."""
    args, device, ddp, opt, gen = (state[k] for k in ("args", "device", "ddp", "opt", "gen"))
    x = torch.randn(args.batch, 128, generator=gen).to(device)
    y = torch.randint(0, 10, (args.batch,), generator=gen).to(device)
    if state["rank"] == state["world"] - 1 and args.straggler_ms > 0:
        time.sleep(args.straggler_ms / 1000)
    loss = nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--straggler-ms", type=float, default=40.0,
                    help="extra sleep of the last rank per step (the planted straggler)")
    return ap.parse_args(argv)


def main():
    args = parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    state = setup(args, rank, world, device)
    loss_val = None
    for step in range(args.steps):
        loss_val = train_step(state, step)
    # Average the final loss across ranks (one more all_reduce, outside DDP).
    dist.all_reduce(loss_val)
    if rank == 0:
        print(f"ddp_mlp: {args.steps} steps on {world} ranks, mean loss {loss_val.item() / world:.4f}")
    # Free DDP and the optimiser now (DDP is in reference cycles: only the collector frees it),
    # not while the interpreter finalises: on torch 2.13 gloo that can abort the process at exit,
    # "terminate called without an active exception" (docs/faq.md, pytorch/pytorch#179291).
    # (No barrier: the all_reduce above already waited for every rank, and an extra collective
    # would be one more op in the demo's trace.)
    state.clear()
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
