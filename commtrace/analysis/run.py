"""A loaded run (`commtrace.load(DIR)` -> :class:`Run`): loads once, caches the tables.

All figures follow ``shared/reference/metrics.md``; each method names the definition it
implements. The work is done by modules of pure functions over a DuckDB connection, which this
class only calls and caches (Holistic Trace Analysis splits its trace parser from its analyzers
the same way):

* :mod:`.loading`: the aligned op table ``t`` (clocks aligned to rank 0, completions filled,
  ``step``, collective key ``ckey``), clustered by rank, on disk and spillable when large;
* :mod:`.matching`: collectives by (pg, seq), their wait states, p2p pairs, wait totals per
  (rank, step) — the engine boundary (docs/large-jobs.md);
* :mod:`.overlap`: per-rank and per-step overlap, by chunks of ranks;
* :mod:`.summaries`: stragglers, per-rank figures, collectives by size, clock, timeline bins;
* :mod:`.findings` and :mod:`.report` read only this class's public tables.

Tables are ``pyarrow.Table``; times are int64 ns on rank 0's clock (offsets applied). Code
that queries the run in SQL uses :meth:`Run.table` (the DuckDB name of one of the run's
tables, built on first use) and :meth:`Run.sql` / :meth:`Run.arrow`.
"""

from __future__ import annotations

import threading
from functools import cached_property

import numpy as np
import pyarrow as pa

from ..errors import CommtraceError
from ..format import reader as R
from ..format import schema as S
from . import in_thread
from . import loading as L
from . import matching as M
from . import overlap as OV
from . import sql as Q
from . import summaries as SU

# Names other modules imported from here before the split (kept: public API of this module).
COLLECTIVE_SQL = Q.COLLECTIVE_SQL
LAZY_COLUMNS = L.LAZY_COLUMNS
LOAD_COLUMNS = L.LOAD_COLUMNS
_LOAD_ONLY = L.LOAD_ONLY
_np_table = Q.np_table
_np_array = Q.np_array
_Rows = Q.Rows


def load(path, *, threads: int | None = None, memory_limit: str | None = None, progress=None,
         run: str | None = None, temp_dir: str | None = None, engine: str = "duckdb",
         spark_master: str | None = None, spark_parts_url: str | None = None,
         in_memory: bool = False) -> "Run":
    """Load a run directory (or one Parquet trace) for analysis.

    `path` may also be a directory of runs (the output of ``commtrace run -o``): with one run
    below it, that run is loaded; with several, `run` picks one (its id, or ``"latest"``),
    else :class:`commtrace.format.runs.MultipleRunsError` (exit code 2) lists them.
    Raises :class:`commtrace.errors.TraceFormatError` (or a subclass) when `path` is not a
    readable trace; tolerable damage (missing ranks, corrupt parts) becomes `Run.warnings`.
    `progress(stage, fraction, rows)` is told when loading starts (with the row count).
    `memory_limit` (DuckDB syntax, e.g. "4GB"; default 40% of memory, at most 4 GB, or
    $COMMTRACE_MEMORY_LIMIT) caps the query engine's memory; large runs are held in a
    database file under `temp_dir` (default $COMMTRACE_TMPDIR or the system's temporary
    directory) and spill there, removed again by :meth:`Run.close`.
    `in_memory=True` holds a large run in memory instead of a database file where it fits in
    half the memory limit (faster: the report with root cause and what-if asks for it).
    `engine="spark"` runs the cross-rank stages on Spark (`spark_master`, default
    $COMMTRACE_SPARK_MASTER or ``local[*]``; `spark_parts_url`, the run directory as the
    executors read it): see :mod:`commtrace.analysis.spark`."""
    from ..format import runs as RUNS

    path = RUNS.resolve(path, run)
    if engine == "spark":
        from . import spark as SP
        return SP.load(path, master=spark_master, threads=threads, memory_limit=memory_limit,
                       progress=progress, temp_dir=temp_dir)
    if engine != "duckdb":
        raise CommtraceError(f"unknown analysis engine {engine!r} (duckdb or spark)")
    rf = R.scan_run(path)
    if progress:
        progress("loading", 0.0, rf.num_rows)
    con, tmp = L.connect(rf.num_rows, threads=threads, memory_limit=memory_limit, temp_dir=temp_dir,
                         in_memory=in_memory)
    if in_memory and rf.num_rows > L.DISK_ROWS and not L.in_memory_fits(rf.num_rows, memory_limit):
        rf.warnings.append(
            f"run held in a database file, not in memory: {rf.num_rows:,} rows need about "
            f"{rf.num_rows * (L.MEMORY_ROW_BYTES + L.DERIVED_ROW_BYTES) / 1e9:.2f} GB, more than half the memory "
            f"limit (--memory-limit) or over {L.SPLIT_MAX_ROWS:,} rows")
    try:
        rf.pgs = L.load_table(con, rf, path, progress)
    except BaseException:
        L.close(con, tmp)
        raise
    return Run(con, rf, _tmp=tmp)


