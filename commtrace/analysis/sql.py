"""SQL building blocks shared by the analysis modules, and how to run a query on a connection.

The op table of :mod:`commtrace.ops` is the one source of the op names, patterns and busbw
factors: each constant below is derived from it. Nothing here knows about a loaded run; every
function takes a DuckDB connection (or cursor) and returns Python rows, Arrow or numpy.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .. import ops as OPS

#: SQL tuple of the collective op names: ``('all_reduce', ...)``.
COLLECTIVE_SQL = "(" + ", ".join(f"'{o}'" for o in OPS.COLLECTIVE_OPS) + ")"
#: Rooted collectives (late broadcast / early reduce patterns), as a comma list.
ROOTED_SQL = ", ".join(f"'{n}'" for n, o in OPS.OPS.items() if o.pattern in (OPS.LATE_BROADCAST, OPS.EARLY_REDUCE))
#: SQL expression: the wait-state pattern of column `op` (metrics.md "Wait states").
PATTERN_SQL = "CASE op " + " ".join(
    f"WHEN '{n}' THEN '{o.pattern}'" for n, o in OPS.OPS.items() if o.collective) + " ELSE 'nxn' END"
#: Ops whose S is the per-rank size times n (metrics.md "Communication time and bandwidth").
BYTES_X_N_SQL = "(" + ", ".join(f"'{n}'" for n, o in OPS.OPS.items() if o.size_rule == "bytes_x_n") + ")"
#: Collective key: group index << CKEY_SHIFT | seq.
CKEY_SHIFT = 40


def factor_sql(op: str, n: str) -> str:
    """busbw factor F of metrics.md ("Communication time and bandwidth") as SQL."""
    ar = ", ".join(f"'{k}'" for k, o in OPS.OPS.items() if o.factor == "allreduce")
    nm = ", ".join(f"'{k}'" for k, o in OPS.OPS.items() if o.factor == "nm1_n")
    return (f"CASE WHEN {op} IN ({ar}) THEN 2.0 * ({n} - 1) / {n} "
            f"WHEN {op} IN ({nm}) THEN ({n} - 1.0) / {n} ELSE 1.0 END")


def quote(s) -> str:
    """A SQL string literal."""
    return "'" + str(s).replace("'", "''") + "'"


#: 2 ** CKEY_SHIFT: collective keys are built and split with arithmetic (portable SQL).
CKEY_MUL = 1 << CKEY_SHIFT


def pg_index_sql(expr: str, pgs) -> str:
    """SQL: the 1-based index of group name `expr` in the load-time list (NULL when absent)."""
    if not pgs:
        return "CAST(NULL AS BIGINT)"
    return "CASE " + expr + " " + " ".join(f"WHEN {quote(p)} THEN {i + 1}" for i, p in enumerate(pgs)) + " END"


def pg_list_sql(pgs) -> str:
    """The load-time list of group names as a SQL VARCHAR[] literal (a key's group index)."""
    return "[" + ", ".join(quote(p) for p in pgs) + "]::VARCHAR[]"


def pg_of_ckey(expr: str, pgs) -> str:
    """SQL: the group name of a collective key (its index in the load-time group list)."""
    if not pgs:
        return "CAST(NULL AS VARCHAR)"
    idx = f"CAST(floor({expr} / {CKEY_MUL}) AS BIGINT)"
    return "CASE " + idx + " " + " ".join(f"WHEN {i + 1} THEN {quote(p)}" for i, p in enumerate(pgs)) + " END"


def seq_of_ckey(expr: str) -> str:
    """SQL: the seq of a collective key."""
    return f"({expr} % {CKEY_MUL})"


def rank_filter(ranks) -> str:
    """SQL condition on `rank` for an iterable of ranks (or a (lo, hi) inclusive range)."""
    if isinstance(ranks, range):
        return f"rank BETWEEN {ranks.start} AND {ranks.stop - 1}"
    rs = [int(r) for r in ranks]
    return "rank IN (" + (", ".join(map(str, rs)) or "NULL") + ")"


# ---------------------------------------------------------------------------- running queries
class Rows:
    """Fetched rows with the cursor methods the callers use."""

    def __init__(self, rows):
        self.rows = rows

    def fetchall(self):
        return self.rows

    def fetchone(self):
        return self.rows[0] if self.rows else None


def rows(con, q: str, params=None) -> Rows:
    """Run SQL and fetch every row (DuckDB refuses new work while a result is unfinished)."""
    import duckdb

    cur = con.execute(q, params or [])
    try:
        out = cur.fetchall()
    except duckdb.Error:
        out = []
    return Rows(out)


def arrow(con, q: str, params=None) -> pa.Table:
    """Run SQL, return a pyarrow.Table."""
    rel = con.sql(q, params=params) if params else con.sql(q)
    return rel.to_arrow_table() if rel is not None else pa.table({})


def numpy(con, q: str, params=None) -> dict[str, np.ndarray]:
    """Run SQL, return its columns as numpy arrays (masked values left as stored)."""
    rel = con.sql(q, params=params) if params else con.sql(q)
    d = rel.fetchnumpy()
    return {k: (np.ma.getdata(v) if isinstance(v, np.ma.MaskedArray) else np.asarray(v)) for k, v in d.items()}


def np_array(a) -> pa.Array:
    """Arrow array from a numpy array without pa.array(), which imports pandas (~0.8 s) on
    first use; floats keep NaN, bools are bit-packed."""
    a = np.ascontiguousarray(a)
    if a.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), len(a), [None, pa.py_buffer(np.packbits(a, bitorder="little"))])
    types = {np.dtype(np.int64): pa.int64(), np.dtype(np.int32): pa.int32(), np.dtype(np.float64): pa.float64()}
    if a.dtype not in types:
        a = a.astype(np.float64 if a.dtype.kind == "f" else np.int64)
    return pa.Array.from_buffers(types[a.dtype], len(a), [None, pa.py_buffer(a)])


