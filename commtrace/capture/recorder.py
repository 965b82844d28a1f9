"""The in-rank recorder: a bounded buffer of rows and a background thread that writes them.

The training thread only builds Python lists (one per row, columns in ``schema.COLUMNS``
order) and appends them to a deque; the writer thread converts them to Arrow and writes one
Parquet part per flush (``--flush-interval``), rewrites ``rank=<r>/_inflight.json`` atomically
with the ops still in flight, polls ``Work.is_completed()`` for Work objects that have no
future and end by themselves (not gloo's point-to-point Works, which only ``wait()`` ends:
``WAIT_ONLY``), releases finished async ops, and reads back device times when a device timer
is set. It wakes only when one of these is due (``_run``): a wake-up costs it 20-60 us of CPU
on a loaded VM and takes the GIL from the training thread.

Hooks used by the other capture modules are documented in ``docs/dev/interfaces.md``
("Capture: recorder hooks"): :func:`get_recorder`, :meth:`Recorder.now_ns`,
:meth:`Recorder.new_op_id`, :meth:`Recorder.emit`, :meth:`Recorder.inflight_ids`,
:meth:`Recorder.pending_ops`, :meth:`Recorder.add_pending_listener`,
:attr:`Recorder.device_timer`.

Nothing here raises into the training loop: write errors (full disk, no permission) are logged
once and the rows of that flush are counted as dropped.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time
import weakref

from .. import __version__
from ..config import Config, clock_skew_for
from ..format import schema as S
from . import completion_hook as _CH
from . import torchseq as _TS
from . import log, nvtx_ranges
from .sites import format_site

# Column indices of a row list (schema order). Rows are plain lists so that the hot path does
# no Arrow work; the writer thread transposes them.
COLUMNS = S.COLUMNS
NCOL = len(COLUMNS)
IDX = {name: i for i, name in enumerate(COLUMNS)}
I_KIND = IDX["kind"]
I_RANK = IDX["rank"]
I_PG = IDX["pg"]
I_PG_SIZE = IDX["pg_size"]
I_SEQ = IDX["seq"]
I_OP = IDX["op"]
I_API = IDX["api"]
I_ASYNC = IDX["async_op"]
I_BACKEND = IDX["backend"]
I_DEVICE = IDX["device"]
I_DTYPE = IDX["dtype"]
I_COUNT = IDX["count"]
I_BYTES = IDX["bytes"]
I_OUT_BYTES = IDX["out_bytes"]
I_PEER = IDX["peer"]
I_ROOT = IDX["root"]
I_T_ENQ = IDX["t_enqueue_ns"]
I_T_RET = IDX["t_return_ns"]
I_T_START = IDX["t_start_ns"]
I_T_END = IDX["t_end_ns"]
I_T_WAIT = IDX["t_wait_ns"]
I_T_WAIT_END = IDX["t_wait_end_ns"]
I_STEP = IDX["step"]
I_SITE = IDX["site"]
I_ERROR = IDX["error"]
I_OP_ID = IDX["op_id"]
I_REF_OP_ID = IDX["ref_op_id"]
I_INFLIGHT = IDX["inflight"]
I_INFLIGHT_IDS = IDX["inflight_ids"]
I_FIRST = IDX["first_on_pg"]
I_STREAM_WAIT = IDX["stream_wait_ns"]
I_THREAD = IDX["thread"]
I_DETAIL = IDX["detail"]
I_COMPLETION = IDX["completion"]
I_TORCH_SEQ = IDX["torch_seq"]

#: How often the writer thread polls Work objects that have no future (seconds). Bounded: at
#: most MAX_POLL works are looked at per cycle.
POLL_INTERVAL_S = 0.001
MAX_POLL = 512
#: (backend, op) of Works that only wait() completes: ProcessGroupGloo's SendWork and RecvWork
#: (isend / irecv) override wait() alone, which finishes the Work; is_completed() reads the
#: flag that finish sets, so it stays False until wait() returns, however long ago the data
#: left (torch's ProcessGroupGloo.cpp; tests/test_writer_wakeups.py checks it on the installed
#: torch). Polling them would never see them end: they are not polled, and stay in flight
#: until waited, as they did when they were polled every POLL_INTERVAL_S.
WAIT_ONLY = frozenset({("gloo", "send"), ("gloo", "recv")})
#: A completed async op whose Work is still referenced but never waited is written after this
#: many flush intervals (its t_wait stays null).
HOLD_FLUSHES = 2
#: Until the first part is written, flush this often (then every --flush-interval): a rank that
#: crashes early still leaves its first ops (docs/trace-format.md).
FIRST_FLUSH_S = 0.2
#: While async ops are pending (or were, less than IDLE_AFTER_S ago), the writer thread looks
#: at them this often (seconds): it releases those completed and waited or whose Work is gone
#: (their tensors, kept for hazard detection, are let go then). 0.05 with a device timer or
#: NCCL completion hooks, POLL_INTERVAL_S with Work objects to poll.
IDLE_WAKE_S = 0.25
#: Functions the writer thread calls at each service, before it looks at the pending ops
#: (GIL held): the C++ DDP hook's ``flush_all``, which writes the completion times its
#: continuations queued on the backend's thread without the GIL (capture/ddp.py).
STAMP_FLUSHERS: list = []
#: With nothing pending for this long, the writer thread sleeps until its next flush; the next
#: op that becomes pending wakes it (recorder's own pending listener).
IDLE_AFTER_S = 1.0
#: ... for at most this long (a rank that issues nothing does not rewrite its snapshot 5x/s).
FIRST_FLUSH_WINDOW_S = 10.0

_time_ns = time.time_ns
_get_ident = threading.get_ident

# ------------------------------------------------------------------------------------------
# Short records of the blocking fast path (wrappers.make_wrapper), expanded off the hot path.
# ------------------------------------------------------------------------------------------

#: index -> (op, api, inplace): facts of one wrapper, fixed at install.
FAST_SPECS: list = []
#: index -> (pg name, pg size, backend): facts of one process group, fixed when first seen.
PG_FACTS: list = []
_facts_lock = threading.Lock()

# Fields of a short record ``pre``; the finished record is the pair ``(pre, t_return_ns)``.
(F_SPEC, F_PG, F_SEQ, F_PEER, F_ROOT, F_T0, F_STEP, F_SITE, F_OP_ID, F_THREAD, F_API,
 F_DETAIL, F_COUNT, F_DTYPE, F_DEVICE, F_BYTES, F_OUT_BYTES, F_ASYNC) = range(18)
PRE_LEN = 18


#: pg name -> slot of its collective seq counter (``Recorder._seqs``), process-wide.
SEQ_SLOTS: dict = {}


def seq_slot(name) -> int:
    """The seq-counter slot of process group `name`."""
    s = SEQ_SLOTS.get(name)
    if s is None:
        with _facts_lock:
            s = SEQ_SLOTS.get(name)
            if s is None:
                s = SEQ_SLOTS[name] = len(SEQ_SLOTS)
    return s


_fact_index: dict = {}   # (id(table), fact) -> index: a fact registered again reuses its entry


def register_fact(table: list, fact: tuple) -> int:
    """The index of `fact` in FAST_SPECS or PG_FACTS, appended the first time. Groups are looked
    up again after every enable() and destroy_process_group(): the table does not grow with that."""
    with _facts_lock:
        key = (id(table), fact)
        i = _fact_index.get(key)
        if i is None:
            table.append(fact)
            i = _fact_index[key] = len(table) - 1
        return i


_dtype_names: dict = {}


def dtype_name(dt):
    """The name of a torch dtype ("float32", ...), cached; strings and None pass through."""
    if dt is None or isinstance(dt, str):
        return dt
    s = _dtype_names.get(dt)
    if s is None:
        s = _dtype_names[dt] = str(dt).replace("torch.", "")
    return s


def expand(rank: int, pre: tuple, t1) -> list:
    """The full row (schema order) of a short record; `t1` is the return time of a completed
    blocking call (t_return_ns = t_end_ns), None while the call is in progress."""
    op, api, inplace = FAST_SPECS[pre[F_SPEC]]
    name, size, backend = PG_FACTS[pre[F_PG]]
    count = pre[F_COUNT]
    dt = pre[F_DTYPE]
    b = pre[F_BYTES]
    if b is None and count is not None and dt is not None and not isinstance(dt, str):
        b = count * dt.itemsize
    ob = pre[F_OUT_BYTES]
    if ob is None and b is not None:
        ob = b if inplace else 0
    seq = pre[F_SEQ]
    return [S.KIND_OP, rank, name, size, seq, op, pre[F_API] or api, pre[F_ASYNC], backend,
            pre[F_DEVICE], dtype_name(dt), count, b, ob, pre[F_PEER], pre[F_ROOT], pre[F_T0],
            t1, None, t1, None, None, pre[F_STEP], pre[F_SITE], None, pre[F_OP_ID], None, None,
            None, (seq == 0) if seq is not None else None, None, pre[F_THREAD], pre[F_DETAIL],
            "return" if t1 is not None else None, None]


def expand_columns(rank: int, c: tuple) -> list:
    """Schema-order column lists of the calls drained from the C fast path
    (``_fastpath.drain_columns()``: the F_* fields and t_return_ns, one list each)."""
    n = len(c[0])
    specs = [FAST_SPECS[i] for i in c[F_SPEC]]
    pgs = [PG_FACTS[i] for i in c[F_PG]]
    counts, dts = c[F_COUNT], c[F_DTYPE]
    nbytes = [None if (k is None or d is None or isinstance(d, str)) else k * d.itemsize
              for k, d in zip(counts, dts)]
    out_b = [ob if ob is not None else (b if sp[2] else (0 if b is not None else None))
             for ob, b, sp in zip(c[F_OUT_BYTES], nbytes, specs)]
    t1 = c[18]
    nones = [None] * n
    return [[S.KIND_OP] * n, [rank] * n, [p[0] for p in pgs], [p[1] for p in pgs], c[F_SEQ],
            [sp[0] for sp in specs], [a or sp[1] for a, sp in zip(c[F_API], specs)],
            c[F_ASYNC], [p[2] for p in pgs], c[F_DEVICE], [dtype_name(d) for d in dts],
            counts, nbytes, out_b, c[F_PEER], c[F_ROOT], c[F_T0], t1, nones, t1, nones, nones,
            c[F_STEP], c[F_SITE], nones, c[F_OP_ID], nones, nones, nones,
            [(s == 0) if s is not None else None for s in c[F_SEQ]], nones, c[F_THREAD],
            c[F_DETAIL], [None if t is None else "return" for t in t1], nones]


# Field order of ``_fastpath.drain_records()``'s buffers.
(D_SEQ, D_PEER, D_ROOT, D_T0, D_STEP, D_OP_ID, D_COUNT, D_OUT_BYTES, D_T1, D_THREAD) = range(10)
(K_FACT, K_PG, K_SITE, K_API, K_DETAIL, K_DTYPE, K_DEVICE) = range(7)
_NULL_LL = -(2 ** 63)
#: Drain the C path's calls as typed buffers (``drain_records``) rather than column lists
#: (``drain_columns``, still used under bounded capture). Tests and benchmarks flip it.
RECORD_BUFFERS = True


#: Build the columns' Arrow buffers in C (``_fastpath.int_column`` / ``string_column``) where
#: the C module has them; the numpy route otherwise (tests and benchmarks flip it).
C_COLUMNS = True

#: The writer's service releases the pending ops whose end is known in C
#: (``_fastpath.service_pass``) where the C module has it (tests and benchmarks flip it).
SERVICE_C = True

_np_state = None


def _numpy_ok() -> bool:
    """numpy importable (torch has imported it already in a rank; without it the writer keeps
    the list path rather than lose the part)."""
    global _np_state
    if _np_state is None:
        try:
            import numpy  # noqa: F401
            _np_state = True
        except Exception:
            _np_state = False
    return _np_state


def _kit(n: int):
    """numpy builders of Arrow arrays of n values (ints, table_ints, strings, bools), shared
    by :func:`arrays_of_records` and :func:`arrays_of_rows`."""
    import numpy as np
    import pyarrow as pa

    def bitmap(mask):
        return pa.py_buffer(np.packbits(mask, bitorder="little").tobytes())

    c_int = c_str = None
    if C_COLUMNS and _cfast is not None and hasattr(_cfast, "string_column"):
        # The column's buffers built in C in one pass (``int_column`` / ``string_column``):
        # the numpy route below costs 10-30 numpy calls per column, a fixed cost per column
        # and part that dominated parts of a few hundred rows (docs/performance.md, Session 15).
        int32 = pa.int32()
        int_column, string_column, from_buffers = (_cfast.int_column, _cfast.string_column,
                                                   pa.Array.from_buffers)
        py_buffer, i32, i64 = pa.py_buffer, np.int32, np.int64

        def c_int(vals, typ):
            """None: an int32 value out of range, or not an int64 array (the numpy route)."""
            if vals.dtype != i64 or not vals.flags.c_contiguous:
                return None
            r = int_column(vals, 0, n, 4 if typ == int32 else 8)
            if r is None:
                return None
            valid, nnull, data = r
            if nnull == n:
                return pa.nulls(n, typ)
            return from_buffers(typ, n, [None if valid is None else py_buffer(valid),
                                         py_buffer(data)], nnull)

        def c_str(code, enc):
            if code.dtype != i32 or not code.flags.c_contiguous:
                code = np.ascontiguousarray(code, dtype=i32)
            r = string_column(code, 0, n, enc)
            if r is None:
                return None
            valid, nnull, offsets, data = r
            if nnull == n:
                return pa.nulls(n, pa.string())
            return from_buffers(pa.string(), n, [None if valid is None else py_buffer(valid),
                                                 py_buffer(offsets), py_buffer(data)], nnull)

    def ints(vals, typ, valid=None):
        """int64 values (``_NULL_LL`` or ~valid: null) as an Arrow array of `typ`."""
        if valid is None:
            if c_int is not None:
                made = c_int(vals, typ)
                if made is not None:
                    return made
            valid = vals != _NULL_LL
        nnull = n - int(np.count_nonzero(valid))
        if nnull == n:
            return pa.nulls(n, typ)
        if nnull:
            vals = np.where(valid, vals, 0)
        data = vals.astype(np.int32 if typ == pa.int32() else np.int64, copy=False)
        return pa.Array.from_buffers(typ, n, [bitmap(valid) if nnull else None,
                                              pa.py_buffer(data.tobytes())], nnull)

    def table_ints(code, table, typ):
        """Integers of a per-code table (None: null), gathered by `code` (-1: null)."""
        vals = np.array([_NULL_LL if v is None else int(v) for v in table] + [_NULL_LL],
                        dtype=np.int64)
        return ints(vals[code], typ)

    def strings(code, table):
        """Strings of a per-code table (None: null), gathered by `code` (-1: null): the
        offsets and the data built with numpy over the column."""
        enc = [None if v is None else str(v).encode("utf-8", "surrogateescape") for v in table]
        if (len(enc) == 1 and enc[0] is not None and n * len(enc[0]) < 2 ** 31
                and int(code.min()) == 0):
            # one value on every row (kind, pg, backend, dtype, ... of most parts)
            offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(enc[0]))
            return pa.Array.from_buffers(pa.string(), n, [
                None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(enc[0] * n)], 0)
        if c_str is not None:
            made = c_str(code, enc)
            if made is not None:
                return made
        valid_t = np.array([e is not None for e in enc] + [False], dtype=bool)
        lens_t = np.array([0 if e is None else len(e) for e in enc] + [0], dtype=np.int64)
        if not valid_t.any():
            return pa.nulls(n, pa.string())
        valid = valid_t[code]
        nnull = n - int(np.count_nonzero(valid))
        if nnull == n:
            return pa.nulls(n, pa.string())
        lens = lens_t[code]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        total = int(offsets[-1])
        if len(enc) == 1 or total == 0:   # one value (or all empty): repeat it
            data = (enc[0] or b"") * (n - nnull) if len(enc) == 1 else b""
        else:
            blob = b"".join(e or b"" for e in enc)
            starts_t = np.zeros(len(enc) + 1, dtype=np.int64)
            np.cumsum(lens_t[:-1], out=starts_t[1:])
            # byte i of the column comes from blob[starts[row] + (i - offsets[row])]
            shift = starts_t[code] - offsets[:-1]
            idx = np.repeat(shift, lens) + np.arange(total, dtype=np.int64)
            data = np.frombuffer(blob, dtype=np.uint8)[idx].tobytes()
        if total > 2 ** 31 - 1:
            return pa.array([None if not ok else enc[c].decode("utf-8", "surrogateescape")
                             for ok, c in zip(valid.tolist(), code.tolist())], pa.string())
        return pa.Array.from_buffers(pa.string(), n, [
            bitmap(valid) if nnull else None,
            pa.py_buffer(offsets.astype(np.int32).tobytes()), pa.py_buffer(data)], nnull)

    def bools(vals, valid):
        nnull = n - int(np.count_nonzero(valid))
        if nnull == n:
            return pa.nulls(n, pa.bool_())
        return pa.Array.from_buffers(pa.bool_(), n, [bitmap(valid) if nnull else None,
                                                     bitmap(vals & valid)], nnull)

    return ints, table_ints, strings, bools


#: Build the drained calls' arrays in one C call, as one Arrow record batch handed over
#: through Arrow's C data interface (``_fastpath.records_batch``), where the C module has it;
#: the numpy route below otherwise. That route made ~26 arrays one by one (numpy, the column
#: builders, ``py_buffer`` and ``from_buffers`` per column): ~1 ms of a 4,000-row soak part's
#: ~6.5 ms of writer CPU, the GIL held (session 22). Tests and benchmarks flip it.
RECORDS_BATCH = True

#: records_batch's column ids (its RB_* enum): the columns the drained calls fill
_RB_IDS = {name: i for i, name in enumerate((
    "kind", "rank", "pg", "pg_size", "seq", "op", "api", "async_op", "backend", "device",
    "dtype", "count", "bytes", "out_bytes", "peer", "root", "t_enqueue_ns", "t_return_ns",
    "t_end_ns", "step", "site", "op_id", "first_on_pg", "thread", "detail", "completion"),
    start=1)}
_rb_program = None   # bytes, one id per schema column (b"" when a column type has no id)


def _records_program() -> bytes:
    """records_batch's program for the schema: a column's RB_* id, or the id of a column null
    throughout of its type (b"" if the schema has a type the C side cannot build)."""
    global _rb_program
    if _rb_program is None:
        import pyarrow as pa

        null_ids = {pa.int64(): 100, pa.int32(): 101, pa.bool_(): 102, pa.string(): 103,
                    pa.list_(pa.int64()): 104}
        ids = [_RB_IDS.get(f.name) or null_ids.get(f.type) for f in S.SCHEMA]
        _rb_program = b"" if None in ids else bytes(ids)
    return _rb_program


def _enc(v):
    return None if v is None else str(v).encode("utf-8", "surrogateescape")


_enc_facts: dict = {}   # id(table) -> [(fact, its encoded form)], in the table's order


def _encoded(table: list, encode) -> list:
    """`encode` of every fact of FAST_SPECS or PG_FACTS (append-only tables of tuples, a few
    dozen long), kept between parts: only facts not seen at their index are encoded again."""
    facts = table[:]
    known = _enc_facts.setdefault(id(table), [])
    for i, f in enumerate(facts):
        if i >= len(known):
            known.append((f, encode(f)))
        elif known[i][0] is not f:
            known[i] = (f, encode(f))
    del known[len(facts):]
    return [e for _, e in known]


def _enc_pg(p):
    return (_enc(p[0]), None if p[1] is None else int(p[1]), _enc(p[2]))


def _enc_spec(sp):
    return (_enc(sp[0]), _enc(sp[1]), bool(sp[2]))


def batch_of_records(rank: int, drained):
    """:func:`arrays_of_records`' arrays as one ``pyarrow.RecordBatch`` of the schema, built in
    C in one call (``records_batch``); None when it cannot (no such C function or RECORDS_BATCH
    off, an int32 value out of range, text past 2 GiB): the numpy route decides then."""
    if not (RECORDS_BATCH and _cfast is not None and hasattr(_cfast, "records_batch")):
        return None
    import pyarrow as pa

    program = _records_program()
    imp = getattr(pa.RecordBatch, "_import_from_c_capsule", None)   # pyarrow >= 14
    if not program or imp is None or not hasattr(S.SCHEMA, "__arrow_c_schema__"):
        return None
    n, nums_b, codes_b, tables = drained
    t_site, t_api, t_detail, t_dtype, t_dev = tables
    enc = _enc
    pgs = _encoded(PG_FACTS, _enc_pg)
    specs = _encoded(FAST_SPECS, _enc_spec)
    dtypes = [(enc(dtype_name(d)),
               -1 if (d is None or isinstance(d, str) or getattr(d, "itemsize", None) is None)
               else int(d.itemsize)) for d in t_dtype]
    strs = ([enc(format_site(v)) for v in t_site], [enc(a) if a else None for a in t_api],
            [enc(v) for v in t_detail], [enc(v) for v in t_dev])
    cap = _cfast.records_batch(n, nums_b, codes_b, rank, program, pgs, specs, dtypes, strs,
                               (enc(S.KIND_OP), b"return"))
    if cap is None:
        return None
    return imp(S.SCHEMA.__arrow_c_schema__(), cap)


def arrays_of_records(rank: int, drained) -> list:
    """Schema-order Arrow arrays of the calls drained from the C fast path as typed buffers
    (``_fastpath.drain_records()``), built in C in one call (RECORDS_BATCH) or with numpy over
    whole columns: no Python object per row (issue 20). The values are those of
    :func:`expand_columns` (tests compare them)."""
    batch = batch_of_records(rank, drained)
    if batch is not None:
        return batch.columns
    import numpy as np
    import pyarrow as pa

    n, nums_b, codes_b, tables = drained
    nums = np.frombuffer(nums_b, dtype=np.int64).reshape(10, n)
    codes = np.frombuffer(codes_b, dtype=np.int32).reshape(7, n)
    t_site, t_api, t_detail, t_dtype, t_dev = tables
    ints, table_ints, strings, bools = _kit(n)

    fact, pgc = codes[K_FACT], codes[K_PG]
    specs = FAST_SPECS[:]
    pgs = PG_FACTS[:]
    seq, count, t1 = nums[D_SEQ], nums[D_COUNT], nums[D_T1]
    # bytes = count * the dtype's itemsize (a torch dtype; a name string or None: null)
    isz = np.array([getattr(d, "itemsize", None) if (d is not None and not isinstance(d, str))
                    else None for d in t_dtype] + [None], dtype=object)
    isz_t = np.array([_NULL_LL if v is None else int(v) for v in isz], dtype=np.int64)
    isz_r = isz_t[codes[K_DTYPE]]
    b_valid = (count != _NULL_LL) & (isz_r != _NULL_LL)
    nbytes = np.where(b_valid, count * np.where(b_valid, isz_r, 0), _NULL_LL)
    # out_bytes: the recorded value, else bytes for an in-place op, else 0 (bytes known)
    inplace = np.array([bool(sp[2]) for sp in specs], dtype=bool)[fact]
    ob = nums[D_OUT_BYTES]
    ob = np.where(ob != _NULL_LL, ob,
                  np.where(inplace, nbytes, np.where(b_valid, 0, _NULL_LL)))
    # api: the call's own (when truthy), else the wrapper's
    n_api = len(t_api)
    api_t = list(t_api) + [sp[1] for sp in specs]
    api_ok = np.array([bool(a) for a in t_api] + [False], dtype=bool)[codes[K_API]]
    api_code = np.where(api_ok, codes[K_API], n_api + fact)
    zeros = np.zeros(n, dtype=np.int32)
    nulls64 = pa.nulls(n, pa.int64())
    t1_ok = t1 != _NULL_LL
    seq_ok = seq != _NULL_LL
    by = {
        "kind": strings(zeros, [S.KIND_OP]),
        "rank": ints(np.full(n, rank, dtype=np.int64), pa.int32()),
        "pg": strings(pgc, [p[0] for p in pgs]),
        "pg_size": table_ints(pgc, [p[1] for p in pgs], pa.int32()),
        "seq": ints(seq, pa.int64()),
        "op": strings(fact, [sp[0] for sp in specs]),
        "api": strings(api_code, api_t),
        "async_op": bools(np.zeros(n, dtype=bool), np.ones(n, dtype=bool)),
        "backend": strings(pgc, [p[2] for p in pgs]),
        "device": strings(codes[K_DEVICE], list(t_dev)),
        "dtype": strings(codes[K_DTYPE], [dtype_name(d) for d in t_dtype]),
        "count": ints(count, pa.int64()),
        "bytes": ints(nbytes, pa.int64()),
        "out_bytes": ints(ob, pa.int64()),
        "peer": ints(nums[D_PEER], pa.int32()),
        "root": ints(nums[D_ROOT], pa.int32()),
        "t_enqueue_ns": ints(nums[D_T0], pa.int64()),
        "t_return_ns": ints(t1, pa.int64()),
        "t_end_ns": ints(t1, pa.int64()),
        "step": ints(nums[D_STEP], pa.int64()),
        "site": strings(codes[K_SITE], [format_site(v) for v in t_site]),
        "op_id": ints(nums[D_OP_ID], pa.int64()),
        "first_on_pg": bools(seq == 0, seq_ok),
        "thread": ints(nums[D_THREAD], pa.int64()),
        "detail": strings(codes[K_DETAIL], list(t_detail)),
        "completion": strings(np.where(t1_ok, 0, -1).astype(np.int32), ["return"]),
    }
    out = []
    for f in S.SCHEMA:
        a = by.get(f.name)
        if a is None:
            a = nulls64 if f.type == pa.int64() else pa.nulls(n, f.type)
        out.append(a)
    return out


#: Queued full rows (async ops, marks, gaps, ...) packed into typed buffers in C
#: (``_fastpath.pack_rows``) and turned into Arrow arrays with numpy (issue 20), rather than
#: one Python list per column and value. Tests and benchmarks flip it.
ROW_BUFFERS = True
#: ... from this many queued rows on: below it numpy's fixed cost per column outweighs what
#: it saves (inside a flush of async rows at world size 1, the conversion's thread CPU: 50
#: rows 0.43 ms lists against 0.54 buffers, 200 rows about even, 5,000 rows about half).
ROW_BUFFERS_MIN_ROWS = 256
#: ... and from this many with the columns built in C (C_COLUMNS): that route wins at every size
#: (thread CPU of the conversion, the DDP sample's rows, session 15: 3 rows 95 us against 161
#: for the lists, 50 rows 105 against 308, 250 rows 138 against 913).
ROW_BUFFERS_MIN_ROWS_C = 1
_ROW_KINDS = None   # pack_rows' column letters, from the schema


def _row_kinds() -> bytes:
    global _ROW_KINDS
    if _ROW_KINDS is None:
        import pyarrow as pa

        _ROW_KINDS = b"".join(b"i" if f.type in (pa.int32(), pa.int64()) else
                           b"b" if f.type == pa.bool_() else b"o" for f in S.SCHEMA)
    return _ROW_KINDS


def arrays_of_rows(rank: int, rows: list):
    """Schema-order Arrow arrays of queued full rows (lists in COLUMNS order, the call site a
    raw (file, line) pair), packed by ``_fastpath.pack_rows`` into typed buffers and built
    with numpy over whole columns: no Python object per row and field (issue 20). The values
    are those of the list path (``rows_to_table_nopandas`` over ``zip(*rows)``; tests compare
    them). None when the rows do not fit the buffers (a value of an unexpected type, an int32
    value out of range): the caller takes the list path."""
    import numpy as np
    import pyarrow as pa

    from ..format import writer as W

    kinds = _row_kinds()
    packed = _cfast.pack_rows(rows, kinds)
    if packed is None:
        return None
    if C_COLUMNS and hasattr(_cfast, "bool_column"):
        return _arrays_of_packed(packed)
    n, nums_b, codes_b, tables, nulls_b = packed
    n_i = kinds.count(b"i")
    nulls = np.frombuffer(nulls_b, dtype=np.int64).tolist()
    nums = np.frombuffer(nums_b, dtype=np.int64).reshape(n_i, n)
    codes = np.frombuffer(codes_b, dtype=np.int32).reshape(len(kinds) - n_i, n)
    ints, _table_ints, strings, bools = _kit(n)
    out = []
    a = c = o = 0
    for j, (f, kd) in enumerate(zip(S.SCHEMA, kinds)):
        if nulls[j] == n:   # null throughout (most of an async row's optional columns)
            a += kd == 0x69
            c += kd != 0x69
            o += kd == 0x6f
            out.append(pa.nulls(n, f.type))
            continue
        if kd == 0x69:   # 'i'
            vals = nums[a]
            a += 1
            if f.type == pa.int32():
                ok = vals != _NULL_LL
                if ok.any() and (vals[ok].min() < -2 ** 31 or vals[ok].max() >= 2 ** 31):
                    return None   # the list path's conversion decides
            out.append(ints(vals, f.type))
        elif kd == 0x62:  # 'b'
            k = codes[c]
            c += 1
            out.append(bools(k == 1, k >= 0))
        else:
            k = codes[c]
            table = tables[o]
            c += 1
            o += 1
            if f.type == pa.string():
                if f.name == "site":
                    table = [format_site(v) for v in table]
                out.append(strings(k, table))
            else:   # inflight_ids: the values, then the list path's conversion
                out.append(W.array_from_list([None if x < 0 else table[x] for x in k.tolist()],
                                             f.type))
    return out


_PLAN = None   # per column of the schema: (letter, type, int width or field name)


def _plan() -> list:
    global _PLAN
    if _PLAN is None:
        import pyarrow as pa

        _PLAN = [(k, f.type, (4 if f.type == pa.int32() else 8) if k == 0x69 else f.name)
                 for f, k in zip(S.SCHEMA, _row_kinds())]
    return _PLAN


def _arrays_of_packed(packed):
    """:func:`arrays_of_rows`' arrays with every column's buffers built in C from pack_rows'
    output (``int_column``, ``bool_column``, ``string_column``): no numpy, a handful of calls
    per column (session 15: inside a flush, after the training steps have evicted the
    caches, each call costs several times what it costs hot, so their number is the cost)."""
    import array

    import pyarrow as pa

    from ..format import writer as W

    n, nums_b, codes_b, tables, nulls_b = packed
    nulls = array.array("q", nulls_b).tolist()
    int_column, bool_column, string_column = (_cfast.int_column, _cfast.bool_column,
                                              _cfast.string_column)
    fb, buf, nulls_of = pa.Array.from_buffers, pa.py_buffer, pa.nulls
    string = pa.string()
    all_null: dict = {}
    out = []
    a = c = o = 0
    for (kd, typ, what), nn in zip(_plan(), nulls):
        if kd == 0x69:   # 'i'
            j = a
            a += 1
            if nn == n and what == 8:
                x = all_null.get(typ)
                if x is None:
                    x = all_null[typ] = nulls_of(n, typ)
                out.append(x)
                continue
            r = int_column(nums_b, j, n, what)
            if r is None:
                return None   # an int32 value out of range: the list path decides
            valid, nn, data = r
            out.append(nulls_of(n, typ) if nn == n else
                       fb(typ, n, [valid and buf(valid), buf(data)], nn))
            continue
        j = c
        c += 1
        if kd == 0x62:   # 'b'
            if nn == n:
                out.append(nulls_of(n, typ))
                continue
            valid, nn, data = bool_column(codes_b, j, n)
            out.append(fb(typ, n, [valid and buf(valid), buf(data)], nn))
            continue
        table = tables[o]
        o += 1
        if nn == n:
            x = all_null.get(typ)
            if x is None:
                x = all_null[typ] = nulls_of(n, typ)
            out.append(x)
            continue
        if typ == string:
            if what == "site":
                table = [format_site(v) for v in table]
            enc = [None if v is None else str(v).encode("utf-8", "surrogateescape")
                   for v in table]
            r = string_column(codes_b, j, n, enc)
            if r is not None:
                valid, nn, offsets, data = r
                out.append(nulls_of(n, typ) if nn == n else
                           fb(typ, n, [valid and buf(valid), buf(offsets), buf(data)], nn))
                continue
            # past 2 GiB of text: pyarrow's own conversion (large offsets refused there too)
            codes = array.array("i", codes_b[4 * j * n:4 * (j + 1) * n])
            out.append(pa.array([None if x < 0 else enc[x].decode("utf-8", "surrogateescape")
                                 for x in codes], string))
        else:   # inflight_ids: the values, then the list path's conversion
            codes = array.array("i", codes_b[4 * j * n:4 * (j + 1) * n])
            out.append(W.array_from_list([None if x < 0 else table[x] for x in codes], typ))
    return out


def columns_of_records(drained) -> tuple:
    """The ``drain_columns()`` form (19 lists) of a ``drain_records()`` result: what the list
    path builds from the same calls (tests compare the two paths' arrays)."""
    n, nums_b, codes_b, tables = drained
    import numpy as np

    nums = np.frombuffer(nums_b, dtype=np.int64).reshape(10, n).tolist()
    codes = np.frombuffer(codes_b, dtype=np.int32).reshape(7, n).tolist()

    def v(col):
        return [None if x == _NULL_LL else x for x in col]

    def obj(j):
        t = tables[j - K_SITE]
        return [None if c < 0 else t[c] for c in codes[j]]

    out = [None] * 19
    out[F_SPEC], out[F_PG] = codes[K_FACT], codes[K_PG]
    out[F_SEQ], out[F_PEER], out[F_ROOT] = v(nums[D_SEQ]), v(nums[D_PEER]), v(nums[D_ROOT])
    out[F_T0], out[F_STEP], out[F_OP_ID] = v(nums[D_T0]), v(nums[D_STEP]), v(nums[D_OP_ID])
    out[F_THREAD], out[F_COUNT] = v(nums[D_THREAD]), v(nums[D_COUNT])
    out[F_SITE], out[F_API], out[F_DETAIL] = obj(K_SITE), obj(K_API), obj(K_DETAIL)
    out[F_DTYPE], out[F_DEVICE] = obj(K_DTYPE), obj(K_DEVICE)
    out[F_BYTES] = [None] * n
    out[F_OUT_BYTES] = v(nums[D_OUT_BYTES])
    out[F_ASYNC] = [False] * n
    out[18] = v(nums[D_T1])
    return tuple(out)


_cfast = None  # the C fast path (wrappers.make_wrapper), when built and not turned off
if os.environ.get("COMMTRACE_PURE_PYTHON", "") in ("", "0"):
    try:
        from . import _fastpath as _cfast
        if getattr(_cfast, "API_VERSION", None) != 1:
            _cfast = None   # a stale build of an older source: not used
    except ImportError:
        _cfast = None
_service_pass = getattr(_cfast, "service_pass", None)
# DDP's buckets recorded as C records (_fastpath.c, "DDP's buckets as C records"; session 30)
_ddp_drain = getattr(_cfast, "ddp_drain", None)
_ddp_inflight = getattr(_cfast, "ddp_inflight", None)
_ddp_inflight_ids = (None if _ddp_inflight is None else lambda: _ddp_inflight(True))
if _cfast is not None and hasattr(_cfast, "ddp_direct") and os.environ.get(
        "COMMTRACE_DDP_DIRECT", "1") in ("0", ""):
    _cfast.ddp_direct(False)

_recorder: "Recorder | None" = None


def _entry_changed() -> None:
    # The C fast path keeps _recorder (and nvtx_ranges.active) from its last read until told
    # it changed, not by this module dict's tag per op (issue 20): every assignment of
    # _recorder is followed by this call.
    f = getattr(_cfast, "entry_changed", None)
    if f is not None:
        f()


def _rd_changed() -> None:
    # A Recorder's step or device_timer was assigned: the C fast path reads them again at its
    # next op (and only them; _entry_changed would also make it read _recorder and
    # nvtx_ranges.active again, at every training step).
    f = getattr(_cfast, "rd_changed", None) or getattr(_cfast, "entry_changed", None)
    if f is not None:
        f()


_entry_changed()   # a reload assigned _recorder above
_part_counter = 0  # process-wide, so a second recorder in the same process never overwrites
_part_lock = threading.Lock()


def _forget_after_fork() -> None:
    # A forked child inherits the parent's recorder without its writer thread: drop it, and
    # the parent's DDP buckets recorded as C records (a recorder of the child's own must not
    # write them)
    global _recorder
    _recorder = None
    _entry_changed()
    f = getattr(_cfast, "ddp_forget", None)
    if f is not None:
        f()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _leave_realtime() -> bool:
    """Move the calling thread from a real-time policy (SCHED_FIFO, SCHED_RR) to SCHED_OTHER;
    True when it did. Linux applies ``sched_setscheduler(0, ...)`` to the calling thread alone
    (the rank's other threads keep theirs), and an unprivileged thread may always lower its
    policy. Never raises."""
    try:
        if not sys.platform.startswith("linux") or not hasattr(os, "sched_getscheduler"):
            return False
        pol = os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)
        if pol not in (os.SCHED_FIFO, os.SCHED_RR):
            return False
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        return True
    except Exception as e:  # noqa: BLE001
        log.warn_once("writer-rt", "cannot take the writer thread off the real-time policy", e)
        return False


