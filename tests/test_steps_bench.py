"""benchmarks/steps.py (issue 20) still runs and reports what docs/performance.md quotes: a tiny
run of two workloads (the figures themselves are measured by the benchmark, not asserted here;
the op counts and the structure of the output are)."""

import itertools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from commtrace.config import Config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # issue 14: main suite within 8 minutes; CI's slow stage runs it
def test_steps_benchmark_small_run(tmp_path):
    out = tmp_path / "s.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "steps.py"),
                        "--workloads", "async_loop", "pipeline", "--rounds", "3",
                        "--duration", "0.05", "--warmup", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    res = {r["workload"]: r for r in json.loads(out.read_text())}
    assert set(res) == {"async_loop", "pipeline"}
    for r in res.values():
        # steps per round calibrated to 50 ms rounds from the slower rank's untraced step
        assert r["rounds"] == 3 and len(r["ratios"]) == 3 and r["round_target_s"] == 0.05
        assert 0 < r["calibrated_step_s"] < 10
        assert r["steps_per_round"] == max(1, round(0.05 / r["calibrated_step_s"]))
        assert r["control"] == "mirror" and r["wall_s"] > 0 and len(r["control_ratios"]) == 3
        for k in ("ratio", "control_ratio", "cpu_ratio", "control_cpu_ratio"):
            lo, hi = r[k + "_ci95"]
            assert lo <= r[k] <= hi, k
        assert r["untraced_step_ms"] > 0 and r["traced_step_ms"] > 0 and r["control_step_ms"] > 0
        assert r["untraced_cpu_ms"] > 0 and r["pin"] == "none"
        assert r["writer_cpu_us_per_op"] > 0 and r["writer"] == "sync"
        assert "load average" in r["uptime_start"] and r["load_start"] and r["load_end"]
        # the default scheduling: SCHED_FIFO 1 with gaps of an eighth of the round where
        # permitted (root or CAP_SYS_NICE), the fair scheduler and no gaps' floor otherwise
        if r["policy"] == ["SCHED_FIFO 1"] * 2:
            assert r["rt"] == 1 and r["gap_s"] == pytest.approx(0.05 / 8)
        else:   # not permitted here: the fair scheduler, no gaps
            assert r["policy"] == [None, None] and r["rt"] == 0 and r["gap_s"] == 0.0
        assert set(r["spill_s"]) == {"untraced", "traced", "control"}
        assert all(v >= 0 for v in r["spill_s"].values())
        assert r["aa"] is False and r["plant"] == 0.0 and r["step_walls"] is None
        # both ranks' writer threads run at commtrace run's default priority (relative to the
        # rank's own: pytest may run under `nice`, and a nice value stops at 19)
        assert r["writer_nice_added"] == [min(Config().writer_nice, 19 - os.nice(0))] * 2
    # every op of the traced rounds is in the trace: 8 async all_reduces per step per rank;
    # the pipeline's 4 micro-batches: 4 sends + 4 recvs on rank 0, 4 recvs + 4 isends on rank 1
    assert res["async_loop"]["ops_per_step_per_rank"] == 8
    assert res["pipeline"]["ops_per_step_per_rank"] == 8
    text = p.stdout
    for w, r in res.items():
        assert (f"{w}: 3 sets of rounds x {r['steps_per_round']} steps (calibrated to 50 ms "
                f"rounds") in text
    assert text.count("traced / untraced step time:") == 2
    assert text.count("writer thread CPU per op:") == 2
    assert text.count("control / untraced step time") == 2
    assert text.count("process CPU per step (all threads)") == 2
    assert "target <= 2%" in text   # the pipeline's verdict line
    assert text.count("SCHED_FIFO 1, 6 ms gaps") + text.count("; fair scheduler") == 2


