"""DDP's gradient all-reduce, which DDP's C++ Reducer issues without passing through Python.

Capture point, where ``commtrace accel build`` built the module for this torch (the default):
no hook. At the model's first forward under tracing its Reducer is handed commtrace's
*recording group* (``_ddp_hook.cpp`` RecordingGroup, :func:`_install_group`), which forwards
every call to the model's group and records the Reducer's bucket all-reduces: DDP computes and
reports exactly what it does untraced (it scales as it copies, as without a hook), and no
hook's extra pass over the buckets is paid. A hook of the user's goes through the dispatcher
below (registered later, the group stays: it records only what still reaches it).

Elsewhere, or with ``COMMTRACE_DDP_GROUP=0``: a DDP communication hook
(``shared/reference/torch-notes.md``). DDP accepts one registration per model, so commtrace
registers exactly one hook, the *dispatcher*, and keeps the user's hook (if any) inside it:

- no user hook: at the model's first forward under tracing (before the first backward)
  commtrace registers the dispatcher, which runs ``default_hooks.allreduce_hook`` -- what DDP
  does without a hook -- and records its all-reduce with ``api="ddp_comm_hook"``;
- user hook registered first: ``register_comm_hook`` is patched to register the dispatcher
  around it; the user's hook runs unchanged and its own collectives are recorded under their
  real api (``all_reduce``, ...), with ``detail`` naming the DDP bucket;
- user hook registered after commtrace's (for instance after a warm-up forward): the patched
  ``register_comm_hook`` stores it in the dispatcher instead of calling DDP again, which would
  fail with "can only be called once". A second user registration still fails as it would
  without commtrace.
"""

from __future__ import annotations

import json
import weakref

from . import log
from . import recorder as _R
from .registry import patch, restore
from .wrappers import tls

_DDP = None
_Reducer = None   # torch.distributed.Reducer, once patched (_patch_reducer)
_by_reducer: dict = {}   # id(reducer) -> weakref to its DDP model (models with commtrace's hook)
_Join = None   # torch.distributed.algorithms.join.Join, once its notify_join_context is patched
_dist = None   # torch.distributed (its all_reduce: commtrace's wrapper once installed)
_installed = False


class _HookState:
    """State of the dispatcher: the DDP process group, the user's hook, if any, and how
    commtrace's own all-reduce scales a bucket: ``base`` (:func:`_scale_of`), and ``scale``,
    what the C and C++ hooks read per bucket: ``base`` itself, or ``("py", base)`` where only
    the Python hook can scale as DDP would (:func:`_route`)."""

    __slots__ = ("process_group", "user_hook", "user_state", "ddp_ref", "scale", "base",
                 "join_dyn", "bview", "pre", "to_py", "__weakref__")

    def __init__(self, process_group):
        self.process_group = process_group
        self.user_hook = None
        self.user_state = None
        self.scale = None
        self.base = None
        self.ddp_ref = None
        self.join_dyn = False   # the Reducer divides by the join context's count (_note_join)
        self.bview = False      # gradient_as_bucket_view: per gradient, mul_ or div_ (_bview_hooks)
        self.pre = {}           # id(param) -> its .grad's storage before this backward, or None
        self.to_py = False      # a gradient had a .grad before this backward (_bview_hooks)


def _route(state) -> None:
    """Set ``state.scale``: the C and C++ hooks scale with the 3-tuple ``base``; anything else
    (``("py", base)``) hands the bucket to the Python hook, which alone follows DDP's join
    count (``join_dyn``) and, with ``gradient_as_bucket_view``, DDP's choice per gradient
    (``to_py``). ``base`` None: torch's ``allreduce_hook`` (mixed precision)."""
    base = state.base
    state.scale = ("py", base) if base is not None and (state.join_dyn or state.to_py) else base


_default_hooks = None   # torch.distributed.algorithms.ddp_comm_hooks.default_hooks, once imported
_bucket_detail: dict = {}   # bucket index -> its detail text (built once: this runs per bucket)


