"""The writer's typed column buffers (issue 20): the C fast path's calls are drained as int64 /
int32 buffers plus tables of their distinct objects (``_fastpath.drain_records``) and turned
into Arrow arrays over whole columns with numpy, instead of a Python object per row and field.
The arrays must equal the ones the list path (``drain_columns`` + ``expand_columns`` +
``rows_to_table_nopandas``) builds from the same calls, on a real 2-rank gloo job; parts
written through either path hold the same rows; small parts are written uncompressed and
large ones compress every column that has a value, with the values unchanged."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from commtrace.capture import recorder as R
from commtrace.format import writer as W
from conftest import ROOT, run_job_results

needs_c = pytest.mark.skipif(R._cfast is None, reason="the C fast path is not built here "
                             "(no compiler, or COMMTRACE_PURE_PYTHON=1)")

SCRIPT = os.path.join(ROOT, "tests", "scripts", "writer_buffers.py")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return run_job_results(tmp_path_factory, "buffers", SCRIPT)


@needs_c
def test_c_built_columns_equal_the_list_built_ones_on_a_2_rank_gloo_job(job):
    _, res = job
    for r in (0, 1):
        got = res[r]
        assert got["c"] is True
        # 5 phases of 9 calls on the C path (send on rank 0, recv on rank 1; barrier takes
        # the Python path)
        assert got["n"] == 45, got["n"]
        assert got["diff"] == [] and got["equal"] is True
        rows = got["rows"]
        # the planted calls, with the values the trace format promises
        assert {x["op"] for x in rows} == {"all_reduce", "broadcast", "reduce", "all_gather",
                                           "reduce_scatter", "all_to_all",
                                           "send" if r == 0 else "recv"}
        # mark_step(k) ends each phase: a phase's calls carry the step marked before it
        assert sorted({x["step"] for x in rows}) == [2, 10, 11, 12, 13]
        f16 = [x for x in rows if x["dtype"] == "float16"]
        assert len(f16) == 5 and all(x["count"] == 5 and x["bytes"] == 10 for x in f16)
        i64 = [x for x in rows if x["dtype"] == "int64"]
        assert len(i64) == 5 and all(x["bytes"] == 24 and x["pg"] != "0" for x in i64)
        bc = [x for x in rows if x["op"] == "broadcast"]
        assert len(bc) == 5 and all(x["root"] == 1 for x in bc)
        p2p = [x for x in rows if x["op"] in ("send", "recv")]
        assert len(p2p) == 5 and all(x["peer"] == 1 - r for x in p2p)
        assert all(x["completion"] == "return" and x["t_end_ns"] == x["t_return_ns"]
                   and x["t_return_ns"] >= x["t_enqueue_ns"] and x["async_op"] is False
                   and x["site"].endswith(".py:" + x["site"].rsplit(":", 1)[1])
                   and x["rank"] == r and x["kind"] == "op" for x in rows)
        assert len({x["op_id"] for x in rows}) == 45


@needs_c
def test_parts_written_through_either_path_hold_the_same_rows(job):
    _, res = job
    volatile = {"t_enqueue_ns", "t_return_ns", "t_end_ns", "op_id", "seq", "step"}
    for r in (0, 1):
        d = os.path.join(res[r]["run_dir"], f"rank={r}")
        parts = sorted((p for p in os.listdir(d) if p.endswith(".parquet")),
                       key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0]))
        lists, buffers = (pq.read_table(os.path.join(d, p)) for p in parts[-2:])
        assert lists.schema.equals(buffers.schema) and lists.num_rows == buffers.num_rows == 11  # + barrier, mark

        def strip(t):
            return [{k: v for k, v in x.items() if k not in volatile} for x in t.to_pylist()]

        assert strip(lists) == strip(buffers)
        # the second phase's calls carry the step the first one marked
        assert set(buffers.filter(pa.compute.equal(buffers["kind"], "op"))["step"].to_pylist()) == {100}
        # seq goes on counting from one part to the next, per group
        assert lists["seq"].to_pylist() != buffers["seq"].to_pylist()


def test_small_parts_are_uncompressed_large_ones_zstd_but_all_null_columns(tmp_path):
    def table(n):
        return W.rows_to_table_nopandas({
            "kind": ["op"] * n, "rank": [1] * n, "seq": list(range(n)),
            "site": [f"train.py:{i % 3}" for i in range(n)],
            "count": [256] * n, "completion": ["return"] * n,
            "inflight_ids": [[i, i + 1] if i % 2 else None for i in range(n)]})

    # from ZSTD_MIN_ROWS rows the columns with a value, but below ZSTD_ALL_ROWS not the labels
    # and delta-packed counters (LEAN_COLUMNS: kind, rank, seq here) nor the LEAN_IF_ONE_VALUE
    # columns that hold one value (count, completion here; the site has three)
    assert {"kind", "rank", "seq"} <= W.LEAN_COLUMNS and "site" not in W.LEAN_COLUMNS
    assert {"count", "completion", "site"} <= W.LEAN_IF_ONE_VALUE
    mid = {"site", "inflight_ids.list.element"}
    for n, zstd in ((10, set()), (W.ZSTD_MIN_ROWS - 1, set()),
                    (W.ZSTD_MIN_ROWS, mid), (W.ZSTD_ALL_ROWS - 1, mid),
                    (W.ZSTD_ALL_ROWS, mid | {"kind", "rank", "seq", "count", "completion"})):
        t = table(n)
        p = W.write_part(str(tmp_path), 0, t, {"rank": 0}, index=n,
                         compression=W.part_compression(t))
        md = pq.ParquetFile(p).metadata.row_group(0)
        codecs = {md.column(i).path_in_schema: md.column(i).compression
                  for i in range(md.num_columns)}
        assert {c for c, k in codecs.items() if k == "ZSTD"} == zstd, n
        assert set(codecs.values()) <= {"ZSTD", "UNCOMPRESSED"}
        back = pq.read_table(p)
        assert back.schema.remove_metadata().equals(t.schema) and back.equals(
            t.replace_schema_metadata(back.schema.metadata))


def test_one_value_columns_of_mid_size_parts():
    """LEAN_IF_ONE_VALUE columns go uncompressed below ZSTD_ALL_ROWS rows only when every row
    holds the same value (nulls counted as a value); a second value anywhere, or a null
    among values, keeps zstd."""
    n = W.ZSTD_MIN_ROWS

    def codec(vals, name="count"):
        t = W.rows_to_table_nopandas({"kind": ["op"] * n, name: vals})
        return W.part_compression(t)[name]

    assert codec([256] * n) == "none"
    assert codec([256] * (n - 1) + [512]) == "zstd"
    assert codec([512] + [256] * (n - 1)) == "zstd"
    assert codec([256] * (n - 1) + [None]) == "zstd"
    assert codec([None] * n) == "none"   # null throughout: never compressed
    assert codec(["a.py:3"] * n, "site") == "none"
    assert codec(["a.py:3"] * (n // 2) + ["a.py:4"] * (n - n // 2), "site") == "zstd"
    assert W._one_value(pa.chunked_array([[1, 1], [1]])) is False   # several chunks: not looked at


def test_lean_codecs_off_compresses_every_column_with_a_value(monkeypatch):
    """LEAN_CODECS = False: the rule up to session 15, every non-null column zstd from
    ZSTD_MIN_ROWS rows; "s16": session 16's rule, LEAN_COLUMNS only (the one-valued count
    still compressed) (benchmarks/writer_sparse.py and writer_soak.py --ab compare them)."""
    n = W.ZSTD_MIN_ROWS
    t = W.rows_to_table_nopandas({"kind": ["op"] * n, "rank": [1] * n, "seq": list(range(n)),
                                  "site": [f"train.py:{i % 3}" for i in range(n)],
                                  "count": [1] * n})
    lean = W.part_compression(t)
    monkeypatch.setattr(W, "LEAN_CODECS", "s16")
    s16 = W.part_compression(t)
    monkeypatch.setattr(W, "LEAN_CODECS", False)
    full = W.part_compression(t)
    assert {c for c, k in full.items() if k == "zstd"} == {"kind", "rank", "seq", "site", "count"}
    assert {c for c, k in s16.items() if k == "zstd"} == {"site", "count"}
    assert {c for c, k in lean.items() if k == "zstd"} == {"site"}
    assert set(full) == set(lean) == set(s16) and len(full) == t.num_columns


def test_arrays_of_records_handle_nulls_and_unknown_dtypes():
    """Null fields (-2^63 in the buffers, -1 codes), a dtype given by name (bytes unknown) and
    an api that is empty (the wrapper's then) come out as the list path writes them."""
    import numpy as np

    R.FAST_SPECS.append(("all_reduce", "all_reduce", True))
    R.PG_FACTS.append(("9", 2, "gloo"))
    spec, pg = len(R.FAST_SPECS) - 1, len(R.PG_FACTS) - 1
    try:
        import torch

        n = 4
        N = R._NULL_LL
        nums = np.array([[0, N, 5, 7], [N, 1, N, N], [N, N, 0, N], [10, 20, 30, 40],
                         [N, 1, 1, 2], [1, 2, 3, 4], [8, N, 8, 8], [N, N, 99, N],
                         [15, N, 35, 45], [77, 77, 77, 77]], dtype=np.int64)
        codes = np.array([[spec] * n, [pg] * n, [0, -1, 1, 0], [-1, 0, 1, -1],
                          [-1, -1, 0, -1], [0, 1, -1, 2], [0, 0, -1, 1]], dtype=np.int32)
        tables = ([("a.py", 3), ("b.py", 9)], ["", "all_reduce_coalesced"], ['{"b": 1}'],
                  [torch.float32, "bfloat16", torch.int8], ["cpu", "cuda:1"])
        d = (n, nums.tobytes(), codes.tobytes(), tables)
        got = W.table_of_arrays(R.arrays_of_records(3, d))
        got.validate(full=True)
        cols = R.expand_columns(3, R.columns_of_records(d))
        cols[R.I_SITE] = [R.format_site(v) for v in cols[R.I_SITE]]
        want = W.rows_to_table_nopandas({c: cols[i] for i, c in enumerate(R.COLUMNS)})
        assert [c for c in R.COLUMNS if not got[c].equals(want[c])] == []
        assert got["bytes"].to_pylist() == [32, None, None, 8]
        assert got["out_bytes"].to_pylist() == [32, None, 99, 8]
        assert got["api"].to_pylist() == ["all_reduce", "all_reduce", "all_reduce_coalesced",
                                           "all_reduce"]
        assert got["site"].to_pylist() == ["a.py:3", None, "b.py:9", "a.py:3"]
        assert got["first_on_pg"].to_pylist() == [True, None, False, False]
        assert got["completion"].to_pylist() == ["return", None, "return", "return"]
        assert got["peer"].type == pa.int32() and got["peer"].to_pylist() == [None, 1, None, None]
    finally:
        R.FAST_SPECS.pop()
        R.PG_FACTS.pop()


@needs_c
def test_async_rows_waiting_in_the_write_queue_are_not_tracked_by_the_gc(tmp_path):
    """The C path's async rows hold only atomic values: untracked, the rows queued between two
    flushes are not visited by the cyclic GC (benchmarks/async_gc.py). Their values are the
    equality tests' (tests/test_capture_async_c.py)."""
    import subprocess
    import sys
    import textwrap

    from conftest import free_ports

    code = textwrap.dedent('''
        import gc, sys, torch, torch.distributed as dist, commtrace
        from commtrace.capture import recorder as R
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2],
                                rank=0, world_size=1)
        commtrace.enable(sys.argv[1], flush_interval=3600)
        rec = R.get_recorder()
        t = torch.ones(16)
        with rec._write_lock:
            rec.flush()
            for _ in range(300):
                dist.all_reduce(t, async_op=True).wait()
            rows = [r for r in rec._ready if isinstance(r, list) and r[R.I_ASYNC]]
            R._cfast.set_untrack_rows(False)
            dist.all_reduce(t, async_op=True).wait()
            R._cfast.set_untrack_rows(True)
            last = [r for r in rec._ready if isinstance(r, list) and r[R.I_ASYNC]][-1]
            print(len(rows), sum(gc.is_tracked(r) for r in rows), gc.is_tracked(last),
                  sorted({r[R.I_COMPLETION] for r in rows}))
        commtrace.disable()
        dist.destroy_process_group()
    ''')
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(free_ports(1)[0])],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    n, tracked, last, how = p.stdout.split(maxsplit=3)
    # (the first sighting of the call takes the Python path)
    assert int(n) >= 290 and int(tracked) <= 300 - 290
    assert last == "True"    # the switch works: the comparison in async_gc.py is real
    assert set(eval(how)) <= {"callback", "observed", "wait"}


