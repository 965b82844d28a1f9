"""What-if by replay: the matched trace replayed through the host model with one thing changed
(Dimemas-style; docs/findings.md "What-if by replay").

The model (:mod:`commtrace.analysis.model`): each rank's next host event starts its measured gap
after the previous one released the host; a communication starts at the latest arrival (a
collective also not before each member's previous collective on the group ended) and each
member leaves its measured transfer time `tc` later; a host event that waited for a completion
releases at max(its start, the completion) plus its measured residual; all others keep their
measured durations. Replaying the unchanged trace reproduces the measured times (the report
prints the error); a scenario changes gaps, transfer times or which arrivals count:

* ``rank_median``  -- a rank made as fast as the median rank: each of its gaps cut to the
  median of the same event's gaps on the other ranks (its excess removed);
* ``fix_delay``    -- one delay (a root cause of delay analysis) removed;
* ``comm_hidden``  -- all communication fully overlapped: every transfer takes no host time
  (the ranks still meet at each collective, so wait states caused by late arrivals remain);
* ``busbw_ref``    -- every collective of one op kind at a reference bus bandwidth (nccl-tests:
  t = S x F / busbw);
* ``remove_rank``  -- a rank removed from a group's critical path: its arrivals no longer
  hold that group's collectives, and the run ends with the other ranks.

The replay is a discrete-event loop in C (``_replay.c``: each rank advances until it waits for
a communication that has not completed). Which event waits for which communication does not
depend on the times, so every scenario takes the same path through the loop: the scenarios
are replayed together, their times side by side (``replay_many``). Without the compiled
extension (or with
``COMMTRACE_PURE_PYTHON=1``) the same model runs in numpy, all scenarios together, in batches
of independent communications in a topological order of the dependencies.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import numpy as np

from .model import Model, build_model, stable_argsort

EPS = 1.0
#: Guards the scenario-independent caches on a model (_c_inputs, _step_index, plan_for):
#: what_if replays scenarios in two threads at once, and each cache is built once.
_CACHE_LOCK = threading.RLock()


@dataclass
class Scenario:
    """One what-if. Overrides are full arrays (None: as measured)."""

    name: str
    kind: str
    params: dict = field(default_factory=dict)
    gap: np.ndarray | None = None        # per event
    gap_at: np.ndarray | None = None     # increasing event indices whose gap is gap_to's instead
    gap_to: np.ndarray | None = None
    tc: np.ndarray | None = None         # per slot, transfer time after T0 (dependent slots)
    tc_ind: np.ndarray | None = None     # per slot, duration of an independent slot
    mask: np.ndarray | None = None       # per slot: arrival ignored in T0
    queue: bool = True
    exclude_ranks: tuple = ()            # ranks left out of the run's end

    def gap_of(self, m: "Model") -> np.ndarray:
        """The scenario's gap of every event (the measured ones where it changes none)."""
        g = m.ev_gap if self.gap is None else self.gap
        if self.gap_at is not None and len(self.gap_at):
            g = g.copy()
            g[self.gap_at] = self.gap_to
        return g


@dataclass
class ReplayResult:
    """Per scenario: replayed end of the run, and per-step ends (ns, model time)."""

    names: list
    t_end: np.ndarray            # (S,)
    steps: np.ndarray            # step numbers
    step_end: np.ndarray         # (S, n_steps)
    ev_rel: np.ndarray | None    # (S, E) when kept

    def part(self, a: int, b: int) -> "ReplayResult":
        """Scenarios a..b-1 of this result."""
        return ReplayResult(self.names[a:b], self.t_end[a:b], self.steps, self.step_end[a:b],
                            None if self.ev_rel is None else self.ev_rel[a:b])


