"""A loaded run and its analysis functions (`commtrace.load(DIR)` -> :class:`Run`).

All figures follow ``shared/reference/metrics.md``; each method names the definition it
implements. The run lives in one in-process DuckDB table (``t``: every schema column, clocks
aligned to rank 0, plus ``step``); matching and aggregation are SQL over it, interval unions are
numpy over Arrow columns. Nothing turns the run into Python objects: only findings (a handful)
are Python.

Tables are ``pyarrow.Table``; times are int64 ns on rank 0's clock (offsets applied).
"""

from __future__ import annotations

import os
import threading
from functools import cached_property

import duckdb
import numpy as np
import pyarrow as pa

from .. import ops as OPS
from ..errors import CommtraceError, TraceFormatError
from ..format import reader as R
from ..format import schema as S
from . import intervals as IV

COLLECTIVE_SQL = "(" + ", ".join(f"'{o}'" for o in OPS.COLLECTIVE_OPS) + ")"
_ROOTED_SQL = ", ".join(f"'{n}'" for n, o in OPS.OPS.items() if o.pattern in (OPS.LATE_BROADCAST, OPS.EARLY_REDUCE))
_PATTERN_SQL = "CASE op " + " ".join(
    f"WHEN '{n}' THEN '{o.pattern}'" for n, o in OPS.OPS.items() if o.collective) + " ELSE 'nxn' END"
_BYTES_X_N_SQL = "(" + ", ".join(f"'{n}'" for n, o in OPS.OPS.items() if o.size_rule == "bytes_x_n") + ")"


def _factor_sql(op: str, n: str) -> str:
    """busbw factor F of metrics.md ("Communication time and bandwidth") as SQL."""
    ar = ", ".join(f"'{k}'" for k, o in OPS.OPS.items() if o.factor == "allreduce")
    nm = ", ".join(f"'{k}'" for k, o in OPS.OPS.items() if o.factor == "nm1_n")
    return (f"CASE WHEN {op} IN ({ar}) THEN 2.0 * ({n} - 1) / {n} "
            f"WHEN {op} IN ({nm}) THEN ({n} - 1.0) / {n} ELSE 1.0 END")


def load(path, *, threads: int | None = None, memory_limit: str | None = None, progress=None,
         run: str | None = None) -> "Run":
    """Load a run directory (or one Parquet trace) for analysis.

    `path` may also be a directory of runs (the output of ``commtrace run -o``): with one run
    below it, that run is loaded; with several, `run` picks one (its id, or ``"latest"``),
    else :class:`commtrace.format.runs.MultipleRunsError` (exit code 2) lists them.
    Raises :class:`commtrace.errors.TraceFormatError` (or a subclass) when `path` is not a
    readable trace; tolerable damage (missing ranks, corrupt parts) becomes `Run.warnings`.
    `progress(stage, fraction, rows)` is told when loading starts (with the row count)."""
    from ..format import runs as RUNS

    path = RUNS.resolve(path, run)
    rf = R.scan_run(path)
    if progress:
        progress("loading", 0.0, rf.num_rows)
    con = duckdb.connect(config={"threads": threads or max(1, min(os.cpu_count() or 1, 8))})
    con.execute("SET preserve_insertion_order = false")
    if memory_limit:
        con.execute(f"SET memory_limit = '{memory_limit}'")
    offs = _offsets(rf.meta)
    con.execute("CREATE OR REPLACE TABLE offsets (rank INTEGER, off BIGINT, rtt BIGINT)")
    if offs:
        con.executemany("INSERT INTO offsets VALUES (?, ?, ?)", offs)
    try:
        pgs = R.distinct_values(con, rf, "pg")
        R.load_into_duckdb(con, rf, "t0", wrap=lambda q: _align_sql(q, pgs), columns=LOAD_COLUMNS)
    except duckdb.Error as e:
        raise TraceFormatError(f"{path}: cannot read trace: {str(e).splitlines()[0]}") from None
    rf.pgs = list(pgs)
    return Run(con, rf)


#: Columns the analysis never reads: left in the Parquet parts and joined back by row id
#: (`rid`) when ops() returns full rows, so that loading materialises less.
LAZY_COLUMNS = ("api", "backend", "thread", "t_start_ns", "completion", "torch_seq")
#: Read at load for derived values (completion fill, in-flight count), then dropped.
_LOAD_ONLY = ("device", "inflight_ids")
LOAD_COLUMNS = [c for c in S.COLUMNS if c not in LAZY_COLUMNS]


def _offsets(meta: dict) -> list[tuple[int, int, int]]:
    out = []
    for r, m in meta.items():
        vals = []
        for k in ("clock_offset_ns", "clock_rtt_ns"):
            try:
                vals.append(int(m.get(k) or 0))
            except (TypeError, ValueError):
                vals.append(0)
        out.append((int(r), vals[0], vals[1]))
    return out


def _align_sql(src: str, pgs=()) -> str:
    """Apply each rank's clock offset (metrics.md "Clock alignment": offset = the rank's clock
    minus rank 0's, so aligned = t - offset), and fill a completion the writer did not record
    but the host saw: a waited op (wait() returned) or a blocking CPU op that returned without
    error has completed by then."""
    end_expr = ("coalesce(r.t_end_ns, CASE WHEN r.kind = 'op' AND r.error IS NULL THEN coalesce(r.t_wait_end_ns, "
                "CASE WHEN NOT coalesce(r.async_op, false) AND coalesce(r.device, '') NOT LIKE 'cuda%' "
                "THEN r.t_return_ns END) END)")
    repl = ", ".join(f"{end_expr if c == 't_end_ns' else 'r.' + c} - coalesce(o.off, 0) AS {c}"
                     for c in S.TIME_COLUMNS if c not in LAZY_COLUMNS)
    repl += ", CAST(coalesce(r.inflight, len(r.inflight_ids)) AS INTEGER) AS inflight"
    # ckey: one BIGINT per collective (pg index << 40 | seq), so that matching groups and joins
    # on an integer instead of (VARCHAR, BIGINT); NULL on every other row.
    pg_list = "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in pgs) + "]::VARCHAR[]"
    ckey = (f"CASE WHEN r.kind = 'op' AND list_contains([{COLLECTIVE_SQL[1:-1]}], r.op) AND r.seq IS NOT NULL AND r.pg IS NOT NULL "
            f"THEN (CAST(list_position({pg_list}, r.pg) AS BIGINT) << 40) | r.seq END AS ckey")
    return (f"SELECT r.* EXCLUDE ({', '.join(_LOAD_ONLY)}) REPLACE ({repl}), {ckey} "
            f"FROM ({src}) r LEFT JOIN offsets o ON o.rank = r.rank")


