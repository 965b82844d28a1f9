"""Write trace parts and the manifest. Used by the in-rank recorder and by `commtrace synth`."""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa

from . import schema as S


def rank_dir(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, S.RANK_DIR_FMT.format(rank=rank))


def atomic_write_text(path: str, text: str) -> None:
    """Write `text` to `path` atomically (temp file + rename in the same directory). The file
    gets the user's umask (0644 under umask 022), as any file the user writes: a run directory
    shared with the team must be readable by it (mkstemp's 0600 was not)."""
    d = os.path.dirname(path) or "."
    while True:
        tmp = os.path.join(d, f".tmp-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            break
        except FileExistsError:
            continue

    def write():
        # bytes through os.write: no text-file object per write (the rank's writer rewrites
        # _inflight.json at every flush); the text is JSON, ASCII unless a caller says otherwise
        try:
            data = memoryview(text.encode("utf-8"))
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)

    _write_then_rename(write, tmp, path)


def _write_then_rename(write, tmp: str, path: str) -> None:
    """Run `write()` (which fills `tmp`), then rename `tmp` to `path`; on any failure remove
    `tmp` and re-raise, so no half-written file is left behind."""
    try:
        write()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def make_dir(d: str) -> None:
    """Create the directory `d` (and its parents) unless it is one already: a ``stat`` where
    ``os.makedirs(d, exist_ok=True)`` tries a ``mkdir`` per level and catches its error
    (~60 us of a rank's writer per part, twice per part before; session 22)."""
    if not os.path.isdir(d):
        os.makedirs(d, exist_ok=True)


def file_metadata(meta: dict) -> dict[bytes, bytes]:
    meta = dict(meta)
    meta.setdefault("schema_version", S.SCHEMA_VERSION)
    return {
        S.META_SCHEMA_VERSION: str(meta["schema_version"]).encode(),
        S.META_JSON: json.dumps(meta, default=str).encode(),
    }


def write_part(run_dir: str, rank: int, table: pa.Table, meta: dict, pid: int | None = None,
               index: int = 0, compression="zstd", prefix: str = "part-") -> str:
    """Write one Parquet part for `rank`; returns its path. The part is written under a
    temporary name and renamed, so readers never see a half-written part. `prefix` replaces
    the ``part-`` of the name (``counters-`` parts of bounded capture)."""
    d = rank_dir(run_dir, rank)
    make_dir(d)
    pid = os.getpid() if pid is None else pid
    name = S.PART_FMT.format(pid=pid, index=index)
    if prefix != "part-" and name.startswith("part-"):
        name = prefix + name[len("part-"):]
    path = os.path.join(d, name)
    tmp = os.path.join(d, "_tmp-" + name + ".partial")  # no .parquet suffix: globs skip it
    table = table.replace_schema_metadata(file_metadata(meta))

    def write():
        write_parquet(table, tmp, compression)
        _check_complete(tmp)

    _write_then_rename(write, tmp, path)
    return path


def _check_complete(path: str) -> None:
    """Raise when `path` is not a whole Parquet file (magic bytes at both ends). A write to a
    full disk has been seen to return without an error here (docs/dev/requests-capture.md);
    the part must then count as dropped, not be renamed into the run."""
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(0, os.SEEK_END)
        size = f.tell()
        tail = b""
        if size >= 12:
            f.seek(size - 4)
            tail = f.read(4)
    if head != b"PAR1" or tail != b"PAR1":
        raise OSError(f"incomplete Parquet part ({size} bytes written; is the disk full?)")


#: Keyword arguments of pyarrow's ``ParquetWriter`` with the defaults of
#: ``pyarrow.parquet.write_table`` (pyarrow 26): the parts are byte for byte what it writes.
_PQ_DEFAULTS = dict(
    version="2.6", use_dictionary=True, write_statistics=True,
    use_deprecated_int96_timestamps=False, compression_level=None, use_byte_stream_split=False,
    column_encoding=None, writer_engine_version="V2", data_page_version="1.0",
    use_compliant_nested_type=True, encryption_properties=None, write_batch_size=None,
    dictionary_pagesize_limit=None, store_schema=True, write_page_index=False,
    write_page_checksum=False, sorting_columns=None, store_decimal_as_integer=False,
    write_time_adjusted_to_utc=False, max_rows_per_page=None, bloom_filter_options=None,
    use_content_defined_chunking=False)
_lean_ok = True

