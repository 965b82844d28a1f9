"""The dashboard as a user meets it (issue 16), in Debian's Chromium through Playwright, on real
traced 2-rank gloo runs of the samples: the overview's straggler card and its "show on
timeline"; every number shown against `commtrace report --format json` on a run with findings
and a run with p2p; a live job that hangs on purpose; and --compare of good vs bad overlap.
One browser for the module; no console error and no warning may appear on any page."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import commtrace
from conftest import CHROMIUM, ROOT, SAMPLES, clean_env, launch_cmd, run_traced, torchrun_cmd

ART = os.path.join(ROOT, "test-artifacts")
FINDINGS = os.path.join(SAMPLES, "findings")
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium")]
GD = "document.querySelector('#timeline .js-plotly-plot')"



@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """sample name -> its traced run directory (made on first use, shared by the module)."""
    base = tmp_path_factory.mktemp("dash-product")
    made: dict[str, str] = {}

    def get(name, script=None, *args):
        if name not in made:
            out = base / name
            # ranks started by tests/launch_ranks.py: the dashboard reads the trace, not the
            # launcher (the live-job test below runs torchrun)
            run_traced(str(out), launch_cmd(script or os.path.join(FINDINGS, f"{name}.py"), *args),
                       opts=("--flush-interval", "0.5"), timeout=150)
            made[name] = str(out)
        return made[name]
    return get


@pytest.fixture(scope="module")
def reports():
    """run directory -> its `commtrace report --format json` (made once per directory)."""
    made: dict[str, dict] = {}

    def get(path):
        if path not in made:
            rep = subprocess.run([sys.executable, "-m", "commtrace", "report", path, "--format", "json"],
                                 env=clean_env(), cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert rep.returncode == 0, rep.stderr
            made[path] = json.loads(rep.stdout)
        return made[path]
    return get


class Page:
    """A served dashboard and a page on it that records console errors and warnings."""

    def __init__(self, browser, path, compare=None, viewport=(1280, 800)):
        from commtrace.dashboard.app import build
        from commtrace.dashboard.serve import Server
        self.run = commtrace.load(path)
        self.other = commtrace.load(compare) if compare else None
        self.app = build(self.run, compare=self.other)
        self.srv = Server(self.app)
        self.page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        self.console: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}")
                     if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        t = time.perf_counter()
        self.page.goto(self.srv.url)
        self.page.wait_for_selector("#overview-body .mantine-Paper-root", timeout=60_000)
        self.first_paint_s = time.perf_counter() - t

    def tab(self, label, selector):
        for _ in range(3):
            self.page.click(f"#tabs >> text={label}")
            try:
                self.page.wait_for_selector(selector, timeout=10_000)
                return
            except Exception:  # noqa: BLE001 (a late initial callback hid it on a loaded machine)
                continue
        self.page.wait_for_selector(selector, timeout=10_000)

    def grid(self, id_) -> list[dict]:
        """The cells of an AG Grid as shown (text), row by row in display order."""
        self.page.wait_for_selector(f"#{id_} .ag-center-cols-container .ag-row", timeout=20_000)
        return self.page.evaluate(f"""() => {{
            const rows = Array.from(document.querySelectorAll('#{id_} .ag-center-cols-container .ag-row'));
            rows.sort((a, b) => +a.getAttribute('row-index') - +b.getAttribute('row-index'));
            return rows.map(r => Object.fromEntries(Array.from(r.querySelectorAll('.ag-cell'))
                .map(c => [c.getAttribute('col-id'), c.innerText.trim()]))); }}""")

    def table(self, id_) -> list[dict]:
        """The cells of a plain (Mantine) table as shown (text), row by row: {field: text} from the
        cells' `col-<field>` classes."""
        self.page.wait_for_selector(f"#{id_} tbody tr", timeout=20_000)
        return self.page.evaluate(f"""() => Array.from(document.querySelectorAll('#{id_} tbody tr')).map(r =>
            Object.fromEntries(Array.from(r.querySelectorAll('td')).map(c =>
                [Array.from(c.classList).find(k => k.startsWith('col-')).slice(4), c.innerText.trim()])))""")

    def close(self):
        self.page.close()
        self.srv.stop()
        self.run.close()
        if self.other is not None:
            self.other.close()
        assert self.console == [], self.console