def _scale_of(ddp, process_group):
    """``(method, factor, group)``: how commtrace's hook scales a bucket so that the gradients
    are DDP's own without a hook, bit for bit, or None (then torch's ``allreduce_hook``).

    Without a comm hook DDP's Reducer divides each gradient by the world size while copying it
    into the bucket: ``mul_out(bucket_view, grad, 1 / world_size)``; with a hook it copies the
    gradient as is and the hook divides. torch's ``allreduce_hook`` divides with ``div_``, which
    on CPU rounds differently from multiplying by the reciprocal (at 3 ranks a third of the
    elements differ in the last bit; at a power of two both are exact), and costs twice as much
    (300k floats: 52 us against 24 us here). So the bucket is multiplied by ``1 / world_size``,
    as DDP does. With ``gradient_as_bucket_view`` DDP still copies (and multiplies) a gradient
    that is not a view of its bucket when the backward reaches it (every step where
    ``zero_grad`` set it to None, torch's default) and divides in place, ``div_``, one that is
    (``zero_grad(set_to_none=False)``, accumulation under ``no_sync``): :func:`_bview_hooks`
    follows which. Mixed precision: torch's hook."""
    try:
        ws = int(process_group.size())
        if ws < 1 or getattr(ddp, "mixed_precision", None) is not None:
            return None
        return ("mul_", 1.0 / ws, process_group)
    except Exception:
        return None


def _bview_hooks(ddp, state) -> None:
    """With ``gradient_as_bucket_view`` DDP's Reducer multiplies a gradient by 1 / n as it
    copies it into the bucket, unless the gradient already is a view of the bucket (it then
    divides it in place): whether it is depends on the parameter's ``.grad`` before the
    backward (None after ``zero_grad()``: a new tensor, copied). A hook on each parameter,
    which runs before its gradient is accumulated, keeps where that ``.grad`` lived
    (``state.pre``); the first one found (a gradient that may be a view) sends the model's
    buckets to the Python hook until the next forward (``state.to_py``), which scales each
    gradient as the Reducer did (:func:`_scaled`). Where every ``.grad`` is None (torch's
    default ``zero_grad``) the C and C++ hooks keep the buckets. The hooks return None: the
    gradients are untouched, and hold no reference to them (a reference would change
    autograd's in-place accumulation)."""
    pre = state.pre

    def make(p):
        ref, key = weakref.ref(p), id(p)

        def hook(grad):
            t = ref()
            g = t.grad if t is not None else None
            if g is None:
                pre[key] = None
            else:
                pre[key] = g.untyped_storage().data_ptr()
                if not state.to_py:
                    state.to_py = True
                    _route(state)
            return None

        return hook

    for p in ddp.module.parameters():
        if p.requires_grad:
            p.register_hook(make(p))
    state.bview = True


#: buckets the Python hook scaled (:func:`_scaled`): all multiplied, all divided, per gradient
SCALED = [0, 0, 0]


def _scaled(state, bucket) -> None:
    """Scale one bucket in place as DDP's Reducer would have (the Python hook's path for
    ``("py", base)``; ``base`` is always a ``mul_``: :func:`_scale_of`): by the join count or the world size (:func:`_join_divisor`), each
    gradient multiplied by its reciprocal or, where DDP found it already a view of the bucket
    (``gradient_as_bucket_view``, :func:`_bview_hooks`), divided."""
    n = _join_divisor(state)
    buf = bucket.buffer()
    alias = None
    if state.bview:
        ptr = buf.untyped_storage().data_ptr()
        pre = state.pre
        alias = [pre.get(id(p)) == ptr for p in bucket.parameters()]
    if not alias or not any(alias):
        buf.mul_(1.0 / n)
        SCALED[0] += 1
    elif all(alias):
        buf.div_(n)
        SCALED[1] += 1
    else:
        SCALED[2] += 1
        for a, g in zip(alias, bucket.gradients()):
            if a:
                g.div_(n)
            else:
                g.mul_(1.0 / n)


