"""The overview of a run: how the job ended, its size, the headline fractions per step, the
per-rank health and the top findings with their meaning, cost and fix; and, for a job still
running, what each rank is in now (the live strip) and which rank has not joined.

Pure functions of a loaded :class:`~commtrace.analysis.run.Run` (and, for the live figures, of
what :func:`commtrace.format.reader.poll_run` read). The dashboard's overview page and the
report's ``overview`` key are both :func:`overview`, so that they cannot disagree. Names follow
``shared/reference/metrics.md``.
"""

from __future__ import annotations

import time

import numpy as np

from .. import ops as OPS
from .catalogue import entry

#: A collective pending this long on some members while another member has not issued it is
#: a hang in the making: the live view names the rank that has not joined.
LIVE_STUCK_NS = 2_000_000_000
#: Findings shown as cards on the overview.
TOP_CARDS = 5
#: Collectives the "show on timeline" window of a straggler covers (its first late ones).
STRAGGLER_WINDOW_COLLECTIVES = 3


def job_state(run, manifest: dict | None = None, snapshots: dict | None = None,
              now_ns: int | None = None, poll: dict | None = None) -> dict:
    """How the job ended (or that it runs): the report's ``job``
    (:func:`commtrace.analysis.job.job_state`, the one source of the verdict) with ``start_ns``,
    ``end_ns`` and ``detail`` (one line) for the overview. With no live data it is
    :meth:`Run.job`; a live view passes what it re-read: `poll`
    (:func:`commtrace.format.reader.poll_run`), or a `manifest` and `snapshots` alone, taken as
    of `now_ns` (:func:`commtrace.analysis.job.from_poll`)."""
    from . import job as J

    if poll is None and (manifest is not None or snapshots is not None):
        poll = {"manifest": manifest or {}, "snapshots": snapshots or {}}
    files = getattr(run, "_files", None)
    if poll is None or files is None:
        j = run.job()  # the same function, on what was loaded
    else:
        files = J.from_poll(files, poll, None if now_ns is None else now_ns / 1e9)
        j = J.job_state(files, run.world_size)
    sess = J.launcher(files) if files is not None else {}
    line = J.describe(j)
    return {"state": j["state"], "exit_code": j["exit_code"],
            "start_ns": run.manifest.get("start_ns") or sess.get("start_ns"),
            "end_ns": sess.get("end_ns") or run.manifest.get("end_ns"),
            "detail": line[len("job: "):].split(" (", 1)[-1].rstrip(")") if "(" in line else "",
            "failed_ranks": j["failed_ranks"], "signal": j["signal"],
            "rank_exit_codes": j.get("rank_exit_codes") or [],
            "errors": J.rank_errors(run.rank_states() if poll is None or files is None
                                    else J.rank_states(files, run.world_size))}


def _step_spans(run):
    """Arrow table (rank, step, t0, t_ns): the step time on that rank, from the step's first event
    to the next step's first event (the last step: to the rank's last event): Run.step_spans()."""
    return run.step_spans()


def _fractions(step_ns: float, exposed_s: float, wait_s: float) -> dict:
    """compute / exposed comm / wait as fractions of `step_ns` (they add up to 1): `wait` is the
    wait-state time inside the exposed communication (a rank blocked in a collective waiting for
    late ranks), `exposed_comm` the rest of the exposed communication (the transfer itself)."""
    t = step_ns / 1e9
    if t <= 0:
        return {"compute": None, "exposed_comm": None, "wait": None}
    ex = min(max(exposed_s, 0.0), t)
    w = min(max(wait_s, 0.0), ex)
    return {"compute": (t - ex) / t, "exposed_comm": (ex - w) / t, "wait": w / t}