def test_round_order_is_balanced():
    """The six orders of a cycle of sets: each mode at each position twice, and each mode right
    after each other mode equally often in the chain of rounds (cyclically), none after itself:
    what a round leaves behind lands on untraced and control rounds alike."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import steps
    finally:
        sys.path.pop(0)
    orders = steps.ORDERS
    assert sorted(orders) == sorted(itertools.permutations(steps.MODES))
    for pos in range(3):
        assert Counter(o[pos] for o in orders) == {m: 2 for m in steps.MODES}
    chain = [m for o in orders for m in o]
    pairs = Counter(zip(chain, chain[1:] + chain[:1]))
    assert pairs == {(a, b): 3 for a in steps.MODES for b in steps.MODES if a != b}


def _steps_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import steps
    finally:
        sys.path.pop(0)
    return steps


def test_robust_ratio_ignores_disturbed_rounds_and_charges_flushes_in_full():
    """The paired robust estimator: rounds that other processes slowed (x5 here, in both modes
    and in different sets) do not move it, while the flushes written in a few traced rounds are
    charged in full: median((x - f) / u) + sum(f) / sum(u)."""
    steps = _steps_module()
    u = [1.0] * 20
    x = [1.01] * 20
    for i in (3, 11):
        u[i] = 5.0          # an untraced round taken by another process
    for i in (5, 17):
        x[i] = 5.05         # a traced round taken by another process
    f = [0.0] * 20
    f[0] = f[10] = 0.4      # two flushes, each 0.4 of a step per step of its round
    xf = [a + b for a, b in zip(x, f)]
    want = 1.01 + 0.8 / sum(u)
    assert steps.robust_ratio(xf, u, f) == pytest.approx(want, abs=1e-12)
    lo, hi = steps.robust_ratio_ci(xf, u, f)
    assert lo <= want <= hi
    # the control (no flushes): the median of the per-set ratios
    assert steps.robust_ratio([1.0] * 19 + [9.0], [1.0] * 20) == 1.0
    # the ratio of totals, by contrast, moves with where the disturbed rounds fell
    assert sum(xf) / sum(u) == pytest.approx((20 * 1.01 + 2 * 4.04 + 0.8) / 28)


def test_flush_per_step_from_the_ranks_chains():
    """The flush of each set's traced round per step, both ranks' mean, from their chains."""
    steps = _steps_module()
    ch0 = [("untraced", 0.0, 1e-3, 1e-3, 0.0), ("traced", 0.1, 2e-3, 1e-3, 0.02),
           ("control", 0.2, 1e-3, 1e-3, 0.0), ("traced", 0.3, 1e-3, 1e-3, 0.0),
           ("untraced", 0.4, 1e-3, 1e-3, 0.0), ("control", 0.5, 1e-3, 1e-3, 0.0)]
    ch1 = [c[:4] + (0.04 if i == 1 else 0.0,) for i, c in enumerate(ch0)]
    got = steps._flush_per_step([{"chain": ch0}, {"chain": ch1}], rounds=2, steps=10)
    assert got == pytest.approx([0.003, 0.0])


def test_plant_adds_its_busy_cpu_to_every_step():
    """--plant's busy loop: each step is followed by plant_s of this thread's CPU time, so a
    planted arm is slower by a known amount (the estimator's recovery check)."""
    import time

    steps = _steps_module()
    calls = []
    t0 = time.thread_time()
    stamps = steps._steps(lambda st, i: calls.append(i), None, 5, plant_s=0.004)
    spent = time.thread_time() - t0
    assert calls == [0, 1, 2, 3, 4] and len(stamps) == 6
    assert spent >= 5 * 0.004
    # each step's wall time holds its busy loop (wall >= thread CPU)
    assert all(b - a >= 0.004 for a, b in zip(stamps, stamps[1:]))
    # no plant: the stamps only
    assert len(steps._steps(lambda st, i: None, None, 3)) == 4


def test_writer_cpu_between_rounds_is_charged_to_the_round_before():
    """The writer thread's CPU from a round's end to the next round's start (the gap and the
    barrier) is added to that round's wall time per step, whatever its mode; the last round's
    up to the reading after the last gap."""
    steps = _steps_module()
    chain = [["untraced", 0.0, 1e-3, 1e-3, 0.0, 0.0, 0.0, 0.0],
             ["traced", 0.5, 2e-3, 1e-3, 0.0, 0.0, 0.0, 0.0],
             ["control", 1.0, 1e-3, 1e-3, 0.0, 0.0, 0.0, 0.0]]
    # writer CPU clock (s) at each round's start and end, and after the last gap
    wc_start = [1.0, 1.0, 1.05]
    wc_end = [1.0, 1.01, 1.05, 1.052]
    got = steps._charge_spill(chain, wc_start, wc_end, steps=10)
    assert [c[7] for c in got] == pytest.approx([0.0, 0.04, 0.002])
    assert [c[2] for c in got] == pytest.approx([1e-3, 2e-3 + 0.004, 1e-3 + 0.0002])
    assert [c[0] for c in got] == ["untraced", "traced", "control"]
    # a clock read out of order never charges a negative time
    assert steps._charge_spill(chain[:1], [1.0], [1.0, 0.9], 10)[0][7] == 0.0


def test_scheduling_options_are_checked_and_reported():
    """--rt and --plant out of range: a one-line parser error; the report's first line says how
    the ranks were scheduled, and when SCHED_FIFO was asked for but not granted."""
    for bad in (["--rt", "100"], ["--plant", "1"], ["--gap", "-1"],
                ["--control", "group", "--workloads", "soak"],
                ["--control", "group", "--workloads", "ddp", "--ddp-copies"]):
        p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "steps.py"), *bad],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and "error:" in p.stderr and "Traceback" not in p.stderr
    steps = _steps_module()
    assert steps._sched_text({"rt": 1, "policy": ["SCHED_FIFO 1"] * 2, "gap_s": 0.05}) == \
        "SCHED_FIFO 1, 50 ms gaps"
    assert steps._sched_text({"rt": 1, "policy": [None, None]}) == \
        "fair scheduler (SCHED_FIFO 1 not permitted)"
    assert steps._sched_text({"rt": 0, "policy": [None, None],
                              "spill_s": {"untraced": 0.0, "traced": 0.0012, "control": 0.0}}) \
        == ("fair scheduler, writer CPU between rounds charged to the round before: "
            "untraced 0.0 ms, traced 1.2 ms, control 0.0 ms")


