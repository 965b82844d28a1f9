"""Unit tests of the dashboard's cache, figure builders and CLI, on synthetic runs with planted
anomalies (`commtrace synth`), asserting values against the analysis API."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

import commtrace
from conftest import ROOT, clean_env

RANKS = 4


def synth(out, *args):
    p = subprocess.run([sys.executable, "-m", "commtrace", "synth", str(out), *map(str, args), "-f"],
                       env=clean_env(), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return str(out)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from commtrace.dashboard.data import RunData
    path = synth(tmp_path_factory.mktemp("dash") / "run", "--ranks", RANKS, "--ops", 600,
                 "--straggler", "1:2ms", "--late-send", "2:1ms", "--hazards")
    run = commtrace.load(path)
    yield RunData(run, nbins=100)
    run.close()


def test_cache_holds_every_op(data):
    ops = data.run.ops()
    assert len(data.o["rank"]) == ops.num_rows == RANKS * 600
    assert np.all(np.diff(data.o["t_enqueue"]) >= 0)
    assert len(data.sync["rank"]) >= 1 and len(data.hazards["rank"]) >= 1


def test_zoomed_out_timeline_is_bins_whose_sums_equal_the_analysis(data):
    from commtrace.dashboard import figures as F
    assert F.timeline_figure(data).layout.meta["mode"] == "exact"  # 2,400 ops: under the exact budget
    fig = F.timeline_figure(data, exact_max=500)
    assert fig.layout.meta["mode"] == "bins"
    # every sub-row labelled (few ranks): host-blocked, in-flight, wait / sync per rank
    assert list(fig.layout.yaxis.ticktext) == [x for r in range(RANKS) for x in
                                               (f"rank {r} · host-blocked", "in-flight", "wait / sync")]
    assert list(fig.layout.yaxis.tickvals) == list(range(RANKS * 3))
    hm = fig.data[0]
    z = np.asarray(hm.z, dtype=np.float64)
    assert z.shape == (RANKS * 3, 100)
    bins = data.run.timeline_bins(nbins=100)
    width = (bins["t1_ns"].to_numpy() - bins["t0_ns"].to_numpy()).reshape(RANKS, 100)
    # Row 3r+1 is in-flight: busy fraction x bin width gives back the analysis' in-flight ns,
    # and these sum to the in-flight time of every op (t_end - t_enqueue) inside the run.
    inflight = (z[1::3] * width).sum()
    assert inflight == pytest.approx(bins["inflight_ns"].to_numpy().sum(), rel=1e-5)
    ops = data.run.ops()
    assert inflight == pytest.approx(np.nansum(ops["inflight_ns"].to_numpy(zero_copy_only=False).astype(float)), rel=1e-3)
    assert (z[0::3] * width).sum() == pytest.approx(bins["blocked_ns"].to_numpy().sum(), rel=1e-5)


def polygon_rects(x, y):
    """(start, end, y0, y1) of each rectangle of a `figures._span_polygon` polygon, in its order;
    asserts that the polygon is nothing but, per sub-row, a way from the spine along the middle
    line below the sub-row, up and around each of its rectangles (left to right) and back down,
    then back to the spine."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    spine = x[0]
    at = np.flatnonzero(x == spine)
    assert len(at) % 2 == 0 and np.all(spine < np.delete(x, at))  # the spine, left of every rectangle
    rects = []
    for s0, s1 in zip(at[0::2], at[1::2]):
        assert y[s0] == y[s1] and (s1 - s0 - 1) % 6 == 0 and s1 - s0 > 1  # out and back on one line
        xs, ys = x[s0 + 1:s1].reshape(-1, 6), y[s0 + 1:s1].reshape(-1, 6)
        assert np.all(xs[:, [1, 4, 5]] == xs[:, [0]]) and np.all(xs[:, 2] == xs[:, 3])
        assert np.all(ys[:, [0, 5]] == y[s0]) and np.all(ys[:, 2] == ys[:, 1]) and np.all(ys[:, 4] == ys[:, 3])
        assert np.all(np.diff(xs[:, 0]) >= 0) and np.all(y[s0] < ys[:, 1]) and np.all(ys[:, 1] <= ys[:, 3])
        rects += list(zip(xs[:, 0], xs[:, 2], ys[:, 1], ys[:, 3]))
    start, end, y0, y1 = (np.array(v) for v in zip(*rects)) if rects else [np.empty(0)] * 4
    return start, end, y0, y1