def get_recorder() -> "Recorder | None":
    """The active recorder of this process, None when tracing is off."""
    return _recorder


def _set_recorder(rec: "Recorder | None") -> None:
    global _recorder
    _recorder = rec
    _entry_changed()


def _next_part_index() -> int:
    global _part_counter
    with _part_lock:
        _part_counter += 1
        return _part_counter


def storage_key(t):
    """The key of the memory a tensor lives in: its storage's base address (a view or a slice
    has the base of its storage). None for a tensor without memory of its own (empty storage,
    fake / meta tensors, a wrapper subclass)."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except Exception:
        return None
    return ptr or None


class PendingOp:
    """An async op issued and not yet written: its row, its Work (or tensor) and state."""

    __slots__ = ("op_id", "op", "api", "tensors", "async_op", "waited", "row",
                 "work", "work_ref", "has_future", "t_done_seen", "device_token", "key",
                 "skeys", "siblings", "nvtx_range", "__weakref__")

    def __init__(self, row, tensors=(), device_token=None):
        self.row = row
        self.op_id = row[I_OP_ID]
        self.op = row[I_OP]
        self.api = row[I_API]
        self.async_op = row[I_ASYNC]
        self.tensors = tensors
        self.waited = False
        self.work = None        # strong ref (Work without a future: must stay alive to be polled)
        self.work_ref = None    # weak ref (Work with a future)
        self.has_future = False
        self.t_done_seen = None  # writer-thread time when first seen complete
        self.device_token = device_token
        self.key = None         # key in Recorder._by_key (id of the Work or tensor)
        self.skeys = ()         # keys in Recorder._by_storage (result tensors' storages)
        self.siblings = None    # other ops completed by the same Work (coalesced)
        self.nvtx_range = None  # id of the NVTX issue-to-wait range (async ops, tool attached)

    @property
    def site(self) -> str | None:
        """``file:line`` of the call (formatted on demand, off the hot path)."""
        return format_site(self.row[I_SITE])

    def work_alive(self) -> bool:
        if self.work is not None:
            return True
        r = self.work_ref
        return r is not None and r() is not None

    def as_json(self) -> dict:
        return _row_json(self.row)


def _row_json(row) -> dict:
    """One ``_inflight.json`` entry: the row's non-null columns plus ``"pending": true``."""
    d = {c: row[i] for i, c in enumerate(COLUMNS) if row[i] is not None}
    if "site" in d:
        d["site"] = format_site(d["site"])
    d["pending"] = True
    return d


