"""Read a commtrace run directory (the layout of :mod:`commtrace.format.schema`).

The reader finds the Parquet parts, checks each one's footer and schema version, collects the
per-rank metadata (clock offsets, group membership) and merges the ``_inflight.json`` snapshots.
It never turns the rows into Python objects: :func:`load_into_duckdb` creates one DuckDB table
over the whole run with every schema column present (absent columns read as NULL) and the clock
offsets not yet applied; the analysis side aligns and queries it.

Tolerated, each with a warning in :attr:`RunFiles.warnings`:

* missing ranks (a rank directory with no parts, or no directory at all);
* truncated or corrupt parts (skipped, the warning names the file);
* parts with only the REQUIRED columns and no key-value metadata (offset 0);
* parts of older schema versions. Newer versions raise :class:`SchemaVersionError`.

``_inflight.json`` (one per rank, rewritten atomically by the capture side at each flush)::

    {"rank": 3,                 # the rank (else taken from the directory name)
     "t_ns": 1712345678901234,  # host clock of the snapshot (the rank's own clock)
     "ops": [                   # async or blocking ops issued and not completed at t_ns
        {"op_id": 812, "kind": "op", "pg": "0", "pg_size": 4, "seq": 77, "op": "all_reduce",
         "api": "all_reduce", "async_op": false, "dtype": "float32", "count": 1048576,
         "bytes": 4194304, "t_enqueue_ns": ..., "t_return_ns": null, "site": "train.py:42", ...},
        ...]}

Keys of each op are schema column names (any subset; unknown keys are ignored). An op of the
snapshot that has a row in the Parquet parts (same rank and ``op_id``; or, without ``op_id``,
same rank, ``pg``, ``seq`` and ``op``) is dropped; the others are added as rows with
``t_end_ns`` NULL (pending). ``t_ns`` becomes the rank's ``snapshot_ns`` (the last time the rank
was known alive).
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import EmptyTraceError, SchemaVersionError, TraceFormatError
from . import schema as S

_RANK_DIR_RE = re.compile(r"^rank=(-?\d+)$")

#: DuckDB type of each schema column (for NULL fill-ins and casts).
_DUCK_TYPES = {
    pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.bool_(): "BOOLEAN",
    pa.list_(pa.int64()): "BIGINT[]",
}


def duck_type(name: str) -> str:
    """DuckDB type of schema column `name`."""
    return _DUCK_TYPES[S.SCHEMA.field(name).type]


@dataclass
class PartInfo:
    path: str
    rank: int | None          # from the directory name, None when flat
    columns: list[str]
    num_rows: int
    schema_version: int
    meta: dict


@dataclass
class RunFiles:
    """What a run directory holds, before any row is read."""

    path: str
    manifest: dict = field(default_factory=dict)
    parts: list[PartInfo] = field(default_factory=list)
    #: rank -> merged JSON metadata of its parts (later parts win)
    meta: dict[int, dict] = field(default_factory=dict)
    #: rank -> parsed _inflight.json
    inflight: dict[int, dict] = field(default_factory=dict)
    #: rank -> stack dump files (stacks-*.txt)
    stacks: dict[int, list[str]] = field(default_factory=dict)
    rank_dirs: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: rank -> modification time (s since the epoch) of its _inflight.json: how fresh it is
    inflight_mtime: dict[int, float] = field(default_factory=dict)
    #: time.time() when the snapshots were read: their age is taken at this moment, not when
    #: an analysis gets to it seconds later
    scan_time: float | None = None
    #: rank -> non-empty _crash-<pid>.txt files (faulthandler's dump at a fatal signal)
    crash: dict[int, list[str]] = field(default_factory=dict)
    #: the manifest `commtrace run` wrote in the directory above (v2: exit code, signal)
    session: dict = field(default_factory=dict)
    #: ranks written by two or more processes (a real conflict): no cross-rank finding uses them
    conflict_ranks: set = field(default_factory=set)
    #: pending ops of the snapshots as a table (set by load_into_duckdb)
    snapshot: object = None
    #: rank -> what --max-size ring retention deleted (its _retention.json "dropped")
    retention: dict = field(default_factory=dict)

    @property
    def columns(self) -> set[str]:
        cols: set[str] = set()
        for p in self.parts:
            cols.update(p.columns)
        return cols

    @property
    def num_rows(self) -> int:
        return sum(p.num_rows for p in self.parts)


def _rel(run_dir: str, path: str) -> str:
    try:
        return os.path.relpath(path, run_dir)
    except ValueError:  # pragma: no cover
        return path


def _part_info(run_dir: str, path: str, rank: int | None, warnings: list[str]) -> PartInfo | None:
    try:
        if os.path.getsize(path) == 0:
            raise TraceFormatError("empty file")
        md = pq.read_metadata(path)
        sch = pq.read_schema(path)
    except (OSError, pa.ArrowException, TraceFormatError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        warnings.append(f"skipped truncated or corrupt part {_rel(run_dir, path)}: {msg}")
        return None
    kv = sch.metadata or {}
    meta: dict = {}
    if S.META_JSON in kv:
        try:
            meta = json.loads(kv[S.META_JSON])
            if not isinstance(meta, dict):
                meta = {}
        except ValueError:
            warnings.append(f"unreadable metadata in {_rel(run_dir, path)}; using defaults")
    version = meta.get("schema_version")
    if S.META_SCHEMA_VERSION in kv:
        version = kv[S.META_SCHEMA_VERSION].decode(errors="replace")
    try:
        version = int(version) if version is not None else S.SCHEMA_VERSION
    except (TypeError, ValueError):
        raise TraceFormatError(f"{_rel(run_dir, path)}: unreadable schema version {version!r}")
    if version > S.SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{_rel(run_dir, path)} was written with trace schema v{version}, but this commtrace "
            f"reads up to v{S.SCHEMA_VERSION}; upgrade commtrace to read it")
    if "kind" not in sch.names and "op" not in sch.names:
        warnings.append(f"skipped {_rel(run_dir, path)}: not a commtrace trace (no kind/op column)")
        return None
    if rank is None and "rank" not in sch.names and meta.get("rank") is None:
        warnings.append(f"skipped {_rel(run_dir, path)}: no rank column and no rank directory")
        return None
    return PartInfo(path, rank, list(sch.names), md.num_rows, version, meta)


def scan_run(path: str) -> RunFiles:
    """Inspect a run directory (or one Parquet file): parts, metadata, snapshots, stacks.

    Raises :class:`TraceFormatError` when `path` does not exist or is not a trace, and
    :class:`EmptyTraceError` when it holds no readable part."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise TraceFormatError(f"{path}: no such file or directory")
    rf = RunFiles(path=os.path.abspath(path), scan_time=time.time())
    if os.path.isfile(path):
        if not path.endswith(".parquet"):
            raise TraceFormatError(f"{path}: not a commtrace run directory or Parquet trace")
        p = _part_info(os.path.dirname(path), path, None, rf.warnings)
        if p is None:
            raise TraceFormatError(f"{path}: not a readable commtrace trace ({rf.warnings[-1]})")
        rf.parts.append(p)
        _merge_meta(rf)
        return rf

    mpath = os.path.join(path, S.MANIFEST_NAME)
    if os.path.exists(mpath):
        try:
            with open(mpath) as f:
                rf.manifest = json.load(f)
            mv = int(rf.manifest.get("schema_version", S.SCHEMA_VERSION))
            if mv > S.SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{mpath} was written with trace schema v{mv}, but this commtrace reads up to "
                    f"v{S.SCHEMA_VERSION}; upgrade commtrace to read it")
        except (ValueError, TypeError) as e:
            rf.warnings.append(f"unreadable {S.MANIFEST_NAME}: {e}")
            rf.manifest = {}

    for entry in sorted(os.listdir(path)):
        m = _RANK_DIR_RE.match(entry)
        full = os.path.join(path, entry)
        if m and os.path.isdir(full):
            rank = int(m.group(1))
            rf.rank_dirs.append(rank)
            for fp in sorted(glob.glob(os.path.join(full, "*.parquet"))):
                if os.path.basename(fp).startswith(("_", ".")):
                    continue  # half-written temporaries (_tmp-*) and hidden files
                p = _part_info(path, fp, rank, rf.warnings)
                if p is not None:
                    rf.parts.append(p)
            ip = os.path.join(full, S.INFLIGHT_NAME)
            if os.path.exists(ip):
                try:
                    with open(ip) as f:
                        snap = json.load(f)
                    if not isinstance(snap, dict) or not isinstance(snap.get("ops", []), list):
                        raise ValueError("expected an object with an 'ops' list")
                    rf.inflight[int(snap.get("rank", rank))] = snap
                    rf.inflight_mtime[int(snap.get("rank", rank))] = os.stat(ip).st_mtime
                except (OSError, ValueError, TypeError) as e:
                    rf.warnings.append(f"skipped unreadable {_rel(path, ip)}: {e}")
            _retention_warning(rf, full, rank)
            stacks = sorted(glob.glob(os.path.join(full, "stacks-*.txt")))
            if stacks:
                rf.stacks[rank] = stacks
            crash = [c for c in sorted(glob.glob(os.path.join(full, S.CRASH_GLOB)))
                     if os.path.getsize(c) > 0]
            if crash:
                rf.crash[rank] = crash
    if not rf.rank_dirs:
        # Another writer: Parquet files anywhere below, rank taken from the data.
        for fp in sorted(glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True)):
            if os.path.basename(fp).startswith(("_", ".")):
                continue
            p = _part_info(path, fp, None, rf.warnings)
            if p is not None:
                rf.parts.append(p)
    if rf.rank_dirs and not os.path.exists(mpath):
        rf.warnings.append(f"no {S.MANIFEST_NAME} in {path} (the run was cut short, or copied "
                           "without it): world size and command taken from the parts")
    if rf.manifest.get("run_id"):
        from .runs import session_manifest

        rf.session = session_manifest(path)
    if not rf.parts and not rf.inflight:
        if rf.warnings:
            raise EmptyTraceError(f"{path}: no readable trace part ({'; '.join(rf.warnings)})")
        raise EmptyTraceError(f"{path}: no trace parts found (is this a commtrace run directory?)")
    _merge_meta(rf)
    _check_rank_claims(rf)
    return rf


