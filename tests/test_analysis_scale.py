"""Analysis at scale (issue 17): the chunked, on-disk, spillable paths give the same answers as
the in-memory one-piece path; the generator streams in blocks without changing its output; the
trace format's bytes per op; module structure (findings and report read Run's public tables,
no import cycle)."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import commtrace
from commtrace.analysis import loading as L
from commtrace.analysis import overlap as OV
from commtrace.analysis.synth import synth_run

from report_compare import assert_same


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("scale") / "run"
    synth_run(str(d), ranks=6, ops=900, straggler=[(4, 3_000_000)], hazards=True,
              init_stall_ns=40_000_000, late_send=[(1, 2_000_000)], parts_per_rank=3, seed=11)
    return str(d)


def _report(path, **kw):
    run = commtrace.load(path, **kw)
    try:
        rep = run.report()
        sub = run.report(steps=(2, 9))
        extra = {"per_step": run.per_step().to_pylist(), "waits": run.waits().num_rows,
                 "p2p": run.p2p().to_pylist(), "ops": run.ops().num_rows}
    finally:
        run.close()
    for r in (rep, sub):
        r.pop("path")
    return rep, sub, extra


@pytest.mark.parametrize("split", [True, False], ids=["op-table-on-disk", "all-on-disk"])
def test_chunked_on_disk_load_gives_the_same_report(synth_dir, monkeypatch, split):
    """The default (one chunk, in memory) and the large-run paths (a database file, the load in
    chunks of ranks, overlap by chunks of one rank, a tight memory limit) agree on every
    number of the report, a step subset, per_step, waits and p2p pairs: with the op table in
    the file and the derived tables in memory (`split`, up to SPLIT_MAX_ROWS rows), and with
    everything in the file (above it)."""
    ref = _report(synth_dir)
    assert ref[0]["finding_counts"].get("straggler") == 1
    monkeypatch.setattr(L, "DISK_ROWS", 0)
    monkeypatch.setattr(L, "LOAD_CHUNK_ROWS", 1500)
    monkeypatch.setattr(L, "SPLIT_MAX_ROWS", 10**9 if split else 0)
    monkeypatch.setattr(OV, "CHUNK_ROWS", 10)
    seen = {}
    real_close = L.close

    def close(con, tmp):
        seen["tmp"] = tmp
        seen["existed"] = tmp is not None and os.path.isdir(tmp)
        seen["where"] = {name: db for db, name in con.execute(
            "SELECT database_name, table_name FROM duckdb_tables()").fetchall()}
        return real_close(con, tmp)

    monkeypatch.setattr(L, "close", close)
    from commtrace.format import reader as R
    real_parallel = R._create_parallel
    writers = []

    def parallel(con, table, queries, workers, progress=None):
        writers.append((table, len(queries), workers))
        return real_parallel(con, table, queries, workers, progress)

    monkeypatch.setattr(R, "_create_parallel", parallel)
    got = _report(synth_dir, memory_limit="300MB")
    assert_same(got, ref)
    # a split run's op table was written by two cursors at once, in chunks of ranks; a run
    # kept all in the file loads one chunk at a time
    assert writers == ([("t0", writers[0][1], L.LOAD_WORKERS)] if split else []), writers
    if split:
        assert writers[0][1] >= 2
    # the run lived in a private temporary directory, removed on close
    assert seen["existed"] and not os.path.exists(seen["tmp"])
    # where the tables were: the op table (and a step subset of it) in the file; the derived
    # ones in memory when split
    assert seen["where"]["t"] == (L.STORE if split else "run")
    assert seen["where"]["t_waits"] == ("memory" if split else "run")
    subs = [name for name in seen["where"] if re.fullmatch(r"t_sub_[0-9]+_[0-9]+", name)]
    assert subs and all(seen["where"][name] == (L.STORE if split else "run") for name in subs), seen["where"]


def test_rank_chunks_cover_every_rank_once():
    ranks = [0, 1, 2, 5, 6, 9]
    ch = OV.rank_chunks(ranks, total_rows=600, chunk_rows=200)
    assert len(ch) == 3
    assert sorted(r for c in ch for r in ranks if r in c) == ranks


def _rows(d):
    t = pa.concat_tables([pq.read_table(f).replace_schema_metadata(None)
                          for f in sorted(glob.glob(os.path.join(d, "rank=*", "*.parquet")))])
    return sorted(t.to_pylist(), key=lambda r: (r["rank"], r["kind"], r["op_id"] or -1, r["t_enqueue_ns"] or 0))


def test_generator_blocks_do_not_change_the_run(tmp_path, monkeypatch):
    """The generator simulated in blocks of a few steps (spooled per group of 2 ranks) writes
    the very rows of a one-block run, hang snapshots included; and its spool is gone
    afterwards."""
    from commtrace.analysis import synth

    kw = dict(ranks=5, ops=400, skip=(3, 150), mismatch=[(1, 20)], skew=[(2, 40_000_000)],
              hazards=True, seed=5)
    a = synth_run(str(tmp_path / "one"), **kw)
    monkeypatch.setattr(synth, "SPOOL_GROUP_ROWS", 2 * 460)
    b = synth_run(str(tmp_path / "blocks"), block_ops=25, **kw)
    assert a.rows == b.rows and a.planted == b.planted
    assert _rows(tmp_path / "one") == _rows(tmp_path / "blocks")
    for r in range(5):
        p1 = tmp_path / "one" / f"rank={r}" / "_inflight.json"
        p2 = tmp_path / "blocks" / f"rank={r}" / "_inflight.json"
        assert p1.exists() == p2.exists()
        if p1.exists():
            assert json.loads(p1.read_text()) == json.loads(p2.read_text())
    assert sorted(os.listdir(tmp_path / "blocks")) == ["_manifest.json"] + [f"rank={r}" for r in range(5)]


def test_bytes_per_op_on_disk(tmp_path):
    """The synthetic mix takes at most 30 bytes per op on disk (issue 17; 32 before the
    timestamps, ids, seq and step were delta-encoded)."""
    d = tmp_path / "run"
    synth_run(str(d), ranks=16, ops=5000, seed=1)
    size = sum(os.path.getsize(f) for f in glob.glob(str(d / "rank=*" / "*.parquet")))
    assert size / (16 * 5000) <= 30.0, size / (16 * 5000)


def test_findings_and_report_do_not_import_run():
    """No import cycle: findings and report read a Run through its public tables only."""
    code = ("import sys, commtrace.analysis.findings, commtrace.analysis.report; "
            "print('commtrace.analysis.run' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    src = open(os.path.join(os.path.dirname(commtrace.__file__), "analysis", "findings.py")).read()
    assert "run._" not in src


def test_memory_limit_is_checked(capsys):
    from commtrace.cli import main

    assert main(["report", os.path.join(os.path.dirname(__file__), "data", "clean"), "--memory-limit", "lots"]) != 0
    assert "--memory-limit" in capsys.readouterr().err



@pytest.mark.slow
def test_traced_run_same_report_in_memory_and_on_disk(tmp_path_factory, monkeypatch):
    """On a real traced 2-rank gloo run (samples/findings/straggler.py: rank 1 sleeps 20 ms
    before each all_reduce), the three storage paths give the same report: in memory, the op
    table in a database file with the derived tables in memory, and everything in the file."""
    from conftest import SAMPLES, run_path, run_traced, torchrun_cmd

    out = tmp_path_factory.mktemp("scale_traced")
    run_traced(out, torchrun_cmd(os.path.join(SAMPLES, "findings", "straggler.py")),
               opts=("--flush-interval", "0.5"), timeout=150)
    d = run_path(out)
    ref = _report(d)
    assert [(f["kind"], f["rank"]) for f in ref[0]["findings"] if f["kind"] == "straggler"] == [("straggler", 1)]
    monkeypatch.setattr(L, "DISK_ROWS", 0)
    for split_max in (10**9, 0):
        monkeypatch.setattr(L, "SPLIT_MAX_ROWS", split_max)
        got = _report(d)
        for r in got[:2] + ref[:2]:  # the one wall-clock figure (seconds since the last snapshot)
            for st in (r.get("rank_states") or {}).values():
                st.pop("snapshot_age_s", None)
        assert_same(got, ref)


def test_a_large_run_held_in_memory_gives_the_same_report_and_cleans_up(synth_dir, monkeypatch):
    """`load(in_memory=True)` (what `report --what-if` asks for): a run above DISK_ROWS is held in
    DuckDB's memory where it fits in half the memory limit, not in a database file: no table in a
    file, spills pointed at a private directory that close() removes, and the same report (with
    root cause and what-if) as the database file's. Where it does not fit, the file as before."""
    from report_compare import differences

    def report(**kw):
        run = commtrace.load(synth_dir, **kw)
        try:
            rep = run.report(what_if=True)
            sub = run.report(steps=(2, 9), what_if=True)    # (a step subset's table beside `t`)
        finally:
            run.close()
        for r in (rep, sub):
            r.pop("path")
        return rep, sub

    monkeypatch.setattr(L, "DISK_ROWS", 0)
    ref = report()
    assert ref[0]["what_if"]["scenarios"] and ref[0]["finding_counts"].get("straggler") == 1
    assert ref[1]["what_if"]["scenarios"] and ref[1]["steps"] == [2, 9]
    seen = {}
    real_close = L.close

    def close(con, tmp):
        seen["tmp"], seen["existed"] = tmp, tmp is not None and os.path.isdir(tmp)
        seen["dbs"] = sorted({db for db, in con.execute("SELECT database_name FROM duckdb_tables()").fetchall()})
        seen["spill"] = con.execute("SELECT current_setting('temp_directory')").fetchone()[0]
        return real_close(con, tmp)

    monkeypatch.setattr(L, "close", close)
    got = report(in_memory=True)
    assert differences(got, ref) == []
    assert set(seen["dbs"]) <= {"memory", "temp"}, seen   # (a file's tables: `store` or `run`)
    assert seen["existed"] and seen["spill"] == os.path.join(seen["tmp"], "spill")
    assert not os.path.exists(seen["tmp"])
    # too large for half the memory limit: the database file, as without in_memory
    monkeypatch.setattr(L, "MEMORY_ROW_BYTES", 10**9)
    rep, _ = report(in_memory=True)
    assert not set(seen["dbs"]) <= {"memory", "temp"}, seen
    said = [w for w in rep["warnings"] if w.startswith("run held in a database file, not in memory")]
    rows = sum(pq.ParquetFile(f).metadata.num_rows
               for f in glob.glob(os.path.join(synth_dir, "**", "*.parquet"), recursive=True))
    assert said == [f"run held in a database file, not in memory: {rows:,} rows need about "
                    f"{rows * (10**9 + L.DERIVED_ROW_BYTES) / 1e9:.2f} GB, more than half the memory limit "
                    f"(--memory-limit) or over {L.SPLIT_MAX_ROWS:,} rows"], rep["warnings"]
    assert not [w for w in got[0]["warnings"] if "not in memory" in w]