def _pollable(row) -> bool:
    """Whether polling ``is_completed()`` can see this op end (see WAIT_ONLY)."""
    return (row[I_BACKEND], row[I_OP]) not in WAIT_ONLY


def _bounded(rec):
    """The recorder's bounded-capture filter (capture/window.py), None when everything is
    recorded; built on first use from the config."""
    b = getattr(rec, "_bounded_cache", False)
    if b is False:
        try:
            from . import window
            b = window.Bounded.for_recorder(rec, COLUMNS)
        except Exception as e:  # a bad option must not stop tracing: record everything
            log.warn_once("window", "bounded capture options ignored", e)
            b = None
        rec._bounded_cache = b
    return b


class Recorder:
    """Per-process recorder (one active at a time); see the module docstring."""

    def __init__(self, config: Config, rank: int, world_size: int, backend: str | None = None,
                 run_dir: str | None = None, clock=None, start_thread: bool = True):
        self.config = config
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.backend = backend
        self.run_dir = run_dir or config.output
        self.device_timer = None
        self.skew_ns = clock_skew_for(self.rank)
        self._clock = clock or _time_ns
        if self._clock is _time_ns and not self.skew_ns:
            # The common case: rec.now_ns() is the builtin itself (no Python frame per read).
            self.now_ns = _time_ns
        self.meta: dict = {
            "rank": self.rank,
            "world_size": self.world_size,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "commtrace_version": __version__,
            "backend": backend,
            "clock_offset_ns": 0,
            "clock_offset_method": "none",
            "clock_rtt_ns": None,
            "clock_skew_injected_ns": self.skew_ns,
            "dropped_rows": 0,
            "pg_ranks": {},
            # "c": blocking ops recorded by the C fast path; "python": it is not built (no
            # compiler at install) or COMMTRACE_PURE_PYTHON=1 (same rows, more cost per op)
            "capture_path": "c" if _cfast is not None else "python",
        }
        try:
            import torch

            self.meta["torch_version"] = torch.__version__
        except Exception:  # pragma: no cover
            pass
        # next() is atomic under the GIL; the C path takes ids from _fastpath.OpIds without
        # making an int object (a stale build without it: itertools.count, read by PyIter_Next)
        self._op_ids = (_cfast.OpIds(1) if getattr(_cfast, "OpIds", None) is not None
                        else itertools.count(1))
        self.step: int | None = None
        self.seq: dict = {}          # pg name -> next collective seq (without the C module)
        # With the C module: the counters by seq_slot(pg), shared with the C fast path.
        self._seqs = _cfast.Counters() if _cfast is not None else None
        #: torch's own per-group sequence number last claimed by a recorded call, by seq slot
        #: (shared with the C path): the gaps (torchseq.py).
        self._tseqs = _TS.new_last(self._seqs)
        self.p2p_seq: dict = {}      # (pg, src, dst) -> next pair seq
        self._ready = collections.deque()
        self._pending: dict[int, PendingOp] = {}   # op_id -> PendingOp
        self._by_key: dict[int, PendingOp] = {}    # id(work or tensor) -> PendingOp
        #: storage key (storage_key()) of an async result tensor -> PendingOp: functional
        #: collectives are waited through whatever tensor shares the result's memory (a view,
        #: a slice, a DTensor's local shard), as torch's own work registry keys them.
        self._by_storage: dict = {}
        self._device_rows: dict[int, list] = {}    # op_id -> row waiting for device times
        #: op_id -> row of a blocking call in progress (set before the call, popped after it
        #: returns). The writer thread lists them in _inflight.json: a rank hung inside a
        #: blocking collective must show which one. dict set/pop are atomic under the GIL.
        self._blocking: dict[int, list] = {}
        self._listeners: list = []
        #: Listeners accept a late "nothing pending" (set_lazy_idle): the 0 of a >0 -> 0
        #: transition is owed (_idle_owed) and delivered by the writer thread at its next wake
        #: (within IDLE_WAKE_S), unless an op becomes pending first, whose 0 -> >0 is then not
        #: told either: a loop of one async op and its wait() calls no listener per op.
        self.lazy_idle = False
        self._idle_owed = False
        #: Guards _pending's count with its insert / pop (the 0 <-> >0 changes the listeners
        #: are told). The C module's PendLock where built: a threading.Lock that the C async
        #: path takes without a Python call (two per DDP bucket).
        self._pend_lock = (_cfast.PendLock() if _cfast is not None and hasattr(_cfast, "PendLock")
                           else threading.Lock())
        self._write_lock = threading.RLock()
        # The writer thread sleeps on this lock (held while nobody rang): wake() releases it.
        # A bare lock, not an Event: ringing costs the ringing thread one C call, no Condition.
        self._bell = threading.Lock()
        self._bell.acquire()
        #: The writer thread is polling Work objects every POLL_INTERVAL_S: a new op to poll is
        #: seen within that, no ring needed. / It sleeps until its next flush (nothing pending
        #: for IDLE_AFTER_S): the next op that becomes pending rings it.
        self._polling = False
        self._deep = False
        self._listening = False
        #: op_id -> PendingOp of the ops the writer polls (a Work without a future, not
        #: complete): its 1 ms cycles look at these only, not at every pending op. Pruned by
        #: the cycles (released or completed ops), refilled by add_pending and _service.
        self._polled: dict = {}
        #: The writer thread's counters (its own thread only): wake-ups, of them rung by
        #: wake(), polling cycles, services of the pending ops, timed flushes.
        self.writer_stats = {"wakeups": 0, "rung": 0, "polls": 0, "services": 0, "flushes": 0}
        #: False: the writer thread writes no part on its own schedule, whoever set it calls
        #: flush() (benchmarks/steps.py --writer sync: traced rounds write their own parts).
        self.auto_flush = True
        self._stop = threading.Event()
        self._closed = False
        self._close_done = False
        #: Signals that arrived while this process was writing (a part between its write and
        #: its rename, or the exit flush): handled once the write is done (_redeliver).
        self._deferred: list = []
        self._dropped = 0
        self._write_failed = False
        self._last_inflight_text = None
        self._pg_ranks_extra: dict = {}
        #: Callables returning metadata entries, run once in the writer thread (first flush).
        self.meta_providers: list = []
        self._meta_done = False
        self.manual_steps = False
        #: How the process ended, written as "exit" in the final _inflight.json (crash.py,
        #: the signal handlers); None: a normal exit ({"how": "ok"}).
        self.exit_info: dict | None = None
        self._wrote_part = False
        self._thread = None
        self._prev_handlers: dict = {}
        self.cap = max(1000, int(config.buffer_ops))
        self.stack = bool(config.stack)
        if start_thread:
            self._thread = threading.Thread(target=self._run, name="commtrace-writer", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ hooks (interfaces.md)

    # step and device_timer are properties: the C fast path keeps the values it last read until
    # a setter says they changed (_rd_changed), not by reading this object's __dict__ tag
    # per op (issue 20, session 20: one memory line per cold op). Every assignment, tests'
    # `rec.step = 5` too, goes through the setter.
    @property
    def step(self) -> int | None:
        return self._step

    @step.setter
    def step(self, value) -> None:
        self._step = value
        _rd_changed()

    @property
    def device_timer(self):
        return self._device_timer

    @device_timer.setter
    def device_timer(self, value) -> None:
        self._device_timer = value
        _rd_changed()

    def now_ns(self) -> int:
        """Host wall clock in ns since the epoch, with the injected test skew."""
        return self._clock() + self.skew_ns

    def new_op_id(self) -> int:
        """Per-rank unique op id (column ``op_id``)."""
        return next(self._op_ids)

    def emit(self, **fields) -> None:
        """Append one non-op row (kind "sync" | "hazard" | "mark" | ...). Keys are schema column
        names; rank, thread, step and t_enqueue_ns are filled in when absent."""
        try:
            row = [None] * NCOL
            for k, v in fields.items():
                i = IDX.get(k)
                if i is not None:
                    row[i] = v
            if row[I_KIND] is None:
                row[I_KIND] = S.KIND_MARK
            row[I_RANK] = self.rank
            if row[I_THREAD] is None:
                row[I_THREAD] = _get_ident()
            if row[I_STEP] is None:
                row[I_STEP] = self.step
            if row[I_T_ENQ] is None:
                row[I_T_ENQ] = self.now_ns()
            if row[I_SITE] is None and self.config.stack:
                from .sites import user_site

                row[I_SITE] = user_site(2)
            self.append_row(row)
        except Exception as e:
            log.warn_once("emit", "could not record a row", e)

    def inflight_ids(self) -> list[int]:
        """op_ids of async ops issued and not yet completed (DDP's buckets recorded as C
        records included: ``_fastpath.ddp_inflight(True)``)."""
        ids = [p.op_id for p in list(self._pending.values()) if p.row[I_T_END] is None]
        if _ddp_inflight_ids is not None:
            ids += _ddp_inflight_ids()
        return ids

    def begin_blocking(self, row) -> None:
        """A blocking call is about to run: list it as in flight until :meth:`end_blocking`."""
        self._blocking[row[I_OP_ID]] = row

    def end_blocking(self, row) -> bool:
        """The blocking call of `row` returned (or raised). False when the final flush already
        wrote it as never completed (then the caller must not queue it again)."""
        return self._blocking.pop(row[I_OP_ID], None) is not None

    def blocking_rows(self) -> list:
        """Rows of the blocking calls in progress (any thread), and of DDP's buckets in flight
        recorded as C records (``_fastpath.ddp_inflight``: the hang watchdog and
        ``_inflight.json`` read them here)."""
        rows = [expand(self.rank, v, None) if len(v) == PRE_LEN else v
                for v in list(self._blocking.values())]
        if _cfast is not None:
            rows += [expand(self.rank, pre, None) for pre in _cfast.in_progress(False)]
        if _ddp_inflight is not None:   # DDP's buckets in flight, recorded as C records
            rows += _ddp_inflight()
        return rows

    def queued(self) -> int:
        """Finished rows waiting for the next flush (Python queue and the C fast path's)."""
        return len(self._ready) + (_cfast.buffered() if _cfast is not None else 0)

    def pending_ops(self) -> dict:
        """op_id -> :class:`PendingOp` for async ops issued and not yet written out (not waited,
        or waited but their completion not yet recorded)."""
        return dict(self._pending)

    def add_pending_listener(self, fn) -> None:
        """`fn(count)` is called when the number of pending async ops goes 0 -> >0 or >0 -> 0
        (from any thread). Exceptions in `fn` are logged once. With :meth:`set_lazy_idle` the
        >0 -> 0 is told late, by the writer thread, and a 0 -> >0 before it not at all.
        Adding a listener already there changes nothing (hazards.install after uninstall on
        the same recorder added it again: each transition then called it once per install)."""
        if fn not in self._listeners:
            self._listeners.append(fn)

    def set_lazy_idle(self, lazy: bool) -> None:
        """Whether the listeners accept a late 0 (hazard detection's basic mode does: with
        nothing pending its checks find nothing). A change tells no listener anything owed:
        the caller re-reads the pending count itself (hazards.install)."""
        self.lazy_idle = bool(lazy)
        self._idle_owed = False

    def _tell_idle(self) -> None:
        """The pending count went >0 -> 0: tell the listeners now, or owe it (lazy_idle)."""
        if self.lazy_idle:
            self._idle_owed = True
        else:
            self._notify(0)

    def _tell_busy(self) -> None:
        """The pending count went 0 -> >0: tell the listeners, unless the 0 before is still
        owed (then they were never told it, and nothing changed for them)."""
        if self._idle_owed:
            self._idle_owed = False
        else:
            self._notify(1)

    def _pay_idle(self) -> None:
        """Deliver an owed 0 (writer thread); the listeners re-read the count themselves."""
        if self._idle_owed and not self._pending:
            self._idle_owed = False
            self._notify(0)

    # ------------------------------------------------------------------ rows

    def next_seq(self, pg: str) -> int:
        if self._seqs is not None:
            return self._seqs.next(seq_slot(pg))
        s = self.seq.get(pg, 0)
        self.seq[pg] = s + 1
        return s

    def next_p2p_seq(self, pg: str, src, dst) -> int:
        k = (pg, src, dst)
        s = self.p2p_seq.get(k, 0)
        self.p2p_seq[k] = s + 1
        return s

    def append_row(self, row) -> None:
        """Queue a finished row for writing (drops and counts when the buffer is full)."""
        if len(self._ready) >= self.cap:
            self._dropped += 1
            return
        self._ready.append(row)

    def append_gap(self, row) -> None:
        """Queue a ``gap`` row (torchseq.py); kept whatever the window (like marks)."""
        self.append_row(row)

    def add_pending(self, row, key_obj=None, work=None, strong=False, has_future=False,
                    tensors=(), device_token=None) -> PendingOp:
        """Register an async op. `key_obj` (a Work or tensor) is what wait() will be called on."""
        p = PendingOp(row, tensors, device_token)
        p.has_future = has_future
        if work is not None:
            if strong:
                p.work = work
            else:
                try:
                    p.work_ref = weakref.ref(work)
                except TypeError:
                    p.work = work
        if key_obj is not None:
            p.key = id(key_obj)
            if work is None and p.work_ref is None and p.work is None:
                try:
                    p.work_ref = weakref.ref(key_obj)
                except TypeError:
                    pass
            self._by_key[p.key] = p
        with self._pend_lock:
            n0 = len(self._pending)
            if n0 >= self.cap:
                self._dropped += 1
                return p
            self._pending[p.op_id] = p
        if p.work is not None and not has_future and _pollable(row):
            self._polled[p.op_id] = p   # before wake(): see _sleep_s
        if n0 == 0 and self._listeners:
            self._tell_busy()
        return p

    def add_pending_tensors(self, row, results, tensors=(), device_token=None) -> PendingOp:
        """Register an async op completed by waiting on any of the tensors `results` (functional
        collectives: ``wait_tensor``), or on anything sharing their memory (:meth:`lookup_tensor`)."""
        p = self.add_pending(row, key_obj=results[0] if results else None, tensors=tensors,
                             device_token=device_token)
        keys = []
        for t in results:
            k = storage_key(t)
            if k is not None:
                keys.append(k)
                self._by_storage[k] = p
        p.skeys = tuple(keys)
        return p

    def lookup_tensor(self, t) -> "PendingOp | None":
        """The pending op whose result tensor shares memory with `t`, if any (a view, a slice
        or the tensor itself)."""
        k = storage_key(t)
        p = self._by_storage.get(k) if k is not None else None
        if p is None:
            p = self._by_key.get(id(t))
            if p is None or p.skeys:
                return None
        return p

    def lookup(self, obj) -> "PendingOp | None":
        """The pending op whose Work (or tensor) is `obj`, if any."""
        p = self._by_key.get(id(obj))
        if p is None:
            return None
        if p.work is not None:
            return p if p.work is obj else None
        r = p.work_ref
        if r is not None and r() is not obj:
            return None
        return p

    def complete(self, p: PendingOp, t_end: int, how: str = "callback") -> None:
        """Completion of an async op; keeps the earliest, with how it was obtained (column
        ``completion``: "callback" when the backend notified the end, "observed" / "wait" when
        commtrace found it complete, an upper bound)."""
        row = p.row
        cur = row[I_T_END]
        if cur is None or t_end < cur:
            row[I_T_END] = t_end
            row[I_COMPLETION] = how

    def hold_device_row(self, op_id: int, row) -> None:
        """A finished host row whose device times are still to be read back by `poll()`."""
        if len(self._device_rows) >= self.cap:
            self.append_row(row)
            return
        self._device_rows[op_id] = row

    def _notify(self, count: int) -> None:
        for fn in list(self._listeners):
            try:
                fn(count)
            except Exception as e:
                log.warn_once(("listener", id(fn)), "pending-op listener failed", e)

    def _release(self, p: PendingOp) -> None:
        """Move a pending op to the write queue."""
        with self._pend_lock:
            if self._pending.pop(p.op_id, None) is None:
                return
            n = len(self._pending)
        if p.key is not None and self._by_key.get(p.key) is p:
            self._by_key.pop(p.key, None)
        for k in p.skeys:
            if self._by_storage.get(k) is p:
                self._by_storage.pop(k, None)
        p.work = None
        p.tensors = ()
        if p.nvtx_range is not None:  # never waited: the range ends when the op is written
            nvtx_ranges.end(p.nvtx_range)
            p.nvtx_range = None
        if p.device_token is not None and self.device_timer is not None and not self._stop.is_set():
            self.hold_device_row(p.op_id, p.row)
        else:
            self.append_row(p.row)
        if n == 0 and self._listeners:
            self._tell_idle()

    def wake(self) -> None:
        """Have the writer thread poll the Work objects without a future soon (an op to poll
        was added, a wait returned without completing one). Free when there is nothing to
        poll or it is polling already."""
        if self._polled and not self._polling:
            self._ring()

    def _ring(self) -> None:
        try:
            self._bell.release()
        except RuntimeError:   # rung already, not yet heard
            pass

    def _pending_changed(self, count) -> None:
        """Pending listener, registered only while the writer thread sleeps until its next
        flush (nothing pending for IDLE_AFTER_S): an op became pending, wake it (it looks
        every IDLE_WAKE_S from then on). Not a listener otherwise: a loop of async ops calls
        no Python function of the writer's per op."""
        if count and self._deep:
            self._deep = False
            self._ring()

    # ------------------------------------------------------------------ writer thread

    def _lower_priority(self) -> None:
        """Lower this (the writer) thread's scheduling priority by ``config.writer_nice``.

        Linux applies ``setpriority(PRIO_PROCESS, tid)`` to the one thread: the training thread
        and the backend's threads keep theirs, and on a busy machine the encoding of a part
        waits for CPU they leave idle instead of taking it from them. The guarantees do not
        depend on it: the buffer stays bounded (rows beyond it are dropped and counted), the
        exit and signal flushes run on the thread that handles them, at its own priority.

        A rank run under a real-time policy (``chrt -f``, SCHED_FIFO or SCHED_RR: the thread
        inherits it) ignores nice values: the writer would run at the training threads' own
        real-time priority, and a training thread woken by its backend on a CPU where the writer
        is encoding a part waits until the writer blocks (the same priority does not preempt).
        The writer thread first leaves the real-time policy for the normal one (no privilege is
        needed to lower it), then takes its nice value (issue 20, session 25)."""
        n = int(getattr(self.config, "writer_nice", 0) or 0)
        if n <= 0 or not sys.platform.startswith("linux") or not hasattr(os, "setpriority"):
            return
        _leave_realtime()
        try:
            tid = threading.get_native_id()
            cur = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, cur + n))
        except Exception as e:
            log.warn_once("writer-nice", "cannot lower the writer thread's priority", e)

    def _run(self) -> None:
        self._lower_priority()
        try:
            # The writer's imports (pyarrow) take 0.1-0.3 s of CPU when cold. Done now, at the
            # start, they do not land in the middle of training at the first flush, where they
            # hold one rank back and make it look like a straggler in a short run.
            from ..format import writer as _writer  # noqa: F401
        except Exception as e:
            log.warn_once("writer-import", "trace writer unavailable", e)
        interval = max(0.05, float(self.config.flush_interval))
        first = min(FIRST_FLUSH_S, interval)
        mono = time.monotonic
        t_start = mono()
        next_flush = t_start + first
        next_service = t_start + IDLE_WAKE_S
        busy_until = t_start + IDLE_AFTER_S   # looks every IDLE_WAKE_S until then at least
        st = self.writer_stats
        bell = self._bell
        # Every wake-up costs this thread 30-100 us of CPU on a loaded 2-core VM (the timed
        # wait's system calls, the GIL), and takes the GIL from the training thread: it wakes
        # only when something is due (docs/performance.md, "The writer thread's wake-ups").
        while not self._stop.is_set():
            now = mono()
            try:
                timeout = self._sleep_s(now, next_flush, next_service, busy_until, interval)
            except Exception as e:  # never die: look again soon
                log.warn_once("writer-sleep", "writer thread error", e)
                timeout = min(IDLE_WAKE_S, interval)
            rung = bell.acquire(True, timeout) if timeout > 0 else bell.acquire(False)
            st["wakeups"] += 1
            self._deep = False
            if self._listening:
                self._listening = False
                try:   # in place: the C path holds this list
                    self._listeners.remove(self._pending_changed)
                except ValueError:
                    pass
            if self._stop.is_set():
                break
            try:
                now = mono()
                if rung:
                    # an op to poll (looked at once when issued), a device-timed op, an op that
                    # became pending: nothing is due at once, the next sleep is shorter
                    st["rung"] += 1
                    busy_until = now + IDLE_AFTER_S
                elif self._polled:
                    self._poll_works()
                flush_due = self.auto_flush and now >= next_flush
                if now >= next_service or flush_due:
                    st["services"] += 1
                    self._service(final=False)
                    now = mono()
                    next_service = now + self._service_period()
                    if self._pending:
                        busy_until = now + IDLE_AFTER_S
                if flush_due:
                    st["flushes"] += 1
                    self.flush()
                    early = not self._wrote_part and mono() < t_start + FIRST_FLUSH_WINDOW_S
                    next_flush = mono() + (first if early else interval)
            except Exception as e:  # never die silently, never raise
                log.warn_once("writer", "writer thread error", e)

    def _service_period(self) -> float:
        """Seconds between services of the pending ops: 0.05 with a device timer or NCCL
        completion hooks (their records are merged, device times read back), else
        IDLE_WAKE_S."""
        if self.device_timer is not None or _CH._enabled or _CH.HOOKED:
            return 0.05
        return IDLE_WAKE_S

    def _sleep_s(self, now, next_flush, next_service, busy_until, interval) -> float:
        """How long the writer thread sleeps: POLL_INTERVAL_S while Work objects are to be
        polled, until the next service while ops are pending (or were, recently), else
        until the next flush. The flags are cleared before the state they describe is read:
        a thread that adds an op to poll (or the first pending op) after that read sees the
        flag down and rings."""
        self._polling = False
        if self._polled:
            self._polling = True
            return POLL_INTERVAL_S
        t = (next_flush - now) if self.auto_flush else interval
        if (self._pending or now < busy_until or self.device_timer is not None
                or _CH._enabled or _CH.HOOKED or self._device_rows):
            return max(0.0, min(t, next_service - now, interval))
        # Asleep until the next flush: the first op that becomes pending rings (the listener,
        # then the flag, then an owed "nothing pending" told, then the count read: an op made
        # pending after that read is told to the listener; an owed 0 would swallow it).
        self._listeners.append(self._pending_changed)
        self._listening = True
        self._deep = True
        if self._idle_owed:
            self._pay_idle()
        if self._pending:
            self._deep = False
            return max(0.0, min(t, next_service - now, interval))
        return max(0.0, min(t, interval))

    def _poll_works(self) -> None:
        """One polling cycle: ``is_completed()`` of the Work objects without a future that
        are still in flight (at most MAX_POLL); completed, released or waited ones leave the
        set."""
        self.writer_stats["polls"] += 1
        polled = self._polled
        pending = self._pending
        now = self.now_ns()
        n = 0
        for op_id, p in list(polled.items()):
            w = p.work
            if w is None or p.row[I_T_END] is not None or op_id not in pending:
                polled.pop(op_id, None)
                continue
            if n >= MAX_POLL:
                break
            n += 1
            try:
                if w.is_completed():
                    self.complete(p, now, "observed")
                    polled.pop(op_id, None)
            except Exception:
                polled.pop(op_id, None)   # polled again by the next service, if still pending

    def _service(self, final: bool) -> None:
        """Read device times, poll Work objects without a future, release finished pending ops.
        Device times are read first so that ops released now (at close, every pending op)
        still carry them."""
        if final:
            dt = self.device_timer
            if dt is not None and getattr(dt, "done_grace_ns", 0):
                dt.done_grace_ns = 0  # closing: completed ops unwaited in Python, read now
        self._poll_device()
        for f in STAMP_FLUSHERS:
            try:
                f()
            except Exception:
                pass
        if _ddp_drain is not None:
            # DDP's buckets recorded as C records: the completed ones' rows queued (final:
            # every one, those in flight as never completed)
            try:
                _ddp_drain(self, final)
            except Exception as e:
                log.warn_once("ddp-drain", "could not write DDP's C records", e)
        if _CH._enabled or _CH.HOOKED:
            _CH.scan()
            if _CH._infos:
                _CH.merge(self, final)
        now = self.now_ns()
        hold_ns = int(HOLD_FLUSHES * max(0.05, float(self.config.flush_interval)) * 1e9)
        polled = 0
        ops = list(self._pending.values())
        if not final and SERVICE_C and ops and _service_pass is not None:
            # the ops whose end is known, released in C (the same decisions as below): the
            # loop below gets the others (in flight, device-timed, with an NVTX range)
            try:
                ops = _service_pass(self, ops, now, hold_ns)
            except Exception as e:  # the loop below looks at every op (one released already
                # is not in _pending: _release does nothing to it)
                log.warn_once("service-c", "C service pass failed; using the Python loop", e)
        for p in ops:
            row = p.row
            if (row[I_T_END] is None and p.work is not None and not p.has_future
                    and polled < MAX_POLL and _pollable(row)):
                polled += 1
                try:
                    if p.work.is_completed():
                        self.complete(p, now, "observed")
                    elif not final:
                        # polled every POLL_INTERVAL_S from now on (an op the C path added
                        # without waking this thread: --async-completion wait)
                        self._polled[p.op_id] = p
                except Exception:
                    pass
            if final:
                self._release(p)
                continue
            if row[I_T_END] is None:
                if (not p.has_future and p.work is None and p.work_ref is not None
                        and p.work_ref() is None):
                    self._release(p)  # e.g. a functional collective's result dropped unwaited
                continue
            if p.t_done_seen is None:
                p.t_done_seen = now
            if p.waited or not p.work_alive() or now - p.t_done_seen >= hold_ns:
                self._release(p)
        if final and self._device_rows:
            for row in list(self._device_rows.values()):
                self.append_row(row)
            self._device_rows.clear()
        if self._idle_owed:
            self._pay_idle()

    def _poll_device(self) -> None:
        """Fill device times (t_start_ns, t_end_ns, stream_wait_ns) reported by the device
        timer into held rows (then queued) and pending ops (still in flight)."""
        dt = self.device_timer
        if dt is not None:
            try:
                for op_id, t_start, t_end, sw in dt.poll():
                    row = self._device_rows.pop(op_id, None)
                    p = None
                    if row is not None and len(row) == 2:   # the C fast path's (pre, t1)
                        row = expand(self.rank, row[0], row[1])
                    if row is None:
                        p = self._pending.get(op_id)
                        if p is None:
                            continue
                        row = p.row
                    if t_start is not None:
                        row[I_T_START] = t_start
                    if t_end is not None:
                        row[I_T_END] = t_end
                        row[I_COMPLETION] = "device"
                    if sw is not None:
                        row[I_STREAM_WAIT] = sw
                    if p is not None:
                        p.device_token = None
                    else:
                        self.append_row(row)
            except Exception as e:
                log.warn_once("device-poll", "device timer poll failed", e)

    def _collect_pg_ranks(self) -> dict:
        out = dict(self._pg_ranks_extra)
        try:
            from torch.distributed import distributed_c10d as c10d

            names = dict(c10d._world.pg_names)
            ranks = dict(c10d._world.pg_group_ranks)
            for pg, name in names.items():
                gr = ranks.get(pg)
                if gr:
                    out[name] = sorted(int(r) for r in gr.keys())
        except Exception:
            pass
        return out

    def _metadata(self) -> dict:
        if not self._meta_done:
            self._meta_done = True
            for fn in self.meta_providers:
                try:
                    self.meta.update(fn())
                except Exception as e:
                    log.warn_once(("meta", id(fn)), "metadata provider failed", e)
        m = dict(self.meta)
        m["dropped_rows"] = self._dropped
        m["pg_ranks"] = self._collect_pg_ranks()
        m["flush_interval_s"] = self.config.flush_interval
        if self.device_timer is not None:
            try:
                m.update(self.device_timer.stats())
            except Exception:
                pass
        return m

    def flush(self, final: bool = False) -> None:
        """Write the queued rows as one part and rewrite the in-flight snapshot. Never raises."""
        with self._write_lock:
            try:
                if final:
                    self._service(final=True)
                q = self._ready
                rank = self.rank
                # the rows queued now, taken from the left at C speed (no Python frame per
                # row): the training thread may append meanwhile, on the right
                rows = list(itertools.starmap(q.popleft, itertools.repeat((), len(q))))
                if 2 in set(map(len, rows)):   # short records of the blocking path: expand
                    rows = [expand(rank, r[0], r[1]) if len(r) == 2 else r for r in rows]
                ccols = None
                if _cfast is not None:
                    if (RECORD_BUFFERS and _bounded(self) is None and _numpy_ok()
                            and hasattr(_cfast, "drain_records")):
                        ccols = _cfast.drain_records()   # typed buffers (n, ...): see _write
                    else:
                        ccols = _cfast.drain_columns()
                    self._dropped += _cfast.take_dropped()
                inflight = [p.as_json() for p in list(self._pending.values())
                            if p.row[I_T_END] is None]
                inflight += [_row_json(r) for r in self.blocking_rows()]
                if final:
                    # A blocking call still in progress (its thread is stuck in C++, or this
                    # flush runs from another thread) is written now, never completed. Popping
                    # it first keeps it from being queued again should the call return.
                    for op_id in list(self._blocking):
                        r = self._blocking.pop(op_id, None)
                        if r is not None:
                            rows.append(expand(rank, r, None) if len(r) == PRE_LEN else r)
                    if _cfast is not None:
                        rows += [expand(rank, pre, None) for pre in _cfast.in_progress(True)]
                    # Ops written just now with t_end null are still reported as in flight.
                    inflight = [_row_json(r)
                                for r in rows if r[I_KIND] == S.KIND_OP and r[I_T_END] is None]
                self._write(rows, inflight, final, ccols)
            except Exception as e:
                log.warn_once("flush", "could not write trace part", e)
        if self._deferred:
            self._redeliver()

    def _write(self, rows, inflight, final, ccols=None) -> None:
        from ..format import writer as W

        d = W.rank_dir(self.run_dir, self.rank)
        buffers = ccols is not None and isinstance(ccols[0], int)   # drain_records()
        n_c = (ccols[0] if buffers else len(ccols[0])) if ccols else 0
        try:
            W.make_dir(d)
            # Queued full rows (async ops of either path, gaps, marks, ...) as typed buffers
            # too (pack_rows) from ROW_BUFFERS_MIN_ROWS rows on, where the C path is built,
            # numpy imports and capture is not bounded (its split works on column lists).
            c_cols = C_COLUMNS and hasattr(_cfast, "string_column")
            row_buffers = (ROW_BUFFERS and RECORD_BUFFERS
                           and len(rows) >= (ROW_BUFFERS_MIN_ROWS_C if c_cols
                                             else ROW_BUFFERS_MIN_ROWS)
                           and _cfast is not None and hasattr(_cfast, "pack_rows")
                           and _bounded(self) is None and _numpy_ok())
            if (buffers and n_c) or (row_buffers and not n_c):
                # arrays built over whole columns: the queued rows first, then the C path's
                # blocking calls (typed buffers), as before
                arrays = None
                if rows:
                    if row_buffers:
                        arrays = arrays_of_rows(self.rank, rows)
                    if arrays is None:   # the list path for these rows
                        cols = [list(col) for col in zip(*rows)]
                        cols[I_SITE] = [format_site(v) for v in cols[I_SITE]]
                        t_py = W.rows_to_table_nopandas({c: cols[i] for i, c in enumerate(COLUMNS)})
                        arrays = [t_py.column(i).chunk(0) for i in range(len(COLUMNS))]
                table = None
                if buffers and n_c:
                    batch = batch_of_records(self.rank, ccols) if arrays is None else None
                    if batch is not None:   # the calls alone (a tight loop's parts): no arrays
                        import pyarrow as pa
                        table = pa.Table.from_batches([batch])
                    else:
                        more = arrays_of_records(self.rank, ccols)
                        if arrays is None:
                            arrays = more
                        else:
                            import pyarrow as pa
                            arrays = [pa.concat_arrays([x, y]) for x, y in zip(arrays, more)]
                if table is None:
                    table = W.table_of_arrays(arrays)
                W.write_part(self.run_dir, self.rank, table, self._metadata(),
                             index=_next_part_index(), compression=W.part_compression(table))
                self._wrote_part = True
            elif rows or n_c:
                cols = [list(col) for col in zip(*rows)] if rows else [[] for _ in COLUMNS]
                if n_c:
                    for col, more in zip(cols, expand_columns(self.rank, ccols)):
                        col.extend(more)
                # Wrappers keep the call site as a raw (file, line) pair: format it here.
                cols[I_SITE] = [format_site(v) for v in cols[I_SITE]]
                bounded = _bounded(self)
                counters = None
                if bounded is not None:  # --steps / --schedule: ops outside become counters
                    cols, counters = bounded.split(cols)
                if cols[0]:
                    table = W.rows_to_table_nopandas({c: list(cols[i]) for i, c in enumerate(COLUMNS)})
                    path = W.write_part(self.run_dir, self.rank, table, self._metadata(),
                                        index=_next_part_index(),
                                        compression=W.part_compression(table))
                    if bounded is not None:
                        bounded.written(path, len(cols[0]), cols[I_STEP])
                if counters:
                    bounded.write_counters(self, counters)
                self._wrote_part = True
            snap = {"rank": self.rank, "t_ns": self.now_ns(), "final": final,
                    "pid": self.meta.get("pid"), "host": self.meta.get("host"),
                    "run_id": self.meta.get("run_id"),
                    "flush_interval_s": self.config.flush_interval, "ops": inflight}
            if getattr(self.config, "session", ""):  # the `commtrace run` invocation
                snap["session"] = self.config.session
            if final:
                if self.exit_info is None:  # an uncaught sys.exit(n) (crash.py)
                    crash = sys.modules.get(__package__ + ".crash")
                    self.exit_info = crash.exit_info() if crash is not None else None
                snap["exit"] = self.exit_info or {"how": "ok"}
            text = json.dumps(snap, default=str)
            if text != self._last_inflight_text or final:
                W.atomic_write_text(os.path.join(d, S.INFLIGHT_NAME), text)
                self._last_inflight_text = text
        except Exception as e:
            self._dropped += len(rows) + n_c
            if not self._write_failed:
                self._write_failed = True
                log.warn_once(("write", self.run_dir), f"cannot write trace under {d}; "
                              "rows are dropped (training continues)", e)

    def close(self) -> None:
        """Stop the writer thread and write everything, including ops still in flight (with
        t_end null). Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        try:
            # numbers issued after the last recorded op of each group still alive
            _TS.check_end(self, None, "close")
        except Exception:
            pass
        try:
            self._stop.set()
            self._ring()
            t = self._thread
            if t is not None and t is not threading.current_thread():
                t.join(timeout=5.0)
            self.flush(final=True)
            _CH.closing()
            # Everything is written: let go of the process groups commtrace looked up (the
            # pending ops' Work objects and tensors went with the final flush), so that none
            # lives on in commtrace to the interpreter's finalisation, where torch 2.13's gloo
            # can abort the process (docs/faq.md).
            w = sys.modules.get(__package__ + ".wrappers")
            if w is not None:
                try:
                    w.reset_caches()
                except Exception as e:
                    log.warn_once("close-caches", "could not drop cached process groups", e)
        finally:
            self._close_done = True
        crash = sys.modules.get(__package__ + ".crash")
        if crash is not None:  # everything is written: an empty crash file is not kept
            crash.closed(self)
        self._restore_signals()
        self._redeliver()

    def writing_here(self) -> bool:
        """True while this thread is writing (a flush holds the write lock) or a close has
        begun and not finished: a signal handler must not end the process now."""
        if self._closed and not self._close_done:
            return True
        try:
            return self._write_lock._is_owned()
        except Exception:
            return False

    def _redeliver(self) -> None:
        """Run the handlers of signals deferred during a write, now that it is done."""
        while self._deferred and not self.writing_here():
            handler, signum, frame = self._deferred.pop(0)
            handler(signum, frame)

    # ------------------------------------------------------------------ signals / exit

    def install_exit_handlers(self) -> None:
        """Flush at normal exit and on SIGTERM / SIGINT, chaining any existing handlers."""
        atexit.register(_atexit_close, weakref.ref(self))
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                prev = signal.getsignal(sig)
                if getattr(prev, "__commtrace__", False):
                    continue
                handler = _make_handler(weakref.ref(self), prev)
                signal.signal(sig, handler)
                self._prev_handlers[sig] = (prev, handler)
            except Exception as e:
                log.warn_once(("signal", sig), "cannot install signal handler", e)

    def _restore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, (prev, handler) in list(self._prev_handlers.items()):
            try:
                if signal.getsignal(sig) is handler:
                    signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
            except Exception:
                pass
        self._prev_handlers.clear()


if _cfast is not None and getattr(_cfast, "rd_props", None) is not None:
    _cfast.rd_props(Recorder.__dict__["step"], Recorder.__dict__["device_timer"])
if _cfast is not None and hasattr(_cfast, "set_devtimer_api"):
    from . import device as _device

    _device._share_c_api()


def _atexit_close(ref) -> None:
    rec = ref()
    if rec is not None:
        try:
            rec.close()
        except Exception:
            pass


def _make_handler(ref, prev):
    def handler(signum, frame):
        rec = ref()
        if rec is not None:
            if rec.writing_here():
                # The handler interrupted this thread's own write (between a part's write and
                # its rename, or the exit flush): ending the process now would lose it. The
                # write re-delivers the signal when it is done.
                rec._deferred.append((handler, signum, frame))
                return None
            try:
                if signum == signal.SIGTERM and prev in (signal.SIG_DFL, None):
                    # The process ends right after, of this signal (SIGINT is recorded by
                    # crash.py's excepthook if its KeyboardInterrupt ends the process).
                    rec.exit_info = {"how": "signal", "signal": "SIGTERM",
                                     "exit_code": 128 + int(signum)}
                    rec.close()  # the process ends right after: write everything
                else:
                    rec.flush()
            except Exception:
                pass
        return _after_flush(signum, frame, prev)

    handler.__commtrace__ = True
    return handler


def _after_flush(signum, frame, prev):
    """What the signal would have done without commtrace: the previous handler, or ignore, or
    the default (restored and re-delivered, so the exit status is the signal's)."""
    if callable(prev):
        return prev(signum, frame)
    if prev == signal.SIG_IGN:
        return None
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return None
