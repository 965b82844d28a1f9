"""Traced DDP computes untraced DDP's parameters bit for bit where DDP's Reducer scales
gradients in ways a comm hook does not see (capture/ddp.py):

- ``join(divide_by_initial_world_size=False)`` with uneven inputs: the Reducer divides by the
  ranks not yet joined. commtrace's hook divided by the world size before session 13 (at 2
  ranks the last rank's steps after another joined were scaled by 1/2 instead of 1).
- ``gradient_as_bucket_view``: the Reducer multiplies a gradient by 1/n as it copies it into
  the bucket and divides in place one that already is a view of it (``zero_grad(set_to_none=
  False)``, accumulation under ``no_sync``). The hook divided every bucket before, which under
  torch's default ``zero_grad`` differed in the last bit at 3 ranks; now it follows DDP per
  gradient.
- and the plain modes (static graph, unused parameters, no_sync, buffers not broadcast), and
  a float64 model (the C++ hook scales float32 and float64 buckets by a 0-dim tensor of their
  dtype: the same products as DDP's scalar).

One real gloo job under ``commtrace run`` (tests/scripts/ddp_numerics_equal.py) trains each case
untraced and traced. Besides the parameters: every synced step's buckets are in the trace, the
buckets only the Python hook can scale went there and no others (the common cases keep the C++
hook), and reading the join count adds no false finding."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import SCRIPTS, clean_env, launch_cmd, load_rows, marked_json, run_path, run_traced

# buckets the Python hook scaled per case: [all multiplied, all divided, per gradient] (> 0: some)
FAST = ("plain", "static_graph", "find_unused", "no_sync", "broadcast_buffers_off", "bview",
        "bview_static", "join_static", "double")


def _job(tmp_path, nproc, env):
    # the light launcher (tests/launch_ranks.py): DDP under `commtrace run -- torchrun` is
    # test_ddp_hook's recording-group job
    p = run_traced(tmp_path, launch_cmd(os.path.join(SCRIPTS, "ddp_numerics_equal.py"),
                                        nproc=nproc), env=env, timeout=300)
    res = marked_json(p.stdout, "NUMERICS ")
    assert [r["rank"] for r in res] == list(range(nproc)), p.stdout[-2000:]
    return res


def _check(tmp_path, res, want_kind):
    rows = load_rows(run_path(tmp_path))
    for r in res:
        assert all(r["equal"].values()), r["equal"]
        assert set(r["hook_kind"].values()) == {want_kind}, r["hook_kind"]
        sc = r["scaled"]
        for case in FAST:
            assert sc[case] == [0, 0, 0], (case, sc)
        assert sc["bview_keep"][1] > 0 and sc["bview_keep"][2] == 0, sc
        assert sc["bview_nosync_keep"][1] > 0, sc
        assert sc["bview_mixed"][2] > 0, sc
        assert sc["bview_nosync"] == [sc["bview_nosync"][0], 0, 0] and sc["bview_nosync"][0] > 0
        for case in ("join_dynamic", "join_dynamic_late", "join_dynamic_bview"):
            assert sum(sc[case]) > 0, (case, sc)
        # every gradient element once per synced step, the joined ranks' zero buckets included
        n = sum(x["count"] for x in rows if x["kind"] == "op" and x["rank"] == r["rank"]
                and x["api"] == "ddp_comm_hook")
        assert n == r["elements"], (n, r["elements"])
    rep = subprocess.run([sys.executable, "-m", "commtrace", "report", str(tmp_path), "--format",
                          "json"], env=clean_env(), capture_output=True, text=True, timeout=180)
    assert rep.returncode == 0, rep.stderr[-2000:]
    errors = {f["kind"] for f in json.loads(rep.stdout)["findings"] if f["severity"] == "error"}
    assert not errors, errors


def test_ddp_modes_equal_untraced_3_ranks_cxx_hook(tmp_path, accel_cache):
    # at 3 ranks 1/3 rounds, so dividing and multiplying differ. The C++ hook: what a model
    # gets where the recording group is off (COMMTRACE_DDP_GROUP=0, or a group it cannot wrap)
    res = _job(tmp_path, 3, {"COMMTRACE_CACHE_DIR": accel_cache, "COMMTRACE_DDP_GROUP": "0"})
    _check(tmp_path, res, "c++")


def test_ddp_modes_equal_untraced_3_ranks_recording_group(tmp_path, accel_cache):
    """The default where the module is built: no comm hook, DDP's Reducer issues its
    all-reduces on commtrace's recording group (capture/ddp.py _install_group). The Reducer
    scales as without commtrace in every mode (the Python hook scales nothing), and every
    synced step's buckets are recorded, the joined ranks' zero buckets included."""
    res = _job(tmp_path, 3, {"COMMTRACE_CACHE_DIR": accel_cache})
    rows = load_rows(run_path(tmp_path))
    for r in res:
        assert all(r["equal"].values()), r["equal"]
        assert set(r["hook_kind"].values()) == {"group"}, r["hook_kind"]
        assert all(sc == [0, 0, 0] for sc in r["scaled"].values()), r["scaled"]
        ddp_rows = [x for x in rows if x["kind"] == "op" and x["rank"] == r["rank"]
                    and x["api"] == "ddp_comm_hook"]
        assert sum(x["count"] for x in ddp_rows) == r["elements"], r["elements"]
        assert all(x["completion"] in ("callback", "observed") for x in ddp_rows)
        assert all(json.loads(x["detail"])["ddp_bucket"] >= 0 for x in ddp_rows)
    rep = subprocess.run([sys.executable, "-m", "commtrace", "report", str(tmp_path), "--format",
                          "json"], env=clean_env(), capture_output=True, text=True, timeout=180)
    assert rep.returncode == 0, rep.stderr[-2000:]
    errors = {f["kind"] for f in json.loads(rep.stdout)["findings"] if f["severity"] == "error"}
    assert not errors, errors


@pytest.mark.slow
def test_ddp_modes_equal_untraced_2_ranks_c_hook(tmp_path):
    res = _job(tmp_path, 2, {"COMMTRACE_DDP_CXX": "0"})
    _check(tmp_path, res, None)
