"""Compare two runs per (op, size bucket) and per finding kind, to show whether a change helped.

Figures follow ``shared/reference/metrics.md``: `t_comm` and `busbw` (nccl-tests) of matched
collectives, averaged per op and power-of-two size bucket; exposed time per op = the part of
each call's host-blocked time (the call, its wait()) during which that op was in flight, summed
over calls and ranks; per run, `exposed_s` of :meth:`Run.per_rank` (HTA's overlap definition:
the union of in-flight time intersected with the union of host-blocked time), summed over ranks.
"""

from __future__ import annotations

import collections


def _bucket(b) -> int:
    b = int(b or 0)
    return 0 if b <= 0 else 1 << (b.bit_length() - 1)


def _label(b: int) -> str:
    for unit, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n:
            return f"{b // n} {unit}"
    return f"{b} B"


def summarize(run) -> dict:
    """The figures `commtrace diff` compares, for one run: `ops` keyed by "op|bucket" (count of
    calls over all ranks, matched collectives, mean t_comm_s, mean busbw_gbps, blocked_s = the
    host-blocked time of those calls, exposed_s = the part of it while the op was in flight),
    `findings` (kind -> count), `totals` (exposed_s,
    inflight_s, blocked_s, wait_s summed over ranks; exposed_after_first_step_s, the exposed time
    of every step but the first; ops; duration_s)."""
    t = run._t
    rows = run._sql(f"""
        SELECT op, CAST(CASE WHEN coalesce(bytes, 0) <= 0 THEN 0 ELSE pow(2, floor(log2(bytes))) END AS BIGINT) AS b,
               count(*), sum(coalesce(t_return_ns - t_enqueue_ns, 0) + coalesce(t_wait_end_ns - t_wait_ns, 0)) / 1e9,
               -- DuckDB's least/greatest skip NULLs: spell the intersections out.
               sum(coalesce(CASE WHEN t_return_ns IS NOT NULL THEN greatest(0,
                       CASE WHEN t_end_ns IS NOT NULL AND t_end_ns < t_return_ns THEN t_end_ns ELSE t_return_ns END
                       - t_enqueue_ns) END, 0)
                   + coalesce(CASE WHEN t_wait_ns IS NOT NULL AND t_wait_end_ns IS NOT NULL THEN greatest(0,
                       CASE WHEN t_end_ns IS NOT NULL AND t_end_ns < t_wait_end_ns THEN t_end_ns ELSE t_wait_end_ns END
                       - CASE WHEN t_wait_ns > t_enqueue_ns THEN t_wait_ns ELSE t_enqueue_ns END) END, 0)) / 1e9
        FROM {t} WHERE kind = 'op' GROUP BY ALL""").fetchall()
    ops: dict[str, dict] = {}
    for op, b, n, blocked, exposed in rows:
        ops[f"{op}|{int(b or 0)}"] = {"op": op, "size_bucket": int(b or 0), "size_label": _label(int(b or 0)),
                                       "calls": int(n), "blocked_s": float(blocked or 0.0),
                                       "exposed_s": float(exposed or 0.0),
                                       "collectives": 0, "t_comm_s": None, "busbw_gbps": None}
    # collectives_summary buckets by S (the bus size); calls above bucket by the per-rank bytes.
    # Per-op rows use the call buckets; collective figures are merged by op over all S buckets
    # that map to that op, weighted by count, when S differs from the per-rank size.
    coll = collections.defaultdict(lambda: [0, 0.0, 0, 0.0, 0])
    for r in run.collectives_summary().to_pylist():
        key = (r["op"], int(r["size_bucket"] or 0))
        acc = coll[key]
        n = int(r["count"] or 0)
        acc[4] += n
        if r["t_comm_s"] is not None:
            acc[0] += n
            acc[1] += r["t_comm_s"] * n
        if r["busbw_gbps"] is not None:
            acc[2] += n
            acc[3] += r["busbw_gbps"] * n
    # map S buckets onto call buckets: match op and the nearest call bucket of that op
    by_op = collections.defaultdict(list)
    for k, v in ops.items():
        by_op[v["op"]].append(v)
    for (op, sb), (nt, st, nb, sbw, n) in coll.items():
        cands = by_op.get(op) or []
        if not cands:
            continue
        tgt = min(cands, key=lambda v: (abs(v["size_bucket"].bit_length() - sb.bit_length()), v["size_bucket"]))
        prev_n = tgt.get("_nt", 0)
        prev_b = tgt.get("_nb", 0)
        tgt["collectives"] += n
        if nt:
            tgt["t_comm_s"] = ((tgt["t_comm_s"] or 0.0) * prev_n + st) / (prev_n + nt)
            tgt["_nt"] = prev_n + nt
        if nb:
            tgt["busbw_gbps"] = ((tgt["busbw_gbps"] or 0.0) * prev_b + sbw) / (prev_b + nb)
            tgt["_nb"] = prev_b + nb
    for v in ops.values():
        v.pop("_nt", None)
        v.pop("_nb", None)
    pr = run.per_rank().to_pylist()
    totals = {k: float(sum((r.get(k) or 0.0) for r in pr)) for k in ("exposed_s", "inflight_s", "blocked_s", "wait_s")}
    # The same without the first step: start-up skew between ranks is absorbed by the first
    # collectives (DDP's construction-time checks, the first broadcast) and counts as exposed
    # there, which says nothing about the overlap of the training loop (warm-up steps are
    # skipped for the same reason by every profiler).
    ps = run.per_step().to_pylist()
    first = min((r["step"] for r in ps if r["step"] is not None), default=None)
    totals["exposed_after_first_step_s"] = float(sum((r.get("exposed_s") or 0.0) for r in ps
                                                     if r["step"] is not None and r["step"] != first))
    totals["ops"] = int(sum(r["ops"] for r in pr))
    totals["duration_s"] = ((run.t_max_ns or 0) - (run.t_min_ns or 0)) / 1e9
    totals["ranks"] = len(run.ranks)
    findings = collections.Counter(f.kind for f in run.findings())
    sev = {}
    for f in run.findings():
        sev.setdefault(f.kind, f.severity)
    return {"path": str(run.path), "ops": ops, "findings": dict(findings), "severity": sev, "totals": totals}