def test_span_polygon_fills_exactly_its_rectangles():
    """The op spans of the exact view are one polygon per op name: exactly one rectangle per span
    with both ends, at its times (0.1 us) and on its sub-row, spans with a NaN end left out; the
    ways out and back enclose nothing (the polygon's area is the rectangles' area)."""
    from commtrace.dashboard.figures import _span_polygon
    a = np.array([0.0, 0.5, 3.0, 1.0, 6.0, 2.123456789])
    b = np.array([1.0, 2.0, 4.0, np.nan, 6.5, 2.25])
    row = np.array([0.0, 0.0, 3.0, 0.0, 1.0, 3.0])
    x, y = _span_polygon(a, b, row)
    start, end, y0, y1 = polygon_rects(x, y)
    # by sub-row, then start
    assert start.tolist() == [0.0, 0.5, 6.0, 2.1234568, 3.0] and end.tolist() == [1.0, 2.0, 6.5, 2.25, 4.0]
    assert np.allclose(y0, [-0.35, -0.35, 0.65, 2.65, 2.65]) and np.allclose(y1 - y0, 0.7)
    # the polygon's area (shoelace, closed back to its first point) is the rectangles' area
    xc, yc = np.r_[x, x[0]], np.r_[y, y[0]]
    shoelace = 0.5 * np.sum(xc[:-1] * yc[1:] - xc[1:] * yc[:-1])
    assert shoelace == pytest.approx(0.7 * (1.0 + 1.5 + 1.0 + 0.5 + (2.25 - 2.1234568)))
    # clipped to a window: cut at its ends, those outside it dropped
    start, end, _, _ = polygon_rects(*_span_polygon(a, b, row, clip=(0.75, 3.5)))
    assert start.tolist() == [0.75, 0.75, 2.1234568, 3.0] and end.tolist() == [1.0, 2.0, 2.25, 3.5]
    assert [len(v) for v in _span_polygon(np.array([]), np.array([]), np.array([]))] == [0, 0]


def test_zoomed_in_timeline_draws_exact_ops_with_hover(data):
    from commtrace.dashboard import figures as F
    a, b = 0.05, 0.08
    fig = F.timeline_figure(data, a, b)
    assert fig.layout.meta["mode"] == "exact"
    assert tuple(fig.layout.xaxis.range) == (a, b)
    hover = [t for t in fig.data if t.name == "ops (hover / click)"][0]
    idx = data.window(a, b)
    assert len(hover.x) == len(idx) > 0
    # every rank has ops in the window, on its own in-flight sub-row
    assert set(np.asarray(hover.y).astype(int)) == {r * 3 + 1 for r in range(RANKS)}
    assert "seq" in hover.text[0] and "bytes" in hover.text[0] and "site" in hover.text[0]
    # one filled polygon per op name (no WebGL), drawn first (under selection and markers): a
    # rectangle per finite span of each op, on its rank's host-blocked / in-flight / wait
    # sub-rows, spanning exactly that op's times
    o = data.o
    names = {str(o["op_values"][k]) for k in np.unique(o["op"][idx])}
    polys = {t.name: t for t in fig.data[:len(names)]}
    assert set(polys) == names
    assert all(t.fill == "toself" and t.mode == "none" and t.hoverinfo == "skip" for t in polys.values())
    assert not any(t.type == "scattergl" for t in fig.data)
    for k in np.unique(o["op"][idx]):
        j = idx[o["op"][idx] == k]
        t = polys[str(o["op_values"][k])]
        start, end, y0, y1 = polygon_rects(t.x, t.y)
        # the spans as drawn: cut to the window, those outside it left out
        spans = [(np.maximum(s, a), np.minimum(e, b), off) for s, e, off in
                 ((o["t_enqueue"][j], o["t_return"][j], 0), (o["t_enqueue"][j], o["t_end"][j], 1),
                  (o["t_wait"][j], o["t_wait_end"][j], 2))]
        assert len(start) == sum(int((np.isfinite(s) & np.isfinite(e) & (s <= e)).sum()) for s, e, _ in spans)
        assert np.allclose(y1 - y0, 0.7)
        got = np.array(sorted(zip(start, end, np.round(y0 + 0.35))))
        want = np.array(sorted((s, e, o["row"][i] * 3 + off) for ss, ee, off in spans
                               for i, s, e in zip(j, ss, ee) if np.isfinite(s) and np.isfinite(e) and s <= e))
        assert np.allclose(got, want, rtol=0, atol=1e-7)  # times sent rounded to 0.1 us
    # the exact view of a window never exceeds the exact budget
    assert F.timeline_figure(data, 0, data.duration_s, exact_max=10).layout.meta["mode"] == "bins"


