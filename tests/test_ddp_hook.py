"""commtrace's DDP comm hook (issue 20): traced DDP computes untraced DDP's gradients bit for bit,
and the hook in C, and the hook in C++ (built here as a user builds it: ``commtrace accel
build``), record the rows the Python dispatcher records.

One real gloo job (tests/scripts/ddp_hook_equal.py) trains the same model on the same data four
times: untraced (DDP's C++ all-reduce), traced through the C hook (or the C++ one: with hook
interface v2, its scaling and all-reduce issued through c10d's C++ API; or v1, through Python's
calls), traced through the Python dispatcher, and with torch's ``allreduce_hook`` (``div_``) untraced. The parameters after the
last step are compared exactly with the untraced model's. At 3 ranks torch's hook rounds
differently from DDP's own division (the planted difference the comparison must see); at 2 ranks
both divisions are exact."""

from __future__ import annotations

import json
import os

import pytest

from commtrace.capture import wrappers as Wr
from conftest import SCRIPTS, launch_cmd, load_rows, marked_json, run_traced, torchrun_cmd

needs_c = pytest.mark.skipif(Wr._cfast is None or not hasattr(Wr._cfast, "ddp_hook"),
                             reason="the C fast path is not built here")

# fields that differ between two ops by nature (times, ids) or by the order of the run (seq)
VOLATILE = {"t_enqueue_ns", "t_return_ns", "t_end_ns", "t_wait_ns", "t_wait_end_ns", "op_id",
            "ref_op_id", "thread", "inflight_ids", "inflight", "completion", "seq",
            "first_on_pg", "step", "torch_seq"}


def _job(tmp_path, nproc, env=None, launcher=launch_cmd):
    """The job under `commtrace run`, its ranks started by tests/launch_ranks.py (no torch in
    the launcher), or by torchrun (`launcher=torchrun_cmd`: the default route, as a user runs
    it)."""
    p = run_traced(tmp_path, launcher(os.path.join(SCRIPTS, "ddp_hook_equal.py"), nproc=nproc),
                   env=env, timeout=240)
    res = marked_json(p.stdout, "DDPEQ ")
    assert [r["rank"] for r in res] == list(range(nproc)), p.stdout[-2000:]
    return res, load_rows(tmp_path)


@pytest.fixture(scope="module")
def job2(tmp_path_factory):
    # the C hook: the C++ one off, whatever is built in this user's cache
    return _job(tmp_path_factory.mktemp("ddp-hook-2"), 2, env={"COMMTRACE_DDP_CXX": "0"})


@pytest.fixture(scope="module")
def job2_cxx(tmp_path_factory, accel_cache):
    # the C++ hook: the recording group off (COMMTRACE_DDP_GROUP=0)
    return _job(tmp_path_factory.mktemp("ddp-hook-2-cxx"), 2,
                env={"COMMTRACE_CACHE_DIR": accel_cache, "COMMTRACE_DDP_GROUP": "0"})


@pytest.fixture(scope="module")
def job2_cxx_v1(tmp_path_factory, accel_cache):
    # the C++ hook with interface v2 off: the bucket's scaling and all_reduce through Python
    return _job(tmp_path_factory.mktemp("ddp-hook-2-cxx-v1"), 2,
                env={"COMMTRACE_CACHE_DIR": accel_cache, "COMMTRACE_DDP_V2": "0",
                     "COMMTRACE_DDP_GROUP": "0"})


@pytest.fixture(scope="module")
def job2_group(tmp_path_factory, accel_cache):
    # the default where the module is built: no hook, the recording group, its buckets
    # recorded as C records (session 30)
    return _job(tmp_path_factory.mktemp("ddp-hook-2-group"), 2,
                env={"COMMTRACE_CACHE_DIR": accel_cache}, launcher=torchrun_cmd)


@pytest.fixture(scope="module")
def job2_group_pending(tmp_path_factory, accel_cache):
    # the recording group with its buckets as pending ops (COMMTRACE_DDP_DIRECT=0)
    return _job(tmp_path_factory.mktemp("ddp-hook-2-group-pending"), 2,
                env={"COMMTRACE_CACHE_DIR": accel_cache, "COMMTRACE_DDP_DIRECT": "0"})


