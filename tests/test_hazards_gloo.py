"""Use-before-wait detected live in a real 2-rank gloo run under torchrun (issue 3, item 5)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pyarrow.dataset as ds
import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "hazard_item.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def marked_lines():
    marks = {}
    with open(SCRIPT) as f:
        for i, line in enumerate(f, 1):
            m = re.search(r"# (HAZARD:\w+|CLEAN)", line)
            if m:
                marks.setdefault(m.group(1), []).append(i)
    return marks


def load(run):
    t = ds.dataset(run, format="parquet", partitioning="hive").to_table()
    return t.to_pylist()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hz")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    env.pop("COMMTRACE_ENABLE", None)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", SCRIPT, str(out)],
                       env=env, capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return {m: load(os.path.join(out, m)) for m in ("basic", "full")}


@pytest.mark.slow
def test_basic_mode_finds_item_and_repr_before_wait(runs):
    marks = marked_lines()
    rows = runs["basic"]
    for rank in (0, 1):
        hz = [r for r in rows if r["kind"] == "hazard" and r["rank"] == rank]
        ops = {r["op_id"]: r for r in rows if r["kind"] == "op" and r["rank"] == rank}
        got = sorted((r["api"], int(r["site"].rsplit(":", 1)[1])) for r in hz)
        assert got == sorted([("Tensor.item", marks["HAZARD:item"][0]),
                              ("Tensor.__repr__", marks["HAZARD:repr"][0])]), hz
        for r in hz:
            assert r["site"].startswith(SCRIPT) and r["detail"] == "use_before_wait"
            ref = ops[r["ref_op_id"]]
            assert ref["op"] == r["op"] == "all_reduce" and ref["async_op"]
        item = next(r for r in hz if r["api"] == "Tensor.item")
        rep = next(r for r in hz if r["api"] == "Tensor.__repr__")
        assert ops[item["ref_op_id"]]["bytes"] == 4
        assert ops[rep["ref_op_id"]]["bytes"] == 4 << 16


@pytest.mark.slow
def test_full_mode_finds_a_torch_op_on_a_pending_tensor(runs):
    marks = marked_lines()
    for rank in (0, 1):
        hz = [r for r in runs["full"] if r["kind"] == "hazard" and r["rank"] == rank]
        assert [(r["api"], int(r["site"].rsplit(":", 1)[1])) for r in hz] == \
            [("Tensor.mul", marks["HAZARD:mul"][0])], hz