def test_selection_highlights_every_rank_and_reports_skew(data):
    from commtrace.dashboard import figures as F
    c = data.collectives.to_pylist()
    row = max((r for r in c if r["n_ranks"] == RANKS), key=lambda r: r["arrival_skew_ns"])
    sel = {"pg": row["pg"], "seq": row["seq"]}
    fig = F.timeline_figure(data, 0, data.duration_s, sel)
    hl = [t for t in fig.data if t.name == "selected"][0]
    assert sorted(np.asarray(hl.customdata).tolist()) == list(range(RANKS))
    info = F.selection_info(data, row["pg"], row["seq"])
    assert info["arrival_skew_ns"] == row["arrival_skew_ns"] and info["last_rank"] == row["last_rank"]
    enter = {int(r): x for r, x in zip(hl.customdata, hl.x)}
    assert max(enter, key=enter.get) == row["last_rank"]
    assert (max(enter.values()) - min(enter.values())) * 1e9 == pytest.approx(row["arrival_skew_ns"], abs=2000)


def test_finding_window_contains_its_evidence(data):
    from commtrace.dashboard import figures as F
    kinds = {f.kind for f in data.findings}
    assert {"straggler", "late_sender", "use_before_wait", "sync_while_inflight"} <= kinds
    for f in data.findings:
        a, b = F.window_for_finding(data, f)
        assert 0 <= a < b <= data.duration_s
        if f.t_ns is not None:
            assert a <= (f.t_ns - data.t_min_ns) / 1e9 <= b
        if f.pg is not None and f.seq is not None:
            j = data.copies(f.pg, f.seq)
            assert len(j) and a <= data.o["t_enqueue"][j].min() and data.o["t_end"][j].max() <= b
        fig = F.timeline_figure(data, a, b)
        assert fig.layout.meta["mode"] == "exact"
        assert any(t.name == "finding" for t in fig.data)


def test_other_views_carry_the_analysis_values(data):
    from commtrace.dashboard import figures as F
    pr = data.run.per_rank()
    f1, f2 = F.overlap_figures(data)
    assert list(f1.data[0].y) == pytest.approx(pr["exposed_s"].to_pylist())
    assert list(f1.data[1].y) == pytest.approx(pr["overlapped_s"].to_pylist())
    assert np.sum(f2.data[0].y) == pytest.approx(np.nansum(data.per_step["exposed_s"].to_numpy(zero_copy_only=False).astype(float)))
    heat, strag, pairs = F.stalls_figures(data)
    assert np.asarray(heat.data[0].z).shape == (RANKS, 100)
    assert np.asarray(heat.data[0].z).sum() * 1e6 == pytest.approx(data.full_bins["wait_ns"].to_numpy().sum(), rel=1e-4)
    assert strag.data[0].x[0] == "rank 1"  # the planted straggler ranks first
    assert any(p["src"] == 2 and p["late_sender_count"] > 0 for p in pairs)  # rank 2 sends late
    rows = F.bandwidth_rows(data)
    assert sum(r["count"] for r in rows) == data.summary["count"].to_numpy().sum()
    bw = F.bandwidth_figure(data)
    assert bw.layout.xaxis.type == "log" and sum(len(t.x) for t in bw.data) > 0
    # the bandwidth table is the report's collectives_summary: time_us is its mean t_comm_s
    rep = {(r["pg"], r["op"], r["size_label"]): r for r in data.report["collectives_summary"]}
    for r in rows:
        want = rep[(r["pg"], r["op"], r["size"])]
        assert r["time_us"] == pytest.approx(want["t_comm_s"] * 1e6, abs=0.05)
        assert r["busbw_gbps"] == pytest.approx(want["busbw_gbps"], abs=5e-4)
    assert [r["kind"] for r in F.findings_rows(data)] == [f.kind for f in data.run.findings()]


