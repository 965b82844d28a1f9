"""The first hour of a new user (issue 14): the demo's planted finding in the report and on the
dashboard it serves, the README's snippet run as written, the report's output at 80 columns and
in a pipe (sites keep their `:line`), the per-rank table's --top / --all-ranks, the straggler
message's figures against the tables, and file modes under umask 022.

One traced run of the demo's job is shared by the tests of this module (module-scoped fixture)."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys

import pytest

import commtrace
from conftest import ROOT, SAMPLES, clean_env, torchrun_cmd

DEMO = os.path.join(SAMPLES, "ddp_mlp.py")


def _ct(*args, cwd=ROOT, env=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "commtrace", *map(str, args)], env=clean_env(env), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


#: The straggler planted in the demo's job here (ms of sleep on rank 1 before each of its 20
#: steps). The demo's default is 40 ms (the slow stage's test_demo_script_runs_as_written runs
#: scripts/demo.sh as written and checks its finding); here it is 120 ms so that the timing
#: checks below (at least half the planted lateness, cost and a quarter of it as gain) hold
#: under load: rank 0's own compute, slowed by other processes on the cores while rank 1
#: sleeps, is subtracted from the lateness measured (mean 19.7 ms of the planted 40 ms at load
#: 10-18 in session 18), and a larger sleep leaves the checks' bounds as far above that as
#: the planted figure is.
PLANTED_MS = 120
STEPS = 20


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The demo's job (scripts/demo.sh: samples/ddp_mlp.py on 2 gloo ranks, its defaults but
    the planted straggler: PLANTED_MS), traced under umask 022."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    p = subprocess.run([sys.executable, "-m", "commtrace", "run", "-o", str(out), "--",
                        *torchrun_cmd(DEMO, "--straggler-ms", PLANTED_MS, "--steps", STEPS)],
                       env=clean_env(), cwd=ROOT, capture_output=True, text=True, timeout=300,
                       preexec_fn=lambda: os.umask(0o022))
    assert p.returncode == 0, p.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def demo_text80(demo_run):
    """`commtrace report` of the demo's run as a user's pipe gets it, with COLUMNS=80."""
    p = _ct("report", demo_run, env={"COLUMNS": "80"})
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.fixture(scope="module")
def demo_loaded(demo_run):
    run = commtrace.load(str(demo_run))
    yield run, run.report()
    run.close()


def _main(capsys, monkeypatch, *args, columns=100):
    """`commtrace ARGS` in this process (stdout a pipe, COLUMNS set); returns stdout."""
    from commtrace.cli import main

    monkeypatch.setenv("COLUMNS", str(columns))
    capsys.readouterr()
    assert main([str(a) for a in args]) == 0
    return capsys.readouterr().out


def test_demo_reports_its_planted_straggler(demo_loaded, demo_text80):
    """The demo's last rank sleeps PLANTED_MS before each step: `straggler` on rank 1, in the
    JSON and in the text report, and the message's per-rank figure is the per-rank table's."""
    run, rep = demo_loaded
    st = [f for f in run.findings() if f.kind == "straggler"]
    assert [f.rank for f in st] == [1], [(f.kind, f.rank, f.message) for f in run.findings()]
    ev = st[0].evidence
    # planted: PLANTED_MS every step; at least half of it measured
    assert ev["share"] >= 0.75 and ev["mean_late_ns"] > 0.5 * PLANTED_MS * 1e6, ev
    assert st[0].site and st[0].site.startswith(DEMO + ":")
    wait0 = next(r["wait_s"] for r in rep["per_rank"] if r["rank"] == 0)
    # rank 0 waits for rank 1 (almost) only: what it waited for it is its whole wait, give or take
    # the collectives rank 1 was not last at.
    assert ev["caused_wait_ranks"] == 1 and 0.8 * wait0 * 1e9 <= ev["caused_wait_max_ns"] <= wait0 * 1e9 + 1
    txt = demo_text80
    assert "findings: straggler x1" in txt and "straggler  rank 1" in txt
    from commtrace.analysis.findings import fmt_ns
    table_wait0 = re.search(r"^\s+0 │.*│\s+(\S+ \S+) │\s+\d+% $", txt, re.M)
    assert table_wait0, txt
    assert f"waited {fmt_ns(ev['caused_wait_max_ns'])} each" in txt.replace("\n", " ")
    assert abs(_secs(table_wait0.group(1)) - ev["caused_wait_max_ns"] / 1e9) <= 0.2 * wait0 + 0.01


def test_demo_report_names_ddps_bucket_rebuild(demo_loaded, demo_text80):
    """Every DDP job's Reducer broadcasts its rebuilt bucket order from C++ at the second
    forward (two collectives no wrapper sees): the demo's report names them as that, once, with
    both ranks and the step, and says why, instead of an unexplained "issued from C++, a
    compiled graph or an unwrapped function" line."""
    run, rep = demo_loaded
    un = rep["unrecorded"]
    assert [(u["origin"], u["at"], u["count"], u["ranks"], u["step"]) for u in un] == \
        [("ddp_rebuild_buckets", "call", 2, [0, 1], 1)], un
    assert un[0]["after"]["op"] == un[0]["before"]["op"] == "all_reduce"
    txt = demo_text80.replace("\n", " ")
    assert "DDP's bucket rebuild" in txt and "unwrapped function" not in txt
    # its sites are written relative to the working directory, as the findings' are
    line = txt[txt.index("unrecorded:"):txt.index("DDP's bucket rebuild")]
    assert "samples/ddp_mlp.py:" in line and ROOT + os.sep not in line, line


