"""The overview as static HTML, sent in the page's first HTTP response (in place of Dash's
"Loading..."), so that the job's answer is on screen before the browser has evaluated the ~5 MB
of JavaScript of the live page (React, Dash, Mantine, Plotly).

It says what the live overview says, from the same overview dict (the report JSON's ``overview``
key) through the same formatting (`overview`): job state, world size, duration, steps, the
headline fractions, the top finding cards, the per-rank health strip and table. Its element ids
are the live ones prefixed with ``pre-``. It is styled (assets/commtrace.css, ``ct-`` classes) to
match the live page's Mantine theme, light or dark, so that the swap is not seen as a jump: the
live page is laid out behind it (invisible) and a small script removes the static one once React
has drawn the overview and its plots, then marks ``commtrace:interactive`` (performance.mark).
The health strip is drawn with HTML boxes from the overview's per-rank numbers; the per-step
chart is a box of its size until Plotly draws it."""

from __future__ import annotations

import math
from html import escape

from . import overview as OV

#: Mantine's filled colours of a badge (light, dark) per colour name.
BADGE = {"green": ("#40c057", "#2f9e44"), "blue": ("#228be6", "#1971c2"), "orange": ("#fd7e14", "#e8590c"),
         "red": ("#fa5252", "#e03131"), "gray": ("#868e96", "#343a40"), "yellow": ("#fab005", "#f08c00")}
#: What `performance.getEntriesByType("element")` names the static overview's numbers, cards and
#: health strip (Element Timing): the benchmark's first meaningful paint is the last of them.
ELEMENT_TIMING = "ct-overview"
#: Removes the static overview once React has drawn the live one (every plot of #overview-body
#: has its SVG); until then the live page is laid out invisible behind it (commtrace.css:
#: `#ct-pre ~ #react-entry-point`).
SWAP_JS = """
(function () {
  var pre = document.getElementById('ct-pre');
  function ready() {
    var body = document.querySelector('#react-entry-point #overview-body');
    if (!body || !body.firstElementChild) { return false; }
    var graphs = body.querySelectorAll('.dash-graph');
    for (var i = 0; i < graphs.length; i++) { if (!graphs[i].querySelector('.main-svg')) { return false; } }
    return true;
  }
  var obs = new MutationObserver(function () {
    if (!ready()) { return; }
    obs.disconnect();
    requestAnimationFrame(function () {
      var later = (pre.getAttribute('data-preload') || '').split(' ').filter(Boolean);
      pre.remove();
      performance.mark('commtrace:interactive');
      // the lazy chunks of the other pages (AG Grid's), evaluated when the page is idle rather
      // than on the first click that needs them; webpack then finds them installed
      (window.requestIdleCallback || setTimeout)(function () {
        later.forEach(function (src) {
          if (document.querySelector('script[src$="' + src.split('/').pop() + '"]')) { return; }
          var s = document.createElement('script');
          s.src = src;
          document.head.appendChild(s);
        });
      }, {timeout: 3000});
    });
  });
  obs.observe(document.body, {childList: true, subtree: true});
})();
"""


def _e(v) -> str:
    return escape("" if v is None else str(v))


def _badge(text: str, color: str, dark: bool, cls: str = "ct-badge", id_: str | None = None) -> str:
    bg = BADGE.get(color, BADGE["gray"])[1 if dark else 0]
    idattr = f' id="{id_}"' if id_ else ""
    return f'<span class="{cls}"{idattr} style="background:{bg}">{_e(text)}</span>'


def _md(text: str) -> str:
    return "".join(f"<code>{_e(p)}</code>" if code else _e(p) for code, p in OV.md_parts(text))


def _card(c: dict, dark: bool, severity_color: dict) -> str:
    facts = "".join(f'<tr><th>{_e(k)}</th><td class="card-{cls}">{_e(v)}</td></tr>' for k, v, cls in OV.card_facts(c))
    return (f'<div class="ct-card" data-kind="{_e(c["kind"])}" data-rank="{_e(c.get("rank"))}">'
            f'<div class="ct-group ct-gap-xs">{_badge(c["severity"], severity_color.get(c["severity"], "gray"), dark, "ct-badge ct-badge-sm")}'
            f'<span class="ct-card-title" elementtiming="{ELEMENT_TIMING}">{_e(c["title"])}</span>'
            f'<code class="ct-code">{_e(c["kind"])}</code></div>'
            f'<p class="ct-sm">{_e(c["meaning"])}</p><p class="ct-sm ct-dim">{_e(c["message"])}</p>'
            f'<table class="ct-facts"><tbody>{facts}</tbody></table>'
            f'<p class="ct-sm"><b>Fix: </b>{_md(c["fix"])}</p>'
            f'<span class="ct-button">Show on timeline</span></div>')


def nice_top(v: float) -> float:
    """The smallest 1/2/5 x 10^k at or above `v` (the health strip's y axis)."""
    if not v or v <= 0 or not math.isfinite(v):
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    return next(m * e for m in (1, 2, 5, 10) if m * e >= v)


