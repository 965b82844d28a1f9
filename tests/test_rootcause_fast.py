"""Issue 18 (speed): the vectorised paths of the host model, the critical path, delay analysis
and the replay's step ends equal straightforward reference implementations (the previous
code: SQL, one global sort, Python loops) on small randomized synthetic runs: a run with
send/recv, hazards, a straggler and skipped ops, a TP x DP layout and a pipeline with jitter.
"""

from __future__ import annotations

import numpy as np
import pytest

import commtrace
from commtrace.analysis import critical_path as CP
from commtrace.analysis import delay as D
from commtrace.analysis import model as M
from commtrace.analysis import replay as RP
from commtrace.analysis import rootcause as RC
from commtrace.analysis.synth import synth_layout, synth_run


@pytest.fixture(scope="module", params=["run", "tpdp", "pipe"])
def run(request, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("rcfast") / request.param)
    rng = np.random.default_rng(7)
    if request.param == "run":
        synth_run(out, ranks=6, ops=900, straggler=[(int(rng.integers(6)), 700_000)], hazards=True,
                  init_stall_ns=3_000_000, seed=11, parts_per_rank=2)
    elif request.param == "tpdp":
        synth_layout(out, "tpdp", tp=2, dp=3, steps=7, jitter_ns=200_000, seed=3,
                     delays=[(int(rng.integers(6)), 2, 3_000_000), (int(rng.integers(6)), 4, 2_000_000, "dp")])
    else:
        synth_layout(out, "pipeline", stages=5, steps=5, microbatches=3, jitter_ns=150_000, seed=5,
                     delays=[(2, 3, 2_500_000, 1)])
    r = commtrace.load(out)
    RC.ENABLED.add(r)
    return r


def test_rows_in_rank_and_enqueue_order(run):
    m = M.build_model(run)
    rows = run.arrow(f"SELECT rank, t_enqueue_ns, rid FROM {run.table('ops')} WHERE kind = 'op' "
                     "ORDER BY rank, t_enqueue_ns NULLS LAST, rid")
    t = run.arrow(f"SELECT {', '.join(M.ROW_COLUMNS + M.P2P_COLUMNS)}, rid AS orid, ckey FROM {run.table('ops')} WHERE kind = 'op'")
    r = M._Rows(t)
    assert np.array_equal(r.col("orid"), rows.column("rid").to_numpy())
    # labels read through the permutation
    ops = run.arrow(f"SELECT rid, op, site FROM {run.table('ops')} WHERE kind = 'op'").to_pydict()
    by_rid = {k: (o or "", s or "") for k, o, s in zip(ops["rid"], ops["op"], ops["site"])}
    orid = r.col("orid")
    for i in range(0, len(orid), 37):
        assert (m.row_op[i], m.row_site[i]) == by_rid[int(orid[i])]


@pytest.mark.parametrize("p2p_columns", ["every row", "attached"])
def test_p2p_slots_equal_the_sql_matching(run, p2p_columns):
    """The p2p slots in numpy equal the SQL matching, with the p2p columns read for every row
    or, as the model reads them, only at the send / recv rows (_Rows.attach)."""
    ref = M._p2p_sql(run).to_pydict()
    if p2p_columns == "attached":
        cur = run.cursor()
        rows = M._read_rows(run, run.table("ops"), cur)[0]
        cur.close()
        assert set(rows._sparse) == set(M.P2P_COLUMNS) and "peer" not in rows._num
    else:
        t = run.arrow(f"SELECT {', '.join(M.ROW_COLUMNS + M.P2P_COLUMNS)}, rid AS orid, ckey FROM {run.table('ops')} "
                      "WHERE kind = 'op'")
        rows = M._Rows(t)
    NUL = np.iinfo(np.int64).min
    pgc, pg_vals = rows.dict_values("pg")
    opc, op_vals = rows.dict_values("op")
    pos, ps, src, dst, nbytes = M._p2p_slots(
        rows, rows.col("ckey", fill=-1, dtype=np.int64), rows.col("rank", dtype=np.int64),
        *(rows.col(c, fill=NUL, dtype=np.int64) for c in ("t_enqueue_ns", "t_end_ns", "t_return_ns")),
        pgc, pg_vals, opc, op_vals, NUL)
    assert run is not None and len(pos) == len(ref["rid"])
    assert rows.col("orid")[pos].tolist() == ref["rid"]
    assert ps.tolist() == ref["ps"] and src.tolist() == ref["src"] and dst.tolist() == ref["dst"]
    assert nbytes.tolist() == [float(b or 0) for b in ref["cbytes"]]


def test_excess_equals_one_global_sort(run):
    m = M.build_model(run)
    # the reference: every event by one global sort (the inputs rebuilt from the model)
    ev_coll = np.where(m.ev_slot >= 0, m.sl_comm[np.maximum(m.ev_slot, 0)], -1)
    cc = np.maximum(ev_coll, 0)
    ev_coll = np.where((ev_coll >= 0) & ~m.cm_is_p2p[cc] & (m.cm_hi[cc] - m.cm_lo[cc] >= 2), ev_coll, -1)
    site = run.arrow(f"SELECT rid, site, op FROM {run.table('ops')} WHERE kind = 'op'").to_pydict()
    labs = {}
    lab_of = {rid: labs.setdefault((s, o), len(labs)) for rid, s, o in zip(site["rid"], site["site"], site["op"])}
    t = run.arrow(f"SELECT rid FROM {run.table('ops')} WHERE kind = 'op' ORDER BY rank, t_enqueue_ns NULLS LAST, rid")
    row_lab = np.array([lab_of[r] for r in t.column("rid").to_pylist()], np.int64)
    ex, hp = M._excess_by_sort(m.ev_rank, row_lab[m.ev_row], m.ev_is_wait, m.ev_gap, m.ev_first, m.ev_step, ev_coll)
    assert len(ex) == m.n_events > 0
    assert np.array_equal(ex, m.ev_excess)
    assert np.array_equal(hp, m.ev_has_peers)


