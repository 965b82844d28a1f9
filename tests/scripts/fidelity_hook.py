"""A group that behaves like ProcessGroupNCCL towards the completion hook, on the CPU: it
numbers its collectives (``_get_sequence_number_for_group``) and calls the registered hook with
a WorkInfo-like record for every op, including ops "issued from C++" (``cpp_op``: no Python
call commtrace could wrap). Planted: 3 blocking and 1 async all_reduce through
torch.distributed, 4 C++ ops with known times (world size 1, gloo default group)."""

import datetime
import sys
import threading
import types

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

EPOCH_S = 1_700_000_000


def done_work(result):
    f = torch.futures.Future()
    f.set_result(result)
    return _create_work_from_future(f)


class HookPG(dist.ProcessGroup):
    def __init__(self):
        super().__init__(0, 1)
        self.seq = 0
        self.p2p_seq = 0
        self.hook = None

    def getBackendName(self):
        return "hook-pg"

    def _register_on_completion_hook(self, hook):
        self.hook = hook

    def _get_sequence_number_for_group(self):
        return self.seq

    def _fire(self, op_type, seq, t0=None, t1=None, dur_us=0):
        now = datetime.datetime.now()
        info = types.SimpleNamespace(
            op_type=types.SimpleNamespace(name=op_type), seq=seq,
            time_started=t0 or now, time_finished=t1 or now,
            active_duration=datetime.timedelta(microseconds=dur_us))
        if self.hook is not None:
            # as NCCL's watchdog does: from another thread, after the op completed
            th = threading.Thread(target=self.hook, args=(info,))
            th.start()
            th.join()

    def allreduce(self, tensors, opts):
        self.seq += 1
        self._fire("ALLREDUCE", self.seq)
        return done_work(tensors)

    def cpp_op(self, op_type, k):
        """An op issued below Python, with planted times: EPOCH_S + k s, 2 ms, 1.5 ms on device."""
        t0 = datetime.datetime.fromtimestamp(EPOCH_S + k)
        t1 = t0 + datetime.timedelta(milliseconds=2)
        if op_type == "SEND":
            self.p2p_seq += 1
            self._fire(op_type, self.p2p_seq, t0, t1, 1500)
        else:
            self.seq += 1
            self._fire(op_type, self.seq, t0, t1, 1500)


dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[1]}")
pg = HookPG()
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t, group=pg)                 # torch seqs 1, 2, 3
pg.cpp_op("ALLREDUCE", 1)                        # 4
w = dist.all_reduce(t, group=pg, async_op=True)  # 5
w.wait()
pg.cpp_op("_ALLGATHER_BASE", 2)                  # 6
pg.cpp_op("_REDUCE_SCATTER_BASE", 3)             # 7
pg.cpp_op("SEND", 4)                             # p2p 1
dist.all_reduce(t)                               # the default (gloo) group: no hook
print("RESULT", t.tolist(), flush=True)
dist.destroy_process_group()