def _first(fut):
    return fut.value()[0]


def _note_join(ddp, work) -> None:
    """DDP's forward under a join context (uneven inputs) handed ``work``, the all-reduce that
    counts the ranks not yet joined, to its Reducer (``_set_forward_pass_work_handle``). The
    Reducer keeps the last such handle, with ``divide_by_initial_world_size`` of that moment,
    and without a comm hook divides the gradients by the world size, or, where that flag is
    False, by the count the handle holds. A hook divides by what it likes, so commtrace keeps
    the same pair here and, once the count is to be used, routes the model's buckets to the
    Python hook (:func:`_route`), which reads it (:func:`_join_divisor`) as the Reducer does."""
    static = bool(getattr(ddp, "_divide_by_initial_world_size", True))
    ddp.__dict__["_commtrace_join_fwd"] = (work, static)
    st = ddp.__dict__.get("_commtrace_hook_state")
    if not static and st is not None and not st.join_dyn:
        st.join_dyn = True
        _route(st)


def _join_divisor(state) -> int:
    """What DDP's Reducer would divide this iteration's gradients by (see :func:`_note_join`):
    the world size, or, after a forward under ``divide_by_initial_world_size=False``, the
    number of ranks that had not joined (the Reducer's ``res.item().to<int>()``)."""
    ref = state.ddp_ref
    ddp = ref() if ref is not None else None
    fwd = ddp.__dict__.get("_commtrace_join_fwd") if ddp is not None else None
    if fwd is None or fwd[1]:
        return int(state.process_group.size())
    work = fwd[0]
    got = ddp.__dict__.get("_commtrace_join_div")
    if got is not None and got[0] is work:
        return got[1]
    # The Reducer waits on the handle (in C++, unseen) before it reads the count; here the
    # wait is Work.wait, recorded as that op's wait, so that the read is not a host read of a
    # tensor still in flight (a false use_before_wait).
    work.wait()
    n = int(work.result()[0].item())
    ddp.__dict__["_commtrace_join_div"] = (work, n)
    return n


def _allreduce_hook(state, bucket):
    """DDP's all-reduce of one bucket with DDP's own numerics (:func:`_scale_of`); the C hook
    (``_fastpath.ddp_hook``) does the same. Where only Python can scale as DDP does (DDP's join
    count, gradients already views of their bucket: :func:`_route`) only this hook runs."""
    sc = state.scale
    if sc is not None and sc[0] == "py":
        sc = sc[1]
        if sc is not None:
            _scaled(state, bucket)
            return _dist.all_reduce(bucket.buffer(), group=sc[2],
                                    async_op=True).get_future().then(_first)
    if sc is not None:
        meth, factor, pg = sc
        buf = bucket.buffer()
        getattr(buf, meth)(factor)
        return _dist.all_reduce(buf, group=pg, async_op=True).get_future().then(_first)
    global _default_hooks
    if _default_hooks is None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        _default_hooks = default_hooks
    return _default_hooks.allreduce_hook(state.process_group, bucket)


def _detail_of(bucket):
    """The ``detail`` text of a bucket's row; ``bucket`` is a GradBucket or its index (the
    C++ hook's)."""
    try:
        i = bucket if type(bucket) is int else int(bucket.index())
    except Exception:
        return None
    d = _bucket_detail.get(i)
    if d is None:
        d = _bucket_detail[i] = json.dumps({"ddp_bucket": i})
    return d


def _dispatch(state: _HookState, bucket):
    """The one hook commtrace registers on a DDP model (see module docstring)."""
    hook = state.user_hook
    rec = _R._recorder
    if rec is None:
        if hook is not None:
            return hook(state.user_state, bucket)
        return _allreduce_hook(state, bucket)
    prev_api, prev_detail = tls.api, tls.detail
    tls.detail = _detail_of(bucket)
    try:
        if hook is not None:
            return hook(state.user_state, bucket)
        tls.api = "ddp_comm_hook"
        return _allreduce_hook(state, bucket)
    finally:
        tls.api, tls.detail = prev_api, prev_detail