def test_figures_stay_small(data):
    from commtrace.dashboard import figures as F
    for fig in (F.timeline_figure(data), F.timeline_figure(data, exact_max=10), F.timeline_figure(data, 0.05, 0.2), F.bandwidth_figure(data),
                *F.overlap_figures(data), *F.stalls_figures(data)[:2]):
        assert len(fig.to_json()) < 5_000_000


def test_figures_have_fixed_margins(data):
    """No figure lets its legend, colorbar or labels grow a margin: Plotly would draw it twice on
    its first view and on every switch between bins and exact ops (dashboard.figures.margin)."""
    from commtrace.dashboard import figures as F
    figs = {"bins": F.timeline_figure(data, exact_max=10), "exact": F.timeline_figure(data, 0.05, 0.08),
            "bandwidth": F.bandwidth_figure(data)}
    figs.update(zip(("overlap-rank", "overlap-step"), F.overlap_figures(data)))
    figs.update(zip(("stalls-heatmap", "stragglers"), F.stalls_figures(data)[:2]))
    for name, fig in figs.items():
        m = fig.layout.margin
        assert m.autoexpand is False and min(m.l, m.r, m.t, m.b) >= 20, name
    # the timeline keeps the same plot area in both modes (room for the colorbar and the legend)
    assert figs["bins"].layout.margin == figs["exact"].layout.margin
    assert figs["bins"].data[0].colorbar.xanchor == "left" and figs["bins"].layout.margin.r >= 80


def test_app_callbacks_take_no_path_input(data):
    from commtrace.dashboard.app import create_app
    app = create_app(data)
    inputs = {(i["id"], i["property"]) for cb in app.callback_map.values() for i in cb["inputs"]}
    assert inputs == {("tabs", "value"), ("timeline", "relayoutData"), ("zoom", "data"), ("range", "value"), ("reset", "n_clicks"),
                      ('{"i":["ALL"],"type":"findings-grid"}', "cellClicked"), ("timeline", "clickData"), ('{"i":["ALL"],"type":"show-finding"}', "n_clicks"),
                      ("tick", "n_intervals"), ("theme-switch", "checked"),
                      ('{"col":["ALL"],"table":["MATCH"],"type":"sort-th"}', "n_clicks")}
    states = {(i["id"], i["property"]) for cb in app.callback_map.values() for i in cb.get("state", [])}
    assert states == {("window", "data"), ("selected", "data"), ("views-drawn", "data"), ("gen", "data"),
                      ("theme-switch", "checked"), ("theme-colors", "data"),
                      ('{"table":["MATCH"],"type":"sort-rows"}', "data")}
    assert "Location" not in json.dumps(app._commtrace_page().to_plotly_json(), default=str)


def test_partial_run_shows_banner(tmp_path):
    from commtrace.dashboard.app import build
    path = synth(tmp_path / "run", "--ranks", 3, "--ops", 100)
    shutil.rmtree(tmp_path / "run" / "rank=2")
    run = commtrace.load(path)
    assert run.missing_ranks == [2]
    app = build(run, nbins=20)
    text = json.dumps(app._commtrace_page().to_plotly_json(), default=str)
    assert "Partial run: rank(s) 2 missing (2 of 3 present)" in text
    run.close()


def _cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "commtrace", "dashboard", *map(str, args)], env=clean_env(),
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_cli_errors_are_one_line(tmp_path):
    p = _cli(tmp_path / "nope", "--no-browser")
    assert p.returncode != 0 and p.stderr.strip().count("\n") == 0
    assert "no such run directory" in p.stderr and "Traceback" not in p.stderr
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.parquet").write_text("not parquet")
    p = _cli(tmp_path / "junk", "--no-browser")
    assert p.returncode != 0 and "Traceback" not in p.stderr and p.stderr.strip().count("\n") <= 1, p.stderr
    p = _cli("--help")
    assert p.returncode == 0 and p.stdout.rstrip().splitlines()[-1].strip().startswith("commtrace dashboard")
    assert "Examples:" in p.stdout