@pytest.fixture(scope="module")
def straggler_page(browser, traced):
    """One server and page on the straggler sample, shared by the tests that read it."""
    p = Page(browser, traced("straggler"))
    yield p
    p.close()


def _num(s):
    return None if s in ("", "—") else float(s)


def test_straggler_overview_card_and_show_on_timeline(straggler_page):
    p = straggler_page
    if True:
        page = p.page
        f = next(f for f in p.run.findings() if f.kind == "straggler")
        card = page.locator(".finding-straggler")
        assert card.count() == 1
        assert card.get_attribute("data-rank") == "1" and f.rank == 1
        text = card.inner_text()
        from commtrace.analysis.catalogue import CATALOGUE
        from commtrace.analysis.findings import fmt_ns
        cost = f.cost_s if getattr(f, "cost_s", None) is not None else f.impact_ns / 1e9
        assert f"{fmt_ns(cost * 1e9)} lost" in card.locator(".card-cost").inner_text()
        if getattr(f, "gain_s", None) is not None:
            assert card.locator(".card-gain").inner_text() == fmt_ns(f.gain_s * 1e9)
        line = next(i for i, x in enumerate(open(os.path.join(FINDINGS, "straggler.py")), 1) if "all_reduce(" in x)
        assert card.locator(".card-site").inner_text() == f.site and f.site.endswith(f"straggler.py:{line}")
        fix = " ".join(card.locator(".card-fix").inner_text().split())
        assert fix == "Fix: " + " ".join(CATALOGUE["straggler"].fix.replace("`", "").split())
        assert "Straggler rank" in text and "rank 1 arrived last" in text
        # the health strip flags rank 1
        health = p.table("ov-health-table")
        assert [r["rank"] for r in health if r["flag"] == "straggler"] == ["1"]
        os.makedirs(ART, exist_ok=True)
        page.screenshot(path=f"{ART}/product-overview.png")
        # "show on timeline": the timeline zoomed to the straggler's collectives, the first selected
        t = time.perf_counter()
        card.locator(".show-on-timeline").click()
        page.wait_for_function(f"() => {{ const g = {GD}; return g && g.offsetParent !== null && "
                               "g.data.some(t => t.name === 'selected'); }", timeout=20_000)
        zoom_s = time.perf_counter() - t
        from commtrace.analysis.overview import evidence
        ev = evidence(p.run, f)
        rng = page.evaluate(f"() => {GD}.layout.xaxis.range")
        mode = page.evaluate(f"() => {GD}.layout.meta.mode")
        t0 = (ev["t0_ns"] - p.run.t_min_ns) / 1e9
        t1 = (ev["t1_ns"] - p.run.t_min_ns) / 1e9
        assert rng[0] <= t0 < t1 <= rng[1] and rng[1] - rng[0] < (t1 - t0) * 1.5 + 1e-3 and mode == "exact"
        info = page.inner_text("#selection-info")
        assert f"seq {ev['seq']}" in info and "last rank 1" in info
        page.wait_for_timeout(500)
        page.screenshot(path=f"{ART}/product-timeline.png")
        print(f"straggler: first paint {p.first_paint_s:.2f} s, show on timeline {zoom_s:.2f} s")
        assert p.console == [], p.console


