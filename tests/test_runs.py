"""Run directories without a job (issue 15): picking a run under a parent, version-1 traces,
job and rank states from snapshots and crash files, and the two-writers conflict."""

from __future__ import annotations

import glob
import json
import os
import shutil
import time

import pytest

import commtrace
from commtrace.cli import main
from commtrace.format import runs as RUNS
from commtrace.format import schema as S
from commtrace.format.runs import MultipleRunsError


DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.fixture
def parent(tmp_path):
    """A directory holding three copies of the `clean` fixture as runs, at two depths."""
    p = tmp_path / "traces"
    for i, rel in enumerate(("a", "b", os.path.join("x", "c"))):
        shutil.copytree(os.path.join(DATA, "clean"), p / rel)
        m = json.loads((p / rel / S.MANIFEST_NAME).read_text())
        m["start_ns"] = 1_000 + i  # c is the latest
        (p / rel / S.MANIFEST_NAME).write_text(json.dumps(m))
    return p


def test_resolve_picks_or_refuses(parent):
    assert [RUNS.label(str(parent), r) for r in RUNS.find_runs(str(parent))] == ["a", "b", "x/c"]
    with pytest.raises(MultipleRunsError) as e:
        RUNS.resolve(str(parent))
    assert e.value.exit_code == 2 and "holds 3 runs (a, b, x/c)" in str(e.value)
    assert "\n" not in str(e.value) and "--run <id|latest>" in str(e.value)
    assert RUNS.resolve(str(parent), "latest") == str(parent / "x" / "c")
    assert RUNS.resolve(str(parent), "b") == str(parent / "b")
    assert RUNS.resolve(str(parent / "a")) == str(parent / "a")  # a run directory is itself
    assert RUNS.resolve(str(parent / "x")) == str(parent / "x" / "c")  # the one run below
    with pytest.raises(commtrace.CommtraceError, match="no such run"):
        RUNS.resolve(str(parent), "zzz")