def test_median_of_the_others_by_rows():
    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 4, 7, 64):
        v = rng.integers(0, 5, size=(40, n)).astype(float) * 1000.0
        v[rng.random(v.shape) < 0.2] = np.nan
        ex, hp = M._median_others_rows(v)
        for i in range(v.shape[0]):
            for j in range(n):
                others = [x for k, x in enumerate(v[i]) if k != j and not np.isnan(x)]
                if np.isnan(v[i, j]) or not others:
                    assert not hp[i, j] and ex[i, j] == 0.0
                else:
                    assert hp[i, j] and ex[i, j] == max(0.0, v[i, j] - float(np.median(others)))


def _walk_reference_queued(m, c):
    best, bs = -np.inf, -1
    for j in range(int(m.cm_lo[c]), int(m.cm_hi[c])):
        p = int(m.sl_prev[j])
        if p >= 0 and m.sl_leave[p] > best:
            best, bs = m.sl_leave[p], p
    return bs


def test_critical_path_queue_and_summary(run):
    m = M.build_model(run)
    q = CP._queued_behind(m)
    assert [int(x) for x in q] == [_walk_reference_queued(m, c) for c in range(len(m.cm_lo))]
    s = CP.summary(run)
    sg = CP._segments(run)[1]
    L = sg["t1"] - sg["t0"]
    tc_total, tc_win, per_op = {}, {}, {}
    for op, tcv, t0 in zip(m.cm_op.tolist(), m.cm_tcomm.tolist(), m.cm_T0.tolist()):
        tc_total[op] = tc_total.get(op, 0.0) + tcv
        tc_win[op] = tc_win.get(op, 0.0) + max(0.0, min(t0 + tcv, m.t_end) - max(t0, m.t_begin))
    for c, ln in zip(sg["comm"][sg["kind"] == 2].tolist(), L[sg["kind"] == 2].tolist()):
        per_op[str(m.cm_op[c])] = per_op.get(str(m.cm_op[c]), 0.0) + ln
    ref = sorted(({"op": op, "on_path_s": per_op.get(op, 0.0) / 1e9,
                   "off_path_s": max(tc_win.get(op, 0.0) - per_op.get(op, 0.0), 0.0) / 1e9,
                   "t_comm_total_s": tc_total.get(op, 0.0) / 1e9,
                   "t_comm_in_window_s": tc_win.get(op, 0.0) / 1e9} for op in sorted(set(tc_total) | set(per_op))),
                 key=lambda x: -x["on_path_s"])
    assert s["per_op"] == ref
    steps = _per_step_reference(m, sg)
    assert s["per_step"] == steps and len(steps) > 1


def _per_step_reference(m, sg):
    """The critical path's per-step figures by a mask, np.unique and bincount per step (the loop
    summary() ran before its one bincount over all steps)."""
    L = sg["t1"] - sg["t0"]
    st = np.full(len(L), -1, np.int64)
    e = sg["event"]
    st[e >= 0] = m.ev_step[e[e >= 0]]
    sel = (e < 0) & (sg["comm"] >= 0)
    st[sel] = m.ev_step[m.sl_call[m.cm_lo[sg["comm"][sel]]]]
    steps = []
    for k in np.unique(st[st >= 0]).tolist():
        w = st == k
        rs, inv = np.unique(sg["rank"][w], return_inverse=True)
        per = np.bincount(inv, weights=L[w])
        steps.append({"step": k, "length_s": float(L[w].sum()) / 1e9, "top_rank": int(rs[np.argmax(per)]),
                      "top_rank_share": float(per.max() / L[w].sum()) if L[w].sum() > 0 else 0.0})
    return steps


def test_critical_path_per_step_on_ties_zeros_and_nan(run, monkeypatch):
    """summary()'s per-step figures by one bincount over all steps equal the per-step loop where
    ranks tie for a step (the lowest rank is named), a step's path has zero length, and (the
    loop's fallback) a length is NaN."""
    m = M.build_model(run)
    ev = np.flatnonzero(m.ev_step >= 0)
    steps = np.unique(m.ev_step[ev])
    assert len(steps) >= 3
    a, b, c = (ev[m.ev_step[ev] == s][:4] for s in steps[:3])
    events = np.r_[a, b[:1], c[:2]]
    ranks = np.array([3, 1, 3, 1, 2, 5, 4], np.int64)
    lengths = np.array([1.0, 2.0, 2.0, 1.0, 5.0, 0.0, 0.0])
    for L in (lengths, np.r_[lengths[:4], np.nan, 0.0, 0.0]):
        sg = {"rank": ranks, "t0": np.zeros(7), "t1": L.copy(), "kind": np.zeros(7, np.int64),
              "comm": np.full(7, -1, np.int64), "event": events.astype(np.int64)}
        monkeypatch.setattr(CP, "_segments", lambda _run, sg=sg: (m, sg))
        s = CP.summary(run)
        ref = _per_step_reference(m, sg)
        assert [x["top_rank"] for x in ref] == [1, 2, 4]
        assert repr(s["per_step"]) == repr(ref)      # (NaN == NaN as text)


def test_delays_per_rank_group_delayed_and_step_ends(run):
    m = M.build_model(run)
    full = D.delays(run).to_pylist()
    top = {}
    for d in full:
        top.setdefault(d["rank"], d)
    assert {d["rank"]: d for d in D.delays(run, per_rank=1).to_pylist()} == top
    a = D.attribution(run)
    for r in m.ranks.tolist():
        d = m.cm_last[m.sl_comm]
        sel = (m.sl_rank[d] == r) & ~m.cm_is_p2p[m.sl_comm]
        best = {}
        for p, x in zip(m.cm_pg[m.sl_comm[sel]].tolist(), (a["sl_direct"] + a["sl_prop"])[sel].tolist()):
            best[p] = best.get(p, 0.0) + x
        assert RC._group_delayed(m, r) == (max(best, key=best.get) if best else None)
    res = RP.replay(m, [RP.baseline(), RP.rank_median(m, int(m.ranks[0]))])
    ok = m.ev_step >= 0
    steps, inv = np.unique(m.ev_step[ok], return_inverse=True)
    for i in range(2):
        rel = RP.replay(m, [[RP.baseline(), RP.rank_median(m, int(m.ranks[0]))][i]], keep_events=True).ev_rel[0]
        ref = np.full(len(steps), -np.inf)
        np.maximum.at(ref, inv, rel[ok])
        assert np.array_equal(res.step_end[i], ref)
        assert np.array_equal(res.steps, steps)