@pytest.mark.parametrize("name", ["straggler", "pipeline"])
def test_every_number_shown_equals_the_report(browser, traced, reports, straggler_page, name):
    """Per-rank wait, exposed and overlap ratio; bandwidth time, algbw and busbw; finding counts:
    what the page shows against `commtrace report --format json` on the same directory."""
    path = traced(name) if name != "pipeline" else traced("pipeline", os.path.join(SAMPLES, "pipeline.py"))
    rep = reports(path)
    shared = name == "straggler"
    p = straggler_page if shared else Page(browser, path)
    try:
        page = p.page
        if shared:
            p.tab("Overview", "#ov-health-table tbody tr")
        # overview: per-rank health table (4 decimals; overlap ratio 3)
        pr = {r["rank"]: r for r in rep["per_rank"]}
        shown = p.table("ov-health-table")
        assert [int(r["rank"]) for r in shown] == sorted(pr)
        for r in shown:
            want = pr[int(r["rank"])]
            assert _num(r["wait_s"]) == pytest.approx(want["wait_s"], abs=5.1e-5)
            assert _num(r["exposed_s"]) == pytest.approx(want["exposed_s"], abs=5.1e-5)
            if want["overlap_ratio"] is None:
                assert r["overlap_ratio"] == ""
            else:
                assert _num(r["overlap_ratio"]) == pytest.approx(want["overlap_ratio"], abs=5.1e-4)
        # headline totals and finding counts
        assert page.inner_text("#ov-findings") == str(sum(rep["finding_counts"].values()))
        hint = page.locator("#ov-findings").locator("xpath=..").inner_text()
        for kind, n in rep["finding_counts"].items():
            assert f"{kind} {n}" in hint
        exp_hint = page.locator("#ov-exposed").locator("xpath=..").inner_text()
        assert f"{sum(r['exposed_s'] for r in rep['per_rank']):.4f} s over all ranks" in exp_hint
        from commtrace.analysis.overview import TOP_CARDS
        assert page.locator(".finding-card").count() == min(len({(f["kind"], f["rank"]) for f in rep["findings"]}), TOP_CARDS)
        # findings page: one row per finding, in the report's order
        p.tab("Findings", "#findings")
        rows = p.grid("findings")
        assert [r["kind"] for r in rows] == [f["kind"] for f in rep["findings"]]
        # overlap page: the per-rank bars are per_rank's exposed and overlapped seconds
        p.tab("Overlap", "#overlap-rank .main-svg")
        bars = page.evaluate("() => { const g = document.querySelector('#overlap-rank .js-plotly-plot');"
                             " return [Array.from(g._fullData[0].y), Array.from(g._fullData[1].y)]; }")
        assert bars[0] == pytest.approx([r["exposed_s"] for r in rep["per_rank"]], abs=1e-9)
        assert bars[1] == pytest.approx([r["overlapped_s"] for r in rep["per_rank"]], abs=1e-9)
        # bandwidth page: nccl-tests table = collectives_summary (time is the mean t_comm, in us)
        cs = rep["collectives_summary"]
        if cs:
            p.tab("Bandwidth", "#bw-table tbody tr")
            shown = p.table("bw-table")
            assert len(shown) == len(cs)
            want = {(r["pg"], r["op"], r["size_label"]): r for r in cs}
            for r in shown:
                w = want[(r["pg"], r["op"], r["size"])]
                assert int(r["count"]) == w["count"]
                assert _num(r["time_us"]) == pytest.approx(w["t_comm_s"] * 1e6, abs=0.051)
                assert _num(r["algbw_gbps"]) == pytest.approx(w["algbw_gbps"], abs=5.1e-4)
                assert _num(r["busbw_gbps"]) == pytest.approx(w["busbw_gbps"], abs=5.1e-4)
        else:
            p.tab("Bandwidth", "#bw-empty")
        if name == "pipeline":
            assert p.run.p2p().num_rows > 0
            p.tab("Stalls", "#stalls-heatmap .main-svg")
            assert page.locator("#late-pairs, #late-pairs-empty").count() == 1
        assert p.console == [], p.console
    finally:
        if not shared:
            p.close()