def _secs(s: str) -> float:
    v, unit = s.split()
    return float(v.replace(",", "")) * {"s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]


def test_demo_report_at_80_columns_in_a_pipe_keeps_the_sites_line(demo_run, demo_text80, capsys, monkeypatch):
    """In a pipe with COLUMNS=80 no line is wider than 80 and every site of the top-collectives
    table ends in `ddp_mlp.py:<line>`, written relative to the working directory."""
    lines = demo_text80.splitlines()
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    i = next(i for i, ln in enumerate(lines) if ln.startswith("Top ") and "collectives by wait" in ln)
    rows = _table_rows(lines, i)
    assert rows, demo_text80
    for ln in rows:
        assert re.search(r"ddp_mlp\.py:\d+\s*$", ln), ln
    assert "samples/ddp_mlp.py:" in demo_text80 and ROOT + os.sep not in demo_text80.split("Findings")[-1]
    # at 200 columns the whole relative path shows
    monkeypatch.chdir(ROOT)
    wide = _main(capsys, monkeypatch, "report", demo_run, columns=200)
    assert re.search(r"│ samples/ddp_mlp\.py:\d+\s*$", wide, re.M), wide


def test_site_column_never_loses_its_line_at_80_columns(capsys, monkeypatch):
    """Long absolute call sites are shortened from the left to fit 80 columns: the file name and
    `:line` stay; a site inside the working directory is written relative to it."""
    from rich.console import Console

    from commtrace.cli.report import _site, render

    rep = json.loads(_main(capsys, monkeypatch, "report", os.path.join(ROOT, "tests", "data", "straggler"),
                           "--format", "json"))
    long_dir = "/home/someone/projects/a-rather-long-project-name/src/training/pipelines/"
    for k, r in enumerate(rep["top_collectives"]):
        r["site"] = f"{long_dir}train_ddp.py:{100 + k}"
        r["total_wait_s"] = 1.0 + k
    buf = io.StringIO()
    render(rep, top=5, console=Console(file=buf, width=80, highlight=False, soft_wrap=False))
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= 80
    i = next(i for i, ln in enumerate(lines) if "collectives by wait" in ln)
    rows = _table_rows(lines, i)
    assert len(rows) == 5
    for ln in rows:
        assert re.search(r"train_ddp\.py:1\d\d\s*$", ln), ln
    assert _site(os.path.join(os.getcwd(), "pkg", "m.py") + ":7") == os.path.join("pkg", "m.py") + ":7"
    assert _site("/x/y/zzzzzzzzzz/file.py:12", 16) == "…/file.py:12"
    assert _site("/x/y/zzzzzzzzzz/file.py:12", 5) == "file.py:12"


def test_per_rank_table_top_and_all_ranks(tmp_path, capsys, monkeypatch):
    """`--top N`: the N ranks that waited most, then a count of the rest; `--all-ranks`: all."""
    out = tmp_path / "s"
    _main(capsys, monkeypatch, "synth", out, "--ranks", 16, "--ops", 200, "--straggler", "5:2ms", "-f")
    rep = json.loads(_main(capsys, monkeypatch, "report", out, "--format", "json"))
    by_wait = sorted(rep["per_rank"], key=lambda r: (-r["wait_s"], r["rank"]))
    txt = _main(capsys, monkeypatch, "report", out, "--top", 3)
    rows = _per_rank_rows(txt)
    assert rows == [r["rank"] for r in by_wait[:3]], txt
    assert "... and 13 more rank(s)" in txt and "--all-ranks" in txt
    assert "the 3 of 16 that waited most" in txt
    txt = _main(capsys, monkeypatch, "report", out, "--top", 3, "--all-ranks")
    assert _per_rank_rows(txt) == list(range(16)) and "more rank(s)" not in txt
    # straggler message: per-rank and total figures of the other ranks' waits
    f = next(f for f in rep["findings"] if f["kind"] == "straggler")
    assert f["rank"] == 5 and f["evidence"]["caused_wait_ranks"] == 15
    waits = [r["wait_s"] for r in rep["per_rank"] if r["rank"] != 5]
    assert f["evidence"]["caused_wait_max_ns"] <= max(waits) * 1e9 + 1
    assert f["evidence"]["caused_wait_min_ns"] >= 0.9 * min(waits) * 1e9
    assert "the other 15 rank(s) waited" in f["message"] and "in all" in f["message"]


def _table_rows(lines: list[str], title: int) -> list[str]:
    """The body rows of the rich table whose title is at line `title` (header, rule, rows)."""
    out = []
    for ln in lines[title + 3:]:
        if "│" not in ln:
            break
        out.append(ln)
    return out


def _per_rank_rows(text: str) -> list[int]:
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("Per rank"))
    out = []
    for ln in lines[i + 3:]:
        if "│" not in ln:
            break
        out.append(int(ln.split("│")[0]))
    return out


