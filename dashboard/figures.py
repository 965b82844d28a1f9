"""Figure builders: pure functions from a :class:`dashboard.data.RunData` (and a view state) to
plotly figures or table rows. Names follow shared/reference/metrics.md (host-blocked, in-flight,
wait, exposed_comm, overlap ratio, busbw, arrival skew, late_sender / late_receiver).

Large arrays go to plotly as numpy so that plotly sends them as typed binary arrays. Nothing uses
WebGL: a browser without a GPU (software GL) takes seconds to create a WebGL context. The
timeline draws one heatmap image (bins) or one filled polygon per op name (exact ops, one SVG
path each), never one SVG element per op span; plots of many points are reduced to what their
pixels can show."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..analysis.findings import fmt_ns
from ..analysis.overview import evidence
from ..ops import OP_COLORS, OTHER_OP_COLOR

from .data import NS, RunData

#: Ops in the window above which the timeline draws level-of-detail bins instead of exact ops.
EXACT_MAX = 5000
#: Sub-rows per rank: host calls (host-blocked), in-flight, waits and syncs.
SUBROWS = ("host-blocked", "in-flight", "wait / sync")
#: Steps above which the per-step overlap plot draws filled step areas instead of bars.
MAX_STEP_BARS = 300
#: synchronize() bands drawn as shapes at most (beyond that they show in the wait / sync row).
MAX_SYNC_BANDS = 300
#: Ranks up to which the timeline labels each sub-row (beyond, one label per rank).
LABEL_SUBROWS_MAX = 16
#: Critical-path segments in the window up to which each is drawn with its hover (beyond: the
#: line reduced to its pixels).
CRITICAL_EXACT_MAX = 3000
#: The critical path's colour (none of the op colours).
CRITICAL_COLOR = "#f0027f"
#: Ratio axes: round ticks.
RATIO_AXIS = dict(range=[0, 1], tickvals=[0, 0.25, 0.5, 0.75, 1], tickformat=".0%")


def op_color(name) -> str:
    """The fixed colour of a canonical op (commtrace.ops.OP_COLORS), the same in every run."""
    return OP_COLORS.get(str(name), OTHER_OP_COLOR)
SEVERITY_COLOR = {"error": "#d62728", "warning": "#ff7f0e", "info": "#1f77b4"}
#: A one-line legend between the title and the plot, inside a fixed top margin (see `margin`).
TOP_LEGEND = dict(orientation="h", y=1.0, x=0, yanchor="bottom")


#: The plots' colours per page theme (the page's toggle; Mantine's body and text colours), applied
#: by the server to the figures it sends (`themed`) and by the browser to the plots already drawn
#: when the toggle changes (`app.THEME_JS`): the same values both ways. Light is what the figures
#: are built with (Plotly's default template, white backgrounds); dark figures also use Plotly's
#: dark template.
THEME_COLORS = {
    "light": {"layout": {"paper_bgcolor": "white", "plot_bgcolor": "white", "font.color": "#2a3f5f"},
              "axis": {"gridcolor": "white", "linecolor": "white", "zerolinecolor": "white"},  # Plotly's template
              "ink": "black"},
    "dark": {"layout": {"paper_bgcolor": "#242424", "plot_bgcolor": "#2e2e2e", "font.color": "#c9c9c9"},
             "axis": {"gridcolor": "#3b3b3b", "linecolor": "#5c5f66", "zerolinecolor": "#424242"},
             "ink": "#e9ecef"},
}


def themed(fig: go.Figure, dark: bool) -> go.Figure:
    """`fig` in the page's dark theme (in place; a light figure is returned as built): Plotly's
    dark template, the colours of :data:`THEME_COLORS`, and black lines and outlines (the
    overlap ratio, the selection rings) drawn in the theme's ink."""
    if not dark:
        return fig
    c = THEME_COLORS["dark"]
    lay = {"template": "plotly_dark", "paper_bgcolor": c["layout"]["paper_bgcolor"],
           "plot_bgcolor": c["layout"]["plot_bgcolor"], "font": {"color": c["layout"]["font.color"]}}
    fig.update_layout(**lay)
    axes = [k for k in fig.layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))] or ["xaxis", "yaxis"]
    fig.update_layout({ax: c["axis"] for ax in axes})
    for t in fig.data:
        line = getattr(t, "line", None)
        if line is not None and getattr(line, "color", None) == "black":
            t.line.color = c["ink"]
        mk = getattr(t, "marker", None)
        if mk is not None and getattr(mk, "line", None) is not None and mk.line.color == "black":
            t.marker.line.color = c["ink"]
    return fig


def fmt_bytes(n) -> str:
    """1.5 MiB, 12 KiB, 80 B."""
    if n is None:
        return "?"
    n = float(n)
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= f:
            return f"{n / f:.3g} {unit}"
    return f"{int(n)} B"


def _ms(s):
    return "—" if s is None or not np.isfinite(s) else f"{s * 1e3:.3f} ms"


def _rects(a: np.ndarray, b: np.ndarray, y: np.ndarray, half: float = 0.35):
    """x, y arrays of the rectangles [a, b] x [y - half, y + half], NaN-separated, for a filled
    scatter trace (`fill="toself"`) of a few rectangles (selection, synchronize() bands). Plotly
    makes, styles and removes an SVG element per NaN-separated segment on every redraw: many
    rectangles go into one polygon instead (`_span_polygon`)."""
    ok = np.isfinite(a) & np.isfinite(b)
    a, b, y = a[ok], b[ok], y[ok]
    n = len(a)
    x = np.full(5 * n, np.nan)
    yy = np.full(5 * n, np.nan)
    x[0::5], x[1::5], x[2::5], x[3::5] = a, b, b, a
    yy[0::5], yy[1::5], yy[2::5], yy[3::5] = y - half, y - half, y + half, y + half
    return x, yy