def test_slot_order_and_call_search():
    rng = np.random.default_rng(3)
    for ties in (False, True):
        rank = rng.integers(0, 4, 500)
        block = rng.integers(0, 80 if ties else 10**9, 500).astype(float)
        key = (rank.astype(np.int64) << 44) + np.floor(block).astype(np.int64)
        o, ks = D._order_by_key(key, block, rank)
        ref = np.lexsort((block, rank))
        assert np.array_equal(o, ref) and np.array_equal(ks, key[ref])
    ekeys = np.sort(rng.integers(0, 300, 400))
    calls = rng.integers(0, 400, 200)
    q = ekeys[calls]
    assert np.array_equal(D._after_own_call(ekeys, q, calls), np.searchsorted(ekeys, q, "right"))


def test_dense_ids_group_equal_tuples():
    rng = np.random.default_rng(4)
    cols = [rng.integers(-1, 3, 300), rng.integers(-1, 5, 300), rng.integers(0, 7, 300)]
    ids = M._dense_ids(cols)
    tuples = list(zip(*(c.tolist() for c in cols)))
    for i in range(300):
        for j in range(0, 300, 7):
            assert (ids[i] == ids[j]) == (tuples[i] == tuples[j])
    assert M._dense_ids(cols, limit=10) is None


def test_other_events_by_tables_equal_the_global_sort():
    rng = np.random.default_rng(9)
    n = 3000
    rank = np.sort(rng.integers(0, 5, n))
    step = rng.integers(-1, 6, n)
    label = rng.choice([3, 4096 * 2 + 1, 4096 * 5], n)
    wait = rng.random(n) < 0.4
    gap = rng.integers(0, 50, n).astype(float) * 1000.0
    first = rng.random(n) < 0.05
    r = M._excess_other(rank, label, wait, gap, first, step)
    assert r is not None
    ref = M._excess_by_sort(rank, label, wait, gap, first, step, np.full(n, -1, np.int64))
    assert np.array_equal(r[0], ref[0]) and np.array_equal(r[1], ref[1]) and r[1].any()


