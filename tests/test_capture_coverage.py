"""Coverage of torch.distributed entry points, wrapper identity, and import lightness."""

from __future__ import annotations

import inspect
import subprocess
import sys

import torch.distributed as dist

from commtrace.capture import api_table
from conftest import clean_env


def _functions():
    for name in dir(dist):
        obj = getattr(dist, name)
        if name.startswith("__") or inspect.isclass(obj) or inspect.ismodule(obj):
            continue
        if callable(obj):
            yield name


def test_every_function_is_wrapped_or_skipped_with_reason():
    unknown = []
    for name in _functions():
        if name in api_table.API_TABLE or name in api_table.SPECIAL:
            continue
        if name in api_table.SKIPPED:
            assert len(api_table.SKIPPED[name]) > 10  # a real reason
            continue
        if name.startswith(api_table.NON_COMMUNICATING_PREFIXES):
            continue
        unknown.append(name)
    assert not unknown, ("torch.distributed functions neither wrapped nor skipped with a reason "
                         f"(add them to commtrace/capture/api_table.py): {unknown}")
    # the new names of torch 2.13 are really wrapped
    for name in ("all_gather_single", "reduce_scatter_single", "_all_gather_base",
                 "_reduce_scatter_base", "batch_isend_irecv"):
        if hasattr(dist, name):
            assert name in api_table.API_TABLE or name in api_table.SPECIAL


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