def test_human_readable_lists_and_numbers(demo_text80):
    txt = demo_text80
    assert "['" not in txt and "e-0" not in txt and "e+0" not in txt, txt
    assert re.search(r"clock: offsets applied: [a-z-]+( and [a-z-]+)?;", txt), txt


def test_run_files_follow_the_umask(demo_run, tmp_path):
    """Under umask 022 every file of a traced run is 0644 and every directory 0755 (a shared
    trace directory is readable by the team); `commtrace synth` likewise."""
    subprocess.run([sys.executable, "-m", "commtrace", "synth", str(tmp_path / "u"), "--ranks", "2", "--ops", "20"],
                   env=clean_env(), cwd=ROOT, capture_output=True, timeout=120, preexec_fn=lambda: os.umask(0o022),
                   check=True)
    for top in (demo_run, tmp_path / "u"):
        files = dirs = 0
        for d, dn, fn in os.walk(top):
            assert stat.S_IMODE(os.stat(d).st_mode) == 0o755, d
            dirs += 1
            for f in fn:
                mode = stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode)
                assert mode == 0o644, (os.path.join(d, f), oct(mode))
                files += 1
        names = {f for _, _, fn in os.walk(top) for f in fn}
        assert "_manifest.json" in names and any(n.endswith(".parquet") for n in names), names


