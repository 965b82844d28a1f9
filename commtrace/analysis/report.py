"""The report dict: the `commtrace report --format json` contract (docs/report.md).

Top-level keys `schema`, `world_size`, `ranks`, `ops`, `per_rank`, `collectives_summary` and
`findings` are the stable contract; the others are additions (never renamed).
"""

from __future__ import annotations

import decimal
import math
import os

from ..format import schema as S
from . import in_thread
from .overview import overview

#: Version of the report's JSON contract (not the trace schema).
REPORT_SCHEMA = 1

#: A rank without a final flush counts as having ended early when another rank was still
#: recording later than one flush interval of it (its snapshot can be that stale while it is
#: alive) plus this slack (a loaded writer thread runs late).
ENDED_EARLY_SLACK_NS = 500_000_000
DEFAULT_FLUSH_INTERVAL_S = 2.0


def _clean(v):
    """JSON-safe scalars: NaN/inf -> None, numpy -> python."""
    t = type(v)
    if t is str or t is int or t is bool or v is None:
        return v
    if t is dict:
        return {str(k): _clean(x) for k, x in v.items()}
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


#: Whether the report runs root cause and what-if beside the rest of the report, in two
#: threads (tests compare it with the sequential order).
PARALLEL = True


def build_report(run, top: int = 10, rank: int | None = None, steps=None, progress=None,
                 busbw_ref: float | None = None, what_if: bool | None = None) -> dict:
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
    from .rootcause import AUTO_MAX_OPS, DISABLED, ENABLED
    skipped = None
    if what_if is None:
        n_op = run.sql(f"SELECT count(*) FROM {run.table('ops')} WHERE kind = 'op'").fetchone()[0]
        what_if = n_op <= AUTO_MAX_OPS
        if not what_if:
            skipped = (f"root cause and what-if skipped on {n_op:,} ops (more than {AUTO_MAX_OPS:,}): "
                       "add --what-if for them (docs/performance.md: about +1 s CPU and +0.8 GB per million ops)")
    (ENABLED if what_if else DISABLED).add(run)
    beside = what_if and PARALLEL and "findings" not in run._cache
    if beside:
        # The model's op rows need only the ops table (built at load): they are read here, on
        # a cursor of their own, while a thread matches the collectives on the run's
        # connection (DuckDB's queries, GIL released), instead of at the head of the model's
        # build once that matching is done. Read in this thread: their arrays come from the
        # heap the model's build, here, reuses (the cursor opened before the thread starts,
        # which holds the run's lock).
        rows_at = _open_model_rows(run)
        coll = _start(run.collectives_summary)
        _read_model_rows(run, rows_at)
        coll_sum = coll.result()
    else:
        coll_sum = run.collectives_summary()
    tick("wait states, overlap and root cause", 0.3)
    if beside:
        # Root cause and what-if need only the ops and the matched collectives, and the rest
        # of the report up to the findings' annotation does not need them: the rest runs in a
        # thread (mostly DuckDB, which releases the GIL) while this one builds the model, the
        # delay analysis and the replay (numpy and C passes that release it too). The same
        # results in either order: both sides only read the run, through its lock, and
        # neither builds a table the other reads (the thread's findings come unannotated and
        # are annotated here, once the what-if is known). The model's cursor is opened first,
        # before the thread's queries start (model.prefetch): it reads its rows on it beside
        # them, and its numpy passes never wait for the lock.
        _prefetch_model(run)
        rest = _start(_base_part, run, top, True)
        what_if, crit, rc_error = _root_cause(run, busbw_ref, top)
        per_rank, raw, tail, head = rest.result()
        from .findings import annotate
        run._cache["findings"] = annotate(run, raw)
    else:
        head = None
        per_rank = run.per_rank()
        if what_if:
            what_if, crit, rc_error = _root_cause(run, busbw_ref, top)
        else:
            what_if, crit, rc_error = None, None, skipped
        run.findings()
        tail = _tail(run, top)
    ck, n_ops, n_coll, topc, sites, steps_summary = tail
    tick("findings", 0.7)
    findings = run.findings()
    tick("summaries", 0.9)

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
        # bounded capture: per-step counters of the steps recorded without op rows
        "step_counters": _rows(run.step_counters()),
        # collectives issued that no recorded call issued (C++, compiled graphs, torch's own
        # unwrapped functions), from torch's per-group numbering (schema v3 gap rows)
        "unrecorded": run.unrecorded(),
        "stragglers": stragglers,
        "clock": _clean(ck),
        "last_completed": {str(k): _clean(v) for k, v in run.last_completed().items()},
        "stacks": {str(k): v for k, v in run.stacks().items()},
        "ended_early": ended_early(base),
        "job": _clean(base.job()),
        "run_id": base.run_id,
        "rank_states": {str(k): _clean(v) for k, v in base.rank_states().items()},
        "warnings": list(dict.fromkeys(base.warnings + run.warnings)),
        "finding_counts": _count(findings),
        "what_if": what_if,
        "critical_path": crit,
        # the dashboard's overview page (job state, headline fractions, per-rank health, cards)
        "overview": _clean(overview(run, head=head)),
    }
    if rc_error:
        rep["warnings"].append(rc_error)
    tick("done", 1.0)
    return rep


