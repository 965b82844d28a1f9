"""Multi-node, simulated (issue 6): two torchrun agents (--nnodes 2, distinct --node-rank,
rendezvous on 127.0.0.1), each under its own `commtrace run` writing into one run directory,
with a 50 ms clock skew injected on the second node. The merged run must analyse correctly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import commtrace

from conftest import SCRIPTS, clean_env, free_port

SKEW_NS = 50_000_000


def test_two_nodes_one_run_directory_with_skew(tmp_path):
    out = tmp_path / "run"
    port = free_port()
    procs = []
    for node in (0, 1):
        env = clean_env({"COMMTRACE_CLOCK_SKEW": f"1:{SKEW_NS}"} if node == 1 else None)
        cmd = [sys.executable, "-m", "commtrace", "run", "-o", str(out), "--flush-interval", "0.5", "--",
               sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
               os.path.join(SCRIPTS, "robust_multinode.py")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, start_new_session=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=150))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    for p, (so, se) in zip(procs, outs):
        assert p.returncode == 0, se[-3000:]
        assert "done: 1.07374e+09" in so  # 2**30: 30 all_reduces doubling ones
        assert "trace of 1 rank(s) written to" in se or "trace of 2 rank(s) written to" in se

    run = commtrace.load(str(out))
    assert run.ranks == [0, 1] and run.missing_ranks == [] and run.world_size == 2
    assert run.warnings == []
    # the offset was measured across the two agents: about the injected skew
    assert abs(run.clock_offsets[1] - SKEW_NS) < 5_000_000, run.clock_offsets
    rep = run.report()
    assert rep["clock"]["violations"] == 0 and rep["clock"]["matched"] >= 31
    kinds = {f["kind"] for f in rep["findings"]}
    assert not kinds & {"not_joined", "not_completed", "collective_mismatch", "clock_violation"}, kinds
    assert run.collectives().num_rows == 31  # 30 all_reduces + the barrier, matched across nodes
    # both nodes' ranks agreed on one run id (through the rendezvous store): one run
    m = json.load(open(out / "_manifest.json"))  # the session manifest of either launcher
    assert "exit_code" in m and m["runs"] == [run.run_id]
    assert run.manifest["world_size"] == 2 and run.manifest["run_id"] == run.run_id
