"""Device timing on the fake event/stream layer: exact times for calibration, polling, pooling,
stream waits and CUDA-graph skips (issue 4, items 1, 5 and 8)."""

from __future__ import annotations

import pytest

from commtrace.capture import device as D

T0 = 1_000_000_000_000  # fake host clock start (ns)
OFF = 7_000_000_000     # device clock = host + OFF


def make(latency=0, **kw):
    clock = D.FakeClock(T0)
    dev = D.FakeDevice(clock, offset_ns=OFF, launch_latency_ns=latency)
    kw.setdefault("calibration_interval_s", 1000.0)
    return clock, dev, D.FakeTimer(dev, **kw)


def blocking_op(timer, dev, op_id, kernel_ns):
    """A blocking collective: start event, kernel on the current stream, end event."""
    tok = timer.on_issue(op_id)
    dev.current.launch(kernel_ns)
    timer.on_return(tok, blocking=True)
    return tok


def test_blocking_op_maps_exactly_through_calibration():
    clock, dev, t = make()
    issued = clock()
    blocking_op(t, dev, 1, 300_000)
    assert t.poll() == []            # not completed yet on the device: nothing, no blocking
    assert clock() == issued         # poll never advanced (blocked) the host
    clock.advance(1_000_000)
    assert t.poll() == [(1, issued, issued + 300_000, None)]
    assert t.pending() == 0


def test_calibration_error_is_half_the_host_bracket():
    # With 2 us between host enqueue and device execution, the calibration event is stamped
    # 2 us after h0 and the host waits until then: midpoint = h0 + 1 us, so every mapped time is
    # 1 us early (the documented bound: half the bracket).
    clock, dev, t = make(latency=2_000)
    issued = clock()
    blocking_op(t, dev, 1, 100_000)
    clock.advance(1_000_000)
    cal_before = clock()
    (row,) = t.poll()
    true_start = issued + 2_000
    assert row == (1, true_start - 1_000, true_start + 100_000 - 1_000, None)
    assert clock() == cal_before + 3 * 2_000 - 2_000 * 0  # three tries, each waits 2 us
    cal = t._latest[0]
    assert cal.bracket_ns == 2_000


def test_poll_returns_completed_ops_in_issue_order_without_waiting_for_others():
    clock, dev, t = make()
    s1, s2 = dev.current, D.FakeStream(dev, "side")
    a = clock()
    tok1 = t.on_issue(1)
    s1.launch(5_000_000)              # long op on stream 1
    t.on_return(tok1, True)
    dev.current = s2
    b = clock()
    tok2 = t.on_issue(2)
    s2.launch(1_000_000)              # short op on stream 2
    t.on_return(tok2, True)
    tok3 = t.on_issue(3)
    s2.launch(1_000_000)
    t.on_return(tok3, True)
    clock.advance(2_000_000)
    assert t.poll() == [(2, b, b + 1_000_000, None), (3, b + 1_000_000, b + 2_000_000, None)]
    clock.advance(10_000_000)
    assert t.poll() == [(1, a, a + 5_000_000, None)]
    assert t.poll() == []


def test_async_op_stream_wait_is_the_exposed_part():
    clock, dev, t = make()
    comm = D.FakeStream(dev, "nccl")
    issued = clock()
    tok = t.on_issue(7)
    # NCCL: the comm stream waits for the caller's stream, then runs the 800 us transfer.
    comm.wait_event(tok.start)
    comm.launch(800_000)
    done = D.FakeEvent(dev)
    done.record(comm)
    t.on_return(tok, blocking=False)
    dev.current.launch(500_000)       # a matmul between issue and wait
    clock.advance(50_000)             # host returns from the matmul launch at once
    t.on_wait_begin(tok)
    dev.current.wait_event(done)      # work.wait(): the current stream waits on the comm stream
    t.on_wait(tok)
    clock.advance(400_000)
    assert t.poll() == []             # device is at issued+450us: not done
    clock.advance(1_000_000)
    # compute reached the wait at +500 us, comm ended at +800 us: 300 us exposed.
    assert t.poll() == [(7, issued, issued + 800_000, 300_000)]