def _base_part(run, top: int, findings: bool):
    """The report's parts that do not depend on root cause and what-if, in the report's order:
    (per_rank, the unannotated findings (findings.detect) or None, _tail's, the overview's
    headline (overview.headline: per rank and per step, no findings) or None). With `findings`
    (the thread beside root cause and what-if) the headline too, which the report otherwise
    computes at its end, after the what-if: one pass fewer in the what-if's tail."""
    per_rank = run.per_rank()
    raw = head = None
    if findings:
        from .findings import detect
        raw = detect(run)
    tail = _tail(run, top)
    if findings:
        from .overview import headline
        head = headline(run)
    return per_rank, raw, tail, head


def _tail(run, top: int):
    """(clock, ops, collectives, top collectives, top sites, per step) of the report."""
    ck = run.clock()
    n_ops = run.sql(f"SELECT count(*) FROM {run.table('ops')} WHERE kind = 'op'").fetchone()[0]
    c = run.table("collectives")
    n_coll = run.sql(f"SELECT count(*) FROM {c}").fetchone()[0]
    w = run.table("waits")
    topc = run.arrow(f"""
        SELECT k.pg, k.seq, k.op, k.step, k.bytes, k.site, k.last_rank, k.n_ranks,
               k.arrival_skew_ns / 1e9 AS arrival_skew_s, k.t_comm_ns / 1e9 AS t_comm_s, k.busbw_gbps,
               coalesce(w.total_wait_ns, 0) / 1e9 AS total_wait_s, coalesce(w.max_wait_ns, 0) / 1e9 AS max_wait_s
        FROM {c} k LEFT JOIN (SELECT ckey, sum(wait_ns) AS total_wait_ns, max(wait_ns) AS max_wait_ns
                              FROM {w} GROUP BY ckey) w ON w.ckey = k.ckey
        ORDER BY total_wait_s DESC NULLS LAST, k.pg, k.seq LIMIT {int(max(top, 0))}""")
    sites = run.arrow(f"""
        SELECT k.site, any_value(k.op) AS op, sum(w.n) AS count, sum(w.wait_ns) / 1e9 AS wait_s
        FROM (SELECT ckey, count(*) AS n, sum(wait_ns) AS wait_ns FROM {w} GROUP BY ckey) w
             JOIN {c} k ON k.ckey = w.ckey
        WHERE k.site IS NOT NULL GROUP BY k.site ORDER BY wait_s DESC LIMIT {int(max(top, 0))}""")
    return ck, n_ops, n_coll, topc, sites, run.steps_summary()


def _start(fn, *args):
    """`fn(*args)` in a new thread; returns its future (`.result()` re-raises its error)."""
    return in_thread(fn, *args, name="commtrace-report")


def _open_model_rows(run):
    """model.open_rows(run), or None on failure (build_model reads the rows then)."""
    try:
        from .model import open_rows
        return open_rows(run)
    except Exception:  # noqa: BLE001
        return None


def _read_model_rows(run, opened) -> None:
    """model.read_rows(run, opened); a failure is left for build_model (it reads them again)."""
    try:
        from .model import read_rows
        read_rows(run, opened)
    except Exception:  # noqa: BLE001
        pass


def _prefetch_model(run) -> None:
    """model.prefetch(run); a failure is left for _root_cause to report (build_model opens
    the tables again)."""
    try:
        from .model import prefetch
        prefetch(run)
    except Exception:  # noqa: BLE001
        pass


def _root_cause(run, busbw_ref, top):
    """The `what_if` (with its `delays`) and `critical_path` sections; (None, None, warning)
    when the analysis fails on odd input: the rest of the report stands."""
    try:
        from .model import build_model
        from .rootcause import critical_path, top_rank, what_if
        cp = None
        if PARALLEL:
            # the critical path reads only the model: walked in a thread of its own while
            # what_if runs delay analysis and the replays (the model built first, once)
            build_model(run)
            cp = _start(critical_path, run)
        try:
            wi = dict(what_if(run, busbw_ref))
        finally:
            crit = cp.result() if cp is not None else None
        wi["top_rank"] = top_rank(wi)
        wi["delays"] = wi["delays"][: max(int(top), 0)]
        return _clean(wi), _clean(crit if cp is not None else critical_path(run)), None
    except Exception as e:  # noqa: BLE001
        return None, None, f"root cause / what-if failed: {type(e).__name__}: {str(e).splitlines()[0]}"