def test_report_on_a_parent_exits_2_with_one_line(parent, capsys):
    assert main(["report", str(parent)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "holds 3 runs" in err
    assert main(["report", str(parent), "--run", "b", "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["path"] == str(parent / "b") and rep["ops"] > 0
    assert main(["ls", str(parent), "--format", "json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in runs] == ["a", "b", "x/c"]
    assert all(r["world_size"] == 4 and r["ranks"] == [0, 1, 2, 3] for r in runs)


def test_version1_traces_still_load():
    """The committed fixtures are schema-v1 run directories (no run id): they load as before."""
    import pyarrow.parquet as pq

    clean = os.path.join(DATA, "clean")
    part = sorted(glob.glob(os.path.join(clean, "rank=0", "*.parquet")))[0]
    assert pq.read_schema(part).metadata[S.META_SCHEMA_VERSION] == b"1" and S.SCHEMA_VERSION == 3
    run = commtrace.load(clean)
    try:
        assert run.run_id is None and run.world_size == 4 and run.ranks == [0, 1, 2, 3]
        rep = run.report()
        assert rep["ops"] > 0 and rep["run_id"] is None and rep["trace_schema"] == 3
        assert rep["job"]["state"] == "unknown" and rep["job"]["exit_code"] is None
    finally:
        run.close()


def _snap(d, rank, **kw):
    snap = {"rank": rank, "t_ns": time.time_ns(), "final": False, "ops": [], "flush_interval_s": 0.5}
    snap.update(kw)
    p = d / f"rank={rank}" / S.INFLIGHT_NAME
    p.write_text(json.dumps(snap))
    return p


def test_rank_and_job_states(tmp_path):
    """Fresh snapshot: alive (running). Stale: killed (failed). Final with an exception: failed.
    A crash file names the signal. A final SIGINT exit without a launcher: interrupted."""
    from commtrace.analysis.job import describe, job_state, rank_states
    from commtrace.format import reader as R

    d = tmp_path / "run"
    shutil.copytree(os.path.join(DATA, "clean"), d)
    for r in range(4):
        _snap(d, r, final=True, exit={"how": "ok"})
    rf = R.scan_run(str(d))
    assert job_state(rf, 4)["state"] == "completed"
    _snap(d, 2)  # rewritten now, not final: alive
    rf = R.scan_run(str(d))
    assert rank_states(rf, 4)[2]["state"] == "alive"
    assert job_state(rf, 4)["state"] == "running"
    old = time.time() - 60
    os.utime(_snap(d, 2, t_ns=int(old * 1e9)), (old, old))  # stale: died without an exit flush
    (d / "rank=1" / "_crash-77.txt").write_text("Fatal Python error: Segmentation fault\n\n"
                                                 "Current thread 0x00007f00 (most recent call first):\n"
                                                 '  File "/x/torch/nn/m.py", line 9 in forward\n'
                                                 '  File "/home/u/train.py", line 40 in step\n'
                                                 '  File "/home/u/train.py", line 80 in <module>\n')
    rf = R.scan_run(str(d))
    st = rank_states(rf, 4)
    assert (st[1]["state"], st[1]["signal"], st[2]["state"]) == ("crashed", "SIGSEGV", "killed")
    job = job_state(rf, 4)
    assert (job["state"], job["failed_ranks"], job["signal"]) == ("failed", [1, 2], "SIGSEGV")
    assert describe(job).startswith("job: failed (rank 1 crashed, SIGSEGV; rank 2 died without")
    from commtrace.analysis.job import innermost_user_frame

    w = innermost_user_frame(str(d / "rank=1" / "_crash-77.txt"))
    assert (w["function"], w["line"], w["file"]) == ("step", 40, "/home/u/train.py")
    for r in (1, 2):
        for f in glob.glob(str(d / f"rank={r}" / "_crash-*")):
            os.unlink(f)
        _snap(d, r, final=True, exit={"how": "signal", "signal": "SIGINT", "exit_code": 130})
    job = job_state(R.scan_run(str(d)), 4)
    assert (job["state"], job["signal"]) == ("interrupted", "SIGINT")


def test_two_writers_of_one_rank_warn_and_draw_no_cross_rank_finding(tmp_path):
    """The `mismatch` fixture with rank 2's parts copied under another pid into rank 3: rank 3
    was written by two processes. The warning stays; no collective_mismatch/not_joined names it."""
    d = tmp_path / "run"
    shutil.copytree(os.path.join(DATA, "mismatch"), d)
    rep0 = commtrace.load(str(d)).report()
    assert any(3 in ([f["rank"]] + (f["evidence"].get("culprits") or [])) for f in rep0["findings"]
               if f["kind"] == "collective_mismatch"), rep0["findings"]
    import pyarrow.parquet as pq

    for f in sorted(glob.glob(str(d / "rank=3" / "*.parquet"))):
        t = pq.read_table(f)
        meta = json.loads(t.schema.metadata[S.META_JSON])
        meta["pid"] = 4242
        t = t.replace_schema_metadata({S.META_SCHEMA_VERSION: b"1", S.META_JSON: json.dumps(meta).encode()})
        pq.write_table(t, f.replace("part-10003", "part-4242"))
    run = commtrace.load(str(d))
    rep = run.report()
    assert [w for w in rep["warnings"] if "rank 3 was written by 2 processes" in w]
    involved = [f for f in rep["findings"] if f["kind"] in ("collective_mismatch", "not_joined",
                                                             "clock_violation", "straggler")
                and (f["rank"] == 3 or 3 in (f["evidence"].get("culprits") or [])
                     or 3 in (f["evidence"].get("ranks") or []))]
    assert involved == []
    run.close()


def test_live_poll_and_report_give_one_verdict(tmp_path):
    """The dashboard's live poll (overview.job_state on what poll_run re-read) and the report
    (Run.job on a fresh load) give the same job verdict at every stage of a job, from one
    function (analysis/job.py), including a rank's own exit code (sys.exit(3))."""
    from commtrace.analysis.overview import job_state as live_job
    from commtrace.format.reader import poll_run

    d = tmp_path / "run"
    shutil.copytree(os.path.join(DATA, "clean"), d)
    for r in range(4):
        _snap(d, r)
    loaded = commtrace.load(str(d))  # loaded while running; the live view polls from here on

    def both():
        live = live_job(loaded, poll=poll_run(str(d)))
        run = commtrace.load(str(d))
        try:
            rep = run.job()
        finally:
            run.close()
        assert (live["state"], live["failed_ranks"], live["exit_code"], live["signal"]) == \
            (rep["state"], rep["failed_ranks"], rep["exit_code"], rep["signal"])
        return rep

    try:
        assert both()["state"] == "running"
        for r in (0, 2, 3):
            _snap(d, r, final=True, exit={"how": "ok"})
        _snap(d, 1, final=True, exit={"how": "exit", "exit_code": 3, "via": "sys.exit"})
        job = both()
        assert (job["state"], job["failed_ranks"], job["rank_exit_codes"]) == \
            ("failed", [1], [{"rank": 1, "exit_code": 3}])
        from commtrace.analysis.job import describe

        assert describe(job) == "job: failed (exit code 3; rank 1 exited with code 3)"
        assert live_job(loaded, poll=poll_run(str(d)))["detail"] == "exit code 3; rank 1 exited with code 3"
        old = time.time() - 60
        os.utime(_snap(d, 2, t_ns=int(old * 1e9)), (old, old))  # stale, no exit flush: killed
        (d / "rank=3" / "_crash-9.txt").write_text("Fatal Python error: Aborted\n")
        job = both()
        assert (job["state"], job["failed_ranks"], job["signal"]) == ("failed", [1, 2, 3], "SIGABRT")
    finally:
        loaded.close()


def _hammer(out, worker, n):
    for k in range(n):
        RUNS.record_invocation(out, {"id": f"w{worker}-{k}", "start_ns": k, "runs": []})
        RUNS.record_invocation(out, {"id": f"w{worker}-{k}", "end_ns": 1, "exit_code": worker})


def test_invocations_accumulate_under_a_lock(tmp_path):
    """Six processes each add and then complete 15 invocations in one output directory's
    manifest at the same time: none is lost, each keeps its own exit code; a manifest written
    before `invocations` existed reads as one invocation; a run finds its own invocation by the
    id in its manifest, else by the runs listed."""
    import multiprocessing as mp

    out = str(tmp_path / "D")
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=_hammer, args=(out, w, 15)) for w in range(6)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(120)
        assert p.exitcode == 0
    m = json.loads(open(os.path.join(out, S.MANIFEST_NAME)).read())
    invs = {i["id"]: i for i in m["invocations"]}
    assert len(invs) == 90 and m["kind"] == "session"
    assert all(invs[f"w{w}-{k}"]["exit_code"] == w and invs[f"w{w}-{k}"]["end_ns"] == 1
               for w in range(6) for k in range(15))
    assert RUNS.forget_invocation(out, "w0-0")["invocations"][0]["id"] != "w0-0"
    # a run's own invocation
    RUNS.record_invocation(out, {"id": "A", "start_ns": 10, "command": ["a"], "end_ns": 20,
                                 "exit_code": 0, "runs": ["r1"]})
    RUNS.record_invocation(out, {"id": "B", "start_ns": 30, "command": ["b"], "runs": []})
    for rid, own in (("r1", {}), ("r2", {"session": "B", "start_ns": 31}), ("r3", {"start_ns": 32})):
        os.makedirs(os.path.join(out, rid))
        if own:
            json.dump(own, open(os.path.join(out, rid, S.MANIFEST_NAME), "w"))
    assert RUNS.session_manifest(os.path.join(out, "r1"))["command"] == ["a"]
    assert RUNS.session_manifest(os.path.join(out, "r2"))["command"] == ["b"]
    assert RUNS.session_manifest(os.path.join(out, "r3"))["id"] == "B"  # older writer, B running
    legacy = tmp_path / "L"
    (legacy / "r9").mkdir(parents=True)
    (legacy / S.MANIFEST_NAME).write_text(json.dumps({"kind": "session", "command": ["x"], "exit_code": 4,
                                                      "end_ns": 5, "runs": ["r9"]}))
    assert RUNS.session_manifest(str(legacy / "r9"))["exit_code"] == 4
    RUNS.record_invocation(str(legacy), {"id": "new", "start_ns": 9, "runs": []})
    m = json.loads((legacy / S.MANIFEST_NAME).read_text())
    assert [i.get("exit_code") for i in m["invocations"]] == [4, None]
    assert m["start_ns"] == 9 and "exit_code" not in m  # the top level: the latest invocation's
    assert RUNS.session_manifest(str(legacy / "r9"))["exit_code"] == 4