class _Plan:
    """The scenario-independent part of a replay: anchors, processing order and batches."""

    def __init__(self, m: Model):
        E = m.n_events
        self.E = E
        anc = np.flatnonzero(m.ev_anchor)
        self.anc = anc
        A = len(anc)
        R = len(m.ranks)
        rpos = np.searchsorted(m.ranks, m.ev_rank)
        self.rpos = rpos
        # last anchor strictly before each event on its rank (anchor number), else -1
        is_a = m.ev_anchor.astype(np.int64)
        cnt_incl = np.cumsum(is_a)
        before = cnt_incl - is_a                      # anchors strictly before, globally
        # anchors before the rank's first event
        base_cnt = before[m.rank_lo]
        ab = before - 1
        ab = np.where(before > base_cnt[rpos], ab, -1)
        self.anc_before = ab                          # -1: rank base
        self.anc_of_event = np.where(m.ev_anchor, cnt_incl - 1, -1)
        self.A, self.R = A, R
        nsl = len(m.sl_comm)
        C = len(m.cm_lo)
        # ---- processing order: keys strictly increasing along every dependency
        a_slot = m.ev_slot[anc]
        a_comm = m.sl_comm[a_slot] if A else np.zeros(0, np.int64)
        a_rank = rpos[anc]
        a_prev = ab[anc]                              # previous anchor on the rank or -1
        a_idx_in_rank = np.arange(A) - (np.searchsorted(a_rank, a_rank, side="left") if A else 0)
        call_ab = ab[m.sl_call] if nsl else np.zeros(0, np.int64)
        rb = np.flatnonzero(np.r_[True, a_rank[1:] != a_rank[:-1]]) if A else np.zeros(0, np.int64)
        a_bounds = list(zip(rb.tolist(), np.r_[rb[1:], A].tolist()))
        kc = m.cm_T0.copy()
        ka = m.ev_rel[anc].copy()
        for _ in range(50):
            ka_new = np.maximum(ka, kc[a_comm] + EPS) if A else ka
            # strictly increasing along each rank's anchors
            if A:
                shifted = ka_new - EPS * a_idx_in_rank
                for lo, hi in a_bounds:           # cummax per rank
                    np.maximum.accumulate(shifted[lo:hi], out=shifted[lo:hi])
                ka_new = shifted + EPS * a_idx_in_rank
            if nsl:
                ka_call = np.where(call_ab >= 0, ka_new[np.maximum(call_ab, 0)] + EPS, -np.inf)
                kq = np.where(m.sl_prev >= 0, kc[m.sl_comm[np.maximum(m.sl_prev, 0)]] + EPS, -np.inf)
                kc_new = np.maximum(m.cm_T0, np.maximum.reduceat(np.maximum(ka_call, kq), m.cm_lo)) if C else kc
            else:
                kc_new = kc
            done = np.array_equal(ka_new, ka) and np.array_equal(kc_new, kc)
            ka, kc = ka_new, kc_new
            if done:
                break
        # nodes: comms then anchors, sorted by key (ties: comm first is never needed, keys
        # of dependent nodes differ by >= EPS)
        keys = np.concatenate([kc, ka])
        is_comm = np.r_[np.ones(C, bool), np.zeros(A, bool)]
        nid = np.r_[np.arange(C), np.arange(A)]
        order = np.lexsort((~is_comm, keys))
        keys, is_comm, nid = keys[order], is_comm[order], nid[order]
        N = len(order)
        # ---- previous conflicting node of each node
        pos = np.arange(N)
        comm_pos = np.full(C, -1, np.int64)
        comm_pos[nid[is_comm]] = pos[is_comm]
        anc_pos = np.full(A, -1, np.int64)
        anc_pos[nid[~is_comm]] = pos[~is_comm]
        # incidences (rank, position): comm members and anchors
        inc_rank = np.concatenate([m.sl_rank, m.ev_rank[anc]]) if nsl or A else np.zeros(0, np.int64)
        inc_pos = np.concatenate([comm_pos[m.sl_comm] if nsl else np.zeros(0, np.int64), anc_pos])
        inc_isa = np.r_[np.zeros(nsl, bool), np.ones(A, bool)]
        io = np.lexsort((inc_pos, inc_rank))
        r_s, p_s = inc_rank[io], inc_pos[io]
        same = np.r_[False, r_s[1:] == r_s[:-1]]
        prev_any = np.where(same, np.r_[-1, p_s[:-1]], -1)
        prevconf = np.full(N, -1, np.int64)
        # comms: max over members of the previous incidence of any kind
        if nsl:
            pa_sl = np.empty(nsl, np.int64)
            sel = ~inc_isa[io]
            pa_sl[io[sel]] = prev_any[sel]
            pc = np.maximum.reduceat(pa_sl, m.cm_lo) if C else np.zeros(0, np.int64)
            prevconf[comm_pos] = pc
        # anchors: the previous anchor of the rank
        if A:
            ao = np.lexsort((anc_pos, a_rank))
            sa = np.r_[False, a_rank[ao][1:] == a_rank[ao][:-1]]
            pprev = np.where(sa, np.r_[-1, anc_pos[ao][:-1]], -1)
            prevconf[anc_pos[ao]] = pprev
        # ---- greedy batches: a batch is a run of comms (sharing no rank) then a run of
        # anchors (one per rank at most); only comms and conflicting anchors need a look.
        comm_flag = is_comm
        prev_is_anchor = np.r_[False, ~comm_flag[:-1]]
        # an anchor can only conflict with an anchor in its own run of anchors
        run_start = np.maximum.accumulate(np.where(comm_flag, pos + 1, 0)) if N else np.zeros(0, np.int64)
        cand = np.flatnonzero(comm_flag | (prevconf >= run_start))
        cuts = [0]
        start = 0
        pc_l = prevconf[cand].tolist()
        ic_l = comm_flag[cand].tolist()
        pa_l = prev_is_anchor[cand].tolist()
        for p, pcv, isc, pia in zip(cand.tolist(), pc_l, ic_l, pa_l):
            if pcv >= start or (isc and pia and p - 1 >= start):
                if p != start:
                    cuts.append(p)
                    start = p
        cuts.append(N)
        self.N = N
        self.cuts = np.asarray(cuts, np.int64)
        self.node_is_comm = is_comm
        self.node_id = nid
        # ---- slots in processing order (contiguous per batch)
        comm_order = nid[is_comm]                      # comms in processing order
        self.comm_order = comm_order
        if C:
            lens = (m.cm_hi - m.cm_lo)[comm_order]
            starts = m.cm_lo[comm_order]
            slot_perm = np.repeat(starts - np.r_[0, np.cumsum(lens)[:-1]], lens) + np.arange(lens.sum())
        else:
            slot_perm = np.zeros(0, np.int64)
            lens = np.zeros(0, np.int64)
        self.slot_perm = slot_perm                     # processing slot -> model slot
        slot_inv = np.empty(nsl, np.int64)
        slot_inv[slot_perm] = np.arange(nsl)
        self.slot_inv = slot_inv
        self.comm_len = lens
        anc_order = nid[~is_comm]                      # anchor numbers in processing order
        self.anc_order = anc_order
        anc_inv = np.empty(A, np.int64)
        anc_inv[anc_order] = np.arange(A)
        self.anc_inv = anc_inv
        # batch boundaries in comm / slot / anchor processing indices
        ncomm_before = np.r_[0, np.cumsum(is_comm)]
        nanc_before = np.r_[0, np.cumsum(~is_comm)]
        cslot = np.r_[0, np.cumsum(lens)]
        b0, b1 = self.cuts[:-1], self.cuts[1:]
        self.b_c0, self.b_c1 = ncomm_before[b0], ncomm_before[b1]
        self.b_s0, self.b_s1 = cslot[self.b_c0], cslot[self.b_c1]
        self.b_a0, self.b_a1 = nanc_before[b0], nanc_before[b1]
        # per processing slot: X column of the anchor before its call, queue predecessor
        XB = A                                          # first rank-base column of X
        self.XB = XB
        ps = slot_perm
        cab = ab[m.sl_call[ps]] if nsl else np.zeros(0, np.int64)
        self.s_xcol = np.where(cab >= 0, anc_inv[np.maximum(cab, 0)] if A else 0, XB + rpos[m.sl_call[ps]]) if nsl else cab
        prv = m.sl_prev[ps] if nsl else np.zeros(0, np.int64)
        self.s_prev = np.where(prv >= 0, slot_inv[np.maximum(prv, 0)], nsl)   # nsl: -inf column
        self.s_dep = m.sl_dep[ps] if nsl else np.zeros(0, bool)
        # local comm index within each batch, for reduceat
        comm_of_pslot = np.repeat(np.arange(C), lens) if C else np.zeros(0, np.int64)
        self.s_comm = comm_of_pslot
        self.comm_slot0 = cslot[:-1]
        # per processing anchor: X column of its previous anchor, its slot (processing)
        ao_ev = anc[anc_order] if A else np.zeros(0, np.int64)
        self.a_ev = ao_ev
        pa = ab[ao_ev] if A else np.zeros(0, np.int64)
        self.a_xprev = np.where(pa >= 0, anc_inv[np.maximum(pa, 0)] if A else 0, XB + rpos[ao_ev]) if A else pa
        self.a_slot = slot_inv[m.ev_slot[ao_ev]] if A else np.zeros(0, np.int64)
        # per event: X column of the anchor before it
        self.e_xcol = np.where(ab >= 0, anc_inv[np.maximum(ab, 0)] if A else 0, XB + rpos) if E else ab