def _annotate(fn):
    # DDP's _check_comm_hook accepts only these annotations (or none).
    import torch
    import torch.distributed as dist

    fn.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                          "return": torch.futures.Future[torch.Tensor]}
    return fn


_c_hook = False   # _fastpath.ddp_hook once set up, None without it (False: not tried yet)


def _hook_in_c():
    """commtrace's comm hook in C (``_fastpath.ddp_hook``), set up on first use; None where the
    C fast path is not built, ``COMMTRACE_PURE_PYTHON=1`` or ``COMMTRACE_DDP_C=0``."""
    global _c_hook
    if _c_hook is not False:
        return _c_hook
    _c_hook = None
    import os

    from . import wrappers as W

    cf = W._cfast
    if cf is None or not hasattr(cf, "ddp_setup") or os.environ.get(
            "COMMTRACE_DDP_C", "1") in ("0", ""):
        return None
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        from .registry import original_of

        ctx = W.fast_twin("all_reduce", cf.ddp_allreduce)
        if ctx is None:
            return None
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        opts.asyncOp = True
        dtypes = frozenset((torch.float32, torch.float64, torch.float16, torch.bfloat16))
        cf.ddp_setup(_dispatch, ctx, _R, tls, _bucket_detail, _detail_of, dtypes,
                     dist.ReduceOp.SUM, opts, c10d._world.pg_coalesce_state,
                     original_of(c10d.all_reduce), "ddp_comm_hook")
        _c_hook = cf.ddp_hook
    except Exception as e:
        log.warn_once("ddp-c", "DDP comm hook in C unavailable; using the Python one", e)
    return _c_hook


def _register_cxx(ddp, state, c_hook) -> bool:
    """Register the C++ hook (``_ddp_hook.cpp``) on ``ddp``'s Reducer where it is built for
    this torch (``commtrace accel build``; :mod:`.accel`); False (nothing registered) where
    it is not, or ``COMMTRACE_DDP_CXX=0``. Its buckets are recorded by the C hook's code
    (``_fastpath.ddp_issue``); what that does not take goes to the C hook, which hands it to
    :func:`_dispatch` (and counts it: ``_fastpath.ddp_counts``)."""
    from . import accel
    from . import wrappers as W

    mod = accel.load()
    if mod is None:
        return False
    v2 = _v2_group(state)
    try:
        mod.register(ddp.reducer, state, c_hook, W._cfast.ddp_cxx_api(), v2)
    except Exception as e:
        log.warn_once("ddp-cxx", "the C++ DDP comm hook did not register; using the C one", e)
        return False
    ddp.__dict__["_commtrace_hook_kind"] = "c++"
    ddp.__dict__["_commtrace_hook_v2"] = v2 is not None
    fl = getattr(mod, "flush_all", None)
    if fl is not None and fl not in _R.STAMP_FLUSHERS:
        _R.STAMP_FLUSHERS.append(fl)
    return True


#: backends whose all_reduce the C++ hook issues through c10d's C++ API (interface v2)
_V2_BACKENDS = frozenset(("gloo", "nccl"))


def _v2_group(state):
    """The group on which the C++ hook scales and issues a bucket's all-reduce from C++ (hook
    interface v2, ``_ddp_hook.cpp``), or None (v1: through Python's calls, as the C hook):
    None where ``COMMTRACE_DDP_V2=0``, commtrace's scaling is torch's hook's (``base`` None),
    the group is not exactly torch's ``ProcessGroup`` (a subclass may bind ``allreduce`` to
    something else), or one of its backends is not gloo or NCCL."""
    import os

    if os.environ.get("COMMTRACE_DDP_V2", "1") in ("0", ""):
        return None
    try:
        sc = state.base   # the 3-tuple, also while ``scale`` hands buckets to Python (_route)
        if sc is None:
            return None
        return _group_of(sc[2])
    except Exception:
        return None


