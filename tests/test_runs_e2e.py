"""Runs and jobs as users have them (issue 15), on real gloo jobs under `commtrace run`:

* several jobs under one ``-o`` (a shell running two torchrun jobs, pytest running two
  multi-process tests) each get their own run: ``ls`` lists them, ``report D`` exits 2 naming
  them, ``report --run <id>`` gives each job's own counts with no cross-job finding;
* a rank aborting in C++ (a real size mismatch on gloo) is labelled crashed, the mismatch is
  named on the true culprit, and ``job`` says failed with the exit code;
* a live hang: the rank that sits in user code is ``not_joined`` (alive, not "killed or
  crashed"), with its innermost user frame, without anyone sending SIGUSR1;
* Ctrl-C: ``job.state == "interrupted"``;
* two `commtrace run -o D` at the same time each keep their own entry (command, exit code) in
  ``D/_manifest.json``, and a rank's own exit code (``sys.exit(3)``, ``os._exit(4)``) is in
  ``job`` and the text;
* 3 ranks, a real gloo size mismatch whose aborting rank wrote nothing of it: the culprit is
  the true one or ambiguous, never the healthy rank.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, SCRIPTS, clean_env, load_rows, run_plain, run_traced, torchrun_cmd

pytestmark = pytest.mark.slow

CT = [sys.executable, "-m", "commtrace"]


def _ct(*args, timeout=120):
    return subprocess.run([*CT, *map(str, args)], env=clean_env(), capture_output=True, text=True,
                          timeout=timeout)


def _report(path, *args):
    p = _ct("report", path, "--format", "json", *args)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def _line(script, marker) -> int:
    with open(os.path.join(SCRIPTS, script)) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line)


def _kinds(rep):
    return [f["kind"] for f in rep["findings"]]


CROSS = {"collective_mismatch", "not_joined", "clock_violation", "not_completed", "rank_crashed"}


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory):
    """One `commtrace run -o D -- bash -c 'job A; job B'` (5 and 8 all_reduces on 2 ranks) and
    one `commtrace run -o P -- pytest runs_two_tests.py` (two tests, 3 and 7 all_reduces)."""
    base = tmp_path_factory.mktemp("runs")
    d, p = base / "D", base / "P"
    a = " ".join(torchrun_cmd(os.path.join(SCRIPTS, "runs_job.py"), 5, 64))
    b = " ".join(torchrun_cmd(os.path.join(SCRIPTS, "runs_job.py"), 8, 128))
    r1 = run_traced(d, ["bash", "-c", f"{a} && {b}"], timeout=240)
    r2 = run_traced(p, [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(SCRIPTS, "runs_two_tests.py")], timeout=240)
    return d, p, r1, r2


def test_two_jobs_under_one_output_are_two_runs(two_jobs):
    d, p, r1, _ = two_jobs
    assert "2 jobs traced, one run each" in r1.stderr
    for out, counts in ((d, {5 * 2, 8 * 2}), (p, {3 * 2, 7 * 2})):
        ls = _ct("ls", out, "--format", "json")
        assert ls.returncode == 0, ls.stderr
        runs = json.loads(ls.stdout)
        assert len(runs) == 2
        assert all(r["world_size"] == 2 and r["ranks"] == [0, 1] for r in runs)
        assert all(r["job"]["state"] == "completed" and r["size_bytes"] > 0 for r in runs)
        assert len({r["id"] for r in runs}) == 2 and runs[0]["start_ns"] <= runs[1]["start_ns"]
        text = _ct("ls", out)
        assert text.returncode == 0 and all(r["id"] in text.stdout for r in runs)
        assert text.stdout.count("completed") == 2
        # reading the parent without choosing: exit 2, one line naming both runs
        rep = _ct("report", out)
        assert rep.returncode == 2 and rep.stdout == ""
        (line,) = rep.stderr.strip().splitlines()
        assert "holds 2 runs" in line and all(r["id"] in line for r in runs) and "--run" in line
        # each run on its own: its own counts, no finding across jobs
        got = set()
        for r in runs:
            j = _report(out, "--run", r["id"])
            assert j["run_id"] == r["id"] and j["world_size"] == 2 and j["ranks"] == [0, 1]
            assert not CROSS & set(_kinds(j)), j["findings"]
            assert not [w for w in j["warnings"] if "written by" in w]
            assert j["job"] == {"state": "completed", "exit_code": j["job"]["exit_code"],
                                "failed_ranks": [], "signal": None,
                                "ranks_by_state": {"exited": [0, 1]}, "rank_exit_codes": [],
                                "ended_after_trace": False}
            got.add(j["ops"])
        assert got == counts
        latest = _report(out, "--run", "latest")
        assert latest["run_id"] == runs[-1]["id"]
        # the session's exit code belongs to its last job
        assert latest["job"]["exit_code"] == 0


def test_a_parent_of_three_runs_is_not_merged(two_jobs, tmp_path):
    import shutil

    d, p, _, _ = two_jobs
    parent = tmp_path / "traces"
    src = [os.path.join(d, x) for x in sorted(os.listdir(d)) if not x.startswith("_")]
    src += [os.path.join(p, x) for x in sorted(os.listdir(p)) if not x.startswith("_")][:1]
    for i, s in enumerate(src):
        shutil.copytree(s, parent / f"exp{i}" / os.path.basename(s))
    rep = _ct("report", parent)
    assert rep.returncode == 2 and rep.stdout == ""  # no findings printed
    assert "holds 3 runs" in rep.stderr and all(os.path.basename(s) in rep.stderr for s in src)
    for cmd in (["export", parent, "-o", tmp_path / "x.json"], ["diff", parent, parent]):
        r = _ct(*cmd)
        assert r.returncode == 2 and "holds 3 runs" in r.stderr and "Traceback" not in r.stderr
    import commtrace
    from commtrace.format.runs import MultipleRunsError

    with pytest.raises(MultipleRunsError, match="holds 3 runs"):
        commtrace.load(str(parent))
    run = commtrace.load(str(parent), run=os.path.basename(src[2]))
    assert run.run_id == os.path.basename(src[2])
    run.close()


def test_gloo_abort_is_a_crash_and_the_job_failed(tmp_path):
    """Rank 1 passes 2048 elements where the others pass 1024 (6th all_reduce, within 0.5 s of
    start): gloo aborts a peer in C++ (SIGABRT). The mismatch is named on rank 1, the aborting
    rank is `crashed` (its faulthandler dump), never `not_joined ... left no trace`, and the job
    failed with commtrace run's exit code."""
    out = tmp_path / "t"
    p = run_traced(out, torchrun_cmd(os.path.join(SCRIPTS, "runs_abort.py"), nproc=4), check=False,
                   timeout=180)
    assert p.returncode != 0, p.stderr[-3000:]
    crashed = sorted(int(f.split("rank=")[1].split(os.sep)[0])
                     for f in glob.glob(str(out / "*" / "rank=*" / "_crash-*.txt")) if os.path.getsize(f))
    assert crashed, p.stderr[-3000:]
    assert "gloo::EnforceNotMet" in p.stderr  # the C++ abort, not a Python exception
    rep = _report(out)
    line = _line("runs_abort.py", "MISMATCH-LINE")
    mm = [f for f in rep["findings"] if f["kind"] == "collective_mismatch"]
    assert [(f["rank"], f["seq"], f["op"]) for f in mm] == [(1, 5, "all_reduce")], rep["findings"]
    assert "rank 1 passed 2048 elements" in mm[0]["message"]
    assert rep["job"]["state"] == "failed" and rep["job"]["exit_code"] == p.returncode
    assert rep["job"]["signal"] == "SIGABRT" and set(crashed) <= set(rep["job"]["failed_ranks"])
    for r in crashed:
        st = rep["rank_states"][str(r)]
        assert st["state"] == "crashed" and st["signal"] == "SIGABRT"
        assert not [f for f in rep["findings"] if f["kind"] == "not_joined" and f["rank"] == r]
        rc = [f for f in rep["findings"] if f["kind"] == "rank_crashed" and f["rank"] == r]
        assert len(rc) == 1 and rc[0]["evidence"]["signal"] == "SIGABRT"
        assert f"rank {r} crashed (SIGABRT)" in rc[0]["message"]
        assert rc[0]["evidence"]["where"]["line"] == line  # from its crash dump
        assert "Fatal Python error: Aborted" in open(st["crash_file"]).read()
    text = _ct("report", out)
    assert text.returncode == 0 and "left no trace" not in text.stdout
    assert "job: failed (exit code" in text.stdout and "crashed, SIGABRT" in text.stdout


