"""Summaries over the matched tables (metrics.md): stragglers, per-rank figures, collectives by
size, clock violations, timeline bins, last completed op per rank.

Pure functions of a DuckDB connection and the names of the tables of
:mod:`commtrace.analysis.matching` / :mod:`commtrace.analysis.overlap`; they read nothing else.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import intervals as IV
from . import sql as Q


def stragglers(con, coll: str, waits: str) -> dict[str, np.ndarray]:
    """Straggler share per rank (metrics.md "Wait states"): over complete collectives with at
    least two members, excluding the first collective of each group (connection set-up):
    `n_collectives` the rank took part in, `last_count` (times it arrived last), `share` =
    last_count / n_collectives, `expected_share` (sum of 1/n over those collectives /
    n_collectives), `var_count`, `mean_late_ns` / `total_late_ns` (its lead over the
    second-latest arrival when last), `typical_late_ns` (median lead of the last arrival in the
    collectives where it was not last). A collective whose latest entries tie to the nanosecond
    (`last_late_ns` 0: synthetic runs without jitter, coarse clocks) has no last arrival: its
    `last_rank`, the lowest of the tied ranks, would otherwise count as one."""
    part = Q.numpy(con, f"""
        SELECT rank, count(*) AS n_collectives, sum(1.0 / n_ranks) AS exp_count,
               sum((1.0 / n_ranks) * (1 - 1.0 / n_ranks)) AS var_count
        FROM {waits} WHERE n_ranks >= 2 AND NOT first_of_pg GROUP BY rank ORDER BY rank""")
    lr = Q.numpy(con, f"""
        SELECT last_rank, last_late_ns FROM {coll}
        WHERE complete AND n_ranks >= 2 AND NOT first_of_pg AND last_late_ns > 0""")
    last_rank = lr["last_rank"].astype(np.int64)
    late = lr["last_late_ns"].astype(np.float64)
    ranks = part["rank"].astype(np.int64)
    n = part["n_collectives"].astype(np.int64)
    gmed = float(np.median(late)) if len(late) else 0.0
    cnt = np.zeros(len(ranks), np.int64)
    tot = np.zeros(len(ranks))
    typ = np.zeros(len(ranks))
    order = np.argsort(last_rank, kind="stable")
    lr_sorted = last_rank[order]
    for i, r in enumerate(ranks):
        lo, hi = np.searchsorted(lr_sorted, r), np.searchsorted(lr_sorted, r, side="right")
        k = int(hi - lo)
        cnt[i] = k
        tot[i] = late[order[lo:hi]].sum() if k else 0.0
        others = len(late) - k
        # The lead of other ranks' last arrivals: needs a few of them to mean anything.
        if others >= 10:
            typ[i] = gmed if k == 0 else float(np.median(late[last_rank != r]))
    return {
        "rank": ranks, "n_collectives": n, "last_count": cnt,
        "share": np.where(n > 0, cnt / np.maximum(n, 1), 0.0),
        "expected_share": np.where(n > 0, part["exp_count"].astype(float) / np.maximum(n, 1), 0.0),
        "var_count": part["var_count"].astype(float),
        "mean_late_ns": np.where(cnt > 0, tot / np.maximum(cnt, 1), 0.0),
        "total_late_ns": tot.astype(np.int64), "typical_late_ns": typ}


def per_rank(ov: dict, con, wait_rank_step: str, strag: dict, nr: int) -> pa.Table:
    """Per rank, in seconds (see Run.per_rank), from the overlap totals `ov` (overlap.compute),
    the per-(rank, step) wait totals and the straggler arrays."""
    ranks = ov["rank"]
    w = Q.numpy(con, f"""
        SELECT rank, sum(wait_ns)::DOUBLE AS wait_ns, sum(completion_wait_ns)::DOUBLE AS completion_wait_ns,
               sum(late_sender_ns)::DOUBLE AS late_sender_ns, sum(late_receiver_ns)::DOUBLE AS late_receiver_ns,
               sum(init_wait_ns)::DOUBLE AS init_wait_ns
        FROM {wait_rank_step} GROUP BY rank""")
    wsum = {k: np.zeros(len(ranks)) for k in ("wait_ns", "completion_wait_ns", "late_sender_ns",
                                              "late_receiver_ns", "init_wait_ns")}
    if len(w["rank"]):
        wr = np.searchsorted(ranks, w["rank"].astype(np.int64))
        ok = (wr < len(ranks)) & (ranks[np.clip(wr, 0, max(len(ranks) - 1, 0))] == w["rank"]) if len(ranks) else wr < 0
        for k in wsum:
            v = np.nan_to_num(w[k].astype(np.float64))
            wsum[k][wr[ok]] = v[ok]
    idx = {int(r): i for i, r in enumerate(ranks)}
    last = np.zeros(len(ranks), np.int64)
    share = np.zeros(len(ranks))
    for r, lc, sh in zip(strag["rank"], strag["last_count"], strag["share"]):
        if int(r) in idx:
            last[idx[int(r)]], share[idx[int(r)]] = lc, sh
    inr = ranks < nr
    c = np.where(inr, ov["C"], 0.0)
    x = np.minimum(np.where(inr, ov["X"], 0.0) + ov["stream_wait_ns"], c)
    b = np.where(inr, ov["B"], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(c > 0, (c - x) / c, np.nan)
    return Q.np_table({
        "rank": ranks.astype(np.int64), "ops": ov["ops"].astype(np.int64), "blocked_s": b / 1e9,
        "inflight_s": c / 1e9, "exposed_s": x / 1e9, "overlapped_s": (c - x) / 1e9, "overlap_ratio": ratio,
        "wait_s": wsum["wait_ns"] / 1e9, "completion_wait_s": wsum["completion_wait_ns"] / 1e9,
        "late_sender_s": wsum["late_sender_ns"] / 1e9, "late_receiver_s": wsum["late_receiver_ns"] / 1e9,
        "sync_s": ov["sync_ns"] / 1e9, "bytes": ov["bytes"].astype(np.int64),
        "last_count": last, "straggler_share": share, "init_wait_s": wsum["init_wait_ns"] / 1e9})


def collectives_summary_sql(coll: str) -> str:
    """SELECT per (pg, op, size bucket) (see Run.collectives_summary)."""
    return f"""
        SELECT pg, op, CAST(CASE WHEN coalesce(bytes, 0) <= 0 THEN 0
                          ELSE pow(2, floor(log2(bytes))) END AS BIGINT) AS size_bucket,
               count(*) AS count, avg(t_comm_ns) / 1e9 AS t_comm_s, min(t_comm_ns) / 1e9 AS t_comm_min_s,
               max(t_comm_ns) / 1e9 AS t_comm_max_s, stddev_samp(t_comm_ns) / 1e9 AS t_comm_std_s,
               avg(busbw_gbps) AS busbw_gbps, min(busbw_gbps) AS busbw_min_gbps,
               max(busbw_gbps) AS busbw_max_gbps, stddev_samp(busbw_gbps) AS busbw_std_gbps,
               avg(algbw_gbps) AS algbw_gbps, sum(arrival_skew_ns) / 1e9 AS arrival_skew_total_s,
               count(*) FILTER (WHERE NOT complete) AS incomplete,
               CASE WHEN size_bucket >= 1073741824 THEN (size_bucket // 1073741824) || ' GiB'
                    WHEN size_bucket >= 1048576 THEN (size_bucket // 1048576) || ' MiB'
                    WHEN size_bucket >= 1024 THEN (size_bucket // 1024) || ' KiB'
                    ELSE size_bucket || ' B' END AS size_label
        FROM {coll} GROUP BY pg, op, size_bucket ORDER BY pg, op, size_bucket"""


def clock(con, coll: str, offsets: dict, rtts: dict, meta: dict) -> dict:
    """Clock alignment facts (see Run.clock)."""
    tol = max([v for v in rtts.values() if v] or [0]) // 2
    row = Q.rows(con, f"""
        WITH v AS (
            SELECT ckey, pg, seq, op, CASE pattern
                WHEN 'late_broadcast' THEN root_enter_ns - first_nonroot_leave_ns
                WHEN 'early_reduce' THEN last_nonroot_enter_ns - root_leave_ns
                ELSE last_enter_ns - first_leave_ns END AS by_ns, last_rank
            FROM {coll} WHERE complete AND n_ranks >= 2)
        SELECT count(*), count(*) FILTER (WHERE by_ns > {tol}), max(by_ns) FILTER (WHERE by_ns > {tol}),
               list(DISTINCT last_rank) FILTER (WHERE by_ns > {tol}),
               -- the worst violation's (pg, seq), both from one row; on a tie, the lowest
               -- collective key (group index, then seq)
               arg_max(struct_pack(pg := pg, seq := seq), struct_pack(b := by_ns, k := -ckey))
                 FILTER (WHERE by_ns > {tol})
        FROM v""").fetchone()
    return {"offsets_ns": {str(r): o for r, o in sorted(offsets.items())},
            "methods": sorted({str(m.get("clock_offset_method")) for m in meta.values()
                               if m.get("clock_offset_method")}),
            "tolerance_ns": int(tol), "matched": int(row[0] or 0), "violations": int(row[1] or 0),
            "max_violation_ns": int(row[2]) if row[2] is not None else 0,
            "late_ranks": sorted(int(x) for x in (row[3] or [])),
            "worst": {"pg": row[4]["pg"], "seq": row[4]["seq"]} if row[1] else None}


def last_completed(con, t: str, ranks) -> dict:
    """rank -> its last completed op (op, pg, seq, site, t_end_ns)."""
    rows = Q.rows(con, f"""
        SELECT rank, x.op, x.pg, x.seq, x.site, x.t FROM (
            SELECT rank, arg_max(struct_pack(op := op, pg := pg, seq := seq, site := site, t := t_end_ns), t_end_ns) AS x
            FROM {t} WHERE kind = 'op' AND t_end_ns IS NOT NULL GROUP BY rank) ORDER BY rank""").fetchall()
    out: dict = {r: None for r in ranks}
    for r, op, pg, seq, site, te in rows:
        out[int(r)] = {"op": op, "pg": pg, "seq": seq, "site": site, "t_end_ns": te}
    return out


def timeline_bins(con, t: str, waits: str, all_ranks, t0: int, t1: int, nbins: int, ranks=None) -> pa.Table:
    """Per (rank, bin) over [t0, t1) (see Run.timeline_bins)."""
    edges = np.linspace(t0, t1, nbins + 1).round().astype(np.int64)
    edges[0], edges[-1] = t0, t1
    rsel = ""
    rs = None
    if ranks is not None:
        rs = [int(r) for r in ([ranks] if isinstance(ranks, (int, np.integer)) else ranks)]
        rsel = " AND rank IN (" + (", ".join(map(str, rs)) or "NULL") + ")"
    win = f"a < {t1} AND z > {t0}"
    d = Q.numpy(con, f"""
        SELECT rank, kind_, a, z FROM (
            SELECT rank, 0 AS kind_, t_enqueue_ns AS a, t_return_ns AS z FROM {t} WHERE kind = 'op'
            UNION ALL SELECT rank, 0, t_wait_ns, t_wait_end_ns FROM {t} WHERE kind = 'op'
            UNION ALL SELECT rank, 1, t_enqueue_ns, t_end_ns FROM {t} WHERE kind = 'op'
            UNION ALL SELECT rank, 2, t_enqueue_ns, t_enqueue_ns + wait_ns FROM {waits} WHERE wait_ns > 0
            UNION ALL SELECT rank, 3, t_enqueue_ns, t_return_ns FROM {t} WHERE kind = 'sync')
        WHERE a IS NOT NULL AND z IS NOT NULL AND {win}{rsel} ORDER BY rank""")
    cnt = Q.numpy(con, f"""
        SELECT rank, CAST(floor((t_enqueue_ns - {t0}) * {nbins} / {t1 - t0}) AS BIGINT) AS b, count(*) AS n
        FROM {t} WHERE kind = 'op' AND t_enqueue_ns >= {t0} AND t_enqueue_ns < {t1}{rsel}
        GROUP BY ALL""")
    rank_list = sorted(set(all_ranks) if rs is None else set(rs) & set(all_ranks))
    nr = len(rank_list)
    pos = {r: i for i, r in enumerate(rank_list)}
    out = np.zeros((4, nr, nbins), np.int64)
    rk = d["rank"].astype(np.int64)
    if len(rk):
        bounds = np.flatnonzero(np.r_[True, rk[1:] != rk[:-1], True])
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            r = int(rk[lo])
            if r not in pos:
                continue
            kk, a, z = d["kind_"][lo:hi], d["a"][lo:hi], d["z"][lo:hi]
            for k in range(4):
                m = kk == k
                if m.any():
                    out[k, pos[r]] = IV.coverage_bins(a[m], z[m], edges)
    ops = np.zeros((nr, nbins), np.int64)
    if len(cnt["rank"]):
        ri = np.array([pos.get(int(r), -1) for r in cnt["rank"]])
        ok = (ri >= 0) & (cnt["b"] >= 0) & (cnt["b"] < nbins)
        np.add.at(ops, (ri[ok], cnt["b"][ok].astype(np.int64)), cnt["n"][ok].astype(np.int64))
    return Q.np_table({
        "rank": np.repeat(np.array(rank_list, np.int32), nbins),
        "bin": np.tile(np.arange(nbins, dtype=np.int64), nr),
        "t0_ns": np.tile(edges[:-1], nr), "t1_ns": np.tile(edges[1:], nr),
        "blocked_ns": out[0].ravel(), "inflight_ns": out[1].ravel(),
        "wait_ns": out[2].ravel(), "sync_ns": out[3].ravel(), "ops": ops.ravel()})
