"""The capture side's public API: :func:`trace`, :func:`enable`, :func:`disable`,
:func:`mark_step`, :func:`is_enabled` (re-exported by ``commtrace``).

Tracing starts in a process once it has a process group: :func:`enable` before
``init_process_group`` arms a hook that starts the recorder when the group is created; after it,
the recorder starts at once. All of this works in a script started by plain ``torchrun`` or
``mp.spawn``; ``commtrace run`` only adds the environment that arms the same hook in every
child (``commtrace.capture.autostart``).

Wrappers are installed once per process and never twice; :func:`disable` stops recording and
flushes, leaving the pass-through wrappers in place (P2POps built meanwhile keep working).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from .. import __version__
from ..config import ENV_ENABLE, Config
from ..errors import UsageError
from . import log
from . import recorder as _R

_lock = threading.RLock()
_config: Config | None = None      # armed config (enable() called, waiting for a group)
_starts = 0                        # recorders started in this process (output key generation)
_OPTION_NAMES = None


def _option_names() -> set[str]:
    global _OPTION_NAMES
    if _OPTION_NAMES is None:
        import dataclasses

        # `session` is set by `commtrace run` for its own ranks, not a tracing option
        _OPTION_NAMES = {f.name for f in dataclasses.fields(Config)} - {"session"}
    return _OPTION_NAMES


def _build_config(output, options) -> Config:
    bad = set(options) - _option_names()
    if bad:
        raise UsageError(f"unknown tracing option(s): {', '.join(sorted(bad))} "
                         f"(known: {', '.join(sorted(_option_names()))})")
    cfg = Config.from_env(**options)
    if output is not None:
        cfg = cfg.replace(output=os.fspath(output))
    return cfg


# --------------------------------------------------------------------------------------------
# Hooks on torch.distributed
# --------------------------------------------------------------------------------------------


def install_c10d_hooks(c10d=None) -> None:
    """Wrap the torch.distributed functions and hook ``init_process_group``. Safe while torch is
    half-imported (called from the import hook on ``distributed_c10d``); idempotent."""
    from . import wrappers
    from .registry import ORIGINAL_ATTR, patch, restore

    wrappers.install()
    if c10d is None:
        import torch.distributed.distributed_c10d as c10d
    cur = c10d.init_process_group
    if not hasattr(cur, ORIGINAL_ATTR):
        orig = cur

        def init_process_group(*args, **kwargs):
            ret = orig(*args, **kwargs)
            try:
                _on_group_created()
            except Exception as e:  # never into user code
                log.warn_once("start", "tracing could not start", e)
            return ret

        import functools

        functools.update_wrapper(init_process_group, orig)
        setattr(init_process_group, ORIGINAL_ATTR, orig)
        patch(c10d, "init_process_group", init_process_group)
        cur = init_process_group
    dist = sys.modules.get("torch.distributed")
    if dist is not None and hasattr(dist, "init_process_group") \
            and dist.init_process_group is not cur:
        restore(dist, "init_process_group")
        patch(dist, "init_process_group", cur)


def _env_armed() -> bool:
    return os.environ.get(ENV_ENABLE, "") == "1"


def _on_group_created() -> None:
    with _lock:
        if _R.get_recorder() is not None:
            return
        cfg = _config
        if cfg is None and _env_armed():
            cfg = Config.from_env()
        if cfg is None:
            return
        _start(cfg)


def _resolve_output(cfg: Config, store, rank: int) -> str:
    """The output directory (the parent of the run directories): the configured one, else
    ``./commtrace-traces``, as rank 0 sees it (shared via the store)."""
    global _starts
    _starts += 1
    if cfg.output:
        return os.path.abspath(cfg.output)
    key = f"commtrace/output/{_starts}"
    if rank == 0 or store is None:
        path = os.path.abspath("commtrace-traces")
        if store is not None:
            try:
                store.set(key, path)
            except Exception:
                pass
        return path
    from datetime import timedelta

    store.wait([key], timedelta(seconds=60))
    return store.get(key).decode()


#: Store key of the job's run id (set once by rank 0; a later enable() in the same job, same
#: store, finds it and keeps the id).
RUN_ID_KEY = "commtrace/run_id"
RUN_ID_TIMEOUT_S = 60.0


def new_run_id() -> str:
    """A fresh run id: start time (sortable) and 6 random hex digits."""
    import secrets

    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _clean_id(v: str) -> str:
    import re

    v = re.sub(r"[^A-Za-z0-9_.=+-]", "_", v.strip())[:80].lstrip("._")
    return v or new_run_id()


def _agree_run_id(store, rank: int, world_size: int) -> str:
    """The run id of this job, the same on every rank: rank 0 publishes it in the rendezvous
    store (where the clock offsets are agreed too), the others read it. ``COMMTRACE_RUN_ID``
    overrides it (the same value must then be given to every rank)."""
    env = os.environ.get("COMMTRACE_RUN_ID", "").strip()
    if env:
        return _clean_id(env)
    if store is None or world_size <= 1:
        return new_run_id()
    if rank == 0:
        rid = new_run_id()
        try:
            # compare_set keeps an id this store already holds (tracing enabled again in the
            # same job), so that the job stays one run.
            got = store.compare_set(RUN_ID_KEY, "", rid)
            got = got.decode() if isinstance(got, bytes) else str(got)
            return _clean_id(got) if got else rid
        except Exception:
            try:
                store.set(RUN_ID_KEY, rid)
            except Exception as e:
                log.warn_once("run-id", "cannot publish the run id in the store", e)
            return rid
    from datetime import timedelta

    try:
        store.wait([RUN_ID_KEY], timedelta(seconds=RUN_ID_TIMEOUT_S))
        return _clean_id(store.get(RUN_ID_KEY).decode())
    except Exception as e:
        log.warn_once("run-id", "run id of rank 0 not found in the store; using one of this rank", e)
        return "rank-" + str(rank) + "-" + new_run_id()


def _write_manifest(rec) -> None:
    import json

    from ..format import schema as S
    from ..format import writer as W

    path = os.path.join(rec.run_dir, S.MANIFEST_NAME)
    m = {}
    try:
        with open(path) as f:
            m = json.load(f)
    except Exception:
        pass
    m.setdefault("run_id", rec.meta.get("run_id"))
    m.setdefault("command", list(sys.argv))
    if getattr(rec.config, "session", ""):
        m.setdefault("session", rec.config.session)
    m.setdefault("start_ns", getattr(rec, "start_ns", None) or time.time_ns())
    m.setdefault("start_time", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    m["world_size"] = rec.world_size
    m["commtrace_version"] = __version__
    m["torch_version"] = rec.meta.get("torch_version")
    m["backend"] = rec.backend
    try:
        W.write_manifest(rec.run_dir, m)
    except Exception as e:
        log.warn_once("manifest", f"cannot write {path}", e)


def _start(cfg: Config) -> None:
    """Create this process's recorder (the process group exists)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from . import clock, ddp, funcol, nvtx_ranges, steps, wrappers

    install_c10d_hooks(c10d)
    rank, ws = dist.get_rank(), dist.get_world_size()
    try:
        backend = str(dist.get_backend())
    except Exception:
        backend = None
    try:
        store = c10d._get_default_store()
    except Exception:
        store = None
    # torch's fake backend: one process plays one rank, no other rank shares the store
    shared = store if backend not in clock.SIMULATED_BACKENDS else None
    out = _resolve_output(cfg, shared, rank)
    rid = _agree_run_id(shared, rank, ws)
    cfg = cfg.replace(output=out)
    # One run directory per job (schema v2): jobs written under one output never mix.
    rec = _R.Recorder(cfg, rank, ws, backend=backend, run_dir=os.path.join(out, rid))
    rec.meta["run_id"] = rid
    rec.store = shared  # on-demand windows agree on their first step through it (capture/window.py)
    rec.start_ns = time.time_ns()
    off, method, rtt = clock.measure(store, rank, ws, rec.now_ns, backend=backend)
    rec.meta.update(clock_offset_ns=off, clock_offset_method=method, clock_rtt_ns=rtt)
    if backend in clock.SIMULATED_BACKENDS:
        # One process plays one rank of a world that does not exist: no other rank can join.
        rec.meta["simulated"] = True
    if rank == 0:
        _write_manifest(rec)
    if cfg.cuda_events:
        try:
            from . import device

            import torch

            if torch.cuda.is_available():
                rec.device_timer = device.get_device_timer("cuda", clock=rec.now_ns)
        except ImportError:
            pass
        except Exception as e:
            log.warn_once("device", "device timing unavailable", e)
    nvtx_ranges.install(cfg.nvtx)
    from . import completion_hook

    completion_hook.enable(cfg.completion_hook)
    ddp.install()
    funcol.install()
    wrappers.reset_caches()
    rec.step = 0
    _R._set_recorder(rec)
    _install_torchseq(rec, cfg)
    steps.install()
    _install_optional(rec, cfg)
    rec.install_exit_handlers()
    try:
        from . import crash

        crash.install(rec)
    except Exception as e:
        log.warn_once("crash", "crash dump unavailable", e)


