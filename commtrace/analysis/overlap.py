"""Overlap per rank and per step (metrics.md "Overlap", HTA's definition at ns resolution),
computed by chunks of ranks so that memory does not grow with the run.

For each chunk of ranks: C = union of comm intervals [t_enqueue, t_end]; Bl = union of
host-blocked intervals (the call, wait(), synchronize()); B, the host's not-blocked time, is the
complement of Bl, so exposed = |C ∩ Bl| and overlapped = |C| - exposed. Per-rank totals are
kept in numpy (one number per rank); per-(rank, step) figures, with each union segment
attributed to the step in which it starts, are appended to a DuckDB table.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import intervals as IV
from . import sql as Q

#: Rows of the op table read per chunk of ranks (about 130 bytes of numpy per row at peak: the
#: blocked intervals' union sorts two per op). 64 x 20,000, the overlap stage alone: peak RSS
#: 481-503 MB with chunks of 1,000,000 rows, 421-429 MB with 500,000, 403-430 MB with 250,000,
#: the same CPU; 512 x 20,000: 250,000 costs 0.9 s more CPU than 1,000,000 (more queries).
CHUNK_ROWS = 500_000

RANK_COLUMNS = ("ops", "bytes", "stream_wait_ns", "sync_ns", "C", "B", "X")


def rank_chunks(ranks: list[int], total_rows: int, chunk_rows: int | None = None) -> list[range]:
    """Consecutive ranges of ranks holding about `chunk_rows` (default CHUNK_ROWS) rows each
    (rows spread evenly)."""
    chunk_rows = chunk_rows or CHUNK_ROWS
    rs = sorted(int(r) for r in ranks)
    if not rs:
        return []
    per_rank = max(1, total_rows // len(rs))
    k = max(1, chunk_rows // per_rank)
    return [range(rs[i], rs[min(i + k, len(rs)) - 1] + 1) for i in range(0, len(rs), k)]


def _rank_step_sql(t: str, where: str) -> str:
    """One pass per (rank, step) (step may be null): ops, bytes, GPU stream waits, time in
    synchronize(), the step's first timestamp (its boundary) and last one (`t_last`, of the rows
    with an enqueue time; `has_t`: there are such rows)."""
    return f"""
        SELECT rank, step, count(*) FILTER (WHERE kind = 'op') AS ops,
               coalesce(sum(bytes) FILTER (WHERE kind = 'op'), 0)::BIGINT AS bytes,
               coalesce(sum(stream_wait_ns) FILTER (WHERE kind = 'op'), 0)::BIGINT AS stream_wait_ns,
               coalesce(sum(t_return_ns - t_enqueue_ns) FILTER (WHERE kind = 'sync'), 0)::BIGINT AS sync_ns,
               min(t_enqueue_ns) AS t0, step IS NULL AS nostep,
               max(greatest(t_enqueue_ns, t_return_ns, t_end_ns, t_wait_end_ns))
                 FILTER (WHERE t_enqueue_ns IS NOT NULL) AS t_last, count(t_enqueue_ns) > 0 AS has_t
        FROM {t} WHERE {where} GROUP BY rank, step ORDER BY rank, step"""


def _unions(con, t: str, where: str, base: int, stride: int):
    """(C, B, X) unions of one chunk of ranks as sorted rank-offset key segments."""
    d = Q.numpy(con, f"""
        SELECT rank::BIGINT * {stride} + (t_enqueue_ns - {base}) AS s, rank::BIGINT * {stride} + (t_end_ns - {base}) AS e
        FROM {t} WHERE {where} AND kind = 'op' AND t_enqueue_ns IS NOT NULL AND t_end_ns IS NOT NULL""")
    C = IV.union(d["s"], d["e"])
    del d
    # One scan for both kinds of blocked interval: the call and the wait().
    b = Q.numpy(con, f"""
        SELECT rank::BIGINT * {stride} AS k, coalesce(t_enqueue_ns - {base}, -1) AS a,
               coalesce(t_return_ns - {base}, -1) AS z, coalesce(t_wait_ns - {base}, -1) AS wa,
               coalesce(t_wait_end_ns - {base}, -1) AS wz
        FROM {t} WHERE {where} AND kind IN ('op', 'sync')
          AND ((t_enqueue_ns IS NOT NULL AND t_return_ns IS NOT NULL)
               OR (t_wait_ns IS NOT NULL AND t_wait_end_ns IS NOT NULL))""")
    m1 = (b["a"] >= 0) & (b["z"] >= 0)
    m2 = (b["wa"] >= 0) & (b["wz"] >= 0)
    s = np.concatenate([b["k"][m1] + b["a"][m1], b["k"][m2] + b["wa"][m2]])
    e = np.concatenate([b["k"][m1] + b["z"][m1], b["k"][m2] + b["wz"][m2]])
    del b
    B = IV.union(s, e)
    del s, e
    X = IV.intersect(*C, *B)
    return {"C": C, "B": B, "X": X}


def _per_step(rs: dict, segs: dict, base: int, stride: int) -> dict:
    """Attribute each union segment to the step (of its rank) in which it starts."""
    m = ~rs["nostep"].astype(bool)
    b_rank, b_step = rs["rank"][m].astype(np.int64), rs["step"][m].astype(np.int64)
    keys = b_rank * stride + (rs["t0"][m].astype(np.int64) - base)
    order = np.argsort(keys, kind="stable")
    keys, b_rank, b_step = keys[order], b_rank[order], b_step[order]
    out = {"rank": b_rank, "step": b_step, "ops": rs["ops"][m][order].astype(np.int64),
           "stream_wait_ns": rs["stream_wait_ns"][m][order].astype(np.int64),
           "t0": rs["t0"][m][order].astype(np.int64), "t_last": rs["t_last"][m][order].astype(np.int64),
           "has_t": rs["has_t"][m][order].astype(bool)}
    if not len(keys):
        for nm in ("C", "B", "X"):
            out[nm] = np.zeros(0)
        return out
    # Rank r's first boundary is moved to the start of r's key range, so that segments before
    # it count in its first step; then each (sorted) segment takes the last boundary at or
    # before its start: a bincount of boundary positions and a cumsum, O(n) instead of a
    # binary search per segment.
    kk = keys.copy()
    first_of_rank = np.r_[True, b_rank[1:] != b_rank[:-1]]
    kk[first_of_rank] = b_rank[first_of_rank] * stride
    for nm in ("C", "B", "X"):
        s, e = segs[nm]
        if not len(s):
            out[nm] = np.zeros(len(keys))
            continue
        pos = np.searchsorted(s, kk, side="left")
        idx = np.cumsum(np.bincount(pos, minlength=len(s) + 1)[: len(s)]) - 1
        ok = idx >= 0
        ok[ok] = b_rank[idx[ok]] == s[ok] // stride
        out[nm] = np.bincount(idx[ok], weights=(e - s)[ok].astype(np.float64), minlength=len(keys))
    return out


def compute(con, t: str, ranks: list[int], total_rows: int, t_min_ns, t_max_ns, step_table: str,
            chunk_rows: int | None = None) -> dict[str, np.ndarray]:
    """Per-rank totals (`rank` plus RANK_COLUMNS, ns / counts as float64) over op table `t`, by
    chunks of ranks; appends the per-(rank, step) figures (rank, step, ops, stream_wait_ns, C,
    B, X, and the step's first and last timestamps t0, t_last: :func:`step_spans_sql`) to DuckDB
    table `step_table` (created here). `con` may be a cursor of a background
    thread."""
    base = int(t_min_ns or 0)
    stride = IV.keyspace_stride((int(t_max_ns) if t_max_ns is not None else base) - base + 1)
    con.execute(f"""CREATE OR REPLACE TABLE {step_table} (rank BIGINT, step BIGINT, ops BIGINT,
                    stream_wait_ns BIGINT, C DOUBLE, B DOUBLE, X DOUBLE, t0 BIGINT, t_last BIGINT)""")
    rank_u = np.array(sorted(int(r) for r in ranks), np.int64)
    tot = {k: np.zeros(len(rank_u)) for k in RANK_COLUMNS}
    seen = np.zeros(len(rank_u), bool)
    for ch in rank_chunks(list(rank_u), total_rows, chunk_rows):
        where = Q.rank_filter(ch)
        rs = Q.numpy(con, _rank_step_sql(t, where))
        if len(rs["rank"]):
            pos = np.searchsorted(rank_u, rs["rank"].astype(np.int64))
            seen[pos] = True
            for k in ("ops", "bytes", "stream_wait_ns", "sync_ns"):
                tot[k] += np.bincount(pos, weights=rs[k].astype(np.float64), minlength=len(rank_u))
        segs = _unions(con, t, where, base, stride)
        for nm in ("C", "B", "X"):
            s, e = segs[nm]
            if len(s):
                r = (s // stride).astype(np.int64)
                pos = np.searchsorted(rank_u, r)
                tot[nm] += np.bincount(pos, weights=(e - s).astype(np.float64), minlength=len(rank_u))
        ps = _per_step(rs, segs, base, stride)
        del segs, rs
        if len(ps["rank"]):
            valid = pa.py_buffer(np.packbits(ps["has_t"], bitorder="little"))
            tbl = pa.table({"rank": Q.np_array(ps["rank"]), "step": Q.np_array(ps["step"]),
                            "ops": Q.np_array(ps["ops"]), "stream_wait_ns": Q.np_array(ps["stream_wait_ns"]),
                            "C": Q.np_array(ps["C"]), "B": Q.np_array(ps["B"]), "X": Q.np_array(ps["X"]),
                            **{k: pa.Array.from_buffers(pa.int64(), len(ps[k]),
                                                        [valid, pa.py_buffer(np.ascontiguousarray(ps[k]))])
                               for k in ("t0", "t_last")}})
            con.register("__ov_chunk", tbl)
            con.execute(f"INSERT INTO {step_table} SELECT * FROM __ov_chunk")
            con.unregister("__ov_chunk")
    # Ranks without a row in `t` (a subset of steps) have no figures.
    return {"rank": rank_u[seen], **{k: v[seen] for k, v in tot.items()}}


def step_spans_sql(step_table: str) -> str:
    """SELECT of (rank, step, t0, t_ns) from the `step_table` of :func:`compute`: the step time
    on that rank, from the step's first event to the next step's first event (the last step: to
    the rank's last event); what overview.py's step spans compute from the op table, without
    another pass over it."""
    return f"""
        SELECT rank, step, t0, greatest(coalesce(lead(t0) OVER (PARTITION BY rank ORDER BY step), t_last) - t0, 0) AS t_ns
        FROM {step_table} WHERE t0 IS NOT NULL"""


def per_step_sql(step_table: str, wait_rank_step: str) -> str:
    """SELECT of the per-(rank, step) figures in seconds, as Run.per_step() returns them."""
    return f"""
        SELECT s.rank, s.step, s.ops, s.B / 1e9 AS blocked_s, s.C / 1e9 AS inflight_s,
               least(s.X + s.stream_wait_ns, s.C) / 1e9 AS exposed_s,
               (s.C - least(s.X + s.stream_wait_ns, s.C)) / 1e9 AS overlapped_s,
               CASE WHEN s.C > 0 THEN (s.C - least(s.X + s.stream_wait_ns, s.C)) / s.C END AS overlap_ratio,
               coalesce(w.wait_ns, 0) / 1e9 AS wait_s, coalesce(w.late_sender_ns, 0) / 1e9 AS late_sender_s,
               coalesce(w.late_receiver_ns, 0) / 1e9 AS late_receiver_s
        FROM {step_table} s LEFT JOIN {wait_rank_step} w ON w.rank = s.rank AND w.step = s.step"""
