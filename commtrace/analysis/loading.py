"""Loading a run into DuckDB: the one table ``t`` every analysis query reads.

``t`` holds the rows of every rank with clocks aligned to rank 0 (metrics.md "Clock
alignment"), completions filled where the host saw them, a ``step`` for each row and a
collective key ``ckey`` (group index << 40 | seq). It is written in chunks of whole ranks, so
that it is clustered by rank and the per-rank stages read a range of ranks without scanning the
rest.

Memory is bounded by design: above :data:`DISK_ROWS` rows the DuckDB database is a file in a
private temporary directory (compressed column storage, about 35 bytes a row instead of 300
in memory), DuckDB's ``memory_limit`` caps its buffers and ``temp_directory`` takes what
spills; the directory is removed when the run is closed.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import weakref

import numpy as np

from ..errors import TraceFormatError
from ..format import reader as R
from ..format import schema as S
from . import sql as Q

#: Columns the analysis never reads: left in the Parquet parts and joined back by row id
#: (`rid`) when ops() returns full rows, so that loading materialises less.
LAZY_COLUMNS = ("api", "backend", "thread", "t_start_ns", "completion", "torch_seq")
#: Read at load for derived values (completion fill, in-flight count), then dropped.
LOAD_ONLY = ("device", "inflight_ids")
LOAD_COLUMNS = [c for c in S.COLUMNS if c not in LAZY_COLUMNS]
#: Runs with more rows than this are loaded into an on-disk database (compressed, spillable).
DISK_ROWS = 200_000
#: Up to this many rows, the tables derived from an on-disk ``t`` stay in memory (spillable),
#: if they fit in half the memory limit at DERIVED_ROW_BYTES per row of ``t``.
SPLIT_MAX_ROWS = 20_000_000
#: Bytes of the in-memory derived tables per row of ``t`` (waits, collectives, p2p pairs,
#: per-step figures; 512 x 20,000 synthetic: 0.66 GB for 11.4 M rows).
DERIVED_ROW_BYTES = 64
#: Bytes of ``t`` in DuckDB's memory per row (uncompressed; 64 x 20,000 synthetic: the report's
#: peak 468 -> 734 MB for 1.28 M rows held in memory instead of the file), for in_memory_fits.
MEMORY_ROW_BYTES = 300
#: Name of the attached database file that holds ``t`` of a large run.
STORE = "store"
#: Rows per load chunk (whole ranks): bounds the memory of one INSERT.
LOAD_CHUNK_ROWS = 1_000_000
#: Chunks inserted at once into the database file of a split connection of at most
#: PARALLEL_LOAD_ROWS rows (reader.py load_into_duckdb). Measured on two cores: 64 x 20,000
#: (1.4 M rows), one writer 1.4-1.8 s wall for 1.8 s CPU, two writers 1.1-1.7 s when a core is
#: free; 512 x 20,000 (11.4 M rows), one writer already keeps both cores busy (7.2-9.2 s wall for
#: 13.5-14.2 s CPU) and two gave 8.6-10.3 s. Larger runs load one chunk at a time.
LOAD_WORKERS = 2
PARALLEL_LOAD_ROWS = 4_000_000
#: Smallest load chunk when the chunks are cut smaller to give every writer work.
MIN_CHUNK_ROWS = 200_000
#: Default DuckDB memory limit: a fraction of the machine's memory, at most 4 GB.
DEFAULT_MEMORY_FRACTION = 0.4
DEFAULT_MEMORY_CAP = 4 << 30


def default_memory_limit() -> str:
    """DuckDB's memory limit when none is given: 40% of physical memory, at most 4 GB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    return f"{max(256 << 20, min(int(total * DEFAULT_MEMORY_FRACTION), DEFAULT_MEMORY_CAP)) >> 20}MB"