def test_critical_path_drawn_is_the_analysis_segments(straggler_page, traced, reports):
    """The timeline's critical path line, as the browser holds it, is
    `critical_path.segments(run)` of a fresh load of the directory, segment by segment on each
    segment's rank; the legend's segment count and length are the report JSON's."""
    p, page = straggler_page, straggler_page.page
    path = traced("straggler")
    from commtrace.analysis.critical_path import segments
    fresh = commtrace.load(path)
    try:
        seg = segments(fresh).to_pydict()
        t_min = fresh.t_min_ns
        ranks = [int(r) for r in fresh.ranks]
    finally:
        fresh.close()
    end_s = (max(seg["t1_ns"]) - t_min) / 1e9
    p.tab("Timeline", "#timeline .main-svg")
    page.click("#reset")
    # wait for the reset view itself (the whole run), not only a view that starts at 0: under
    # load the page may still show an earlier zoom that happens to start there
    page.wait_for_function(f"() => {{ const g = {GD}; return g && g.layout.meta && g.layout.meta.mode !== 'none' && "
                           "g.layout.meta.critical === 'segments' && g.layout.xaxis.range[0] <= 0 && "
                           f"g.layout.xaxis.range[1] >= {end_s!r} && "
                           "g.data.some(t => t.name === 'critical path'); }", timeout=30_000)
    drawn = page.evaluate(f"""() => {{ const g = {GD}; const t = g._fullData.find(t => t.name === 'critical path');
        return {{x: Array.from(t.x), y: Array.from(t.y), range: g.layout.xaxis.range,
                 ticks: Array.from(g.layout.yaxis.ticktext)}}; }}""")
    a, b = drawn["range"]
    t0 = [(v - t_min) / 1e9 for v in seg["t0_ns"]]
    t1 = [(v - t_min) / 1e9 for v in seg["t1_ns"]]
    want = [i for i in range(len(t0)) if t1[i] >= a and t0[i] <= b]
    assert len(want) == len(t0) > 20  # the whole run in view: every segment
    assert len(drawn["x"]) == 2 * len(want)
    for k, i in enumerate(want):
        assert drawn["x"][2 * k] == pytest.approx(t0[i], abs=1e-9)
        assert drawn["x"][2 * k + 1] == pytest.approx(t1[i], abs=1e-9)
        assert drawn["y"][2 * k] == drawn["y"][2 * k + 1] == ranks.index(seg["rank"][i]) * 3 + 0.5
    # the straggler (rank 1) holds part of the path: the line visits its row
    assert 1 * 3 + 0.5 in drawn["y"]
    cp = reports(path)["critical_path"]
    assert cp["segments"] == len(t0)
    legend = page.inner_text("#critical-legend")
    assert f"{cp['segments']:,} segments, {cp['length_s']:.4f} s" in legend
    assert p.console == [], p.console


#: The overview's headline figures: the element ids' keys (`ov-<key>` live, `pre-ov-<key>` static).
STAT_KEYS = ("world", "duration", "steps", "compute", "exposed", "wait", "overlap", "findings")


def _health_cells(page, table_id) -> list[dict]:
    return page.evaluate(f"""() => Array.from(document.querySelectorAll('#{table_id} tbody tr')).map(r =>
        Object.fromEntries(Array.from(r.querySelectorAll('td')).map(c =>
            [Array.from(c.classList).find(k => k.startsWith('col-')).slice(4), c.innerText.trim()])))""")


