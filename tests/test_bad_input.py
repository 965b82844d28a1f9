"""Bad input catalogue (issue 6): each case gives a one-line error or warning, a non-zero exit
where nothing could be done, and never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from commtrace.cli import main

from conftest import clean_env

DATA = os.path.join(os.path.dirname(__file__), "data")


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("commtrace: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def _report(capsys, path, *args):
    rc = main(["report", str(path), "--format", "json", *args])
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return rc, (json.loads(cap.out) if rc == 0 else None), cap.err


@pytest.fixture
def clean(tmp_path):
    d = tmp_path / "clean"
    shutil.copytree(os.path.join(DATA, "clean"), d)
    return d


def test_empty_directory(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no trace parts found" in _err_line(capsys)


def test_parquet_that_is_not_a_trace(capsys, tmp_path):
    (tmp_path / "run" / "rank=0").mkdir(parents=True)
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), tmp_path / "run" / "rank=0" / "part-1.parquet")
    pq.write_table(pa.table({"a": [1]}), tmp_path / "other.parquet")
    assert main(["report", str(tmp_path / "run")]) == 2
    assert "rank=0/part-1.parquet: not a commtrace trace" in _err_line(capsys)
    assert main(["report", str(tmp_path / "other.parquet")]) == 2
    assert "not a commtrace trace" in _err_line(capsys)
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["report", str(tmp_path / "notes.txt")]) == 2
    assert "not a commtrace run directory" in _err_line(capsys)


def test_truncated_part_is_skipped_with_a_warning(capsys, clean):
    part = sorted((clean / "rank=1").glob("*.parquet"))[-1]
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    rc, rep, _ = _report(capsys, clean)
    assert rc == 0 and rep["ranks"] == [0, 1, 2, 3]
    assert [w for w in rep["warnings"] if f"rank=1/{part.name}" in w and "truncated" in w]
    # rank 1 keeps its first part's rows; the others are complete
    ops = {r["rank"]: r["ops"] for r in rep["per_rank"]}
    assert ops[0] == ops[2] == ops[3] == 150 and 0 < ops[1] < 150
    assert main(["report", str(clean)]) == 0  # the text report shows it too
    assert f"warning: skipped truncated or corrupt part rank=1/{part.name}" in capsys.readouterr().out


def test_every_part_truncated_is_an_error(capsys, clean):
    for part in clean.glob("rank=*/*.parquet"):
        part.write_bytes(part.read_bytes()[:100])
    assert main(["report", str(clean)]) == 2
    assert "no readable trace part" in _err_line(capsys)


def test_future_schema_version(capsys, clean):
    assert main(["report", os.path.join(DATA, "newer_schema")]) == 2
    err = _err_line(capsys)
    assert "upgrade commtrace" in err and "schema v" in err
    m = json.loads((clean / "_manifest.json").read_text())
    m["schema_version"] = 99
    (clean / "_manifest.json").write_text(json.dumps(m))
    assert main(["report", str(clean)]) == 2
    assert "_manifest.json was written with trace schema v99" in _err_line(capsys)


def test_missing_manifest_warns_and_reports(capsys, clean):
    os.unlink(clean / "_manifest.json")
    rc, rep, _ = _report(capsys, clean)
    assert rc == 0 and rep["world_size"] == 4 and rep["ranks"] == [0, 1, 2, 3]
    assert [w for w in rep["warnings"] if w.startswith("no _manifest.json in")]


def test_unreadable_manifest_warns(capsys, clean):
    (clean / "_manifest.json").write_text("{not json")
    rc, rep, _ = _report(capsys, clean)
    assert rc == 0 and [w for w in rep["warnings"] if w.startswith("unreadable _manifest.json")]


def _rewrite_meta(src, dst, **changes):
    t = pq.read_table(src)
    kv = dict(t.schema.metadata)
    meta = json.loads(kv[b"commtrace.meta"])
    meta.update(changes)
    kv[b"commtrace.meta"] = json.dumps(meta).encode()
    pq.write_table(t.replace_schema_metadata(kv), dst)


def test_two_files_claiming_one_rank(capsys, clean):
    src = sorted((clean / "rank=0").glob("*.parquet"))[0]
    # a second process (another run, or a second node started with the same --node-rank)
    _rewrite_meta(src, clean / "rank=0" / "part-20000-000001.parquet", pid=20000, host="node-b")
    rc, rep, _ = _report(capsys, clean)
    assert rc == 0
    w = [w for w in rep["warnings"] if w.startswith("rank 0 was written by 2 processes")]
    assert w and "pid 20000 on node-b" in w[0] and "counted twice" in w[0]


def test_part_in_the_wrong_rank_directory(capsys, clean):
    src = sorted((clean / "rank=0").glob("*.parquet"))[0]
    shutil.copy(src, clean / "rank=2" / "part-10000-000009.parquet")
    rc, rep, _ = _report(capsys, clean)
    assert rc == 0
    assert [w for w in rep["warnings"] if "says rank 0 but lies in rank=2" in w]


def test_unknown_cli_flags(capsys, tmp_path):
    assert main(["report", os.path.join(DATA, "clean"), "--bogus"]) == 2
    assert "No such option '--bogus'" in _err_line(capsys)
    assert main(["nosuchcommand"]) == 2
    assert "No such command 'nosuchcommand'" in _err_line(capsys)
    assert main(["report", os.path.join(DATA, "clean"), "--format", "xml"]) == 2
    assert "'xml' is not one of" in _err_line(capsys)
    assert main(["run", "--flush-interval", "0", "--", "true"]) == 2
    assert "--flush-interval" in _err_line(capsys)


@pytest.mark.parametrize("cmd", ["report", "synth", "dashboard", "export", "diff", "run"])
def test_unknown_option_of_every_command(capsys, tmp_path, cmd):
    """Every subcommand: an unknown option is one line naming it, exit 2, nothing done."""
    assert main([cmd, "--bogus", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = _err_line(capsys)
    assert "No such option '--bogus'" in err and f"(see 'commtrace {cmd} --help')" in err
    assert list(tmp_path.iterdir()) == []


_ARGV_TO_FILE = "import json, sys; json.dump(sys.argv[1:], open(sys.argv[1], 'w'))"


def test_run_unknown_option_before_the_command(capsys, tmp_path):
    """An unknown option of `commtrace run` (before `--`, or before the command without `--`)
    is a usage error: one line, exit 2, nothing run, no run directory created."""
    marker = tmp_path / "ran.json"
    for args in (["--bogus", "--"], ["--bogus"], ["--bogus=3", "--"], ["-x", "--"]):
        out = tmp_path / "o"
        rc = main(["run", "-o", str(out), *args, sys.executable, "-c", _ARGV_TO_FILE, str(marker)])
        assert rc == 2, args
        opt = args[0].split("=")[0]
        assert f"No such option '{opt}'" in _err_line(capsys)
        assert not marker.exists() and not out.exists()
    assert main(["run", "--flush-intervl", "3", "--", "true"]) == 2
    assert "Did you mean '--flush-interval'?" in _err_line(capsys)


def test_run_passes_everything_after_the_command(capsys, tmp_path):
    """After `--` (or after the command's first word) every argument, option-like or not,
    belongs to the command."""
    marker = tmp_path / "ran.json"
    rc = main(["run", "-o", str(tmp_path / "a"), "--", sys.executable, "-c", _ARGV_TO_FILE,
               str(marker), "--anything", "--bogus=1", "-x", "--", "--flush-interval"])
    assert rc == 0, capsys.readouterr().err
    assert json.loads(marker.read_text()) == [str(marker), "--anything", "--bogus=1", "-x", "--",
                                              "--flush-interval"]
    marker.unlink()
    rc = main(["run", "-o", str(tmp_path / "b"), "--no-stack", sys.executable, "-c", _ARGV_TO_FILE,
               str(marker), "--lr", "3"])
    assert rc == 0 and json.loads(marker.read_text()) == [str(marker), "--lr", "3"]
    assert "Traceback" not in capsys.readouterr().err


def test_unwritable_output_directory(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    assert main(["run", "-o", str(tmp_path / "file" / "run"), "--", sys.executable, "-c", "pass"]) == 2
    assert "cannot create the output directory" in _err_line(capsys)
    assert main(["run", "-o", "/proc/commtrace-run", "--", sys.executable, "-c", "pass"]) == 2
    assert "cannot create the output directory /proc/commtrace-run" in _err_line(capsys)


def test_errors_from_a_real_process_are_one_line(tmp_path):
    """The installed entry point, not just main(): no traceback on stderr, exit 2."""
    (tmp_path / "empty").mkdir()
    for args in (["report", str(tmp_path / "empty")], ["report", str(tmp_path / "nope")],
                 ["report", os.path.join(DATA, "newer_schema")], ["--bogus"],
                 ["run", "-o", str(tmp_path / "never"), "--bogus", "--", sys.executable, "-c", "pass"]):
        p = subprocess.run([sys.executable, "-m", "commtrace", *args], env=clean_env(),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.startswith("commtrace: error: ") and p.stderr.count("\n") == 1, p.stderr
    assert not (tmp_path / "never").exists()


def test_disk_filling_mid_run(tmp_path):
    from conftest import SCRIPTS, free_port, load_rows, rank_meta, run_traced

    out = tmp_path / "t"
    p = run_traced(out, [sys.executable, os.path.join(SCRIPTS, "robust_diskfull.py"), str(free_port())],
                   opts=("--flush-interval", "0.1"), timeout=120)
    assert "training finished: sum 800," in p.stdout  # 200 all_reduces of 4 ones, world size 1
    lines = [line for line in p.stderr.splitlines() if "cannot write trace" in line]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "training continues" in lines[0]
    assert "Traceback" not in p.stderr
    ops = [r for r in load_rows(out) if r["kind"] == "op"]
    dropped = rank_meta(out)[0]["dropped_rows"]
    assert dropped > 0 and len(ops) + dropped == 200, (len(ops), dropped)
    # what was written is intact: seq has gaps exactly where parts were lost, no duplicates
    seqs = sorted(r["seq"] for r in ops)
    assert len(set(seqs)) == len(seqs) and seqs[0] == 0 and seqs[-1] == 199
    # the report says so
    p = subprocess.run([sys.executable, "-m", "commtrace", "report", str(out), "--format", "json"],
                       env=clean_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    warn = [w for w in json.loads(p.stdout)["warnings"] if "dropped" in w]
    assert warn == [f"rank 0 dropped {dropped} rows while tracing (its buffer was full or trace "
                    "writes failed): its counts and times are incomplete (see --buffer-ops, "
                    "--flush-interval)"]


def test_accel_build_into_an_unusable_cache_directory(capsys, monkeypatch, tmp_path):
    """`commtrace accel build` with a cache directory that cannot be made: one line, exit 2,
    before anything is compiled (a file stands where the directory would go)."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("COMMTRACE_CACHE_DIR", str(blocker))
    assert main(["accel", "build"]) == 2
    err = _err_line(capsys)
    assert "cannot create the cache directory" in err and str(blocker) in err
    assert blocker.read_text() == "x"


def test_accel_status_with_a_source_missing_from_the_install(capsys, monkeypatch, tmp_path):
    """An install without one of the sources `accel build` compiles (a wheel whose package-data
    missed it): `accel status` and `accel build` say so in one line, exit 2, no traceback."""
    from commtrace.capture import accel
    gone = str(tmp_path / "_accel_meta.cpp")
    monkeypatch.setattr(accel, "SOURCES", [accel.SOURCE, gone])
    for cmd in ("status", "build"):
        assert main(["accel", cmd]) == 2
        err = _err_line(capsys)
        assert "lacks _accel_meta.cpp" in err and "reinstall commtrace" in err
