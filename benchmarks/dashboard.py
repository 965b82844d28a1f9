"""Dashboard benchmark: a real headless Chromium (Playwright, Debian's /usr/bin/chromium) on the
dashboard of a synthetic run (default 64 ranks x 20,000 ops, with a straggler, a late sender and
host hazards planted).

Measures: server start (load + cached derived tables); the first meaningful paint (from the
navigation until Chromium painted the overview's numbers, finding cards and health strip: the
static overview of the first HTTP response, dashboard/prerender.py, timed by Element Timing; for
a dashboard without it, the live overview); the time to interactive (until the live Dash page is
mounted with the overview's numbers, cards and Plotly health figure shown, and a click answered:
sorting the health table, a clientside callback); each interaction (box-zoom out->in, select an
op, reset, range slider, switch view, zoom via a finding) from its input (the click; for a drag, the mouse release, as the
browser's Interaction to Next Paint counts) until the browser has drawn its result, and the
JSON payload of every callback response (the figures sent to the browser). Each interaction's
time is split into `server` (the app's callback handlers, timed in the server), `fetch` (the
browser's callback requests started since the input, first start to last end: server plus
transfer) and `browser` (the rest: Plotly and React drawing, the box-zoom redraw).
The browser part runs `--rounds` times (default 3), each on a fresh page of the same server; each
figure is the median over the rounds, and the slowest single interaction of all rounds is
printed too (one round on a loaded 2-core machine varied 2x between runs).

    python benchmarks/dashboard.py [--ranks 64] [--ops 20000] [--keep DIR] [--json out.json]
    # where an interaction's browser time goes (DevTools CPU profile, self time per function)
    python benchmarks/dashboard.py --keep /tmp/run --profile "zoom to 0.2"
    # old vs new side by side, in one run: the previous commit's own benchmark script on its
    # code, then this one, on the same synthetic run, and a table of both
    git worktree add /tmp/base <commit>
    python benchmarks/dashboard.py --keep /tmp/run --against /tmp/base

Also measured: the live refresh (the tick callback's server time, with an `_inflight.json`
snapshot per rank, 63 ranks pending in one all_reduce) and the largest response.
Targets (issue 16): first meaningful paint <= 2 s, every interaction <= 0.5 s at the median and
<= 1 s at the maximum, live refresh <= 0.3 s of server time, largest response <= 2 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
GD = "document.querySelector('#timeline .js-plotly-plot')"
#: Before the page's own scripts: when Chromium paints each element of the static overview marked
#: `elementtiming="ct-overview"` (Element Timing, page clock), and how many of them are in view.
PAINT_JS = """
window.__ctPaint = [];
new PerformanceObserver(l => l.getEntries().forEach(e => {
    if (e.identifier === 'ct-overview') { window.__ctPaint.push(e.renderTime || e.loadTime); }
})).observe({type: 'element', buffered: true});
document.addEventListener('DOMContentLoaded', () => {  // those in view (below it nothing is painted)
    window.__ctExpected = Array.from(document.querySelectorAll('[elementtiming="ct-overview"]'))
        .filter(e => e.getBoundingClientRect().top < window.innerHeight).length;
});
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--keep", default=None, help="reuse / keep the synthetic run in this directory")
    ap.add_argument("--json", default=None, help="write the figures as JSON here")
    ap.add_argument("--profile", default=None, metavar="INTERACTION",
                    help="profile the browser's JavaScript during this interaction (e.g. 'zoom to 0.2%%') with "
                    "the DevTools profiler and print the functions with the most self time")
    ap.add_argument("--rounds", type=int, default=3,
                    help="browser rounds (a fresh page each, same server); each figure is the median over them")
    ap.add_argument("--code", default=None, help="import commtrace and the dashboard from this checkout "
                    "(e.g. a git worktree of an older commit) instead of this one")
    ap.add_argument("--against", default=None, metavar="CHECKOUT",
                    help="first run CHECKOUT's own benchmarks/dashboard.py on its code (same run), then this one, "
                    "and print both side by side")
    args = ap.parse_args()
    if args.against:
        return _against(args)
    if args.code:
        sys.path.insert(0, os.path.abspath(args.code))
        _dashboard_from(os.path.abspath(args.code))

    import commtrace
    from commtrace.dashboard.app import build
    from commtrace.dashboard.serve import Server
    from playwright.sync_api import sync_playwright

    path = args.keep or os.path.join(tempfile.mkdtemp(prefix="ct-dash-bench-"), "run")
    if not os.path.exists(path):
        subprocess.run([sys.executable, "-m", "commtrace", "synth", path, "--ranks", str(args.ranks), "--ops",
                        str(args.ops), "--straggler", "5:2ms", "--late-send", "3:1ms", "--hazards"],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    res: dict = {"ranks": args.ranks, "ops_per_rank": args.ops, "cpus": os.cpu_count(),
                 "code": os.path.dirname(os.path.dirname(os.path.abspath(commtrace.__file__))),
                 "load_average": os.getloadavg()}
    t = time.perf_counter()
    run = commtrace.load(path)
    res["load_s"] = time.perf_counter() - t
    app = build(run)
    res["server_start_s"] = time.perf_counter() - t
    handled: list[float] = []  # seconds in each callback request, in the server

    @app.server.before_request
    def _t0():
        import flask
        flask.g.t0 = time.perf_counter()

    @app.server.after_request
    def _t1(resp):
        import flask
        if "_dash-update-component" in flask.request.path:
            handled.append(time.perf_counter() - flask.g.t0)
        return resp

    sizes: list[tuple[str, int]] = []
    with Server(app) as srv, sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        rounds: list[dict] = []
        errors: list[str] = []
        for rnd in range(args.rounds):
            h0 = len(handled)  # the server's callback times of this round start here
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            if os.environ.get("BENCH_DEBUG"):
                page.on("request", _print_callback_request)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            label = ["first page"]
            marks: list[tuple[str, int]] = []  # (interaction, resource entries before it)

            def entries():
                return page.evaluate("() => performance.getEntriesByType('resource').map(e => "
                                     "[e.name, e.encodedBodySize, e.startTime, e.responseEnd, e.requestStart, e.responseStart])")

            split = {}

            def timed(name, t, n_ent, n_handled, t0=0.0):
                """Total, fetch (callback requests started since page time t0, first start to last end),
                server and browser time."""
                total = time.perf_counter() - t
                ups = [e for e in entries()[n_ent:] if "_dash-update-component" in e[0] and e[2] >= t0]
                if os.environ.get("BENCH_DEBUG"):
                    print(name, [[round(x) for x in e[2:]] for e in ups], handled[n_handled:], file=sys.stderr)
                fetch = (max(e[3] for e in ups) - min(e[2] for e in ups)) / 1e3 if ups else 0.0
                split[name] = {"total": round(total, 3), "requests": len(ups), "fetch": round(fetch, 3),
                               "server": round(sum(handled[n_handled:]), 3), "browser": round(total - fetch, 3)}
                return total

            def drawn(cond: str, timeout=60_000):
                try:
                    page.wait_for_function(f"() => {{ const g = {GD}; return g && g.layout && g.layout.meta && ({cond}); }}",
                                           timeout=timeout)
                except Exception:
                    print("timed out waiting for", cond, page.evaluate(
                        f"() => [{GD}.layout.xaxis.range, {GD}.layout.meta.mode, document.querySelector('#mode-info').innerText]"),
                        file=sys.stderr)
                    raise

            cdp = _start_profile(page) if args.profile and "first page".startswith(args.profile) else None
            page.add_init_script(PAINT_JS)
            t, t_epoch = time.perf_counter(), time.time()
            page.goto(srv.url, wait_until="commit")
            # the first meaningful paint: the overview's numbers, cards and health strip painted.
            # The static overview of the first response (dashboard/prerender.py): when Chromium
            # painted the last of its marked elements (Element Timing), on the page's clock.
            page.wait_for_function("() => window.__ctExpected !== undefined && "
                                   "window.__ctPaint.length >= window.__ctExpected", timeout=60_000, polling=20)
            pre = page.evaluate("() => [window.__ctExpected, Math.max(0, ...window.__ctPaint), performance.timeOrigin]")
            # the live page (React) mounted with the same: the overview's numbers, cards and its
            # Plotly health figure drawn and shown (the static one removed)
            page.wait_for_function("() => { const c = document.querySelector('#overview-body #ov-compute'); "
                                   "return !document.getElementById('ct-pre') && c && c.innerText.includes('%') && "
                                   "document.querySelector('#overview-body .finding-card') && "
                                   "document.querySelector('#ov-health .main-svg .bars'); }", timeout=60_000)
            mounted = time.perf_counter() - t
            # ... and a click works: sort the health table by rank (its order already), a
            # clientside callback of the Dash app, until its header shows the sort
            page.click("#ov-health-table th.col-rank button")
            page.wait_for_function("() => document.querySelector('#ov-health-table th.col-rank').innerText.includes('▲')",
                                   timeout=60_000)
            res["interactive_s"] = timed("time to interactive", t, 0, h0)
            res["mounted_s"] = mounted
            # no static overview (an older dashboard): the first paint is the live page's
            res["first_page_s"] = ((pre[2] + pre[1]) / 1e3 - t_epoch) if pre[0] else mounted
            fmp = round(res["first_page_s"], 3)  # no callback request: the first response's HTML
            split["first page"] = {"total": fmp, "requests": 0, "fetch": 0.0, "server": 0.0, "browser": fmp}
            if cdp:
                _print_profile(cdp.send("Profiler.stop")["profile"], "first page")
            page.wait_for_load_state("networkidle")
            inter = {}

            def step(name, action, cond, settle=True):
                label[0] = name
                n_ent, n_h = len(entries()), len(handled)
                marks.append((name, n_ent))
                cdp = _start_profile(page) if args.profile and name.startswith(args.profile) else None
                t0 = page.evaluate("performance.now()")
                t = time.perf_counter()
                # an action may say when the user's part ended (a drag: the mouse release), in host and page time
                t, t0 = action() or (t, t0)
                drawn(cond)
                inter[name] = timed(name, t, n_ent, n_h, t0)
                if cdp:
                    _print_profile(cdp.send("Profiler.stop")["profile"], name)
                if settle:
                    page.wait_for_load_state("networkidle")

            def drag(a, bb):
                """Box-zoom on the plot with the mouse, as a user does; returns when the mouse was released
                (the dragging before is the user's time, a few CDP round trips here)."""
                x0, x1, y = page.evaluate(f"""() => {{ const g = {GD}, fl = g._fullLayout, r = g.getBoundingClientRect();
                    return [r.left + fl._size.l + fl.xaxis.l2p({a}), r.left + fl._size.l + fl.xaxis.l2p({bb}),
                            r.top + fl._size.t + fl._size.h / 2]; }}""")
                page.mouse.move(x0, y)
                page.mouse.down()
                page.mouse.move((x0 + x1) / 2, y, steps=4)
                page.mouse.move(x1, y, steps=4)
                return release()

            def release():
                """Release the mouse: the input that asks for the change. Returns (host, page) time."""
                t0 = page.evaluate("performance.now()")
                t = time.perf_counter()
                page.mouse.up()
                return t, t0

            d = app._commtrace_data  # the RunData the app serves
            dur = d.duration_s
            step("view Timeline (first drawing)", lambda: page.click("#tabs >> text=Timeline"),
                 "g.offsetParent !== null && g.layout.meta.mode === 'bins'")
            # zoom with the range selector: 10 % of the run (still bins), then 0.2 % (exact ops)
            for name, frac in (("zoom to 10% (bins)", 0.1), ("zoom to 0.2% (exact ops)", 0.002)):
                a, bb = dur * 0.4, dur * (0.4 + frac)
                step(name, lambda a=a, bb=bb: drag(a, bb),
                    f"Math.abs(g.layout.xaxis.range[1] - {bb}) < {(bb - a) * 0.05 + dur * 2e-3} && g.layout.meta.mode === "
                    f"'{'bins' if frac > 0.01 else 'exact'}' && !document.querySelector('#mode-info').innerText.includes('0.0000–')")
            # select an op: the click handler's callback (clickData) through the real Dash round trip
            i, k, cd = page.evaluate(f"() => {{ const g = {GD}, i = g._fullData.findIndex(t => t.name === 'ops (hover / click)'); "
                                     "const t = g._fullData[i]; for (let k = 0; k < t.x.length; k++) "
                                     "if (!/<b>(send|recv)/.test(t.text[k])) return [i, k, t.customdata[k]]; }")
            step("select an op", lambda: page.evaluate(
                f"() => {GD}.emit('plotly_click', {{points: [{{curveNumber: {i}, pointNumber: {k}, customdata: {json.dumps(cd)}}}]}})"),
                f"g.data.some(t => t.name === 'selected pg {d.o['pg_values'][cd[0]]} seq {cd[1]}')")
            step("reset zoom (full run, bins)", lambda: page.click("#reset"), "g.layout.meta.mode === 'bins' && g.layout.xaxis.range[0] === 0")

            def slide(frac):
                """Drag the range slider's left handle to `frac` of the run, as a user does; returns when
                the mouse was released (the slider's value changes on mouse-up)."""
                th = page.locator("#range .dash-slider-thumb-1").bounding_box()
                tr = page.locator("#range .dash-slider-track").bounding_box()
                page.mouse.move(th["x"] + th["width"] / 2, th["y"] + th["height"] / 2)
                page.mouse.down()
                x1 = tr["x"] + tr["width"] * frac
                page.mouse.move(x1, th["y"] + th["height"] / 2, steps=4)
                return release()

            step("range slider: left handle to 50% (bins)", lambda: slide(0.5),
                 f"g.layout.meta.mode === 'bins' && Math.abs(g.layout.xaxis.range[0] - {dur / 2}) < {dur * 0.03} "
                 f"&& g.layout.xaxis.range[1] > {dur * 0.99}")
            step("reset zoom again", lambda: page.click("#reset"), "g.layout.xaxis.range[0] === 0")
            for tab, sel in (("Overlap", "#overlap-step .main-svg"), ("Stalls", "#stalls-heatmap .main-svg"),
                             ("Bandwidth", "#busbw .main-svg"), ("Run", "#facts-job tbody tr"), ("Overview", "#view-overview .finding-card"),
                             ("Findings", "#findings .ag-row")):
                label[0] = f"view {tab}"
                n_ent, n_h = len(entries()), len(handled)
                marks.append((label[0], n_ent))
                cdp = _start_profile(page) if args.profile and label[0].startswith(args.profile) else None
                t = time.perf_counter()
                page.click(f"#tabs >> text={tab}")
                page.wait_for_selector(sel, timeout=60_000)
                inter[f"view {tab}"] = timed(label[0], t, n_ent, n_h)
                if cdp:
                    _print_profile(cdp.send("Profiler.stop")["profile"], label[0])
                page.wait_for_load_state("networkidle")
            step("click a finding (zoom to evidence)",
                 lambda: page.locator('#findings .ag-row[row-index="0"] [col-id="kind"]').first.click(),
                 f"g.offsetParent !== null && document.querySelector('#view-timeline').getBoundingClientRect().height > 100 && g.layout.xaxis.range[1] - g.layout.xaxis.range[0] < {dur} / 2")
            # the first card's "show on timeline", from the whole run (reset first, untimed)
            page.click("#reset")
            drawn("g.layout.xaxis.range[0] === 0 && g.layout.meta.mode === 'bins'")
            page.click("#tabs >> text=Overview")
            page.wait_for_selector("#view-overview .show-on-timeline")
            page.wait_for_load_state("networkidle")
            ev = d.overview["cards"][0]["evidence"]
            step("overview card: show on timeline", lambda: page.click("#view-overview .show-on-timeline"),
                 "g.offsetParent !== null && g.layout.meta.mode === 'exact' && "
                 + (f"g.data.some(t => t.name === 'selected pg {ev['pg']} seq {ev['seq']}')" if ev["seq"] is not None else "true"))
            res["interactions_s"] = inter
            res["split_s"] = split
            ent = entries()
            bounds = [("first page", 0)] + marks + [("end", len(ent))]
            for (name, lo), (_, hi) in zip(bounds[:-1], bounds[1:]):
                for url, n, *_ in ent[lo:hi]:
                    if "_dash-update-component" in url or "_dash-layout" in url:
                        sizes.append((name, int(n)))
            res["console_errors"] = errors
            rounds.append({"first_page_s": res.pop("first_page_s"), "interactive_s": res.pop("interactive_s"),
                           "mounted_s": res.pop("mounted_s"), "interactions_s": res.pop("interactions_s"),
                           "split_s": res.pop("split_s")})
            page.close()
        b.close()
    # per interaction, the median over the rounds (each round a fresh page on the same server)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    res["rounds"] = rounds
    res["first_page_s"] = med([r["first_page_s"] for r in rounds])
    res["interactive_s"] = med([r["interactive_s"] for r in rounds])
    res["mounted_s"] = med([r["mounted_s"] for r in rounds])
    names = list(rounds[0]["interactions_s"])
    res["interactions_s"] = inter = {k: med([r["interactions_s"][k] for r in rounds]) for k in names}
    split = {k: {f: med([r["split_s"][k][f] for r in rounds]) for f in ("total", "fetch", "server", "browser")}
             for k in ["first page", "time to interactive"] + names}
    res["split_s"] = split
    res["interactions_worst_s"] = max(v for r in rounds for v in r["interactions_s"].values())
    per: dict[str, int] = {}
    for name, n in sizes:
        per[name] = max(per.get(name, 0), n)
    res["max_response_bytes"] = per
    res["max_figure_bytes"] = max(per.values()) if per else 0
    res["live_refresh_server_s"] = _live_refresh(app, path, d)
    run.close()
    res["load_average_after"] = os.getloadavg()
    print(json.dumps(res, indent=2))
    print(f"{'interaction':40s} {'total':>6s} {'fetch':>6s} {'server':>6s} {'browser':>7s}")
    for name, v in split.items():
        print(f"{name:40s} {v['total']:6.2f} {v['fetch']:6.2f} {v['server']:6.2f} {v['browser']:7.2f}")
    vals = sorted(inter.values())
    res["interactions_median_s"] = vals[len(vals) // 2] if vals else 0.0
    res["interactions_max_s"] = vals[-1] if vals else 0.0
    for k, r in enumerate(rounds):
        v = sorted(r["interactions_s"].values())
        print(f"round {k + 1}: first meaningful paint {r['first_page_s']:.2f} s, time to interactive "
              f"{r['interactive_s']:.2f} s; interactions median {v[len(v) // 2]:.2f} s, max {v[-1]:.2f} s")
    print(f"medians over {len(rounds)} round(s): first meaningful paint {res['first_page_s']:.2f} s, time to interactive "
          f"{res['interactive_s']:.2f} s (live page mounted {res['mounted_s']:.2f} s); "
          f"interactions median {res['interactions_median_s']:.2f} s, "
          f"max {res['interactions_max_s']:.2f} s; live refresh {res['live_refresh_server_s']['median']:.3f} s median "
          f"(max {res['live_refresh_server_s']['max']:.3f} s) server time; largest response {res['max_figure_bytes'] / 1e6:.2f} MB"
          f"; slowest single interaction of all rounds {res['interactions_worst_s']:.2f} s")
    ok = (res["first_page_s"] <= 2 and res["interactions_median_s"] <= 0.5 and res["interactions_max_s"] <= 1
          and res["live_refresh_server_s"]["median"] <= 0.3 and res["max_figure_bytes"] <= 2e6 and not errors)
    print("targets (paint <= 2 s, interactions <= 0.5 s median / 1 s max, live refresh <= 0.3 s, responses <= 2 MB):",
          "met" if ok else "NOT met")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def _dashboard_from(code: str) -> None:
    """Import `commtrace.dashboard` from CODE's `dashboard/` (the folder installs as that package:
    without this an editable install's finder would serve this checkout's dashboard to CODE's
    commtrace)."""
    import importlib.util
    init = os.path.join(code, "dashboard", "__init__.py")
    if not os.path.isfile(init):
        return
    import commtrace
    spec = importlib.util.spec_from_file_location("commtrace.dashboard", init,
                                                  submodule_search_locations=[os.path.dirname(init)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["commtrace.dashboard"] = mod
    spec.loader.exec_module(mod)
    commtrace.dashboard = mod


def _live_refresh(app, path, d, n=10) -> dict:
    """Server time of the live refresh (the tick callback, undecorated): snapshots written for
    every rank (63 pending in one all_reduce, as a hang looks), then `n` ticks; the snapshots
    are removed again. None for a dashboard without live mode (an older checkout)."""
    tick = getattr(app, "_commtrace_tick", None)
    if tick is None:
        return {"median": float("nan"), "max": float("nan"), "n": 0}
    now = time.time_ns()
    written = []
    for r in d.ranks:
        fp = os.path.join(path, f"rank={r}", "_inflight.json")
        ops = [] if r == d.ranks[-1] else [{"kind": "op", "op": "all_reduce", "pg": "0", "seq": 10**6,
                                             "t_enqueue_ns": now - 5 * 10**9, "site": "train.py:1"}]
        with open(fp, "w") as f:
            json.dump({"rank": r, "t_ns": now, "final": False, "ops": ops}, f)
        written.append(fp)
    try:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            tick(1, 0, {"a": 0.0, "b": d.duration_s}, None)
            times.append(time.perf_counter() - t)
    finally:
        for fp in written:
            os.unlink(fp)
    times.sort()
    return {"median": round(times[len(times) // 2], 4), "max": round(times[-1], 4), "n": n}


def _against(args) -> int:
    """The previous checkout's benchmark, then this one, on the same run; both side by side."""
    path = args.keep or os.path.join(tempfile.mkdtemp(prefix="ct-dash-bench-"), "run")
    if not os.path.exists(path):
        subprocess.run([sys.executable, "-m", "commtrace", "synth", path, "--ranks", str(args.ranks), "--ops",
                        str(args.ops), "--straggler", "5:2ms", "--late-send", "3:1ms", "--hazards"],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    out = {}
    for name, script, code in (("previous", os.path.join(args.against, "benchmarks", "dashboard.py"), args.against),
                               ("this", os.path.abspath(__file__), None)):
        js = os.path.join(tempfile.mkdtemp(prefix="ct-dash-bench-"), f"{name}.json")
        cmd = [sys.executable, script, "--keep", path, "--json", js] + (["--code", code] if code else [])
        print(f"--- {name}: {' '.join(cmd)}  (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
        subprocess.run(cmd, cwd=code or ROOT, check=True, stdout=subprocess.DEVNULL)
        with open(js) as f:
            out[name] = json.load(f)
    a, b = out["previous"], out["this"]
    print(f"{'figure':44s} {'previous':>9s} {'this':>9s}")
    rows = [("server start (s)", "server_start_s"), ("first meaningful paint (s)", "first_page_s"),
            ("time to interactive (s)", "interactive_s"), ("live page mounted (s)", "mounted_s"),
            ("interactions, median (s)", "interactions_median_s"), ("interactions, max (s)", "interactions_max_s"),
            ("largest response (MB)", "max_figure_bytes")]
    for label, k in rows:
        f = 1e-6 if k == "max_figure_bytes" else 1
        cell = lambda r: "—" if r.get(k) is None else f"{r[k] * f:.2f}"  # noqa: E731
        print(f"{label:44s} {cell(a):>9s} {cell(b):>9s}")
    for k in sorted(set(a["interactions_s"]) | set(b["interactions_s"]), key=lambda k: (k not in b["interactions_s"], k)):
        va, vb = a["interactions_s"].get(k), b["interactions_s"].get(k)
        print(f"{k[:44]:44s} {'—' if va is None else f'{va:.2f}':>9s} {'—' if vb is None else f'{vb:.2f}':>9s}")
    lr = b.get("live_refresh_server_s") or {}
    print(f"{'live refresh, server (s, median / max)':44s} {'—':>9s} {lr.get('median', float('nan')):.3f}/{lr.get('max', float('nan')):.3f}")
    print(f"load average: previous {a['load_average']} -> {a['load_average_after']}; this {b['load_average']} -> "
          f"{b['load_average_after']}; cpus {b['cpus']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


def _start_profile(page):
    """A DevTools CPU profile of the page's JavaScript, sampling every 0.2 ms, started."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("Profiler.enable")
    cdp.send("Profiler.setSamplingInterval", {"interval": 200})
    cdp.send("Profiler.start")
    return cdp


def _print_callback_request(r) -> None:
    """BENCH_DEBUG: which input each callback request answers (and the zoom it carries)."""
    if "_dash-update-component" in r.url:
        body = json.loads(r.post_data or "{}")
        ins = [i for i in body.get("inputs", []) if isinstance(i, dict)]  # a pattern input is a list
        print("req", body.get("changedPropIds"), [i.get("value") for i in ins if i.get("id") == "zoom"],
              file=sys.stderr)


def _print_profile(profile: dict, name: str, top: int = 25) -> None:
    """Self time per function (and per script) of a DevTools CPU profile, most first, to stderr."""
    nodes = {n["id"]: n for n in profile["nodes"]}
    dt = profile.get("timeDeltas", [])
    self_us: dict[tuple, float] = {}
    for sid, d in zip(profile.get("samples", []), dt[1:] + [0]):
        cf = nodes[sid]["callFrame"]
        key = (cf["functionName"] or "(anonymous)", os.path.basename(cf["url"]) or "", f"{cf['lineNumber']}:{cf['columnNumber']}")
        self_us[key] = self_us.get(key, 0.0) + d
    total = sum(self_us.values())
    print(f"--- JavaScript self time during '{name}': {total / 1e3:.0f} ms sampled", file=sys.stderr)
    for (fn, url, line), us in sorted(self_us.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{us / 1e3:8.1f} ms  {fn} ({url}:{line})", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