def _retention_warning(rf: RunFiles, rank_dir: str, rank: int) -> None:
    """A warning for the oldest parts that ``--max-size`` deleted (``_retention.json``,
    capture/window.py): the run's first steps have counters but no op rows on that rank."""
    p = os.path.join(rank_dir, "_retention.json")
    if not os.path.exists(p):
        return
    try:
        with open(p) as f:
            d = json.load(f).get("dropped") or {}
        rf.retention[rank] = d
        steps = (f", steps {d.get('first_step')}..{d.get('last_step')}"
                 if d.get("first_step") is not None else "")
        rf.warnings.append(f"rank {rank}: --max-size deleted its {d.get('parts', 0)} oldest part(s) "
                           f"({d.get('rows', 0)} rows{steps}): those ops are missing")
    except (OSError, ValueError, TypeError, AttributeError) as e:
        rf.warnings.append(f"unreadable {_rel(rf.path, p)}: {e}")


def _check_rank_claims(rf: RunFiles) -> None:
    """Warn when two processes wrote parts for one rank (two runs written into one directory,
    two nodes started with the same --node-rank, a restarted worker) or when a part's metadata
    names another rank than its directory: the rows are still read, but collectives of that
    rank may be counted twice."""
    writers: dict[int, dict[tuple, list[str]]] = {}
    for p in rf.parts:
        mr = p.meta.get("rank")
        if p.rank is not None and mr is not None and _int_or_none(mr) not in (None, p.rank):
            rf.warnings.append(f"{_rel(rf.path, p.path)} says rank {mr} but lies in rank={p.rank}; "
                               f"read as rank {p.rank}")
        r = p.rank if p.rank is not None else _int_or_none(mr)
        if r is None or (p.meta.get("pid") is None and p.meta.get("host") is None):
            continue
        key = (str(p.meta.get("host")), str(p.meta.get("pid")))
        writers.setdefault(r, {}).setdefault(key, []).append(_rel(rf.path, p.path))
    for r, procs in sorted(writers.items()):
        if len(procs) > 1:
            rf.conflict_ranks.add(int(r))
            who = ", ".join(f"pid {pid} on {host} ({len(files)} part(s), e.g. {files[0]})"
                            for (host, pid), files in sorted(procs.items()))
            rf.warnings.append(f"rank {r} was written by {len(procs)} processes: {who}; two runs "
                               "in one directory, or a restarted worker? its ops may be counted twice; no "
                               "cross-rank finding is drawn from this rank")


