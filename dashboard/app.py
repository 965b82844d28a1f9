"""The Dash app: layout and callbacks. Every callback draws from the :class:`RunData` built at
start from the one run given on the command line (and, live, rebuilt from the same directory);
no URL or callback input names a path.

Pages: Overview (first: the job and its answer), Timeline, Overlap, Stalls, Findings, Bandwidth,
Run (facts), and Compare with ``--compare``. Layout and theme are Mantine components
(dash-mantine-components); tables are AG Grid (dash-ag-grid)."""

from __future__ import annotations

import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dash
import dash_ag_grid as dag
import dash_mantine_components as dmc
from dash import ALL, MATCH, Input, Output, State, dcc, html

from ..analysis.findings import fmt_ns

from . import figures as F
from . import overview as OV
from .data import RunData

#: (value, label) of the pages, in their order; "compare" only with a second run.
PAGES = [("overview", "Overview"), ("timeline", "Timeline"), ("overlap", "Overlap"), ("stalls", "Stalls"),
         ("findings", "Findings"), ("bandwidth", "Bandwidth"), ("facts", "Run")]
#: How a view is hidden: kept laid out at its width (height 0, clipped) rather than display:none,
#: so that its plots are not resized (re-drawn) on every switch of view.
HIDDEN = {"height": 0, "overflow": "hidden"}
#: Views whose content is sent the first time they are shown, then kept; their figures are built in
#: a background thread when the app is created, so that showing one costs no server time.
LAZY = ("findings", "overlap", "stalls", "bandwidth", "facts")
#: Columns of long text, wrapped in their cells.
WRAP_FIELDS = ("message", "value", "site", "reason", "command")
#: Tables of at most this many rows take the height of their rows.
AUTO_HEIGHT_ROWS = 30
#: Lazy chunks the first page does not use, loaded when the live page is shown and the browser is
#: idle (prerender.SWAP_JS): AG Grid's (0.9 MB) cost the first page showing a grid (Bandwidth, Run,
#: Findings) its evaluation.
PRELOAD_CHUNKS = ("dash_ag_grid/async-community.js",)
#: Live refresh period (ms) while the job runs.
LIVE_MS = 2000
SEVERITY_MANTINE = {"error": "red", "warning": "orange", "info": "blue"}
STATE_COLOR = {"completed": "green", "running": "blue", "interrupted": "orange", "failed": "red", "unknown": "gray"}

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


# ---------------------------------------------------------------------------- small pieces
def _graph(id_, fig, **kw):
    """A dcc.Graph whose height is fixed (the figure's), so that hiding its view resizes nothing."""
    h = fig.layout.height or 450
    return dcc.Graph(id=id_, figure=F.fast_axes(fig), style={"height": f"{h}px"},
                     config={"displaylogo": False, **kw.pop("config", {})}, **kw)


def _grid(id_, rows, columns, height=None, **kw):
    """An AG Grid of `rows` (dicts) with `columns` = [(field, header) or (field, header, extra)]."""
    defs = []
    for c in columns:
        d = {"field": c[0], "headerName": c[1]}
        if len(c) > 2:
            d.update(c[2])
        if c[0] in WRAP_FIELDS:  # long text: wrapped, the row as high as it needs (costly per row)
            d.update(wrapText=True, autoHeight=True, cellStyle={"lineHeight": "1.4", "paddingTop": "6px",
                                                                "paddingBottom": "6px"})
        else:
            # at least as wide as its longest value (sized to fit, a column could cut "reduce_scatter")
            longest = max((len(str(r.get(c[0], ""))) for r in rows[:2000]), default=0)
            need = min(360, int(7.5 * longest) + 40)
            d["minWidth"] = max(d.get("minWidth", 0), need)
            if "maxWidth" in d:
                d["maxWidth"] = max(d["maxWidth"], need)
        defs.append(d)
    # A short table takes the height of its rows (nothing clipped, no inner scroll bar); a long
    # one scrolls inside a fixed height (AG Grid draws only the rows in view).
    auto = len(rows) <= AUTO_HEIGHT_ROWS
    return dag.AgGrid(id=id_, rowData=rows, columnDefs=defs, className="ag-theme-alpine",
                      defaultColDef={"sortable": True, "resizable": True, "filter": False,
                                     "wrapHeaderText": True, "autoHeaderHeight": True},
                      columnSize="responsiveSizeToFit",
                      dashGridOptions={"domLayout": "autoHeight" if auto else "normal", "animateRows": False},
                      style={"width": "100%", **({} if auto else {"height": f"{height or 520}px"})}, **kw)


def _empty(text, id_=None):
    """An empty state: what is absent and why."""
    kw = {"id": id_} if id_ else {}
    return dmc.Alert(text, color="gray", variant="light", className="empty-state", **kw)


def _md_code(text: str) -> list:
    """Markdown `code` spans of a catalogue text as html.Code (no Markdown renderer needed)."""
    return [html.Code(p) if code else p for code, p in OV.md_parts(text)]


def _stat(label, value, id_, color=None, hint=None):
    return dmc.Paper([dmc.Text(label, size="sm", c="dimmed"),
                      dmc.Text(value, id=id_, fw=700, size="xl", **({"c": color} if color else {})),
                      dmc.Text(hint or "", size="xs", c="dimmed")],
                     withBorder=True, p="sm", radius="md")


def _fmt_s(s) -> str:
    return "—" if s is None else fmt_ns(s * 1e9)


#: The cookie that keeps the page's theme ("dark" / "light") between visits: the server reads it
#: to send the page and its figures in that theme, so a dark page is dark from its first paint.
THEME_COOKIE = "commtrace_theme"
#: The theme toggle (clientside): sets the page's colour scheme and the cookie, and re-colours
#: the plots already drawn with figures.THEME_COLORS (figures sent later come themed).
THEME_JS = """
function(dark, colors) {
    const scheme = dark ? 'dark' : 'light';
    document.cookie = '%s=' + scheme + '; path=/; max-age=31536000; SameSite=Lax';
    const c = colors[scheme], other = colors[dark ? 'light' : 'dark'];
    document.querySelectorAll('.js-plotly-plot').forEach(gd => {
        const fl = gd._fullLayout;
        if (!fl || !window.Plotly) { return; }
        const u = Object.assign({}, c.layout);
        Object.keys(fl).filter(k => /^[xy]axis[0-9]*$/.test(k)).forEach(ax => {
            Object.entries(c.axis).forEach(([k, v]) => { u[ax + '.' + k] = v; });
        });
        window.Plotly.relayout(gd, u);
        const ink = [], ring = [];
        (gd.data || []).forEach((t, i) => {
            if (t.line && t.line.color === other.ink) { ink.push(i); }
            if (t.marker && t.marker.line && t.marker.line.color === other.ink) { ring.push(i); }
        });
        if (ink.length) { window.Plotly.restyle(gd, {'line.color': c.ink}, ink); }
        if (ring.length) { window.Plotly.restyle(gd, {'marker.line.color': c.ink}, ring); }
    });
    return scheme;
}
""" % THEME_COOKIE


