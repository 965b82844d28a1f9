"""The Spark engine (``commtrace report --engine spark``, ``commtrace.load(..., engine="spark")``):
the heavy cross-rank stages of the analysis on Spark, for runs larger than one machine.

On Spark (pyspark, any master: ``local[N]`` or a cluster):

1. read the hive-partitioned Parquet parts (``rank=<r>/part-*.parquet``) with the reader's own
   select list and row ids, add the pending ops of the ``_inflight.json`` snapshots;
2. align the clocks, fill completions, key collectives (:func:`loading.align_sql`) and give each
   row its step (recorded, from step markers, or detected from a repeating pattern);
3. write that aligned op table as Parquet (``ops/`` under the run's temporary directory);
4. match collectives by (pg, seq), their wait states, p2p pairs, wait totals per (rank, step)
   (:mod:`matching`), and the per-rank / per-(rank, step) overlap figures (:mod:`overlap`, run
   per rank on the executors).

Those outputs are the engine boundary (docs/large-jobs.md): the per-collective table (one row
per collective with its arrival and completion statistics), the per-(collective, rank) wait
table, the p2p pairs, and the per-rank and per-(rank, step) tables. They are collected into the
run's local DuckDB connection under the names the DuckDB engine gives them, with the types it
gives them; the aligned op table is a DuckDB view over the Parquet of step 3. Everything above
(findings, summaries, the report, root cause) is the same code for both engines.

One source of truth for the SQL: every query here is the DuckDB SQL of :mod:`loading`,
:mod:`matching` and :mod:`format.reader`, transpiled by sqlglot (:func:`to_spark`). The one
construct with no Spark equivalent, DuckDB's ASOF join (a row's latest step marker), is a
window (:func:`_asof_step_sql`).

pyspark is imported only here, and only when this engine is asked for.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile

import numpy as np
import pyarrow as pa

from ..errors import CommtraceError, TraceFormatError
from ..format import reader as R
from ..format import schema as S
from . import loading as L
from . import matching as M
from . import overlap as OV
from . import sql as Q

#: Settings of every session commtrace starts (a cluster's own defaults otherwise).
BASE_CONF = {
    "spark.app.name": "commtrace",
    "spark.sql.session.timeZone": "UTC",
    # array_length(NULL) is NULL in DuckDB; Spark's size(NULL) must not be -1.
    "spark.sql.legacy.sizeOfNull": "false",
}
#: Settings of a local session (``local[N]``): small shuffles, no UI, loopback only.
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.adaptive.enabled": "true",
}
#: Master when none is given ($COMMTRACE_SPARK_MASTER overrides).
DEFAULT_MASTER = "local[*]"
#: Spark type of each DuckDB type of the schema columns.
_SPARK_TYPES = {"VARCHAR": "STRING", "INTEGER": "INT", "BIGINT": "BIGINT", "BOOLEAN": "BOOLEAN",
                "BIGINT[]": "ARRAY<BIGINT>"}
#: Columns of the op table the overlap stage reads (overlap.compute).
OVERLAP_COLUMNS = ("rank", "step", "kind", "bytes", "stream_wait_ns", "t_enqueue_ns", "t_return_ns",
                   "t_end_ns", "t_wait_ns", "t_wait_end_ns")
_OV_SCHEMA = ("total BOOLEAN, rank BIGINT, step BIGINT, ops DOUBLE, bytes DOUBLE, stream_wait_ns DOUBLE, "
              "sync_ns DOUBLE, C DOUBLE, B DOUBLE, X DOUBLE")


class SparkUnavailable(CommtraceError):
    """pyspark or Java is missing."""


def check_available() -> None:
    """Raise :class:`SparkUnavailable` (one line a user can act on) when pyspark or a Java
    runtime is missing."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise SparkUnavailable("--engine spark needs pyspark: pip install 'commtrace[spark]'") from None
    try:
        import sqlglot  # noqa: F401
    except ImportError:
        raise SparkUnavailable("--engine spark needs sqlglot: pip install 'commtrace[spark]'") from None
    java_home = os.environ.get("JAVA_HOME")
    if not shutil.which("java") and not (java_home and os.path.exists(os.path.join(java_home, "bin", "java"))):
        raise SparkUnavailable("--engine spark needs a Java runtime (17): none found on PATH or in $JAVA_HOME "
                               "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless)")


