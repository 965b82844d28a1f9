"""The host model of a matched trace, shared by delay analysis, the critical path and replay.

docs/findings.md ("Root cause, critical path and what-if") defines it; in short:

* each rank is a chain of **host events** in start order: the call of every op
  (`t_enqueue_ns` .. `t_return_ns`) and its `wait()` (`t_wait_ns` .. `t_wait_end_ns`);
* the **gap** of an event is the time since the previous event of its rank released the host
  (compute, data loading, Python: everything commtrace does not see);
* a **communication** is a matched collective (pg, seq) that every member completed, or a
  matched send/recv pair (metrics.md "Matching one collective across ranks"); its members'
  entries (`t_enqueue_ns`) are its arrivals. It starts at **T0** = the latest arrival (for a
  collective, also no earlier than each member's previous collective on the group ended: one
  collective at a time per group, as NCCL's stream and gloo's queue run them) and each
  member leaves (`t_end_ns`) its own measured time `tc` after T0, so that min over members of
  `tc` is metrics.md's `t_comm` when nothing queued;
* an event **depends** on a communication when it released the host after that member's
  completion (a blocking call, or a wait() that returned after it): it is an **anchor**, and
  releases at max(its start, the completion) + the measured residual; every other event keeps
  its measured duration.

All times here are float64 ns relative to `base_ns` (rank 0's clock, offsets applied).
The model is built once per run from public tables (`Run.ops(columns=...)`,
`Run.collectives()`) and cached on the run object.
"""

from __future__ import annotations

import os
import sys
import weakref
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .. import ops as OPS
from . import sql as Q

_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

try:  # the C helpers (commtrace/analysis/_replay.c); numpy does the same without them
    if os.environ.get("COMMTRACE_PURE_PYTHON"):
        raise ImportError
    from . import _replay as _C
except ImportError:
    _C = None

ROW_COLUMNS = ["rank", "op", "pg", "t_enqueue_ns",
               "t_return_ns", "t_end_ns", "t_wait_ns", "t_wait_end_ns", "step", "site"]
#: Columns the model reads only at the send / recv rows outside collectives (p2p matching):
#: fetched for those rows alone (_P2P_ROWS_SQL, _Rows.attach) rather than for every row.
P2P_COLUMNS = ["peer", "op_id", "bytes"]
_P2P_ROWS_SQL = ("SELECT rid AS orid, " + ", ".join(P2P_COLUMNS) + " FROM {ops} WHERE kind = 'op' "
                 "AND ckey IS NULL AND op IN ('send', 'recv') ORDER BY rid")

# Rows whose completion the user's program waits on in C++, where no wait() is recorded: DDP's
# Reducer blocks on every bucket's future at the end of backward (finalize). See _implicit_waits.
_IMPLICIT_WAIT_APIS = ("ddp_comm_hook",)


@dataclass
class Model:
    """Arrays of the host model (see the module doc). Events are sorted by (rank, start);
    slots (one per member of a communication) are grouped by communication."""

    base_ns: int
    ranks: np.ndarray
    # events
    ev_rank: np.ndarray
    ev_start: np.ndarray
    ev_rel: np.ndarray
    ev_row: np.ndarray
    ev_is_wait: np.ndarray
    ev_slot: np.ndarray          # slot of the op's communication, -1 if none
    ev_anchor: np.ndarray        # depends on the communication's completion
    ev_gap: np.ndarray           # start - previous event's release (first of rank: start)
    ev_dur: np.ndarray           # rel - start (locals)
    ev_rho: np.ndarray           # rel - max(start, completion) (anchors)
    ev_first: np.ndarray         # first event of its rank
    ev_excess: np.ndarray        # gap - median gap of the same event on the other ranks, >= 0
    ev_has_peers: np.ndarray
    ev_step: np.ndarray          # int64, -1 unknown
    rank_lo: np.ndarray          # event range per rank (positions in `ranks`)
    rank_hi: np.ndarray
    # slots
    sl_comm: np.ndarray
    sl_rank: np.ndarray
    sl_call: np.ndarray          # CALL event index
    sl_enter: np.ndarray
    sl_leave: np.ndarray
    sl_dep: np.ndarray           # leave depends on T0 (left after the latest arrival)
    sl_tc: np.ndarray            # leave - T0 (dep) ; leave - enter otherwise
    sl_prev: np.ndarray          # previous slot of the same group on the same rank (queue), -1
    sl_sync: np.ndarray          # host release that ended the rank's previous comm on the group
    sl_wait: np.ndarray          # wait state: min(latest arrival, leave) - block start, >= 0
    sl_block: np.ndarray         # when the host blocked on it (call or wait() start; else enter)
    # communications
    cm_lo: np.ndarray
    cm_hi: np.ndarray
    cm_T0: np.ndarray
    cm_last: np.ndarray          # slot of the latest arrival
    cm_is_p2p: np.ndarray
    cm_op: np.ndarray            # object array of op names (collective op, or "send/recv")
    cm_pg: np.ndarray
    cm_seq: np.ndarray
    cm_bytes: np.ndarray
    cm_factor: np.ndarray
    cm_tcomm: np.ndarray         # min over dependent slots of tc
    # rows (for labels)
    row_op: "_CodeLabels"        # per row: its op and site, from dictionary codes
    row_site: "_CodeLabels"
    t_begin: float
    t_end: float
    notes: list = field(default_factory=list)
    # integer codes of cm_op / cm_pg (equal names, equal codes): index into op_names / pg_names
    cm_opc: np.ndarray | None = None
    cm_pgc: np.ndarray | None = None
    op_names: np.ndarray | None = None
    pg_names: np.ndarray | None = None

    @property
    def n_events(self) -> int:
        return len(self.ev_start)


class _CodeLabels:
    """`labels[i]` -> the string of row i ("" when null) from the column's dictionary codes
    (`codes`, int32, -1 for null) and their values (`values`, the last one "" for null), without
    keeping the strings of every row (64 x 20,000: the 35 MB of `op` and `site` the Arrow labels
    of session 13 copied by combine_chunks, against 2 x 5 MB of codes; the `op` codes are the
    model's own, the `site` codes one `_replay.str_codes` pass)."""

    def __init__(self, codes: np.ndarray, values: np.ndarray):
        self.codes = codes
        self.values = values

    def __getitem__(self, i):
        return self.values[int(self.codes[int(i)])]


