"""Delay analysis: which rank's work caused the waiting, and what it cost (Scalasca's delay
costs; docs/findings.md "Delay analysis").

For every wait state (metrics.md "Wait states": a member's wait in a communication, `wait =
min(latest arrival, leave) - enter`), the latest arrival is the **delayer**. Each member's
**synchronisation interval** runs from the host release that ended its previous communication
on the same group (p2p: the same pair) to its entry; in it the rank either waited (its own wait
states, on any group: `W`) or worked (`comp = length - W`). The delayer's excess over the waiter
is split in proportion:

* the part from more work (`comp_d - comp_w`) is **direct cost** of the delay;
* the part from more waiting (`W_d - W_w`) was itself caused elsewhere: it is handed back to
  the delayer's own wait states in that interval (in proportion to their length) and follows
  their causes as **propagated cost** (e.g. a DP all_reduce that waits for a rank held up in
  its TP all_reduce, or a pipeline stage that waits for a stage that waited).

Waits that start before the model's window (`t_begin`: start-up skew in the first
collective) are left out. A delay is located at the host events of the delayer's interval whose gap exceeds the same
event's gap on the other ranks (`excess`, see :mod:`commtrace.analysis.model`), so that the
same extra work seen from several groups' intervals is one root cause. Every waiting second is
attributed exactly once: the sum of all delays' costs equals the sum of the wait states.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import model as _M
from . import sql as Q
from .model import Model, build_model

_SHIFT = 44           # rank << 44 | ns: per-rank sorted keys (2^44 ns is 4.9 hours)
MAX_ITER = 200


def attribute(m: Model) -> dict:
    """Per-slot and per-event delay costs (ns): the core of delay analysis."""
    nsl = len(m.sl_comm)
    E = m.n_events
    # (the arrays are made where they are computed: zeros made up front and replaced at the
    # end would be 62 MB more at the analysis' peak on 64 x 20,000, i.e. page faults)
    out = {"ev_direct": None, "ev_prop": None, "sl_direct": None, "sl_prop": None, "sl_load": None,
           "iterations": 0, "total_wait": 0.0}
    if nsl == 0 or E == 0:
        out.update(ev_direct=np.zeros(E), ev_prop=np.zeros(E), sl_direct=np.zeros(nsl), sl_prop=np.zeros(nsl),
                   sl_load=np.zeros(nsl))
        return out
    base = np.int64(0)
    rk = m.sl_rank.astype(np.int64) << _SHIFT
    omega = m.sl_wait.copy()
    d_slot = m.cm_last[m.sl_comm]
    # waits before the model's window (the first wait of each rank: start-up skew, connection
    # set-up) are no delay of anyone's work
    waiting = (omega > 0) & (d_slot != np.arange(nsl)) & (m.sl_block >= m.t_begin)
    omega = np.where(waiting, omega, 0.0)
    out["total_wait"] = float(omega.sum())
    # wait time in each slot's synchronisation interval [sync, enter)
    so, keys = _order_by_key(rk + np.floor(m.sl_block).astype(np.int64) + base, m.sl_block, m.sl_rank)
    d = d_slot
    r = _intervals_c(m, so, keys, omega, d, waiting) if _M._C is not None and USE_C else None
    if r is None:
        r = _intervals_numpy(m, rk, so, keys, omega, d, waiting)
    lo, hi, s_lo, s_hi, W, comp, f, gpos, cg = r
    del keys, r, rk
    # propagation: (omega + load) * (1 - f) handed to the delayer's waits in its interval
    push_idx = np.flatnonzero(waiting & (f < 1.0) & (W[d] > 0))
    load = np.zeros(nsl)
    it = 0
    if len(push_idx):
        dl = lo[d[push_idx]]
        dh = hi[d[push_idx]]
        wd = W[d[push_idx]]
        omega_so = omega[so]
        for it in range(1, MAX_ITER + 1):
            p = (omega[push_idx] + load[push_idx]) * (1.0 - f[push_idx]) / wd
            diff = np.zeros(nsl + 1)
            np.add.at(diff, dl, p)
            np.add.at(diff, dh, -p)
            rate = np.cumsum(diff[:-1])
            new = np.zeros(nsl)
            new[so] = omega_so * rate
            delta = np.abs(new - load).max()
            load = new
            if delta <= 1e-9 * max(out["total_wait"], 1.0):
                break
        del dl, dh, wd, omega_so, p, diff, rate, new
    del push_idx, lo, hi        # (freed before the arrays of the location below)
    out["iterations"] = it
    direct = omega * f
    prop = load * f
    out["sl_direct"], out["sl_prop"], out["sl_load"] = direct, prop, load
    # (f, W and comp are not kept: nothing reads them after this, and the what-if's replay,
    # next, reaches the analysis' peak memory with what is kept here)
    del f, W, comp
    # ---- locate on the delayer's events in its interval: start in (sync, enter]
    ws = np.flatnonzero(waiting & ((direct > 0) | (prop > 0)))
    ev_d = np.zeros(E)
    ev_p = np.zeros(E)
    out["ev_direct"], out["ev_prop"] = ev_d, ev_p
    if len(ws):
        if _M._C is not None and USE_C:
            _M._C.delay_locate(ws, np.ascontiguousarray(d, np.int64), s_lo, s_hi, direct, prop,
                               np.ascontiguousarray(m.ev_excess, np.float64), gpos, cg,
                               np.ascontiguousarray(m.sl_call, np.int64), ev_d, ev_p)
        else:
            _locate_numpy(m, ws, d, s_lo, s_hi, direct, prop, gpos, cg, ev_d, ev_p)
    return out


#: Whether delay analysis takes its C passes (`_replay.delay_intervals`, `delay_locate`) where the
#: extension is built (tests switch it off to compare with the numpy reference).
USE_C = True


def _intervals_c(m: Model, so, keys, omega, d, waiting):
    """_intervals_numpy by `_replay.delay_intervals` (one pass over the slots and events, no
    temporaries of their size but its outputs); None where its shortcut does not hold."""
    nsl, E = len(m.sl_comm), m.n_events
    lo, hi, s_lo, s_hi = (np.empty(nsl, np.int64) for _ in range(4))
    W, comp, f = (np.empty(nsl) for _ in range(3))
    gpos = np.empty(E)
    cg = np.empty(E + 1)
    c = np.ascontiguousarray
    ok = _M._C.delay_intervals(c(so, np.int64), c(keys, np.int64), c(m.sl_rank, np.int64), c(m.sl_sync, np.float64),
                               c(m.sl_enter, np.float64), c(omega, np.float64), c(m.ev_rank, np.int64),
                               c(m.ev_start, np.float64), c(m.ev_first, np.uint8), c(m.ev_gap, np.float64),
                               c(d, np.int64), c(waiting, np.uint8), lo, hi, s_lo, s_hi, W, comp, f, gpos, cg)
    return (lo, hi, s_lo, s_hi, W, comp, f, gpos, cg) if ok else None


def _intervals_numpy(m: Model, rk, so, keys, omega, d, waiting):
    """Per slot, its synchronisation interval's bounds among the slots in (rank, block) order
    (`lo`, `hi`: `keys` are theirs) and among the events (`s_lo`, `s_hi`: events starting in
    (sync, enter]), the waiting `W` and the work `comp` in it, and the share `f` of a waiter's
    wait that is direct cost; with the events' positive gaps `gpos` and their running sum `cg`
    (the reference of `_replay.delay_intervals`)."""
    cum = np.r_[0.0, np.cumsum(omega[so])]
    k_s = rk + np.floor(m.sl_sync).astype(np.int64)
    k_e = rk + np.floor(m.sl_enter).astype(np.int64)
    lo = _search(keys, k_s, "left", so)
    hi = _search(keys, k_e, "left", so)
    W = cum[hi] - cum[lo]
    del cum, k_s, k_e
    # work in the interval: the gaps (time outside any traced call) of the rank's events that
    # start in (sync, enter]; time inside calls is waiting (W) or the transfers themselves
    erk = m.ev_rank.astype(np.int64) << _SHIFT
    ekeys = erk + np.floor(m.ev_start).astype(np.int64)
    s_lo = _search(ekeys, rk + np.floor(m.sl_sync).astype(np.int64), "right", so)
    q_e = rk + np.floor(m.sl_enter).astype(np.int64)
    s_hi = _search(ekeys, q_e, "right", so, fallback=lambda: _after_own_call(ekeys, q_e, m.sl_call))
    del q_e
    gpos = np.where(m.ev_first, 0.0, np.maximum(m.ev_gap, 0.0))
    cg = np.r_[0.0, np.cumsum(gpos)]
    comp = cg[s_hi] - cg[s_lo]
    del ekeys, erk
    exc_c = np.maximum(0.0, comp[d] - comp)
    exc_w = np.maximum(0.0, W[d] - W)
    tot = exc_c + exc_w
    f = np.where(tot > 0, exc_c / np.where(tot > 0, tot, 1.0), 1.0)
    f = np.where(waiting, f, 1.0)
    return lo, hi, s_lo, s_hi, W, comp, f, gpos, cg


def _locate_numpy(m: Model, ws, d, s_lo, s_hi, direct, prop, gpos, cg, ev_d, ev_p) -> None:
    """The delay costs of the waiting slots `ws` located on the delayer's events that start in
    its interval, added into ev_d / ev_p: by the events' excess where the interval has any,
    else by their gaps, else on the slot's call (the reference of `_replay.delay_locate`)."""
    E = len(ev_d)
    dd = d[ws]
    e_lo, e_hi = s_lo[dd], s_hi[dd]
    x = m.ev_excess
    cx = np.r_[0.0, np.cumsum(x)]
    sx = cx[e_hi] - cx[e_lo]
    sg = cg[e_hi] - cg[e_lo]
    use_x = sx > 0
    use_g = ~use_x & (sg > 0)
    rest = ~use_x & ~use_g
    for amt, acc in ((direct[ws], ev_d), (prop[ws], ev_p)):
        for sel, cw, wts in ((use_x, sx, x), (use_g, sg, gpos)):
            if not sel.any():
                continue
            diff = np.zeros(E + 1)
            r = amt[sel] / cw[sel]
            np.add.at(diff, e_lo[sel], r)
            np.add.at(diff, e_hi[sel], -r)
            acc += wts * np.cumsum(diff[:-1])
        if rest.any():
            np.add.at(acc, m.sl_call[dd[rest]], amt[rest])


