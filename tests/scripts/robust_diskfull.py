"""The disk fills mid-run: the 2nd and 3rd trace parts fail to write with ENOSPC, then space
comes back. Training must go on unharmed; the lost rows are counted as dropped.

    commtrace run -o OUT --flush-interval 0.1 -- python tests/scripts/robust_diskfull.py PORT
"""

import errno
import os
import sys
import time

import torch
import torch.distributed as dist

from commtrace.format import writer

calls = [0]
real_write_part = writer.write_part


def write_part(*args, **kwargs):
    calls[0] += 1
    if calls[0] in (2, 3):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real_write_part(*args, **kwargs)


writer.write_part = write_part

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ["MASTER_PORT"] = sys.argv[1]
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.ones(4)
total = 0.0
for phase in range(4):
    for i in range(50):
        t.fill_(1.0)
        dist.all_reduce(t)
        total += float(t.sum())
    time.sleep(0.5)  # a few flushes per phase
dist.destroy_process_group()
print(f"training finished: sum {total:g}, write_part calls {calls[0]}", flush=True)
