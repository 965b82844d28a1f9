"""torch.compile of functions that issue collectives, run under torchrun (2 ranks, gloo).

Usage: compile_cases.py OUT_JSON BACKENDS [CASES]
  BACKENDS: comma list of aot_eager,inductor; CASES: comma list of case names (default all).

For each backend x fullgraph x case: a fresh Dynamo state, the compiled function called twice,
then once more after eager collectives changed commtrace's state (a guard on that state would
recompile). Written per rank to OUT_JSON.<rank>: graph count, graph-break count, recompiles,
the outputs' exact bytes (hex of a hash), or the exception's type. The planted eager calls
after the cases use sizes no compiled case uses (13 and 17 elements), so the trace's rows can be
told apart from anything the compiled code did.

Used with and without commtrace by tests/test_compile.py; the two JSON files must be equal.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

warnings.simplefilter("ignore")  # deprecation warnings of the old funcol names


def _digest(out) -> str:
    h = hashlib.sha256()

    def add(x):
        if isinstance(x, torch.Tensor):
            x = x.wait() if hasattr(x, "wait") and type(x).__name__ == "AsyncCollectiveTensor" \
                else x
            h.update(str(x.dtype).encode() + str(tuple(x.shape)).encode())
            h.update(x.detach().contiguous().view(torch.uint8).numpy().tobytes()
                     if _has_numpy() else repr(x.detach().tolist()).encode())
        elif isinstance(x, (list, tuple)):
            for y in x:
                add(y)
        else:
            h.update(repr(x).encode())

    add(out)
    return h.hexdigest()[:16]


def _state_guards(fn) -> list[str]:
    """Guard lines of `fn`'s compiled entries that read a module of commtrace (its recorder,
    its caches): there must be none. Guards on a wrapper's identity and its fixed
    ``__commtrace_original__`` are not state."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    out = []
    for entry in _debug_get_cache_entry_list(fn.__code__):
        for line in str(entry.guard_manager).splitlines():
            if "__import_commtrace" in line or "_recorder" in line:
                out.append(line.strip()[:200])
    return out


def _has_numpy() -> bool:
    try:
        import numpy  # noqa: F401
        return True
    except ImportError:
        return False