def _span_polygon(a: np.ndarray, b: np.ndarray, y: np.ndarray, half: float = 0.35,
                  clip: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """x, y of ONE polygon that fills exactly the rectangles [a, b] x [y - half, y + half] (spans
    with a NaN end dropped; with `clip` = (lo, hi), cut to [lo, hi] and those outside dropped),
    times to 0.1 us (x float64, y float32), for a filled scatter trace (`fill="toself"`).

    The rectangles are joined by ways that enclose no area: per sub-row, from a spine left of the
    plot (outside its clip path) along the empty middle line below the sub-row (y - 0.5, so
    `half` < 0.5) to under each rectangle's corner in turn, up its left edge, around it, down the
    same edge, and at the end of the row back along the middle line to the spine; then along the
    spine to the next sub-row. No way crosses a rectangle's edge: diagonal ways straight to each
    corner did, and the renderer left faint hairlines at some crossings. Overlapping rectangles
    wind the same way, so the nonzero rule fills them.

    Plotly draws it as one SVG path from numeric arrays. Not the alternatives measured (a 64 x
    20,000 synthetic run, 0.2 % zoom): a NaN-separated filled trace or line trace made an SVG
    element per rectangle or segment; a layout-shape path had every number of its path string
    parsed twice (autorange, drawing), ~0.3 s more."""
    ok = np.isfinite(a) & np.isfinite(b)
    a, b, y = _r(a[ok]), _r(b[ok]), y[ok].astype(np.float64)
    if clip is not None:
        a, b = np.maximum(a, _r(clip[0])), np.minimum(b, _r(clip[1]))
        keep = a <= b
        a, b, y = a[keep], b[keep], y[keep]
    n = len(a)
    if not n:
        return np.empty(0), np.empty(0, np.float32)
    o = np.lexsort((a, y))
    a, b, y = a[o], b[o], y[o]
    left = clip[0] if clip is not None else float(a.min())
    width = (clip[1] - clip[0]) if clip is not None else float(b.max() - a.min())
    spine = _r(left - 0.02 * (width or 1.0))
    lo, hi, mid = y - half, y + half, y - 0.5
    # per rectangle: under its corner, corner, around, down its left edge to under the corner
    xs = np.stack([a, a, b, b, a, a], axis=1)
    ys = np.stack([mid, lo, lo, hi, hi, mid], axis=1)
    # per sub-row: from the spine, its rectangles, back to the spine (a point on the spine before
    # the sub-row's first rectangle and after its last, at the sub-row's middle line)
    first = np.flatnonzero(np.r_[True, y[1:] != y[:-1]])
    cut = np.c_[first, np.r_[first[1:], n]].ravel() * 6
    x = np.insert(xs.ravel(), cut, spine)
    yy = np.insert(ys.ravel(), cut, np.repeat(mid[first], 2))
    return x, yy.astype(np.float32)


def margin(l: int, r: int, t: int, b: int) -> dict:
    """Fixed margins, large enough for the figure's legend, colorbar and axis labels.

    With Plotly's default (`autoexpand`), a legend, colorbar or axis label that pushes a margin
    makes Plotly draw the whole figure a second time after the first (`Plots.doAutoMargin`), and
    again whenever what pushes changes (the timeline's colorbar in bins mode, its legend in exact
    mode): one full redraw more per first view and per switch between bins and exact ops."""
    return dict(l=l, r=r, t=t, b=b, autoexpand=False)


def fast_axes(fig: go.Figure) -> go.Figure:
    """Every cartesian axis of `fig` (in place) without automargin and with tick labels allowed
    past the plot: with fixed margins (`margin`) automargin's pushes are ignored anyway, but it
    and the default "hide past div" measure every tick label's box at each drawing (most of the
    overview's drawing time in the first page's profile). The margins are sized so that the
    labels fit (tests/test_dashboard_layout.py checks every text lies inside its plot)."""
    axes = [k for k in fig.layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]
    for ax in axes or ["xaxis", "yaxis"]:
        fig.layout[ax].automargin = False
        fig.layout[ax].ticklabeloverflow = "allow"
    return fig


def _r(x: np.ndarray, digits: int = 7) -> np.ndarray:
    """Times (s) rounded to 0.1 us: what any zoom can show, and shorter JSON."""
    return np.round(x, digits)


def _base_layout(fig: go.Figure, d: RunData, a: float, b: float, mode: str, critical: str = "none") -> go.Figure:
    nr = len(d.ranks)
    if nr <= LABEL_SUBROWS_MAX:
        # every sub-row labelled: "rank 0 host-blocked", "in-flight", "wait / sync"
        tickvals = list(range(nr * 3))
        ticktext = [f"rank {r} · {SUBROWS[0]}" if k == 0 else SUBROWS[k] for r in d.ranks for k in range(3)]
    else:
        tickvals, ticktext = [i * 3 + 1 for i in range(nr)], [f"rank {r}" for r in d.ranks]
    fig.update_layout(
        height=_timeline_height(d),
        margin=margin(l=150, r=80, t=40, b=50),
        # ticklabeloverflow="allow": the default ("hide past div") measures every tick label at
        # each redraw, most of the redraw's time with a row per rank.
        # automargin off (the default template turns it on): with fixed margins its pushes are
        # ignored anyway
        xaxis=dict(range=[a, b], title="time since start of run (s)", showgrid=False, zeroline=False,
                   ticklabeloverflow="allow", automargin=False),
        yaxis=dict(range=[nr * 3 - 0.5, -0.5], tickvals=tickvals, ticktext=ticktext, fixedrange=True, tickfont=dict(size=11), showgrid=False, zeroline=False,
                   ticklabeloverflow="allow", automargin=False),
        dragmode="zoom", hovermode="closest", legend=TOP_LEGEND,
        # meta holds no array: Plotly.react redraws everything when one in the layout changes
        meta={"mode": mode, "critical": critical}, plot_bgcolor="white", uirevision="timeline")
    return fig


def timeline_figure(d: RunData, a: float | None = None, b: float | None = None,
                    selected: dict | None = None, exact_max: int = EXACT_MAX) -> go.Figure:
    """The timeline over [a, b] s: exact ops when at most `exact_max` ops were entered in the
    window, else level-of-detail bins of `Run.timeline_bins`. `selected` = {"pg", "seq"} adds
    the highlight of that collective on every rank. `layout.meta.mode` says which was drawn."""
    a = 0.0 if a is None else max(0.0, float(a))
    b = d.duration_s if b is None else min(d.duration_s, float(b))
    if b <= a:
        b = min(d.duration_s, a + 1e-6)
    exact = d.count_in(a, b) <= exact_max
    fig = go.Figure()
    if exact:
        _exact_traces(fig, d, a, b)
    else:
        _bin_traces(fig, d, a, b)
    crit = _critical_trace(fig, d, a, b)
    _findings_trace(fig, d, a, b)
    if selected and selected.get("pg") is not None and selected.get("seq") is not None:
        _selected_traces(fig, d, selected["pg"], int(selected["seq"]))
    return _base_layout(fig, d, a, b, "exact" if exact else "bins", crit)


def empty_timeline(d: RunData) -> go.Figure:
    """The timeline before it is first shown (`layout.meta.mode` "none"): no data and no axes,
    at the timeline's height. The first page is the overview; the timeline is drawn when first
    shown, and axes here would cost the first page their drawing (a tick label per sub-row)."""
    return go.Figure(layout=dict(height=_timeline_height(d), margin=margin(l=150, r=80, t=40, b=50),
                                 # fixed ranges: an autorange would be reported back as a zoom
                                 xaxis=dict(visible=False, range=[0.0, d.duration_s]),
                                 yaxis=dict(visible=False, range=[len(d.ranks) * 3 - 0.5, -0.5]),
                                 meta={"mode": "none", "critical": "none"}, uirevision="timeline"))


def _timeline_height(d: RunData) -> int:
    nr = len(d.ranks)
    return max(360, min(1400, 60 + nr * 3 * (6 if nr > LABEL_SUBROWS_MAX else 22)))


def _bin_traces(fig: go.Figure, d: RunData, a: float, b: float) -> None:
    t = d.bins(a, b)
    nr, nb = len(d.ranks), d.nbins
    width = (t["t1_ns"].to_numpy() - t["t0_ns"].to_numpy()).astype(np.float64)
    width[width <= 0] = 1.0
    pos = np.array([d.row_of[int(r)] for r in t["rank"].to_numpy()], np.int64)
    binn = t["bin"].to_numpy().astype(np.int64)
    z = np.full((nr * 3, nb), np.nan, np.float32)
    z[pos * 3 + 0, binn] = t["blocked_ns"].to_numpy() / width
    z[pos * 3 + 1, binn] = t["inflight_ns"].to_numpy() / width
    z[pos * 3 + 2, binn] = (t["wait_ns"].to_numpy() + t["sync_ns"].to_numpy()) / width
    x = ((np.arange(nb) + 0.5) * (b - a) / nb + a).astype(np.float64)
    fig.add_trace(go.Heatmap(
        z=z, x=x, y=np.arange(nr * 3), zmin=0, zmax=1, colorscale="Viridis", name="busy fraction",
        colorbar=dict(title="busy<br>fraction", thickness=10, len=0.5, x=1, xpad=6, xanchor="left"),  # in-flight can exceed 1: ops in flight at once
        hovertemplate="t=%{x:.4f} s<br>row %{y}: %{z:.2f} of the bin busy<extra>"
                      "host-blocked / in-flight / wait+sync rows per rank</extra>"))


def _exact_traces(fig: go.Figure, d: RunData, a: float, b: float) -> None:
    """Exact ops in [a, b]: per op, the host-blocked, in-flight and wait spans as rectangles on
    the rank's three sub-rows (one SVG path per op name), and one hover / click marker per op."""
    o = d.o
    idx = d.window(a, b)
    row = o["row"][idx] * 3
    ops = o["op"][idx]
    for k, name in enumerate(o["op_values"]):
        m = ops == k
        if not m.any():
            continue
        j = idx[m]
        r = row[m].astype(np.float64)
        # host-blocked, in-flight and wait spans on the rank's three sub-rows: one filled polygon
        # per op name, before the other traces (selection and markers stay on top)
        x, y = _span_polygon(np.r_[o["t_enqueue"][j], o["t_enqueue"][j], o["t_wait"][j]],
                             np.r_[o["t_return"][j], o["t_end"][j], o["t_wait_end"][j]], np.r_[r, r + 1, r + 2],
                             clip=(a, b))
        fig.add_trace(go.Scatter(x=x, y=y, mode="none", fill="toself", fillcolor=op_color(name),
                                 name=str(name), hoverinfo="skip", hoveron="points", line=dict(simplify=False)))
    if len(idx):
        pgv, sitev, opv = o["pg_values"], o["site_values"], o["op_values"]
        text = [
            f"<b>{opv[o['op'][i]]}</b> rank {o['rank'][i]} pg {pgv[o['pg'][i]] if o['pg'][i] >= 0 else '—'} "
            f"seq {o['seq'][i]}<br>bytes {fmt_bytes(o['bytes'][i])}<br>enqueue {o['t_enqueue'][i]:.6f} s"
            f"<br>host-blocked {_ms(o['t_return'][i] - o['t_enqueue'][i])}"
            f"<br>in-flight {_ms(o['t_end'][i] - o['t_enqueue'][i])}"
            f"<br>wait {_ms(o['t_wait_end'][i] - o['t_wait'][i])}"
            f"<br>site {sitev[o['site'][i]] if o['site'][i] >= 0 else '—'}"
            for i in idx.tolist()]
        # plain lists (Dash hands customdata back in clickData, where a typed array would come
        # back as an object), held in an object array: plotly validates it without walking it
        custom = np.empty(len(idx), dtype=object)
        custom[:] = np.c_[o["pg"][idx], o["seq"][idx], o["rank"][idx]].tolist()
        # Points without markers (mode "none"): they hover and click like markers, and cost no
        # SVG element each (styling thousands of markers was most of the exact view's drawing).
        fig.add_trace(go.Scatter(
            x=_r(o["t_enqueue"][idx]), y=(row + 1).astype(np.float64), mode="none", name="ops (hover / click)",
            hoveron="points", text=text, customdata=custom, hovertemplate="%{text}<extra></extra>", showlegend=False))
    _sync_traces(fig, d, a, b)


def _sync_traces(fig: go.Figure, d: RunData, a: float, b: float) -> None:
    s = d.sync
    m = (s["t_return"] >= a) & (s["t_enqueue"] <= b)
    j = np.flatnonzero(m)
    if len(j):
        r = s["row"][j] * 3.0
        x, y = _rects(s["t_enqueue"][j], s["t_return"][j], r + 2, half=0.45)
        fig.add_trace(go.Scatter(x=_r(x), y=y, mode="none", fill="toself", fillcolor="#d62728",
                                 name="synchronize()", hoverinfo="skip"))
        sitev = s["site_values"]
        fig.add_trace(go.Scatter(
            x=_r(s["t_enqueue"][j]), y=r + 2, mode="markers", showlegend=False, name="synchronize()",
            marker=dict(size=9, color="#d62728", symbol="diamond"),
            text=[f"<b>synchronize()</b> rank {s['rank'][i]}<br>{s['inflight'][i]} op(s) in flight"
                  f"<br>host-blocked {_ms(s['t_return'][i] - s['t_enqueue'][i])}"
                  f"<br>site {sitev[s['site'][i]] if s['site'][i] >= 0 else '—'}" for i in j.tolist()],
            hovertemplate="%{text}<extra></extra>"))
        for i in j[:MAX_SYNC_BANDS].tolist():
            y0 = s["row"][i] * 3 - 0.5
            fig.add_shape(type="rect", x0=s["t_enqueue"][i], x1=s["t_return"][i], y0=y0, y1=y0 + 3,
                          fillcolor="rgba(214,39,40,0.15)", line_width=0, layer="below")
    h = d.hazards
    j = np.flatnonzero((h["t_enqueue"] >= a) & (h["t_enqueue"] <= b))
    if len(j):
        fig.add_trace(go.Scatter(
            x=_r(h["t_enqueue"][j]), y=h["row"][j] * 3.0, mode="markers", name="hazard",
            marker=dict(size=11, color="#d62728", symbol="x"),
            text=[f"<b>hazard</b> {h['api_values'][h['api'][i]] if h['api'][i] >= 0 else ''} rank {h['rank'][i]}"
                  f"<br>site {h['site_values'][h['site'][i]] if h['site'][i] >= 0 else '—'}" for i in j.tolist()],
            hovertemplate="%{text}<extra></extra>"))


def critical_in(d: RunData, a: float, b: float) -> np.ndarray:
    """Indices of the critical path's segments that overlap [a, b] (s); they are in time order
    and follow each other (each starts where the previous ended)."""
    c = d.critical
    if c is None or not len(c["t0"]):
        return np.zeros(0, np.int64)
    lo = np.searchsorted(c["t1"], a, "left")
    hi = np.searchsorted(c["t0"], b, "right")
    return np.arange(lo, max(lo, hi))


def _critical_trace(fig: go.Figure, d: RunData, a: float, b: float) -> str:
    """The critical path (`critical_path.segments`, as in the report) as one line on the rank
    holding each segment (between its host-blocked and in-flight sub-rows), jumping between
    ranks where the path does. Up to :data:`CRITICAL_EXACT_MAX` segments in the window: every
    segment, with its kind, op and length on hover ("segments"); beyond, consecutive segments on
    one rank are joined (the same line) and each pixel column keeps its first, last, top and
    bottom points (the same pixels: "reduced"). Returns the mode drawn ("none": no segment in
    the window; "skipped": the report has no critical path)."""
    c = d.critical
    if c is None:
        return "skipped"
    idx = critical_in(d, a, b)
    idx = idx[c["row"][idx] >= 0]
    if not len(idx):
        return "none"
    t0, t1 = c["t0"][idx], c["t1"][idx]
    y = c["row"][idx] * 3.0 + 0.5  # between host-blocked and in-flight: clicks on ops still hit the ops
    line = dict(color=CRITICAL_COLOR, width=3)
    if len(idx) <= CRITICAL_EXACT_MAX:
        text = []
        for i in idx.tolist():
            what = c["kind"][i]
            if c["op"][i] is not None:
                what += f" · {c['op'][i]} pg {c['pg'][i]} seq {c['seq'][i]}"
            text.append(f"<b>critical path</b>: {what}<br>rank {c['rank'][i]}, {fmt_ns((c['t1'][i] - c['t0'][i]) * NS)}"
                        f" ({c['t0'][i]:.6f}–{c['t1'][i]:.6f} s)"
                        + (f"<br>step {c['step'][i]}" if c["step"][i] is not None else ""))
        fig.add_trace(go.Scatter(x=np.c_[t0, t1].ravel(), y=np.repeat(y, 2), mode="lines", name="critical path",
                                 line=line, text=np.repeat(np.array(text, dtype=object), 2),
                                 hovertemplate="%{text}<extra></extra>"))
        return "segments"
    # join consecutive segments of one rank (the points between them lie on the line)
    start = np.r_[True, y[1:] != y[:-1]]
    end = np.r_[start[1:], True]
    x = np.c_[t0[start], t1[end]].ravel()
    yy = np.repeat(y[start], 2)
    keep = _pixel_extremes(x, yy, a, b, 1600)
    fig.add_trace(go.Scatter(x=_r(x[keep]), y=yy[keep], mode="lines", name="critical path", line=line,
                             hoverinfo="skip"))
    return "reduced"


def _pixel_extremes(x: np.ndarray, y: np.ndarray, a: float, b: float, width: int) -> np.ndarray:
    """Indices of the points of a line that draw the same pixels at `width` columns over [a, b]:
    per column its first, last, lowest and highest point (M4 aggregation), in order."""
    col = np.clip(((x - a) / max(b - a, 1e-12) * width).astype(np.int64), -1, width)
    n = len(x)
    order = np.arange(n)
    brk = np.r_[True, col[1:] != col[:-1]]          # columns are visited in order: runs
    run = np.cumsum(brk) - 1
    first = np.flatnonzero(brk)
    last = np.r_[first[1:] - 1, n - 1]
    keep = np.zeros(n, bool)
    keep[first] = keep[last] = True
    # lowest and highest y of each run
    o = np.lexsort((y, run))
    keep[o[np.r_[first]]] = True                     # lexsort: runs in order, y ascending
    keep[o[np.r_[last]]] = True
    return order[keep]


def _findings_trace(fig: go.Figure, d: RunData, a: float, b: float) -> None:
    xs, ys, cs, text = [], [], [], []
    for f in d.findings:
        if f.t_ns is None:
            continue
        x = (f.t_ns - d.t_min_ns) / NS
        if not (a <= x <= b):
            continue
        rows = [d.row_of[f.rank]] if f.rank in d.row_of else list(range(len(d.ranks)))
        for r in rows[:64]:
            xs.append(x)
            ys.append(r * 3 + 1)
            cs.append(SEVERITY_COLOR.get(f.severity, "#333"))
            text.append(f"<b>{f.severity}: {f.kind}</b><br>{f.message[:200]}")
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="finding",
                                   marker=dict(size=13, color=cs, symbol="triangle-down", line=dict(width=1, color="black")),
                                   text=text, hovertemplate="%{text}<extra></extra>"))