#: The timeline's relayoutData passed on (to the store "zoom", an input of the timeline callback)
#: only when it changes the x range.
ZOOM_JS = """
function(r) {
    if (r && Object.keys(r).some(k => k.startsWith('xaxis.range') || k === 'xaxis.autorange')) { return r; }
    return window.dash_clientside.no_update;
}
"""


def _request_dark() -> bool:
    """Whether the request asks for the dark theme (its cookie); False outside a request."""
    import flask
    return flask.has_request_context() and flask.request.cookies.get(THEME_COOKIE) == "dark"


def _themed_tree(node, dark: bool):
    """`node` (a component, or a list of them) with every dcc.Graph's figure in the page's
    theme, changed in place (figures.themed); light: unchanged."""
    if not dark:
        return node
    if isinstance(node, (list, tuple)):
        for n in node:
            _themed_tree(n, dark)
        return node
    if isinstance(node, dcc.Graph) and hasattr(getattr(node, "figure", None), "update_layout"):
        F.themed(node.figure, dark)  # the builders' go.Figure
    kids = getattr(node, "children", None)
    if kids is not None and not isinstance(kids, str):
        _themed_tree(kids, dark)
    return node


# ---------------------------------------------------------------------------- overview
def job_badge(job: dict, id_=None):
    kw = {"id": id_} if id_ else {}
    st = job.get("state", "unknown")
    return dmc.Badge(f"job {st}", color=STATE_COLOR.get(st, "gray"), variant="filled", size="lg", **kw)


def card(c: dict, prefix: str = "show-finding"):
    """One finding card: severity, title, the one-sentence meaning, the finding's own message,
    cost, rank and call site, the fix (docs/findings.md) and "show on timeline"."""
    sev = c["severity"]
    kids = [
        dmc.Group([dmc.Badge(sev, color=SEVERITY_MANTINE.get(sev, "gray"), variant="filled"),
                   dmc.Text(c["title"], fw=700, size="lg", className="card-title"),
                   dmc.Code(c["kind"])], gap="xs"),
        dmc.Text(c["meaning"], size="sm", className="card-meaning"),
        dmc.Text(c["message"], size="sm", c="dimmed", className="card-message"),
        html.Table(className="card-facts", children=[html.Tbody([
            html.Tr([html.Th(k, style={"textAlign": "left", "paddingRight": "12px", "fontWeight": 500}),
                     html.Td(v, className=f"card-{cls}")]) for k, v, cls in OV.card_facts(c)])]),
        dmc.Text([html.B("Fix: "), *_md_code(c["fix"])], size="sm", className="card-fix"),
    ]
    if prefix:
        kids.append(dmc.Button("Show on timeline", id={"type": prefix, "i": c["i"]}, size="xs", variant="light",
                               className="show-on-timeline"))
    return dmc.Card(kids, withBorder=True, shadow="xs", padding="md", radius="md",
                    className=f"finding-card finding-{c['kind']}", **{"data-kind": c["kind"], "data-rank": str(c.get("rank"))})


def overview_children(ov: dict, d: RunData | None, prefix: str = "show-finding", suffix: str = ""):
    """The overview page of one run (also one column of the compare page, with a `suffix` on ids
    and no timeline action). Its text comes from `overview` (as the static overview of the first
    response, `prerender`, does)."""
    h = ov["headline"]
    job = ov["job"]
    top = dmc.Group([job_badge(job, id_=f"job-state{suffix}"), dmc.Text(OV.job_line(job), size="sm", c="dimmed")], gap="sm")
    errs = OV.error_lines(job)
    if errs:
        top = dmc.Stack([top] + [dmc.Text(e, size="sm", c="red", id=f"job-error-{i}{suffix}")
                                 for i, e in enumerate(errs)], gap=2)
    stats = dmc.SimpleGrid(cols={"base": 2, "sm": 4, "lg": 8}, spacing="xs", children=[
        _stat(s["label"], s["value"], f"ov-{s['key']}{suffix}", s["color"], s["hint"]) for s in OV.stats(ov)])
    cards = ov["cards"]
    cards_block = (dmc.SimpleGrid(cols={"base": 1, "md": 2}, spacing="sm", children=[card(c, prefix) for c in cards])
                   if cards else _empty(no_findings_text(ov), f"no-findings{suffix}"))
    sf = F.steps_figure(ov)
    steps_block = (_graph(f"ov-steps-fig{suffix}", sf) if sf is not None else _empty(no_steps_text(h["steps"]), f"no-steps{suffix}"))
    hf = F.health_figure(ov)
    return [
        top, stats,
        dmc.Title("Top findings", order=4, mt="sm"), cards_block,
        dmc.Title(STEPS_TITLE, order=4, mt="sm"), steps_block,
        dmc.Title("Per-rank health", order=4, mt="sm"),
        _graph(f"ov-health{suffix}", hf),
        _plain_table(f"ov-health-table{suffix}", OV.health_rows(ov), OV.HEALTH_COLUMNS, height=300),
    ]


#: The overview's empty states and titles (the static overview of the first response says the same).
NO_FINDINGS = ("No findings: no straggler, hang, mismatch, late sender or host hazard stood out in this run "
               "(docs/findings.md lists every check).")
STEPS_TITLE = "Time per step: compute, exposed communication, wait"


def no_findings_text(ov: dict) -> str:
    """NO_FINDINGS, and the what-if's costliest rank when its delays cost 5% of the run or more
    (the overview's `top_rank`: the text report's line)."""
    tr = ov.get("top_rank")
    return NO_FINDINGS + (" " + tr["text"] if tr else "")


def no_steps_text(steps: int) -> str:
    return ("No per-step chart: this run has " + ("one step" if steps == 1 else "no step markers")
            + " (steps come from optimizer.step() or commtrace.mark_step()), so the fractions above are for the whole run.")


