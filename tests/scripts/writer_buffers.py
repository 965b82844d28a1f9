"""A 2-rank gloo job for tests/test_writer_buffers.py (issue 20): the C path's calls drained as
typed buffers and turned into Arrow arrays with numpy, against the list path's arrays of the
very same calls; then the same phase of calls written once through each path.

    torchrun --nproc-per-node 2 writer_buffers.py OUT
"""

import sys

import torch
import torch.distributed as dist

import commtrace
from commtrace.capture import recorder as R
from commtrace.format import writer as W
from job_result import finish


def phase(g, step):
    """Every kind of blocking call the C path records, on two groups and several dtypes."""
    r = dist.get_rank()
    t = torch.ones(16)
    dist.all_reduce(t)
    dist.broadcast(t, src=1)
    dist.reduce(t, dst=0)
    o = torch.empty(32)
    dist.all_gather_into_tensor(o, t)
    dist.reduce_scatter_tensor(torch.empty(16), o)
    dist.all_to_all_single(torch.empty(16), t)
    dist.all_reduce(torch.ones(3, dtype=torch.int64), group=g)
    dist.all_reduce(torch.ones(5, dtype=torch.float16))
    if r == 0:
        dist.send(torch.ones(4), dst=1)
    else:
        dist.recv(torch.empty(4), src=0)
    dist.barrier()
    commtrace.mark_step(step)


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    commtrace.enable(out, flush_interval=3600, hazards="off")
    g = dist.new_group([0, 1])
    for i in range(3):   # first sightings (Python path) and first ops out of the way
        phase(g, i)
    rec = R.get_recorder()
    rec.flush()
    cf = R._cfast
    res = {"rank": rank, "c": cf is not None, "run_dir": rec.run_dir}
    if cf is not None:
        # 1. the same drained calls, both ways (the writer thread held off meanwhile)
        with rec._write_lock:
            for i in range(5):
                phase(g, 10 + i)
            d = cf.drain_records()
        res["n"] = d[0]
        got = W.table_of_arrays(R.arrays_of_records(rank, d))
        got.validate(full=True)
        cols = R.expand_columns(rank, R.columns_of_records(d))
        cols[R.I_SITE] = [R.format_site(v) for v in cols[R.I_SITE]]
        want = W.rows_to_table_nopandas({c: cols[i] for i, c in enumerate(R.COLUMNS)})
        res["equal"] = got.equals(want)
        res["diff"] = [c for c in R.COLUMNS if not got[c].equals(want[c])]
        res["rows"] = got.to_pylist()
        rec.flush()
        # 2. one phase written through each path (a part each)
        for mode in (False, True):
            R.RECORD_BUFFERS = mode
            with rec._write_lock:   # (an RLock: flush() takes it too)
                phase(g, 100)
                rec.flush()
        R.RECORD_BUFFERS = True
    finish(out, rank, res)


if __name__ == "__main__":
    main()
