"""What the GPU and NCCL look like on this rank, for the rank metadata (issue 4, item 6).

Keys (``commtrace.format.schema.META_KEYS``):

- ``nvml``: ``{"name", "bus_id", "index", "nvlink": {"count", "active", "states"},
  "pcie": {"gen", "width", "max_gen", "max_width"}, "driver"}`` for the rank's GPU, or the string
  ``"unavailable: <why>"`` when pynvml, the NVML library or a GPU is missing (never an error);
- ``nccl_version``: ``"2.21.5"`` or ``"unavailable"``;
- ``nccl_env``: every ``NCCL_*`` and ``TORCH_NCCL_*`` environment variable. Algorithm, protocol
  and transport choices (``NCCL_ALGO``, ``NCCL_PROTO``, ``NCCL_P2P_DISABLE``,
  ``NCCL_IB_*``...) explain bandwidth.

Import-light: pynvml and torch are imported inside the functions, and CUDA is never initialised
here (the rank's GPU is found through torch only when torch has initialised CUDA already).
"""

from __future__ import annotations

import os

UNAVAILABLE = "unavailable"
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")


def nccl_env(environ=None) -> dict[str, str]:
    """Every ``NCCL_*`` / ``TORCH_NCCL_*`` variable of the environment, sorted by name."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if k.startswith(ENV_PREFIXES)}


def nccl_version() -> str:
    """NCCL version torch was built with ("2.21.5"), or "unavailable"."""
    try:
        import torch

        if not torch.cuda.is_available():
            return UNAVAILABLE
        v = torch.cuda.nccl.version()
    except Exception:
        return UNAVAILABLE
    if isinstance(v, tuple):
        return ".".join(str(x) for x in v)
    if isinstance(v, int):  # old torch: 2215 -> 2.21.5 (NCCL_VERSION_CODE = M*10000+m*100+p)
        if v >= 10000:
            return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
        return f"{v // 1000}.{v // 100 % 10}.{v % 100}"
    return str(v)


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _device_index(environ) -> int:
    """NVML index of this rank's GPU when torch has not told us: LOCAL_RANK mapped through
    CUDA_VISIBLE_DEVICES (when it lists plain indices)."""
    local = int(environ.get("LOCAL_RANK", "0") or 0)
    vis = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if vis and local < len(vis) and vis[local].isdigit():
        return int(vis[local])
    return local


_gpu_cache = None


def _torch_bus_id():
    """PCI bus id of torch's current device, only when CUDA is initialised already."""
    try:
        import torch

        if not torch.cuda.is_initialized():
            return None
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except Exception:
        return None


def gpu_info(pynvml=None, environ=None):
    """NVML facts about this rank's GPU, or ``"unavailable: <reason>"``."""
    environ = os.environ if environ is None else environ
    if pynvml is None:
        try:
            import pynvml
        except Exception:
            return f"{UNAVAILABLE}: pynvml not installed"
    try:
        pynvml.nvmlInit()
    except Exception as e:
        return f"{UNAVAILABLE}: {type(e).__name__}"
    try:
        try:
            n = pynvml.nvmlDeviceGetCount()
        except Exception as e:
            return f"{UNAVAILABLE}: {type(e).__name__}"
        if n == 0:
            return f"{UNAVAILABLE}: no GPU"
        handle = None
        bus = _torch_bus_id()
        if bus is not None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
            except Exception:
                handle = None
        if handle is None:
            idx = _device_index(environ)
            if idx >= n:
                idx = 0
            handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
        info = {"name": _text(pynvml.nvmlDeviceGetName(handle))}
        for key, fn in (("bus_id", lambda: _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)),
                        ("index", lambda: int(pynvml.nvmlDeviceGetIndex(handle))),
                        ("driver", lambda: _text(pynvml.nvmlSystemGetDriverVersion()))):
            try:
                info[key] = fn()
            except Exception:
                info[key] = None
        states = []
        for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                states.append(bool(pynvml.nvmlDeviceGetNvLinkState(handle, link)))
            except Exception:
                break  # NotSupported / InvalidArgument past the last link (or no NVLink)
        info["nvlink"] = {"count": len(states), "active": sum(states), "states": states}
        pcie = {}
        for key, fname in (("gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                           ("width", "nvmlDeviceGetCurrPcieLinkWidth"),
                           ("max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
                           ("max_width", "nvmlDeviceGetMaxPcieLinkWidth")):
            try:
                pcie[key] = int(getattr(pynvml, fname)(handle))
            except Exception:
                pcie[key] = None
        info["pcie"] = pcie
        return info
    except Exception as e:
        return f"{UNAVAILABLE}: {type(e).__name__}: {e}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _gpu_info_cached():
    """gpu_info() once per process: NVML init takes milliseconds and the recorder asks at every
    flush. Cached once the GPU is known through torch (or there is none)."""
    global _gpu_cache
    if _gpu_cache is not None:
        return _gpu_cache
    bus_known = _torch_bus_id() is not None
    info = gpu_info()
    if bus_known or not isinstance(info, dict):
        _gpu_cache = info
    return info


def collect(environ=None, pynvml=None) -> dict:
    """The rank metadata entries ``nvml``, ``nccl_version`` and ``nccl_env``. Never raises.

    With the defaults (the process environment, the installed pynvml) the GPU facts are cached
    per process; explicit `environ` / `pynvml` (tests) always query."""
    out = {"nvml": UNAVAILABLE, "nccl_version": UNAVAILABLE, "nccl_env": {}}
    try:
        out["nccl_env"] = nccl_env(environ)
    except Exception:
        pass
    try:
        out["nccl_version"] = nccl_version()
    except Exception:
        pass
    try:
        if environ is None and pynvml is None:
            out["nvml"] = _gpu_info_cached()
        else:
            out["nvml"] = gpu_info(pynvml, environ)
    except Exception as e:
        out["nvml"] = f"{UNAVAILABLE}: {type(e).__name__}"
    return out
