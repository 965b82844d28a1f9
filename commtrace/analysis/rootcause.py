"""Root cause and what-if for the report, the findings and the dashboard: one place that runs
delay analysis (:mod:`.delay`), the critical path (:mod:`.critical_path`) and the replay
(:mod:`.replay`) and turns them into the report's `what_if`, `delays` and `critical_path`
sections and the findings' `cost_s`, `gain_s` and `root_cause` (docs/findings.md).
"""

from __future__ import annotations

import os
import weakref

import numpy as np

from . import critical_path as CP
from . import in_thread
from . import delay as D
from . import replay as RP
from .model import build_model

#: Delays replayed one by one (their `gain_s`), and ranks made as fast as the median rank.
TOP_DELAYS = 5
TOP_RANKS = 3
#: Finding kinds whose rank's delays are the finding's cost (the late rank is `rank`).
RANK_KINDS = ("straggler", "late_sender", "late_receiver")


def _fmt_s(v: float) -> str:
    a = abs(v)
    if a >= 1:
        return f"{v:.3g} s" if a < 100 else f"{v:.0f} s"
    if a >= 1e-3:
        return f"{v * 1e3:.3g} ms"
    return f"{v * 1e6:.3g} us"


def _where(d: dict) -> str:
    op = d.get("op") or "the next op"
    at = f" at {d['site']}" if d.get("site") else ""
    return f"before {op}{at}"


def _when(m, d: dict) -> str:
    """Where in the run a delay row lies, for its texts: "step N" where the run has steps (a
    user's step markers or optimizer.step), else its time since the first op ("+1.23 s": every
    row of a run without steps is in step 0, which says nothing)."""
    if d.get("step") is not None and _has_steps(m):
        return f"step {d['step']}"
    t0 = m.base_ns + (float(m.ev_start.min()) if m.n_events else 0.0)
    return f"at +{_fmt_s(max(0.0, (d['t_ns'] - t0) / 1e9))}"


def _has_steps(m) -> bool:
    hs = getattr(m, "_has_steps", None)
    if hs is None:
        st = m.ev_step[m.ev_step >= 0]
        hs = m._has_steps = bool(len(st)) and int(st.min()) != int(st.max())
    return hs


def save_text(what: str, gain_s: float, total_s: float) -> str:
    """"Fixing X would save 11.8 s of 95.1 s (12.4%)"."""
    pct = 100.0 * gain_s / total_s if total_s > 0 else 0.0
    return f"{what} would save {_fmt_s(gain_s)} of {_fmt_s(total_s)} ({pct:.1f}%)"