def test_first_response_carries_the_overview_numbers(browser, straggler_page, traced, reports):
    """The page's first HTTP response, as a browser without JavaScript shows it (no other request
    than its stylesheet and icon), already holds the overview: its headline figures, finding
    cards and per-rank health table equal `commtrace report --format json`; once React has
    mounted, the live overview shows the same text and the static one is gone. Chromium painted
    the static numbers before the live page took over (Element Timing against the page's
    `commtrace:interactive` mark)."""
    import urllib.request
    from commtrace.analysis.findings import fmt_ns
    p = straggler_page
    rep = reports(traced("straggler"))
    ov = rep["overview"]
    h, w = ov["headline"], ov["headline"]["run"]
    raw = urllib.request.urlopen(p.srv.url, timeout=60).read().decode()
    assert raw.count('id="ct-pre"') == 1 and raw.index('id="ct-pre"') < raw.index('id="react-entry-point"')
    ctx = browser.new_context(java_script_enabled=False, viewport={"width": 1280, "height": 800})
    try:
        pg = ctx.new_page()
        asked: list[str] = []
        pg.on("request", lambda r: asked.append(r.url))
        pg.goto(p.srv.url)
        assert not [u for u in asked if "_dash-" in u and "component-suites" not in u], asked  # no layout, no callback
        static = {k: pg.inner_text(f"#pre-ov-{k}") for k in STAT_KEYS}
        for k in STAT_KEYS:  # each also verbatim in the HTML of the response
            assert f'id="pre-ov-{k}"' in raw and static[k].replace("&", "&amp;") in raw
        assert static["world"] == str(h["world_size"]) == "2"
        assert static["duration"] == f"{h['duration_s']:.3f} s"
        assert static["steps"] == (str(h["steps"]) if h["steps"] else "none")
        for key, field in (("compute", "compute"), ("exposed", "exposed_comm"), ("wait", "wait")):
            assert float(static[key].rstrip("%")) == pytest.approx(w[field] * 100, abs=0.051)
        assert float(static["overlap"]) == pytest.approx(w["overlap_ratio"], abs=0.0051)
        assert static["findings"] == str(sum(rep["finding_counts"].values()))
        hint = pg.locator("#pre-ov-exposed").locator("xpath=..").inner_text()
        assert f"{sum(r['exposed_s'] for r in rep['per_rank']):.4f} s over all ranks" in hint
        # the cards: kind, rank and cost of the report's overview cards, in its order
        cards = pg.locator("#pre-cards .ct-card")
        assert cards.count() == len(ov["cards"]) >= 1
        for k, c in enumerate(ov["cards"]):
            card = cards.nth(k)
            assert card.get_attribute("data-kind") == c["kind"] and card.get_attribute("data-rank") == str(c["rank"])
            assert card.locator(".card-site").inner_text() == c["site"]
        straggler = next(c for c in ov["cards"] if c["kind"] == "straggler")
        cost = pg.locator('#pre-cards .ct-card[data-kind="straggler"] .card-cost').inner_text()
        assert cost.startswith(f"{fmt_ns(straggler['cost_s'] * 1e9)} lost")
        # the per-rank health table: per_rank's wait, exposed and overlap ratio
        pr = {r["rank"]: r for r in rep["per_rank"]}
        rows = _health_cells(pg, "pre-ov-health-table")
        assert [int(r["rank"]) for r in rows] == sorted(pr)
        for r in rows:
            want = pr[int(r["rank"])]
            assert _num(r["wait_s"]) == pytest.approx(want["wait_s"], abs=5.1e-5)
            assert _num(r["exposed_s"]) == pytest.approx(want["exposed_s"], abs=5.1e-5)
            assert _num(r["overlap_ratio"]) == pytest.approx(want["overlap_ratio"], abs=5.1e-4)
        # the flags are the report's (overview.health); the planted straggler is rank 1. Which
        # other flags a rank gets depends on the run (under load the first op's setup can stall
        # long enough for a first_op_init_stall finding), so only the report decides them.
        assert [r["flag"] or None for r in rows] == [h["flag"] for h in ov["health"]]
        assert straggler["rank"] == 1 and "straggler" in {f["kind"] for f in rep["findings"] if f["rank"] == 1}
    finally:
        ctx.close()
    # the live page, mounted: the same text, and the static overview removed
    page = p.page
    p.tab("Overview", "#overview-body #ov-compute")
    assert page.locator("#ct-pre").count() == 0
    assert {k: page.inner_text(f"#ov-{k}") for k in STAT_KEYS} == static
    assert [(c.get_attribute("data-kind"), c.get_attribute("data-rank"))
            for c in page.locator("#overview-body .finding-card").all()] == [(c["kind"], str(c["rank"])) for c in ov["cards"]]
    assert _health_cells(page, "ov-health-table") == rows
    painted, interactive = page.evaluate("""() => new Promise(res => {
        new PerformanceObserver((l, o) => { o.disconnect();
            res([l.getEntries().filter(e => e.identifier === 'ct-overview').map(e => e.renderTime || e.loadTime),
                 performance.getEntriesByName('commtrace:interactive').map(e => e.startTime)]); })
            .observe({type: 'element', buffered: true}); })""")
    assert len(painted) >= len(STAT_KEYS) and len(interactive) == 1
    assert max(painted) < interactive[0]
    assert p.console == [], p.console