def plan_for(m: Model) -> _Plan:
    p = getattr(m, "_plan", None)
    if p is None:
        with _CACHE_LOCK:
            p = getattr(m, "_plan", None)
            if p is None:
                p = _Plan(m)
                m._plan = p
    return p


def _offsets(m: Model, plan: _Plan, gap: np.ndarray) -> np.ndarray:
    """start'_e - X[anchor before e]: the gaps and local durations since that anchor."""
    dloc = np.where(m.ev_anchor, 0.0, m.ev_dur)
    u = gap + dloc
    c = np.cumsum(u)
    # per-rank cumsum
    c0 = np.r_[0.0, c][m.rank_lo]
    c = c - c0[plan.rpos]
    ab = plan.anc_before
    ca = np.where(ab >= 0, c[plan.anc[np.maximum(ab, 0)]] if plan.A else 0.0, 0.0)
    return c - dloc - ca


try:
    if os.environ.get("COMMTRACE_PURE_PYTHON"):
        raise ImportError
    from . import _replay as _C
except ImportError:  # no compiler at install time: the numpy batches below
    _C = None


def _c_inputs(m: Model) -> dict:
    """Scenario-independent arrays of the C replay (cached on the model)."""
    ci = getattr(m, "_c_inputs", None)
    if ci is not None:
        return ci
    with _CACHE_LOCK:
        ci = getattr(m, "_c_inputs", None)
        return ci if ci is not None else _c_inputs_build(m)


