"""Device-timed blocking ops on the C fast path (_fastpath + the C device timer, _devtimer).

With the C device timer, a blocking op on a timed device (CUDA) stays on the C fast path: its
start and end events are C calls, and its record waits in the recorder's _device_rows until
the writer reads its device times, as the Python path's row does. Here the fake device layer
stands in for CUDA ("cpu" ops timed), and both paths must give the same row.
"""

from __future__ import annotations

import pytest

from commtrace.capture import device as D
from commtrace.capture import wrappers as Wr
from commtrace.capture.api_table import API_TABLE
from test_capture_fastpath import _rows, traced  # noqa: F401 (the fixture)

cfast = Wr._cfast
pytestmark = pytest.mark.skipif(
    cfast is None or D.FakeCTimer is None or not hasattr(cfast, "set_devtimer_api"),
    reason="the C fast path or the C device timer is not built here")

T0 = 1_000_000_000_000
OFF = 7_000_000_000


@pytest.fixture
def timed(traced):
    """test_capture_fastpath's recorder, with the C device timer on the fake layer timing "cpu"
    ops (the stand-in for CUDA)."""
    rec, pg = traced
    clock = D.FakeClock(T0)
    dev = D.FakeDevice(clock, offset_ns=OFF)
    timer = D.FakeCTimer(dev, calibration_interval_s=1000.0)
    D.set_timed_device_prefix("cpu")
    rec.device_timer = timer
    try:
        yield rec, pg, clock, dev, timer
    finally:
        rec.device_timer = None
        D.set_timed_device_prefix("cuda")


def test_c_path_times_a_blocking_op_as_the_python_path_does(timed):
    import torch

    rec, pg, clock, dev, timer = timed
    kernels = iter([5_000, 7_000, 11_000])

    def all_reduce(tensor, op=None, group=None, async_op=False):
        dev.current.launch(next(kernels))   # the op's kernel on the current stream
        return None

    w = Wr.make_wrapper("all_reduce", all_reduce, API_TABLE["all_reduce"])
    before = cfast.counts()[0]
    w(torch.ones(8), group=pg)                        # C
    w.__commtrace_python__(torch.ones(8), group=pg)   # Python
    w(torch.ones(4), group=pg)                        # C
    assert cfast.counts()[0] == before + 2            # the C path kept both of its ops
    assert len(rec._device_rows) == 3 and rec.queued() == 0   # all wait for device times
    assert timer.pending() == 3
    clock.advance(1_000_000)
    rec._poll_device()
    assert timer.pending() == 0 and not rec._device_rows
    a, b, c = _rows(rec)
    assert [r["t_end_ns"] - r["t_start_ns"] for r in (a, b, c)] == [5_000, 7_000, 11_000]
    assert b["t_start_ns"] == a["t_end_ns"] and c["t_start_ns"] == b["t_end_ns"]  # one stream
    assert a["t_start_ns"] == T0   # the fake device's clock through the calibration
    for r in (a, b, c):
        assert r["completion"] == "device" and r["stream_wait_ns"] is None
        assert r["t_enqueue_ns"] <= r["t_return_ns"]
    ignore = {"op_id", "seq", "first_on_pg", "site", "t_enqueue_ns", "t_return_ns", "t_start_ns",
              "t_end_ns"}
    assert {k: v for k, v in a.items() if k not in ignore} == \
        {k: v for k, v in b.items() if k not in ignore}
    assert (a["seq"], b["seq"], c["seq"]) == (0, 1, 2)
    assert c["count"] == 4 and a["count"] == 8


def test_untimed_devices_and_errors_on_the_c_path(timed):
    import torch

    rec, pg, clock, dev, timer = timed
    D.set_timed_device_prefix("cuda")   # CPU tensors are not timed: recorded as before

    def all_reduce(tensor, op=None, group=None, async_op=False):
        return None

    w = Wr.make_wrapper("all_reduce", all_reduce, API_TABLE["all_reduce"])
    w(torch.ones(8), group=pg)
    assert rec.queued() == 1 and not rec._device_rows and timer.pending() == 0
    D.set_timed_device_prefix("cpu")

    def broken(tensor, op=None, group=None, async_op=False):
        dev.current.launch(1_000)
        raise RuntimeError("NCCL error")

    wb = Wr.make_wrapper("all_reduce", broken, API_TABLE["all_reduce"])
    with pytest.raises(RuntimeError, match="NCCL error"):
        wb(torch.ones(8), group=pg)
    assert timer.pending() == 0 and not rec._device_rows   # the token abandoned
    rows = _rows(rec)
    assert rows[-1]["error"] == "RuntimeError: NCCL error" and rows[-1]["t_start_ns"] is None


def test_held_rows_are_written_at_close_without_device_times(timed):
    import torch

    rec, pg, clock, dev, timer = timed

    def all_reduce(tensor, op=None, group=None, async_op=False):
        dev.current.launch(10 ** 9)   # never completes before the close
        return None

    w = Wr.make_wrapper("all_reduce", all_reduce, API_TABLE["all_reduce"])
    w(torch.ones(8), group=pg)
    assert len(rec._device_rows) == 1
    rec._service(final=True)
    assert not rec._device_rows
    (row,) = _rows(rec)
    assert row["completion"] == "return" and row["t_end_ns"] == row["t_return_ns"]