def _all_scenarios(m):
    d = int(np.argmax(m.ev_excess))
    r = int(m.ranks[len(m.ranks) // 2])
    ops = sorted({str(o) for o, p in zip(m.cm_op.tolist(), m.cm_is_p2p.tolist()) if not p})
    pgs = sorted({str(p) for p in m.cm_pg.tolist()})
    return ([RP.baseline(), RP.rank_median(m, r), RP.rank_median(m, int(m.ranks[0])), RP.fix_delay(m, d),
             RP.comm_hidden(m)] + [RP.busbw_ref(m, op, 3.0) for op in ops]
            + [RP.remove_rank(m, r, pg) for pg in pgs])


@pytest.mark.skipif(RP._C is None, reason="the C replay is not built")
def test_replay_of_all_scenarios_in_one_pass_equals_one_per_call(run, monkeypatch):
    m = M.build_model(run)
    scs = _all_scenarios(m)
    # a scenario with a gap array of its own (the packed records' gaps are the measured ones)
    scs.insert(2, RP.Scenario("gaps halved", "test", gap=m.ev_gap * 0.5))
    ref = RP.replay(m, scs, keep_events=True, engine="c-each")
    # the packed per-event records built once per model (RP.PACKED) or by each pass
    for packed in (True, False):
        monkeypatch.setattr(RP, "PACKED", packed)
        for batch in (1, 2, 64):
            monkeypatch.setattr(RP, "C_BATCH", batch)
            res = RP.replay(m, scs, keep_events=True, engine="c")
            assert np.array_equal(res.t_end, ref.t_end) and np.array_equal(res.step_end, ref.step_end)
            assert np.array_equal(res.ev_rel, ref.ev_rel) and np.array_equal(res.steps, ref.steps)
    assert "packed" in RP._c_inputs(m) and RP._c_inputs(m)["packed"].dtype.itemsize == 32
    assert len(set(ref.t_end.tolist())) > 2          # the scenarios differ
    # halved between two threads (what_if's pass): the same figures, in the scenarios' order
    for k in (1, 2, len(scs)):
        sp = RP.replay_split(m, scs[:k])
        assert sp.names == ref.names[:k] and np.array_equal(sp.t_end, ref.t_end[:k])
        assert np.array_equal(sp.step_end, ref.step_end[:k]) and np.array_equal(sp.steps, ref.steps)
        part = sp.part(1, k)
        assert part.names == ref.names[1:k] and np.array_equal(part.t_end, ref.t_end[1:k])
    # and the numpy batches agree (other arithmetic order: within 1 ns)
    npy = RP.replay(m, scs, engine="numpy")
    assert np.allclose(npy.t_end, ref.t_end, rtol=0, atol=1.0)


@pytest.mark.skipif(RP._C is None, reason="the C replay is not built")
def test_what_if_drops_the_packed_records_and_a_later_replay_builds_them_again(run):
    """what_if's replays use the packed per-event records (replay._packed_events) and drop them
    when done (a cached model does not hold 32 bytes an event for nothing); a later replay
    builds them again, with the same figures."""
    m = M.build_model(run)
    wi = RC.what_if(run)
    assert wi["scenarios"] and "packed" not in RP._c_inputs(m)
    scs = _all_scenarios(m)
    a = RP.replay(m, scs)
    assert "packed" in RP._c_inputs(m)
    assert np.array_equal(a.t_end, RP.replay(m, scs, engine="c-each").t_end)


@pytest.mark.skipif(M._C is None, reason="the C helpers are not built")
def test_median_excess_in_c_equals_the_sorted_arithmetic():
    rng = np.random.default_rng(12)
    for n, G in ((2, 1), (50, 3), (5000, 40), (5000, 900)):
        g = rng.integers(0, 6, n).astype(float) * 250.0 + rng.choice([0.0, 0.5], n)
        g[rng.random(n) < 0.15] = np.nan
        grp = rng.integers(-1, G, n).astype(np.int64)
        grp[0] = 0
        ex, hp = M._C.median_excess(g, grp, G)
        ex, hp = np.frombuffer(ex, np.float64), np.frombuffer(hp, np.bool_)
        sel = np.flatnonzero(grp >= 0)
        o2 = sel[np.lexsort((np.nan_to_num(g[sel], nan=np.inf), grp[sel]))]
        rex, rhp = M._median_sorted(np.arange(len(o2)), grp[o2], g[o2])
        assert np.array_equal(ex[o2], rex) and np.array_equal(hp[o2], rhp)
        assert not ex[grp < 0].any() and not hp[grp < 0].any()
    # a group of 64 (one collective's members) against the rows' arithmetic
    v = rng.integers(0, 9, (30, 64)).astype(float)
    v[rng.random(v.shape) < 0.1] = np.nan
    ex, hp = M._C.median_excess(v.ravel(), np.repeat(np.arange(30), 64).astype(np.int64), 30)
    rex, rhp = M._median_others_rows(v)
    assert np.array_equal(np.frombuffer(ex, np.float64), rex.ravel())
    assert np.array_equal(np.frombuffer(hp, np.bool_), rhp.ravel())


def _model_fields(m):
    import dataclasses
    out = {}
    for f in dataclasses.fields(M.Model):
        v = getattr(m, f.name)
        if f.name in ("row_op", "row_site", "notes", "cm_opc", "op_names"):
            continue
        out[f.name] = v
    # op codes follow the fetch's dictionary order: compare the names they stand for
    out["cm_op_by_code"] = m.op_names[m.cm_opc]
    return out


@pytest.mark.skipif(M._C is None, reason="the C helpers are not built")
def test_model_passes_in_c_equal_numpy(run, monkeypatch):
    """merge_events, anchors, slot_prev, sync_points and median_excess (C) against the numpy
    code they replace: every array of the model equal, dtypes included."""
    mc = M._build(run)
    monkeypatch.setattr(M, "_C", None)
    mn = M._build(run)
    a, b = _model_fields(mc), _model_fields(mn)
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, k
            if x.dtype == object:
                assert x.tolist() == y.tolist(), k
            else:
                assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k
        else:
            assert x == y, k
    assert mc.n_events > 0 and mc.ev_anchor.any()


@pytest.mark.skipif(M._C is None, reason="the C helpers are not built")
def test_model_c_shortcuts_fall_back_on_unsorted_input():
    # merge_events: calls out of key order -> None (numpy sorts them)
    NUL = np.iinfo(np.int64).min
    r = np.array([0, 0, 1], np.int64)
    tq = np.array([5, 3, 1], np.int64)
    assert M._C.merge_events(r, tq, tq + 1, np.full(3, NUL), np.full(3, NUL), 0, NUL) is None
    # waits out of order are sorted (stably) in C, as numpy's stable argsort does
    tq = np.array([1, 2, 3, 4], np.int64)
    tw = np.array([9, 6, NUL, 6], np.int64)
    rk = np.zeros(4, np.int64)
    out = M._C.merge_events(rk, tq, tq, tw, tw + 1, 0, NUL)
    c = M._C
    ref = M._events_numpy(rk, tq, tw, tq.astype(float), tq.astype(float),
                          np.where(tw == NUL, np.nan, tw.astype(float)), np.where(tw == NUL, np.nan, tw + 1.0), 0, 4)
    for x, y, t in zip(out, ref, (np.int64, np.bool_, np.float64, np.float64, np.int64, np.int64)):
        assert np.array_equal(np.frombuffer(x, t), y)
    # slot_prev: a group's slots out of enter order -> None
    assert c.slot_prev(np.array([0, 0], np.int64), np.array([2.0, 1.0]), 1) is None
    assert np.frombuffer(c.slot_prev(np.array([0, 1, 0, -1], np.int64), np.array([1.0, 1.0, 1.0, 0.0]), 2),
                         np.int64).tolist() == [-1, -1, 0, -1]
    # sync_points: anchors of a group out of floor order, or times beyond 2^44 -> None
    assert c.sync_points(np.array([0, 0], np.int64), np.array([5.0, 3.0]), np.array([0], np.int64),
                         np.array([9.0]), 1) is None
    assert c.sync_points(np.array([0], np.int64), np.array([2.0 ** 45]), np.array([0], np.int64),
                         np.array([9.0]), 1) is None
    f, v = c.sync_points(np.array([0, 0, 1], np.int64), np.array([3.2, 3.7, 1.0]), np.array([0, 0, 1, 1], np.int64),
                         np.array([3.9, 2.0, 0.5, 1.5]), 2)
    assert np.frombuffer(f, np.bool_).tolist() == [True, False, False, True]
    assert np.frombuffer(v, np.float64)[[0, 3]].tolist() == [3.7, 1.0]


def test_events_of_a_run_longer_than_the_packed_keys_come_by_rank():
    """The events' merge keys (rank << 44 | ns since the start) order them by rank only while
    every start lies within 2^44 ns (4.9 hours) of the run's start: beyond it _build sorts them
    by (rank, start) itself (no C merge), so that each rank's events stay contiguous and
    rank_lo / rank_hi hold (the model's np.unique fallback gave a wrong rank_hi there)."""
    NUL = np.iinfo(np.int64).min
    big = 1 << 44
    rk = np.array([0, 0, 0, 1, 1], np.int64)
    tq = np.array([10, big + 5, big + 50, 20, 30], np.int64)       # rank 0 runs past 2^44 ns
    tr = tq + 2
    tw = np.array([NUL, big + 7, NUL, 25, NUL], np.int64)
    twe = np.where(tw == NUL, NUL, tw + 1)

    def f(a):
        return np.where(a == NUL, np.nan, a.astype(float))

    assert not M._packed_keys_exact(rk, tq, tw, 0, NUL)
    assert M._packed_keys_exact(rk, tq % big, np.where(tw == NUL, NUL, tw % big), 0, NUL)
    ev_row, ev_is_wait, ev_start, ev_rel, ev_rank, call_ev = M._events_numpy(
        rk, tq, tw, f(tq), f(tr), f(tw), f(twe), 0, 5, packed=False)
    assert ev_rank.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert ev_row.tolist() == [0, 1, 1, 2, 3, 3, 4]
    assert ev_is_wait.tolist() == [False, False, True, False, False, True, False]
    assert ev_start.tolist() == [10.0, big + 5.0, big + 7.0, big + 50.0, 20.0, 25.0, 30.0]
    assert call_ev.tolist() == [0, 1, 3, 4, 6]
    # (the packed keys would interleave the ranks)
    packed = M._events_numpy(rk, tq, tw, f(tq), f(tr), f(tw), f(twe), 0, 5)
    assert not np.all(packed[4][1:] >= packed[4][:-1])
    # within 2^44 ns both orders are the same, ties included (call before wait, then row order)
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = 60
        rk = np.sort(rng.integers(0, 4, n))
        tq = rng.integers(0, 40, n)
        o = np.lexsort((tq, rk))
        rk, tq = rk[o], tq[o]
        tw = np.where(rng.random(n) < 0.5, tq + rng.integers(0, 5, n), NUL)
        tr = tq + rng.integers(0, 3, n)
        twe = np.where(tw == NUL, NUL, tw + 1)
        a = M._events_numpy(rk, tq, tw, f(tq), f(tr), f(tw), f(twe), 0, n)
        b = M._events_numpy(rk, tq, tw, f(tq), f(tr), f(tw), f(twe), 0, n, packed=False)
        for x, y in zip(a, b):
            assert np.array_equal(x, y, equal_nan=True)


@pytest.mark.skipif(M._C is None, reason="the C helpers are not built")
def test_critical_path_walk_in_c_equals_the_python_loop(run):
    m = M.build_model(run)
    a, b = CP.walk(m), CP.walk(m, _python=True)
    assert a.keys() == b.keys() and len(b["rank"]) > 10
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def test_the_c_helpers_are_built_where_a_compiler_is():
    """The extension is optional (a failed build falls back to numpy silently): where a C
    compiler exists it must have built, with every helper, or the tests above would skip."""
    import shutil
    import sysconfig
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if not shutil.which(cc):
        pytest.skip(f"no C compiler ({cc})")
    from commtrace.analysis import _replay
    for name in ("replay", "replay_many", "median_excess", "merge_events", "anchors", "slot_prev", "sync_points",
                 "sync_points_ev", "cp_walk", "counting_argsort", "search_along", "median_excess_comms"):
        assert hasattr(_replay, name), name


def test_stable_argsort_equals_numpys():
    rng = np.random.default_rng(5)
    for n, lo, hi in ((0, 0, 1), (1, 3, 4), (1000, -5, 40), (5000, 0, 3), (3000, 10**6, 10**6 + 2000), (100, 0, 10**12)):
        k = rng.integers(lo, hi, n)
        assert np.array_equal(M.stable_argsort(k), np.argsort(k, kind="stable"))


@pytest.mark.skipif(RP._C is None, reason="the C replay is not built")
def test_sparse_gap_overrides_equal_the_dense_gaps(run):
    m = M.build_model(run)
    sparse = [RP.rank_median(m, int(r)) for r in m.ranks[:3]] + [RP.fix_delay(m, int(np.argmax(m.ev_excess)))]
    # the same scenarios with every gap written out, and one with both (overrides win)
    dense = [RP.Scenario(sc.name, sc.kind, sc.params, gap=sc.gap_of(m)) for sc in sparse]
    g = m.ev_gap * 0.5
    both = RP.Scenario("both", "x", gap=g, gap_at=sparse[0].gap_at, gap_to=sparse[0].gap_to)
    ref_both = RP.Scenario("both", "x", gap=both.gap_of(m))
    assert np.array_equal(ref_both.gap[sparse[0].gap_at], sparse[0].gap_to)
    a = RP.replay(m, sparse + [both], keep_events=True)
    b = RP.replay(m, dense + [ref_both], keep_events=True)
    assert np.array_equal(a.t_end, b.t_end) and np.array_equal(a.step_end, b.step_end)
    assert np.array_equal(a.ev_rel, b.ev_rel)
    assert len(set(a.t_end.tolist())) > 1


def test_remove_rank_selects_the_groups_slots_by_name(run):
    m = M.build_model(run)
    hits = 0
    # (slots whose transfer started before the what-if window stay as measured)
    in_window = np.where(m.sl_dep, m.cm_T0[m.sl_comm], m.sl_enter) >= m.t_begin
    for pg in sorted({str(p) for p in m.cm_pg.tolist()}):
        for r in m.ranks.tolist():
            ref = (m.sl_rank == r) & (m.cm_pg[m.sl_comm] == pg) & in_window
            assert np.array_equal(RP.remove_rank(m, r, pg).mask, ref)
            hits += int(ref.any())
    assert hits >= len(m.ranks)


@pytest.mark.skipif(M._C is None, reason="the C helpers are not built")
def test_search_along_equals_numpys_searchsorted():
    """`_replay.search_along` (delay analysis' interval ends) is np.searchsorted whatever the
    order the queries are taken in: sorted, reversed, random, with repeated keys and queries
    beyond either end; None for unsorted keys or an order that is no permutation."""
    rng = np.random.default_rng(3)
    for n, m, span in ((0, 5, 10), (1, 4, 3), (50, 200, 20), (5000, 3000, 10**6), (4000, 4000, 500), (10, 0, 5)):
        keys = np.sort(rng.integers(0, span, n)).astype(np.int64)
        q = rng.integers(-3, span + 3, m).astype(np.int64)
        for order in (np.argsort(q, kind="stable"), np.arange(m)[::-1], rng.permutation(m), np.arange(m)):
            order = np.ascontiguousarray(order, np.int64)
            for side in ("left", "right"):
                r = M._C.search_along(keys, q, order, side == "right")
                assert np.array_equal(np.frombuffer(r, np.int64), np.searchsorted(keys, q, side)), (n, m, side)
    keys = np.array([1, 5, 3], np.int64)
    q = np.array([2, 4], np.int64)
    assert M._C.search_along(keys, q, np.arange(2, dtype=np.int64), False) is None
    keys = np.array([1, 3, 5], np.int64)
    assert M._C.search_along(keys, q, np.array([1, 1], np.int64), False) is None
    assert M._C.search_along(keys, q, np.array([0, 2], np.int64), False) is None


def test_delay_attribution_with_and_without_the_c_search(run, monkeypatch):
    """Delay analysis by `_replay.search_along` equals the numpy searches (the reference),
    array by array, on the randomized runs."""
    m = M.build_model(run)
    a = D.attribute(m)
    monkeypatch.setattr(M, "_C", None)
    b = D.attribute(m)
    assert set(a) == set(b)
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert np.array_equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


_HUGEPAGE_PROBE = """
import sys
import commtrace
from numpy._core import multiarray as MA
from commtrace.analysis import model as M
from commtrace.analysis.synth import synth_layout
out = sys.argv[1]
synth_layout(out, "tpdp", tp=2, dp=2, steps=3)
before = MA._get_madvise_hugepage()
MA._set_madvise_hugepage(True)
M.build_model(commtrace.load(out))
lib = MA._get_madvise_hugepage()
if sys.argv[2] == "cli":
    from commtrace.cli import main
    M._CACHE.clear()
    assert main(["report", out, "--what-if", "--format", "json"]) == 0
print("HUGE", lib, MA._get_madvise_hugepage())
"""


@pytest.mark.parametrize("how,expected", [("lib", "True True"), ("cli", "True False")])
def test_numpy_huge_pages_off_only_in_commtraces_own_process(tmp_path, how, expected):
    """The `commtrace` command's process stops numpy's madvise(MADV_HUGEPAGE) with its malloc
    tuning (model._no_huge_pages: huge-page faults cost the 64 x 20,000 what-if 0.6-0.9 s of
    system time); a program that imports the analysis keeps numpy's setting."""
    import os
    import subprocess
    import sys
    if not hasattr(__import__("numpy")._core.multiarray, "_set_madvise_hugepage"):
        pytest.skip("numpy without _set_madvise_hugepage")
    e = {k: v for k, v in os.environ.items() if k != "COMMTRACE_MALLOC_TUNE"}
    p = subprocess.run([sys.executable, "-c", _HUGEPAGE_PROBE, str(tmp_path / "r"), how],
                       capture_output=True, text=True, env=e, timeout=300)
    assert p.returncode == 0, p.stderr
    assert [ln for ln in p.stdout.splitlines() if ln.startswith("HUGE ")] == ["HUGE " + expected]


def test_partition_order_equals_the_lexsort():
    """_p2p_slots' order of the send/recv rows within (pg, op, rank, peer) by (t_enqueue_ns,
    op_id, row id): a counting sort of the partitions where the rows' own order is that, the
    lexsort elsewhere (equal times with op_ids out of row order, ranges too large)."""
    rng = np.random.default_rng(9)
    for n, tspan, big in ((0, 5, False), (1, 5, False), (400, 10**9, False), (3000, 40, False), (3000, 40, True)):
        rank = np.sort(rng.integers(0, 6, n))
        t = rng.integers(0, tspan, n)
        o = np.lexsort((t, rank))                  # rows in (rank, t) order, as _Rows gives them
        rank, t = rank[o], t[o]
        pg = rng.integers(0, 3, n) * (10**9 if big else 1)
        is_send = rng.integers(0, 2, n)
        peer = rng.integers(0, 6, n)
        op_id = rng.integers(0, 50, n)
        rid = rng.permutation(n)
        calls = []

        def ties():
            calls.append(1)
            return op_id, rid
        got = M._partition_order([pg, is_send, rank, peer], t, ties)
        ref = np.lexsort((rid, op_id, t, peer, rank, is_send, pg))
        assert np.array_equal(got, ref), (n, tspan, big)
        if n and tspan > 10**6 and not big:
            assert not calls                        # no equal times: op_id and row id never read


@pytest.mark.skipif(M._C is None, reason="the C helpers are not built")
def test_median_excess_by_slots_equals_the_group_ids():
    """`_replay.median_excess_comms` (a collective's calls and wait()s read by slot) equals
    `median_excess` over group ids comm * 2 + is_wait, on random communications of 1 to 70
    members (some not comm_ok, some without waits, NaN gaps, equal values)."""
    rng = np.random.default_rng(21)
    for C in (1, 40, 300):
        size = rng.integers(1, 71, C)
        cm_lo = np.r_[0, np.cumsum(size)[:-1]].astype(np.int64)
        cm_hi = (cm_lo + size).astype(np.int64)
        nsl = int(size.sum())
        E = 3 * nsl
        ev = rng.permutation(E).astype(np.int64)
        sl_call = ev[:nsl].copy()
        wait_ev = np.where(rng.random(nsl) < 0.6, ev[nsl:2 * nsl], -1).astype(np.int64)
        comm_ok = (rng.random(C) < 0.8).astype(np.uint8)
        g = rng.integers(0, 7, E).astype(float) * 100.0
        g[rng.random(E) < 0.1] = np.nan
        ex = np.zeros(E)
        hp = np.zeros(E, np.uint8)
        assert M._C.median_excess_comms(g, sl_call, wait_ev, cm_lo, cm_hi, comm_ok, ex, hp) is None
        gid = np.full(E, -1, np.int64)
        comm = np.repeat(np.arange(C), size)
        okc = comm_ok[comm].astype(bool)
        gid[sl_call[okc]] = comm[okc] * 2
        w = okc & (wait_ev >= 0)
        gid[wait_ev[w]] = comm[w] * 2 + 1
        rex, rhp = M._C.median_excess(g, gid, 2 * C)
        assert np.array_equal(ex, np.frombuffer(rex, np.float64))
        assert np.array_equal(hp, np.frombuffer(rhp, np.uint8))
        assert hp.any() and (ex > 0).any()


@pytest.mark.skipif(M._C is None, reason="the C helpers are not built")
def test_sync_points_in_any_slot_order_equal_the_search():
    """`_replay.sync_points` searches each slot from its group's previous answer: for slots in
    any order (sorted, reversed, random) the answer is the last anchor of the slot's group
    with floor(rel) <= floor(enter), as the searchsorted of model._build finds it."""
    rng = np.random.default_rng(17)
    for A, NS, G in ((0, 10, 3), (1, 5, 1), (500, 800, 4), (5000, 3000, 40)):
        ag = np.sort(rng.integers(0, G, A)).astype(np.int64)
        arel = np.empty(A)
        for k in range(G):
            sel = ag == k
            arel[sel] = np.sort(rng.integers(0, 2000, sel.sum()) + rng.random(sel.sum()))
        perm = rng.permutation(A)                  # the groups' anchors interleaved
        ag, arel = ag[perm], arel[perm]
        # within a group the anchors come in floor order (as the model's do)
        ag_k, arel_k = ag.copy(), arel.copy()
        for k in range(G):
            idx = np.flatnonzero(ag == k)
            arel_k[idx] = np.sort(arel[idx])
        sg = rng.integers(0, G, NS).astype(np.int64)
        sen = rng.integers(0, 2100, NS) + rng.random(NS)
        for order in (np.arange(NS), np.arange(NS)[::-1], rng.permutation(NS)):
            r = M._C.sync_points(ag_k, arel_k, sg[order], sen[order], G)
            found, val = np.frombuffer(r[0], np.bool_), np.frombuffer(r[1], np.float64)
            akey = (ag_k << 44) + np.floor(arel_k).astype(np.int64)
            ao = np.argsort(akey, kind="stable")
            q = (sg[order] << 44) + np.floor(sen[order]).astype(np.int64)
            j = np.searchsorted(akey[ao], q, "right") - 1
            ok = (j >= 0) & ((akey[ao][np.maximum(j, 0)] >> 44) == sg[order]) if A else np.zeros(NS, bool)
            assert np.array_equal(found, ok)
            assert np.array_equal(val[ok], arel_k[ao][j[ok]])


def test_delay_passes_in_c_equal_numpy_and_are_taken(run, monkeypatch):
    """`_replay.delay_intervals` and `delay_locate` (delay.USE_C) equal the numpy reference
    value by value on the randomized runs, and the C intervals are taken there (not a silent
    fallback); unsorted event keys make the C intervals decline (False)."""
    if M._C is None:
        pytest.skip("the C extension is not built")
    m = M.build_model(run)
    taken = []
    real = D._intervals_c

    def spy(*a, **k):
        r = real(*a, **k)
        taken.append(r is not None)
        return r
    monkeypatch.setattr(D, "_intervals_c", spy)
    a = D.attribute(m)
    assert taken == [True]
    monkeypatch.setattr(D, "USE_C", False)
    b = D.attribute(m)
    assert set(a) == set(b)
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k
    # locate alone, with calls at -1 (numpy's add.at wraps them to the last event) and NaN gaps
    rng = np.random.default_rng(3)
    E, nsl = m.n_events, len(m.sl_comm)
    ws = np.sort(rng.choice(nsl, size=min(nsl, 50), replace=False)).astype(np.int64)
    d = rng.integers(0, nsl, nsl).astype(np.int64)
    s_lo = rng.integers(0, E + 1, nsl).astype(np.int64)
    s_hi = np.minimum(E, s_lo + rng.integers(0, 4, nsl)).astype(np.int64)
    direct, prop = rng.random(nsl), rng.random(nsl) * (rng.random(nsl) < 0.5)
    gpos = np.where(rng.random(E) < 0.3, 0.0, rng.random(E))
    cg = np.r_[0.0, np.cumsum(gpos)]
    mm = type("Mm", (), {})()
    mm.ev_excess = np.where(rng.random(E) < 0.7, 0.0, rng.random(E))
    mm.sl_call = np.where(rng.random(nsl) < 0.2, -1, rng.integers(0, E, nsl)).astype(np.int64)
    out = []
    for use_c in (True, False):
        ev_d, ev_p = np.zeros(E), np.zeros(E)
        if use_c:
            M._C.delay_locate(ws, d, s_lo, s_hi, direct, prop, mm.ev_excess, gpos, cg, mm.sl_call, ev_d, ev_p)
        else:
            D._locate_numpy(mm, ws, d, s_lo, s_hi, direct, prop, gpos, cg, ev_d, ev_p)
        out.append((ev_d, ev_p))
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])
    # event keys out of order: the C pass declines
    m2 = type("M2", (), {})()
    for k in ("sl_rank", "sl_sync", "sl_enter", "sl_comm", "ev_rank", "ev_first", "ev_gap", "sl_call"):
        setattr(m2, k, getattr(m, k))
    m2.ev_start = m.ev_start[::-1].copy()
    m2.n_events = m.n_events
    rk = m.sl_rank.astype(np.int64) << 44
    so, keys = D._order_by_key(rk + np.floor(m.sl_block).astype(np.int64), m.sl_block, m.sl_rank)
    omega = np.where(np.isfinite(m.sl_wait), m.sl_wait, 0.0)
    if E > 1 and len(np.unique(m.ev_start)) > 1:
        assert D._intervals_c(m2, so, keys, omega, m.cm_last[m.sl_comm], np.ones(nsl, bool)) is None