class _GroupState:
    """What the C path (``_fastpath.ddp_issue``) reads of a model on the group route
    (:func:`_install_group`): no hook of the user's, and a ``mul_`` whose step the recording
    group does not take (DDP's Reducer has scaled the gradients as it copied them)."""

    __slots__ = ("user_hook", "scale")

    def __init__(self, pg):
        self.user_hook = None
        self.scale = ("mul_", 1.0, pg)


def _group_fallback(group, buf, idx):
    """A bucket the recording group's C path did not take (tracing off, a CUDA or complex
    bucket, the C path off): its all_reduce through commtrace's all_reduce, recorded as the
    Python dispatcher records it (the Work), or None where tracing is off (the group then
    issues it itself, unrecorded)."""
    if _R._recorder is None or _dist is None:
        return None
    prev_api, prev_detail = tls.api, tls.detail
    tls.api, tls.detail = "ddp_comm_hook", _detail_of(idx)
    try:
        return _dist.all_reduce(buf, group=group, async_op=True)
    finally:
        tls.api, tls.detail = prev_api, prev_detail


def _install_group(ddp) -> bool:
    """The group route (``_ddp_hook.cpp`` RecordingGroup): record DDP's own all-reduce of each
    bucket without a comm hook, by handing the model's Reducer a group that records its
    all-reduces and forwards everything to the model's group. No hook: the Reducer scales as
    it copies (one pass over the gradients less than any hook: docs/performance.md, "Session
    15"), DDP's numerics and logging data are untouched. False (nothing changed) where the
    built module is missing, ``COMMTRACE_DDP_GROUP=0``, the C path is off, mixed precision or
    DDP's Python reducer, or the group is not torch's ProcessGroup on gloo or NCCL."""
    import os

    if os.environ.get("COMMTRACE_DDP_GROUP", "1") in ("0", ""):
        return False
    if (getattr(ddp, "mixed_precision", None) is not None
            or getattr(ddp, "_use_python_reducer", False)):
        return False
    pg = ddp.process_group
    if _group_of(pg) is None:
        return False
    from . import accel
    from . import wrappers as W

    mod = accel.load()
    wrap = getattr(mod, "wrap_group", None) if mod is not None else None
    if wrap is None or _hook_in_c() is None:
        return False
    reducer = ddp.reducer
    upd = getattr(reducer, "_update_process_group", None)
    if upd is None:
        return False
    try:
        gpg, ctl = wrap(pg, _GroupState(pg), _group_fallback, W._cfast.ddp_cxx_api())
        upd(gpg)
    except Exception as e:
        log.warn_once("ddp-group", "DDP's recording group did not install; using the C++ hook", e)
        return False
    d = ddp.__dict__
    d["_commtrace_group"] = ctl
    d["_commtrace_hook_kind"] = "group"
    # the group handed to the Reducer (the Reducer holds it too): benchmarks/steps.py swaps
    # DDP's own group back in for its untraced rounds on this very copy
    d["_commtrace_pg"] = gpg
    try:   # ctl.reset without pybind's dispatch per forward (the C++ module's reset_fn)
        d["_commtrace_group_reset"] = getattr(ctl, "reset_fn", None) or ctl.reset
    except Exception:
        pass
    try:
        _by_reducer[id(reducer)] = weakref.ref(ddp)
    except Exception:
        pass
    fl = getattr(mod, "flush_all", None)
    if fl is not None and fl not in _R.STAMP_FLUSHERS:
        _R.STAMP_FLUSHERS.append(fl)
    return True


def _group_of(pg):
    """``pg`` where it is exactly torch's ``ProcessGroup`` on gloo or NCCL backends, else None
    (what the C++ side issues on through c10d's C++ API)."""
    try:
        if type(pg) is not _dist.ProcessGroup:
            return None
        name = str(_dist.get_backend(pg))
        parts = {p.split(":", 1)[-1].strip() for p in name.split(",")}
        return pg if parts and parts <= _V2_BACKENDS else None
    except Exception:
        return None


