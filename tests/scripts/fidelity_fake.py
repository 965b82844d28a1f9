"""One process playing rank 1 of a world of 4 on torch's fake backend (a dry run): prints the
results, which the fake backend leaves as they were."""

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
t = torch.arange(4, dtype=torch.float32)
dist.all_reduce(t)
out = torch.empty(16)
dist.all_gather_into_tensor(out, t)
w = dist.all_reduce(t, async_op=True)
busy = sum(i * i for i in range(200000))   # work overlapping the op
w.wait()
dist.barrier()
print("RESULT", t.tolist(), flush=True)
dist.destroy_process_group()
