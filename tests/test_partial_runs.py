"""Diagnosis of partial runs on synthetic traces whose snapshots say how each rank ended:
`ended_early` (issue 6, "Killed rank": the report says which rank ended early), `not_completed`
and missing ranks. The real SIGKILL run is
tests/test_hang_e2e.py::test_killed_rank_leaves_readable_parts."""

from __future__ import annotations

import json
import os

import commtrace
from commtrace.cli import main
from commtrace.format import schema as S
from commtrace.format import writer as W

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
FLUSH_S = 1.0


def _write_run(path, ranks: dict, world=None):
    """ranks: rank -> (number of all_reduces issued on pg 0, final flag or None for no
    snapshot, snapshot time in ms after T0, seq left pending or None). Op k is entered at
    T0 + 10 k ms and completes 1 ms later."""
    world = world or len(ranks)
    W.write_manifest(str(path), {"world_size": world})
    for r, (n, final, snap_ms, pending) in ranks.items():
        rows = {c: [] for c in ("kind", "rank", "pg", "pg_size", "seq", "op", "api", "t_enqueue_ns",
                                "t_return_ns", "t_end_ns", "site", "op_id", "count", "bytes")}
        for k in range(n):
            done = k != pending
            for c, v in (("kind", "op"), ("rank", r), ("pg", "0"), ("pg_size", world), ("seq", k),
                         ("op", "all_reduce"), ("api", "all_reduce"), ("t_enqueue_ns", T0 + k * 10 * MS),
                         ("t_return_ns", T0 + k * 10 * MS + MS if done else None),
                         ("t_end_ns", T0 + k * 10 * MS + MS if done else None),
                         ("site", f"train.py:{40 + r}"), ("op_id", k + 1), ("count", 4), ("bytes", 16)):
                rows[c].append(v)
        meta = {"rank": r, "world_size": world, "flush_interval_s": FLUSH_S, "pid": 1000 + r,
                "pg_ranks": {"0": list(range(world))}}
        W.write_part(str(path), r, W.rows_to_table(rows), meta, pid=1000 + r, index=1)
        if final is not None:
            ops = [] if pending is None else [{"kind": "op", "rank": r, "pg": "0", "seq": pending,
                                               "op": "all_reduce", "op_id": pending + 1,
                                               "t_enqueue_ns": T0 + pending * 10 * MS, "pending": True}]
            W.atomic_write_text(os.path.join(W.rank_dir(str(path), r), S.INFLIGHT_NAME), json.dumps(
                {"rank": r, "t_ns": T0 + snap_ms * MS, "final": final, "ops": ops}))
    return path


def _early(path):
    run = commtrace.load(str(path))
    try:
        return run.report()["ended_early"]
    finally:
        run.close()


def test_killed_rank_behind_the_others(tmp_path):
    """Rank 1 stopped after 5 collectives without a final flush while ranks 0 and 2 went on to
    seq 9: rank 1 ended early. Rank 2 also has no final flush but did all 10 (torn down with the
    job): not listed."""
    run = _write_run(tmp_path / "r", {0: (10, True, 200, None), 1: (5, False, 45, None),
                                      2: (10, False, 150, None)})
    early = _early(run)
    assert [e["rank"] for e in early] == [1]
    e = early[0]
    assert e["signals"] == ["no_final_flush", "behind"]  # 155 ms: within a flush interval
    assert e["final_flush"] is False
    assert e["last_t_ns"] == T0 + 45 * MS  # the snapshot is later than its last row
    assert e["last_t_s"] == 0.045
    assert e["others_until_ns"] == T0 + 200 * MS
    assert e["last_op"]["seq"] == 4 and e["last_op"]["op"] == "all_reduce"
    assert e["last_op"]["site"] == "train.py:41" and e["last_op"]["t_end_ns"] == T0 + 41 * MS
    assert e["last_completed"]["seq"] == 4
    assert e["behind"] == {"0": {"last_seq": 4, "others_seq": 9, "ranks_ahead": [0, 2]}}
    assert "no exit flush" in e["reason"] and "rank(s) 0, 2 went on to seq 9 on pg 0" in e["reason"]


def test_killed_before_its_first_op_is_listed(tmp_path):
    """Rank 1 left its directory, an empty part and a snapshot without the final flag, and no op
    row (killed before its first collective) while rank 0 went on to seq 4 on pg 0, a group of
    both: it is not one of the report's `ranks` (those are the ranks with ops), but it is
    listed as ended early, behind with no seq of its own (session 25: the property test met
    this case and asked the list to hold only the report's ranks; the design lists it)."""
    run = _write_run(tmp_path / "r", {0: (5, True, 200, None), 1: (0, False, 0, None)})
    r = commtrace.load(str(run))
    try:
        rep = r.report()
    finally:
        r.close()
    assert rep["ranks"] == [0]
    early = rep["ended_early"]
    assert [e["rank"] for e in early] == [1]
    assert early[0]["behind"] == {"0": {"last_seq": None, "others_seq": 4, "ranks_ahead": [0]}}
    assert early[0]["final_flush"] is False and early[0]["last_op"] is None
    assert "its last was none" in early[0]["reason"]


