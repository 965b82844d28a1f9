"""The findings catalogue as data: per finding kind, a title, the one-sentence meaning and the
fix, for the dashboard's cards (and any other front end).

One source with ``docs/findings.md``: the **Fix:** paragraph of each kind's section there is the
``fix`` text here, word for word (``tests/test_dashboard_numbers.py::test_fix_texts_are_the_docs``
parses the page and compares). Edit both together. Import-light: no pyarrow, no duckdb.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """What a finding kind means and what to do about it (`fix` is Markdown: `code` spans)."""

    kind: str
    title: str
    meaning: str
    fix: str


_ENTRIES = (
    Entry("not_joined", "A rank never joined a collective (hang culprit)",
          "A member rank never issued a collective that the other members issued: they wait in it "
          "until the timeout.",
          "look at what the culprit did after its last completed op (its stack dump): a data-dependent "
          "branch that skips a collective, an exception swallowed on one rank, an early "
          "`return`/`break`, a rank stuck in I/O."),
    Entry("rank_crashed", "A rank's process died",
          "A rank's process ended without finishing the job (a fatal signal, killed, or an uncaught "
          "exception) while its peers went on or waited for it.",
          "read its crash file (the stacks at the signal) and the job's log; a C++ abort on a "
          "collective usually follows a `collective_mismatch` (sizes or ops that differ across ranks)."),
    Entry("not_completed", "An op never completed",
          "An op was issued by every member but never completed: no completion, no returned wait().",
          "the peer side of the op (its rank's `last_completed` and stacks); transport errors in the "
          "rank's log; timeouts (`TORCH_NCCL_*`/gloo timeout) to turn hangs into errors."),
    Entry("collective_mismatch", "Ranks disagree on a collective",
          "For one collective (pg, seq) the ranks passed a different op, dtype or size.",
          "the culprit's call site: a rank-dependent shape, a different code path (e.g. a bucket layout "
          "that differs across ranks), collectives issued in a different order."),
    Entry("use_before_wait", "Tensor read before wait()",
          "The host read the buffer of an async op that was not waited yet: the value may be stale.",
          "call `work.wait()` (or `fut.wait()`) before reading the tensor, or read a copy taken before "
          "the collective."),
    Entry("straggler", "Straggler rank",
          "One rank arrives last at collectives far more often than chance, and the others wait for it.",
          "what the rank does between collectives (data loading, logging, an extra evaluation, a slower "
          "GPU or host, an unbalanced shard)."),
    Entry("late_sender", "Late sender",
          "A receiver waited for a send that its peer posted late.",
          "balance the stages; post receives early (`irecv` before the compute)."),
    Entry("late_receiver", "Late receiver",
          "A blocking sender waited for a receive that its peer posted late.",
          "balance the stages; post receives early (`irecv` before the compute)."),
    Entry("sync_while_inflight", "synchronize() while communication is in flight",
          "A device synchronize drained every stream while async communication was in flight, so it "
          "could not overlap.",
          "remove the synchronize, or move it after the `wait()`s; time with CUDA events instead."),
    Entry("redundant_sync", "Redundant synchronize()",
          "A synchronize() right after wait() drains the device for nothing.",
          "drop the synchronize; `work.wait()` already orders the streams."),
    Entry("clock_violation", "Clock alignment is wrong",
          "After clock alignment some collectives complete on a rank before another rank entered them: "
          "cross-host wait figures are not trustworthy.",
          "make sure every rank recorded `clock_offset_ns` (capture runs the alignment at "
          "`init_process_group`); check NTP/PTP on the hosts."),
    Entry("wait_immediately", "wait() right after an async op",
          "An async op was waited right after the issue: it bought no overlap.",
          "issue early, do independent work, wait late; or use the blocking call and save the "
          "bookkeeping."),
    Entry("first_op_init_stall", "First op stalls on set-up",
          "The first op on a group blocked the host much longer than the later ones: lazy "
          "communicator or connection set-up.",
          "warm communicators up before timing (a small collective / `batch_isend_irecv` at start-up), "
          "or exclude the first step from measurements."),
)

#: kind -> :class:`Entry`, for every kind of :data:`commtrace.analysis.findings.KINDS`.
CATALOGUE: dict[str, Entry] = {e.kind: e for e in _ENTRIES}


def entry(kind: str) -> Entry:
    """The catalogue entry of a finding kind (a neutral one for a kind added since)."""
    return CATALOGUE.get(kind) or Entry(kind, kind.replace("_", " "), "", "see docs/findings.md")