def test_async_op_fully_overlapped_has_zero_stream_wait():
    clock, dev, t = make()
    comm = D.FakeStream(dev, "nccl")
    issued = clock()
    tok = t.on_issue(8)
    comm.wait_event(tok.start)
    comm.launch(200_000)
    done = D.FakeEvent(dev)
    done.record(comm)
    t.on_return(tok, False)
    dev.current.launch(900_000)
    t.on_wait_begin(tok)
    dev.current.wait_event(done)
    t.on_wait(tok)
    clock.advance(2_000_000)
    # t_end is when the caller's stream passed the wait (an upper bound on completion).
    assert t.poll() == [(8, issued, issued + 900_000, 0)]


def test_async_without_wait_begin_has_no_stream_wait_and_unwaited_ops_stay_pending():
    clock, dev, t = make(unwaited_timeout_s=1.0)
    issued = clock()
    tok = t.on_issue(1)
    t.on_return(tok, False)
    clock.advance(500_000_000)
    assert t.poll() == [] and t.pending() == 1
    tok2 = t.on_issue(2)
    t.on_return(tok2, False)
    w = clock()
    t.on_wait(tok2)
    clock.advance(1)
    assert t.poll() == [(2, w - 0, w, None)]
    clock.advance(600_000_000)        # op 1 never waited: after 1 s, start only, events freed
    assert t.poll() == [(1, issued, None, None)]
    assert t.pending() == 0


def _async_op_with_completion(t, dev, op_id, kernel_ns):
    """An async NCCL op: start event, the comm stream's kernel, then its future's callback,
    which runs on a pool stream made to wait for the op's events and records the completion."""
    comm = D.FakeStream(dev, "nccl")
    issued = dev.clock()
    tok = t.on_issue(op_id)
    comm.wait_event(tok.start)
    comm.launch(kernel_ns)
    fin = D.FakeEvent(dev)
    fin.record(comm)
    t.on_return(tok, blocking=False)
    main = dev.current
    side = D.FakeStream(dev, "pool")
    side.wait_event(fin)
    dev.current = side
    try:
        t.on_done(tok)
    finally:
        dev.current = main
    return issued, tok, fin


def test_async_op_never_waited_in_python_ends_at_its_completion():
    """DDP's Reducer waits on the bucket's future in C++: no wait() through Python. The end is
    the completion event recorded in the future's callback, read back after the grace."""
    clock, dev, t = make(done_grace_s=1.0)
    issued, tok, fin = _async_op_with_completion(t, dev, 9, 300_000)
    dev.current.launch(900_000)       # the backward pass goes on; the 300 us op ends first
    clock.advance(500_000_000)
    assert t.poll() == [] and t.pending() == 1   # within the grace: a wait() may still come
    clock.advance(600_000_000)
    assert t.poll() == [(9, issued, issued + 300_000, None)]
    assert t.pending() == 0 and t.pooled() == t.events_created - 1  # (the calibration keeps one)


def test_async_op_waited_in_python_keeps_its_wait_end_and_stream_wait():
    """A completion event as well as wait(): the wait's events give t_end and stream_wait_ns
    (unchanged), and the extra event goes back to the pool."""
    clock, dev, t = make(done_grace_s=1.0)
    issued, tok, fin = _async_op_with_completion(t, dev, 7, 800_000)
    dev.current.launch(500_000)
    t.on_wait_begin(tok)
    dev.current.wait_event(fin)
    t.on_wait(tok)
    clock.advance(2_000_000)
    assert t.poll() == [(7, issued, issued + 800_000, 300_000)]
    assert t.pending() == 0 and t.pooled() == t.events_created - 1  # (the calibration keeps one)


def test_closing_reads_unwaited_completions_without_the_grace():
    clock, dev, t = make(done_grace_s=1.0)
    issued, tok, fin = _async_op_with_completion(t, dev, 3, 100_000)
    clock.advance(200_000)
    assert t.poll() == []
    t.done_grace_ns = 0               # what the recorder's final service does
    assert t.poll() == [(3, issued, issued + 100_000, None)]


