"""A real size mismatch on gloo: rank 1 passes twice the elements in the 6th all_reduce; gloo
aborts a peer in C++ (gloo::EnforceNotMet, SIGABRT) within milliseconds."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1024)
for _ in range(5):
    dist.all_reduce(t)
x = torch.ones(2048 if rank == 1 else 1024)
dist.all_reduce(x)  # MISMATCH-LINE
dist.destroy_process_group()