def what_if(run, busbw_ref: float | None = None) -> dict:
    """Replay scenarios and their projected gains (cached per run and `busbw_ref`)."""
    m = build_model(run)
    cache = getattr(m, "_whatif", None)
    if cache is None:
        cache = m._whatif = {}
    key = None if busbw_ref is None else float(busbw_ref)
    if key in cache:
        return cache[key]
    # Every scenario is replayed after delay analysis, in one pass over the trace whose
    # scenarios are halved between this thread and a second one (SPLIT; the replay's inputs
    # are built in that second thread while this one runs delay analysis). With SPLIT off, as
    # before session 27: the scenarios that need no delay analysis (the run as measured, all
    # communication hidden, the bus-bandwidth references) are replayed in a second thread
    # beside delay analysis, the others after it in this one. The C loop and most of delay
    # analysis release the GIL; each scenario's replay is its own: the same figures either way
    # (docs/performance.md, session 27).
    free = [RP.baseline(), RP.comm_hidden(m)]
    if busbw_ref:
        for op in sorted({str(o) for o, p2p in zip(m.cm_op.tolist(), m.cm_is_p2p.tolist()) if not p2p}):
            free.append(RP.busbw_ref(m, op, busbw_ref))
    beside = prep = None
    if PARALLEL and SPLIT:      # (the replay's inputs built beside delay analysis)
        prep = in_thread(RP.prepare, m, name="commtrace-whatif")
    elif PARALLEL:
        RP.prepare(m)
        beside = in_thread(RP.replay, m, free, name="commtrace-whatif") if not SPLIT else None
    dl = D.delays(run, top=TOP_DELAYS).to_pylist()
    by_rank = D.cost_by_rank(run)
    ranks = [r for r, (a, b) in sorted(by_rank.items(), key=lambda kv: -(kv[1][0] + kv[1][1])) if a + b > 0][:TOP_RANKS]
    after = []
    for r in ranks:
        after.append(RP.rank_median(m, r))
    for d in dl:
        if d["delay_s"] > 0:
            after.append(RP.fix_delay(m, d["event"], f"rank {d['rank']}'s delay {_where(d)} ({_when(m, d)}) removed"))
    if ranks:
        # the top rank removed from the critical path of the group it delayed most
        pg = _group_delayed(m, ranks[0])
        if pg is not None:
            after.append(RP.remove_rank(m, ranks[0], pg))
    if PARALLEL and SPLIT:
        # every scenario in one pass over the trace, its scenarios halved between two threads
        if prep is not None:
            prep.result()
        both = RP.replay_split(m, free + after)
        res, res_after = both.part(0, len(free)), (both.part(len(free), len(free) + len(after)) if after else None)
    else:
        res_after = RP.replay(m, after) if after else None
        res = beside.result() if beside is not None else RP.replay(m, free)
    RP.release_packed(m)                    # (32 bytes an event, rebuilt by a later replay)
    val = RP._validation(m, res)            # (the baseline is free[0])
    # the scenarios in the report's order: the measured run, the ranks, the delays, the
    # communication hidden, the bus bandwidths, the rank removed
    n_r = len(ranks)
    n_d = len(after) - n_r - (1 if after and after[-1].kind == "remove_rank" else 0)
    scs = [free[0]] + after[:n_r + n_d] + free[1:] + after[n_r + n_d:]
    t_ends = np.r_[res.t_end[:1], res_after.t_end[:n_r + n_d] if after else np.zeros(0), res.t_end[1:],
                   res_after.t_end[n_r + n_d:] if after else np.zeros(0)]
    total = val["run_time_s"]
    base_end = float(res.t_end[0])
    out_sc = []
    for sc, te in zip(scs[1:], t_ends[1:].tolist()):
        gain = (base_end - te) / 1e9
        row = {"name": sc.name, "kind": sc.kind, "params": sc.params, "gain_s": gain,
               "projected_s": total - gain, "gain_pct": 100.0 * gain / total if total > 0 else 0.0}
        if sc.kind == "fix_delay":
            row["text"] = save_text(f"Fixing {sc.name.replace(' removed', '')}", gain, total)
        elif sc.kind == "rank_median":
            row["text"] = save_text(f"Making rank {sc.params['rank']} as fast as the median rank", gain, total)
        elif sc.kind == "comm_hidden":
            row["text"] = save_text("Overlapping all communication fully", gain, total)
        elif sc.kind == "busbw_ref":
            row["text"] = save_text(f"Running every {sc.params['op']} at {sc.params['busbw_gbps']:g} GB/s bus bandwidth", gain, total)
        else:
            row["text"] = save_text(f"Taking rank {sc.params['rank']} off pg {sc.params['pg']}'s critical path", gain, total)
        out_sc.append(row)
    # per-delay gains
    gains = {sc.params.get("event"): g for sc, g in zip(scs, ((base_end - x) / 1e9 for x in t_ends.tolist()))
             if sc.kind == "fix_delay"}
    delays = []
    for d in dl:
        d = dict(d)
        g = gains.get(d["event"])
        d["gain_s"] = g
        d["text"] = save_text(f"Fixing rank {d['rank']}'s delay {_where(d)}", g, total) if g is not None else None
        d["when"] = _when(m, d)
        delays.append(d)
    a = D.attribution(run)
    out = {
        "model": "docs/findings.md#what-if-by-replay",
        "t_begin_ns": int(round(m.t_begin)) + m.base_ns, "t_end_ns": int(round(m.t_end)) + m.base_ns,
        "run_time_s": total, "replayed_s": val["replayed_s"], "replay_error": val["error"],
        "max_step_error": val.get("max_step_error"),
        "steps": val["steps"] if len(val["steps"]) <= 1000 else None,
        "busbw_ref_gbps": key,
        "scenarios": sorted(out_sc, key=lambda x: -x["gain_s"]),
        "rank_gains": {int(sc.params["rank"]): (base_end - te) / 1e9 for sc, te in zip(scs, t_ends.tolist())
                       if sc.kind == "rank_median"},
        "delays": delays,
        "wait_total_s": a["total_wait"] / 1e9,
        "delay_cost_total_s": float(a["ev_direct"].sum() + a["ev_prop"].sum()) / 1e9,
        "propagation_iterations": int(a["iterations"]),
    }
    cache[key] = out
    return out


