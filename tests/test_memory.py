"""Allocator settings passed to traced commands (commtrace/capture/memory.py; the figures are
in the Soak section of docs/performance.md, measured by benchmarks/soak.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from commtrace.capture import memory
from commtrace.cli.run import child_env
from commtrace.config import Config


def test_traced_command_gets_lazy_mimalloc_commit():
    env = child_env(Config(output="/tmp/x"), base={"PATH": "/usr/bin"})
    assert env["MIMALLOC_ARENA_EAGER_COMMIT"] == "0"
    assert memory.allocator_env({}) == {"MIMALLOC_ARENA_EAGER_COMMIT": "0"}


def test_users_allocator_setting_is_kept():
    env = child_env(Config(output="/tmp/x"), base={"MIMALLOC_ARENA_EAGER_COMMIT": "1"})
    assert env["MIMALLOC_ARENA_EAGER_COMMIT"] == "1"
    assert memory.allocator_env({"MIMALLOC_ARENA_EAGER_COMMIT": "2"}) == {}


def test_setting_reaches_a_child_and_pyarrow_still_writes(tmp_path):
    """The variable arrives in the child before pyarrow loads, and Parquet round-trips."""
    code = ("import os, json, sys, pyarrow as pa, pyarrow.parquet as pq; "
            "pq.write_table(pa.table({'a': list(range(1000))}), sys.argv[1]); "
            "print(json.dumps([os.environ.get('MIMALLOC_ARENA_EAGER_COMMIT'), "
            "pq.read_table(sys.argv[1])['a'].to_pylist()[-1]]))")
    env = child_env(Config(output=str(tmp_path)), base={"PATH": "/usr/bin:/bin"})
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.parquet")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == ["0", 999]