def np_table(cols: dict) -> pa.Table:
    """Arrow table from a dict of numpy arrays (see np_array)."""
    return pa.Table.from_arrays([np_array(np.asarray(v)) for v in cols.values()], names=list(cols))


def _np_dtype(t: pa.DataType):
    """numpy dtype of a fixed-width integer or float Arrow type; None for any other type."""
    if pa.types.is_integer(t):
        return np.dtype(f"{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
    if pa.types.is_float32(t) or pa.types.is_float64(t):
        return np.dtype(f"f{t.bit_width // 8}")
    return None


def arrow_parts(a) -> tuple:
    """(values, valid) of an Arrow integer or float array (or chunked array) read from its
    buffers: `values` in the column's own dtype (null slots hold whatever the buffer holds),
    `valid` a bool mask, None when there are no nulls. None for any other type."""
    chunks = a.chunks if isinstance(a, pa.ChunkedArray) else [a]
    dt = _np_dtype(a.type)
    if dt is None:
        return None
    n = sum(len(c) for c in chunks)
    vals = np.empty(n, dt)
    valid = None
    pos = 0
    for c in chunks:
        k = len(c)
        if k:
            bufs = c.buffers()
            vals[pos:pos + k] = np.frombuffer(bufs[1], dt, count=c.offset + k)[c.offset:]
            if c.null_count:
                if valid is None:
                    valid = np.ones(n, bool)
                bits = np.frombuffer(bufs[0], np.uint8)
                valid[pos:pos + k] = np.unpackbits(bits, count=c.offset + k, bitorder="little")[c.offset:].view(bool)
        pos += k
    return vals, valid


def arrow_numpy(a, fill=None, dtype=None) -> np.ndarray:
    """`a.fill_null(fill).to_numpy(zero_copy_only=False).astype(dtype)` (without `fill`: nulls
    of an integer column make it float64 with NaN, as pyarrow's to_numpy), as a fresh array,
    from the Arrow buffers: pyarrow's conversion imports pandas (0.2-0.4 s of CPU on first use,
    which the rest of the report does not pay). Other types go through pyarrow."""
    p = arrow_parts(a)
    if p is None:
        if fill is not None and a.null_count:
            a = a.fill_null(fill)
        v = a.to_numpy(zero_copy_only=False)
        return v.astype(dtype, copy=False) if dtype is not None else v
    return finish(*p, fill=fill, dtype=dtype)


def finish(vals: np.ndarray, valid, fill=None, dtype=None) -> np.ndarray:
    """arrow_numpy's result from arrow_parts' (values, valid), or from a subset of both."""
    if valid is None or valid.all():
        return vals.astype(dtype, copy=False) if dtype is not None else vals
    if fill is not None:
        # fill_null casts the fill to the column's type first
        out = vals.astype(dtype if dtype is not None else vals.dtype)
        out[~valid] = vals.dtype.type(fill)
        return out
    out = vals.astype(np.float64 if vals.dtype.kind in "iu" else vals.dtype)
    out[~valid] = np.nan
    return out.astype(dtype, copy=False) if dtype is not None else out


def py_array(values: list, type_: pa.DataType) -> pa.Array:
    """pa.array(values, type_) for a list of Python ints, floats or strings with None (nulls),
    without pa.array() (which imports pandas: see np_array). int64, float64 and string only."""
    n = len(values)
    valid = np.fromiter((v is not None for v in values), bool, n)
    vbuf = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    if pa.types.is_string(type_):
        enc = [b"" if v is None else str(v).encode("utf-8") for v in values]
        off = np.zeros(n + 1, np.int32)
        if n:
            np.cumsum(np.fromiter((len(b) for b in enc), np.int64, n), out=off[1:], dtype=np.int32)
        return pa.Array.from_buffers(pa.string(), n, [vbuf, pa.py_buffer(off), pa.py_buffer(b"".join(enc))],
                                     null_count=int(n - valid.sum()))
    if type_ == pa.int64():
        arr = np.fromiter((0 if v is None else int(v) for v in values), np.int64, n)
    elif type_ == pa.float64():
        arr = np.fromiter((0.0 if v is None else float(v) for v in values), np.float64, n)
    else:
        raise TypeError(f"py_array: {type_}")
    return pa.Array.from_buffers(type_, n, [vbuf, pa.py_buffer(arr)], null_count=int(n - valid.sum()))