#: Whether what_if uses a second thread: with SPLIT, for the replay's inputs beside delay
#: analysis and half of the scenarios' replay; without, for the scenarios that need no delay
#: analysis, replayed beside it (tests compare both with one thread).
PARALLEL = True
#: With PARALLEL: whether what_if replays every scenario after delay analysis, in one pass
#: split between two threads (RP.replay_split), rather than those needing no delay analysis in
#: a second thread beside it and the others after it.
SPLIT = os.environ.get("COMMTRACE_WHATIF_SPLIT", "1") != "0"


def _group_delayed(m, rank: int):
    """The group whose waits the delays of `rank` cost most (collectives only; on equal costs
    the group met first in slot order)."""
    a = getattr(m, "_attribution", None)
    if a is None or not len(m.cm_lo):
        return None
    # the collectives whose latest arrival is the rank's (per communication: 158k on 64 x
    # 20,000, where a selection per slot gathered 1.28 M slots five times)
    csel = np.flatnonzero((m.sl_rank[m.cm_last] == rank) & ~m.cm_is_p2p)
    if not len(csel):
        return None
    # each one's waits (its slots are m.cm_lo..m.cm_hi), then per group in slot order
    w = np.add.reduceat(a["sl_direct"], m.cm_lo)[csel] + np.add.reduceat(a["sl_prop"], m.cm_lo)[csel]
    codes = m.cm_pgc[csel]
    tot = np.bincount(codes, weights=w, minlength=len(m.pg_names))
    seen, first = np.unique(codes, return_index=True)
    best = seen[np.lexsort((first, -tot[seen]))[0]]
    return m.pg_names[best]


def rank_gain(run, rank: int) -> float:
    """Projected saving (s) if `rank` were as fast as the median rank."""
    wi = None
    m = build_model(run)
    for v in (getattr(m, "_whatif", None) or {}).values():
        wi = v
        break
    if wi is None:
        wi = what_if(run)
    if rank in wi["rank_gains"]:
        return wi["rank_gains"][rank]
    res = RP.replay(m, [RP.baseline(), RP.rank_median(m, rank)])
    g = (float(res.t_end[0]) - float(res.t_end[1])) / 1e9
    wi["rank_gains"][rank] = g
    return g


#: The report runs root cause and what-if by itself up to this many ops (`--what-if` forces
#: them on larger runs, and holds such a run in memory where it fits: they cost about 1 s of CPU
#: and 0.8 GB per million ops; the 64 x 20,000 report with them 2.8-2.9 s at best, +16-23% over
#: the report without them, +35-42% over that report held in memory too; docs/performance.md).
AUTO_MAX_OPS = 250_000
#: Runs whose report was asked without root cause and what-if (`report --no-what-if`), and
#: runs where they were asked for whatever the size (`report --what-if`).
DISABLED: "weakref.WeakSet" = weakref.WeakSet()
ENABLED: "weakref.WeakSet" = weakref.WeakSet()


def wanted(run) -> bool:
    """Whether `Run.findings()` should carry the what-if: asked for, or a run of at most
    AUTO_MAX_OPS ops (the dashboard and the report share this rule)."""
    if run in DISABLED:
        return False
    if run in ENABLED:
        return True
    try:
        n = run.sql(f"SELECT count(*) FROM {run.table('ops')} WHERE kind = 'op'").fetchone()[0]
    except Exception:  # noqa: BLE001
        return False
    return n <= AUTO_MAX_OPS