def _check_cxx(res, rows, v2):
    """The C++ hook ran every bucket of the traced model, through c10d's C++ API (v2) or
    through Python's calls (v1)."""
    assert all(r["hook_kind"] == "c++" and r["hook_v2"] is v2 for r in res), res
    for r in res:
        n = len(_ddp_rows(rows, r["rank"], r["window_c"]))
        assert n >= 4 and r["counts_c"] == [n, 0], r
        # the module's counters are per process: the first traced model only
        assert r["cxx_counts"] == ([n, 0] if v2 else [0, n]), r


def _ddp_rows(rows, rank, window):
    lo, hi = window
    return sorted((r for r in rows if r["kind"] == "op" and r["rank"] == rank
                   and r["api"] == "ddp_comm_hook" and lo <= r["t_enqueue_ns"] <= hi),
                  key=lambda r: r["t_enqueue_ns"])


def _check(res, rows, torch_hook_equal):
    for r in res:
        rank = r["rank"]
        # the gradients: bit for bit those of untraced DDP
        assert r["equal"]["traced_c"] and r["equal"]["traced_py"], r
        assert r["equal"]["torch_hook"] is torch_hook_equal, r
        rc = _ddp_rows(rows, rank, r["window_c"])
        rp = _ddp_rows(rows, rank, r["window_py"])
        assert len(rc) >= 4 and len(rc) == len(rp), (len(rc), len(rp))
        if r["hook_kind"] == "group":
            # every bucket of the first traced model went through the recording group's C
            # path, of the second through its Python fallback (the C path off)
            assert r["counts_c"] == r["counts_py"] == [len(rc), 0], r
            assert r["group_counts"] == [len(rc), len(rp)], r
        elif r["c_hook"]:
            # every bucket of the first traced model went through the C hook, of the second
            # through the Python dispatcher
            assert r["counts_c"] == [len(rc), 0], r
            assert r["counts_py"] == [len(rc), len(rp)], r
        for x, y in zip(rc, rp):
            assert {k: v for k, v in x.items() if k not in VOLATILE} == \
                {k: v for k, v in y.items() if k not in VOLATILE}
        for rs in (rc, rp):
            # every gradient once per step, in buckets named in `detail`
            assert sum(x["count"] for x in rs) == 4 * r["n_params"]
            assert {json.loads(x["detail"])["ddp_bucket"] for x in rs} >= {0, 1}
            seqs = [x["seq"] for x in rs]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))   # nothing in between
            for x in rs:
                assert (x["op"], x["async_op"], x["pg_size"], x["backend"], x["dtype"],
                        x["device"]) == ("all_reduce", True, r["world"], "gloo", "float32", "cpu")
                assert x["bytes"] == x["out_bytes"] == 4 * x["count"]
                assert x["thread"] == r["thread"]   # issued on the training thread
                assert x["site"] and "ddp_hook_equal.py" in x["site"]   # the user's backward()
                # completed through the Work's future (on gloo's thread), not by a wait()
                assert x["completion"] in ("callback", "observed"), x
                assert x["t_enqueue_ns"] <= x["t_return_ns"] <= x["t_end_ns"]
                assert x["t_wait_ns"] is None


def test_ddp_traced_gradients_equal_untraced_and_c_rows_equal_python_rows(job2):
    res, rows = job2
    assert all(r["hook_kind"] is None for r in res), res   # COMMTRACE_DDP_CXX=0
    # 2 ranks: torch's div_ by 2 is exact too
    _check(res, rows, torch_hook_equal=True)


@needs_c
def test_ddp_cxx_hook_gradients_equal_untraced_and_rows_equal_python_rows(job2_cxx):
    """The C++ hook (registered on DDP's C++ Reducer; it records through the C hook's code and
    stamps completions without the GIL on gloo's thread): the same gradients, bit for bit,
    and the same rows as the Python dispatcher's, completed through the Work's future."""
    res, rows = job2_cxx
    _check_cxx(res, rows, v2=True)
    _check(res, rows, torch_hook_equal=True)
    for r in res:
        # its buckets as C records (session 30), stamped by its continuation
        n = len(_ddp_rows(rows, r["rank"], r["window_c"]))
        assert r["hook_dr"] == r["direct_counts"][0] == n and r["direct_counts"][2] == 0, r


