"""The report dict: the `commtrace report --format json` contract (docs/report.md).

Top-level keys `schema`, `world_size`, `ranks`, `ops`, `per_rank`, `collectives_summary` and
`findings` are the stable contract; the others are additions (never renamed).
"""

from __future__ import annotations

import decimal
import math

from ..trace import schema as S

#: Version of the report's JSON contract (not the trace schema).
REPORT_SCHEMA = 1


def _clean(v):
    """JSON-safe scalars: NaN/inf -> None, numpy -> python."""
    if v is None:
        return None
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, decimal.Decimal):
        v = int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def _rows(table) -> list[dict]:
    return [_clean(r) for r in table.to_pylist()]


def build_report(run, top: int = 10, rank: int | None = None, steps=None, progress=None) -> dict:
    """Assemble the report of `run` (optionally restricted to `steps` = (a, b), half-open, and
    focused on `rank`). `progress(stage, fraction)` is called between stages."""
    def tick(stage, frac):
        if progress:
            progress(stage, frac)

    base = run
    if steps:
        run = run.subset(steps)
    run.start_background()
    tick("matching collectives", 0.1)
    coll_sum = run.collectives_summary()
    tick("wait states and overlap", 0.3)
    per_rank = run.per_rank()
    tick("per step", 0.55)
    per_step = run.per_step()
    tick("findings", 0.7)
    findings = run.findings()
    tick("summaries", 0.9)
    ck = run.clock()
    n_ops = run._sql(f"SELECT count(*) FROM {run._t} WHERE kind = 'op'").fetchone()[0]
    c = run._ensure_coll()
    n_coll = run._sql(f"SELECT count(*) FROM {c}").fetchone()[0]
    w = run._ensure_waits()
    topc = run._arrow(f"""
        SELECT k.pg, k.seq, k.op, k.step, k.bytes, k.site, k.last_rank, k.n_ranks,
               k.arrival_skew_ns / 1e9 AS arrival_skew_s, k.t_comm_ns / 1e9 AS t_comm_s, k.busbw_gbps,
               coalesce(w.total_wait_ns, 0) / 1e9 AS total_wait_s, coalesce(w.max_wait_ns, 0) / 1e9 AS max_wait_s
        FROM {c} k LEFT JOIN (SELECT ckey, sum(wait_ns) AS total_wait_ns, max(wait_ns) AS max_wait_ns
                              FROM {w} GROUP BY ckey) w ON w.ckey = k.ckey
        ORDER BY total_wait_s DESC NULLS LAST, k.pg, k.seq LIMIT {int(max(top, 0))}""")
    sites = run._arrow(f"""
        SELECT k.site, any_value(k.op) AS op, sum(w.n) AS count, sum(w.wait_ns) / 1e9 AS wait_s
        FROM (SELECT ckey, count(*) AS n, sum(wait_ns) AS wait_ns FROM {w} GROUP BY ckey) w
             JOIN {c} k ON k.ckey = w.ckey
        WHERE k.site IS NOT NULL GROUP BY k.site ORDER BY wait_s DESC LIMIT {int(max(top, 0))}""")
    import duckdb
    con = duckdb.connect()
    con.register("ps", per_step)
    steps_summary = con.sql("""
        SELECT step, count(*) AS ranks, sum(ops)::BIGINT AS ops, avg(exposed_s) AS exposed_s_mean,
               max(exposed_s) AS exposed_s_max, avg(wait_s) AS wait_s_mean, max(wait_s) AS wait_s_max,
               avg(inflight_s) AS inflight_s_mean, avg(overlap_ratio) AS overlap_ratio_mean
        FROM ps GROUP BY step ORDER BY step""").to_arrow_table()
    con.close()

    pr_rows = _rows(per_rank)
    fs = [f.to_dict() for f in findings]
    if rank is not None:
        pr_rows = [r for r in pr_rows if r["rank"] == rank]
        fs = [f for f in fs if f["rank"] == rank or rank in (f["evidence"].get("ranks") or [])
              or rank in (f["evidence"].get("culprits") or [])]
    stragglers = [r for r in _rows(run.stragglers())]
    t_span = ((run.t_max_ns or 0) - (run.t_min_ns or 0)) / 1e9 if run.t_min_ns is not None else 0.0
    rep = {
        "schema": REPORT_SCHEMA,
        "world_size": run.world_size,
        "ranks": list(run.ranks),
        "ops": int(n_ops),
        "per_rank": pr_rows,
        "collectives_summary": _rows(coll_sum),
        "findings": _clean(fs),
        # additions
        "trace_schema": S.SCHEMA_VERSION,
        "path": base.path,
        "missing_ranks": list(run.missing_ranks),
        "collectives": int(n_coll),
        "t_min_ns": run.t_min_ns, "t_max_ns": run.t_max_ns, "duration_s": t_span,
        "steps": list(steps) if steps else None,
        "focus_rank": rank,
        "top_collectives": _rows(topc),
        "top_sites": _rows(sites),
        "per_step": _rows(steps_summary),
        "stragglers": stragglers,
        "clock": _clean(ck),
        "last_completed": {str(k): _clean(v) for k, v in run.last_completed().items()},
        "stacks": {str(k): v for k, v in run.stacks().items()},
        "warnings": list(dict.fromkeys(base.warnings + run.warnings)),
        "finding_counts": _count(findings),
    }
    tick("done", 1.0)
    return rep


def _count(findings) -> dict:
    out: dict = {}
    for f in findings:
        out[f.kind] = out.get(f.kind, 0) + 1
    return out