#: A straggler by delay analysis (where arrival counts miss it: a rank that holds up a small
#: group, whose members then arrive late together at the larger ones): its delays cost at least
#: this share of all the waiting (a quarter: two recurring stragglers, or one and a single long
#: stall of another rank, each stay above it; half hid a 40 ms-per-step straggler at 44% behind
#: one 1 s stall of a loaded host's rank), ...
DELAY_STRAGGLER_MIN_SHARE = 0.25
#: ... made as fast as the median rank it would save at least this share of the run, ...
DELAY_STRAGGLER_MIN_GAIN = 0.05
#: ... its delays of at least findings.STRAGGLER_MIN_LATE_NS, with a mean above the clock's
#: uncertainty and findings.STRAGGLER_TYPICAL_FACTOR x the other ranks' typical delay (the median
#: over the other ranks of each one's median excess per event: a loaded host's ranks that all
#: trail now and then set it; one rank's single stall, or a second straggler, does not),
#: number at least DELAY_STRAGGLER_MIN_DELAYS, stand out by count as the arrival test's do (z >=
#: findings.STRAGGLER_MIN_Z over steps, against 1 / n by chance), and recur: in at least this
#: share of the rank's steps in the window (without steps: of the occurrences of the event before
#: which its costliest delay lies). A rank that trails in a few steps of forty on a loaded
#: host (scheduling) is not one.
DELAY_STRAGGLER_MIN_DELAYS = 3
DELAY_STRAGGLER_MIN_RECUR = 0.5


def _recurrence(m, r: int, ev: np.ndarray, top_event: int | None) -> tuple[int, int, str]:
    """(in how many steps, or occurrences, rank `r` has a delay of `ev`; out of how many; of
    what: "steps", or "occurrences" of the event before which its costliest delay lies)."""
    win = (m.ev_rank == r) & (m.ev_start >= m.t_begin)
    st = m.ev_step[win]
    known = st[st >= 0]
    if len(known) == win.sum() and len(np.unique(known)) > 1:
        return len(np.unique(m.ev_step[ev])), len(np.unique(known)), "steps"
    if top_event is None:
        return len(ev), len(ev), "occurrences"
    lab = D._label(m, top_event)
    same = [int(e) for e in np.flatnonzero(win).tolist() if D._label(m, e) == lab]
    big = set(ev.tolist())
    return sum(1 for e in same if e in big), len(same), "occurrences"


def _median_excess_by_rank(m) -> dict:
    """rank -> the median of its events' excess (ns, 0 where it is not late at most of them)."""
    if not m.n_events:
        return {}
    # (the model's events come by rank: rank m.ranks[i]'s are m.rank_lo[i]..m.rank_hi[i])
    ex = m.ev_excess
    ranks, starts, ends = m.ranks.tolist(), m.rank_lo.tolist(), m.rank_hi.tolist()
    return {int(q): max(0.0, float(np.median(ex[a:b]))) for q, a, b in zip(ranks, starts, ends)}


def _main_site_delay(m, a: dict, ev: np.ndarray) -> dict | None:
    """The delay row (delay.delay_row) that stands for a straggler's delays `ev` (event
    indices): the costliest of those before the op and call site where together they cost
    most. Not simply the costliest one: a loaded host's single stall of the rank elsewhere can
    outweigh any one of its recurring delays (CI, 2026-12-03: a stall before the all_gather
    after the planted sleep's all_reduce), never their sum."""
    if not len(ev):
        return None
    cost = a["ev_direct"][ev] + a["ev_prop"][ev]
    by_site: dict = {}
    for e, c in zip(ev.tolist(), cost.tolist()):
        k = D._label(m, e)
        t, best, bc = by_site.get(k, (0.0, e, -1.0))
        by_site[k] = (t + c, e, c) if c > bc else (t + c, best, bc)
    _t, e, _c = max(by_site.values(), key=lambda v: (v[0], v[2]))
    return D.delay_row(m, a, e)