def _selected_traces(fig: go.Figure, d: RunData, pg: str, seq: int) -> None:
    o = d.o
    j = d.copies(pg, seq)
    if not len(j):
        return
    r = o["row"][j] * 3.0
    x, y = _rects(o["t_enqueue"][j], o["t_end"][j], r + 1, half=0.6)
    fig.add_trace(go.Scatter(x=x, y=y, mode="none", fill="toself", fillcolor="rgba(255,215,0,0.9)",
                             name=f"selected pg {pg} seq {seq}", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=o["t_enqueue"][j], y=r + 1, mode="markers", name="selected",
                               showlegend=False, customdata=o["rank"][j].tolist(),
                               marker=dict(size=14, color="rgba(0,0,0,0)", line=dict(width=3, color="black")),
                               hovertemplate="rank %{customdata} entered at %{x:.6f} s<extra>selected</extra>"))


def selection_info(d: RunData, pg: str, seq: int) -> dict:
    """Arrival skew, last rank and per-rank entry of collective (pg, seq), from collectives()."""
    c = d.collective(pg, seq)
    j = d.copies(pg, seq)
    o = d.o
    out = {"pg": pg, "seq": int(seq), "ranks": [int(x) for x in o["rank"][j]],
           "op": o["op_values"][o["op"][j[0]]] if len(j) else None}
    if c:
        out.update(arrival_skew_ns=c["arrival_skew_ns"], last_rank=c["last_rank"], bytes=c["bytes"],
                   busbw_gbps=c["busbw_gbps"], completion_skew_ns=c["completion_skew_ns"])
    return out


