"""Coverage of torch.distributed entry points, wrapper identity, and import lightness."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import torch.distributed as dist

from commtrace.capture import api_table
from conftest import ROOT, clean_env


def _public_callables(module):
    """Public callables of `module` defined by torch.distributed (its own functions and classes,
    the C++ bindings it re-exports; not ``typing.cast`` and the like)."""
    for name in dir(module):
        if name.startswith("_"):
            continue
        obj = getattr(module, name)
        if not callable(obj) or inspect.ismodule(obj):
            continue
        mod = getattr(obj, "__module__", None) or ""
        if mod.startswith(("torch.distributed", "torch._C._distributed")):
            yield name, obj


def _funcol():
    import torch.distributed._functional_collectives as fc

    return fc


def _unaccounted(module) -> list[str]:
    """Public callables of `module` that are neither wrapped nor listed with a reason."""
    from commtrace.capture import funcol

    out = []
    for name, obj in _public_callables(module):
        if module.__name__.endswith("_functional_collectives"):
            why = funcol.funcol_reason(name)
            if why is None and inspect.isclass(obj):
                why = api_table.c10d_reason(name, obj)
        else:
            why = api_table.c10d_reason(name, obj)
        if why is None:
            out.append(name)
        else:
            assert len(why) > 5, (name, why)   # a real reason
    return out


def test_every_public_callable_is_wrapped_or_listed_with_a_reason():
    from torch.distributed import distributed_c10d as c10d

    for module in (dist, c10d, _funcol()):
        names = [n for n, _ in _public_callables(module)]
        assert len(names) > 40, (module.__name__, names)   # enumerated from the installed torch
        bad = _unaccounted(module)
        assert not bad, (f"{module.__name__}: public callables neither wrapped nor listed with a "
                         f"reason (commtrace/capture/api_table.py, funcol.py): {bad}")
    # the private entry points libraries call are in the table too
    for name in ("_all_gather_base", "_reduce_scatter_base", "_broadcast_coalesced",
                 "_verify_params_across_processes"):
        if hasattr(dist, name) or hasattr(c10d, name):
            assert name in api_table.API_TABLE


def test_a_new_collective_in_torch_fails_the_coverage_check():
    """What a torch upgrade adding a collective looks like: the check names it."""
    from torch.distributed import distributed_c10d as c10d

    fc = _funcol()

    def all_frobnicate(tensor, group=None, async_op=False):
        pass

    def frobnicate_single(self, group, tag=""):
        pass

    all_frobnicate.__module__ = c10d.__name__
    frobnicate_single.__module__ = fc.__name__
    try:
        c10d.all_frobnicate = all_frobnicate
        dist.all_frobnicate = all_frobnicate
        fc.frobnicate_single = frobnicate_single
        assert _unaccounted(c10d) == ["all_frobnicate"]
        assert _unaccounted(dist) == ["all_frobnicate"]
        assert _unaccounted(fc) == ["frobnicate_single"]
    finally:
        del c10d.all_frobnicate, dist.all_frobnicate, fc.frobnicate_single
    assert _unaccounted(c10d) == [] and _unaccounted(fc) == []


def test_process_group_methods_are_a_documented_decision():
    """``pg.allreduce(...)`` is not wrapped (api_table.PROCESS_GROUP_METHODS says why); a method
    torch adds fails here so that it is decided, not missed."""
    methods = {n for n in dir(dist.ProcessGroup)
               if not n.startswith("_") and callable(getattr(dist.ProcessGroup, n))
               and not inspect.isclass(getattr(dist.ProcessGroup, n))}
    assert methods - api_table.PROCESS_GROUP_METHODS == set()
    assert {"allreduce", "broadcast", "send"} <= methods
    faq = open(os.path.join(ROOT, "docs", "faq.md")).read()
    assert "pg.allreduce" in faq


def test_every_funcol_function_is_wrapped_after_install():
    from commtrace.capture import funcol, registry

    fc = _funcol()
    assert funcol.install()
    try:
        for name in list(funcol.FUNCOL_TABLE) + ["wait_tensor", "batch_p2p_ops_inplace"]:
            if hasattr(fc, name):
                assert registry.is_wrapper(getattr(fc, name)), name
        # DTensor's and FSDP2's names of torch 2.13 are among them
        for name in ("all_gather_single", "reduce_scatter_single", "all_gather_single_autograd",
                     "reduce_scatter_single_coalesced", "isend_inplace", "irecv_inplace",
                     "batch_p2p_ops_inplace", "all_reduce_inplace"):
            if hasattr(fc, name):
                assert registry.is_wrapper(getattr(fc, name)), name
    finally:
        funcol.uninstall()
    assert not registry.is_wrapper(fc.all_gather_single)


def test_install_wraps_both_modules_with_the_same_object_once():
    from torch.distributed import distributed_c10d as c10d

    from commtrace.capture import registry, wrappers

    wrappers.install()
    try:
        first = {n: getattr(dist, n) for n in api_table.API_TABLE if hasattr(dist, n)}
        wrappers.install()  # idempotent: never wrapped twice
        for n, w in first.items():
            assert getattr(dist, n) is w
            assert registry.original_of(w) is not w
            assert not registry.is_wrapper(registry.original_of(w))
            if hasattr(c10d, n) and n in c10d.__dict__:
                assert getattr(c10d, n) is w  # identity matters for batch_isend_irecv
        assert dist.isend is c10d.isend and dist.irecv is c10d.irecv
        assert set(first) <= wrappers.wrapped_names()
    finally:
        wrappers.uninstall()
    assert not registry.is_wrapper(dist.all_reduce)


def test_capture_import_is_light():
    code = (
        "import sys, os, datetime\n"
        "import commtrace\n"
        "import commtrace.capture.api as api\n"
        "import torch.distributed as dist\n"
        "store = dist.HashStore()\n"
        "dist.init_process_group('gloo', store=store, rank=0, world_size=1)\n"
        "commtrace.enable(output=sys.argv[1])\n"
        "import torch\n"
        "dist.all_reduce(torch.ones(3))\n"
        "commtrace.disable()\n"
        "bad = sorted(m for m in ('dash', 'plotly', 'duckdb', 'pandas') if m in sys.modules)\n"
        "print('BAD', bad)\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([sys.executable, "-c", code, d], env=clean_env(),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "BAD []" in p.stdout, p.stdout
        import pyarrow.dataset as ds

        t = ds.dataset(d, partitioning="hive").to_table()
        assert t.column("kind").to_pylist().count("op") == 1
