"""A 2-rank gloo job for tests/test_writer_buffers.py (issue 20): queued full rows (async
collectives and their waits, recorded by the C async path; gaps, marks, the Python path's
rows) packed into typed buffers by ``_fastpath.pack_rows`` and turned into Arrow arrays with
numpy, against the list path's arrays of the very same rows, at every write of the run: async
ops waited at once or later, one never waited, one still in flight across a flush and
completed after it. Then one phase written through each path (a part each).

    torchrun --nproc-per-node 2 writer_async_buffers.py OUT
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import commtrace
from commtrace.capture import recorder as R
from commtrace.format import schema as S
from commtrace.format import writer as W


def phase(step):
    """Async collectives of several kinds and dtypes, waited at once or in a batch, and a
    blocking call among them (the C path's typed buffers concatenated after the rows)."""
    r = dist.get_rank()
    t = torch.ones(16)
    dist.all_reduce(t, async_op=True).wait()
    dist.broadcast(t, src=1, async_op=True).wait()
    o = torch.empty(32)
    works = [dist.all_gather_into_tensor(o, t, async_op=True),
             dist.reduce_scatter_tensor(torch.empty(16), o, async_op=True),
             dist.all_reduce(torch.ones(5, dtype=torch.float16), async_op=True),
             dist.all_reduce(torch.ones(3, dtype=torch.int64), async_op=True)]
    if r == 0:
        works.append(dist.isend(torch.ones(4), dst=1))
    else:
        works.append(dist.irecv(torch.empty(4), src=0))
    for w in works:
        w.wait()
    dist.all_reduce(t)   # blocking: C path, drained as typed buffers
    commtrace.mark_step(step)


def table_of_lists(rows):
    cols = [list(col) for col in zip(*rows)]
    cols[R.I_SITE] = [R.format_site(v) for v in cols[R.I_SITE]]
    return W.rows_to_table_nopandas({c: cols[i] for i, c in enumerate(R.COLUMNS)})


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    commtrace.enable(out, flush_interval=3600, hazards="off")
    rec = R.get_recorder()
    R.ROW_BUFFERS_MIN_ROWS = 1   # every write of this small job through the typed buffers
    writes = []
    orig = rec._write

    def spy(rows, inflight, final, ccols=None):
        """Every write of the run: the rows both ways, then the real write."""
        if rows and R._cfast is not None:
            t_lists = table_of_lists(rows)
            a = R.arrays_of_rows(rank, rows)
            w = {"n": len(rows), "packed": a is not None, "final": final,
                 "async": sum(1 for x in rows if x[R.I_ASYNC] is True),
                 "inflight": sorted(x["op_id"] for x in inflight if "op_id" in x)}
            if a is not None:
                got = W.table_of_arrays(a)
                got.validate(full=True)
                w["equal"] = got.equals(t_lists)
                w["diff"] = [c for c in R.COLUMNS if not got[c].equals(t_lists[c])]
                w["rows"] = got.to_pylist()
            writes.append(w)
        return orig(rows, inflight, final, ccols)

    rec._write = spy
    for i in range(3):   # first sightings (the Python path) out of the way
        phase(i)
    rec.flush()
    res = {"rank": rank, "c": R._cfast is not None, "run_dir": rec.run_dir,
           "async_counts": list(R._cfast.async_counts()) if R._cfast is not None else None}
    for i in range(5):
        phase(10 + i)
    # never waited (kept alive: released at the final flush, its end from the callback)
    never = dist.all_reduce(torch.ones(7), async_op=True)
    # in flight across a flush: rank 1 joins only once rank 0 has flushed
    if rank == 1:
        store.wait(["flushed"])
    late = dist.all_reduce(torch.ones(9), async_op=True)
    late_id = [p.op_id for p in rec._pending.values() if p.row[R.I_COUNT] == 9]
    res["late_id"] = late_id
    if rank == 0:
        rec.flush()
        with open(os.path.join(rec.run_dir, f"rank={rank}", S.INFLIGHT_NAME)) as f:
            res["inflight_mid"] = [x.get("op_id") for x in json.load(f)["ops"]]
        store.set("flushed", "1")
    late.wait()
    rec.flush()
    deadline = time.time() + 60
    while not never.is_completed() and time.time() < deadline:
        time.sleep(0.01)
    # one phase written through each path (a part each)
    for mode in (False, True):
        R.ROW_BUFFERS = mode
        with rec._write_lock:
            phase(100)
            rec.flush()
    R.ROW_BUFFERS = True
    res["async_counts_end"] = list(R._cfast.async_counts()) if R._cfast is not None else None
    commtrace.disable()
    res["writes"] = writes
    with open(os.path.join(out, f"result-{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