def test_killed_inside_a_collective_the_others_outlived(tmp_path):
    """Every rank entered seq 3; rank 1 (no final flush) went silent 5 s before the others'
    last records: ended early by time alone. The rank is not behind on any group."""
    run = _write_run(tmp_path / "r", {0: (4, True, 5100, 3), 1: (4, False, 100, 3)})
    early = _early(run)
    assert [(e["rank"], e["signals"]) for e in early] == [(1, ["no_final_flush", "outlived"])]
    assert early[0]["behind"] == {} and early[0]["last_op"]["seq"] == 3
    assert early[0]["last_op"]["t_end_ns"] is None  # killed inside it
    assert "other ranks recorded 5 s longer" in early[0]["reason"]


def test_within_one_flush_interval_is_not_early(tmp_path):
    """All ranks killed together (no final flush anywhere): snapshots 0.9 s apart, less than one
    flush interval + slack, and nobody went on: nothing ended early."""
    run = _write_run(tmp_path / "r", {0: (6, False, 1000, None), 1: (6, False, 100, None)})
    assert _early(run) == []


def test_clean_exit_and_hung_ranks_are_not_early(tmp_path):
    """Rank 1 exited through Python after 3 collectives (final snapshot): it is not_joined, not
    ended early. Rank 0 hung in seq 3 and was killed (no final flush) after rank 1 left: the
    others did not go on without it."""
    run = _write_run(tmp_path / "r", {0: (4, False, 30_000, 3), 1: (3, True, 25_000, None)})
    assert _early(run) == []
    rep = commtrace.load(str(run)).report()
    assert [(f["kind"], f["rank"], f["seq"]) for f in rep["findings"] if f["kind"] == "not_joined"] == [
        ("not_joined", 1, 3)]


def test_no_snapshots_no_claim(tmp_path):
    """Traces without _inflight.json (synthetic, other writers) never claim a rank ended early."""
    run = _write_run(tmp_path / "r", {0: (10, None, 0, None), 1: (5, None, 0, None)})
    assert _early(run) == []


def test_cli_json_and_text(tmp_path, capsys):
    run = _write_run(tmp_path / "r", {0: (10, True, 200, None), 1: (5, False, 45, None)})
    assert main(["report", str(run), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [e["rank"] for e in rep["ended_early"]] == [1]
    assert main(["report", str(run), "--steps", "0:1", "--format", "json"]) == 0
    assert [e["rank"] for e in json.loads(capsys.readouterr().out)["ended_early"]] == [1]  # run-wide
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "ended early: rank(s) 1" in out
    assert "rank 1 ended early (last sign of life 45 ms into the run): no exit flush" in out
    assert "last op issued: all_reduce seq 4 on pg 0 at train.py:41" in out


def test_not_completed_names_the_op_every_member_issued(tmp_path, capsys):
    """Both ranks entered all_reduce seq 3 and it never completed (a network or device failure):
    not_completed names it, with how long it was pending at the end of the trace (the last
    snapshot, 500 ms, minus the entry at 30 ms). Nobody is not_joined or ended early."""
    run = _write_run(tmp_path / "r", {0: (4, True, 500, 3), 1: (4, True, 480, 3)})
    rep = commtrace.load(str(run)).report()
    nc = [f for f in rep["findings"] if f["kind"] == "not_completed"]
    assert [(f["rank"], f["pg"], f["seq"], f["op"], f["severity"]) for f in nc] == [
        (0, "0", 3, "all_reduce", "error")]
    assert nc[0]["evidence"]["ranks"] == [0, 1] and nc[0]["evidence"]["pending_ns"] == 470 * MS
    assert nc[0]["t_ns"] == T0 + 30 * MS and nc[0]["site"] in ("train.py:40", "train.py:41")
    assert "issued by every member but never completed on rank(s) 0-1 (470 ms pending" in nc[0]["message"]
    assert not [f for f in rep["findings"] if f["kind"] == "not_joined"] and rep["ended_early"] == []
    assert rep["last_completed"]["0"]["seq"] == 2 and rep["last_completed"]["1"]["seq"] == 2
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "not_completed" in out and "Last completed op per rank" in out


def test_missing_rank_is_reported_by_rank(tmp_path, capsys):
    """World size 3 with no trace of rank 2: missing_ranks, a not_joined warning naming it, and
    the text report's table row."""
    run = _write_run(tmp_path / "r", {0: (3, True, 100, None), 1: (3, True, 100, None)}, world=3)
    rep = commtrace.load(str(run)).report()
    assert rep["world_size"] == 3 and rep["ranks"] == [0, 1] and rep["missing_ranks"] == [2]
    nj = [f for f in rep["findings"] if f["kind"] == "not_joined"]
    assert [(f["rank"], f["seq"], f["severity"]) for f in nj] == [(2, 0, "warning")]
    assert "it left no trace at all" in nj[0]["message"] and rep["ended_early"] == []
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "missing rank(s) 2" in out and "no trace at all" in out
