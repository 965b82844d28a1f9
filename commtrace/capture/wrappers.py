"""Function wrappers on torch.distributed: one row per op per rank.

Each wrapper of :data:`api_table.API_TABLE` is one function object installed under the same
name in both ``torch.distributed`` and ``torch.distributed.distributed_c10d``, because
``batch_isend_irecv`` and ``P2POp`` recognise ops by the identity of ``isend`` / ``irecv``
(``shared/reference/torch-notes.md``). When tracing is off a wrapper costs one attribute read.

Completion (metrics.md ``t_end_ns``):

- async op with a future (gloo collectives, NCCL): the future's done-callback;
- async op without one (gloo isend / irecv / batch_isend_irecv): the writer thread polls
  ``is_completed()``; ``wait()`` refines it (the earliest of the two is kept);
- blocking op: the return of the call (the op had completed when it returned), or the CUDA end
  event when a device timer is active;
- ``Work.wait`` is patched on the class to record ``t_wait_ns`` / ``t_wait_end_ns``.

Wrapped calls are never re-entered: the tensor collectives that an object collective issues
internally are not recorded as ops of their own (their sizes are added to the outer row), so
the per-group ``seq`` counts the calls the user made.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import threading
import weakref

from ..format import schema as S
from . import device as _device
from . import completion_hook as _CH
from . import torchseq as _TS
from . import log, nvtx_ranges
from . import recorder as _R
from .api_table import API_TABLE, Reader, split_param, tensors_of
from .registry import ORIGINAL_ATTR, original_of, patch, restore
from .recorder import (I_API, I_ASYNC, I_BYTES, I_COUNT, I_DETAIL, I_DEVICE, I_DTYPE, I_ERROR,
                       I_FIRST, I_OP_ID, I_OUT_BYTES, I_PEER, I_ROOT, I_SEQ, I_T_END, I_T_RET,
                       I_T_WAIT, I_T_WAIT_END, NCOL)
from . import sites as _sites
from .sites import site_of_frame, user_site_raw

_getframe = __import__("sys")._getframe

# The blocking fast path in C (commtrace/capture/_fastpath.c), when built; the Python one in
# make_wrapper does the same. COMMTRACE_PURE_PYTHON=1 turns the C one off.
_cfast = None
if __import__("os").environ.get("COMMTRACE_PURE_PYTHON", "") in ("", "0"):
    try:
        from . import _fastpath as _cfast
        if getattr(_cfast, "API_VERSION", None) != 1:
            _cfast = None   # a stale build of an older source: not used
    except ImportError:
        _cfast = None
#: True while this thread is inside a call the C path records (its inner calls are not rows).
_cdepth = _cfast.depth if _cfast is not None else None


class _TLS(threading.local):
    # Set per thread in __init__ so that reads hit the instance dict (class-level defaults make
    # every read on the hot path miss it first).
    def __init__(self):
        self.depth = 0        # >0 inside a recorded call: inner calls are not rows of their own
        self.acc = None       # [count, bytes, out_bytes, dtype, device] from an object
        #                       collective's inner calls
        self.api = None       # api name override (batch_isend_irecv, ddp_comm_hook, ...)
        self.detail = None    # detail text for rows issued in this context (DDP bucket, ...)
        self.coalesce = None  # list of (row, tensors, token) issued inside a _coalescing_manager


tls = _TLS()

_c10d = None     # torch.distributed.distributed_c10d
_world = None    # its _World (the default group is read as _world._default_pg, no property)
_dist = None     # torch.distributed
_installed = False
_install_lock = threading.RLock()
_WRAPPERS: dict[str, object] = {}

# --------------------------------------------------------------------------------------------
# Process-group facts, cached per group object.
# --------------------------------------------------------------------------------------------


class PgInfo:
    __slots__ = ("name", "size", "ranks", "backend", "member", "pg", "idx", "fidx", "seq_slot",
                 "tseq", "p2p_one")

    def __init__(self, pg, name, size, ranks, backend, member):
        self.pg, self.name, self.size, self.ranks = pg, name, size, ranks
        self.backend, self.member = backend, member
        # Index of (name, size, backend) in recorder.PG_FACTS, for the fast path's records.
        self.fidx = _R.register_fact(_R.PG_FACTS, (name, size, backend)) if member else -1
        # What the C fast path reads: None hands every call on this group to the Python path
        # (a group with a completion hook: its calls claim the group's own seqs).
        self.idx = self.fidx
        self.seq_slot = _R.seq_slot(name) if member else -1   # its seq counter
        # torch numbers this group's ops: unrecorded ones are found (torchseq.py)
        self.tseq = member and _TS.enabled and _TS.read(pg) is not None
        # Its backend numbers each point-to-point op once (gloo; NCCL does not number them):
        # a send/recv claims (hi - 1, hi] with one read after it, as a collective does
        # (torchseq.P2P_ONE; tests/test_fidelity_gaps.py checks gloo does)
        self.p2p_one = bool(self.tseq) and backend in _TS.P2P_ONE


_pg_cache: dict = {}
#: Names given to process groups that torch has no name for, by first use in this process:
#: group -> name. Kept for the process's life (a group dropped and another created at the same
#: address must not take its name): weak keys.
_unnamed = weakref.WeakKeyDictionary()
_unnamed_count: dict = {}


def _group_name(c, group) -> str:
    """A stable name for `group`: torch's name for the groups it knows (``new_group``,
    DeviceMesh, ``_register_process_group``), else the group's own ``group_name`` when set,
    else ``<backend>#<k>`` where k counts the unnamed groups of that backend in order of first
    use on this rank. A Python ``ProcessGroup`` subclass used directly, which torch never
    registers, gets a name of its own and therefore a seq of its own; ranks that create and
    use such groups in the same order give them the same names, so their rows match."""
    name = c._world.pg_names.get(group) if hasattr(c, "_world") else None
    if name is not None:
        return str(name)
    try:
        gn = group.group_name
    except Exception:
        gn = None
    if gn:
        return str(gn)
    try:
        got = _unnamed.get(group)
    except TypeError:   # not weakly referenceable: named by id, not remembered
        return f"{type(group).__name__}@{id(group):x}"
    if got is not None:
        return got
    try:
        kind = str(group.name()) or type(group).__name__
    except Exception:
        kind = type(group).__name__
    k = _unnamed_count.get(kind, 0)
    _unnamed_count[kind] = k + 1
    got = f"{kind}#{k}"
    try:
        if group.size() == 1:
            # A group of one is this rank's alone: another rank's group of the same name is
            # not the same group, and its ops must not match this rank's.
            rec = _R.get_recorder()
            got += f"@rank{rec.rank if rec is not None else group.rank()}"
    except Exception:
        pass
    _unnamed[group] = got
    return got


def pg_info(group) -> PgInfo | None:
    """Name, size, global ranks and backend of `group` (None: the default group)."""
    if group is None:
        group = _c10d._world.default_pg
        if group is None:
            return None
    info = _pg_cache.get(group)
    if info is not None:
        return info
    c = _c10d
    try:
        member = not c._rank_not_in_group(group)
    except Exception:
        member = True
    if not member:
        info = PgInfo(group, None, 0, [], None, False)
    else:
        name = _group_name(c, group)
        try:
            ranks = [int(r) for r in c.get_process_group_ranks(group)]
        except Exception:
            ranks = []
            try:
                if group.size() == 1:   # an unregistered group of one: this rank
                    rec = _R.get_recorder()
                    ranks = [rec.rank] if rec is not None else []
            except Exception:
                pass
        try:
            backend = str(c.get_backend(group))
        except Exception:
            backend = None
        if backend is None:
            try:   # a Python ProcessGroup torch never registered: its getBackendName()
                backend = str(group.name())
            except Exception:
                backend = None
        info = PgInfo(group, name, len(ranks) or group.size(), ranks, backend, True)
        if _CH._enabled or _CH.HOOKED:
            try:
                if _CH.maybe_register(group, name, info.size, backend):
                    info.idx = None
                    info.tseq = False   # its unrecorded ops are c++ rows of their own
            except Exception as e:
                log.warn_once("completion-hook", "completion hook not registered", e)
        rec = _R.get_recorder()
        if rec is not None:
            rec._pg_ranks_extra[name] = ranks
    _pg_cache[group] = info
    return info


def _pg_by_name(name):
    """The cached PgInfo of the group named `name` (None: not cached)."""
    for info in list(_pg_cache.values()):
        if info.name == name:
            return info
    return None


class _WorldShim:
    """``_default_pg`` through the public property, for a torch whose _World lacks the field."""

    def __init__(self, c10d):
        self._c10d = c10d

    @property
    def _default_pg(self):
        return self._c10d._world.default_pg


def _global(info: PgInfo, glob, grp):
    if glob is not None:
        return int(glob)
    if grp is not None:
        try:
            return info.ranks[int(grp)]
        except Exception:
            return None
    return None


#: "float32", ... for a torch dtype (cached; shared with the writer's expansion).
dtype_name = _R.dtype_name


def _nbytes(ts) -> tuple[int, int]:
    n = b = 0
    for t in ts:
        try:
            n += t.numel()
            b += t.nbytes
        except Exception:
            pass
    return n, b


#: device index -> name. -1 is the CPU (get_device() is -1 only for CPU and meta tensors,
#: and meta tensors do not communicate).
_dev_names: dict = {-1: "cpu"}


def device_name(t) -> str:
    """"cpu", "cuda:0", ... (cached per device index; get_device() is cheaper than .device)."""
    d = t.get_device()
    if d < 0:
        return "cpu" if t.is_cpu else str(t.device)
    s = _dev_names.get(d)
    if s is None:
        s = _dev_names[d] = str(t.device)
    return s


# --------------------------------------------------------------------------------------------
# Row construction.
# --------------------------------------------------------------------------------------------


_get_ident = threading.get_ident
assert NCOL == 35, "new_row's literal follows schema.COLUMNS"


def new_row(rec, kind, info: PgInfo, op, api, async_op, t0) -> list:
    """A row in schema.COLUMNS order, with the fields known before the call."""
    return [kind, rec.rank, info.name, info.size, None, op, api, async_op, info.backend,
            None, None, None, None, None, None, None, t0, None, None, None, None, None,
            rec.step, user_site_raw(3) if rec.stack else None, None, next(rec._op_ids), None,
            None, None, None, None, _get_ident(), tls.detail, None, None]


def _prepare(rec, reader: Reader, args, kwargs, t0):
    """Build the row of one call (before the call). Returns (row, tensors, info) or None when
    the call is not to be recorded (rank not in the group)."""
    spec = reader.spec
    info = pg_info(reader.arg(args, kwargs, spec.group))
    if info is None or not info.member:
        return None
    if spec.always_async:
        async_op = True
    elif spec.async_param:
        async_op = bool(reader.arg(args, kwargs, spec.async_param))
    else:
        async_op = False
    api = tls.api or reader.api
    row = new_row(rec, S.KIND_OP, info, spec.op, api, async_op, t0)
    in_name, in_kind = split_param(spec.ins)
    out_name, out_kind = split_param(spec.outs)
    ins = tensors_of(reader.arg(args, kwargs, in_name), in_kind) if in_name else []
    outs = tensors_of(reader.arg(args, kwargs, out_name), out_kind) if out_name else []
    if spec.sizes:
        c, b, ob, x, _ts = _SIZE_RULES[spec.sizes](reader)(args, kwargs, len(args))
        row[I_COUNT], row[I_BYTES], row[I_OUT_BYTES] = c, b, ob
        row[I_DTYPE], row[I_DEVICE] = dtype_name(x.dtype), device_name(x)
    elif ins or outs:
        n, b = _nbytes(ins)
        row[I_COUNT] = n
        row[I_BYTES] = b
        row[I_OUT_BYTES] = _nbytes(outs)[1] if outs else 0
        t = ins[0] if ins else outs[0]
        try:
            row[I_DTYPE] = dtype_name(t.dtype)
            row[I_DEVICE] = device_name(t)
        except Exception:
            pass
    elif not spec.object:
        row[I_COUNT] = row[I_BYTES] = row[I_OUT_BYTES] = 0 if spec.op == "barrier" else None
    me = rec.rank
    if spec.peer:
        peer = _global(info, reader.arg(args, kwargs, spec.peer[0]),
                       reader.arg(args, kwargs, spec.peer[1]))
        row[I_PEER] = peer
        if peer is not None:
            src, dst = (me, peer) if spec.op == "send" else (peer, me)
            s = rec.next_p2p_seq(info.name, src, dst)
            row[I_SEQ] = s
            row[I_FIRST] = s == 0
    else:
        if spec.root:
            row[I_ROOT] = _global(info, reader.arg(args, kwargs, spec.root[0]),
                              reader.arg(args, kwargs, spec.root[1]))
        s = rec.next_seq(info.name)
        row[I_SEQ] = s
        row[I_FIRST] = s == 0
    return row, ins + outs, info


_nofuture: set = set()   # (backend, op) whose Work has no future (gloo p2p)


#: Work classes whose wait() has been looked at (patched when it overrides Work.wait).
_wait_checked: set = set()
_wait_patched: list = []


def _patch_wait_of(cls) -> None:
    """A Work subclass with a wait() of its own (torch's FakeWork, PythonCallbackWork, a Python
    backend's Work) bypasses the patch on Work.wait: patch its wait too, once per class, so that
    waiting on it is recorded like any other wait."""
    _wait_checked.add(cls)
    try:
        if "wait" in cls.__dict__ and not hasattr(cls.__dict__["wait"], ORIGINAL_ATTR):
            patch(cls, "wait", _make_wait(cls.__dict__["wait"]))
            _wait_patched.append(cls)
    except Exception as e:
        log.warn_once(("work-wait", cls), f"cannot patch {cls.__name__}.wait", e)


def _device_done(dt, work, token) -> None:
    try:
        get_future = getattr(work, "get_future", None)
        fut = get_future() if get_future is not None else (
            work if hasattr(work, "add_done_callback") else None)
        if fut is not None and dt is not None:
            fut.add_done_callback(lambda _f, dt=dt, token=token: dt.on_done(token))
    except Exception as e:
        log.warn_once("device-done", "cannot attach a device completion callback", e)


def _track_work(rec, row, work, tensors, token):
    """Register an async op's Work: completion through its future, else by polling."""
    cls = type(work)
    if cls not in _wait_checked:
        _patch_wait_of(cls)
    if token is not None:
        # Device-timed op (CUDA tensors): ProcessGroupNCCL completes the Work's future right
        # after enqueue, so the future says nothing about completion. The op stays in flight
        # until the device timer's poll() reports its end event (or is_completed() polled by
        # the writer thread, or wait()).
        p = rec.add_pending(row, key_obj=work, work=work, strong=True, has_future=False,
                            tensors=tensors, device_token=token)
        # Its completion on the device, for an op whose wait() never comes through Python
        # (DDP's Reducer waits on the future in C++): torch runs a CUDA future's callbacks on
        # streams made to wait for the op's events, and the timer records an event there.
        _device_done(rec.device_timer, work, token)
        rec.wake()
        return p
    key = (row[8], row[I_API])
    wait_mode = getattr(rec.config, "async_completion", "callback") == "wait"
    if not wait_mode and key not in _nofuture:
        get_future = getattr(work, "get_future", None)
        if get_future is None:
            # all_reduce_coalesced(async_op=True) returns the future itself.
            fut = work if hasattr(work, "add_done_callback") else None
        else:
            try:
                fut = get_future()
            except Exception:
                _nofuture.add(key)
                fut = None
        if fut is not None:
            # An op that ended before its callback is attached gets no notification of its
            # end: torch runs the callback of a future already complete at once, inside
            # add_done_callback, and its end is then only known to precede that moment
            # (column completion = "observed": t_end_ns is an upper bound, the op ended in
            # [t_enqueue_ns, t_end_ns]). No future.done() look first: it tells nothing more
            # (the C path does the same).
            p = rec.add_pending(row, key_obj=work, work=work, has_future=True,
                                tensors=tensors, device_token=token)
            attaching = [True]

            def _done(_f, p=p, rec=rec, attaching=attaching):
                # run at once by add_done_callback: the op ended while it was being attached
                rec.complete(p, rec.now_ns(), "observed" if attaching[0] else "callback")

            try:
                fut.add_done_callback(_done)
            except Exception as e:
                log.warn_once("future-cb", "cannot attach a completion callback", e)
            attaching[0] = False
            return p
    # No future (or --async-completion wait: no callback on the backend's thread): keep the
    # Work alive (the backend holds the op anyway) and poll it; one look now, so that an op
    # already complete at its return is not left to the next poll.
    try:
        done = work.is_completed()
    except Exception:
        done = False
    t_seen = rec.now_ns()
    p = rec.add_pending(row, key_obj=work, work=work, strong=True, has_future=False,
                        tensors=tensors, device_token=token)
    if done:
        rec.complete(p, t_seen, "observed")
    if not wait_mode:
        # (--async-completion wait: no wake-up per op; the writer polls within 50 ms, and
        # wait() completes the op)
        rec.wake()
    return p


def _finish(rec, reader, row, ret, t1, tensors, token, info):
    row[I_T_RET] = t1
    spec = reader.spec
    if spec.op == "recv" and row[I_PEER] is None and not row[I_ASYNC] and isinstance(ret, int) \
            and ret >= 0:
        # recv from any source returns the sender's rank.
        row[I_PEER] = ret
        s = rec.next_p2p_seq(info.name, ret, rec.rank)
        row[I_SEQ] = s
        row[I_FIRST] = s == 0
    if spec.object and tls.acc is not None:
        pass
    co = tls.coalesce
    if co is not None and ret is None:
        # Inside _coalescing_manager: the op runs when the manager exits.
        co.append((row, tensors, token))
        return
    if row[I_ASYNC]:
        if ret is None:
            rec.append_row(row)  # nothing to wait on: completion unknown
            return None
        return _track_work(rec, row, ret, tensors, token)
    row[I_T_END] = t1
    row[_R.I_COMPLETION] = "return"
    if token is not None and rec.device_timer is not None:
        rec.hold_device_row(row[I_OP_ID], row)
    else:
        rec.append_row(row)


def _record_error(rec, row, t1, e):
    try:
        row[I_T_RET] = t1
        row[I_ERROR] = f"{type(e).__name__}: {e}"
        rec.append_row(row)
    except Exception:
        pass


def _call(rec, reader: Reader, orig, args, kwargs):
    """The general path of one recorded call: prepare the row, then :func:`_run`."""
    t0 = rec.now_ns()
    try:
        prep = _prepare(rec, reader, args, kwargs, t0)
    except Exception as e:
        log.warn_once(("prepare", reader.api), f"cannot record {reader.api}", e)
        prep = None
    if prep is None:
        return orig(*args, **kwargs)
    row, tensors, info = prep
    return _run(rec, reader, orig, args, kwargs, row, tensors, info)


def _run(rec, reader: Reader, orig, args, kwargs, row, tensors, info):
    """Run the call of a prepared row with everything the fast path leaves out: device timer,
    NVTX, object collectives (sizes accumulated from inner calls), async completion."""
    spec = reader.spec
    token = None
    dt = rec.device_timer
    # (not inside _coalescing_manager: its ops are enqueued at the block's exit, so events
    # recorded around each call would bracket nothing; they keep their host times)
    if dt is not None and row[I_DEVICE] and row[I_DEVICE].startswith(_device.TIMED_DEVICE_PREFIX) \
            and tls.coalesce is None:
        try:
            token = dt.on_issue(row[I_OP_ID])
        except Exception as e:
            log.warn_once("dt-issue", "device timer failed", e)
    nv = nvtx_ranges.active
    if nv:
        nvtx_ranges.push(spec.op, row[I_BYTES], row[2], row[I_SEQ])
    if spec.object:
        prev_acc = tls.acc
        acc = tls.acc = [0, 0, 0, None, None]
    tls.depth += 1
    # In flight while the call runs: a rank stuck inside it lists it in _inflight.json.
    rec._blocking[row[I_OP_ID]] = row
    hooked = _CH.HOOKED and info.name in _CH.HOOKED
    if hooked:
        lo = _CH.seq_of(info.pg)
    tlo = _TS.read(info.pg) if info.tseq else None
    try:
        ret = orig(*args, **kwargs)
    except BaseException as e:
        t1 = rec.now_ns()
        if rec.end_blocking(row):
            _record_error(rec, row, t1, e)
        if tlo is not None:   # a call that raised may still have issued its number
            _TS.after(rec, info, tlo, row[I_OP_ID], row[I_SEQ])
        if token is not None:
            try:
                dt.abandon(token)
            except Exception:
                pass
        raise
    finally:
        tls.depth -= 1
        if spec.object:
            tls.acc = prev_acc
        if nv:
            nvtx_ranges.pop()
    t1 = rec.now_ns()
    if hooked:
        try:
            _CH.claim(info.name, lo, _CH.seq_of(info.pg), spec.op, row)
        except Exception:
            pass
    if tlo is not None:
        _TS.after(rec, info, tlo, row[I_OP_ID], row[I_SEQ])
    if not rec.end_blocking(row):
        return ret  # the final flush already wrote it as never completed
    try:
        if spec.object:
            row[I_COUNT], row[I_BYTES], row[I_OUT_BYTES] = acc[0], acc[1], acc[2]
            row[I_DTYPE], row[I_DEVICE] = acc[3], acc[4]
        if token is not None:
            dt.on_return(token, not row[I_ASYNC])
        p = _finish(rec, reader, row, ret, t1, tensors if rec.config.hazards != "off" else (),
                    token, info)
        if nv and p is not None:
            # Second range for an async op: from the return until wait() (or until written).
            p.nvtx_range = nvtx_ranges.start(spec.op, row[I_BYTES], row[2], row[I_SEQ])
    except Exception as e:
        log.warn_once(("finish", reader.api), f"cannot record {reader.api}", e)
    return ret


def _accumulate(reader: Reader, args, kwargs):
    """Inside an object collective: add an inner tensor call's sizes to the outer row."""
    try:
        acc = tls.acc
        spec = reader.spec
        in_name, in_kind = split_param(spec.ins)
        out_name, out_kind = split_param(spec.outs)
        ins = tensors_of(reader.arg(args, kwargs, in_name), in_kind) if in_name else []
        outs = tensors_of(reader.arg(args, kwargs, out_name), out_kind) if out_name else []
        n, b = _nbytes(ins)
        acc[0] += n
        acc[1] += b
        acc[2] += _nbytes(outs)[1]
        t = ins[0] if ins else (outs[0] if outs else None)
        if t is not None and acc[3] is None:
            acc[3] = dtype_name(t.dtype)
            acc[4] = str(t.device)
    except Exception:
        pass


_NOPOS = 1 << 30
_code_internal = _sites._code_internal


_site_pairs = _sites._site_pairs


def _site(f):
    """Raw (file, line) of the first user frame from `f`. The caller is usually user code
    seen before: two dict lookups and no allocation that outlives the call."""
    code = f.f_code
    k = id(code)
    if _code_internal.get(k) is False:
        s = _site_pairs.get((k, f.f_lasti))
        if s is not None:
            return s
    return site_of_frame(f)


def _verify_params_sizes(reader: Reader):
    """``_verify_params_across_processes(process_group, params, logger)``: its all_gather moves
    one int64 per rank (the parameter count), on the parameters' device."""
    def sizes(args, kwargs, n):
        params = reader.arg(args, kwargs, "params")
        pg = reader.arg(args, kwargs, "process_group")
        torch = sys.modules["torch"]
        x = torch.empty(1, dtype=torch.int64, device=params[0].device)
        return 1, 8, 8 * pg.size(), x, ()
    return sizes


_SIZE_RULES = {"ddp_verify_params": _verify_params_sizes}


def _sizes_fn(reader: Reader):
    """A function ``(args, kwargs, n) -> (count, bytes, out_bytes, first_tensor, tensors)``
    compiled for one API: positions resolved once, a single-tensor fast path (no lists)."""
    spec = reader.spec
    if spec.sizes:
        return _SIZE_RULES[spec.sizes](reader)
    in_name, in_kind = split_param(spec.ins)
    out_name, out_kind = split_param(spec.outs)
    i_i, i_n, i_d = reader.slot(in_name)
    o_i, o_n, o_d = reader.slot(out_name)
    if in_name and in_kind == "" and (out_name is None or (out_name == in_name and out_kind == "")):
        inplace = out_name is not None

        def sizes(args, kwargs, n):
            x = args[i_i] if i_i < n else kwargs.get(i_n, i_d)
            if x is None:
                return None, None, None, None, ()
            b = x.nbytes
            return x.numel(), b, (b if inplace else 0), x, (x,)
        return sizes
    if in_name and in_kind == "" and out_name and out_kind == "":
        def sizes(args, kwargs, n):
            x = args[i_i] if i_i < n else kwargs.get(i_n, i_d)
            y = args[o_i] if o_i < n else kwargs.get(o_n, o_d)
            if x is None or y is None:
                ins = [x] if x is not None else []
                outs = [y] if y is not None else []
                return _generic_sizes(ins, outs)
            return x.numel(), x.nbytes, y.nbytes, x, (x, y)
        return sizes

    def sizes(args, kwargs, n):
        ins = tensors_of(args[i_i] if i_i < n else kwargs.get(i_n, i_d), in_kind) \
            if in_name else []
        outs = tensors_of(args[o_i] if o_i < n else kwargs.get(o_n, o_d), out_kind) \
            if out_name else []
        return _generic_sizes(ins, outs)
    return sizes


def _generic_sizes(ins, outs):
    if not ins and not outs:
        return None, None, None, None, ()
    c, b = _nbytes(ins)
    ob = _nbytes(outs)[1] if outs else 0
    return c, b, ob, (ins[0] if ins else outs[0]), ins + outs


def make_wrapper(api: str, orig, spec):
    """The wrapper of one torch.distributed function (see module docstring).

    The common call (a blocking tensor collective or send/recv, no device timer, no NVTX tool,
    not an object collective) takes the fast path: argument positions are resolved once here,
    the call is described by a short tuple of atomic values (``recorder.F_*``: indices of this
    wrapper's and the group's fixed facts, seq, times, the raw call site, the tensor's count,
    dtype object and device) which the writer thread expands into a full row
    (:func:`recorder.expand`). Everything else goes through :func:`_run` with the full row."""
    reader = Reader.build(api, orig, spec)
    g_i, g_n, g_d = reader.slot(spec.group)
    a_i, a_n, a_d = reader.slot(spec.async_param)
    has_async = bool(spec.async_param)
    always_async = spec.always_async
    sizes = _sizes_fn(reader)
    in_name, in_kind = split_param(spec.ins)
    out_name, out_kind = split_param(spec.outs)
    # One tensor in (and the same tensor out, or none): counted inline, no sizes() call.
    single = bool(in_name) and in_kind == "" and (
        out_name is None or (out_name == in_name and out_kind == ""))
    inplace = single and out_name is not None
    x_i, x_n, x_d = reader.slot(in_name)
    op = spec.op
    is_object = spec.object
    peer = spec.peer
    root = spec.root
    is_send = op == "send"
    is_recv = op == "recv"
    barrier = op == "barrier"
    warn = log.warn_once
    fact = _R.register_fact(_R.FAST_SPECS, (op, api, inplace))
    # One tensor argument in (and out): one collective, one torch seq (torchseq.py; the C
    # path, which takes only these calls, assumes the same)
    tone = not peer and (single or (bool(in_name) and in_kind == "" and bool(out_name)
                                     and out_kind == ""))
    expand = _R.expand
    dev_names = _dev_names
    F_DEVICE = _R.F_DEVICE

    def wrapper(*args, **kwargs):
        rec = _R._recorder
        if rec is None:
            return orig(*args, **kwargs)
        st = tls.__dict__  # this thread's state: one thread-local read, then dict lookups
        if st["depth"] or (_cdepth is not None and _cdepth()):
            if st["acc"] is not None:
                _accumulate(reader, args, kwargs)
            return orig(*args, **kwargs)
        now = rec.now_ns
        t0 = now()
        pre = None
        try:
            n = len(args)
            group = args[g_i] if g_i < n else kwargs.get(g_n, g_d)
            info = _pg_cache.get(group if group is not None else _world._default_pg)
            if info is None:
                info = pg_info(group)
            if info is not None and info.member:
                if always_async:
                    async_op = True
                elif has_async:
                    async_op = bool(args[a_i] if a_i < n else kwargs.get(a_n, a_d))
                else:
                    async_op = False
                tensors = ()
                c = dt = dev = b = ob = None
                if is_object:
                    pass
                elif single:
                    x = args[x_i] if x_i < n else kwargs.get(x_n, x_d)
                    if x is not None:
                        c = x.numel()
                        dt = x.dtype
                        d = x.get_device()
                        dev = dev_names.get(d) or device_name(x)
                        tensors = (x,)
                    elif barrier:
                        c = b = ob = 0
                else:
                    c, b, ob, x, tensors = sizes(args, kwargs, n)
                    if x is not None:
                        dt = x.dtype
                        dev = dev_names.get(x.get_device()) or device_name(x)
                    elif barrier:
                        c = b = ob = 0
                me = rec.rank
                p = r = None
                if peer:
                    p = _global(info, reader.arg(args, kwargs, peer[0]),
                                reader.arg(args, kwargs, peer[1]))
                    if p is not None:
                        s = rec.next_p2p_seq(info.name, me, p) if is_send \
                            else rec.next_p2p_seq(info.name, p, me)
                    else:
                        s = None
                else:
                    if root:
                        r = _global(info, reader.arg(args, kwargs, root[0]),
                                    reader.arg(args, kwargs, root[1]))
                    s = rec.next_seq(info.name)
                pre = (fact, info.fidx, s, p, r, t0, rec.step,
                       _site(_getframe(1)) if rec.stack else None,
                       next(rec._op_ids), _get_ident(), st["api"], st["detail"],
                       c, dt, dev, b, ob, async_op)
        except Exception as e:
            warn(("prepare", api), f"cannot record {api}", e)
            pre = None
        if pre is None:
            return orig(*args, **kwargs)
        if is_object or async_op or nvtx_ranges.active or st["coalesce"] is not None \
                or info.idx is None or (rec.device_timer is not None and dev is not None
                    and dev.startswith(_device.TIMED_DEVICE_PREFIX)) or (is_recv and p is None):
            try:
                row = expand(me, pre, None)
            except Exception as e:
                warn(("prepare", api), f"cannot record {api}", e)
                return orig(*args, **kwargs)
            return _run(rec, reader, orig, args, kwargs, row, tensors, info)
        # Fast path: a blocking call, completed when it returns.
        blocking = rec._blocking
        op_id = pre[8]
        blocking[op_id] = pre   # in flight while the call runs (_inflight.json)
        # torch's number: read after the call; before it too unless the call is one plain
        # collective (send/recv: NCCL does not number them; lists: DDP's helpers issue several)
        tseq = info.tseq
        one = tone or (peer and info.p2p_one)
        tlo = _TS.read(info.pg) if tseq and not one else None
        st["depth"] = 1         # it was 0: inner wrapped calls are not rows of their own
        try:
            ret = orig(*args, **kwargs)
        except BaseException as e:
            t1 = now()
            if blocking.pop(op_id, None) is not None:
                _record_error(rec, expand(rec.rank, pre, None), t1, e)
            if tseq:   # a call that raised may still have issued its number
                _TS.after(rec, info, tlo, op_id, s, one=one)
            raise
        finally:
            st["depth"] = 0
        t1 = now()
        if blocking.pop(op_id, None) is not None:
            q = rec._ready
            if len(q) < rec.cap:
                # A tuple of atomic values (the cyclic GC stops tracking it), expanded by the
                # writer thread.
                q.append((pre, t1))
            else:
                rec._dropped += 1
        if tseq:
            _TS.after(rec, info, tlo, op_id, s, one=one)
        return ret

    inout = bool(in_name) and in_kind == "" and bool(out_name) and out_kind == "" \
        and out_name != in_name
    if _cfast is not None and not is_object and (single or inout) \
            and (not always_async or hasattr(_cfast, "set_async")):
        try:
            r0, r1 = (peer or root or ("", ""))
            ctx_args = (
                wrapper, _on_error, _R, tls, _pg_cache, _world, nvtx_ranges,
                _R._time_ns, _sites._code_internal, _sites._site_pairs, site_of_frame,
                _dev_names, fact,
                {"group": (g_i, g_n, g_d), "x": (x_i, x_n, x_d),
                 "y": reader.slot(out_name) if inout else (1 << 30, None, None),
                 "async": (a_i, a_n, a_d), "r0": reader.slot(r0), "r1": reader.slot(r1)},
                {"has_y": inout, "has_root": bool(root), "has_peer": bool(peer),
                 "is_send": is_send, "always_async": always_async})
            ctx = _cfast.make_ctx(orig, *ctx_args)
            _CTX_ARGS[api] = ctx_args
        except Exception as e:
            log.warn_once("cfast", "C fast path unavailable; using the Python one", e)
        else:
            # The C object is the wrapper itself (called like torch's function, no argument
            # packing); the Python wrapper runs whatever the C path hands over.
            ctx.__commtrace_python__ = wrapper
            wrapper = ctx
    try:
        functools.update_wrapper(wrapper, orig)
    except Exception:
        wrapper.__name__ = api
    setattr(wrapper, ORIGINAL_ATTR, orig)
    wrapper.__commtrace_reader__ = reader
    return wrapper


#: api -> the arguments of its FastCtx after torch's function (for :func:`fast_twin`)
_CTX_ARGS: dict = {}


def fast_twin(api: str, orig):
    """A C fast-path context recording calls exactly as the wrapper of `api` does, whose
    call of torch's function is a call of `orig` instead (same arguments); None without the C
    path. ddp.py's C comm hook issues its all_reduce through one (no torch Python frame)."""
    args = _CTX_ARGS.get(api)
    if _cfast is None or args is None:
        return None
    return _cfast.make_ctx(orig, *args)


def _on_error(rec, pre, t1, exc) -> None:
    """The C fast path's call raised: record the row with its error (never raises)."""
    try:
        _record_error(rec, _R.expand(rec.rank, pre, None), t1, exc)
    except Exception:
        pass


# --------------------------------------------------------------------------------------------
# Work.wait
# --------------------------------------------------------------------------------------------


def _make_wait(orig_wait):
    def wait(self, *args, **kwargs):
        rec = _R._recorder
        if rec is None or not rec._by_key:
            return orig_wait(self, *args, **kwargs)
        p = rec.lookup(self)
        if p is None:
            return orig_wait(self, *args, **kwargs)
        group = [p] + list(getattr(p, "siblings", None) or ())
        dt = rec.device_timer
        if dt is not None and p.device_token is not None:
            try:
                dt.on_wait_begin(p.device_token)
            except Exception:
                pass
        t0 = rec.now_ns()
        try:
            r = orig_wait(self, *args, **kwargs)
        except BaseException as e:
            t1 = rec.now_ns()
            if p.nvtx_range is not None:
                nvtx_ranges.end(p.nvtx_range)
                p.nvtx_range = None
            for q in group:
                if q.row[I_ERROR] is None:
                    q.row[I_ERROR] = f"{type(e).__name__}: {e}"
                q.row[I_T_WAIT] = q.row[I_T_WAIT] or t0
                q.row[I_T_WAIT_END] = t1
                q.waited = True
            raise
        t1 = rec.now_ns()
        try:
            if _stamp_flush is not None:
                _stamp_flush()   # a callback time queued in C++ comes before the wait's
            if p.nvtx_range is not None:
                nvtx_ranges.end(p.nvtx_range)
                p.nvtx_range = None
            if dt is not None and p.device_token is not None:
                dt.on_wait(p.device_token)
            wake = False
            for q in group:
                if q.row[I_T_WAIT] is None:
                    q.row[I_T_WAIT] = t0
                q.row[I_T_WAIT_END] = t1
                if r is not False:
                    rec.complete(q, t1, "wait")
                q.waited = True
                if q.row[I_T_END] is not None:
                    # Completed and waited: its row is final (a future callback still to run
                    # can only move t_end earlier, on the same row object, before the write).
                    # Queued here: waking the writer thread per op cost more than the op.
                    rec._release(q)
                else:
                    wake = True
            if wake:
                rec.wake()
        except Exception as e:
            log.warn_once("wait", "cannot record wait()", e)
        return r

    setattr(wait, ORIGINAL_ATTR, orig_wait)
    try:
        functools.update_wrapper(wait, orig_wait)
    except Exception:
        pass
    if _cfast is not None:
        # torch's blocking collectives call work.wait() themselves: with no async op in
        # flight, the C object calls the original at once (no Python frame).
        try:
            w = _cfast.make_wait(orig_wait, wait, _R)
            functools.update_wrapper(w, orig_wait)
            setattr(w, ORIGINAL_ATTR, orig_wait)
            w.__commtrace_python__ = wait
            return w
        except Exception as e:
            log.warn_once("cfast-wait", "C Work.wait unavailable; using the Python one", e)
    return wait


def instancemethod(fn):
    """`fn` as an ``instancemethod``, the object pybind11 puts on a class for a C++ method
    (torch's own ``Work.wait`` is one). Once Dynamo is imported, compile.py installs the
    ``Work.wait`` wrapper this way, so that torch.compile treats it exactly as torch's instead of
    tracing commtrace's code. Not before: a call through it creates a bound method each time
    (about 0.1 us more per blocking op than the C wrapper's own method-descriptor call)."""
    try:
        from . import _fastpath

        return _fastpath.instancemethod(fn)
    except (ImportError, AttributeError):
        pass
    try:
        import ctypes

        new = ctypes.pythonapi.PyInstanceMethod_New
        new.argtypes, new.restype = [ctypes.py_object], ctypes.py_object
        return new(fn)
    except Exception as e:
        log.warn_once("instancemethod", "Work.wait installed as a plain function", e)
        return fn


# --------------------------------------------------------------------------------------------
# destroy_process_group, batch_isend_irecv and _coalescing_manager
# --------------------------------------------------------------------------------------------


def _make_destroy(orig):
    """destroy_process_group, then commtrace forgets every group it cached (``_pg_cache``, the C
    fast path's last group per wrapper): holding them would keep a destroyed group, its gloo
    threads and sockets alive until the interpreter's finalisation, where a gloo thread that
    then needs the GIL ends the process with "terminate called without an active exception".
    No row: it is not an op. Groups still alive are looked up again at their next op."""
    def destroy_process_group(*args, **kwargs):
        rec = _R._recorder
        checked = []
        if rec is not None:
            try:   # what the group(s) issued after their last recorded op (torchseq.py)
                g = args[0] if args else kwargs.get("group")
                every = g is None or g is _c10d._world.default_pg   # torch destroys them all
                checked = _TS.check_end(rec, None if every else [pg_info(g)], "destroy")
            except Exception:
                checked = []
        try:
            return orig(*args, **kwargs)
        finally:
            for info in checked or ():   # torch numbers a group created again from 0
                try:
                    rec._tseqs.set(info.seq_slot, 0)
                except Exception:
                    pass
            try:
                reset_caches()
            except Exception as e:  # never raise into user code
                log.warn_once("destroy-pg", "could not drop cached process groups", e)

    functools.update_wrapper(destroy_process_group, orig)
    setattr(destroy_process_group, ORIGINAL_ATTR, orig)
    return destroy_process_group


def _make_batch(orig):
    def batch_isend_irecv(p2p_op_list):
        p2p_op_list = _repoint_p2p_ops(p2p_op_list)
        rec = _R._recorder
        if rec is None or tls.depth or (_cdepth is not None and _cdepth()):
            return orig(p2p_op_list)
        prev = tls.api
        tls.api = "batch_isend_irecv"
        try:
            return orig(p2p_op_list)
        finally:
            tls.api = prev

    functools.update_wrapper(batch_isend_irecv, orig)
    setattr(batch_isend_irecv, ORIGINAL_ATTR, orig)
    return batch_isend_irecv


def _repoint_p2p_ops(ops):
    """P2POps built before tracing hold the original isend/irecv; batch_isend_irecv tells sends
    from receives by identity with the (now wrapped) module functions, so hand it copies that
    point at the wrappers. The caller's objects are left untouched."""
    w_isend = _WRAPPERS.get("isend")
    w_irecv = _WRAPPERS.get("irecv")
    if w_isend is None:
        return ops
    o_isend, o_irecv = original_of(w_isend), original_of(w_irecv)
    try:
        if not any(getattr(o, "op", None) is o_isend or getattr(o, "op", None) is o_irecv
                   for o in ops):
            return ops
        out = []
        for o in ops:
            if o.op is o_isend or o.op is o_irecv:
                n = object.__new__(type(o))
                n.__dict__.update(o.__dict__)
                n.op = w_isend if o.op is o_isend else w_irecv
                o = n
            out.append(o)
        return out
    except Exception:
        return ops


def _make_coalescing(orig):
    @contextlib.contextmanager
    def _coalescing_manager(group=None, device=None, async_ops=False):
        rec = _R._recorder
        if rec is None or tls.depth or (_cdepth is not None and _cdepth()):
            with orig(group, device, async_ops) as cm:
                yield cm
            return
        prev = tls.coalesce
        issued = tls.coalesce = []
        ok = False
        hinfo = None
        if _CH.HOOKED:
            try:
                hinfo = pg_info(group)
                if hinfo is not None and hinfo.name in _CH.HOOKED:
                    lo = _CH.seq_of(hinfo.pg)
                else:
                    hinfo = None
            except Exception:
                hinfo = None
        try:
            tinfo = pg_info(group)
            tlo = _TS.before(tinfo)
        except Exception:
            tinfo = tlo = None
        try:
            with orig(group, device, async_ops) as cm:
                try:
                    yield cm
                finally:
                    tls.coalesce = prev
            ok = True
        finally:
            tls.coalesce = prev
            if tlo is not None:   # the block's own numbers (the coalesced Work)
                _TS.after(rec, tinfo, tlo, None, None)
            if hinfo is not None:   # the coalesced Work's own seq(s)
                try:
                    _CH.claim(hinfo.name, lo, _CH.seq_of(hinfo.pg), "coalesced")
                except Exception:
                    pass
            try:
                _close_coalesced(rec, issued, cm if ok else None, async_ops)
            except Exception as e:
                log.warn_once("coalesce", "cannot record coalesced ops", e)

    setattr(_coalescing_manager, ORIGINAL_ATTR, orig)
    return _coalescing_manager


def _close_coalesced(rec, issued, cm, async_ops):
    if not issued:
        return
    t = rec.now_ns()
    detail = json.dumps({"coalesced": len(issued)})
    works = [w for w in (getattr(cm, "works", None) or []) if w is not None] if cm else []
    for row, tensors, token in issued:
        row[I_DETAIL] = row[I_DETAIL] or detail
        row[I_ASYNC] = bool(async_ops)
    if async_ops and works:
        row, tensors, token = issued[0]
        first = _track_work(rec, row, works[-1], tensors, token)
        first.siblings = []
        for row, tensors, token in issued[1:]:
            q = rec.add_pending(row, work=works[-1], has_future=first.has_future,
                                strong=not first.has_future, tensors=tensors)
            first.siblings.append(q)
            if first.has_future:
                try:
                    works[-1].get_future().add_done_callback(
                        lambda _f, q=q: rec.complete(q, rec.now_ns(), "callback"))
                except Exception:
                    pass
        return
    for row, tensors, token in issued:
        if cm is not None:
            row[I_T_END] = t
            row[_R.I_COMPLETION] = "return"
        rec.append_row(row)


# --------------------------------------------------------------------------------------------
# install / uninstall
# --------------------------------------------------------------------------------------------


def install() -> bool:
    """Wrap the torch.distributed functions of API_TABLE (plus batch_isend_irecv,
    _coalescing_manager and Work.wait). Safe to call while torch is half-imported (it touches
    only ``distributed_c10d`` and ``torch.distributed``) and idempotent."""
    global _c10d, _dist, _installed, _world
    import sys

    with _install_lock:
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        if c10d is None:
            import torch.distributed.distributed_c10d as c10d  # noqa: F811
        _c10d = c10d
        _world = c10d._world
        if not hasattr(_world, "_default_pg"):  # pragma: no cover - older/newer torch
            _world = _WorldShim(c10d)
        _dist = sys.modules.get("torch.distributed")
        if _cfast is not None:
            _set_tensor_api()
            _set_async()
        targets = [c10d] + ([_dist] if _dist is not None else [])
        for name, spec in API_TABLE.items():
            w = _WRAPPERS.get(name)
            if w is None:
                orig = None
                for mod in targets:
                    f = getattr(mod, name, None)
                    if f is not None:
                        orig = original_of(f)
                        break
                if orig is None:
                    continue
                w = make_wrapper(name, orig, spec)
                _WRAPPERS[name] = w
            orig = original_of(w)
            for mod in targets:
                if hasattr(mod, name) or mod is c10d:
                    cur = getattr(mod, name, None)
                    if cur is w:
                        continue
                    if cur is not None and original_of(cur) is not orig:
                        # Someone else (the user, another tool) replaced it since we
                        # installed: keep theirs. It usually calls ours, which it captured.
                        continue
                    restore(mod, name)
                    patch(mod, name, w)
        for name, maker in (("batch_isend_irecv", _make_batch),
                            ("_coalescing_manager", _make_coalescing),
                            ("destroy_process_group", _make_destroy)):
            w = _WRAPPERS.get(name)
            if w is None:
                f = getattr(c10d, name, None)
                if f is None:
                    continue
                w = _WRAPPERS[name] = maker(original_of(f))
            for mod in targets:
                if hasattr(mod, name) and getattr(mod, name) is not w:
                    restore(mod, name)
                    patch(mod, name, w)
        try:
            Work = c10d.Work
            if not hasattr(Work.wait, ORIGINAL_ATTR):
                patch(Work, "wait", _make_wait(Work.wait))
        except Exception as e:
            log.warn_once("work-wait", "cannot patch Work.wait; t_wait_ns will be null", e)
        _installed = True
        from . import compile as _compile

        _compile.install()
        _compile.refresh_remaps()
        return True


def _set_tensor_api() -> None:
    """Give the C fast path torch's tensor accessors (looked up once, not per call)."""
    try:
        torch = sys.modules.get("torch")
        base = getattr(getattr(torch, "_C", None), "TensorBase", None)
        if base is None:
            return   # torch still half-imported: the next install() call does it
        d = base.__dict__
        types = tuple(t for t in (getattr(torch, "Tensor", None),
                                  getattr(getattr(torch, "nn", None), "Parameter", None))
                      if isinstance(t, type)
                      and not any(n in t.__dict__ for n in ("numel", "get_device", "dtype")))
        _cfast.set_tensor_api(d["numel"], d["get_device"], d["dtype"], types)
    except Exception as e:
        log.warn_once("cfast-tensor", "C fast path: tensor accessors unavailable", e)
        return
    _set_meta_api()


_meta_set = False
#: _fastpath.flush_stamps once the C++ reads are set (async completions stamped in C++)
_stamp_flush = None


def _set_meta_api() -> None:
    """Let the C fast path read tensors and groups through torch's C++ API where the module of
    ``commtrace accel build`` is built for this torch (accel.meta_api); once per process."""
    global _meta_set
    if _meta_set or not hasattr(_cfast, "set_meta_api"):
        return
    try:
        from . import accel

        cap = accel.meta_api()
        if cap is None:
            return
        _cfast.set_meta_api(cap)
        _meta_set = True
        # async completions stamped in C++ (capsule version 2): the writer thread's service
        # writes the queued stamps into their rows before it looks at them
        global _stamp_flush
        fl = getattr(_cfast, "flush_stamps", None)
        if fl is not None and fl not in _R.STAMP_FLUSHERS:
            _R.STAMP_FLUSHERS.append(fl)
        _stamp_flush = fl
    except Exception as e:
        _meta_set = True
        log.warn_once("cfast-meta", "C fast path: torch's C++ reads unavailable", e)


def _set_async() -> None:
    """Let the C fast path record async calls too (issue 20: no Python frame per op), unless
    COMMTRACE_ASYNC_C=0 (and release a C++ DDP hook's op at its stamp, unless
    COMMTRACE_STAMP_RELEASE=0: ``_fastpath.stamp_release``). Its semantics are _run / _finish /
    _track_work / the wait() wrapper's (it hands anything unusual to them)."""
    import os

    if not hasattr(_cfast, "set_async"):
        return
    if os.environ.get("COMMTRACE_ASYNC_C", "1") in ("0", ""):
        _cfast.async_off()
        return
    try:
        _cfast.set_async(_R.PendingOp, _track_work, _record_error, S.KIND_OP, _R,
                         tuple(S.COLUMNS))
    except Exception as e:
        _cfast.async_off()
        log.warn_once("cfast-async", "C async path unavailable; using the Python one", e)
        return
    if hasattr(_cfast, "stamp_release"):
        # a DDP bucket's op released at its stamp (session 17); COMMTRACE_STAMP_RELEASE=0:
        # by the writer's service, as before (benchmarks compare the two)
        _cfast.stamp_release(os.environ.get("COMMTRACE_STAMP_RELEASE", "1") not in ("0", ""))


def install_late() -> None:
    """Re-run :func:`install` once ``torch.distributed`` has finished importing (its
    ``from .distributed_c10d import *`` may have copied names before we patched)."""
    install()


def uninstall() -> None:
    """Restore every original. P2POps built while wrapped keep working: batch_isend_irecv's
    original resolves them by identity with the restored functions only, so this is meant for
    tests; :func:`commtrace.disable` leaves the (pass-through) wrappers in place."""
    global _installed
    with _install_lock:
        for mod in (_c10d, _dist):
            if mod is None:
                continue
            for name in list(_WRAPPERS):
                restore(mod, name)
        try:
            restore(_c10d.Work, "wait")
        except Exception:
            pass
        for cls in _wait_patched:
            try:
                restore(cls, "wait")
            except Exception:
                pass
        _wait_patched.clear()
        _wait_checked.clear()
        _WRAPPERS.clear()
        reset_caches()
        _installed = False


def installed() -> bool:
    return _installed


def wrapped_names() -> set[str]:
    """Names of torch.distributed functions currently wrapped."""
    return {n for n, w in _WRAPPERS.items() if _dist is not None and getattr(_dist, n, None) is w}


def reset_caches() -> None:
    """Forget every process group commtrace looked up (``_pg_cache``, the C fast path's last
    group per wrapper, the functional collectives' group names): destroy_process_group and the
    recorder's close (atexit) call it, so that commtrace never holds a group to the
    interpreter's finalisation."""
    _pg_cache.clear()
    if _cfast is not None:
        _cfast.invalidate()
    fc = sys.modules.get(__package__ + ".funcol")
    if fc is not None:
        fc._name_cache.clear()