@pytest.mark.parametrize("sample", ["straggler", "hazards", "skew"])
def test_report_with_root_cause_beside_the_rest_equals_the_sequential_report(sample, monkeypatch):
    """build_report runs root cause and what-if in the main thread while a second one computes
    the rest of the report (report.PARALLEL), and parts of root cause and what-if in threads of
    their own (rootcause.PARALLEL): the same report as all in one thread, value by value (the
    findings annotated with the same cost_s / gain_s, in the same order)."""
    import os

    from commtrace.analysis import report as R
    path = os.path.join(os.path.dirname(__file__), "data", sample)
    reps = []
    for parallel, split in ((False, False), (True, False), (True, True)):
        # (and what_if's replays beside delay analysis or, with rootcause.SPLIT, all after it
        # halved between two threads; the critical path beside what_if: each in one thread
        # against two)
        for mod in (R, RC):
            monkeypatch.setattr(mod, "PARALLEL", parallel)
        monkeypatch.setattr(RC, "SPLIT", split)
        reps.append(R.build_report(commtrace.load(path), what_if=True))
    seq = reps[0]
    assert seq["what_if"] is not None and seq["what_if"]["scenarios"]
    assert any(f.get("gain_s") is not None for f in seq["findings"]) or sample != "straggler"
    for par in reps[1:]:
        assert seq.keys() == par.keys()
        for k in ("what_if", "critical_path", "findings", "per_rank", "warnings", "top_collectives", "top_sites",
                  "per_step", "collectives_summary"):
            assert par[k] == seq[k], k
        # the rest too, but DuckDB's float sums (the overview's per-step fractions) may round
        # differently in the last bit with the tables built in another order
        _assert_close(par, seq, "")