def _order_by_key(key: np.ndarray, block: np.ndarray, rank: np.ndarray):
    """(np.lexsort((block, rank)), key in that order) for key = rank << 44 | floor(block): one
    int64 argsort when the blocks are whole ns (they are times in ns) and no key repeats (the
    order of equal keys would then be the sort's own), else the lexsort. (numpy's stable sort:
    the same order for distinct keys, and it finds the slots' runs of increasing keys: 34
    against 45 ms for the 1.28M slots of the 64 x 20,000 run.)"""
    # by rank first (a counting sort), then by key: the same stable order (equal keys are of one
    # rank, in their original order either way), with runs numpy's sort merges instead of the
    # slots' communication order, ranks interleaved (64 x 20,000: 50 -> 22 ms)
    o = _M.stable_argsort(rank) if len(rank) else np.zeros(0, np.int64)
    o = o[np.argsort(key[o], kind="stable")]
    ks = key[o]
    if len(ks) > 1 and (np.any(ks[1:] == ks[:-1]) or not np.array_equal(np.floor(block), block)):
        o = np.lexsort((block, rank))
        ks = key[o]
    return o, ks


def _search(keys: np.ndarray, q: np.ndarray, side: str, order: np.ndarray, fallback=None) -> np.ndarray:
    """np.searchsorted(keys, q, side) (or `fallback()`, equal to it), by `_replay.search_along`
    where the extension is built: the queries taken in `order` (the slots by rank and block
    time, in which they are almost sorted), each searched from the previous answer. The
    slots' queries come in communication order, ranks interleaved: numpy's searches from
    scratch took 0.1-0.3 s of the 64 x 20,000 run's delay analysis (cache misses)."""
    if _M._C is not None and len(q):
        r = _M._C.search_along(np.ascontiguousarray(keys, np.int64), np.ascontiguousarray(q, np.int64),
                            np.ascontiguousarray(order, np.int64), side == "right")
        if r is not None:
            return np.frombuffer(r, np.int64)
    return fallback() if fallback is not None else np.searchsorted(keys, q, side)


