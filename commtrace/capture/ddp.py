"""DDP's gradient all-reduce, which DDP's C++ Reducer issues without passing through Python.

Capture point: a DDP communication hook (``shared/reference/torch-notes.md``). DDP accepts one
registration per model, so commtrace registers exactly one hook, the *dispatcher*, and keeps
the user's hook (if any) inside it:

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

from . import log
from . import recorder as _R
from .registry import patch, restore
from .wrappers import tls

_DDP = None
_installed = False


class _HookState:
    """State of the dispatcher: the DDP process group and the user's hook, if any."""

    __slots__ = ("process_group", "user_hook", "user_state", "ddp_ref", "__weakref__")

    def __init__(self, process_group):
        self.process_group = process_group
        self.user_hook = None
        self.user_state = None


_default_hooks = None   # torch.distributed.algorithms.ddp_comm_hooks.default_hooks, once imported
_bucket_detail: dict = {}   # bucket index -> its detail text (built once: this runs per bucket)


def _allreduce_hook(process_group, bucket):
    global _default_hooks
    if _default_hooks is None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        _default_hooks = default_hooks
    return _default_hooks.allreduce_hook(process_group, bucket)


def _detail_of(bucket):
    try:
        i = int(bucket.index())
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
        return _allreduce_hook(state.process_group, bucket)
    prev_api, prev_detail = tls.api, tls.detail
    tls.detail = _detail_of(bucket)
    try:
        if hook is not None:
            return hook(state.user_state, bucket)
        tls.api = "ddp_comm_hook"
        return _allreduce_hook(state.process_group, bucket)
    finally:
        tls.api, tls.detail = prev_api, prev_detail


def _annotate(fn):
    # DDP's _check_comm_hook accepts only these annotations (or none).
    import torch
    import torch.distributed as dist

    fn.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                          "return": torch.futures.Future[torch.Tensor]}
    return fn


def _install_dispatcher(ddp, orig_register, user_hook=None, user_state=None) -> bool:
    state = _HookState(ddp.process_group)
    state.user_hook, state.user_state = user_hook, user_state
    if user_hook is None:
        # No hook of the user's: register with the reducer only, as register_comm_hook does
        # minus its bookkeeping, so that DDP reads as without commtrace: its logging data has
        # no "comm_hook" and its hook list (which DDP's Python reducer under compiled autograd
        # calls with other arguments) stays empty.
        import torch.distributed as dist

        _annotate(_dispatch)
        ddp._check_comm_hook(_dispatch)
        dist._register_comm_hook(ddp.reducer, state, _dispatch)
    else:
        orig_register(ddp, state, _dispatch)
    ddp.__dict__["_commtrace_hook_state"] = state
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
    global _DDP, _installed
    if _installed:
        return True
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except Exception as e:
        log.warn_once("ddp-import", "DDP capture unavailable", e)
        return False
    _DDP = DDP
    _annotate(_dispatch)
    orig_forward = DDP.forward
    orig_register = DDP.register_comm_hook

    def forward(self, *inputs, **kwargs):
        if _R._recorder is not None and "_commtrace_hook_state" not in self.__dict__:
            _maybe_install_default(self, orig_register)
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
    _patch_builtin(DDP)
    _installed = True
    return True


def _patch_builtin(DDP):
    orig = DDP._register_builtin_comm_hook

    def _register_builtin_comm_hook(self, comm_hook_type):
        st = self.__dict__.get("_commtrace_hook_state")
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
    _installed = False