def test_plain_tables_sort_by_a_clicked_header(straggler_page):
    """The overview's per-rank health table and the Run page's fact tables (Mantine tables, no AG
    Grid on the first page) sort by the clicked header's column, ascending then descending,
    in the browser; a click on "rank" brings back the first order."""
    p, page = straggler_page, straggler_page.page
    p.tab("Overview", "#ov-health-table tbody tr")
    first = _health_cells(page, "ov-health-table")
    assert [int(r["rank"]) for r in first] == [0, 1]

    def click(table, col, arrow):
        page.click(f"#{table} th.col-{col} button")
        page.wait_for_function(f"() => document.querySelector('#{table} th.col-{col}').innerText.endsWith('{arrow}')",
                               timeout=20_000)
        return _health_cells(page, table)

    waits = {r["rank"]: _num(r["wait_s"]) for r in first}
    assert waits["1"] < waits["0"]  # the straggler waits least: the others wait for it
    up = click("ov-health-table", "wait_s", "▲")
    assert [r["rank"] for r in up] == ["1", "0"]
    assert sorted(up, key=lambda r: r["rank"]) == first  # whole rows moved
    down = click("ov-health-table", "wait_s", "▼")
    assert [r["rank"] for r in down] == ["0", "1"]
    assert "▲" not in page.inner_text("#ov-health-table th.col-rank")
    down = click("ov-health-table", "exposed_s", "▲")
    ex = [_num(r["exposed_s"]) for r in down]
    assert ex == sorted(ex)
    assert click("ov-health-table", "rank", "▲") == first
    # the Run page's job facts: by fact name, then the other way; a number column sorts numerically
    p.tab("Run", "#facts-job tbody tr")
    shown = _health_cells(page, "facts-job")
    names = click("facts-job", "fact", "▲")
    assert [r["fact"] for r in names] == sorted((r["fact"] for r in shown), key=str.lower)
    back = click("facts-job", "fact", "▼")
    assert [r["fact"] for r in back] == [r["fact"] for r in names][::-1]
    ops = _health_cells(page, "facts-ops")
    calls = click("facts-ops", "value", "▲")
    assert [int(r["value"]) for r in calls] == sorted(int(r["value"]) for r in ops)
    calls = click("facts-ops", "value", "▼")
    assert [int(r["value"]) for r in calls] == sorted((int(r["value"]) for r in ops), reverse=True)
    assert sorted(calls, key=lambda r: r["fact"]) == sorted(ops, key=lambda r: r["fact"])
    assert p.console == [], p.console