#: Integer columns written with DELTA_BINARY_PACKED instead of a dictionary: timestamps, op
#: ids, seq and step grow within a rank, so their deltas pack into a few bits (the synthetic
#: mix: 32 -> 12 bytes per op on disk; docs/performance.md). DuckDB, pyarrow and Spark read
#: the encoding natively.
DELTA_COLUMNS = tuple(S.TIME_COLUMNS) + ("op_id", "seq", "step")


#: (schema, [(column name, its key in a per-column `compression`)], encoding kwargs) of the
#: last schema written: a rank writes every part with one schema, and walking its 35 fields
#: (a Python wrapper each) cost ~0.1 ms a part hot (session 21)
_schema_plan = None


def _plan_of(schema: pa.Schema) -> tuple:
    plan = _schema_plan
    if plan is not None and (plan[0] is schema or plan[0].equals(schema)):
        return plan
    return _new_plan(schema)


def _new_plan(schema: pa.Schema) -> tuple:
    global _schema_plan
    fields = list(schema)
    keys = [(f.name, f.name + ".list.element" if pa.types.is_list(f.type) else f.name)
            for f in fields]
    delta = [f.name for f in fields if f.name in DELTA_COLUMNS and pa.types.is_integer(f.type)]
    kwargs = {} if not delta else {
        "use_dictionary": [f.name for f in fields if f.name not in delta],
        "column_encoding": {n: "DELTA_BINARY_PACKED" for n in delta}}
    _schema_plan = plan = (schema, keys, kwargs)
    return plan


def encoding_kwargs(schema: pa.Schema) -> dict:
    """`use_dictionary` / `column_encoding` arguments of pyarrow's Parquet writer for a part
    of `schema` (see DELTA_COLUMNS)."""
    kw = _plan_of(schema)[2]
    return {k: (list(v) if isinstance(v, list) else dict(v)) for k, v in kw.items()}


#: Parts of fewer rows are written uncompressed: zstd sets up a compressor per column chunk
#: (35 of them: about 1.3 ms of a part's 2.4 ms of Parquet writing, whatever its size), and on
#: chunks this small it saves nothing (a 100-row part: 11.2 kB uncompressed, 11.3 kB with zstd,
#: the footer being most of it). Larger parts compress every column that has a value
#: (below ZSTD_ALL_ROWS rows, all but LEAN_COLUMNS).
ZSTD_MIN_ROWS = 1024


#: Below this many rows a part's labels (few distinct values: dictionary pages and
#: run-length or bit-packed indices of a few bits a row) and its counters written as deltas
#: (seq, op_id: a bit or so a row) are not compressed: zstd saves nothing on them there and
#: costs a compressor's set-up per column (on a DDP part of 2,400 rows: -18 to +20 bytes each,
#: ~45 us each; docs/performance.md, session 16). A sparse loop (DDP: ~1,000-2,500 rows per
#: 2 s part) writes its parts in this range; a tight one (the soak: tens of thousands) does not.
ZSTD_ALL_ROWS = 16384
LEAN_COLUMNS = frozenset({"kind", "rank", "pg", "pg_size", "op", "api", "backend", "device",
                          "dtype", "peer", "root", "thread", "seq", "op_id"})
#: ... and, below ZSTD_ALL_ROWS rows, these when they hold one value throughout the part (a
#: dictionary of one entry and one run of indices: zstd made them larger, by 17-24% in the
#: soak's parts, and cost a compressor each, ~45 us). With several values (a DDP part's
#: buckets of two sizes and its step marks) zstd halves them: kept there (session 21).
LEAN_IF_ONE_VALUE = frozenset({"count", "bytes", "out_bytes", "site", "completion",
                               "ref_op_id", "torch_seq"})
#: Tests and benchmarks flip it (False: every column with a value is compressed from
#: ZSTD_MIN_ROWS rows, the rule up to session 15; "s16": LEAN_COLUMNS only, up to session 20).
LEAN_CODECS = True


def _one_value(col) -> bool:
    """Whether the column (a ChunkedArray) holds one value on every row, nulls counted as a
    value: the array equals itself shifted by one row (Arrow's own comparison, no compute
    kernel; a few us for a part)."""
    if col.num_chunks != 1:
        return False
    a = col.chunk(0)
    return len(a) > 0 and a.slice(1).equals(a.slice(0, len(a) - 1))