def _c_inputs_build(m: Model) -> dict:
    E, nsl, C = m.n_events, len(m.sl_comm), len(m.cm_lo)
    call_slot = np.full(E, -1, np.int64)
    if nsl:
        call_slot[m.sl_call] = np.arange(nsl)
    # queue successors: comm of slot j follows comm of slot sl_prev[j]
    has = np.flatnonzero(m.sl_prev >= 0)
    pred = m.sl_comm[m.sl_prev[has]] if len(has) else np.zeros(0, np.int64)
    sc = m.sl_comm[has] if len(has) else np.zeros(0, np.int64)
    o = np.argsort(pred, kind="stable")
    succ = np.ascontiguousarray(sc[o], np.int64)
    succ_lo = np.r_[0, np.cumsum(np.bincount(pred, minlength=C))].astype(np.int64) if C else np.zeros(1, np.int64)
    ci = {"rank_lo": np.ascontiguousarray(m.rank_lo, np.int64), "rank_hi": np.ascontiguousarray(m.rank_hi, np.int64),
          "dur": np.ascontiguousarray(m.ev_dur, np.float64), "rho": np.ascontiguousarray(m.ev_rho, np.float64),
          "anchor": np.ascontiguousarray(m.ev_anchor, np.uint8), "ev_slot": np.ascontiguousarray(m.ev_slot, np.int64),
          "call_slot": call_slot, "sl_comm": np.ascontiguousarray(m.sl_comm, np.int64),
          "sl_dep": np.ascontiguousarray(m.sl_dep, np.uint8), "sl_prev": np.ascontiguousarray(m.sl_prev, np.int64),
          "cm_lo": np.ascontiguousarray(m.cm_lo, np.int64), "cm_hi": np.ascontiguousarray(m.cm_hi, np.int64),
          "succ_lo": succ_lo, "succ": succ, "nomask": np.zeros(nsl, np.uint8)}
    m._c_inputs = ci
    return ci


#: Scenarios replayed together by one pass of the C loop (their times side by side; memory: one
#: float64 per scenario for each slot in flight, entered and not yet read by all its readers,
#: rows reused: at most 317 on 64 x 20,000, where one row per slot was 123 MB for 12 scenarios;
#: and two int32 per slot).
C_BATCH = 12
_NO_AT = np.zeros(0, np.int64)
_NO_TO = np.zeros(0, np.float64)


def _replay_c(m: Model, scenarios: list[Scenario], keep_events: bool) -> ReplayResult:
    """All scenarios through `_replay.replay_many`, C_BATCH at a time: the loop's path through
    the trace is the same for every scenario (it depends on the structure, not the times), so
    one pass computes several; the run and step ends are taken in the loop."""
    ci = _c_inputs(m)
    S, E, R = len(scenarios), m.n_events, len(m.ranks)
    steps, sinv, sok = _step_index(m)
    ev_steppos = _ev_steppos(m, ci)
    packed = _packed_events(m, ci, ev_steppos) if PACKED else None
    nst = len(steps)
    t_end = np.zeros(S)
    step_end = np.full((S, nst), -np.inf)
    kept = np.empty((S, E)) if keep_events else None
    noex = np.zeros(R, np.uint8)
    for b0 in range(0, S, C_BATCH):
        batch = scenarios[b0:b0 + C_BATCH]
        gaps, tcs, tcis, masks, queues, excls = [], [], [], [], [], []
        ats, tos = [], []
        for sc in batch:
            gaps.append(np.ascontiguousarray(m.ev_gap if sc.gap is None else sc.gap, np.float64))
            ats.append(_NO_AT if sc.gap_at is None else np.ascontiguousarray(sc.gap_at, np.int64))
            tos.append(_NO_TO if sc.gap_at is None else np.ascontiguousarray(sc.gap_to, np.float64))
            # (the loop reads tc at the dependent slots only and tc_ind at the others: the
            # scenario's arrays as they are, no np.where with m.sl_tc of 10 MB each)
            tcs.append(np.ascontiguousarray(m.sl_tc if sc.tc is None else sc.tc, np.float64))
            tcis.append(np.ascontiguousarray(m.sl_tc if sc.tc_ind is None else sc.tc_ind, np.float64))
            masks.append(ci["nomask"] if sc.mask is None else np.ascontiguousarray(sc.mask, np.uint8))
            queues.append(bool(sc.queue))
            excls.append(noex if not sc.exclude_ranks
                         else np.isin(m.ranks, np.asarray(sc.exclude_ranks, np.int64)).astype(np.uint8))
        k = kept[b0:b0 + len(batch)] if kept is not None else None
        te, se = _C.replay_many(ci["rank_lo"], ci["rank_hi"], ci["dur"], ci["rho"], ci["anchor"], ci["ev_slot"],
                                ci["call_slot"], ci["sl_comm"], ci["sl_dep"], ci["sl_prev"], ci["cm_lo"], ci["cm_hi"],
                                ci["succ_lo"], ci["succ"], ev_steppos, nst, gaps, tcs, tcis, masks, queues, excls, k,
                                ats, tos, packed, all(sc.gap is None for sc in batch))
        t_end[b0:b0 + len(batch)] = np.frombuffer(te, np.float64)
        if nst:
            step_end[b0:b0 + len(batch)] = np.frombuffer(se, np.float64).reshape(len(batch), nst)
    return ReplayResult([s.name for s in scenarios], t_end, steps, step_end, kept)