def window_for_finding(d: RunData, f) -> tuple[float, float]:
    """The timeline window (s) that shows a finding's evidence (commtrace.analysis.overview.
    evidence: its collective on every rank, a straggler's first late collectives, else its span),
    with a margin of 10 % on each side."""
    return window_for_evidence(d, evidence(d.run, f))


def window_for_evidence(d: RunData, ev: dict) -> tuple[float, float]:
    """The timeline window (s) of an `evidence` dict (t0_ns, t1_ns), padded by 10 %."""
    a = (ev["t0_ns"] - d.t_min_ns) / NS
    b = (ev["t1_ns"] - d.t_min_ns) / NS
    pad = max((b - a) * 0.1, 2e-4)
    return max(0.0, a - pad), min(d.duration_s, b + pad)


# ---------------------------------------------------------------------- other views
def overlap_figures(d: RunData) -> tuple[go.Figure, go.Figure]:
    """(per rank, per step): exposed_comm vs overlapped comm as stacked bars and the overlap
    ratio (metrics.md "Overlap")."""
    pr = d.per_rank
    ranks = [f"rank {r}" for r in pr["rank"].to_pylist()]
    f1 = go.Figure([
        go.Bar(x=ranks, y=pr["exposed_s"].to_numpy(), name="exposed comm (s)", marker_color="#d62728"),
        go.Bar(x=ranks, y=pr["overlapped_s"].to_numpy(), name="overlapped comm (s)", marker_color="#2ca02c"),
        go.Scatter(x=ranks, y=pr["overlap_ratio"].to_numpy(zero_copy_only=False), name="overlap ratio",
                   yaxis="y2", mode="lines+markers", line=dict(color="black"))])
    f1.update_layout(barmode="stack", title="Per rank: exposed vs overlapped communication",
                     yaxis=dict(title="seconds"), yaxis2=dict(title="overlap ratio", overlaying="y", side="right", showgrid=False, **RATIO_AXIS),
                     # a fixed angle, so that the labels of a bar per rank fit the fixed bottom margin
                     xaxis=dict(tickangle=-90 if len(ranks) > 16 else 0),
                     height=400, margin=margin(l=60, r=60, t=80, b=70), legend=TOP_LEGEND)
    ps = d.per_step
    step = ps["step"].to_numpy(zero_copy_only=False)
    ok = np.isfinite(step.astype(np.float64))
    step = step[ok].astype(np.int64)
    ex = np.nan_to_num(ps["exposed_s"].to_numpy(zero_copy_only=False)[ok].astype(np.float64))
    ov = np.nan_to_num(ps["overlapped_s"].to_numpy(zero_copy_only=False)[ok].astype(np.float64))
    steps, inv = np.unique(step, return_inverse=True)
    exs = np.bincount(inv, ex, len(steps))
    ovs = np.bincount(inv, ov, len(steps))
    tot = exs + ovs
    ratio = np.divide(ovs, tot, out=np.full_like(tot, np.nan), where=tot > 0)
    if len(steps) <= MAX_STEP_BARS:
        stack = [go.Bar(x=steps, y=exs, name="exposed comm (s, all ranks)", marker_color="#d62728"),
                 go.Bar(x=steps, y=ovs, name="overlapped comm (s, all ranks)", marker_color="#2ca02c")]
    else:
        # Bars narrower than a pixel: the same stack drawn as two filled step areas (two SVG
        # paths instead of one element per bar and step).
        stack = [go.Scatter(x=steps, y=y, name=name, stackgroup="comm", mode="lines", fillcolor=c,
                            line=dict(shape="hvh", width=0, color=c))
                 for y, name, c in ((exs, "exposed comm (s, all ranks)", "#d62728"),
                                    (ovs, "overlapped comm (s, all ranks)", "#2ca02c"))]
    f2 = go.Figure([*stack, go.Scatter(x=steps, y=ratio, name="overlap ratio", yaxis="y2", mode="lines",
                                       line=dict(color="black", width=1))])
    f2.update_layout(barmode="stack", title="Per step: exposed vs overlapped communication, overlap ratio over the run",
                     xaxis=dict(title="step", tickformat="d", **({"dtick": 1} if len(steps) <= 20 else {})),
                     yaxis=dict(title="seconds"),
                     yaxis2=dict(title="overlap ratio", overlaying="y", side="right", showgrid=False, **RATIO_AXIS),
                     height=380, margin=margin(l=60, r=60, t=80, b=50), legend=TOP_LEGEND)
    return f1, f2


