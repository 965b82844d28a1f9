"""Browser tests: the dashboard served from a thread, driven by Debian's Chromium through
Playwright, on a traced 2-rank DDP run and on a large synthetic run with planted anomalies.
Screenshots go to test-artifacts/ (docs/img/ holds copies of good ones)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import commtrace
from conftest import CHROMIUM, ROOT, SAMPLES, clean_env, launch_cmd, run_traced

ART = os.path.join(ROOT, "test-artifacts")
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium")]
#: The large synthetic run (the benchmark, benchmarks/dashboard.py, uses 64 x 20,000).
BIG_RANKS, BIG_OPS = 64, int(os.environ.get("COMMTRACE_TEST_DASH_OPS", "2000"))

GD = "document.querySelector('#timeline .js-plotly-plot')"
#: The timeline's view is shown (hidden views have height 0, so that their plots keep their size).
VISIBLE = "(g.offsetParent !== null && document.querySelector('#view-timeline').getBoundingClientRect().height > 100)"



def _serve(path):
    from commtrace.dashboard.app import build
    from commtrace.dashboard.serve import Server
    run = commtrace.load(path)
    return run, Server(build(run))


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dash-ddp") / "run"
    # a 15 ms straggler on rank 1 so that the run always has a finding to click. 30 steps: the
    # straggler's evidence is counted over steps (one trial per step), and over 16 steps (two of
    # them set-up) a rank last at every step reached z_steps 3.15-3.40, one noisy step from none
    # (ranks started by tests/launch_ranks.py: the dashboard reads the trace, not the launcher)
    run_traced(str(out), launch_cmd(os.path.join(SAMPLES, "ddp_mlp.py"), "--steps", 30, "--straggler-ms", 15))
    return str(out)


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dash-big") / "run"
    p = subprocess.run([sys.executable, "-m", "commtrace", "synth", str(out), "--ranks", str(BIG_RANKS),
                        "--ops", str(BIG_OPS), "--straggler", "5:2ms", "--late-send", "3:1ms", "--hazards"],
                       env=clean_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return str(out)


def _timeline(page):
    return page.evaluate(f"""() => {{ const g = {GD};
        return {{mode: g.layout.meta.mode, range: g.layout.xaxis.range, ticks: g.layout.yaxis.ticktext,
                 names: g.data.map(t => t.name)}}; }}""")


def _open(page, url, errors):
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    t = time.perf_counter()
    page.goto(url)
    page.wait_for_function(f"() => {{ const g = {GD}; return g && g.data && g.layout && g.layout.meta; }}",
                           timeout=60_000)
    dt = time.perf_counter() - t
    page.wait_for_load_state("networkidle")
    return dt


def _tab(page, label, selector):
    """Switch view; click again if a late initial callback hid it (2-core machines)."""
    for _ in range(3):
        page.click(f"#tabs >> text={label}")
        try:
            page.wait_for_selector(selector, timeout=10_000)
            return
        except Exception:  # noqa: BLE001
            continue
    page.wait_for_selector(selector, timeout=10_000)


def _click_op(page, world):
    """Click an op of rank 0 (exact view) whose collective also shows on another rank; returns
    its (pg code, seq)."""
    cands = page.evaluate(f"""() => {{ const g = {GD};
        const t = g._fullData.find(t => t.name === 'ops (hover / click)'); if (!t) return [];
        const fl = g._fullLayout, xa = fl.xaxis, ya = fl.yaxis, r = g.getBoundingClientRect();
        const key = k => t.customdata[k][0] + ':' + t.customdata[k][1];
        const selTrace = g.data.find(t => t.name && t.name.startsWith('selected pg'));
        const cur = selTrace ? selTrace.name.split(' seq ')[1] : null;
        const rows = {{}};
        for (let k = 0; k < t.x.length; k++) (rows[key(k)] = rows[key(k)] || new Set()).add(t.y[k]);
        const out = [];
        for (let k = 0; k < t.x.length; k++) {{
            if (t.y[k] !== 1 || rows[key(k)].size < 2 || /<b>(send|recv)/.test(t.text[k]) ||
                String(t.customdata[k][1]) === cur) continue;
            const px = xa.l2p(t.x[k]);
            if (px < 20 || px > xa._length - 20) continue;
            out.push([r.left + fl._size.l + px, r.top + fl._size.t + ya.l2p(t.y[k]), t.customdata[k][0], t.customdata[k][1]]);
        }}
        const step = Math.max(1, Math.floor(out.length / 4));
        return out.filter((_, j) => j % step === 0); }}""")
    assert cands, "no clickable collective op of rank 0 in view"
    for x, y, pg, seq in cands[:4]:
        page.mouse.move(x - 3, y)
        page.mouse.move(x, y)
        page.wait_for_timeout(300)
        page.mouse.click(x, y)
        try:
            page.wait_for_function(f"""() => {{ const g = {GD};
                const t = g.data.find(t => t.name === 'selected');
                return t && t.customdata && new Set(Array.from(t.customdata)).size >= 2 &&
                       g.data.find(t => t.name && t.name.startsWith('selected pg')).name.endsWith(' seq {seq}'); }}""",
                                   timeout=8_000)
            return pg, seq
        except Exception:  # noqa: BLE001 (a marker on top took the click: try the next op)
            continue
    raise AssertionError("clicking an op did not highlight its collective")


def _check_run(browser, path, name, world):
    os.makedirs(ART, exist_ok=True)
    run, srv = _serve(path)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    try:
        first = _open(page, srv.url, errors)
        # the overview comes first, with its numbers in the first response
        assert page.inner_text("#ov-world") == str(world)
        _tab(page, "Timeline", "#timeline .main-svg")
        page.wait_for_function(f"() => {GD}.layout.meta.mode !== 'none'", timeout=20_000)
        tl = _timeline(page)
        # one labelled row per rank (and per sub-row, for a few ranks)
        want = ([x for r in range(world) for x in (f"rank {r} · host-blocked", "in-flight", "wait / sync")]
                if world <= 16 else [f"rank {r}" for r in range(world)])
        assert tl["ticks"] == want
        assert tl["range"][0] == 0
        page.screenshot(path=f"{ART}/dashboard-{name}-timeline.png", full_page=True)

        # clicking a finding zooms the timeline to its evidence
        assert run.findings(), "the run should have findings"
        _tab(page, "Findings", "#findings .ag-row")
        page.screenshot(path=f"{ART}/dashboard-{name}-findings.png", full_page=True)
        full = tl["range"][1]
        t = time.perf_counter()
        page.locator('#findings .ag-row[row-index="0"] [col-id="kind"]').first.click()
        page.wait_for_function(f"() => {{ const g = {GD}; return {VISIBLE} && "
                               f"g.layout.xaxis.range[1] - g.layout.xaxis.range[0] < {full} * 0.9; }}", timeout=20_000)
        zoom_s = time.perf_counter() - t
        tl = _timeline(page)
        assert tl["mode"] == "exact" and "finding" in tl["names"]
        from commtrace.analysis.overview import evidence
        ev = evidence(run, run.findings()[0])  # the row clicked
        assert tl["range"][0] <= (ev["t0_ns"] - run.t_min_ns) / 1e9 <= (ev["t1_ns"] - run.t_min_ns) / 1e9 <= tl["range"][1]
        page.wait_for_timeout(500)
        page.screenshot(path=f"{ART}/dashboard-{name}-finding-zoom.png", full_page=True)

        # selecting an op highlights the other ranks' copies, with arrival skew and last rank
        t = time.perf_counter()
        pg, seq = _click_op(page, world)
        select_s = time.perf_counter() - t
        hl = page.evaluate(f"() => Array.from({GD}.data.find(t => t.name === 'selected').customdata)")
        coll = [r for r in run.collectives().to_pylist() if r["seq"] == seq]
        assert sorted(hl) == sorted(range(world)) if any(r["n_ranks"] == world for r in coll) else len(hl) >= 2
        info = page.inner_text("#selection-info")
        assert f"seq {seq}" in info and "arrival skew" in info and "last rank" in info
        page.wait_for_timeout(500)
        page.screenshot(path=f"{ART}/dashboard-{name}-selected.png", full_page=True)

        for tab, sel in (("Overlap", "#overlap-step .main-svg"), ("Stalls", "#stalls-heatmap .main-svg"),
                         ("Bandwidth", "#busbw .main-svg"), ("Run", "#facts-job tbody tr")):
            _tab(page, tab, sel)
            page.wait_for_timeout(500)
            page.screenshot(path=f"{ART}/dashboard-{name}-{tab.lower()}.png", full_page=True)
        cells = page.locator("#facts-job tbody tr").filter(has_text="world size").first.locator("td").all_inner_texts()
        assert cells == ["world size", str(world)]

        # the range slider follows a box-zoom on the plot, and the plot follows the slider
        _tab(page, "Timeline", "#timeline .main-svg")
        page.click("#reset")
        page.wait_for_function(f"() => {{ const g = {GD}; return g.layout.xaxis.range[0] === 0 && "
                               f"g.layout.xaxis.range[1] === {full}; }}", timeout=20_000)
        a, b = full * 0.3, full * 0.6
        x0, x1, y = page.evaluate(f"""() => {{ const g = {GD}, fl = g._fullLayout, r = g.getBoundingClientRect();
            return [r.left + fl._size.l + fl.xaxis.l2p({a}), r.left + fl._size.l + fl.xaxis.l2p({b}),
                    r.top + fl._size.t + fl._size.h / 2]; }}""")
        page.mouse.move(x0, y)
        page.mouse.down()
        page.mouse.move((x0 + x1) / 2, y, steps=4)
        page.mouse.move(x1, y, steps=4)
        page.mouse.up()
        page.wait_for_function(f"() => {{ const h = document.querySelectorAll('#range [role=slider]'); "
                               f"return h.length === 2 && Math.abs(+h[0].getAttribute('aria-valuenow') - {a}) < {full} * 0.02 && "
                               f"Math.abs(+h[1].getAttribute('aria-valuenow') - {b}) < {full} * 0.02; }}", timeout=20_000)
        tl = _timeline(page)
        assert abs(tl["range"][0] - a) < full * 0.02 and abs(tl["range"][1] - b) < full * 0.02
        # the other way: dragging the slider's left handle moves the plot's start
        lo = float(page.get_attribute("#range [role=slider] >> nth=0", "aria-valuenow"))
        box = page.locator("#range [role=slider]").first.bounding_box()
        hx, hy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        page.mouse.move(hx, hy)
        page.mouse.down()
        page.mouse.move(hx + 60, hy, steps=5)
        page.mouse.up()
        page.wait_for_function(f"() => {{ const g = {GD}; return g.layout.xaxis.range[0] > {lo} + {full} * 0.01; }}",
                               timeout=20_000)
        new_lo = float(page.get_attribute("#range [role=slider] >> nth=0", "aria-valuenow"))
        assert _timeline(page)["range"][0] == pytest.approx(new_lo, abs=full * 1e-3)
        assert errors == [], errors
        print(f"{name}: first page {first:.2f} s, finding zoom {zoom_s:.2f} s, select {select_s:.2f} s")
    finally:
        page.close()
        srv.stop()
        run.close()


def test_ddp_run_in_browser(browser, ddp_run):
    _check_run(browser, ddp_run, "ddp", 2)


def test_large_synthetic_run_in_browser(browser, big_run):
    _check_run(browser, big_run, "synth64", BIG_RANKS)
