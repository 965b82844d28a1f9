"""The overview's analysis (commtrace.analysis.overview) and the findings catalogue, on the
committed sample traces: values against the report JSON and against docs/findings.md."""

from __future__ import annotations

import os
import re

import pytest

import commtrace
from conftest import ROOT

DATA = os.path.join(ROOT, "tests", "data")


def _doc_fixes() -> dict[str, str]:
    """kind -> the **Fix:** paragraph of its section in docs/findings.md (whitespace folded)."""
    with open(os.path.join(ROOT, "docs", "findings.md")) as f:
        txt = f.read()
    out = {}
    for sec in re.split(r"^### ", txt, flags=re.M)[1:]:
        head, body = sec.split("\n", 1)
        if not head.startswith("`"):  # not a finding's section ("The host model", ...)
            continue
        m = re.search(r"\*\*Fix:\*\*(.*?)(?:\n\s*\n|\n## |\Z)", body, re.S)
        assert m, head
        for kind in re.findall(r"`(\w+)`", head):
            out[kind] = " ".join(m.group(1).split())
    return out


def test_fix_texts_are_the_docs():
    """One source: each card's fix is the docs' Fix paragraph, word for word, for every kind."""
    from commtrace.analysis.catalogue import CATALOGUE
    from commtrace.analysis.findings import KINDS
    docs = _doc_fixes()
    assert set(CATALOGUE) == set(KINDS) == set(docs)
    for kind, e in CATALOGUE.items():
        assert " ".join(e.fix.split()) == docs[kind], kind
        assert e.meaning.endswith(".") and e.title


def _assert_close(a, b, path="overview"):
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for k in a:
            _assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), path
    else:
        assert a == b, path


@pytest.fixture(scope="module")
def straggler():
    run = commtrace.load(os.path.join(DATA, "straggler"))
    yield run
    run.close()


def test_report_carries_the_overview(straggler):
    from commtrace.analysis.overview import overview
    rep = straggler.report()
    ov = rep["overview"]
    # the same function (float sums in DuckDB may add in another order: equal to 1e-9)
    _assert_close(ov, commtrace.analysis.report._clean(overview(straggler)))
    h = ov["headline"]
    assert h["world_size"] == 4 and h["steps"] == 17 and h["duration_s"] == pytest.approx(rep["duration_s"])
    w = h["run"]
    assert w["compute"] + w["exposed_comm"] + w["wait"] == pytest.approx(1.0)
    assert w["exposed_s"] == pytest.approx(sum(r["exposed_s"] for r in rep["per_rank"]))
    assert w["wait_s"] == pytest.approx(sum(r["wait_s"] for r in rep["per_rank"]))
    for s in h["per_step"]:
        assert s["compute"] + s["exposed_comm"] + s["wait"] == pytest.approx(1.0)
    assert ov["finding_counts"] == rep["finding_counts"]
    # the health strip is per_rank, the straggler flagged
    assert [r["wait_s"] for r in ov["health"]] == [r["wait_s"] for r in rep["per_rank"]]
    assert [r["rank"] for r in ov["health"] if r["flag"] == "straggler"] == [1]


def test_straggler_card_has_cost_site_fix_and_evidence(straggler):
    from commtrace.analysis.catalogue import CATALOGUE
    from commtrace.analysis.overview import cards
    c = cards(straggler)[0]
    f = straggler.findings()[0]
    assert c["kind"] == "straggler" and c["rank"] == 1 and c["site"] == f.site == "ddp.py:120"
    # the root-cause analysis' cost where it gives one, else the finding's impact
    want = f.cost_s if getattr(f, "cost_s", None) is not None else f.impact_ns / 1e9
    assert c["cost_s"] == pytest.approx(want) and c["fix"] == CATALOGUE["straggler"].fix
    assert c["gain_s"] == getattr(f, "gain_s", None)
    dur = (straggler.t_max_ns - straggler.t_min_ns) / 1e9
    assert c["share"] == pytest.approx(c["cost_s"] / (dur * 4))
    # "show on timeline": the straggler's first late collectives, the first one selected
    ev = c["evidence"]
    coll = {(r["pg"], r["seq"]): r for r in straggler.collectives().to_pylist()}
    sel = coll[(ev["pg"], ev["seq"])]
    assert sel["last_rank"] == 1 and ev["t0_ns"] <= sel["first_enter_ns"] and sel["last_leave_ns"] <= ev["t1_ns"]
    late = sorted((r for r in coll.values() if r["last_rank"] == 1 and r["complete"] and not r["first_of_pg"]),
                  key=lambda r: r["first_enter_ns"])[:3]
    assert ev["t0_ns"] == late[0]["first_enter_ns"] and ev["t1_ns"] == max(r["last_leave_ns"] for r in late)


def test_job_state_from_the_manifest(straggler):
    from commtrace.analysis.overview import job_state
    now = straggler.t_max_ns
    assert job_state(straggler, {"end_ns": 2, "exit_code": 0}, {}, now)["state"] == "completed"
    assert job_state(straggler, {"end_ns": 2, "exit_code": 143}, {}, now)["state"] == "interrupted"
    assert job_state(straggler, {"end_ns": 2, "exit_code": 1}, {}, now)["state"] == "failed"
    fresh = {0: {"t_ns": now - 10**9, "final": False, "ops": []}}
    assert job_state(straggler, {}, fresh, now)["state"] == "running"
    # stale a minute later, never flushed at exit: the report's verdict (one source,
    # analysis/job.py): rank 0 died without an exit flush
    stale = job_state(straggler, {}, fresh, now + 60 * 10**9)
    assert (stale["state"], stale["failed_ranks"]) == ("failed", [0])


def test_live_status_names_the_rank_that_has_not_joined():
    """The committed hang sample (rank 2 never issued all_reduce seq 40 on pg 0) seen as a live
    job: snapshots with the others pending in seq 40 for 5 s name rank 2."""
    from commtrace.analysis.overview import live_status
    run = commtrace.load(os.path.join(DATA, "hang"))
    try:
        f = next(f for f in run.findings() if f.kind == "not_joined")
        now = run.t_max_ns + 5 * 10**9
        snaps = {r: {"rank": r, "t_ns": now - 10**8, "final": False,
                     "ops": [{"kind": "op", "op": "all_reduce", "pg": "0", "seq": 40, "t_enqueue_ns": run.t_max_ns}]}
                 for r in (0, 1, 3)}
        snaps[2] = {"rank": 2, "t_ns": now - 10**8, "final": False, "ops": []}
        st = live_status(run, {"manifest": {}, "snapshots": snaps}, now)
        assert st["hang"]["rank"] == f.rank == 2 and st["hang"]["seq"] == 40 and st["hang"]["waiting"] == [0, 1, 3]
        assert st["hang"]["for_s"] == pytest.approx(5.0)
        by = {r["rank"]: r for r in st["ranks"]}
        assert by[0]["op"] == "all_reduce" and by[0]["seq"] == 40 and by[0]["for_s"] == pytest.approx(5.0)
        assert by[2]["op"] is None and by[2]["no_progress_s"] > 4.5
        assert st["job"]["state"] == "running"
    finally:
        run.close()