def _ev_steppos(m: Model, ci: dict) -> np.ndarray:
    """Per event, the position of its step in _step_index's steps (-1 without one), cached in
    the C replay's inputs."""
    ev_steppos = ci.get("ev_steppos")
    if ev_steppos is None:
        with _CACHE_LOCK:
            ev_steppos = ci.get("ev_steppos")
            if ev_steppos is None:
                _, sinv, sok = _step_index(m)
                ev_steppos = np.full(m.n_events, -1, np.int64)
                ev_steppos[sok] = sinv
                ci["ev_steppos"] = ev_steppos
    return ev_steppos


#: replay_many's per-event records (`_replay.c` EvP: gap, rho or dur, call slot, event slot, step
#: position, anchor flag; 32 bytes), built once per model (_packed_events) instead of in every
#: pass; False: each pass packs its own.
_EVP = np.dtype([("gap", "<f8"), ("dr", "<f8"), ("cs", "<i4"), ("sl", "<i4"), ("step", "<i4"), ("anchor", "<i4")])
PACKED = True


def _packed_events(m: Model, ci: dict, ev_steppos: np.ndarray):
    """The replay's packed per-event records of model `m` (cached in the C replay's inputs), with
    the measured gaps; None where an index would not fit in int32 (the C loop refuses those)."""
    pk = ci.get("packed")
    if pk is not None:
        return pk
    with _CACHE_LOCK:
        pk = ci.get("packed")
        if pk is None:
            E = m.n_events
            if E >= 2 ** 31 - 1 or len(m.sl_comm) >= 2 ** 31 - 1:
                return None
            pk = np.empty(E, _EVP)
            pk["gap"] = m.ev_gap
            pk["dr"] = np.where(m.ev_anchor, m.ev_rho, m.ev_dur)
            pk["cs"] = ci["call_slot"]
            pk["sl"] = ci["ev_slot"]
            pk["step"] = ev_steppos
            pk["anchor"] = ci["anchor"]
            ci["packed"] = pk
    return pk


def release_packed(m: Model) -> None:
    """Drop the packed per-event records of model `m` (what_if, once its replays are done: 64
    MB on 64 x 20,000 that a cached model would otherwise hold; a later replay builds them
    again)."""
    ci = getattr(m, "_c_inputs", None)
    if ci is not None:
        with _CACHE_LOCK:
            ci.pop("packed", None)


def prepare(m: Model) -> None:
    """Build replay()'s scenario-independent inputs of model `m` (cached on it) in the calling
    thread, before replays in several threads would each build them: what_if runs it in a
    second thread beside delay analysis (rootcause.SPLIT), or in its own before the free
    scenarios' replay starts beside it; replay_split runs it first (cached: nothing then)."""
    if _C is not None:
        ci = _c_inputs(m)
        evsp = _ev_steppos(m, ci)
        if PACKED:
            _packed_events(m, ci, evsp)
    else:
        plan_for(m)
    _step_index(m)


