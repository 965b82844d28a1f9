"""Live use-before-wait detection (issue 3, item 5; ``shared/reference/metrics.md``,
"Synchronisation rules"): a host read of a tensor that is the buffer of an async op not waited
yet. The value read may be stale (on NCCL the comm kernel may not even have started).

How it stays free when nothing is pending: the recorder calls our pending listener when the
number of pending async ops goes 0 -> >0 and >0 -> 0 (in basic mode the recorder tells the
>0 -> 0 late, from its writer thread: a loop of one async op and its wait() then calls the
listener only at its start; with nothing pending a check finds nothing). The host-read methods of ``torch.Tensor``
(``item``, ``tolist``, ``cpu``, ``numpy``, ``__repr__``, ``__str__``, ``__format__``) are
replaced by checking wrappers the first time an op becomes pending, and torch's originals are
put back once nothing has been pending for ``UNPATCH_AFTER_S`` (checked by the next host read,
or at uninstall): a program with no async op in flight runs torch's own methods, untouched.
The hysteresis is there because patching and restoring seven attributes of ``torch.Tensor``
costs tens of microseconds (type-cache invalidation), which a loop of async op + wait would
otherwise pay every iteration; in between, a wrapper with nothing pending costs one flag test.

Each check asks whether the tensor's memory overlaps the memory of a tensor of a pending op that
was not waited (a view of the same storage counts; a disjoint slice of one bucket does not).
A hit emits one ``kind="hazard"`` row: ``api`` (e.g. ``Tensor.item``), ``op`` and ``ref_op_id`` of
the pending op, ``detail="use_before_wait"`` and ``site`` (file:line of the user's code).
Repeated hits with the same (op, api, site) are recorded once: a loop reading a pending tensor
is one hazard, not thousands of rows.

``--hazards full`` (opt-in) also catches any torch operation taking a pending tensor as input
(``x = pending + 1``, ``pending.zero_()``), through a ``TorchFunctionMode`` pushed while ops
are pending. Metadata queries and view constructors (``size``, ``dtype``, ``t[0]``,
``view``...) read no data and are not reported. Torch-function modes are per thread: the mode
is pushed on the thread whose call made the pending count leave 0 and popped by that thread;
when the count returns to 0 on another thread (a gloo completion thread), the mode stays on the
stack in pass-through until its thread next sees a transition. Its overhead is measured in
``benchmarks/hazards.py`` (docs/performance.md, "Hazard detection overhead").

Thread-safety: the listener may run on any thread (gloo completes futures on its own threads);
state changes happen under one lock and a check reads a snapshot of the pending ops.
"""

from __future__ import annotations

import sys
import threading
import time

from . import registry
from .log import warn_once
from .sites import user_site

BASIC_METHODS = ("item", "tolist", "cpu", "numpy", "__repr__", "__str__", "__format__")
DETAIL = "use_before_wait"
#: Restore torch's host-read methods after this long with nothing pending (seconds).
UNPATCH_AFTER_S = 1.0
_monotonic = time.monotonic

#: Functions that read no tensor data (metadata, views): not hazards in full mode.
_NO_DATA = frozenset((
    "__get__", "__set__", "size", "dim", "ndimension", "numel", "nelement", "stride",
    "storage_offset", "data_ptr", "untyped_storage", "_typed_storage", "element_size",
    "is_contiguous", "is_floating_point", "is_complex", "is_signed", "get_device", "__len__",
    "__hash__", "__getitem__", "view", "view_as", "reshape", "reshape_as", "detach", "narrow",
    "select", "chunk", "split", "tensor_split", "unbind", "flatten", "unflatten", "squeeze",
    "unsqueeze", "expand", "expand_as", "t", "T", "transpose", "permute", "as_strided",
    "__reduce_ex__", "__setstate__", "__deepcopy__", "_is_view", "is_set_to", "has_names",
    "requires_grad_", "retain_grad", "register_hook", "record_stream", "dim_order",
))

