"""NVTX ranges (issue 4, item 7): names, payload and domain; the second range of async ops
from return to wait() (or to the write when never waited); no nvtx package -> ranges off."""

from __future__ import annotations

import sys
import types

import pytest

from commtrace.capture import nvtx_ranges as N
from commtrace.capture import recorder as R
from commtrace.capture import wrappers as Wr
from commtrace.capture.api_table import API_TABLE
from commtrace.config import Config


class FakeDomain:
    def __init__(self, name, log):
        self.name, self.log, self._next = name, log, 100

    def get_event_attributes(self, message=None, color=None, category=None, payload=None):
        return (message, payload)

    def push_range(self, a):
        self.log.append(("push", self.name) + a)

    def pop_range(self):
        self.log.append(("pop",))

    def start_range(self, a):
        self._next += 1
        self.log.append(("start", self.name, self._next) + a)
        return self._next

    def end_range(self, rid):
        self.log.append(("end", rid))


@pytest.fixture
def fake_nvtx(monkeypatch):
    log = []
    mod = types.ModuleType("nvtx")
    mod.get_domain = lambda name: FakeDomain(name, log)
    monkeypatch.setitem(sys.modules, "nvtx", mod)
    monkeypatch.setenv("COMMTRACE_NVTX_FORCE", "1")
    assert N.install(True) is True
    yield log
    N.uninstall()


class _PG:
    pass


class _Work:  # a gloo p2p-like Work: no future, polled
    def get_future(self):
        raise RuntimeError("Work::getFuture not implemented")

    def is_completed(self):
        return True


@pytest.fixture
def traced(tmp_path):
    pg = _PG()
    Wr._pg_cache[pg] = Wr.PgInfo(pg, "3", 2, [0, 1], "gloo", True)
    rec = R.Recorder(Config(output=str(tmp_path), hazards="off"), rank=0, world_size=2,
                     start_thread=False)
    R._set_recorder(rec)
    nofuture = set(Wr._nofuture)
    yield rec, pg
    R._set_recorder(None)
    rec.close()
    Wr._pg_cache.pop(pg, None)
    # _Work (no future) marks ("gloo", "all_reduce") as future-less for the whole process: later
    # tests' gloo all_reduce Works would get no completion callback (test_fidelity_completion's
    # test_pending_then_done_is_callback failed after this file in the full suite)
    Wr._nofuture.clear()
    Wr._nofuture.update(nofuture)


def _wrapper(calls):
    def all_reduce(tensor, op=None, group=None, async_op=False):
        calls.append(async_op)
        return _Work() if async_op else None

    return Wr.make_wrapper("all_reduce", all_reduce, API_TABLE["all_reduce"])


def test_message_format():
    assert N.message("all_reduce", 4 << 20, "0", 12) == "all_reduce 4.0MB pg=0 seq=12"
    assert N.message("barrier", 0, "1", 0) == "barrier 0B pg=1 seq=0"
    assert N.message("broadcast", None, "0", 3) == "broadcast ? pg=0 seq=3"


def test_blocking_op_range_spans_the_call(fake_nvtx, traced):
    import torch

    rec, pg = traced
    calls = []
    w = _wrapper(calls)
    w(torch.ones(256), group=pg)
    w(torch.ones(256), group=pg)
    assert fake_nvtx == [("push", "commtrace", "all_reduce 1.0KB pg=3 seq=0", 0), ("pop",),
                         ("push", "commtrace", "all_reduce 1.0KB pg=3 seq=1", 1), ("pop",)]


def test_async_op_second_range_ends_at_wait(fake_nvtx, traced):
    import torch

    rec, pg = traced
    w = _wrapper([])
    work = w(torch.ones(4), group=pg, async_op=True)
    assert fake_nvtx == [("push", "commtrace", "all_reduce 16B pg=3 seq=0", 0), ("pop",),
                         ("start", "commtrace", 101, "all_reduce 16B pg=3 seq=0", 0)]
    wait = Wr._make_wait(lambda self: True)
    assert wait(work) is True
    assert fake_nvtx[-1] == ("end", 101)
    rec.close()
    assert [e for e in fake_nvtx if e[0] == "end"] == [("end", 101)]   # ended once


def test_async_op_never_waited_range_ends_when_written(fake_nvtx, traced):
    import torch

    rec, pg = traced
    w = _wrapper([])
    work = w(torch.ones(4), group=pg, async_op=True)
    assert fake_nvtx[-1][0] == "start"
    rec.close()
    assert fake_nvtx[-1] == ("end", 101)
    del work


def test_no_nvtx_package_means_no_ranges_and_calls_still_recorded(monkeypatch, traced):
    import torch

    monkeypatch.setitem(sys.modules, "nvtx", None)     # import nvtx -> ImportError
    monkeypatch.setenv("COMMTRACE_NVTX_FORCE", "1")
    assert N.install(True) is False and N.active is False
    rec, pg = traced
    calls = []
    w = _wrapper(calls)
    w(torch.ones(4), group=pg)
    assert calls == [False] and rec.queued() == 1


def test_no_profiler_attached_means_inactive(monkeypatch):
    for k in ("NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH", "COMMTRACE_NVTX_FORCE"):
        monkeypatch.delenv(k, raising=False)
    assert N.install(True) is False and N.active is False