def _replay_c_each(m: Model, scenarios: list[Scenario], keep_events: bool) -> ReplayResult:
    """The C replay one scenario per call (`_replay.replay`): the reference of _replay_c."""
    ci = _c_inputs(m)
    S, E = len(scenarios), m.n_events
    t_end = np.zeros(S)
    steps, sinv, sok = _step_index(m)
    step_end = np.full((S, len(steps)), -np.inf)
    kept = np.empty((S, E)) if keep_events else None
    for i, sc in enumerate(scenarios):
        gap = np.ascontiguousarray(sc.gap_of(m), np.float64)
        tc = np.ascontiguousarray(m.sl_tc if sc.tc is None else np.where(m.sl_dep, sc.tc, m.sl_tc), np.float64)
        tci = np.ascontiguousarray(m.sl_tc if sc.tc_ind is None else np.where(~m.sl_dep, sc.tc_ind, m.sl_tc), np.float64)
        mask = ci["nomask"] if sc.mask is None else np.ascontiguousarray(sc.mask, np.uint8)
        buf = _C.replay(ci["rank_lo"], ci["rank_hi"], gap, ci["dur"], ci["rho"], ci["anchor"], ci["ev_slot"],
                        ci["call_slot"], ci["sl_comm"], ci["sl_dep"], tc, tci, ci["sl_prev"], mask, ci["cm_lo"],
                        ci["cm_hi"], ci["succ_lo"], ci["succ"], bool(sc.queue))
        rel = np.frombuffer(buf, np.float64)
        _collect(m, sc, rel, i, t_end, step_end, sinv, sok, kept)
    return ReplayResult([s.name for s in scenarios], t_end, steps, step_end, kept)


def _collect(m: Model, sc: Scenario, rel, i: int, t_end, step_end, sinv, sok, kept) -> None:
    """Scenario `i`'s run end (without its excluded ranks), step ends and kept events, from its
    replayed release times `rel` (one per event)."""
    if sc.exclude_ranks:
        keep = ~np.isin(m.ev_rank, np.asarray(sc.exclude_ranks, np.int64))
        t_end[i] = rel[keep].max() if keep.any() else 0.0
    else:
        t_end[i] = rel.max() if len(rel) else 0.0
    if len(step_end[i]):
        step_end[i] = _step_max(m, rel)
    if kept is not None:
        kept[i] = rel


def replay(m: Model, scenarios: list[Scenario], keep_events: bool = False, engine: str | None = None) -> ReplayResult:
    """Replay `scenarios` through model `m` (see the module doc). `engine`: "c" (the compiled
    event loop, all scenarios in one pass, the default when built), "c-each" (the compiled
    loop once per scenario: the reference of "c") or "numpy" (batches of independent
    communications)."""
    if engine is None:
        engine = "c" if _C is not None else "numpy"
    if engine in ("c", "c-each"):
        if _C is None:
            raise RuntimeError("the C replay (commtrace.analysis._replay) is not built")
        try:
            return (_replay_c if engine == "c" else _replay_c_each)(m, scenarios, keep_events)
        except RuntimeError:
            pass   # a dependency cycle in odd input: the numpy path orders by keys instead
    return _replay_numpy(m, scenarios, keep_events)


def replay_split(m: Model, scenarios: list[Scenario]) -> ReplayResult:
    """replay(m, scenarios), the first half of the scenarios in this thread and the second in
    another at the same time (the compiled loop releases the GIL): each scenario's figures are
    its own, whichever pass computes them."""
    if _C is None or len(scenarios) < 2:
        return replay(m, scenarios)
    from . import in_thread
    k = (len(scenarios) + 1) // 2
    prepare(m)      # (the cached inputs built once, here, not by both threads)
    beside = in_thread(replay, m, scenarios[k:], name="commtrace-whatif")
    a = replay(m, scenarios[:k])
    b = beside.result()
    return ReplayResult(a.names + b.names, np.r_[a.t_end, b.t_end], a.steps, np.concatenate([a.step_end, b.step_end]),
                        None)