ASYNC_SCRIPT = os.path.join(ROOT, "tests", "scripts", "writer_async_buffers.py")


@pytest.fixture(scope="module")
def async_job(tmp_path_factory):
    return run_job_results(tmp_path_factory, "async_buffers", ASYNC_SCRIPT)


@needs_c
def test_queued_async_rows_packed_equal_the_list_built_ones_on_a_2_rank_gloo_job(async_job):
    """Every write of a real 2-rank gloo job with async collectives + waits (of the C async
    path), one op never waited and one in flight across a flush: the rows' arrays built from
    pack_rows' typed buffers equal the list path's, and the guarantees hold (the op in flight
    is listed in _inflight.json and written once it completed, with its completion time)."""
    _, res = async_job
    for r in (0, 1):
        got = res[r]
        assert got["c"] is True
        on, n0 = got["async_counts"]
        assert on == 1 and got["async_counts_end"][1] - n0 >= 5 * 7   # the C async path
        ws = [w for w in got["writes"]]
        assert ws and all(w["packed"] and w["equal"] and w["diff"] == [] for w in ws), \
            [{k: v for k, v in w.items() if k != "rows"} for w in ws]
        rows = [x for w in ws for x in w["rows"]]
        asy = [x for x in rows if x["async_op"] is True]
        # 10 phases of 7 async ops, the op never waited and the one in flight across a flush
        assert sum(w["async"] for w in ws) == len(asy) == 72
        assert len({x["op_id"] for x in asy}) == 72
        assert {x["op"] for x in asy} == {"all_reduce", "broadcast", "all_gather",
                                         "reduce_scatter", "send" if r == 0 else "recv"}
        assert {x["dtype"] for x in asy} == {"float32", "float16", "int64"}
        assert all(x["t_end_ns"] is not None and x["t_end_ns"] >= x["t_enqueue_ns"]
                   and x["completion"] in ("callback", "observed", "wait")
                   and x["rank"] == r and x["backend"] == "gloo" for x in asy)
        waited = [x for x in asy if x["count"] not in (7, 9)]
        assert all(x["t_wait_end_ns"] >= x["t_wait_ns"] >= x["t_return_ns"] for x in waited)
        # never waited: written at the final flush, its end from the future
        never = [(i, x) for i, w in enumerate(ws) for x in w["rows"] if x["count"] == 7]
        assert len(never) == 1 and ws[never[0][0]]["final"] is True
        assert never[0][1]["t_wait_ns"] is None and never[0][1]["completion"] in ("callback",
                                                                                  "observed")
        late = [(i, x) for i, w in enumerate(ws) for x in w["rows"] if x["count"] == 9]
        assert len(late) == 1 and late[0][1]["op_id"] == got["late_id"][0]
        assert late[0][1]["t_wait_end_ns"] >= late[0][1]["t_end_ns"] or \
            late[0][1]["completion"] == "wait"
    # rank 0 flushed while its op could not complete (rank 1 joined after): listed in flight,
    # in the snapshot and the write, and written by a later write once it completed
    r0 = res[0]
    late_id = r0["late_id"][0]
    assert late_id in r0["inflight_mid"]
    mid = [i for i, w in enumerate(r0["writes"]) if late_id in w["inflight"]]
    late_at = [i for i, w in enumerate(r0["writes"]) for x in w["rows"] if x["op_id"] == late_id]
    assert mid and late_at and late_at[0] > mid[0]


