"""torch.compile under commtrace compiles and runs exactly as without it (issue 13, item 1).

One torchrun job (2 ranks, gloo) of tests/scripts/compile_cases.py per configuration: without
commtrace, under ``commtrace run`` with the C fast path, and with ``COMMTRACE_PURE_PYTHON=1``.
Each compiles functions calling every kind of wrapped entry point (functional collectives and
their autograd / coalesced / deprecated / in-place forms, the in-place c10d collectives Dynamo
rewrites, point to point, and collectives Dynamo cannot compile) with aot_eager and inductor,
``fullgraph`` on and off, and reports graph count, graph-break count, recompiles after
commtrace's state changed, guards reading commtrace's modules, and the exact outputs.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import SCRIPTS, launch_cmd, load_rows, run_plain, run_traced, torchrun_cmd

SCRIPT = os.path.join(SCRIPTS, "compile_cases.py")
CASES = ("funcol_all", "funcol_autograd", "funcol_deprecated", "funcol_inplace", "c10d_inplace",
         "p2p", "c10d_break", "c10d_more", "torch_fails")
#: One case per kind of entry point: functional collectives, the in-place c10d collectives
#: Dynamo rewrites, point to point, collectives that break the graph.
FAST_CASES = ("funcol_all", "c10d_inplace", "p2p", "c10d_break")
#: inductor compiles C++ for every graph.
INDUCTOR_CASES = ("funcol_all", "c10d_inplace", "c10d_break")


def _run(tmp, name, traced, pure=False, backends="aot_eager", cases=CASES):
    out = os.path.join(tmp, name)
    args = (SCRIPT, out, backends, ",".join(cases))
    env = {"COMMTRACE_PURE_PYTHON": "1"} if pure else None
    if traced:
        run_traced(os.path.join(tmp, name + "-trace"), torchrun_cmd(*args), env=env, timeout=600)
    else:
        # the reference without commtrace: not about the launcher (tests/launch_ranks.py)
        run_plain(launch_cmd(*args), env=env, timeout=600)
    res = {}
    for rank in (0, 1):
        with open(f"{out}.{rank}") as f:
            res[rank] = json.load(f)
    return res


@pytest.fixture(scope="module")
def aot_runs(tmp_path_factory):
    """aot_eager, one case per kind of entry point: without commtrace and with the C wrappers
    (the CI tier; the slow tier runs every case, the pure-Python wrappers and inductor)."""
    tmp = str(tmp_path_factory.mktemp("compile-aot"))
    return {"tmp": tmp,
            "plain": _run(tmp, "plain", False, cases=FAST_CASES),
            "c": _run(tmp, "c", True, cases=FAST_CASES)}


@pytest.fixture(scope="module")
def full_runs(tmp_path_factory):
    """aot_eager, every case: without commtrace, C wrappers, pure-Python wrappers."""
    tmp = str(tmp_path_factory.mktemp("compile-full"))
    return {"tmp": tmp,
            "plain": _run(tmp, "plain", False),
            "c": _run(tmp, "c", True),
            "pure": _run(tmp, "pure", True, pure=True)}


@pytest.fixture(scope="module")
def inductor_runs(tmp_path_factory):
    """inductor (C++ code generated and compiled per graph): the cases that cover each kind of
    entry point once, without commtrace and with the C wrappers."""
    tmp = str(tmp_path_factory.mktemp("compile-inductor"))
    kw = dict(backends="inductor", cases=INDUCTOR_CASES)
    return {"tmp": tmp, "plain": _run(tmp, "plain", False, **kw),
            "c": _run(tmp, "c", True, **kw)}


def _check_same(plain, traced, backend):
    for rank in (0, 1):
        assert set(traced[rank]) == set(plain[rank])
        for key, want in plain[rank].items():
            got = traced[rank][key]
            assert got == want, (rank, key, got, want)
    # the plain run itself shows what the cases are meant to show
    p0 = plain[0]
    for fullgraph in ("graphs", "fullgraph"):
        k = f"{backend}/{fullgraph}/funcol_all"
        assert p0[k]["graphs"] == 1 and p0[k]["breaks"] == 0
        k = f"{backend}/{fullgraph}/c10d_inplace"
        assert p0[k]["graphs"] == 1 and p0[k]["breaks"] == 0   # rewritten to funcol
    assert p0[f"{backend}/graphs/c10d_break"]["breaks"] > 0
    assert p0[f"{backend}/fullgraph/c10d_break"] == {"error": "Unsupported"}


def _check_no_state(res):
    for rank in (0, 1):
        for key, r in res[rank].items():
            if "error" in r:
                continue
            assert r["recompiles"] == 0, key
            assert r["state_guards"] == [], (key, r["state_guards"])
            assert len(set(r["out"])) == 1, key   # same result on every call


def test_aot_eager_same_graphs_breaks_and_outputs(aot_runs):
    _check_same(aot_runs["plain"], aot_runs["c"], "aot_eager")
    _check_no_state(aot_runs["c"])


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("mode", ["c", "pure"])
def test_aot_eager_every_case_c_and_pure_python(full_runs, mode):
    _check_same(full_runs["plain"], full_runs[mode], "aot_eager")
    _check_no_state(full_runs[mode])


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_inductor_same_graphs_breaks_and_outputs(inductor_runs):
    _check_same(inductor_runs["plain"], inductor_runs["c"], "inductor")
    _check_no_state(inductor_runs["c"])


def _check_rows(tmp, mode):
    """The planted eager calls (13 and 17 elements) are rows; collectives inside graphs (every
    funcol call of the cases, 8 elements) are not; calls Dynamo ran eagerly at a graph break
    are, with the user's line."""
    rows = [r for r in load_rows(os.path.join(tmp, f"{mode}-trace"))
            if r["kind"] == "op"]
    for rank in (0, 1):
        mine = [r for r in rows if r["rank"] == rank]
        assert [r["api"] for r in mine if r["count"] == 13] == ["all_reduce"]
        assert [r["api"] for r in mine if r["count"] == 17] == ["funcol.all_reduce"]
        assert [r for r in mine if r["api"].startswith("funcol.") and r["count"] == 8] == []
        inplace = [r for r in mine if r["count"] == 8 and r["api"] in (
            "all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor",
            "reduce_scatter_single", "all_to_all_single", "_all_gather_base")]
        assert inplace == []          # rewritten into the graph
        # c10d_break, fullgraph=False: 3 calls, each running broadcast and reduce eagerly
        for api in ("broadcast", "reduce"):
            got = [r for r in mine if r["api"] == api and r["count"] == 8]
            assert len(got) == 3, (api, len(got))
            assert all("compile_cases.py" in r["site"] for r in got), [r["site"] for r in got]
        assert all(r["t_end_ns"] is not None for r in mine if r["count"] in (8, 13, 17))


