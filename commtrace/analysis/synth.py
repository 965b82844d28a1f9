"""Synthetic runs in the public trace format, with planted anomalies (`commtrace synth`).

The generator simulates an SPMD training loop on every rank at once (numpy over ranks, one
Python step per op position), so 512 ranks x 20,000 ops take seconds. Each step of the loop
issues, per rank::

    mark(step)  broadcast(root 0)  all_gather  3 x all_reduce(async, DDP-like buckets)
    reduce_scatter  wait(buckets)  isend(r -> r+1)  irecv(r-1 -> r)  wait(p2p)  all_reduce(loss)

Timing model (so that the analysis has known answers):

* a rank enters an op after a compute gap (``GAP_NS`` plus up to ``JITTER_NS`` of jitter; a
  straggler adds its delay before every op);
* an N x N collective starts when its last member arrived and the group's previous collective
  finished, and lasts ``t_comm = LATENCY_NS + S / ALGBW``; a blocking call returns at its end;
* a broadcast behaves alike (gloo's root waits for its receivers); its non-roots' wait is the
  late-broadcast pattern, min(enter_root, leave_r) - enter_r;
* a send and its recv finish ``t_comm`` after both were posted;
* async ops return at once and are waited later (``t_wait``/``t_wait_end``).

Planted anomalies:

* ``straggler=[(rank, delay_ns)]``: the rank's compute takes `delay_ns` longer before the first
  collective after each synchronisation point, so it arrives `delay_ns` late at every
  collective (its p2p ops stay on time);
* ``skip=(rank, seq)``: the rank never issues collective `seq` of group "0" (it is stuck
  elsewhere); the others block in it until the job is killed. Half of them have it as a row with
  no completion, the other half only in ``_inflight.json``;
* ``mismatch=[(rank, seq)]``: the rank's collective `seq` of group "0" has twice the count;
* ``late_send=[(rank, delay_ns)]``: the rank posts its ring isend `delay_ns` late (late sender
  for its successor);
* ``skew=[(rank, ns)]``: the rank's clock runs `ns` ahead; its measured offset is recorded in
  the metadata (unless ``record_offsets=False``);
* ``hazards=True``: on rank 0, in step 1: a ``.item()`` on a pending all_reduce
  (use_before_wait), a synchronize() with two async ops in flight (sync_while_inflight), a
  synchronize() right after wait() (redundant_sync) and an async all_reduce waited at once
  (wait_immediately);
* ``init_stall_ns``: the first collective of the group and the first op of each peer pair block
  the host that much longer (lazy communicator set-up, first_op_init_stall).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..format import schema as S
from ..format import writer as W

GAP_NS = 200_000
JITTER_NS = 40_000
STEP_GAP_NS = 3_000_000
#: Work between an async op's issue (or the previous wait) and its wait().
WAIT_GAP_NS = 300_000
LATENCY_NS = 20_000
#: Algorithmic bandwidth of the simulated links, bytes per ns (= GB/s).
ALGBW = 5.0
START_NS = 1_760_000_000_000_000_000
PG = "0"

# Template of one step: (op, async, bytes, site). "wait:..." entries are wait points.
_MB = 1 << 20
TEMPLATE = [
    ("broadcast", False, 64 * 1024, "train.py:31"),
    ("all_gather", False, 1 * _MB, "model.py:57"),
    ("all_reduce", True, 25 * _MB, "ddp.py:120"),
    ("all_reduce", True, 25 * _MB, "ddp.py:120"),
    ("all_reduce", True, 8 * _MB, "ddp.py:120"),
    ("reduce_scatter", False, 4 * _MB, "model.py:64"),
    ("wait:buckets", None, 0, "ddp.py:131"),
    ("send", True, 1 * _MB, "pipe.py:12"),
    ("recv", True, 1 * _MB, "pipe.py:13"),
    ("wait:p2p", None, 0, "pipe.py:15"),
    ("all_reduce", False, 4, "train.py:77"),
]
API = {"broadcast": "broadcast", "all_gather": "all_gather_into_tensor", "all_reduce": "all_reduce",
       "reduce_scatter": "reduce_scatter_tensor", "send": "isend", "recv": "irecv"}
OPS_PER_STEP = sum(1 for t in TEMPLATE if not t[0].startswith("wait:"))


@dataclass
class SynthResult:
    path: str
    world_size: int
    ops_per_rank: int
    rows: int
    #: (rank, op_id) -> op of planted hazards etc., for tests
    planted: dict


def parse_duration_ns(text: str) -> int:
    """'20ms', '500us', '1.5s', '300ns' or a bare number of ns -> int ns."""
    t = str(text).strip().lower()
    for unit, mult in (("ns", 1), ("us", 1_000), ("µs", 1_000), ("ms", 1_000_000), ("s", 1_000_000_000)):
        if t.endswith(unit):
            return int(round(float(t[: -len(unit)]) * mult))
    return int(round(float(t)))


def synth_run(out: str, ranks: int = 4, ops: int = 1000, *, straggler=(), skip=None, mismatch=(),
              skew=(), hazards: bool = False, init_stall_ns: int = 0, record_offsets: bool = True,
              parts_per_rank: int = 1, seed: int = 0, overwrite: bool = True, late_send=(),
              command: str | None = None) -> SynthResult:
    """Write a synthetic run of `ranks` ranks x `ops` ops to directory `out` (see module doc)."""
    n = int(ranks)
    if n < 1 or ops < 1:
        raise ValueError("ranks and ops must be >= 1")
    rng = np.random.default_rng(seed)
    if os.path.exists(out) and overwrite:
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)

    delay = np.zeros(n, np.int64)
    for r, d in straggler:
        delay[int(r)] += int(d)
    lsend = np.zeros(n, np.int64)
    for r, d in late_send:
        lsend[int(r)] += int(d)
    skew_ns = np.zeros(n, np.int64)
    for r, d in skew:
        skew_ns[int(r)] += int(d)
    mism = {int(s): int(r) for r, s in mismatch}
    skip_rank, skip_seq = (int(skip[0]), int(skip[1])) if skip else (None, None)

    # Op positions (no wait points) and their template index.
    tmpl = [t for t in TEMPLATE if n > 1 or t[0] not in ("send", "recv")]
    plan = []  # (template index, step)
    step = 0
    while len([p for p in plan if not tmpl[p[0]][0].startswith("wait:")]) < ops:
        for ti in range(len(tmpl)):
            plan.append((ti, step))
        step += 1
    # Trim to exactly `ops` ops, keeping wait points that come before the last op.
    k = 0
    trimmed = []
    for ti, st in plan:
        if tmpl[ti][0].startswith("wait:"):
            trimmed.append((ti, st))
            continue
        if k == ops:
            break
        trimmed.append((ti, st))
        k += 1
    plan = trimmed
    M = ops

    NULL = np.iinfo(np.int64).min
    t_enq = np.full((M, n), NULL, np.int64)
    t_ret = np.full((M, n), NULL, np.int64)
    t_end = np.full((M, n), NULL, np.int64)
    t_wait = np.full((M, n), NULL, np.int64)
    t_wend = np.full((M, n), NULL, np.int64)
    issued = np.ones((M, n), bool)
    in_snapshot = np.zeros((M, n), bool)
    count = np.zeros((M, n), np.int64)
    tmpl_idx = np.zeros(M, np.int64)
    step_of = np.zeros(M, np.int64)
    seq = np.zeros(M, np.int64)
    first = np.zeros(M, bool)
    marks = []  # (step, t per rank)
    extra = []  # extra rows: dicts with per-row values (rank 0 hazards)
    planted: dict = {}

    cur = np.full(n, START_NS, np.int64)
    comm_free = START_NS
    coll_seq = 0
    p2p_seq = 0
    pending_async: list[int] = []  # op indices awaiting the next "wait:buckets"
    pending_p2p: list[int] = []
    pending_send = None
    alive = np.ones(n, bool)
    stopped = False
    last_step = -1
    i = 0
    ar = np.arange(n)
    hz_step = 1 if hazards else -1
    hz_bucket_ops: list[int] = []
    synced = True

    for ti, st in plan:
        name, is_async, nbytes, site = tmpl[ti]
        if stopped:
            break
        if st != last_step:
            cur = cur + STEP_GAP_NS
            marks.append((st, cur.copy()))
            last_step = st
        if name.startswith("wait:"):
            waitlist = pending_async if name == "wait:buckets" else pending_p2p
            imm = planted.get("wait_immediately_ops", ())
            for j in waitlist:
                who = np.ones(n, bool)
                if j in imm:
                    who[0] = False  # already waited right after the issue
                tw = cur + WAIT_GAP_NS + rng.integers(0, 5_000, n)
                t_wait[j] = np.where(who, tw, t_wait[j])
                t_wend[j] = np.where(who, np.maximum(tw, t_end[j]) + 2_000, t_wend[j])
                cur = np.where(who, t_wend[j], cur)
            if name == "wait:buckets" and st == hz_step:
                # synchronize() right after the last wait(): redundant.
                t0 = int(cur[0]) + 3_000
                extra.append(dict(kind=S.KIND_SYNC, rank=0, api="torch.cuda.synchronize",
                                  t_enqueue_ns=t0, t_return_ns=t0 + 30_000, inflight=0,
                                  inflight_ids=[], site="train.py:95"))
                planted["redundant_sync"] = t0
                cur[0] = t0 + 30_000
            waitlist.clear()
            synced = synced or name == "wait:buckets"
            continue

        # A straggler's delay lands once per synchronisation point (after a blocking op or a
        # wait), so that it arrives `delay` late at every collective rather than accumulating.
        is_coll = name not in ("send", "recv")
        gap = GAP_NS + rng.integers(0, JITTER_NS, n) + (delay if synced and is_coll else 0)
        if name == "send":
            gap = gap + lsend
        if is_coll:
            synced = False
        enter = cur + gap
        cnt = np.full(n, max(nbytes // 4, 1), np.int64)
        t_enq[i] = enter
        tmpl_idx[i] = ti
        step_of[i] = st
        if name in ("send", "recv"):
            p2p_seq += (name == "send")
            seq[i] = p2p_seq
            first[i] = p2p_seq == 1
            count[i] = cnt
            tcomm = LATENCY_NS + int(nbytes / ALGBW)
            t_ret[i] = enter + 8_000
            if first[i] and init_stall_ns:
                t_ret[i] += init_stall_ns
            cur = t_ret[i].copy()
            if name == "send":
                pending_send = i
            else:
                s = pending_send
                match = np.maximum(t_enq[i], np.roll(t_enq[s], 1))  # recv on d matches send of d-1
                t_end[i] = match + tcomm + rng.integers(0, 3_000, n)
                t_end[s] = np.roll(match, -1) + tcomm + rng.integers(0, 3_000, n)
                pending_p2p.extend([s, i])
            i += 1
            continue

        coll_seq += 1
        seq[i] = coll_seq
        first[i] = coll_seq == 1
        if coll_seq in mism:
            cnt[mism[coll_seq]] *= 2
            planted.setdefault("mismatch", []).append((mism[coll_seq], coll_seq, name))
        count[i] = cnt
        S_bytes = nbytes * n if name == "all_gather" else nbytes
        tcomm = LATENCY_NS + int(S_bytes / ALGBW)
        if skip_seq is not None and coll_seq == skip_seq:
            # The culprit never arrives: the others block here until the job is killed.
            issued[i, skip_rank] = False
            others = ar[ar != skip_rank]
            in_snapshot[i, others[len(others) // 2:]] = True
            t_ret[i] = NULL
            planted["skip"] = (skip_rank, coll_seq, name)
            i += 1
            stopped = True
            break
        # Every collective, broadcast included (gloo's root waits for its receivers), ends
        # t_comm after the last member arrived and the group's previous collective ended.
        start = max(int(enter.max()), comm_free)
        end = np.full(n, start + tcomm, np.int64)
        end = end + rng.integers(0, 3_000, n)
        comm_free = int(end.max())
        t_end[i] = end
        if is_async:
            t_ret[i] = enter + 8_000
            cur = t_ret[i].copy()
            pending_async.append(i)
            if st == hz_step:
                hz_bucket_ops.append(i)
                if len(hz_bucket_ops) == 1:
                    # .item() on this bucket's tensor before wait() on rank 0.
                    t0 = int(cur[0]) + 2_000
                    extra.append(dict(kind=S.KIND_HAZARD, rank=0, api="Tensor.item",
                                      detail=json.dumps({"method": "item"}), ref_op_id=i,
                                      t_enqueue_ns=t0, t_return_ns=t0 + 1_000, site="train.py:88"))
                    planted["use_before_wait"] = i
                    cur[0] = t0 + 1_000
                elif len(hz_bucket_ops) == 2:
                    t0 = int(cur[0]) + 2_000
                    extra.append(dict(kind=S.KIND_SYNC, rank=0, api="torch.cuda.synchronize",
                                      t_enqueue_ns=t0, t_return_ns=t0 + 40_000, inflight=2,
                                      inflight_ids=list(hz_bucket_ops), site="train.py:91"))
                    planted["sync_while_inflight"] = t0
                    cur[0] = t0 + 40_000
                elif len(hz_bucket_ops) == 3:
                    # Waited at once: nothing between issue and wait().
                    tw = int(cur[0]) + 2_000
                    t_wait[i, 0] = tw
                    t_wend[i, 0] = max(tw, int(t_end[i, 0])) + 2_000
                    cur[0] = t_wend[i, 0]
                    planted["wait_immediately"] = i
                    planted["wait_immediately_ops"] = (i,)
        else:
            t_ret[i] = end + 3_000
            synced = True
            if first[i] and init_stall_ns:
                t_ret[i] += init_stall_ns
            cur = t_ret[i].copy()
        i += 1

    M_used = i
    if skip_seq is not None and "skip" not in planted:
        raise ValueError(f"--skip seq {skip_seq} is beyond the {coll_seq} collectives of the run")

    # Per-rank offsets: the rank's clock minus rank 0's; estimated within a few us.
    est_err = rng.integers(-3_000, 3_000, n)
    est_err[0] = 0
    offsets = skew_ns - skew_ns[0] + est_err
    offsets[0] = 0

    def strings(idx: np.ndarray, values: list[str]) -> pa.Array:
        return pa.DictionaryArray.from_arrays(pa.array(idx, pa.int32()),
                                              pa.array(values, pa.string())).cast(pa.string())

    sites = [t[3] for t in tmpl]
    ops_names = [t[0] for t in tmpl]
    apis = [API.get(t[0], t[0]) for t in tmpl]
    asyncs = np.array([bool(t[1]) for t in tmpl])
    is_send_t = np.array([t[0] == "send" for t in tmpl])
    is_p2p_t = np.array([t[0] in ("send", "recv") for t in tmpl])
    is_bcast_t = np.array([t[0] == "broadcast" for t in tmpl])
    is_ag_t = np.array([t[0] == "all_gather" for t in tmpl])
    is_rs_t = np.array([t[0] == "reduce_scatter" for t in tmpl])
    rows_total = 0
    pg_ranks = {PG: list(range(n))}
    mark_steps = np.array([m[0] for m in marks], np.int64)
    mark_t = np.array([m[1] for m in marks], np.int64).reshape(len(marks), n)
    for r in range(n):
        sel = np.nonzero(issued[:M_used, r] & ~in_snapshot[:M_used, r])[0]
        ti = tmpl_idx[sel]
        is_p2p = is_p2p_t[ti]
        peer = np.where(is_send_t[ti], (r + 1) % n, (r - 1) % n)
        sk = int(skew_ns[r])

        def tcol(a):
            v = a[sel, r]
            mask = v == NULL
            return pa.array(np.where(mask, 0, v + sk), pa.int64(), mask=mask)

        cnt = count[sel, r]
        byts = cnt * 4
        out_b = np.where(is_ag_t[ti], byts * n, np.where(is_rs_t[ti], byts // n, byts))
        nn = len(sel)
        cols = {
            "kind": strings(np.zeros(nn, np.int32), ["op"]),
            "rank": pa.array(np.full(nn, r, np.int32)),
            "pg": strings(np.zeros(nn, np.int32), [PG]),
            "pg_size": pa.array(np.full(nn, n, np.int32)),
            "seq": pa.array(seq[sel]),
            "op": strings(ti, ops_names),
            "api": strings(ti, apis),
            "async_op": pa.array(asyncs[ti]),
            "backend": strings(np.zeros(nn, np.int32), ["gloo"]),
            "device": strings(np.zeros(nn, np.int32), ["cpu"]),
            "dtype": strings(np.zeros(nn, np.int32), ["float32"]),
            "count": pa.array(cnt),
            "bytes": pa.array(byts),
            "out_bytes": pa.array(out_b),
            "peer": pa.array(peer.astype(np.int32), mask=~is_p2p),
            "root": pa.array(np.zeros(nn, np.int32), mask=~is_bcast_t[ti]),
            "t_enqueue_ns": tcol(t_enq), "t_return_ns": tcol(t_ret),
            "t_start_ns": pa.nulls(nn, pa.int64()),
            "t_end_ns": tcol(t_end), "t_wait_ns": tcol(t_wait), "t_wait_end_ns": tcol(t_wend),
            "step": pa.array(step_of[sel]),
            "site": strings(ti, sites),
            "error": pa.nulls(nn, pa.string()),
            "op_id": pa.array(sel.astype(np.int64)),
            "ref_op_id": pa.nulls(nn, pa.int64()),
            "inflight": pa.nulls(nn, pa.int32()),
            "inflight_ids": pa.nulls(nn, pa.list_(pa.int64())),
            "first_on_pg": pa.array(first[sel]),
            "stream_wait_ns": pa.nulls(nn, pa.int64()),
            "thread": pa.array(np.full(nn, 140000000 + r, np.int64)),
            "detail": pa.nulls(nn, pa.string()),
        }
        tables = [pa.Table.from_arrays([cols[f.name] if f.name in cols else pa.nulls(nn, f.type)
                                        for f in S.SCHEMA], schema=S.SCHEMA)]
        # Step markers (the culprit of a skip stops with the others).
        nm = len(mark_steps)
        if nm:
            mt = mark_t[:, r] + sk
            mcols = {f.name: pa.nulls(nm, f.type) for f in S.SCHEMA}
            mcols.update({
                "kind": strings(np.zeros(nm, np.int32), [S.KIND_MARK]),
                "rank": pa.array(np.full(nm, r, np.int32)), "step": pa.array(mark_steps),
                "t_enqueue_ns": pa.array(mt), "t_return_ns": pa.array(mt),
                "api": strings(np.zeros(nm, np.int32), ["commtrace.mark_step"]),
                "site": strings(np.zeros(nm, np.int32), ["train.py:20"]),
                "thread": pa.array(np.full(nm, 140000000 + r, np.int64)),
            })
            tables.append(pa.Table.from_arrays([mcols[f.name] for f in S.SCHEMA], schema=S.SCHEMA))
        ex_rows = {f.name: [] for f in S.SCHEMA}
        for row in extra:
            if row["rank"] != r:
                continue
            row = dict(row)
            row["t_enqueue_ns"] += sk
            row["t_return_ns"] += sk
            row.setdefault("step", hz_step)
            row.setdefault("thread", 140000000 + r)
            for f in S.SCHEMA:
                ex_rows[f.name].append(row.get(f.name))
        if ex_rows["kind"]:
            tables.append(W.rows_to_table(ex_rows))
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        meta = {"rank": r, "world_size": n, "host": f"synth-node{r // 8}", "pid": 10_000 + r,
                "backend": "gloo", "torch_version": "synthetic", "pg_ranks": pg_ranks,
                "commtrace_version": "synth", "dropped_rows": 0}
        if record_offsets:
            meta.update(clock_offset_ns=int(offsets[r]), clock_offset_method="synth",
                        clock_rtt_ns=10_000)
        nparts = max(1, int(parts_per_rank))
        bounds = np.linspace(0, table.num_rows, nparts + 1).astype(int)
        for p in range(nparts):
            W.write_part(out, r, table.slice(bounds[p], bounds[p + 1] - bounds[p]), meta,
                         pid=10_000 + r, index=p)
        rows_total += table.num_rows
        # _inflight.json for ranks blocked in the skipped collective.
        snap_sel = np.nonzero(in_snapshot[:M_used, r])[0]
        if len(snap_sel):
            ops_l = []
            for j in snap_sel:
                k = tmpl_idx[j]
                ops_l.append({"op_id": int(j), "kind": "op", "pg": PG, "pg_size": n,
                              "seq": int(seq[j]), "op": ops_names[k], "api": apis[k],
                              "async_op": bool(asyncs[k]), "dtype": "float32",
                              "count": int(count[j, r]), "bytes": int(count[j, r]) * 4,
                              "t_enqueue_ns": int(t_enq[j, r]) + sk, "t_return_ns": None,
                              "step": int(step_of[j]), "site": sites[k], "backend": "gloo",
                              "device": "cpu"})
            snap = {"rank": r, "t_ns": int(t_enq[snap_sel[-1], r]) + sk + 5_000_000, "ops": ops_l}
            W.atomic_write_text(os.path.join(W.rank_dir(out, r), S.INFLIGHT_NAME), json.dumps(snap))
            rows_total += len(ops_l)
    W.write_manifest(out, {"command": command or f"commtrace synth {out} --ranks {n} --ops {ops}",
                           "world_size": n, "synthetic": True, "commtrace_version": "synth",
                           "start_ns": START_NS})
    return SynthResult(out, n, M_used, rows_total, planted)


# ---------------------------------------------------------------------------------------------
# Layouts with planted delays and known answers (delay analysis, critical path, what-if)
# ---------------------------------------------------------------------------------------------
#: Host time after a blocking op completed, before the call returns; and an isend's issue.
LAYOUT_RET_NS = 3_000
LAYOUT_ISSUE_NS = 8_000


def layout_tcomm_ns(nbytes: int) -> int:
    """Transfer time of the layouts' collectives and transfers: LATENCY_NS + S / ALGBW."""
    return LATENCY_NS + int(nbytes / ALGBW)


