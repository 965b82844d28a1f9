"""Ops issued below Python, from ``ProcessGroup._register_on_completion_hook`` (NCCL).

ProcessGroupNCCL calls a registered hook with a ``WorkInfo`` (``op_type``, ``seq``,
``time_started``, ``time_finished``, ``active_duration``) for every Work it completes, whoever
issued it: commtrace's wrapped functions, DDP's C++ reducer without a comm hook, inductor's
generated code, any C++ caller. commtrace merges those records with its own rows by (group,
sequence number): each wrapped call on a hooked group reads the group's own counter
(``_get_sequence_number_for_group()``, NCCL's ``seqCollective_``) before and after the call and
claims the sequence numbers in between (one for a plain collective, two for an object
collective, ...); point-to-point ops, which NCCL numbers separately (``seqP2P_``, no getter),
are claimed by count. A record nobody claimed becomes a row of its own with ``api="c++"``:
op from ``op_type``, ``torch_seq`` = ``WorkInfo.seq``, ``t_enqueue_ns`` = ``time_started``
(when the Work was created), ``t_end_ns`` = ``time_finished`` (when NCCL's watchdog saw it
complete: an upper bound, ``completion="hook"``), ``detail`` with the device-measured
``active_duration_ns``; no call site, sizes or dtype (WorkInfo has none). On a hooked group the
``seq`` of every collective, wrapped or not, is the group's own number (NCCL's
``seqCollective_``, the same on every member), so that c++ rows match across ranks like the
others; point-to-point rows keep commtrace's per-pair numbering.

Opt-in (``Config.completion_hook``, ``COMMTRACE_COMPLETION_HOOK=1``): NCCL needs
``TORCH_NCCL_ENABLE_TIMING=1`` for it (it records CUDA events around every op), calls the
Python hook on its watchdog thread with the GIL, and torch asks that every group with a hook
be destroyed before the interpreter exits. Groups of other backends refuse the hook (gloo:
"Only ProcessGroupNCCL supports onCompletion hook") and are left alone, quietly.

Records are merged by the writer thread once they are :data:`MERGE_DELAY_S` old, so that the
claim of a wrapped call that has just returned is always in place before its record is looked at.
"""

from __future__ import annotations

import collections
import datetime
import json
import threading
import time
import warnings

from ..format import schema as S
from . import log

#: pg name -> True for groups whose hook is registered (read on every wrapped call: a dict, so
#: that the common case, no hook anywhere, is one falsy check).
HOOKED: dict = {}
#: Records older than this are merged (seconds).
MERGE_DELAY_S = 0.2
#: Claims kept per group at most (a record that never comes must not grow memory forever).
MAX_CLAIMS = 100_000

_enabled = False
_closing = False
_lock = threading.Lock()
_infos: collections.deque = collections.deque(maxlen=1_000_000)
_claimed: dict = {}     # pg name -> set of claimed torch seqs (collectives)
_p2p: dict = {}         # pg name -> count of p2p ops claimed and not yet matched
_facts: dict = {}       # pg name -> (pg_size, backend)
_tried: set = set()     # id() of groups a registration was attempted on (with a ref below)
_tried_refs: list = []

#: WorkInfo.op_type name -> canonical op (commtrace.ops names)
OP_OF = {
    "BROADCAST": "broadcast", "ALLREDUCE": "all_reduce", "ALLREDUCE_COALESCED": "all_reduce",
    "_ALLREDUCE_SPARSE": "all_reduce", "REDUCE": "reduce", "ALLGATHER": "all_gather",
    "_ALLGATHER_BASE": "all_gather", "ALLGATHER_COALESCED": "all_gather", "GATHER": "gather",
    "SCATTER": "scatter", "REDUCE_SCATTER": "reduce_scatter",
    "_REDUCE_SCATTER_BASE": "reduce_scatter", "REDUCE_SCATTER_TENSOR_COALESCED": "reduce_scatter",
    "ALLTOALL_BASE": "all_to_all", "ALLTOALL": "all_to_all", "SEND": "send", "RECV": "recv",
    "RECVANYSOURCE": "recv", "BARRIER": "barrier", "COALESCED": "coalesced",
}
P2P_TYPES = ("SEND", "RECV", "RECVANYSOURCE")


