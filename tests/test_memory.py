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


def _table(n=2000):
    from commtrace.format import writer as W

    return W.rows_to_table_nopandas({
        "kind": ["op"] * n, "rank": [1] * n, "pg": ["0"] * n, "seq": list(range(n)),
        "op": ["all_reduce"] * n, "t_enqueue_ns": [1_700_000_000_000_000_000 + 1000 * i for i in range(n)],
        "site": [f"train.py:{40 + i % 3}" for i in range(n)],
        "inflight_ids": [[i, i + 1] if i % 2 else None for i in range(n)]})


def test_lean_parquet_write_is_byte_identical(tmp_path, monkeypatch):
    """The rank's writer skips pyarrow.parquet (and its filesystem modules) but writes exactly
    the bytes pyarrow.parquet.write_table writes; the fallback path writes them too."""
    import pyarrow.parquet as pq

    from commtrace.format import writer as W

    t = _table().replace_schema_metadata(W.file_metadata({"rank": 1}))
    pq.write_table(t, tmp_path / "ref.parquet", compression="zstd", **W.encoding_kwargs(t.schema))
    monkeypatch.setattr(W, "_lean_ok", True)
    W.write_parquet(t, str(tmp_path / "lean.parquet"))
    assert W._lean_ok is True  # the private writer took the arguments
    # encoded in memory, one write (BUFFERED_WRITE, the default) or through pyarrow's file sink
    monkeypatch.setattr(W, "BUFFERED_WRITE", False)
    W.write_parquet(t, str(tmp_path / "unbuffered.parquet"))
    monkeypatch.setattr(W, "_lean_ok", False)
    W.write_parquet(t, str(tmp_path / "fallback.parquet"))
    ref = (tmp_path / "ref.parquet").read_bytes()
    assert (tmp_path / "lean.parquet").read_bytes() == ref
    assert (tmp_path / "unbuffered.parquet").read_bytes() == ref
    assert (tmp_path / "fallback.parquet").read_bytes() == ref
    back = pq.read_table(tmp_path / "lean.parquet")
    assert back.num_rows == 2000 and back["inflight_ids"][3].as_py() == [3, 4]
    assert back["seq"].to_pylist() == list(range(2000))
    # Timestamps, ids, seq and step are delta-encoded (docs/performance.md, bytes per op).
    col = pq.ParquetFile(tmp_path / "lean.parquet").metadata.row_group(0)
    enc = {col.column(i).path_in_schema: col.column(i).encodings for i in range(col.num_columns)}
    assert "DELTA_BINARY_PACKED" in enc["t_enqueue_ns"] and "DELTA_BINARY_PACKED" in enc["seq"]
    assert "RLE_DICTIONARY" in enc["site"]


def test_write_errors_propagate_on_both_paths(monkeypatch, tmp_path):
    """Write errors (no directory, a full disk at the footer) reach the recorder, which counts
    the rows as dropped; they never switch the writer to the fallback path."""
    import pytest
    from pyarrow import _parquet

    from commtrace.format import writer as W

    for lean, buffered in ((True, True), (True, False), (False, True)):
        monkeypatch.setattr(W, "_lean_ok", lean)
        monkeypatch.setattr(W, "BUFFERED_WRITE", buffered)
        with pytest.raises(OSError):
            W.write_parquet(_table(), str(tmp_path / "no-such-dir" / "x.parquet"))
        assert W._lean_ok is lean
        assert not (tmp_path / "no-such-dir").exists()
    monkeypatch.setattr(W, "BUFFERED_WRITE", True)

    class FullDisk(_parquet.ParquetWriter):
        def close(self):
            super().close()
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(_parquet, "ParquetWriter", FullDisk)
    monkeypatch.setattr(W, "_lean_ok", True)
    with pytest.raises(OSError, match="No space left"):
        W.write_parquet(_table(), str(tmp_path / "x.parquet"))
    assert W._lean_ok is True


def test_rank_side_writer_does_not_import_pyarrow_fs(tmp_path):
    """In a fresh process (a rank), writing a part imports neither pyarrow.parquet nor
    pyarrow.fs (the S3/GCS/Azure/HDFS modules)."""
    code = ("import sys, json; from commtrace.format import writer as W; "
            "t = W.rows_to_table_nopandas({'kind': ['op'], 'rank': [0]}); "
            "p = W.write_part(sys.argv[1], 0, t, {'rank': 0}, index=1); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('pyarrow.parquet', 'pyarrow.fs', 'pyarrow._s3fs')))))")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == []
    import pyarrow.parquet as pq

    (part,) = (tmp_path / "run" / "rank=0").glob("*.parquet")
    assert pq.read_table(part).to_pylist()[0]["kind"] == "op"
