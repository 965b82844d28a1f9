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


# The host reads and the step marker of the pipeline sample, at world size 1 (issue 20): the
# common cases run in C (_fastpath.hazard_reader, _fastpath.step_hook), the rest in Python.
READS_AND_STEPS = r'''
import sys, torch, torch.distributed as dist, torch.nn as nn, commtrace
from commtrace.capture import hazards, recorder as R
hazards.UNPATCH_AFTER_S = 3600.0   # the readers stay on between the reads, however slow
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0,
                        world_size=1)
with commtrace.trace(output=sys.argv[1]):
    lin = nn.Linear(4, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    other = torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.1)
    t = torch.ones(8)
    for step in range(3):
        dist.all_reduce(t, async_op=True).wait()
        # every pending op waited (or none left): torch's method at once, in C
        t.tolist(); t.sum().item(); repr(t); str(t); f"{t[0]:.1f}"; t.cpu(); t.numpy()
        x = torch.ones(4)
        w = dist.all_reduce(x, async_op=True)
        t.tolist()                # pending x, disjoint: the Python reader, no row
        x[1:].tolist()            # HAZARD:view
        repr(x)                   # HAZARD:repr
        w.wait()
        x.tolist()                # waited: no row
        lin(t[:4]).sum().backward()
        opt.step()                # MARK
        other.step()              # not the first optimizer: no mark
    commtrace.mark_step(10)       # the user takes over: no more optimizer marks
    opt.step()
    c = R._cfast
    pc = c.pipe_counts() if c is not None else {}
    print(" ".join(f"{k} {pc.get(k, 0)}" for k in ("marks", "marks_python", "marks_direct",
                                                   "reads", "reads_python")))
dist.destroy_process_group()
'''


def _line(text):
    return next(i for i, ln in enumerate(READS_AND_STEPS.splitlines(), 1) if text in ln)


def test_host_reads_and_step_marks_in_c_record_the_python_rows(tmp_path):
    from conftest import run_both_paths

    got = {}
    for mode, d, stdout in run_both_paths(READS_AND_STEPS, tmp_path):
        v = dict(zip(stdout.split()[0::2], (int(x) for x in stdout.split()[1::2])))
        if mode == "0" and hazards_c():
            # 3 marks; 7+ reads per step with nothing unwaited, 3+ with x pending
            assert v["marks"] == 3 and v["marks_python"] == 0, v
            # each set the step behind the recorder's property, with no Python frame
            assert v["marks_direct"] == 3, v
            assert v["reads"] >= 3 * 7 + 3 and v["reads_python"] >= 3 * 3, v
        else:
            assert v == {"marks": 0, "marks_python": 0, "marks_direct": 0, "reads": 0,
                         "reads_python": 0}, v
        every = load(d)
        # the ops of loop i are step i: the step each mark set is the one the next ops read
        # (in C, the fast path's cached step, updated in place by the marker)
        assert [r["step"] for r in sorted((r for r in every if r["kind"] == "op"),
                                          key=lambda r: r["op_id"])] == [0, 0, 1, 1, 2, 2]
        rows = [r for r in every if r["kind"] != "op"]
        for r in rows:
            r.pop("t_enqueue_ns"), r.pop("thread"), r.pop("ref_op_id")
            r["site"] = r["site"] and r["site"].replace("<string>", "")
        got[mode] = sorted(rows, key=repr)
        hz = sorted((r["api"], int(r["site"].rsplit(":", 1)[1]), r["step"])
                    for r in rows if r["kind"] == "hazard")
        assert hz == sorted([("Tensor.tolist", _line("HAZARD:view"), s) for s in (0, 1, 2)] +
                            [("Tensor.__repr__", _line("HAZARD:repr"), s) for s in (0, 1, 2)])
        mk = [(r["step"], r["detail"], r["site"]) for r in rows if r["kind"] == "mark"]
        assert [m[:2] for m in mk] == [(1, "optimizer.step"), (2, "optimizer.step"),
                                       (3, "optimizer.step"), (10, "mark_step")], mk
        assert all(m[2] == f":{_line('# MARK')}" for m in mk[:3]), mk
    assert got["0"] == got["1"]


def hazards_c() -> bool:
    from commtrace.capture import recorder as R

    return R._cfast is not None and hasattr(R._cfast, "pipe_counts")