@needs_c
def test_ddp_recording_group_gradients_equal_untraced_and_rows_equal_python_rows(job2_group):
    """No comm hook (the default where the module is built): DDP's Reducer scales as without
    commtrace and issues its all-reduces on commtrace's recording group, which records them
    through the C path: the same gradients, bit for bit, and the same rows as the Python
    dispatcher's, completed through the Work's future, no C++ hook run."""
    res, rows = job2_group
    assert all(r["hook_kind"] == "group" and r["cxx_counts"] == [0, 0] for r in res), res
    _check(res, rows, torch_hook_equal=True)
    for r in res:
        # every bucket of the C model recorded as a C record, its row built by the writer
        n = len(_ddp_rows(rows, r["rank"], r["window_c"]))
        assert r["direct_counts"][0] == r["group_dr"] == n, r
        assert r["direct_counts"][2] == 0, r   # none dropped (rows: _check, above)
        # most without a Python call (direct_pre): all but a bucket's first sight, which the
        # ctx route names (the rows of both compared with the Python path's above)
        assert r["group_direct"] == r["route_counts"][0] >= n // 2, r
        assert r["group_direct"] + r["route_counts"][1] == n, r


@needs_c
def test_ddp_recording_group_pending_ops_rows_equal_python_rows(job2_group_pending):
    """COMMTRACE_DDP_DIRECT=0: the recording group's buckets as pending ops with their rows
    built on the training thread (the route before session 30): the same gradients and rows."""
    res, rows = job2_group_pending
    assert all(r["hook_kind"] == "group" for r in res), res
    _check(res, rows, torch_hook_equal=True)
    assert all(r["direct_counts"][0] == 0 and r["group_dr"] == 0 and r["group_direct"] == 0
               for r in res), res


@needs_c
def test_ddp_cxx_hook_v1_gradients_equal_untraced_and_rows_equal_python_rows(job2_cxx_v1):
    """COMMTRACE_DDP_V2=0 (what the C++ hook does for a group it does not issue on from C++):
    the bucket's scaling and all_reduce through Python's calls; the same gradients and rows."""
    res, rows = job2_cxx_v1
    _check_cxx(res, rows, v2=False)
    _check(res, rows, torch_hook_equal=True)
    # v1 issues through Python's calls: pending ops, no C records
    assert all(r["hook_dr"] == 0 and r["direct_counts"][0] == 0 for r in res), res


@needs_c
@pytest.mark.slow
@pytest.mark.parametrize("bucket_view", [False, True])
def test_ddp_cxx_hook_v2_three_ranks_gradients_equal_untraced(tmp_path, accel_cache,
                                                               bucket_view):
    """Hook interface v2 at 3 ranks, where the division rounds: the C++ scaling (``mul_`` by
    1/3, or ``div_`` by 3 for gradients that are views of their buckets, as DDP) gives
    untraced DDP's gradients bit for bit, and the rows are the Python dispatcher's."""
    env = {"COMMTRACE_CACHE_DIR": accel_cache, "COMMTRACE_DDP_GROUP": "0"}
    if bucket_view:
        env["DDPEQ_BUCKET_VIEW"] = "1"
    res, rows = _job(tmp_path, 3, env=env)
    _check_cxx(res, rows, v2=True)
    # with gradient_as_bucket_view and zero_grad's set_to_none DDP still multiplies (ddp.py
    # _bview_hooks): torch's div_ differs at 3 ranks either way
    _check(res, rows, torch_hook_equal=False)


@pytest.mark.slow
def test_ddp_three_ranks_gradients_equal_untraced(tmp_path):
    """At 3 ranks dividing by 3 and multiplying by 1/3 round differently: commtrace's hook
    multiplies as DDP does; torch's allreduce_hook (what commtrace ran before) does not."""
    res, rows = _job(tmp_path, 3)
    _check(res, rows, torch_hook_equal=False)


@pytest.mark.slow
def test_ddp_pure_python_gradients_equal_untraced(tmp_path):
    """COMMTRACE_PURE_PYTHON=1: the Python dispatcher alone, with the same numerics and rows."""
    res, rows = _job(tmp_path, 2, env={"COMMTRACE_PURE_PYTHON": "1"})
    assert not any(r["c_hook"] for r in res)
    _check(res, rows, torch_hook_equal=True)


