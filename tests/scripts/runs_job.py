"""One small gloo job: N all_reduces of COUNT elements (tests/test_runs_e2e.py runs two of them
one after the other under one `commtrace run -o D`)."""

import sys

import torch
import torch.distributed as dist

n, count = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
t = torch.ones(count)
for _ in range(n):
    dist.all_reduce(t)
dist.destroy_process_group()