def test_eager_calls_are_recorded_compiled_ones_are_not(aot_runs):
    _check_rows(aot_runs["tmp"], "c")


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("mode", ["c", "pure"])
def test_eager_calls_recorded_every_case(full_runs, mode):
    _check_rows(full_runs["tmp"], mode)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_pytorch_inductor_cpu_check_passes_under_commtrace(tmp_path):
    """PyTorch's CompileTestCPU check (fake backend, inductor with the Python and the C++
    wrapper, AOTInductor), written anew in tests/scripts/inductor_cpu_fake.py: it failed under
    commtrace with a KeyError on a guard of commtrace's recorder; now it passes, with the same
    results as without commtrace."""
    script = os.path.join(SCRIPTS, "inductor_cpu_fake.py")
    plain = run_plain([sys.executable, script, str(tmp_path / "plain.json")], timeout=1400)
    assert "OK" in plain.stdout
    traced = run_plain([sys.executable, script, str(tmp_path / "traced.json"), "--commtrace",
                        str(tmp_path / "trace")], timeout=1400)
    assert "OK" in traced.stdout
    want = json.load(open(tmp_path / "plain.json"))
    got = json.load(open(tmp_path / "traced.json"))
    assert got == want
    assert set(got) == {"cpp_wrapper=False", "cpp_wrapper=True", "aoti", "eager"}
    # the eager call at the end is recorded; the compiled ones are not
    rows = [r for r in load_rows(str(tmp_path / "trace")) if r["kind"] == "op"]
    assert [r["api"] for r in rows] == ["funcol.all_reduce"]


@pytest.mark.slow
def test_compiled_ddp_model_same_and_its_allreduces_recorded(tmp_path):
    """``torch.compile(DDP(model))``: the same graphs, breaks and trained parameters with and
    without commtrace, and DDP's gradient all-reduces (issued eagerly by its reducer through
    commtrace's comm hook) in the trace: one per step and rank."""
    script = os.path.join(SCRIPTS, "ddp_compile.py")
    run_plain(torchrun_cmd(script, tmp_path / "plain"), timeout=600)
    run_traced(tmp_path / "trace", torchrun_cmd(script, tmp_path / "traced"), timeout=600)
    for rank in (0, 1):
        want = json.load(open(f"{tmp_path / 'plain'}.{rank}"))
        got = json.load(open(f"{tmp_path / 'traced'}.{rank}"))
        assert got == want
    rows = [r for r in load_rows(str(tmp_path / "trace")) if r["kind"] == "op"]
    for rank in (0, 1):
        assert len([r for r in rows if r["rank"] == rank and r["api"] == "ddp_comm_hook"]) == 3