def enable(on: bool = True) -> None:
    """Turn registration on (at recorder start, from ``Config.completion_hook``)."""
    global _enabled, _closing
    _enabled = bool(on)
    _closing = False


def reset() -> None:
    """Forget everything (tests)."""
    global _enabled, _scanned
    _enabled = False
    _scanned = -1
    HOOKED.clear()
    _infos.clear()
    _claimed.clear()
    _p2p.clear()
    _facts.clear()
    _tried.clear()
    _tried_refs.clear()


def seq_of(pg):
    """The group's own sequence number now, None where it has none."""
    try:
        return int(pg._get_sequence_number_for_group())
    except Exception:
        return None


def maybe_register(pg, name: str, size, backend) -> bool:
    """Register the hook on `pg` (once per group) when enabled; True when it is hooked."""
    if name in HOOKED:
        return True
    if not _enabled or id(pg) in _tried:
        return False
    _tried.add(id(pg))
    _tried_refs.append(pg)   # the id stays this group's while commtrace remembers it

    def hook(info, _name=name):
        if _closing:
            return
        try:
            _infos.append((time.monotonic(), _name, info))
        except Exception:
            pass

    try:
        with warnings.catch_warnings():
            # torch warns once that the hook "will be deprecated in favor of Flight Recorder"
            warnings.simplefilter("ignore")
            pg._register_on_completion_hook(hook)
    except Exception as e:
        # gloo and other backends refuse it; NCCL without TORCH_NCCL_ENABLE_TIMING=1 too
        if "TIMING" in str(e):
            log.warn_once(("completion-hook", "timing"), "C++-issued NCCL ops are not recorded: "
                          "the completion hook needs TORCH_NCCL_ENABLE_TIMING=1", None)
        return False
    _facts[name] = (size, backend)
    HOOKED[name] = True
    return True


def claim(name: str, lo, hi, op: str, row=None) -> None:
    """A wrapped call on hooked group `name` issued the group's seqs in (lo, hi] (collectives),
    or one p2p op when none moved."""
    with _lock:
        if lo is not None and hi is not None and hi > lo:
            s = _claimed.setdefault(name, set())
            s.update(range(lo + 1, hi + 1))
            if len(s) > MAX_CLAIMS:
                for x in sorted(s)[: len(s) - MAX_CLAIMS]:
                    s.discard(x)
        elif op in ("send", "recv"):
            _p2p[name] = _p2p.get(name, 0) + 1
    if row is not None and hi is not None:
        from .recorder import I_SEQ, I_TORCH_SEQ

        if lo is not None and op not in ("send", "recv"):
            # On a hooked group a collective's seq is the group's own number (the same on
            # every member): the c++ rows, numbered by NCCL, then match across ranks too. A
            # call that moved no number (queued in a coalescing block, numbered when the
            # block ends) has none: unmatched rather than matched against another op.
            row[I_SEQ] = hi if hi > lo else None
            row[I_TORCH_SEQ] = hi if hi > lo else None
        else:
            row[I_TORCH_SEQ] = hi


def _ns(t, rec=None):
    """WorkInfo times -> epoch ns (the recorder's clock). pybind converts torch's time points by
    their clock: a ``system_clock`` one to a datetime; a ``steady_clock`` one (torch 2.11's
    ProcessGroupNCCL, seen on the GPU check) to a timedelta since the steady clock's epoch, which
    is CLOCK_MONOTONIC (``time.monotonic_ns``) on Linux: mapped onto the wall clock by the
    offset between the two now. Numbers are taken as epoch ns."""
    if t is None:
        return None
    if isinstance(t, (int, float)):
        return int(t)
    if isinstance(t, datetime.timedelta):
        mono = ((t.days * 86400 + t.seconds) * 1_000_000 + t.microseconds) * 1000
        now = rec.now_ns() if rec is not None else time.time_ns()
        return mono + (now - time.monotonic_ns())
    try:
        return int(round(t.timestamp() * 1e6)) * 1000
    except Exception:
        return None


