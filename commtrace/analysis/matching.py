"""Matching across ranks: collectives by (pg, seq), their wait states, p2p pairs (metrics.md).

Pure functions of a DuckDB connection: each reads the aligned op table (``t`` of
:mod:`commtrace.analysis.loading`, or any table with its columns) and writes one table. Their
outputs are the engine boundary (docs/large-jobs.md): a per-collective table, a per-(collective,
rank) wait table, a p2p pair table and per-(rank, step) wait totals; every figure above them
(findings, summaries, the report) reads only these and the op table.
"""

from __future__ import annotations

from . import sql as Q


def collectives_sql(t: str, pgs, members_table: str) -> str:
    """SELECT of one row per matched collective (see :func:`build_collectives`), before the
    wait-state refinements of :func:`finish_collectives`."""
    f = Q.factor_sql("c.op", "c.n")
    return f"""
        WITH k0 AS (
            SELECT ckey, any_value(op) AS op, max(pg_size) AS pg_size,
                   count(*) AS n_ranks, max(bytes) AS in_bytes,
                   min(t_enqueue_ns) AS first_enter_ns, max(t_enqueue_ns) AS last_enter_ns,
                   -- the latest entry; on a tie, the lowest of those ranks (deterministic)
                   arg_max(rank, CASE WHEN t_enqueue_ns IS NOT NULL
                                      THEN struct_pack(t := t_enqueue_ns, r := -rank) END) AS last_rank,
                   min(t_end_ns) AS first_leave_ns, max(t_end_ns) AS last_leave_ns,
                   count(t_end_ns) AS n_done, count(*) AS n_rows, min(step) AS step,
                   any_value(site) AS site,
                   bool_or(coalesce(first_on_pg, false)) AS first_on_pg,
                   min(hash(op, dtype, count)) <> max(hash(op, dtype, count))
                     OR bool_or(op = 'all_gather' AND out_bytes <> bytes * pg_size)
                     OR bool_or(op = 'reduce_scatter' AND out_bytes * pg_size <> bytes) AS differs
            FROM {t}
            WHERE ckey IS NOT NULL
            GROUP BY ckey),
        -- Rooted ops only (broadcast, scatter, reduce, gather): the root's entry and leave.
        rt AS (
            SELECT ckey, min(root) AS root,
                   max(CASE WHEN rank = root THEN t_enqueue_ns END) AS root_enter_ns,
                   max(CASE WHEN rank <> root THEN t_enqueue_ns END) AS last_nonroot_enter_ns,
                   min(CASE WHEN rank <> root THEN t_end_ns END) AS first_nonroot_leave_ns,
                   max(CASE WHEN rank = root THEN t_end_ns END) AS root_leave_ns
            FROM {t} WHERE ckey IS NOT NULL AND op IN ({Q.ROOTED_SQL}) GROUP BY ckey),
        k AS (
            SELECT k0.*, {Q.pg_of_ckey("k0.ckey", pgs)} AS pg, {Q.seq_of_ckey("k0.ckey")} AS seq,
                   rt.root, rt.root_enter_ns, rt.last_nonroot_enter_ns, rt.first_nonroot_leave_ns,
                   rt.root_leave_ns
            FROM k0 LEFT JOIN rt ON rt.ckey = k0.ckey),
        c AS (
            SELECT k.*, coalesce(m.n_members, k.pg_size, k.n_ranks) AS n_expected,
                   greatest(coalesce(k.pg_size, k.n_ranks), 1) AS n,
                   {Q.PATTERN_SQL} AS pattern,
                   (k.n_done = k.n_rows AND k.n_ranks >= coalesce(m.n_members, k.pg_size, k.n_ranks)) AS complete,
                   k.seq = min(k.seq) OVER (PARTITION BY k.pg) AS first_of_pg
            FROM k LEFT JOIN {members_table} m ON m.pg = k.pg)
        SELECT ckey, pg, seq, op, pattern, pg_size, n_ranks, n_expected, complete,
               CAST(CASE WHEN op IN {Q.BYTES_X_N_SQL} THEN in_bytes * n ELSE in_bytes END AS BIGINT) AS bytes,
               CASE WHEN complete AND first_leave_ns > last_enter_ns THEN first_leave_ns - last_enter_ns END AS t_comm_ns,
               first_enter_ns, last_enter_ns, first_leave_ns, last_leave_ns,
               last_enter_ns - first_enter_ns AS arrival_skew_ns,
               CASE WHEN complete THEN last_leave_ns - first_leave_ns END AS completion_skew_ns,
               last_rank,
               CAST(NULL AS BIGINT) AS last_late_ns,
               root, root_enter_ns, last_nonroot_enter_ns, first_nonroot_leave_ns, root_leave_ns,
               step, site, first_of_pg, first_on_pg, coalesce(differs, false) AS differs, {f} AS busbw_factor
        FROM c"""