# ---------------------------------------------------------------------------- other pages
def _plain_table(id_, rows, columns, height=None, widths=None, wrap=(), sort_by=None):
    """A table of `rows` (dicts) with `columns` = [(field, header)] as a Mantine table: each cell
    has the class `col-<field>`; with `height`, a longer table scrolls inside it (sticky header).
    A click on a header sorts by its column (again: the other way), in the browser
    (:data:`SORT_JS`, from the rows kept in a store beside the table): no server round trip,
    and no AG Grid, whose 0.9 MB chunk the first page does not load (it cost the overview's first
    paint 0.2-0.6 s, and each grid's start 0.1-0.3 s on the page that shows it). `widths`: field
    -> header width; `wrap`: fields whose long values break; `sort_by`: field -> the field whose
    values sort it (a size label by its bytes). Column ids and order: the header buttons' ids
    {"type": "sort-th", "table": id_, "col": field}; each cell has the class `col-<field>` (other
    characters than letters, digits and _ as _)."""
    widths, sort_by = widths or {}, sort_by or {}
    fields = [f for f, _ in columns]
    cls = ["col-" + re.sub(r"\W", "_", f) for f in fields]
    text = [[OV.cell_text(r.get(f)) for f in fields] for r in rows]
    store = {"cols": fields, "heads": [h for _, h in columns], "wrap": [f in wrap for f in fields], "cls": cls,
             "rows": [[_sort_key(r.get(sort_by.get(f, f))) for f in fields] for r in rows], "text": text, "sort": None}
    head = dmc.TableThead(dmc.TableTr([
        dmc.TableTh(html.Button(h, id={"type": "sort-th", "table": id_, "col": f}, n_clicks=0, className="sort-button",
                                title=f"sort by {h}"), className=c, **({"w": widths[f]} if f in widths else {}))
        for (f, h), c in zip(columns, cls)]))
    body = dmc.TableTbody(id={"type": "sort-body", "table": id_}, children=[
        dmc.TableTr([dmc.TableTd(t, className=c, **({"style": WRAP_STYLE} if f in wrap else {}))
                     for f, c, t in zip(fields, cls, cells)]) for cells in text])
    table = dmc.Table(id=id_, striped=True, highlightOnHover=True, withTableBorder=True, stickyHeader=True,
                      className="sortable-table", children=[head, body])
    kids = [table, dcc.Store(id={"type": "sort-rows", "table": id_}, data=store)]
    if height is None or len(rows) <= AUTO_HEIGHT_ROWS:
        return html.Div(kids)
    return html.Div([dmc.TableScrollContainer(table, minWidth=400, maxHeight=height, type="native"), kids[1]])


#: A long value's cell breaks anywhere (paths, commands).
WRAP_STYLE = {"wordBreak": "break-word"}


def _sort_key(v):
    """A cell's value as the browser sorts it: numbers as numbers, the rest as text, None last."""
    if v is None or isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    return str(v)


#: The plain tables' sort (clientside): the clicked header's column, ascending, or descending when
#: it was already sorted ascending; empty cells last either way, ties in their original order.
#: The rows come back as Mantine table rows from the store, and each header shows ▲ / ▼.
SORT_JS = """
function(clicks, state) {
    const dc = window.dash_clientside, ctx = dc.callback_context;
    const trig = ctx.triggered_id || (ctx.triggered && ctx.triggered.length ? JSON.parse(ctx.triggered[0].prop_id.split('.')[0]) : null);
    if (!trig || !state || !clicks.some(n => n)) { return [dc.no_update, dc.no_update, dc.no_update]; }
    const col = trig.col, k = state.cols.indexOf(col);
    const asc = !(state.sort && state.sort.col === col && state.sort.asc);
    const cmp = (a, b) => (typeof a === 'number' && typeof b === 'number') ? a - b
        : String(a).localeCompare(String(b), undefined, {numeric: true});
    const order = state.rows.map((_, i) => i);
    order.sort((i, j) => {
        const a = state.rows[i][k], b = state.rows[j][k];
        if (a === null || b === null) { return (a === null) - (b === null) || i - j; }
        return (asc ? cmp(a, b) : cmp(b, a)) || i - j;
    });
    const ns = 'dash_mantine_components';
    const body = order.map(i => ({namespace: ns, type: 'TableTr', props: {children: state.cols.map((f, c) => ({
        namespace: ns, type: 'TableTd', props: Object.assign({children: state.text[i][c], className: state.cls[c]},
                                                             state.wrap[c] ? {style: {wordBreak: 'break-word'}} : {})}))}}));
    const heads = ctx.outputs_list[2].map(o => {
        const c = state.cols.indexOf(o.id.col);
        return state.heads[c] + (o.id.col === col ? (asc ? ' ▲' : ' ▼') : '');
    });
    return [body, Object.assign({}, state, {sort: {col: col, asc: asc}}), heads];
}
"""


def _facts_table(id_, rows, head=("fact", "value")):
    """A short two-column table of facts (a sortable Mantine table, `_plain_table`: the Run page's
    short lists cost no grid each; its long per-rank tables stay AG Grids)."""
    return _plain_table(id_, rows, [("fact", head[0]), ("value", head[1])], widths={"fact": "25%"}, wrap=("value",))


def facts_children(d: RunData):
    """Run facts as tables: job, hosts and versions per rank, NCCL / NVML facts when present,
    clock offsets and violations, ops by op, dropped rows, warnings."""
    run, rep = d.run, d.report
    man = run.manifest or {}
    job = d.overview["job"]
    job_rows = [{"fact": k, "value": v} for k, v in (
        ("state", job["state"]), ("detail", job.get("detail")), ("exit code", job.get("exit_code")),
        *(("exception", e) for e in OV.error_lines(job)),
        ("command", (man["command"] if isinstance(man.get("command"), str)
                     else " ".join(map(str, man.get("command") or []))) or None), ("started", man.get("start_time")),
        ("directory", str(run.path)), ("world size", run.world_size),
        ("ranks traced", len(run.ranks)), ("missing ranks", ", ".join(map(str, run.missing_ranks)) or "none"),
        ("ops", rep["ops"]), ("matched collectives", rep["collectives"]),
        ("trace schema", rep.get("trace_schema"))) if v is not None]
    rank_rows, extra_rows = [], []
    for r in sorted(run.meta):
        m = run.meta[r] or {}
        rank_rows.append({"rank": r, "host": m.get("host"), "backend": m.get("backend"),
                          "device": m.get("device") or m.get("device_name"),
                          "torch": m.get("torch_version"), "commtrace": m.get("commtrace_version"),
                          "clock offset (ns)": m.get("clock_offset_ns"), "offset rtt (ns)": m.get("clock_rtt_ns"),
                          "dropped rows": int(m.get("dropped_rows") or 0)})
        for k, v in sorted(m.items()):
            if any(t in k.lower() for t in ("nccl", "nvml", "gpu", "cuda")) and v not in (None, "", [], {}):
                extra_rows.append({"rank": r, "fact": k, "value": str(v)[:200]})
    ck = rep["clock"] or {}
    clock_rows = [{"fact": k, "value": str(v)} for k, v in (
        ("methods", ", ".join(ck.get("methods") or []) or "none recorded"), ("tolerance", fmt_ns(ck.get("tolerance_ns"))),
        ("matched collectives checked", ck.get("matched")), ("violations", ck.get("violations")),
        ("max violation", fmt_ns(ck.get("max_violation_ns"))), ("late ranks", ", ".join(map(str, ck.get("late_ranks") or [])) or "none"))]
    o = d.o
    import numpy as np
    counts = np.bincount(o["op"][o["op"] >= 0], minlength=len(o["op_values"])) if len(o["op"]) else []
    op_rows = [{"op": o["op_values"][k], "calls": int(n)} for k, n in enumerate(counts) if n]
    out = [dmc.Title("Job", order=4), _facts_table("facts-job", job_rows),
           dmc.Title("Ranks: hosts, versions, clock offsets, dropped rows", order=4, mt="sm"),
           _plain_table("facts-ranks", rank_rows, [(k, k) for k in rank_rows[0]] if rank_rows else [("rank", "rank")], height=520)]
    out += [dmc.Title("NCCL / NVML / GPU facts", order=4, mt="sm"),
            _plain_table("facts-device", extra_rows, [("rank", "rank"), ("fact", "fact"), ("value", "value")], height=520,
                         wrap=("value",))
            if extra_rows else _empty("None recorded: a CPU (gloo) run has no NCCL or NVML facts.")]
    out += [dmc.Title("Clock alignment", order=4, mt="sm"), _facts_table("facts-clock", clock_rows),
            dmc.Title("Ops by op", order=4, mt="sm"),
            _facts_table("facts-ops", [{"fact": r["op"], "value": r["calls"]} for r in op_rows], ("op", "calls (all ranks)"))
            if op_rows else _empty("No ops recorded.")]
    warns = list(rep.get("warnings") or [])
    out += [dmc.Title("Warnings from loading", order=4, mt="sm"),
            dmc.List([dmc.ListItem(w) for w in warns]) if warns else _empty("None: every part read cleanly.")]
    return out