def test_event_pool_bounds_allocation():
    clock, dev, t = make()
    for i in range(1000):
        blocking_op(t, dev, i, 1_000)
        clock.advance(2_000)
        if i % 10 == 9:
            assert len(t.poll()) == 10
    # 10 ops x 2 events between polls, plus 3 calibration tries once (2 spares pooled).
    assert t.events_created == 23
    assert dev.events_created == 23
    assert t.pooled() == 22 and t.pending() == 0


def test_max_pending_drops_instead_of_growing():
    clock, dev, t = make(max_pending=5)
    toks = [t.on_issue(i) for i in range(8)]
    assert sum(x is not None for x in toks) == 5
    assert t.dropped == 3 and t.pending() == 5


def test_graph_capture_records_no_events_and_counts_ops():
    clock, dev, t = make()
    dev.current.capturing = True
    assert [t.on_issue(i) for i in range(4)] == [None] * 4
    for _ in range(4):
        t.on_return(None, True)
        t.on_wait(None)
    assert t.graph_captured_ops == 4 and t.events_created == 0 and t.pending() == 0
    dev.current.capturing = False
    blocking_op(t, dev, 9, 10_000)
    clock.advance(20_000)
    assert [r[0] for r in t.poll()] == [9]
    assert t.stats()["graph_captured_ops"] == 4


def test_writer_keeps_off_cuda_while_a_graph_capture_runs():
    class FakeGraph:
        def capture_begin(self, *a, **k):
            self.began = True

        def capture_end(self):
            self.ended = True

    clock, dev, t = make()
    assert D.install(FakeGraph) and D.install(FakeGraph)  # idempotent
    try:
        blocking_op(t, dev, 1, 1_000)
        clock.advance(5_000)
        g = FakeGraph()
        g.capture_begin()
        assert D.graph_capture_active()
        assert t.poll() == []
        g.capture_end()
        assert not D.graph_capture_active()
        assert [r[0] for r in t.poll()] == [1]
    finally:
        D.uninstall()
    assert FakeGraph.capture_begin.__name__ == "capture_begin"
    assert not hasattr(FakeGraph.capture_begin, "__wrapped__")


def test_calibration_renewal_bounds_drift():
    clock, dev, t = make(calibration_interval_s=1.0)
    a = clock()
    blocking_op(t, dev, 1, 10_000)
    clock.advance(20_000)
    assert t.poll() == [(1, a, a + 10_000, None)]
    dev.offset_ns += 50_000           # the device clock drifts 50 us ahead
    b = clock()
    blocking_op(t, dev, 2, 10_000)
    clock.advance(20_000)
    assert t.poll() == [(2, b + 50_000, b + 60_000, None)]  # stale calibration: 50 us off
    clock.advance(1_000_000_000)      # interval passed: next poll renews
    c = clock()
    blocking_op(t, dev, 3, 10_000)    # issued under the stale calibration...
    clock.advance(20_000)
    assert t.poll() == [(3, c + 50_000, c + 60_000, None)]  # ...renewed after it: no newer one precedes it
    d = clock() + 2_000_000
    clock.t = d
    blocking_op(t, dev, 4, 10_000)    # issued under the renewed calibration: exact again
    clock.advance(20_000)
    assert t.poll() == [(4, d, d + 10_000, None)]
    assert t.stats()["calibrations"] == 2


def test_op_issued_before_renewal_keeps_its_calibration_and_old_ones_are_freed():
    clock, dev, t = make(calibration_interval_s=1.0)
    blocking_op(t, dev, 1, 1_000)
    clock.advance(2_000)
    t.poll()                          # calibration 1
    first_cal = t._latest[0]
    a = clock()
    tok = t.on_issue(2)               # issued under calibration 1
    t.on_return(tok, False)
    assert tok.calib == first_cal.index
    clock.advance(2_000_000_000)
    blocking_op(t, dev, 3, 1_000)
    clock.advance(2_000)
    assert [r[0] for r in t.poll()] == [3]  # calibration 2 taken; op 2 still pending
    assert first_cal.index in t._calibs      # still referenced by op 2
    t.on_wait(tok)
    clock.advance(1)
    (row,) = t.poll()
    assert row[:2] == (2, a)
    assert first_cal.index not in t._calibs  # released to the pool