_tls = threading.local()


class _State:
    def __init__(self):
        self.lock = threading.RLock()
        self.recorder = None
        self.mode = "off"
        self.installed = False
        self.active = False          # async ops pending: wrappers check
        self.last_change = 0.0       # monotonic time of the last pending-count transition
        self.patched: list[tuple[object, str]] = []
        self.tf_mode = None          # the TorchFunctionMode object (full mode)
        self.tf_owner = None         # thread ident that pushed it
        self.seen: set = set()
        self.extents: dict = {}      # {'key': pending op ids, 'ops': their memory extents}
        self.hits = 0
        self.toggles = 0


_S = _State()


# -- memory extents -----------------------------------------------------------------------


def _extent(t):
    """(first byte, one past the last byte) of the memory `t` can read, or None."""
    try:
        lo = t.data_ptr()
        if lo == 0:
            return None
        if t.is_contiguous():
            return lo, lo + t.nbytes
        span = 1
        for sz, st in zip(t.size(), t.stride()):
            if sz == 0:
                return None
            span += (sz - 1) * abs(st)
        return lo, lo + span * t.element_size()
    except Exception:  # sparse, meta, fake tensors: no memory to compare
        return None


def _tensors_of(obj, out):
    import torch

    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors_of(x, out)
    return out


def _pending_extents(rec):
    """[(op_id, op, [(lo, hi, device)])] of pending ops not yet waited.

    The extents are rebuilt only when the set of pending op ids changes, so a check costs one
    ``pending_ops()`` call and a scan of a few tuples.
    """
    try:
        pend = rec.pending_ops()
    except Exception as e:
        warn_once("hazard-pending", "hazard check: pending_ops() failed", e)
        return ()
    if not pend:
        return ()
    key = tuple(pend)
    cached = _S.extents
    if cached.get("key") != key:
        ops = []
        for op_id, p in list(pend.items()):
            ext = []
            for pt in _tensors_of(getattr(p, "tensors", None) or (), []):
                e = _extent(pt)
                if e is not None and e[1] > e[0]:
                    ext.append((e[0], e[1], pt.device))
            if ext:
                ops.append((p, op_id, getattr(p, "op", None), ext))
        cached = {"key": key, "ops": ops}
        _S.extents = cached
    return [(op_id, op, ext) for p, op_id, op, ext in cached["ops"]
            if not getattr(p, "waited", False)]


def _find(t, pend):
    """The first pending (op_id, op) whose memory overlaps tensor `t`, or None."""
    e = _extent(t)
    if e is None:
        return None
    lo, hi = e
    if hi <= lo:
        return None
    for op_id, op, exts in pend:
        for plo, phi, pdev in exts:
            if lo < phi and plo < hi and t.device == pdev:  # CPU and GPU addresses may coincide
                return op_id, op
    return None


def _report(rec, op_id, op, api, site) -> None:
    key = (op_id, api, site)
    with _S.lock:
        if key in _S.seen:
            return
        _S.seen.add(key)
        _S.hits += 1
    try:
        rec.emit(kind="hazard", api=api, op=op, ref_op_id=op_id, detail=DETAIL, site=site)
    except Exception as e:
        warn_once("hazard-emit", "hazard row could not be recorded", e)


def check(tensors, api: str, depth: int = 2) -> int:
    """Check `tensors` against the pending ops now; emit a hazard row per hit. Returns hits."""
    rec = _S.recorder
    if rec is None:
        return 0
    pend = _pending_extents(rec)
    if not pend:
        return 0
    n = 0
    site = None
    for t in tensors:
        hit = _find(t, pend)
        if hit is not None:
            if site is None:
                site = user_site(depth + 1)
            _report(rec, hit[0], hit[1], api, site)
            n += 1
    return n


# -- basic mode: host-read methods --------------------------------------------------------


def _lazy_unpatch() -> None:
    with _S.lock:
        if not _S.active and _S.patched and _monotonic() - _S.last_change >= UNPATCH_AFTER_S:
            _unpatch_readers()