@needs_c
@pytest.mark.parametrize("kind", ["group", "c++", "c"])
def test_ddp_join_shadow_allreduces_complete(tmp_path, request, kind):
    """DDP's join mode: the joined rank's shadow all-reduces run the hook through
    ``Reducer._run_comm_hook`` and are waited in Python, never read by ``parseHookResult``;
    the C++ hook's completion times (queued by its continuations without the GIL) are written
    by the writer thread's service all the same: every bucket's row has its end time. So are
    the recording group's (no hook: ``_run_comm_hook`` runs DDP's all-reduce on it)."""
    if kind == "group":
        env = {"COMMTRACE_CACHE_DIR": request.getfixturevalue("accel_cache")}
    elif kind == "c++":
        env = {"COMMTRACE_CACHE_DIR": request.getfixturevalue("accel_cache"),
               "COMMTRACE_DDP_GROUP": "0"}
    else:
        env = {"COMMTRACE_DDP_CXX": "0"}
    p = run_traced(tmp_path, launch_cmd(os.path.join(SCRIPTS, "ddp_join.py")), env=env,
                   timeout=240)
    res = marked_json(p.stdout, "DDPJOIN ")
    assert [r["rank"] for r in res] == [0, 1], p.stdout[-2000:]
    assert all(r["hook_kind"] == (kind if kind != "c" else None) for r in res), res
    rows = load_rows(tmp_path)
    per_rank = {}
    for r in res:
        ops = [x for x in rows if x["kind"] == "op" and x["rank"] == r["rank"]
               and x["api"] == "ddp_comm_hook"]
        per_rank[r["rank"]] = ops
        for x in ops:
            assert x["t_end_ns"] is not None and x["completion"] in ("callback", "observed"), x
            assert x["t_enqueue_ns"] <= x["t_return_ns"] <= x["t_end_ns"]
    # rank 1 joined after 2 of 6 steps: its DDP shadowed rank 0's later buckets
    assert res[1]["steps"] < res[0]["steps"]
    assert len(per_rank[1]) == len(per_rank[0]) > 0, {k: len(v) for k, v in per_rank.items()}


@needs_c
def test_ddp_hook_benchmarks_run_and_use_v2(accel_cache):
    """benchmarks/ddp_hook_call.py and ddp_hooks.py (a few rounds: what they print, not their
    figures): the C++ hook registers with interface v2 on the DDP sample, and with v1 when
    COMMTRACE_DDP_V2=0 is set for its copy."""
    import subprocess
    import sys

    from conftest import clean_env

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = clean_env({"COMMTRACE_CACHE_DIR": accel_cache})
    p = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "ddp_hook_call.py"),
                        "--rounds", "2", "--calls", "4"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "'cxx': 'c++ v2', 'cxx_v1': 'c++', 'c': 'c'" in p.stdout, p.stdout
    assert "thread CPU per bucket (over floor): floor " in p.stdout, p.stdout
    p = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "ddp_hooks.py"),
                        "--world", "1", "--modes", "cxx_v1,cxx", "--rounds", "2", "--steps", "2"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "'cxx_v1': 'c++', 'cxx': 'c++ v2'" in p.stdout, p.stdout
    assert "1 rank(s)" in p.stdout and "cxx_v1 " in p.stdout, p.stdout


def test_v2_group_only_for_torchs_process_group_on_gloo_or_nccl(monkeypatch):
    """Hook interface v2 is asked for only where it issues what Python would: a group of
    exactly torch's ProcessGroup class whose backends are gloo or NCCL, commtrace's own
    scaling (also while Python scales the buckets), and not COMMTRACE_DDP_V2=0; else None (v1)."""
    import types

    from commtrace.capture import ddp as D

    class PG:   # stands for torch's ProcessGroup
        def __init__(self, backend):
            self.backend = backend

    class SubPG(PG):
        pass

    fake = types.SimpleNamespace(ProcessGroup=PG, get_backend=lambda pg: pg.backend)
    monkeypatch.setattr(D, "_dist", fake)
    monkeypatch.delenv("COMMTRACE_DDP_V2", raising=False)

    def state(base, py=False):
        # py: the buckets go to the Python hook (join count, bucket views: ddp._route)
        s = D._HookState(None)
        s.base, s.join_dyn = base, py
        D._route(s)
        assert (s.scale[0] == "py") is (py and base is not None) if s.scale else base is None
        return s

    for backend in ("gloo", "nccl", "cpu:gloo,cuda:nccl"):
        pg = PG(backend)
        assert D._v2_group(state(("mul_", 0.5, pg))) is pg, backend
        assert D._v2_group(state(("div_", 2, pg))) is pg, backend
        assert D._v2_group(state(("mul_", 0.5, pg), py=True)) is pg, backend
    for backend in ("mpi", "ucc", "cpu:gloo,cuda:custom", "fake", ""):
        assert D._v2_group(state(("mul_", 0.5, PG(backend)))) is None, backend
    assert D._v2_group(state(("mul_", 0.5, SubPG("gloo")))) is None   # a subclass
    assert D._v2_group(state(None)) is None                          # torch's hook's numerics
    assert D._v2_group(state(None, py=True)) is None
    fake.get_backend = lambda pg: 1 / 0                              # a failing look-up
    assert D._v2_group(state(("mul_", 0.5, PG("gloo")))) is None
    fake.get_backend = lambda pg: pg.backend
    monkeypatch.setenv("COMMTRACE_DDP_V2", "0")
    assert D._v2_group(state(("mul_", 0.5, PG("gloo")))) is None