def stalls_figures(d: RunData) -> tuple[go.Figure, go.Figure, list[dict]]:
    """(heatmap ranks x time bins of wait time, straggler ranking, late sender / receiver pairs)."""
    t = d.full_bins
    nr, nb = len(d.ranks), d.nbins
    pos = np.array([d.row_of[int(r)] for r in t["rank"].to_numpy()], np.int64)
    z = np.zeros((nr, nb), np.float32)
    z[pos, t["bin"].to_numpy().astype(np.int64)] = t["wait_ns"].to_numpy() / 1e6
    x = (np.arange(nb) + 0.5) * d.duration_s / nb
    f1 = go.Figure(go.Heatmap(z=z, x=x, y=[f"rank {r}" for r in d.ranks], colorscale="Reds",
                              colorbar=dict(title=dict(text="wait (ms)", side="top"), thickness=12),
                              hovertemplate="%{y}, t=%{x:.3f} s: wait %{z:.3f} ms<extra></extra>"))
    f1.update_layout(title="Wait time (Scalasca wait states) per rank and time bin", xaxis_title="time since start of run (s)",
                     yaxis=dict(autorange="reversed"), height=max(300, 80 + nr * 8), margin=margin(l=70, r=110, t=50, b=50))
    s = d.stragglers
    order = np.argsort(-s["share"].to_numpy(zero_copy_only=False).astype(np.float64))[:20]
    sr = s.take(order)
    f2 = go.Figure([
        go.Bar(x=[f"rank {r}" for r in sr["rank"].to_pylist()], y=sr["share"].to_numpy(zero_copy_only=False),
               name="straggler share (arrived last)", marker_color="#9467bd",
               customdata=np.c_[sr["last_count"].to_numpy(zero_copy_only=False), sr["mean_late_ns"].to_numpy(zero_copy_only=False) / 1e6],
               hovertemplate="%{x}: last at %{customdata[0]} collectives (%{y:.1%}), mean late %{customdata[1]:.3f} ms<extra></extra>")])
    f2.update_layout(title="Straggler ranking (share of collectives arrived last)", yaxis=dict(title="share", tickformat=".0%"),
                     height=320, margin=margin(l=60, r=20, t=50, b=60))
    return f1, f2, late_pairs(d)


