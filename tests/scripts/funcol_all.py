"""Every functional collective called eagerly once (2 ranks, gloo), each with a tensor of its own
size, so that its row can be found in the trace. Writes OUT_JSON.<rank>: the calls made, in
order, as [api, op, count, dtype] (the independent list the test compares the trace with),
and the results (identical with and without commtrace); then the warnings of
warn_sites.py (deprecated names: their calls are made after the list above and are not in it)
and what DDP says about itself after training (ddp_logging.py).

Usage: funcol_all.py OUT_JSON
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
import torch.distributed as dist

warnings.simplefilter("ignore")


def main() -> int:
    dist.init_process_group("gloo")
    import torch.distributed._functional_collectives as fc

    rank, ws = dist.get_rank(), dist.get_world_size()
    g = dist.group.WORLD
    calls, outs = [], []

    def t(n, dtype=torch.float32):
        return (torch.arange(n) + 100 * rank).to(dtype)

    def did(api, op, x, dtype="float32"):
        n = sum(y.numel() for y in x) if isinstance(x, list) else x.numel()
        calls.append(["funcol." + api, op, n, dtype])

    def keep(r):
        r = r if isinstance(r, (list, tuple)) else [r]
        outs.append([torch.as_tensor(y).clone().tolist() for y in r])

    x = t(2); did("all_reduce", "all_reduce", x); keep(fc.all_reduce(x, "sum", g))
    x = [t(4), t(6)]; did("all_reduce_coalesced", "all_reduce", x)
    keep(fc.all_reduce_coalesced(x, "sum", g))
    for i, name in enumerate(("all_gather_single", "all_gather_single_autograd",
                              "all_gather_tensor", "all_gather_tensor_autograd")):
        x = t(8 + 2 * i); did(name, "all_gather", x); keep(getattr(fc, name)(x, 0, g))
    for i, name in enumerate(("all_gather_single_coalesced", "all_gather_into_tensor_coalesced")):
        x = [t(16 + 2 * i)]; did(name, "all_gather", x); keep(getattr(fc, name)(x, g))
    for i, name in enumerate(("reduce_scatter_single", "reduce_scatter_single_autograd",
                              "reduce_scatter_tensor", "reduce_scatter_tensor_autograd")):
        x = t(20 + 2 * i); did(name, "reduce_scatter", x)
        keep(getattr(fc, name)(x, "sum", 0, g))
    for i, name in enumerate(("reduce_scatter_single_coalesced",
                              "reduce_scatter_tensor_coalesced")):
        x = [t(28 + 2 * i)]; did(name, "reduce_scatter", x)
        keep(getattr(fc, name)(x, "sum", [0], g))
    for i, name in enumerate(("all_to_all_single", "all_to_all_single_autograd")):
        x = t(32 + 2 * i); did(name, "all_to_all", x)
        keep(getattr(fc, name)(x, None, None, g))
    x = t(36); did("broadcast", "broadcast", x); keep(fc.broadcast(x, 1, g))
    x = t(38); did("permute_tensor", "all_to_all", x); keep(fc.permute_tensor(x, [1, 0], g))
    x = t(40); did("all_reduce_inplace", "all_reduce", x); fc.all_reduce_inplace(x, "sum", g)
    keep(x)
    x = t(42); out = torch.empty(42 * ws); did("all_gather_tensor_inplace", "all_gather", x)
    fc.all_gather_tensor_inplace(out, x, g); keep(out)
    x = t(44); lst = [torch.empty(44) for _ in range(ws)]
    did("all_gather_inplace", "all_gather", x); fc.all_gather_inplace(lst, x, g); keep(lst)
    x = t(46); out = torch.empty(46 // ws); did("reduce_scatter_tensor_inplace", "reduce_scatter", x)
    fc.reduce_scatter_tensor_inplace(out, x, "sum", g); keep(out)
    x = t(48); out = torch.empty(48); did("all_to_all_inplace", "all_to_all", x)
    fc.all_to_all_inplace(out, x, None, None, g); keep(out)
    # Point to point: rank 0 sends, rank 1 receives (int64: a dtype of their own).
    peer = 1 - rank
    x = t(50, torch.int64)
    if rank == 0:
        did("isend_inplace", "send", x, "int64"); r = fc.isend_inplace(x, peer)
    else:
        did("irecv_inplace", "recv", x, "int64"); r = fc.irecv_inplace(x, peer)
    keep(r.wait() if hasattr(r, "wait") else r)
    a, b = t(52, torch.int64), torch.zeros(52, dtype=torch.int64)
    ops = (["isend", "irecv"], [peer, peer], [0, 0], [a, b]) if rank == 0 else \
        (["irecv", "isend"], [peer, peer], [0, 0], [b, a])
    for kind, y in zip(ops[0], ops[3]):
        did("batch_p2p_ops_inplace", "send" if kind == "isend" else "recv", y, "int64")
    res = fc.batch_p2p_ops_inplace(*ops, g)
    keep([r.wait() if hasattr(r, "wait") else r for r in res])
    dist.barrier()
    import warn_sites   # next to this script

    warns = warn_sites.record_sites()
    import ddp_logging   # next to this script: DDP without a comm hook, in the same job

    ddp = ddp_logging.train_and_describe()
    with open(f"{sys.argv[1]}.{rank}", "w") as f:
        json.dump({"calls": calls, "outs": outs, "warn": warns, "ddp": ddp}, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