class _Rows:
    """The op rows in (rank, t_enqueue_ns) order (nulls last, then by row id), as numpy columns.

    Read batch by batch (`src`: a pyarrow Table, or a RecordBatchReader / iterable of record
    batches of `n` rows in all, with its `schema`) into one numpy array per column, in the
    column's own dtype with a validity mask where it has nulls; string columns as dictionary
    codes (numbered in order of first appearance, null -> -1) and their values. From DuckDB the
    batches come through a stream (Run.arrow_batches): each batch's Arrow buffers are freed
    before the next is read, so its memory is reused, where a whole fetched table (64 x 20,000:
    167 MB, allocated in DuckDB's worker threads' malloc arenas) was fresh pages that numpy
    could not reuse (docs/performance.md, session 19).

    The rows come unordered and are sorted here with one argsort of an int64 key (an ORDER BY
    over the table's 18 columns cost more than the rest of the fetch, 64 x 20,000: 1.4 s of
    2.0 s CPU); every stored column is then permuted once, by moving whole runs where the
    permutation is a few of them (a scan of the load's two writers' interleaved row groups:
    _runs_of), else by a gather. `perm` is that permutation (positions in the source's row
    order; None when the rows came in order)."""

    def __init__(self, src, n: int | None = None, schema: pa.Schema | None = None):
        if isinstance(src, pa.Table):
            n, schema, src = src.num_rows, src.schema, src.to_batches()
        elif schema is None:
            schema = src.schema
        if n is None:
            src = list(src)
            n = sum(b.num_rows for b in src)
        self.num_rows = n
        self.perm = None
        self._num: dict = {}     # name -> [values, valid or None]
        self._str: dict = {}     # name -> [int32 codes, {value: code}]
        self._other: dict = {}   # name -> (type, [Arrow chunks]) (neither numeric nor string)
        self._sparse: dict = {}  # name -> (values, valid) at the rows of row ids _sparse_rid (attach)
        self._sparse_rid = None
        for f in schema:
            dt = Q._np_dtype(f.type)
            if dt is not None:
                self._num[f.name] = [np.empty(n, dt), None]
            elif pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
                self._str[f.name] = [np.empty(n, np.int32), {}]
            else:
                self._other[f.name] = (f.type, [])
        pos = 0
        for b in src:
            k = b.num_rows
            if pos + k > n:
                raise ValueError(f"_Rows: more than the {n} rows announced")
            for i, name in enumerate(b.schema.names):
                a = b.column(i)
                if name in self._num:
                    self._read_num(name, a, pos, k)
                elif name in self._str:
                    self._read_str(name, a, pos)
                elif name in self._other:
                    self._other[name][1].append(a)
            pos += k
        if pos != n:
            raise ValueError(f"_Rows: {pos} rows read of the {n} announced")
        self._order()

    def _read_num(self, name: str, a, pos: int, k: int) -> None:
        ent = self._num[name]
        vals = ent[0]
        if not k:
            return
        bufs = a.buffers()
        vals[pos:pos + k] = np.frombuffer(bufs[1], vals.dtype, count=a.offset + k)[a.offset:]
        if a.null_count:
            if ent[1] is None:
                ent[1] = np.ones(len(vals), bool)
            bits = np.frombuffer(bufs[0], np.uint8)
            ent[1][pos:pos + k] = np.unpackbits(bits, count=a.offset + k, bitorder="little")[a.offset:].view(bool)

    def _read_str(self, name: str, a, pos: int) -> None:
        codes, index = self._str[name]
        k = len(a)
        if not k:
            return
        r = _str_codes(a)
        if r is not None:
            local, values = r
        else:
            d = a.dictionary_encode()
            local = Q.arrow_numpy(d.indices, fill=-1, dtype=np.int64)
            values = d.dictionary.to_pylist()
        # this batch's codes -> the column's (first appearance over the batches in order;
        # -1, null, reads the table's last entry)
        lut = np.array([index.setdefault(v, len(index)) for v in values] + [-1], np.int32)
        codes[pos:pos + k] = lut[local]

    def _order(self) -> None:
        n = self.num_rows
        if n < 2:
            return
        NUL = np.iinfo(np.int64).min
        rk = self._get("rank", fill=np.iinfo(np.int32).max, dtype=np.int64)
        tq = self._get("t_enqueue_ns", fill=NUL, dtype=np.int64)
        ok = tq != NUL
        if ok.any():
            lo = int(tq[ok].min())
            span = int(tq[ok].max()) - lo
        else:
            lo, span = 0, 0
        r0 = int(rk.min())
        if (int(rk.max()) - r0 + 1) * (span + 2) < 2 ** 62:
            key = (rk - r0) * (span + 2) + np.where(ok, tq - lo, span + 1)
            del rk, tq, ok
            if np.all(key[1:] > key[:-1]):
                return
            o = np.argsort(key, kind="stable")
            ks = key[o]
            if np.any(ks[1:] == ks[:-1]):       # ties: by row id, whatever the fetch order
                o = np.lexsort((self._get("orid", dtype=np.int64), key))
            del key, ks
        else:
            o = np.lexsort((self._get("orid", dtype=np.int64), np.where(ok, tq, np.iinfo(np.int64).max), ~ok, rk))
            del rk, tq, ok
        self.perm = o
        runs = _runs_of(o)
        if runs is not None:
            self._order_runs(runs)
            return
        # each stored column permuted once (the one before freed: the next one's memory)
        for ent in self._num.values():
            ent[0] = ent[0][o]
            if ent[1] is not None:
                ent[1] = ent[1][o]
        for ent in self._str.values():
            ent[0] = ent[0][o]

    def _order_runs(self, runs) -> None:
        """Reorder every stored column by `perm`, moving its runs ((lo, hi) source ranges, in
        their order in the result: _runs_of) whole: slice copies instead of a gather per
        element (64 x 20,000: some 20 runs, the row groups of the load's two writers)."""
        def moved(a):
            out = np.empty_like(a)
            pos = 0
            for lo, hi in runs:
                out[pos:pos + hi - lo] = a[lo:hi]
                pos += hi - lo
            return out
        for ent in self._num.values():
            ent[0] = moved(ent[0])
            if ent[1] is not None:
                ent[1] = moved(ent[1])
        for ent in self._str.values():
            ent[0] = moved(ent[0])

    def _get(self, name: str, fill=None, dtype=None) -> np.ndarray:
        """Column `name` (arrow_numpy's conversion: nulls -> `fill`), possibly the stored array."""
        if name in self._num:
            vals, valid = self._num[name]
            return Q.finish(vals, valid, fill=fill, dtype=dtype)
        c = pa.chunked_array(self._other[name][1], type=self._other[name][0])
        v = Q.arrow_numpy(c, fill=fill, dtype=dtype)
        return v if self.perm is None else v[self.perm]

    def col(self, name: str, fill=None, dtype=None) -> np.ndarray:
        """Column `name` in row order (nulls -> `fill`, as `dtype`), a fresh array."""
        v = self._get(name, fill=fill, dtype=dtype)
        return v.copy() if name in self._num and v is self._num[name][0] else v

    def take(self, name: str, fill=None, dtype=None) -> np.ndarray:
        """col(name, fill, dtype), and the column is dropped here: no copy where the stored
        array needs no conversion."""
        ent = self._num.get(name)
        if ent is not None and ent[1] is not None and fill is not None and (dtype is None or ent[0].dtype == dtype):
            vals, valid = ent     # (Q.finish's result, without its copy: nulls filled in place)
            if not valid.all():
                vals[~valid] = vals.dtype.type(fill)
            del self._num[name]
            return vals
        v = self._get(name, fill=fill, dtype=dtype)
        self._num.pop(name, None)
        self._other.pop(name, None)
        return v

    def attach(self, t: pa.Table) -> None:
        """Columns of table `t` (`orid`, the row id, ascending, and numeric columns) known at
        those rows only: col_at reads them by row id, null at any other row."""
        rid = Q.arrow_numpy(t.column("orid"), dtype=np.int64)
        if len(rid) > 1 and not np.all(rid[1:] > rid[:-1]):
            raise ValueError("_Rows.attach: row ids not ascending")
        self._sparse_rid = rid
        for name in t.column_names:
            if name == "orid":
                continue
            p = Q.arrow_parts(t.column(name))
            if p is None:
                raise TypeError(f"_Rows.attach: column {name} is not numeric")
            self._sparse[name] = p

    def _col_at_sparse(self, name: str, idx: np.ndarray, fill=None, dtype=None) -> np.ndarray:
        vals, valid = self._sparse[name]
        rid = self._sparse_rid
        orid = self.col_at("orid", idx, dtype=np.int64)
        if not len(rid):
            return Q.finish(np.zeros(len(orid), vals.dtype), np.zeros(len(orid), bool), fill=fill, dtype=dtype)
        pos = np.minimum(np.searchsorted(rid, orid), len(rid) - 1)
        ok = rid[pos] == orid
        if valid is not None:
            ok &= valid[pos]
        return Q.finish(vals[pos], ok, fill=fill, dtype=dtype)

    def col_at(self, name: str, idx: np.ndarray, fill=None, dtype=None) -> np.ndarray:
        """`col(name)[idx]`, converting only those rows."""
        if name in self._sparse:
            return self._col_at_sparse(name, idx, fill=fill, dtype=dtype)
        if name in self._num:
            vals, valid = self._num[name]
            return Q.finish(vals[idx], None if valid is None else valid[idx], fill=fill, dtype=dtype)
        return self.col(name, fill=fill, dtype=dtype)[idx]

    def release(self) -> None:
        """Drop every stored column (every column is read by then)."""
        self._num.clear()
        self._str.clear()
        self._other.clear()
        self._sparse.clear()

    def dict_values(self, name: str):
        """(int32 codes in row order, -1 for null: the stored array itself, values as an object
        array, "" appended for null)."""
        codes, index = self._str[name]
        return codes, np.asarray(list(index) + [""], dtype=object)

    def codes(self, name: str) -> np.ndarray:
        return self._str[name][0].astype(np.int64)


#: Most pieces _Rows reorders by moving them whole (_runs_of); more: a gather per column.
MAX_SORTED_RUNS = 4096


def _runs_of(o: np.ndarray):
    """Permutation `o` as the (lo, hi) source ranges it takes whole, in order, when there are
    at most MAX_SORTED_RUNS of them (a scan of a table inserted in chunks by several writers:
    each chunk's rows in order, the chunks' row groups interleaved); else None."""
    br = np.flatnonzero(o[1:] != o[:-1] + 1) + 1
    if len(br) >= MAX_SORTED_RUNS:
        return None
    starts = np.r_[0, br]
    ends = np.r_[br, len(o)]
    lo = o[starts]
    return list(zip(lo.tolist(), (lo + (ends - starts)).tolist()))


def _str_codes(a, rows=None):
    """(codes, values) of Arrow's dictionary encoding of a string column (int64 codes numbered
    in order of first appearance, null -> -1; the values in code order), of every row or of
    `rows` (positions in the column, in that order), by `_replay.str_codes`: no import of
    pyarrow.compute, no copy of the strings by combine_chunks. None without the extension or
    for another type (large or view strings)."""
    if _C is None or not pa.types.is_string(a.type):
        return None
    chunks = a.chunks if isinstance(a, pa.ChunkedArray) else [a]
    parts, starts = [], [0]
    for c in chunks:
        b = c.buffers()
        if len(c) and (b[1] is None or b[2] is None):
            return None
        if len(c):
            parts.append((b[1], b[2], b[0] if c.null_count else None, c.offset, len(c)))
            starts.append(starts[-1] + len(c))
    r = None if rows is None else np.ascontiguousarray(rows, np.int64)
    codes, values = _C.str_codes(parts, np.asarray(starts, np.int64), r)
    return np.frombuffer(codes, np.int64), values


def _dict_values(t: pa.Table, name: str):
    """(codes, values as an object array) of a string column's dictionary encoding."""
    a = t.column(name)
    if a.num_chunks == 0:
        return np.zeros(0, np.int64), np.zeros(0, object)
    r = _str_codes(a)
    if r is not None:
        return r[0], np.asarray(r[1] + [""], dtype=object)
    d = a.combine_chunks().dictionary_encode()
    return (Q.arrow_numpy(d.indices, fill=-1, dtype=np.int64),
            np.asarray(d.dictionary.to_pylist() + [""], dtype=object))


def _codes(t: pa.Table, name: str) -> np.ndarray:
    """Integer codes of a string column (equal strings, equal codes; null -> -1), computed by
    Arrow's dictionary encoding instead of sorting Python strings."""
    a = t.column(name)
    if a.num_chunks == 0:
        return np.zeros(0, np.int64)
    r = _str_codes(a)
    if r is not None:
        return r[0]
    d = a.combine_chunks().dictionary_encode()
    return Q.arrow_numpy(d.indices, fill=-1, dtype=np.int64)


_MALLOC_TUNED = False


