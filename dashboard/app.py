"""The Dash app: layout and callbacks. Every callback draws from the :class:`RunData` built at
start from the one run given on the command line; no URL or callback input names a path."""

from __future__ import annotations

import json

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


def create_app(d: RunData) -> dash.Dash:
    """A Dash app serving the views of `d` (see docs/dashboard.md)."""
    app = dash.Dash(__name__, title=f"commtrace: {d.run.path}", update_title=None, eager_loading=True)
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
        html.Div(id="view-timeline", children=[
            html.Div(style={"display": "flex", "gap": "12px", "alignItems": "center", "margin": "4px 0"}, children=[
                html.Button("Reset zoom", id="reset"),
                html.Span(id="mode-info"),
                html.Span(id="selection-info", style={"fontWeight": "bold"})]),
            dcc.RangeSlider(id="range", min=0, max=d.duration_s, value=[0, d.duration_s], step=slider_step,
                            marks=None, allowCross=False, tooltip={"placement": "bottom", "always_visible": False},
                            updatemode="mouseup"),
            dcc.Graph(id="timeline", figure=first, config={"displaylogo": False, "scrollZoom": False}),
            html.Div("Rows per rank: host-blocked (call and wait()), in-flight (enqueue to completion), "
                     "wait / sync (wait states and synchronize()). Click an op to highlight the same collective "
                     "(pg, seq) on every rank. Drag to zoom; zoomed out, bins show the busy fraction of each bin.",
                     style={"fontSize": 12, "color": "#555"})]),
        html.Div(id="view-other"),
    ])

    @app.callback(Output("view-timeline", "style"), Output("view-other", "children"),
                  Output("view-findings", "style"), Input("tabs", "value"))
    def show_view(tab):
        return (*_view(tab), {} if tab == "findings" else {"display": "none"})

    def _view(tab):
        hidden = {"display": "none"}
        if tab == "timeline":
            return {}, None
        if tab == "overlap":
            f1, f2 = F.overlap_figures(d)
            return hidden, [dcc.Graph(id="overlap-rank", figure=f1), dcc.Graph(id="overlap-step", figure=f2)]
        if tab == "stalls":
            f1, f2, pairs = F.stalls_figures(d)
            return hidden, [dcc.Graph(id="stalls-heatmap", figure=f1), dcc.Graph(id="stragglers", figure=f2),
                            html.H4("Late sender / late receiver pairs"), _table("late-pairs", pairs)]
        if tab == "bandwidth":
            return hidden, [dcc.Graph(id="busbw", figure=F.bandwidth_figure(d)),
                            html.H4("nccl-tests style table (per pg, op and size)"), _table("bw-table", F.bandwidth_rows(d))]
        if tab == "summary":
            return hidden, [html.Pre(id="summary", children=json.dumps(facts, indent=2, default=str))]
        return hidden, None

    # Findings live in the layout (hidden unless their tab) so that their table can be an Input.
    app.layout.children.append(html.Div(id="view-findings", style={"display": "none"}, children=[
        html.Div("Click a finding to zoom the timeline to its evidence.", style={"fontSize": 12}),
        _table("findings", F.findings_rows(d), columns=["severity", "kind", "rank", "pg", "seq", "op", "site",
                                                         "impact", "message"], page_size=50,
               style_data_conditional=[{"if": {"filter_query": f'{{severity}} = "{k}"'}, "color": c}
                                       for k, c in F.SEVERITY_COLOR.items()])]))

    # The slider is an input only: had it followed the zoom, its snapping to its step would
    # re-fire this callback and Dash would drop the in-flight response (lost zooms).
    @app.callback(Output("window", "data"), Output("tabs", "value"),
                  Output("selected", "data", allow_duplicate=True),
                  Input("timeline", "relayoutData"), Input("range", "value"), Input("reset", "n_clicks"),
                  Input("findings", "active_cell"), State("window", "data"), State("selected", "data"),
                  State("findings", "derived_viewport_data"), prevent_initial_call=True)
    def set_window(relayout, rng, _reset, cell, win, sel, rows):
        trig = dash.ctx.triggered_id
        no = dash.no_update
        if trig == "reset":
            return {"a": 0.0, "b": d.duration_s}, no, no
        if trig == "range" and rng:
            return {"a": float(rng[0]), "b": float(rng[1])}, no, no
        if trig == "findings" and cell:
            i = (rows[cell["row"]]["i"] if rows and cell["row"] < len(rows) else cell["row"])
            f = d.findings[int(i)]
            a, b = F.window_for_finding(d, f)
            new_sel = {"pg": f.pg, "seq": f.seq} if f.pg is not None and f.seq is not None else sel
            return {"a": a, "b": b}, "timeline", new_sel
        if trig == "timeline" and relayout:
            if relayout.get("xaxis.autorange"):
                return {"a": 0.0, "b": d.duration_s}, no, no
            a, b = relayout.get("xaxis.range[0]"), relayout.get("xaxis.range[1]")
            if a is None and isinstance(relayout.get("xaxis.range"), list):
                a, b = relayout["xaxis.range"]
            if a is not None and b is not None:
                a, b = max(0.0, float(a)), min(d.duration_s, float(b))
                return {"a": a, "b": b}, no, no
        raise dash.exceptions.PreventUpdate

    @app.callback(Output("selected", "data"), Input("timeline", "clickData"), prevent_initial_call=True)
    def select(click):
        if not click or not click.get("points"):
            raise dash.exceptions.PreventUpdate
        p = click["points"][0]
        cd = p.get("customdata")
        if not isinstance(cd, list) or len(cd) < 3:
            raise dash.exceptions.PreventUpdate
        pgc, seq = int(cd[0]), int(cd[1])
        if pgc < 0 or seq < 0:
            raise dash.exceptions.PreventUpdate
        return {"pg": d.o["pg_values"][pgc], "seq": seq}

    @app.callback(Output("timeline", "figure"), Output("mode-info", "children"), Output("selection-info", "children"),
                  Input("window", "data"), Input("selected", "data"), prevent_initial_call=True)
    def draw(win, sel):
        fig = F.timeline_figure(d, win["a"], win["b"], sel)
        mode = fig.layout.meta["mode"]
        info = (f"{'exact ops' if mode == 'exact' else 'level-of-detail bins'}: "
                f"{win['a']:.4f}–{win['b']:.4f} s")
        s = ""
        if sel:
            x = F.selection_info(d, sel["pg"], sel["seq"])
            s = f"selected {x.get('op')} pg {x['pg']} seq {x['seq']} on {len(x['ranks'])} rank(s)"
            if x.get("arrival_skew_ns") is not None:
                s += f" · arrival skew {F.fmt_ns(x['arrival_skew_ns'])} · last rank {x['last_rank']}"
        return fig, info, s

    return app


def build(run, nbins: int = 400) -> dash.Dash:
    """The Dash app for a loaded :class:`commtrace.analysis.run.Run` (derived tables cached)."""
    return create_app(RunData(run, nbins=nbins))
