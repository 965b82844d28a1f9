"""Two multi-process tests, run by pytest under `commtrace run` (tests/test_runs_e2e.py): each
spawns its own 2-rank gloo job (a fresh store, as PyTorch's own multi-process tests do), so the
run holds two jobs whose default groups both start at seq 0."""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank, store_path, n, count):
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    t = torch.ones(count)
    for _ in range(n):
        dist.all_reduce(t)
    dist.destroy_process_group()


def _job(n, count):
    d = tempfile.mkdtemp()
    mp.spawn(_worker, args=(os.path.join(d, "store"), n, count), nprocs=2, join=True)


def test_job_a():
    _job(3, 16)


def test_job_b():
    _job(7, 32)
