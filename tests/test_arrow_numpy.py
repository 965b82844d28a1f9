"""Issue 18 (speed): the analysis reads Arrow columns into numpy from their buffers
(`sql.arrow_numpy`, `sql.arrow_parts`, `sql.finish`) and builds small Arrow tables from Python
lists (`sql.py_array`) instead of through pyarrow's conversions, which import pandas (0.2-0.4 s
of CPU that the report without root cause never paid), and encodes string columns in C
(`model._str_codes`, no pyarrow.compute). Each equals pyarrow's own conversion value by value,
and the report with root cause and what-if no longer imports pandas."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import commtrace
from commtrace.analysis import model as M
from commtrace.analysis import sql as Q
from commtrace.analysis.synth import synth_run


def _ref(a, fill=None, dtype=None):
    if fill is not None and a.null_count:
        a = a.fill_null(fill)
    v = a.to_numpy(zero_copy_only=False)
    return v.astype(dtype, copy=False) if dtype is not None else v


def _same(x, y):
    assert x.dtype == y.dtype
    assert x.shape == y.shape
    assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f")


def _columns():
    rng = np.random.default_rng(5)
    out = []
    for t, make in ((pa.int32(), lambda n: rng.integers(-2**31, 2**31 - 1, n)),
                    (pa.int64(), lambda n: rng.integers(-2**62, 2**62, n)),
                    (pa.uint8(), lambda n: rng.integers(0, 255, n)),
                    (pa.float64(), lambda n: rng.normal(size=n))):
        chunks = []
        for n, nulls in ((1000, 0.0), (37, 0.3), (0, 0.0), (513, 1.0), (2049, 0.01)):
            v = make(n).tolist()
            v = [None if rng.random() < nulls else x for x in v]
            chunks.append(pa.array(v, t))
        ca = pa.chunked_array(chunks, t)
        out += [ca, ca.slice(3, 2000), ca.slice(1040, 9), pa.chunked_array([], t), ca.combine_chunks().slice(5)]
        out.append(pa.chunked_array([chunks[0]], t))
    return out


@pytest.mark.parametrize("fill,dtype", [(None, None), (-1, np.int64), (None, np.float64), (7, None), (None, np.int64)])
def test_arrow_numpy_equals_pyarrow(fill, dtype):
    for a in _columns():
        if fill is not None and pa.types.is_unsigned_integer(a.type) and fill < 0:
            continue
        if fill is None and dtype is np.int64 and a.null_count:
            continue      # NaN cast to int64: undefined either way
        _same(Q.arrow_numpy(a, fill, dtype), _ref(a, fill, dtype))
        # a subset through arrow_parts + finish equals pyarrow's take
        p = Q.arrow_parts(a)
        idx = np.arange(0, len(a), 3, dtype=np.int64)
        sub = Q.finish(p[0][idx], None if p[1] is None else p[1][idx], fill=fill, dtype=dtype)
        if not (fill is None and dtype is np.int64 and a.take(pa.array(idx)).null_count):
            _same(sub, _ref(a.take(pa.array(idx)), fill, dtype))


def test_arrow_numpy_other_types_fall_back():
    a = pa.chunked_array([pa.array(["a", None, "b"])])
    assert Q.arrow_parts(a) is None
    assert Q.arrow_numpy(a, fill="z").tolist() == ["a", "z", "b"]


@pytest.mark.parametrize("t,values", [
    (pa.int64(), [1, None, -3, 2**62]), (pa.float64(), [1.5, None, float("nan"), -0.0]),
    (pa.string(), ["ab", None, "é", "", "train.py:88"]), (pa.string(), []), (pa.int64(), [None, None])])
def test_py_array_equals_pa_array(t, values):
    x = Q.py_array(values, t)
    x.validate(full=True)
    ref = pa.array(values, t)
    assert x.null_count == ref.null_count
    assert x.is_null().to_pylist() == ref.is_null().to_pylist()
    if t == pa.float64():     # (NaN != NaN in Arrow's equals)
        f = lambda v: np.array([np.nan if y is None else y for y in v.to_pylist()], float)  # noqa: E731
        assert np.array_equal(f(x), f(ref), equal_nan=True)
        assert np.array_equal(np.signbit(f(x)), np.signbit(f(ref)))
    else:
        assert x.equals(ref)


def test_rows_columns_equal_pyarrow(tmp_path):
    """The model's row columns (M._Rows.col / col_at, the dictionary codes) on a synthetic run
    equal pyarrow's conversions of the same Arrow table."""
    out = str(tmp_path / "r")
    synth_run(out, ranks=4, ops=600, straggler=[(1, 500_000)], hazards=True, seed=3, parts_per_rank=2)
    run = commtrace.load(out)
    t = run.arrow(f"SELECT {', '.join(M.ROW_COLUMNS + M.P2P_COLUMNS)}, rid AS orid, ckey FROM {run.table('ops')} WHERE kind = 'op'")
    rows = M._Rows(t)
    perm = rows.perm if rows.perm is not None else np.arange(t.num_rows)
    NUL = np.iinfo(np.int64).min
    idx = np.arange(0, t.num_rows, 5)
    for name, fill in (("rank", None), ("t_enqueue_ns", NUL), ("t_wait_ns", NUL), ("step", -1), ("ckey", -1),
                       ("peer", -1), ("op_id", np.iinfo(np.int64).max), ("orid", None)):
        _same(rows.col(name, fill=fill, dtype=np.int64), _ref(t.column(name), fill, np.int64)[perm])
        _same(rows.col_at(name, idx, fill=fill, dtype=np.int64), _ref(t.column(name), fill, np.int64)[perm][idx])
    _same(rows.col_at("bytes", idx, dtype=np.float64), _ref(t.column("bytes"), None, np.float64)[perm][idx])
    for name in ("op", "pg", "site"):
        d = t.column(name).combine_chunks().dictionary_encode()
        _same(rows.codes(name), d.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)[perm])
        # the model's row labels (dict_values: codes in row order, values with "" for null)
        codes, values = rows.dict_values(name)
        labels = [t.column(name)[int(perm[i])].as_py() for i in idx]
        for c, lab in zip(codes[idx].tolist(), labels):
            assert (c == -1) == (lab is None)
            assert values[c] == (lab if lab is not None else "")


