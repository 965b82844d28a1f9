"""The async path in C (issue 20): ops issued with async_op=True are recorded by
commtrace/capture/_fastpath.c with no Python frame per op, and the rows are the Python path's.

The equality test runs one real 2-rank gloo job twice -- C paths, and pure Python
(COMMTRACE_PURE_PYTHON=1) -- and compares every row but times, ids and threads; the times are
checked for order in each. (COMMTRACE_ASYNC_C=0 keeps the blocking C path and turns the async
one off.)"""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest

from commtrace.capture import wrappers as Wr
from conftest import SCRIPTS, launch_cmd, load_rows, run_both_paths, run_traced

needs_c = pytest.mark.skipif(Wr._cfast is None or not hasattr(Wr._cfast, "set_async"),
                             reason="the C fast path is not built here")

# completion: "callback", "observed" or "wait" depends on which came first (a race by nature)
VOLATILE = {"t_enqueue_ns", "t_return_ns", "t_end_ns", "t_wait_ns", "t_wait_end_ns", "op_id",
            "ref_op_id", "thread", "inflight_ids", "inflight", "completion"}
MODES = {"c": {}, "pure-python": {"COMMTRACE_PURE_PYTHON": "1"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, env in MODES.items():
        d = tmp_path_factory.mktemp(f"async-{name}")
        # the light launcher (tests/launch_ranks.py): capture under `commtrace run -- torchrun`
        # is test_robustness's (and the slow stage's test_capture_e2e)
        p = run_traced(d, launch_cmd(os.path.join(SCRIPTS, "async_mix.py")), env=env,
                       timeout=240)
        n_c = [int(x) for x in re.findall(r"async ops recorded in C: (\d+)", p.stdout)]
        marks = [tuple(int(x) for x in m) for m in re.findall(
            r"marks in C: (\d+) in Python: (\d+) reads in C: (\d+)", p.stdout)]
        out[name] = (load_rows(d), n_c, marks)
    return out


def _key(r):
    return json.dumps(r, sort_keys=True, default=str)


def _stable(rows):
    out = []
    for r in rows:
        s = {k: v for k, v in r.items() if k not in VOLATILE}
        # what the times say, not their values: completed, waited
        s["has_t_end"] = r["t_end_ns"] is not None
        s["has_t_wait"] = r["t_wait_ns"] is not None
        out.append(s)
    return sorted(out, key=_key)


@needs_c
def test_c_async_path_records_the_python_paths_rows(runs):
    c_rows, n_c, _ = runs["c"]
    # most async ops took the C path: 36 collectives, and of the 12 isend / irecv per rank
    # all but the first of each (the Python path learns their Work type)
    assert len(n_c) == 2 and min(n_c) >= 25 + 10, n_c
    assert runs["pure-python"][1] == [0, 0]
    ops = [r for r in c_rows if r["kind"] == "op" and r["async_op"]]
    # 4 x 6 collectives + 6 + 1 + 3 all_reduces + DDP's (at least one bucket per step), per rank
    assert sum(r["rank"] == 0 for r in ops) >= 4 * 6 + 6 + 1 + 3 + 3
    assert {r["api"] for r in ops} >= {"all_reduce", "broadcast", "all_gather_into_tensor",
                                       "reduce_scatter_tensor", "all_to_all_single", "reduce",
                                       "ddp_comm_hook", "isend", "irecv"}
    p2p = [r for r in ops if r["api"] in ("isend", "irecv")]
    # 12 per rank, and 3 in the steps at the end
    assert len(p2p) == 2 * (12 + 3) and all(r["completion"] in ("wait", "observed") for r in p2p)
    assert any(r["kind"] == "hazard" for r in c_rows)
    assert _stable(c_rows) == _stable(runs["pure-python"][0])


@needs_c
def test_c_step_marks_and_host_reads_record_the_python_paths_rows(runs):
    """The step marker and the hazard readers in C (issue 20, the pipeline sample): the C run
    made its marks and most host reads in C, and its mark and hazard rows (with their sites
    and steps) are the pure-Python run's."""
    c_rows, _, marks = runs["c"]
    py_rows, _, py_marks = runs["pure-python"]
    # 3 steps of the first optimizer per rank, all marked in C; 7 host reads per step with
    # every pending op waited (C), 2 with an op not waited (the Python reader)
    assert len(marks) == 2 and all(m[0] == 3 and m[1] == 0 and m[2] >= 3 * 6 for m in marks), marks
    assert py_marks == [(0, 0, 0), (0, 0, 0)]
    for rows in (c_rows, py_rows):
        mk = [r for r in rows if r["kind"] == "mark"]
        assert sorted((r["rank"], r["step"]) for r in mk) == [(0, 1), (0, 2), (0, 3),
                                                             (1, 1), (1, 2), (1, 3)]
        assert all(r["detail"] == "optimizer.step" and r["site"].endswith(
            f"async_mix.py:{_line_of('opt.step()')}") for r in mk), mk
        hz = [r for r in rows if r["kind"] == "hazard"]
        # the read before wait at the top, and y.tolist() at each of the 3 steps, per rank
        assert sorted(r["site"].rsplit(":", 1)[1] for r in hz if r["rank"] == 0) == sorted(
            [str(_line_of("x.tolist()"))] + [str(_line_of("y.tolist()"))] * 3), hz
        ops = [r for r in rows if r["kind"] == "op" and r["api"] == "all_reduce"
               and r["count"] == 4]
        # (ops before the first step are step 0)
        assert sorted(r["step"] for r in ops if r["rank"] == 1) == [0, 0, 1, 2], ops
    stable = [[r for r in _stable(rows) if r["kind"] in ("mark", "hazard")]
              for rows in (c_rows, py_rows)]
    assert stable[0] == stable[1]


def _line_of(text: str) -> int:
    """The line of async_mix.py that starts with `text` (after its indentation)."""
    with open(os.path.join(SCRIPTS, "async_mix.py")) as f:
        for i, line in enumerate(f, 1):
            if line.strip().startswith(text):
                return i
    raise AssertionError(text)


@pytest.mark.parametrize("mode", list(MODES))
def test_async_rows_times_in_order(runs, mode):
    rows = runs[mode][0]
    ops = [r for r in rows if r["kind"] == "op" and r["async_op"]]
    assert ops
    for r in ops:
        assert r.get("completion", "callback") in ("callback", "observed", "wait"), r
        assert r["t_enqueue_ns"] <= r["t_return_ns"]
        assert r["t_end_ns"] is not None and r["t_end_ns"] >= r["t_enqueue_ns"]
        if r["t_wait_ns"] is not None:
            assert r["t_return_ns"] <= r["t_wait_ns"] <= r["t_wait_end_ns"]
            assert r["t_end_ns"] <= r["t_wait_end_ns"]   # completed by the time wait returned
    waited = [r for r in ops if r["api"] != "ddp_comm_hook" and r["count"] != 3]
    assert waited and all(r["t_wait_ns"] is not None for r in waited)


def test_async_completion_wait_attaches_no_callback(tmp_path):
    """--async-completion wait (issue 20): no completion callback on the backend's thread;
    t_end_ns comes from wait() ("wait") or a look at the Work ("observed"), never a callback,
    on the C and the pure Python paths alike, with the same rows otherwise."""
    code = textwrap.dedent('''
        import sys, torch, torch.distributed as dist, commtrace
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2],
                                rank=0, world_size=1)
        calls = []
        Future = torch._C.Future   # what Work.get_future() returns
        orig = Future.add_done_callback
        def spy(self, fn):
            calls.append(fn)
            return orig(self, fn)
        Future.add_done_callback = spy
        orig_done = Future.done
        def done_spy(self):   # the look before attaching (callback mode asks the future)
            calls.append("done")
            return orig_done(self)
        Future.done = done_spy
        with commtrace.trace(output=sys.argv[1], async_completion="wait"):
            t = torch.ones(16)
            for i in range(6):
                dist.all_reduce(t, async_op=True).wait()
                dist.broadcast(t, src=0, async_op=True).wait()
        from commtrace.capture import wrappers as W
        c = W._cfast
        print("callbacks", len(calls), "async_c", c.async_counts()[1] if c is not None else 0)
        dist.destroy_process_group()
    ''')
    out = {}
    for mode, d, stdout in run_both_paths(code, tmp_path):
        cb, n_c = (int(x) for x in stdout.split()[1::2])
        assert cb == 0              # the future is not even asked (no callback attached)
        assert (n_c >= 8) if (mode == "0" and Wr._cfast is not None) else n_c == 0
        rows = [r for r in load_rows(d) if r["kind"] == "op"]
        assert len(rows) == 12
        for r in rows:
            assert r["completion"] in ("wait", "observed"), r
            assert r["t_end_ns"] <= r["t_wait_end_ns"]
        out[mode] = _stable(rows)
    assert out["0"] == out["1"]


def test_no_listener_call_per_async_op(tmp_path):
    """Hazard detection's basic mode takes a late "nothing pending" (issue 20): in a loop of
    one async op and its wait(), the pending-op listener is told the first 0 -> >0 and then
    nothing per op from the training thread (before: twice per op, 1.2-1.5 us of CPU at world
    size 1); the owed 0 comes from the writer thread. A host read of a pending tensor is
    still a hazard row, and detection goes idle once nothing is pending. C and pure Python
    paths alike."""
    code = textwrap.dedent('''
        import sys, threading, time, torch, torch.distributed as dist, commtrace
        from commtrace.capture import hazards, recorder as R
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2],
                                rank=0, world_size=1)
        with commtrace.trace(output=sys.argv[1]):
            rec = R.get_recorder()
            assert rec.lazy_idle and len(rec._listeners) == 1
            calls = []
            orig = rec._listeners[0]
            def spy(n, orig=orig):
                calls.append((n, threading.get_ident() == threading.main_thread().ident))
                orig(n)
            rec._listeners[0] = spy
            t = torch.ones(16)
            for i in range(200):
                dist.all_reduce(t, async_op=True).wait()
            loop = list(calls)
            x = torch.ones(4)
            w = dist.all_reduce(x, async_op=True)
            x.tolist()                 # use before wait: a hazard row
            w.wait()
            deadline = time.monotonic() + 30
            while hazards.stats()["active"] and time.monotonic() < deadline:
                time.sleep(0.01)
            print("main", sum(m for _, m in loop), "main0", sum(m and n == 0 for n, m in loop),
                  "writer0", sum((not m) and n == 0 for n, m in loop),
                  "active", int(hazards.stats()["active"]), "owed", int(rec._idle_owed))
        dist.destroy_process_group()
    ''')
    out = {}
    for mode, d, stdout in run_both_paths(code, tmp_path):
        v = dict(zip(stdout.split()[0::2], (int(x) for x in stdout.split()[1::2])))
        assert v["main0"] == 0, v             # the training thread never tells a 0
        # a 0 -> >0 told again only after the writer thread delivered an owed 0
        assert 1 <= v["main"] <= 1 + v["writer0"], v
        assert v["main"] < 20, v              # 200 ops: not one call per op (was 400 calls)
        assert v["active"] == 0 and v["owed"] == 0, v
        rows = load_rows(d)
        assert sum(r["kind"] == "op" for r in rows) == 201
        hz = [r for r in rows if r["kind"] == "hazard"]
        assert [(r["api"], r["op"]) for r in hz] == [("Tensor.tolist", "all_reduce")], hz
        out[mode] = v


def test_step_marks_share_one_site_string(tmp_path):
    """The step marker's site (issue 20, the DDP writer cost): every mark row of one call site
    holds the same string object, on the C and the pure Python paths, so that the writer
    encodes it once per part rather than once per row; the values are the call's file:line
    and the rows are the same on both paths."""
    code = textwrap.dedent('''
        import sys, torch, torch.distributed as dist, commtrace
        from commtrace.capture import recorder as R
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2],
                                rank=0, world_size=1)
        w = torch.nn.Parameter(torch.ones(4))
        opt = torch.optim.SGD([w], lr=0.1)
        opt2 = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
        with commtrace.trace(output=sys.argv[1]):
            rec = R.get_recorder()
            rec.auto_flush = False
            for i in range(5):
                w.grad = torch.ones(4)
                opt.step()
                if i == 2:
                    opt.step()  # a second site
            sites = [r[R.I_SITE] for r in list(rec._ready) if r[R.I_KIND] == "mark"]
            print("marks", len(sites), "objects", len({id(s) for s in sites}),
                  "values", len(set(sites)))
        dist.destroy_process_group()
    ''')
    out = {}
    for mode, d, stdout in run_both_paths(code, tmp_path):
        n, objs, vals = (int(x) for x in stdout.split()[1::2])
        assert (n, objs, vals) == (6, 2, 2), (mode, stdout)
        mk = [r for r in load_rows(d) if r["kind"] == "mark"]
        lines = sorted(int(r["site"].rsplit(":", 1)[1]) for r in mk)
        src = code.splitlines()
        at = [i for i, l in enumerate(src, 1) if l.strip() == "opt.step()"]
        at2 = [i for i, l in enumerate(src, 1) if l.strip().startswith("opt.step()  #")]
        assert lines == sorted(at * 5 + at2), (lines, at, at2)
        assert [r["step"] for r in sorted(mk, key=lambda r: r["t_enqueue_ns"])] == [1, 2, 3, 4,
                                                                                  5, 6]
        out[mode] = sorted((r["step"], r["site"], r["detail"]) for r in mk)
    assert out["0"] == out["1"]
