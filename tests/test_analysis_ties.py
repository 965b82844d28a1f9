"""Ties broken deterministically (issue 17): the last arrival of a collective when several ranks
entered at the same instant is the lowest of them (and no rank's last arrival in the straggler
counts), and the clock's worst violation names the
(pg, seq) of one collective, the lowest collective key among equal violations; whatever the
load order of the parts (``rank=10`` is read before ``rank=2``), the storage arrangement or
the number of threads."""

from __future__ import annotations

import pytest

import commtrace
from commtrace.analysis import loading as L
from commtrace.format import writer as W

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
WORLD = 11
N = 12          # all_reduces per group
TIED = (2, 5, 10)  # enter last, at the same instant, in every collective of group "0"
#: (pg, seq) of the two clock violations of the same size (rank 0 leaves 3 ms before the last
#: entry): separate arg_max of pg and of seq could name ("1", 7) or ("0", 4)
VIOLATIONS = {("0", 7), ("1", 4)}


def _write(path):
    W.write_manifest(str(path), {"world_size": WORLD})
    for r in range(WORLD):
        rows = {c: [] for c in ("kind", "rank", "pg", "pg_size", "seq", "op", "api", "t_enqueue_ns",
                                "t_return_ns", "t_end_ns", "site", "op_id", "count", "bytes", "step")}
        op_id = 0
        for g, pg in enumerate(("0", "1")):
            for k in range(N):
                t = T0 + (g * N + k) * 20 * MS
                enter = t + (5 * MS if r in TIED else r * 100_000)  # the tied ranks come last
                leave = t + 8 * MS
                if (pg, k) in VIOLATIONS and r == 0:
                    leave = t + 2 * MS  # 3 ms before the tied ranks enter
                op_id += 1
                for c, v in (("kind", "op"), ("rank", r), ("pg", pg), ("pg_size", WORLD), ("seq", k),
                             ("op", "all_reduce"), ("api", "all_reduce"), ("t_enqueue_ns", enter),
                             ("t_return_ns", leave), ("t_end_ns", leave), ("site", "train.py:10"),
                             ("op_id", op_id), ("count", 4), ("bytes", 16), ("step", k)):
                    rows[c].append(v)
        meta = {"rank": r, "world_size": WORLD, "pid": 1000 + r,
                "pg_ranks": {"0": list(range(WORLD)), "1": list(range(WORLD))}}
        W.write_part(str(path), r, W.rows_to_table(rows), meta, pid=1000 + r, index=1)


@pytest.fixture(scope="module")
def tie_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("ties") / "run"
    _write(d)
    return str(d)


@pytest.mark.parametrize("how", ["memory", "file", "one-thread"])
def test_ties_pick_the_lowest(tie_run, monkeypatch, how):
    kw = {}
    if how == "file":
        monkeypatch.setattr(L, "DISK_ROWS", 0)
        monkeypatch.setattr(L, "LOAD_CHUNK_ROWS", 50)
    elif how == "one-thread":
        kw["threads"] = 1
    run = commtrace.load(tie_run, **kw)
    try:
        c = run.collectives().to_pylist()
        assert len(c) == 2 * N
        assert {x["last_rank"] for x in c} == {min(TIED)}, sorted({x["last_rank"] for x in c})
        # ...but a tie is nobody's late arrival: the straggler counts leave it out (a run
        # without jitter named a false straggler from the lowest-rank tie break)
        st = {x["rank"]: x["last_count"] for x in run.stragglers().to_pylist()}
        assert len(st) == WORLD and all(v == 0 for v in st.values()), st
        ck = run.clock()
        assert ck["violations"] == len(VIOLATIONS) and ck["max_violation_ns"] == 3 * MS
        assert ck["worst"] == {"pg": "0", "seq": 7}
    finally:
        run.close()