def test_report_holds_a_large_run_in_memory_with_what_if(synth_dir, monkeypatch, capsys):
    """`commtrace report`: --what-if holds a large run in memory (where it fits), the report
    without it in the database file; --in-memory / --no-in-memory choose either way."""
    from commtrace.cli import main

    asked = []
    real_connect = L.connect
    monkeypatch.setattr(L, "connect", lambda rows, **kw: (asked.append(kw.get("in_memory")), real_connect(rows, **kw))[1])
    monkeypatch.setattr(L, "DISK_ROWS", 0)
    for args, want in ((["--what-if"], True), (["--no-what-if"], False), ([], False),
                       (["--no-what-if", "--in-memory"], True), (["--what-if", "--no-in-memory"], False)):
        assert main(["report", synth_dir, "--format", "json", "--no-progress"] + args) == 0
        rep = json.loads(capsys.readouterr().out)
        assert asked[-1] is want, args
        assert (rep["what_if"] is not None) == ("--what-if" in args or not args), args


def test_in_memory_fits_half_the_memory_limit():
    assert L.in_memory_fits(1_000_000, "4GB")                      # 364 MB of 2 GB
    assert not L.in_memory_fits(1_000_000, "500MB")                # 364 MB of 250 MB
    assert not L.in_memory_fits(L.SPLIT_MAX_ROWS + 1, "1TB")       # the file above 20 M rows
    assert not L.in_memory_fits(1000, "a lot")