def _after_own_call(ekeys: np.ndarray, q: np.ndarray, sl_call: np.ndarray) -> np.ndarray:
    """np.searchsorted(ekeys, q, "right") where q[j] is the key of slot j's call event (the
    first event after it, unless later events share its key: searched for those only)."""
    E = len(ekeys)
    c = sl_call + 1
    ok = (sl_call >= 0) & (ekeys[np.clip(sl_call, 0, max(E - 1, 0))] == q)
    nxt = ekeys[np.minimum(c, E - 1)] if E else np.zeros(0, np.int64)
    ok &= (c >= E) | (nxt > q)
    out = np.where(ok, c, 0)
    bad = np.flatnonzero(~ok)
    if len(bad):
        out[bad] = np.searchsorted(ekeys, q[bad], "right")
    return out


def _label(m: Model, e: int) -> tuple:
    row = int(m.ev_row[e])
    op = m.row_op[row] or None
    if m.ev_is_wait[e]:
        op = f"wait({op})" if op else "wait()"
    return op, (m.row_site[row] or None)


DELAY_COLUMNS = ("rank", "step", "op", "site", "prev_op", "prev_site", "delay_s", "direct_cost_s",
                 "propagated_cost_s", "cost_s", "t_ns", "event")


def delay_row(m, a: dict, e: int) -> dict:
    """The row of :func:`delays` for host event `e` of model `m` (`a`: its attribution)."""
    op, site = _label(m, e)
    if e > 0 and not m.ev_first[e]:
        pop, psite = _label(m, e - 1)
        t0 = m.ev_rel[e - 1]
    else:
        pop, psite, t0 = None, None, m.ev_start[e]
    st = int(m.ev_step[e])
    dc, pc = float(a["ev_direct"][e]), float(a["ev_prop"][e])
    return {"rank": int(m.ev_rank[e]), "step": st if st >= 0 else None, "op": op, "site": site,
            "prev_op": pop, "prev_site": psite, "delay_s": float(m.ev_excess[e]) / 1e9,
            "direct_cost_s": dc / 1e9, "propagated_cost_s": pc / 1e9, "cost_s": (dc + pc) / 1e9,
            "t_ns": int(round(t0)) + m.base_ns, "event": int(e)}