def _install_dispatcher(ddp, orig_register, user_hook=None, user_state=None) -> bool:
    state = _HookState(ddp.process_group)
    state.user_hook, state.user_state = user_hook, user_state
    state.base = state.scale = _scale_of(ddp, ddp.process_group)
    state.ddp_ref = weakref.ref(ddp)
    if (state.base is not None and user_hook is None
            and getattr(ddp, "gradient_as_bucket_view", False)):
        # (a user's hook scales as it likes: no per-parameter hooks for it)
        _bview_hooks(ddp, state)
    fwd = ddp.__dict__.get("_commtrace_join_fwd")
    if fwd is not None and not fwd[1]:
        # the Reducer keeps a join count from before tracing was on (_note_join)
        state.join_dyn = True
        _route(state)
    if user_hook is None:
        # No hook of the user's: register with the reducer only, as register_comm_hook does
        # minus its bookkeeping, so that DDP reads as without commtrace: its logging data has
        # no "comm_hook" and its hook list (which DDP's Python reducer under compiled autograd
        # calls with other arguments) stays empty. The hook is the dispatcher, in C where
        # built (it hands anything but the common case to the Python one).
        import torch.distributed as dist

        _annotate(_dispatch)
        ddp._check_comm_hook(_dispatch)
        c_hook = _hook_in_c()
        if c_hook is None or not _register_cxx(ddp, state, c_hook):
            dist._register_comm_hook(ddp.reducer, state, c_hook or _dispatch)
    else:
        orig_register(ddp, state, _dispatch)
    ddp.__dict__["_commtrace_hook_state"] = state
    try:
        _by_reducer[id(ddp.reducer)] = weakref.ref(ddp)
    except Exception:
        pass
    if user_hook is not None:
        # Show the user's hook, not ours, in DDP's logging data and hook list.
        try:
            ddp.logger._set_comm_hook_name(user_hook.__qualname__)
        except Exception:
            pass
        try:
            ddp._comm_hooks[-1] = (user_hook, user_state)
        except Exception:
            pass
    return True


def install() -> bool:
    """Patch ``DistributedDataParallel.forward`` and ``register_comm_hook``; idempotent. Call
    once torch is fully imported (at init_process_group)."""
    global _DDP, _dist, _installed
    if _installed:
        return True
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except Exception as e:
        log.warn_once("ddp-import", "DDP capture unavailable", e)
        return False
    _DDP = DDP
    import torch.distributed as dist

    _dist = dist
    _annotate(_dispatch)
    orig_forward = DDP.forward
    orig_register = DDP.register_comm_hook

    def forward(self, *inputs, **kwargs):
        d = self.__dict__
        g = d.get("_commtrace_group")
        if g is not None:
            # the Reducer's buckets of this iteration count from 0 (_install_group)
            r = d.get("_commtrace_group_reset")
            if r is not None:
                r()
            else:
                g.reset()
            return orig_forward(self, *inputs, **kwargs)
        st = d.get("_commtrace_hook_state")
        if st is None:
            if _R._recorder is not None:
                _maybe_install_default(self, orig_register)
        elif st.to_py:
            # a new step: back to the C / C++ hook until a .grad is found (_bview_hooks)
            st.to_py = False
            _route(st)
        return orig_forward(self, *inputs, **kwargs)

    def register_comm_hook(self, state, hook):
        st = self.__dict__.get("_commtrace_hook_state")
        if st is None:
            if _R._recorder is None:
                return orig_register(self, state, hook)
            self._check_comm_hook(hook)
            if self.__dict__.get("_commtrace_foreign_hook"):
                return orig_register(self, state, hook)
            return _install_dispatcher(self, orig_register, hook, state) and None
        # commtrace's dispatcher is already registered: dispatch to the user's hook.
        self._check_comm_hook(hook)
        if st.user_hook is not None:
            raise RuntimeError(
                "register_comm_hook or register_builtin_comm_hook can only be called once.")
        st.user_hook, st.user_state = hook, state
        try:
            self.logger._set_comm_hook_name(hook.__qualname__)
            self._comm_hooks.append((hook, state))
        except Exception:
            pass
        return None

    forward.__commtrace_original__ = orig_forward
    register_comm_hook.__commtrace_original__ = orig_register
    register_comm_hook.__doc__ = orig_register.__doc__
    patch(DDP, "forward", forward)
    patch(DDP, "register_comm_hook", register_comm_hook)
    _patch_join(DDP)
    _patch_builtin(DDP)
    _patch_reducer()
    _installed = True
    return True


