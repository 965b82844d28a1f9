"""End-to-end capture on real 2-rank gloo runs (issue 2, Acceptance)."""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (SAMPLES, SCRIPTS, clean_env, free_port, load_rows, rank_meta, run_path,
                      run_plain, run_traced, torchrun_cmd)

pytestmark = pytest.mark.slow

SKEW_NS = 50_000_000  # injected on rank 1 in the all_collectives run


def ops(rows, **eq):
    return [r for r in rows if r["kind"] == "op" and all(r.get(k) == v for k, v in eq.items())]


def check_seq_matches(rows):
    """Every collective (pg, seq) appears once on each member rank, with the same op."""
    by = collections.defaultdict(dict)
    for r in rows:
        if r["kind"] == "op" and r["op"] not in ("send", "recv"):
            key = (r["pg"], r["seq"])
            assert r["rank"] not in by[key], f"duplicate seq {key} on rank {r['rank']}"
            by[key][r["rank"]] = (r["op"], r["api"], r["bytes"] if r["op"] != "gather" else None)
    for key, per_rank in by.items():
        assert set(per_rank) == {0, 1}, (key, per_rank)
        assert len({v[0] for v in per_rank.values()}) == 1, (key, per_rank)
        assert len({v[1] for v in per_rank.values()}) == 1, (key, per_rank)
    return by


def check_times(rows):
    for r in rows:
        if r["kind"] != "op":
            continue
        assert r["t_enqueue_ns"] <= r["t_return_ns"], r
        if r["t_end_ns"] is not None:
            assert r["t_enqueue_ns"] <= r["t_end_ns"], r
        if r["t_wait_ns"] is not None:
            assert r["t_wait_ns"] <= r["t_wait_end_ns"], r


# ------------------------------------------------------------------------------------------
# DDP end to end


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("ddp")
    out, counts = d / "trace", d / "counts"
    p = run_traced(out, torchrun_cmd(os.path.join(SCRIPTS, "capture_ddp_count.py"), "--steps", 12),
                   opts=("--flush-interval", "0.5"),
                   # the count is of the hook registered through dist._register_comm_hook: not
                   # the C++ hook (commtrace accel build), registered on the Reducer in C++
                   env={"COUNT_DIR": str(counts), "COMMTRACE_DDP_CXX": "0"})
    n = {r: json.load(open(counts / f"rank{r}.json"))["n"] for r in (0, 1)}
    return out, load_rows(out), n, p


def test_ddp_rows_match_hook_calls(ddp_run):
    out, rows, hook_calls, p = ddp_run
    assert {r["rank"] for r in rows} == {0, 1}
    for rank in (0, 1):
        ddp = ops(rows, rank=rank, api="ddp_comm_hook")
        # 12 steps with bucket_cap_mb=1: 1 bucket in step 1, 2 afterwards (torch-notes.md).
        assert hook_calls[rank] > 12
        assert len(ddp) == hook_calls[rank]
        assert all(r["op"] == "all_reduce" and r["async_op"] and r["bytes"] > 0 for r in ddp)
        assert all(json.loads(r["detail"])["ddp_bucket"] >= 0 for r in ddp)
        # optimizer steps advance the step column (no mark_step in the sample)
        assert sorted({r["step"] for r in ddp}) == list(range(12))
        marks = [r for r in rows if r["rank"] == rank and r["kind"] == "mark"]
        assert len(marks) == 12
    check_times(rows)
    check_seq_matches(rows)
    assert "commtrace report" in p.stderr and "commtrace dashboard" in p.stderr


def test_ddp_trace_reads_with_pyarrow_and_duckdb(ddp_run):
    out, rows, _, _ = ddp_run
    import duckdb
    import pyarrow.dataset as ds

    t = ds.dataset(str(out), partitioning="hive").to_table()
    n = duckdb.sql(f"select count(*) from read_parquet('{out}/**/*.parquet', "
                   "hive_partitioning=true)").fetchall()[0][0]
    assert t.num_rows == n == len(rows)
    session = json.load(open(out / "_manifest.json"))  # commtrace run's (schema v2)
    assert session["kind"] == "session" and session["exit_code"] == 0
    assert "torch.distributed.run" in " ".join(session["command"])
    run = run_path(out)
    assert session["runs"] == [os.path.basename(run)]
    man = json.load(open(os.path.join(run, "_manifest.json")))  # the job's
    assert man["world_size"] == 2 and man["run_id"] == os.path.basename(run)
    meta = rank_meta(out)
    for r in (0, 1):
        m = meta[r]
        assert m["rank"] == r and m["world_size"] == 2 and m["backend"] == "gloo"
        assert m["pg_ranks"] == {"0": [0, 1]}
        assert m["dropped_rows"] == 0 and m["schema_version"] == 3
        assert m["run_id"] == man["run_id"]  # agreed across ranks
        # the ranks run without COMMTRACE_* settings: the C path whenever it is built
        built = importlib.util.find_spec("commtrace.capture._fastpath") is not None
        assert m["capture_path"] == ("c" if built else "python")
        assert {"host", "pid", "torch_version", "commtrace_version", "clock_offset_ns",
                "clock_offset_method"} <= set(m)
    for r in (0, 1):
        inflight = json.load(open(os.path.join(run, f"rank={r}", "_inflight.json")))
        assert inflight["ops"] == [] and inflight["final"] is True
        assert inflight["exit"] == {"how": "ok"} and inflight["run_id"] == man["run_id"]