def test_an_abort_after_the_exit_flush_fails_the_job_with_a_complete_trace(tmp_path):
    """Rank 1 aborts after commtrace's exit flush (runs_exit_abort.py: as torch 2.13's gloo abort
    at interpreter exit does, docs/faq.md). The trace holds every op of both ranks, the job is
    failed with the launcher's exit code, no rank is blamed, and the header says the failure
    came after every rank's trace ended normally."""
    out = tmp_path / "t"
    p = run_traced(out, torchrun_cmd(os.path.join(SCRIPTS, "runs_exit_abort.py")), check=False)
    assert p.returncode != 0 and "SIGABRT" in p.stderr, p.stderr[-3000:]
    assert "rank 0 sum 128" in p.stdout and "rank 1 sum 128" in p.stdout   # 4 ones, 5 sums of 2
    rows = [r for r in load_rows(str(out)) if r["kind"] == "op"]
    assert sorted((r["rank"], r["op"]) for r in rows) == [(0, "all_reduce")] * 5 + [(1, "all_reduce")] * 5
    assert all(r["t_end_ns"] is not None for r in rows)
    rep = _report(out)
    assert rep["job"] == {"state": "failed", "exit_code": p.returncode, "failed_ranks": [],
                          "signal": None, "ranks_by_state": {"exited": [0, 1]},
                          "rank_exit_codes": [], "ended_after_trace": True}
    text = _ct("report", out)
    assert text.returncode == 0
    assert f"job: failed (exit code {p.returncode}; every rank's trace ended normally: a rank " \
           "failed after its last write, e.g. torch's abort at interpreter exit, see docs/faq.md)" \
        in " ".join(text.stdout.split())


