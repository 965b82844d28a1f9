"""Every page of the dashboard at 1920 x 1080 and 1280 x 800 (issue 16: "no clipped text"), and
the dark theme, in Debian's Chromium through Playwright.

Geometry is asserted from the elements' bounding boxes, not by eye: no horizontal overflow of the
page; no element whose text is cut by its own box; no two blocks (cards, stats, titles, plots,
tables, alerts, buttons, tabs) overlapping unless one holds the other; every text of every plot
(titles, axis titles, legend entries, colorbar titles, tick labels) inside its plot, and no two
of a plot's titles and legend entries overlapping. A screenshot of each page goes to
test-artifacts/ for a look. One server per run for the module; no console error or warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import commtrace
from conftest import CHROMIUM, ROOT, clean_env

ART = os.path.join(ROOT, "test-artifacts")
DATA = os.path.join(ROOT, "tests", "data")
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium")]
GD = "document.querySelector('#timeline .js-plotly-plot')"
#: Each page and what shows that its content is there.
PAGES = [("Overview", "#view-overview #ov-health .main-svg"),
         ("Timeline", "#timeline .main-svg .xtick"),
         ("Overlap", "#overlap-rank .main-svg .xtick"),
         ("Stalls", "#stalls-heatmap .main-svg .xtick"),
         ("Findings", "#findings .ag-row"),
         ("Bandwidth", "#busbw .main-svg .xtick"),
         ("Run", "#facts-ranks tbody tr"),
         ("Compare", "#cmp-totals .ag-row")]

#: The geometry checks of the visible page, in the browser: a list of problems (empty: none).
CHECK_JS = r"""
(view) => {
  const out = [];
  const vw = window.innerWidth;
  const de = document.documentElement;
  if (de.scrollWidth > vw + 1) out.push(`page overflows horizontally: ${de.scrollWidth} > ${vw}`);
  const root = document.getElementById(view);
  const shown = el => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0 &&
                        getComputedStyle(el).visibility !== 'hidden'; };
  const name = el => (el.id ? '#' + el.id : '') + '.' + String(el.className && el.className.baseVal !== undefined
                     ? el.className.baseVal : el.className).split(' ').slice(0, 2).join('.') +
                     ' "' + (el.innerText || el.textContent || '').trim().slice(0, 40) + '"';
  const scope = [document.querySelector('#tabs'), document.querySelector('#run-summary').closest('.mantine-Group-root'),
                 document.querySelector('#live-banner'), document.querySelector('#banner'), root].filter(Boolean);
  // 1. text cut by its own box: an element with its own text whose content is wider or taller
  //    than its box while its overflow hides it (AG Grid cells included)
  for (const s of scope) for (const el of s.querySelectorAll('*')) {
    if (el.closest('.js-plotly-plot') || !shown(el)) continue;
    const own = Array.from(el.childNodes).some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own) continue;
    const cs = getComputedStyle(el);
    const hides = v => v === 'hidden' || v === 'clip';
    if ((hides(cs.overflowX) || cs.textOverflow === 'ellipsis') && el.scrollWidth > el.clientWidth + 1)
      out.push(`text cut (width ${el.scrollWidth} > ${el.clientWidth}): ${name(el)}`);
    if (hides(cs.overflowY) && el.scrollHeight > el.clientHeight + 1)
      out.push(`text cut (height ${el.scrollHeight} > ${el.clientHeight}): ${name(el)}`);
    const r = el.getBoundingClientRect();
    if (r.right > vw + 1 || r.left < -1) out.push(`outside the window: ${name(el)} [${r.left}, ${r.right}]`);
  }
  // 2. blocks overlapping (neither holding the other)
  const SEL = ['.mantine-Paper-root', '.mantine-Card-root', '.mantine-Title-root', '.js-plotly-plot',
               '.ag-root-wrapper', '.mantine-Alert-root', '.mantine-Button-root', '.mantine-Badge-root',
               '.mantine-Tabs-tab', '.mantine-Switch-root', '.mantine-Code-root', '#timeline-legend > div',
               '.rc-slider'].join(',');
  const blocks = [];
  for (const s of scope) for (const el of s.querySelectorAll(SEL)) if (shown(el)) blocks.push(el);
  for (let i = 0; i < blocks.length; i++) for (let j = i + 1; j < blocks.length; j++) {
    const a = blocks[i], b = blocks[j];
    if (a.contains(b) || b.contains(a)) continue;
    const p = a.getBoundingClientRect(), q = b.getBoundingClientRect();
    const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
    const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
    if (w > 1 && h > 1) out.push(`overlap ${w.toFixed(0)}x${h.toFixed(0)} px: ${name(a)} / ${name(b)}`);
  }
  // 3. plots: every text inside the plot; titles and legend entries apart
  for (const gd of root.querySelectorAll('.js-plotly-plot')) {
    if (!shown(gd)) continue;
    const g = gd.getBoundingClientRect();
    const id = gd.parentElement.id || gd.id;
    const texts = Array.from(gd.querySelectorAll('.main-svg text')).filter(t => t.textContent.trim() &&
        getComputedStyle(t).display !== 'none' && t.getAttribute('visibility') !== 'hidden' &&
        !t.closest('.hoverlayer'));
    for (const t of texts) {
      const r = t.getBoundingClientRect();
      if (r.width === 0) continue;
      if (r.left < g.left - 1 || r.right > g.right + 1 || r.top < g.top - 1 || r.bottom > g.bottom + 1)
        out.push(`plot ${id}: text outside the plot: "${t.textContent.slice(0, 40)}" ` +
                 `[${r.left.toFixed(0)}, ${r.top.toFixed(0)}, ${r.right.toFixed(0)}, ${r.bottom.toFixed(0)}] in ` +
                 `[${g.left.toFixed(0)}, ${g.top.toFixed(0)}, ${g.right.toFixed(0)}, ${g.bottom.toFixed(0)}]`);
    }
    const labels = texts.filter(t => t.matches('.gtitle, .xtitle, .ytitle, .y2title, .legendtext, .cbtitle text, .cbtitle'));
    for (let i = 0; i < labels.length; i++) for (let j = i + 1; j < labels.length; j++) {
      const p = labels[i].getBoundingClientRect(), q = labels[j].getBoundingClientRect();
      const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
      const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
      if (w > 1 && h > 1) out.push(`plot ${id}: "${labels[i].textContent}" overlaps "${labels[j].textContent}"`);
    }
  }
  return out;
}
"""



def many_ranks(tmp_path_factory):
    """A 32-rank synthetic run (one label per rank, rotated tick labels, long tables)."""
    out = str(tmp_path_factory.mktemp("layout") / "r32")
    p = subprocess.run([sys.executable, "-m", "commtrace", "synth", out, "--ranks", "32", "--ops", "300",
                        "--straggler", "7:2ms", "--late-send", "3:1ms", "--hazards", "-f"],
                       env=clean_env(), cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    return out


class Served:
    """A dashboard (with --compare) served from this process."""

    def __init__(self, path, compare):
        from commtrace.dashboard.app import build
        from commtrace.dashboard.serve import Server
        self.run, self.other = commtrace.load(path), commtrace.load(compare)
        self.app = build(self.run, compare=self.other)
        self.srv = Server(self.app)

    def close(self):
        self.srv.stop()
        self.run.close()
        self.other.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """run name -> its served dashboard (made on first use, shared by the module)."""
    made: dict[str, Served] = {}

    def get(name):
        if name not in made:
            path = many_ranks(tmp_path_factory) if name == "synth32" else os.path.join(DATA, name)
            made[name] = Served(path, os.path.join(DATA, "clean"))
        return made[name]
    yield get
    for s in made.values():
        s.close()


def _open(browser, srv, size, context=None):
    ctx = context or browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = ctx.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.goto(srv.url)
    page.wait_for_selector("#overview-body .mantine-Paper-root", timeout=60_000)
    return ctx, page, console


def _show(page, label, selector):
    """Show a page and wait for its content (retried: a click can land while the tabs re-render)."""
    for _ in range(3):
        page.click(f"#tabs >> text={label}")
        try:
            page.wait_for_selector(selector, state="visible", timeout=20_000)
            break
        except Exception:  # noqa: BLE001
            continue
    page.wait_for_selector(selector, state="visible", timeout=20_000)
    # settled: no callback in flight and the plots drawn (two animation frames)
    page.wait_for_function("() => !document.querySelector('._dash-loading') && "
                           "Array.from(document.querySelectorAll('.js-plotly-plot')).every(g => g._fullLayout)",
                           timeout=30_000)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


# 1920 x 1080 on the 4-rank run in the main suite; the others in CI's slow stage (suite time)
@pytest.mark.parametrize("name,size", [("straggler", (1920, 1080)),
                                       pytest.param("straggler", (1280, 800), marks=pytest.mark.slow),
                                       pytest.param("synth32", (1920, 1080), marks=pytest.mark.slow)])
def test_every_page_fits(browser, served, name, size):
    srv = served(name)
    ctx, page, console = _open(browser, srv.srv, size)
    try:
        os.makedirs(ART, exist_ok=True)
        problems = {}
        for label, sel in PAGES:
            _show(page, label, sel)
            view = "view-" + {"Run": "facts"}.get(label, label.lower())
            if label == "Timeline":  # drawn: exact ops or bins, and the critical path
                page.wait_for_function(f"() => {GD}.layout.meta.mode !== 'none'", timeout=30_000)
            p = page.evaluate(CHECK_JS, view)
            if p:
                problems[label] = p
            page.screenshot(path=f"{ART}/layout-{name}-{size[0]}x{size[1]}-{label.lower()}.png", full_page=True)
        assert problems == {}, problems
        assert console == [], console
    finally:
        ctx.close()


def test_dark_theme_toggle_persists_and_themes_every_plot(browser, served):
    """The toggle turns the page and every plot dark (the plots drawn before it, and those the
    server sends after it: a view shown the first time, a zoom); a reload keeps it (cookie), and
    the page is dark from its first figures; toggling back restores the light colours."""
    from commtrace.dashboard.figures import THEME_COLORS
    srv = served("straggler")
    dark, light = THEME_COLORS["dark"]["layout"], THEME_COLORS["light"]["layout"]
    ctx, page, console = _open(browser, srv.srv, (1280, 800))
    colors = ("() => Array.from(document.querySelectorAll('.js-plotly-plot')).filter(g => g._fullLayout)"
              ".map(g => [g.parentElement.id, g._fullLayout.paper_bgcolor, g._fullLayout.plot_bgcolor, g._fullLayout.font.color])")
    scheme = "() => document.documentElement.getAttribute('data-mantine-color-scheme')"

    def all_plots(c):
        got = page.evaluate(colors)
        assert got and all(x[1:] == [c["paper_bgcolor"], c["plot_bgcolor"], c["font.color"]] for x in got), got
        return {x[0] for x in got}

    try:
        page.wait_for_selector("#ov-health .main-svg")
        _show(page, "Timeline", "#timeline .main-svg .xtick")
        _show(page, "Overview", "#view-overview #ov-health .main-svg")
        assert page.evaluate(scheme) == "light"
        all_plots(light)
        page.locator(".mantine-Switch-root").click()
        page.wait_for_function(f"() => ({scheme})() === 'dark'", timeout=20_000)
        page.wait_for_function(f"() => ({colors})().every(x => x[1] === '{dark['paper_bgcolor']}')", timeout=20_000)
        assert {"ov-health", "timeline"} <= all_plots(dark)
        bg = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
        assert bg == "rgb(36, 36, 36)", bg
        # sent after the toggle: a lazy view's first showing, and a zoom of the timeline
        _show(page, "Overlap", "#overlap-rank .main-svg .xtick")
        assert "overlap-rank" in all_plots(dark)
        tpl = page.evaluate("() => document.querySelector('#overlap-rank .js-plotly-plot').layout.template.layout.paper_bgcolor")
        assert tpl == "rgb(17,17,17)"  # Plotly's dark template
        _show(page, "Findings", "#findings .ag-row")
        page.locator("#findings .ag-row").first.click()
        page.wait_for_function(f"() => {{ const g = {GD}; return g.offsetParent !== null && "
                               "g.data.some(t => t.name === 'selected'); }", timeout=30_000)
        assert page.evaluate(f"() => {GD}.layout.paper_bgcolor") == dark["paper_bgcolor"]
        grid_bg = page.evaluate("() => getComputedStyle(document.querySelector('#findings .ag-root-wrapper')).backgroundColor")
        assert grid_bg != "rgb(255, 255, 255)", grid_bg
        # persisted: a new page (same browser profile) is dark from the first response
        page.close()
        page = ctx.new_page()
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        page.goto(srv.srv.url)
        page.wait_for_selector("#ov-health .main-svg", timeout=60_000)
        assert page.evaluate(scheme) == "dark"
        assert page.locator("#theme-switch").is_checked()
        all_plots(dark)
        # and back
        page.locator(".mantine-Switch-root").click()
        page.wait_for_function(f"() => ({scheme})() === 'light'", timeout=20_000)
        page.wait_for_function(f"() => ({colors})().every(x => x[1] === '{light['paper_bgcolor']}')", timeout=20_000)
        all_plots(light)
        assert console == [], console
    finally:
        ctx.close()