def build_collectives(con, t: str, name: str, pgs, members: dict) -> None:
    """Table `name`: one row per matched collective (pg, seq) of op table `t` (metrics.md
    "Matching one collective across ranks"), with `n_expected` members from `members`
    ({pg: [ranks]}), `complete` (every member issued and completed it), arrival and completion
    statistics, `t_comm_ns` for N x N patterns and the busbw factor. Call
    :func:`finish_collectives` once the wait table exists."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name}_m (pg VARCHAR, n_members INTEGER)")
    if members:
        # one statement: executemany costs milliseconds a row (thousands of groups in a large job)
        rows = [(str(k), len(v)) for k, v in members.items()]
        con.execute(f"INSERT INTO {name}_m VALUES " + ", ".join(["(?, ?)"] * len(rows)),
                    [x for r in rows for x in r])
    con.execute(f"CREATE OR REPLACE TABLE {name} AS {collectives_sql(t, pgs, name + '_m')}")


#: Columns of the collective table before finish_collectives, in order.
COLLECTIVE_COLUMNS = (
    "ckey", "pg", "seq", "op", "pattern", "pg_size", "n_ranks", "n_expected", "complete", "bytes", "t_comm_ns",
    "first_enter_ns", "last_enter_ns", "first_leave_ns", "last_leave_ns", "arrival_skew_ns",
    "completion_skew_ns", "last_rank", "last_late_ns", "root", "root_enter_ns", "last_nonroot_enter_ns",
    "first_nonroot_leave_ns", "root_leave_ns", "step", "site", "first_of_pg", "first_on_pg", "differs",
    "busbw_factor")
_FINISH = {
    "t_comm_ns": "CASE WHEN c.pattern <> 'nxn' AND u.tc > 0 THEN u.tc ELSE c.t_comm_ns END AS t_comm_ns",
    "last_late_ns": "CASE WHEN u.ckey IS NULL THEN c.last_late_ns ELSE u.lead END AS last_late_ns"}


def finish_collectives(con, name: str, waits: str) -> None:
    """Complete the collective table `name` from the wait table `waits`: for rooted patterns
    t_comm = min over the waiting ranks of (leave - enter - wait), which for N x N is exactly
    min_r leave_r - max_j enter_j (metrics.md), and for a broadcast whose root finished before a
    late receiver entered stays the transfer time itself; `last_late_ns`, the last arrival's
    lead over the second-latest one (straggler evidence); then algbw and busbw."""
    con.execute(f"CREATE OR REPLACE TABLE {name} AS {finish_sql(name, waits)}")


def finish_sql(name: str, waits: str) -> str:
    """SELECT of finish_collectives over collective table `name`."""
    return f"""
        WITH u AS (
            SELECT ckey, min(t_end_ns - t_enqueue_ns - wait_ns) FILTER (WHERE tc_role) AS tc,
                   min(lead_ns) FILTER (WHERE NOT is_last) AS lead
            FROM {waits} GROUP BY ckey),
        c AS (
            SELECT {", ".join(_FINISH.get(col, "c." + col) for col in COLLECTIVE_COLUMNS)}
            FROM {name} c LEFT JOIN u ON u.ckey = c.ckey)
        SELECT *, bytes / t_comm_ns AS algbw_gbps, bytes / t_comm_ns * busbw_factor AS busbw_gbps FROM c"""


def waits_sql(t: str, coll: str) -> str:
    """SELECT of the wait state of each member of each complete collective (see build_waits)."""
    return f"""
        SELECT x.ckey, x.rank, x.step, x.t_enqueue_ns, x.t_end_ns,
            CASE k.pattern WHEN 'late_broadcast' THEN x.rank IS DISTINCT FROM k.root
                           WHEN 'early_reduce' THEN x.rank = k.root ELSE false END AS tc_role,
            CAST(CASE k.pattern
              WHEN 'late_broadcast' THEN CASE WHEN x.rank = k.root THEN 0
                   ELSE greatest(0, least(coalesce(k.root_enter_ns, k.last_enter_ns), x.t_end_ns) - x.t_enqueue_ns) END
              WHEN 'early_reduce' THEN CASE WHEN x.rank = k.root
                   THEN greatest(0, least(coalesce(k.last_nonroot_enter_ns, k.last_enter_ns), x.t_end_ns) - x.t_enqueue_ns)
                   ELSE 0 END
              ELSE greatest(0, least(k.last_enter_ns, x.t_end_ns) - x.t_enqueue_ns) END AS BIGINT) AS wait_ns,
            CAST(CASE WHEN k.pattern = 'nxn' THEN greatest(0, x.t_end_ns - greatest(k.first_leave_ns, k.last_enter_ns)) END
                 AS BIGINT) AS completion_wait_ns,
            k.last_enter_ns - x.t_enqueue_ns AS lead_ns, x.rank = k.last_rank AS is_last,
            k.first_of_pg, k.n_ranks
        FROM {t} x JOIN {coll} k ON k.ckey = x.ckey
        WHERE k.complete"""


def build_waits(con, t: str, coll: str, name: str) -> None:
    """Table `name`: the wait state of each member rank of each complete collective, Scalasca's
    definitions (metrics.md "Wait states", clamped >= 0): `wait_ns` by pattern,
    `completion_wait_ns` (N x N completion), `lead_ns` (its arrival before the last one),
    `is_last`, and the collective's `first_of_pg` and `n_ranks`."""
    con.execute(f"CREATE OR REPLACE TABLE {name} AS {waits_sql(t, coll)}")