def test_recording_group_only_where_it_can_wrap(monkeypatch):
    """The recording group (capture/ddp.py _install_group) is handed to a model's Reducer only
    where the built module has it, the C path is on, the group is exactly torch's
    ProcessGroup on gloo or NCCL, the model has no mixed precision and no Python reducer, and
    not COMMTRACE_DDP_GROUP=0; anywhere else, or where wrapping fails, nothing is changed (the
    caller then registers the hook)."""
    import types

    from commtrace.capture import accel
    from commtrace.capture import ddp as D
    from commtrace.capture import recorder as R

    class PG:   # stands for torch's ProcessGroup
        def __init__(self, backend="gloo"):
            self.backend = backend

    class SubPG(PG):
        pass

    class Reducer:
        def __init__(self):
            self.got = []

        def _update_process_group(self, g):
            self.got.append(g)

    class Model:
        def __init__(self, pg=None, **kw):
            self.process_group = pg if pg is not None else PG()
            self.reducer = Reducer()
            self.mixed_precision = None
            self.__dict__.update(kw)

    monkeypatch.setattr(D, "_dist", types.SimpleNamespace(ProcessGroup=PG,
                                                          get_backend=lambda pg: pg.backend))
    monkeypatch.setattr(D, "_by_reducer", {})
    monkeypatch.setattr(R, "STAMP_FLUSHERS", [])
    monkeypatch.setattr(Wr, "_cfast", types.SimpleNamespace(ddp_cxx_api=lambda: "capsule"))
    monkeypatch.setattr(D, "_hook_in_c", lambda: "c hook")
    seen = []

    def wrap(pg, state, fallback, capsule):
        seen.append((pg, state.user_hook, state.scale, fallback, capsule))
        return "recording group", "control"

    mod = types.SimpleNamespace(wrap_group=wrap, flush_all=lambda: None)
    monkeypatch.setattr(accel, "load", lambda: mod)
    monkeypatch.delenv("COMMTRACE_DDP_GROUP", raising=False)

    m = Model()
    assert D._install_group(m) is True
    assert m.reducer.got == ["recording group"]
    assert seen == [(m.process_group, None, ("mul_", 1.0, m.process_group), D._group_fallback,
                     "capsule")]
    assert m.__dict__["_commtrace_group"] == "control"
    assert m.__dict__["_commtrace_hook_kind"] == "group"
    assert D._by_reducer[id(m.reducer)]() is m and R.STAMP_FLUSHERS == [mod.flush_all]

    def refused(m):
        assert D._install_group(m) is False
        assert m.reducer.got == [] and "_commtrace_group" not in m.__dict__

    refused(Model(SubPG()))                              # a subclass of the group
    for backend in ("mpi", "ucc", "cpu:gloo,cuda:custom", ""):
        refused(Model(PG(backend)))
    refused(Model(mixed_precision=object()))
    refused(Model(_use_python_reducer=True))
    monkeypatch.setenv("COMMTRACE_DDP_GROUP", "0")
    refused(Model())
    monkeypatch.delenv("COMMTRACE_DDP_GROUP")
    monkeypatch.setattr(D, "_hook_in_c", lambda: None)   # the C path off
    refused(Model())
    monkeypatch.setattr(D, "_hook_in_c", lambda: "c hook")
    monkeypatch.setattr(accel, "load", lambda: None)     # not built for this torch
    refused(Model())
    monkeypatch.setattr(accel, "load", lambda: types.SimpleNamespace())   # an older build
    refused(Model())

    def broken(*a):
        raise RuntimeError("cannot wrap")

    monkeypatch.setattr(accel, "load", lambda: types.SimpleNamespace(wrap_group=broken))
    refused(Model())