# ---------------------------------------------------------------------------- SQL
@functools.lru_cache(maxsize=512)
def to_spark(sql: str) -> str:
    """DuckDB SQL -> Spark SQL (sqlglot). Decimal literals become DOUBLE: DuckDB computes
    ``2.0 * (n - 1) / n`` in floating point, Spark in DECIMAL, rounded to 6 places."""
    import sqlglot
    from sqlglot import exp

    def fix(node):
        if isinstance(node, exp.Literal) and not node.is_string and any(c in node.this for c in ".eE"):
            return exp.Cast(this=node.copy(), to=exp.DataType.build("DOUBLE"))
        return node

    tree = sqlglot.parse_one(sql, read="duckdb").transform(fix)
    return tree.sql(dialect="spark")


def _asof_step_sql(t0: str, cols: list[str], marks: str, default: str | None) -> str:
    """Spark SQL: `t0` with each row's step = its own, else the step of the latest row of
    `marks` (mrank, mt, mstep) on its rank at or before its enqueue, else `default`: DuckDB's
    ``ASOF LEFT JOIN ... ON x.rank = m.mrank AND x.t_enqueue_ns >= m.mt`` of
    loading.assign_steps, as a running last-non-null over the rows and marks of a rank sorted
    by time (marks first on a tie, as >= includes them)."""
    dflt = f", {default}" if default else ""
    out, row_sel, mark_sel = [], [], []
    for c in cols:
        q = f"`{c}`"
        if c == "step":
            out.append(f"CASE WHEN t_enqueue_ns IS NULL OR `rank` IS NULL THEN coalesce(step{dflt}) "
                       f"ELSE coalesce(step, __m{dflt}) END AS step")
            mark_sel.append("CAST(NULL AS BIGINT) AS step")
        else:
            out.append(q)
            mark_sel.append({"rank": "mrank AS `rank`", "t_enqueue_ns": "mt AS t_enqueue_ns"}.get(
                c, f"CAST(NULL AS {_col_type_of(c)}) AS {q}"))
        row_sel.append(q)
    return f"""
        SELECT {', '.join(out)} FROM (
            SELECT *, last(__mark, true) OVER (PARTITION BY `rank` ORDER BY t_enqueue_ns, __o
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS __m
            FROM (
                SELECT {', '.join(row_sel)}, CAST(NULL AS BIGINT) AS __mark, 1 AS __o, true AS __row FROM {t0}
                UNION ALL
                SELECT {', '.join(mark_sel)}, CAST(mstep AS BIGINT) AS __mark, 0 AS __o, false AS __row
                FROM {marks} WHERE mrank IS NOT NULL AND mt IS NOT NULL))
        WHERE __row"""


_COL_TYPES: dict[str, str] = {}


def _col_type_of(c: str) -> str:
    return _COL_TYPES.get(c, "STRING")


