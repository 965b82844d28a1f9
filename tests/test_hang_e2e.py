"""End-to-end hang diagnosis (issue 6 acceptance): a real 2-rank gloo job under commtrace run
where rank 1 skips the 6th all_reduce; watchdog dump, SIGUSR1 on a rank blocked in gloo, SIGTERM
after 25 s, and the report naming rank 1 not_joined at seq 5."""

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

from conftest import SCRIPTS, clean_env, run_path, torchrun_cmd
from test_hang import _stacks, _wait_for

pytestmark = pytest.mark.slow  # multi-process hang runs (issue 14: CI's slow stage)


def _hang_line() -> int:
    with open(os.path.join(SCRIPTS, "hang_skip.py")) as f:
        return next(i for i, line in enumerate(f, 1) if "HANG-LINE" in line)


def test_hang_end_to_end(tmp_path):
    """Rank 1 of 2 skips the 6th all_reduce; the job is ended with SIGTERM 25 s after start.
    The watchdog (timeout 5 s) has dumped rank 0's stacks and flushed before; SIGUSR1 dumps a
    rank blocked inside gloo; the report names rank 1 not_joined at seq 5."""
    out = tmp_path / "t"
    cmd = [sys.executable, "-m", "commtrace", "run", "-o", str(out), "--hang-timeout", "5",
           "--", *torchrun_cmd(os.path.join(SCRIPTS, "hang_skip.py"))]
    t_start = time.monotonic()
    p = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    log_lines: list[str] = []
    reader = threading.Thread(target=lambda: log_lines.extend(p.stdout), daemon=True)
    reader.start()
    try:
        hang_files = _wait_for(lambda: _stacks(run_path(out)), timeout=40, step=0.2)
        assert hang_files, "".join(log_lines)[-4000:]
        # SIGUSR1 to rank 0 while its main thread is blocked inside gloo
        pid = _rank_pid(run_path(out), 0)
        os.kill(pid, signal.SIGUSR1)
        assert _wait_for(lambda: len(_stacks(run_path(out))) == 2, timeout=10), "".join(log_lines)[-4000:]
        time.sleep(max(0.0, 25 - (time.monotonic() - t_start)))
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:  # a failed assertion: end the job the way torchrun expects
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=45)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    reader.join(5)
    log = "".join(log_lines)
    assert rc != 0
    assert f"trace of 2 rank(s) written to {out}" in log, log[-3000:]
    assert "in flight for" in log and "possible hang" in log  # the watchdog's one line

    line = _hang_line()
    where = f'hang_skip.py", line {line} in <module>'
    hang_text, usr1_text = (open(f).read() for f in _stacks(run_path(out)))
    if "SIGUSR1" in hang_text:
        hang_text, usr1_text = usr1_text, hang_text
    assert "--hang-timeout 5 s" in hang_text
    assert f"all_reduce seq 5 on pg 0 at {SCRIPTS}/hang_skip.py:{line}" in hang_text
    assert where in hang_text and where in usr1_text and "SIGUSR1 received" in usr1_text
    # rank 1 was not in a collective: the watchdog of rank 0 asked it for its stacks (issue 15)
    (req,) = _stacks(run_path(out), rank=1)
    req_text = open(req).read()
    assert "stacks requested by rank 0" in req_text and "all_reduce seq 5 on pg 0" in req_text

    rp = subprocess.run([sys.executable, "-m", "commtrace", "report", str(out), "--format", "json"],
                        env=clean_env(), capture_output=True, text=True, timeout=120)
    assert rp.returncode == 0, rp.stderr
    rep = json.loads(rp.stdout)
    nj = [f for f in rep["findings"] if f["kind"] == "not_joined"]
    assert [(f["rank"], f["pg"], f["seq"], f["op"]) for f in nj] == [(1, "0", 5, "all_reduce")]
    assert nj[0]["evidence"]["waiting"] == [0]
    assert rep["last_completed"]["1"]["seq"] == 4 and rep["last_completed"]["0"]["seq"] == 4
    # rank 0 hung and rank 1 was stopped with the job: neither ended early
    assert rep["ended_early"] == [], rep["ended_early"]
    assert sorted(os.path.basename(f) for f in rep["stacks"]["0"]) == sorted(
        os.path.basename(f) for f in _stacks(run_path(out)))
    txt = subprocess.run([sys.executable, "-m", "commtrace", "report", str(out)],
                         env=clean_env(), capture_output=True, text=True, timeout=120)
    assert txt.returncode == 0 and "not_joined" in txt.stdout and "Traceback" not in txt.stderr
    assert "Last completed op per rank" in txt.stdout and "stacks of rank 0: " in txt.stdout