def late_pairs(d: RunData, top: int = 20) -> list[dict]:
    """Peer pairs ranked by late_sender + late_receiver time (from p2p())."""
    p = d.p2p
    if not p.num_rows:
        return []
    src = p["src"].to_numpy(zero_copy_only=False).astype(np.int64)
    dst = p["dst"].to_numpy(zero_copy_only=False).astype(np.int64)
    ls = np.nan_to_num(p["late_sender_ns"].to_numpy(zero_copy_only=False).astype(np.float64))
    lr = np.nan_to_num(p["late_receiver_ns"].to_numpy(zero_copy_only=False).astype(np.float64))
    key = src * (1 << 32) + dst
    keys, inv = np.unique(key, return_inverse=True)
    sls, slr = np.bincount(inv, ls), np.bincount(inv, lr)
    n = np.bincount(inv)
    nls, nlr = np.bincount(inv, ls > 0), np.bincount(inv, lr > 0)
    order = np.argsort(-(sls + slr))[:top]
    return [{"src": int(keys[i] >> 32), "dst": int(keys[i] & 0xFFFFFFFF), "transfers": int(n[i]),
             "late_sender": fmt_ns(sls[i]), "late_sender_count": int(nls[i]),
             "late_receiver": fmt_ns(slr[i]), "late_receiver_count": int(nlr[i])}
            for i in order if sls[i] + slr[i] > 0]