def part_compression(table: pa.Table):
    """The `compression` argument for a trace part of `table` (see ZSTD_MIN_ROWS): "none",
    or per column, zstd except for the columns that are null throughout and, in parts of
    fewer than ZSTD_ALL_ROWS rows, LEAN_COLUMNS and the LEAN_IF_ONE_VALUE columns that hold
    one value."""
    n = table.num_rows
    if n < ZSTD_MIN_ROWS:
        return "none"
    lean = LEAN_CODECS and n < ZSTD_ALL_ROWS
    one = lean and LEAN_CODECS != "s16"
    out = {}
    for (name, key), col in zip(_plan_of(table.schema)[1], table.columns):
        out[key] = "none" if (col.null_count == n or (lean and name in LEAN_COLUMNS)
                              or (one and name in LEAN_IF_ONE_VALUE and _one_value(col))) else "zstd"
    return out


#: The lean path encodes a part into memory and writes it with one ``write`` (session 21):
#: pyarrow's file sink is unbuffered, so a part went to the file in ~110 writes (a page
#: header, a page, ... the footer), each a system call that zeroes the rest of an ext4 block:
#: 4-5% of the writer thread's samples in the soak. The bytes are the same. Tests and
#: benchmarks flip it.
BUFFERED_WRITE = True


