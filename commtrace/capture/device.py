"""Device-side completion clocks: CUDA events around communication ops, read off the hot path.

Why events: on NCCL a blocking call returns once the kernel is *enqueued*, and an async op's
``wait()`` only orders streams, so the host clock says nothing about when a transfer ran. Events
recorded on the caller's current stream do (``shared/reference/metrics.md``, ``t_start_ns`` /
``t_end_ns``):

- ``on_issue``   records event S on the caller's current stream before the op  -> ``t_start_ns``
- ``on_return``  records event E after a blocking op (the stream already waits on the comm
  stream there, so E completes when the transfer does)                        -> ``t_end_ns``
- ``on_wait_begin`` (optional) records event W0 just before ``work.wait()`` and ``on_wait``
  records event W1 right after it. Between W0 and W1 the stream holds nothing but the wait on
  the comm stream, so ``W1 - W0`` is the time the compute stream sat behind the communication
  stream (``stream_wait_ns``, the exposed part of metrics.md "Overlap"), and W1 is ``t_end_ns``
  (the op had finished by then; with ``stream_wait_ns > 0`` it finished exactly then).

Only the writer thread reads events back (:meth:`EventTimer.poll`, non-blocking ``query()``);
the training thread records events and never synchronises. Event times are mapped onto the
host clock through a *calibration*: one event on a private idle stream bracketed by two host
timestamps (``host = midpoint``), taken in the writer thread and renewed every
``calibration_interval_s`` so that drift between the host and device clocks stays bounded.
The writer waits for a calibration event by spinning on ``query()`` for at most 2 ms, never
with ``cudaEventSynchronize``: on a hung device it must stay free to flush the trace.

During CUDA graph capture no event is recorded: the op is counted in
:attr:`EventTimer.graph_captured_ops` (rank metadata ``graph_captured_ops``) and skipped. Ops
*replayed* by a graph never reach Python and are invisible to commtrace. While any graph capture
is in progress the writer thread does not touch CUDA at all, because ``cudaEventQuery`` from
another thread invalidates a capture in the default ``"global"`` capture mode.

The same :class:`EventTimer` runs on a fake layer (:class:`FakeClock`, :class:`FakeDevice`,
:class:`FakeStream`, :class:`FakeEvent`) so that CPU tests assert exact times.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

log = logging.getLogger("commtrace.device")

#: Renew the host<->device calibration this often (seconds). Host and device clocks drift by
#: tens of ppm (more while NTP slews the host clock), i.e. tens of us per second; renewing every
#: second in the writer thread costs three event round trips on an idle stream.
DEFAULT_CALIBRATION_INTERVAL_S = 1.0
#: A newer calibration maps an op only if taken this long before the op's start (see
#: EventTimer._calibration_for): far more than any drift over one interval.
CALIBRATION_MARGIN_NS = 1_000_000
#: Host/device calibration tries; the one with the narrowest host bracket wins.
CALIBRATION_TRIES = 3
#: A calibration event not completed after this long is given up (device busy or hung); the
#: next try comes one calibration interval later.
CALIBRATION_MAX_WAIT_NS = 2_000_000
#: Upper bound on ops tracked at once; beyond it on_issue records nothing (counted in `dropped`).
DEFAULT_MAX_PENDING = 65536
#: An async op never waited is reported without t_end after this long (its events are freed).
DEFAULT_UNWAITED_TIMEOUT_S = 600.0
#: An async op with a completion event (:meth:`EventTimer.on_done`) and no wait() through Python
#: yet is read back this long after its issue, with its completion as its end: DDP's bucket
#: all-reduces, waited by the Reducer in C++. An op waited later than that keeps no
#: ``stream_wait_ns``.
DEFAULT_DONE_GRACE_S = 1.0


class DeviceTimer:
    """Interface between the capture wrappers and a device clock (docs/dev/interfaces.md).

    One per process. The training thread calls ``on_issue`` / ``on_return`` / ``on_wait_begin`` /
    ``on_wait``; the writer thread calls ``poll``. Implementations never raise into the caller.
    """

    #: Ops seen while a CUDA graph was being captured (no events recorded for them).
    graph_captured_ops: int = 0

    def on_issue(self, op_id: int):
        """Before the op: record a start event on the current stream; return a token (or None)."""
        return None

    def on_return(self, token, blocking: bool) -> None:
        """After the call returned: for a blocking op, record the end event."""

    def on_wait_begin(self, token) -> None:
        """Just before ``work.wait()`` of an async op (optional; enables ``stream_wait_ns``)."""

    def on_wait(self, token) -> None:
        """After ``work.wait()`` returned (async ops): record the end event."""

    def on_done(self, token) -> None:
        """In the callback of an async op's future (a CUDA future runs it on streams made to
        wait for the op): record the op's completion, the end of an op whose wait never comes
        through Python (DDP's Reducer waits in C++)."""

    def poll(self) -> list:
        """Ops completed since the last poll: ``(op_id, t_start_ns, t_end_ns, stream_wait_ns)``."""
        return []

    def pending(self) -> int:
        """Number of ops whose device times are not read back yet."""
        return 0

    def stats(self) -> dict:
        """Counters for the rank metadata."""
        return {"graph_captured_ops": self.graph_captured_ops}


# --------------------------------------------------------------------------------------------
# Backends: what EventTimer needs from a device. CUDA and the fake implement the same calls.
# --------------------------------------------------------------------------------------------


class _CudaBackend:
    """torch.cuda behind the small surface EventTimer uses."""

    def __init__(self):
        import torch

        self._torch = torch
        self._Event = torch.cuda.Event
        self._current_stream = torch.cuda.current_stream
        C = torch._C
        self._is_capturing = getattr(C, "_cuda_isCurrentStreamCapturing", None) or \
            torch.cuda.is_current_stream_capturing
        # torch.cuda.Event's methods only add a Python frame over its C base's (or, for
        # record(), a current_stream() call when no stream is given): called on the base
        base = torch.cuda.Event.__mro__[1]
        self._record = getattr(base, "record", None) or torch.cuda.Event.record
        self._query = getattr(base, "query", None) or torch.cuda.Event.query
        self._elapsed = getattr(base, "elapsed_time", None) or torch.cuda.Event.elapsed_time
        self._calib_streams: dict = {}
        # torch.cuda.current_stream() builds a Python Stream per call (8.2 us of the timer's
        # 29 us per blocking op on the GPU check's H200): the raw handle of the current
        # stream is read instead (0.2 us) and its Stream object kept, by (device, handle)
        self._get_device = getattr(C, "_cuda_getDevice", None)
        self._raw_stream = getattr(C, "_cuda_getCurrentRawStream", None)
        self._streams: dict = {}

    def now_ns(self) -> int:
        return time.time_ns()

    def current_stream(self):
        raw_of = self._raw_stream
        if raw_of is None or self._get_device is None:
            return self._current_stream()
        dev = self._get_device()
        key = (dev, raw_of(dev))
        s = self._streams.get(key)
        if s is None:
            s = self._current_stream()
            # the same stream (its handle is what recording an event on it uses); a handle
            # seen again later is that stream or one that reuses it, recorded on the same way
            if (s.device_index, s.cuda_stream) == key and len(self._streams) < 4096:
                self._streams[key] = s
        return s

    def stream_device(self, stream) -> int:
        return stream.device_index

    def is_capturing(self) -> bool:
        return bool(self._is_capturing())

    def new_event(self, device: int):
        return self._Event(enable_timing=True)

    def record(self, event, stream) -> None:
        self._record(event, stream)

    def query(self, event) -> bool:
        return self._query(event)

    def elapsed_ms(self, start, end) -> float:
        return self._elapsed(start, end)

    def calibration_stream(self, device: int):
        s = self._calib_streams.get(device)
        if s is None:
            with self._torch.cuda.device(device):
                s = self._torch.cuda.Stream(device=device)
            self._calib_streams[device] = s
        return s

    def wait_event(self, event, max_ns: int) -> bool:
        """Spin on query() for at most `max_ns` (real time), yielding the GIL between tries.
        Never cudaEventSynchronize: with CUDA_DEVICE_MAX_CONNECTIONS=1 an event on our private
        stream can queue behind a hung NCCL kernel, and a writer thread blocked forever could
        no longer flush the trace that explains the hang."""
        deadline = time.monotonic_ns() + max_ns
        query = event.query
        while not query():
            if time.monotonic_ns() > deadline:
                return False
            time.sleep(0)
        return True


class FakeClock:
    """A host clock under test control (ns)."""

    def __init__(self, t0_ns: int = 1_000_000_000_000):
        self.t = int(t0_ns)

    def __call__(self) -> int:
        return self.t

    def advance(self, ns: int) -> int:
        self.t += int(ns)
        return self.t


class FakeDevice:
    """A device clock: ``device_ns = host_ns + offset_ns`` (change ``offset_ns`` to model drift).

    ``launch_latency_ns`` is the delay between the host enqueuing work and the device starting
    it on an idle stream.
    """

    def __init__(self, clock: FakeClock, index: int = 0, offset_ns: int = 7_000_000_000,
                 launch_latency_ns: int = 0):
        self.clock = clock
        self.index = index
        self.offset_ns = offset_ns
        self.launch_latency_ns = launch_latency_ns
        self.current: FakeStream = FakeStream(self, "default")
        self.events_created = 0

    def device_now(self) -> int:
        return self.clock() + self.offset_ns


class FakeStream:
    """A stream as a time cursor on the device clock: work enqueued runs after earlier work."""

    def __init__(self, device: FakeDevice, name: str = ""):
        self.device = device
        self.name = name
        self.busy_until = 0  # device ns
        self.capturing = False
        self.device_index = device.index

    def _enqueue_point(self) -> int:
        d = self.device
        return max(self.busy_until, d.device_now() + d.launch_latency_ns)

    def launch(self, duration_ns: int) -> int:
        """Enqueue a kernel of `duration_ns`; returns its device end time."""
        self.busy_until = self._enqueue_point() + int(duration_ns)
        return self.busy_until

    def wait_event(self, event: "FakeEvent") -> None:
        """cudaStreamWaitEvent: later work on this stream starts after `event`."""
        if event.device_ns is not None:
            self.busy_until = max(self._enqueue_point(), event.device_ns)

    def synchronize(self) -> None:
        """Block the host until this stream is idle (advances the fake host clock)."""
        d = self.device
        if self.busy_until > d.device_now():
            d.clock.t = self.busy_until - d.offset_ns


class FakeEvent:
    """A timing-enabled event: completes when its stream reaches it."""

    def __init__(self, device: FakeDevice):
        self.device = device
        self.device_ns: int | None = None
        device.events_created += 1

    def record(self, stream: FakeStream) -> None:
        self.device_ns = stream._enqueue_point()
        stream.busy_until = self.device_ns

    def query(self) -> bool:
        return self.device_ns is not None and self.device_ns <= self.device.device_now()

    def elapsed_time(self, end: "FakeEvent") -> float:
        """Milliseconds from this event to `end`, as cudaEventElapsedTime (float)."""
        if not (self.query() and end.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (end.device_ns - self.device_ns) / 1e6

    def synchronize(self) -> None:
        if self.device_ns is not None and self.device_ns > self.device.device_now():
            self.device.clock.t = self.device_ns - self.device.offset_ns


class _FakeBackend:
    """The fake device behind the same surface as :class:`_CudaBackend`."""

    def __init__(self, device: FakeDevice):
        self.device = device
        self._calib = FakeStream(device, "calibration")

    def now_ns(self) -> int:
        return self.device.clock()

    def current_stream(self):
        return self.device.current

    def stream_device(self, stream) -> int:
        return stream.device_index

    def is_capturing(self) -> bool:
        return self.device.current.capturing

    def new_event(self, device: int):
        return FakeEvent(self.device)

    def record(self, event, stream) -> None:
        event.record(stream)

    def query(self, event) -> bool:
        return event.query()

    def elapsed_ms(self, start, end) -> float:
        return start.elapsed_time(end)

    def calibration_stream(self, device: int):
        return self._calib

    def wait_event(self, event, max_ns: int) -> bool:
        """Like the CUDA spin: the host clock advances to the event, or by `max_ns` if later."""
        d = self.device
        if event.device_ns is None:
            return False
        due = event.device_ns - d.offset_ns
        if due - d.clock() > max_ns:
            d.clock.advance(max_ns)
            return False
        if due > d.clock():
            d.clock.t = due
        return True


# --------------------------------------------------------------------------------------------
# The timer
# --------------------------------------------------------------------------------------------


class _Calibration:
    __slots__ = ("index", "device", "event", "host_ns", "bracket_ns")

    def __init__(self, index, device, event, host_ns, bracket_ns):
        self.index = index
        self.device = device
        self.event = event
        self.host_ns = host_ns
        self.bracket_ns = bracket_ns


class _Token:
    __slots__ = ("op_id", "device", "stream", "start", "end", "wait_begin", "blocking",
                 "returned", "calib", "issued_ns", "done", "end_same")

    def __init__(self, op_id, device, stream, start, calib, issued_ns):
        self.op_id = op_id
        self.device = device
        self.stream = stream
        self.start = start
        self.end = None
        self.wait_begin = None
        self.blocking = None
        self.returned = False
        self.calib = calib  # calibration index current at issue (None before the first one)
        self.issued_ns = issued_ns
        self.done = None  # completion event recorded in the future's callback (on_done)
        self.end_same = False  # end recorded on the start's stream: its completion implies start's


class EventTimer(DeviceTimer):
    """Event-based :class:`DeviceTimer` over a backend (CUDA or fake).

    Events are pooled per device: an event goes back to the pool once its time has been read,
    so the number of events ever created is bounded by the ops in flight between two polls
    (at most 3 per op) plus one per calibration in use.
    """

    def __init__(self, backend, clock=None, calibration_interval_s: float =
                 DEFAULT_CALIBRATION_INTERVAL_S, max_pending: int = DEFAULT_MAX_PENDING,
                 unwaited_timeout_s: float = DEFAULT_UNWAITED_TIMEOUT_S,
                 done_grace_s: float = DEFAULT_DONE_GRACE_S):
        self._b = backend
        #: Host clock (ns). The recorder sets its own (`recorder.now_ns`, with injected skew).
        self.clock = clock or backend.now_ns
        self.calibration_interval_ns = int(calibration_interval_s * 1e9)
        self.max_pending = max_pending
        self.unwaited_timeout_ns = int(unwaited_timeout_s * 1e9)
        self.done_grace_ns = int(done_grace_s * 1e9)
        self._lock = threading.Lock()
        self._tokens: "collections.OrderedDict[int, _Token]" = collections.OrderedDict()
        self._pool: dict[int, list] = {}
        self._calibs: dict[int, _Calibration] = {}  # index -> calibration, per device latest last
        self._latest: dict[int, _Calibration] = {}  # device -> latest calibration
        self._calib_seq = 0
        self._calib_tried: dict[int, int] = {}  # device -> host ns of the last attempt
        self.calibration_failures = 0
        self.events_created = 0
        self.graph_captured_ops = 0
        self.dropped = 0
        self.errors = 0
        self._logged = False

    # -- training thread ---------------------------------------------------------------------

    def _acquire(self, device: int):
        free = self._pool.get(device)
        if free:
            return free.pop()
        self.events_created += 1
        return self._b.new_event(device)

    def _release(self, device: int, *events) -> None:
        free = self._pool.setdefault(device, [])
        for ev in events:
            if ev is not None:
                free.append(ev)

    def _fail(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        if not self._logged:
            self._logged = True
            log.warning("commtrace: device timing disabled for some ops (%s: %r)", where, exc)

    def on_issue(self, op_id: int):
        try:
            b = self._b
            if b.is_capturing():
                # Recording timing events into a graph would make them graph nodes, replayed
                # later with no Python to read them: count the op and skip it.
                self.graph_captured_ops += 1
                return None
            if len(self._tokens) >= self.max_pending:
                self.dropped += 1
                return None
            stream = b.current_stream()
            dev = b.stream_device(stream)
            with self._lock:
                ev = self._acquire(dev)
                latest = self._latest.get(dev)
            b.record(ev, stream)
            tok = _Token(op_id, dev, stream, ev, latest.index if latest else None, self.clock())
            with self._lock:
                self._tokens[op_id] = tok
            return tok
        except Exception as e:  # never into user code
            self._fail("on_issue", e)
            return None

    def _record_on(self, tok: _Token):
        with self._lock:
            ev = self._acquire(tok.device)
        self._b.record(ev, tok.stream if tok.stream is not None else self._b.current_stream())
        return ev

    def on_return(self, token, blocking: bool) -> None:
        if token is None:
            return
        try:
            token.blocking = bool(blocking)
            if blocking:
                # Record on the stream current *now* (the caller's), which the blocking op made
                # wait on the comm stream.
                with self._lock:
                    ev = self._acquire(token.device)
                stream = self._b.current_stream()
                self._b.record(ev, stream)
                token.end_same = stream is token.stream
                token.end = ev
            token.returned = True
        except Exception as e:
            self._fail("on_return", e)

    def on_wait_begin(self, token) -> None:
        if token is None or token.blocking or token.end is not None:
            return
        try:
            with self._lock:
                ev = self._acquire(token.device)
            self._b.record(ev, self._b.current_stream())
            if token.wait_begin is not None:  # a second wait(): keep the first
                self._release(token.device, ev)
            else:
                token.wait_begin = ev
        except Exception as e:
            self._fail("on_wait_begin", e)

    def on_wait(self, token) -> None:
        if token is None or token.blocking or token.end is not None:
            return  # blocking ops: their end event is already there; second wait(): ignored
        try:
            with self._lock:
                ev = self._acquire(token.device)
            self._b.record(ev, self._b.current_stream())
            token.end = ev
            token.returned = True
        except Exception as e:
            self._fail("on_wait", e)

    def on_done(self, token) -> None:
        if token is None or token.done is not None or token.blocking:
            return
        try:
            with self._lock:
                ev = self._acquire(token.device)
            # the current stream here is the one the future's callback runs on, made to wait
            # for the op's events (torch's CUDA future): the event completes with the op
            self._b.record(ev, self._b.current_stream())
            token.done = ev
        except Exception as e:
            self._fail("on_done", e)

    def abandon(self, token) -> None:
        """Forget an op whose end will never be recorded (e.g. the call raised)."""
        if token is None:
            return
        with self._lock:
            if self._tokens.pop(token.op_id, None) is not None:
                self._release(token.device, token.start, token.end, token.wait_begin,
                              token.done)

    # -- writer thread -------------------------------------------------------------------------

    def calibrate(self, device: int) -> "_Calibration | None":
        """Pair one event on a private idle stream with the host clock (writer thread only).

        The device stamps the event between two host reads h0 (before recording) and h1 (once
        ``query()`` says it has completed); its host time is taken as the midpoint, so the error
        is at most half the bracket. Best of CALIBRATION_TRIES. Never blocks for more than
        CALIBRATION_MAX_WAIT_NS per try: on a busy or hung device it gives up (returns None,
        the events are dropped, not pooled) and the writer thread carries on.
        """
        b = self._b
        stream = b.calibration_stream(device)
        best = None
        spare = []
        self._calib_tried[device] = self.clock()
        for _ in range(CALIBRATION_TRIES):
            with self._lock:
                ev = self._acquire(device)
            h0 = self.clock()
            b.record(ev, stream)
            if not b.wait_event(ev, CALIBRATION_MAX_WAIT_NS):
                self.calibration_failures += 1
                break  # ev may still complete later: never reuse it
            h1 = self.clock()
            cand = (h1 - h0, (h0 + h1) // 2, ev)
            if best is None or cand[0] < best[0]:
                if best is not None:
                    spare.append(best[2])
                best = cand
            else:
                spare.append(ev)
        with self._lock:
            self._release(device, *spare)
            if best is None:
                return None
            self._calib_seq += 1
            cal = _Calibration(self._calib_seq, device, best[2], best[1], best[0])
            self._calibs[cal.index] = cal
            self._latest[device] = cal
        return cal

    def _to_host(self, cal: _Calibration, ev) -> int:
        return cal.host_ns + round(self._b.elapsed_ms(cal.event, ev) * 1e6)

    def _calibration_for(self, tok: _Token) -> _Calibration:
        """The newest calibration known to precede the op on the device.

        The calibration current at issue was published only after its event completed, so it
        precedes the op's events (elapsed times stay positive). A newer one is preferred (less
        drift) when its host time lies at least CALIBRATION_MARGIN_NS before the op's start as
        mapped by the older one. Ops issued before the first calibration use the latest.
        """
        latest = self._latest[tok.device]
        cal = self._calibs.get(tok.calib) if tok.calib is not None else None
        if cal is None or cal is latest:
            return latest
        t0 = self._to_host(cal, tok.start)
        for newer in sorted((c for c in self._calibs.values()
                             if c.device == tok.device and c.index > cal.index),
                            key=lambda c: c.index, reverse=True):
            if newer.host_ns <= t0 - CALIBRATION_MARGIN_NS:
                return newer
        return cal

    def poll(self) -> list:
        """Read back every op whose events have completed, in issue order (writer thread only).

        Never blocks on an op's events (``query()`` only). Returns
        ``[(op_id, t_start_ns, t_end_ns, stream_wait_ns), ...]`` on the host clock.
        """
        if _graphs.capturing():
            return []  # any CUDA call from this thread could invalidate the capture
        out = []
        try:
            with self._lock:
                toks = list(self._tokens.values())
            if not toks:
                return out
            now = self.clock()
            for dev in {t.device for t in toks}:
                cal = self._latest.get(dev)
                tried = self._calib_tried.get(dev)
                if (cal is None or now - cal.host_ns >= self.calibration_interval_ns) and \
                        (tried is None or now - tried >= self.calibration_interval_ns
                         or (cal is None and now - tried >= CALIBRATION_MAX_WAIT_NS * 50)):
                    self.calibrate(dev)
            q = self._b.query
            done = []
            for tok in toks:
                if tok.device not in self._latest:
                    continue  # no calibration yet (device busy): read it later
                if tok.end is None:
                    if tok.done is not None and now - tok.issued_ns >= self.done_grace_ns:
                        # no wait() through Python: its completion is its end
                        if not (q(tok.done) and q(tok.start)):
                            continue
                        cal = self._calibration_for(tok)
                        out.append((tok.op_id, self._to_host(cal, tok.start),
                                    self._to_host(cal, tok.done), None))
                        done.append(tok)
                        continue
                    if not self._expired(tok, now):
                        continue
                    # Never waited (or the call raised): report its start only, free its events.
                    if not q(tok.start):
                        continue
                    cal = self._calibration_for(tok)
                    out.append((tok.op_id, self._to_host(cal, tok.start), None, None))
                    done.append(tok)
                    continue
                # (stream order: an end on the start's stream completes after the start)
                if not (q(tok.end) and (tok.end_same or q(tok.start))):
                    continue
                if tok.wait_begin is not None and not q(tok.wait_begin):
                    continue
                cal = self._calibration_for(tok)
                t0 = self._to_host(cal, tok.start)
                t1 = self._to_host(cal, tok.end)
                sw = None
                if tok.wait_begin is not None:
                    sw = max(0, round(self._b.elapsed_ms(tok.wait_begin, tok.end) * 1e6))
                out.append((tok.op_id, t0, t1, sw))
                done.append(tok)
            if done:
                with self._lock:
                    for tok in done:
                        self._tokens.pop(tok.op_id, None)
                        self._release(tok.device, tok.start, tok.end, tok.wait_begin,
                                      tok.done)
                    self._prune_calibrations()
        except Exception as e:
            self._fail("poll", e)
        return out

    def _expired(self, tok: _Token, now: int) -> bool:
        """An op with no end event after `unwaited_timeout_s`: an async op never waited, or a
        call that raised before on_return (the wrapper did not call abandon())."""
        return now - tok.issued_ns >= self.unwaited_timeout_ns

    def _prune_calibrations(self) -> None:
        """Return calibration events no pending op refers to (the latest per device stays)."""
        used = {t.calib for t in self._tokens.values()}
        keep = {c.index for c in self._latest.values()}
        for idx in [i for i in self._calibs if i not in used and i not in keep]:
            cal = self._calibs.pop(idx)
            self._release(cal.device, cal.event)

    def pending(self) -> int:
        return len(self._tokens)

    def pooled(self) -> int:
        """Events idle in the pool."""
        return sum(len(v) for v in self._pool.values())

    def stats(self) -> dict:
        return {"graph_captured_ops": self.graph_captured_ops, "events_created": self.events_created,
                "dropped": self.dropped, "errors": self.errors,
                "calibrations": self._calib_seq,
                "calibration_failures": self.calibration_failures,
                "device_timer": "python"}


class CudaTimer(EventTimer):
    """EventTimer on torch.cuda (timing-enabled events on the caller's current stream)."""

    def __init__(self, clock=None, **kw):
        super().__init__(_CudaBackend(), clock=clock, **kw)


class FakeTimer(EventTimer):
    """EventTimer on the fake device layer, for CPU tests."""

    def __init__(self, device: FakeDevice, **kw):
        super().__init__(_FakeBackend(device), clock=device.clock, **kw)
        self.device = device


# --------------------------------------------------------------------------------------------
# The timer in C (commtrace/capture/_devtimer.c): the same logic, no Python frame per call
# --------------------------------------------------------------------------------------------

try:
    from . import _devtimer as _cdt
except Exception:  # not built (no compiler at install): EventTimer
    _cdt = None

#: The CUDA driver functions the C timer calls, in the order _devtimer.Timer takes them; each
#: name's later entries are fallbacks for older or newer drivers.
CUDA_DRIVER_FUNCTIONS = (
    ("cuEventCreate",),
    ("cuEventRecord",),
    ("cuEventQuery",),
    ("cuEventElapsedTime_v2", "cuEventElapsedTime"),
    ("cuStreamIsCapturing",),
    ("cuCtxGetCurrent",),
    ("cuCtxSetCurrent",),
    ("cuStreamCreate",),
)
#: The same for ``api="runtime"`` (``COMMTRACE_DEVICE_TIMER_API=runtime``): the CUDA runtime
#: torch loaded (libcudart), the calls torch's own events make.
CUDA_RUNTIME_FUNCTIONS = (
    ("cudaEventCreateWithFlags",),
    ("cudaEventRecord",),
    ("cudaEventQuery",),
    ("cudaEventElapsedTime_v2", "cudaEventElapsedTime"),
    ("cudaStreamIsCapturing",),
    ("cudaGetDevice",),
    ("cudaSetDevice",),
    ("cudaStreamCreateWithFlags",),
)


def _loaded_cudart() -> str:
    """The path of the CUDA runtime library this process has loaded (torch's), from
    /proc/self/maps."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.rstrip("\n").split(None, 5)[-1]
            if "/libcudart.so" in path:
                return path
    raise RuntimeError("no libcudart in this process (torch links the CUDA runtime statically?)")


#: Ops on devices whose name starts with this are timed by the device timer (wrappers.py,
#: funcol.py and the C fast path read it; tests time "cpu" ops on the fake layer through
#: :func:`set_timed_device_prefix`).
TIMED_DEVICE_PREFIX = "cuda"


def set_timed_device_prefix(prefix: str) -> None:
    """Time ops on devices named `prefix`... (tests; the default is "cuda"), on the Python
    path and the C fast path alike."""
    global TIMED_DEVICE_PREFIX
    TIMED_DEVICE_PREFIX = prefix
    _share_c_api()


def _share_c_api() -> None:
    """Hand the C timer's API to the C fast path (blocking ops on a timed device stay there)."""
    try:
        from . import recorder

        cf = recorder._cfast
        if cf is not None and hasattr(cf, "set_devtimer_api"):
            cf.set_devtimer_api(_cdt._C_API if c_timer_available() else None,
                                TIMED_DEVICE_PREFIX)
    except Exception as e:
        log.warning("commtrace: C fast path without the device timer (%r)", e)


def c_timer_available() -> bool:
    """Whether the C device timer is built and not turned off (``COMMTRACE_PURE_PYTHON=1`` or
    ``COMMTRACE_DEVICE_TIMER_C=0``)."""
    import os

    if _cdt is None:
        return False
    if os.environ.get("COMMTRACE_PURE_PYTHON", "") not in ("", "0"):
        return False
    return os.environ.get("COMMTRACE_DEVICE_TIMER_C", "1") not in ("0", "false", "no", "off")


class _HandleBackend:
    """A backend of Python objects (the fake layer) behind integer handles, for the C timer:
    each object gets one handle for its life here (kept alive by this table)."""

    def __init__(self, backend):
        self.b = backend
        self._objs: dict = {}
        self._ids: dict = {}

    def __getattr__(self, name):   # the backend's own attributes (tests: ``_calib``)
        return getattr(self.b, name)

    def _h(self, obj) -> int:
        h = self._ids.get(id(obj))
        if h is None:
            h = len(self._objs) + 1
            self._objs[h] = obj
            self._ids[id(obj)] = h
        return h

    def obj(self, h: int):
        return self._objs[h]

    def current_stream(self) -> int:
        return self._h(self.b.current_stream())

    def stream_device(self, h: int) -> int:
        return self.b.stream_device(self._objs[h])

    def is_capturing(self) -> bool:
        return self.b.is_capturing()

    def new_event(self, device: int) -> int:
        return self._h(self.b.new_event(device))

    def record(self, ev: int, stream: int) -> None:
        self.b.record(self._objs[ev], self._objs[stream])

    def query(self, ev: int) -> bool:
        return self.b.query(self._objs[ev])

    def elapsed_ms(self, a: int, b: int) -> float:
        return self.b.elapsed_ms(self._objs[a], self._objs[b])

    def calibration_stream(self, device: int) -> int:
        return self._h(self.b.calibration_stream(device))

    def wait_event(self, ev: int, max_ns: int) -> bool:
        return self.b.wait_event(self._objs[ev], max_ns)


#: A calibration of the C timer as EventTimer's _Calibration reads (its ``_calibs`` / ``_latest``)
_CalibView = collections.namedtuple("_CalibView", "index device event host_ns bracket_ns")


if _cdt is not None:
    class CEventTimer(_cdt.Timer):
        """:class:`EventTimer` in C (``_devtimer.Timer``): the same calls, rows and counters.

        on_issue / on_return / on_wait_begin / on_wait / on_done are C calls on the training
        thread; :meth:`poll` queries events with the GIL released (CUDA), so the writer's
        read-back no longer holds the GIL the training thread needs when its op returns.
        """

        def __init__(self, backend=None, fns=None, get_device=None, raw_stream=None,
                     clock=None, calibration_interval_s: float = DEFAULT_CALIBRATION_INTERVAL_S,
                     max_pending: int = DEFAULT_MAX_PENDING,
                     unwaited_timeout_s: float = DEFAULT_UNWAITED_TIMEOUT_S,
                     done_grace_s: float = DEFAULT_DONE_GRACE_S, api: str = "driver"):
            super().__init__(backend, fns, get_device, raw_stream, clock,
                             int(calibration_interval_s * 1e9), max_pending,
                             int(unwaited_timeout_s * 1e9), int(done_grace_s * 1e9),
                             self._log_failure, api)
            self.api = api

        @staticmethod
        def _log_failure(where, message):
            log.warning("commtrace: device timing disabled for some ops (%s: %s)", where,
                        message)

        def stats(self) -> dict:
            """Counters for the rank metadata (EventTimer's keys), and which timer ran."""
            d = super().stats()
            d["device_timer"] = "c" if getattr(self, "api", "driver") == "driver" else "c-runtime"
            return d

        def poll(self) -> list:
            if _graphs.capturing():
                return []  # any CUDA call from this thread could invalidate the capture
            return self._poll()

        def _views(self):
            return [(_CalibView(i, d, ev, h, b), latest)
                    for i, d, ev, h, b, latest in self.calibrations()]

        @property
        def _calibs(self) -> dict:
            """index -> calibration (EventTimer's ``_calibs``; tests)."""
            return {c.index: c for c, _ in self._views()}

        @property
        def _latest(self) -> dict:
            """device -> latest calibration (EventTimer's ``_latest``; tests)."""
            return {c.device: c for c, latest in self._views() if latest}

    class FakeCTimer(CEventTimer):
        """The C timer on the fake device layer, for CPU tests."""

        def __init__(self, device: "FakeDevice", **kw):
            super().__init__(backend=_HandleBackend(_FakeBackend(device)), clock=device.clock,
                             **kw)
            self.device = device

    class CudaCTimer(CEventTimer):
        """The C timer on CUDA: driver-API events on the stream torch reports as current."""

        def __init__(self, clock=None, api: str | None = None, **kw):
            """`api`: "driver" (libcuda's cuEvent*, the default) or "runtime" (the libcudart
            torch loaded: cudaEvent*, as torch's own events); default from
            ``COMMTRACE_DEVICE_TIMER_API``."""
            import ctypes
            import os

            import torch

            api = api or os.environ.get("COMMTRACE_DEVICE_TIMER_API", "driver").strip() or \
                "driver"
            if api not in ("driver", "runtime"):
                raise ValueError(f"COMMTRACE_DEVICE_TIMER_API must be driver or runtime, not "
                                 f"{api!r}")

            C = torch._C
            get_device = getattr(C, "_cuda_getDevice", None)
            raw_stream = getattr(C, "_cuda_getCurrentRawStream", None)
            if get_device is None or raw_stream is None:
                raise RuntimeError("this torch has no _cuda_getCurrentRawStream")
            if api == "runtime":
                torch.cuda.init()   # (libcudart is loaded with torch's CUDA library)
                lib = ctypes.CDLL(_loaded_cudart())
            else:
                lib = ctypes.CDLL("libcuda.so.1")
            fns = []
            for names in (CUDA_RUNTIME_FUNCTIONS if api == "runtime" else CUDA_DRIVER_FUNCTIONS):
                for name in names:
                    f = getattr(lib, name, None)
                    if f is not None:
                        fns.append(ctypes.cast(f, ctypes.c_void_p).value)
                        break
                else:
                    raise RuntimeError(f"{lib._name} has no {names[0]}")
            super().__init__(fns=tuple(fns), get_device=get_device, raw_stream=raw_stream,
                             clock=clock, api=api, **kw)
            self._lib = lib
else:  # pragma: no cover - the C module is built wherever a compiler is
    CEventTimer = FakeCTimer = CudaCTimer = None


# --------------------------------------------------------------------------------------------
# CUDA graph capture guard: knows, from any thread, whether a capture is in progress.
# --------------------------------------------------------------------------------------------


class _GraphGuard:
    """Wraps ``torch.cuda.CUDAGraph.capture_begin`` / ``capture_end`` to count live captures,
    so that the writer thread keeps off CUDA while one runs (global capture mode forbids
    ``cudaEventQuery`` from other threads)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._active = 0
        self._originals: dict = {}

    def capturing(self) -> bool:
        return self._active > 0

    def install(self, graph_cls=None) -> bool:
        if graph_cls is None:
            try:
                import torch

                graph_cls = torch.cuda.CUDAGraph
            except Exception:
                return False
        with self._lock:
            if graph_cls in self._originals:
                return True
            begin = graph_cls.__dict__.get("capture_begin")
            end = graph_cls.__dict__.get("capture_end")
            if begin is None or end is None:
                return False
            guard = self

            def capture_begin(self, *a, **k):
                with guard._lock:
                    guard._active += 1
                try:
                    return begin(self, *a, **k)
                except BaseException:
                    with guard._lock:
                        guard._active -= 1
                    raise

            def capture_end(self, *a, **k):
                try:
                    return end(self, *a, **k)
                finally:
                    with guard._lock:
                        guard._active = max(0, guard._active - 1)

            capture_begin.__wrapped__ = begin
            capture_end.__wrapped__ = end
            self._originals[graph_cls] = (begin, end)
            graph_cls.capture_begin = capture_begin
            graph_cls.capture_end = capture_end
        return True

    def uninstall(self) -> None:
        with self._lock:
            for cls, (begin, end) in self._originals.items():
                cls.capture_begin = begin
                cls.capture_end = end
            self._originals.clear()
            self._active = 0


_graphs = _GraphGuard()


def install(graph_cls=None) -> bool:
    """Install the graph-capture guard on ``torch.cuda.CUDAGraph`` (or `graph_cls`, for tests);
    idempotent. Called by :func:`get_device_timer`."""
    return _graphs.install(graph_cls)


def graph_capture_active() -> bool:
    """Whether a CUDA graph capture begun through ``CUDAGraph.capture_begin`` is in progress."""
    return _graphs.capturing()


def uninstall() -> None:
    """Restore ``CUDAGraph.capture_begin`` / ``capture_end``."""
    _graphs.uninstall()


_timer: DeviceTimer | None = None
_timer_lock = threading.Lock()


def get_device_timer(device_type: str, clock=None) -> DeviceTimer | None:
    """The process's device timer for `device_type` ("cuda"), None off CUDA or when unavailable.

    The first call creates a :class:`CudaTimer` (with host clock `clock`, e.g. the recorder's
    ``now_ns``) and installs the graph-capture guard; later calls return the same timer.
    """
    global _timer
    if device_type != "cuda":
        return None
    if _timer is not None:
        if clock is not None:
            _timer.clock = clock
        return _timer
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except Exception:
        return None
    with _timer_lock:
        if _timer is None:
            try:
                _timer = None
                if c_timer_available():
                    try:
                        _timer = CudaCTimer(clock=clock)
                    except Exception as e:
                        log.warning("commtrace: C device timer unavailable, using Python (%r)", e)
                if _timer is None:
                    _timer = CudaTimer(clock=clock)
                install()
            except Exception as e:
                log.warning("commtrace: CUDA event timing unavailable (%r)", e)
                return None
    return _timer


def reset_device_timer() -> None:
    """Drop the process's timer (tests, or `commtrace.disable()`)."""
    global _timer
    with _timer_lock:
        _timer = None


# --------------------------------------------------------------------------------------------
# Optional cross-check: ProcessGroupNCCL's own timing.
# --------------------------------------------------------------------------------------------

#: Setting this before the process group is created makes ProcessGroupNCCL record its own
#: start/end events around every op; ``Work._get_duration()`` then returns the op's duration in
#: ms. Known cost: with ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (Megatron-style) the extra events on
#: the NCCL stream can serialise it with compute and break comm/compute overlap, so commtrace
#: never turns it on itself.
NCCL_TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"


def nccl_timing_enabled(environ=None) -> bool:
    """Whether ProcessGroupNCCL's own timing was requested in the environment."""
    import os

    environ = os.environ if environ is None else environ
    return environ.get(NCCL_TIMING_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def nccl_duration_ms(work) -> float | None:
    """ProcessGroupNCCL's own duration of a completed op in ms (cross-check), None if unknown.

    Needs ``TORCH_NCCL_ENABLE_TIMING=1`` and a completed Work; gloo raises "This Backend doesn't
    support getDuration", which gives None here.
    """
    try:
        d = float(work._get_duration())
    except Exception:
        return None
    return d if d >= 0 else None
