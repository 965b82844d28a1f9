"""Calls every torch.distributed collective, sync and async, plus send/recv, batch_isend_irecv,
a coalesced all-reduce, object collectives and functional collectives. A plain torch script.

    torchrun --nproc-per-node 2 samples/all_collectives.py [--backend gloo|nccl] [-n 1024]

Every tensor op moves N float32 elements per rank (per peer for all_to_all), so the sizes in a
trace are easy to check: bytes = 4 N for all_reduce, N x world for an all_gather output, ...
Rank 0 is the root of the rooted collectives; p2p goes from rank 0 to rank 1 and back.
Ops that a backend does not implement are skipped with a note on stderr.
"""

import argparse
import os
import sys
import warnings

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("-n", type=int, default=1024, help="elements per rank")
    args = ap.parse_args()
    warnings.simplefilter("ignore")  # deprecation warnings of the older names

    dist.init_process_group(args.backend)
    r, W, N = dist.get_rank(), dist.get_world_size(), args.n
    if args.backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", r))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    peer = (r + 1) % W if r == 0 else 0
    gloo = args.backend == "gloo"

    def t(n=N, v=1.0):
        return torch.full((n,), float(v), device=dev)

    def run(name, fn):
        try:
            fn()
        except (RuntimeError, NotImplementedError, ValueError) as e:
            print(f"all_collectives: rank {r}: {name} skipped: {str(e).splitlines()[0][:100]}",
                  file=sys.stderr)

    for async_op in (False, True):
        def done(w):
            if async_op and w is not None:
                w.wait()

        run("all_reduce", lambda: done(dist.all_reduce(t(), async_op=async_op)))
        run("broadcast", lambda: done(dist.broadcast(t(), src=0, async_op=async_op)))
        run("reduce", lambda: done(dist.reduce(t(), dst=0, async_op=async_op)))
        run("all_gather", lambda: done(dist.all_gather([t() for _ in range(W)], t(),
                                                        async_op=async_op)))
        run("all_gather_into_tensor", lambda: done(dist.all_gather_into_tensor(
            t(N * W), t(), async_op=async_op)))
        if hasattr(dist, "all_gather_single"):
            run("all_gather_single", lambda: done(dist.all_gather_single(
                t(N * W), t(), async_op=async_op)))
        run("_all_gather_base", lambda: done(dist._all_gather_base(t(N * W), t(),
                                                                   async_op=async_op)))
        run("gather", lambda: done(dist.gather(
            t(), [t() for _ in range(W)] if r == 0 else None, dst=0, async_op=async_op)))
        run("scatter", lambda: done(dist.scatter(
            t(), [t() for _ in range(W)] if r == 0 else None, src=0, async_op=async_op)))
        run("reduce_scatter", lambda: done(dist.reduce_scatter(
            t(), [t() for _ in range(W)], async_op=async_op)))
        run("reduce_scatter_tensor", lambda: done(dist.reduce_scatter_tensor(
            t(), t(N * W), async_op=async_op)))
        if hasattr(dist, "reduce_scatter_single"):
            run("reduce_scatter_single", lambda: done(dist.reduce_scatter_single(
                t(), t(N * W), async_op=async_op)))
        run("_reduce_scatter_base", lambda: done(dist._reduce_scatter_base(
            t(), t(N * W), async_op=async_op)))
        run("all_to_all", lambda: done(dist.all_to_all(
            [t() for _ in range(W)], [t() for _ in range(W)], async_op=async_op)))
        run("all_to_all_single", lambda: done(dist.all_to_all_single(
            t(N * W), t(N * W), async_op=async_op)))
        run("all_reduce_coalesced", lambda: done(dist.all_reduce_coalesced(
            [t(), t()], async_op=async_op)))
        run("barrier", lambda: done(dist.barrier(async_op=async_op)))

    if gloo:
        run("monitored_barrier", lambda: dist.monitored_barrier())

    # point to point: rank 0 <-> rank 1 (other ranks idle)
    if r < 2 and W >= 2:
        if r == 0:
            dist.send(t(), dst=1)
            dist.recv(t(), src=1)
            dist.isend(t(), dst=1).wait()
            dist.irecv(t(), src=1).wait()
        else:
            dist.recv(t(), src=0)
            dist.send(t(), dst=0)
            dist.irecv(t(), src=0).wait()
            dist.isend(t(), dst=0).wait()
        ops = [dist.P2POp(dist.isend, t(), peer), dist.P2POp(dist.irecv, t(), peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    # coalesced all-reduce (one Work for both)
    def coalesced():
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.all_reduce(t())
            dist.all_reduce(t())
        cm.wait()

    run("_coalescing_manager", coalesced)

    # object collectives
    objs = [{"rank": r, "payload": list(range(8))}]
    dist.broadcast_object_list(objs, src=0)
    out = [None] * W
    dist.all_gather_object(out, {"rank": r})
    dist.gather_object({"rank": r}, [None] * W if r == 0 else None, dst=0)
    recv = [None]
    dist.scatter_object_list(recv, [{"to": i} for i in range(W)] if r == 0 else None, src=0)
    if r < 2 and W >= 2:
        if r == 0:
            dist.send_object_list([{"hello": 1}], dst=1)
        else:
            got = [None]
            dist.recv_object_list(got, src=0)

    # functional collectives: completion is the wait on the async tensor
    import torch.distributed._functional_collectives as funcol

    g = dist.group.WORLD
    funcol.all_reduce(t(), "sum", g).wait()
    funcol.all_gather_tensor(t(), 0, g).wait()
    funcol.reduce_scatter_tensor(t(N * W), "sum", 0, g).wait()
    funcol.all_to_all_single(t(N * W), None, None, g).wait()
    funcol.broadcast(t(), 0, g).wait()

    dist.barrier()
    if r == 0:
        print(f"all_collectives: done on {W} ranks ({args.backend}, N={N})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
