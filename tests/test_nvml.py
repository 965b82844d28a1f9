"""NVML / NCCL rank metadata: real pynvml without a GPU ("unavailable"), and a fake NVML."""

from __future__ import annotations

import types

import pytest

from commtrace.capture import nvml


class NVMLError(Exception):
    pass


def fake_pynvml(links=(1, 1, 0, 1), pcie=(4, 16, 5, 16), n=2, init_error=None):
    calls = []

    def init():
        if init_error:
            raise init_error
        calls.append("init")

    def nvlink(h, link):
        if link >= len(links):
            raise NVMLError("NVML_ERROR_INVALID_ARGUMENT")
        return links[link]

    m = types.SimpleNamespace(
        NVML_NVLINK_MAX_LINKS=18,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: n,
        nvmlDeviceGetHandleByIndex=lambda i: ("h", i),
        nvmlDeviceGetHandleByPciBusId=lambda b: ("bus", b),
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=f"00000000:{h[1]:02d}:00.0"),
        nvmlDeviceGetIndex=lambda h: h[1],
        nvmlSystemGetDriverVersion=lambda: "570.86",
        nvmlDeviceGetNvLinkState=nvlink,
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: pcie[0],
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: pcie[1],
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: pcie[2],
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: pcie[3],
    )
    return m, calls


def test_fake_nvml_values_for_the_ranks_gpu():
    m, calls = fake_pynvml()
    env = {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_ALGO": "Ring",
           "TORCH_NCCL_ENABLE_TIMING": "1", "NCCLX": "no", "PATH": "/bin"}
    out = nvml.collect(environ=env, pynvml=m)
    assert out["nvml"] == {
        "name": "NVIDIA H200", "bus_id": "00000000:01:00.0", "index": 1, "driver": "570.86",
        "nvlink": {"count": 4, "active": 3, "states": [True, True, False, True]},
        "pcie": {"gen": 4, "width": 16, "max_gen": 5, "max_width": 16},
    }
    assert out["nccl_env"] == {"NCCL_ALGO": "Ring", "TORCH_NCCL_ENABLE_TIMING": "1"}
    assert calls == ["init", "shutdown"]


def test_visible_devices_map_local_rank_to_nvml_index():
    m, _ = fake_pynvml(n=8)
    out = nvml.gpu_info(m, {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "6,7"})
    assert out["index"] == 6


def test_missing_library_or_gpu_is_unavailable_not_an_error():
    m, _ = fake_pynvml(init_error=NVMLError("NVML Shared Library Not Found"))
    assert nvml.gpu_info(m, {}) == "unavailable: NVMLError"
    m, _ = fake_pynvml(n=0)
    assert nvml.gpu_info(m, {}) == "unavailable: no GPU"


def test_real_pynvml_on_this_machine():
    import torch

    out = nvml.collect()
    assert set(out) == {"nvml", "nccl_version", "nccl_env"}
    if torch.cuda.is_available():
        pytest.skip("GPU machine: covered by scripts/gpu_check.py")
    assert out["nvml"].startswith("unavailable")
    assert out["nccl_version"] == "unavailable"


def test_nccl_version_formats():
    import torch

    if torch.cuda.is_available():
        assert nvml.nccl_version().count(".") == 2
    else:
        assert nvml.nccl_version() == "unavailable"