def test_timer_never_raises_into_the_caller():
    class Broken(D._FakeBackend):
        def record(self, event, stream):
            raise RuntimeError("CUDA error: boom")

    clock = D.FakeClock(T0)
    dev = D.FakeDevice(clock)
    t = D.EventTimer(Broken(dev), clock=clock)
    assert t.on_issue(1) is None
    t.on_return(None, True)
    assert t.errors == 1 and t.poll() == []


def test_no_timer_off_cuda():
    assert D.get_device_timer("cpu") is None
    import torch

    if not torch.cuda.is_available():
        assert D.get_device_timer("cuda") is None


def test_nccl_duration_cross_check_is_guarded():
    class Gloo:
        def _get_duration(self):
            raise RuntimeError("This Backend doesn't support getDuration")

    class Nccl:
        def _get_duration(self):
            return 1.25

    assert D.nccl_duration_ms(Gloo()) is None
    assert D.nccl_duration_ms(Nccl()) == 1.25
    assert D.nccl_timing_enabled({"TORCH_NCCL_ENABLE_TIMING": "1"})
    assert not D.nccl_timing_enabled({})


@pytest.mark.gpu
def test_cuda_timer_on_a_real_gpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    t = D.CudaTimer()
    x = torch.randn(4096, 4096, device="cuda")
    ref0, ref1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ref0.record()
    tok = t.on_issue(1)
    y = x @ x
    t.on_return(tok, True)
    ref1.record()
    torch.cuda.synchronize()
    (row,) = t.poll()
    ref_ns = ref0.elapsed_time(ref1) * 1e6
    assert abs((row[2] - row[1]) - ref_ns) <= max(0.1 * ref_ns, 20_000)
    del y


def test_op_queued_behind_long_work_uses_the_newer_calibration():
    clock, dev, t = make(calibration_interval_s=0.001)
    blocking_op(t, dev, 1, 1_000)
    clock.advance(2_000)
    t.poll()                                   # calibration 1
    dev.current.launch(10_000_000)             # 10 ms of compute queued before the op
    a = clock()
    tok = blocking_op(t, dev, 2, 100_000)
    assert tok.calib == 1
    dev.offset_ns += 30_000                    # drift after calibration 1
    clock.advance(2_000_000)
    assert t.poll() == []                      # renews (calibration 2 at a+2ms); op 2 not done
    clock.advance(20_000_000)
    # The device reaches the op's events 30 us earlier on the host clock than calibration 1
    # predicts (a + 10 ms). Op 2 started more than 1 ms after calibration 2, so calibration 2
    # maps it: exact.
    assert t.poll() == [(2, a + 10_000_000 - 30_000, a + 10_100_000 - 30_000, None)]


def test_writer_thread_polls_while_the_training_thread_issues():
    """Threading model: on_issue/on_return on one thread, poll() on another; every op is
    reported exactly once, with its own times."""
    import threading

    clock, dev, t = make()
    lock = threading.Lock()          # the fake clock is shared; real clocks need no lock
    got, stop = [], threading.Event()

    def writer():
        while not stop.is_set() or t.pending():
            with lock:
                got.extend(t.poll())

    th = threading.Thread(target=writer)
    th.start()
    expected = []
    for i in range(500):
        with lock:
            a = clock()
            blocking_op(t, dev, i, 1_000)
            clock.advance(1_500)
        expected.append((i, a, a + 1_000, None))
    stop.set()
    th.join(10)
    assert sorted(got) == expected
    assert t.pending() == 0