def _assert_close(a, b, where):
    import math

    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) or (math.isnan(a) and math.isnan(b)), where
    else:
        assert a == b, where


@pytest.mark.skipif(M._C is None, reason="the C helpers are not built")
def test_sync_points_of_the_anchor_events_in_place_equal_sync_points_on_their_copies():
    """`_replay.sync_points_ev` reads the anchors' groups and times through ev_slot and
    ev_anchor in place: the same answers as `sync_points` on the gathered copies (model.py's
    previous call), None in the same cases, and None for an anchor without a slot."""
    rng = np.random.default_rng(5)
    c = M._C
    for E, NS, G in ((1, 1, 1), (40, 12, 3), (3000, 900, 25)):
        for _ in range(4):
            ev_slot = rng.integers(-1, NS, E)
            anchor = (rng.random(E) < 0.6) & (ev_slot >= 0)
            rel = np.sort(rng.integers(0, 5000, E)).astype(float) + rng.choice([0.0, 0.25], E)
            sg = rng.integers(0, G, NS)
            sen = rng.integers(0, 5000, NS).astype(float) + 0.5
            ai = np.flatnonzero(anchor)
            ref = c.sync_points(np.ascontiguousarray(sg[ev_slot[ai]]), np.ascontiguousarray(rel[ai]), sg, sen, G)
            got = c.sync_points_ev(ev_slot, anchor.view(np.uint8), rel, sg, sen, G)
            assert ref is not None and got is not None
            assert bytes(got[0]) == bytes(ref[0])
            f = np.frombuffer(ref[0], np.bool_)
            assert np.array_equal(np.frombuffer(got[1], np.float64)[f], np.frombuffer(ref[1], np.float64)[f])
    # out of floor order within a group, beyond 2^44, or an anchor without a slot: None
    one = np.array([0], np.int64)
    assert c.sync_points_ev(np.array([0, 0], np.int64), np.array([1, 1], np.uint8), np.array([5.0, 3.0]), one,
                            np.array([9.0]), 1) is None
    assert c.sync_points_ev(one, np.array([1], np.uint8), np.array([2.0 ** 45]), one, np.array([9.0]), 1) is None
    assert c.sync_points_ev(np.array([-1], np.int64), np.array([1], np.uint8), np.array([1.0]), one,
                            np.array([9.0]), 1) is None


