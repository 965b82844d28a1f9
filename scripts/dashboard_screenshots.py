"""Refresh the screenshots of docs/dashboard.md and docs/concepts.md (1280 x 800, Debian's
Chromium through Playwright) from the current dashboard: the overview and the timeline of
samples/findings/straggler.py, the live view of samples/findings/hang.py while it hangs,
--compare of good_overlap.py vs bad_overlap.py, and for concepts.md a 2-rank DDP run
(samples/ddp_mlp.py with a 15 ms straggler on rank 1): its timeline with a collective selected,
its Overlap and its Stalls view. Each sample really runs under `commtrace run` (2 ranks, gloo);
about three minutes.

    python scripts/dashboard_screenshots.py [--out docs/img] [--keep DIR] [--only dashboard|concepts]

Fails (exit 1) when a page logs a console error or warning.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINDINGS = os.path.join(ROOT, "samples", "findings")
SIZE = {"width": 1280, "height": 800}


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMTRACE_")}
    env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", PYTHONUNBUFFERED="1")
    return env


def _cmd(out: str, sample: str, *args) -> list[str]:
    script = sample if sample.endswith(".py") else os.path.join(FINDINGS, f"{sample}.py")
    return [sys.executable, "-m", "commtrace", "run", "-o", out, "--flush-interval", "0.5", "--",
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            script, *map(str, args)]


def traced(base: str, sample: str, *args, name: str | None = None) -> str:
    out = os.path.join(base, name or sample)
    if not os.path.exists(out):
        subprocess.run(_cmd(out, sample, *args), env=_env(), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=300)
    return out


def _settled(page):
    """No callback in flight, every plot drawn, two frames painted."""
    page.wait_for_function("() => !document.querySelector('._dash-loading') && "
                           "Array.from(document.querySelectorAll('.js-plotly-plot')).every(g => g._fullLayout)",
                           timeout=30_000)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    page.wait_for_timeout(500)


def _tab(page, label, selector):
    for _ in range(3):
        page.click(f"#tabs >> text={label}")
        try:
            page.wait_for_selector(selector, state="visible", timeout=20_000)
            break
        except Exception:  # noqa: BLE001 - a click while the tabs re-rendered: again
            continue
    page.wait_for_selector(selector, state="visible", timeout=20_000)
    _settled(page)


def concepts(browser, base: str, out_dir: str) -> list[str]:
    """docs/concepts.md: a DDP run's timeline with a collective selected (its first finding's
    evidence), its Overlap and Stalls views."""
    path = traced(base, os.path.join(ROOT, "samples", "ddp_mlp.py"), "--steps", 30, "--straggler-ms", 15, name="ddp")
    s = Shot(browser, path)
    _tab(s.page, "Findings", "#findings .ag-row")
    s.page.locator("#findings .ag-row").first.click()
    s.page.wait_for_function("() => { const g = document.querySelector('#timeline .js-plotly-plot'); "
                             "return g && g.offsetParent !== null && g.data.some(t => t.name === 'selected'); }",
                             timeout=30_000)
    _settled(s.page)
    s.page.screenshot(path=os.path.join(out_dir, "dashboard-ddp-selected.png"))
    _tab(s.page, "Overlap", "#overlap-rank .main-svg .xtick")
    s.page.screenshot(path=os.path.join(out_dir, "dashboard-overlap.png"))
    _tab(s.page, "Stalls", "#stalls-heatmap .main-svg .xtick")
    s.page.screenshot(path=os.path.join(out_dir, "dashboard-stalls.png"))
    return s.close()


class Shot:
    """A dashboard served from this process and a 1280 x 800 page on it."""

    def __init__(self, browser, path, compare=None):
        import commtrace
        from commtrace.dashboard.app import build
        from commtrace.dashboard.serve import Server
        self.runs = [commtrace.load(path)] + ([commtrace.load(compare)] if compare else [])
        self.app = build(self.runs[0], compare=self.runs[1] if compare else None)
        self.srv = Server(self.app)
        self.page = browser.new_page(viewport=SIZE)
        self.console: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}")
                     if m.type in ("error", "warning") else None)
        self.page.goto(self.srv.url)
        self.page.wait_for_selector("#overview-body .mantine-Paper-root", timeout=60_000)

    def close(self):
        self.page.close()
        self.srv.stop()
        for r in self.runs:
            r.close()
        return self.console


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img"))
    ap.add_argument("--keep", default=None, help="keep (and reuse) the traced samples in this directory")
    ap.add_argument("--only", choices=("dashboard", "concepts"), default=None,
                    help="only the screenshots of docs/dashboard.md or of docs/concepts.md")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    base = args.keep or tempfile.mkdtemp(prefix="ct-dash-shots-")
    os.makedirs(base, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        names = []
        if args.only != "dashboard":
            problems += concepts(browser, base, args.out)
            names += ["ddp-selected", "overlap", "stalls"]
        if args.only == "concepts":
            browser.close()
            return _done(args.out, names, problems)
        names += ["overview", "timeline", "live", "compare"]
        # overview and timeline: the straggler sample, its card's "show on timeline"
        s = Shot(browser, traced(base, "straggler"))
        s.page.wait_for_selector("#ov-health .main-svg .bars")
        s.page.wait_for_timeout(800)
        s.page.screenshot(path=os.path.join(args.out, "dashboard-overview.png"))
        s.page.click(".finding-straggler .show-on-timeline")
        s.page.wait_for_function("() => { const g = document.querySelector('#timeline .js-plotly-plot'); "
                                 "return g && g.data.some(t => t.name === 'selected'); }", timeout=30_000)
        s.page.wait_for_timeout(800)
        s.page.screenshot(path=os.path.join(args.out, "dashboard-timeline.png"))
        problems += s.close()
        # compare: good vs bad overlap
        s = Shot(browser, traced(base, "good_overlap"), traced(base, "bad_overlap"))
        s.page.click("#tabs >> text=Compare")
        s.page.wait_for_selector("#cmp-totals .ag-row")
        s.page.wait_for_timeout(800)
        s.page.screenshot(path=os.path.join(args.out, "dashboard-compare.png"))
        problems += s.close()
        # live: the hang sample while it hangs
        out = os.path.join(base, f"hang-{int(time.time())}")
        job = subprocess.Popen(_cmd(out, "hang"), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            t0 = time.time()
            while time.time() - t0 < 180:
                snaps = glob.glob(os.path.join(out, "**", "rank=0", "_inflight.json"), recursive=True)
                try:
                    if snaps and any(o.get("seq") == 9 for o in json.load(open(snaps[0]))["ops"]):
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.3)
            s = Shot(browser, out)
            s.page.wait_for_selector("#hang-banner", timeout=30_000)
            s.page.wait_for_timeout(2500)  # one live refresh
            s.page.screenshot(path=os.path.join(args.out, "dashboard-live.png"))
            problems += s.close()
        finally:
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                job.kill()
        browser.close()
    return _done(args.out, names, problems)


def _done(out_dir, names, problems) -> int:
    for name in names:
        print(os.path.join(out_dir, f"dashboard-{name}.png"))
    if problems:
        print("console errors or warnings:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