def test_memory_limit_sizes_in_bytes():
    """The memory limit as DuckDB reads it (KB/MB/GB powers of 1000, KiB/MiB/GiB of 1024): it
    decides whether a large run's derived tables fit in memory."""
    from commtrace.analysis.loading import size_bytes

    assert size_bytes("4GB") == 4_000_000_000 and size_bytes("3.5 GB") == 3_500_000_000
    assert size_bytes("512MiB") == 512 << 20 and size_bytes("1TiB") == 1 << 40
    assert size_bytes("2kb") == 2000 and size_bytes("100") == 100
    assert size_bytes("a lot") is None and size_bytes("") is None


def test_parallel_load_skips_a_corrupt_part_like_the_serial_one(tmp_path, monkeypatch):
    """A part whose pages are corrupt behind a valid footer fails inside one of the parallel
    writers; the load then skips that part with a warning and gives the report of the serial,
    in-memory load."""
    import shutil

    d = tmp_path / "run"
    synth_run(str(d), ranks=4, ops=300, parts_per_rank=3, seed=2)
    part = sorted((d / "rank=2").glob("*.parquet"))[1]
    data = bytearray(part.read_bytes())
    tail = pq.ParquetFile(part).metadata.serialized_size + 8
    for i in range(4, len(data) - tail, 7):  # garbage in the pages, the footer intact
        data[i] = 0xA5
    part.write_bytes(bytes(data))
    ref = _report(str(d))
    assert [w for w in ref[0]["warnings"] if part.name in w and "corrupt" in w]
    monkeypatch.setattr(L, "DISK_ROWS", 0)
    monkeypatch.setattr(L, "LOAD_CHUNK_ROWS", 300)
    got = _report(str(d))
    assert_same(got, ref)
    shutil.rmtree(d)


def test_runs_above_the_parallel_threshold_load_one_chunk_at_a_time(synth_dir, monkeypatch):
    from commtrace.format import reader as R

    ref = _report(synth_dir)
    writers = []
    real_parallel = R._create_parallel
    monkeypatch.setattr(R, "_create_parallel", lambda *a, **k: (writers.append(a[3]), real_parallel(*a, **k))[1])
    monkeypatch.setattr(L, "DISK_ROWS", 0)
    monkeypatch.setattr(L, "LOAD_CHUNK_ROWS", 1500)
    monkeypatch.setattr(L, "PARALLEL_LOAD_ROWS", 1000)
    got = _report(synth_dir)
    assert writers == []
    assert_same(got, ref)