def headline(run) -> dict:
    """World size, ranks, duration, steps, and the headline fractions of the time of the ranks:
    ``compute`` (not blocked in communication), ``exposed_comm`` (blocked in communication, the
    transfer) and ``wait`` (blocked waiting for other ranks: the wait states of metrics.md),
    with the overlap ratio, over the whole run (``run``: per_rank() totals over duration x
    ranks) and per step (``per_step``: per_step() summed over ranks, over the step times)."""
    t_span = ((run.t_max_ns or 0) - (run.t_min_ns or 0)) if run.t_min_ns is not None else 0
    pr = run.per_rank().to_pylist()
    tot = {k: float(sum((r.get(k) or 0.0) for r in pr)) for k in ("exposed_s", "wait_s", "inflight_s", "overlapped_s")}
    whole = _fractions(t_span * max(len(pr), 1), tot["exposed_s"], tot["wait_s"])
    whole["overlap_ratio"] = tot["overlapped_s"] / tot["inflight_s"] if tot["inflight_s"] > 0 else None
    whole.update({k: tot[k] for k in tot})
    # per step, summed over ranks (SQL over the two Arrow tables: thousands of steps x ranks)
    import duckdb
    con = duckdb.connect()
    con.register("ps", run.per_step())
    con.register("sp", _step_spans(run))
    agg = con.sql("""
        SELECT ps.step, sum(coalesce(sp.t_ns, 0))::DOUBLE AS t_ns, min(sp.t0) AS t0, count(*) AS ranks,
               sum(coalesce(exposed_s, 0)) AS exposed_s, sum(coalesce(wait_s, 0)) AS wait_s,
               sum(coalesce(inflight_s, 0)) AS inflight_s, sum(coalesce(overlapped_s, 0)) AS overlapped_s
        FROM ps LEFT JOIN sp ON sp.rank = ps.rank AND sp.step = ps.step
        WHERE ps.step IS NOT NULL GROUP BY ps.step ORDER BY ps.step""").fetchall()
    con.close()
    steps = []
    for s_, t_ns, t0, n, ex, w, inf, ov in agg:
        f = _fractions(t_ns, ex, w)
        steps.append({"step": int(s_), "t_s": (t0 - run.t_min_ns) / 1e9 if t0 is not None and run.t_min_ns is not None else None,
                      "step_s": t_ns / 1e9 / max(n, 1), **f,
                      "overlap_ratio": ov / inf if inf > 0 else None, "exposed_s": ex, "wait_s": w})
    return {"world_size": run.world_size, "ranks": len(run.ranks), "missing_ranks": list(run.missing_ranks),
            "duration_s": t_span / 1e9, "steps": len(steps), "run": whole, "per_step": steps}


def health(run, findings=None) -> list[dict]:
    """Per rank (per_rank()): ``wait_s``, ``exposed_s``, ``overlap_ratio``, ``straggler_share``
    and ``flag``: the kind of the most severe finding that names the rank (``straggler``,
    ``not_joined``, ...) or None."""
    findings = run.findings() if findings is None else findings
    flag: dict[int, str] = {}
    from .findings import SEVERITY_ORDER
    # by severity (the findings list itself is ordered by projected gain): the first naming a rank wins
    for f in sorted(findings, key=lambda f: SEVERITY_ORDER.get(f.severity, 9)):
        if f.rank is not None and int(f.rank) not in flag:
            flag[int(f.rank)] = f.kind
    return [{"rank": int(r["rank"]), "wait_s": r["wait_s"], "exposed_s": r["exposed_s"],
             "overlap_ratio": r["overlap_ratio"], "straggler_share": r["straggler_share"],
             "flag": flag.get(int(r["rank"]))} for r in run.per_rank().to_pylist()]