def _delta(a, b):
    if a is None or b is None:
        return None
    return b - a


def _pct(a, b):
    if a is None or b is None or not a:
        return None
    return (b - a) / a


def diff_runs(run_a, run_b) -> dict:
    """The `commtrace diff --format json` dict: `a`, `b` (paths), `totals` (per figure: a, b,
    delta, rel), `ops` (per op and size bucket: calls, collectives, t_comm_s, busbw_gbps,
    exposed_s, blocked_s for a and b, with deltas) and `findings` (per kind: a, b, delta)."""
    sa, sb = summarize(run_a), summarize(run_b)
    totals = {k: {"a": sa["totals"][k], "b": sb["totals"][k], "delta": _delta(sa["totals"][k], sb["totals"][k]),
                  "rel": _pct(sa["totals"][k], sb["totals"][k])} for k in sa["totals"]}
    ops = []
    for key in sorted(set(sa["ops"]) | set(sb["ops"]), key=lambda k: (k.split("|")[0], int(k.split("|")[1]))):
        a, b = sa["ops"].get(key) or {}, sb["ops"].get(key) or {}
        ref = a or b
        row = {"op": ref["op"], "size_bucket": ref["size_bucket"], "size_label": ref["size_label"]}
        for k in ("calls", "collectives", "t_comm_s", "busbw_gbps", "exposed_s", "blocked_s"):
            row[f"{k}_a"], row[f"{k}_b"] = a.get(k), b.get(k)
            row[f"{k}_delta"] = _delta(a.get(k) if a else (0 if k in ("calls", "collectives") else None),
                                       b.get(k) if b else (0 if k in ("calls", "collectives") else None))
        ops.append(row)
    kinds = sorted(set(sa["findings"]) | set(sb["findings"]))
    findings = [{"kind": k, "severity": sa["severity"].get(k) or sb["severity"].get(k),
                 "a": sa["findings"].get(k, 0), "b": sb["findings"].get(k, 0),
                 "delta": sb["findings"].get(k, 0) - sa["findings"].get(k, 0)} for k in kinds]
    return {"a": sa["path"], "b": sb["path"], "totals": totals, "ops": ops, "findings": findings}