def test_labels_of_a_chunked_column():
    """The model's row labels (model._CodeLabels over model._dict_values' codes) read row i of
    a string column fetched in chunks: every row, nulls as "", equals the column's value."""
    import pyarrow as pa
    rng = np.random.default_rng(5)
    vals = [None if rng.random() < 0.1 else f"train.py:{int(rng.integers(1000))}" for _ in range(2000)]
    cuts = [0, 1, 700, 700, 1500, 2000]          # an empty chunk and a one-row chunk among them
    col = pa.chunked_array([pa.array(vals[a:b], pa.string()) for a, b in zip(cuts[:-1], cuts[1:])])
    flat = [v if v is not None else "" for v in vals]
    codes, values = M._dict_values(pa.table({"site": col}), "site")
    lab = M._CodeLabels(codes.astype(np.int32), values)
    assert [lab[i] for i in range(len(vals))] == flat
    assert [lab[np.int64(i)] for i in (0, 1, 700, 1999)] == [flat[i] for i in (0, 1, 700, 1999)]


@pytest.mark.skipif(RP._C is None, reason="the C replay is not built")
def test_replay_with_thousands_of_slots_in_flight_equals_one_per_call():
    """replay_many keeps a slot's times in a pooled row from its entry until its last reader
    (the anchors waiting for it, its queue successor) has read them; here each of 3 ranks issues
    1,500 collectives before it waits for any (4,500 slots in flight: the pool grows past its
    first 1,024 rows, twice), the waits in another order than the issues on one rank, and the
    queue successors read their predecessors: the same times as one full row per slot (c-each)."""
    from types import SimpleNamespace

    rng = np.random.default_rng(5)
    R, K = 3, 1500
    C, NS = K, R * K
    sl_comm = np.repeat(np.arange(C), R)                      # comm i: slots R*i .. R*i+R-1, rank order
    sl_rank = np.tile(np.arange(R), C)
    sl_prev = np.where(sl_comm > 0, np.arange(NS) - R, -1)   # the queue: comm i-1 on the same rank
    ev_rank, ev_slot, anchor, call = [], [], [], []
    for r in range(R):
        waits = np.arange(K) if r != 1 else rng.permutation(K)
        for i in range(K):                                    # the issues (calls)
            ev_rank.append(r); ev_slot.append(R * i + r); anchor.append(False); call.append(R * i + r)
        for i in waits.tolist():                              # then the waits (anchors)
            ev_rank.append(r); ev_slot.append(R * i + r); anchor.append(True); call.append(-1)
    ev_rank, ev_slot, anchor, call = (np.asarray(x) for x in (ev_rank, ev_slot, anchor, call))
    E = len(ev_rank)
    sl_call = np.full(NS, -1, np.int64)
    isc = np.flatnonzero(call >= 0)
    sl_call[call[isc]] = isc
    rank_lo = np.arange(R) * 2 * K
    m = SimpleNamespace(
        n_events=E, ranks=np.arange(R), ev_rank=ev_rank, rank_lo=rank_lo, rank_hi=rank_lo + 2 * K,
        ev_dur=rng.uniform(0, 50, E), ev_rho=rng.uniform(0, 20, E), ev_anchor=anchor, ev_slot=ev_slot,
        ev_gap=rng.uniform(0, 100, E), ev_step=np.full(E, -1, np.int64), sl_call=sl_call,
        sl_comm=sl_comm, sl_rank=sl_rank, sl_dep=rng.random(NS) < 0.8, sl_prev=sl_prev,
        sl_tc=rng.uniform(10, 500, NS), cm_lo=np.arange(C) * R, cm_hi=np.arange(C) * R + R)
    scs = [RP.Scenario("as measured", "baseline"),
           RP.Scenario("gaps", "x", gap=rng.uniform(0, 100, E)),
           RP.Scenario("tc", "x", tc=rng.uniform(0, 300, NS), tc_ind=rng.uniform(0, 300, NS)),
           RP.Scenario("no queue", "x", tc=np.zeros(NS), tc_ind=np.zeros(NS), queue=False),
           RP.Scenario("mask", "x", mask=sl_rank == 2, exclude_ranks=(2,))]
    ref = RP.replay(m, scs, keep_events=True, engine="c-each")
    res = RP.replay(m, scs, keep_events=True, engine="c")
    assert np.array_equal(res.ev_rel, ref.ev_rel) and np.array_equal(res.t_end, ref.t_end)
    assert len(set(ref.t_end.tolist())) == len(scs)           # the scenarios differ
