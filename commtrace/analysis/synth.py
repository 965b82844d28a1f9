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


#: Op positions x ranks simulated per block: bounds the generator's memory (about 100 bytes per
#: element at peak) whatever the size of the run.
BLOCK_ELEMENTS = 1_000_000
#: Rows of the whole run per group of ranks read back from the spool at once.
SPOOL_GROUP_ROWS = 250_000


def synth_run(out: str, ranks: int = 4, ops: int = 1000, *, straggler=(), skip=None, mismatch=(),
              skew=(), hazards: bool = False, init_stall_ns: int = 0, record_offsets: bool = True,
              parts_per_rank: int = 1, seed: int = 0, overwrite: bool = True, late_send=(),
              command: str | None = None, block_ops: int | None = None) -> SynthResult:
    """Write a synthetic run of `ranks` ranks x `ops` ops to directory `out` (see module doc).

    The loop is simulated in blocks of whole steps (about BLOCK_ELEMENTS op positions x ranks,
    or `block_ops` op positions); each block's rows are spooled per rank to a temporary Arrow
    file and every rank's part is written from the spool at the end, so memory stays bounded
    (2,048 ranks x 50,000 ops: 463 MB peak RSS, docs/performance.md)."""
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

    # Op positions (no wait points) and their template index: whole steps, trimmed to `ops`
    # ops, keeping wait points that come before the last op.
    tmpl = [t for t in TEMPLATE if n > 1 or t[0] not in ("send", "recv")]
    per_step = sum(1 for t in tmpl if not t[0].startswith("wait:"))
    plan = []  # (template index, step)
    k = 0
    for st in range((ops + per_step - 1) // per_step):
        for ti in range(len(tmpl)):
            if not tmpl[ti][0].startswith("wait:"):
                if k == ops:
                    break
                k += 1
            plan.append((ti, st))
    # Blocks of whole steps (a wait point refers to ops of its own step).
    bops = max(per_step, int(block_ops) if block_ops else BLOCK_ELEMENTS // n)
    blocks, cur_b, nb_ops, last_st = [], [], 0, None
    for ti, st in plan:
        if st != last_st and nb_ops >= bops:
            blocks.append(cur_b)
            cur_b, nb_ops = [], 0
        last_st = st
        cur_b.append((ti, st))
        nb_ops += not tmpl[ti][0].startswith("wait:")
    if cur_b:
        blocks.append(cur_b)

    NULL = np.iinfo(np.int64).min
    extra = []  # extra rows: dicts with per-row values (rank 0 hazards)
    planted: dict = {}
    cur = np.full(n, START_NS, np.int64)
    comm_free = START_NS
    coll_seq = 0
    p2p_seq = 0
    pending_async: list[int] = []  # op indices awaiting the next "wait:buckets"
    pending_p2p: list[int] = []
    pending_send = None
    stopped = False
    last_step = -1
    i = 0  # global op index (= op_id)
    ar = np.arange(n)
    hz_step = 1 if hazards else -1
    hz_bucket_ops: list[int] = []
    synced = True
    spool = _Spool(out, n, len(blocks), group=max(1, SPOOL_GROUP_ROWS // max(1, int(ops * 1.15))))
    snapshots: dict[int, list] = {}

    for block in blocks:
        if stopped:
            break
        B = sum(1 for ti, _ in block if not tmpl[ti][0].startswith("wait:"))
        base = i
        t_enq = np.full((B, n), NULL, np.int64)
        t_ret = np.full((B, n), NULL, np.int64)
        t_end = np.full((B, n), NULL, np.int64)
        t_wait = np.full((B, n), NULL, np.int64)
        t_wend = np.full((B, n), NULL, np.int64)
        issued = np.ones((B, n), bool)
        in_snapshot = np.zeros((B, n), bool)
        count = np.zeros((B, n), np.int64)
        tmpl_idx = np.zeros(B, np.int64)
        step_of = np.zeros(B, np.int64)
        seq = np.zeros(B, np.int64)
        first = np.zeros(B, bool)
        marks = []  # (step, t per rank)

        for ti, st in block:
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
                    lj = j - base
                    who = np.ones(n, bool)
                    if j in imm:
                        who[0] = False  # already waited right after the issue
                    tw = cur + WAIT_GAP_NS + rng.integers(0, 5_000, n)
                    t_wait[lj] = np.where(who, tw, t_wait[lj])
                    t_wend[lj] = np.where(who, np.maximum(tw, t_end[lj]) + 2_000, t_wend[lj])
                    cur = np.where(who, t_wend[lj], cur)
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

            li = i - base
            # A straggler's delay lands once per synchronisation point (after a blocking op or
            # a wait), so that it arrives `delay` late at every collective rather than
            # accumulating.
            is_coll = name not in ("send", "recv")
            gap = GAP_NS + rng.integers(0, JITTER_NS, n) + (delay if synced and is_coll else 0)
            if name == "send":
                gap = gap + lsend
            if is_coll:
                synced = False
            enter = cur + gap
            cnt = np.full(n, max(nbytes // 4, 1), np.int64)
            t_enq[li] = enter
            tmpl_idx[li] = ti
            step_of[li] = st
            if name in ("send", "recv"):
                p2p_seq += (name == "send")
                seq[li] = p2p_seq
                first[li] = p2p_seq == 1
                count[li] = cnt
                tcomm = LATENCY_NS + int(nbytes / ALGBW)
                t_ret[li] = enter + 8_000
                if first[li] and init_stall_ns:
                    t_ret[li] += init_stall_ns
                cur = t_ret[li].copy()
                if name == "send":
                    pending_send = i
                else:
                    ls = pending_send - base
                    match = np.maximum(t_enq[li], np.roll(t_enq[ls], 1))  # recv on d matches send of d-1
                    t_end[li] = match + tcomm + rng.integers(0, 3_000, n)
                    t_end[ls] = np.roll(match, -1) + tcomm + rng.integers(0, 3_000, n)
                    pending_p2p.extend([pending_send, i])
                i += 1
                continue

            coll_seq += 1
            seq[li] = coll_seq
            first[li] = coll_seq == 1
            if coll_seq in mism:
                cnt[mism[coll_seq]] *= 2
                planted.setdefault("mismatch", []).append((mism[coll_seq], coll_seq, name))
            count[li] = cnt
            S_bytes = nbytes * n if name == "all_gather" else nbytes
            tcomm = LATENCY_NS + int(S_bytes / ALGBW)
            if skip_seq is not None and coll_seq == skip_seq:
                # The culprit never arrives: the others block here until the job is killed.
                issued[li, skip_rank] = False
                others = ar[ar != skip_rank]
                in_snapshot[li, others[len(others) // 2:]] = True
                t_ret[li] = NULL
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
            t_end[li] = end
            if is_async:
                t_ret[li] = enter + 8_000
                cur = t_ret[li].copy()
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
                        t_wait[li, 0] = tw
                        t_wend[li, 0] = max(tw, int(t_end[li, 0])) + 2_000
                        cur[0] = t_wend[li, 0]
                        planted["wait_immediately"] = i
                        planted["wait_immediately_ops"] = (i,)
            else:
                t_ret[li] = end + 3_000
                synced = True
                if first[li] and init_stall_ns:
                    t_ret[li] += init_stall_ns
                cur = t_ret[li].copy()
            i += 1

        used = i - base
        spool.add_block(_block_tables(tmpl, n, base, used, skew_ns, issued, in_snapshot, count, tmpl_idx,
                                      step_of, seq, first, t_enq, t_ret, t_end, t_wait, t_wend, marks, NULL))
        for r, j in zip(*np.nonzero(in_snapshot[:used].T)):
            k = tmpl_idx[j]
            snapshots.setdefault(int(r), []).append(
                {"op_id": int(base + j), "kind": "op", "pg": PG, "pg_size": n, "seq": int(seq[j]),
                 "op": tmpl[k][0], "api": API.get(tmpl[k][0], tmpl[k][0]), "async_op": bool(tmpl[k][1]),
                 "dtype": "float32", "count": int(count[j, r]), "bytes": int(count[j, r]) * 4,
                 "t_enqueue_ns": int(t_enq[j, r]) + int(skew_ns[r]), "t_return_ns": None,
                 "step": int(step_of[j]), "site": tmpl[k][3], "backend": "gloo", "device": "cpu"})
        del t_enq, t_ret, t_end, t_wait, t_wend, issued, in_snapshot, count

    if skip_seq is not None and "skip" not in planted:
        spool.close()
        raise ValueError(f"--skip seq {skip_seq} is beyond the {coll_seq} collectives of the run")

    # Per-rank offsets: the rank's clock minus rank 0's; estimated within a few us.
    est_err = rng.integers(-3_000, 3_000, n)
    est_err[0] = 0
    offsets = skew_ns - skew_ns[0] + est_err
    offsets[0] = 0

    rows_total = 0
    pg_ranks = {PG: list(range(n))}
    for r, tables in spool.rank_tables():
        sk = int(skew_ns[r])
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
        del tables, table
        # _inflight.json for ranks blocked in the skipped collective.
        ops_l = snapshots.get(r)
        if ops_l:
            snap = {"rank": r, "t_ns": ops_l[-1]["t_enqueue_ns"] + 5_000_000, "ops": ops_l}
            W.atomic_write_text(os.path.join(W.rank_dir(out, r), S.INFLIGHT_NAME), json.dumps(snap))
            rows_total += len(ops_l)
    spool.close()
    W.write_manifest(out, {"command": command or f"commtrace synth {out} --ranks {n} --ops {ops}",
                           "world_size": n, "synthetic": True, "commtrace_version": "synth",
                           "start_ns": START_NS})
    return SynthResult(out, n, i, rows_total, planted)


def _strings(idx: np.ndarray, values: list[str]) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(idx, pa.int32()), pa.array(values, pa.string()))


def _block_tables(tmpl, n, base, used, skew_ns, issued, in_snapshot, count, tmpl_idx, step_of, seq, first,
                  t_enq, t_ret, t_end, t_wait, t_wend, marks, NULL):
    """The op rows and mark rows of one block, rank-major (all of rank 0, then rank 1, ...),
    with each rank's row offsets: (ops table, op offsets, marks table, mark offsets). Strings
    stay dictionary-encoded until the rank's part is written."""
    keep = (issued[:used] & ~in_snapshot[:used]).T  # (n, used)
    rr, jj = np.nonzero(keep)
    off = np.r_[0, np.cumsum(keep.sum(axis=1))]
    ti = tmpl_idx[jj]
    is_send_t = np.array([t[0] == "send" for t in tmpl])
    is_p2p_t = np.array([t[0] in ("send", "recv") for t in tmpl])
    is_bcast_t = np.array([t[0] == "broadcast" for t in tmpl])
    is_ag_t = np.array([t[0] == "all_gather" for t in tmpl])
    is_rs_t = np.array([t[0] == "reduce_scatter" for t in tmpl])
    asyncs = np.array([bool(t[1]) for t in tmpl])
    sk = skew_ns[rr]
    nn = len(rr)

    def tcol(a):
        v = a[jj, rr]
        mask = v == NULL
        return pa.array(np.where(mask, 0, v + sk), pa.int64(), mask=mask)

    cnt = count[jj, rr]
    byts = cnt * 4
    out_b = np.where(is_ag_t[ti], byts * n, np.where(is_rs_t[ti], byts // n, byts))
    peer = np.where(is_send_t[ti], (rr + 1) % n, (rr - 1) % n)
    zeros = np.zeros(nn, np.int32)
    cols = {
        "kind": _strings(zeros, ["op"]),
        "rank": pa.array(rr.astype(np.int32)),
        "pg": _strings(zeros, [PG]),
        "pg_size": pa.array(np.full(nn, n, np.int32)),
        "seq": pa.array(seq[jj]),
        "op": _strings(ti, [t[0] for t in tmpl]),
        "api": _strings(ti, [API.get(t[0], t[0]) for t in tmpl]),
        "async_op": pa.array(asyncs[ti]),
        "backend": _strings(zeros, ["gloo"]),
        "device": _strings(zeros, ["cpu"]),
        "dtype": _strings(zeros, ["float32"]),
        "count": pa.array(cnt),
        "bytes": pa.array(byts),
        "out_bytes": pa.array(out_b),
        "peer": pa.array(peer.astype(np.int32), mask=~is_p2p_t[ti]),
        "root": pa.array(zeros, mask=~is_bcast_t[ti]),
        "t_enqueue_ns": tcol(t_enq), "t_return_ns": tcol(t_ret),
        "t_start_ns": pa.nulls(nn, pa.int64()),
        "t_end_ns": tcol(t_end), "t_wait_ns": tcol(t_wait), "t_wait_end_ns": tcol(t_wend),
        "step": pa.array(step_of[jj]),
        "site": _strings(ti, [t[3] for t in tmpl]),
        "error": pa.nulls(nn, pa.string()),
        "op_id": pa.array((base + jj).astype(np.int64)),
        "ref_op_id": pa.nulls(nn, pa.int64()),
        "inflight": pa.nulls(nn, pa.int32()),
        "inflight_ids": pa.nulls(nn, pa.list_(pa.int64())),
        "first_on_pg": pa.array(first[jj]),
        "stream_wait_ns": pa.nulls(nn, pa.int64()),
        "thread": pa.array(140000000 + rr.astype(np.int64)),
        "detail": pa.nulls(nn, pa.string()),
    }
    # Columns of the schema the generator does not fill (newer extensions) are null.
    ops_t = pa.table({f.name: cols[f.name] if f.name in cols else pa.nulls(nn, f.type) for f in S.SCHEMA})
    nm = len(marks)
    mark_t = None
    moff = np.zeros(n + 1, np.int64)
    if nm:
        steps = np.array([m[0] for m in marks], np.int64)
        mt = np.array([m[1] for m in marks], np.int64).T  # (n, nm)
        mr = np.repeat(np.arange(n), nm)
        tt = (mt + skew_ns[:, None]).ravel()
        z = np.zeros(n * nm, np.int32)
        mcols = {f.name: pa.nulls(n * nm, f.type) for f in S.SCHEMA}
        mcols.update({
            "kind": _strings(z, [S.KIND_MARK]),
            "rank": pa.array(mr.astype(np.int32)), "step": pa.array(np.tile(steps, n)),
            "t_enqueue_ns": pa.array(tt), "t_return_ns": pa.array(tt),
            "api": _strings(z, ["commtrace.mark_step"]),
            "site": _strings(z, ["train.py:20"]),
            "thread": pa.array(140000000 + mr.astype(np.int64)),
        })
        mark_t = pa.table({f.name: mcols[f.name] for f in S.SCHEMA})
        moff = np.arange(n + 1, dtype=np.int64) * nm
    return ops_t, off, mark_t, moff


def Q_np_array(a: np.ndarray) -> pa.Array:
    """int64 Arrow array over a numpy array (no pa.array(): it imports pandas)."""
    return pa.Array.from_buffers(pa.int64(), len(a), [None, pa.py_buffer(np.ascontiguousarray(a))])


class _Spool:
    """Per-rank rows of each block: kept in memory when the run is one block, else written to
    a temporary Arrow IPC file per block, one compressed record batch per group of `group`
    ranks, and read back a group at a time (every block's batch of the group, cast once,
    sorted by rank, then split)."""

    def __init__(self, out: str, n: int, nblocks: int, group: int = 1):
        self.n = n
        self.group = max(1, int(group))
        self.mem = nblocks <= 1
        self.blocks: list = []
        self.readers: dict = {}
        self.dir = None
        if not self.mem:
            import tempfile
            self.dir = tempfile.mkdtemp(prefix=".synth-spool-", dir=out)

    def add_block(self, tables) -> None:
        ops_t, off, mark_t, moff = tables
        if self.mem:
            self.blocks.append(tables)
            return
        import pyarrow.ipc as ipc
        path = os.path.join(self.dir, f"block-{len(self.blocks):05d}.arrow")
        opts = ipc.IpcWriteOptions(compression="lz4")
        for kind, t, o in (("ops", ops_t, off), ("marks", mark_t, moff)):
            if t is None:
                continue
            with ipc.new_file(f"{path}.{kind}", t.schema, options=opts) as w:
                for g in range(0, self.n, self.group):
                    lo, hi = int(o[g]), int(o[min(g + self.group, self.n)])
                    part = t.slice(lo, hi - lo).combine_chunks()
                    w.write_batch(pa.RecordBatch.from_arrays([c.chunk(0) for c in part.columns], schema=t.schema))
        self.blocks.append(path)

    def _group(self, gi: int, kind: str):
        """One table of the rows of rank group `gi` over every block (None when none)."""
        parts = []
        g0 = gi * self.group
        g1 = min(g0 + self.group, self.n)
        for b in self.blocks:
            if self.mem:
                ops_t, off, mark_t, moff = b
                t, o = (ops_t, off) if kind == "ops" else (mark_t, moff)
                if t is not None:
                    parts.append(t.slice(int(o[g0]), int(o[g1] - o[g0])))
                continue
            import pyarrow.ipc as ipc
            p = f"{b}.{kind}"
            if p not in self.readers and os.path.exists(p):
                # read, not memory-mapped: mapped pages of every block would stay resident
                # (counted in RSS and the memory cgroup) as the groups are read one by one
                self.readers[p] = ipc.open_file(pa.OSFile(p))
            if p in self.readers:
                parts.append(pa.Table.from_batches([self.readers[p].get_batch(gi)]))
        parts = [t for t in parts if t.num_rows]
        if not parts:
            return None
        t = pa.concat_tables(parts).cast(S.SCHEMA).combine_chunks()
        if len(parts) > 1:
            # rank-major within each block: a stable sort by rank puts every rank's rows in
            # block (= op) order
            t = t.take(Q_np_array(np.argsort(t["rank"].to_numpy(), kind="stable").astype(np.int64)))
        return t

    def rank_tables(self):
        """(rank, [tables]) for every rank in order: its op rows of every block, then its step
        markers of every block (schema types)."""
        for gi in range(0, (self.n + self.group - 1) // self.group):
            g0 = gi * self.group
            g1 = min(g0 + self.group, self.n)
            grp = {k: self._group(gi, k) for k in ("ops", "marks")}
            bounds = {}
            for k, t in grp.items():
                cnt = np.bincount(t["rank"].to_numpy() - g0, minlength=g1 - g0) if t is not None else np.zeros(g1 - g0, np.int64)
                bounds[k] = np.r_[0, np.cumsum(cnt)]
            for r in range(g0, g1):
                out = []
                for k in ("ops", "marks"):
                    t, bd = grp[k], bounds[k]
                    j = r - g0
                    if t is not None and bd[j + 1] > bd[j]:
                        out.append(t.slice(int(bd[j]), int(bd[j + 1] - bd[j])))
                yield r, (out or [S.SCHEMA.empty_table()])
            del grp

    def close(self) -> None:
        self.readers.clear()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


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
