"""Capture robustness cases in one 2-rank job (issue 6). Every rank writes what the training
code observed to OUT.rank<r>.json; the test runs this script with and without commtrace and
requires the two to be identical (training behaves exactly as without commtrace), then checks
the trace rows.

    torchrun --nproc-per-node 2 tests/scripts/robust_cases.py OUT
"""

import json
import os
import sys
import threading

import torch
import torch.distributed as dist

OUT = sys.argv[1]
res = {}

# A user who monkeypatches torch.distributed too, before init_process_group
user_calls = []
_orig_all_reduce = dist.all_reduce


def user_all_reduce(tensor, *args, **kwargs):
    user_calls.append(tuple(tensor.shape))
    return _orig_all_reduce(tensor, *args, **kwargs)


dist.all_reduce = user_all_reduce

dist.init_process_group("gloo")
rank, ws = dist.get_rank(), dist.get_world_size()
res["user_patch_kept"] = dist.all_reduce is user_all_reduce

# ... and one who wraps a function after init_process_group (the common case)
user_bcasts = []
_orig_broadcast = dist.broadcast


def user_broadcast(tensor, *args, **kwargs):
    user_bcasts.append(tuple(tensor.shape))
    return _orig_broadcast(tensor, *args, **kwargs)


dist.broadcast = user_broadcast
for _ in range(2):
    b = torch.full((16,), float(rank))
    dist.broadcast(b, src=1)
res["user_broadcast"] = [len(user_bcasts), b.tolist()]
dist.broadcast = _orig_broadcast

# group=None and subgroups: new_group, new_subgroups, DeviceMesh
t = torch.full((3,), float(rank + 1))
dist.all_reduce(t)  # group=None
res["world"] = t.tolist()
g = dist.new_group([0, 1])
t = torch.full((5,), float(rank + 1))
dist.all_reduce(t, group=g)
res["new_group"] = t.tolist()
sub, _ = dist.new_subgroups(group_size=2)
t = torch.full((6,), float(rank + 1))
dist.all_reduce(t, group=sub)
res["new_subgroups"] = t.tolist()
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
t = torch.full((9,), float(rank + 1))
dist.all_reduce(t, group=mesh.get_group("tp"))
res["mesh_tp"] = t.tolist()
t = torch.full((10,), float(rank + 1))
dist.all_reduce(t, group=mesh.get_group("dp"))  # a group of one rank
res["mesh_dp"] = t.tolist()
res["user_calls"] = len(user_calls)
print(f"rank {rank} groups done", flush=True)

# ops that raise: the exception reaches the caller unchanged. The all_reduce that fails inside
# gloo runs on a group of its own: gloo can surface its error again at the next op of the same
# group (seen with and without commtrace: the barrier below raised "Cannot use ReduceOp.BAND").
g_err = dist.new_group([0, 1])
for name, call in [
    ("band_on_float", lambda: dist.all_reduce(torch.ones(11), op=dist.ReduceOp.BAND, group=g_err)),
    ("bad_src", lambda: dist.broadcast(torch.ones(12), src=ws + 5)),
]:
    try:
        call()
        res[name] = None
    except Exception as e:  # noqa: BLE001
        res[name] = [type(e).__module__ + "." + type(e).__qualname__, str(e).splitlines()[0]]
dist.barrier()
print(f"rank {rank} raise done", flush=True)

# collectives from several threads, each on its own group (the order within a group is fixed)
g_a, g_b = dist.new_group([0, 1]), dist.new_group([0, 1])
out = {}


def worker(name, group, n):
    acc = 0.0
    for i in range(n):
        x = torch.full((13,), float(i + rank))
        dist.all_reduce(x, group=group)
        acc += float(x[0])
    out[name] = acc


ths = [threading.Thread(target=worker, args=("a", g_a, 20)),
       threading.Thread(target=worker, args=("b", g_b, 20))]
for th in ths:
    th.start()
for th in ths:
    th.join()
res["threads"] = out
print(f"rank {rank} threads done", flush=True)

# alongside torch.profiler
from torch.profiler import ProfilerActivity, profile  # noqa: E402

with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(3):
        x = torch.ones(14)
        dist.all_reduce(x)
names = [e.key for e in prof.key_averages()]
res["profiler_allreduce_events"] = sorted(
    (e.key, e.count) for e in prof.key_averages() if "allreduce" in e.key.lower().replace("_", ""))
res["profiler_ok"] = len(names) > 0

# fork after init: the child computes without communicating and exits
pid = os.fork()
if pid == 0:
    y = torch.arange(15.0).sum()
    os._exit(0 if float(y) == 105.0 else 3)
_, status = os.waitpid(pid, 0)
res["fork_child_exit"] = os.waitstatus_to_exitcode(status)
res["child_pid"] = pid

print(f"rank {rank} fork done", flush=True)

# destroy_process_group and init again in the same process (a fresh rendezvous through a file
# store: the agent's store keeps the first group's keys)
store = dist.distributed_c10d._get_default_store()
if rank == 0:
    import tempfile

    store.set("robust_reinit_file", tempfile.mktemp(prefix="robust-reinit-"))
path = store.get("robust_reinit_file").decode()
dist.barrier()
dist.destroy_process_group()
dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=ws)
t = torch.full((7,), float(rank + 1))
dist.all_reduce(t)
res["after_reinit"] = t.tolist()
dist.destroy_process_group()

with open(f"{OUT}.rank{rank}.json", "w") as f:
    json.dump(res, f, indent=1, sort_keys=True)
print(f"rank {rank} ok", flush=True)
