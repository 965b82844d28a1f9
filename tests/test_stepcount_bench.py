"""benchmarks/stepcount.py (issue 20, session 25): instructions per training step, traced against
untraced, per thread, under callgrind. The parsing and the report on callgrind-shaped files here;
a real (tiny) run of the soak loop in the slow stage, where valgrind is installed."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import stepcount  # noqa: E402


def _dump(path: Path, n: int, body: str = "") -> None:
    path.write_text(f"version: 1\nevents: Ir\n{body}\nsummary: {n}\ntotals: {n}\n")


def test_threads_reads_the_dump_not_the_run_total(tmp_path):
    pre = tmp_path / "callgrind.ddp.traced"
    # dump 0: the whole run's counts at exit (not the counted steps); dump 1: the steps
    _dump(Path(f"{pre}.0-01"), 10**9)
    _dump(Path(f"{pre}.1-01"), 2_000_000)
    _dump(Path(f"{pre}.1-02"), 300, "fn=ParquetWriter::write_table")
    _dump(Path(f"{pre}.1-03"), 0)
    th = stepcount._threads(str(pre))
    assert th == {1: 2_000_000, 2: 300, 3: 0}
    assert stepcount._label(str(pre), 1) == "training thread"
    assert stepcount._label(str(pre), 2) == "thread 2 (writer: parts)"
    assert stepcount._label(str(pre), 3) == "thread 3"


def test_report_ratio_and_difference():
    res = {"traced": {1: 17_388_414.0, 8: 2_366_588.0}, "untraced": {1: 17_349_217.0, 8: 164_128.0},
           "traced_labels": {1: "training thread", 8: "thread 8 (writer: parts)"},
           "untraced_labels": {1: "training thread", 8: "thread 8"}}
    lines = stepcount.report("ddp", res, 20)
    assert lines[0].startswith("ddp: instructions per step, 20 steps counted")
    main = [ln for ln in lines if ln.strip().startswith("training thread ")]
    assert "+39,197" in main[0]
    assert lines[-1].strip() == ("training thread: traced / untraced 1.0023 (+0.23%, "
                                 "+39,197 instructions per step)")
    assert any("thread 8 (writer: parts)" in ln and "+2,202,460" in ln for ln in lines)


def test_bad_steps_is_a_usage_error():
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "stepcount.py"), "--steps", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--steps must be at least 1" in p.stderr


@pytest.mark.slow  # callgrind: a minute or two
@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
                    reason="valgrind not installed")
def test_soak_counts_the_recording_on_the_training_thread(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "stepcount.py"), "--workloads",
                        "soak", "--steps", "2", "--warmup", "1", "--keep", str(tmp_path)],
                       capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    res = {m: stepcount._threads(str(tmp_path / f"callgrind.soak.{m}")) for m in ("traced", "untraced")}
    tr, un = res["traced"][1] / 2, res["untraced"][1] / 2
    # a soak step is 200 blocking all_reduces: traced, each is recorded (the C fast path's
    # record, a few hundred instructions at least); untraced, the wrapper calls torch at once
    assert un > 200 * 1000            # torch's own all_reduce: thousands of instructions each
    assert tr - un > 200 * 100
    assert tr / un < 1.5
    assert "soak: instructions per step, 2 steps counted" in p.stdout
    assert "training thread: traced / untraced" in p.stdout


def test_report_cache_lines_with_cache_sim(tmp_path):
    pre = tmp_path / "callgrind.ddp.traced"
    Path(f"{pre}.1-01").write_text("events: Ir Dr D1mr DLmr Dw D1mw DLmw I1mr ILmr\n"
                                   "summary: 2000 10 40 8 6 20 2 30 1\n")
    ev = stepcount._thread_events(str(pre))
    assert ev == {1: {"Ir": 2000, "Dr": 10, "D1mr": 40, "DLmr": 8, "Dw": 6, "D1mw": 20,
                      "DLmw": 2, "I1mr": 30, "ILmr": 1}}
    assert stepcount._threads(str(pre)) == {1: 2000}
    res = {"traced": {1: 1000.0}, "untraced": {1: 900.0},
           "traced_events": {k: v / 2 for k, v in ev[1].items()},
           "untraced_events": {"Ir": 900.0, "D1mr": 10.0, "D1mw": 10.0, "DLmr": 1.0, "DLmw": 1.0,
                               "I1mr": 5.0},
           "traced_labels": {1: "training thread"}, "untraced_labels": {1: "training thread"}}
    lines = stepcount.report("ddp", res, 2)
    assert any("data lines missed in L1 (32 KB): traced 30  untraced 20  traced - untraced +10" in ln
               for ln in lines)
    assert any("data lines from memory (LL 4 MB missed): traced 5  untraced 2  traced - untraced +3" in ln
               for ln in lines)
    assert any("instruction lines missed in L1: traced 15  untraced 5  traced - untraced +10" in ln
               for ln in lines)


def test_report_of_rank_1_at_world_size_2_sums_every_thread():
    res = {"traced": {1: 100.0}, "untraced": {1: 90.0}, "traced_labels": {1: "training thread"},
           "untraced_labels": {1: "training thread"},
           "traced_r1": {1: 17_400_000.0, 4: 250_000.0, 5: 1_000.0},
           "untraced_r1": {1: 17_350_000.0, 4: 240_000.0},
           "traced_r1_labels": {1: "training thread", 4: "thread 4", 5: "thread 5"},
           "untraced_r1_labels": {1: "training thread", 4: "thread 4"}}
    lines = stepcount.report("ddp", res, 20, rank=1, world=2)
    assert lines[0].startswith("ddp: instructions per step, 20 steps counted (rank 1 of 2, gloo;")
    tot = [ln for ln in lines if ln.strip().startswith("all threads")]
    # 17,651,000 traced against 17,590,000 untraced: every thread of the rank, gloo's included
    assert len(tot) == 1 and "+61,000" in tot[0]
    assert any("thread 4" in ln and "+10,000" in ln for ln in lines)
    assert lines[-1].strip().startswith("training thread: traced / untraced 1.0029")


def test_world_size_2_counts_ddp_only():
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "stepcount.py"), "--world-size", "2",
                        "--workloads", "soak"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--world-size 2 counts the DDP sample only" in p.stderr