def size_bytes(size: str) -> int | None:
    """Bytes of a DuckDB size such as "4GB", "512 MiB" or "3.5GB" (None when unreadable)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?)b?\s*", str(size).lower())
    if not m:
        return None
    num, unit, binary = m.groups()
    power = "_kmgt".index(unit) if unit else 0
    return int(float(num) * (1024 if binary else 1000) ** power)


def memory_limit_of(memory_limit: str | None = None) -> str:
    """The memory limit a connection gets: `memory_limit`, else $COMMTRACE_MEMORY_LIMIT, else
    :func:`default_memory_limit`."""
    return memory_limit or os.environ.get("COMMTRACE_MEMORY_LIMIT") or default_memory_limit()


def in_memory_fits(rows: int, memory_limit: str | None = None) -> bool:
    """Whether a run of `rows` rows may be held in memory when its caller prefers that
    (:func:`connect`'s `in_memory`): at most SPLIT_MAX_ROWS rows whose table and derived tables
    (MEMORY_ROW_BYTES + DERIVED_ROW_BYTES a row) fit in half the memory limit."""
    limit = size_bytes(memory_limit_of(memory_limit))
    return limit is not None and rows <= SPLIT_MAX_ROWS and rows * (MEMORY_ROW_BYTES + DERIVED_ROW_BYTES) <= limit // 2


def connect(rows: int, *, threads: int | None = None, memory_limit: str | None = None,
            temp_dir: str | None = None, in_memory: bool = False):
    """A DuckDB connection for a run of `rows` rows: in memory when small, else a database file
    in a new temporary directory under `temp_dir` (default: $COMMTRACE_TMPDIR or the system's).
    With `in_memory`, a larger run is held in memory too where it fits (:func:`in_memory_fits`),
    its spills in such a directory: the report with root cause and what-if asks for it (their
    model holds several times the table's memory anyway; docs/performance.md, session 28).
    Returns (connection, directory or None); the directory is removed by :func:`close`."""
    import duckdb

    threads = threads or max(1, min(os.cpu_count() or 1, 8))
    mem = memory_limit_of(memory_limit)
    tmp = None
    if rows > DISK_ROWS:
        tmp = tempfile.mkdtemp(prefix="commtrace-", dir=temp_dir or os.environ.get("COMMTRACE_TMPDIR") or None)
        db = os.path.join(tmp, "run.duckdb")
        limit = size_bytes(mem)
        if in_memory and in_memory_fits(rows, mem):
            con = duckdb.connect(config={"threads": threads})
        elif rows > SPLIT_MAX_ROWS or limit is None or rows * DERIVED_ROW_BYTES > limit // 2:
            con = duckdb.connect(db, config={"threads": threads})
        else:
            con = duckdb.connect(config={"threads": threads})
            con.execute(f"ATTACH {Q.quote(db)} AS {STORE}")
        con.execute(f"SET temp_directory = {Q.quote(os.path.join(tmp, 'spill'))}")
        # The database is thrown away: no checkpoint on close.
        con.execute("PRAGMA disable_checkpoint_on_shutdown")
    else:
        con = duckdb.connect(config={"threads": threads})
    con.execute("SET preserve_insertion_order = false")
    con.execute(f"SET memory_limit = {Q.quote(mem)}")
    return con, tmp


def close(con, tmp: str | None) -> None:
    """Close the connection and remove its temporary directory."""
    try:
        con.close()
    except Exception:  # noqa: BLE001
        pass
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


def closer(owner, con, tmp: str | None):
    """A callable that closes `con` and removes `tmp` once: called by Run.close(), or when
    `owner` is garbage-collected, or at exit, whichever comes first."""
    return weakref.finalize(owner, close, con, tmp)


def offsets(meta: dict) -> list[tuple[int, int, int]]:
    """(rank, clock offset ns, offset round trip ns) from the parts' metadata."""
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


def align_sql(src: str, pgs=(), columns=None, rid: bool = True) -> str:
    """Apply each rank's clock offset (metrics.md "Clock alignment": offset = the rank's clock
    minus rank 0's, so aligned = t - offset), and fill a completion the writer did not record
    but the host saw: a waited op (wait() returned) or a blocking CPU op that returned without
    error has completed by then. `src` yields `columns` (default LOAD_COLUMNS) and, with `rid`,
    the row id; the output drops LOAD_ONLY and adds `ckey`. Plain SQL that sqlglot carries to
    Spark (the other engine, commtrace.analysis.spark)."""
    end_expr = ("coalesce(r.t_end_ns, CASE WHEN r.kind = 'op' AND r.error IS NULL THEN coalesce(r.t_wait_end_ns, "
                "CASE WHEN NOT coalesce(r.async_op, false) AND coalesce(r.device, '') NOT LIKE 'cuda%' "
                "THEN r.t_return_ns END) END)")
    sel = []
    for c in (columns or LOAD_COLUMNS):
        if c in LOAD_ONLY:
            continue
        if c in S.TIME_COLUMNS and c not in LAZY_COLUMNS:
            sel.append(f"{end_expr if c == 't_end_ns' else 'r.' + c} - coalesce(o.off, 0) AS {c}")
        elif c == "inflight":
            sel.append("CAST(coalesce(r.inflight, array_length(r.inflight_ids)) AS INTEGER) AS inflight")
        else:
            sel.append(f"r.{c}")
    if rid:
        sel.append("r.rid")
    # ckey: one BIGINT per collective (pg index * 2^40 + seq), so that matching groups and joins
    # on an integer instead of (VARCHAR, BIGINT); NULL on every other row.
    sel.append(f"CASE WHEN r.kind = 'op' AND r.op IN {Q.COLLECTIVE_SQL} AND r.seq IS NOT NULL "
               f"AND r.pg IS NOT NULL THEN CAST({Q.pg_index_sql('r.pg', pgs)} AS BIGINT) * {Q.CKEY_MUL} "
               f"+ r.seq END AS ckey")
    return f"SELECT {', '.join(sel)} FROM ({src}) r LEFT JOIN offsets o ON o.rank = r.rank"


def create_offsets(con, rf: R.RunFiles) -> None:
    """DuckDB table ``offsets`` (rank, off, rtt): each rank's recorded clock offset."""
    offs = offsets(rf.meta)
    con.execute("CREATE OR REPLACE TABLE offsets (rank INTEGER, off BIGINT, rtt BIGINT)")
    if offs:
        # one statement (integers only): executemany costs about 2.7 ms a row (0.17 s at 64 ranks)
        con.execute("INSERT INTO offsets VALUES " + ", ".join(f"({int(r)}, {int(o)}, {int(t)})" for r, o, t in offs))


def _split(con) -> bool:
    """Whether `con` holds ``t`` in the attached :data:`STORE` (see the module doc)."""
    return bool(Q.rows(con, f"SELECT count(*) FROM duckdb_databases() WHERE database_name = '{STORE}'").fetchone()[0])


def publish(con) -> None:
    """After :func:`assign_steps` on a split connection: back to the in-memory database, where
    the derived tables go, with views ``t`` and ``offsets`` of the file's tables."""
    if _split(con):
        con.execute("USE memory")
        for name in ("t", "offsets"):
            con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM {STORE}.main.{name}")


def create_op_table(con, name: str, select: str) -> None:
    """Table `name` of op rows (`select`), next to ``t``: in the database file of a split
    connection (a view of it in memory), so that a step subset of a large run does not take
    the memory the file saves; else in the current database."""
    if _split(con):
        con.execute(f"CREATE OR REPLACE TABLE {STORE}.main.{name} AS {select}")
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM {STORE}.main.{name}")
    else:
        con.execute(f"CREATE OR REPLACE TABLE {name} AS {select}")


def load_table(con, rf: R.RunFiles, path: str, progress=None) -> list:
    """Create ``offsets`` and the aligned table ``t0`` (see the module doc); returns the group
    names in load order (a collective key's group is its index there)."""
    import duckdb

    split = _split(con)
    if split:
        con.execute(f"USE {STORE}")
    create_offsets(con, rf)
    workers, chunk = 1, LOAD_CHUNK_ROWS
    if split and rf.num_rows <= PARALLEL_LOAD_ROWS:
        # No more writers than the connection's threads; at least two chunks per writer, so
        # that they finish together.
        workers = max(1, min(LOAD_WORKERS, int(Q.rows(con, "SELECT current_setting('threads')").fetchone()[0])))
        chunk = min(LOAD_CHUNK_ROWS, max(MIN_CHUNK_ROWS, -(-rf.num_rows // (2 * workers))))
    try:
        pgs = R.distinct_values(con, rf, "pg")
        R.load_into_duckdb(con, rf, "t0", wrap=lambda q: align_sql(q, pgs), columns=LOAD_COLUMNS,
                           chunk_rows=chunk, workers=workers,
                           progress=(lambda f: progress("loading", 0.9 * f, rf.num_rows)) if progress else None)
    except duckdb.Error as e:
        raise TraceFormatError(f"{path}: cannot read trace: {str(e).splitlines()[0]}") from None
    return list(pgs)


def assign_steps(con, warnings: list[str]) -> None:
    """Turn ``t0`` into ``t``, giving each row a step (metrics: per-step figures): the recorded
    `step` column; else the latest step marker (kind="mark") at or before the row on its rank;
    else iteration boundaries detected from the repeating op pattern of the lowest rank."""
    n_step, n_mark = Q.rows(con, step_counts_sql("t0")).fetchone()
    if n_step or not n_mark:
        if n_step == 0:
            _detect_steps(con, warnings)
            return
        con.execute("ALTER TABLE t0 RENAME TO t")
        return
    con.execute(f"""
        CREATE OR REPLACE TABLE t AS
        SELECT x.* REPLACE (coalesce(x.step, m.mstep) AS step)
        FROM t0 x ASOF LEFT JOIN (
            SELECT rank AS mrank, t_enqueue_ns AS mt, step AS mstep FROM t0
            WHERE kind = '{S.KIND_MARK}' AND step IS NOT NULL) m
          ON x.rank = m.mrank AND x.t_enqueue_ns >= m.mt""")
    con.execute("DROP TABLE t0")


def step_counts_sql(t0: str) -> str:
    """SELECT of (ops with a recorded step, step markers) of op table `t0`: which way
    :func:`assign_steps` gives rows their step (shared with the Spark engine)."""
    return f"""
        SELECT count(step) FILTER (WHERE kind = '{S.KIND_OP}'), count(*) FILTER (WHERE kind = '{S.KIND_MARK}')
        FROM {t0}"""


def lowest_rank_sql(t0: str, rank: int) -> str:
    """SELECT of the collectives of `rank` in enqueue order, for :func:`detect_period`."""
    return f"""
        SELECT op, coalesce(bytes, 0) AS b, t_enqueue_ns FROM {t0}
        WHERE rank = {int(rank)} AND kind = 'op' AND op IN {Q.COLLECTIVE_SQL} AND t_enqueue_ns IS NOT NULL
        ORDER BY t_enqueue_ns"""


def detect_period(d: dict) -> int | None:
    """The period (in collectives) of the repeating (op, bytes) pattern of one rank's
    collectives `d` (columns of :func:`lowest_rank_sql`), or None when there is none."""
    n = len(d["t_enqueue_ns"])
    if n < 6:
        return None
    sig = np.unique(np.char.add(np.asarray(d["op"], dtype=str),
                                np.asarray(d["b"]).astype(str)), return_inverse=True)[1]
    ref = sig[n // 2]
    cands = np.flatnonzero(sig == ref)
    cands = np.unique(np.diff(cands))[:8]
    for p in sorted(int(c) for c in cands if 0 < c <= n // 3):
        if np.mean(sig[p:] == sig[:-p]) >= 0.9:
            return p
    return None


def bounds_sql(t0: str, lowest: int, period: int) -> str:
    """SELECT of the step boundaries (brank, bt, bstep): boundary k is the enqueue of collective
    k*period on the lowest rank, mapped to every rank through the matching (pg, seq) of that
    collective on each rank."""
    return f"""
        WITH ref AS (
            SELECT pg, seq, (row_number() OVER (ORDER BY t_enqueue_ns) - 1) AS k FROM {t0}
            WHERE rank = {int(lowest)} AND kind = 'op' AND op IN {Q.COLLECTIVE_SQL})
        SELECT x.rank AS brank, x.t_enqueue_ns AS bt, CAST(ref.k // {int(period)} AS BIGINT) AS bstep
        FROM ref JOIN {t0} x ON x.pg = ref.pg AND x.seq = ref.seq AND x.kind = 'op'
        WHERE ref.k % {int(period)} = 0"""


def detected_warning(period: int) -> str:
    return f"no step markers: steps detected from a repeating pattern of {period} collectives"


def _detect_steps(con, warnings: list[str]) -> None:
    lowest = Q.rows(con, "SELECT min(rank) FROM t0").fetchone()[0]
    period = detect_period(Q.numpy(con, lowest_rank_sql("t0", lowest))) if lowest is not None else None
    if period is None:
        con.execute("ALTER TABLE t0 RENAME TO t")
        return
    con.execute(f"CREATE OR REPLACE TEMP TABLE __bounds AS {bounds_sql('t0', lowest, period)}")
    con.execute("""
        CREATE OR REPLACE TABLE t AS
        SELECT x.* REPLACE (coalesce(x.step, b.bstep, 0) AS step)
        FROM t0 x ASOF LEFT JOIN __bounds b ON x.rank = b.brank AND x.t_enqueue_ns >= b.bt""")
    con.execute("DROP TABLE t0")
    con.execute("DROP TABLE __bounds")
    warnings.append(detected_warning(period))


def run_info(con, rf: R.RunFiles, t: str = "t") -> dict:
    """World size, traced ranks, time span and per-rank snapshot times of the loaded run."""
    meta = rf.meta
    info = Q.rows(con, f"""
        SELECT min(t_enqueue_ns), max(greatest(t_enqueue_ns, t_return_ns, t_end_ns, t_wait_ns, t_wait_end_ns)),
               list(DISTINCT rank ORDER BY rank), max(rank),
               max(pg_size) FILTER (WHERE pg IN ('0', 'default_pg', 'default'))
        FROM {t}""").fetchone()
    ranks = [int(r) for r in (info[2] or []) if r is not None]
    ws = None
    for src in (rf.manifest.get("world_size"),
                max((m.get("world_size") or 0 for m in meta.values()), default=0) or None,
                info[4]):
        if src:
            ws = int(src)
            break
    if ws is None:
        ws = (max(ranks) + 1) if ranks else 0
    ws = max(ws, (max(ranks) + 1) if ranks else 0)
    offs = {r: o for r, o, _ in offsets(meta)}
    snap = {}
    for r, s in rf.inflight.items():
        try:
            snap[r] = int(s.get("t_ns")) - offs.get(r, 0)
        except (TypeError, ValueError):
            pass
    return {"world_size": ws, "ranks": ranks, "t_min_ns": info[0], "t_max_ns": info[1], "snapshot_ns": snap}