def _make_reader(orig, api: str):
    def reader(self, *args, **kwargs):
        if not _S.active:
            if _monotonic() - _S.last_change >= UNPATCH_AFTER_S:
                _lazy_unpatch()
            return orig(self, *args, **kwargs)
        if getattr(_tls, "busy", False):
            return orig(self, *args, **kwargs)
        _tls.busy = True  # __format__ -> item, __str__ -> __repr__, repr's own torch ops
        try:
            try:
                check((self,), api, depth=2)
            except Exception as e:
                warn_once(("hazard-check", api), "hazard check failed", e)
            return orig(self, *args, **kwargs)
        finally:
            _tls.busy = False

    w = _c_reader(orig, reader)
    for r in (reader, w) if w is not None else (reader,):
        setattr(r, registry.ORIGINAL_ATTR, orig)
        r.__name__ = getattr(orig, "__name__", api)
        r.__qualname__ = "Tensor." + r.__name__
        r.__doc__ = getattr(orig, "__doc__", None)
    return w if w is not None else reader


def _c_reader(orig, reader):
    """``_fastpath.hazard_reader``: `reader`'s common cases in C (nothing active and no restore
    due; active with every pending op waited: torch's method at once, as `reader` would end),
    `reader` for the rest (issue 20: 4 Python frames per ``loss.item()`` of the pipeline
    sample). None without the C module (``COMMTRACE_PURE_PYTHON=1``)."""
    from . import recorder as _R

    cf = _R._cfast
    if cf is None or getattr(cf, "hazard_reader", None) is None:
        return None
    try:
        return cf.hazard_reader(orig, reader, _S, sys.modules[__name__])
    except Exception as e:
        warn_once("hazard-c", "host reads checked in Python only", e)
        return None


_readers: dict[str, object] = {}


def _patch_readers() -> None:
    import torch

    for name in BASIC_METHODS:
        if registry.patched(torch.Tensor, name):
            continue
        orig = registry.get_original(torch.Tensor, name)
        w = _readers.get(name)
        if w is None or registry.original_of(w) is not orig:
            w = _readers[name] = _make_reader(orig, "Tensor." + name)
        if registry.patch(torch.Tensor, name, w):
            _S.patched.append((torch.Tensor, name))


def _unpatch_readers() -> None:
    for owner, name in _S.patched:
        registry.restore(owner, name)
    _S.patched.clear()


# -- full mode: any torch op ----------------------------------------------------------------


def _api_name(func) -> str:
    name = getattr(func, "__name__", None) or repr(func)
    qual = getattr(func, "__qualname__", "") or ""
    if qual.startswith(("TensorBase.", "Tensor.", "_TensorBase.")):
        return "Tensor." + name
    mod = getattr(func, "__module__", None) or "torch"
    if mod.startswith("torch._C"):
        mod = "torch"
    return f"{mod}.{name}"