def _rank_pid(run_dir, rank) -> int:
    import pyarrow.parquet as pq

    parts = sorted(glob.glob(os.path.join(str(run_dir), f"rank={rank}", "*.parquet")))
    return int(json.loads(pq.read_schema(parts[-1]).metadata[b"commtrace.meta"])["pid"])


def test_killed_rank_leaves_readable_parts(tmp_path):
    """Rank 1 is SIGKILLed after 20 all_reduces: its parts stay readable, its snapshot is not
    final (it never flushed at exit), and the report names it as the rank that stopped: not_joined
    at seq 20 with its last completed op seq 19."""
    out = tmp_path / "t"
    p = subprocess.run([sys.executable, "-m", "commtrace", "run", "-o", str(out), "--flush-interval",
                        "0.2", "--", *torchrun_cmd(os.path.join(SCRIPTS, "hang_killed.py"))],
                       env=clean_env(), capture_output=True, text=True, timeout=150)
    assert p.returncode != 0 and f"trace of 2 rank(s) written to {out}" in p.stderr, p.stderr[-3000:]
    assert "rank 1 killing itself" in p.stdout
    import commtrace

    run = commtrace.load(str(out))
    assert run.ranks == [0, 1] and not [w for w in run.warnings if "corrupt" in w]
    ops1 = run.ops(ranks=[1]).to_pylist()
    assert sorted(r["seq"] for r in ops1) == list(range(20))  # everything before the kill
    snap1 = json.load(open(os.path.join(run_path(out), "rank=1", "_inflight.json")))
    snap0 = json.load(open(os.path.join(run_path(out), "rank=0", "_inflight.json")))
    assert snap1["final"] is False and snap0["final"] is True
    rep = run.report()
    # a rank that died is labelled as such (issue 15), not as a non-joiner
    assert [f for f in rep["findings"] if f["kind"] == "not_joined"] == []
    rc_ = [f for f in rep["findings"] if f["kind"] == "rank_crashed"]
    assert [(f["rank"], f["seq"], f["evidence"]["rank_state"]) for f in rc_] == [(1, 20, "killed")]
    assert rep["job"]["state"] == "failed" and rep["job"]["failed_ranks"] == [1]
    assert rep["job"]["exit_code"] == p.returncode
    assert rep["last_completed"]["1"]["seq"] == 19
    assert "hang_killed.py:" in rep["last_completed"]["1"]["site"]
    # the report says which rank ended early, and why
    assert [e["rank"] for e in rep["ended_early"]] == [1], rep["ended_early"]
    e = rep["ended_early"][0]
    assert e["final_flush"] is False and e["signals"][:2] == ["no_final_flush", "behind"]
    assert e["behind"] == {"0": {"last_seq": 19, "others_seq": 20, "ranks_ahead": [0]}}
    assert e["last_op"]["seq"] == 19 and e["last_op"]["t_end_ns"] is not None
    assert e["last_t_ns"] >= e["last_op"]["t_end_ns"] and e["last_t_ns"] <= e["others_until_ns"]
    txt = subprocess.run([sys.executable, "-m", "commtrace", "report", str(out)],
                         env=clean_env(), capture_output=True, text=True, timeout=120)
    assert txt.returncode == 0 and "Traceback" not in txt.stderr
    assert "ended early: rank(s) 1" in txt.stdout and "rank 1 ended early (last sign of life" in txt.stdout
    assert "rank(s) 0 went on to seq 20 on pg 0, its last was seq 19" in txt.stdout
