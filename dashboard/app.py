"""The Dash app: layout and callbacks. Every callback draws from the :class:`RunData` built at
start from the one run given on the command line; no URL or callback input names a path."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import dash
from dash import Input, Output, State, dash_table, dcc, html

from . import figures as F
from .data import RunData

TABS = [("timeline", "Timeline"), ("overlap", "Overlap"), ("stalls", "Stalls"), ("findings", "Findings"),
        ("bandwidth", "Bandwidth"), ("summary", "Summary")]


def _banner(d: RunData):
    run = d.run
    parts = []
    if run.missing_ranks:
        parts.append(f"Partial run: rank(s) {', '.join(map(str, run.missing_ranks))} missing "
                     f"({len(d.ranks)} of {run.world_size} present).")
    parts += [str(w) for w in run.warnings[:5]]
    if not parts:
        return None
    return html.Div(id="banner", children=[html.Div(p) for p in parts],
                    style={"background": "#fff3cd", "border": "1px solid #e0c36c", "padding": "6px 10px", "margin": "4px 0"})


def _table(id_, rows, columns=None, **kw):
    cols = columns or (list(rows[0].keys()) if rows else [])
    return dash_table.DataTable(
        id=id_, data=rows, columns=[{"name": c, "id": c} for c in cols], page_size=kw.pop("page_size", 25),
        sort_action="native", style_cell={"fontFamily": "monospace", "fontSize": 12, "textAlign": "left",
                                          "whiteSpace": "normal", "height": "auto", "maxWidth": 600},
        style_header={"fontWeight": "bold"}, **kw)


#: How a view is hidden: kept laid out at its width (height 0, clipped) rather than display:none,
#: so that its plots are not resized (re-drawn) on every switch of view.
HIDDEN = {"height": 0, "overflow": "hidden"}
#: Views whose content is sent the first time they are shown, then kept; their figures are built in
#: a background thread when the app is created, so that showing one costs no server time.
LAZY = ("overlap", "stalls", "bandwidth", "summary")


def _graph(id_, fig, **kw):
    """A dcc.Graph whose height is fixed (the figure's), so that hiding its view resizes nothing."""
    h = fig.layout.height or 450
    return dcc.Graph(id=id_, figure=fig, style={"height": f"{h}px"},
                     config={"displaylogo": False, **kw.pop("config", {})}, **kw)


ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")


def cartesian_bundle() -> str | None:
    """The version of plotly.js's cartesian bundle in assets/ when it is the version of the
    plotly.js that the installed plotly ships (which Dash would serve), else None.

    The page loads that bundle (1.5 MB: the scatter, bar and heatmap traces the views use, among
    others) instead of plotly's full bundle (4.8 MB), which Dash's graph component loads only when
    no `window.Plotly` exists: with lazy chunks, the first page of the 64 x 20,000 synthetic run
    is ready about 1.3 s sooner (docs/performance.md). Another plotly.js version falls back to
    the full bundle."""
    try:
        from plotly.offline import get_plotlyjs_version
        have = get_plotlyjs_version()
    except Exception:  # noqa: BLE001 - an older plotly: the full bundle
        return None
    return have if os.path.isfile(os.path.join(ASSETS, f"plotly-cartesian-{have}.min.js")) else None


def create_app(d: RunData) -> dash.Dash:
    """A Dash app serving the views of `d` (see docs/dashboard.md)."""
    bundle = cartesian_bundle()
    # Not eager_loading: with it Dash also loads every component's lazy chunks (MathJax 2 MB,
    # Markdown, date pickers, and plotly's full bundle as well) before the first page can draw.
    app = dash.Dash(__name__, title=f"commtrace: {d.run.path}", update_title=None, assets_folder=ASSETS,
                    assets_ignore="" if bundle else r"plotly-cartesian-.*")
    app._commtrace_plotly = f"cartesian {bundle}" if bundle else "full"  # for tests
    app._commtrace_data = d  # for the benchmark and tests
    slider_step = d.duration_s / 10000
    first = F.timeline_figure(d)
    facts = F.summary_facts(d)
    app.layout = html.Div(style={"fontFamily": "sans-serif", "margin": "6px 12px"}, children=[
        html.Div([html.B("commtrace dashboard"), html.Span(f"  {d.run.path}  ·  world size {d.run.world_size}"
                                                          f"  ·  {facts['ops']:,} ops  ·  {facts['findings']} findings")]),
        _banner(d),
        dcc.Tabs(id="tabs", value="timeline", children=[dcc.Tab(label=l, value=v) for v, l in TABS]),
        dcc.Store(id="window", data={"a": 0.0, "b": d.duration_s}),
        dcc.Store(id="selected", data=None),
        dcc.Store(id="views-drawn", data=[]),
        html.Div(id="view-timeline", children=[
            html.Div(style={"display": "flex", "gap": "12px", "alignItems": "center", "margin": "4px 0"}, children=[
                html.Button("Reset zoom", id="reset"),
                html.Span(id="mode-info", children=_mode_info("bins" if first.layout.meta["mode"] == "bins" else "exact",
                                                              0.0, d.duration_s)),
                html.Span(id="selection-info", style={"fontWeight": "bold"})]),
            dcc.RangeSlider(id="range", min=0, max=d.duration_s, value=[0, d.duration_s], step=slider_step,
                            marks=None, allowCross=False, tooltip={"placement": "bottom", "always_visible": False},
                            updatemode="mouseup"),
            _graph("timeline", first, config={"scrollZoom": False}),
            html.Div("Rows per rank: host-blocked (call and wait()), in-flight (enqueue to completion), "
                     "wait / sync (wait states and synchronize()). Click an op to highlight the same collective "
                     "(pg, seq) on every rank. Drag on the plot or move the range slider to zoom (each follows "
                     "the other); zoomed out, bins show the busy fraction of each bin.",
                     style={"fontSize": 12, "color": "#555"})]),
        *[html.Div(id=f"view-{v}", style=HIDDEN) for v in LAZY],
        # Findings live in the layout (hidden unless their tab) so that their table can be an Input.
        html.Div(id="view-findings", style=HIDDEN, children=[
            html.Div("Click a finding to zoom the timeline to its evidence.", style={"fontSize": 12}),
            _table("findings", F.findings_rows(d), columns=["severity", "kind", "rank", "pg", "seq", "op", "site",
                                                             "impact", "message"], page_size=50,
                   style_data_conditional=[{"if": {"filter_query": f'{{severity}} = "{k}"'}, "color": c}
                                           for k, c in F.SEVERITY_COLOR.items()])]),
    ])

    def _content(tab):
        """The children of a lazily built view."""
        if tab == "overlap":
            f1, f2 = F.overlap_figures(d)
            return [_graph("overlap-rank", f1), _graph("overlap-step", f2)]
        if tab == "stalls":
            f1, f2, pairs = F.stalls_figures(d)
            return [_graph("stalls-heatmap", f1), _graph("stragglers", f2),
                    html.H4("Late sender / late receiver pairs"), _table("late-pairs", pairs)]
        if tab == "bandwidth":
            return [_graph("busbw", F.bandwidth_figure(d)),
                    html.H4("nccl-tests style table (per pg, op and size)"), _table("bw-table", F.bandwidth_rows(d))]
        return [html.Pre(id="summary", children=json.dumps(facts, indent=2, default=str))]

    # One worker builds the lazy views in the order of their tabs (about 0.3 s on the 64 x 20,000
    # synthetic run) while the server answers the first page; a view shown before its turn waits.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="commtrace-views")
    built = {tab: pool.submit(_content, tab) for tab in LAZY}
    pool.shutdown(wait=False)
    app._commtrace_views = built  # for tests
    views = ["timeline", *LAZY, "findings"]

    @app.callback(*[Output(f"view-{v}", "style") for v in views], *[Output(f"view-{v}", "children") for v in LAZY],
                  Output("views-drawn", "data"), Input("tabs", "value"), State("views-drawn", "data"))
    def show_view(tab, drawn):
        """Show one view; build a lazy view's figures the first time only (then it is a style change)."""
        drawn = list(drawn or [])
        styles = [{} if v == tab else HIDDEN for v in views]
        children = [dash.no_update] * len(LAZY)
        if tab in LAZY and tab not in drawn:
            children[LAZY.index(tab)] = built[tab].result()
            drawn.append(tab)
        return (*styles, *children, drawn)

    app._commtrace_show_view = show_view  # for tests

    no = dash.no_update

    # One callback for everything that changes the timeline: a zoom on the plot, the range slider,
    # reset, a finding, a click on an op. One round trip per interaction, and the slider follows
    # the plot: an output that is also an input of the same callback does not fire it again.
    @app.callback(Output("timeline", "figure"), Output("range", "value"), Output("window", "data"),
                  Output("selected", "data"), Output("tabs", "value"), Output("mode-info", "children"),
                  Output("selection-info", "children"),
                  Input("timeline", "relayoutData"), Input("range", "value"), Input("reset", "n_clicks"),
                  Input("findings", "active_cell"), Input("timeline", "clickData"),
                  State("window", "data"), State("selected", "data"), State("findings", "derived_viewport_data"),
                  prevent_initial_call=True)
    def timeline(relayout, rng, _reset, cell, click, win, sel, rows):
        return update(dash.ctx.triggered[0]["prop_id"], relayout, rng, cell, click, win, sel, rows)

    def update(prop, relayout, rng, cell, click, win, sel, rows):
        """The timeline callback's outputs for the input `prop` ("timeline.relayoutData", ...)."""
        win = win or {"a": 0.0, "b": d.duration_s}
        new_win, new_sel, tab = _window_input(prop, relayout, rng, cell, click, win, sel, rows)
        if new_win is None and new_sel is no:
            raise dash.exceptions.PreventUpdate
        w = new_win or win
        s = sel if new_sel is no else new_sel
        fig, slider, mode, info = draw(w, s)
        return fig, slider, w, new_sel, tab, mode, info

    def _window_input(prop, relayout, rng, cell, click, win, sel, rows):
        """(new window or None, new selection or no_update, tab or no_update) for an input."""
        trig = prop.split(".")[0]
        full = {"a": 0.0, "b": d.duration_s}
        if trig == "reset":
            return full, no, no
        if trig == "range" and rng:
            a, b = float(rng[0]), float(rng[1])
            # the slider snapping a value we set to its step: not a new zoom
            if abs(a - win["a"]) <= slider_step and abs(b - win["b"]) <= slider_step:
                return None, no, no
            return {"a": a, "b": b}, no, no
        if trig == "findings" and cell:
            i = (rows[cell["row"]]["i"] if rows and cell["row"] < len(rows) else cell["row"])
            f = d.findings[int(i)]
            a, b = F.window_for_finding(d, f)
            new_sel = {"pg": f.pg, "seq": f.seq} if f.pg is not None and f.seq is not None else no
            return {"a": a, "b": b}, new_sel, "timeline"
        if prop == "timeline.clickData":
            s = _selection(click)
            return (None, s, no) if s is not None else (None, no, no)
        if trig == "timeline" and relayout:
            if relayout.get("xaxis.autorange"):
                return full, no, no
            a, b = relayout.get("xaxis.range[0]"), relayout.get("xaxis.range[1]")
            if a is None and isinstance(relayout.get("xaxis.range"), list):
                a, b = relayout["xaxis.range"]
            if a is not None and b is not None:
                return {"a": max(0.0, float(a)), "b": min(d.duration_s, float(b))}, no, no
        return None, no, no

    def _selection(click):
        """{"pg", "seq"} of a clicked op, or None."""
        if not click or not click.get("points"):
            return None
        cd = click["points"][0].get("customdata")
        if not isinstance(cd, list) or len(cd) < 3:
            return None
        pgc, seq = int(cd[0]), int(cd[1])
        if pgc < 0 or seq < 0 or pgc >= len(d.o["pg_values"]):
            return None
        return {"pg": d.o["pg_values"][pgc], "seq": seq}

    def draw(win, sel):
        """(figure, slider value, mode line, selection line) of a window and selection."""
        fig = F.timeline_figure(d, win["a"], win["b"], sel)
        a, b = fig.layout.xaxis.range
        # the slider's value on its own grid, so that it does not snap (and echo) it
        rng = [max(0.0, slider_step * round(a / slider_step)), min(d.duration_s, slider_step * round(b / slider_step))]
        s = ""
        if sel:
            x = F.selection_info(d, sel["pg"], sel["seq"])
            s = f"selected {x.get('op')} pg {x['pg']} seq {x['seq']} on {len(x['ranks'])} rank(s)"
            if x.get("arrival_skew_ns") is not None:
                s += f" · arrival skew {F.fmt_ns(x['arrival_skew_ns'])} · last rank {x['last_rank']}"
        return fig, rng, _mode_info(fig.layout.meta["mode"], a, b), s

    app._commtrace_update = update  # for tests
    return app


def _mode_info(mode: str, a: float, b: float) -> str:
    return f"{'exact ops' if mode == 'exact' else 'level-of-detail bins'}: {a:.4f}–{b:.4f} s"


def build(run, nbins: int = 400) -> dash.Dash:
    """The Dash app for a loaded :class:`commtrace.analysis.run.Run` (derived tables cached)."""
    return create_app(RunData(run, nbins=nbins))