def test_loopback_detection():
    from commtrace.cli.dashboard import is_loopback
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")


def test_cli_serves_and_warns_on_public_host(tmp_path):
    import time
    import urllib.request

    from conftest import free_port
    path = synth(tmp_path / "run", "--ranks", 2, "--ops", 50)
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "commtrace", "dashboard", path, "--port", str(port), "--no-browser",
                          "--host", "0.0.0.0"], env=clean_env(), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         # as from a terminal: a pytest started as a background job of a
                         # non-interactive shell passes SIGINT on ignored
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        body = None
        for _ in range(120):
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/_dash-layout", timeout=2).read()
                break
            except OSError:
                time.sleep(0.5)
        assert body and b"timeline" in body
        for path_ in ("/", "/_dash-layout", "/_dash-dependencies"):
            assert urllib.request.urlopen(f"http://127.0.0.1:{port}{path_}", timeout=10).status == 200
    finally:
        p.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
    # commtrace's one line, not Flask's banner; no access-log line per request; Ctrl-C exits 130.
    assert f"serving on http://0.0.0.0:{port}/, Ctrl-C to stop" in out
    assert "warning: serving on 0.0.0.0" in err
    both = out + err
    for noise in ("GET /", "HTTP/1.1", "Serving Flask app", "development server", "Traceback"):
        assert noise not in both, (noise, both)
    assert p.returncode == 130, (p.returncode, both)