def test_op_whose_call_raised_is_reported_start_only_or_abandoned():
    clock, dev, t = make(unwaited_timeout_s=1.0)
    a = clock()
    t.on_issue(1)                     # the collective raised: no on_return
    tok2 = t.on_issue(2)
    t.abandon(tok2)                   # the wrapper may forget it at once
    assert t.pending() == 1
    clock.advance(1_000_000_000)
    assert t.poll() == [(1, a, None, None)]
    # 4 events ever: 2 op starts (one reused by the calibration) + 2 more calibration tries;
    # all but the calibration's own are back in the pool.
    assert t.pending() == 0 and t.events_created == 4 and t.pooled() == 3


def test_recorder_fills_device_times_from_the_timer(tmp_path):
    """The seam of docs/dev/interfaces.md: rows held for device times get t_start_ns,
    t_end_ns and stream_wait_ns from poll(), exactly, in the written trace."""
    import pyarrow.dataset as ds

    from commtrace.capture.recorder import IDX, NCOL, Recorder
    from commtrace.config import Config

    rec = Recorder(Config(output=str(tmp_path)), rank=0, world_size=1, start_thread=False)
    clock, dev, t = make()
    rec.device_timer = t

    def row(op_id, async_op):
        r = [None] * NCOL
        r[IDX["kind"]], r[IDX["rank"]], r[IDX["op"]] = "op", 0, "all_reduce"
        r[IDX["op_id"]], r[IDX["async_op"]], r[IDX["device"]] = op_id, async_op, "cuda:0"
        r[IDX["t_enqueue_ns"]] = clock()
        return r

    a = clock()
    r1 = row(1, False)
    blocking_op(t, dev, 1, 300_000)
    r1[IDX["t_end_ns"]] = clock()     # host return: the enqueue, not the completion
    rec.hold_device_row(1, r1)
    clock.advance(10_000)
    comm = D.FakeStream(dev, "nccl")
    b = clock()
    r2 = row(2, True)
    tok = t.on_issue(2)
    comm.wait_event(tok.start)
    comm.launch(800_000)
    done = D.FakeEvent(dev)
    done.record(comm)
    t.on_return(tok, False)
    dev.current.launch(500_000)
    t.on_wait_begin(tok)
    dev.current.wait_event(done)
    t.on_wait(tok)
    rec.hold_device_row(2, r2)
    clock.advance(5_000_000)
    rec.close()
    got = {r["op_id"]: r for r in ds.dataset(str(tmp_path), partitioning="hive").to_table()
           .to_pylist()}
    assert (got[1]["t_start_ns"], got[1]["t_end_ns"], got[1]["stream_wait_ns"]) == \
        (a, a + 300_000, None)
    # op 2 started when the caller's stream reached it: after op 1's 300 us kernel.
    s2 = a + 300_000
    assert b < s2
    assert (got[2]["t_start_ns"], got[2]["t_end_ns"], got[2]["stream_wait_ns"]) == \
        (s2, s2 + 800_000, 300_000)


def test_busy_or_hung_device_never_blocks_the_writer():
    """With CUDA_DEVICE_MAX_CONNECTIONS=1 the calibration event can queue behind a hung
    kernel: the writer gives up after 2 ms instead of blocking, and retries later."""
    clock, dev, t = make()
    calib_stream = t._b._calib
    calib_stream.busy_until = dev.device_now() + 10_000_000_000  # stuck for 10 s
    a = clock()
    blocking_op(t, dev, 1, 1_000)
    clock.advance(5_000)
    before = clock()
    assert t.poll() == []
    assert clock() - before == D.CALIBRATION_MAX_WAIT_NS     # waited 2 ms, no more
    assert t.calibration_failures == 1 and t.pending() == 1
    assert t.poll() == [] and t.calibration_failures == 1     # no retry storm
    calib_stream.busy_until = 0                                 # the device recovers
    clock.advance(100_000_000)
    assert t.poll() == [(1, a, a + 1_000, None)]


# ------------------------------------------------------------------ NCCL path through the wrappers


class _DoneFuture:
    """ProcessGroupNCCL's future: marked completed right after enqueue (callbacks fire at once)."""

    def add_done_callback(self, fn):
        fn(self)


class _NcclWork:
    def __init__(self):
        self.done = False

    def get_future(self):
        return _DoneFuture()

    def is_completed(self):
        return self.done