def _install_torchseq(rec, cfg) -> None:
    """Unrecorded collectives (torchseq.py): groups that exist now start from their number now;
    the C path checks the number after each call (unless ``gap_check`` is off)."""
    try:
        from . import torchseq

        torchseq.enabled = bool(getattr(cfg, "gap_check", True))
        if not torchseq.enabled:
            if _R._cfast is not None and hasattr(_R._cfast, "set_tseq"):
                _R._cfast.set_tseq(None)
            return
        torchseq.baseline(rec)
        if _R._cfast is not None and hasattr(_R._cfast, "set_tseq"):
            _R._cfast.set_tseq(torchseq.on_gap)
    except Exception as e:
        log.warn_once("torchseq", "unrecorded-collective check unavailable", e)


def _install_optional(rec, cfg) -> None:
    """Mechanisms of other capture modules (host hazards, synchronize capture, NVML facts),
    each guarded: capture works without them."""
    if cfg.hazards != "off":
        try:
            from . import hazards

            hazards.install(rec, mode=cfg.hazards)
        except ImportError:
            pass
        except Exception as e:
            log.warn_once("hazards", "hazard detection unavailable", e)
    try:
        from . import sync

        sync.install(get_recorder=_R.get_recorder)
    except ImportError:
        pass
    except Exception as e:
        log.warn_once("sync", "synchronize capture unavailable", e)
    try:
        from . import nvml

        rec.meta_providers.append(nvml.collect)
    except ImportError:
        pass
    try:
        from . import watchdog

        watchdog.install(rec)
    except ImportError:
        pass
    except Exception as e:
        log.warn_once("watchdog", "hang watchdog unavailable", e)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def is_enabled() -> bool:
    """Whether tracing is on (recording, or armed and waiting for a process group)."""
    return _R.get_recorder() is not None or _config is not None