def _lazy_content(d: RunData, tab: str):
    """The children of a lazily built view."""
    if tab == "findings":
        return _findings_view(d)
    if tab == "overlap":
        f1, f2 = F.overlap_figures(d)
        kids = [_graph("overlap-rank", f1)]
        kids.append(_graph("overlap-step", f2) if d.overview["headline"]["steps"] >= 2 else
                    _empty("No per-step chart: this run has " + ("one step" if d.overview["headline"]["steps"] == 1
                                                                 else "no step markers")
                           + " (steps come from optimizer.step() or commtrace.mark_step()).", "overlap-no-steps"))
        return kids
    if tab == "stalls":
        f1, f2, pairs = F.stalls_figures(d)
        kids = [_graph("stalls-heatmap", f1), _graph("stragglers", f2), dmc.Title("Late sender / late receiver pairs", order=4)]
        if pairs:
            kids.append(_grid("late-pairs", pairs, [(k, k.replace("_", " ")) for k in pairs[0]]))
        elif not d.p2p.num_rows:
            kids.append(_empty("None in this run: it has no point-to-point transfers (send / recv).", "late-pairs-empty"))
        else:
            kids.append(_empty(f"None in this run: its {d.p2p.num_rows} point-to-point transfers were all posted in time.",
                               "late-pairs-empty"))
        return kids
    if tab == "bandwidth":
        rows = F.bandwidth_rows(d)
        if not rows:
            return [_empty("No matched collectives: bandwidth is measured on collectives (all_reduce, ...).", "bw-empty")]
        return [_graph("busbw", F.bandwidth_figure(d)),
                dmc.Title("nccl-tests style table (per pg, op and size)", order=4),
                _plain_table("bw-table", rows, [("pg", "pg"), ("op", "op"), ("size", "size"), ("count", "count"),
                                                ("time_us", "time (us)"), ("algbw_gbps", "algbw (GB/s)"),
                                                ("busbw_gbps", "busbw (GB/s)"), ("busbw_min", "busbw min"),
                                                ("busbw_max", "busbw max"), ("busbw_std", "busbw std"),
                                                ("incomplete", "incomplete")], height=520, sort_by={"size": "size_bytes"})]
    return facts_children(d)


def compare_children(d: RunData, other: RunData, diff: dict):
    """The diff's deltas (totals, per op and size, per finding kind) and both overviews."""
    def n(v, k=4):
        return None if v is None else round(float(v), k)
    tot_rows = [{"figure": k, "a": n(v["a"]), "b": n(v["b"]), "delta": n(v["delta"]),
                 "change": None if v["rel"] is None else f"{v['rel'] * 100:+.1f}%"} for k, v in diff["totals"].items()]
    op_rows = [{"op": r["op"], "size": r["size_label"], "calls a": r["calls_a"], "calls b": r["calls_b"],
                "t_comm a (us)": n(r["t_comm_s_a"] * 1e6 if r["t_comm_s_a"] is not None else None, 1),
                "t_comm b (us)": n(r["t_comm_s_b"] * 1e6 if r["t_comm_s_b"] is not None else None, 1),
                "exposed a (s)": n(r["exposed_s_a"]), "exposed b (s)": n(r["exposed_s_b"]),
                "exposed delta (s)": n(r["exposed_s_delta"]),
                "busbw a": n(r["busbw_gbps_a"], 3), "busbw b": n(r["busbw_gbps_b"], 3)} for r in diff["ops"]]
    f_rows = [{"kind": r["kind"], "severity": r["severity"], "a": r["a"], "b": r["b"], "delta": r["delta"]}
              for r in diff["findings"]]
    cols = lambda rows: [(k, k) for k in rows[0]] if rows else [("x", "x")]  # noqa: E731
    return [
        dmc.Text(f"A = {d.run.path}   ·   B = {other.run.path}   (delta = B − A)", size="sm", c="dimmed"),
        dmc.Title("Totals (summed over ranks)", order=4), _grid("cmp-totals", tot_rows, cols(tot_rows)),
        dmc.Title("Per op and size", order=4, mt="sm"),
        _grid("cmp-ops", op_rows, cols(op_rows)) if op_rows else _empty("Neither run has ops."),
        dmc.Title("Findings", order=4, mt="sm"),
        _grid("cmp-findings", f_rows, cols(f_rows)) if f_rows else _empty("Neither run has findings."),
        dmc.SimpleGrid(cols=2, spacing="md", mt="md", children=[
            dmc.Stack([dmc.Title(f"A: {os.path.basename(str(d.run.path))}", order=3),
                       *overview_children(d.overview, d, prefix=None, suffix="-a")], gap="xs"),
            dmc.Stack([dmc.Title(f"B: {os.path.basename(str(other.run.path))}", order=3),
                       *overview_children(other.overview, other, prefix=None, suffix="-b")], gap="xs")]),
    ]


def live_children(st: dict):
    """The live strip: per rank, what it is in now."""
    rows = []
    for r in st["ranks"]:
        rows.append({"rank": r["rank"], "now": ("in " + str(r["op"])) if r["op"] else ("exited" if r["final"] else "no op in flight"),
                     "pg": r["pg"], "seq": r["seq"], "for": _fmt_s(r["for_s"]),
                     "no progress for": _fmt_s(r["no_progress_s"]),
                     "last completed": f"{r['last_op']} seq {r['last_seq']}" if r.get("last_op") else "—",
                     "snapshot age": _fmt_s(r["snapshot_age_s"])})
    return [dmc.Title("Live: what each rank is in now", order=4),
            _grid("live-table", rows, [("rank", "rank"), ("now", "now"), ("pg", "group"), ("seq", "seq"),
                                       ("for", "for"), ("no progress for", "no progress for"),
                                       ("last completed", "last completed"), ("snapshot age", "snapshot age")],
                  height=min(40 + 42 * len(rows), 360))]


