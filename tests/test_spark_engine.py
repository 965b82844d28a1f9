"""Issue 17, part 3: `commtrace report --engine spark` gives the same report as the default
(DuckDB) engine: every number equal within rounding (relative 1e-9) and the same findings, on a
real traced 2-rank gloo run with a planted straggler (samples/findings/straggler.py: rank 1
sleeps 20 ms before each all_reduce) and on a synthetic run with a planted straggler.

Spark runs in local mode (local[2]) in ONE session for the module (its start-up takes from
20 s to about 2 minutes on a loaded 2-core machine); the equality tests are slow. The error
tests (pyspark or Java missing, default engine never imports pyspark) start no Spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from commtrace.analysis.synth import synth_run
from commtrace.cli import main
from conftest import ROOT, SAMPLES, clean_env, run_path, run_traced, torchrun_cmd
from report_compare import assert_same

DATA = os.path.join(ROOT, "tests", "data")


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for every Spark test (the engine reuses the active session)."""
    from commtrace.analysis import spark as SP

    s = SP.session("local[2]")
    yield s
    s.stop()


def _report(capsys, d, *extra):
    capsys.readouterr()
    assert main(["report", d, "--format", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _both(capsys, d):
    duck = _report(capsys, d)
    spk = _report(capsys, d, "--engine", "spark", "--spark-master", "local[2]")
    # The one wall-clock figure: a snapshot's age when the report was made (job.py: now minus
    # the _inflight.json mtime). The two reports are made a minute apart, so it differs by
    # that minute; it is not computed by either engine.
    for rep in (duck, spk):
        for st in (rep.get("rank_states") or {}).values():
            if st.get("snapshot_age_s") is not None:
                assert st["snapshot_age_s"] >= 0
                st["snapshot_age_s"] = "(wall clock)"
    return duck, spk


def _findings(rep):
    return [(f["kind"], f["severity"], f.get("rank"), f["message"]) for f in rep["findings"]]


@pytest.mark.slow
def test_traced_straggler_same_report(tmp_path_factory, spark, capsys):
    out = tmp_path_factory.mktemp("spark_traced")
    run_traced(out, torchrun_cmd(os.path.join(SAMPLES, "findings", "straggler.py")),
               opts=("--flush-interval", "0.5"), timeout=150)
    d = run_path(out)
    duck, spk = _both(capsys, d)
    assert_same(duck, spk, "duckdb and spark reports")
    # The planted signal is there, in both: rank 1 is the straggler, rank 0 waited for it
    # about 20 ms in each of the 29 all_reduces after the first (connection set-up).
    assert [f[:3] for f in _findings(spk) if f[0] == "straggler"] == [("straggler", "warning", 1)]
    assert _findings(duck) == _findings(spk)
    per_rank = {r["rank"]: r for r in spk["per_rank"]}
    assert per_rank[0]["wait_s"] > 29 * 0.015
    assert per_rank[1]["straggler_share"] > 0.9


@pytest.mark.slow
def test_synthetic_straggler_same_report(tmp_path, spark, capsys):
    d = str(tmp_path / "synth")
    synth_run(d, ranks=4, ops=400, straggler=[(2, 4_000_000)], seed=5)
    duck, spk = _both(capsys, d)
    assert_same(duck, spk, "duckdb and spark reports")
    assert [f[:3] for f in _findings(spk) if f[0] == "straggler"] == [("straggler", "warning", 2)]
    assert _findings(duck) == _findings(spk)
    assert {r["rank"]: r for r in spk["per_rank"]}[2]["straggler_share"] > 0.95


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hang", "mismatch", "damaged", "required_only"])
def test_committed_samples_same_report(spark, capsys, name):
    """tests/data samples: a hung run (the pending ops of the _inflight.json snapshots go
    through Spark too), a collective mismatch, a run with a corrupt part (skipped by both, with
    the same warning) and parts with only the required columns (rank from the directory)."""
    duck, spk = _both(capsys, os.path.join(DATA, name))
    assert_same(duck, spk, "duckdb and spark reports")
    assert _findings(duck) == _findings(spk)
    if name in ("hang", "mismatch"):
        assert [f for f in _findings(spk) if f[1] == "error"], _findings(spk)


def _cli(code, env=None):
    return subprocess.run([sys.executable, "-c", code], env=clean_env(env), capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_default_engine_never_imports_pyspark():
    p = _cli("import sys; from commtrace.cli import main; "
             f"rc = main(['report', {os.path.join(DATA, 'straggler')!r}, '--format', 'json']); "
             "print('IMPORTED', sorted(m for m in ('pyspark', 'sqlglot', 'py4j') if m in sys.modules)); "
             "sys.exit(rc)")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "IMPORTED []" in p.stdout


def test_missing_pyspark_is_one_line_error():
    # pyspark made unimportable in the child (as when the spark extra is not installed).
    p = _cli("import sys; sys.modules['pyspark'] = None; from commtrace.cli import main; "
             f"sys.exit(main(['report', {os.path.join(DATA, 'straggler')!r}, '--engine', 'spark']))")
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "pip install 'commtrace[spark]'" in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_missing_java_is_one_line_error(tmp_path):
    # No java on PATH (an empty directory) and no JAVA_HOME; this Python by its full path.
    env = clean_env({"PATH": str(tmp_path)})
    env.pop("JAVA_HOME", None)
    p = subprocess.run([sys.executable, "-m", "commtrace", "report", os.path.join(DATA, "straggler"),
                        "--engine", "spark"], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Java runtime" in lines[0] and "openjdk-17-jre-headless" in lines[0], p.stderr


def test_spark_options_need_the_spark_engine(capsys):
    rc = main(["report", os.path.join(DATA, "straggler"), "--spark-master", "local[2]"])
    assert rc == 2
    assert "--spark-master and --spark-parts-url need --engine spark" in capsys.readouterr().err


def test_in_memory_is_for_the_duckdb_engine(capsys):
    rc = main(["report", os.path.join(DATA, "straggler"), "--engine", "spark", "--in-memory"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["commtrace: error: --in-memory is for --engine duckdb (Spark holds the run itself)"]
