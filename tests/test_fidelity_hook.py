"""Ops issued below Python, merged from the completion hook (issue 13, item 2), on the CPU:
tests/scripts/fidelity_hook.py's group numbers its ops and calls the hook with WorkInfo-like
records as ProcessGroupNCCL does (the real NCCL check is in scripts/gpu_check.py)."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import SCRIPTS, free_port, load_rows, run_plain, run_traced

HOOK = f"{SCRIPTS}/fidelity_hook.py"
EPOCH_NS = 1_700_000_000 * 10**9


@pytest.fixture(scope="module")
def hooked(tmp_path_factory):
    d = tmp_path_factory.mktemp("hook")
    plain = run_plain([sys.executable, HOOK, str(free_port())])
    traced = run_traced(d / "run", [sys.executable, HOOK, str(free_port())],
                        opts=("--completion-hook",))
    return d / "run", plain, traced


def key(r):
    return (r["api"], r["op"], r["seq"], r["torch_seq"])


def test_same_results_and_quiet(hooked):
    run, plain, traced = hooked
    assert plain.returncode == traced.returncode == 0
    res = [line for line in traced.stdout.splitlines() if line.startswith("RESULT")]
    assert res == [line for line in plain.stdout.splitlines() if line.startswith("RESULT")]
    assert "commtrace:" not in traced.stderr.replace("commtrace: trace of", "").replace(
        "commtrace: next:", "")   # no warning: gloo's refusal of the hook is silent


def test_shim_rows_claim_their_seqs_and_cpp_rows_fill_the_rest(hooked):
    run, _p, _t = hooked
    rows = [r for r in load_rows(run) if r["kind"] == "op"]
    hook = sorted((r for r in rows if r["backend"] == "hook-pg"),
                  key=lambda r: (r["api"] == "c++", r["torch_seq"] if r["op"] != "send" else 99))
    # on a hooked group a collective's seq is the group's own number, wrapped or c++
    assert [key(r) for r in hook] == [
        ("all_reduce", "all_reduce", 1, 1), ("all_reduce", "all_reduce", 2, 2),
        ("all_reduce", "all_reduce", 3, 3), ("all_reduce", "all_reduce", 5, 5),
        ("c++", "all_reduce", 4, 4), ("c++", "all_gather", 6, 6),
        ("c++", "reduce_scatter", 7, 7), ("c++", "send", None, 1)]
    assert len({r["pg"] for r in hook}) == 1
    cpp = [r for r in hook if r["api"] == "c++"]
    for k, r in enumerate(cpp, start=1):
        # planted: started at EPOCH + k s, finished 2 ms later, 1.5 ms on the device
        assert r["t_enqueue_ns"] == EPOCH_NS + k * 10**9
        assert r["t_end_ns"] == r["t_enqueue_ns"] + 2_000_000
        assert r["completion"] == "hook" and r["site"] is None and r["count"] is None
        assert json.loads(r["detail"])["active_duration_ns"] == 1_500_000
        assert r["pg_size"] == 1 and r["rank"] == 0
    shim = [r for r in hook if r["api"] != "c++"]
    assert all(r["site"] and r["site"].endswith(".py:" + r["site"].rsplit(":", 1)[1]) for r in shim)
    assert [r["async_op"] for r in shim] == [False, False, False, True]
    # the default group (gloo) refuses the hook: its row has no torch_seq and no c++ twin
    world = [r for r in rows if r["pg"] == "0"]
    assert [key(r) for r in world] == [("all_reduce", "all_reduce", 0, None)]


def test_steady_clock_workinfo_times_map_onto_the_wall_clock():
    """torch 2.11's ProcessGroupNCCL hands steady_clock time points, which pybind turns into a
    timedelta since CLOCK_MONOTONIC's epoch (seen on the GPU check): mapped to epoch ns."""
    import datetime
    import time

    from commtrace.capture import completion_hook as CH

    class Rec:
        def now_ns(self):
            return time.time_ns() + 5_000_000_000   # a recorder with an injected +5 s skew

    mono = time.monotonic_ns() - 3_000_000          # 3 ms ago on the monotonic clock
    td = datetime.timedelta(microseconds=mono // 1000)
    want = time.time_ns() + 5_000_000_000 - 3_000_000
    got = CH._ns(td, Rec())
    assert abs(got - want) < 2_000_000, (got - want)
    assert CH._ns(datetime.timedelta(seconds=1), None) < time.time_ns()
    assert CH._ns(None) is None and CH._ns(123) == 123
