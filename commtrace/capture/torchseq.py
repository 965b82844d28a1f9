"""Collectives a group issued that commtrace did not record, from torch's own sequence number.

Every c10d backend that numbers its ops (gloo, NCCL; ``ProcessGroup._get_sequence_number_for_
group()``, torch 2.13) adds one to a per-group counter for each collective it issues, whoever
issues it: a wrapped function, DDP's C++ reducer, a compiled graph, a C++ extension, a call to
torch's unwrapped function. gloo counts point-to-point ops too; NCCL does not (its getter
returns ``seqCollective_``). A group starts at 0 when it is created.

Each recorded call claims the numbers it issued, ``(lo, hi]``: ``hi`` is read right after the
call returns; ``lo`` is read before the call where the count is not known (the Python paths,
point-to-point ops, object collectives, coalescing blocks) and is ``hi - 1`` for a plain
collective on the fast paths (one read per op), and for a point-to-point op there on a backend
that numbers each one (``P2P_ONE``: gloo). The recorder keeps, per group, the last number
claimed (``Recorder._tseqs``, by seq slot; shared with the C fast path). A call whose ``lo`` is
past it leaves a gap: the numbers ``last + 1 .. lo`` were issued on this rank by something
commtrace did not see. Each gap is written as a row of kind ``gap`` (docs/trace-format.md):
``count`` = the number of such collectives, ``torch_seq`` = the first of them, ``ref_op_id`` /
``seq`` = the recorded op right after the gap, ``detail`` = ``{"torch_seq_first", "torch_seq_
last", "at"}``. Numbers issued after the last recorded op of a group are found when the group
is destroyed or the recorder closes (``at`` = ``"destroy"`` / ``"close"``, no next op).

Groups with a completion hook (NCCL, ``--completion-hook``) are left to it: their unrecorded ops
are rows of their own (``api="c++"``). Groups whose backend has no number (a Python
``ProcessGroup`` subclass that does not implement it, the ``fake`` backend raising) are not
checked. The numbering is read per call, so two threads issuing on one group at the same time
could be miscounted; torch requires one order of collectives per group on every rank, which
such a program could not guarantee either.
"""

from __future__ import annotations

import json
import sys

from ..format import schema as S
from . import log

#: Backends (``c10d.get_backend``'s name) that number each point-to-point op once, as a
#: collective: a send / recv / isend / irecv on their groups claims (hi - 1, hi] with one read
#: after it (at its wait() on the C path), not a read before it too. gloo does in torch 2.13
#: (tests/test_fidelity_gaps.py asserts it); NCCL numbers no point-to-point op.
P2P_ONE = frozenset({"gloo"})
#: The number of recorded rows of kind "gap" (tests, benchmarks).
n_gaps = 0
#: Config.gap_check of the running recorder (COMMTRACE_GAP_CHECK=0: off, groups not followed).
enabled = True


def read(pg):
    """torch's sequence number of `pg` now, None where the backend has none."""
    try:
        v = int(pg._get_sequence_number_for_group())
    except Exception:
        return None
    return v if v >= 0 else None


class Last:
    """The last torch seq claimed per seq slot (the C module's Counters when built)."""

    def __init__(self):
        self._d: dict = {}

    def get(self, slot):
        return self._d.get(slot, 0)

    def set(self, slot, v):
        self._d[slot] = v


def new_last(seqs=None):
    """A per-recorder table of last claimed numbers, shared with the C path when it is built:
    the pair of the recorder's seq counters `seqs` (one array, a slot's two values side by
    side: one memory line per blocking op for both) where it has one."""
    from .recorder import _cfast

    if _cfast is not None and hasattr(_cfast.Counters, "get"):
        if seqs is not None and hasattr(seqs, "pair"):
            return seqs.pair()
        return _cfast.Counters()
    return Last()


def before(info):
    """The group's number before a call on `info` (None: not checked)."""
    if info is None or not getattr(info, "tseq", False):
        return None
    return read(info.pg)


def after(rec, info, lo, op_id, seq, one: bool = False) -> None:
    """After a recorded call on `info`'s group: claim its numbers, write a gap row if numbers
    before them were not claimed. `lo` is the number read before the call (None with `one`:
    the call issued exactly one). Never raises."""
    try:
        if not getattr(info, "tseq", False) or (lo is None and not one):
            return
        hi = read(info.pg)
        if hi is None:
            return
        if lo is None:
            lo = hi - 1
        last_t = rec._tseqs
        slot = info.seq_slot
        last = last_t.get(slot)
        if lo > last:
            on_gap(rec, info.name, last, lo, op_id, seq)
        if hi > last:
            last_t.set(slot, hi)
    except Exception as e:
        log.warn_once("torchseq", "cannot read torch's sequence number", e)