def test_set_orders_are_balanced_blocks_in_a_seeded_random_order():
    """Each block of six sets holds the six orders once (each mode first, second and last
    twice), in an order drawn from the seed: the same for every rank, another for another seed;
    seed None gives the fixed cycle of ORDERS."""
    steps = _steps_module()
    a = steps._set_orders(40, 7)
    assert a == steps._set_orders(40, 7) and len(a) == 40
    assert a != steps._set_orders(40, 8)
    for b in range(0, 36, 6):
        assert sorted(a[b:b + 6]) == sorted(steps.ORDERS)
    assert set(a[36:]) <= set(steps.ORDERS)
    assert steps._set_orders(8, None) == list(steps.ORDERS) + list(steps.ORDERS[:2])
    # over many blocks a traced round comes k rounds before an untraced and a control one
    # about equally often, at every lag (the fixed cycle: twice as often at lag 2)
    chain = [m for o in steps._set_orders(60000, 1) for m in o]
    for lag in (1, 2, 3, 4):
        n = Counter(chain[i + lag] for i in range(len(chain) - lag) if chain[i] == "traced")
        assert abs(n["untraced"] - n["control"]) < 0.03 * n["untraced"], (lag, n)
    cyc = [m for o in steps.ORDERS for m in o] * 10
    n2 = Counter(cyc[i + 2] for i in range(len(cyc) - 2) if cyc[i] == "traced")
    assert n2["untraced"] > 1.8 * n2["control"]


def _group_recorded() -> bool:
    """Whether DDP is recorded through commtrace's recording group here (the C++ module of
    `commtrace accel build` built for this torch)."""
    p = subprocess.run([sys.executable, "-c", "import torch; from commtrace.capture import accel; "
                        "m = accel.load(); print(bool(m is not None and hasattr(m, 'wrap_group')))"],
                       capture_output=True, text=True, timeout=120)
    return p.stdout.strip() == "True"


@pytest.mark.slow  # two DDP ranks, three sets of rounds
def test_control_group_runs_ddp_on_the_recording_group_with_the_recorder_off(tmp_path):
    """--control group (session 26): the control's rounds hand DDP's Reducer the recording
    group with the recorder off; the traced rounds still record DDP's two buckets per step."""
    if not _group_recorded():
        p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "steps.py"), "--workloads", "ddp",
                            "--control", "group", "--rounds", "1"], capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 2 and "--control group needs DDP recorded through" in p.stderr
        return
    out = tmp_path / "g.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "steps.py"), "--workloads", "ddp",
                        "--control", "group", "--rounds", "3", "--duration", "0.05", "--warmup", "2",
                        "--json", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    (r,) = json.loads(out.read_text())
    assert r["control"] == "group" and len(r["control_ratios"]) == 3
    assert r["ops_per_step_per_rank"] == 2          # the DDP sample's two buckets, traced rounds
    assert r["control_step_ms"] > 0
    assert "control = the recording group, recorder off" in p.stdout
    assert "control / untraced step time (the recording group's path, no row recorded):" in p.stdout


def test_variant_control_switches_the_fast_path_setting_per_round():
    """--control variant:NAME (session 29): the control's rounds set one of the C fast path's
    switches to its earlier behaviour, and each round after restores the default."""
    from commtrace.capture import recorder as R

    if R._cfast is None or getattr(R._cfast, "step_direct", None) is None:
        pytest.skip("the C fast path is not built")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import steps
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert steps._variant_switch("mirror") is None
    assert set(steps.VARIANTS) == {"step-property", "stamp-hold", "ddp-pending"}
    use = steps._variant_switch("variant:step-property")
    f = R._cfast.step_direct
    use(True)
    assert f(False) is False        # the variant: the step through the property
    use(False)
    assert f(True) is True          # the default again
    use = steps._variant_switch("variant:stamp-hold")
    use(True)
    assert R._cfast.stamp_release(False) is False
    use(False)
    assert R._cfast.stamp_release(True) is True
    use = steps._variant_switch("variant:ddp-pending")
    use(True)
    assert R._cfast.ddp_direct(False) is False   # DDP's buckets as pending ops
    use(False)
    assert R._cfast.ddp_direct(True) is True


@pytest.mark.slow  # a 2-rank run, as the small run above
def test_steps_benchmark_variant_control(tmp_path):
    out = tmp_path / "v.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "steps.py"),
                        "--workloads", "async_loop", "--rounds", "3", "--duration", "0.05",
                        "--warmup", "2", "--control", "variant:step-property",
                        "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    (r,) = json.loads(out.read_text())
    assert r["control"] == "variant:step-property"
    lo, hi = r["variant_ratio_ci95"]
    assert lo <= r["variant_ratio"] <= hi and r["variant_ratio"] > 0
    assert len(r["variant_median_ratio_ci95"]) == 3
    # both arms traced, the ops per step counted over the traced rounds only
    assert r["ops_per_step_per_rank"] == 8
    assert "traced / control (this code over variant:step-property, both traced)" in p.stdout
    assert "control / untraced step time (traced with variant:step-property)" in p.stdout