def _write_bytes(path: str, data) -> None:
    """Write `data` (a buffer) as the new file `path` (the user's umask applies, as for
    pyarrow's own file sink); errors propagate."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0),
                 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def write_parquet(table: pa.Table, path: str, compression="zstd") -> None:
    """Write `table` to the local file `path` as Parquet.

    Inside a rank this goes through ``pyarrow._parquet.ParquetWriter`` directly: importing
    ``pyarrow.parquet`` also imports ``pyarrow.fs`` and with it the S3, GCS, Azure and HDFS
    filesystem modules and ``libarrow_s3``, about 4 MB of resident memory that a traced rank
    never uses (Soak section of docs/performance.md). When that private class does not take
    these arguments (another pyarrow version), ``pyarrow.parquet.write_table`` is used.
    Write errors (a full disk) propagate either way."""
    global _lean_ok
    if _lean_ok:
        try:
            from pyarrow import _parquet

            sink = pa.BufferOutputStream() if BUFFERED_WRITE else path
            w = _parquet.ParquetWriter(sink, table.schema, compression=compression,
                                       **{**_PQ_DEFAULTS, **encoding_kwargs(table.schema)})
        except (ImportError, AttributeError, TypeError, ValueError):
            _lean_ok = False
        else:
            try:
                w.write_table(table, row_group_size=None)
            except BaseException:
                try:
                    w.close()
                except Exception:  # noqa: BLE001 - the write's own error is the one to report
                    pass
                raise
            w.close()  # writes the footer: its errors (a full disk) must reach the caller
            if BUFFERED_WRITE:
                _write_bytes(path, sink.getvalue())
            return
    import pyarrow.parquet as pq

    pq.write_table(table, path, compression=compression, **encoding_kwargs(table.schema))


def write_manifest(run_dir: str, manifest: dict) -> str:
    """Write (or rewrite) `_manifest.json`."""
    os.makedirs(run_dir, exist_ok=True)
    m = {"schema_version": S.SCHEMA_VERSION, "created_ns": time.time_ns()}
    m.update(manifest)
    path = os.path.join(run_dir, S.MANIFEST_NAME)
    atomic_write_text(path, json.dumps(m, indent=2, default=str))
    return path


def empty_table() -> pa.Table:
    return S.SCHEMA.empty_table()


def rows_to_table(columns: dict[str, list]) -> pa.Table:
    """Build a table in SCHEMA column order from a dict of python lists (missing → null)."""
    n = max((len(v) for v in columns.values()), default=0)
    arrays = []
    for f in S.SCHEMA:
        vals = columns.get(f.name)
        arrays.append(pa.array(vals if vals is not None else [None] * n, type=f.type))
    return pa.Table.from_arrays(arrays, schema=S.SCHEMA)


# --------------------------------------------------------------------------------------------
# Building Arrow arrays from Python lists without pandas.
#
# pyarrow's `pa.array(list)` consults its pandas shim, which imports pandas (~0.4 s and a few
# hundred modules) the first time. Inside a training rank the capture side must not import
# pandas, so the recorder builds its arrays straight from buffers instead.
# --------------------------------------------------------------------------------------------

import array as _array  # noqa: E402

import itertools  # noqa: E402
import operator  # noqa: E402

_INT_CODES = {pa.int64(): "q", pa.int32(): "i"}


#: 8 flag bytes (0/1) -> their packed bitmap byte (Arrow: least significant bit first)
_PACK = {bytes((i >> k) & 1 for k in range(8)): bytes((i,)) for i in range(256)}


def _bitmap(flags: bytes, n: int):
    """A packed Arrow bitmap of `n` 0/1 bytes, 8 at a time through a table. (Arrow's own cast
    would do it faster, but loads its compute kernels: 10-20 MB more resident in every rank,
    which the soak's memory budget does not allow.)"""
    pad = -n % 8
    if pad:
        flags = flags + bytes(pad)
    get = _PACK.__getitem__
    return pa.py_buffer(b"".join(map(get, map(flags.__getitem__,
                                                  map(slice, range(0, n + pad, 8),
                                                      range(8, n + pad + 1, 8))))))


def _validity(vals, nnull=None):
    if nnull is None:
        nnull = vals.count(None)
    if not nnull:
        return None, 0
    return _bitmap(bytes(map(operator.is_not, vals, itertools.repeat(None))), len(vals)), nnull


def _offsets(lengths):
    return pa.py_buffer(_array.array("i", itertools.accumulate(lengths, initial=0)).tobytes())


def _strings(vals: list, n: int, valid, nnull) -> pa.Array:
    enc = [b"" if v is None else str(v).encode("utf-8", "surrogateescape") for v in vals]
    return pa.Array.from_buffers(pa.string(), n, [valid, _offsets(map(len, enc)),
                                                  pa.py_buffer(b"".join(enc))], nnull)


def array_from_list(vals: list, typ: pa.DataType) -> pa.Array:
    """An Arrow array of `typ` (int32, int64, bool, string, list<int64>) from a Python list with
    None for nulls, built from buffers (never imports pandas).

    The writer thread's cost per row is mostly here, so the common shapes take C-speed routes:
    an all-null column is ``pa.nulls``; integers without nulls go through ``array.array``
    directly; a string column (few distinct values: op, api, pg, device, call site) is encoded
    once per distinct value. No Arrow compute kernel is used: loading them costs every rank
    10-20 MB of resident memory."""
    n = len(vals)
    nnull = vals.count(None)
    if nnull == n and n:
        return pa.nulls(n, typ)
    code = _INT_CODES.get(typ)
    if code is not None:
        data = None
        if not nnull:
            try:
                data = _array.array(code, vals)
            except TypeError:   # not all ints (bools, numbers of another type): convert
                data = None
        valid, nnull = _validity(vals, nnull)
        if data is None:
            data = _array.array(code, [0 if v is None else int(v) for v in vals])
        return pa.Array.from_buffers(typ, n, [valid, pa.py_buffer(data.tobytes())], nnull)
    valid, nnull = _validity(vals, nnull)
    if typ == pa.bool_():
        return pa.Array.from_buffers(typ, n, [valid, _bitmap(bytes(map(bool, vals)), n)], nnull)
    if typ == pa.string():
        if n < 64:
            return _strings(vals, n, valid, nnull)
        try:
            keys = dict.fromkeys(vals)
        except TypeError:   # an unhashable value: encode each
            return _strings(vals, n, valid, nnull)
        if len(keys) * 2 > n:
            return _strings(vals, n, valid, nnull)
        # each distinct value encoded once, then looked up per row at C speed
        for k in keys:
            keys[k] = b"" if k is None else str(k).encode("utf-8", "surrogateescape")
        enc = list(map(keys.__getitem__, vals))
        return pa.Array.from_buffers(typ, n, [valid, _offsets(map(len, enc)),
                                              pa.py_buffer(b"".join(enc))], nnull)
    if pa.types.is_list(typ) and typ.value_type in _INT_CODES:
        items = [() if v is None else list(v) for v in vals]
        child = array_from_list([x for it in items for x in it], typ.value_type)
        return pa.Array.from_buffers(typ, n, [valid, _offsets(len(it) for it in items)], nnull,
                                     children=[child])
    return pa.array(vals, type=typ)  # other types: pyarrow's own conversion


def rows_to_table_nopandas(columns: dict[str, list]) -> pa.Table:
    """Like :func:`rows_to_table`, built from buffers (used inside training processes)."""
    n = max((len(v) for v in columns.values()), default=0)
    arrays = []
    for f in S.SCHEMA:
        vals = columns.get(f.name)
        arrays.append(array_from_list(list(vals) if vals is not None else [None] * n, f.type))
    return pa.Table.from_arrays(arrays, schema=S.SCHEMA)


def table_of_arrays(arrays: list) -> pa.Table:
    """A table in SCHEMA order of arrays built elsewhere (the recorder's typed buffers)."""
    return pa.Table.from_arrays(arrays, schema=S.SCHEMA)