@pytest.mark.slow
def test_live_job_hang_banner_and_end(browser, tmp_path):
    """A 2-rank job that hangs on purpose (samples/findings/hang.py: rank 1 never joins
    all_reduce seq 9) under `commtrace run`; the dashboard opened while it runs shows each rank's
    current op and names rank 1 within 10 s; once the job is killed the page says it ended."""
    out = tmp_path / "hang"
    cmd = [sys.executable, "-m", "commtrace", "run", "-o", str(out), "--flush-interval", "0.5", "--",
           *torchrun_cmd(os.path.join(FINDINGS, "hang.py"))]
    job = subprocess.Popen(cmd, env=clean_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    p = None
    try:
        t0 = time.time()
        run_dir = None
        while True:  # rank 0 stuck in seq 9 (both ranks' snapshots written)
            assert time.time() - t0 < 120 and job.poll() is None, "the job did not reach its hang"
            # the job's run directory: OUT/<run id>/ (trace schema v2), or OUT itself (v1)
            for cand in [out, *sorted(out.glob("*/"))] if out.exists() else []:
                try:
                    s0 = json.load(open(cand / "rank=0" / "_inflight.json"))
                    json.load(open(cand / "rank=1" / "_inflight.json"))
                    if any(o.get("seq") == 9 for o in s0["ops"]):
                        run_dir = cand
                except (OSError, ValueError):
                    pass
            if run_dir is not None:
                break
            time.sleep(0.3)
        p = Page(browser, str(out))
        page = p.page
        assert page.inner_text("#job-badge").lower() == "job running"
        t = time.perf_counter()
        page.wait_for_selector("#hang-banner", timeout=10_000)
        page.wait_for_function("() => document.querySelector('#live-table .ag-row') !== null", timeout=10_000)
        assert time.perf_counter() - t + p.first_paint_s <= 10.0
        assert "rank 1 has not joined all_reduce seq 9 on pg 0" in page.inner_text("#hang-banner")
        live = {r["rank"]: r for r in p.grid("live-table")}
        assert live["0"]["now"] == "in all_reduce" and live["0"]["pg"] == "0" and live["0"]["seq"] == "9"
        assert live["1"]["now"] == "no op in flight" and live["1"]["last completed"] == "all_reduce seq 8"
        os.makedirs(ART, exist_ok=True)
        page.screenshot(path=f"{ART}/product-live.png")
        # the live page fits too (the geometry checks of tests/test_dashboard_layout.py)
        from test_dashboard_layout import CHECK_JS
        for w, h in ((1280, 800), (1920, 1080)):
            page.set_viewport_size({"width": w, "height": h})
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            assert page.evaluate(CHECK_JS, "view-overview") == [], (w, h)
        # the strip refreshes on its own: rank 0's time in the op grows
        first = live["0"]["for"]
        page.wait_for_function(f"() => {{ const c = document.querySelector('#live-table .ag-row[row-index=\"0\"] [col-id=\"for\"]');"
                               f" return c && c.innerText.trim() !== {json.dumps(first)}; }}", timeout=10_000)
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)
        page.wait_for_selector("#ended-banner", timeout=30_000)
        assert "The job ended" in page.inner_text("#ended-banner")
        page.wait_for_function("() => !document.querySelector('#job-badge').innerText.toLowerCase().includes('running')",
                               timeout=20_000)
        # the final analysis names the culprit on the overview
        page.wait_for_selector(".finding-not_joined", timeout=20_000)
        assert page.locator(".finding-not_joined").get_attribute("data-rank") == "1"
    finally:
        if job.poll() is None:  # commtrace run forwards SIGTERM to the launcher and its ranks
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                job.kill()
        if p is not None:
            p.close()


@pytest.mark.slow
def test_compare_good_and_bad_overlap(browser, traced):
    good, bad = traced("good_overlap"), traced("bad_overlap")
    p = Page(browser, good, compare=bad)
    try:
        p.tab("Compare", "#cmp-totals .ag-row")
        diff = p.app._commtrace_diff
        rows = {r["figure"]: r for r in p.grid("cmp-totals")}
        ex = diff["totals"]["exposed_s"]
        assert _num(rows["exposed_s"]["a"]) == pytest.approx(ex["a"], abs=5.1e-5)
        assert _num(rows["exposed_s"]["b"]) == pytest.approx(ex["b"], abs=5.1e-5)
        assert _num(rows["exposed_s"]["delta"]) == pytest.approx(ex["b"] - ex["a"], abs=1.1e-4)
        assert ex["b"] > ex["a"]  # bad overlap exposes more communication
        # both overviews, side by side
        assert p.page.inner_text("#ov-world-a") == p.page.inner_text("#ov-world-b") == "2"
        assert p.page.locator("#view-compare .finding-wait_immediately").count() >= 1
        os.makedirs(ART, exist_ok=True)
        p.page.screenshot(path=f"{ART}/product-compare.png")
    finally:
        p.close()
