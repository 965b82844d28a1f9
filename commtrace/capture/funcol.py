"""Functional collectives (``torch.distributed._functional_collectives``).

They return an ``AsyncCollectiveTensor`` and run through ``torch.ops._c10d_functional``, not
through the ``torch.distributed`` functions, so they get wrappers of their own with
``api="funcol.<name>"``. Their completion is the wait on the async tensor: ``wait_tensor``
(which ``AsyncCollectiveTensor.trigger_wait`` and ``.wait()`` look up at call time) is
wrapped, and ``t_wait_ns`` / ``t_wait_end_ns`` / ``t_end_ns`` come from it. A result that is
never waited keeps ``t_end_ns`` null.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

from ..format import schema as S
from . import device as _device
from . import log
from . import recorder as _R
from .recorder import (I_API, I_BYTES, I_COUNT, I_DEVICE, I_DTYPE, I_FIRST, I_OUT_BYTES, I_PEER,
                       I_OP_ID, I_ROOT, I_SEQ, I_T_END, I_T_RET, I_T_WAIT, I_T_WAIT_END)
from .registry import ORIGINAL_ATTR, original_of, patch, restore
from . import wrappers as W

MOD = "torch.distributed._functional_collectives"

@dataclass(frozen=True)
class FuncolSpec:
    """How to read one functional collective."""

    op: str                    # canonical op (commtrace.ops)
    out: str = "same"          # out_bytes: "same" (= input bytes), "x_n" (x group size),
    #                            "div_n" (/ group size)
    ins: str = "self"          # parameter holding the input tensor (or list of tensors)
    root: str | None = None    # root parameter (global rank)
    peer: tuple = ()           # (global-rank param, group-rank param) of isend/irecv_inplace
    group: str = "group"
    group_tag: bool = True     # "tag" names the group (isend/irecv_inplace: a message tag)


_AG = FuncolSpec("all_gather", "x_n")
_RS = FuncolSpec("reduce_scatter", "div_n")
_RSL = FuncolSpec("reduce_scatter", "div_n", ins="inputs")

#: Every public function of ``torch.distributed._functional_collectives`` that issues a
#: collective: wrapped (``api="funcol.<name>"``). The others are in FUNCOL_SKIPPED with the
#: reason; tests/test_capture_coverage.py enumerates the module and fails on anything else.
FUNCOL_TABLE: dict[str, FuncolSpec] = {
    "all_reduce": FuncolSpec("all_reduce"),
    "all_reduce_coalesced": FuncolSpec("all_reduce"),
    "all_gather_single": _AG,
    "all_gather_single_autograd": _AG,
    "all_gather_single_coalesced": _AG,
    "all_gather_tensor": _AG,
    "all_gather_tensor_autograd": _AG,
    "all_gather_into_tensor_coalesced": _AG,
    "reduce_scatter_single": _RS,
    "reduce_scatter_single_autograd": _RS,
    "reduce_scatter_single_coalesced": _RSL,
    "reduce_scatter_tensor": _RS,
    "reduce_scatter_tensor_autograd": _RS,
    "reduce_scatter_tensor_coalesced": _RSL,
    "all_to_all_single": FuncolSpec("all_to_all"),
    "all_to_all_single_autograd": FuncolSpec("all_to_all"),
    "broadcast": FuncolSpec("broadcast", root="src"),
    "permute_tensor": FuncolSpec("all_to_all"),
    # In-place forms (what torch.compile rewrites dist.* collectives into; callable eagerly).
    "all_reduce_inplace": FuncolSpec("all_reduce", ins="tensor"),
    "all_gather_tensor_inplace": FuncolSpec("all_gather", "x_n", ins="input_tensor"),
    "all_gather_inplace": FuncolSpec("all_gather", "x_n", ins="tensor"),
    "reduce_scatter_tensor_inplace": FuncolSpec("reduce_scatter", "div_n", ins="input"),
    "all_to_all_inplace": FuncolSpec("all_to_all", ins="input"),
    "isend_inplace": FuncolSpec("send", ins="tensor", peer=("dst", "group_dst"),
                                group_tag=False),
    "irecv_inplace": FuncolSpec("recv", ins="tensor", peer=("src", "group_src"),
                                group_tag=False),
}

#: Wrapped by dedicated code.
FUNCOL_SPECIAL = {
    "wait_tensor": "completion of the collective whose result it waits (t_wait_ns, t_end_ns)",
    "batch_p2p_ops_inplace": "one row per send/recv of the batch (api="
                             "'funcol.batch_p2p_ops_inplace')",
}

#: Public callables of the module that need no wrapper, with the reason.
FUNCOL_SKIPPED = {
    "allow_inflight_collective_as_graph_input_ctx": "context manager setting a flag; no "
                                                    "communication",
    "backend_impl": "leftover loop variable of the legacy op registration (an op kernel "
                    "reached through torch.ops, not a Python entry point)",
}
#: Name patterns with the reason: autograd formulas run inside the autograd engine, which
#: calls ``torch.ops._c10d_functional`` directly (not recorded, docs/faq.md); ``legacy_*`` are
#: the c10d functions under another name (wrapped in torch.distributed).
FUNCOL_SKIPPED_SUFFIXES = {
    "_backward": "autograd backward formula: its collective is a torch.ops._c10d_functional "
                 "call made by the autograd engine, not a Python entry point",
    "_setup_context": "autograd context setup; no communication",
}
FUNCOL_SKIPPED_PREFIXES = {
    "legacy_": "a torch.distributed function under another name (wrapped there)",
}


def funcol_reason(name: str) -> str | None:
    """Why funcol's public callable `name` is fine as it is (wrapped, or needs no wrapper);
    None: unaccounted for."""
    if name in FUNCOL_TABLE:
        return "wrapped"
    for d in (FUNCOL_SPECIAL, FUNCOL_SKIPPED):
        if name in d:
            return d[name]
    for suffix, why in FUNCOL_SKIPPED_SUFFIXES.items():
        if name.endswith(suffix):
            return why
    for prefix, why in FUNCOL_SKIPPED_PREFIXES.items():
        if name.startswith(prefix):
            return why
    return None


_mod = None
#: group (or its name) -> (group, its PgInfo). Holds the group: wrappers.reset_caches() empties
#: it at destroy_process_group (a group created again under the same name must not get the
#: destroyed one's PgInfo) and at the recorder's close.
_name_cache: dict = {}


def _group_info(group, tag):
    if group is None:
        return W.pg_info(None)   # the in-place forms default to the world group
    key = group if isinstance(group, str) else id(group)
    info = _name_cache.get(key)
    if info is not None and (isinstance(group, str) or info[0] is group):
        return info[1]
    name = _mod._resolve_group_name(group, tag)
    from torch.distributed import distributed_c10d as c10d

    pg = c10d._resolve_process_group(name)
    pinfo = W.pg_info(pg)
    _name_cache[key] = (group, pinfo)
    return pinfo


class _Args:
    """Parameter lookup of one function, positions resolved once from its signature."""

    def __init__(self, fn):
        import inspect

        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            params = []
        self.idx = {p.name: i for i, p in enumerate(params)}
        self.default = {p.name: p.default for p in params if p.default is not p.empty}

    def get(self, args, kwargs, name):
        i = self.idx.get(name)
        if i is not None and i < len(args):
            return args[i]
        return kwargs.get(name, self.default.get(name))


def _tracing() -> bool:
    """funcol's own test for "traced, not run" (Dynamo, fake tensors, make_fx / export): its
    calls then build a graph instead of communicating, and are not recorded."""
    try:
        return bool(_mod._are_we_tracing())
    except Exception:
        return False


def _make(api, orig, spec: FuncolSpec):
    """The wrapper of one functional collective: ``before`` builds the row, torch's function
    runs, ``after`` registers its completion. With the C extension the wrapper is a C object
    (``_fastpath.around``) calling torch's function itself, so that the deprecation warnings of
    the old names (``stacklevel=2``) point at the user's line; the Python fallback is one frame
    more."""
    a = _Args(orig)
    op, out_rule = spec.op, spec.out

    def before(*args, **kwargs):
        rec = _R._recorder
        if rec is None or W.tls.depth or (W._cdepth is not None and W._cdepth()) or _tracing():
            return None
        t0 = rec.now_ns()
        try:
            group = a.get(args, kwargs, spec.group)
            tag = a.get(args, kwargs, "tag") if spec.group_tag else ""
            info = _group_info(group, tag or "")
            if info is None or not info.member:
                return None
            row = W.new_row(rec, S.KIND_OP, info, op, "funcol." + api, True, t0)
            x = a.get(args, kwargs, spec.ins)
            ts = list(x) if isinstance(x, (list, tuple)) else [x]
            n, b = W._nbytes(ts)
            row[I_COUNT], row[I_BYTES] = n, b
            row[I_OUT_BYTES] = b * info.size if out_rule == "x_n" else (
                b // max(1, info.size) if out_rule == "div_n" else b)
            row[I_DTYPE] = W.dtype_name(ts[0].dtype)
            row[I_DEVICE] = str(ts[0].device)
            if spec.root:
                src = a.get(args, kwargs, spec.root)
                row[I_ROOT] = int(src) if src is not None else None
            if spec.peer:
                peer = a.get(args, kwargs, spec.peer[0])
                gpeer = a.get(args, kwargs, spec.peer[1])
                if gpeer is not None and gpeer != -1:
                    peer = info.ranks[int(gpeer)]
                peer = row[I_PEER] = int(peer)
                me = rec.rank
                s = rec.next_p2p_seq(info.name, me, peer) if op == "send" \
                    else rec.next_p2p_seq(info.name, peer, me)
            else:
                s = rec.next_seq(info.name)
            row[I_SEQ], row[I_FIRST] = s, s == 0
        except Exception as e:
            log.warn_once(("funcol", api), f"cannot record funcol.{api}", e)
            return None
        dtok = None
        dt = rec.device_timer
        if dt is not None and row[I_DEVICE].startswith(_device.TIMED_DEVICE_PREFIX):
            dtok = dt.on_issue(row[I_OP_ID])   # (never raises)
        W.tls.depth += 1   # the calls torch's function makes are not rows of their own
        hooked = W._CH.HOOKED and info.name in W._CH.HOOKED
        lo = W._CH.seq_of(info.pg) if hooked else None
        return rec, row, ts, info, hooked, lo, W._TS.before(info), dtok

    def after(tok, ret, exc):
        rec, row, ts, info, hooked, lo, tlo, dtok = tok
        W.tls.depth -= 1
        if exc is not None:
            if dtok is not None:
                rec.device_timer.abandon(dtok)
            W._record_error(rec, row, rec.now_ns(), exc)
            if tlo is not None:
                W._TS.after(rec, info, tlo, row[I_OP_ID], row[I_SEQ])
            return
        t1 = rec.now_ns()
        if hooked:
            try:
                W._CH.claim(info.name, lo, W._CH.seq_of(info.pg), op, row)
            except Exception:
                pass
        if tlo is not None:
            W._TS.after(rec, info, tlo, row[I_OP_ID], row[I_SEQ])
        try:
            row[I_T_RET] = t1
            elems = []
            for r in (ret if isinstance(ret, (list, tuple)) else [ret]):
                e = getattr(r, "elem", None)
                if e is not None and not getattr(r, "completed", False):
                    elems.append(e)
            dt = rec.device_timer if dtok is not None else None
            if dt is not None:
                # (results already waited: the end is recorded now, as for a blocking op)
                dt.on_return(dtok, not elems)
            if not elems:
                row[I_T_END] = t1   # traced / already waited: complete at return
                row[_R.I_COMPLETION] = "return"
                if dt is not None:
                    rec.hold_device_row(row[I_OP_ID], row)
                else:
                    rec.append_row(row)
            else:
                # Keyed by the results' storage: any of them, or any view of them, completes
                # it; on CUDA its end is recorded by wait_tensor (device_token)
                rec.add_pending_tensors(row, elems, tensors=tuple(ts) + tuple(elems),
                                        device_token=dtok)
        except Exception as e:
            log.warn_once(("funcol-finish", api), f"cannot record funcol.{api}", e)

    wrapper = _around(orig, before, after)
    try:
        functools.update_wrapper(wrapper, orig)
    except Exception:
        pass
    setattr(wrapper, ORIGINAL_ATTR, orig)
    return wrapper


def _around(orig, before, after):
    try:
        from . import _fastpath

        return _fastpath.around(orig, before, after)
    except (ImportError, AttributeError):
        pass

    def wrapper(*args, **kwargs):
        tok = before(*args, **kwargs)
        if tok is None:
            return orig(*args, **kwargs)
        try:
            ret = orig(*args, **kwargs)
        except BaseException as e:
            after(tok, None, e)
            raise
        after(tok, ret, None)
        return ret

    return wrapper


def _make_batch(orig):
    """``batch_p2p_ops_inplace(op_list, peer_list, tag_list, tensors, group_name)``: one row per
    send / recv, each completed by the wait on its own result."""
    a = _Args(orig)

    def batch_p2p_ops_inplace(*args, **kwargs):
        rec = _R._recorder
        if rec is None or W.tls.depth or (W._cdepth is not None and W._cdepth()) or _tracing():
            return orig(*args, **kwargs)
        t0 = rec.now_ns()
        rows = []
        try:
            info = _group_info(a.get(args, kwargs, "group_name") or None, "")
            if info is not None and info.member:
                me = rec.rank
                for kind, peer, t in zip(a.get(args, kwargs, "op_list"),
                                         a.get(args, kwargs, "peer_list"),
                                         a.get(args, kwargs, "tensors")):
                    op = "send" if kind == "isend" else "recv"
                    row = W.new_row(rec, S.KIND_OP, info, op, "funcol.batch_p2p_ops_inplace",
                                    True, t0)
                    row[I_COUNT], row[I_BYTES] = W._nbytes([t])
                    row[I_OUT_BYTES] = row[I_BYTES] if op == "recv" else 0
                    row[I_DTYPE] = W.dtype_name(t.dtype)
                    row[I_DEVICE] = str(t.device)
                    peer = row[I_PEER] = int(peer)
                    s = rec.next_p2p_seq(info.name, me, peer) if op == "send" \
                        else rec.next_p2p_seq(info.name, peer, me)
                    row[I_SEQ], row[I_FIRST] = s, s == 0
                    rows.append((row, t))
        except Exception as e:
            log.warn_once(("funcol", "batch"), "cannot record funcol.batch_p2p_ops_inplace", e)
            rows = []
        if not rows:
            return orig(*args, **kwargs)
        W.tls.depth += 1
        try:
            ret = orig(*args, **kwargs)
        except BaseException as e:
            t1 = rec.now_ns()
            for row, _t in rows:
                W._record_error(rec, row, t1, e)
            raise
        finally:
            W.tls.depth -= 1
        t1 = rec.now_ns()
        try:
            for (row, t), r in zip(rows, ret):
                row[I_T_RET] = t1
                e = getattr(r, "elem", None)
                if e is None or getattr(r, "completed", False):
                    row[I_T_END] = t1
                    row[_R.I_COMPLETION] = "return"
                    rec.append_row(row)
                else:
                    rec.add_pending_tensors(row, [e], tensors=(t, e))
        except Exception as e:
            log.warn_once(("funcol-finish", "batch"), "cannot record funcol.batch_p2p_ops_inplace",
                          e)
        return ret

    functools.update_wrapper(batch_p2p_ops_inplace, orig)
    setattr(batch_p2p_ops_inplace, ORIGINAL_ATTR, orig)
    return batch_p2p_ops_inplace


def _make_wait(orig):
    def wait_tensor(tensor):
        rec = _R._recorder
        if rec is None or not (rec._by_storage or rec._by_key):
            return orig(tensor)
        p = rec.lookup_tensor(tensor)
        if p is None or p.waited:
            return orig(tensor)
        t0 = rec.now_ns()
        dt = rec.device_timer if p.device_token is not None else None
        if dt is not None:
            dt.on_wait_begin(p.device_token)
        try:
            out = orig(tensor)
        except BaseException:
            raise
        t1 = rec.now_ns()
        if dt is not None:
            dt.on_wait(p.device_token)   # the current stream now waits for the op
        try:
            row = p.row
            if row[I_T_WAIT] is None:
                row[I_T_WAIT] = t0
            row[I_T_WAIT_END] = t1
            rec.complete(p, t1, "wait")
            p.waited = True
            # Completed and waited: queued here, as Work.wait does (a wake-up of the writer
            # thread per wait cost more than the op).
            rec._release(p)
        except Exception:
            pass
        return out

    functools.update_wrapper(wait_tensor, orig)
    setattr(wait_tensor, ORIGINAL_ATTR, orig)
    return wait_tensor


def install() -> bool:
    """Wrap the functional collectives and ``wait_tensor``; idempotent. Call once torch is fully
    imported (at init_process_group)."""
    global _mod
    try:
        import importlib

        _mod = sys.modules.get(MOD) or importlib.import_module(MOD)
    except Exception as e:
        log.warn_once("funcol-import", "functional collectives not captured", e)
        return False
    for name, spec in FUNCOL_TABLE.items():
        f = getattr(_mod, name, None)
        if f is None or hasattr(f, ORIGINAL_ATTR):
            continue
        patch(_mod, name, _make(name, original_of(f), spec))
    f = getattr(_mod, "batch_p2p_ops_inplace", None)
    if f is not None and not hasattr(f, ORIGINAL_ATTR):
        patch(_mod, "batch_p2p_ops_inplace", _make_batch(f))
    f = getattr(_mod, "wait_tensor", None)
    if f is not None and not hasattr(f, ORIGINAL_ATTR):
        patch(_mod, "wait_tensor", _make_wait(f))
    return True


def uninstall() -> None:
    if _mod is not None:
        restore(_mod)
    _name_cache.clear()