@needs_c
def test_parts_with_async_rows_written_through_either_path_hold_the_same_rows(async_job):
    _, res = async_job
    for r in (0, 1):
        d = os.path.join(res[r]["run_dir"], f"rank={r}")
        parts = sorted((p for p in os.listdir(d) if p.endswith(".parquet")),
                       key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0]))
        # ROW_BUFFERS off, then on (then the final part: the op never waited)
        lists, buffers = (pq.read_table(os.path.join(d, p)) for p in parts[-3:-1])
        assert lists.schema.equals(buffers.schema)
        assert lists.num_rows == buffers.num_rows == 9   # 7 async, 1 blocking, the mark
        assert lists["async_op"].to_pylist().count(True) == 7

        def strip(t):
            return [{k: v for k, v in x.items() if not k.startswith("t_")
                     and k not in ("op_id", "seq", "step", "completion")}
                    for x in t.to_pylist()]

        assert strip(lists) == strip(buffers)


@needs_c
def test_arrays_of_rows_handle_nulls_single_values_and_values_that_do_not_fit():
    """Columns null throughout, a single value with and without nulls, a list column, a site
    pair and a site string come out as the list path writes them; a value of another type
    (a bool in an integer column, an int32 column out of range, a number in a bool column)
    sends the rows to the list path (None)."""
    base = dict.fromkeys(R.COLUMNS)
    base.update(kind="op", rank=1, pg="0", pg_size=2, op="all_reduce", api="all_reduce",
                async_op=True, backend="gloo", device="cpu", dtype="float32", count=4,
                bytes=16, out_bytes=16, t_enqueue_ns=10, t_return_ns=20, step=3,
                site=("a.py", 3), op_id=7, thread=123, completion="callback")
    rows = []
    for i in range(5):
        r = dict(base, seq=i, op_id=7 + i, t_end_ns=30 + i if i != 2 else None)
        if i == 1:
            r.update(site="b.py:9", inflight_ids=[1, 2], error="RuntimeError: x", dtype=None,
                     first_on_pg=True, completion=None)
        if i == 3:
            r.update(kind="gap", pg=None, async_op=None, first_on_pg=False, peer=1)
        rows.append([r[c] for c in R.COLUMNS])

    def lists(rs):
        cols = [list(col) for col in zip(*rs)]
        cols[R.I_SITE] = [R.format_site(v) for v in cols[R.I_SITE]]
        return W.rows_to_table_nopandas({c: cols[i] for i, c in enumerate(R.COLUMNS)})

    got = W.table_of_arrays(R.arrays_of_rows(1, rows))
    got.validate(full=True)
    want = lists(rows)
    assert [c for c in R.COLUMNS if not got[c].equals(want[c])] == []
    assert got["site"].to_pylist() == ["a.py:3", "b.py:9", "a.py:3", "a.py:3", "a.py:3"]
    assert got["inflight_ids"].to_pylist() == [None, [1, 2], None, None, None]
    assert got["t_end_ns"].to_pylist() == [30, 31, None, 33, 34]
    assert got["torch_seq"].null_count == 5 and got["rank"].to_pylist() == [1] * 5
    for col, bad in (("seq", True), ("rank", 2 ** 31), ("async_op", 1), ("count", 2 ** 64)):
        odd = [list(r) for r in rows]
        odd[4][R.IDX[col]] = bad
        assert R.arrays_of_rows(1, odd) is None, col
    # a row of another length
    assert R.arrays_of_rows(1, rows + [rows[0][:-1]]) is None


