"""`commtrace report`: JSON contract, text output, exit codes."""

import json
import os

from commtrace.cli import main

DATA = os.path.join(os.path.dirname(__file__), "data")

TOP = ["schema", "world_size", "ranks", "ops", "per_rank", "collectives_summary", "findings"]


def report_json(capsys, *args):
    assert main(["report", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_contract(capsys):
    rep = report_json(capsys, os.path.join(DATA, "straggler"))
    assert list(rep)[:7] == TOP
    assert rep["world_size"] == 4 and rep["ranks"] == [0, 1, 2, 3] and rep["ops"] == 600
    for r in rep["per_rank"]:
        assert {"rank", "ops", "blocked_s", "inflight_s", "exposed_s", "overlap_ratio", "wait_s"} <= set(r)
    for c in rep["collectives_summary"]:
        assert {"pg", "op", "size_bucket", "count", "t_comm_s", "busbw_gbps"} <= set(c)
    f = rep["findings"][0]
    assert {"kind", "severity", "rank", "pg", "seq", "op", "site", "t_ns", "t_end_ns", "evidence", "message"} <= set(f)
    assert f["kind"] == "straggler" and f["rank"] == 1


def test_rank_and_steps_filters(capsys):
    path = os.path.join(DATA, "straggler")
    rep = report_json(capsys, path, "--rank", "2", "--steps", "3:6", "--top", "3")
    assert [r["rank"] for r in rep["per_rank"]] == [2]
    assert rep["ops"] == 4 * 3 * 9 and rep["steps"] == [3, 6]
    assert len(rep["top_collectives"]) <= 3
    assert {p["step"] for p in rep["per_step"]} == {3, 4, 5}


def test_text_report(capsys):
    assert main(["report", os.path.join(DATA, "hazards")]) == 0
    out = capsys.readouterr().out
    for s in ("Per rank", "Findings", "use_before_wait", "train.py:88", "redundant_sync"):
        assert s in out
    assert main(["report", os.path.join(DATA, "clean")]) == 0
    assert "No findings" in capsys.readouterr().out


def test_errors_are_one_line(capsys, tmp_path):
    assert main(["report", str(tmp_path / "missing")]) != 0
    err = capsys.readouterr().err
    assert err.startswith("commtrace: error:") and err.count("\n") == 1
    assert main(["report", os.path.join(DATA, "newer_schema")]) != 0
    assert "upgrade commtrace" in capsys.readouterr().err
    assert main(["report", os.path.join(DATA, "clean"), "--steps", "x"]) != 0


def test_help_has_examples(capsys):
    assert main(["report", "--help"]) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1].strip().startswith("commtrace report")


def test_duration_format_never_uses_e_notation():
    """One duration format for the report and the findings (fmt_ns): 3 significant digits, the
    unit chosen after rounding (999.7 ms is 1 s, not '1e+03 ms'), thousands separators from
    1,000 s on."""
    from commtrace.analysis.findings import fmt_ns

    got = [fmt_ns(v) for v in (45e6, 20.14e6, 350e3, 800, 999.4e6, 999.7e6, 999.7e3, 999.7, 1234.4e9)]
    assert got == ["45 ms", "20.1 ms", "350 us", "800 ns", "999 ms", "1 s", "1 ms", "1 us", "1,234 s"]


def _blas_env(*args, env_extra=None):
    """OPENBLAS_NUM_THREADS as the `commtrace` command leaves it for `args`, in a fresh process
    (numpy not yet imported there)."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env.update(env_extra or {})
    code = ("import os, sys\nfrom commtrace.cli import _one_blas_thread\n"
            "_one_blas_thread(sys.argv[1:])\nprint(os.environ.get('OPENBLAS_NUM_THREADS'), 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_analysis_commands_start_one_blas_thread():
    # numpy's OpenBLAS pool spins ~0.1 s per thread at import; the analysis makes no BLAS call
    assert _blas_env("report", "x", "--format", "json") == ["1", "False"]
    assert _blas_env("--quiet-flag", "dashboard", "x") == ["1", "False"]
    # the user's own choice is kept
    assert _blas_env("report", "x", env_extra={"OPENBLAS_NUM_THREADS": "4"}) == ["4", "False"]
    # the user's program (commtrace run) keeps its environment exactly
    assert _blas_env("run", "--", "python", "train.py") == ["None", "False"]


def test_run_leaves_the_programs_environment_alone(tmp_path):
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    prog = "import os; print('BLAS=' + str(os.environ.get('OPENBLAS_NUM_THREADS')))"
    out = subprocess.run([sys.executable, "-m", "commtrace", "run", "--output", str(tmp_path / "t"), "--",
                          sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=120)
    assert "BLAS=None" in out.stdout, out.stdout + out.stderr
