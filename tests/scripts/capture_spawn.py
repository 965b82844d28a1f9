"""mp.spawn two ranks that each create a gloo group (init_method tcp) and all-reduce 3 times."""

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    for _ in range(3):
        dist.all_reduce(torch.ones(5))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]),), nprocs=2)
