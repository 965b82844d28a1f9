"""Dashboard benchmark: a real headless Chromium (Playwright, Debian's /usr/bin/chromium) on the
dashboard of a synthetic run (default 64 ranks x 20,000 ops, with a straggler, a late sender and
host hazards planted).

Measures: server start (load + cached derived tables), first page (navigation until the timeline
figure is drawn), each interaction (box-zoom out->in, select an op, reset, range slider, switch
view, zoom via a finding) from its input (the click; for a drag, the mouse release, as the
browser's Interaction to Next Paint counts) until the browser has drawn its result, and the
JSON payload of every callback response (the figures sent to the browser). Each interaction's
time is split into `server` (the app's callback handlers, timed in the server), `fetch` (the
browser's callback requests started since the input, first start to last end: server plus
transfer) and `browser` (the rest: Plotly and React drawing, the box-zoom redraw).

    python benchmarks/dashboard.py [--ranks 64] [--ops 20000] [--keep DIR] [--json out.json]
    # where an interaction's browser time goes (DevTools CPU profile, self time per function)
    python benchmarks/dashboard.py --keep /tmp/run --profile "zoom to 0.2"
    # old vs new side by side: the same benchmark on another checkout's code
    git worktree add /tmp/base <commit>
    python benchmarks/dashboard.py --keep /tmp/run --code /tmp/base
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--keep", default=None, help="reuse / keep the synthetic run in this directory")
    ap.add_argument("--json", default=None, help="write the figures as JSON here")
    ap.add_argument("--profile", default=None, metavar="INTERACTION",
                    help="profile the browser's JavaScript during this interaction (e.g. 'zoom to 0.2%%') with "
                    "the DevTools profiler and print the functions with the most self time")
    ap.add_argument("--code", default=None, help="import commtrace and the dashboard from this checkout "
                    "(e.g. a git worktree of an older commit) instead of this one")
    args = ap.parse_args()
    if args.code:
        sys.path.insert(0, os.path.abspath(args.code))

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
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
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
        t = time.perf_counter()
        page.goto(srv.url)
        drawn("true")
        res["first_page_s"] = timed("first page", t, 0, 0)
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
                         ("Bandwidth", "#busbw .main-svg"), ("Findings", "#findings td")):
            label[0] = f"view {tab}"
            n_ent, n_h = len(entries()), len(handled)
            marks.append((label[0], n_ent))
            t = time.perf_counter()
            page.click(f"#tabs >> text={tab}")
            page.wait_for_selector(sel, timeout=60_000)
            inter[f"view {tab}"] = timed(label[0], t, n_ent, n_h)
            page.wait_for_load_state("networkidle")
        step("click a finding (zoom to evidence)",
             lambda: page.locator("#findings tbody tr").nth(1).locator("td").first.click(),
             f"g.offsetParent !== null && document.querySelector('#view-timeline').getBoundingClientRect().height > 100 && g.layout.xaxis.range[1] - g.layout.xaxis.range[0] < {dur} / 2")
        res["interactions_s"] = inter
        res["split_s"] = split
        ent = entries()
        bounds = [("first page", 0)] + marks + [("end", len(ent))]
        for (name, lo), (_, hi) in zip(bounds[:-1], bounds[1:]):
            for url, n, *_ in ent[lo:hi]:
                if "_dash-update-component" in url or "_dash-layout" in url:
                    sizes.append((name, int(n)))
        res["console_errors"] = errors
        b.close()
    per: dict[str, int] = {}
    for name, n in sizes:
        per[name] = max(per.get(name, 0), n)
    res["max_response_bytes"] = per
    res["max_figure_bytes"] = max(per.values()) if per else 0
    run.close()
    res["load_average_after"] = os.getloadavg()
    print(json.dumps(res, indent=2))
    print(f"{'interaction':40s} {'total':>6s} {'fetch':>6s} {'server':>6s} {'browser':>7s}")
    for name, v in split.items():
        print(f"{name:40s} {v['total']:6.2f} {v['fetch']:6.2f} {v['server']:6.2f} {v['browser']:7.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    ok = (res["first_page_s"] <= 5 and all(v <= 1 for v in inter.values()) and res["max_figure_bytes"] <= 5e6
          and not errors)
    print("targets (first page <= 5 s, interactions <= 1 s, responses <= 5 MB):", "met" if ok else "NOT met")
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
        print("req", body.get("changedPropIds"), [i.get("value") for i in body.get("inputs", [])
                                                  if i.get("property") == "relayoutData"], file=sys.stderr)


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