def test_rows_read_batch_by_batch_equal_the_whole_table(tmp_path):
    """The model reads its rows as a stream of small batches (Run.arrow_batches, each freed
    before the next): the same columns, permutation, codes and labels as from the whole table,
    with nulls in some batches only and values first met in a later batch; `take` hands the
    column over and drops it, `col` and `col_at` keep it."""
    out = str(tmp_path / "r")
    synth_run(out, ranks=4, ops=600, straggler=[(1, 500_000)], hazards=True, seed=3, parts_per_rank=2)
    run = commtrace.load(out)
    q = f"SELECT {', '.join(M.ROW_COLUMNS + M.P2P_COLUMNS)}, rid AS orid, ckey FROM {run.table('ops')} WHERE kind = 'op'"
    t = run.arrow(q)
    n = t.num_rows
    # the table's rows in a shuffled order, as small batches (7 rows: many of them)
    perm0 = np.random.default_rng(1).permutation(n)
    ts = t.take(Q.np_array(perm0))
    whole = M._Rows(ts)
    batches = M._Rows(pa.RecordBatchReader.from_batches(ts.schema, ts.to_batches(max_chunksize=7)), n)
    assert sum(b.num_rows for b in ts.to_batches(max_chunksize=7)) == n and n > 100
    assert np.array_equal(whole.perm, batches.perm)
    NUL = np.iinfo(np.int64).min
    for name, fill in (("rank", None), ("t_enqueue_ns", NUL), ("t_wait_ns", NUL), ("step", -1), ("ckey", -1),
                       ("peer", -1), ("orid", None)):
        ref = _ref(ts.column(name), fill, np.int64)[whole.perm]
        _same(batches.col(name, fill=fill, dtype=np.int64), ref)
        _same(batches.col_at(name, np.arange(0, n, 3), fill=fill, dtype=np.int64), ref[::3])
    _same(batches.col("bytes", dtype=np.float64), _ref(ts.column("bytes"), None, np.float64)[whole.perm])
    for name in ("op", "pg", "site"):
        c1, v1 = whole.dict_values(name)
        c2, v2 = batches.dict_values(name)
        assert [v1[c] for c in c1] == [v2[c] for c in c2]
        labels = [x if x is not None else "" for x in ts.column(name).take(Q.np_array(whole.perm)).to_pylist()]
        assert [v2[c] for c in c2] == labels
        assert np.array_equal(batches.codes(name), c2)
    # the rows in (rank, t_enqueue_ns) order, row id on ties, whatever the fetch order
    ref = run.arrow(f"SELECT rid FROM {run.table('ops')} WHERE kind = 'op' ORDER BY rank, t_enqueue_ns NULLS LAST, rid")
    assert batches.col("orid").tolist() == ref.column("rid").to_pylist()
    tq = batches.take("t_enqueue_ns", fill=NUL, dtype=np.int64)
    _same(tq, _ref(ts.column("t_enqueue_ns"), NUL, np.int64)[whole.perm])
    with pytest.raises(KeyError):
        batches.col("t_enqueue_ns")
    # through DuckDB's stream (Run.arrow_batches): the model's rows as from the whole table
    streamed = run.arrow_batches(q, lambda rd: M._Rows(rd, n), batch_rows=64)
    _same(streamed.col("orid"), batches.col("orid"))
    with pytest.raises(ValueError):
        M._Rows(pa.RecordBatchReader.from_batches(ts.schema, ts.to_batches(max_chunksize=7)), n - 1)