def _run_bg(out, cmd, opts=()):
    p = subprocess.Popen([*CT, "run", "-o", str(out), *opts, "--", *cmd], env=clean_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(p.stdout), daemon=True).start()
    return p, log


def _wait_for(fn, timeout=60.0, step=0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(step)
    return fn()


def _end(p, out, sig=signal.SIGKILL):
    """End a job: `sig` to every rank (their pids are in their snapshots), then wait."""
    for f in glob.glob(str(out / "*" / "rank=*" / "_inflight.json")):
        try:
            os.kill(int(json.load(open(f))["pid"]), sig)
        except (OSError, ValueError, KeyError):
            pass
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


def test_live_hang_names_the_rank_in_user_code(tmp_path):
    """Rank 2 of 3 sleeps in data_loader_stuck() instead of joining the 4th all_reduce. While
    the job runs: not_joined on rank 2 at seq 3, rank 2 alive (no "killed or crashed"), and its
    innermost user frame, which the waiting ranks' watchdog asked it for (no manual SIGUSR1)."""
    out = tmp_path / "t"
    p, log = _run_bg(out, torchrun_cmd(os.path.join(SCRIPTS, "runs_hang_user.py"), 300, nproc=3),
                     ("--hang-timeout", "1.5", "--flush-interval", "0.5"))
    try:
        stacks = _wait_for(lambda: glob.glob(str(out / "*" / "rank=2" / "stacks-*.txt")), timeout=90)
        assert stacks, "".join(log)[-4000:]
        assert p.poll() is None
        rep = _report(out)
        txt = _ct("report", out)
    finally:
        _end(p, out)
    line = _line("runs_hang_user.py", "STUCK-LINE")
    assert "stacks requested by rank" in open(stacks[0]).read()
    nj = [f for f in rep["findings"] if f["kind"] == "not_joined"]
    assert [(f["rank"], f["pg"], f["seq"], f["op"]) for f in nj] == [(2, "0", 3, "all_reduce")]
    ev = nj[0]["evidence"]
    assert ev["rank_state"] == "alive" and sorted(ev["issued_by"]) == [0, 1]
    assert (ev["where"]["function"], ev["where"]["line"]) == ("data_loader_stuck", line)
    assert f"rank 2 is in data_loader_stuck at {os.path.join(SCRIPTS, 'runs_hang_user.py')}:{line}" \
        in nj[0]["message"]
    assert rep["job"]["state"] == "running" and rep["job"]["exit_code"] is None
    assert rep["ended_early"] == [] and "rank_crashed" not in _kinds(rep)
    assert txt.returncode == 0 and "killed or crashed" not in txt.stdout
    assert "job: running" in txt.stdout and "data_loader_stuck" in txt.stdout


def test_ctrl_c_is_interrupted(tmp_path):
    """SIGINT to `commtrace run` (what Ctrl-C sends it) during training: job.state interrupted."""
    out = tmp_path / "t"
    p, log = _run_bg(out, torchrun_cmd(os.path.join(SCRIPTS, "runs_loop.py")))
    try:
        assert _wait_for(lambda: len(glob.glob(str(out / "*" / "rank=*" / "part-*.parquet"))) >= 2,
                         timeout=90), "".join(log)[-4000:]
        p.send_signal(signal.SIGINT)
        p.wait(timeout=90)
    finally:
        if p.poll() is None:
            _end(p, out)
    # Ctrl-C: the shell's exit code, and the user's interrupt shows no commtrace frame (the
    # recorder's SIGINT handler flushed before the KeyboardInterrupt; issue 14).
    text = "".join(log)
    assert p.returncode == 130, (p.returncode, text[-3000:])
    assert "KeyboardInterrupt" in text and "runs_loop.py" in text, text[-3000:]
    own = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "commtrace") + os.sep
    assert not [ln for ln in text.splitlines() if 'File "' in ln and own in ln], text[-3000:]
    rep = _report(out)
    assert rep["job"]["state"] == "interrupted" and rep["job"]["signal"] == "SIGINT", rep["job"]
    assert rep["ops"] > 2 and "rank_crashed" not in _kinds(rep)
    txt = _ct("report", out)
    assert "job: interrupted" in txt.stdout