def synth_layout(out: str, layout: str = "tpdp", *, tp: int = 2, dp: int = 2, stages: int = 4,
                 steps: int = 8, microbatches: int = 4, delays=(), gap_ns: int = 1_000_000,
                 jitter_ns: int = 0, bytes_tp: int = 4 * _MB, bytes_dp: int = 16 * _MB,
                 bytes_p2p: int = 1 * _MB, seed: int = 0, overwrite: bool = True,
                 command: str | None = None) -> SynthResult:
    """A run with planted delays on a 2-group layout or a pipeline, with known answers.

    ``layout="tpdp"``: ``tp * dp`` ranks; rank r is in TP group ``tp{r // tp}`` and DP group
    ``dp{r % tp}``. Each step: `gap_ns` of work, a blocking all_reduce on the TP group
    (`bytes_tp`), `gap_ns` of work, a blocking all_reduce on the DP group (`bytes_dp`).

    ``layout="pipeline"``: ``stages`` ranks on one group; per step `microbatches` times: stage
    s > 0 receives (blocking) from s - 1, works `gap_ns`, and stage s < last sends (isend,
    never waited) to s + 1. Stage 0's work also covers the time the others spend receiving, and
    the last stage's the others' issue of the send, so that the pipeline is balanced: no stage
    waits after the first microbatch.

    Timing as in :func:`synth_run`: a collective (a transfer) starts when the last member
    arrived (both sides posted) and the group's previous collective ended, and takes
    :func:`layout_tcomm_ns`; a blocking call returns LAYOUT_RET_NS after its end.

    ``delays``: ``(rank, step, delay_ns)`` or ``(rank, step, delay_ns, where)``: the rank works
    `delay_ns` longer in that step, before its TP all_reduce (``where="tp"``, default) or its
    DP all_reduce (``"dp"``); in a pipeline before its send of microbatch ``where`` (default 0;
    the last stage: before the end of that microbatch's work).
    """
    rng = np.random.default_rng(seed)
    if os.path.exists(out) and overwrite:
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    if layout not in ("tpdp", "pipeline"):
        raise ValueError(f"layout must be 'tpdp' or 'pipeline', got {layout!r}")
    n = tp * dp if layout == "tpdp" else int(stages)
    if n < 2 or steps < 1:
        raise ValueError("a layout needs at least 2 ranks and 1 step")
    plan: dict = {}
    for d in delays:
        r, st, ns = int(d[0]), int(d[1]), int(d[2])
        where = d[3] if len(d) > 3 else ("tp" if layout == "tpdp" else 0)
        if not 0 <= r < n:
            raise ValueError(f"delay rank {r} is not in 0..{n - 1}")
        plan[(r, st, where)] = plan.get((r, st, where), 0) + ns
    rows = {r: {k: [] for k in ("kind", "op", "pg", "pg_size", "seq", "peer", "async_op", "bytes", "count",
                                "t_enqueue_ns", "t_return_ns", "t_end_ns", "step", "site", "op_id", "api")}
            for r in range(n)}
    seqs: dict = {}
    op_ids = [0] * n

    def add(r, **kw):
        d = rows[r]
        kw.setdefault("kind", "op")
        kw["op_id"] = op_ids[r]
        op_ids[r] += 1
        for k in d:
            d[k].append(kw.get(k))

    def jit():
        return int(rng.integers(0, jitter_ns)) if jitter_ns > 0 else 0

    cur = [START_NS] * n
    pg_members: dict = {}
    planted = {"layout": layout, "delays": [(int(d[0]), int(d[1]), int(d[2])) for d in delays]}
    if layout == "tpdp":
        tp_groups = [[g * tp + i for i in range(tp)] for g in range(dp)]
        dp_groups = [[j * tp + i for j in range(dp)] for i in range(tp)]
        for g, mem in enumerate(tp_groups):
            pg_members[f"tp{g}"] = mem
        for i, mem in enumerate(dp_groups):
            pg_members[f"dp{i}"] = mem
        free = {pg: START_NS for pg in pg_members}
        for st in range(steps):
            for r in range(n):
                add(r, kind="mark", step=st, t_enqueue_ns=cur[r], t_return_ns=cur[r], site="train.py:20")
            for phase, groups, nbytes, site, prefix in (("tp", tp_groups, bytes_tp, "model.py:40", "tp"),
                                                        ("dp", dp_groups, bytes_dp, "train.py:88", "dp")):
                for gi, mem in enumerate(groups):
                    pg = f"{prefix}{gi}"
                    enter = {r: cur[r] + gap_ns + jit() + plan.get((r, st, phase), 0) for r in mem}
                    t0 = max(max(enter.values()), free[pg])
                    end = t0 + layout_tcomm_ns(nbytes)
                    free[pg] = end
                    seqs[pg] = seqs.get(pg, 0) + 1
                    for r in mem:
                        add(r, op="all_reduce", api="all_reduce", pg=pg, pg_size=len(mem), seq=seqs[pg],
                            async_op=False, bytes=nbytes, count=nbytes // 4, t_enqueue_ns=enter[r],
                            t_return_ns=end + LAYOUT_RET_NS, t_end_ns=end, step=st, site=site)
                        cur[r] = end + LAYOUT_RET_NS
    else:
        pg_members["0"] = list(range(n))
        tc = layout_tcomm_ns(bytes_p2p)
        last = n - 1
        send_idx: dict = {}
        for st in range(steps):
            for r in range(n):
                add(r, kind="mark", step=st, t_enqueue_ns=cur[r], t_return_ns=cur[r], site="train.py:20")
            for mb in range(microbatches):
                send_enter = {}
                for r in range(n):
                    if r > 0:
                        # blocking recv of this microbatch from r - 1
                        t_in = cur[r]
                        s_enter = send_enter[r - 1]
                        t0 = max(t_in, s_enter)
                        end = t0 + tc
                        add(r, op="recv", api="recv", pg="0", pg_size=n, peer=r - 1, async_op=False,
                            bytes=bytes_p2p, count=bytes_p2p // 4, t_enqueue_ns=t_in,
                            t_return_ns=end + LAYOUT_RET_NS, t_end_ns=end, step=st, site="pipe.py:13")
                        rows[r - 1]["t_end_ns"][send_idx[r - 1]] = end
                        cur[r] = end + LAYOUT_RET_NS
                    work = gap_ns + jit() + plan.get((r, st, mb), 0)
                    if r == 0:
                        work += tc + LAYOUT_RET_NS
                    if r == last:
                        work += LAYOUT_ISSUE_NS
                    cur[r] += work
                    if r < last:
                        send_enter[r] = cur[r]
                        add(r, op="send", api="isend", pg="0", pg_size=n, peer=r + 1, async_op=True,
                            bytes=bytes_p2p, count=bytes_p2p // 4, t_enqueue_ns=cur[r],
                            t_return_ns=cur[r] + LAYOUT_ISSUE_NS, t_end_ns=None, step=st, site="pipe.py:12")
                        send_idx[r] = len(rows[r]["op"]) - 1
                        cur[r] += LAYOUT_ISSUE_NS
    rows_total = 0
    for r in range(n):
        d = dict(rows[r])
        nn = len(d["kind"])
        d["rank"] = [r] * nn
        d["backend"] = ["gloo"] * nn
        d["device"] = ["cpu"] * nn
        d["dtype"] = [None if k == "mark" else "float32" for k in d["kind"]]
        d["out_bytes"] = d["bytes"]
        d["thread"] = [140000000 + r] * nn
        table = W.rows_to_table(d)
        meta = {"rank": r, "world_size": n, "host": "synth-node0", "pid": 10_000 + r, "backend": "gloo",
                "torch_version": "synthetic", "pg_ranks": pg_members, "commtrace_version": "synth",
                "dropped_rows": 0, "clock_offset_ns": 0, "clock_offset_method": "synth", "clock_rtt_ns": 1_000}
        W.write_part(out, r, table, meta, pid=10_000 + r, index=0)
        rows_total += nn
    W.write_manifest(out, {"command": command or f"commtrace synth {out} --layout {layout}",
                           "world_size": n, "synthetic": True, "commtrace_version": "synth",
                           "start_ns": START_NS})
    return SynthResult(out, n, max(op_ids), rows_total, planted)