def delay_stragglers(run, known=()) -> list:
    """`straggler` findings from delay analysis (docs/findings.md, `straggler`, "by delay
    analysis") for ranks not in `known` (those the arrival counts already name)."""
    from . import findings as F

    m = build_model(run)
    a = D.attribution(run)
    total_wait = float(a["total_wait"])
    if not m.n_events or total_wait <= 0:
        return []
    by_rank = D.cost_by_rank(run)
    mixed = set(getattr(run.files, "conflict_ranks", None) or ())   # (rows of two processes)
    out, rank_typ = [], None
    for r, (dc, pc) in sorted(by_rank.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        cost = dc + pc
        if r in known or r in mixed or cost * 1e9 < DELAY_STRAGGLER_MIN_SHARE * total_wait:
            continue
        ev = np.flatnonzero((m.ev_rank == r) & (m.ev_excess >= F.STRAGGLER_MIN_LATE_NS)
                            & (a["ev_direct"] + a["ev_prop"] > 0))
        if len(ev) < DELAY_STRAGGLER_MIN_DELAYS:
            continue
        mean_delay = float(m.ev_excess[ev].mean())
        unc = F._clock_uncertainty_ns(run, r)
        if mean_delay < F.STRAGGLER_CLOCK_FACTOR * unc:
            continue
        if rank_typ is None:
            rank_typ = _median_excess_by_rank(m)
        oth = [v for q, v in rank_typ.items() if q != r]
        typical = float(np.median(oth)) if oth else 0.0
        if mean_delay < F.STRAGGLER_TYPICAL_FACTOR * typical:
            continue
        total = what_if(run)["run_time_s"]
        if total <= 0 or rank_gain(run, r) < DELAY_STRAGGLER_MIN_GAIN * total:
            continue
        d = _main_site_delay(m, a, ev)
        n_in, n_of, unit = _recurrence(m, r, ev, d["event"] if d else None)
        if n_in < DELAY_STRAGGLER_MIN_DELAYS or n_in < DELAY_STRAGGLER_MIN_RECUR * n_of:
            continue
        # the same count evidence as the arrival test over steps: delayed in n_in of n_of
        # steps against 1 / n (any one rank's share of the delays by chance), z >= 3
        p = 1.0 / max(len(m.ranks), 2)
        z = (n_in - p * n_of) / (n_of * p * (1 - p)) ** 0.5 if n_of else 0.0
        if z < F.STRAGGLER_MIN_Z:
            continue
        t0 = int(round(float(m.ev_start[ev].min()))) + m.base_ns
        where = f" (most {_where(d)}, the costliest there {_when(m, d)})" if d is not None else ""
        out.append(F.Finding(
            kind="straggler", severity="warning", rank=int(r), op=d["op"] if d else None,
            site=d["site"] if d else None, t_ns=t0, impact_ns=int(round(cost * 1e9)),
            evidence={"basis": "delay_analysis", "cost_s": cost, "direct_cost_s": dc, "propagated_cost_s": pc,
                      "share_of_wait": cost * 1e9 / total_wait, "wait_total_s": total_wait / 1e9,
                      "delays": int(len(ev)), "recurs_in": int(n_in), "recurs_of": int(n_of), "recurs_unit": unit, "z": z,
                      "mean_delay_s": mean_delay / 1e9, "typical_delay_s": typical / 1e9,
                      "clock_uncertainty_ns": unc},
            message=(f"rank {r}'s work between communications ran longer than the other ranks' in "
                     f"{n_in:,} of {n_of:,} {unit}, on average {F.fmt_ns(mean_delay)}{where}; the waiting it caused, "
                     f"directly and passed on by the ranks it held up, is {_fmt_s(cost)} of the "
                     f"{_fmt_s(total_wait / 1e9)} all ranks waited ({cost * 1e9 / total_wait:.0%})")))
    return out


def annotate_findings(run, findings: list) -> list:
    """Give each finding `cost_s` (delay costs of its late rank), `gain_s` (the replay's
    saving if that rank were as fast as the median rank) and `root_cause` (the rank's costliest
    delay); order by `gain_s` (largest first), findings without one after, in their order.
    Stragglers that only delay analysis shows are added (:func:`delay_stragglers`)."""
    if not wanted(run):
        return findings
    m = build_model(run)
    if not m.n_events:
        return findings
    # ranks a finding already names as the cause (a straggler by arrivals, a late sender or
    # receiver: their delays are those) get no second one
    known = {f.rank for f in findings if f.kind in RANK_KINDS}
    findings = list(findings) + delay_stragglers(run, known)
    need = [f for f in findings if f.kind in RANK_KINDS and f.rank is not None]
    if not need:
        return findings
    wi = what_if(run)
    total = wi["run_time_s"]
    by_rank = D.cost_by_rank(run)
    top = {d["rank"]: d for d in D.delays(run, per_rank=1).to_pylist()}
    for f in need:
        r = int(f.rank)
        a, b = by_rank.get(r, (0.0, 0.0))
        f.cost_s = a + b
        f.gain_s = rank_gain(run, r)
        d = top.get(r)
        if d is not None:
            f.root_cause = {k: d[k] for k in ("rank", "step", "op", "site", "prev_op", "prev_site", "delay_s",
                                              "direct_cost_s", "propagated_cost_s", "cost_s")}
            f.root_cause["text"] = save_text(
                f"Fixing rank {r}'s delays (the costliest {_where(d)}, {_when(m, d)})", f.gain_s, total)
        f.evidence["what_if"] = save_text(f"Making rank {r} as fast as the median rank", f.gain_s, total)
    order = sorted(range(len(findings)), key=lambda i: (0 if findings[i].gain_s is not None else 1,
                                                        -(findings[i].gain_s or 0.0), i))
    return [findings[i] for i in order]


#: the share of the run that making one rank as fast as the median rank must save for
#: :func:`top_rank` to name it (a report without findings then says so).
TOP_RANK_MIN_PCT = 5.0


def top_rank(wi: dict) -> dict | None:
    """From a :func:`what_if` dict: the rank whose "as fast as the median rank" scenario saves
    the most, when that is at least TOP_RANK_MIN_PCT of the run: ``rank``, ``gain_s``,
    ``gain_pct``, ``steps`` (of its delays of 1% of the run or more, ascending), ``n_delays``
    (how many), ``op`` / ``site`` (the costliest of them) and ``text`` (the sentence the text
    report and the dashboard print when there are no findings: such delays, a periodic data load
    or a checkpoint on one rank, are real but too rare to make the rank a straggler). None
    otherwise. One source for the report and the dashboard."""
    sc = [x for x in wi.get("scenarios") or [] if x.get("kind") == "rank_median"
          and (x.get("gain_pct") or 0) >= TOP_RANK_MIN_PCT]
    if not sc:
        return None
    best = max(sc, key=lambda x: x.get("gain_s") or 0)
    rank = int((best.get("params") or {}).get("rank"))
    run = wi.get("run_time_s") or 0
    mine = sorted((d for d in wi.get("delays") or [] if d.get("rank") == rank
                   and (d.get("gain_s") or 0) >= 0.01 * run), key=lambda d: -(d.get("gain_s") or 0))
    steps = sorted({int(d["step"]) for d in mine if d.get("step") is not None})
    top = mine[0] if mine else {}
    text = f"Delays still cost time: {best.get('text')}"
    if mine:
        shown = ", ".join(map(str, steps[:8])) + (" ..." if len(steps) > 8 else "")
        text += (f"; its {len(mine)} delay(s) of 1% of the run or more"
                 + (f" (step{'s' if len(steps) > 1 else ''} {shown})" if steps else "")
                 + f", the costliest before {top.get('op')}"
                 + (f" at {top.get('site')}" if top.get("site") else ""))
    text += (f". They are too rare to make rank {rank} a straggler (docs/findings.md#straggler); "
             "see the root causes and the what-if.")
    return {"rank": rank, "gain_s": best.get("gain_s"), "gain_pct": best.get("gain_pct"), "steps": steps,
            "n_delays": len(mine), "op": top.get("op"), "site": top.get("site"), "text": text}


def critical_path(run) -> dict:
    """The report's `critical_path` section (critical_path.summary)."""
    s = CP.summary(run)
    s["per_step"] = s["per_step"] if len(s["per_step"]) <= 1000 else None
    return s


def segments(run):
    """Critical path segments per rank as a table (for the dashboard's timeline)."""
    return CP.segments(run)


def delays(run, top: int | None = None):
    """Root causes as a table (delay.delays)."""
    return D.delays(run, top=top)