def _traced_model(reducer):
    """The DDP model whose Reducer `reducer` is, where it carries commtrace's hook and tracing
    is on; else None."""
    if _R._recorder is None:
        return None
    ref = _by_reducer.get(id(reducer))
    ddp = ref() if ref is not None else None
    return ddp if ddp is not None and getattr(ddp, "reducer", None) is reducer else None


def _patch_reducer():
    """Two Reducer methods that DDP or torch's hooks call from Python and that issue collectives
    from C++, no wrapper seeing them, for models with commtrace's hook:

    - ``_rebuild_buckets``: the Reducer rebuilds its buckets once, at the forward after the
      first backward, and broadcasts the new bucket order from rank 0 (``sync_bucket_indices``:
      two broadcasts). The torch numbers it issued on the model's group become one ``gap`` row
      naming it (``origin="ddp_rebuild_buckets"``, with the call's start and return) instead
      of an unexplained gap before the next op.
    - ``_run_allreduce_hook``: torch's Python hooks that keep DDP's all-reduce but do more
      around it (mixed precision's ``_reducer_allreduce_and_upcast_hook``, the optimizer in
      backward) have the Reducer issue the bucket's SUM all-reduce on the model's group
      (ProcessGroup::allreduce of the bucket's buffer, its Work's future). The same all-reduce
      is issued through the recorded all_reduce instead: the same call of the same group on the
      same buffer, its Work's future returned."""
    global _Reducer
    try:
        import torch.distributed as dist

        R = dist.Reducer
        orig, orig_run = R._rebuild_buckets, R._run_allreduce_hook
        orig_comm = R._run_comm_hook
    except Exception as e:
        log.warn_once("ddp-reducer", "DDP's Reducer unknown to commtrace", e)
        return
    from . import torchseq

    def _rebuild_buckets(self):
        ddp = _traced_model(self)
        if ddp is None or ddp.__dict__.get("_commtrace_rebuilt"):
            # (the Reducer rebuilds once: after that no torch numbers are read per forward)
            return orig(self)
        try:
            from .wrappers import pg_info

            info = pg_info(ddp.process_group)
        except Exception:
            info = None
        done = torchseq.around(_R._recorder, info, lambda: orig(self), "ddp_rebuild_buckets")
        if done:
            ddp.__dict__["_commtrace_rebuilt"] = True
        return done

    def _run_allreduce_hook(self, bucket):
        ddp = _traced_model(self)
        if ddp is None or _dist is None:
            return orig_run(self, bucket)
        prev_api, prev_detail = tls.api, tls.detail
        tls.api, tls.detail = "ddp_comm_hook", _detail_of(bucket)
        try:
            return _dist.all_reduce(bucket.buffer(), group=ddp.process_group, async_op=True).get_future()
        finally:
            tls.api, tls.detail = prev_api, prev_detail

    def _run_comm_hook(self, bucket):
        # a bucket Python hands to the Reducer (DDP's join mode: the shadow all-reduces of a
        # joined rank): a recording group learns its index first (_install_group)
        ddp = _traced_model(self)
        g = ddp.__dict__.get("_commtrace_group") if ddp is not None else None
        if g is not None:
            try:
                g.hint(int(bucket.index()))
            except Exception:
                pass
        return orig_comm(self, bucket)

    for fn, o in ((_rebuild_buckets, orig), (_run_allreduce_hook, orig_run),
                  (_run_comm_hook, orig_comm)):
        fn.__commtrace_original__ = o
        fn.__doc__ = getattr(o, "__doc__", None)
    ok = patch(R, "_rebuild_buckets", _rebuild_buckets)
    ok = patch(R, "_run_allreduce_hook", _run_allreduce_hook) or ok
    ok = patch(R, "_run_comm_hook", _run_comm_hook) or ok
    if ok:
        _Reducer = R