_P2P_X = "pg, t_enqueue_ns, t_end_ns, bytes, async_op, site, step, block_ns, pair_seq"


def p2p_sql(t: str) -> str:
    """SELECT of the matched point-to-point pairs (see build_p2p)."""
    return f"""
        WITH x AS (
            SELECT pg, op, rank, peer, t_enqueue_ns, t_end_ns, bytes, async_op, site, step,
                   CASE WHEN coalesce(async_op, false) THEN t_wait_ns ELSE t_enqueue_ns END AS block_ns,
                   row_number() OVER (PARTITION BY pg, op, rank, peer ORDER BY t_enqueue_ns, op_id) AS pair_seq
            FROM {t}
            WHERE ckey IS NULL AND peer IS NOT NULL AND peer >= 0 AND kind = 'op' AND op IN ('send', 'recv')),
        s AS (SELECT {_P2P_X}, rank AS src, peer AS dst FROM x WHERE op = 'send'),
        r AS (SELECT {_P2P_X}, peer AS src, rank AS dst FROM x WHERE op = 'recv')
        SELECT coalesce(s.pg, r.pg) AS pg, coalesce(s.src, r.src) AS src, coalesce(s.dst, r.dst) AS dst,
               coalesce(s.pair_seq, r.pair_seq) AS pair_seq, coalesce(s.bytes, r.bytes) AS bytes,
               s.t_enqueue_ns AS send_enter_ns, s.t_end_ns AS send_leave_ns,
               r.t_enqueue_ns AS recv_enter_ns, r.t_end_ns AS recv_leave_ns,
               CAST(greatest(0, least(s.t_enqueue_ns, r.t_end_ns) - r.block_ns) AS BIGINT) AS late_sender_ns,
               CAST(greatest(0, least(r.t_enqueue_ns, s.t_end_ns) - s.block_ns) AS BIGINT) AS late_receiver_ns,
               s.async_op AS send_async, r.async_op AS recv_async, s.site AS send_site, r.site AS recv_site,
               coalesce(r.step, s.step) AS step,
               CASE WHEN s.t_end_ns IS NOT NULL AND r.t_end_ns IS NOT NULL
                    AND least(s.t_end_ns, r.t_end_ns) > greatest(s.t_enqueue_ns, r.t_enqueue_ns)
                    THEN least(s.t_end_ns, r.t_end_ns) - greatest(s.t_enqueue_ns, r.t_enqueue_ns) END AS t_comm_ns
        FROM s FULL OUTER JOIN r ON s.pg = r.pg AND s.src = r.src AND s.dst = r.dst AND s.pair_seq = r.pair_seq"""