# ------------------------------------------------------------------------------------------
# Every collective (+ clock skew on rank 1)


@pytest.fixture(scope="module")
def coll_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("coll") / "trace"
    run_traced(out, torchrun_cmd(os.path.join(SAMPLES, "all_collectives.py"), "-n", 1024),
               env={"COMMTRACE_CLOCK_SKEW": f"1:{SKEW_NS}"})
    return out, load_rows(out)


N, B = 1024, 4096  # elements and bytes per rank in all_collectives.py (float32)
EXPECTED = {
    # api: (op, bytes, out_bytes on rank 0, out_bytes on rank 1, root)
    "all_reduce": ("all_reduce", B, B, B, None),
    "broadcast": ("broadcast", B, B, B, 0),
    "reduce": ("reduce", B, B, B, 0),
    "all_gather": ("all_gather", B, 2 * B, 2 * B, None),
    "all_gather_into_tensor": ("all_gather", B, 2 * B, 2 * B, None),
    "all_gather_single": ("all_gather", B, 2 * B, 2 * B, None),
    "_all_gather_base": ("all_gather", B, 2 * B, 2 * B, None),
    "gather": ("gather", B, 2 * B, 0, 0),
    "scatter": ("scatter", B, B, B, 0),
    "reduce_scatter": ("reduce_scatter", 2 * B, B, B, None),
    "reduce_scatter_tensor": ("reduce_scatter", 2 * B, B, B, None),
    "reduce_scatter_single": ("reduce_scatter", 2 * B, B, B, None),
    "_reduce_scatter_base": ("reduce_scatter", 2 * B, B, B, None),
    "all_to_all": ("all_to_all", 2 * B, 2 * B, 2 * B, None),
    "all_to_all_single": ("all_to_all", 2 * B, 2 * B, 2 * B, None),
    "all_reduce_coalesced": ("all_reduce", 2 * B, 2 * B, 2 * B, None),
    "barrier": ("barrier", 0, 0, 0, None),
}


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("api", sorted(EXPECTED))
def test_every_collective(coll_run, api, async_op):
    _, rows = coll_run
    op, nbytes, out0, out1, root = EXPECTED[api]
    for rank, out in ((0, out0), (1, out1)):
        rs = sorted((r for r in ops(rows, rank=rank, api=api, async_op=async_op)
                     if r["detail"] is None), key=lambda r: r["seq"])
        if api == "barrier" and not async_op:
            rs = rs[:1]  # the sample ends with one more barrier
        assert len(rs) == 1, (api, rank, rs)
        r = rs[0]
        assert (r["op"], r["bytes"], r["out_bytes"], r["root"]) == (op, nbytes, out, root)
        assert r["pg"] == "0" and r["pg_size"] == 2 and r["backend"] == "gloo"
        if api != "barrier":
            assert r["dtype"] == "float32" and r["device"] == "cpu"
        assert r["t_end_ns"] is not None and r["error"] is None
        if api != "barrier":
            assert r["count"] == nbytes // 4
        if async_op and api != "all_reduce_coalesced":  # that one returns a Future, not a Work
            assert r["t_wait_ns"] is not None and r["t_wait_end_ns"] >= r["t_wait_ns"]
        assert r["site"].endswith(".py:" + r["site"].rsplit(":", 1)[1])
        assert "all_collectives.py" in r["site"]