def _dur_ns(d):
    if d is None:
        return None
    if isinstance(d, (int, float)):
        return int(d)
    try:
        return int(round(d.total_seconds() * 1e9))
    except Exception:
        return None


def _op_type_name(ot) -> str:
    n = getattr(ot, "name", None)
    if n is None:
        n = str(ot).rsplit(".", 1)[-1]
    return str(n)


def merge(rec, final: bool = False) -> int:
    """Match the hook's records to claims; append a ``c++`` row for each one nobody claimed.
    Returns the number of rows added. Writer thread; never raises."""
    n = 0
    now = time.monotonic()
    while _infos:
        try:
            t_arr, name, info = _infos[0]
        except IndexError:
            break
        if not final and now - t_arr < MERGE_DELAY_S:
            break
        _infos.popleft()
        try:
            ot = _op_type_name(info.op_type)
            seq = int(info.seq)
            with _lock:
                if ot in P2P_TYPES:
                    if _p2p.get(name, 0) > 0:
                        _p2p[name] -= 1
                        continue
                else:
                    s = _claimed.get(name)
                    if s is not None and seq in s:
                        s.discard(seq)
                        continue
                    if ot == "COALESCED" and _p2p.get(name, 0) > 0:
                        _p2p[name] -= 1   # a batch of p2p ops the wrappers issued
                        continue
            rec.append_row(_row(rec, name, ot, seq, info))
            n += 1
        except Exception as e:
            log.warn_once("completion-hook-merge", "cannot merge a completion record", e)
    return n


def _row(rec, name, ot, seq, info) -> list:
    from .recorder import IDX, NCOL

    size, backend = _facts.get(name, (None, None))
    row = [None] * NCOL
    dur = _dur_ns(getattr(info, "active_duration", None))
    t0 = _ns(getattr(info, "time_started", None), rec)
    t1 = _ns(getattr(info, "time_finished", None), rec)
    vals = {
        "kind": S.KIND_OP, "rank": rec.rank, "pg": name, "pg_size": size,
        "op": OP_OF.get(ot, ot.lower()), "api": "c++", "backend": backend,
        "t_enqueue_ns": t0, "t_end_ns": t1, "completion": "hook" if t1 is not None else None,
        # collectives: NCCL's number is the group's seq on every member; p2p and coalesced
        # Works are numbered apart (seqP2P_) or ambiguously: not matched
        "seq": seq if ot not in P2P_TYPES and ot != "COALESCED" else None,
        "torch_seq": seq, "step": rec.step, "op_id": rec.new_op_id(),
        "detail": json.dumps({"op_type": ot, "active_duration_ns": dur}),
    }
    for k, v in vals.items():
        row[IDX[k]] = v
    return row


_scanned = -1


def scan() -> None:
    """Register on groups torch knows that no wrapped call has used yet (a group only C++ code
    uses). Writer thread; cheap when nothing changed."""
    global _scanned
    if not _enabled:
        return
    try:
        import sys

        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        names = c10d._world.pg_names if c10d is not None else {}
        if len(names) == _scanned:
            return
        _scanned = len(names)
        from . import wrappers

        for pg in list(names):
            if id(pg) not in _tried:
                wrappers.pg_info(pg)
    except Exception as e:
        log.warn_once("completion-hook-scan", "completion hook: cannot list process groups", e)


def closing() -> None:
    """The process is ending: the hook returns at once from now on."""
    global _closing
    _closing = True