def _patch_join(DDP):
    """Keep, per DDP model, the join context's forward all-reduce as its Reducer does
    (:func:`_note_join`), so that commtrace's hook divides as DDP would without it."""
    try:
        from torch.distributed.algorithms.join import Join

        orig = Join.notify_join_context
    except Exception as e:
        log.warn_once("ddp-join", "DDP's join mode unknown to commtrace's hook", e)
        return

    def notify_join_context(joinable):
        work = orig(joinable)
        if work is not None and isinstance(joinable, DDP):
            try:
                _note_join(joinable, work)
            except Exception as e:
                log.warn_once("ddp-join-note", "cannot follow DDP's join", e)
        return work

    notify_join_context.__commtrace_original__ = orig
    notify_join_context.__doc__ = orig.__doc__
    if patch(Join, "notify_join_context", staticmethod(notify_join_context)):
        # Dynamo meets the function, not the staticmethod: have it trace torch's.
        from . import compile as _compile

        _compile.mark(notify_join_context, owner=Join)
    global _Join
    _Join = Join


def _patch_builtin(DDP):
    orig = DDP._register_builtin_comm_hook

    def _register_builtin_comm_hook(self, comm_hook_type):
        st = self.__dict__.get("_commtrace_hook_state")
        if st is None and self.__dict__.get("_commtrace_group") is not None:
            # the builtin hook issues its all-reduces on the Reducer's group: recorded there
            return orig(self, comm_hook_type)
        if st is None:
            # DDP runs a C++ builtin hook: its all-reduces are invisible to commtrace.
            self.__dict__["_commtrace_foreign_hook"] = True
            log.warn_once("ddp-builtin", "a builtin DDP comm hook is registered; DDP's gradient "
                          "all-reduces of that model are not recorded")
            return orig(self, comm_hook_type)
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        py = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
              dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}
        hook = py.get(comm_hook_type)
        if hook is None or st.user_hook is not None:
            return orig(self, comm_hook_type)  # raises "can only be called once"
        st.user_hook, st.user_state = hook, self.process_group
        return None

    _register_builtin_comm_hook.__commtrace_original__ = orig
    patch(DDP, "_register_builtin_comm_hook", _register_builtin_comm_hook)


def _maybe_install_default(ddp, orig_register) -> None:
    try:
        if ddp.__dict__.get("_commtrace_foreign_hook"):
            return
        if getattr(ddp, "_comm_hooks", None):
            # A hook registered before tracing was on: DDP accepts no second one.
            ddp.__dict__["_commtrace_foreign_hook"] = True
            log.warn_once("ddp-foreign", "a DDP comm hook was registered before tracing was "
                          "turned on; DDP's gradient all-reduces of that model are not recorded")
            return
        if _install_group(ddp):
            return
        _install_dispatcher(ddp, orig_register)
    except Exception as e:
        ddp.__dict__["_commtrace_foreign_hook"] = True
        log.warn_once("ddp-install", "cannot register commtrace's DDP comm hook", e)


def uninstall() -> None:
    """Restore DDP's methods (models that already carry the dispatcher keep it; it then just
    forwards to the user's hook or to allreduce_hook)."""
    global _installed
    if _DDP is not None:
        restore(_DDP)
    if _Join is not None:
        restore(_Join)
    if _Reducer is not None:
        restore(_Reducer)
    _installed = False