def _replay_numpy(m: Model, scenarios: list[Scenario], keep_events: bool = False) -> ReplayResult:
    plan = plan_for(m)
    S = len(scenarios)
    E, A, R = plan.E, plan.A, plan.R
    nsl = len(m.sl_comm)
    ps = plan.slot_perm
    off = np.empty((S, E))
    tc = np.empty((S, nsl))
    tci = np.empty((S, nsl))
    mask = np.zeros((S, nsl))
    qmask = np.zeros((S, 1))
    for i, sc in enumerate(scenarios):
        off[i] = _offsets(m, plan, sc.gap_of(m))
        t = m.sl_tc if sc.tc is None else np.where(m.sl_dep, sc.tc, m.sl_tc)
        ti = m.sl_tc if sc.tc_ind is None else np.where(~m.sl_dep, sc.tc_ind, m.sl_tc)
        tc[i] = t[ps]
        tci[i] = ti[ps]
        if sc.mask is not None:
            mask[i] = np.where(sc.mask[ps], -np.inf, 0.0)
        if not sc.queue:
            qmask[i] = -np.inf
    s_off = off[:, m.sl_call[ps]] if nsl else np.zeros((S, 0))
    a_off = off[:, plan.a_ev] if A else np.zeros((S, 0))
    a_rho = m.ev_rho[plan.a_ev] if A else np.zeros(0)
    X = np.zeros((S, A + R))
    L = np.full((S, nsl + 1), -np.inf)
    has_mask = bool(np.any(mask))
    dep = plan.s_dep
    s_xcol, s_prev, a_xprev, a_slot = plan.s_xcol, plan.s_prev, plan.a_xprev, plan.a_slot
    comm_slot0, s_comm = plan.comm_slot0, plan.s_comm
    for s0, s1, c0, c1, a0, a1 in zip(plan.b_s0.tolist(), plan.b_s1.tolist(), plan.b_c0.tolist(),
                                      plan.b_c1.tolist(), plan.b_a0.tolist(), plan.b_a1.tolist()):
        if s1 > s0:
            ent = X[:, s_xcol[s0:s1]] + s_off[:, s0:s1]
            q = L[:, s_prev[s0:s1]] + qmask
            if has_mask:
                q = q + mask[:, s0:s1]
            arr = ent + mask[:, s0:s1] if has_mask else ent
            mm = np.maximum(arr, q)
            if c1 - c0 == 1:
                T0 = mm.max(axis=1, keepdims=True)
                T0s = T0
            else:
                T0 = np.maximum.reduceat(mm, comm_slot0[c0:c1] - s0, axis=1)
                T0s = T0[:, s_comm[s0:s1] - c0]
            if has_mask:
                T0s = np.maximum(T0s, ent)
            L[:, s0:s1] = np.where(dep[s0:s1], T0s + tc[:, s0:s1], ent + tci[:, s0:s1])
        if a1 > a0:
            st = X[:, a_xprev[a0:a1]] + a_off[:, a0:a1]
            X[:, a0:a1] = np.maximum(st, L[:, a_slot[a0:a1]]) + a_rho[a0:a1]
    # every event's release, one scenario at a time (memory: one row of E)
    del s_off, a_off, tc, tci, mask
    t_end = np.zeros(S)
    steps, sinv, sok = _step_index(m)
    step_end = np.full((S, len(steps)), -np.inf)
    kept = np.empty((S, E)) if keep_events else None
    for i in range(S):
        rel = X[i, plan.e_xcol] + off[i]
        rel += np.where(m.ev_anchor, 0.0, m.ev_dur)
        if A:
            rel[plan.anc] = X[i, plan.anc_inv]
        _collect(m, scenarios[i], rel, i, t_end, step_end, sinv, sok, kept)
    return ReplayResult([s.name for s in scenarios], t_end, steps, step_end, kept)


def _step_index(m: Model):
    """(step numbers, step position of each event with a step, mask of those events), and the
    events with a step grouped by step (cached on the model)."""
    si = getattr(m, "_step_idx", None)
    if si is not None:
        return si[:3]
    with _CACHE_LOCK:
        si = getattr(m, "_step_idx", None)
        return si[:3] if si is not None else _step_index_build(m)


def _step_index_build(m: Model):
    ok = m.ev_step >= 0
    if not ok.any():
        si = (np.zeros(0, np.int64), np.zeros(0, np.int64), ok, np.zeros(0, np.int64), np.zeros(0, np.int64))
    else:
        evs = np.flatnonzero(ok)
        o = stable_argsort(m.ev_step[evs])
        st = m.ev_step[evs[o]]
        b = np.flatnonzero(np.r_[True, st[1:] != st[:-1]])
        steps = st[b]
        inv = np.empty(len(evs), np.int64)
        inv[o] = np.cumsum(np.r_[True, st[1:] != st[:-1]]) - 1
        si = (steps, inv, ok, evs[o], b)
    m._step_idx = si
    return si[:3]


def _step_max(m: Model, rel: np.ndarray) -> np.ndarray:
    """Per step (of _step_index), the latest of `rel` over its events."""
    _step_index(m)
    _, _, _, ev_by_step, b = m._step_idx
    return np.maximum.reduceat(rel[ev_by_step], b) if len(b) else np.zeros(0)


def _step_ends(m: Model, rel: np.ndarray):
    steps, inv, ok = _step_index(m)
    out = np.full((rel.shape[0], len(steps)), -np.inf)
    for i in range(rel.shape[0]):
        if len(steps):
            out[i] = _step_max(m, rel[i])
    return steps, out


def measured_step_ends(m: Model):
    return _step_ends(m, m.ev_rel[None, :])


# ------------------------------------------------------------------ scenarios
def baseline() -> Scenario:
    return Scenario("as measured", "baseline")