def _int_or_none(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _merge_meta(rf: RunFiles) -> None:
    for p in rf.parts:  # sorted by name: later flushes win
        r = p.rank if p.rank is not None else p.meta.get("rank")
        if r is None:
            continue
        rf.meta.setdefault(int(r), {}).update(p.meta)
    for r, m in sorted(rf.meta.items()):
        try:
            n = int(m.get("dropped_rows") or 0)
        except (TypeError, ValueError):
            n = 0
        if n > 0:
            rf.warnings.append(
                f"rank {r} dropped {n} rows while tracing (its buffer was full or trace writes "
                "failed): its counts and times are incomplete (see --buffer-ops, --flush-interval)")


def _select_list(columns: set[str], hive_rank: bool, names=None) -> str:
    out = []
    for name in (names or S.COLUMNS):
        if name == "rank":
            if "rank" in columns and hive_rank:
                out.append('CAST(coalesce("rank", __hive_rank) AS INTEGER) AS "rank"')
            elif "rank" in columns:
                out.append('CAST("rank" AS INTEGER) AS "rank"')
            else:
                out.append('CAST(__hive_rank AS INTEGER) AS "rank"')
        elif name in columns:
            out.append(f'CAST("{name}" AS {duck_type(name)}) AS "{name}"')
        elif name == "kind":
            out.append("'op' AS \"kind\"")
        else:
            out.append(f'CAST(NULL AS {duck_type(name)}) AS "{name}"')
    return ", ".join(out)


#: Row id of a part row: file index in the part list << 32 | row number in the file. Snapshot
#: rows get negative ids.
RID_SQL = "(CAST(file_index AS BIGINT) << 32) | CAST(file_row_number AS BIGINT)"


def _read_parts_sql(parts: list[PartInfo], names=None, rid: bool = False, file_offset: int = 0) -> str:
    cols: set[str] = set()
    for p in parts:
        cols.update(p.columns)
    files = ", ".join("'" + p.path.replace("'", "''") + "'" for p in parts)
    # Rank from the directory name only for writers that left the rank column out somewhere.
    hive = all(p.rank is not None for p in parts) and any("rank" not in p.columns for p in parts)
    # union_by_name only when the parts' schemas differ (older writers, extra columns): it costs.
    same = len({tuple(p.columns) for p in parts}) == 1
    src = f"read_parquet([{files}], union_by_name={'false' if same else 'true'}{', filename=true' if hive else ''})"
    # file_offset: the index of parts[0] in the run's part list, so that a run loaded in
    # chunks of parts gets the row ids of a load in one piece.
    off = f" + {int(file_offset)}" if file_offset else ""
    rid_sql = f"(CAST(file_index{off} AS BIGINT) << 32) | CAST(file_row_number AS BIGINT)"
    if hive:
        src = (f"(SELECT *, CAST(regexp_extract(filename, 'rank=(-?[0-9]+)', 1) AS INTEGER) "
               f"AS __hive_rank, file_index AS __fi, file_row_number AS __frn FROM {src})")
        rid_sql = f"(CAST(__fi{off} AS BIGINT) << 32) | CAST(__frn AS BIGINT)"
    extra = f", {rid_sql} AS rid" if rid else ""
    return f"SELECT {_select_list(cols, hive, names)}{extra} FROM {src}"


def _snapshot_table(rf: RunFiles) -> pa.Table | None:
    cols: dict[str, list] = {n: [] for n in S.COLUMNS}
    n = 0
    for rank, snap in sorted(rf.inflight.items()):
        for op in snap.get("ops", []):
            if not isinstance(op, dict):
                continue
            for name in S.COLUMNS:
                cols[name].append(op.get(name))
            cols["rank"][-1] = int(op.get("rank", rank))
            if cols["kind"][-1] is None:
                cols["kind"][-1] = S.KIND_OP
            cols["t_end_ns"][-1] = None  # pending by definition
            n += 1
    if n == 0:
        return None
    arrays = []
    for f in S.SCHEMA:
        try:
            arrays.append(pa.array(cols[f.name], type=f.type))
        except (pa.ArrowException, TypeError, ValueError):
            arrays.append(pa.nulls(n, type=f.type))
            rf.warnings.append(f"_inflight.json: unreadable values in column {f.name}; ignored")
    t = pa.Table.from_arrays(arrays, schema=S.SCHEMA)
    return t.append_column("rid", pa.array(-np.arange(1, n + 1, dtype=np.int64)))


def distinct_values(con, rf: RunFiles, column: str) -> list:
    """Distinct non-null values of `column` over the parts and snapshots (reads one column)."""
    vals: set = set()
    if rf.parts and any(column in p.columns for p in rf.parts):
        try:
            rows = con.execute(f'SELECT DISTINCT "{column}" FROM ({_read_parts_sql(rf.parts, [column])}) '
                               f'WHERE "{column}" IS NOT NULL').fetchall()
            vals.update(r[0] for r in rows)
        except Exception:  # noqa: BLE001 -- a corrupt part: the full load finds and reports it
            pass
    for snap in rf.inflight.values():
        for op in snap.get("ops", []):
            if isinstance(op, dict) and op.get(column) is not None:
                vals.add(str(op[column]))
    return sorted(vals, key=str)


def part_chunks(parts: list[PartInfo], chunk_rows: int | None) -> list[tuple[int, list[PartInfo]]]:
    """Consecutive runs of `parts` holding at most `chunk_rows` rows each (one part at least),
    cut at rank boundaries where possible; each with the index of its first part."""
    if not chunk_rows or sum(p.num_rows for p in parts) <= chunk_rows:
        return [(0, list(parts))] if parts else []
    out: list[tuple[int, list[PartInfo]]] = []
    start, cur, n = 0, [], 0
    for i, p in enumerate(parts):
        new_rank = not cur or p.rank != cur[-1].rank
        if cur and n + p.num_rows > chunk_rows and new_rank:
            out.append((start, cur))
            start, cur, n = i, [], 0
        cur.append(p)
        n += p.num_rows
    if cur:
        out.append((start, cur))
    return out


def load_into_duckdb(con, rf: RunFiles, table: str = "raw", wrap=None, columns=None,
                     chunk_rows: int | None = None, progress=None, workers: int = 1) -> None:
    """Create DuckDB table `table` holding every row of the run (unaligned clocks), the schema
    `columns` (default: all) present, plus `rid` (see RID_SQL), plus pending ops from the
    ``_inflight.json`` snapshots.

    With `chunk_rows`, the parts are read in consecutive chunks of about that many rows (whole
    ranks where possible), one INSERT each: the table ends up clustered by rank (so that a
    filter on a range of ranks skips the rest) and the load never holds more than one chunk
    in flight. `progress(fraction)` is told after each chunk.

    A part that DuckDB cannot decode (corrupt pages behind a valid footer) is found by reading
    each part with pyarrow, skipped with a warning naming it, and the load retried.

    `wrap(sql) -> sql` may transform the rows on the way in (the analysis aligns clocks there,
    so that the run is materialised once).

    With `workers` > 1 and several chunks, that many cursors of `con` insert chunks at the
    same time (an empty `table` is created first; appends of separate transactions do not
    conflict). Writing a chunk into a database file is mostly serial inside DuckDB
    (compression of each row group as it is appended), so two writers halve the load's wall
    time on two cores (64 x 20,000 synthetic: 1.9 s -> 1.1 s) for about the same memory."""
    wrap = wrap or (lambda q: q)
    names = list(columns or S.COLUMNS)
    parts = list(rf.parts)

    def create(parts):
        chunks = part_chunks(parts, chunk_rows)
        if workers > 1 and len(chunks) > 1:
            _create_parallel(con, table, [wrap(_read_parts_sql(ch, names, rid=True, file_offset=off))
                                          for off, ch in chunks], workers, progress)
            return
        for k, (off, ch) in enumerate(chunks):
            q = wrap(_read_parts_sql(ch, names, rid=True, file_offset=off))
            con.execute(f"CREATE OR REPLACE TABLE {table} AS {q}" if k == 0 else f"INSERT INTO {table} BY NAME {q}")
            if progress and len(chunks) > 1:
                progress((k + 1) / len(chunks))

    if parts:
        try:
            create(parts)
        except Exception:  # duckdb raises its own exception family
            good = []
            for p in parts:
                try:
                    pq.read_table(p.path)
                    good.append(p)
                except Exception as e:  # noqa: BLE001
                    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                    rf.warnings.append(
                        f"skipped truncated or corrupt part {_rel(rf.path, p.path)}: {msg}")
            rf.parts = good
            if not good and not rf.inflight:
                raise EmptyTraceError(f"{rf.path}: no readable trace part")
            parts = good
            if parts:
                create(parts)
    if not parts:
        cols = ", ".join(f'CAST(NULL AS {duck_type(n)}) AS "{n}"' for n in names)
        con.execute(f"CREATE OR REPLACE TABLE {table} AS {wrap(f'SELECT {cols}, CAST(NULL AS BIGINT) AS rid LIMIT 0')}")
    rf.snapshot = _snapshot_table(rf)
    if rf.snapshot is not None:
        con.register("__snapshot", rf.snapshot)
        sel = snapshot_rows_sql(table, names)
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM ({wrap(sel)})")
        con.unregister("__snapshot")


def _create_parallel(con, table: str, queries: list[str], workers: int, progress=None) -> None:
    """Table `table` holding the rows of every SELECT in `queries`, inserted by `workers`
    cursors of `con` at once (each in the database `con` is using); raises the first error."""
    import threading

    db = con.execute("SELECT current_database()").fetchone()[0]
    con.execute(f"CREATE OR REPLACE TABLE {table} AS SELECT * FROM ({queries[0]}) LIMIT 0")
    lock = threading.Lock()
    todo = list(range(len(queries)))
    errors: list[BaseException] = []
    done = [0]

    def work(cur):
        try:
            cur.execute(f'USE "{db}"')
            while not errors:
                with lock:
                    if not todo:
                        return
                    k = todo.pop(0)
                cur.execute(f"INSERT INTO {table} BY NAME {queries[k]}")
                with lock:
                    done[0] += 1
                    if progress:
                        progress(done[0] / len(queries))
        except BaseException as e:  # noqa: BLE001 -- re-raised in the calling thread
            with lock:
                errors.append(e)
        finally:
            cur.close()

    # One DuckDB thread per writer: the writers are the parallelism, and each thread of a
    # query holds its own row group buffers (about 100 MB less at the peak of a 64 x 20,000 run).
    nthreads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    con.execute(f"SET threads = {max(1, min(int(nthreads), workers))}")
    threads = [threading.Thread(target=work, args=(con.cursor(),), name=f"commtrace-load-{i}", daemon=True)
               for i in range(min(workers, len(queries)))]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        con.execute(f"SET threads = {int(nthreads)}")
    if errors:
        raise errors[0]


def snapshot_rows_sql(table: str, names, snapshot: str = "__snapshot") -> str:
    """SELECT of the snapshot ops (table `snapshot`, columns `names` + rid) that have no row in
    `table` (same rank and op_id; or, without op_id, same rank, pg, seq and op): the pending
    ops added to a run (shared with the Spark engine)."""
    s_names = ", ".join(f's."{n}"' for n in list(names) + ["rid"])
    return f"""
        SELECT {s_names} FROM {snapshot} s
        WHERE NOT EXISTS (
            SELECT 1 FROM {table} t WHERE t.rank = s.rank AND t.kind = s.kind AND (
                (s.op_id IS NOT NULL AND t.op_id = s.op_id) OR
                (s.op_id IS NULL AND t.pg IS NOT DISTINCT FROM s.pg
                 AND t.seq IS NOT DISTINCT FROM s.seq AND t.op IS NOT DISTINCT FROM s.op)))"""


def select_parts_sql(rf: RunFiles, columns) -> str | None:
    """SQL over the parts with `rid` and `columns` (schema names), for targeted lazy reads."""
    if not rf.parts:
        return None
    return _read_parts_sql(rf.parts, list(columns), rid=True)


def load_columns(con, rf: RunFiles, table: str, columns) -> None:
    """Create `table` (rid + `columns`) for every part row and snapshot op: the columns that
    :func:`load_into_duckdb` left out, joined back by `rid` when someone asks for them."""
    names = list(columns)
    sels = []
    if rf.parts:
        sels.append(_read_parts_sql(rf.parts, ["rank"] + names, rid=True))
    snap = getattr(rf, "snapshot", None)
    if snap is not None:
        con.register("__snapshot_x", snap)
        sels.append("SELECT " + ", ".join(f'"{n}"' for n in ["rank"] + names + ["rid"]) + " FROM __snapshot_x")
    if not sels:
        sels.append("SELECT " + ", ".join(f'CAST(NULL AS {duck_type(n)}) AS "{n}"' for n in ["rank"] + names)
                    + ", CAST(NULL AS BIGINT) AS rid LIMIT 0")
    cols = ", ".join(f'"{n}"' for n in names)
    con.execute(f"CREATE OR REPLACE TABLE {table} AS SELECT rid, {cols} FROM ("
                + " UNION ALL BY NAME ".join(sels) + ")")
    if snap is not None:
        con.unregister("__snapshot_x")


def poll_run(path) -> dict:
    """What a live view re-reads every few seconds, without opening a part: the manifest, each
    rank's ``_inflight.json`` snapshot, and a signature of the parts (count and newest mtime per
    rank directory) that changes when a rank writes a new part.

    Returns ``{"manifest": dict, "snapshots": {rank: snapshot}, "parts": (n, newest_mtime_ns),
    "mtimes": {rank: snapshot mtime (s)}, "crash": {rank: [non-empty crash files]},
    "rank_dirs": [ranks], "scan_time": time.time() of the read, "session": the launcher's
    record (v2)}``, what :func:`commtrace.analysis.job.from_poll` takes; unreadable files are
    skipped (a snapshot being replaced reads as the previous one next time)."""
    path = os.fspath(path)
    out = {"manifest": {}, "snapshots": {}, "parts": (0, 0), "mtimes": {}, "crash": {},
           "rank_dirs": [], "scan_time": time.time()}
    try:
        with open(os.path.join(path, S.MANIFEST_NAME)) as f:
            m = json.load(f)
        out["manifest"] = m if isinstance(m, dict) else {}
    except (OSError, ValueError):
        pass
    n, newest = 0, 0
    try:
        entries = sorted(os.listdir(path))
    except OSError:
        return out
    for entry in entries:
        mm = _RANK_DIR_RE.match(entry)
        if not mm:
            continue
        full = os.path.join(path, entry)
        rank = int(mm.group(1))
        crash = []
        try:
            with os.scandir(full) as it:
                for de in it:
                    if de.name.endswith(".parquet") and not de.name.startswith(("_", ".")):
                        n += 1
                        newest = max(newest, de.stat().st_mtime_ns)
                    elif fnmatch.fnmatch(de.name, S.CRASH_GLOB) and de.stat().st_size > 0:
                        crash.append(de.path)
        except OSError:
            continue
        out["rank_dirs"].append(rank)
        if crash:
            out["crash"][rank] = sorted(crash)
        try:
            ip = os.path.join(full, S.INFLIGHT_NAME)
            with open(ip) as f:
                snap = json.load(f)
            if isinstance(snap, dict) and isinstance(snap.get("ops", []), list):
                r = int(snap.get("rank", rank))
                out["snapshots"][r] = snap
                out["mtimes"][r] = os.stat(ip).st_mtime
        except (OSError, ValueError, TypeError):
            pass
    out["parts"] = (n, newest)
    if out["manifest"].get("run_id"):
        # Schema v2: the launcher's end and exit code are in the session manifest above the run
        # (they are this job's when it is the session's last).
        from .runs import session_manifest

        sess = session_manifest(path)
        out["session"] = sess
        runs = sess.get("runs") or []
        if sess.get("end_ns") and (not runs or runs[-1] == os.path.basename(os.path.abspath(path))):
            out["manifest"] = dict(out["manifest"], end_ns=sess["end_ns"], exit_code=sess.get("exit_code"),
                                   signal=sess.get("signal"))
    return out