class Run:
    """A loaded run. See docs/dev/interfaces.md ("Analysis API") for the member contract."""

    def __init__(self, con, rf: R.RunFiles, *, _table: str | None = None, _parent: "Run | None" = None,
                 _tmp: str | None = None, _steps_done: bool = False):
        self._con = con
        self._files = rf
        self._lock = threading.RLock() if _parent is None else _parent._lock
        self._cache: dict = {}
        self._tmp = _tmp
        #: group names in load order: a collective key's group is its index here
        self._pgs = list(getattr(rf, "pgs", None) or [])
        self.path = rf.path
        self.manifest = rf.manifest
        self.warnings: list[str] = rf.warnings if _parent is None else list(_parent.warnings)
        offs = L.offsets(rf.meta)
        self._offsets = {r: o for r, o, _ in offs}
        self._rtts = {r: t for r, _, t in offs}
        if _parent is None:
            self._t = "t"
            with self._lock:
                if not _steps_done:  # another engine (analysis/spark.py) built `t` with its steps
                    L.assign_steps(con, self.warnings)
                    L.publish(con)
                self._info = L.run_info(con, rf, "t")
            self._closer = L.closer(self, con, _tmp)
        else:
            self._t = _table
            self._info = _parent._info
        self.meta: dict[int, dict] = rf.meta
        self.world_size: int = self._info["world_size"]
        self.ranks: list[int] = self._info["ranks"]
        self.missing_ranks: list[int] = [r for r in range(self.world_size) if r not in set(self.ranks)]
        self.t_min_ns: int | None = self._info["t_min_ns"]
        self.t_max_ns: int | None = self._info["t_max_ns"]
        self._rows = rf.num_rows

    # ------------------------------------------------------------------ querying
    def sql(self, q: str, params=None) -> Q.Rows:
        """Run SQL on the run's connection and fetch every row (`.fetchall()`, `.fetchone()`).
        Name the run's tables with :meth:`table`."""
        with self._lock:
            return Q.rows(self._con, q, params)

    def arrow(self, q: str, params=None) -> pa.Table:
        """Run SQL on the run's connection, return a pyarrow.Table."""
        with self._lock:
            return Q.arrow(self._con, q, params)

    @property
    def lock(self) -> threading.RLock:
        """The connection's lock (reentrant; every query here takes it): hold it to run several
        queries with no other thread's query between them."""
        return self._lock

    def arrow_batches(self, q: str, consume, batch_rows: int = 122_880, con=None):
        """Run SQL and return `consume(reader)`, `reader` its result as a
        pyarrow.RecordBatchReader of `batch_rows`-row batches, read under the run's lock (the
        connection runs nothing else until the result is read); on `con` (a :meth:`cursor`)
        without the lock when given. A consumer that drops each batch before reading the next
        holds one batch's memory, not the whole result's."""
        if con is not None:
            return consume(con.sql(q).to_arrow_reader(batch_rows))
        with self._lock:
            return consume(self._con.sql(q).to_arrow_reader(batch_rows))

    def cursor(self):
        """A second connection to the run's database (DuckDB's cursor), opened under the run's
        lock: queries on it need no lock and run beside the run's own (DuckDB runs several
        connections' queries at once; start_background's overlap does the same). Read only
        tables that are built already (:meth:`table`); close it after use."""
        with self._lock:
            return self._con.cursor()

    def numpy(self, q: str, params=None) -> dict[str, np.ndarray]:
        """Run SQL on the run's connection, return numpy columns."""
        with self._lock:
            return Q.numpy(self._con, q, params)

    def register(self, name: str, table) -> None:
        """Make an Arrow table queryable as `name` on the run's connection."""
        with self._lock:
            self._con.register(name, table)

    def unregister(self, name: str) -> None:
        with self._lock:
            self._con.unregister(name)

    def table(self, name: str) -> str:
        """The DuckDB name of one of the run's tables, built on first use:

        * ``"ops"``: every row, aligned (schema columns but the lazy ones, plus `ckey`, the
          collective key, and `rid`, the row id);
        * ``"collectives"``: one row per (pg, seq), :meth:`collectives` plus `ckey` and the
          pattern's root times;
        * ``"waits"``: one row per (collective, member rank) of complete collectives (`ckey`,
          `rank`, `step`, `wait_ns`, `completion_wait_ns`, `lead_ns`, `is_last`, ...);
        * ``"p2p"``: :meth:`p2p`;
        * ``"wait_rank_step"``: wait totals per (rank, step);
        * ``"lazy"``: `rid` + the columns left in the Parquet parts."""
        build = {"ops": lambda: self._t, "collectives": self._ensure_coll, "waits": self._ensure_waits,
                 "p2p": self._ensure_p2p, "wait_rank_step": self._ensure_wait_rank_step,
                 "lazy": self._ensure_lazy}
        if name not in build:
            raise KeyError(f"no run table {name!r} (one of {', '.join(build)})")
        return build[name]()

    # the pre-split private names, kept for code written against them
    def _sql(self, q: str, params=None) -> Q.Rows:
        return self.sql(q, params)

    def _arrow(self, q: str, params=None) -> pa.Table:
        return self.arrow(q, params)

    def _np(self, q: str, params=None) -> dict[str, np.ndarray]:
        return self.numpy(q, params)

    def _many(self, q: str, rows) -> None:
        with self._lock:
            self._con.executemany(q, rows)

    def _pg_of_ckey(self, expr: str) -> str:
        """SQL: the group name of a collective key (its index in the load-time group list)."""
        return Q.pg_of_ckey(expr, self._pgs)

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
        with self._lock:
            L.create_op_table(self._con, name, f"SELECT * FROM {self._t} WHERE " + " AND ".join(conds))
        sub = Run(self._con, self._files, _table=name, _parent=self)
        sub._base = self  # the connection lives as long as its owner
        rng = sub.sql(f"SELECT min(t_enqueue_ns), max(greatest(t_enqueue_ns, t_return_ns, t_end_ns, t_wait_end_ns)), "
                      f"count(*) FROM {name}").fetchone()
        sub.t_min_ns, sub.t_max_ns, sub._rows = rng[0], rng[1], int(rng[2] or 0)
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
        rows = self.sql(f"""
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
    def files(self) -> R.RunFiles:
        """What the run directory holds (parts, metadata, snapshots, stacks), before any row."""
        return self._files

    @property
    def snapshot_ns(self) -> dict[int, int]:
        """rank -> time of its last ``_inflight.json`` snapshot (aligned): when it was last
        known alive."""
        return dict(self._info.get("snapshot_ns", {}))

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
        return self.arrow(f"""
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

    def lazy_columns(self, where: str, columns, con=None) -> pa.Table:
        """`rid` + `columns` of the part rows matching `where` (SQL on unaligned columns), read
        straight from the Parquet parts (projection and filter pushdown); on `con` (a
        :meth:`cursor`, no lock) when given."""
        q = R.select_parts_sql(self._files, list(columns) + [c for c in ("kind", "rank") if c not in columns])
        if q is None:
            return Q.np_table({"rid": np.zeros(0, np.int64)})
        q = f"SELECT rid, {', '.join(columns)} FROM ({q}) WHERE {where}"
        return Q.arrow(con, q) if con is not None else self.arrow(q)

    def _ops_sql(self, ranks=None, t0=None, t1=None, kinds=("op",)) -> str:
        conds = []
        if kinds:
            conds.append("kind IN (" + ", ".join(Q.quote(k) for k in kinds) + ")")
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
        members = self.pg_members
        w = f"{self._t}_waits"
        with self._lock:
            M.build_collectives(self._con, self._t, name, self._pgs, members)
            M.build_waits(self._con, self._t, name, w)
            M.finish_collectives(self._con, name, w)
        self._cache[w] = True
        self._cache[name] = True
        return name

    def _ensure_waits(self) -> str:
        self._ensure_coll()
        return f"{self._t}_waits"

    def _ensure_p2p(self) -> str:
        name = f"{self._t}_p2p"
        if name not in self._cache:
            with self._lock:
                M.build_p2p(self._con, self._t, name)
            self._cache[name] = True
        return name

    def _ensure_wait_rank_step(self) -> str:
        name = f"{self._t}_wrs"
        if name not in self._cache:
            w, p = self._ensure_waits(), self._ensure_p2p()
            with self._lock:
                M.build_wait_rank_step(self._con, w, p, name)
            self._cache[name] = True
        return name

    def collectives(self) -> pa.Table:
        """One row per matched collective (pg, seq), metrics.md "Matching one collective across
        ranks": `bytes` (S), `t_comm_ns` (min_r leave_r - max_j enter_j, null unless every member
        completed), `algbw_gbps` = S / t_comm, `busbw_gbps` = algbw x F (nccl-tests factors),
        `arrival_skew_ns`, `completion_skew_ns`, `last_rank` (arrived last), `last_late_ns`
        (its lead over the second-latest arrival), `first_enter_ns`, `last_enter_ns`, `step`."""
        c = self._ensure_coll()
        return self.arrow(f"SELECT * EXCLUDE (ckey) FROM {c} ORDER BY pg, seq")

    def waits(self) -> pa.Table:
        """Wait state per (pg, seq, rank), Scalasca's definitions of metrics.md "Wait states"
        (clamped >= 0): `wait_ns` by `pattern` (nxn: min(max_j enter_j, leave_r) - enter_r;
        late_broadcast for non-roots; early_reduce for the root) and `completion_wait_ns`
        (N x N completion). Only collectives that every member completed."""
        w = self._ensure_waits()
        c = self._ensure_coll()
        return self.arrow(f"""
            SELECT k.pg, k.seq, w.rank, k.op, k.pattern, w.step, w.t_enqueue_ns, w.t_end_ns, w.wait_ns,
                   w.completion_wait_ns, w.lead_ns, w.is_last
            FROM {w} w JOIN {c} k ON k.ckey = w.ckey ORDER BY k.pg, k.seq, w.rank""")

    def p2p(self) -> pa.Table:
        """Matched point-to-point pairs by (pg, src, dst, per-pair seq), metrics.md: late sender
        (recv waits for send) = enter_send - enter_recv capped at leave_recv; late receiver
        (send waits for recv) = enter_recv - enter_send capped at leave_send; both >= 0. For a
        non-blocking isend/irecv the host waits in wait(), so its wait starts at `t_wait_ns`
        instead of the enqueue (as Scalasca attributes MPI_Wait); never waited: no wait state."""
        p = self._ensure_p2p()
        return self.arrow(f"SELECT * FROM {p} ORDER BY pg, src, dst, pair_seq")

    # ------------------------------------------------------------------ per rank / step
    def _overlap(self) -> dict:
        """Per-rank overlap totals (metrics.md "Overlap", HTA's definition at ns resolution),
        computed by chunks of ranks (commtrace.analysis.overlap); the per-(rank, step) figures
        go to the DuckDB table `<t>_ovs`."""
        if "overlap" in self._cache:
            return self._cache["overlap"]
        fut = self._cache.get("overlap_future")
        if fut is not None:
            out = fut.result()
        else:
            with self._lock:
                out = self._compute_overlap(self._con)
        self._cache["overlap"] = out
        return out

    def _compute_overlap(self, con) -> dict:
        out = OV.compute(con, self._t, self.ranks, self._rows, self.t_min_ns, self.t_max_ns, f"{self._t}_ovs")
        self._cache["step_spans"] = OV.step_spans_sql(f"{self._t}_ovs")
        return out

    def step_spans(self) -> pa.Table:
        """(rank, step, t0, t_ns): the step time on that rank, from the step's first event to
        the next step's first event (the last step: to the rank's last event); steps with an
        enqueue time only. From the overlap stage's per-(rank, step) table when it has the
        timestamps (the DuckDB engine), else one pass over the op table."""
        self._overlap()
        q = self._cache.get("step_spans")
        if q is None:
            q = f"""
                SELECT rank, step, t0, greatest(coalesce(lead(t0) OVER (PARTITION BY rank ORDER BY step), t_last) - t0, 0) AS t_ns
                FROM (SELECT rank, step, min(t_enqueue_ns) AS t0,
                             max(greatest(t_enqueue_ns, t_return_ns, t_end_ns, t_wait_end_ns)) AS t_last
                      FROM {self._t} WHERE step IS NOT NULL AND t_enqueue_ns IS NOT NULL GROUP BY rank, step)"""
        return self.arrow(q)

    def start_background(self) -> None:
        """Start the overlap computation on a second DuckDB cursor in a thread, so that it runs
        while the SQL side matches collectives (numpy and DuckDB both release the GIL)."""
        if "overlap" in self._cache or "overlap_future" in self._cache:
            return
        with self._lock:
            cur = self._con.cursor()

        def work():
            try:
                return self._compute_overlap(cur)
            finally:
                cur.close()
        self._cache["overlap_future"] = in_thread(work, name="commtrace-overlap")

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
        wrs = self._ensure_wait_rank_step()
        self.stragglers()
        nr = (max(self.ranks) + 1) if self.ranks else 0
        with self._lock:
            t = SU.per_rank(ov, self._con, wrs, self._cache["stragglers_np"], nr)
        self._cache["per_rank"] = t
        return t

    def _per_step_table(self) -> str:
        """DuckDB table of per_step() (built on first use)."""
        name = f"{self._t}_per_step"
        if name not in self._cache:
            self._overlap()
            wrs = self._ensure_wait_rank_step()
            self.sql(f"CREATE OR REPLACE TABLE {name} AS {OV.per_step_sql(self._t + '_ovs', wrs)}")
            self._cache[name] = True
        return name

    def per_step(self) -> pa.Table:
        """Per (rank, step): the per_rank figures (seconds), for the trend over the run. Union
        segments are attributed to the step in which they start."""
        if "per_step" in self._cache:
            return self._cache["per_step"]
        t = self.arrow(f"SELECT * FROM {self._per_step_table()} ORDER BY step, rank")
        self._cache["per_step"] = t
        return t

    def steps_summary(self) -> pa.Table:
        """Per step, over ranks: `ranks`, `ops`, mean and max `exposed_s` and `wait_s`, mean
        `inflight_s` and `overlap_ratio` (the report's `per_step`)."""
        return self.arrow(f"""
            SELECT step, count(*) AS ranks, sum(ops)::BIGINT AS ops, avg(exposed_s) AS exposed_s_mean,
                   max(exposed_s) AS exposed_s_max, avg(wait_s) AS wait_s_mean, max(wait_s) AS wait_s_max,
                   avg(inflight_s) AS inflight_s_mean, avg(overlap_ratio) AS overlap_ratio_mean
            FROM {self._per_step_table()} GROUP BY step ORDER BY step""")

    def step_counters(self) -> pa.Table:
        """Per (step, op) over ranks, from the counter rows that bounded capture writes for the
        steps outside its window (capture/window.py, docs/large-jobs.md): `ranks`, `ops`,
        `bytes`, `blocked_s` (host-blocked time of those calls), `inflight_s`. Empty for a run
        recorded in full."""
        def num(k):
            return f"sum(CAST(regexp_extract(detail, '\"{k}\":(-?[0-9]+)', 1) AS BIGINT))"
        return self.arrow(f"""
            SELECT step, op, count(DISTINCT rank) AS ranks, {num('ops')}::BIGINT AS ops,
                   sum(bytes)::BIGINT AS bytes, {num('blocked_ns')} / 1e9 AS blocked_s,
                   {num('inflight_ns')} / 1e9 AS inflight_s
            FROM {self._t} WHERE kind = 'counter' GROUP BY step, op ORDER BY step, op""")

    def unrecorded(self) -> list[dict]:
        """Collectives a group issued that commtrace did not record (rows of kind ``gap``,
        schema v3; docs/trace-format.md "Unrecorded collectives"), one entry per run of them,
        merged over the ranks that saw the same run: `pg`, `count` (collectives), torch's
        numbers `torch_seq_first` .. `torch_seq_last`, `ranks`, `at` ("op": found at the next
        recorded op; "destroy" / "close": after the group's last one; "call": around a call of
        torch's known to issue them, named by `origin`, e.g. "ddp_rebuild_buckets"; else None),
        `step`, and the recorded ops around it on the first of those ranks, `after` / `before` =
        {`seq`, `op`, `site`} (None at the start / end). Empty for a run recorded in full or a
        trace before v3."""
        t = self._t
        if not self.sql(f"SELECT count(*) FROM {t} WHERE kind = 'gap'").fetchone()[0]:
            return []  # (the query below joins every op row even when there is no gap row)
        num = "CAST(regexp_extract(g.detail, '\"{}\": ?(-?[0-9]+)', 1) AS BIGINT)"
        # rows found at the next recorded op name it (ref_op_id); rows of a known call
        # (at = "call", `origin`) lie between the ops around their start time
        rows = self.sql(f"""
            WITH g AS (
                SELECT rank, pg, count AS n, step, ref_op_id, op_id_max, t_enqueue_ns AS t_at,
                       {num.format('torch_seq_first')} AS first, {num.format('torch_seq_last')} AS last,
                       regexp_extract(g.detail, '"at": ?"([a-z]+)"', 1) AS at,
                       nullif(regexp_extract(g.detail, '"origin": ?"([a-z_]+)"', 1), '') AS origin
                FROM (SELECT *, coalesce(ref_op_id, 9223372036854775807) AS op_id_max FROM {t}
                      WHERE kind = 'gap') g)
            SELECT g.pg, g.n, g.first, g.last, g.at, g.step, g.rank, g.origin,
                   (SELECT struct_pack(seq := o.seq, op := o.op, site := o.site)
                    FROM {t} o WHERE o.kind = 'op' AND o.rank = g.rank AND o.pg = g.pg
                      AND CASE WHEN g.at = 'call' THEN o.t_enqueue_ns < g.t_at ELSE o.op_id < g.op_id_max END
                    ORDER BY o.op_id DESC LIMIT 1) AS prev,
                   CASE WHEN g.at = 'call' THEN
                       (SELECT struct_pack(seq := o.seq, op := o.op, site := o.site)
                        FROM {t} o WHERE o.kind = 'op' AND o.rank = g.rank AND o.pg = g.pg
                          AND o.t_enqueue_ns > g.t_at ORDER BY o.op_id LIMIT 1)
                   ELSE (SELECT struct_pack(seq := o.seq, op := o.op, site := o.site)
                         FROM {t} o WHERE o.kind = 'op' AND o.rank = g.rank AND o.op_id = g.ref_op_id) END AS nxt
            FROM g ORDER BY g.pg, g.first, g.rank""").fetchall()
        out: dict = {}
        for pg, n, first, last, at, step, rank, origin, prev, nxt in rows:
            k = (pg, first, last, at, origin)
            e = out.get(k)
            if e is None:
                e = out[k] = {
                    "pg": pg, "count": int(n), "torch_seq_first": first, "torch_seq_last": last,
                    "ranks": [], "at": at, "origin": origin, "step": step,
                    "after": ({"seq": prev["seq"], "op": prev["op"], "site": prev["site"]}
                              if prev else None),
                    "before": ({"seq": nxt["seq"], "op": nxt["op"], "site": nxt["site"]}
                               if nxt and nxt["op"] is not None else None)}
            e["ranks"].append(int(rank))
        return list(out.values())

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
        c, w = self._ensure_coll(), self._ensure_waits()
        with self._lock:
            d = SU.stragglers(self._con, c, w)
        self._cache["stragglers_np"] = d
        t = Q.np_table(d)
        self._cache["stragglers"] = t
        return t

    # ------------------------------------------------------------------ summaries
    def collectives_summary(self) -> pa.Table:
        """Per (pg, op, size bucket): `count`, mean `t_comm_s`, mean `busbw_gbps` (nccl-tests,
        metrics.md), with min/max/std. Size buckets are powers of two of S (`size_bucket` is the
        bucket's lower bound in bytes, `size_label` its readable form)."""
        return self.arrow(SU.collectives_summary_sql(self._ensure_coll()))

    def clock(self) -> dict:
        """Clock alignment facts (metrics.md "Clock alignment"): offsets applied and the count of
        clock violations after alignment: matched complete collectives where a completion
        precedes an entry it depends on (N x N: min leave < max enter; late broadcast: a
        non-root leaves before the root enters; early reduce: the root leaves before the last
        non-root enters), beyond half the recorded round trip of the ranks' offset estimates."""
        if "clock" not in self._cache:
            c = self._ensure_coll()
            with self._lock:
                self._cache["clock"] = SU.clock(self._con, c, self._offsets, self._rtts, self.meta)
        return self._cache["clock"]

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
            return Q.np_table({"rank": np.zeros(0, np.int32), "bin": np.zeros(0, np.int64),
                               "t0_ns": np.zeros(0, np.int64), "t1_ns": np.zeros(0, np.int64),
                               **{k: np.zeros(0, np.int64) for k in ("blocked_ns", "inflight_ns", "wait_ns", "sync_ns", "ops")}})
        w = self._ensure_waits()
        with self._lock:
            return SU.timeline_bins(self._con, self._t, w, self.ranks, t0, t1, nbins, ranks)

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
        if "last_completed" not in self._cache:
            with self._lock:
                self._cache["last_completed"] = SU.last_completed(self._con, self._t, self.ranks)
        return dict(self._cache["last_completed"])

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
               busbw_ref: float | None = None, what_if: bool | None = None) -> dict:
        """The `commtrace report --format json` dict (public contract, docs/report.md).
        `busbw_ref` (GB/s) adds a what-if per collective op kind at that bus bandwidth;
        `what_if=False` leaves out root cause, critical path and what-if (null sections); None
        (default): on up to `rootcause.AUTO_MAX_OPS` ops."""
        from .report import build_report
        return build_report(self, top=top, rank=rank, steps=steps, progress=progress, busbw_ref=busbw_ref,
                            what_if=what_if)

    def close(self) -> None:
        """Release the DuckDB connection and remove the run's temporary files."""
        fut = self._cache.get("overlap_future")
        if fut is not None:
            try:
                fut.result()
            except Exception:  # noqa: BLE001
                pass
        closer = getattr(self, "_closer", None)
        if closer is not None:
            closer()
        else:
            L.close(self._con, None)

    def __repr__(self) -> str:
        return f"<commtrace.Run {self.path!r} world_size={self.world_size} ranks={len(self.ranks)}>"


__all__ = ["load", "Run", "CommtraceError"]