def _error_line(e: BaseException) -> str:
    """One line saying what went wrong in Spark: the Java exception's own message when py4j
    wraps one ("An error occurred while calling o175.getResult" says nothing)."""
    java = getattr(e, "java_exception", None)
    if java is not None:
        try:
            cause = java
            while cause.getCause() is not None:  # the root cause names the real problem
                cause = cause.getCause()
            return str(cause.toString()).strip().splitlines()[0]
        except Exception:  # noqa: BLE001
            pass
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# ---------------------------------------------------------------------------- session
def session(master: str | None = None):
    """The active SparkSession, or a new one on `master` (default $COMMTRACE_SPARK_MASTER or
    ``local[*]``) with :data:`BASE_CONF` (and :data:`LOCAL_CONF` for a local master)."""
    check_available()
    import warnings

    # pyspark warns about pandas 3 on every grouped UDF; this engine passes Arrow, not pandas.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:  # a session of this process (spark-submit's, a notebook's, the tests')
        return active
    master = master or os.environ.get("COMMTRACE_SPARK_MASTER")
    # Under spark-submit (it starts the JVM and passes its gateway): its --master and --conf.
    submitted = master is None and bool(os.environ.get("PYSPARK_GATEWAY_PORT"))
    if not submitted:
        master = master or DEFAULT_MASTER
    conf = dict(BASE_CONF)
    if master and master.startswith("local"):
        conf.update(LOCAL_CONF)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # The executors are threads of this machine: the overlap stage runs this interpreter.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    b = SparkSession.builder if submitted else SparkSession.builder.master(master)
    for k, v in conf.items():
        b = b.config(k, v)
    try:
        spark = b.getOrCreate()
    except Exception as e:  # noqa: BLE001 -- py4j / JVM start-up failures
        raise SparkUnavailable(f"cannot start Spark on {master or 'the spark-submit master'}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# ---------------------------------------------------------------------------- stages
def _part_key(path: str) -> str:
    """The last two components of a part's path: how a part is told apart in Spark's
    ``_metadata.file_path`` (rank=<r>/part-*.parquet, unique within a run)."""
    parts = os.path.normpath(path).split(os.sep)
    return "/".join(parts[-2:])


def _part_url(path: str, run_dir: str, parts_url: str | None) -> str:
    if not parts_url:
        return os.path.abspath(path)
    rel = os.path.relpath(path, run_dir).replace(os.sep, "/")
    return parts_url.rstrip("/") + "/" + rel


def _read_parts(spark, rf: R.RunFiles, parts_url: str | None) -> str:
    """Spark view ``ct_loaded``: the reader's select list (LOAD_COLUMNS, absent columns NULL,
    rank from the directory where a writer left it out) with row ids, plus snapshot ops."""
    from pyspark.sql import functions as F

    names = list(L.LOAD_COLUMNS)
    for n in names:
        _COL_TYPES[n] = _SPARK_TYPES[R.duck_type(n)]
    parts = rf.parts
    if parts:
        raw = (spark.read.option("mergeSchema", "true")
               .parquet(*[_part_url(p.path, rf.path, parts_url) for p in parts]))
        raw = raw.select("*", F.substring_index(F.col("_metadata.file_path"), "/", -2).alias("__key"),
                         F.col("_metadata.row_index").alias("__frn"))
        files = spark.createDataFrame([(_part_key(p.path), i, p.rank) for i, p in enumerate(parts)],
                                      "__key STRING, __fi INT, __hive_rank INT")
        raw.join(F.broadcast(files), "__key").createOrReplaceTempView("ct_raw")
        cols = set()
        for p in parts:
            cols.update(p.columns)
        hive = all(p.rank is not None for p in parts) and any("rank" not in p.columns for p in parts)
        sel = (f"SELECT {R._select_list(cols, hive, names)}, "
               f"(CAST(__fi AS BIGINT) << 32) | CAST(__frn AS BIGINT) AS rid FROM ct_raw")
        loaded = spark.sql(to_spark(sel))
    else:
        sel = ", ".join(f'CAST(NULL AS {R.duck_type(n)}) AS "{n}"' for n in names)
        loaded = spark.sql(to_spark(f"SELECT {sel}, CAST(NULL AS BIGINT) AS rid LIMIT 0"))
    loaded.createOrReplaceTempView("ct_parts")
    rf.snapshot = R._snapshot_table(rf)
    if rf.snapshot is not None:
        snap = rf.snapshot.select(names + ["rid"])
        spark.createDataFrame(snap).createOrReplaceTempView("ct_snapshot")
        pending = spark.sql(to_spark(R.snapshot_rows_sql("ct_parts", names, "ct_snapshot")))
        loaded = loaded.unionByName(pending)
    loaded.createOrReplaceTempView("ct_loaded")
    return "ct_loaded"


def _distinct_pgs(spark, rf: R.RunFiles) -> list:
    """The group names in load order, as reader.distinct_values gives them."""
    vals = {r[0] for r in spark.sql("SELECT DISTINCT pg FROM ct_parts WHERE pg IS NOT NULL").collect()}
    for snap in rf.inflight.values():
        for op in snap.get("ops", []):
            if isinstance(op, dict) and op.get("pg") is not None:
                vals.add(str(op["pg"]))
    return sorted(vals, key=str)


def _align(spark, rf: R.RunFiles, pgs: list) -> list[str]:
    """Spark view ``ct_t0``: the aligned rows (loading.align_sql); returns its columns."""
    offs = L.offsets(rf.meta)
    spark.createDataFrame(offs or [], "rank INT, off BIGINT, rtt BIGINT").createOrReplaceTempView("offsets")
    df = spark.sql(to_spark(L.align_sql("SELECT * FROM ct_loaded", pgs)))
    df.createOrReplaceTempView("ct_t0")
    for f in df.schema.fields:
        _COL_TYPES.setdefault(f.name, f.dataType.simpleString())
    return list(df.columns)


def _assign_steps(spark, cols: list[str], warnings: list[str]):
    """Spark DataFrame of the op table with each row's step (loading.assign_steps)."""
    n_step, n_mark = spark.sql(to_spark(L.step_counts_sql("ct_t0"))).first()
    if n_step or not n_mark:
        if n_step:
            return spark.table("ct_t0")
        lowest = spark.sql("SELECT min(rank) FROM ct_t0").first()[0]
        period = None
        if lowest is not None:
            d = spark.sql(to_spark(L.lowest_rank_sql("ct_t0", lowest))).toArrow()
            period = L.detect_period({k: d.column(k).to_numpy(zero_copy_only=False) for k in d.column_names})
        if period is None:
            return spark.table("ct_t0")
        spark.sql(to_spark(L.bounds_sql("ct_t0", lowest, period))).createOrReplaceTempView("ct_marks_src")
        spark.sql("SELECT brank AS mrank, bt AS mt, bstep AS mstep FROM ct_marks_src").createOrReplaceTempView("ct_marks")
        warnings.append(L.detected_warning(period))
        return spark.sql(_asof_step_sql("ct_t0", cols, "ct_marks", "0"))
    spark.sql(f"""SELECT rank AS mrank, t_enqueue_ns AS mt, step AS mstep FROM ct_t0
                  WHERE kind = '{S.KIND_MARK}' AND step IS NOT NULL""").createOrReplaceTempView("ct_marks")
    return spark.sql(_asof_step_sql("ct_t0", cols, "ct_marks", None))


def _overlap_group(t_min_ns, t_max_ns, table: pa.Table) -> pa.Table:
    """The overlap stage for the rows of one rank (runs on an executor): overlap.compute over
    an in-memory DuckDB, the same code as the DuckDB engine, with the run-wide time base."""
    import duckdb

    con = duckdb.connect()
    try:
        con.register("g", table)
        ranks = sorted({int(r) for r in table.column("rank").to_pylist() if r is not None})
        tot = OV.compute(con, "g", ranks, table.num_rows, t_min_ns, t_max_ns, "ovs")
        st = con.sql("SELECT * FROM ovs").fetchnumpy()
    finally:
        con.close()
    n_t, n_s = len(tot["rank"]), len(st["rank"])

    def col(k, dtype=np.float64):
        a = np.concatenate([np.asarray(tot[k], dtype) if k in tot else np.zeros(n_t, dtype),
                            np.asarray(st[k], dtype) if k in st else np.zeros(n_s, dtype)])
        return pa.array(a)

    return pa.table({
        "total": pa.array([True] * n_t + [False] * n_s), "rank": col("rank", np.int64),
        "step": pa.array(np.concatenate([np.zeros(n_t, np.int64), np.asarray(st["step"], np.int64)]),
                         mask=np.r_[np.ones(n_t, bool), np.zeros(n_s, bool)]),
        **{k: col(k) for k in ("ops", "bytes", "stream_wait_ns", "sync_ns", "C", "B", "X")}})


def _duck_schemas(con, pgs, members) -> dict[str, list[tuple[str, str]]]:
    """The (column, DuckDB type) of each boundary table as the DuckDB engine builds it: its
    own builders run on an empty op table, so that both engines hand the same types to the
    code above the boundary."""
    con.execute("CREATE OR REPLACE TEMP TABLE __e AS SELECT * FROM t LIMIT 0")
    M.build_collectives(con, "__e", "__e_coll", pgs, members)
    M.build_waits(con, "__e", "__e_coll", "__e_waits")
    M.build_p2p(con, "__e", "__e_p2p")
    M.build_wait_rank_step(con, "__e_waits", "__e_p2p", "__e_wrs")
    M.finish_collectives(con, "__e_coll", "__e_waits")
    out = {k: [(r[0], r[1]) for r in Q.rows(con, f"DESCRIBE __e_{k}").fetchall()]
           for k in ("coll", "waits", "p2p", "wrs")}
    for k in ("__e_coll_m", "__e_coll", "__e_waits", "__e_p2p", "__e_wrs", "__e"):
        con.execute(f"DROP TABLE IF EXISTS {k}")
    return out


def _to_duck(con, name: str, df, types: list[tuple[str, str]], out_dir: str) -> None:
    """Spark DataFrame `df` -> DuckDB table `name` with `types` (DuckDB's): Spark writes it as
    Parquet under `out_dir` and DuckDB reads it there (out of core; nothing goes through the
    Spark driver)."""
    path = os.path.join(out_dir, name)
    df.write.mode("overwrite").parquet(path)
    files = os.path.join(path, "*.parquet")
    if any(f.endswith(".parquet") for f in os.listdir(path)):
        sel = ", ".join(f'CAST("{c}" AS {ty}) AS "{c}"' for c, ty in types)
        src = f"read_parquet({Q.quote(files)})"
    else:  # an empty result may leave no file
        sel = ", ".join(f'CAST(NULL AS {ty}) AS "{c}"' for c, ty in types)
        src = "(SELECT 1 LIMIT 0)"
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT {sel} FROM {src}")


# ---------------------------------------------------------------------------- load
def load(path: str, *, master: str | None = None, threads: int | None = None, memory_limit: str | None = None,
         progress=None, temp_dir: str | None = None, parts_url: str | None = None, spark=None):
    """Load the run directory `path` with the cross-rank stages on Spark (see the module doc);
    returns a :class:`commtrace.analysis.run.Run` whose boundary tables are already built.
    `parts_url`: the run directory as the executors see it (``s3a://bucket/traces/run42``),
    when it is not `path`. The aligned op table is written under `temp_dir`, which on a cluster
    must be storage both this machine and the executors reach."""
    from .run import Run

    spark = spark or session(master)
    rf = R.scan_run(path)
    if progress:
        progress("loading (spark)", 0.0, rf.num_rows)
    warnings = rf.warnings
    tmp = tempfile.mkdtemp(prefix="commtrace-spark-", dir=temp_dir or os.environ.get("COMMTRACE_TMPDIR") or None)
    con = None
    try:
        try:
            _read_parts(spark, rf, parts_url)
            pgs = _distinct_pgs(spark, rf)
            cols = _align(spark, rf, pgs)
            t = _assign_steps(spark, cols, warnings)
            ops_dir = os.path.join(tmp, "ops")
            (t.repartitionByRange(max(1, min(64, len(rf.rank_dirs) or 1)), "rank")
             .sortWithinPartitions("rank", "rid").write.parquet(ops_dir))
        except CommtraceError:
            raise
        except Exception as e:  # noqa: BLE001 -- Spark's own exception family
            raise TraceFormatError(f"{path}: Spark cannot read the trace: {_error_line(e)}") from None
        if progress:
            progress("matching (spark)", 0.5, rf.num_rows)
        con, _ = L.connect(rf.num_rows, threads=threads, memory_limit=memory_limit, temp_dir=tmp)
        L.create_offsets(con, rf)
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({Q.quote(os.path.join(ops_dir, '*.parquet'))})")
        rf.pgs = pgs
        run = Run(con, rf, _tmp=tmp, _steps_done=True)
    except BaseException:
        if con is not None:
            L.close(con, None)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        _cross_rank(spark, run, ops_dir, pgs)
    except BaseException as e:
        run.close()
        if isinstance(e, Exception) and not isinstance(e, CommtraceError):
            raise CommtraceError(f"{path}: the Spark stages failed: {_error_line(e)}") from None
        raise
    return run


def _cross_rank(spark, run, ops_dir: str, pgs: list) -> None:
    """Run the boundary stages on Spark and hand their tables to `run` (see the module doc)."""
    con = run._con
    out_dir = os.path.join(os.path.dirname(ops_dir), "tables")
    members = run.pg_members
    schemas = _duck_schemas(con, pgs, members)
    spark.read.parquet(ops_dir).createOrReplaceTempView("ct_t")
    spark.createDataFrame([(k, len(v)) for k, v in members.items()] or [],
                          "pg STRING, n_members INT").createOrReplaceTempView("ct_m")
    coll0 = spark.sql(to_spark(M.collectives_sql("ct_t", pgs, "ct_m"))).cache()
    coll0.createOrReplaceTempView("ct_coll0")
    waits = spark.sql(to_spark(M.waits_sql("ct_t", "ct_coll0"))).cache()
    waits.createOrReplaceTempView("ct_waits")
    coll = spark.sql(to_spark(M.finish_sql("ct_coll0", "ct_waits")))
    p2p = spark.sql(to_spark(M.p2p_sql("ct_t"))).cache()
    p2p.createOrReplaceTempView("ct_p2p")
    wrs = spark.sql(to_spark(M.wait_rank_step_sql("ct_waits", "ct_p2p")))
    t = run._t
    with run._lock:
        _to_duck(con, f"{t}_coll", coll, schemas["coll"], out_dir)
        _to_duck(con, f"{t}_waits", waits, schemas["waits"], out_dir)
        _to_duck(con, f"{t}_p2p", p2p, schemas["p2p"], out_dir)
        _to_duck(con, f"{t}_wrs", wrs, schemas["wrs"], out_dir)
    for df in (coll0, waits, p2p):
        df.unpersist()
    # Overlap per rank, on the executors (one group per rank).
    t_min_ns, t_max_ns = run.t_min_ns, run.t_max_ns

    def fn(table: pa.Table) -> pa.Table:
        return _overlap_group(t_min_ns, t_max_ns, table)
    ov_types = [(f.split()[0], f.split()[1]) for f in _OV_SCHEMA.split(", ")]
    with run._lock:
        _to_duck(con, "__ov", spark.read.parquet(ops_dir).select(*OVERLAP_COLUMNS).groupBy("rank")
                 .applyInArrow(fn, _OV_SCHEMA), ov_types, out_dir)
        tot = Q.numpy(con, f"SELECT rank, {', '.join(OV.RANK_COLUMNS)} FROM __ov WHERE total ORDER BY rank")
        con.execute(f"""CREATE OR REPLACE TABLE {t}_ovs AS
                        SELECT rank, step, CAST(ops AS BIGINT) AS ops, CAST(stream_wait_ns AS BIGINT) AS stream_wait_ns,
                               C, B, X FROM __ov WHERE NOT total""")
        con.execute("DROP TABLE __ov")
    overlap = {"rank": tot["rank"].astype(np.int64), **{k: tot[k].astype(np.float64) for k in OV.RANK_COLUMNS}}
    for name in (f"{t}_coll", f"{t}_waits", f"{t}_p2p", f"{t}_wrs"):
        run._cache[name] = True
    run._cache["overlap"] = overlap