def test_p2p_columns_attached_at_the_send_recv_rows_equal_the_full_columns(tmp_path):
    """The model reads peer, op_id and bytes only at the send / recv rows outside collectives
    (model._read_rows: _Rows.attach, by row id): there they equal the columns read for every
    row, null (the fill, or NaN) at every other row."""
    out = str(tmp_path / "p")
    synth_run(out, ranks=4, ops=400, late_send=[(1, 300_000)], hazards=True, seed=2, parts_per_rank=2)
    run = commtrace.load(out)
    cur = run.cursor()
    rows = M._read_rows(run, run.table("ops"), cur)[0]
    cur.close()
    full = M._Rows(run.arrow(f"SELECT {', '.join(M.ROW_COLUMNS + M.P2P_COLUMNS)}, rid AS orid, ckey "
                             f"FROM {run.table('ops')} WHERE kind = 'op'"))
    assert np.array_equal(rows.col("orid"), full.col("orid"))
    n = rows.num_rows
    idx = np.arange(n)
    codes, values = full.dict_values("op")
    p2p = np.isin(np.asarray(values, object)[codes], ["send", "recv"]) & (full.col("ckey", fill=-1, dtype=np.int64) < 0)
    assert p2p.sum() > 10 and (~p2p).sum() > 10
    big = np.iinfo(np.int64).max
    for name, fill, dt in (("peer", -1, np.int64), ("op_id", big, np.int64), ("bytes", None, np.float64)):
        got = rows.col_at(name, idx, fill=fill, dtype=dt)
        ref = full.col_at(name, idx, fill=fill, dtype=dt)
        _same(got[p2p], ref[p2p])
        if fill is None:
            assert np.isnan(got[~p2p]).all()
        else:
            assert (got[~p2p] == fill).all()
    sub = np.flatnonzero(p2p)[::3]
    _same(rows.col_at("peer", sub, fill=-1, dtype=np.int64), full.col_at("peer", sub, fill=-1, dtype=np.int64))
    with pytest.raises(ValueError):
        M._Rows(run.arrow(f"SELECT rank, t_enqueue_ns, rid AS orid FROM {run.table('ops')} WHERE kind = 'op'")).attach(
            pa.table({"orid": pa.array([3, 1], pa.int64()), "peer": pa.array([0, 1], pa.int64())}))


