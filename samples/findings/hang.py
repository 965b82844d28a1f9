"""Finding `not_joined` (a hang): rank 1 skips one all_reduce (a data-dependent `continue`), then
is busy elsewhere; rank 0 blocks in its last all_reduce, which rank 1 never issues.

This job hangs on purpose: stop it after a few seconds (Ctrl-C, or run it under
`timeout -s TERM 30`). commtrace flushes the trace on the signal and names rank 1 and the
collective it never joined.

    timeout -s TERM 30 commtrace run -- torchrun --nproc-per-node 2 samples/findings/hang.py
"""

import time

import torch
import torch.distributed as dist

STEPS, SKIPPED = 10, 4

dist.init_process_group("gloo")
rank = dist.get_rank()
grad = torch.ones(1 << 10)
for step in range(STEPS):
    if rank == 1 and step == SKIPPED:
        continue  # BUG: this rank skips one all_reduce
    dist.all_reduce(grad)
print(f"rank {rank} done issuing", flush=True)
if rank == 1:
    time.sleep(600)  # stuck elsewhere (a data loader, an eval loop): never joins again
dist.destroy_process_group()