def test_point_to_point(coll_run):
    _, rows = coll_run
    for api, async_op in (("send", False), ("recv", False), ("isend", True), ("irecv", True)):
        for rank in (0, 1):
            rs = ops(rows, rank=rank, api=api)
            assert len(rs) == 1
            r = rs[0]
            assert r["peer"] == 1 - rank and r["bytes"] == B and r["async_op"] == async_op
            assert r["t_end_ns"] is not None
    for rank in (0, 1):
        b = ops(rows, rank=rank, api="batch_isend_irecv")
        assert sorted(r["op"] for r in b) == ["recv", "send"]
        assert all(r["peer"] == 1 - rank and r["bytes"] == B and r["t_end_ns"] for r in b)
    # per (pg, src, dst) sequence numbers match between the sender's and receiver's rows
    def key(r):
        src, dst = (r["rank"], r["peer"]) if r["op"] == "send" else (r["peer"], r["rank"])
        return (r["pg"], src, dst, r["seq"])
    sends = collections.Counter(key(r) for r in ops(rows, op="send"))
    recvs = collections.Counter(key(r) for r in ops(rows, op="recv"))
    # 0->1: send, isend, batch, send_object_list; 1->0: send, isend, batch
    assert sends == recvs and len(sends) == 7


def test_coalesced_object_and_functional(coll_run):
    _, rows = coll_run
    for rank in (0, 1):
        co = [r for r in ops(rows, rank=rank, api="all_reduce") if r["detail"]]
        assert len(co) == 2 and all(json.loads(r["detail"]) == {"coalesced": 2} for r in co)
        assert all(r["async_op"] and r["t_end_ns"] and r["t_wait_ns"] for r in co)
        for api, op, root in (("broadcast_object_list", "broadcast", 0),
                              ("all_gather_object", "all_gather", None),
                              ("gather_object", "gather", 0),
                              ("scatter_object_list", "scatter", 0)):
            rs = ops(rows, rank=rank, api=api)
            assert len(rs) == 1 and rs[0]["op"] == op and rs[0]["root"] == root
            assert rs[0]["bytes"] > 0 and rs[0]["t_end_ns"]
        p2p = ops(rows, rank=rank, api="send_object_list" if rank == 0 else "recv_object_list")
        assert len(p2p) == 1 and p2p[0]["peer"] == 1 - rank and p2p[0]["bytes"] > 0
        for api, op, nbytes, out in (("funcol.all_reduce", "all_reduce", B, B),
                                     ("funcol.all_gather_tensor", "all_gather", B, 2 * B),
                                     ("funcol.reduce_scatter_tensor", "reduce_scatter", 2 * B, B),
                                     ("funcol.all_to_all_single", "all_to_all", 2 * B, 2 * B),
                                     ("funcol.broadcast", "broadcast", B, B)):
            rs = ops(rows, rank=rank, api=api)
            assert len(rs) == 1, api
            r = rs[0]
            assert (r["op"], r["bytes"], r["out_bytes"], r["async_op"]) == (op, nbytes, out, True)
            # completion is the wait on the async tensor
            assert r["t_wait_ns"] is not None and r["t_end_ns"] == r["t_wait_end_ns"]


def test_all_collectives_seq_and_times(coll_run):
    _, rows = coll_run
    by = check_seq_matches(rows)
    assert len(by) == 47
    check_times(rows)


def test_clock_skew_is_measured(coll_run):
    out, _ = coll_run
    meta = rank_meta(out)
    assert meta[0]["clock_offset_ns"] == 0 and meta[0]["clock_offset_method"] == "reference"
    m = meta[1]
    assert m["clock_offset_method"] == "tcp-pingpong" and m["clock_skew_injected_ns"] == SKEW_NS
    assert abs(m["clock_offset_ns"] - SKEW_NS) < 1_000_000, m["clock_offset_ns"]
    assert 0 < m["clock_rtt_ns"] < 50_000_000


# ------------------------------------------------------------------------------------------
# User comm hook, context manager, SIGKILL, spawn + sitecustomize chaining


def test_user_comm_hook_before_and_after_warmup(tmp_path):
    out = tmp_path / "trace"
    res = tmp_path / "res"
    run_traced(out, torchrun_cmd(os.path.join(SCRIPTS, "capture_user_hook.py"), res))
    rows = load_rows(out)
    for rank in (0, 1):
        got = json.load(open(f"{res}.rank{rank}"))
        assert got["calls"]["before"] >= 3 and got["calls"]["after"] >= 3
        assert got["unchanged"] is True  # DDP used the user's (zero) result
        hook_rows = [r for r in ops(rows, rank=rank, api="all_reduce")
                     if r["detail"] and "ddp_bucket" in r["detail"]]
        assert len(hook_rows) == got["calls"]["before"] + got["calls"]["after"]
        assert not ops(rows, rank=rank, api="ddp_comm_hook")
    check_seq_matches(rows)


