"""A two-stage pipeline with send/recv: rank 0 runs the first half of an MLP on micro-batches
and sends activations to rank 1, which runs the second half, and sends gradients back.
A plain torch script (no commtrace import).

    torchrun --nproc-per-node 2 samples/pipeline.py [--steps 6] [--micro 4] [--backend gloo|nccl]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn


def setup(args, rank, world, dev):
    """This rank's stage and optimiser (after init_process_group). benchmarks/steps.py times
    :func:`train_step` on this state."""
    assert world == 2, "pipeline.py runs on exactly 2 ranks"
    torch.manual_seed(rank)
    H = args.hidden
    stage = (nn.Sequential(nn.Linear(64, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU()) if rank == 0
             else nn.Sequential(nn.Linear(H, H), nn.ReLU(), nn.Linear(H, 10))).to(dev)
    opt = torch.optim.SGD(stage.parameters(), lr=0.01)
    return {"args": args, "rank": rank, "dev": dev, "stage": stage, "opt": opt}


def train_step(state, step):
    """One step: the micro-batches forward through both stages and back. Returns rank 1's
    mean loss over the micro-batches (None on rank 0)."""
    args, rank, dev, stage, opt = (state[k] for k in ("args", "rank", "dev", "stage", "opt"))
    H = args.hidden
    opt.zero_grad()
    loss_mean = None
    if rank == 0:
        outs = []
        for _ in range(args.micro):
            x = torch.randn(args.batch, 64, device=dev)
            y = stage(x)
            dist.send(y.detach(), dst=1)
            outs.append(y)
        for y in outs:
            g = torch.empty_like(y)
            dist.recv(g, src=1)
            y.backward(g)
    else:
        acts, loss_sum = [], 0.0
        for _ in range(args.micro):
            a = torch.empty(args.batch, H, device=dev)
            dist.recv(a, src=0)
            a.requires_grad_()
            loss = nn.functional.cross_entropy(
                stage(a), torch.randint(0, 10, (args.batch,), device=dev))
            loss.backward()
            loss_sum += loss.item()
            acts.append(a)
        reqs = [dist.isend(a.grad, dst=0) for a in acts]
        for r in reqs:
            r.wait()
        loss_mean = loss_sum / args.micro
    opt.step()
    return loss_mean


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per step")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    return ap.parse_args(argv)


def main():
    args = parse_args()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    state = setup(args, rank, world, dev)
    for step in range(args.steps):
        loss_mean = train_step(state, step)
    if rank == 1:
        print(f"pipeline: {args.steps} steps x {args.micro} micro-batches, last loss "
              f"{loss_mean:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