def hang_alert(st: dict):
    h = st.get("hang")
    if not h:
        return None
    who = ", ".join(map(str, h["ranks"]))
    return dmc.Alert(
        f"Hang: rank {who} has not joined {h['op']} seq {h['seq']} on pg {h['pg']}; rank(s) "
        f"{', '.join(map(str, h['waiting']))} have waited in it for {h['for_s']:.1f} s.",
        title=f"Rank {h['rank']} has not joined", color="red", variant="filled", id="hang-banner")


def ended_alert(job: dict, was_live: bool):
    if not was_live or job.get("state") == "running":
        return None
    return dmc.Alert(f"The job ended: {job['state']} ({job.get('detail') or ''}). The page shows the final analysis.",
                     title="Job ended", color=STATE_COLOR.get(job["state"], "gray"), variant="light", id="ended-banner")


def _partial_texts(d: RunData) -> list[str]:
    """The partial-run banner's lines: missing ranks, the first loading warnings."""
    run = d.run
    parts = []
    if run.missing_ranks:
        parts.append(f"Partial run: rank(s) {', '.join(map(str, run.missing_ranks))} missing "
                     f"({len(d.ranks)} of {run.world_size} present).")
    return parts + [str(w) for w in run.warnings[:5]]


def _partial_banner(d: RunData):
    parts = _partial_texts(d)
    if not parts:
        return None
    return dmc.Alert([html.Div(p) for p in parts], id="banner", color="yellow", variant="light")


def _mode_info(mode: str, a: float, b: float) -> str:
    return f"{'exact ops' if mode == 'exact' else 'level-of-detail bins'}: {a:.4f}–{b:.4f} s"


def _legend(d: RunData):
    """What the timeline's rows and colours mean (the op colours are fixed: commtrace.ops.OP_COLORS)."""
    from ..ops import OP_COLORS
    sw = [html.Span([html.Span(style={"display": "inline-block", "width": 12, "height": 12, "background": c,
                                      "marginRight": 4, "verticalAlign": "middle"}), op],
                    style={"marginRight": 10, "whiteSpace": "nowrap"}) for op, c in OP_COLORS.items()]
    return html.Div(id="timeline-legend", style={"fontSize": 12, "color": "var(--mantine-color-dimmed)", "lineHeight": "1.8"}, children=[
        html.Div([html.B("Rows per rank, top to bottom: "), "host-blocked (the call and wait()) · in-flight (enqueue to "
                  "completion) · wait / sync (wait states and synchronize()). Zoomed out, each cell is the busy "
                  "fraction of its time bin."]),
        html.Div([html.B("Op colours (the same in every run): "), *sw,
                  html.Span("▼ finding  ✕ hazard  ◆ synchronize()", style={"whiteSpace": "nowrap"})]),
        html.Div(id="critical-legend", children=_critical_legend(d)),
        html.Div("Click an op to highlight the same collective (pg, seq) on every rank; drag on the plot or move the "
                 "range slider to zoom (each follows the other).")])


def _critical_legend(d: RunData):
    """What the critical path line is, or why it is not drawn."""
    from .figures import CRITICAL_COLOR
    if d.critical is None:
        why = next((w for w in d.report.get("warnings", []) if "root cause" in w), "the report has no critical path")
        return [html.B("Critical path: "), f"not drawn ({why})."]
    cp = d.report["critical_path"]
    return [html.Span(style={"display": "inline-block", "width": 18, "height": 3, "background": CRITICAL_COLOR,
                             "marginRight": 4, "verticalAlign": "middle"}),
            html.B("Critical path"), f" ({cp['segments']:,} segments, {cp['length_s']:.4f} s): the chain of compute gaps, "
            "host time in calls and transfers that determines the run's end, drawn on the rank holding each segment "
            "(docs/findings.md, \"Critical path\"). Hover a segment for its kind, op and length."]


# ---------------------------------------------------------------------------- the app
#: The live refresh callback's outputs and inputs.
_TICK_OUTPUTS = (Output("live-strip", "children"), Output("live-banner", "children"), Output("job-badge", "children"),
                 Output("job-badge", "color"), Output("tick", "disabled"), Output("gen", "data"),
                 Output("overview-body", "children"), Output("timeline", "figure", allow_duplicate=True),
                 Output("views-drawn", "data", allow_duplicate=True), Output("view-findings", "children"),
                 Output("run-summary", "children"), Output("range", "max"), Output("range", "step"))
_TICK_INPUTS = (Input("tick", "n_intervals"), State("gen", "data"), State("window", "data"), State("selected", "data"),
                State("theme-switch", "checked"))
class _State:
    """The data the callbacks serve (swapped whole when a live run is reloaded)."""

    def __init__(self, d: RunData, views):
        self.d, self.views, self.gen = d, views, 0
        self.dark_views: dict = {}  # (id of views, tab) -> the lazy view's content in the dark theme
        self.prev_duration = d.duration_s


def _build_views(d: RunData):
    """One worker builds the lazy views in the order of their tabs while the server answers the
    first page; a view shown before its turn waits."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="commtrace-views")
    built = {tab: pool.submit(_lazy_content, d, tab) for tab in LAZY}
    pool.shutdown(wait=False)
    return built


class _Dash(dash.Dash):
    """Dash whose first response carries the static overview (`prerender`) before the element
    React renders into, and whose scripts start after it was painted (:data:`LOADER_JS`): the
    job's answer is on screen while the ~5 MB of JavaScript of the live page are evaluated."""

    _commtrace_prerender = None

    def interpolate_index(self, **kw):
        if self._commtrace_prerender is not None:
            kw = dict(kw, **_after_first_paint(kw["scripts"], kw["renderer"]))
            kw["css"] = kw["css"] + kw.pop("preload", "")
        page = super().interpolate_index(**kw)
        if self._commtrace_prerender is None:
            return page
        entry = '<div id="react-entry-point">'
        return page.replace(entry, self._commtrace_prerender() + entry, 1)


#: Starts the page's scripts once the static overview has been painted (after the next frame);
#: until then they are only fetched (preload links). As parser-blocking tags, on a busy machine
#: Chromium evaluated them before its first paint, and the static overview showed 1-7 s late.
LOADER_JS = """
(function () {
  function run() {
    var tags = Array.prototype.slice.call(document.querySelectorAll('script[type="commtrace/deferred"]'));
    var last = null;
    tags.forEach(function (t) {
      var s = document.createElement('script');
      s.src = t.getAttribute('src');
      s.async = false;
      document.body.appendChild(s);
      last = s;
    });
    // Dash's own renderer line, run in the global scope as the inline script was
    var start = function () { (0, eval)(document.getElementById('_dash-renderer').text); };
    if (last) { last.addEventListener('load', start); last.addEventListener('error', start); } else { start(); }
  }
  if (document.visibilityState === 'hidden') { run(); }
  else { requestAnimationFrame(function () { setTimeout(run, 0); }); }
})();
"""


