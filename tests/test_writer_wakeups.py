"""The writer thread wakes only when something is due (issue 20), counted by its own counters
(``Recorder.writer_stats``) over a number of its timed flushes, on a real 2-rank gloo job
(tests/scripts/writer_wakeups.py, flush interval 0.5 s):

- nothing pending (blocking ops only): one wake-up per flush, none in between (it woke 4 times
  a second before, 20 with ops pending, 1,000 with a Work to poll);
- async ops pending (unwaited, complete through their future): a look every IDLE_WAKE_S, no
  polling, and every op is written;
- gloo's isend / irecv Works: gloo completes them in wait() only (is_completed() stays False
  after the peer has received the data: checked on the installed torch), so the writer does
  not poll them (it polled them 1,000 times a second before, never seeing one end);
- a Work without a future that does end by itself (``--async-completion wait``): polled every
  POLL_INTERVAL_S until it is seen complete, before its wait, and no longer.

The guarantees (flush interval, SIGKILL loss, in-flight snapshot, bounded memory, held
unwaited ops) have their own tests (test_capture_signals.py, test_hang*.py,
test_partial_runs.py, test_bounded_capture.py, test_capture_recorder.py, test_robustness*.py),
unchanged."""

from __future__ import annotations

import os

import pytest

from commtrace.capture import recorder as R
from conftest import ROOT, load_rows, run_job_results

SCRIPT = os.path.join(ROOT, "tests", "scripts", "writer_wakeups.py")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return run_job_results(tmp_path_factory, "wakeups", SCRIPT)


def test_nothing_pending_one_wakeup_per_flush(job):
    _, res = job
    for r in (0, 1):
        for phase in ("idle", "idle_after"):
            c = res[r][phase]
            assert c["flushes"] >= 2, (r, phase, c)
            # asleep from flush to flush: each wake-up is a flush (+1: the window's edge)
            assert c["wakeups"] <= c["flushes"] + 1, (r, phase, c)
            assert c["polls"] == 0 and c["rung"] == 0, (r, phase, c)


def test_pending_ops_looked_at_every_idle_wake_and_all_written(job):
    out, res = job
    per_flush = res[0]["interval_s"] / res[0]["idle_wake_s"]   # 2 looks per flush interval
    rows = [x for x in load_rows(out) if x["kind"] == "op" and x["op"] == "all_reduce"
            and x["async_op"]]
    for r in (0, 1):
        # asleep until its next flush, the writer was rung by the first op that became
        # pending (its pending listener), then not again while ops stayed pending
        assert res[r]["deep_before_first_op"] is True
        assert res[r]["first_op"]["rung"] == 1, res[r]["first_op"]
        c = res[r]["pending"]
        assert c["rung"] == 0, (r, c)
        assert c["flushes"] >= 2 and c["polls"] == 0, (r, c)
        assert c["services"] >= c["flushes"], (r, c)
        assert c["wakeups"] <= c["flushes"] * (per_flush + 1) + 2, (r, c)
        # every async all_reduce of the phase is in the trace, with its end from its future
        mine = [x for x in rows if x["rank"] == r
                and res[r]["pending_t0_ns"] <= x["t_enqueue_ns"] <= res[r]["pending_t1_ns"]]
        assert len(mine) == res[r]["pending_issued"] > 10, (r, len(mine))
        assert all(x["t_end_ns"] is not None and x["t_end_ns"] >= x["t_enqueue_ns"]
                   and x["completion"] in ("callback", "observed") for x in mine)
    assert res[0]["pending_issued"] == res[1]["pending_issued"]


def test_gloo_p2p_works_end_only_in_wait_and_are_not_polled(job):
    out, res = job
    one, zero = res[1], res[0]
    # The planted truth: rank 0 received all 8 tensors (values checked there) before rank 1
    # looked, yet none of rank 1's isend Works reads complete until its wait() (recorder.
    # WAIT_ONLY: if this fails, this torch completes them by itself and they should be polled)
    assert one["p2p_completed_before_wait"] == [False] * 8
    assert one["p2p_completed_after_wait"] == [True] * 8
    assert zero["p2p_received_ns"] < one["p2p_t_wait_ns"]
    assert ("gloo", "send") in R.WAIT_ONLY and ("gloo", "recv") in R.WAIT_ONLY
    # so the writer does not poll them, nor is it woken for them
    assert one["p2p"]["polls"] == 0 and one["p2p"]["rung"] == 0, one["p2p"]
    sends = [x for x in load_rows(out) if x["kind"] == "op" and x["op"] == "send"
             and x["rank"] == 1]
    assert len(sends) == 8
    assert all(x["async_op"] and x["completion"] == "wait"
               and x["t_end_ns"] >= one["p2p_t_wait_ns"] for x in sends)


def test_a_pollable_work_is_polled_until_seen_complete_before_its_wait(job):
    out, res = job
    one, zero = res[1], res[0]
    assert one["poll_value"] == zero["poll_value"] == 2.0
    rows = [x for x in load_rows(str(out) + "_wait") if x["kind"] == "op"
            and x["op"] == "all_reduce"]
    mine = [x for x in rows if x["rank"] == 1 and x["async_op"]]
    assert len(mine) == 1, rows
    x = mine[0]
    # seen complete by a poll: after rank 0 joined, before rank 1's wait
    assert x["completion"] == "observed", x
    assert zero["poll_t_join_ns"] <= x["t_end_ns"] < one["poll_t_wait_ns"] <= x["t_wait_ns"]
    c = one["poll"]
    assert c["polls"] >= 1, c
    # no longer than it was in flight (one poll per POLL_INTERVAL_S at most, then none)
    in_flight_polls = (x["t_end_ns"] - x["t_enqueue_ns"]) / 1e9 / one["poll_interval_s"]
    assert c["polls"] <= in_flight_polls + 20, (c, in_flight_polls)