def ended_early(run) -> list[dict]:
    """Ranks whose process ended before the others, without commtrace's exit flush.

    A traced rank rewrites ``rank=<r>/_inflight.json`` at every flush and writes it one last time
    with ``"final": true`` when it exits through commtrace (normal exit, exception, SIGTERM or
    SIGINT). A snapshot with ``"final": false`` means the process was killed (SIGKILL, the OOM
    killer, a lost node), crashed hard, or is still running. Such a rank is listed here when the
    others show they went on without it:

    * ``behind``: on some process group other members issued collectives after its last one
      (those it never issued are the ``not_joined`` findings);
    * ``outlived``: another rank was still recording (rows, or its own snapshot) more than one
      flush interval + :data:`ENDED_EARLY_SLACK_NS` after this rank's last sign of life.

    A rank hung inside a collective and torn down with the others is not listed (the others did
    not go on), nor is a rank that exited early through Python (its snapshot is final; a missed
    collective still shows as ``not_joined``). Traces without snapshots (``commtrace synth``)
    give an empty list. Times are on rank 0's clock.
    """
    snaps = getattr(run._files, "inflight", {}) or {}
    states = run.rank_states() if hasattr(run, "rank_states") else {}
    # A rank whose snapshot is fresh is alive (a live report), whatever it has not joined; a
    # rank with a crash file died of a fatal signal, with or without a snapshot.
    candidates = [r for r in sorted(set(run.ranks) | {r for r, s in states.items() if s["state"] in ("crashed", "killed")})
                  if ((snaps.get(r) or {}).get("final") is False
                      or (states.get(r) or {}).get("state") in ("crashed", "killed"))
                  and (states.get(r) or {}).get("state") != "alive"]
    if not candidates:
        return []
    snap_ns = run._info.get("snapshot_ns", {})
    t = run.table("ops")
    last = {}
    for r, t_last, op in run.sql(f"""
            SELECT rank, max(greatest(t_enqueue_ns, t_return_ns, t_end_ns, t_wait_end_ns)),
                   arg_max(struct_pack(op := op, pg := pg, seq := seq, site := site,
                                       t_enqueue_ns := t_enqueue_ns, t_end_ns := t_end_ns,
                                       error := error), t_enqueue_ns) FILTER (WHERE kind = 'op')
            FROM {t} GROUP BY rank""").fetchall():
        last[int(r)] = (t_last, op)
    alive = {}
    for r in run.ranks:
        vals = [v for v in (last.get(r, (None,))[0], snap_ns.get(r)) if v is not None]
        alive[r] = max(vals) if vals else None
    top_seq = {(pg, int(r)): s for pg, r, s in run.sql(f"""
            SELECT pg, rank, max(seq) FROM {t} WHERE kind = 'op' AND ckey IS NOT NULL
            GROUP BY pg, rank""").fetchall()}
    completed = run.last_completed()
    out = []
    for r in candidates:
        behind = {}
        for pg, members in run.pg_members.items():
            if r not in members:
                continue
            others = [(top_seq[(pg, o)], o) for o in members if o != r and (pg, o) in top_seq]
            mine = top_seq.get((pg, r), -1)
            ahead = [o for s, o in others if s > mine]
            if ahead:
                behind[pg] = {"last_seq": None if mine < 0 else int(mine),
                              "others_seq": int(max(s for s, _ in others)),
                              "ranks_ahead": sorted(int(o) for o in ahead)}
        flush_s = (run.meta.get(r) or {}).get("flush_interval_s") or DEFAULT_FLUSH_INTERVAL_S
        others_alive = [(v, o) for o, v in alive.items() if o != r and v is not None]
        others_until = max(others_alive)[0] if others_alive else None
        mine_t = alive.get(r)
        gap = (others_until - mine_t) if others_until is not None and mine_t is not None else None
        outlived = gap is not None and gap > float(flush_s) * 1e9 + ENDED_EARLY_SLACK_NS
        if not behind and not outlived and (states.get(r) or {}).get("state") != "crashed":
            continue
        op = _clean(last.get(r, (None, None))[1])
        st = states.get(r) or {}
        why = ([f"crashed ({st.get('signal') or 'fatal signal'}; stacks in {os.path.basename(st['crash_file'])})"]
               if st.get("state") == "crashed" else ["no exit flush (killed or crashed)"])
        for pg, b in sorted(behind.items()):
            why.append(f"rank(s) {', '.join(map(str, b['ranks_ahead']))} went on to seq "
                       f"{b['others_seq']} on pg {pg}, its last was "
                       + ("none" if b["last_seq"] is None else f"seq {b['last_seq']}"))
        if outlived:
            why.append(f"other ranks recorded {gap / 1e9:.3g} s longer")
        out.append({
            "rank": int(r),
            "reason": "; ".join(why),
            "signals": (["crashed"] if st.get("state") == "crashed" else ["no_final_flush"])
            + (["behind"] if behind else []) + (["outlived"] if outlived else []),
            "state": st.get("state"),
            "final_flush": False,
            "last_t_ns": _clean(mine_t),
            "last_t_s": (mine_t - run.t_min_ns) / 1e9 if mine_t is not None and run.t_min_ns is not None else None,
            "others_until_ns": _clean(others_until),
            "last_op": op,
            "last_completed": _clean(completed.get(r)),
            "behind": _clean(behind),
        })
    return out


def _count(findings) -> dict:
    out: dict = {}
    for f in findings:
        out[f.kind] = out.get(f.kind, 0) + 1
    return out