def evidence(run, f) -> dict:
    """Where a finding's evidence is on the timeline: ``t0_ns``, ``t1_ns`` (aligned) and the
    collective to select (``pg``, ``seq``, or None). A finding naming one collective: that
    collective on every rank. A straggler: its first
    :data:`STRAGGLER_WINDOW_COLLECTIVES` collectives in which it arrived last (the first one
    selected). Else the finding's span, at most 50 ms from its start."""
    pg, seq = f.pg, f.seq
    t0, t1 = f.t_ns, f.t_end_ns
    if f.kind == "straggler" and f.rank is not None:
        c = run._ensure_coll()
        rows = run._sql(f"""
            SELECT pg, seq, first_enter_ns, last_leave_ns FROM {c}
            WHERE last_rank = ? AND last_late_ns > 0 AND complete AND NOT first_of_pg AND n_ranks >= 2
            ORDER BY first_enter_ns LIMIT {STRAGGLER_WINDOW_COLLECTIVES}""", [int(f.rank)]).fetchall()
        if rows:
            pg, seq = rows[0][0], int(rows[0][1])
            t0 = min(int(r[2]) for r in rows if r[2] is not None)
            t1 = max(int(r[3] if r[3] is not None else r[2]) for r in rows)
    elif pg is not None and seq is not None:
        c = run._ensure_coll()
        row = run._sql(f"SELECT first_enter_ns, last_leave_ns FROM {c} WHERE pg = ? AND seq = ?",
                       [pg, int(seq)]).fetchone()
        if row and row[0] is not None:
            t0, t1 = int(row[0]), int(row[1] if row[1] is not None else row[0])
    else:
        pg = seq = None
    if t0 is None:
        t0 = run.t_min_ns or 0
    if t1 is None or t1 < t0:
        t1 = t0
    if f.kind != "straggler" and (pg is None or seq is None):
        t1 = min(max(t1, t0 + 1_000_000), t0 + 50_000_000)
    return {"t0_ns": int(t0), "t1_ns": int(t1), "pg": pg, "seq": None if seq is None else int(seq)}


def cards(run, findings=None, top: int = TOP_CARDS) -> list[dict]:
    """The top findings as cards: ``i`` (index in ``run.findings()``), kind, severity, title,
    meaning and fix (:mod:`commtrace.analysis.catalogue`, the text of docs/findings.md),
    message, rank, site, ``cost_s`` (the finding's ``cost_s`` when the analysis gives one, else
    its impact), ``share`` (cost over the ranks' total time, duration x ranks), ``gain_s`` when
    given, and ``evidence`` (:func:`evidence`). One card per kind and rank at most."""
    findings = run.findings() if findings is None else findings
    t_span = ((run.t_max_ns or 0) - (run.t_min_ns or 0)) / 1e9 if run.t_min_ns is not None else 0.0
    rank_time = t_span * max(len(run.ranks), 1)
    out, seen = [], set()
    for i, f in enumerate(findings):
        key = (f.kind, f.rank)
        if key in seen:
            continue
        seen.add(key)
        e = entry(f.kind)
        cost = getattr(f, "cost_s", None)
        if cost is None:
            cost = (f.impact_ns or 0) / 1e9
        out.append({"i": i, "kind": f.kind, "severity": f.severity, "title": e.title, "meaning": e.meaning,
                    "fix": e.fix, "message": f.message, "rank": f.rank, "pg": f.pg, "seq": f.seq, "op": f.op,
                    "site": f.site, "cost_s": float(cost), "gain_s": getattr(f, "gain_s", None),
                    "share": float(cost) / rank_time if rank_time > 0 else None,
                    "count": sum(1 for g in findings if g.kind == f.kind),
                    "evidence": evidence(run, f)})
        if len(out) >= top:
            break
    return out


def overview(run, top: int = TOP_CARDS, head: dict | None = None) -> dict:
    """The overview page (and the report's ``overview`` key): ``job`` (:func:`job_state`),
    ``headline`` (:func:`headline`; `head` when the caller computed it already: it does not
    depend on the findings), ``health`` (:func:`health`), ``cards`` (:func:`cards`) and
    ``finding_counts`` (kind -> count)."""
    fs = run.findings()
    counts: dict[str, int] = {}
    for f in fs:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    return {"job": job_state(run), "headline": headline(run) if head is None else head, "health": health(run, fs),
            "cards": cards(run, fs, top), "finding_counts": counts, "top_rank": _top_rank(run, fs)}


def _top_rank(run, findings) -> dict | None:
    """Without findings, the what-if's costliest rank (rootcause.top_rank), when the what-if is
    computed for this run (rootcause.wanted): the overview says what the report says."""
    if findings:
        return None
    from . import rootcause as RC

    try:
        return RC.top_rank(RC.what_if(run)) if RC.wanted(run) else None
    except Exception:  # noqa: BLE001  (the report's what-if failing is a warning there too)
        return None