# Scenarios change only what lies in the window (`m.t_begin` on; docs/findings.md "What-if by
# replay"): before it, every rank replays as measured (start-up skew is not part of the run
# time the gains are a share of), so no scenario saves more than the window. A gap is cut by
# at most its part after `t_begin`; a transfer that started before it, and the arrivals at a
# communication that did, stay as measured.
def _window_cut(m: Model, ev: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """`cut` of the gaps of events `ev`, limited to each gap's part inside the window."""
    return np.minimum(cut, np.maximum(m.ev_start[ev] - m.t_begin, 0.0))


def _pre_window(m: Model) -> np.ndarray:
    """Per slot: its transfer started before the window (a dependent slot at its communication's
    start, an independent one at its entry); cached on the model."""
    pre = getattr(m, "_pre_window", None)
    if pre is None:
        if len(m.sl_comm):
            pre = np.where(m.sl_dep, m.cm_T0[m.sl_comm], m.sl_enter) < m.t_begin
        else:
            pre = np.zeros(0, bool)
        m._pre_window = pre
    return pre


def rank_median(m: Model, rank: int) -> Scenario:
    """Rank `rank` as fast as the median rank: its gaps cut by their excess (in the window)."""
    sel = np.flatnonzero(m.ev_rank == int(rank))
    return Scenario(f"rank {int(rank)} as fast as the median rank", "rank_median", {"rank": int(rank)},
                    gap_at=sel, gap_to=m.ev_gap[sel] - _window_cut(m, sel, m.ev_excess[sel]))


def fix_delay(m: Model, event: int, label: str = "") -> Scenario:
    """The delay (excess gap) of one event removed (its part in the window)."""
    e = np.array([int(event)], np.int64)
    return Scenario(label or f"delay of event {event} removed", "fix_delay", {"event": int(event)},
                    gap_at=e, gap_to=m.ev_gap[e] - _window_cut(m, e, m.ev_excess[e]))


def comm_hidden(m: Model) -> Scenario:
    """All communication fully overlapped: no transfer time on the host's path (transfers
    that started before the window as measured)."""
    pre = _pre_window(m)
    z = np.where(pre, m.sl_tc, 0.0) if pre.any() else np.zeros(len(m.sl_comm))
    return Scenario("all communication fully overlapped", "comm_hidden", {}, tc=z, tc_ind=z, queue=False)


def busbw_ref(m: Model, op: str, gbps: float) -> Scenario:
    """Every collective `op` at bus bandwidth `gbps` (GB/s): t_comm = S x F / busbw."""
    t_ref = m.cm_bytes * m.cm_factor / float(gbps)     # bytes / (GB/s) = ns
    sel_c = (m.cm_op == op) & ~m.cm_is_p2p
    delta = np.where(sel_c, t_ref - m.cm_tcomm, 0.0)
    tc = np.maximum(m.sl_tc + delta[m.sl_comm], 0.0)
    pre = _pre_window(m)
    if pre.any():
        tc = np.where(pre, m.sl_tc, tc)
    return Scenario(f"every {op} at {gbps:g} GB/s bus bandwidth", "busbw_ref", {"op": op, "busbw_gbps": float(gbps)}, tc=tc)


def remove_rank(m: Model, rank: int, pg: str) -> Scenario:
    """Rank `rank`'s arrivals no longer hold the collectives of group `pg`, and the run ends
    with the other ranks' last release (the rank's own late work no longer counts: as if a
    spare took its place on that group)."""
    codes = np.flatnonzero(m.pg_names == pg)       # (by code: no string per slot)
    sel = (m.sl_rank == int(rank)) & np.isin(m.cm_pgc[m.sl_comm], codes) & ~_pre_window(m)
    return Scenario(f"rank {int(rank)} removed from pg {pg}'s critical path", "remove_rank",
                    {"rank": int(rank), "pg": pg}, mask=sel, exclude_ranks=(int(rank),))


def validate(run) -> dict:
    """Replay of the unchanged trace against the measured run and step times."""
    m = build_model(run)
    res = replay(m, [baseline()])
    return _validation(m, res)


def _validation(m: Model, res: ReplayResult) -> dict:
    meas = m.t_end - m.t_begin
    rep = float(res.t_end[0]) - m.t_begin
    steps, ms = measured_step_ends(m)
    out = {"run_time_s": meas / 1e9, "replayed_s": rep / 1e9,
           "error": (rep - meas) / meas if meas > 0 else 0.0, "steps": []}
    if len(steps):
        me = ms[0]
        re = res.step_end[0]
        prev_m = prev_r = m.t_begin
        errs = []
        for s, a, b in zip(steps.tolist(), me.tolist(), re.tolist()):
            if a < m.t_begin:
                prev_m, prev_r = a, b
                continue
            dm, dr = a - prev_m, b - prev_r
            out["steps"].append({"step": int(s), "measured_s": dm / 1e9, "replayed_s": dr / 1e9})
            if dm > 0:
                errs.append(abs(dr - dm) / dm)
            prev_m, prev_r = a, b
        out["max_step_error"] = max(errs) if errs else 0.0
    return out