def delays(run, top: int | None = None, min_cost_s: float = 0.0, per_rank: int | None = None) -> pa.Table:
    """Root causes, one row per host event with delay costs, largest cost first: `rank`,
    `step`, `op` / `site` (the op the delay precedes: "before all_reduce at train.py:88"),
    `prev_op` / `prev_site` (the op it follows), `delay_s` (the event's excess gap over the
    same event on the other ranks), `direct_cost_s`, `propagated_cost_s`, `cost_s`, `t_ns`
    (start of the gap, rank 0's clock) and `event` (index in the host model). `per_rank`: only
    each rank's first (costliest) rows."""
    m = build_model(run)
    a = attribution(run)
    cost = a["ev_direct"] + a["ev_prop"]
    idx = np.flatnonzero(cost > max(min_cost_s, 0.0) * 1e9)
    idx = idx[np.argsort(-cost[idx], kind="stable")]
    if per_rank is not None:
        # the first `per_rank` rows of each rank, in the same order
        r = m.ev_rank[idx]
        o = np.argsort(r, kind="stable")
        rs = r[o]
        k = np.arange(len(o)) - np.searchsorted(rs, rs, "left")
        idx = idx[np.sort(o[k < int(per_rank)])]
    if top is not None:
        idx = idx[: int(top)]
    cols = {k: [] for k in DELAY_COLUMNS}
    for e in idx.tolist():
        for k, v in delay_row(m, a, e).items():
            cols[k].append(v)
    # (sql.py_array, not pa.array: that imports pandas, 0.2-0.4 s the report does not pay otherwise)
    types = {"op": pa.string(), "site": pa.string(), "prev_op": pa.string(), "prev_site": pa.string(),
             "delay_s": pa.float64(), "direct_cost_s": pa.float64(), "propagated_cost_s": pa.float64(),
             "cost_s": pa.float64()}
    return pa.table({k: Q.py_array(v, types.get(k, pa.int64())) for k, v in cols.items()})


def attribution(run) -> dict:
    """`attribute` of the run's model (cached with the model)."""
    m = build_model(run)
    a = getattr(m, "_attribution", None)
    if a is None:
        a = attribute(m)
        m._attribution = a
    return a


def cost_by_rank(run) -> dict[int, tuple[float, float]]:
    """rank -> (direct, propagated) delay cost in seconds of the delays located on it."""
    m = build_model(run)
    a = attribution(run)
    out = {}
    if not m.n_events:
        return out
    cached = getattr(m, "_cost_by_rank", None)
    if cached is not None and cached[0] is a:
        return dict(cached[1])
    # the events are in rank order, rank i's in rank_lo[i]..rank_hi[i]: the position of each
    # event's rank in m.ranks by a repeat (a searchsorted of 2M events took 20-40 ms)
    pos = np.repeat(np.arange(len(m.ranks)), m.rank_hi - m.rank_lo)
    if len(pos) != m.n_events or not np.array_equal(m.ranks[pos], m.ev_rank):
        pos = np.searchsorted(m.ranks, m.ev_rank)
    dsum = np.bincount(pos, weights=a["ev_direct"], minlength=len(m.ranks))
    psum = np.bincount(pos, weights=a["ev_prop"], minlength=len(m.ranks))
    for r, x, y in zip(m.ranks.tolist(), dsum.tolist(), psum.tolist()):
        out[int(r)] = (x / 1e9, y / 1e9)
    m._cost_by_rank = (a, dict(out))
    return out