@needs_c
def test_columns_built_in_c_equal_the_numpy_built_ones():
    """``int_column`` / ``string_column`` (the columns' Arrow buffers built in C, Session 15)
    give the arrays the numpy route gives: nulls, int32 edges (out of range: the list path),
    empty and non-ASCII strings, a column null throughout, one value on every row."""
    if not hasattr(R._cfast, "string_column"):
        pytest.skip("a build of _fastpath without the column builders")
    import numpy as np

    base = dict.fromkeys(R.COLUMNS)
    base.update(kind="op", rank=1, pg="0", pg_size=2, op="all_reduce", api="all_reduce",
                async_op=True, backend="gloo", device="cpu", dtype="float32", count=4,
                t_enqueue_ns=10, step=3, site=("a.py", 3), thread=123)
    rows = []
    for i in range(300):   # 300: past pack_rows' threshold in the writer, any size works here
        r = dict(base, seq=i, op_id=7 + i, t_end_ns=None if i % 7 == 0 else 30 + i,
                 peer=[None, -2 ** 31, 2 ** 31 - 1, 0][i % 4],
                 detail=[None, "", "éü 中", '{"ddp_bucket": 1}'][i % 4],
                 error=None if i % 5 else "RuntimeError: x" * (i % 3),
                 site=("a.py", 3) if i % 2 else "b/c.py:12", bytes=-(2 ** 62) + i)
        rows.append([r[c] for c in R.COLUMNS])
    try:
        R.C_COLUMNS = False
        want = W.table_of_arrays(R.arrays_of_rows(1, rows))
        R.C_COLUMNS = True
        got = W.table_of_arrays(R.arrays_of_rows(1, rows))
    finally:
        R.C_COLUMNS = True
    got.validate(full=True)
    assert [c for c in R.COLUMNS if not got[c].equals(want[c])] == []
    assert got["detail"].to_pylist()[:4] == [None, "", "éü 中", '{"ddp_bucket": 1}']
    assert got["peer"].to_pylist()[:4] == [None, -2 ** 31, 2 ** 31 - 1, 0]
    assert got["torch_seq"].null_count == 300 and got["kind"].to_pylist() == ["op"] * 300
    for bad in (2 ** 31, -2 ** 31 - 1):   # beyond int32: the list path decides (None)
        odd = [list(r) for r in rows]
        odd[299][R.IDX["peer"]] = bad
        assert R.arrays_of_rows(1, odd) is None
    # the builders themselves
    f = R._cfast
    v = np.array([5, R._NULL_LL, -(2 ** 40)], dtype=np.int64)
    valid, nnull, data = f.int_column(v, 0, 3, 8)
    assert nnull == 1 and valid == bytes([0b101]) and \
        np.frombuffer(data, np.int64).tolist() == [5, 0, -(2 ** 40)]
    assert f.int_column(v, 0, 3, 4) is None
    assert f.int_column(v[:1].copy(), 0, 1, 4) == (None, 0, np.int32(5).tobytes())
    k = np.array([1, -1, 0, 1, 7], dtype=np.int32)   # 7: no such value, null
    valid, nnull, offs, data = f.string_column(k, 0, 5, [b"ab", b"xyz"])
    assert nnull == 2 and valid == bytes([0b01101]) and data == b"xyzabxyz"
    assert np.frombuffer(offs, np.int32).tolist() == [0, 3, 3, 5, 8, 8]
    with pytest.raises(TypeError):
        f.string_column(k, 0, 5, ["not bytes"])
    with pytest.raises(ValueError):
        f.int_column(v, 1, 3, 8)   # past the buffer