def test_demo_dashboard_points_at_the_finding(demo_loaded):
    """The dashboard the demo serves opens on the overview, which names the straggler."""
    from commtrace.dashboard.app import build

    app = build(demo_loaded[0])
    body = app.server.test_client().get("/_dash-layout").get_data(as_text=True)
    assert "straggler" in body and "rank 1" in body


README = os.path.join(ROOT, "README.md")


def _readme_python_blocks():
    text = open(README).read()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_snippet_runs_as_written(tmp_path):
    """The README's Python snippet, saved as train.py and run as the README says (torchrun, 2
    ranks, gloo), traces, loads and numbers steps from 0, one step per iteration."""
    blocks = _readme_python_blocks()
    assert len(blocks) == 1, "the README has one Python snippet"
    (tmp_path / "train.py").write_text(blocks[0])
    m = re.search(r"(torchrun --nproc-per-node 2 train\.py)", open(README).read())
    assert m, "the README says how to run the snippet"
    p = subprocess.run(torchrun_cmd(str(tmp_path / "train.py")), env=clean_env(), cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    run = commtrace.load(str(tmp_path / "traces" / "snippet"))
    ops = [r for r in run.ops().to_pylist() if r["op"] == "all_reduce"]
    steps = sorted({r["step"] for r in ops})
    assert steps == list(range(10)), steps
    per = {s: sum(1 for r in ops if r["step"] == s) for s in steps}
    assert len(set(per[s] for s in steps if s > 0)) == 1, per  # one step per iteration, none merged
    assert "rank" in p.stdout  # it printed the per-rank rows


@pytest.mark.slow
def test_demo_script_runs_as_written(tmp_path):
    """`bash scripts/demo.sh` as the README gives it (plus the dashboard options it passes on):
    progress lines, no pip warnings, the report with the planted straggler, the dashboard's one
    serving line, and Ctrl-C ending it with 130. Reuses ./.venv (set-up is the only slow part)."""
    import signal
    import time
    import urllib.request

    from conftest import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMTRACE_", "VIRTUAL_ENV"))}
    p = subprocess.Popen(["bash", "scripts/demo.sh", "--no-browser", "--port", str(port)], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out = []
    try:
        end = time.monotonic() + 600
        for line in p.stdout:
            out.append(line)
            if "serving on" in line or time.monotonic() > end:
                break
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/_dash-layout", timeout=30).read()
        assert b"straggler" in body
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C in the demo's terminal
        rest, _ = p.communicate(timeout=60)
        out.append(rest)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    text = "".join(out)
    assert "[setup] ready" in text and "is ignored" not in text and "WARNING: " not in text, text[-3000:]
    assert "straggler  rank 1" in text and f"serving on http://127.0.0.1:{port}/, Ctrl-C to stop" in text, text[-3000:]
    assert p.returncode == 130, (p.returncode, text[-2000:])


def test_demo_root_cause_is_the_planted_rank(demo_loaded):
    """DDP waits for its buckets in C++ (no wait() row): the root-cause model must still see rank
    0's blocked time as waiting, so the delay, its cost and the what-if gain land on rank 1 (the
    planted PLANTED_MS per step, STEPS steps), never on the rank that waited."""
    run, rep = demo_loaded
    st = next(f for f in rep["findings"] if f["kind"] == "straggler")
    planted_s = STEPS * PLANTED_MS / 1000
    assert st["root_cause"]["rank"] == 1, st["root_cause"]
    assert st["cost_s"] >= 0.5 * planted_s, st          # rank 1's delays cost rank 0 its waits
    assert st["gain_s"] >= 0.25 * planted_s, st         # and fixing them saves a real share
    assert all(d["rank"] == 1 for d in rep["what_if"]["delays"][:3]), rep["what_if"]["delays"][:3]
    assert abs(rep["what_if"]["replay_error"]) <= 0.02