def test_lod_bins_equal_the_analysis_timeline_bins(data):
    """commtrace.analysis.lod.TimelineBins (prefix sums) gives Run.timeline_bins' table, integer for integer."""
    from commtrace.analysis.lod import TimelineBins
    run = data.run
    tb = TimelineBins(run)
    assert tb.exact
    span = run.t_max_ns - run.t_min_ns
    for t0, t1, n in ((None, None, 100), (run.t_min_ns + span // 3, run.t_min_ns + span // 2, 400),
                      (run.t_min_ns + 12345, run.t_min_ns + 12345 + span // 1000, 37), (run.t_min_ns - 10**6, run.t_max_ns + 10**6, 7)):
        got, want = tb.bins(t0, t1, n), run.timeline_bins(t0, t1, nbins=n)
        assert got.column_names == want.column_names
        for c in want.column_names:
            assert np.array_equal(got[c].to_numpy(), want[c].to_numpy()), c
        assert want["inflight_ns"].to_numpy().sum() > 0


def test_one_callback_moves_the_slider_with_a_plot_zoom(data):
    """A box-zoom on the plot (relayoutData) returns the figure and the range slider's value in the
    same response; the slider's own echo of that value is not taken for a new zoom."""
    import dash

    from commtrace.dashboard.app import create_app
    app = create_app(data)
    win = {"a": 0.0, "b": data.duration_s}
    a, b = data.duration_s * 0.25, data.duration_s * 0.5

    def call(prop, value, win, inputs):
        return app._commtrace_update(prop, *inputs, win, None)

    out = call("timeline.relayoutData", {"xaxis.range[0]": a, "xaxis.range[1]": b}, win,
               [{"xaxis.range[0]": a, "xaxis.range[1]": b}, [0, data.duration_s], None, None])
    fig, slider, new_win = out[0], out[1], out[2]
    assert tuple(fig.layout.xaxis.range) == pytest.approx((a, b))
    step = data.duration_s / 10000
    assert slider[0] == pytest.approx(a, abs=step) and slider[1] == pytest.approx(b, abs=step)
    assert new_win == {"a": a, "b": b}
    # the slider reporting (snapped) what we set: no new drawing
    with pytest.raises(dash.exceptions.PreventUpdate):
        call("range.value", slider, new_win, [None, slider, None, None])
    # a real slider move: a new window, drawn
    out = call("range.value", [a, b + data.duration_s * 0.1], new_win, [None, [a, b + data.duration_s * 0.1], None, None])
    assert out[2]["b"] == pytest.approx(b + data.duration_s * 0.1)
    assert tuple(out[0].layout.xaxis.range)[1] == pytest.approx(b + data.duration_s * 0.1)


def test_lazy_views_are_built_in_the_background_and_sent_once(data):
    """The Overlap, Stalls, Bandwidth and Run views are built when the app is created (a
    background thread); showing one sends that content the first time, then only styles."""
    import dash

    from commtrace.dashboard import figures as F
    from commtrace.dashboard.app import LAZY, create_app
    app = create_app(data)
    views = app._commtrace_views
    assert set(views) == set(LAZY)
    overlap = views["overlap"].result(timeout=60)
    assert [c.id for c in overlap] == ["overlap-rank", "overlap-step"]
    f1, _ = F.overlap_figures(data)
    assert list(overlap[0].figure.data[0].y) == pytest.approx(list(f1.data[0].y))
    out = app._commtrace_show_view("overlap", [])
    from commtrace.dashboard.app import PAGES
    views = [v for v, _ in PAGES]
    n = len(views)  # styles of every page
    styles, children, drawn = out[:n], out[n:n + len(LAZY)], out[-1]
    assert styles[views.index("overlap")] == {} and styles[views.index("overview")]["height"] == 0
    assert children[LAZY.index("overlap")] is overlap
    assert all(c is dash.no_update for i, c in enumerate(children) if i != LAZY.index("overlap"))
    assert drawn == ["overlap"]
    # the timeline is drawn the first time it is shown (the first page is the overview)
    assert app._commtrace_page().to_plotly_json() and F.empty_timeline(data).layout.meta["mode"] == "none"
    tl = app._commtrace_show_view("timeline", drawn)
    assert tl[n + len(LAZY)].layout.meta["mode"] in ("bins", "exact") and tl[-1] == ["overlap", "timeline"]
    assert app._commtrace_show_view("timeline", tl[-1])[n + len(LAZY)] is dash.no_update
    again = app._commtrace_show_view("overlap", drawn)
    assert all(c is dash.no_update for c in again[n:n + len(LAZY)])
    # the job facts' row "world size | 4" (a Mantine table's cells)
    rows = []

    def walk(c):
        if isinstance(c, (list, tuple)):
            for x in c:
                walk(x)
        elif hasattr(c, "children"):
            if type(c).__name__ == "TableTr":
                rows.append([getattr(td, "children", None) for td in c.children])
            walk(c.children)
    walk(app._commtrace_views["facts"].result(timeout=60))
    assert ["world size", "4"] in rows, rows


def test_page_loads_the_cartesian_bundle_of_the_installed_plotly_js(data, monkeypatch):
    """The page loads plotly.js's cartesian bundle from assets/ when it is the plotly.js version
    the installed plotly ships (Dash's graph then uses it instead of loading the full bundle),
    and leaves it out for any other version (the full bundle, as without it)."""
    import re

    import plotly.offline

    from commtrace.dashboard.app import ASSETS, cartesian_bundle, create_app
    have = plotly.offline.get_plotlyjs_version()
    vendored = [f for f in os.listdir(ASSETS) if f.startswith("plotly-cartesian-") and f.endswith(".min.js")]
    assert len(vendored) == 1
    with open(os.path.join(ASSETS, vendored[0])) as f:
        head = f.read(200)
    ver = re.search(r"plotly\.js \(cartesian - minified\) v(\S+)", head).group(1)
    assert vendored[0] == f"plotly-cartesian-{ver}.min.js"

    def scripts(app):
        """The page's script sources (tags made inert until the first paint: app.LOADER_JS)."""
        html = app.server.test_client().get("/").get_data(as_text=True)
        return re.findall(r'<script (?:type="commtrace/deferred" )?src="([^"]+)"', html)

    app = create_app(data)
    if ver == have:
        assert cartesian_bundle() == have and app._commtrace_plotly == f"cartesian {have}"
        got = [s for s in scripts(app) if "plotly-cartesian" in s]
        assert len(got) == 1 and got[0].startswith(f"/assets/plotly-cartesian-{have}.min.js")
        # served, and it is the bundle (it defines window.Plotly, which Dash's graph looks for)
        body = app.server.test_client().get(got[0].split("?")[0]).get_data(as_text=True)
        assert len(body) > 1_000_000 and "window.Plotly = Plotly" in body
    monkeypatch.setattr(plotly.offline, "get_plotlyjs_version", lambda: "0.0.0-other")
    assert cartesian_bundle() is None
    app = create_app(data)
    assert app._commtrace_plotly == "full" and not any("plotly-cartesian" in s for s in scripts(app))


def test_timeline_draws_the_critical_path_of_the_analysis(data, tmp_path):
    """The line drawn is `critical_path.segments(run)` computed on a fresh load of the same
    directory: every segment in the window, on its rank's row, in time order; the legend's
    figures are the report's `critical_path` section."""
    from commtrace.analysis.critical_path import segments
    from commtrace.dashboard import figures as F
    from commtrace.dashboard.app import _critical_legend
    fresh = commtrace.load(str(data.run.path))
    try:
        seg = segments(fresh).to_pydict()
        rep_cp = fresh.report()["critical_path"]
    finally:
        fresh.close()
    assert len(seg["rank"]) > 10 and len(set(seg["rank"])) >= 2
    t0 = (np.array(seg["t0_ns"]) - data.t_min_ns) / 1e9
    t1 = (np.array(seg["t1_ns"]) - data.t_min_ns) / 1e9
    row = np.array([data.row_of[r] for r in seg["rank"]])
    for a, b in [(0.0, data.duration_s), (data.duration_s * 0.3, data.duration_s * 0.35)]:
        fig = F.timeline_figure(data, a, b)
        (tr,) = [t for t in fig.data if t.name == "critical path"]
        assert fig.layout.meta["critical"] == "segments"
        want = np.flatnonzero((t1 >= a) & (t0 <= b))
        x = np.asarray(tr.x, np.float64).reshape(-1, 2)
        y = np.asarray(tr.y, np.float64).reshape(-1, 2)
        np.testing.assert_allclose(x[:, 0], t0[want], rtol=0, atol=1e-12)
        np.testing.assert_allclose(x[:, 1], t1[want], rtol=0, atol=1e-12)
        assert np.array_equal(y[:, 0], row[want] * 3 + 0.5) and np.array_equal(y[:, 1], y[:, 0])
        kinds = [seg["kind"][i] for i in want]
        assert [t.split(":", 1)[1].split(" ·")[0].split("<br>")[0].strip() for t in tr.text[::2]] == kinds
    text = "".join(c if isinstance(c, str) else "".join(getattr(c, "children", "") or "") for c in _critical_legend(data))
    assert f"{rep_cp['segments']:,} segments, {rep_cp['length_s']:.4f} s" in text
    # above the per-segment budget: the same line, fewer points, nothing outside the segments
    fig = F.timeline_figure(data)
    old = F.CRITICAL_EXACT_MAX
    try:
        F.CRITICAL_EXACT_MAX = 5
        red = F.timeline_figure(data)
    finally:
        F.CRITICAL_EXACT_MAX = old
    assert red.layout.meta["critical"] == "reduced"
    (tr,) = [t for t in red.data if t.name == "critical path"]
    x, y = np.asarray(tr.x, np.float64), np.asarray(tr.y, np.float64)
    assert len(x) < 2 * len(seg["rank"])
    assert x[0] == pytest.approx(t0[0], abs=1e-7) and x[-1] == pytest.approx(t1[-1], abs=1e-7)
    assert set(y.tolist()) == set((row * 3 + 0.5).tolist())


def test_pixel_extremes_keep_every_column_first_last_top_and_bottom():
    from commtrace.dashboard.figures import _pixel_extremes
    rng = np.random.default_rng(3)
    x = np.sort(rng.random(20000))
    y = rng.integers(0, 64, len(x)).astype(np.float64)
    keep = _pixel_extremes(x, y, 0.0, 1.0, 500)
    assert np.all(np.diff(keep) > 0) and len(keep) <= 4 * 501
    col = (x * 500).astype(int)
    for c in np.unique(col)[::37]:
        m = np.flatnonzero(col == c)
        k = np.intersect1d(keep, m)
        assert k[0] == m[0] and k[-1] == m[-1]
        assert y[k].min() == y[m].min() and y[k].max() == y[m].max()