def on_gap(rec, name, last, lo, op_id=None, seq=None, at: str = "op", origin: str | None = None,
           t0: int | None = None, t1: int | None = None) -> None:
    """Write a ``gap`` row: this rank's group `name` issued torch seqs ``last+1 .. lo`` that no
    recorded call claimed. Called by the C path too (op_id / seq: the recorded op after the gap,
    the C module's None marker as a very negative number). `origin`: the call known to have
    issued them (``at="call"``; e.g. ``"ddp_rebuild_buckets"``), which ran from `t0` to `t1`."""
    global n_gaps
    try:
        from .recorder import IDX, NCOL
        from .wrappers import _pg_by_name

        if op_id is not None and op_id < 0:
            op_id = None
        if seq is not None and seq < 0:
            seq = None
        info = _pg_by_name(name)
        row = [None] * NCOL
        vals = {
            "kind": S.KIND_GAP, "rank": rec.rank, "pg": name,
            "pg_size": info.size if info is not None else None,
            "backend": info.backend if info is not None else None,
            "count": int(lo - last), "torch_seq": int(last + 1), "seq": seq,
            "ref_op_id": op_id, "t_enqueue_ns": rec.now_ns() if t0 is None else t0, "step": rec.step,
            "detail": json.dumps({"torch_seq_first": int(last + 1), "torch_seq_last": int(lo),
                                  "at": at, **({"origin": origin} if origin else {})}),
        }
        if t1 is not None:
            vals["t_return_ns"] = t1
        for k, v in vals.items():
            row[IDX[k]] = v
        rec.append_gap(row)
        n_gaps += 1
    except Exception as e:
        log.warn_once("torchseq-gap", "cannot record unrecorded collectives", e)


def around(rec, info, call, origin: str):
    """Run `call()` (a call of torch's that issues collectives on `info`'s group from C++, such
    as DDP's bucket rebuild) and write the numbers it issued as one ``gap`` row naming it
    (``origin``, ``at="call"``, its start and return times); numbers issued before it that no
    recorded call claimed are a gap row of their own. Returns what `call` returns; only
    `call` may raise."""
    lo = None
    try:
        if enabled and info is not None and getattr(info, "tseq", False):
            lo = read(info.pg)
    except Exception:
        lo = None
    if lo is None:
        return call()
    t0 = rec.now_ns()
    out = call()
    try:
        t1 = rec.now_ns()
        hi = read(info.pg)
        if hi is not None and hi > lo:
            last_t, slot = rec._tseqs, info.seq_slot
            last = last_t.get(slot)
            if lo > last:
                on_gap(rec, info.name, last, lo)
            on_gap(rec, info.name, max(lo, last), hi, at="call", origin=origin, t0=t0, t1=t1)
            last_t.set(slot, hi)
    except Exception as e:
        log.warn_once("torchseq-call", "cannot follow the collectives of a C++ call", e)
    return out


def baseline(rec) -> None:
    """At recorder start: the groups that exist already start from their number now (what
    they issued before commtrace started is not a gap)."""
    try:
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        if c10d is None:
            return
        from .wrappers import pg_info

        for pg in list(c10d._world.pg_names):
            info = pg_info(pg)
            if info is None or not getattr(info, "tseq", False):
                continue
            v = read(pg)
            if v is not None and v > rec._tseqs.get(info.seq_slot):
                rec._tseqs.set(info.seq_slot, v)
    except Exception as e:
        log.warn_once("torchseq-base", "cannot read torch's sequence numbers", e)


def check_end(rec, groups=None, at: str = "close") -> list:
    """Numbers issued after the last recorded op of each group (`groups`: PgInfo list, default
    every group commtrace or torch knows). Returns the groups checked. Never raises."""
    try:
        if groups is None:
            from . import wrappers

            seen = {}
            for info in list(wrappers._pg_cache.values()):
                seen[id(info.pg)] = info
            c10d = sys.modules.get("torch.distributed.distributed_c10d")
            if c10d is not None and c10d._world.default_pg is not None:
                for pg in list(c10d._world.pg_names):
                    if id(pg) not in seen:
                        info = wrappers.pg_info(pg)
                        if info is not None:
                            seen[id(pg)] = info
            groups = list(seen.values())
        for info in groups:
            if info is None or not getattr(info, "tseq", False):
                continue
            hi = read(info.pg)
            if hi is None:
                continue
            last = rec._tseqs.get(info.seq_slot)
            if hi > last:
                on_gap(rec, info.name, last, hi, None, None, at)
                rec._tseqs.set(info.seq_slot, hi)
        return [g for g in groups if g is not None]
    except Exception as e:
        log.warn_once("torchseq-end", "cannot check the last sequence numbers", e)
        return []