def _make_mode():
    from torch.overrides import TorchFunctionMode

    class PendingTensorMode(TorchFunctionMode):
        """Checks every torch op's tensor inputs against pending async ops (full mode)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if kwargs is None:
                kwargs = {}
            if (_S.active and not getattr(_tls, "busy", False)
                    and getattr(func, "__name__", None) not in _NO_DATA):
                _tls.busy = True
                try:
                    ts = _tensors_of(args, [])
                    if kwargs:
                        _tensors_of(tuple(kwargs.values()), ts)
                    if ts:
                        check(ts, _api_name(func), depth=2)
                except Exception as e:
                    warn_once("hazard-mode", "hazard check (full mode) failed", e)
                finally:
                    _tls.busy = False
            return func(*args, **kwargs)

    return PendingTensorMode()


def _mode_on_top(mode) -> bool:
    import torch

    n = torch._C._len_torch_function_stack()
    return n > 0 and torch._C._get_function_stack_at(n - 1) is mode


def _push_mode() -> None:
    if _S.tf_owner is not None:
        return  # already on some thread's stack (pass-through there until its thread pops it)
    if _S.tf_mode is None:
        _S.tf_mode = _make_mode()
    _S.tf_mode.__enter__()
    _S.tf_owner = threading.get_ident()


def _pop_mode() -> None:
    if _S.tf_owner != threading.get_ident():
        return
    if not _mode_on_top(_S.tf_mode):
        return  # the user pushed a mode above ours: never pop theirs; ours stays pass-through
    _S.tf_mode.__exit__(None, None, None)
    _S.tf_owner = None


# -- the listener ---------------------------------------------------------------------------


def _on_pending(count=None) -> None:
    """Pending listener: the number of pending async ops went 0 -> >0 or >0 -> 0."""
    try:
        with _S.lock:
            rec = _S.recorder
            if not _S.installed or rec is None:
                return
            # Re-read the count under our lock rather than trusting `count`: calls from two
            # threads (issue on the training thread, release on the writer or a gloo thread)
            # may arrive out of order, but the last one to take our lock reads the final state.
            # (The recorder calls listeners without holding its own locks.)
            try:
                # its length (pending_ops() copies the dict: this runs twice per async op
                # in a loop that issues and waits one op at a time)
                n = len(rec._pending)
            except Exception:
                n = int(count or 0)
            if n > 0:
                if not _S.active:
                    _S.last_change = _monotonic()
                    if not _S.patched:
                        _patch_readers()
                        _S.toggles += 1
                    _S.active = True
                if _S.mode == "full":
                    _push_mode()
            else:
                if _S.active:
                    _S.active = False
                    _S.last_change = _monotonic()
                    _S.seen.clear()
                    _S.extents.clear()
                if _S.mode == "full":
                    _pop_mode()
    except Exception as e:
        warn_once("hazard-listener", "hazard detection could not follow pending ops", e)


def install(recorder=None, mode: str = "basic") -> bool:
    """Follow `recorder`'s pending async ops and check host reads while any is pending.

    `mode`: "off", "basic" (host-read methods) or "full" (also any torch op, on the thread that
    issued the op). Idempotent; a second call may change the mode. Returns whether installed.
    """
    if mode not in ("basic", "full"):
        uninstall()
        return False
    try:
        if recorder is None:
            from .recorder import get_recorder

            recorder = get_recorder()
        if recorder is None:
            return False
        with _S.lock:
            if _S.installed and _S.recorder is recorder:
                _S.mode = mode
            else:
                if _S.installed:
                    _uninstall_locked()
                _S.recorder = recorder
                _S.mode = mode
                _S.installed = True
                recorder.add_pending_listener(_on_pending)
            # Basic mode takes a late "nothing pending" (its checks then find nothing): the
            # recorder may tell it from its writer thread, not at every wait() (a loop of one
            # async op and its wait() then calls no listener per op). Full mode's torch-function
            # mode must leave at once.
            lazy = getattr(recorder, "set_lazy_idle", None)
            if lazy is not None:
                lazy(mode == "basic")
        _on_pending()
        return True
    except Exception as e:
        warn_once("hazard-install", "could not install hazard detection", e)
        return False


def _uninstall_locked() -> None:
    _unpatch_readers()
    _S.active = False
    if _S.tf_owner is not None:
        _pop_mode()
    _S.installed = False
    _S.recorder = None
    _S.seen.clear()
    _S.extents.clear()


def uninstall() -> None:
    """Stop checking and restore torch's methods (the listener, if still called, does nothing).

    A full-mode TorchFunctionMode pushed on another thread is left in pass-through there."""
    with _S.lock:
        _uninstall_locked()


def stats() -> dict:
    """Counters: hazard rows emitted, times the readers were patched, current state."""
    return {"hazards": _S.hits, "toggles": _S.toggles, "active": _S.active,
            "patched": bool(_S.patched), "mode": _S.mode}