def main() -> int:
    out_json, backends = sys.argv[1], sys.argv[2].split(",")
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 and sys.argv[3] else None
    import datetime

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    import torch._dynamo
    import torch.distributed._functional_collectives as funcol
    from torch._dynamo.utils import counters

    rank, ws = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    peer = 1 - rank

    def x0():
        return (torch.arange(8, dtype=torch.float32) + 10 * rank,)

    # -- functional collectives: every public function of the module -------------------------
    def funcol_all(x):
        a = funcol.all_reduce(x, "sum", group)
        b = funcol.all_gather_single(x, 0, group)
        c = funcol.reduce_scatter_single(x, "sum", 0, group)
        d = funcol.all_to_all_single(x, None, None, group)
        e = funcol.broadcast(x, 0, group)
        f = funcol.all_reduce_coalesced([x, x * 2], "sum", group)
        g = funcol.all_gather_single_coalesced([x, x + 1], group)
        h = funcol.reduce_scatter_single_coalesced([x, x + 1], "sum", [0, 0], group)
        i = funcol.permute_tensor(x, [1, 0], group)
        j = funcol.wait_tensor(funcol.all_reduce(x * 3, "max", group))
        return a * 2, b + 1, c, d, e, f[0] + f[1], g[1], h[0], i, j

    def funcol_autograd(x):
        a = funcol.all_gather_single_autograd(x, 0, group)
        b = funcol.reduce_scatter_single_autograd(x, "sum", 0, group)
        c = funcol.all_to_all_single_autograd(x, None, None, group)
        return a + 1, b, c

    def funcol_deprecated(x):
        a = funcol.all_gather_tensor(x, 0, group)
        b = funcol.reduce_scatter_tensor(x, "sum", 0, group)
        c = funcol.all_gather_tensor_autograd(x, 0, group)
        d = funcol.reduce_scatter_tensor_autograd(x, "sum", 0, group)
        e = funcol.all_gather_into_tensor_coalesced([x], group)
        f = funcol.reduce_scatter_tensor_coalesced([x], "sum", [0], group)
        return a, b, c, d, e[0], f[0]

    def funcol_inplace(x):
        y = x.clone()
        funcol.all_reduce_inplace(y, "sum", group)
        out = torch.empty(16)
        funcol.all_gather_tensor_inplace(out, x, group)
        rs = torch.empty(4)
        funcol.reduce_scatter_tensor_inplace(rs, x, "sum", group)
        a2a = torch.empty(8)
        funcol.all_to_all_inplace(a2a, x, None, None, group)
        lst = [torch.empty(8) for _ in range(ws)]
        funcol.all_gather_inplace(lst, x, group)
        return y, out, rs, a2a, lst[0], lst[1]

    # -- in-place c10d collectives that Dynamo rewrites to funcol -----------------------------
    def c10d_inplace(x):
        y = x.clone()
        dist.all_reduce(y)
        ag = torch.empty(16)
        dist.all_gather_into_tensor(ag, x)
        ags = torch.empty(16)
        dist.all_gather_single(ags, x)
        rs = torch.empty(4)
        dist.reduce_scatter_tensor(rs, x)
        rss = torch.empty(4)
        dist.reduce_scatter_single(rss, x)
        a2a = torch.empty(8)
        dist.all_to_all_single(a2a, x)
        lst = [torch.empty(8) for _ in range(ws)]
        dist.all_gather(lst, x)
        agb = torch.empty(16)
        dist._all_gather_base(agb, x)
        rsb = torch.empty(4)
        dist._reduce_scatter_base(rsb, x)
        return y, ag, ags, rs, rss, a2a, lst[1], agb, rsb

    # -- point to point -----------------------------------------------------------------------
    def p2p(x):
        buf = torch.empty(8)
        if rank == 0:
            w = dist.isend(x, peer)
        else:
            w = dist.irecv(buf, peer)
        w.wait()
        ops = [dist.P2POp(dist.isend, x + 1, peer), dist.P2POp(dist.irecv, buf, peer)]
        for w in dist.batch_isend_irecv(ops if rank == 0 else ops[::-1]):
            w.wait()
        return buf * 1

    # -- collectives Dynamo does not rewrite: graph breaks (fullgraph=True: Unsupported) ------
    def c10d_break(x):
        y = x.clone() + 1
        dist.broadcast(y, 0)
        z = y * 2
        dist.reduce(z, 0)
        dist.barrier()
        w = dist.all_reduce(z, async_op=True)
        w.wait()
        return z + 1

    # -- the rest of the wrapped entry points. Dynamo 2.13 itself fails on this one without
    #    fullgraph (InternalTorchDynamoError, UnsafeScriptObjectError in a resumed frame), with
    #    or without commtrace: what is compared is that it fails the same way ------------------
    def c10d_more(x):
        y = x + 1
        gl = [torch.empty(8) for _ in range(ws)] if rank == 0 else None
        dist.gather(y, gl, dst=0)
        sc = torch.empty(8)
        dist.scatter(sc, [y, y * 2] if rank == 0 else None, src=0)
        outs = [torch.empty(4) for _ in range(ws)]
        dist.all_to_all(outs, list(y.chunk(ws)))
        dist.monitored_barrier()
        fc_t = funcol.wait_tensor(funcol.all_reduce(y[:5], "sum", group))  # run eagerly here
        return sc + y + fc_t.sum() + outs[1].sum()

    # -- where Dynamo 2.13 itself fails (InternalTorchDynamoError, UnsafeScriptObjectError on
    #    the resumed frame), with or without commtrace: it must fail the same way ---------------
    def torch_fails(x):
        y = x + 1
        a, b = y.clone(), y * 3
        dist.all_reduce_coalesced([a, b])
        if rank == 0:
            dist.send(y, 1)
        else:
            dist.recv(y, 0)
        objs = [None] * ws
        dist.all_gather_object(objs, {"rank": rank})
        lst = [y.clone()]
        dist.broadcast_object_list(lst, src=0)
        return y + a + b + lst[0] + float(len(objs))

    cases = {
        "funcol_all": (funcol_all, x0),
        "funcol_autograd": (funcol_autograd, x0),
        "funcol_deprecated": (funcol_deprecated, x0),
        "funcol_inplace": (funcol_inplace, x0),
        "c10d_inplace": (c10d_inplace, x0),
        "p2p": (p2p, x0),
        "c10d_break": (c10d_break, x0),
        "c10d_more": (c10d_more, x0),
        "torch_fails": (torch_fails, x0),
    }
    results = {}
    for backend in backends:
        for fullgraph in (False, True):
            for name, (fn, inputs) in cases.items():
                if only and name not in only:
                    continue
                key = f"{backend}/{'fullgraph' if fullgraph else 'graphs'}/{name}"
                torch._dynamo.reset()
                counters.clear()
                compiled = torch.compile(fn, backend=backend, fullgraph=fullgraph)
                r = {}
                try:
                    outs = [_digest(compiled(*inputs())) for _ in range(2)]
                    graphs = counters["stats"]["unique_graphs"]
                    # Change commtrace's state (rows recorded, async ops pending and done),
                    # then call again: a guard on that state would fail and recompile.
                    w = dist.all_reduce(torch.ones(3), async_op=True)
                    w.wait()
                    funcol.all_reduce(torch.ones(3), "sum", group).wait()
                    outs.append(_digest(compiled(*inputs())))
                    r.update(out=outs, graphs=graphs,
                             recompiles=counters["stats"]["unique_graphs"] - graphs,
                             breaks=sum(counters["graph_break"].values()),
                             state_guards=_state_guards(fn))
                except Exception as e:
                    r.update(error=type(e).__name__)
                    if os.environ.get("COMPILE_CASES_DEBUG"):
                        import traceback

                        traceback.print_exc()
                    print(f"rank {rank} {key} {type(e).__name__}: {str(e)[:300]}", flush=True)
                    # Both ranks leave the case at the same point only if it failed the same
                    # way on both; re-synchronise before the next one.
                    dist.barrier()
                results[key] = r
                print(f"rank {rank} {key} {r}", flush=True)
    # Planted eager calls (sizes 13 and 17 appear nowhere else): recorded under commtrace.
    dist.all_reduce(torch.ones(13))
    funcol.all_reduce(torch.ones(17), "sum", group).wait()
    dist.barrier()
    with open(f"{out_json}.{rank}", "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    # Free the compiled graphs (dynamo's caches hold their collectives' works and tensors) before
    # the group goes, and let both ranks' gloo threads finish: a gloo work freed while Python
    # finalizes aborts the process (torch 2.13, pytorch/pytorch#179291; CI saw it twice in a row
    # here). A careful user's exit, not a retry.
    torch._dynamo.reset()
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