def findings_rows(d: RunData) -> list[dict]:
    """The findings table, in the analysis' order (severity, then impact)."""
    return [{"i": i, "rid": str(i), "severity": f.severity, "kind": f.kind, "rank": f.rank, "pg": f.pg, "seq": f.seq,
             "op": f.op, "site": f.site, "impact": fmt_ns(f.impact_ns), "message": f.message}
            for i, f in enumerate(d.findings)]


def _pixel_cells(x: np.ndarray, y: np.ndarray, nx: int, ny: int) -> np.ndarray:
    """Cell of each point in an nx x ny grid over the points' range (one int key per cell):
    one marker per occupied cell is all a plot of about that many pixels can show."""
    def cell(v, n):
        lo, span = (np.min(v), np.ptp(v)) if len(v) else (0.0, 0.0)
        return np.zeros(len(v), np.int64) if span <= 0 else np.minimum((v - lo) / span * n, n - 1).astype(np.int64)
    return cell(x, nx) * (ny + 1) + cell(y, ny)


def bandwidth_figure(d: RunData) -> go.Figure:
    """busbw against message size per op (nccl-tests), log x, one trace per op with the count of
    collectives in its legend entry. Collectives that would land on the same pixel (1200 x 400
    grid over the plot's range) share one marker whose hover gives their number."""
    c = d.collectives
    ops = c["op"].to_pylist()
    byt = c["bytes"].to_numpy(zero_copy_only=False).astype(np.float64)
    bw = c["busbw_gbps"].to_numpy(zero_copy_only=False).astype(np.float64)
    fig = go.Figure()
    opsa = np.array(ops, dtype=object)
    ok = np.isfinite(bw) & (byt > 0)
    cells = np.full(len(bw), -1, np.int64)
    cells[ok] = _pixel_cells(np.log10(byt[ok]), bw[ok], 1200, 400)  # same grid for every op
    for k, name in enumerate(sorted({x for x in ops if x})):
        m = np.flatnonzero((opsa == name) & ok)
        if not len(m):
            continue
        _, first, count = np.unique(cells[m], return_index=True, return_counts=True)
        j = m[first]
        fig.add_trace(go.Scatter(x=byt[j], y=bw[j], mode="markers", name=f"{name} ({len(m)})",
                                 marker=dict(size=5, opacity=0.6, color=op_color(name)),
                                 customdata=count,
                                 hovertemplate="%{x:.3s}B: busbw %{y:.3f} GB/s (%{customdata} collective(s) here)"
                                               "<extra>" + name + "</extra>"))
    fig.update_layout(title="busbw vs message size (each matched collective)", xaxis=dict(type="log", title="message size S (bytes)"),
                      yaxis=dict(title="busbw (GB/s)"), height=420, margin=margin(l=60, r=20, t=80, b=50),
                      legend=TOP_LEGEND)
    return fig


