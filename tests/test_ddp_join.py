"""DDP's join mode (uneven inputs) under commtrace: the gradients are untraced DDP's, bit for bit.

Without a comm hook DDP's Reducer divides by the world size or, under
``join(divide_by_initial_world_size=False)``, by the number of ranks not yet joined; commtrace's
hook follows it (capture/ddp.py ``_note_join``). Before, the hook always divided by the world
size: at 2 ranks the last rank's steps after the first joined were scaled by 1/2 instead of 1.

One real gloo job under ``commtrace run`` (tests/scripts/ddp_join_equal.py) trains each case
untraced and traced and compares the parameters exactly; the trace holds every bucket's
all-reduce, and reading the join count adds no false finding."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import SCRIPTS, clean_env, load_rows, run_path, run_traced, torchrun_cmd

CASES = ("static", "dynamic", "dynamic_late", "dynamic_py")


def _job(tmp_path, nproc, env):
    p = run_traced(tmp_path, torchrun_cmd(os.path.join(SCRIPTS, "ddp_join_equal.py"),
                                          nproc=nproc), env=env, timeout=240)
    dec = json.JSONDecoder()
    res = sorted((dec.raw_decode(part)[0] for part in p.stdout.split("DDPJOIN ")[1:]),
                 key=lambda r: r["rank"])
    assert [r["rank"] for r in res] == list(range(nproc)), p.stdout[-2000:]
    return res


def _check(tmp_path, res, want_kind):
    rows = load_rows(run_path(tmp_path))
    for r in res:
        assert r["equal"] == {c: True for c in CASES}, r
        assert r["hook_kind"] == {c: want_kind for c in CASES}, r
        # every gradient element once per step, the joined ranks' zero buckets included
        n = sum(x["count"] for x in rows if x["kind"] == "op" and x["rank"] == r["rank"]
                and x["api"] == "ddp_comm_hook")
        assert n == r["steps"] * r["n_params"], (n, r)
    rep = subprocess.run([sys.executable, "-m", "commtrace", "report", str(tmp_path), "--format",
                          "json"], env=clean_env(), capture_output=True, text=True, timeout=180)
    assert rep.returncode == 0, rep.stderr[-2000:]
    kinds = {f["kind"] for f in json.loads(rep.stdout)["findings"]
             if f["severity"] == "error"}
    assert not kinds, kinds


def test_join_matches_untraced_ddp_cxx_hook(tmp_path, accel_cache):
    res = _job(tmp_path, 2, {"COMMTRACE_CACHE_DIR": accel_cache})
    _check(tmp_path, res, "c++")


@pytest.mark.slow
def test_join_matches_untraced_ddp_3_ranks_c_hook(tmp_path):
    # at 3 ranks the divisors are 3, 2, 1: 1/3 rounds; the C hook (C++ one off)
    res = _job(tmp_path, 3, {"COMMTRACE_DDP_CXX": "0"})
    _check(tmp_path, res, None)