def test_rows_in_interleaved_blocks_are_moved_whole_as_the_gather_orders_them(tmp_path, monkeypatch):
    """Rows that come as blocks in order, the blocks interleaved (the scan of a table two load
    writers filled), are reordered by moving each block whole (_runs_of): the same columns,
    masks, codes and permutation as the per-element gather (MAX_SORTED_RUNS = 0), and a
    permutation with more pieces than MAX_SORTED_RUNS is gathered."""
    out = str(tmp_path / "r")
    synth_run(out, ranks=4, ops=600, straggler=[(1, 500_000)], hazards=True, seed=3, parts_per_rank=2)
    run = commtrace.load(out)
    t = run.arrow(f"SELECT {', '.join(M.ROW_COLUMNS + M.P2P_COLUMNS)}, rid AS orid, ckey FROM {run.table('ops')} WHERE kind = 'op' "
                  "ORDER BY rank, t_enqueue_ns NULLS LAST, rid")
    n = t.num_rows
    # the sorted rows cut into 7 blocks, shuffled
    cuts = np.linspace(0, n, 8).astype(int)
    blocks = [np.arange(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    order = np.random.default_rng(5).permutation(len(blocks))
    src = np.concatenate([blocks[i] for i in order])
    ts = t.take(Q.np_array(src))
    moved = M._Rows(ts)
    runs = M._runs_of(moved.perm)
    assert runs is not None and 1 < len(runs) <= 7     # (blocks shuffled next to each other are one run)
    assert np.array_equal(src[moved.perm], np.arange(n))
    monkeypatch.setattr(M, "MAX_SORTED_RUNS", 0)
    assert M._runs_of(moved.perm) is None
    gathered = M._Rows(ts)
    assert np.array_equal(moved.perm, gathered.perm)
    for name, (v1, m1) in moved._num.items():
        v2, m2 = gathered._num[name]
        assert np.array_equal(v1, v2) and v1.dtype == v2.dtype, name
        assert (m1 is None) == (m2 is None) and (m1 is None or np.array_equal(m1, m2)), name
    for name in moved._str:
        assert np.array_equal(moved._str[name][0], gathered._str[name][0])
    assert moved.col("orid").tolist() == t.column("orid").to_pylist()


def test_prefetched_model_equals_the_model_read_at_build(tmp_path):
    """model.prefetch (the report opens the model's cursor before its other queries start)
    gives the same model as build_model reading them itself."""
    out = str(tmp_path / "r")
    synth_run(out, ranks=4, ops=400, straggler=[(2, 800_000)], hazards=True, seed=9)
    a, b = commtrace.load(out), commtrace.load(out)
    M.prefetch(a)
    assert a in M._FETCHED
    ma, mb = M.build_model(a), M.build_model(b)
    assert a not in M._FETCHED
    _same_model(ma, mb)
    assert ma.n_events > 0


def _same_model(ma, mb):
    for k, x in vars(mb).items():
        y = getattr(ma, k)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and (x.tolist() == y.tolist() if x.dtype == object
                                           else np.array_equal(x, y, equal_nan=x.dtype.kind == "f")), k
        elif isinstance(x, (int, float, str, list)):
            assert x == y, k


def test_rows_read_ahead_beside_the_collectives_matching(tmp_path):
    """model.read_rows (the report reads the model's op rows on a cursor of its own while a
    thread matches the collectives on the run's connection, before the collectives table
    exists): the same model as build_model reading them itself; the cursor is closed after
    the read, the rows are taken by the build, and a second open_rows reads nothing."""
    import threading

    out = str(tmp_path / "r")
    synth_run(out, ranks=4, ops=400, straggler=[(2, 800_000)], hazards=True, seed=13)
    a, b = commtrace.load(out), commtrace.load(out)
    mb = M.build_model(b)
    opened = M.open_rows(a)
    assert opened is not None and "collectives" not in a._cache
    errs = []

    def match():
        try:
            a.collectives_summary()
        except Exception as e:  # noqa: BLE001
            errs.append(e)

    th = threading.Thread(target=match)
    th.start()
    M.read_rows(a, opened)
    th.join(120)
    assert not th.is_alive() and not errs
    with pytest.raises(Exception):
        opened[1].sql("SELECT 1").fetchall()      # closed
    assert a in M._ROWS and M.open_rows(a) is None
    M.prefetch(a)
    ma = M.build_model(a)
    assert a not in M._ROWS and M.open_rows(a) is None
    _same_model(ma, mb)
    assert ma.n_events > 0


def test_what_if_report_imports_no_pandas(tmp_path):
    out = str(tmp_path / "r")
    synth_run(out, ranks=4, ops=400, straggler=[(2, 800_000)], hazards=True, seed=9)
    code = ("import sys, json, commtrace; from commtrace.analysis import report as R; "
            f"rep = R.build_report(commtrace.load({out!r}), what_if=True); "
            "print(json.dumps([rep['what_if'] is not None, 'pandas' in sys.modules]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [True, False]


def _str_chunks(rng, words, nulls=0.1):
    chunks = []
    for _ in range(int(rng.integers(0, 5))):
        n = int(rng.integers(0, 3000))
        v = [None if rng.random() < nulls else words[int(rng.integers(0, len(words)))] for _ in range(n)]
        arr = pa.array(v, pa.string())
        if n > 5 and rng.random() < 0.5:
            arr = arr.slice(int(rng.integers(0, 5)))
        chunks.append(arr)
    return pa.chunked_array(chunks, pa.string())


def test_string_codes_in_c_equal_arrows_dictionary_encode():
    """model._str_codes (`_replay.str_codes`) gives the codes and values of Arrow's
    dictionary_encode (first appearance order, null -> -1), over every row and over a subset
    of rows in a given order, on chunked and sliced columns; and the model's `_dict_values`,
    and `_codes` equal their pyarrow.compute paths."""
    if M._C is None:
        pytest.skip("the C extension is not built")
    rng = np.random.default_rng(1)
    words = ["", "a", "train.py:88", "é", "x" * 40] + [f"site{i}.py:{j}" for i in range(50) for j in range(20)]
    for trial in range(30):
        a = _str_chunks(rng, words if trial % 2 else words[:6], nulls=0.0 if trial % 5 == 0 else 0.1)
        d = a.combine_chunks().dictionary_encode()
        codes, values = M._str_codes(a)
        _same(codes, d.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64))
        assert values == d.dictionary.to_pylist()
        if len(a):
            rows = rng.integers(0, len(a), int(rng.integers(0, 500))).astype(np.int64)
            d = a.take(pa.array(rows)).combine_chunks().dictionary_encode()
            codes, values = M._str_codes(a, rows)
            _same(codes, d.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64))
            assert values == d.dictionary.to_pylist()
        t = pa.table({"s": a})
        c, v = M._dict_values(t, "s")
        d = a.combine_chunks().dictionary_encode()
        _same(c, d.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64))
        assert list(v) == (d.dictionary.to_pylist() + [""] if a.num_chunks else [])
        _same(M._codes(t, "s"), c)
    assert M._str_codes(pa.chunked_array([pa.array(["a"], pa.large_string())])) is None


