"""A 2-rank gloo job for tests/test_ddp_direct.py (issue 20, session 30): DDP's buckets recorded
as C records by commtrace's recording group (``_fastpath.ddp_direct``) keep the pending-op
route's guarantees. Tracing is enabled in the script (commtrace.enable) with the automatic
flushes off; the model's buckets are all-reduced on the recording group where the C++ module
is built (COMMTRACE_CACHE_DIR).

    torchrun --nproc-per-node 2 ddp_direct.py OUT MODE

MODE:
- ``inflight``: rank 1 sleeps before one step's forward, so rank 0's buckets wait in gloo; a
  thread of rank 0 reads what the recorder lists in flight meanwhile (``inflight_ids``,
  ``blocking_rows`` as the hang watchdog reads them, ``hung_ops``) and writes a part
  (``_inflight.json``); a service then must not write them, and after the step it does;
- ``close``: the same wait, and rank 0's thread closes the recorder while its buckets are in
  flight (the final flush writes them as never completed; their late completions touch
  nothing);
- ``cap``: ``buffer_ops=1000`` and the writer's service held off for 700 steps (2 buckets
  each): at most 1000 records are kept, the others are counted as dropped; a child forked
  then lists none of them;
- ``raise``: the next bucket recorded without a Python call fails at its issue on both ranks
  (the C++ module's ``_test_fail_issues``: a c10::Error where the all-reduce is issued, as an
  issue that throws raises; gloo has no way to make it throw for real): the user's
  ``backward()`` gets the error, the record is written once as a raising call's row, and
  nothing stays listed (the step's bucket issued before it completes as usual).

Writes OUT.rank<r> (JSON)."""

import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import commtrace
from commtrace.capture import recorder as R


CAP_STEPS = 700


def main():
    out, mode = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kw = {"flush_interval": 3600}
    if mode == "cap":
        kw["buffer_ops"] = 1000
    commtrace.enable(out + ".trace", **kw)
    rec = R.get_recorder()
    rec.auto_flush = False
    torch.manual_seed(0)
    # ~290k parameters: three gradient buckets of at most 0.4 MB
    model = nn.Sequential(nn.Linear(32, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    ddp = DDP(model, bucket_cap_mb=0.4)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))

    def step():
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(3):   # DDP rebuilds its buckets after the first step
        step()
    cf = R._cfast
    n = cf.ddp_direct_counts()[0]
    step()
    per_step = cf.ddp_direct_counts()[0] - n   # buckets per step (2 here)
    dist.barrier()
    rec._service(False)
    rec.flush()
    res = {"kind": ddp.__dict__.get("_commtrace_hook_kind"), "per_step": per_step,
           "counts0": list(cf.ddp_direct_counts())}
    if mode in ("inflight", "close"):
        seen = {}
        if rank == 0:
            def look():
                time.sleep(0.8)   # rank 0 is inside backward(), its buckets waiting for rank 1
                from commtrace.capture.watchdog import _Watchdog
                ids = rec.inflight_ids()
                rows = [r for r in rec.blocking_rows() if r[R.I_API] == "ddp_comm_hook"]
                seen["ids"] = ids
                seen["rows"] = [{"op_id": r[R.I_OP_ID], "t_end": r[R.I_T_END],
                                 "t_enq": r[R.I_T_ENQ], "t_ret": r[R.I_T_RET],
                                 "detail": r[R.I_DETAIL], "seq": r[R.I_SEQ]} for r in rows]
                try:
                    hung = _Watchdog.hung_ops(type("W", (), {"rec": rec})(), 0)
                    seen["hung"] = [h[0] for h in hung]
                except Exception as e:   # (reported: the test asserts on it)
                    seen["hung"] = repr(e)
                if mode == "inflight":
                    rec._service(False)   # in flight: not written
                    seen["listed_after_service"] = len(cf.ddp_inflight(True))
                    rec.flush()           # a part and _inflight.json
                    from commtrace.format import schema as S
                    from commtrace.format import writer as W
                    with open(os.path.join(W.rank_dir(rec.run_dir, rec.rank),
                                           S.INFLIGHT_NAME)) as f:
                        seen["inflight_json"] = [o.get("op_id") for o in json.load(f)["ops"]
                                                 if o.get("api") == "ddp_comm_hook"]
                else:
                    commtrace.disable()   # the final flush: written as never completed
                    seen["closed"] = True
            t = threading.Thread(target=look)
            t.start()
        else:
            time.sleep(2.5)
        step()
        if rank == 0:
            t.join()
        dist.barrier()
        time.sleep(0.2)   # the last completions (any late one on a closed recorder)
        res["seen"] = seen
        res["after"] = list(cf.ddp_direct_counts())
        if mode == "inflight":
            rec._service(False)
            res["listed_end"] = len(cf.ddp_inflight(True))
            res["end"] = list(cf.ddp_direct_counts())
    elif mode == "cap":
        service = rec._service
        rec._service = lambda final: service(final) if final else None
        try:
            for _ in range(CAP_STEPS):
                step()
            dist.barrier()
            res["held"] = list(cf.ddp_direct_counts())
            res["dropped_rows"] = rec._dropped
            # a forked child does not keep its parent's records (exit status: records listed)
            pid = os.fork()
            if pid == 0:
                os._exit(min(100, cf.ddp_direct_counts()[3] + len(cf.ddp_inflight())))
            res["child_listed"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            res["parent_listed"] = cf.ddp_direct_counts()[3]
        finally:
            rec._service = service
        rec.flush()   # the other rows first (the queue's own cap)
        service(False)
        res["after"] = list(cf.ddp_direct_counts())
    elif mode == "raise":
        from commtrace.capture import accel

        mod = accel.load()
        before = list(cf.ddp_direct_route_counts())
        res["prev"] = mod._test_fail_issues(1)
        try:
            step()
            res["error"] = None
        except RuntimeError as e:
            res["error"] = str(e)
        res["left"] = mod._test_fail_issues(0)
        res["route"] = [a - b for a, b in zip(cf.ddp_direct_route_counts(), before)]
        # a bucket the step issued before the failing one is still in flight: gloo's barrier
        # waits for it, and its completion stamp lands on gloo's thread
        dist.barrier()
        deadline = time.time() + 10
        while cf.ddp_inflight(True) and time.time() < deadline:
            time.sleep(0.01)
        rec._service(False)
        res["after"] = list(cf.ddp_direct_counts())
        res["listed"] = len(cf.ddp_inflight(True))
        res["inflight_ids"] = list(rec.inflight_ids())
    if R.get_recorder() is not None:
        commtrace.disable()
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(res, f)
    dist.barrier()
    del ddp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