def test_codecs_and_encodings_follow_the_schema_of_each_part():
    """The per-schema plan (the last schema's column keys and encodings) is rebuilt when a part
    of another schema comes: the keys and encodings are those of the part's own columns."""
    n = W.ZSTD_MIN_ROWS
    full = W.rows_to_table_nopandas({"kind": ["op"] * n, "t_end_ns": list(range(n))})
    a = pa.table({"kind": ["op"] * n, "t_end_ns": pa.array(range(n), pa.int64())})
    b = pa.table({"step": pa.array([i // 3 for i in range(n)], pa.int64()),
                  "inflight_ids": pa.array([[i] for i in range(n)], pa.list_(pa.int64()))})
    for t in (a, b, full, a, b):
        names = t.schema.names
        assert set(W.part_compression(t)) == {
            k + ".list.element" if pa.types.is_list(t.schema.field(k).type) else k for k in names}
        kw = W.encoding_kwargs(t.schema)
        delta = [k for k in names if k in W.DELTA_COLUMNS]
        assert sorted(kw["column_encoding"]) == sorted(delta)
        assert sorted(kw["use_dictionary"]) == sorted(k for k in names if k not in delta)
        kw["use_dictionary"].append("x")   # a copy: the next call is not changed
        assert "x" not in W.encoding_kwargs(t.schema)["use_dictionary"]
    assert W.part_compression(a) == {"kind": "none", "t_end_ns": "zstd"}   # kind: LEAN_COLUMNS
    assert W.part_compression(b) == {"step": "zstd", "inflight_ids.list.element": "zstd"}


@needs_c
def test_records_batch_equals_the_numpy_route_values_and_parquet_bytes(tmp_path):
    """``records_batch`` (the drained calls as one Arrow record batch built in C, session 22)
    gives the arrays the numpy route gives (RECORDS_BATCH off), and the parts written from
    either are the same bytes: random nulls, codes outside their tables (null), an api empty
    or a number (the wrapper's / its text), a dtype by name (no bytes), one site on every row
    and several, parts below and above ZSTD_MIN_ROWS. An int32 value out of range: None, and
    arrays_of_records takes the numpy route."""
    if not hasattr(R._cfast, "records_batch"):
        pytest.skip("a build of _fastpath without records_batch")
    import numpy as np
    import torch

    R.FAST_SPECS.extend([("all_reduce", "all_reduce", True), ("send", None, False)])
    R.PG_FACTS.extend([("9", 2, "gloo"), ("1", None, None)])
    s0, p0 = len(R.FAST_SPECS) - 2, len(R.PG_FACTS) - 2
    N = R._NULL_LL
    rng = np.random.default_rng(7)
    try:
        for n, one_site in ((1, False), (7, True), (1000, False), (W.ZSTD_MIN_ROWS + 5, True),
                            (3000, False)):
            nums = rng.integers(-2 ** 40, 2 ** 40, size=(10, n))
            nums[rng.random((10, n)) < 0.2] = N
            nums[1:3] = rng.integers(-3, 3, size=(2, n))     # peer, root: int32 columns
            nums[1:3][rng.random((2, n)) < 0.3] = N
            nums[0][rng.random(n) < 0.1] = 0                 # seq 0: first_on_pg
            codes = np.stack([rng.integers(s0, s0 + 2, n), rng.integers(p0, p0 + 2, n),
                              np.zeros(n, int) if one_site else rng.integers(-1, 3, n),
                              rng.integers(-1, 3, n), rng.integers(-1, 1, n),
                              rng.integers(-1, 3, n), rng.integers(-1, 2, n)]).astype(np.int32)
            tables = ([("a.py", 3), "b/é.py:9"], ["", "all_reduce_coalesced", 5], ['{"b": 1}'],
                      [torch.float32, "bfloat16", torch.int8], ["cpu", "cuda:1"])
            d = (n, nums.astype(np.int64).tobytes(), codes.tobytes(), tables)
            batch = R.batch_of_records(3, d)
            assert batch is not None
            got = W.table_of_arrays(R.arrays_of_records(3, d))
            got.validate(full=True)
            try:
                R.RECORDS_BATCH = False
                assert R.batch_of_records(3, d) is None
                want = W.table_of_arrays(R.arrays_of_records(3, d))
            finally:
                R.RECORDS_BATCH = True
            assert [c for c in R.COLUMNS if not got[c].equals(want[c])] == [], n
            assert pa.Table.from_batches([batch]).equals(want)
            blobs = []
            for name, t in (("c", pa.Table.from_batches([batch])), ("numpy", want)):
                path = str(tmp_path / f"{name}-{n}.parquet")
                W.write_parquet(t, path, W.part_compression(t))
                blobs.append(open(path, "rb").read())
            assert blobs[0] == blobs[1], n
            if n == 1000:
                assert got["t_end_ns"].equals(got["t_return_ns"])
                assert got["api"].to_pylist().count("5") > 0
                assert got["torch_seq"].null_count == n and got["inflight_ids"].null_count == n
        nums[1][0] = 2 ** 31   # a peer beyond int32
        d = (n, nums.astype(np.int64).tobytes(), codes.tobytes(), tables)
        assert R.batch_of_records(3, d) is None
        try:
            R.RECORDS_BATCH = False
            want = W.table_of_arrays(R.arrays_of_records(3, d))
        finally:
            R.RECORDS_BATCH = True
        assert W.table_of_arrays(R.arrays_of_records(3, d)).equals(want)
    finally:
        del R.FAST_SPECS[s0:], R.PG_FACTS[p0:]
