"""Export a loaded run to formats other tools read.

- :func:`write_perfetto`: Chrome Trace Event JSON (opens in ui.perfetto.dev and chrome://tracing),
  written streaming from Arrow record batches, gzip-compressed when the name ends in ``.gz``.
- :func:`write_table`: the analysed per-op table (:func:`op_table_sql`) as CSV or Parquet.

Both read the run's aligned DuckDB table (times on rank 0's clock, ``shared/reference/metrics.md``
"Clock alignment") and never the files themselves. The Trace Event format is documented at
https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import gzip
import json
import os

from ..errors import OutputError, UsageError

#: Record batch size of the streaming readers (rows).
BATCH_ROWS = 65_536

#: Fixed thread ids of each rank's process (host-call threads follow from HOST_TID0 up).
TID_FINDINGS, TID_WAITS, TID_SYNC, TID_HAZARDS, HOST_TID0 = 1, 2, 3, 4, 10

FORMATS = ("perfetto", "csv", "parquet")


def _open_text(path: str):
    try:
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        if path.endswith(".gz"):
            return gzip.open(path, "wt", encoding="utf-8", compresslevel=6)
        return open(path, "w", encoding="utf-8")
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e}") from None


def _us(ns) -> float:
    """Trace Event timestamps are microseconds; keep ns resolution as decimals (callers pass
    times relative to the run's start: epoch microseconds need 16 digits before the point, and
    a double then cannot hold the nanoseconds)."""
    return round(ns / 1000.0, 3)


def _batches(run, sql: str):
    """Stream the rows of `sql` as Arrow record batches (DuckDB holds the result, not Python)."""
    with run._lock:
        rel = run._con.sql(sql)
        reader = (rel.to_arrow_reader if hasattr(rel, "to_arrow_reader") else rel.fetch_arrow_reader)(BATCH_ROWS)
        for b in reader:
            yield b


def _ops_events_sql(run) -> str:
    """Op, wait and sync rows for the trace, in (rank, enqueue) order, with the host thread
    number per rank and each collective copy's position among its ranks' copies (for flows)."""
    lazy = run._ensure_lazy()
    t = run._t
    return f"""
        SELECT q.kind, q.rank, q.op, q.pg, q.seq, q.op_id, q.async_op, q.dtype, q.count, q.bytes, q.peer, q.root,
               q.t_enqueue_ns, q.t_return_ns, q.t_end_ns, q.t_wait_ns, q.t_wait_end_ns, q.step, q.site, q.error,
               q.inflight, q.detail, q.ckey, x.api,
               CAST(dense_rank() OVER (PARTITION BY q.rank ORDER BY coalesce(x.thread, 0)) AS BIGINT) AS thread_no,
               CASE WHEN q.ckey IS NOT NULL THEN row_number() OVER (PARTITION BY q.ckey ORDER BY q.t_enqueue_ns, q.rank) END AS copy_no,
               CASE WHEN q.ckey IS NOT NULL THEN count(*) OVER (PARTITION BY q.ckey) END AS copies
        FROM {t} q LEFT JOIN {lazy} x ON x.rid = q.rid
        WHERE q.kind IN ('op', 'sync', 'hazard') AND q.t_enqueue_ns IS NOT NULL
        ORDER BY q.rank, q.t_enqueue_ns"""


def _args(row: dict, keys) -> dict:
    return {k: row[k] for k in keys if row.get(k) is not None}


_OP_ARGS = ("pg", "seq", "op_id", "async_op", "dtype", "count", "bytes", "peer", "root", "step", "site", "error", "api")


def write_perfetto(run, path: str) -> dict:
    """Write `run` as Chrome Trace Event JSON to `path` (gzip when it ends in ``.gz``).

    Per rank one process ``rank N (host)``; per host thread a track of the calls (complete
    events, the host-blocked part of metrics.md); the in-flight interval of every op
    (``t_enqueue`` to ``t_end``) as an async begin/end pair with a per-rank unique id, because
    in-flight ops overlap; ``wait()`` calls, ``synchronize()`` calls and host hazards on their
    own tracks; findings as instant events; flow events (``s``/``t``/``f``, id = the collective's
    key) linking the ranks' copies of each matched collective (pg, seq) in arrival order.
    Timestamps are microseconds since the run's first event (``otherData.t0_epoch_ns``, the
    epoch time of ts 0) on rank 0's clock (offsets applied).

    Streams: memory stays bounded by one record batch whatever the run's size.
    Returns counts of what was written (`events`, `ops`, `flows`, `findings`)."""
    counts = {"events": 0, "ops": 0, "inflight": 0, "waits": 0, "syncs": 0, "hazards": 0, "flows": 0,
              "findings": 0}
    dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode
    t0 = int(run.t_min_ns or 0)
    f = _open_text(path)
    first = [True]

    def emit(chunk: list[str]):
        if not chunk:
            return
        s = ",\n".join(chunk)
        f.write(s if first[0] else ",\n" + s)
        first[0] = False
        counts["events"] += len(chunk)

    try:
        f.write('{"displayTimeUnit":"ns","otherData":'
                + dumps({"tool": "commtrace", "run": str(run.path), "world_size": run.world_size,
                         "t0_epoch_ns": t0,
                         "clock": "us since t0_epoch_ns, every rank aligned to rank 0"})
                + ',"traceEvents":[\n')
        meta = []
        for r in run.ranks:
            host = (run.meta.get(r) or {}).get("host") or "?"
            meta.append(dumps({"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                               "args": {"name": f"rank {r} ({host})"}}))
            meta.append(dumps({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0,
                               "args": {"sort_index": r}}))
            for tid, nm in ((TID_FINDINGS, "findings"), (TID_WAITS, "wait()"), (TID_SYNC, "synchronize()"),
                            (TID_HAZARDS, "host hazards")):
                meta.append(dumps({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": nm}}))
        emit(meta)
        named_threads: set = set()
        for batch in _batches(run, _ops_events_sql(run)):
            chunk: list[str] = []
            for row in batch.to_pylist():
                r = row["rank"]
                tid = HOST_TID0 + int(row["thread_no"] or 1) - 1
                if (r, tid) not in named_threads:
                    named_threads.add((r, tid))
                    chunk.append(dumps({"ph": "M", "name": "thread_name", "pid": r, "tid": tid,
                                        "args": {"name": f"host calls (thread {tid - HOST_TID0 + 1})"}}))
                te, tr = row["t_enqueue_ns"], row["t_return_ns"]
                kind = row["kind"]
                if kind == "sync":
                    counts["syncs"] += 1
                    chunk.append(dumps({"ph": "X", "name": row["api"] or "synchronize", "cat": "sync", "pid": r,
                                        "tid": TID_SYNC, "ts": _us(te - t0), "dur": _us(max((tr or te) - te, 0)),
                                        "args": _args(row, ("inflight", "site", "step", "api"))}))
                    continue
                if kind == "hazard":
                    counts["hazards"] += 1
                    chunk.append(dumps({"ph": "i", "s": "t", "name": f"hazard: {row['api'] or row['detail'] or ''}",
                                        "cat": "hazard", "pid": r, "tid": TID_HAZARDS, "ts": _us(te - t0),
                                        "args": _args(row, ("op", "site", "detail", "api"))}))
                    continue
                counts["ops"] += 1
                name = row["op"] or "op"
                args = _args(row, _OP_ARGS)
                # The call itself (host-blocked part). A 1 ns floor keeps flow events bindable.
                ts = _us(te - t0)
                chunk.append(dumps({"ph": "X", "name": name, "cat": "call", "pid": r, "tid": tid, "ts": ts,
                                    "dur": _us(max((tr if tr is not None else te) - te, 1)), "args": args}))
                if row["copies"] and row["copies"] > 1:
                    n, k = row["copies"], row["copy_no"]
                    ph = "s" if k == 1 else ("f" if k == n else "t")
                    ev = {"ph": ph, "name": f"{name} pg {row['pg']} seq {row['seq']}", "cat": "match",
                          "id": int(row["ckey"]), "pid": r, "tid": tid, "ts": ts}
                    if ph != "s":
                        ev["bp"] = "e"
                    chunk.append(dumps(ev))
                    counts["flows"] += 1
                if row["t_end_ns"] is not None:
                    counts["inflight"] += 1
                    aid = f"r{r}.{row['op_id'] if row['op_id'] is not None else counts['ops']}"
                    chunk.append(dumps({"ph": "b", "name": name, "cat": "inflight", "id": aid, "pid": r, "tid": tid,
                                        "ts": ts, "args": _args(row, ("pg", "seq", "bytes", "site"))}))
                    chunk.append(dumps({"ph": "e", "name": name, "cat": "inflight", "id": aid, "pid": r, "tid": tid,
                                        "ts": _us(max(row["t_end_ns"], te) - t0)}))
                if row["t_wait_ns"] is not None and row["t_wait_end_ns"] is not None:
                    counts["waits"] += 1
                    chunk.append(dumps({"ph": "X", "name": f"wait({name})", "cat": "wait", "pid": r,
                                        "tid": TID_WAITS, "ts": _us(row["t_wait_ns"] - t0),
                                        "dur": _us(max(row["t_wait_end_ns"] - row["t_wait_ns"], 0)),
                                        "args": _args(row, ("pg", "seq", "op_id", "site"))}))
            emit(chunk)
        fchunk = []
        for fd in run.findings():
            t = fd.t_ns if fd.t_ns is not None else run.t_min_ns
            if t is None:
                continue
            ev = {"ph": "i", "name": fd.kind, "cat": f"finding,{fd.severity}", "ts": _us(t - t0),
                  "args": {"severity": fd.severity, "message": fd.message, "pg": fd.pg, "seq": fd.seq,
                           "op": fd.op, "site": fd.site, "evidence": fd.evidence}}
            if fd.rank is not None and fd.rank in run.ranks:
                ev.update({"s": "p", "pid": fd.rank, "tid": TID_FINDINGS})
            else:
                ev.update({"s": "g", "pid": run.ranks[0] if run.ranks else 0, "tid": TID_FINDINGS})
            fchunk.append(dumps(ev))
        counts["findings"] = len(fchunk)
        emit(fchunk)
        f.write("\n]}\n")
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e}") from None
    finally:
        f.close()
    return counts


def op_table_sql(run) -> str:
    """SQL of the analysed per-op table: every op row (aligned, with `step`, `blocked_ns`,
    `inflight_ns`), its wait state in its collective (`wait_ns`, `completion_wait_ns`,
    metrics.md "Wait states"), its matched collective's figures (`coll_n_ranks`,
    `coll_t_comm_ns`, `coll_busbw_gbps`, `coll_algbw_gbps`, `coll_arrival_skew_ns`,
    `coll_last_rank`, `coll_complete`) and, for send/recv, the matched pair's
    `late_sender_ns` / `late_receiver_ns`."""
    t = run._t
    c = run._ensure_coll()
    w = run._ensure_waits()
    lazy = run._ensure_lazy()
    return f"""
        WITH p2p AS (
            SELECT pg, rank, op, peer, op_id, t_enqueue_ns,
                   row_number() OVER (PARTITION BY pg, op, rank, peer ORDER BY t_enqueue_ns, op_id) AS pair_seq
            FROM {t} WHERE ckey IS NULL AND peer IS NOT NULL AND peer >= 0 AND kind = 'op' AND op IN ('send', 'recv'))
        SELECT q.rank, q.step, q.op, x.api, q.pg, q.pg_size, q.seq, q.op_id, q.async_op, x.backend, q.dtype, q.count,
               q.bytes, q.out_bytes, q.peer, q.root,
               q.t_enqueue_ns, q.t_return_ns, x.t_start_ns - coalesce(o.off, 0) AS t_start_ns, q.t_end_ns,
               q.t_wait_ns, q.t_wait_end_ns,
               (q.t_return_ns - q.t_enqueue_ns) + coalesce(q.t_wait_end_ns - q.t_wait_ns, 0) AS blocked_ns,
               q.t_end_ns - q.t_enqueue_ns AS inflight_ns, q.stream_wait_ns,
               w.wait_ns, w.completion_wait_ns,
               c.n_ranks AS coll_n_ranks, c.complete AS coll_complete, c.t_comm_ns AS coll_t_comm_ns,
               c.algbw_gbps AS coll_algbw_gbps, c.busbw_gbps AS coll_busbw_gbps,
               c.arrival_skew_ns AS coll_arrival_skew_ns, c.last_rank AS coll_last_rank,
               pp.late_sender_ns, pp.late_receiver_ns,
               q.first_on_pg, x.thread, q.site, q.error
        FROM {t} q
        LEFT JOIN {lazy} x ON x.rid = q.rid
        LEFT JOIN offsets o ON o.rank = q.rank
        LEFT JOIN {c} c ON c.ckey = q.ckey
        LEFT JOIN {w} w ON w.ckey = q.ckey AND w.rank = q.rank
        LEFT JOIN p2p s ON s.rank = q.rank AND s.op_id IS NOT DISTINCT FROM q.op_id AND s.t_enqueue_ns = q.t_enqueue_ns
                       AND s.pg = q.pg AND s.op = q.op
        LEFT JOIN {run._ensure_p2p()} pp ON pp.pg = s.pg AND pp.pair_seq = s.pair_seq
              AND pp.src = CASE WHEN s.op = 'send' THEN s.rank ELSE s.peer END
              AND pp.dst = CASE WHEN s.op = 'send' THEN s.peer ELSE s.rank END
        WHERE q.kind = 'op'
        ORDER BY q.rank, q.t_enqueue_ns"""


def write_table(run, path: str, fmt: str) -> int:
    """Write the analysed per-op table (:func:`op_table_sql`) to `path` as ``csv`` or
    ``parquet``, streaming record batches; ``.gz`` compresses CSV. Returns the row count."""
    import pyarrow as pa

    if fmt not in ("csv", "parquet"):
        raise UsageError(f"unknown table format {fmt!r} (csv or parquet)")
    n = 0
    writer = None
    sink = None
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        batches = _batches(run, op_table_sql(run))
        if fmt == "parquet":
            import pyarrow.parquet as pq
            for b in batches:
                if writer is None:
                    writer = pq.ParquetWriter(path, b.schema, compression="zstd")
                writer.write_batch(b)
                n += b.num_rows
            if writer is None:  # no ops: still a valid, empty file with the schema
                tbl = run._arrow(op_table_sql(run) + " LIMIT 0")
                pq.write_table(tbl, path)
        else:
            import pyarrow.csv as pc
            sink = pa.CompressedOutputStream(path, "gzip") if path.endswith(".gz") else pa.OSFile(path, "wb")
            for b in batches:
                if writer is None:
                    writer = pc.CSVWriter(sink, b.schema)
                writer.write_batch(b)
                n += b.num_rows
            if writer is None:
                pc.write_csv(run._arrow(op_table_sql(run) + " LIMIT 0"), sink)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e}") from None
    finally:
        if writer is not None:
            writer.close()
        if sink is not None:
            sink.close()
    return n


def export(run, path: str, fmt: str) -> dict:
    """Export `run` to `path` in `fmt` (one of :data:`FORMATS`); returns what was written."""
    if fmt == "perfetto":
        return write_perfetto(run, path)
    if fmt in ("csv", "parquet"):
        return {"rows": write_table(run, path, fmt)}
    raise UsageError(f"unknown export format {fmt!r} (one of {', '.join(FORMATS)})")


__all__ = ["export", "write_perfetto", "write_table", "op_table_sql", "FORMATS"]
