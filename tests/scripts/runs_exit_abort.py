"""Rank 1 aborts (SIGABRT) after commtrace's exit flush, as torch 2.13's gloo abort at
interpreter exit does ("terminate called without an active exception", docs/faq.md): an atexit
handler registered before init_process_group runs after commtrace's own (atexit runs last
registered first), so every op of both ranks is written before the abort."""

import atexit
import os

import torch
import torch.distributed as dist


def _late_abort():
    if os.environ.get("RANK") == "1":
        os.abort()


atexit.register(_late_abort)
dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(5):
    dist.all_reduce(t)
print(f"rank {dist.get_rank()} sum {t.sum().item():.0f}", flush=True)
dist.destroy_process_group()