def build_p2p(con, t: str, name: str) -> None:
    """Table `name`: matched point-to-point pairs by (pg, src, dst, per-pair seq), metrics.md:
    late sender (recv waits for send) = enter_send - enter_recv capped at leave_recv; late
    receiver (send waits for recv) = enter_recv - enter_send capped at leave_send; both >= 0.
    For a non-blocking isend/irecv the host waits in wait(), so its wait starts at `t_wait_ns`
    instead of the enqueue (as Scalasca attributes MPI_Wait); never waited: no wait state."""
    con.execute(f"CREATE OR REPLACE TABLE {name} AS {p2p_sql(t)}")


def wait_rank_step_sql(waits: str, p2p: str) -> str:
    """SELECT of wait-state totals per (rank, step) (see build_wait_rank_step)."""
    return f"""
        SELECT rank, coalesce(step, -9223372036854775807) AS step, CAST(sum(wait_ns) AS BIGINT) AS wait_ns,
               CAST(sum(completion_wait_ns) AS BIGINT) AS completion_wait_ns,
               CAST(sum(ls) AS BIGINT) AS late_sender_ns, CAST(sum(lr) AS BIGINT) AS late_receiver_ns,
               CAST(sum(iw) AS BIGINT) AS init_wait_ns
        FROM (
            SELECT rank, step, CASE WHEN first_of_pg THEN 0 ELSE wait_ns END AS wait_ns,
                   CASE WHEN first_of_pg THEN 0 ELSE completion_wait_ns END AS completion_wait_ns,
                   0 AS ls, 0 AS lr, CASE WHEN first_of_pg THEN wait_ns ELSE 0 END AS iw FROM {waits}
            UNION ALL
            SELECT dst, step, late_sender_ns, 0, late_sender_ns, 0, 0 FROM {p2p}
            WHERE recv_enter_ns IS NOT NULL AND send_enter_ns IS NOT NULL
            UNION ALL
            SELECT src, step, late_receiver_ns, 0, 0, late_receiver_ns, 0 FROM {p2p}
            WHERE send_enter_ns IS NOT NULL AND recv_enter_ns IS NOT NULL)
        GROUP BY rank, step"""


def build_wait_rank_step(con, waits: str, p2p: str, name: str) -> None:
    """Table `name`: wait-state totals per (rank, step) (null step as INT64 min + 1):
    collectives' `wait_ns` and `completion_wait_ns` but the first collective of each group,
    whose wait is start-up skew (`init_wait_ns`); late sender on the recv side, late receiver
    on blocking sends (both also counted in `wait_ns`)."""
    con.execute(f"CREATE OR REPLACE TABLE {name} AS {wait_rank_step_sql(waits, p2p)}")
