"""Property tests (issue 6, hypothesis):

* what the recorder writes is what the reader reads, for any sequence of rows and flushes;
* the analysis never crashes on any table that fits the schema, including empty tables, one
  rank, and all-null times.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile

import duckdb
import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rich.console import Console

import commtrace
from commtrace.capture import recorder as R
from commtrace.cli.report import render
from commtrace.config import Config
from commtrace.ops import CANONICAL_OPS
from commtrace.format import reader as RD
from commtrace.format import schema as S
from commtrace.format import writer as W

I32 = st.integers(-2**31, 2**31 - 1)
I64 = st.integers(-2**63, 2**63 - 1)
TEXT = st.text(max_size=12)


def _value(field: pa.Field):
    t = field.type
    if t == pa.int32():
        v = I32
    elif t == pa.int64():
        v = I64
    elif t == pa.bool_():
        v = st.booleans()
    elif t == pa.string():
        v = TEXT
    else:  # list<int64>
        v = st.lists(I64, max_size=4)
    return st.none() | v


# Rows as the capture side builds them: schema-ordered lists; kind and rank are not null.
ROW = st.fixed_dictionaries({f.name: _value(f) for f in S.SCHEMA
                             if f.name not in ("kind", "rank", "op_id")})
KINDS = st.sampled_from([S.KIND_OP, S.KIND_SYNC, S.KIND_MARK, S.KIND_HAZARD])


@st.composite
def batches(draw):
    """Rows split into flushes (each non-empty batch becomes one part)."""
    n = draw(st.integers(0, 3))
    return [draw(st.lists(st.tuples(KINDS, ROW), max_size=12)) for _ in range(n)]


SETTINGS = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(batches())
def test_recorder_rows_equal_reader_rows(parts):
    d = tempfile.mkdtemp(prefix="ct-prop-")
    try:
        rec = R.Recorder(Config(output=d, flush_interval=60), rank=3, world_size=4, start_thread=False)
        written = []
        for batch in parts:
            for kind, fields in batch:
                row = [None] * R.NCOL
                for name, v in fields.items():
                    row[R.IDX[name]] = v
                row[R.I_KIND], row[R.I_RANK] = kind, 3
                row[R.I_OP_ID] = rec.new_op_id()  # unique per rank, as the capture side makes it
                rec.append_row(row)
                written.append(row)
            rec.flush()
        rec.close()
        assert rec._dropped == 0
        if not written:
            assert not any(f.endswith(".parquet") for _, _, fs in os.walk(d) for f in fs)
            return
        rf = RD.scan_run(d)
        assert rf.num_rows == len(written) and not [w for w in rf.warnings if "skipped" in w]
        con = duckdb.connect()
        RD.load_into_duckdb(con, rf)
        cols = ", ".join(f'"{c}"' for c in S.COLUMNS)
        got = con.execute(f"SELECT {cols} FROM raw ORDER BY op_id").fetchall()
        # every row once, value for value: the _inflight.json snapshot merged in adds nothing
        # (its ops have rows in the parts)
        assert [list(r) for r in got] == written
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- analysis on any table

SMALL = st.integers(0, 5)
TIME = st.none() | st.integers(0, 10**9)


@st.composite
def analysis_rows(draw, rank):
    kind = draw(st.sampled_from([S.KIND_OP] * 4 + [S.KIND_SYNC, S.KIND_MARK, S.KIND_HAZARD]))
    op = draw(st.none() | st.sampled_from(CANONICAL_OPS))
    return {
        "kind": kind, "rank": rank, "pg": draw(st.none() | st.sampled_from(["0", "1"])),
        "pg_size": draw(st.none() | st.integers(0, 4)), "seq": draw(st.none() | SMALL),
        "op": op, "api": op, "async_op": draw(st.none() | st.booleans()),
        "count": draw(st.none() | st.integers(0, 1 << 20)),
        "bytes": draw(st.none() | st.integers(0, 1 << 30)),
        "out_bytes": draw(st.none() | st.integers(0, 1 << 30)),
        "peer": draw(st.none() | st.integers(-1, 4)), "root": draw(st.none() | st.integers(-1, 4)),
        "t_enqueue_ns": draw(TIME), "t_return_ns": draw(TIME), "t_start_ns": draw(TIME),
        "t_end_ns": draw(TIME), "t_wait_ns": draw(TIME), "t_wait_end_ns": draw(TIME),
        "step": draw(st.none() | SMALL), "site": draw(st.none() | st.sampled_from(["a.py:1", "b.py:2"])),
        "error": draw(st.none() | st.just("RuntimeError: x")),
        "op_id": draw(st.none() | st.integers(0, 30)), "ref_op_id": draw(st.none() | st.integers(0, 30)),
        "inflight": draw(st.none() | SMALL), "first_on_pg": draw(st.none() | st.booleans()),
        "stream_wait_ns": draw(st.none() | st.integers(0, 10**6)),
        "detail": draw(st.none() | st.sampled_from(['{"ddp_bucket": 0}', "optimizer.step", "not json {"])),
    }


@st.composite
def runs(draw):
    nranks = draw(st.integers(1, 3))
    all_null_times = draw(st.booleans())
    out = {}
    for r in range(nranks):
        rows = draw(st.lists(analysis_rows(r), max_size=15))
        if all_null_times:
            for row in rows:
                for c in ("t_enqueue_ns", "t_return_ns", "t_start_ns", "t_end_ns", "t_wait_ns", "t_wait_end_ns"):
                    row[c] = None
        out[r] = rows
    offsets = draw(st.lists(st.none() | st.integers(-10**6, 10**6), min_size=nranks, max_size=nranks))
    # the rank's _inflight.json: none, or (final, t_ns, a pending op or not)
    snaps = draw(st.lists(st.none() | st.tuples(st.booleans(), TIME, st.booleans()),
                          min_size=nranks, max_size=nranks))
    return out, offsets, draw(st.booleans()), snaps


_NULL_OP = {c: None for c in S.COLUMNS} | {"kind": "op", "rank": 0, "op": "all_reduce", "pg": "0", "seq": 0}


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(runs())
@example(({0: []}, [None], False, [None]))                                 # an empty table
@example(({0: [dict(_NULL_OP)], 1: [dict(_NULL_OP, rank=1)]}, [None, 5], True, [None, None]))  # all-null times
@example(({0: [dict(_NULL_OP, t_enqueue_ns=1, t_end_ns=2)]}, [0], True, [None]))       # one rank
@example(({0: [dict(_NULL_OP, t_enqueue_ns=1, t_end_ns=2)], 1: [dict(_NULL_OP, rank=1)]},
          [None, None], True, [(True, 10**9, False), (False, None, True)]))  # a killed rank, null times
@example(({0: [dict(_NULL_OP, op=None, pg=None, seq=None),                  # only a wait() interval,
               dict(_NULL_OP, op=None, pg=None, seq=None, t_wait_ns=2, t_wait_end_ns=0)]},  # inverted,
          [None], False, [None]))  # beyond the run's t_max_ns: the overlap ranked it past the last rank
@example(({0: [], 1: [dict(_NULL_OP, rank=1, pg="1", pg_size=2, t_enqueue_ns=5, t_end_ns=6)]},
          [None, None], False, [(False, 0, False), None]))   # killed before its first op
def test_analysis_never_crashes(spec):
    per_rank, offsets, manifest, snaps = spec
    d = tempfile.mkdtemp(prefix="ct-prop-an-")
    try:
        if manifest:
            W.write_manifest(d, {"world_size": len(per_rank), "schema_version": S.SCHEMA_VERSION})
        for r, rows in per_rank.items():
            cols = {c: [row.get(c) for row in rows] for c in S.COLUMNS}
            meta = {"schema_version": S.SCHEMA_VERSION, "rank": r, "world_size": len(per_rank)}
            if offsets[r] is not None:
                meta["clock_offset_ns"] = offsets[r]
            W.write_part(d, r, W.rows_to_table(cols), meta, pid=1000 + r)
            if snaps[r] is not None:
                final, t_ns, pending = snaps[r]
                ops = [{"kind": "op", "rank": r, "pg": "0", "seq": 9, "op": "all_reduce",
                        "op_id": 99, "t_enqueue_ns": t_ns, "pending": True}] if pending else []
                W.atomic_write_text(os.path.join(W.rank_dir(d, r), S.INFLIGHT_NAME), json.dumps(
                    {"rank": r, "t_ns": t_ns, "final": final, "ops": ops}))
        run = commtrace.load(d)
        rep = run.report()
        with_ops = {r for r, rows in per_rank.items() if any(row["kind"] == "op" for row in rows)}
        assert with_ops <= set(rep["ranks"]) <= set(per_rank)
        # every op row, plus each snapshot's pending op (op_id 99 has no row in the parts)
        n_pending = sum(1 for sn in snaps if sn is not None and sn[2])
        assert rep["ops"] == n_pending + sum(1 for rows in per_rank.values() for row in rows
                                             if row["kind"] == "op")
        # ended_early: only ranks whose snapshot says they did not exit through commtrace,
        # among the report's ranks or, killed before their first op (no op row, so not in
        # "ranks"), the run's other ranks (report.ended_early: the killed and crashed states
        # join the candidates; tests/test_partial_runs.py)
        killed = {r for r, sn in enumerate(snaps) if sn is not None and sn[0] is False}
        listed = {e["rank"] for e in rep["ended_early"]}
        assert listed <= killed
        assert listed <= set(rep["ranks"]) | (set(per_rank) - with_ops)
        for e in rep["ended_early"]:
            assert e["final_flush"] is False and e["signals"][0] == "no_final_flush"
            assert e["reason"].startswith("no exit flush") and len(e["signals"]) >= 2
        json.dumps(rep)  # the --format json output
        render(rep, console=Console(file=io.StringIO(), width=100))  # the text report
        run.findings()
        run.per_step()
        run.p2p()
        run.waits()
        if run.t_min_ns is not None and run.t_max_ns is not None:
            run.timeline_bins(run.t_min_ns, run.t_max_ns + 1, 8)
        run.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