def test_context_manager_and_decorator(tmp_path):
    out, out2 = tmp_path / "in", tmp_path / "dec"
    run_plain(torchrun_cmd(os.path.join(SCRIPTS, "capture_ctx.py"), out, out2))
    rows = load_rows(out)
    for rank in (0, 1):
        ar = ops(rows, rank=rank, op="all_reduce")
        assert sorted(r["count"] for r in ar) == [11, 11]  # not 7, 13 or 19; not doubled
        assert [r["async_op"] for r in sorted(ar, key=lambda r: r["seq"])] == [False, True]
        b = ops(rows, rank=rank, api="batch_isend_irecv")  # P2POps built before tracing
        assert sorted(r["op"] for r in b) == ["recv", "send"]
        assert all(r["peer"] == 1 - rank and r["t_end_ns"] for r in b)
        marks = [r for r in rows if r["rank"] == rank and r["kind"] == "mark"
                 and r["detail"] == "mark_step"]
        assert [m["step"] for m in marks] == [5]
        last = max(ar, key=lambda r: r["seq"])
        assert last["step"] == 5
    rows2 = load_rows(out2)
    assert sorted((r["rank"], r["op"], r["count"]) for r in rows2 if r["kind"] == "op") == \
        [(0, "broadcast", 17), (1, "broadcast", 17)]


def test_sigkill_one_rank(tmp_path):
    out = tmp_path / "trace"
    p = run_traced(out, torchrun_cmd(os.path.join(SCRIPTS, "capture_loop.py"), "--seconds", 20,
                                     "--kill-rank", 1, "--kill-after", 1.5),
                   opts=("--flush-interval", "0.3"), check=False, timeout=120)
    assert p.returncode != 0
    rows = load_rows(out)  # the whole run reads cleanly
    n = collections.Counter(r["rank"] for r in rows if r["kind"] == "op")
    assert n[0] > 10 and n[1] > 10  # the killed rank's earlier parts are there
    import pyarrow.parquet as pq

    run = Path(run_path(out))
    for f in (run / "rank=1").glob("*.parquet"):
        pq.read_table(f)
    snap = json.load(open(run / "rank=1" / "_inflight.json"))
    assert snap["rank"] == 1 and isinstance(snap["ops"], list)
    # rank 0's last all_reduce is not lost: either gloo failed it when the peer died (row with
    # the error text) or torchrun tore rank 0 down while it was still blocked in it (the op is
    # in rank 0's in-flight snapshot or written with t_end_ns null). Which one happens depends
    # on whether gloo notices the closed socket before the agent's SIGTERM.
    snap0 = json.load(open(run / "rank=0" / "_inflight.json"))
    assert (any(r["error"] for r in ops(rows, rank=0))
            or any(r["t_end_ns"] is None for r in ops(rows, rank=0, op="all_reduce"))
            or any(o.get("op") == "all_reduce" for o in snap0["ops"]))


def test_spawn_children_and_existing_sitecustomize(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "markers"
    marker.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\n"
        f"open(os.path.join({str(marker)!r}, str(os.getpid())), 'w').close()\n")
    out = tmp_path / "trace"
    env = clean_env()
    env["PYTHONPATH"] = str(site) + os.pathsep + env["PYTHONPATH"]
    p = subprocess.run([sys.executable, "-m", "commtrace", "run", "-o", str(out), "--",
                        sys.executable, os.path.join(SCRIPTS, "capture_spawn.py"),
                        str(free_port())], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = load_rows(out)
    for rank in (0, 1):
        assert [r["count"] for r in ops(rows, rank=rank, op="all_reduce")] == [5, 5, 5]
    assert len(os.listdir(marker)) >= 3  # parent + 2 spawn children ran the user's sitecustomize


# ------------------------------------------------------------------------------------------
# commtrace run itself


def test_run_exit_code_and_nothing_written_without_group(tmp_path):
    out = tmp_path / "t"
    p = run_traced(out, [sys.executable, "-c", "import sys, torch.distributed; sys.exit(3)"],
                   check=False)
    assert p.returncode == 3
    assert not out.exists()
    assert "nothing was traced" in p.stderr


def test_run_forwards_sigterm(tmp_path):
    out = tmp_path / "t"
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-m", "commtrace", "run", "-o", str(out), "--",
                             sys.executable, "-c", code], env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    assert rc == 7 and time.time() - t0 < 10


def test_run_help_ends_with_examples():
    p = run_plain([sys.executable, "-m", "commtrace", "run", "--help"])
    text = p.stdout.rstrip()
    assert "Examples:" in text
    assert text.splitlines()[-1].strip().startswith("commtrace run")
    for opt in ("--output", "--no-nvtx", "--no-stack", "--flush-interval", "--buffer-ops",
                "--hang-timeout", "--dump-on-hang", "--hazards"):
        assert opt in text