def _retain_freed_memory() -> None:
    """Let glibc's malloc keep the memory numpy frees for the next arrays, once per process.

    The model and its analyses allocate and free arrays of millions of elements, stage after
    stage. By default glibc serves such arrays with mmap and returns them to the system when
    freed (and trims the heap's top beyond 128 kB to 64 MB), so the next array of that size is
    faulted in again page by page, and page faults are what this analysis spends most of its
    system time on (64 x 20,000 ops: about 110,000 faults, 1 to 2 s of system CPU, as much as
    the arithmetic; docs/performance.md). Raising the mmap and trim thresholds makes freed
    arrays reusable: the process keeps up to 1 GB it has freed instead of giving it back, which
    its peak has already held. Not in a training process (capture never imports this).

    mallopt is process-wide, so it is done only where commtrace owns the process: the
    `commtrace` command sets `commtrace.analysis.TUNE_MALLOC`. A program that imports the
    analysis as a library keeps its malloc settings unless it sets that flag itself.
    `COMMTRACE_MALLOC_TUNE=0` leaves malloc alone everywhere; `=1` tunes it in any process."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    env = os.environ.get("COMMTRACE_MALLOC_TUNE")
    import commtrace.analysis as _pkg
    wanted = env == "1" or (env != "0" and getattr(_pkg, "TUNE_MALLOC", False))
    if not wanted or not sys.platform.startswith("linux"):
        return
    _MALLOC_TUNED = True
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    mallopt(M_MMAP_THRESHOLD, 512 << 20)
    mallopt(M_TRIM_THRESHOLD, 1 << 30)
    _no_huge_pages()


def _no_huge_pages() -> None:
    """Stop numpy asking for transparent huge pages (madvise(MADV_HUGEPAGE) on every array
    of 4 MB or more), in the same processes as `_retain_freed_memory`.

    Where the kernel's THP mode is `madvise` with `defrag` on `madvise` (this project's
    machines), each huge page a fresh array touches is allocated, compacted for and zeroed
    (2 MB) in the page fault: on the 64 x 20,000 what-if that was 0.6-0.9 s of system CPU
    (`clear_page_erms` alone a quarter of the root-cause stages' samples in `perf`), against
    0.1 s more user time for 4 kB pages (docs/performance.md). The arrays here are built once
    and read a few times, so huge pages buy little TLB reach back."""
    try:
        from numpy._core import multiarray as _ma
    except ImportError:  # numpy < 2
        try:
            from numpy.core import multiarray as _ma
        except ImportError:
            return
    setter = getattr(_ma, "_set_madvise_hugepage", None)
    if setter is not None:
        setter(False)


def build_model(run) -> Model:
    """The host model of `run` (cached per run object)."""
    m = _CACHE.get(run)
    if m is None:
        _retain_freed_memory()
        m = _build(run, _FETCHED.pop(run, None))
        _CACHE[run] = m
    return m


_FETCHED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: run -> (_Rows, implicit-wait row ids or None): the op rows read ahead by read_rows.
_ROWS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def open_rows(run):
    """(ops table, a cursor on the run's database) for read_rows, opened now under the run's
    lock (quick: the ops table is built when the run is loaded); None when the model is built
    or its rows read already."""
    if run in _CACHE or run in _ROWS or isinstance(_FETCHED.get(run), _Read):
        return None
    with run.lock:
        return run.table("ops"), run.cursor()


def read_rows(run, opened) -> None:
    """Read the model's op rows (and the implicit waits' row ids) on `opened`'s cursor (open_rows;
    closed here), without the run's lock, and keep them for build_model. They come from the
    ops table alone, built when the run is loaded and never written after, so they can be read
    before the collectives are matched: the report reads them beside that matching (its
    queries on the run's own connection, in a thread), where they used to be read after it, at
    the head of the model's build (docs/performance.md, session 22)."""
    if opened is None:
        return
    ops_t, cur = opened
    try:
        _retain_freed_memory()
        _ROWS[run] = _read_rows(run, ops_t, cur)
    finally:
        cur.close()


def _read_rows(run, ops_t, cur):
    """(the op rows as _Rows, the row ids of _IMPLICIT_WAIT_APIS' rows or None) on cursor `cur`."""
    # (a stream of batches, each freed before the next is read: _Rows)
    n_rows = Q.rows(cur, f"SELECT count(*) FROM {ops_t} WHERE kind = 'op'").fetchone()[0]
    rows = run.arrow_batches(f"SELECT {', '.join(ROW_COLUMNS)}, rid AS orid, ckey FROM {ops_t} WHERE kind = 'op'",
                             lambda rd: _Rows(rd, int(n_rows)), con=cur)
    rows.attach(Q.arrow(cur, _P2P_ROWS_SQL.format(ops=ops_t)))
    return rows, (_implicit_wait_rids(run, cur) if rows.num_rows else None)


def prefetch(run) -> None:
    """Make ready what build_model(run) reads (kept for it): the run's tables built and a
    DuckDB cursor on its database opened now, under the run's lock; build_model then reads the
    rows on that cursor without the lock. The report does so before it starts the rest of the
    report's queries in a thread beside the model: the model's reads and numpy passes never
    wait for the run's lock behind one of them, and its reads run beside them (DuckDB runs the
    queries of several connections at once) where they used to come first, alone."""
    if run not in _CACHE and run not in _FETCHED:
        _retain_freed_memory()
        if READ_BESIDE:
            _FETCHED[run] = _open(run)
        else:       # (the rows read now, under the lock, before the report's other queries)
            with run.lock:
                _FETCHED[run] = _fetch(run, _open(run))


#: Whether model.prefetch only opens the model's cursor (its rows read by build_model beside
#: the report's other queries) rather than reading the rows then, under the run's lock, before
#: those queries start (sessions 19-20); `COMMTRACE_MODEL_READ_BESIDE=0` for the latter (A/B
#: in one tree: docs/performance.md, session 21).
READ_BESIDE = os.environ.get("COMMTRACE_MODEL_READ_BESIDE", "1") != "0"


def _open(run):
    """(ops table, collectives table, a cursor on the run's database), under the run's lock."""
    with run.lock:
        return run.table("ops"), run.table("collectives"), run.cursor()


def _fetch(run, opened=None):
    """The model's inputs from the run's tables, read on a cursor of their own (_open's; no
    hold of the run's lock while they are read): (the op rows as _Rows (read_rows' when it read
    them ahead), the complete collectives' keys, bytes and bus-bandwidth factors, the row ids of
    _IMPLICIT_WAIT_APIS' rows or None). The tables read are built once and not written after
    that: the same rows whatever the other threads' queries in between."""
    if isinstance(opened, _Read):
        return opened
    ops_t, coll_t, cur = opened if opened is not None else _open(run)
    try:
        ahead = _ROWS.pop(run, None)
        rows, implicit = ahead if ahead is not None else _read_rows(run, ops_t, cur)
        kc = Q.numpy(cur, f"""SELECT ckey, CAST(coalesce(seq, -1) AS BIGINT) AS seq,
                                     CAST(coalesce(bytes, 0) AS DOUBLE) AS cbytes,
                                     CAST(coalesce(busbw_factor, 1.0) AS DOUBLE) AS factor
                              FROM {coll_t} WHERE complete ORDER BY ckey""")
        return _Read((rows, kc, implicit))
    finally:
        cur.close()


class _Read(tuple):
    """_fetch's inputs, read."""


def _build(run, inputs=None) -> Model:
    """The model of `run` from `inputs` (prefetch's _open(run), or None: read now)."""
    import os as _os
    import time as _time
    _T = [_time.process_time(), 0]
    if _os.environ.get("COMMTRACE_MODEL_TIMING"):   # (page faults since the build started)
        import resource
        _T[1] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def tick(name):
        if _os.environ.get("COMMTRACE_MODEL_TIMING"):
            t = _time.process_time()
            import tracemalloc
            mem = ""
            if tracemalloc.is_tracing():
                cur, peak = tracemalloc.get_traced_memory()
                mem = f" current {cur / 1e6:.0f} MB peak {peak / 1e6:.0f} MB"
                tracemalloc.reset_peak()
            import resource
            flt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            print(f"model {name}: {t - _T[0]:.3f} s{mem} (+{flt - _T[1]} page faults)")
            _T[0], _T[1] = t, flt
    rows, kc, implicit_rids = _fetch(run, inputs)
    tick("fetch")
    n = rows.num_rows
    # Slots: one per member of a communication. Collectives: the rows of complete matched
    # (pg, seq), found by the run's integer collective key against the (small) collective
    # table (kc), in numpy. P2P: the n-th send r->p matched with the n-th recv on p from r
    # (metrics.md), both completed: numpy over the rows (_p2p_slots).

    rank_r = rows.take("rank", dtype=np.int64)
    t_enq = rows.take("t_enqueue_ns", fill=np.iinfo(np.int64).min, dtype=np.int64)
    t_ret = rows.take("t_return_ns", fill=np.iinfo(np.int64).min, dtype=np.int64)
    t_end = rows.take("t_end_ns", fill=np.iinfo(np.int64).min, dtype=np.int64)
    t_w = rows.take("t_wait_ns", fill=np.iinfo(np.int64).min, dtype=np.int64)
    t_we = rows.take("t_wait_end_ns", fill=np.iinfo(np.int64).min, dtype=np.int64)
    step_r = rows.take("step", fill=-1, dtype=np.int64)
    NUL = np.iinfo(np.int64).min
    # collective slots, ordered by (collective key, rank): a stable sort by key of rows that
    # are in (rank, t_enqueue) order
    rck = rows.take("ckey", fill=-1, dtype=np.int64)
    kkey = np.asarray(kc["ckey"], np.int64)
    kpos = np.minimum(np.searchsorted(kkey, rck), max(len(kkey) - 1, 0))
    cok = (rck >= 0) & (t_enq != NUL) & (t_end != NUL) & (t_ret != NUL)
    if len(kkey):
        cok &= kkey[kpos] == rck
    else:
        cok[:] = False
    cidx = np.flatnonzero(cok)
    # (by position in the sorted, unique collective keys: the same order as by the key)
    cidx = cidx[stable_argsort(kpos[cidx], 0, max(len(kkey) - 1, 0))]
    del cok
    # p2p slots (positions in `rows`)
    row_pgc, pg_vals = rows.dict_values("pg")
    op_codes, op_vals = rows.dict_values("op")
    pidx, p_ps, p_src, p_dst, p_bytes = _p2p_slots(rows, rck, rank_r, t_enq, t_end, t_ret, row_pgc, pg_vals,
                                                   op_codes, op_vals, NUL)
    np2 = len(pidx)
    nc = len(cidx)
    nsl = nc + np2
    s_rid = np.concatenate([cidx, pidx]).astype(np.int64)
    s_is_p2p = np.r_[np.zeros(nc, bool), np.ones(np2, bool)]
    s_pgc = row_pgc[s_rid]
    del row_pgc
    # communications: a new one where (p2p or not, pg, seq, src, dst) changes from the slot
    # before (collectives: src = dst = 0, (pg, seq) one collective key, kpos; p2p: seq is ps);
    # the per-slot columns of that key are not kept (only the p2p slots' src and dst, for the
    # sync points), and the seq, bytes and bus-bandwidth factors are read per communication
    # (from the collectives' table for collectives: cm_seq, cm_bytes, cm_factor below; the
    # rows' seq column is not read)
    newc = np.ones(nsl, bool)
    if nc > 1:
        c_kp = kpos[cidx]
        np.not_equal(c_kp[1:], c_kp[:-1], out=newc[1:nc])
        del c_kp
    if np2 > 1:
        pp = s_pgc[nc:]
        np.not_equal(pp[1:], pp[:-1], out=newc[nc + 1:])
        newc[nc + 1:] |= (p_ps[1:] != p_ps[:-1]) | (p_src[1:] != p_src[:-1]) | (p_dst[1:] != p_dst[:-1])
        del pp
    cm_lo = np.flatnonzero(newc).astype(np.int64)
    cc_lo, pc_lo = cm_lo[cm_lo < nc], cm_lo[cm_lo >= nc] - nc     # (collective, p2p) comms' first slots
    ck_lo = kpos[cidx[cc_lo]]
    cm_seq = np.concatenate([np.asarray(kc["seq"], np.int64)[ck_lo] if len(kkey) else np.zeros(0, np.int64),
                             p_ps[pc_lo]]).astype(np.int64, copy=False)
    cm_bytes = np.concatenate([np.asarray(kc["cbytes"], np.float64)[ck_lo] if len(kkey) else np.zeros(0),
                               np.asarray(p_bytes, np.float64)[pc_lo]])
    cm_factor = np.r_[np.asarray(kc["factor"], np.float64)[ck_lo] if len(kkey) else np.zeros(0), np.ones(len(pc_lo))]
    del rck, kpos, cidx, pidx, kc, cc_lo, pc_lo, ck_lo, p_ps, p_bytes
    tick("slots")
    _implicit_waits(_implicit_wait_rows(rows, implicit_rids), rank_r, t_enq, t_ret, t_end, t_w, t_we, NUL)
    # every column is read: the rows' labels are dictionary codes (_CodeLabels), and the fetched
    # strings go with the rest of the table
    site_codes, site_vals = rows.dict_values("site")
    row_op = _CodeLabels(op_codes, op_vals)
    row_site = _CodeLabels(site_codes, site_vals)
    rows.release()
    have = [int(x[x != NUL].min()) for x in (t_enq, t_we) if (x != NUL).any()]
    base = min(have) if have else 0
    del have

    def rel(a, at=None):
        """Times `a` (int64 ns, NUL: null) as float64 ns since `base`, NaN for null; only rows
        `at` when given (the slots' entries and leaves, the p2p closings: not every column
        converted whole for them, 5 x 1.28M rows on 64 x 20,000)."""
        if at is not None:
            d = a[at]
            nul = d == NUL
            d -= base
        else:
            nul = a == NUL
            d = a - base
        out = d.astype(np.float64)
        del d
        out[nul] = np.nan
        return out

    # ---- events: calls and waits, sorted by (rank, start, call before wait): every rank's
    # events contiguous, in rank order (rank_lo / rank_hi below, delay analysis and the replay
    # rely on it)
    packed = _packed_keys_exact(rank_r, t_enq, t_w, base, NUL)
    r = _C.merge_events(rank_r, t_enq, t_ret, t_w, t_we, base, NUL) if _C is not None and packed else None
    if r is not None:   # one merge in C (the numpy below is its reference)
        ev_row, ev_is_wait, ev_start, ev_rel, ev_rank, call_ev = (
            np.frombuffer(x, t) for x, t in zip(r, (np.int64, np.bool_, np.float64, np.float64, np.int64, np.int64)))
        E = len(ev_row)
        del r
    else:
        ev_row, ev_is_wait, ev_start, ev_rel, ev_rank, call_ev = _events_numpy(
            rank_r, t_enq, t_w, rel(t_enq), rel(t_ret), rel(t_w), rel(t_we), base, n, packed)
        E = len(ev_row)
    del t_w
    tick("events")
    # where each rank's events start (they come by rank)
    rank_lo = np.flatnonzero(np.r_[True, ev_rank[1:] != ev_rank[:-1]]) if E else np.zeros(0, np.int64)
    ranks = ev_rank[rank_lo]
    rank_hi = np.r_[rank_lo[1:], E].astype(np.int64)
    ev_first = np.zeros(E, bool)
    ev_first[rank_lo] = True

    # ---- slots and communications
    sl_comm = np.cumsum(newc) - 1
    cm_hi = np.r_[cm_lo[1:], nsl].astype(np.int64)
    C = len(cm_lo)
    sl_rank = rank_r[s_rid]
    sl_call = call_ev[s_rid]
    sl_enter = rel(t_enq, s_rid)
    sl_leave = rel(t_end, s_rid)
    del t_enq, t_end
    # group key of a slot: collectives by pg, p2p by (pg, unordered pair)
    # latest arrival per comm
    if C:
        last_enter = np.maximum.reduceat(sl_enter, cm_lo)
    else:
        last_enter = np.zeros(0)
    # previous slot on the same group and rank (collectives only: one collective at a time)
    sl_prev = np.full(nsl, -1, np.int64)
    coll_sl = np.flatnonzero(~s_is_p2p)
    pv = None
    if len(coll_sl) and _C is not None:     # slots in enter order per group already: in C
        gq = _dense_ids([s_pgc[coll_sl], sl_rank[coll_sl].astype(np.int64)])
        if gq is not None:
            gfull = np.full(nsl, -1, np.int64)
            gfull[coll_sl] = gq
            pv = _C.slot_prev(gfull, np.ascontiguousarray(sl_enter, np.float64), int(gq.max()) + 1)
            del gfull
    if pv is not None:
        sl_prev = np.frombuffer(pv, np.int64)
    elif len(coll_sl):
        gq = _dense_ids([s_pgc[coll_sl], sl_rank[coll_sl].astype(np.int64)])
        ent = sl_enter[coll_sl]
        if gq is not None and int(gq.max()) < (1 << 19) and _whole_ns(ent):
            # (group, enter, slot) order by one stable int64 argsort
            o2 = coll_sl[np.argsort((gq << 44) + ent.astype(np.int64), kind="stable")]
        else:
            with np.errstate(over="ignore"):
                hq = _mix(s_pgc[coll_sl], sl_rank[coll_sl].astype(np.int64))
            o2 = coll_sl[np.lexsort((ent, hq))]
        del ent
        same = np.r_[False, (sl_rank[o2[1:]] == sl_rank[o2[:-1]]) & (s_pgc[o2[1:]] == s_pgc[o2[:-1]])]
        sl_prev[o2[same]] = o2[np.flatnonzero(same) - 1]
    queue = np.where(sl_prev >= 0, sl_leave[np.maximum(sl_prev, 0)], -np.inf)
    cm_T0 = np.maximum(last_enter, np.maximum.reduceat(queue, cm_lo)) if C else np.zeros(0)
    T0_sl = cm_T0[sl_comm] if nsl else np.zeros(0)
    sl_dep = sl_leave >= T0_sl
    sl_tc = sl_leave - sl_enter
    np.subtract(sl_leave, T0_sl, out=sl_tc, where=sl_dep)
    # the latest arrival of each comm (first of ties)
    if C:
        is_last = sl_enter == last_enter[sl_comm]
        cand = np.where(is_last, np.arange(nsl), nsl)
        cm_last = np.minimum.reduceat(cand, cm_lo)
    else:
        cm_last = np.zeros(0, np.int64)
    cm_is_p2p = s_is_p2p[cm_lo] if C else np.zeros(0, bool)
    cm_op = np.where(cm_is_p2p, "send/recv", op_vals[op_codes[s_rid[cm_lo]]] if C else np.zeros(0, object)).astype(object)
    cm_pg = pg_vals[s_pgc[cm_lo]] if C else np.zeros(0, object)
    # codes: "send/recv" after the row ops' names (op_vals ends with "" for null)
    op_names = np.r_[op_vals, np.array(["send/recv"], dtype=object)]
    cm_opc = np.where(cm_is_p2p, len(op_vals), op_codes[s_rid[cm_lo]] if C else np.zeros(0, np.int64)).astype(np.int64)
    cm_opc = np.where(cm_opc < 0, len(op_vals) - 1, cm_opc)
    cm_pgc = np.where(s_pgc[cm_lo] < 0, len(pg_vals) - 1, s_pgc[cm_lo]).astype(np.int64) if C else np.zeros(0, np.int64)
    tc_dep = np.where(sl_dep, sl_tc, np.inf)
    cm_tcomm = np.minimum.reduceat(tc_dep, cm_lo) if C else np.zeros(0)
    cm_tcomm = np.where(np.isfinite(cm_tcomm), cm_tcomm, 0.0)
    del queue, T0_sl, tc_dep, newc, call_ev
    if C:
        del is_last, cand
    # (freed as soon as they are read: the model's peak is what the page faults cost)
    del rank_r
    coll_sl = gq = None

    tick("slots")
    # ---- events <-> slots, anchors, gaps
    sl_of_row = np.full(n, -1, np.int64)
    sl_of_row[s_rid] = np.arange(nsl)
    args = (ev_row, ev_start, ev_rel, ev_first, sl_of_row, sl_leave, sl_enter, sl_comm, last_enter)
    if _C is not None:      # one pass in C (the numpy below is its reference)
        ev_slot, ev_anchor, ev_rho, ev_dur, ev_gap, sl_block, sl_wait = (
            np.frombuffer(x, t) for x, t in zip(_C.anchors(*(np.ascontiguousarray(v) for v in args)),
                                                (np.int64, np.bool_) + (np.float64,) * 5))
    else:
        ev_slot, ev_anchor, ev_rho, ev_dur, ev_gap, sl_block, sl_wait = _anchors_numpy(*args)
    ev_step = step_r[ev_row]
    del sl_of_row, step_r, args

    tick("anchors")
    # synchronisation point of each slot: the latest release, at or before its entry, of a
    # host event of the same rank that waited for a communication of the same group (p2p: the
    # same pair). An async op issued but not yet waited is no synchronisation point.
    sl_sync = np.full(nsl, np.nan)
    if nsl:
        pl = np.full(nsl, -1, np.int64)
        ph = np.full(nsl, -1, np.int64)
        np.minimum(p_src, p_dst, out=pl[nc:])
        np.maximum(p_src, p_dst, out=ph[nc:])
        # dense id of (group key, rank) per slot (any numbering: only equality matters)
        gr = _dense_ids([s_pgc, pl, ph, sl_rank.astype(np.int64)])
        if gr is None:
            with np.errstate(over="ignore"):
                h3 = _mix(_mix(_mix(s_pgc, pl), ph), sl_rank.astype(np.int64))
            o3 = np.argsort(h3, kind="stable")
            newk = np.r_[True, (sl_rank[o3[1:]] != sl_rank[o3[:-1]]) | (s_pgc[o3[1:]] != s_pgc[o3[:-1]])
                         | (pl[o3[1:]] != pl[o3[:-1]]) | (ph[o3[1:]] != ph[o3[:-1]])]
            gr = np.empty(nsl, np.int64)
            gr[o3] = np.cumsum(newk) - 1
            del h3, o3, newk
        r = None
        if _C is not None:   # anchors bucketed by group in C (in floor(rel) order already),
            # read in place (no copies of the 1.28M anchors' groups and times on 64 x 20,000)
            r = _C.sync_points_ev(np.ascontiguousarray(ev_slot, np.int64), np.ascontiguousarray(ev_anchor).view(np.uint8),
                                  np.ascontiguousarray(ev_rel, np.float64), np.ascontiguousarray(gr, np.int64),
                                  np.ascontiguousarray(sl_enter, np.float64), int(gr.max()) + 1 if nsl else 0)
        ai = np.flatnonzero(ev_anchor) if r is None else None
        if r is not None:
            okj = np.frombuffer(r[0], np.bool_)
            sl_sync[okj] = np.frombuffer(r[1], np.float64)[okj]
            akey = ao = akey_s = arel_s = q = j = None
        else:
            akey = (gr[ev_slot[ai]] << 44) + np.floor(ev_rel[ai]).astype(np.int64)
            ao = np.argsort(akey, kind="stable")
            akey_s = akey[ao]
            arel_s = ev_rel[ai][ao]
            q = (gr << 44) + np.floor(sl_enter).astype(np.int64)
            j = np.searchsorted(akey_s, q, "right") - 1
            okj = (j >= 0) & ((akey_s[np.maximum(j, 0)] >> 44) == gr) if len(akey_s) else np.zeros(nsl, bool)
            sl_sync[okj] = arel_s[j[okj]]
        # p2p: an eager send is never waited for, so the previous transfer on the pair counts
        # as the synchronisation point once its call returned (Scalasca: the interval since
        # the previous communication between the two)
        ai = None
        p2 = np.flatnonzero(s_is_p2p)
        if len(p2):
            o4 = p2[np.lexsort((sl_enter[p2], gr[p2]))]
            same = np.r_[False, gr[o4[1:]] == gr[o4[:-1]]]
            cur, prv = o4[same], o4[np.flatnonzero(same) - 1]
            closing = rel(t_ret, s_rid[prv])
            wend = rel(t_we, s_rid[prv])
            closing = np.where(~np.isnan(wend) & (wend <= sl_enter[cur]), np.fmax(closing, wend), closing)
            sl_sync[cur] = np.fmax(sl_sync[cur], closing)
        del pl, ph, gr, akey, ao, akey_s, arel_s, q, j, okj
    # no previous sync on the group: the rank's first event
    first_start = np.full(int(ranks.max()) + 1 if len(ranks) else 1, np.nan)
    first_start[ranks] = ev_start[rank_lo]
    miss = np.isnan(sl_sync)
    sl_sync[miss] = first_start[sl_rank[miss]] if nsl else sl_sync[miss]
    sl_sync = np.minimum(sl_sync, sl_enter)
    del p_src, p_dst, s_pgc, s_rid, s_is_p2p, t_ret, t_we

    tick("sync")
    # ---- excess gap: gap minus the median gap of the same event on the other ranks
    ev_excess, ev_has_peers = _excess_of(ev_slot, sl_comm, cm_lo, cm_hi, cm_is_p2p, ev_row, site_codes, op_codes,
                                         ev_rank, ev_is_wait, ev_gap, ev_first, ev_step, sl_call)
    del site_codes, op_codes
    tick("excess")
    # ---- window: from the first release of a rank that waited for another, to the last release
    anc = np.flatnonzero(ev_anchor)
    if len(anc):
        fa = np.unique(ev_rank[anc], return_index=True)[1]
        t_begin = float(np.min(ev_rel[anc[fa]]))
    else:
        t_begin = float(np.min(ev_start)) if E else 0.0
    t_end_ = float(np.max(ev_rel)) if E else 0.0
    return Model(
        base_ns=base, ranks=ranks.astype(np.int64), ev_rank=ev_rank, ev_start=ev_start, ev_rel=ev_rel,
        ev_row=ev_row, ev_is_wait=ev_is_wait, ev_slot=ev_slot, ev_anchor=ev_anchor, ev_gap=ev_gap,
        ev_dur=ev_dur, ev_rho=ev_rho, ev_first=ev_first, ev_excess=ev_excess, ev_has_peers=ev_has_peers,
        ev_step=ev_step, rank_lo=rank_lo.astype(np.int64), rank_hi=rank_hi,
        sl_comm=sl_comm.astype(np.int64), sl_rank=sl_rank, sl_call=sl_call, sl_enter=sl_enter,
        sl_leave=sl_leave, sl_dep=sl_dep, sl_tc=sl_tc, sl_prev=sl_prev, sl_sync=sl_sync, sl_wait=sl_wait, sl_block=sl_block,
        cm_lo=cm_lo, cm_hi=cm_hi, cm_T0=cm_T0, cm_last=cm_last.astype(np.int64), cm_is_p2p=cm_is_p2p,
        cm_op=cm_op, cm_pg=cm_pg, cm_seq=cm_seq, cm_bytes=cm_bytes, cm_factor=cm_factor, cm_tcomm=cm_tcomm,
        row_op=row_op, row_site=row_site, t_begin=t_begin, t_end=t_end_,
        cm_opc=cm_opc, cm_pgc=cm_pgc, op_names=op_names, pg_names=pg_vals)


def _excess_of(ev_slot, sl_comm, cm_lo, cm_hi, cm_is_p2p, ev_row, site_codes, op_codes, ev_rank, ev_is_wait,
               ev_gap, ev_first, ev_step, sl_call):
    """_build's excess gaps: gap minus the median gap of the same event (site, op, call/wait,
    step, occurrence) on the other ranks that have it (_excess): (ev_excess, ev_has_peers)."""
    E, nsl, C = len(ev_slot), len(sl_comm), len(cm_lo)
    ev_coll = np.where(ev_slot >= 0, sl_comm[np.maximum(ev_slot, 0)] if nsl else -1, -1)
    if C:
        cc = np.maximum(ev_coll, 0)
        ev_coll = np.where((ev_coll >= 0) & ~cm_is_p2p[cc] & (cm_hi[cc] - cm_lo[cc] >= 2), ev_coll, -1)
        del cc
    # (site, op) labels: _excess compares them only between the events outside a collective
    # (ev_coll < 0), so only those rows' sites are encoded (0 elsewhere)
    ev_lab = np.zeros(E, np.int64)
    oth = np.flatnonzero(ev_coll < 0)
    if len(oth):
        orow = ev_row[oth]
        # (equal sites, equal codes: only equality matters to _excess' groups)
        ev_lab[oth] = site_codes[orow].astype(np.int64) * 4096 + op_codes[orow]
        del orow
    del oth
    return _excess(ev_rank, ev_lab, ev_is_wait, ev_gap, ev_first, ev_step, ev_coll,
                   slots=(sl_call, ev_slot, cm_lo, cm_hi, ~cm_is_p2p & (cm_hi - cm_lo >= 2)))


def _anchors_numpy(ev_row, ev_start, ev_rel, ev_first, sl_of_row, sl_leave, sl_enter, sl_comm, last_enter):
    """_build's anchors, residuals, gaps and wait states in numpy (the reference of
    `_replay.anchors`): (ev_slot, ev_anchor, ev_rho, ev_dur, ev_gap, sl_block, sl_wait)."""
    E, nsl = len(ev_row), len(sl_leave)
    ev_slot = sl_of_row[ev_row]
    has = ev_slot >= 0
    Lev = np.full(E, np.nan)
    Lev[has] = sl_leave[ev_slot[has]]
    ev_anchor = has & (ev_rel >= Lev)
    ev_rho = np.where(ev_anchor, ev_rel - np.maximum(ev_start, np.nan_to_num(Lev, nan=-np.inf)), 0.0)
    ev_dur = ev_rel - ev_start
    # a wait state needs the host to wait: it starts when the host blocked on the op (the
    # call, or its wait()); an op nobody waited for delayed nobody (metrics.md late sender
    # takes the wait() start for isend/irecv alike)
    sl_block = np.full(nsl, np.inf)
    ai = np.flatnonzero(ev_anchor)
    if len(ai):
        np.minimum.at(sl_block, ev_slot[ai], ev_start[ai])
    blocked = np.isfinite(sl_block)
    sl_wait = np.where(blocked, np.maximum(0.0, np.minimum(last_enter[sl_comm] if nsl else np.zeros(0), sl_leave)
                                           - np.where(blocked, sl_block, 0.0)), 0.0)
    sl_block = np.where(blocked, sl_block, sl_enter)
    prev_rel = np.r_[0.0, ev_rel[:-1]]
    ev_gap = np.where(ev_first, ev_start, ev_start - prev_rel)
    return ev_slot, ev_anchor, ev_rho, ev_dur, ev_gap, sl_block, sl_wait


def _packed_keys_exact(rank_r, t_enq, t_w, base, NUL) -> bool:
    """Whether the events' merge keys rank << 44 | ns since `base` (`_replay.merge_events`,
    _events_numpy) order the calls and waits exactly as (rank, start): every rank in [0, 2^19)
    and every enqueue and wait start in [base, base + 2^44) (2^44 ns is 4.9 hours). Where they do
    not (a longer run), _events_numpy sorts by (rank, start) itself."""
    if not len(rank_r):
        return True
    if int(rank_r.min()) < 0 or int(rank_r.max()) >= 1 << 19:
        return False
    for t in (t_enq, t_w):
        ok = t != NUL
        if ok.any() and (int(t[ok].min()) < base or int(t[ok].max()) - base >= 1 << 44):
            return False
    return True


def _events_numpy(rank_r, t_enq, t_w, enq, ret, tw, twe, base, n, packed=True):
    """_build's host events by numpy sorts (the reference of `_replay.merge_events`): (ev_row,
    ev_is_wait, ev_start, ev_rel, ev_rank, call_ev), in (rank, start, call before wait, row)
    order. `packed`: by the int64 keys of merge_events (exact where _packed_keys_exact), else
    by a lexsort of those columns."""
    call_ok = ~np.isnan(enq) & ~np.isnan(ret)
    wait_ok = ~np.isnan(tw) & ~np.isnan(twe)
    rid_c = np.flatnonzero(call_ok)
    rid_w = np.flatnonzero(wait_ok)
    ev_row = np.concatenate([rid_c, rid_w])
    ev_is_wait = np.concatenate([np.zeros(len(rid_c), bool), np.ones(len(rid_w), bool)])
    ev_start = np.concatenate([enq[rid_c], tw[rid_w]])
    ev_rel = np.concatenate([ret[rid_c], twe[rid_w]])
    ev_rank = rank_r[ev_row]
    if not packed:
        # (rows in (rank, t_enqueue, row id) order: a call's row order breaks its ties, a
        # wait's too, and a call goes before a wait of the same start)
        nc = len(rid_c)
        tt = np.concatenate([t_enq[rid_c], t_w[rid_w]])
        order = np.lexsort((ev_row, ev_is_wait, tt, ev_rank))
        del tt
        ev_row, ev_is_wait, ev_start, ev_rel, ev_rank = (a[order] for a in (ev_row, ev_is_wait, ev_start, ev_rel,
                                                                              ev_rank))
        call_ev = np.full(n, -1, np.int64)
        idx = np.flatnonzero(~ev_is_wait)
        call_ev[ev_row[idx]] = idx
        return ev_row, ev_is_wait, ev_start, ev_rel, ev_rank, call_ev
    # rows come ordered by (rank, t_enqueue): the calls are in order already; merge the waits
    # in with int64 keys (rank << 44 | ns since base; 2^44 ns is 4.9 hours)
    ck = (rank_r[rid_c] << 44) + (t_enq[rid_c] - base)
    wk = (rank_r[rid_w] << 44) + (t_w[rid_w] - base)
    if len(ck) > 1 and not np.all(ck[1:] >= ck[:-1]):
        co = np.argsort(ck, kind="stable")
    else:
        co = None
    wo = np.argsort(wk, kind="stable")
    cks = ck if co is None else ck[co]
    wks = wk[wo]
    nc = len(ck)
    # a wait goes after every call with a key <= its own (call before wait on ties)
    wpos = np.searchsorted(cks, wks, side="right") + np.arange(len(wks))
    order = np.empty(nc + len(wks), np.int64)
    is_w = np.zeros(nc + len(wks), bool)
    is_w[wpos] = True
    order[wpos] = nc + wo
    order[~is_w] = np.arange(nc) if co is None else co
    ev_row, ev_is_wait, ev_start, ev_rel, ev_rank = (a[order] for a in (ev_row, ev_is_wait, ev_start, ev_rel, ev_rank))
    del ck, wk, co, wo, cks, wks, wpos, order, call_ok, wait_ok, rid_c, rid_w
    call_ev = np.full(n, -1, np.int64)
    idx = np.flatnonzero(~is_w)
    call_ev[ev_row[idx]] = idx
    del idx, is_w
    return ev_row, ev_is_wait, ev_start, ev_rel, ev_rank, call_ev


def _p2p_sql(run) -> pa.Table:
    """The p2p slots by SQL (the reference of _p2p_slots, tests/test_rootcause_fast.py): one row
    per member of a matched send/recv pair, `rid` of its row, ordered by (pg, src, dst, ps,
    rank)."""
    ops_t = run.table("ops")
    return run.arrow(f"""
        WITH x AS (
            SELECT rid, pg, op, rank, peer, bytes,
                   row_number() OVER (PARTITION BY pg, op, rank, peer ORDER BY t_enqueue_ns, op_id) AS ps
            FROM {ops_t} WHERE kind = 'op' AND ckey IS NULL AND op IN ('send', 'recv') AND peer IS NOT NULL
              AND peer >= 0 AND t_enqueue_ns IS NOT NULL AND t_end_ns IS NOT NULL AND t_return_ns IS NOT NULL),
        s AS (SELECT * FROM x WHERE op = 'send'),
        r AS (SELECT * FROM x WHERE op = 'recv'),
        p AS (
            SELECT s.pg, s.ps, s.rank AS src, s.peer AS dst, s.rid AS srid, r.rid AS rrid,
                   s.rank AS srank, r.rank AS rrank, coalesce(s.bytes, r.bytes) AS cbytes
            FROM s JOIN r ON s.pg = r.pg AND s.rank = r.peer AND s.peer = r.rank AND s.ps = r.ps)
        SELECT * FROM (
            SELECT pg, ps, src, dst, srid AS rid, srank AS rank, cbytes FROM p
            UNION ALL SELECT pg, ps, src, dst, rrid, rrank, cbytes FROM p)
        ORDER BY pg, src, dst, ps, rank""")


def _p2p_slots(rows: "_Rows", rck, rank_r, t_enq, t_end, t_ret, pgc, pg_vals, op_codes, op_vals, NUL):
    """The p2p slots of metrics.md's matching, in numpy over the rows: the n-th send r -> p
    (in (t_enqueue_ns, op_id) order on its (pg, rank, peer)) with the n-th recv on p from r,
    both completed. Returns (positions in `rows`, ps, src, dst, bytes), one entry per member,
    ordered by (pg name, src, dst, ps, rank), as _p2p_sql."""
    empty = (np.zeros(0, np.int64),) * 4 + (np.zeros(0),)
    names = [str(v) for v in op_vals]
    if "send" not in names[:-1] or "recv" not in names[:-1]:
        return empty
    c_send, c_recv = names.index("send"), names.index("recv")
    x = np.flatnonzero((rck < 0) & ((op_codes == c_send) | (op_codes == c_recv)) & (pgc >= 0)
                       & (t_enq != NUL) & (t_end != NUL) & (t_ret != NUL))
    peer = rows.col_at("peer", x, fill=-1, dtype=np.int64)
    x, pr = x[peer >= 0], peer[peer >= 0]
    del peer
    if not len(x):
        return empty
    big = np.iinfo(np.int64).max
    is_send = op_codes[x] == c_send
    rk, pg = rank_r[x], pgc[x]
    # ps: row_number() over (pg, op, rank, peer) ordered by (t_enqueue_ns, op_id); row id on ties
    o = _partition_order([pg, is_send.astype(np.int64), rk, pr], t_enq[x],
                         lambda: (rows.col_at("op_id", x, fill=big, dtype=np.int64), rows.col_at("orid", x, dtype=np.int64)))
    part = np.r_[True, (pg[o][1:] != pg[o][:-1]) | (is_send[o][1:] != is_send[o][:-1]) | (rk[o][1:] != rk[o][:-1])
                 | (pr[o][1:] != pr[o][:-1])]
    ps = np.empty(len(x), np.int64)
    starts = np.flatnonzero(part)
    ps[o] = np.arange(len(x)) - starts[np.cumsum(part) - 1] + 1
    src = np.where(is_send, rk, pr)
    dst = np.where(is_send, pr, rk)
    # pg in name order (ORDER BY pg): its rank among the group names
    pg_order = np.empty(len(pg_vals), np.int64)
    pg_order[sorted(range(len(pg_vals)), key=lambda i: str(pg_vals[i]))] = np.arange(len(pg_vals))
    pgr = pg_order[pg]
    # a send and its recv have equal (pg, src, dst, ps), unique on each side: adjacent once
    # sorted, the send first
    o2 = np.lexsort((~is_send, ps, dst, src, pgr))
    same = ((pgr[o2][1:] == pgr[o2][:-1]) & (src[o2][1:] == src[o2][:-1]) & (dst[o2][1:] == dst[o2][:-1])
            & (ps[o2][1:] == ps[o2][:-1]) & is_send[o2][:-1] & ~is_send[o2][1:])
    k = np.flatnonzero(same)
    si, ri = o2[k], o2[k + 1]
    b = rows.col_at("bytes", x, dtype=np.float64)    # null -> NaN
    cb = np.where(np.isnan(b[si]), b[ri], b[si])
    cb = np.where(np.isnan(cb), 0.0, cb)
    # two members per pair, by rank (send first on equal ranks)
    first = np.where(src[si] <= dst[si], si, ri)
    second = np.where(src[si] <= dst[si], ri, si)
    mem = np.stack([first, second], 1).ravel()
    two = lambda a: np.repeat(a, 2)  # noqa: E731
    return x[mem], two(ps[si]), two(src[si]), two(dst[si]), two(cb)


def _partition_order(part_cols: list, t: np.ndarray, ties) -> np.ndarray:
    """np.lexsort((rid, op_id, t, *reversed(part_cols))) for rows in (rank, t) order, where
    `ties()` returns (op_id, rid) (read only when needed): the partitions by a counting sort
    of their dense ids, which keeps the rows' order within each; that is the lexsort's when
    the rows of a partition come in increasing (t, op_id, rid), checked, else the lexsort.
    (_p2p_slots: 0.12 s of lexsort over the 284,000 send/recv rows of the 64 x 20,000 run.)"""
    pid = _dense_ids(part_cols)
    if pid is not None:
        o = stable_argsort(pid, 0, int(pid.max()) if len(pid) else 0)
        same = pid[o][1:] == pid[o][:-1]
        ts = t[o]
        up = ts[1:] > ts[:-1]
        if np.all(up | ~same):
            return o
        op_id, rid = ties()
        a, b = op_id[o], rid[o]
        eq = ts[1:] == ts[:-1]
        up |= eq & ((a[1:] > a[:-1]) | ((a[1:] == a[:-1]) & (b[1:] > b[:-1])))
        if np.all(up | ~same):
            return o
    else:
        op_id, rid = ties()
    return np.lexsort((rid, op_id, t) + tuple(reversed(part_cols)))


def _implicit_wait_rids(run, con=None):
    """Row ids of the rows whose API is one of `_IMPLICIT_WAIT_APIS` (read from the parts:
    `api` is a lazy column; on `con` when given); None when there are none."""
    names = ", ".join("'" + a + "'" for a in _IMPLICIT_WAIT_APIS)
    try:
        hit = run.lazy_columns(f"api IN ({names})", ["api"], con=con)
    except Exception:  # a trace without the column: no implicit waits
        return None
    return Q.arrow_numpy(hit.column("rid")) if hit.num_rows else None


def _implicit_wait_rows(rows: "_Rows", rids) -> np.ndarray:
    """Mask of `rows` whose row id is one of `rids` (_implicit_wait_rids')."""
    if rids is None or not rows.num_rows:
        return np.zeros(rows.num_rows, bool)
    return np.isin(rows.col("orid", dtype=np.int64), rids)


def _implicit_waits(cand, rank_r, t_enq, t_ret, t_end, t_w, t_we, NUL) -> None:
    """Give the unwaited completions that the program blocks on in C++ a wait event, in place.

    DDP's Reducer waits for every bucket's all_reduce at the end of backward, in C++, so the
    trace has no wait() for them: without one, the time a rank sat blocked on a late peer would
    count as its own compute gap, and the rank that waited would look like the delayed one.
    For such a row j (an API of `_IMPLICIT_WAIT_APIS`, completed, no recorded wait) whose
    completion falls after the return of call b (b >= j, the rank's last call before it) and
    no later than the next call's start, the rank is taken as blocked from b's return until the
    latest such completion: one wait event per gap, on the row that completed last. Completions
    that arrive during a later call or before one returns need no wait. The replay of the
    unchanged trace is unaffected (the wait releases at the measured completion)."""
    n = len(rank_r)
    if not n:
        return
    cand = cand & (t_w == NUL) & (t_end != NUL) & (t_ret != NUL) & (t_enq != NUL)
    js = np.flatnonzero(cand)
    if not len(js):
        return
    # Rows are in (rank, t_enqueue) order: one sorted int64 key per row, rank-major (each rank
    # owns a key range of `stride`; a row without t_enqueue sorts at its rank's end), so that
    # one searchsorted finds, for every candidate j, b = the last call of its rank that started
    # before its completion (b < j when none: the completion came before j's own start).
    ok = t_enq != NUL
    lo = int(t_enq[ok].min())
    span = int(t_enq[ok].max()) - lo
    stride = span + 2
    _, rank_pos = np.unique(rank_r, return_inverse=True)
    rkey = rank_pos.astype(np.int64) * stride
    key = rkey + np.where(ok, t_enq - lo, span + 1)
    q = rkey[js] + np.clip(t_end[js] - lo, 0, span + 1)
    bs = np.searchsorted(key, q, side="left") - 1
    bi = np.maximum(bs, 0)
    keep = (bs >= js) & (t_ret[bi] < t_end[js])
    js, bs = js[keep], bs[keep]
    if not len(js):
        return
    # per call b: the candidate that completed last (the first of them on ties)
    o = np.lexsort((js, -t_end[js], bs))
    first = np.r_[True, bs[o][1:] != bs[o][:-1]]
    b_, j_ = bs[o][first], js[o][first]
    t_w[j_] = t_ret[b_]
    t_we[j_] = t_end[j_]


def stable_argsort(keys: np.ndarray, lo: int | None = None, hi: int | None = None) -> np.ndarray:
    """np.argsort(keys, kind="stable") for int64 keys; by a counting sort in C when their range
    (lo..hi, computed when not given) is at most 4 per key (or 2^16)."""
    keys = np.asarray(keys)
    n = len(keys)
    if _C is not None and n > 1 and keys.dtype.kind in "iu":
        if lo is None:
            lo, hi = int(keys.min()), int(keys.max())
        K = hi - lo + 1
        if K <= max(4 * n, 1 << 16):
            k = keys.astype(np.int64) - lo if lo else np.ascontiguousarray(keys, np.int64)
            return np.frombuffer(_C.counting_argsort(k, K), np.int64)
    return np.argsort(keys, kind="stable")


def _dense_ids(cols: list, limit: int = 1 << 25):
    """Equal ids for equal tuples of the int64 columns, numbered 0.. in the tuples' order,
    through a table over the tuples' range (no sort); None when that range exceeds `limit`."""
    n = len(cols[0])
    if not n:
        return np.zeros(0, np.int64)
    key = np.zeros(n, np.int64)
    size = 1
    for c in cols:
        lo, hi = int(c.min()), int(c.max())
        w = hi - lo + 1
        size *= w
        if size > limit:
            return None
        key *= w
        key += c - lo
    present = np.zeros(size, bool)
    present[key] = True
    ids = np.cumsum(present) - 1
    return ids[key]


def _whole_ns(t: np.ndarray) -> bool:
    """Times that are whole ns in [0, 2^44) (int64 keys rank-or-group << 44 | ns keep their order)."""
    return bool(len(t) == 0 or (np.all(t >= 0) and np.all(t < 2.0 ** 44) and np.array_equal(np.floor(t), t)))


def _mix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """64-bit hash combination of two int64 arrays (splitmix64-style, wrapping)."""
    x = (a * np.int64(-7046029254386353131)) ^ (b + np.int64(0x632BE59BD9B4E019))
    x = (x ^ (x >> np.int64(31))) * np.int64(-4658895280553007687)
    return x ^ (x >> np.int64(29))


def _excess(ev_rank, ev_label, ev_is_wait, ev_gap, ev_first, ev_step, ev_coll, slots=None):
    """Per event: max(0, gap - median of the same event's gaps on the other ranks). The same
    event: for a collective's call or wait(), the other members' call or wait() of that
    collective; for any other event (p2p, unmatched ops), the same (site, op, call or wait,
    step) and the same occurrence of it within the rank's step, i.e. the same place in the
    program (a pipeline's stages compare their sends with each other).

    `slots` = (sl_call, ev_slot, cm_lo, cm_hi, comm_ok): the collectives' events are then
    compared within their communication's slots (contiguous, one row of a matrix per
    communication, sorted along the row), and only the other events by one global sort;
    without it (the reference), every event by the global sort. Equal results."""
    if slots is None or not len(ev_gap):
        return _excess_by_sort(ev_rank, ev_label, ev_is_wait, ev_gap, ev_first, ev_step, ev_coll)
    if _C is not None:
        r = _excess_c(ev_rank, ev_label, ev_is_wait, ev_gap, ev_first, ev_step, ev_coll, slots)
        if r is not None:
            return r
    sl_call, ev_slot, cm_lo, cm_hi, comm_ok = slots
    E = len(ev_gap)
    ex = np.zeros(E)
    hp = np.zeros(E, bool)
    g = np.where(ev_first, np.nan, np.maximum(ev_gap, 0.0))
    nsl = len(sl_call)
    wi = np.flatnonzero(ev_is_wait & (ev_slot >= 0))
    wait_ev = np.full(nsl, -1, np.int64)
    wait_ev[ev_slot[wi]] = wi
    size = cm_hi - cm_lo
    for n in np.unique(size[comm_ok]).tolist():
        cs = np.flatnonzero(comm_ok & (size == n))
        idx = cm_lo[cs][:, None] + np.arange(n)[None, :]          # slots, one row per comm
        for evm in (sl_call[idx], wait_ev[idx]):
            v = np.where(evm >= 0, g[np.maximum(evm, 0)], np.nan)
            e_out, h_out = _median_others_rows(v)
            ok = evm >= 0
            ex[evm[ok]] = e_out[ok]
            hp[evm[ok]] = h_out[ok]
    other = np.flatnonzero(ev_coll < 0)
    if len(other):
        args = (ev_rank[other], ev_label[other], ev_is_wait[other], ev_gap[other], ev_first[other], ev_step[other])
        r = _excess_other(*args)
        e2, h2 = r if r is not None else _excess_by_sort(*args, np.full(len(other), -1, np.int64))
        ex[other] = e2
        hp[other] = h2
    return ex, hp


def _excess_c(ev_rank, ev_label, ev_is_wait, ev_gap, ev_first, ev_step, ev_coll, slots=None):
    """_excess by `_replay.median_excess`: one group id per event (a collective's calls, its
    wait()s, and the other events' (key, step, occurrence) groups of _excess_other), and the
    medians per group in C. With `slots` (as _excess), the collectives' groups are read by
    slot (`_replay.median_excess_comms`) and only the other events go through the group ids.
    None when the other events' groups do not fit _dense_ids' tables."""
    if slots is not None:
        return _excess_c_slots(ev_rank, ev_label, ev_is_wait, ev_gap, ev_first, ev_step, ev_coll, slots)
    wi = ev_is_wait.astype(np.int64)
    gid = np.where(ev_coll >= 0, ev_coll * 2 + wi, -1)
    ncoll = int(ev_coll.max()) * 2 + 2 if len(ev_coll) else 0
    other = np.flatnonzero(ev_coll < 0)
    if len(other):
        g_o = _other_groups(ev_rank[other], ev_label[other], wi[other], ev_step[other])
        if g_o is None:
            return None
        gid[other] = ncoll + g_o
        ng = ncoll + (int(g_o.max()) + 1 if len(g_o) else 0)
    else:
        ng = ncoll
    g = np.where(ev_first, np.nan, np.maximum(ev_gap, 0.0))
    ex, hp = _C.median_excess(np.ascontiguousarray(g, np.float64), gid, ng)
    return np.frombuffer(ex, np.float64), np.frombuffer(hp, np.bool_)


def _excess_c_slots(ev_rank, ev_label, ev_is_wait, ev_gap, ev_first, ev_step, ev_coll, slots):
    """_excess_c with the collectives' groups by slot: a communication's members' calls
    (sl_call) and wait()s (the wait event of each slot) for each comm_ok communication, the
    groups of _excess' matrix path; the other events (ev_coll < 0) by their group ids."""
    sl_call, ev_slot, cm_lo, cm_hi, comm_ok = slots
    E = len(ev_gap)
    other = np.flatnonzero(ev_coll < 0)
    g_o = None
    if len(other):
        g_o = _other_groups(ev_rank[other], ev_label[other], ev_is_wait[other].astype(np.int64), ev_step[other])
        if g_o is None:
            return None
    g = np.where(ev_first, np.nan, np.maximum(ev_gap, 0.0))
    wi = np.flatnonzero(ev_is_wait & (ev_slot >= 0))
    wait_ev = np.full(len(sl_call), -1, np.int64)
    wait_ev[ev_slot[wi]] = wi
    del wi
    ex = np.zeros(E)
    hp = np.zeros(E, np.uint8)
    _C.median_excess_comms(g, np.ascontiguousarray(sl_call, np.int64), wait_ev, np.ascontiguousarray(cm_lo, np.int64),
                           np.ascontiguousarray(cm_hi, np.int64), np.ascontiguousarray(comm_ok, np.uint8), ex, hp)
    if len(other):
        exo, hpo = _C.median_excess(np.ascontiguousarray(g[other]), g_o, int(g_o.max()) + 1 if len(g_o) else 0)
        ex[other] = np.frombuffer(exo, np.float64)
        hp[other] = np.frombuffer(hpo, np.uint8)
    return ex, hp.view(np.bool_)


def _other_groups(ev_rank, ev_label, wi, ev_step):
    """Dense ids of _excess_other's groups (same key, step and occurrence within the rank's
    step), or None when a range is too large for _dense_ids' tables."""
    n = len(ev_rank)
    lab = _dense_ids([np.asarray(ev_label, np.int64)])
    if lab is None:
        return None
    key = lab * 2 + wi
    st = np.asarray(ev_step, np.int64)
    g1 = _dense_ids([np.asarray(ev_rank, np.int64), st, key])
    if g1 is None:
        return None
    o = stable_argsort(g1, 0, int(g1.max()) if len(g1) else 0)
    s1 = g1[o]
    newg = np.r_[True, s1[1:] != s1[:-1]]
    occ = np.empty(n, np.int64)
    occ[o] = np.arange(n) - np.flatnonzero(newg)[np.cumsum(newg) - 1]
    del o, s1, newg, g1
    return _dense_ids([key, st, occ])


def _excess_other(ev_rank, ev_label, ev_is_wait, ev_gap, ev_first, ev_step):
    """_excess_by_sort for events that are not a collective's, with the groups numbered through
    tables over the columns' ranges and one int64 argsort by (group, gap) (gaps are whole ns);
    None when a range is too large for a table (the caller then sorts as _excess_by_sort)."""
    gid = _other_groups(ev_rank, ev_label, np.asarray(ev_is_wait).astype(np.int64), ev_step)
    if gid is None or int(gid.max()) >= (1 << 19):
        return None
    g = np.where(ev_first, np.nan, np.maximum(ev_gap, 0.0))
    ok = ~np.isnan(g)
    if not _whole_ns(g[ok]) or (ok.any() and float(g[ok].max()) >= 2.0 ** 44 - 1):
        return None
    v = np.where(ok, g, 0.0).astype(np.int64)
    v[~ok] = (1 << 44) - 1                      # NaN last in its group
    k2 = (gid << 44) | v
    o2 = np.argsort(k2)                         # equal keys are equal values: any order
    return _median_sorted(o2, k2[o2] >> 44, g)


def _median_others_rows(v: np.ndarray):
    """Per element of a matrix (NaN: no value): max(0, v - median of the other values of its
    row) and whether its row has another value; the arithmetic of _excess_by_sort."""
    k, n = v.shape
    o = np.argsort(v, axis=1, kind="stable")                   # NaN last
    gs = np.take_along_axis(v, o, axis=1)
    valid = ~np.isnan(gs)
    cnt = valid.sum(axis=1)
    # in sorted order, an element's own position is its column
    col = np.arange(n)[None, :]
    m = cnt - 1
    rows = np.arange(k)

    def at(j):
        # the others' j-th value (j is one per row): the row's j-th, or its (j+1)-th for the
        # elements at or before column j (their own value comes first)
        j = np.clip(j, 0, None)
        a = gs[rows, np.minimum(j, n - 1)][:, None]
        b = gs[rows, np.minimum(j + 1, n - 1)][:, None]
        return np.where(j[:, None] >= col, b, a)

    half = m // 2
    odd = (m % 2 == 1)[:, None]
    med = at(half)
    med = np.where(odd, med, 0.5 * (at(half - 1) + med))
    has_peers = valid & (m >= 1)[:, None]
    ex_sorted = np.where(has_peers, np.maximum(0.0, gs - med), 0.0)
    ex = np.empty((k, n))
    hp = np.empty((k, n), bool)
    np.put_along_axis(ex, o, ex_sorted, axis=1)
    np.put_along_axis(hp, o, has_peers, axis=1)
    return ex, hp


def _excess_by_sort(ev_rank, ev_label, ev_is_wait, ev_gap, ev_first, ev_step, ev_coll):
    """_excess by one global sort of every event by (group, gap)."""
    E = len(ev_gap)
    if E == 0:
        return np.zeros(0), np.zeros(0, bool)
    gid = np.where(ev_coll >= 0, ev_coll * 2 + ev_is_wait.astype(np.int64), -1)
    ncoll = int(gid.max()) + 1 if len(gid) else 0
    other = np.flatnonzero(ev_coll < 0)
    if len(other):
        key = ev_label[other] * 2 + ev_is_wait[other].astype(np.int64)
        st = ev_step[other].astype(np.int64)
        # occurrence of key within (rank, step): group by a 64-bit mix of the three (one stable
        # argsort instead of a lexsort of three keys; a collision would need 2^-64 luck)
        with np.errstate(over="ignore"):
            h1 = _mix(_mix(ev_rank[other].astype(np.int64), st), key)
        o = np.argsort(h1, kind="stable")
        hs = h1[o]
        newg = np.r_[True, hs[1:] != hs[:-1]]
        g1 = np.cumsum(newg) - 1
        occ = np.empty(len(other), np.int64)
        occ[o] = np.arange(len(other)) - np.flatnonzero(newg)[g1]
        with np.errstate(over="ignore"):
            h2 = _mix(_mix(key, st), occ)
        og = np.argsort(h2)
        hs2 = h2[og]
        g2 = np.empty(len(other), np.int64)
        g2[og] = np.cumsum(np.r_[True, hs2[1:] != hs2[:-1]]) - 1
        gid[other] = ncoll + g2
    g = np.where(ev_first, np.nan, np.maximum(ev_gap, 0.0))
    # sort by group, then by value within it: the group id times E plus the value's global
    # rank, one int64 argsort (a lexsort of a float and a group key is 3x slower)
    grank = np.empty(E, np.int64)
    grank[np.argsort(g)] = np.arange(E)       # NaN sorts last: after every value of its group
    grank += gid * E
    del gid
    o2 = np.argsort(grank)
    gsort = grank[o2] // E
    del grank
    return _median_sorted(o2, gsort, g)


def _median_sorted(o2: np.ndarray, gsort: np.ndarray, g: np.ndarray):
    """_excess's arithmetic on values `g` ordered by `o2` (by group, then value, NaN last in
    its group), `gsort` the group of each in that order."""
    E = len(g)
    newp = np.r_[True, gsort[1:] != gsort[:-1]]
    del gsort
    pid = np.cumsum(newp) - 1
    plo = np.flatnonzero(newp)
    del newp
    gs = g[o2]
    del g
    valid = ~np.isnan(gs)
    cnt = np.bincount(pid, weights=valid, minlength=len(plo)).astype(np.int64)
    # NaNs sort last within a group, so the valid values are the first cnt of each group
    start = plo[pid]                     # where this value's group starts
    del plo
    pos = np.arange(E) - start           # position of this value among its group's sorted values
    m = cnt[pid] - 1                     # number of others
    del cnt, pid
    has_peers = valid & (m >= 1)
    del valid

    def at(j):
        j = np.clip(j, 0, None)
        # others' j-th value skips this value's own position
        j += j >= pos
        j += start
        np.clip(j, 0, E - 1, out=j)
        return gs[j]

    half = m // 2
    odd = m % 2 == 1
    del m
    med = at(half)
    med = np.where(odd, med, 0.5 * (at(half - 1) + med))
    del half, odd, pos, start
    ex_sorted = np.where(has_peers, np.maximum(0.0, gs - med), 0.0)
    del med, gs
    ex = np.empty(E)
    ex[o2] = ex_sorted
    hp = np.empty(E, bool)
    hp[o2] = has_peers
    return ex, hp
