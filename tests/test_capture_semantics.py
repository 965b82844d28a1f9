"""What commtrace must not change, and the rows it must write (issue 13, items 3 and 5), on
short 2-rank gloo runs, each also run without commtrace:

- every functional collective (DTensor's ``all_gather_single`` / ``reduce_scatter_single``, the
  ``*_autograd``, ``*_coalesced``, ``*_inplace`` forms, ``isend_inplace``, ``irecv_inplace``,
  ``batch_p2p_ops_inplace``) gives exactly one row per call, with its sizes, completed;
- DDP reads the same about itself (``_get_ddp_logging_data()``: no ``comm_hook`` when the user
  registered none) and trains to the same parameters; its construction-time all_gather has
  sizes;
- a warning torch raises inside a wrapped call points at the user's line.
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import SCRIPTS, launch_cmd, load_rows, run_plain, run_traced


def _both(tmp_path_factory, script, pure=False):
    tmp = str(tmp_path_factory.mktemp(os.path.splitext(script)[0]))
    env = {"COMMTRACE_PURE_PYTHON": "1"} if pure else None
    res = {}
    for traced in (False, True):
        out = os.path.join(tmp, "traced" if traced else "plain")
        # through the light launcher (tests/launch_ranks.py): capture under `commtrace run --
        # torchrun` is test_robustness's (and the slow stage's test_capture_e2e)
        cmd = launch_cmd(os.path.join(SCRIPTS, script), out)
        if traced:
            run_traced(os.path.join(tmp, "trace"), cmd, env=env)
        else:
            run_plain(cmd)
        res[traced] = {r: json.load(open(f"{out}.{r}")) for r in (0, 1)}
    res["rows"] = [r for r in load_rows(os.path.join(tmp, "trace")) if r["kind"] == "op"]
    return res


@pytest.fixture(scope="module")
def funcol_run(tmp_path_factory):
    return _both(tmp_path_factory, "funcol_all.py")


def test_every_functional_collective_is_one_complete_row(funcol_run):
    rows = funcol_run["rows"]
    for rank in (0, 1):
        assert funcol_run[True][rank]["outs"] == funcol_run[False][rank]["outs"]
        calls = funcol_run[True][rank]["calls"]
        mine = sorted((r for r in rows if r["rank"] == rank and r["api"].startswith("funcol.")),
                      key=lambda r: r["op_id"])
        # the 26 calls, then the 3 deprecated names of warn_sites.py
        assert [[r["api"], r["op"], r["count"], r["dtype"]] for r in mine[:26]] == calls
        assert len(calls) == 26
        assert [r["api"] for r in mine[26:]] == [
            "funcol.all_gather_tensor", "funcol.reduce_scatter_tensor",
            "funcol.all_gather_into_tensor_coalesced"]
        mine = mine[:26]
        for r in mine:
            itemsize = 8 if r["dtype"] == "int64" else 4
            assert r["bytes"] == r["count"] * itemsize, r
            assert r["t_end_ns"] is not None and r["t_end_ns"] >= r["t_enqueue_ns"], r
            assert "funcol_all.py" in r["site"], r
        by_api = {r["api"]: r for r in mine}
        assert by_api["funcol.all_gather_single"]["out_bytes"] == 8 * 4 * 2
        assert by_api["funcol.reduce_scatter_single"]["out_bytes"] == 20 * 4 // 2
        assert by_api["funcol.broadcast"]["root"] == 1
    # point to point: each send matched by the peer's recv (same pg, seq, size)
    sends = {(r["pg"], r["seq"], r["count"]) for r in rows if r["op"] == "send"}
    recvs = {(r["pg"], r["seq"], r["count"]) for r in rows if r["op"] == "recv"}
    assert sends == recvs and len(sends) == 3


def test_ddp_reads_the_same_without_a_user_hook(funcol_run):
    ddp_run = funcol_run
    for rank in (0, 1):
        plain, traced = ddp_run[False][rank]["ddp"], ddp_run[True][rank]["ddp"]
        assert traced["comm_hook"] is None and plain["comm_hook"] is None
        assert traced["comm_hooks"] == plain["comm_hooks"] == 0
        assert traced["logging"] == plain["logging"]
        assert traced["params"] == plain["params"]
    rows = ddp_run["rows"]
    for rank in (0, 1):
        mine = [r for r in rows if r["rank"] == rank]
        assert len([r for r in mine if r["api"] == "ddp_comm_hook"]) == 3   # 1 bucket x 3 steps


def test_every_op_row_has_sizes(funcol_run):
    ddp_run = funcol_run
    for r in funcol_run["rows"]:
        if r["op"] == "barrier":
            assert (r["count"], r["bytes"]) == (0, 0)
            continue
        assert r["count"] is not None and r["bytes"] is not None and r["dtype"], r
    verify = [r for r in ddp_run["rows"] if r["api"] == "_verify_params_across_processes"]
    assert len(verify) == 2
    for r in verify:   # one int64 (the parameter count) per rank
        assert (r["op"], r["count"], r["bytes"], r["out_bytes"], r["dtype"]) == \
            ("all_gather", 1, 8, 16, "int64")


def _check_warnings(run):
    for rank in (0, 1):
        plain, traced = run[False][rank]["warn"], run[True][rank]["warn"]
        assert traced["got"] == plain["got"]
        for name in ("funcol_all_gather_tensor", "funcol_reduce_scatter_tensor",
                     "funcol_coalesced"):
            assert traced["got"][name] == [["warn_sites.py", traced["marks"][name]]], name


def test_torch_warnings_point_at_the_users_line(funcol_run):
    _check_warnings(funcol_run)


@pytest.mark.slow
def test_pure_python_wrappers_rows_and_warnings(tmp_path_factory):
    run = _both(tmp_path_factory, "funcol_all.py", pure=True)
    _check_warnings(run)
    for rank in (0, 1):
        mine = sorted((r for r in run["rows"] if r["rank"] == rank
                       and r["api"].startswith("funcol.")), key=lambda r: r["op_id"])
        assert [[r["api"], r["op"], r["count"], r["dtype"]] for r in mine[:26]] == \
            run[True][rank]["calls"]