def enable(output: str | os.PathLike | None = None, **options) -> None:
    """Turn tracing on in this process.

    `output` is the run directory (default: ``$COMMTRACE_OUTPUT``, else a new
    ``./commtrace-traces/<time>`` that rank 0 picks and shares); `options` are
    :class:`commtrace.config.Config` fields (``flush_interval``, ``buffer_ops``, ``nvtx``,
    ``stack``, ...). Calling it again while on changes nothing. Recording starts when the
    process group exists (at once if it already does)."""
    global _config
    cfg = _build_config(output, options)
    with _lock:
        if is_enabled():
            return
        try:
            install_c10d_hooks()
        except Exception as e:
            log.warn_once("install", "cannot install the torch.distributed wrappers", e)
            return
        _config = cfg
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                _start(cfg)
        except Exception as e:
            log.warn_once("start", "tracing could not start", e)


def disable() -> None:
    """Stop recording in this process and write what was recorded (ops still in flight are
    written with ``t_end_ns`` null and listed in ``_inflight.json``). Idempotent."""
    global _config
    with _lock:
        _config = None
        rec = _R.get_recorder()
        _R._set_recorder(None)
        if rec is not None:
            try:
                rec.close()
            except Exception as e:
                log.warn_once("close", "error while closing the trace", e)
        _uninstall_optional()


def _uninstall_optional() -> None:
    """Undo the mechanisms :func:`_start` / :func:`_install_optional` put in place beyond the
    pass-through wrappers: host-hazard patches, synchronize wrappers, the CUDA-graph guard, the
    process's device timer (a later enable() creates a fresh one) and the hang watchdog. Each
    guarded."""
    for mod, fns in (("hazards", ("uninstall",)), ("sync", ("uninstall",)),
                     ("device", ("uninstall", "reset_device_timer")),
                     ("watchdog", ("uninstall",)), ("crash", ("uninstall",))):
        name = f"{__package__}.{mod}"
        m = sys.modules.get(name)
        if m is None:
            continue  # never imported: nothing of it installed
        for fn in fns:
            try:
                getattr(m, fn)()
            except Exception as e:
                log.warn_once(("uninstall", mod, fn), f"cannot undo {mod}.{fn}", e)


def mark_step(step: int | None = None) -> None:
    """Record a step marker (row kind "mark") and tag later ops with `step` (default: the
    previous step + 1). Once called, optimizer steps no longer advance the step on their own.
    A no-op when tracing is off."""
    rec = _R.get_recorder()
    if rec is None:
        return
    try:
        if step is None:
            step = 0 if not getattr(rec, "manual_steps", False) or rec.step is None \
                else rec.step + 1
        rec.manual_steps = True
        rec.step = int(step)
        rec.emit(kind="mark", step=rec.step, detail="mark_step")
    except Exception as e:
        log.warn_once("mark_step", "mark_step failed", e)


class trace(contextlib.ContextDecorator):
    """Trace the ops issued inside: ``with commtrace.trace(output=DIR): ...`` or
    ``@commtrace.trace(output=DIR)``. Nested inside an active trace it changes nothing; the
    outermost one stops tracing and writes the trace on exit."""

    def __init__(self, output: str | os.PathLike | None = None, **options):
        _build_config(output, options)  # validate now, in the caller's frame
        self.output = output
        self.options = options
        self._owned: list[bool] = []

    def __enter__(self):
        owned = not is_enabled()
        if owned:
            enable(self.output, **self.options)
        self._owned.append(owned)
        return self

    def __exit__(self, *exc):
        if self._owned.pop():
            disable()
        return False
