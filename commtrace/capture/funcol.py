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

from ..format import schema as S
from . import log
from . import recorder as _R
from .recorder import (I_API, I_BYTES, I_COUNT, I_DEVICE, I_DTYPE, I_FIRST, I_OUT_BYTES, I_ROOT,
                       I_SEQ, I_T_END, I_T_RET, I_T_WAIT, I_T_WAIT_END)
from .registry import ORIGINAL_ATTR, original_of, patch, restore
from . import wrappers as W

MOD = "torch.distributed._functional_collectives"

#: funcol function -> (canonical op, input param index, output size rule, root param name)
#: out rule: "same" (= input bytes), "x_n" (input x group size), "div_n" (input / group size).
FUNCOL_TABLE = {
    "all_reduce": ("all_reduce", "same", None),
    "all_reduce_coalesced": ("all_reduce", "same", None),
    "all_gather_tensor": ("all_gather", "x_n", None),
    "all_gather_tensor_autograd": ("all_gather", "x_n", None),
    "all_gather_into_tensor_coalesced": ("all_gather", "x_n", None),
    "reduce_scatter_tensor": ("reduce_scatter", "div_n", None),
    "reduce_scatter_tensor_autograd": ("reduce_scatter", "div_n", None),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", "div_n", None),
    "all_to_all_single": ("all_to_all", "same", None),
    "all_to_all_single_autograd": ("all_to_all", "same", None),
    "broadcast": ("broadcast", "same", "src"),
    "permute_tensor": ("all_to_all", "same", None),
}

_mod = None
_pending_by_tensor: dict = {}
_name_cache: dict = {}


def _group_info(group, tag):
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


def _make(api, orig, op, out_rule, root_param):
    import inspect

    try:
        params = list(inspect.signature(orig).parameters)
    except (TypeError, ValueError):
        params = []
    gi = params.index("group") if "group" in params else None
    ti = params.index("tag") if "tag" in params else None
    ri = params.index(root_param) if root_param and root_param in params else None

    def wrapper(*args, **kwargs):
        rec = _R._recorder
        if rec is None or W.tls.depth or (W._cdepth is not None and W._cdepth()):
            return orig(*args, **kwargs)
        t0 = rec.now_ns()
        try:
            group = args[gi] if gi is not None and gi < len(args) else kwargs.get("group")
            tag = args[ti] if ti is not None and ti < len(args) else kwargs.get("tag", "")
            info = _group_info(group, tag or "")
            row = W.new_row(rec, S.KIND_OP, info, op, "funcol." + api, True, t0)
            x = args[0] if args else next(iter(kwargs.values()))
            ts = list(x) if isinstance(x, (list, tuple)) else [x]
            n, b = W._nbytes(ts)
            row[I_COUNT], row[I_BYTES] = n, b
            row[I_OUT_BYTES] = b * info.size if out_rule == "x_n" else (
                b // max(1, info.size) if out_rule == "div_n" else b)
            row[I_DTYPE] = W.dtype_name(ts[0].dtype)
            row[I_DEVICE] = str(ts[0].device)
            if ri is not None:
                src = args[ri] if ri < len(args) else kwargs.get(root_param)
                row[I_ROOT] = int(src) if src is not None else None
            s = rec.next_seq(info.name)
            row[I_SEQ], row[I_FIRST] = s, s == 0
        except Exception as e:
            log.warn_once(("funcol", api), f"cannot record funcol.{api}", e)
            return orig(*args, **kwargs)
        W.tls.depth += 1
        try:
            ret = orig(*args, **kwargs)
        except BaseException as e:
            W._record_error(rec, row, rec.now_ns(), e)
            raise
        finally:
            W.tls.depth -= 1
        t1 = rec.now_ns()
        try:
            row[I_T_RET] = t1
            elems = []
            for r in (ret if isinstance(ret, (list, tuple)) else [ret]):
                e = getattr(r, "elem", None)
                if e is not None and not getattr(r, "completed", False):
                    elems.append(e)
            if not elems:
                row[I_T_END] = t1   # traced / already waited: complete at return
                row[_R.I_COMPLETION] = "return"
                rec.append_row(row)
            else:
                # Keyed by the results' storage: any of them, or any view of them, completes it
                rec.add_pending_tensors(row, elems, tensors=tuple(ts) + tuple(elems))
        except Exception as e:
            log.warn_once(("funcol-finish", api), f"cannot record funcol.{api}", e)
        return ret

    functools.update_wrapper(wrapper, orig)
    setattr(wrapper, ORIGINAL_ATTR, orig)
    return wrapper


def _make_wait(orig):
    def wait_tensor(tensor):
        rec = _R._recorder
        if rec is None or not (rec._by_storage or rec._by_key):
            return orig(tensor)
        p = rec.lookup_tensor(tensor)
        if p is None or p.waited:
            return orig(tensor)
        t0 = rec.now_ns()
        try:
            out = orig(tensor)
        except BaseException:
            raise
        t1 = rec.now_ns()
        try:
            row = p.row
            if row[I_T_WAIT] is None:
                row[I_T_WAIT] = t0
            row[I_T_WAIT_END] = t1
            rec.complete(p, t1, "wait")
            p.waited = True
            rec.wake()
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
    for name, (op, rule, root) in FUNCOL_TABLE.items():
        f = getattr(_mod, name, None)
        if f is None or hasattr(f, ORIGINAL_ATTR):
            continue
        patch(_mod, name, _make(name, original_of(f), op, rule, root))
    f = getattr(_mod, "wait_tensor", None)
    if f is not None and not hasattr(f, ORIGINAL_ATTR):
        patch(_mod, "wait_tensor", _make_wait(f))
    return True


def uninstall() -> None:
    if _mod is not None:
        restore(_mod)
    _name_cache.clear()