class Run:
    """A loaded run. See docs/dev/interfaces.md ("Analysis API") for the member contract."""

    def __init__(self, con, rf: R.RunFiles, *, _table: str | None = None, _parent: "Run | None" = None):
        self._con = con
        self._files = rf
        self._lock = threading.RLock()
        self._cache: dict = {}
        #: group names in load order: a collective key's group is its index here
        self._pgs = list(getattr(rf, "pgs", None) or [])
        self.path = rf.path
        self.manifest = rf.manifest
        self.warnings: list[str] = rf.warnings if _parent is None else list(_parent.warnings)
        if _parent is None:
            self._t = "t"
            self._prepare()
        else:
            self._t = _table
            self._info = _parent._info
        self.meta: dict[int, dict] = rf.meta
        self.world_size: int = self._info["world_size"]
        self.ranks: list[int] = self._info["ranks"]
        self.missing_ranks: list[int] = [r for r in range(self.world_size) if r not in set(self.ranks)]
        self.t_min_ns: int | None = self._info["t_min_ns"]
        self.t_max_ns: int | None = self._info["t_max_ns"]

    # ------------------------------------------------------------------ loading
    def _sql(self, q: str, params=None) -> "_Rows":
        """Run SQL and fetch every row (DuckDB refuses new work while a result is unfinished)."""
        with self._lock:
            cur = self._con.execute(q, params or [])
            try:
                rows = cur.fetchall()
            except duckdb.Error:
                rows = []
        return _Rows(rows)

    def _many(self, q: str, rows) -> None:
        with self._lock:
            self._con.executemany(q, rows)
            try:
                self._con.fetchall()
            except duckdb.Error:
                pass

    def _arrow(self, q: str, params=None) -> pa.Table:
        with self._lock:
            rel = self._con.sql(q, params=params) if params else self._con.sql(q)
            return rel.to_arrow_table() if rel is not None else pa.table({})

    def _np(self, q: str, params=None) -> dict[str, np.ndarray]:
        with self._lock:
            rel = self._con.sql(q, params=params) if params else self._con.sql(q)
            d = rel.fetchnumpy()
        out = {}
        for k, v in d.items():
            out[k] = np.ma.getdata(v) if isinstance(v, np.ma.MaskedArray) else np.asarray(v)
        return out

    def _prepare(self) -> None:
        rf = self._files
        meta = rf.meta
        offs = _offsets(meta)
        self._offsets = {r: o for r, o, _ in offs}
        self._rtts = {r: t for r, _, t in offs}
        self._assign_steps()
        info = self._sql(f"""
            SELECT min(t_enqueue_ns), max(greatest(t_enqueue_ns, t_return_ns, t_end_ns, t_wait_end_ns)),
                   list(DISTINCT rank ORDER BY rank), max(rank),
                   max(pg_size) FILTER (WHERE pg IN ('0', 'default_pg', 'default'))
            FROM t""").fetchone()
        ranks = [int(r) for r in (info[2] or []) if r is not None]
        ws = None
        for src in (self.manifest.get("world_size"),
                    max((m.get("world_size") or 0 for m in meta.values()), default=0) or None,
                    info[4]):
            if src:
                ws = int(src)
                break
        if ws is None:
            ws = (max(ranks) + 1) if ranks else 0
        ws = max(ws, (max(ranks) + 1) if ranks else 0)
        self._info = {"world_size": ws, "ranks": ranks, "t_min_ns": info[0], "t_max_ns": info[1]}
        snap = {}
        for r, s in rf.inflight.items():
            try:
                snap[r] = int(s.get("t_ns")) - self._offsets.get(r, 0)
            except (TypeError, ValueError):
                pass
        self._info["snapshot_ns"] = snap

    def _assign_steps(self) -> None:
        """Give each row a step (metrics: per-step figures): the recorded `step` column; else
        the latest step marker (kind="mark") at or before the row on its rank; else iteration
        boundaries detected from the repeating op pattern of the lowest rank."""
        con = self._con
        n_step, n_mark = self._sql(
            f"SELECT count(step) FILTER (WHERE kind = '{S.KIND_OP}'), count(*) FILTER (WHERE kind = '{S.KIND_MARK}') FROM t0").fetchone()
        if n_step or not n_mark:
            if n_step == 0:
                self._detect_steps()
                return
            self._sql("ALTER TABLE t0 RENAME TO t")
            return
        self._sql(f"""
            CREATE OR REPLACE TABLE t AS
            SELECT x.* REPLACE (coalesce(x.step, m.mstep) AS step)
            FROM t0 x ASOF LEFT JOIN (
                SELECT rank AS mrank, t_enqueue_ns AS mt, step AS mstep FROM t0
                WHERE kind = '{S.KIND_MARK}' AND step IS NOT NULL) m
              ON x.rank = m.mrank AND x.t_enqueue_ns >= m.mt""")
        self._sql("DROP TABLE t0")

    def _detect_steps(self) -> None:
        con = self._con
        lowest = self._sql("SELECT min(rank) FROM t0").fetchone()[0]
        d = self._np(f"""
            SELECT op, coalesce(bytes, 0) AS b, t_enqueue_ns FROM t0
            WHERE rank = ? AND kind = 'op' AND op IN {COLLECTIVE_SQL} AND t_enqueue_ns IS NOT NULL
            ORDER BY t_enqueue_ns""", [lowest])
        period = None
        n = len(d["t_enqueue_ns"])
        if n >= 6:
            sig = np.unique(np.char.add(np.asarray(d["op"], dtype=str),
                                        np.asarray(d["b"]).astype(str)), return_inverse=True)[1]
            ref = sig[n // 2]
            cands = np.flatnonzero(sig == ref)
            cands = np.unique(np.diff(cands))[:8]
            for p in sorted(int(c) for c in cands if 0 < c <= n // 3):
                if np.mean(sig[p:] == sig[:-p]) >= 0.9:
                    period = p
                    break
        if period is None:
            self._sql("ALTER TABLE t0 RENAME TO t")
            return
        # Boundary k: the enqueue of collective k*period on the lowest rank, mapped to every rank
        # through the matching (pg, seq) of that collective on each rank.
        self._sql(f"""
            CREATE OR REPLACE TEMP TABLE __bounds AS
            WITH ref AS (
                SELECT pg, seq, (row_number() OVER (ORDER BY t_enqueue_ns) - 1) AS k FROM t0
                WHERE rank = {int(lowest)} AND kind = 'op' AND op IN {COLLECTIVE_SQL})
            SELECT x.rank AS brank, x.t_enqueue_ns AS bt, CAST(ref.k // {period} AS BIGINT) AS bstep
            FROM ref JOIN t0 x ON x.pg = ref.pg AND x.seq = ref.seq AND x.kind = 'op'
            WHERE ref.k % {period} = 0""")
        self._sql("""
            CREATE OR REPLACE TABLE t AS
            SELECT x.* REPLACE (coalesce(x.step, b.bstep, 0) AS step)
            FROM t0 x ASOF LEFT JOIN __bounds b ON x.rank = b.brank AND x.t_enqueue_ns >= b.bt""")
        self._sql("DROP TABLE t0")
        self._sql("DROP TABLE __bounds")
        self.warnings.append(f"no step markers: steps detected from a repeating pattern of {period} collectives")

    def _pg_of_ckey(self, expr: str) -> str:
        """SQL: the group name of a collective key (its index in the load-time group list)."""
        pgs = getattr(self, "_pgs", None) or []
        lst = "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in pgs) + "]::VARCHAR[]"
        return f"list_extract({lst}, CAST({expr} >> 40 AS INTEGER))"

    # ------------------------------------------------------------------ subsets
    def subset(self, steps: tuple[int | None, int | None] | None = None) -> "Run":
        """A run restricted to steps [a, b) (either end open when None)."""
        if not steps:
            return self
        a, b = steps
        conds = []
        if a is not None:
            conds.append(f"step >= {int(a)}")
        if b is not None:
            conds.append(f"step < {int(b)}")
        if not conds:
            return self
        name = f"t_sub_{len(self._cache)}_{abs(hash(steps)) % 10**8}"
        self._sql(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM {self._t} WHERE " + " AND ".join(conds))
        sub = Run(self._con, self._files, _table=name, _parent=self)
        sub._offsets, sub._rtts, sub._pgs = self._offsets, self._rtts, getattr(self, "_pgs", [])
        rng = sub._sql(f"SELECT min(t_enqueue_ns), max(greatest(t_enqueue_ns, t_return_ns, t_end_ns, t_wait_end_ns)) FROM {name}").fetchone()
        sub.t_min_ns, sub.t_max_ns = rng
        sub._lock = self._lock
        return sub

    # ------------------------------------------------------------------ facts
    @cached_property
    def pg_members(self) -> dict[str, list[int]]:
        """Members of each process group: metadata `pg_ranks`; else every world rank for a
        group of world size; else the ranks that issued on it."""
        members: dict[str, set] = {}
        for m in self.meta.values():
            for pg, rs in (m.get("pg_ranks") or {}).items():
                try:
                    members.setdefault(str(pg), set()).update(int(x) for x in rs)
                except (TypeError, ValueError):
                    pass
        rows = self._sql(f"""
            SELECT pg, max(pg_size), list(DISTINCT rank) FROM {self._t}
            WHERE kind = 'op' AND pg IS NOT NULL GROUP BY pg""").fetchall()
        out = {pg: sorted(v) for pg, v in members.items()}
        for pg, size, rs in rows:
            if pg in out:
                continue
            if size is not None and int(size) == self.world_size:
                out[pg] = list(range(self.world_size))
            else:
                out[pg] = sorted(int(r) for r in rs)
        if any(m.get("simulated") for m in self.meta.values()):
            # A simulated world (torch's fake backend: one process plays one rank of N): the
            # other members are not processes, so only the traced ranks can join anything.
            present = set(self.ranks)
            out = {pg: [r for r in v if r in present] for pg, v in out.items()}
        return out

    @property
    def clock_offsets(self) -> dict[int, int]:
        """rank -> recorded clock offset to rank 0 (ns) that was applied (metrics: "Clock alignment")."""
        return dict(self._offsets)

    def stacks(self) -> dict[int, list[str]]:
        """rank -> Python stack dump files written on hang or SIGUSR1."""
        return dict(self._files.stacks)

    # ------------------------------------------------------------------ tables
    def ops(self, ranks=None, t0=None, t1=None, kinds=("op",), columns=None) -> pa.Table:
        """Rows of the trace (aligned), plus `blocked_ns` (host-blocked: t_return - t_enqueue,
        + t_wait_end - t_wait when waited) and `inflight_ns` (t_end - t_enqueue), metrics.md
        "Timestamps recorded per op and rank". `columns`: only these columns (none of the
        lazily loaded ones: api, backend, thread, t_start_ns, device, inflight_ids), read
        without joining the Parquet parts back."""
        if columns is not None:
            cols = [str(c) for c in columns]
            bad = [c for c in cols if c in LAZY_COLUMNS or c in _LOAD_ONLY
                   or c not in set(S.COLUMNS) | {"blocked_ns", "inflight_ns"}]
            if bad:
                raise CommtraceError(f"ops(columns=...): not available without the full rows: {', '.join(bad)}")
            return self._arrow(f"SELECT {', '.join(cols)} FROM ({self._ops_sql(ranks, t0, t1, kinds)}) q "
                               "ORDER BY rank, t_enqueue_ns")
        x = self._ensure_lazy()
        cols = []
        for c in S.COLUMNS:
            if c in S.TIME_COLUMNS and (c in LAZY_COLUMNS or c in _LOAD_ONLY):
                cols.append(f"x.{c} - coalesce(o.off, 0) AS {c}")
            elif c in LAZY_COLUMNS or c in _LOAD_ONLY:
                cols.append(f"x.{c}")
            else:
                cols.append(f"q.{c}")
        return self._arrow(f"""
            SELECT {', '.join(cols)}, q.blocked_ns, q.inflight_ns
            FROM ({self._ops_sql(ranks, t0, t1, kinds)}) q LEFT JOIN {x} x ON x.rid = q.rid
                 LEFT JOIN offsets o ON o.rank = q.rank
            ORDER BY q.rank, q.t_enqueue_ns""")

    def _ensure_lazy(self) -> str:
        """The columns left in the parts (LAZY_COLUMNS, and device / inflight_ids), by rid."""
        name = "t_lazy"
        if "lazy" not in self._cache:
            with self._lock:
                R.load_columns(self._con, self._files, name, list(LAZY_COLUMNS) + list(_LOAD_ONLY))
            self._cache["lazy"] = True
        return name

    def lazy_columns(self, where: str, columns) -> pa.Table:
        """`rid` + `columns` of the part rows matching `where` (SQL on unaligned columns), read
        straight from the Parquet parts (projection and filter pushdown)."""
        q = R.select_parts_sql(self._files, list(columns) + [c for c in ("kind", "rank") if c not in columns])
        if q is None:
            return _np_table({"rid": np.zeros(0, np.int64)})
        return self._arrow(f"SELECT rid, {', '.join(columns)} FROM ({q}) WHERE {where}")

    def _ops_sql(self, ranks=None, t0=None, t1=None, kinds=("op",)) -> str:
        conds = []
        if kinds:
            conds.append("kind IN (" + ", ".join("'" + str(k).replace("'", "''") + "'" for k in kinds) + ")")
        if ranks is not None:
            rs = [int(r) for r in ([ranks] if isinstance(ranks, (int, np.integer)) else ranks)]
            conds.append("rank IN (" + (", ".join(map(str, rs)) or "NULL") + ")")
        if t1 is not None:
            conds.append(f"t_enqueue_ns <= {int(t1)}")
        if t0 is not None:
            conds.append(f"greatest(t_enqueue_ns, t_return_ns, t_end_ns, t_wait_end_ns) >= {int(t0)}")
        where = (" WHERE " + " AND ".join(conds)) if conds else ""
        return f"""SELECT *, (t_return_ns - t_enqueue_ns) + coalesce(t_wait_end_ns - t_wait_ns, 0) AS blocked_ns,
                          t_end_ns - t_enqueue_ns AS inflight_ns FROM {self._t}{where}"""

    def _ensure_coll(self) -> str:
        """DuckDB table of matched collectives (one row per (pg, seq)); see collectives()."""
        name = f"{self._t}_coll"
        if name in self._cache:
            return name
        self._cache.pop(f"{self._t}_waits", None)
        members = self.pg_members
        self._sql(f"CREATE OR REPLACE TEMP TABLE {name}_m (pg VARCHAR, n_members INTEGER)")
        if members:
            self._many(f"INSERT INTO {name}_m VALUES (?, ?)", [(k, len(v)) for k, v in members.items()])
        f = _factor_sql("c.op", "c.n")
        self._sql(f"""
            CREATE OR REPLACE TABLE {name} AS
            WITH k0 AS (
                SELECT ckey, any_value(op) AS op, max(pg_size) AS pg_size,
                       count(*) AS n_ranks, max(bytes) AS in_bytes,
                       min(t_enqueue_ns) AS first_enter_ns, max(t_enqueue_ns) AS last_enter_ns,
                       arg_max(rank, t_enqueue_ns) AS last_rank,
                       min(t_end_ns) AS first_leave_ns, max(t_end_ns) AS last_leave_ns,
                       count(t_end_ns) AS n_done, count(*) AS n_rows, min(step) AS step,
                       any_value(site) AS site,
                       bool_or(coalesce(first_on_pg, false)) AS first_on_pg,
                       min(hash(op, dtype, count)) <> max(hash(op, dtype, count))
                         OR bool_or(op = 'all_gather' AND out_bytes <> bytes * pg_size)
                         OR bool_or(op = 'reduce_scatter' AND out_bytes * pg_size <> bytes) AS differs
                FROM {self._t}
                WHERE ckey IS NOT NULL
                GROUP BY ckey),
            -- Rooted ops only (broadcast, scatter, reduce, gather): the root's entry and leave.
            rt AS (
                SELECT ckey, min(root) AS root,
                       max(CASE WHEN rank = root THEN t_enqueue_ns END) AS root_enter_ns,
                       max(CASE WHEN rank <> root THEN t_enqueue_ns END) AS last_nonroot_enter_ns,
                       min(CASE WHEN rank <> root THEN t_end_ns END) AS first_nonroot_leave_ns,
                       max(CASE WHEN rank = root THEN t_end_ns END) AS root_leave_ns
                FROM {self._t} WHERE ckey IS NOT NULL AND op IN ({_ROOTED_SQL}) GROUP BY ckey),
            k AS (
                SELECT k0.*, {self._pg_of_ckey("k0.ckey")} AS pg, k0.ckey & {(1 << 40) - 1} AS seq,
                       rt.* EXCLUDE (ckey)
                FROM k0 LEFT JOIN rt ON rt.ckey = k0.ckey),
            c AS (
                SELECT k.*, coalesce(m.n_members, k.pg_size, k.n_ranks) AS n_expected,
                       greatest(coalesce(k.pg_size, k.n_ranks), 1) AS n,
                       {_PATTERN_SQL} AS pattern,
                       (k.n_done = k.n_rows AND k.n_ranks >= coalesce(m.n_members, k.pg_size, k.n_ranks)) AS complete,
                       k.seq = min(k.seq) OVER (PARTITION BY k.pg) AS first_of_pg
                FROM k LEFT JOIN {name}_m m ON m.pg = k.pg)
            SELECT ckey, pg, seq, op, pattern, pg_size, n_ranks, n_expected, complete,
                   CAST(CASE WHEN op IN {_BYTES_X_N_SQL} THEN in_bytes * n ELSE in_bytes END AS BIGINT) AS bytes,
                   CASE WHEN complete AND first_leave_ns > last_enter_ns THEN first_leave_ns - last_enter_ns END AS t_comm_ns,
                   first_enter_ns, last_enter_ns, first_leave_ns, last_leave_ns,
                   last_enter_ns - first_enter_ns AS arrival_skew_ns,
                   CASE WHEN complete THEN last_leave_ns - first_leave_ns END AS completion_skew_ns,
                   last_rank,
                   CAST(NULL AS BIGINT) AS last_late_ns,
                   root, root_enter_ns, last_nonroot_enter_ns, first_nonroot_leave_ns, root_leave_ns,
                   step, site, first_of_pg, first_on_pg, coalesce(differs, false) AS differs, {f} AS busbw_factor
            FROM c""")
        self._cache[name] = True
        # Rooted patterns: t_comm = min over the waiting ranks of (leave - enter - wait), which
        # for N x N is exactly min_r leave_r - max_j enter_j (metrics.md), and for a broadcast
        # whose root finished before a late receiver entered stays the transfer time itself.
        w = self._ensure_waits()
        # last_late_ns: the last arrival's lead over the second-latest one (straggler evidence).
        self._sql(f"""
            UPDATE {name} SET
                t_comm_ns = CASE WHEN {name}.pattern <> 'nxn' AND u.tc > 0 THEN u.tc ELSE {name}.t_comm_ns END,
                last_late_ns = u.lead
            FROM (
                SELECT ckey, min(t_end_ns - t_enqueue_ns - wait_ns) FILTER (WHERE tc_role) AS tc,
                       min(lead_ns) FILTER (WHERE NOT is_last) AS lead
                FROM {w} GROUP BY ckey) u
            WHERE {name}.ckey = u.ckey""")
        self._sql(f"""
            CREATE OR REPLACE TABLE {name} AS
            SELECT *, bytes / t_comm_ns AS algbw_gbps, bytes / t_comm_ns * busbw_factor AS busbw_gbps
            FROM {name}""")
        self._cache[name] = True
        return name

    def collectives(self) -> pa.Table:
        """One row per matched collective (pg, seq), metrics.md "Matching one collective across
        ranks": `bytes` (S), `t_comm_ns` (min_r leave_r - max_j enter_j, null unless every member
        completed), `algbw_gbps` = S / t_comm, `busbw_gbps` = algbw x F (nccl-tests factors),
        `arrival_skew_ns`, `completion_skew_ns`, `last_rank` (arrived last), `last_late_ns`
        (its lead over the second-latest arrival), `first_enter_ns`, `last_enter_ns`, `step`."""
        c = self._ensure_coll()
        return self._arrow(f"SELECT * EXCLUDE (ckey) FROM {c} ORDER BY pg, seq")

    def _ensure_waits(self) -> str:
        name = f"{self._t}_waits"
        if name in self._cache:
            return name
        c = self._ensure_coll()
        self._sql(f"""
            CREATE OR REPLACE TABLE {name} AS
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
            FROM {self._t} x JOIN {c} k ON k.ckey = x.ckey
            WHERE k.complete""")
        self._cache[name] = True
        return name

    def waits(self) -> pa.Table:
        """Wait state per (pg, seq, rank), Scalasca's definitions of metrics.md "Wait states"
        (clamped >= 0): `wait_ns` by `pattern` (nxn: min(max_j enter_j, leave_r) - enter_r;
        late_broadcast for non-roots; early_reduce for the root) and `completion_wait_ns`
        (N x N completion). Only collectives that every member completed."""
        w = self._ensure_waits()
        c = self._ensure_coll()
        return self._arrow(f"""
            SELECT k.pg, k.seq, w.rank, k.op, k.pattern, w.step, w.t_enqueue_ns, w.t_end_ns, w.wait_ns,
                   w.completion_wait_ns, w.lead_ns, w.is_last
            FROM {w} w JOIN {c} k ON k.ckey = w.ckey ORDER BY k.pg, k.seq, w.rank""")

    def _ensure_p2p(self) -> str:
        name = f"{self._t}_p2p"
        if name in self._cache:
            return name
        self._sql(f"""
            CREATE OR REPLACE TABLE {name} AS
            WITH x AS MATERIALIZED (
                SELECT pg, op, rank, peer, t_enqueue_ns, t_end_ns, bytes, async_op, site, step,
                       CASE WHEN coalesce(async_op, false) THEN t_wait_ns ELSE t_enqueue_ns END AS block_ns,
                       row_number() OVER (PARTITION BY pg, op, rank, peer ORDER BY t_enqueue_ns, op_id) AS pair_seq
                FROM {self._t}
                WHERE ckey IS NULL AND peer IS NOT NULL AND peer >= 0 AND kind = 'op' AND op IN ('send', 'recv')),
            s AS (SELECT x.* EXCLUDE (op, rank, peer), rank AS src, peer AS dst FROM x WHERE op = 'send'),
            r AS (SELECT x.* EXCLUDE (op, rank, peer), peer AS src, rank AS dst FROM x WHERE op = 'recv')
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
            FROM s FULL OUTER JOIN r ON s.pg = r.pg AND s.src = r.src AND s.dst = r.dst AND s.pair_seq = r.pair_seq""")
        self._cache[name] = True
        return name

    def p2p(self) -> pa.Table:
        """Matched point-to-point pairs by (pg, src, dst, per-pair seq), metrics.md: late sender
        (recv waits for send) = enter_send - enter_recv capped at leave_recv; late receiver
        (send waits for recv) = enter_recv - enter_send capped at leave_send; both >= 0. For a
        non-blocking isend/irecv the host waits in wait(), so its wait starts at `t_wait_ns`
        instead of the enqueue (as Scalasca attributes MPI_Wait); never waited: no wait state."""
        p = self._ensure_p2p()
        return self._arrow(f"SELECT * FROM {p} ORDER BY pg, src, dst, pair_seq")

    # ------------------------------------------------------------------ per rank / step
    def _wait_by_rank_step(self) -> pa.Table:
        """Wait-state totals per (rank, step): collectives' wait_ns (but the first collective
        of each group, whose wait is start-up skew: see `init_wait_s`), late sender on the recv
        side, late receiver on blocking sends."""
        key = "wait_rs"
        if key in self._cache:
            return self._cache[key]
        w = self._ensure_waits()
        p = self._ensure_p2p()
        t = self._np(f"""
            SELECT rank, coalesce(step, -9223372036854775807) AS step, sum(wait_ns)::BIGINT AS wait_ns, sum(completion_wait_ns)::BIGINT AS completion_wait_ns,
                   sum(ls)::BIGINT AS late_sender_ns, sum(lr)::BIGINT AS late_receiver_ns
            FROM (
                SELECT rank, step, wait_ns, completion_wait_ns, 0 AS ls, 0 AS lr FROM {w} WHERE NOT first_of_pg
                UNION ALL
                SELECT dst, step, late_sender_ns, 0, late_sender_ns, 0 FROM {p} WHERE recv_enter_ns IS NOT NULL AND send_enter_ns IS NOT NULL
                UNION ALL
                SELECT src, step, late_receiver_ns, 0, 0, late_receiver_ns FROM {p}
                WHERE send_enter_ns IS NOT NULL AND recv_enter_ns IS NOT NULL)
            GROUP BY rank, step""")
        self._cache[key] = t
        return t

    def _overlap(self) -> dict:
        """Unions and intersections per rank (metrics.md "Overlap", HTA's definition at ns
        resolution): C = union of comm intervals [t_enqueue, t_end]; Bl = union of host-blocked
        intervals (the call, wait(), synchronize()); B, the host's not-blocked time, is the
        complement of Bl, so exposed = |C ∩ Bl| and overlapped = |C| - exposed. GPU traces add
        `stream_wait_ns` (the compute stream behind the comm stream) to the exposed part."""
        if "overlap" in self._cache:
            return self._cache["overlap"]
        fut = self._cache.get("overlap_future")
        out = fut.result() if fut is not None else self._compute_overlap(None)
        self._cache["overlap"] = out
        return out

    def start_background(self) -> None:
        """Start the numpy overlap computation on a second DuckDB cursor in a thread, so that it
        runs while the SQL side matches collectives (both release the GIL)."""
        if "overlap" in self._cache or "overlap_future" in self._cache:
            return
        from concurrent.futures import ThreadPoolExecutor
        with self._lock:
            cur = self._con.cursor()
        ex = ThreadPoolExecutor(1, thread_name_prefix="commtrace-overlap")
        self._cache["overlap_future"] = ex.submit(self._compute_overlap, cur)
        ex.shutdown(wait=False)

    def _compute_overlap(self, cur) -> dict:
        def fetch(q):
            if cur is None:
                return self._np(q)
            d = cur.sql(q).fetchnumpy()
            return {k: (np.ma.getdata(v) if isinstance(v, np.ma.MaskedArray) else np.asarray(v)) for k, v in d.items()}
        base = self.t_min_ns or 0
        span = (self.t_max_ns or base) - base + 1
        stride = IV.keyspace_stride(span)
        nr = (max(self.ranks) + 1) if self.ranks else 0
        d = fetch(f"""
            SELECT rank::BIGINT * {stride} + (t_enqueue_ns - {base}) AS s, rank::BIGINT * {stride} + (t_end_ns - {base}) AS e
            FROM {self._t} WHERE kind = 'op' AND t_enqueue_ns IS NOT NULL AND t_end_ns IS NOT NULL""")
        c_s, c_e = IV.union(d["s"], d["e"])
        del d
        # One scan for both kinds of blocked interval: the call and the wait().
        b = fetch(f"""
            SELECT rank::BIGINT * {stride} AS k, coalesce(t_enqueue_ns - {base}, -1) AS a,
                   coalesce(t_return_ns - {base}, -1) AS z, coalesce(t_wait_ns - {base}, -1) AS wa,
                   coalesce(t_wait_end_ns - {base}, -1) AS wz
            FROM {self._t} WHERE kind IN ('op', 'sync')
              AND ((t_enqueue_ns IS NOT NULL AND t_return_ns IS NOT NULL)
                   OR (t_wait_ns IS NOT NULL AND t_wait_end_ns IS NOT NULL))""")
        m1 = (b["a"] >= 0) & (b["z"] >= 0)
        m2 = (b["wa"] >= 0) & (b["wz"] >= 0)
        b = {"s": np.concatenate([b["k"][m1] + b["a"][m1], b["k"][m2] + b["wa"][m2]]),
             "e": np.concatenate([b["k"][m1] + b["z"][m1], b["k"][m2] + b["wz"][m2]])}
        b_s, b_e = IV.union(b["s"], b["e"])
        del b
        x_s, x_e = IV.intersect(c_s, c_e, b_s, b_e)
        if cur is not None:
            cur.close()
        return {"stride": stride, "base": base, "nr": nr, "C": (c_s, c_e), "B": (b_s, b_e), "X": (x_s, x_e)}

    def _rank_step(self) -> dict[str, np.ndarray]:
        """One pass per (rank, step) (step may be null): ops, bytes, GPU stream waits, time in
        synchronize(), and the step's first timestamp (its boundary)."""
        if "rank_step" not in self._cache:
            self._cache["rank_step"] = self._np(f"""
                SELECT rank, step, count(*) FILTER (WHERE kind = 'op') AS ops,
                       coalesce(sum(bytes) FILTER (WHERE kind = 'op'), 0)::BIGINT AS bytes,
                       coalesce(sum(stream_wait_ns) FILTER (WHERE kind = 'op'), 0)::BIGINT AS stream_wait_ns,
                       coalesce(sum(t_return_ns - t_enqueue_ns) FILTER (WHERE kind = 'sync'), 0)::BIGINT AS sync_ns,
                       min(t_enqueue_ns) AS t0, step IS NULL AS nostep
                FROM {self._t} GROUP BY rank, step ORDER BY rank, step""")
        return self._cache["rank_step"]

    def per_rank(self) -> pa.Table:
        """Per rank, in seconds (metrics.md): `ops`; `blocked_s` = |union of host-blocked
        intervals|; `inflight_s` = |C|, the union of in-flight intervals; `exposed_s` = |C ∩
        blocked| (+ GPU stream waits); `overlapped_s` = inflight - exposed; `overlap_ratio` =
        overlapped / inflight; `wait_s` = wait-state total (N x N, late broadcast, early reduce,
        late sender, late receiver on blocking sends); `completion_wait_s`, `late_sender_s`,
        `late_receiver_s`, `sync_s` (time in synchronize()), `bytes`, `last_count`,
        `straggler_share` (fraction of its collectives in which it arrived last) and
        `init_wait_s` (wait in the first collective of each group: start-up skew and
        connection set-up, kept out of `wait_s`)."""
        if "per_rank" in self._cache:
            return self._cache["per_rank"]
        ov = self._overlap()
        nr, stride = ov["nr"], ov["stride"]
        C = IV.per_rank_sum(*ov["C"], stride, nr)
        B = IV.per_rank_sum(*ov["B"], stride, nr)
        X = IV.per_rank_sum(*ov["X"], stride, nr)
        rs = self._rank_step()
        ranks_u = np.unique(rs["rank"].astype(np.int64))
        pos = np.searchsorted(ranks_u, rs["rank"].astype(np.int64))
        base = {"rank": ranks_u}
        for k in ("ops", "bytes", "stream_wait_ns", "sync_ns"):
            base[k] = np.bincount(pos, weights=rs[k].astype(np.float64), minlength=len(ranks_u))
        w = self._wait_by_rank_step()
        ranks = base["rank"]
        idx = {int(r): i for i, r in enumerate(ranks)}
        wsum = {k: np.zeros(len(ranks)) for k in ("wait_ns", "completion_wait_ns", "late_sender_ns", "late_receiver_ns")}
        if len(w["rank"]):
            wr = np.searchsorted(ranks, w["rank"].astype(np.int64))
            wr = np.where((wr < len(ranks)) & (ranks[np.clip(wr, 0, len(ranks) - 1)] == w["rank"]), wr, -1)
            ok = wr >= 0
            for k in wsum:
                v = np.nan_to_num(w[k].astype(np.float64))
                wsum[k] = np.bincount(wr[ok], weights=v[ok], minlength=len(ranks))
        self.stragglers()
        st = self._cache["stragglers_np"]
        last = np.zeros(len(ranks), np.int64)
        share = np.zeros(len(ranks))
        for r, lc, sh in zip(st["rank"], st["last_count"], st["share"]):
            if int(r) in idx:
                last[idx[int(r)]], share[idx[int(r)]] = lc, sh
        rr = np.clip(ranks, 0, max(nr - 1, 0))
        inr = ranks < nr
        c = np.where(inr, C[rr] if nr else 0.0, 0.0)
        x = np.minimum(np.where(inr, X[rr] if nr else 0.0, 0.0) + base["stream_wait_ns"], c)
        b = np.where(inr, B[rr] if nr else 0.0, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(c > 0, (c - x) / c, np.nan)
        iw = self._np(f"SELECT rank, sum(wait_ns)::BIGINT AS w FROM {self._ensure_waits()} WHERE first_of_pg GROUP BY rank")
        init_wait = np.zeros(len(ranks))
        for r, v in zip(iw["rank"], iw["w"]):
            j = np.searchsorted(ranks, int(r))
            if j < len(ranks) and ranks[j] == int(r):
                init_wait[j] = float(v)
        rows = {"rank": ranks.astype(np.int64), "ops": base["ops"].astype(np.int64), "blocked_s": b / 1e9,
                "inflight_s": c / 1e9, "exposed_s": x / 1e9, "overlapped_s": (c - x) / 1e9, "overlap_ratio": ratio,
                "wait_s": wsum["wait_ns"] / 1e9, "completion_wait_s": wsum["completion_wait_ns"] / 1e9,
                "late_sender_s": wsum["late_sender_ns"] / 1e9, "late_receiver_s": wsum["late_receiver_ns"] / 1e9,
                "sync_s": base["sync_ns"] / 1e9, "bytes": base["bytes"].astype(np.int64),
                "last_count": last, "straggler_share": share, "init_wait_s": init_wait / 1e9}
        t = _np_table(rows)
        self._cache["per_rank"] = t
        return t

    def per_step(self) -> pa.Table:
        """Per (rank, step): the per_rank figures (seconds), for the trend over the run. Union
        segments are attributed to the step in which they start."""
        if "per_step" in self._cache:
            return self._cache["per_step"]
        ov = self._overlap()
        stride, base = ov["stride"], ov["base"]
        rs = self._rank_step()
        m = ~rs["nostep"].astype(bool)
        b_rank, b_step = rs["rank"][m].astype(np.int64), rs["step"][m].astype(np.int64)
        keys = b_rank * stride + (rs["t0"][m].astype(np.int64) - base)
        order = np.argsort(keys, kind="stable")
        keys, b_rank, b_step = keys[order], b_rank[order], b_step[order]
        b_ops, b_sw = rs["ops"][m][order], rs["stream_wait_ns"][m][order]
        acc: dict[str, dict] = {}
        if len(keys):
            # Rank r's first boundary is moved to the start of r's key range, so that segments
            # before it count in its first step; then each (sorted) segment takes the last
            # boundary at or before its start: a bincount of boundary positions and a cumsum,
            # O(n) instead of a binary search per segment.
            kk = keys.copy()
            first_of_rank = np.r_[True, b_rank[1:] != b_rank[:-1]]
            kk[first_of_rank] = b_rank[first_of_rank] * stride
            for nm in ("C", "B", "X"):
                s, e = ov[nm]
                if not len(s):
                    acc[nm] = np.zeros(len(keys))
                    continue
                pos = np.searchsorted(s, kk, side="left")
                idx = np.cumsum(np.bincount(pos, minlength=len(s) + 1)[: len(s)]) - 1
                ok = idx >= 0
                ok[ok] = b_rank[idx[ok]] == s[ok] // stride
                acc[nm] = np.bincount(idx[ok], weights=(e - s)[ok].astype(np.float64), minlength=len(keys))
        opc = _np_table({"rank": b_rank, "step": b_step, "ops": b_ops.astype(np.int64),
                        "stream_wait_ns": b_sw.astype(np.int64)})
        w = self._wait_by_rank_step()
        con = duckdb.connect()
        con.register("opc", opc)
        con.register("w", _np_table(w))
        con.register("seg", _np_table({
            "rank": b_rank, "step": b_step,
            "C": acc.get("C", np.zeros(len(keys))), "B": acc.get("B", np.zeros(len(keys))),
            "X": acc.get("X", np.zeros(len(keys)))}))
        t = con.sql("""
            SELECT s.rank, s.step, coalesce(o.ops, 0) AS ops, s.B / 1e9 AS blocked_s, s.C / 1e9 AS inflight_s,
                   least(s.X + coalesce(o.stream_wait_ns, 0), s.C) / 1e9 AS exposed_s,
                   (s.C - least(s.X + coalesce(o.stream_wait_ns, 0), s.C)) / 1e9 AS overlapped_s,
                   CASE WHEN s.C > 0 THEN (s.C - least(s.X + coalesce(o.stream_wait_ns, 0), s.C)) / s.C END AS overlap_ratio,
                   coalesce(w.wait_ns, 0) / 1e9 AS wait_s, coalesce(w.late_sender_ns, 0) / 1e9 AS late_sender_s,
                   coalesce(w.late_receiver_ns, 0) / 1e9 AS late_receiver_s
            FROM seg s LEFT JOIN opc o ON o.rank = s.rank AND o.step = s.step
                       LEFT JOIN w ON w.rank = s.rank AND w.step = s.step
            ORDER BY s.step, s.rank""").to_arrow_table()
        con.close()
        self._cache["per_step"] = t
        return t

    # ------------------------------------------------------------------ stragglers
    def stragglers(self) -> pa.Table:
        """Straggler share per rank (metrics.md "Wait states"): over complete collectives with
        at least two members, excluding the first collective of each group (connection
        set-up): `n_collectives` the rank took part in, `last_count` (times it arrived last),
        `share` = last_count / n_collectives, `expected_share` (sum of 1/n over those
        collectives / n_collectives), `mean_late_ns` / `total_late_ns` (its lead over the
        second-latest arrival when last), `typical_late_ns` (median lead of the last arrival in
        the collectives where it was not last)."""
        if "stragglers" in self._cache:
            return self._cache["stragglers"]
        c = self._ensure_coll()
        w = self._ensure_waits()
        part = self._np(f"""
            SELECT rank, count(*) AS n_collectives, sum(1.0 / n_ranks) AS exp_count,
                   sum((1.0 / n_ranks) * (1 - 1.0 / n_ranks)) AS var_count
            FROM {w} WHERE n_ranks >= 2 AND NOT first_of_pg GROUP BY rank ORDER BY rank""")
        lr = self._np(f"""
            SELECT last_rank, last_late_ns FROM {c}
            WHERE complete AND n_ranks >= 2 AND NOT first_of_pg AND last_late_ns IS NOT NULL""")
        last_rank = lr["last_rank"].astype(np.int64)
        late = lr["last_late_ns"].astype(np.float64)
        ranks = part["rank"].astype(np.int64)
        n = part["n_collectives"].astype(np.int64)
        gmed = float(np.median(late)) if len(late) else 0.0
        cnt = np.zeros(len(ranks), np.int64)
        tot = np.zeros(len(ranks))
        typ = np.zeros(len(ranks))
        for i, r in enumerate(ranks):
            mine = last_rank == r
            k = int(mine.sum())
            cnt[i] = k
            tot[i] = late[mine].sum() if k else 0.0
            others = len(late) - k
            # The lead of other ranks' last arrivals: needs a few of them to mean anything.
            typ[i] = (gmed if k == 0 else float(np.median(late[~mine]))) if others >= 10 else 0.0
        self._cache["stragglers_np"] = d = {
            "rank": ranks, "n_collectives": n, "last_count": cnt,
            "share": np.where(n > 0, cnt / np.maximum(n, 1), 0.0),
            "expected_share": np.where(n > 0, part["exp_count"].astype(float) / np.maximum(n, 1), 0.0),
            "var_count": part["var_count"].astype(float),
            "mean_late_ns": np.where(cnt > 0, tot / np.maximum(cnt, 1), 0.0),
            "total_late_ns": tot.astype(np.int64), "typical_late_ns": typ}
        t = _np_table(d)
        self._cache["stragglers"] = t
        return t

    # ------------------------------------------------------------------ summaries
    def collectives_summary(self) -> pa.Table:
        """Per (pg, op, size bucket): `count`, mean `t_comm_s`, mean `busbw_gbps` (nccl-tests,
        metrics.md), with min/max/std. Size buckets are powers of two of S (`size_bucket` is the
        bucket's lower bound in bytes, `size_label` its readable form)."""
        c = self._ensure_coll()
        t = self._arrow(f"""
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
            FROM {c} GROUP BY pg, op, size_bucket ORDER BY pg, op, size_bucket""")
        return t

    def clock(self) -> dict:
        """Clock alignment facts (metrics.md "Clock alignment"): offsets applied and the count of
        clock violations after alignment: matched complete collectives where a completion
        precedes an entry it depends on (N x N: min leave < max enter; late broadcast: a
        non-root leaves before the root enters; early reduce: the root leaves before the last
        non-root enters), beyond half the recorded round trip of the ranks' offset estimates."""
        if "clock" in self._cache:
            return self._cache["clock"]
        c = self._ensure_coll()
        tol = max([v for v in self._rtts.values() if v] or [0]) // 2
        row = self._sql(f"""
            WITH v AS (
                SELECT pg, seq, op, CASE pattern
                    WHEN 'late_broadcast' THEN root_enter_ns - first_nonroot_leave_ns
                    WHEN 'early_reduce' THEN last_nonroot_enter_ns - root_leave_ns
                    ELSE last_enter_ns - first_leave_ns END AS by_ns, last_rank
                FROM {c} WHERE complete AND n_ranks >= 2)
            SELECT count(*), count(*) FILTER (WHERE by_ns > {tol}), max(by_ns) FILTER (WHERE by_ns > {tol}),
                   list(DISTINCT last_rank) FILTER (WHERE by_ns > {tol}),
                   arg_max(pg, by_ns) FILTER (WHERE by_ns > {tol}), arg_max(seq, by_ns) FILTER (WHERE by_ns > {tol})
            FROM v""").fetchone()
        out = {"offsets_ns": {str(r): o for r, o in sorted(self._offsets.items())},
               "methods": sorted({str(m.get("clock_offset_method")) for m in self.meta.values()
                                  if m.get("clock_offset_method")}),
               "tolerance_ns": int(tol), "matched": int(row[0] or 0), "violations": int(row[1] or 0),
               "max_violation_ns": int(row[2]) if row[2] is not None else 0,
               "late_ranks": sorted(int(x) for x in (row[3] or [])),
               "worst": {"pg": row[4], "seq": row[5]} if row[1] else None}
        self._cache["clock"] = out
        return out

    # ------------------------------------------------------------------ timeline
    def timeline_bins(self, t0=None, t1=None, nbins: int = 200, ranks=None) -> pa.Table:
        """Per (rank, bin) over [t0, t1): `blocked_ns` (host-blocked time: calls, waits),
        `inflight_ns` (in-flight time), `wait_ns` (wait-state time: [enter, enter + wait]),
        `sync_ns` (synchronize() time) and `ops` (ops entered in the bin). Durations of
        overlapping intervals add up (in-flight can exceed the bin width with several ops in
        flight). For level-of-detail drawing: cost is O(rows in window), whatever nbins."""
        t0 = self.t_min_ns if t0 is None else int(t0)
        t1 = (self.t_max_ns + 1) if t1 is None else int(t1)
        nbins = max(1, int(nbins))
        if t0 is None or t1 is None or t1 <= t0:
            return _np_table({"rank": np.zeros(0, np.int32), "bin": np.zeros(0, np.int64),
                              "t0_ns": np.zeros(0, np.int64), "t1_ns": np.zeros(0, np.int64),
                              **{k: np.zeros(0, np.int64) for k in ("blocked_ns", "inflight_ns", "wait_ns", "sync_ns", "ops")}})
        edges = np.linspace(t0, t1, nbins + 1).round().astype(np.int64)
        edges[0], edges[-1] = t0, t1
        rsel = ""
        if ranks is not None:
            rs = [int(r) for r in ([ranks] if isinstance(ranks, (int, np.integer)) else ranks)]
            rsel = " AND rank IN (" + (", ".join(map(str, rs)) or "NULL") + ")"
        win = f"a < {t1} AND z > {t0}"
        w = self._ensure_waits()
        d = self._np(f"""
            SELECT rank, kind_, a, z FROM (
                SELECT rank, 0 AS kind_, t_enqueue_ns AS a, t_return_ns AS z FROM {self._t} WHERE kind = 'op'
                UNION ALL SELECT rank, 0, t_wait_ns, t_wait_end_ns FROM {self._t} WHERE kind = 'op'
                UNION ALL SELECT rank, 1, t_enqueue_ns, t_end_ns FROM {self._t} WHERE kind = 'op'
                UNION ALL SELECT rank, 2, t_enqueue_ns, t_enqueue_ns + wait_ns FROM {w} WHERE wait_ns > 0
                UNION ALL SELECT rank, 3, t_enqueue_ns, t_return_ns FROM {self._t} WHERE kind = 'sync')
            WHERE a IS NOT NULL AND z IS NOT NULL AND {win}{rsel} ORDER BY rank""")
        cnt = self._np(f"""
            SELECT rank, CAST(floor((t_enqueue_ns - {t0}) * {nbins} / {t1 - t0}) AS BIGINT) AS b, count(*) AS n
            FROM {self._t} WHERE kind = 'op' AND t_enqueue_ns >= {t0} AND t_enqueue_ns < {t1}{rsel}
            GROUP BY ALL""")
        rank_list = sorted(set(self.ranks) if ranks is None else set(rs) & set(self.ranks))
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
        return _np_table({
            "rank": np.repeat(np.array(rank_list, np.int32), nbins),
            "bin": np.tile(np.arange(nbins, dtype=np.int64), nr),
            "t0_ns": np.tile(edges[:-1], nr), "t1_ns": np.tile(edges[1:], nr),
            "blocked_ns": out[0].ravel(), "inflight_ns": out[1].ravel(),
            "wait_ns": out[2].ravel(), "sync_ns": out[3].ravel(), "ops": ops.ravel()})

    # ------------------------------------------------------------------ findings / report
    def findings(self) -> list:
        """Findings (docs/findings.md), sorted by severity then impact."""
        if "findings" not in self._cache:
            from .findings import detect_all
            self._cache["findings"] = detect_all(self)
        return self._cache["findings"]

    def last_completed(self) -> dict[int, dict | None]:
        """rank -> its last completed op (op, pg, seq, site, t_end_ns), the "last completed op"
        that names a hang culprit's position."""
        if "last_completed" in self._cache:
            return dict(self._cache["last_completed"])
        rows = self._sql(f"""
            SELECT rank, x.op, x.pg, x.seq, x.site, x.t FROM (
                SELECT rank, arg_max(struct_pack(op := op, pg := pg, seq := seq, site := site, t := t_end_ns), t_end_ns) AS x
                FROM {self._t} WHERE kind = 'op' AND t_end_ns IS NOT NULL GROUP BY rank) ORDER BY rank""").fetchall()
        out: dict[int, dict | None] = {r: None for r in self.ranks}
        for r, op, pg, seq, site, te in rows:
            out[int(r)] = {"op": op, "pg": pg, "seq": seq, "site": site, "t_end_ns": te}
        self._cache["last_completed"] = out
        return dict(out)

    def rank_states(self) -> dict[int, dict]:
        """rank -> how its process stands: alive, exited, crashed, ... (analysis/job.py)."""
        if "rank_states" not in self._cache:
            from .job import rank_states
            self._cache["rank_states"] = rank_states(self._files, self.world_size)
        return self._cache["rank_states"]

    def job(self) -> dict:
        """How the job ended: the report's ``job`` key (analysis/job.py, docs/report.md)."""
        from .job import job_state
        return job_state(self._files, self.world_size, self.rank_states())

    @property
    def run_id(self) -> str | None:
        """The run id (schema v2; None for version-1 traces)."""
        return self.manifest.get("run_id") or next(
            (m.get("run_id") for m in self.meta.values() if m.get("run_id")), None)

    def report(self, top: int = 10, rank: int | None = None, steps=None, progress=None,
               busbw_ref: float | None = None) -> dict:
        """The `commtrace report --format json` dict (public contract, docs/report.md).
        `busbw_ref` (GB/s) adds a what-if per collective op kind at that bus bandwidth."""
        from .report import build_report
        return build_report(self, top=top, rank=rank, steps=steps, progress=progress, busbw_ref=busbw_ref)

    def close(self) -> None:
        """Release the DuckDB connection."""
        try:
            self._con.close()
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        return f"<commtrace.Run {self.path!r} world_size={self.world_size} ranks={len(self.ranks)}>"


def _np_array(a) -> pa.Array:
    """Arrow array from a numpy array without pa.array(), which imports pandas (~0.8 s) on
    first use; floats keep NaN, bools are bit-packed."""
    a = np.ascontiguousarray(a)
    if a.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), len(a), [None, pa.py_buffer(np.packbits(a, bitorder="little"))])
    types = {np.dtype(np.int64): pa.int64(), np.dtype(np.int32): pa.int32(), np.dtype(np.float64): pa.float64()}
    if a.dtype not in types:
        a = a.astype(np.float64 if a.dtype.kind == "f" else np.int64)
    return pa.Array.from_buffers(types[a.dtype], len(a), [None, pa.py_buffer(a)])


def _np_table(cols: dict) -> pa.Table:
    """Arrow table from a dict of numpy arrays (see _np_array)."""
    return pa.Table.from_arrays([_np_array(np.asarray(v)) for v in cols.values()], names=list(cols))


class _Rows:
    def __init__(self, rows):
        self.rows = rows

    def fetchall(self):
        return self.rows

    def fetchone(self):
        return self.rows[0] if self.rows else None


__all__ = ["load", "Run", "CommtraceError"]
