"""A 2-rank gloo job for tests/test_writer_cost.py (issue 20, session 17): DDP's bucket
all-reduces recorded through the C++ hook or recording group are released at their stamp on
the training thread (``_fastpath.stamp_release``), not at the writer's next service. The
sample's steps run twice, the release at the stamp on, then off, with the writer's service
held off meanwhile (``rec._service`` answers only the final one): what is still pending after
each phase, then a service and a part per phase. Writes OUT.rank<r> (JSON).

    torchrun --nproc-per-node 2 ddp_stamp_release.py OUT [HAZARDS]
"""

import importlib.util
import json
import os
import sys

import torch
import torch.distributed as dist

import commtrace
from commtrace.capture import accel
from commtrace.capture import recorder as R

STEPS = 6


def main():
    out = sys.argv[1]
    hazards = sys.argv[2] if len(sys.argv) > 2 else "basic"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    commtrace.enable(out + ".trace", flush_interval=3600, hazards=hazards)
    rec = R.get_recorder()
    rec.auto_flush = False   # parts only where this script flushes (not the first 0.2 s flushes)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location("ddp_mlp", os.path.join(root, "samples", "ddp_mlp.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    st = m.setup(m.parse_args(["--straggler-ms", "0"]), rank, dist.get_world_size(), torch.device("cpu"))
    if hasattr(R._cfast, "ddp_direct"):
        # the buckets as pending ops (the route this is about): not as the C records the
        # recording group makes by default since session 30 (tests/test_ddp_direct.py)
        R._cfast.ddp_direct(False)
    service = rec._service
    for i in range(3):   # DDP rebuilds its buckets after the first step
        m.train_step(st, i)
    dist.barrier()
    service(False)
    rec.flush()
    res = {"cxx": accel.load() is not None, "phases": {}}
    for on in (True, False):
        was = R._cfast.stamp_release(on)
        rec._service = lambda final: service(final) if final else None
        try:
            for i in range(STEPS):
                m.train_step(st, i)
            dist.barrier()
            pending = [(p.op, p.api) for p in rec._pending.values()]
            queued = sum(1 for r in rec._ready
                         if r[R.I_KIND] == "op" and r[R.I_API] == "ddp_comm_hook")
        finally:
            rec._service = service
            R._cfast.stamp_release(was)
        service(False)   # whatever the stamps left, as before
        rec.flush()
        res["phases"]["on" if on else "off"] = {"pending": pending, "queued": queued,
                                                "left": len(rec._pending)}
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
