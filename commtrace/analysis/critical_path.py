"""The critical path across ranks: the chain of compute gaps, host time in calls and
communication that determines the run's end (docs/findings.md "Critical path").

Walked backwards through the host model (:mod:`commtrace.analysis.model`) from the last host
release: an event that waited for a communication's completion continues into that
communication (its transfer, `[T0, leave]`), and from there to whatever started it: the latest
arrival (the path jumps to that rank, at its entry) or, for a collective queued behind the
group's previous one, that one's completion. Any other event continues into its own host time
and the gap before it, on the same rank. The walk stops at the model's start (`t_begin`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .model import _C, Model, build_model

KINDS = ("compute", "host", "comm")


def walk(m: Model, _python: bool = False) -> dict[str, np.ndarray]:
    """Critical path segments (ns relative to `m.base_ns`), latest first reversed to time
    order: rank, t0, t1, kind (index into KINDS), comm (-1 if none), event (-1 if none).
    The loop runs in C (`_replay.cp_walk`) when built; `_python`: this Python loop, its
    reference."""
    E = m.n_events
    rk, t0s, t1s, kd, cm, ev = [], [], [], [], [], []
    if E == 0:
        return _seg_arrays(rk, t0s, t1s, kd, cm, ev)
    ev_start, ev_rel, ev_anchor, ev_slot, ev_first = (m.ev_start, m.ev_rel, m.ev_anchor, m.ev_slot, m.ev_first)
    ev_rank = m.ev_rank
    sl_leave, sl_dep, sl_comm, sl_call, sl_enter, sl_prev = (m.sl_leave, m.sl_dep, m.sl_comm, m.sl_call,
                                                            m.sl_enter, m.sl_prev)
    cm_T0, cm_last, cm_lo, cm_hi = m.cm_T0, m.cm_last, m.cm_lo, m.cm_hi
    tb = m.t_begin
    q_prev = _queued_behind(m)
    e = int(np.argmax(ev_rel))
    if _C is not None and not _python:   # the same loop in C (this one is its reference)
        c = np.ascontiguousarray
        r = _C.cp_walk(c(ev_rank, np.int64), c(ev_start, np.float64), c(ev_rel, np.float64), c(ev_anchor, np.bool_),
                       c(ev_slot, np.int64), c(ev_first, np.bool_), c(sl_leave, np.float64), c(sl_dep, np.bool_),
                       c(sl_comm, np.int64), c(sl_call, np.int64), c(sl_enter, np.float64), c(m.sl_rank, np.int64),
                       c(cm_T0, np.float64), c(cm_last, np.int64), c(q_prev, np.int64), float(tb), e,
                       4 * E + 4 * len(sl_comm) + 10)
        if r is not None:
            return dict(zip(("rank", "t0", "t1", "kind", "comm", "event"),
                            (np.frombuffer(x, t) for x, t in zip(r, (np.int64, np.float64, np.float64, np.int64,
                                                                     np.int64, np.int64)))))
    mode = 0          # 0: at the end of event e; 1: at the start of e; 2: at completion of slot s
    s = -1
    guard = 4 * E + 4 * len(sl_comm) + 10
    while guard > 0:
        guard -= 1
        if mode == 0:
            r = int(ev_rank[e])
            if ev_anchor[e]:
                s = int(ev_slot[e])
                L = sl_leave[s]
                if L >= ev_start[e]:
                    a = max(L, tb)
                    if ev_rel[e] > a:
                        rk.append(r); t0s.append(a); t1s.append(ev_rel[e]); kd.append(1); cm.append(int(sl_comm[s])); ev.append(e)
                    if L <= tb:
                        break
                    mode = 2
                    continue
            a = max(ev_start[e], tb)
            if ev_rel[e] > a:
                rk.append(r); t0s.append(a); t1s.append(ev_rel[e]); kd.append(1)
                cm.append(int(sl_comm[ev_slot[e]]) if ev_slot[e] >= 0 else -1); ev.append(e)
            mode = 1
        elif mode == 1:
            r = int(ev_rank[e])
            if ev_first[e] or ev_start[e] <= tb:
                break
            a = max(ev_rel[e - 1], tb)
            if ev_start[e] > a:
                rk.append(r); t0s.append(a); t1s.append(ev_start[e]); kd.append(0); cm.append(-1); ev.append(e)
            e -= 1
            mode = 0
        else:
            c = int(sl_comm[s])
            r = int(m.sl_rank[s])
            L = sl_leave[s]
            if sl_dep[s]:
                T0 = cm_T0[c]
                a = max(T0, tb)
                if L > a:
                    rk.append(r); t0s.append(a); t1s.append(L); kd.append(2); cm.append(c); ev.append(-1)
                if T0 <= tb:
                    break
                d = int(cm_last[c])
                if sl_enter[d] >= T0:
                    e = int(sl_call[d])
                    mode = 1
                else:
                    # queued behind the group's previous collective on some member
                    bs = int(q_prev[c])
                    if bs < 0:
                        e = int(sl_call[d])
                        mode = 1
                    else:
                        s = bs
                        mode = 2
            else:
                a = max(sl_enter[s], tb)
                if L > a:
                    rk.append(r); t0s.append(a); t1s.append(L); kd.append(2); cm.append(c); ev.append(-1)
                e = int(sl_call[s])
                mode = 1
    return _seg_arrays(rk[::-1], t0s[::-1], t1s[::-1], kd[::-1], cm[::-1], ev[::-1])


def _queued_behind(m: Model) -> np.ndarray:
    """Per communication, the member's previous slot on the group that ended last (the first
    of ties, in slot order), -1 if no member has one."""
    nsl, C = len(m.sl_comm), len(m.cm_lo)
    if not C:
        return np.zeros(0, np.int64)
    has = m.sl_prev >= 0
    v = np.where(has, m.sl_leave[np.maximum(m.sl_prev, 0)], -np.inf)
    best = np.maximum.reduceat(v, m.cm_lo)
    cand = has & (v == best[m.sl_comm]) & (v > -np.inf)
    j = np.minimum.reduceat(np.where(cand, np.arange(nsl), nsl), m.cm_lo)
    return np.where(j < nsl, m.sl_prev[np.minimum(j, nsl - 1)], -1)


def _seg_arrays(rk, t0s, t1s, kd, cm, ev):
    return {"rank": np.asarray(rk, np.int64), "t0": np.asarray(t0s, np.float64), "t1": np.asarray(t1s, np.float64),
            "kind": np.asarray(kd, np.int64), "comm": np.asarray(cm, np.int64), "event": np.asarray(ev, np.int64)}


def _segments(run) -> tuple[Model, dict]:
    m = build_model(run)
    seg = getattr(m, "_critical_path", None)
    if seg is None:
        seg = walk(m)
        m._critical_path = seg
    return m, seg


def segments(run) -> pa.Table:
    """The critical path as a table, in time order (for drawing on the timeline): `rank`,
    `t0_ns`, `t1_ns` (rank 0's clock), `kind` (compute: a gap between host events; host: time
    inside a call or wait() not spent waiting for a completion; comm: a transfer, from the
    start of a communication to this rank's completion), `op`, `pg`, `seq` (comm segments;
    `seq` is the pair's sequence for p2p), `step`."""
    m, sg = _segments(run)
    n = len(sg["rank"])
    op, pg, seq, step = [], [], [], []
    for i in range(n):
        c = int(sg["comm"][i])
        e = int(sg["event"][i])
        if c >= 0:
            op.append(str(m.cm_op[c])); pg.append(str(m.cm_pg[c])); seq.append(int(m.cm_seq[c]))
        else:
            op.append(None); pg.append(None); seq.append(None)
        if e >= 0:
            st = int(m.ev_step[e])
        elif c >= 0:
            st = int(m.ev_step[m.sl_call[m.cm_lo[c]]])
        else:
            st = -1
        step.append(st if st >= 0 else None)
    return pa.table({
        "rank": pa.array(sg["rank"], pa.int64()),
        "t0_ns": pa.array(np.round(sg["t0"]).astype(np.int64) + m.base_ns, pa.int64()),
        "t1_ns": pa.array(np.round(sg["t1"]).astype(np.int64) + m.base_ns, pa.int64()),
        "kind": pa.array([KINDS[k] for k in sg["kind"].tolist()], pa.string()),
        "op": pa.array(op, pa.string()), "pg": pa.array(pg, pa.string()),
        "seq": pa.array(seq, pa.int64()), "step": pa.array(step, pa.int64())})


def summary(run) -> dict:
    """Per rank, the share of the critical path it holds; per op kind, the communication on
    the path (exposed) and off it (hidden: the rest of the transfers' time in the window, sum
    over communications of t_comm clipped to the window; `t_comm_total_s`: unclipped); per step, the path's length and the rank holding most of it."""
    m, sg = _segments(run)
    total = m.t_end - m.t_begin
    L = sg["t1"] - sg["t0"]
    out = {"length_s": float(L.sum()) / 1e9, "run_time_s": total / 1e9, "segments": int(len(L))}
    per_rank = []
    if len(L):
        ur, inv = np.unique(sg["rank"], return_inverse=True)
        by_kind = np.zeros((len(ur), 3))
        np.add.at(by_kind, (inv, sg["kind"]), L)
        for i, r in enumerate(ur.tolist()):
            t = float(by_kind[i].sum())
            per_rank.append({"rank": int(r), "time_s": t / 1e9, "share": t / total if total > 0 else 0.0,
                             "compute_s": by_kind[i, 0] / 1e9, "host_s": by_kind[i, 1] / 1e9, "comm_s": by_kind[i, 2] / 1e9})
        per_rank.sort(key=lambda x: -x["time_s"])
    out["per_rank"] = per_rank
    # per op kind: exposed (on the path) vs hidden (bincount adds in communication order, as
    # a running sum per op would). Hidden is the transfer time inside the window not on the
    # path: a transfer before the window (the start-up's first collective) is neither.
    K = len(m.op_names)
    tc_total = np.bincount(m.cm_opc, weights=m.cm_tcomm, minlength=K)
    t0 = m.cm_T0
    in_win = np.clip(np.minimum(t0 + m.cm_tcomm, m.t_end) - np.maximum(t0, m.t_begin), 0.0, None)
    tc_win = np.bincount(m.cm_opc, weights=in_win, minlength=K)
    n_c = np.bincount(m.cm_opc, minlength=K)
    comm_seg = sg["kind"] == 2
    cs = m.cm_opc[sg["comm"][comm_seg]]
    per_op = np.bincount(cs, weights=L[comm_seg], minlength=K)
    n_on = np.bincount(cs, minlength=K)
    ops = []
    for k in sorted(set(np.flatnonzero((n_c > 0) | (n_on > 0)).tolist()), key=lambda k: str(m.op_names[k])):
        on = float(per_op[k])
        tct, tcw = float(tc_total[k]), float(tc_win[k])
        ops.append({"op": str(m.op_names[k]), "on_path_s": on / 1e9, "off_path_s": max(tcw - on, 0.0) / 1e9,
                    "t_comm_total_s": tct / 1e9, "t_comm_in_window_s": tcw / 1e9})
    ops.sort(key=lambda x: -x["on_path_s"])
    out["per_op"] = ops
    # per step
    steps = []
    if len(L):
        st = np.full(len(L), -1, np.int64)
        e = sg["event"]
        st[e >= 0] = m.ev_step[e[e >= 0]]
        cc = sg["comm"]
        sel = (e < 0) & (cc >= 0)
        st[sel] = m.ev_step[m.sl_call[m.cm_lo[cc[sel]]]]
        # segments grouped by step, each group in time order (the same sums as a mask per step)
        ok = np.flatnonzero(st >= 0)
        o = ok[np.argsort(st[ok], kind="stable")]
        so, Lo, ro = st[o], L[o], sg["rank"][o]
        b = np.flatnonzero(np.r_[True, so[1:] != so[:-1]]) if len(o) else np.zeros(0, np.int64)
        if len(b) and not np.isfinite(Lo).all():   # (NaN: the reference loop, numpy's argmax)
            for s, i0, i1 in zip(so[b].tolist(), b.tolist(), np.r_[b[1:], len(o)].tolist()):
                Lk = Lo[i0:i1]
                rs, inv = np.unique(ro[i0:i1], return_inverse=True)
                per = np.bincount(inv, weights=Lk)
                tot = Lk.sum()
                steps.append({"step": int(s), "length_s": float(tot) / 1e9, "top_rank": int(rs[np.argmax(per)]),
                              "top_rank_share": float(per.max() / tot) if tot > 0 else 0.0})
        elif len(b):
            # per (step, rank) sums by one bincount over all steps (each bin adds its segments
            # in the order a bincount per step would; 2,223 steps of the 64 x 20,000 run: 0.23 s
            # of np.unique and bincount per step before), then per step the first (lowest)
            # rank of those holding most of it, as argmax over the step's ranks
            nb = len(b)
            ends = np.r_[b[1:], len(o)]
            ur, rpos = np.unique(ro, return_inverse=True)
            flat = np.repeat(np.arange(nb), ends - b) * len(ur) + rpos
            keys, kid = np.unique(flat, return_inverse=True)       # (step, rank) pairs in order
            per = np.bincount(kid, weights=Lo, minlength=len(keys))
            kstep = keys // len(ur)
            kb = np.flatnonzero(np.r_[True, kstep[1:] != kstep[:-1]])
            pmax = np.maximum.reduceat(per, kb)
            first = np.minimum.reduceat(np.where(per == pmax[np.repeat(np.arange(nb), np.diff(np.r_[kb, len(keys)]))],
                                                 np.arange(len(keys)), len(keys)), kb)
            top = ur[keys[first] % len(ur)]
            # (each step's total as the sum of its slice: numpy's pairwise sum, as before)
            tots = [float(Lo[i0:i1].sum()) for i0, i1 in zip(b.tolist(), ends.tolist())]
            for s, tot, r, pm in zip(so[b].tolist(), tots, top.tolist(), pmax.tolist()):
                steps.append({"step": int(s), "length_s": tot / 1e9, "top_rank": int(r),
                              "top_rank_share": float(pm / tot) if tot > 0 else 0.0})
    out["per_step"] = steps
    return out
