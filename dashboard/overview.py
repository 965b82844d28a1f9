"""What the overview page says, as text: the job line, the headline figures, each finding card's
facts and the per-rank health rows, from the overview dict (`commtrace.analysis.overview`, the
report JSON's ``overview`` key). The live page (`app.overview_children`, Mantine components) and
the static overview sent in the first HTTP response (`prerender`) both format from here, so the
two cannot show different numbers."""

from __future__ import annotations

from ..analysis.findings import fmt_ns

#: Columns of the per-rank health table: (field, header).
HEALTH_COLUMNS = [("rank", "rank"), ("wait_s", "wait (s)"), ("exposed_s", "exposed comm (s)"),
                  ("overlap_ratio", "overlap ratio"), ("flag", "finding")]


def pct(v) -> str:
    """A fraction as a percentage with one decimal ("—" when unknown)."""
    return "—" if v is None else f"{v * 100:.1f}%"


def share_text(share) -> str:
    """A cost's share of the ranks' time, as the card prints it after the cost."""
    if share is None:
        return ""
    if share > 1:  # a hang: the others waited (and may still wait) longer than the trace lasted
        return " (longer than the traced time of all ranks)"
    return f" ({pct(share)} of the ranks' time)"


def job_line(job: dict) -> str:
    """"completed after 12.3 s: exit code 0" (state, time, detail)."""
    end = ""
    if job.get("end_ns") and job.get("start_ns"):
        end = f" after {(job['end_ns'] - job['start_ns']) / 1e9:.1f} s"
    return f"{job['state']}{end}" + (f": {job['detail']}" if job.get("detail") else "")


def error_lines(job: dict) -> list[str]:
    """"ranks 0 and 1: RuntimeError: ..." per distinct exception the ranks exited on (the
    overview's `job.errors`; the text report's lines, analysis.job.error_lines)."""
    from ..analysis.job import error_lines as lines

    return lines(job.get("errors") or [], width=300)


def stats(ov: dict) -> list[dict]:
    """The headline figures: dicts of ``key`` (the element id is ``ov-<key>``), ``label``,
    ``value``, ``color`` (a Mantine colour name or None) and ``hint``."""
    h = ov["headline"]
    w = h["run"]
    counts = ov["finding_counts"]
    return [
        dict(key="world", label="world size", value=str(h["world_size"]), color=None,
             hint=f"{h['ranks']} rank(s) traced" + (f", {len(h['missing_ranks'])} missing" if h["missing_ranks"] else "")),
        dict(key="duration", label="duration", value=f"{h['duration_s']:.3f} s", color=None, hint=""),
        dict(key="steps", label="steps", value=str(h["steps"]) if h["steps"] else "none", color=None,
             hint="" if h["steps"] else "no step markers"),
        dict(key="compute", label="compute", value=pct(w["compute"]), color="green", hint="of the ranks' time"),
        dict(key="exposed", label="exposed comm", value=pct(w["exposed_comm"]), color="orange",
             hint=f"{w['exposed_s']:.4f} s over all ranks"),
        dict(key="wait", label="wait", value=pct(w["wait"]), color="red", hint=f"{w['wait_s']:.4f} s over all ranks"),
        dict(key="overlap", label="overlap ratio", value="—" if w["overlap_ratio"] is None else f"{w['overlap_ratio']:.2f}",
             color=None, hint="overlapped / in-flight comm"),
        dict(key="findings", label="findings", value=str(sum(counts.values())), color=None,
             hint=", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "nothing stood out"),
    ]


def card_facts(c: dict) -> list[tuple[str, str, str]]:
    """A finding card's facts: (label, text, class suffix) for cost, gain, rank, call site and
    the number of findings of its kind."""
    cost = c.get("cost_s")
    cost_line = ("not a time: a correctness problem" if cost is None or c["kind"] in ("use_before_wait", "collective_mismatch")
                 else f"{fmt_ns(cost * 1e9)} lost" + share_text(c.get("share")))
    facts = [("cost", cost_line, "cost")]
    if c.get("gain_s") is not None:
        facts.append(("gain if fixed", fmt_ns(c["gain_s"] * 1e9), "gain"))
    if c.get("rank") is not None:
        facts.append(("rank", str(c["rank"]), "rank"))
    facts.append(("call site", c.get("site") or "unknown (no stack recorded)", "site"))
    if c.get("count", 1) > 1:
        facts.append(("findings of this kind", str(c["count"]), "count"))
    return facts


def md_parts(text: str) -> list[tuple[bool, str]]:
    """A catalogue text's Markdown `code` spans: [(is_code, text)]."""
    return [(bool(i % 2), p) for i, p in enumerate(text.split("`")) if p]


def _r4(v):
    return None if v is None else round(float(v), 4)


def health_rows(ov: dict) -> list[dict]:
    """The per-rank health table's rows (wait and exposed in s to 4 decimals, overlap ratio to 3)."""
    return [{"rank": r["rank"], "wait_s": _r4(r["wait_s"]), "exposed_s": _r4(r["exposed_s"]),
             "overlap_ratio": None if r["overlap_ratio"] is None else round(r["overlap_ratio"], 3),
             "flag": r["flag"] or ""} for r in ov["health"]]


def cell_text(v) -> str:
    """A table cell as shown."""
    return "" if v is None else str(v)