def _after_first_paint(scripts: str, renderer: str) -> dict:
    """Dash's script tags made inert (`commtrace/deferred`) and started by :data:`LOADER_JS`;
    unchanged when a tag is not a plain `<script src="...">` (the loader would not know it)."""
    tags = re.findall(r"<script\b[^>]*\bsrc=[^>]*>", scripts)
    if not tags or any(not re.fullmatch(r'<script src="[^"]+">', t) for t in tags):
        return {}
    inert = scripts.replace('<script src="', '<script type="commtrace/deferred" src="')
    runner = renderer.replace('type="application/javascript"', 'type="commtrace/deferred-inline"')
    if runner == renderer:
        return {}
    preload = "".join(f'<link rel="preload" as="script" href="{src}">' for src in re.findall(r'<script src="([^"]+)">', scripts))
    return {"scripts": inert, "renderer": runner + f"<script>{LOADER_JS}</script>", "preload": preload}


def create_app(d: RunData, other: RunData | None = None, live: bool | None = None, loader=None) -> dash.Dash:
    """A Dash app serving the views of `d` (see docs/dashboard.md); with `other`, a Compare page
    (the diff's deltas and both overviews). `live` (default: the job is running) refreshes the
    page every :data:`LIVE_MS` from the run directory, reloading it with `loader(path)` when a
    rank wrote a new part."""
    bundle = cartesian_bundle()
    # Not eager_loading: with it Dash also loads every component's lazy chunks (MathJax 2 MB,
    # Markdown, date pickers, and plotly's full bundle as well) before the first page can draw.
    app = _Dash(__name__, title=f"commtrace: {d.run.path}", update_title=None, assets_folder=ASSETS,
                assets_ignore="" if bundle else r"plotly-cartesian-.*")
    app._commtrace_plotly = f"cartesian {bundle}" if bundle else "full"  # for tests
    S = _State(d, _build_views(d))
    app._commtrace_state = S
    app._commtrace_data = d  # for the benchmark and tests
    app._commtrace_views = S.views  # for tests
    if live is None:  # from the files as they are now (not as loaded: a load can take seconds)
        live = _live_status(d)["job"]["state"] == "running"
    pages = PAGES + ([("compare", "Compare")] if other is not None else [])
    views = [v for v, _ in pages]
    diff = None
    if other is not None:
        from ..export.diff import diff_runs
        diff = diff_runs(d.run, other.run)
        app._commtrace_diff = diff
    layouts: dict = {}

    def page():
        """The page of the current data (rebuilt once per reload of a live run), with the live
        strip of the moment when the job runs."""
        d = S.d
        st = _live_status(d) if live else None
        running = bool(st) and st["job"]["state"] == "running"
        dark = _request_dark()
        key = (S.gen, running, dark)
        if key not in layouts:
            for k in [k for k in layouts if k[:2] != key[:2]]:
                del layouts[k]
            layouts[key] = _page(d, other, diff, pages, running, st["job"] if st else None, dark)
        lay = layouts[key]
        if running:  # the live parts of the moment
            lay = _with_live(lay, st)
        return lay

    app.layout = page
    prerendered: dict = {}

    def prerender() -> str:
        """The static overview for the first response (`prerender.overview_html`), of the data
        and job state the page's layout shows, in the request's theme."""
        d = S.d
        st = _live_status(d) if live else None
        ov = d.overview if st is None else dict(d.overview, job=st["job"])
        dark = _request_dark()
        key = (S.gen, ov["job"].get("state"), ov["job"].get("detail"), dark)
        if key not in prerendered:
            prerendered.clear()
            sf, hf = F.steps_figure(ov), F.health_figure(ov)
            from .prerender import overview_html
            prerendered[key] = overview_html(ov, d, pages, dark, SEVERITY_MANTINE, sf.layout.height if sf is not None else None,
                                             hf.layout.height, hf.layout.margin.b, _partial_texts(d),
                                             preload=[app.get_relative_path(f"/_dash-component-suites/{c}") for c in PRELOAD_CHUNKS])
        return prerendered[key]

    app._commtrace_prerender = prerender
    # Only a zoom of the plot goes to the server: Plotly also reports an autosize (when the
    # timeline is first shown, the page's scroll bar appears) and the theme toggle's re-colouring
    # as relayoutData, and each cost a round trip beside the figure's.
    app.clientside_callback(ZOOM_JS, Output("zoom", "data"), Input("timeline", "relayoutData"), prevent_initial_call=True)
    app.clientside_callback(THEME_JS, Output("provider", "forceColorScheme"), Input("theme-switch", "checked"),
                            State("theme-colors", "data"), prevent_initial_call=True)
    app.clientside_callback(SORT_JS, Output({"type": "sort-body", "table": MATCH}, "children"),
                            Output({"type": "sort-rows", "table": MATCH}, "data"),
                            Output({"type": "sort-th", "table": MATCH, "col": ALL}, "children"),
                            Input({"type": "sort-th", "table": MATCH, "col": ALL}, "n_clicks"),
                            State({"type": "sort-rows", "table": MATCH}, "data"), prevent_initial_call=True)
    app._commtrace_page = page  # for tests
    page()  # built now, not on the first request

    @app.callback(*[Output(f"view-{v}", "style") for v in views], *[Output(f"view-{v}", "children") for v in LAZY],
                  Output("timeline", "figure", allow_duplicate=True), Output("mode-info", "children", allow_duplicate=True),
                  Output("views-drawn", "data"), Input("tabs", "value"), State("views-drawn", "data"),
                  State("window", "data"), State("selected", "data"), State("theme-switch", "checked"),
                  prevent_initial_call=True)
    def show_view(tab, drawn, win=None, sel=None, dark=False):
        """Show one view; build a lazy view's figures the first time only (then it is a style
        change). The timeline is drawn the first time it is shown, unless an action that showed
        it (a finding, a card) drew it already: the first page is the overview, and a plot drawn
        hidden would cost the first paint its drawing."""
        drawn = list(drawn or [])
        styles = [{} if v == tab else HIDDEN for v in views]
        children = [dash.no_update] * len(LAZY)
        fig = mode = dash.no_update
        if tab in LAZY and tab not in drawn:
            children[LAZY.index(tab)] = _lazy_themed(tab, bool(dark))
            drawn.append(tab)
        if tab == "timeline" and "timeline" not in drawn:
            d = S.d
            w = win or {"a": 0.0, "b": d.duration_s}
            fig, _, mode, _ = draw(d, w, sel, dark)
            drawn.append("timeline")
        return (*styles, *children, fig, mode, drawn)

    app._commtrace_show_view = show_view  # for tests

    def _lazy_themed(tab, dark):
        """A lazy view's content in the theme (dark: a themed copy, made once per build)."""
        kids = S.views[tab].result()
        if not dark:
            return kids
        key = (id(S.views), tab)
        if key not in S.dark_views:
            import copy
            S.dark_views[key] = _themed_tree(copy.deepcopy(kids), True)
        return S.dark_views[key]
    no = dash.no_update

    # One callback for everything that changes the timeline: a zoom on the plot, the range slider,
    # reset, a finding (its row or its card), a click on an op. One round trip per interaction,
    # and the slider follows the plot: an output that is also an input of the same callback does
    # not fire it again.
    @app.callback(Output("timeline", "figure"), Output("range", "value"), Output("window", "data"),
                  Output("selected", "data"), Output("tabs", "value"), Output("mode-info", "children"),
                  Output("selection-info", "children"), Output("views-drawn", "data", allow_duplicate=True),
                  Input("zoom", "data"), Input("range", "value"), Input("reset", "n_clicks"),
                  Input({"type": "findings-grid", "i": ALL}, "cellClicked"), Input("timeline", "clickData"),
                  Input({"type": "show-finding", "i": ALL}, "n_clicks"),
                  State("window", "data"), State("selected", "data"), State("views-drawn", "data"),
                  State("theme-switch", "checked"), prevent_initial_call=True)
    def timeline(relayout, rng, _reset, cells, click, shows, win, sel, drawn, dark=False):
        trig = dash.ctx.triggered_id
        if isinstance(trig, dict) and trig.get("type") == "findings-grid":  # a row of the findings table
            cell = next((c for c in cells or [] if c), None)
            if cell is None:
                raise dash.exceptions.PreventUpdate
            return update("findings.cellClicked", relayout, rng, cell, click, win, sel, drawn, dark)
        if isinstance(trig, dict):  # a card's "show on timeline"
            if not any(shows or []):
                raise dash.exceptions.PreventUpdate
            return update("show-finding", relayout, rng, {"i": trig["i"]}, click, win, sel, drawn, dark)
        prop = dash.ctx.triggered[0]["prop_id"]
        if prop == "zoom.data":  # the plot's zoom (relayoutData, filtered in the browser)
            prop = "timeline.relayoutData"
        return update(prop, relayout, rng, None, click, win, sel, drawn, dark)

    def update(prop, relayout, rng, cell, click, win, sel, drawn=None, dark=False):
        """The timeline callback's outputs for the input `prop` ("timeline.relayoutData", ...)."""
        d = S.d
        win = win or {"a": 0.0, "b": d.duration_s}
        new_win, new_sel, tab = _window_input(d, prop, relayout, rng, cell, click, win, sel)
        if new_win is None and new_sel is no:
            raise dash.exceptions.PreventUpdate
        w = new_win or win
        s = sel if new_sel is no else new_sel
        fig, slider, mode, info = draw(d, w, s, dark)
        drawn = list(drawn or [])
        new_drawn = no if "timeline" in drawn else drawn + ["timeline"]
        return fig, slider, w, new_sel, tab, mode, info, new_drawn

    def _window_input(d, prop, relayout, rng, cell, click, win, sel):
        """(new window or None, new selection or no_update, tab or no_update) for an input."""
        trig = prop.split(".")[0]
        full = {"a": 0.0, "b": d.duration_s}
        if trig == "reset":
            return full, no, no
        if trig == "range" and rng:
            a, b = float(rng[0]), float(rng[1])
            # the slider snapping a value we set to its step: not a new zoom
            if abs(a - win["a"]) <= d.slider_step and abs(b - win["b"]) <= d.slider_step:
                return None, no, no
            return {"a": a, "b": b}, no, no
        if trig in ("findings", "show-finding") and cell:
            i = cell.get("i")
            if i is None:
                i = (cell.get("rowId") if cell.get("rowId") is not None else cell.get("rowIndex"))
            if i is None or not (0 <= int(i) < len(d.findings)):
                return None, no, no
            from ..analysis.overview import evidence
            ev = evidence(d.run, d.findings[int(i)])
            a, b = F.window_for_evidence(d, ev)
            new_sel = {"pg": ev["pg"], "seq": ev["seq"]} if ev["pg"] is not None and ev["seq"] is not None else no
            return {"a": a, "b": b}, new_sel, "timeline"
        if prop == "timeline.clickData":
            s = _selection(d, click)
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

    def _selection(d, click):
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

    def draw(d, win, sel, dark=False):
        """(figure, slider value, mode line, selection line) of a window and selection."""
        fig = F.themed(F.timeline_figure(d, win["a"], win["b"], sel), bool(dark))
        a, b = fig.layout.xaxis.range
        # the slider's value on its own grid, so that it does not snap (and echo) it
        st = d.slider_step
        rng = [max(0.0, st * round(a / st)), min(d.duration_s, st * round(b / st))]
        s = ""
        if sel:
            x = F.selection_info(d, sel["pg"], sel["seq"])
            s = f"selected {x.get('op')} pg {x['pg']} seq {x['seq']} on {len(x['ranks'])} rank(s)"
            if x.get("arrival_skew_ns") is not None:
                s += f" · arrival skew {F.fmt_ns(x['arrival_skew_ns'])} · last rank {x['last_rank']}"
        return fig, rng, _mode_info(fig.layout.meta["mode"], a, b), s

    app._commtrace_update = update  # for tests

    # ------------------------------------------------------------------ live
    reload = {"busy": False, "sig": None, "t": 0.0}
    lock = threading.Lock()

    def _maybe_reload(poll, ended):
        """Reload the run in a thread when a rank wrote a new part (or the job ended)."""
        sig = poll["parts"]
        if reload["sig"] is None:
            reload["sig"] = sig
        with lock:
            final = ended and not reload.get("final")
            if reload["busy"] or (sig == reload["sig"] and not final) or time.monotonic() - reload["t"] < 1.5:
                return
            reload["busy"], reload["sig"], reload["t"] = True, sig, time.monotonic()
            if ended:
                reload["final"] = True

        def work():
            try:
                from ..analysis.run import load
                run = (loader or load)(str(S.d.run.path))
                nd = RunData(run, nbins=S.d.nbins)
                S.views = _build_views(nd)
                S.d = nd
                S.gen += 1
            except Exception:  # noqa: BLE001 - a part being written: the next tick retries
                reload["sig"], reload["final"] = None, False
            finally:
                reload["busy"] = False
        threading.Thread(target=work, daemon=True, name="commtrace-reload").start()

    app._commtrace_reload = reload

    def tick(_n, gen, win, sel, dark=False):
        """Every LIVE_MS while the job runs: the live strip and banners from the latest snapshots;
        when a reload finished, the overview, the timeline (same zoom and selection) and the
        findings from the new data; when the job ended, a last reload and the refresh stops."""
        from ..format.reader import poll_run
        d = S.d
        poll = poll_run(str(d.run.path))
        st = _live_status(d, poll)
        ended = st["job"]["state"] != "running"
        _maybe_reload(poll, ended)
        fresh = S.gen != gen
        d = S.d
        banner = [b for b in (hang_alert(st), ended_alert(st["job"], True)) if b is not None]
        job = st["job"]
        out_ov = out_fig = out_drawn = out_find = out_sum = out_max = out_step = no
        if fresh:
            out_max, out_step = d.duration_s, d.slider_step
            out_ov = _themed_tree(overview_children(d.overview, d), bool(dark))
            w = win or {"a": 0.0, "b": d.duration_s}
            if w["b"] >= S.prev_duration - 1e-9:
                w = {"a": w["a"], "b": d.duration_s}  # it showed the end of the run: follow it
            out_fig = F.themed(F.timeline_figure(d, w["a"], w["b"], sel), bool(dark))
            out_drawn = []
            out_find = _findings_view(d)
            out_sum = f"world size {d.run.world_size} · {d.report['ops']:,} ops · {len(d.findings)} findings"
        S.prev_duration = d.duration_s
        stop = ended and not reload["busy"] and not fresh and S.gen == gen
        return (live_children(st), banner, f"job {job['state']}", STATE_COLOR.get(job["state"], "gray"), stop,
                S.gen, out_ov, out_fig, out_drawn, out_find, out_sum, out_max, out_step)

    app.callback(*_TICK_OUTPUTS, *_TICK_INPUTS, prevent_initial_call=True)(tick)
    app._commtrace_tick = tick  # the undecorated function: the benchmark times it
    return app