# ------------------------------------------------------------------------------------ live
def _issued(run) -> dict:
    """(pg, rank) -> highest collective seq in the loaded parts."""
    rows = run._sql(f"""SELECT pg, rank, max(seq) FROM {run._t}
                        WHERE kind = 'op' AND ckey IS NOT NULL GROUP BY pg, rank""").fetchall()
    return {(str(pg), int(r)): int(s) for pg, r, s in rows if s is not None}


def live_status(run, poll: dict, now_ns: int | None = None) -> dict:
    """What each rank is in now, from the latest snapshots (`poll`, as read by
    :func:`commtrace.format.reader.poll_run`) and the loaded parts of `run`:

    ``ranks``: per rank ``op``, ``pg``, ``seq`` of its oldest pending op (None when nothing is in
    flight), ``for_s`` (how long it has been pending), ``no_progress_s`` (since its last
    completion or, when it has none since, since the oldest pending op was issued),
    ``snapshot_age_s`` and ``final`` (the rank flushed at exit).

    ``hang``: the first collective pending for at least :data:`LIVE_STUCK_NS` on some members
    that another member has not issued (its highest seq on the group is lower): ``rank`` (the
    one not joined, the lowest if several), ``ranks``, ``pg``, ``seq``, ``op``, ``waiting``
    (the ranks in it) and ``for_s``; None when there is none. ``job``: :func:`job_state`."""
    now = time.time_ns() if now_ns is None else now_ns
    snaps = poll.get("snapshots") or {}
    last = run.last_completed()
    offs = getattr(run, "clock_offsets", None) or {}
    issued = _issued(run)
    ranks, pending = [], {}
    for r in sorted(set(run.ranks) | set(snaps)):
        s = snaps.get(r) or {}
        ops = [o for o in s.get("ops", []) if (o.get("kind") or "op") == "op" and o.get("t_enqueue_ns") is not None]
        for o in ops:
            if o.get("pg") is not None and o.get("seq") is not None and o.get("op") in OPS.COLLECTIVE_OPS:
                k = (str(o["pg"]), int(o["seq"]))
                issued[(k[0], r)] = max(issued.get((k[0], r), -1), k[1])
                pending.setdefault(k, {"op": o.get("op"), "ranks": {}})["ranks"][r] = int(o["t_enqueue_ns"])
        cur = min(ops, key=lambda o: int(o["t_enqueue_ns"])) if ops else None
        lc = last.get(r) or {}
        t_last = lc.get("t_end_ns")
        t_last_raw = None if t_last is None else int(t_last) + int(offs.get(r, 0) or 0)
        row = {"rank": int(r), "op": None, "pg": None, "seq": None, "for_s": None,
               "no_progress_s": None if t_last_raw is None else max(0.0, (now - t_last_raw) / 1e9),
               "last_op": lc.get("op"), "last_seq": lc.get("seq"),
               "snapshot_age_s": None if s.get("t_ns") is None else max(0.0, (now - int(s["t_ns"])) / 1e9),
               "final": bool(s.get("final"))}
        if cur is not None:
            t_e = int(cur["t_enqueue_ns"])
            row.update(op=cur.get("op"), pg=None if cur.get("pg") is None else str(cur.get("pg")),
                       seq=None if cur.get("seq") is None else int(cur["seq"]), for_s=max(0.0, (now - t_e) / 1e9),
                       site=cur.get("site"))
            if t_last_raw is None or t_last_raw < t_e:
                row["no_progress_s"] = row["for_s"]
        ranks.append(row)
    hang = None
    members_of = run.pg_members
    for (pg, seq), p in sorted(pending.items(), key=lambda kv: min(kv[1]["ranks"].values())):
        waited = (now - min(p["ranks"].values()))
        if waited < LIVE_STUCK_NS:
            continue
        members = members_of.get(pg) or list(range(run.world_size))
        missing = [m for m in members if m not in p["ranks"] and issued.get((pg, m), -1) < seq]
        if missing:
            hang = {"rank": min(missing), "ranks": sorted(missing), "pg": pg, "seq": seq, "op": p["op"],
                    "waiting": sorted(p["ranks"]), "for_s": waited / 1e9}
            break
    return {"ranks": ranks, "hang": hang,
            "job": job_state(run, poll=poll, now_ns=None if now_ns is None else now)}