def test_model_read_on_its_cursor_beside_other_queries(tmp_path):
    """The model reads its rows on a cursor of its own (model.prefetch: Run.cursor), without
    the run's lock: it reads them while another thread holds the lock, and while another
    thread runs the report's other queries on the run (building tables of their own
    meanwhile); the same model as read alone, and the cursor is closed after the read."""
    import threading

    out = str(tmp_path / "r")
    synth_run(out, ranks=4, ops=400, straggler=[(2, 800_000)], hazards=True, seed=11)
    a, b, c = commtrace.load(out), commtrace.load(out), commtrace.load(out)
    mb = M.build_model(b)
    a.collectives()
    M.prefetch(a)
    cur = M._FETCHED[a][2]
    res = {}
    th = threading.Thread(target=lambda: res.setdefault("m", M.build_model(a)))
    with a.lock:            # held here, in another thread than the model's
        th.start()
        th.join(120)
        assert not th.is_alive()
    with pytest.raises(Exception):
        cur.sql("SELECT 1").fetchall()      # closed
    c.collectives()
    M.prefetch(c)
    errs = []

    def others():
        try:
            for _ in range(3):
                c.per_rank(), c.findings(), c.steps_summary()
        except Exception as e:  # noqa: BLE001
            errs.append(e)

    th = threading.Thread(target=others)
    th.start()
    mc = M.build_model(c)
    th.join()
    assert not errs
    for m in (res["m"], mc):
        for k, x in vars(mb).items():
            y = getattr(m, k)
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype and (x.tolist() == y.tolist() if x.dtype == object
                                               else np.array_equal(x, y, equal_nan=x.dtype.kind == "f")), k
    # Run.arrow_batches on a cursor reads what it reads under the lock
    q = f"SELECT rid FROM {b.table('ops')} ORDER BY rid"
    cb = b.cursor()
    try:
        got = b.arrow_batches(q, lambda rd: rd.read_all(), batch_rows=64, con=cb)
    finally:
        cb.close()
    assert got.column("rid").to_pylist() == b.arrow(q).column("rid").to_pylist()
