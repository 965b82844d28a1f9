"""The modern stack end to end on gloo (issue 13, item 4), the scenarios whose collectives go
through the functional collectives DTensor calls (``all_gather_single``,
``reduce_scatter_single``): DTensor on a 1-D mesh, FSDP2 + TP on a 2x2 mesh, an FSDP2 checkpoint
save. Same method as tests/test_fidelity_stack.py."""

from __future__ import annotations

from collections import Counter

import pytest

from test_fidelity_stack import FALSE, check_counts, findings, in_window, scenario

pytestmark = pytest.mark.slow


def test_dtensor_distribute_redistribute_full_tensor(tmp_path):
    run, rows, counts = scenario(tmp_path, "dtensor", "stack_dtensor.py")
    assert counts[0]["ops"] == {"scatter": 1, "all_gather": 3, "all_reduce": 1,
                                "reduce_scatter": 1}
    check_counts(rows, counts)
    assert {x["pg"] for x in rows} == {"0"} and {x["pg_size"] for x in rows} == {2}
    assert not {f["kind"] for f in findings(run)} & FALSE


def test_fsdp2_checkpoint_save_all_gathers_recorded(tmp_path):
    run, rows, counts = scenario(tmp_path, "ckpt", "stack_fsdp.py")
    # 6 parameters + Adam's exp_avg and exp_avg_sq of each: 18 full tensors, one all_gather each
    assert counts[0]["saved"] == 18 and counts[0]["ops"] == {"all_gather": 18}
    check_counts(rows, counts)


def test_fsdp2_tp_2x2_mesh(tmp_path):
    run, rows, counts = scenario(tmp_path, "fsdp_tp", "stack_fsdp.py", "--tp", nproc=4)
    check_counts(rows, counts)
    for rank, c in counts.items():
        dp, tp = c["dp"][0], c["tp"][0]
        mine = in_window(rows, counts, rank)
        assert {x["pg"] for x in mine} <= {dp, tp}
        assert all(x["pg_size"] == 2 for x in mine)
        by_pg = Counter((x["pg"], x["op"]) for x in mine)
        assert by_pg[(dp, "reduce_scatter")] == c["ops"]["reduce_scatter"]   # FSDP's grads
        assert by_pg[(tp, "all_reduce")] == c["ops"]["all_reduce"]           # TP's outputs
    assert not {f["kind"] for f in findings(run)} & FALSE