def _page(d: RunData, other, diff, pages, running: bool, job: dict | None = None, dark: bool = False):
    """The layout of the app for `d` (and the compare page with `other`); `job`: the job state
    read just now (live), else the one loaded with the run; `dark`: in the dark theme."""
    first = F.empty_timeline(d)  # drawn when first shown (show_view)
    rep = d.report
    ov = d.overview if job is None else dict(d.overview, job=job)
    header = dmc.Group(justify="space-between", children=[
        dmc.Group([dmc.Title("commtrace", order=3), job_badge(ov["job"], "job-badge"),
                   dmc.Text(f"{d.run.path}", size="sm", c="dimmed", id="run-path")], gap="sm"),
        dmc.Group([dmc.Text(f"world size {d.run.world_size} · {rep['ops']:,} ops · {len(d.findings)} findings",
                            size="sm", id="run-summary"),
                   dmc.Switch(id="theme-switch", label="dark", checked=dark, size="sm")], gap="lg")])
    lay = dmc.MantineProvider(id="provider", forceColorScheme="dark" if dark else "light", children=html.Div(style={"margin": "6px 14px"}, children=[
        header,
        _partial_banner(d),
        html.Div(id="live-banner", children=[]),
        dmc.Tabs(id="tabs", value="overview", children=[dmc.TabsList([dmc.TabsTab(l, value=v) for v, l in pages])],
                 mb="xs"),
        dcc.Store(id="window", data={"a": 0.0, "b": d.duration_s}),
        dcc.Store(id="selected", data=None),
        dcc.Store(id="views-drawn", data=[]),
        dcc.Store(id="gen", data=0),
        dcc.Store(id="zoom", data={}),
        dcc.Store(id="theme-colors", data=F.THEME_COLORS),
        dcc.Interval(id="tick", interval=LIVE_MS, disabled=not running),
        html.Div(id="view-overview", children=[
            html.Div(id="live-strip", children=[]),
            html.Div(id="overview-body", children=overview_children(ov, d))]),
        html.Div(id="view-timeline", style=HIDDEN, children=[
            dmc.Group(gap="md", mb=4, children=[
                dmc.Button("Reset zoom", id="reset", size="xs", variant="default"),
                html.Span(id="mode-info", children="",
                          style={"fontSize": 13}),
                html.Span(id="selection-info", style={"fontWeight": "bold", "fontSize": 13})]),
            dcc.RangeSlider(id="range", min=0, max=d.duration_s, value=[0, d.duration_s], step=d.slider_step,
                            marks=None, allowCross=False, tooltip={"placement": "bottom", "always_visible": False},
                            updatemode="mouseup", allow_direct_input=False),
            _graph("timeline", first, config={"scrollZoom": False}),
            _legend(d)]),
        *[html.Div(id=f"view-{v}", style=HIDDEN) for v in LAZY],
        # Findings live in the layout (hidden unless their tab) so that their table can be an Input.
        *([html.Div(id="view-compare", style=HIDDEN, children=compare_children(d, other, diff))] if other is not None else []),
    ]))
    return _themed_tree(lay, dark)