@pytest.fixture(scope="module")
def concurrent(tmp_path_factory):
    """Two `commtrace run -o D` started together: a 2-rank job that completes (runs_job.py, 5
    all_reduces) and a 3-rank job whose rank 1 calls sys.exit(3) and rank 2 os._exit(4)."""
    d = tmp_path_factory.mktemp("conc") / "D"
    cmds = {"job": torchrun_cmd(os.path.join(SCRIPTS, "runs_job.py"), 5, 64),
            "exit": torchrun_cmd(os.path.join(SCRIPTS, "runs_exit.py"), nproc=3)}
    ps = {k: subprocess.Popen([*CT, "run", "-o", str(d), "--", *c], env=clean_env(), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
          for k, c in cmds.items()}
    logs = {k: p.communicate(timeout=300)[0] for k, p in ps.items()}
    return d, {k: p.returncode for k, p in ps.items()}, logs


def test_concurrent_invocations_keep_their_own_entries(concurrent):
    d, rc, logs = concurrent
    assert rc == {"job": 0, "exit": 1}, logs
    m = json.load(open(d / "_manifest.json"))
    invs = {os.path.basename(i["command"][-1] if i["command"][-1].endswith(".py") else i["command"][-3]): i
            for i in m["invocations"]}
    assert sorted(invs) == ["runs_exit.py", "runs_job.py"] and m["kind"] == "session"
    assert invs["runs_job.py"]["exit_code"] == 0 and invs["runs_exit.py"]["exit_code"] == 1
    assert all(len(i["runs"]) == 1 and i["end_ns"] for i in invs.values())
    p = _ct("ls", d, "--format", "json")
    assert p.returncode == 0, p.stderr
    runs = {os.path.basename(r["command"][0]): r for r in json.loads(p.stdout)}
    assert sorted(runs) == ["runs_exit.py", "runs_job.py"]
    for name, r in runs.items():
        assert r["id"] == invs[name]["runs"][0] and r["launcher"]["id"] == invs[name]["id"]
        assert r["job"]["exit_code"] == invs[name]["exit_code"] == r["launcher"]["exit_code"]
    assert runs["runs_job.py"]["job"]["state"] == "completed" and runs["runs_job.py"]["world_size"] == 2
    assert runs["runs_exit.py"]["job"]["state"] == "failed" and runs["runs_exit.py"]["world_size"] == 3
    txt = subprocess.run([*CT, "ls", str(d)], env=clean_env(), cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert txt.returncode == 0, txt.stderr
    rows = [ln for ln in txt.stdout.splitlines() if "runs_job.py" in ln or "runs_exit.py" in ln]
    assert len(rows) == 2, txt.stdout
    job_row = next(ln for ln in rows if "runs_job.py" in ln)
    exit_row = next(ln for ln in rows if "runs_exit.py" in ln)
    assert "tests/scripts/runs_job.py 5 64" in job_row and "completed (exit code 0)" in job_row
    assert "failed (exit code 1;" in exit_row


def test_a_ranks_own_exit_code_is_recorded(concurrent):
    """rank 1: sys.exit(3), rank 2: os._exit(4), each in its exit flush; job.failed_ranks and the
    text line name them with their codes."""
    d, rc, logs = concurrent
    run = next(r for r in glob.glob(str(d / "*" / "rank=2")))
    rep = _report(os.path.dirname(run))
    st = rep["rank_states"]
    assert (st["1"]["state"], st["1"]["exit_code"], st["1"].get("via")) == ("exited", 3, "sys.exit"), st
    assert (st["2"]["state"], st["2"]["exit_code"], st["2"].get("via")) == ("exited", 4, "os._exit"), st
    job = rep["job"]
    assert (job["state"], job["exit_code"], job["failed_ranks"]) == ("failed", 1, [1, 2])
    assert job["rank_exit_codes"] == [{"rank": 1, "exit_code": 3}, {"rank": 2, "exit_code": 4}]
    assert rep["ops"] >= 3 * 5  # 4 all_reduces and a barrier on each rank, all written
    txt = _ct("report", os.path.dirname(run))
    assert "job: failed (exit code 1; rank 1 exited with code 3; rank 2 exited with code 4)" in txt.stdout


def test_three_rank_mismatch_never_blames_the_healthy_rank(tmp_path):
    """3 ranks, rank 1 passes 2048 elements where ranks 0 and 2 pass 1024 (runs_abort.py): gloo
    aborts one of the others in C++ (SIGABRT), typically before its call is written. The
    mismatch then names rank 1, or, when the aborted rank's call is unknown and the two others
    split 1 to 1, says the culprit is ambiguous: never rank 0 or 2."""
    out = tmp_path / "t"
    p = run_traced(out, torchrun_cmd(os.path.join(SCRIPTS, "runs_abort.py"), nproc=3), check=False,
                   timeout=180)
    assert p.returncode != 0 and "gloo::EnforceNotMet" in p.stderr, p.stderr[-3000:]
    rep = _report(out)
    crashed = [int(r) for r, s in rep["rank_states"].items() if s["state"] == "crashed"]
    assert crashed and 1 not in crashed, rep["rank_states"]
    mm = [f for f in rep["findings"] if f["kind"] == "collective_mismatch"]
    assert len(mm) == 1 and (mm[0]["seq"], mm[0]["op"]) == (5, "all_reduce"), rep["findings"]
    f = mm[0]
    recorded = sorted(e["rank"] for e in f["evidence"]["entries"])
    if len(recorded) == 2:  # the aborted rank's call was not written: 1 to 1
        assert f["rank"] is None and f["evidence"]["ambiguous"] is True, f
        assert f["evidence"]["culprits"] == [] and f["evidence"]["candidates"] == recorded
        assert 1 in recorded and f["evidence"]["unrecorded"] == crashed
        assert "ambiguous" in f["message"] and f"rank {crashed[0]} (crashed, SIGABRT)" in f["message"]
    else:  # it was written: 2 to 1, rank 1 is the minority
        assert f["rank"] == 1 and f["evidence"]["culprits"] == [1], f
    assert f["rank"] in (1, None)
    txt = _ct("report", out)
    assert txt.returncode == 0 and "collective_mismatch" in txt.stdout
    for healthy in (0, 2):  # no sentence blames a rank that passed the right size
        assert f"rank {healthy} passed 1024 elements (4.1 kB) where" not in " ".join(txt.stdout.split())


@pytest.mark.parametrize("mode, status, exit_", [("caught", 0, {"how": "ok"}),
                                                 ("top", 6, {"how": "exit", "exit_code": 6, "via": "sys.exit"})])
def test_a_caught_sys_exit_is_not_the_exit_code(tmp_path, mode, status, exit_):
    """A sys.exit(5) the script catches is not how the process ended: the exit flush says ok,
    or the code of the sys.exit(6) that did end it."""
    from conftest import free_port

    out = tmp_path / "t"
    p = run_traced(out, [sys.executable, os.path.join(SCRIPTS, "runs_exit_caught.py"), mode, str(free_port())],
                   check=False, timeout=120)
    assert p.returncode == status, p.stderr[-3000:]
    (snap,) = glob.glob(str(out / "*" / "rank=0" / "_inflight.json"))
    assert json.load(open(snap))["exit"] == exit_
    job = _report(out)["job"]
    assert job["state"] == ("completed" if status == 0 else "failed") and job["exit_code"] == status
