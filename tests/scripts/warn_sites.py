"""Where torch's warnings point when raised inside a wrapped call (2 ranks, gloo). Each call
below is on a line marked ``# WARN <name>``; :func:`record_sites` returns name -> [[file, line],
...] of the warnings it raised, and name -> the marked line (funcol_all.py runs it; alone, the
script writes them to OUT_JSON.<rank>).

Usage: warn_sites.py OUT_JSON
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist


def record_sites() -> dict:
    """The warnings of the marked calls (the group exists): {"got": ..., "marks": ...}."""
    import torch.distributed._functional_collectives as fc

    g = dist.group.WORLD
    x, out = torch.ones(4), torch.empty(8)
    got = {}

    def record(name, fn):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fn()
        got[name] = [[os.path.basename(m.filename), m.lineno] for m in w]

    record("funcol_all_gather_tensor",
           lambda: fc.all_gather_tensor(x, 0, g).wait())  # WARN funcol_all_gather_tensor
    record("funcol_reduce_scatter_tensor",
           lambda: fc.reduce_scatter_tensor(out, "sum", 0, g).wait())  # WARN funcol_reduce_scatter_tensor
    record("funcol_coalesced",
           lambda: fc.all_gather_into_tensor_coalesced([x], g)[0].wait())  # WARN funcol_coalesced
    record("c10d_all_gather_into_tensor",
           lambda: dist.all_gather_into_tensor(out, x))  # WARN c10d_all_gather_into_tensor
    record("c10d_async", lambda: dist.all_gather_into_tensor(out, x, async_op=True).wait())  # WARN c10d_async
    marks = {}
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if "# WARN " in line and "split" not in line and "marked" not in line:
                marks[line.split("# WARN ")[1].strip()] = i
    return {"got": got, "marks": marks}


def main() -> int:
    dist.init_process_group("gloo")
    res = record_sites()
    with open(f"{sys.argv[1]}.{dist.get_rank()}", "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