def _with_live(lay, st: dict):
    """`lay` with the live strip and hang banner of `st` (the cached layout is not changed)."""
    import copy
    lay = copy.copy(lay)
    root = copy.copy(lay.children)
    lay.children = root
    kids = list(root.children)
    root.children = kids
    for k, c in enumerate(kids):
        if getattr(c, "id", None) == "live-banner":
            kids[k] = html.Div(id="live-banner", children=[b for b in (hang_alert(st),) if b is not None])
        elif getattr(c, "id", None) == "view-overview":
            ov = copy.copy(c)
            ov.children = [html.Div(id="live-strip", children=live_children(st)), c.children[1]]
            kids[k] = ov
    return lay


def _findings_view(d: RunData):
    """The Findings page: a table of every finding (an AG Grid inside the div `#findings`; the
    grid's own id is a pattern, {"type": "findings-grid"}, so that the timeline callback can take
    its clicks while the page is not built yet: it is built the first time it is shown)."""
    rows = F.findings_rows(d)
    return [dmc.Text("Click a finding to zoom the timeline to its evidence.", size="sm") if rows else
            _empty("No findings in this run: nothing stood out (docs/findings.md lists every check).", "findings-empty"),
            html.Div(id="findings", children=_grid({"type": "findings-grid", "i": 0}, rows, [("severity", "severity", {"maxWidth": 110}), ("kind", "kind"), ("rank", "rank", {"maxWidth": 80}),
                                     ("pg", "pg", {"maxWidth": 70}), ("seq", "seq", {"maxWidth": 80}), ("op", "op"),
                                     ("site", "site"), ("impact", "impact", {"maxWidth": 110}),
                                     ("message", "message", {"flex": 4, "minWidth": 300})],
                  getRowId="params.data.rid", height=min(60 + 60 * len(rows), 700),
                  rowClassRules={f"sev-{k}": f"params.data.severity == '{k}'" for k in F.SEVERITY_COLOR}))]


def _live_status(d: RunData, poll: dict | None = None) -> dict:
    from ..analysis.overview import live_status
    from ..format.reader import poll_run
    return live_status(d.run, poll if poll is not None else poll_run(str(d.run.path)))


def build(run, nbins: int = 400, compare=None, live: bool | None = None) -> dash.Dash:
    """The Dash app for a loaded :class:`commtrace.analysis.run.Run` (derived tables cached);
    `compare`: a second loaded run for the Compare page."""
    other = RunData(compare, nbins=nbins) if compare is not None else None
    return create_app(RunData(run, nbins=nbins), other, live=live)