class _CudaTensor:
    """Just enough of a CUDA tensor for the wrappers' size and device reads."""

    def __init__(self, numel=1024):
        import torch

        self.dtype = torch.float32
        self._n = numel
        self.nbytes = 4 * numel
        self.is_cpu = False
        self.device = "cuda:0"

    def numel(self):
        return self._n

    def get_device(self):
        return 0


def _rec_with_timer(tmp_path):
    from commtrace.capture.recorder import Recorder
    from commtrace.config import Config

    clock, dev, t = make()
    rec = Recorder(Config(output=str(tmp_path), hazards="off"), rank=0, world_size=1,
                   clock=clock, start_thread=False)
    rec.device_timer = t
    return rec, clock, dev, t


def _rows(path):
    import pyarrow.dataset as ds

    return {r["op_id"]: r for r in ds.dataset(str(path), partitioning="hive").to_table()
            .to_pylist()}


def _async_row(rec, clock):
    from commtrace.capture.recorder import IDX, NCOL

    r = [None] * NCOL
    r[IDX["kind"]], r[IDX["rank"]], r[IDX["op"]], r[IDX["api"]] = "op", 0, "all_reduce", \
        "all_reduce"
    r[IDX["op_id"]], r[IDX["async_op"]], r[IDX["device"]] = rec.new_op_id(), True, "cuda:0"
    r[IDX["backend"]] = "nccl"
    r[IDX["t_enqueue_ns"]] = r[IDX["t_return_ns"]] = clock()
    return r


def _issue_async(rec, clock, dev, t, kernel_ns):
    """An async collective on a side (NCCL) stream, as ProcessGroupNCCL issues it."""
    from commtrace.capture import wrappers as Wr

    row = _async_row(rec, clock)
    tok = t.on_issue(row[25])
    comm = D.FakeStream(dev, "nccl")
    comm.wait_event(tok.start)
    comm.launch(kernel_ns)
    done = D.FakeEvent(dev)
    done.record(comm)
    t.on_return(tok, False)
    work = _NcclWork()
    Wr._track_work(rec, row, work, (), tok)
    return row, tok, done, work


def _wait(dev, t, tok, done):
    t.on_wait_begin(tok)
    dev.current.wait_event(done)
    t.on_wait(tok)


def test_nccl_future_done_at_enqueue_does_not_complete_a_device_timed_op(tmp_path):
    rec, clock, dev, t = _rec_with_timer(tmp_path)
    a = clock()
    row, tok, done, work = _issue_async(rec, clock, dev, t, 2_000_000)
    assert row[19] is None                 # t_end_ns: the early future did not complete it
    rec._service(final=False)              # not done, not waited: still in flight
    assert row[19] is None and rec.inflight_ids() == [row[25]]
    _wait(dev, t, tok, done)
    clock.advance(3_000_000)
    rec._service(final=False)              # the end event has completed: device times
    assert (row[18], row[19]) == (a, a + 2_000_000)
    rec.close()
    got = _rows(tmp_path)[row[25]]
    assert (got["t_start_ns"], got["t_end_ns"]) == (a, a + 2_000_000)


def test_never_waited_device_op_completes_through_is_completed(tmp_path):
    rec, clock, dev, t = _rec_with_timer(tmp_path)
    row, tok, done, work = _issue_async(rec, clock, dev, t, 1_000_000)
    rec._service(final=False)
    assert row[19] is None
    clock.advance(2_000_000)
    work.done = True
    seen = clock()
    rec._service(final=False)              # the writer's is_completed() poll
    assert row[19] == seen
    assert rec.inflight_ids() == []


def test_close_reads_device_times_before_releasing_pending_ops(tmp_path):
    rec, clock, dev, t = _rec_with_timer(tmp_path)
    a = clock()
    row, tok, done, work = _issue_async(rec, clock, dev, t, 500_000)
    _wait(dev, t, tok, done)
    clock.advance(1_000_000)               # completed on the device; the writer never polled
    rec.close()
    got = _rows(tmp_path)[row[25]]
    assert (got["t_start_ns"], got["t_end_ns"]) == (a, a + 500_000)


