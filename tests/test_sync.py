"""Synchronisation-call capture (issue 4, item 3), on a fake CUDA namespace and on real gloo Work."""

from __future__ import annotations

import types

import pytest
import torch

from commtrace.capture import registry, sync
from commtrace.capture.device import FakeClock


class FakeRecorder:
    """The recorder hooks of docs/dev/interfaces.md that sync capture uses."""

    def __init__(self, clock, inflight=()):
        self.clock = clock
        self.rows = []
        self.inflight = list(inflight)
        self.fail_emit = False

    def now_ns(self):
        return self.clock()

    def inflight_ids(self):
        return list(self.inflight)

    def emit(self, **fields):
        if self.fail_emit:
            raise RuntimeError("writer gone")
        self.rows.append(fields)


def fake_cuda(clock, calls):
    def synchronize(device=None):
        calls.append(("device", device))
        clock.advance(5_000_000)

    class Stream:
        def synchronize(self):
            calls.append("stream")
            clock.advance(1_000)

    class Event:
        def synchronize(self):
            calls.append("event")
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    return types.SimpleNamespace(synchronize=synchronize, Stream=Stream, Event=Event)


class FakeWork:
    def synchronize(self):
        return None


@pytest.fixture
def env():
    clock = FakeClock(10_000)
    calls = []
    cuda = fake_cuda(clock, calls)
    rec = FakeRecorder(clock, inflight=[3, 4])
    state = {"rec": rec}
    assert sync.install(get_recorder=lambda: state["rec"], cuda=cuda, work_cls=FakeWork,
                        accelerator=None, force=True)
    yield clock, calls, cuda, rec, state
    sync.uninstall()


def test_device_synchronize_gives_a_sync_row_with_inflight_ops(env):
    clock, calls, cuda, rec, _ = env
    line = __import__("inspect").currentframe().f_lineno + 1
    cuda.synchronize(0)
    assert calls == [("device", 0)]
    assert rec.rows == [dict(kind="sync", api="torch.cuda.synchronize", t_enqueue_ns=10_000,
                             t_return_ns=5_010_000, inflight=2, inflight_ids=[3, 4],
                             site=f"{__file__}:{line}")]


def test_stream_event_and_work_synchronize(env):
    clock, calls, cuda, rec, _ = env
    rec.inflight = []
    cuda.Stream().synchronize()
    with pytest.raises(RuntimeError, match="illegal memory access"):  # the original's own error
        cuda.Event().synchronize()
    FakeWork().synchronize()
    assert [(r["api"], r["t_return_ns"] - r["t_enqueue_ns"], r["inflight"]) for r in rec.rows] == [
        ("torch.cuda.Stream.synchronize", 1_000, 0),
        ("torch.cuda.Event.synchronize", 0, 0),
        ("Work.synchronize", 0, 0),
    ]


def test_no_recorder_no_row_and_our_errors_never_reach_the_user(env):
    clock, calls, cuda, rec, state = env
    state["rec"] = None
    cuda.synchronize()
    assert rec.rows == [] and len(calls) == 1
    state["rec"] = rec
    rec.fail_emit = True
    cuda.synchronize()                # emit raises inside: swallowed, logged once
    assert len(calls) == 2


def test_install_is_idempotent_and_uninstall_restores(env):
    clock, calls, cuda, rec, _ = env
    wrapped = cuda.synchronize
    orig = registry.original_of(wrapped)
    assert orig is not wrapped
    sync.install(get_recorder=lambda: rec, cuda=cuda, work_cls=FakeWork, accelerator=None,
                 force=True)
    assert cuda.synchronize is wrapped                       # never wrapped twice
    assert registry.original_of(cuda.synchronize) is orig
    cuda.synchronize()
    assert len(rec.rows) == 1                                 # one row per call
    sync.uninstall()
    assert cuda.synchronize is orig and not registry.is_wrapper(cuda.Stream.synchronize)
    assert not registry.is_wrapper(FakeWork.synchronize)


def test_not_installed_off_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    before = torch.cuda.synchronize
    assert sync.install() is False
    assert torch.cuda.synchronize is before and not sync.installed()


def test_real_gloo_work_synchronize_row(tmp_path):
    import torch.distributed as dist

    clock = FakeClock(0)
    rec = FakeRecorder(clock, inflight=[11])
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        assert sync.install(get_recorder=lambda: rec, force=True)
        w = dist.all_reduce(torch.ones(4), async_op=True)
        w.synchronize()
        w.wait()
    finally:
        sync.uninstall()
        dist.destroy_process_group()
    assert [(r["api"], r["inflight_ids"]) for r in rec.rows] == [("Work.synchronize", [11])]
    assert rec.rows[0]["site"].startswith(__file__)
    assert not registry.is_wrapper(torch.cuda.synchronize)
    assert not registry.is_wrapper(torch.cuda.Stream.synchronize)