def _health(ov: dict, height: int, bottom: int) -> str:
    """Per rank: wait and exposed time as bars (the colours of figures.health_figure), the ranks a
    finding names in red, each rank's label under its bars (upright for more than 16 ranks)."""
    h = ov["health"]
    many = len(h) > 16
    top = nice_top(max([r["wait_s"] or 0.0 for r in h] + [r["exposed_s"] or 0.0 for r in h] + [0.0]))
    cols = []
    for r, shown in zip(h, OV.health_rows(ov)):
        f = bool(r["flag"])
        w, x = (r["wait_s"] or 0.0) / top * 100, (r["exposed_s"] or 0.0) / top * 100
        label = f"rank {r['rank']}" + (f" <b>{_e(r['flag'])}</b>" if f else "")
        cols.append(f'<div class="ct-hcol" title="rank {r["rank"]}: wait {OV.cell_text(shown["wait_s"])} s, '
                    f'exposed comm {OV.cell_text(shown["exposed_s"])} s">'
                    f'<div class="ct-hbars"><i style="height:{w:.2f}%;background:{"#d62728" if f else "#f4a582"}"></i>'
                    f'<i style="height:{x:.2f}%;background:{"#7f0000" if f else "#92c5de"}"></i></div>'
                    f'<div class="ct-hlabel{" ct-upright" if many else ""}" style="height:{bottom - 6}px">{label}</div></div>')
    legend = "".join(f'<span><i style="background:{c}"></i>{_e(n)}</span>' for n, c in (
        ("wait (s)", "#f4a582"), ("exposed comm (s)", "#92c5de"), ("rank named by a finding (wait / exposed)", "#d62728")))
    return (f'<div class="ct-health" id="pre-ov-health" style="height:{height}px">'
            f'<div class="ct-hlegend" elementtiming="{ELEMENT_TIMING}">{legend}</div>'
            f'<div class="ct-hplot" style="bottom:{bottom}px"><span class="ct-ytitle">seconds</span>'
            f'<span class="ct-ytick" style="top:0">{top:g}</span><span class="ct-ytick" style="top:50%">{top / 2:g}</span>'
            f'<span class="ct-ytick" style="top:100%">0</span>{"".join(cols)}</div></div>')


def overview_html(ov: dict, d, pages, dark: bool, severity_color: dict, steps_height: int | None,
                  health_height: int, health_bottom: int, banner: list[str] | None = None,
                  preload: list[str] = ()) -> str:
    """The static page: header, tabs (Overview active) and the overview of `ov` for the RunData
    `d`; `steps_height`: the per-step chart's height (None: the run has no per-step chart);
    `preload`: script URLs to load once the live page is shown and the browser idle."""
    h = ov["headline"]
    job = ov["job"]
    state_color = {"completed": "green", "running": "blue", "interrupted": "orange", "failed": "red"}.get(job.get("state"), "gray")
    rep = d.report
    head = (f'<div class="ct-header"><div class="ct-group ct-gap-sm"><h3>commtrace</h3>{_badge("job " + str(job["state"]), state_color, dark, "ct-badge ct-badge-lg")}'
            f'<span class="ct-sm ct-dim">{_e(d.run.path)}</span></div>'
            f'<div class="ct-group ct-gap-lg"><span class="ct-sm">world size {_e(d.run.world_size)} · {rep["ops"]:,} ops · '
            f'{len(d.findings)} findings</span><span class="ct-sm"><span class="ct-switch"></span>dark</span></div></div>')
    ban = "".join(f"<div>{_e(b)}</div>" for b in banner or [])
    tabs = "".join(f'<span class="ct-tab{" ct-active" if v == "overview" else ""}">{_e(l)}</span>' for v, l in pages)
    stats = "".join(f'<div class="ct-paper"><p class="ct-sm ct-dim">{_e(s["label"])}</p>'
                    f'<p class="ct-stat{" ct-" + s["color"] if s["color"] else ""}" id="pre-ov-{s["key"]}" '
                    f'elementtiming="{ELEMENT_TIMING}">{_e(s["value"])}</p><p class="ct-xs ct-dim">{_e(s["hint"])}</p></div>'
                    for s in OV.stats(ov))
    cards = ("".join(_card(c, dark, severity_color) for c in ov["cards"]) if ov["cards"] else "")
    from .app import STEPS_TITLE, no_findings_text, no_steps_text
    cards_block = (f'<div class="ct-cards" id="pre-cards">{cards}</div>' if cards
                   else f'<div class="ct-empty" elementtiming="{ELEMENT_TIMING}">{_e(no_findings_text(ov))}</div>')
    steps_block = (f'<div class="ct-plot-pending" style="height:{steps_height}px"></div>' if steps_height
                   else f'<div class="ct-empty">{_e(no_steps_text(h["steps"]))}</div>')
    rows = OV.health_rows(ov)
    table = ("<table class=\"ct-table\" id=\"pre-ov-health-table\"><thead><tr>"
             + "".join(f'<th class="col-{f}">{_e(t)}</th>' for f, t in OV.HEALTH_COLUMNS) + "</tr></thead><tbody>"
             + "".join("<tr>" + "".join(f'<td class="col-{f}">{_e(OV.cell_text(r.get(f)))}</td>' for f, _ in OV.HEALTH_COLUMNS)
                       + "</tr>" for r in rows) + "</tbody></table>")
    cap = ' style="max-height:300px"' if len(rows) > 30 else ""
    table = f'<div class="ct-scroll"{cap}>{table}</div>'
    later = f' data-preload="{_e(" ".join(preload))}"' if preload else ""
    return (f'<div id="ct-pre" class="ct-pre{" ct-dark" if dark else ""}" aria-busy="true"{later}>'
            f'<div class="ct-wrap">{head}{f"<div class=ct-banner>{ban}</div>" if ban else ""}<div class="ct-tabs">{tabs}</div>'
            f'<div class="ct-group ct-gap-sm">{_badge("job " + str(job["state"]), state_color, dark, "ct-badge ct-badge-lg", "pre-job-state")}'
            f'<span class="ct-sm ct-dim">{_e(OV.job_line(job))}</span></div>'
            f'<div class="ct-stats">{stats}</div>'
            f'<h4>Top findings</h4>{cards_block}<h4>{_e(STEPS_TITLE)}</h4>{steps_block}'
            f'<h4>Per-rank health</h4>{_health(ov, health_height, health_bottom)}{table}</div>'
            f'<script>{SWAP_JS}</script></div>')