def test_call_that_raises_abandons_its_device_token(tmp_path):
    from commtrace.capture import recorder as R
    from commtrace.capture import wrappers as Wr
    from commtrace.capture.api_table import API_TABLE

    class _PG:
        pass

    pg = _PG()
    Wr._pg_cache[pg] = Wr.PgInfo(pg, "7", 1, [0], "nccl", True)
    rec, clock, dev, t = _rec_with_timer(tmp_path)

    def all_reduce(tensor, op=None, group=None, async_op=False):
        raise RuntimeError("NCCL error: unhandled system error")

    w = Wr.make_wrapper("all_reduce", all_reduce, API_TABLE["all_reduce"])
    R._set_recorder(rec)
    try:
        with pytest.raises(RuntimeError, match="unhandled system error"):
            w(_CudaTensor(), group=pg)
    finally:
        R._set_recorder(None)
        Wr._pg_cache.pop(pg, None)
    assert t.pending() == 0                # the token was abandoned, not left to expire
    rec.close()
    (got,) = _rows(tmp_path).values()
    assert (got["pg"], got["device"], got["bytes"], got["t_end_ns"]) == ("7", "cuda:0", 4096, None)
    assert got["error"] == "RuntimeError: NCCL error: unhandled system error"


def test_disable_undoes_hazards_sync_and_device(monkeypatch):
    import commtrace
    from commtrace.capture import device, hazards, sync

    calls = []
    monkeypatch.setattr(hazards, "uninstall", lambda: calls.append("hazards"))
    monkeypatch.setattr(sync, "uninstall", lambda: calls.append("sync"))
    monkeypatch.setattr(device, "uninstall", lambda: calls.append("device"))
    monkeypatch.setattr(device, "_timer", object())
    commtrace.disable()
    assert calls == ["hazards", "sync", "device"]
    assert device._timer is None


def test_cuda_backend_keeps_stream_objects_by_raw_handle():
    """The CUDA backend reads the current stream's raw handle (cheap) and builds a Stream
    object only for a handle not seen before (torch.cuda.current_stream() cost 8 us per call
    on the GPU check)."""
    b = object.__new__(D._CudaBackend)
    built = []

    class S:
        def __init__(self, d, h):
            self.device_index, self.cuda_stream = d, h

    cur = {"dev": 0, "h": 111}
    b._get_device = lambda: cur["dev"]
    b._raw_stream = lambda d: cur["h"] + d
    b._current_stream = lambda: built.append(1) or S(cur["dev"], cur["h"] + cur["dev"])
    b._streams = {}
    s1 = b.current_stream()
    assert b.current_stream() is s1 and len(built) == 1
    cur["h"] = 222                      # another stream made current (torch.cuda.stream(...))
    s2 = b.current_stream()
    assert (s2.device_index, s2.cuda_stream) == (0, 222) and len(built) == 2
    cur["dev"] = 1                      # another device: its own current stream
    s3 = b.current_stream()
    assert (s3.device_index, s3.cuda_stream) == (1, 223) and len(built) == 3
    cur.update(dev=0, h=111)
    assert b.current_stream() is s1 and len(built) == 3
    b._raw_stream = None                # a torch without the raw read: the public call
    assert b.current_stream().cuda_stream == 111 and len(built) == 4


def test_poll_queries_one_event_per_blocking_op():
    """A blocking op's end is recorded on the stream its start was: the end's completion implies
    the start's (stream order), so the writer queries one event per op, not two (each query
    cost 1.8 us under the GIL on the GPU check's H200)."""
    clock, dev, t = make()
    blocking_op(t, dev, 0, 1_000)
    clock.advance(10_000)
    assert [r[0] for r in t.poll()] == [0]         # (calibrates)
    for i in range(1, 11):
        blocking_op(t, dev, i, 1_000)
    clock.advance(100_000)
    calls = []
    q = t._b.query
    t._b.query = lambda ev: calls.append(ev) or q(ev)
    assert [r[0] for r in t.poll()] == list(range(1, 11))
    assert len(calls) == 10