def bandwidth_rows(d: RunData) -> list[dict]:
    """nccl-tests style table from collectives_summary()."""
    s = d.summary.to_pylist()
    f = lambda v, n=3: None if v is None else round(float(v), n)  # noqa: E731
    return [{"pg": r["pg"], "op": r["op"], "size": r["size_label"], "size_bytes": r["size_bucket"], "count": r["count"],
             # t_comm_s is already the mean over the bucket's collectives (collectives_summary)
             "time_us": f(r["t_comm_s"] * 1e6 if r["t_comm_s"] is not None else None, 1),
             "algbw_gbps": f(r["algbw_gbps"]), "busbw_gbps": f(r["busbw_gbps"]),
             "busbw_min": f(r["busbw_min_gbps"]), "busbw_max": f(r["busbw_max_gbps"]), "busbw_std": f(r["busbw_std_gbps"]),
             "incomplete": r["incomplete"]} for r in s]


# ---------------------------------------------------------------------- overview
#: Colours of the headline fractions (compute, exposed comm, wait).
FRACTION_COLORS = {"compute": "#2ca02c", "exposed_comm": "#ff7f0e", "wait": "#d62728"}
FRACTION_NAMES = {"compute": "compute", "exposed_comm": "exposed comm", "wait": "wait"}


def steps_figure(ov: dict) -> go.Figure | None:
    """Per step: compute, exposed comm and wait as stacked fractions of the step time, and the
    overlap ratio (the overview's `headline.per_step`); None without steps."""
    st = ov["headline"]["per_step"]
    if len(st) < 2:  # one bar says nothing a trend could: the headline above says it
        return None
    x = np.array([r["step"] for r in st])
    many = len(st) > MAX_STEP_BARS
    traces = []
    for k in ("compute", "exposed_comm", "wait"):
        y = np.array([np.nan if r[k] is None else r[k] for r in st], np.float64)
        if many:
            traces.append(go.Scatter(x=x, y=y, name=FRACTION_NAMES[k], stackgroup="f", mode="lines",
                                     fillcolor=FRACTION_COLORS[k], line=dict(width=0, shape="hvh", color=FRACTION_COLORS[k]),
                                     hovertemplate="step %{x}: %{y:.1%}<extra>" + FRACTION_NAMES[k] + "</extra>"))
        else:
            traces.append(go.Bar(x=x, y=y, name=FRACTION_NAMES[k], marker_color=FRACTION_COLORS[k],
                                 hovertemplate="step %{x}: %{y:.1%}<extra>" + FRACTION_NAMES[k] + "</extra>"))
    ratio = np.array([np.nan if r["overlap_ratio"] is None else r["overlap_ratio"] for r in st], np.float64)
    traces.append(go.Scatter(x=x, y=ratio, name="overlap ratio", mode="lines+markers" if len(st) <= 60 else "lines",
                             line=dict(color="black", width=1.5), marker=dict(size=5),
                             hovertemplate="step %{x}: overlap ratio %{y:.2f}<extra></extra>"))
    fig = go.Figure(traces)
    fig.update_layout(barmode="stack", height=300, margin=margin(l=60, r=20, t=40, b=45), legend=TOP_LEGEND,
                      xaxis=dict(title="step", tickformat="d", **({"dtick": 1} if len(st) <= 20 else {})),
                      yaxis=dict(title="share of step time", **RATIO_AXIS), plot_bgcolor="white", bargap=0.15)
    return fig


def health_figure(ov: dict) -> go.Figure:
    """Per rank: wait and exposed time (s), ranks named by a finding in red with the finding's
    kind under their label (the overview's `health`)."""
    h = ov["health"]
    many = len(h) > 16
    # few ranks: the finding under the label; many (labels turned upright): after it, in bold
    labels = [f"rank {r['rank']}" + ((f" <b>{r['flag']}</b>" if many else f"<br><b>{r['flag']}</b>") if r["flag"] else "")
              for r in h]
    wait = np.array([r["wait_s"] or 0.0 for r in h])
    exp = np.array([r["exposed_s"] or 0.0 for r in h])
    flagged = [bool(r["flag"]) for r in h]
    fig = go.Figure([
        go.Bar(x=labels, y=wait, name="wait (s)", marker=dict(color=["#d62728" if f else "#f4a582" for f in flagged]),
               hovertemplate="%{x}: wait %{y:.4f} s<extra></extra>", showlegend=False),
        go.Bar(x=labels, y=exp, name="exposed comm (s)", marker=dict(color=["#7f0000" if f else "#92c5de" for f in flagged]),
               hovertemplate="%{x}: exposed comm %{y:.4f} s<extra></extra>", showlegend=False),
        # the legend's swatches (a bar trace shows its first bar's colour, a flagged rank's maybe)
        *[go.Scatter(x=[None], y=[None], mode="markers", name=n, marker=dict(symbol="square", size=11, color=c))
          for n, c in (("wait (s)", "#f4a582"), ("exposed comm (s)", "#92c5de"),
                       ("rank named by a finding (wait / exposed)", "#d62728"))]])
    longest = max((len(f"rank {r['rank']} {r['flag'] or ''}") for r in h), default=6)
    fig.update_layout(barmode="group", height=260 if not many else 200 + 6 * longest,
                      margin=margin(l=60, r=20, t=40, b=70 if not many else 20 + 6 * longest),
                      legend=TOP_LEGEND, yaxis=dict(title="seconds"), plot_bgcolor="white",
                      xaxis=dict(tickangle=-90 if many else 0, showticklabels=True, tickfont=dict(size=9 if many else 12)))
    return fig
