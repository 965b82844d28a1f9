"""Findings: what went wrong, where, and by how much (catalogue: docs/findings.md).

Each detector is a function of a loaded :class:`~commtrace.analysis.run.Run` that returns a few
:class:`Finding` objects; the heavy lifting is SQL over the run's table. Thresholds are the
named constants below, chosen so that a clean run reports nothing: the first collective of each
group (connection set-up) is ignored for stragglers, and a straggler needs evidence in both
count (a z-score against arrival order by chance) and magnitude.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .sql import COLLECTIVE_SQL, quote

#: The fixed finding kinds (issue 3).
KINDS = ("straggler", "late_sender", "late_receiver", "collective_mismatch", "not_joined",
         "not_completed", "sync_while_inflight", "redundant_sync", "wait_immediately",
         "use_before_wait", "first_op_init_stall", "clock_violation", "rank_crashed")
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}

# Straggler: count evidence (z-score of last arrivals against 1/n by chance, and a share at
# least STRAGGLER_MIN_RATIO times the expected one) and magnitude evidence (mean lead over the
# second-latest arrival).
STRAGGLER_MIN_COLLECTIVES = 4
STRAGGLER_MIN_LAST = 3
STRAGGLER_MIN_Z = 3.0
STRAGGLER_MIN_RATIO = 1.5
STRAGGLER_SHARE_HALFWAY = 0.5
STRAGGLER_MAX_RATIO = 10.0
STRAGGLER_MIN_LATE_NS = 500_000
STRAGGLER_TYPICAL_FACTOR = 3.0
#: A straggler must be late by more than this many times the clock alignment uncertainty.
STRAGGLER_CLOCK_FACTOR = 1.0
#: Arrival order within one training step is one event, not several (DDP's buckets of a step
#: all wait for the same backward): where steps are known and hold at most this many of the
#: rank's collectives on average, the count evidence is also taken over steps.
STRAGGLER_MAX_PER_STEP = 32
STRAGGLER_MIN_STEPS = 4
# Late sender / receiver per peer pair (first op of a pair excluded: lazy set-up).
P2P_LATE_MIN_NS = 100_000
P2P_MIN_EVENTS = 3
P2P_MIN_TOTAL_NS = 1_000_000
# Host rules.
# 0.5 ms: the capture path itself puts ~100-400 us between the issue returning and wait() on a
# loaded CPU, so a tighter bound misses the real case; less than 0.5 ms of overlap buys next to nothing.
WAIT_IMMEDIATE_NS = 500_000
REDUNDANT_SYNC_GAP_NS = 200_000
INIT_STALL_MIN_NS = 10_000_000
INIT_STALL_RATIO = 5.0
#: Individual findings per group for mismatches / incomplete ops (the rest are counted).
MAX_PER_GROUP = 10


@dataclass
class Finding:
    """One finding. `evidence` holds the numbers behind `message` (ns unless named _s)."""

    kind: str
    severity: str
    message: str
    rank: int | None = None
    pg: str | None = None
    seq: int | None = None
    op: str | None = None
    site: str | None = None
    t_ns: int | None = None
    t_end_ns: int | None = None
    impact_ns: int = 0
    evidence: dict = field(default_factory=dict)
    #: delay costs of the late rank (s), the replay's projected saving if fixed (s), and its
    #: costliest delay (docs/findings.md "Root cause and what-if"); None where not applicable
    cost_s: float | None = None
    gain_s: float | None = None
    root_cause: dict | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict (the `findings` entries of the report contract)."""
        d = asdict(self)
        d["impact_s"] = self.impact_ns / 1e9
        return d


def fmt_ns(ns) -> str:
    """Human duration: 1,234 s, 1.23 s, 20.1 ms, 350 us, 800 ns."""
    if ns is None:
        return "?"
    ns = float(ns)
    a = abs(ns)
    if a >= 999.5e9:
        return f"{ns / 1e9:,.0f} s"
    # each unit from where 3 significant digits of the smaller one would round up to 1000
    # (999.7 ms is "1 s", not "1e+03 ms")
    if a >= 999.5e6:
        return f"{ns / 1e9:.3g} s"
    if a >= 999.5e3:
        return f"{ns / 1e6:.3g} ms"
    if a >= 999.5:
        return f"{ns / 1e3:.3g} us"
    return f"{ns:.0f} ns"


def fmt_ranks(ranks) -> str:
    rs = sorted({int(r) for r in ranks})
    if not rs:
        return "none"
    parts, start, prev = [], rs[0], rs[0]
    for r in rs[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    s = ", ".join(parts)
    return s if len(s) < 80 else s[:77] + "..."


def _i(v):
    return None if v is None else int(v)


# ---------------------------------------------------------------------------- detectors
def _clock_uncertainty_ns(run, rank: int) -> float:
    """Bound on the clock alignment error between `rank` and any other rank: half of its
    offset measurement's round trip plus the largest half round trip of the others (rank 0,
    the reference, has none)."""
    half = {}
    for r, m in (getattr(run, "meta", None) or {}).items():
        try:
            half[int(r)] = max(0, int(m.get("clock_rtt_ns") or 0)) / 2.0
        except (TypeError, ValueError, AttributeError):
            continue
    others = [v for r, v in half.items() if r != rank]
    return half.get(rank, 0.0) + (max(others) if others else 0.0)


def straggler(run) -> list[Finding]:
    """A rank that arrives last far more often than chance, and by a margin that stands out."""
    out = []
    st = run.stragglers().to_pylist()
    if not st:
        return out
    c = run.table("collectives")
    for s in st:
        n = s["n_collectives"] or 0
        last = s["last_count"] or 0
        if n < STRAGGLER_MIN_COLLECTIVES or last < STRAGGLER_MIN_LAST:
            continue
        expected = (s["expected_share"] or 0.0) * n
        var = s["var_count"] or 0.0
        z = (last - expected) / (var ** 0.5) if var > 0 else 0.0
        share = s["share"] or 0.0
        exp_share = s["expected_share"] or 0.0
        mean_late = float(s["mean_late_ns"] or 0.0)
        typical = float(s["typical_late_ns"] or 0.0)
        # Arrival order is correlated over consecutive collectives (one step's buckets, a
        # burst of CPU contention), so the z-score alone overstates the evidence: the share
        # must also reach halfway from chance to always-last, or STRAGGLER_MAX_RATIO x chance.
        need = min(exp_share + STRAGGLER_SHARE_HALFWAY * (1 - exp_share), STRAGGLER_MAX_RATIO * exp_share)
        if z < STRAGGLER_MIN_Z or share < max(STRAGGLER_MIN_RATIO * exp_share, need):
            continue
        if mean_late < max(STRAGGLER_MIN_LATE_NS, STRAGGLER_TYPICAL_FACTOR * typical):
            continue
        r = s["rank"]
        z_steps = _straggler_step_z(run, r, n)
        if z_steps is not None and z_steps < STRAGGLER_MIN_Z:
            continue
        # Lateness within the clock alignment's uncertainty is no evidence: each rank's offset
        # to rank 0 is known to within half its round trip (metrics.md, clock alignment), so two
        # ranks' arrivals compare to within the sum of those halves. On a loaded machine a
        # round trip of several ms makes a clean run look like a steady straggler.
        unc = _clock_uncertainty_ns(run, r)
        if mean_late < STRAGGLER_CLOCK_FACTOR * unc:
            continue
        row = run.sql(f"""
            SELECT mode(op), mode(site), count(DISTINCT pg), min(pg), min(first_enter_ns), max(last_enter_ns)
            FROM {c} WHERE last_rank = ? AND last_late_ns > 0 AND complete AND NOT first_of_pg
              AND n_ranks >= 2""", [r]).fetchone()
        total = int(s["total_late_ns"] or 0)
        # What the others waited for it, rank by rank: their wait states (the per-rank table's
        # `wait`) at the collectives it arrived last at, so that the message's figures are the
        # tables' figures.
        w = run.table("waits")
        caused = [int(v or 0) for (v,) in run.sql(f"""
            SELECT sum(w.wait_ns) FROM {w} w JOIN {c} k ON k.ckey = w.ckey
            WHERE k.last_rank = ? AND k.last_late_ns > 0 AND w.rank <> ? AND k.complete
              AND NOT k.first_of_pg AND k.n_ranks >= 2
            GROUP BY w.rank""", [r, r]).fetchall()]
        each_lo, each_hi = (min(caused), max(caused)) if caused else (0, 0)
        each = fmt_ns(each_hi) if fmt_ns(each_lo) == fmt_ns(each_hi) else f"{fmt_ns(each_lo)} to {fmt_ns(each_hi)}"
        out.append(Finding(
            kind="straggler", severity="warning", rank=r, pg=row[3] if row[2] == 1 else None,
            op=row[0], site=row[1], t_ns=_i(row[4]), t_end_ns=_i(row[5]), impact_ns=total,
            evidence={"basis": "arrivals", "last_count": last, "n_collectives": n, "share": share,
                      "expected_share": exp_share, "z": z, "mean_late_ns": mean_late,
                      "total_late_ns": total, "typical_late_ns": typical,
                      "clock_uncertainty_ns": unc, "z_steps": z_steps,
                      "caused_wait_ns": sum(caused), "caused_wait_ranks": len(caused),
                      "caused_wait_min_ns": each_lo, "caused_wait_max_ns": each_hi},
            message=(f"rank {r} arrived last at {last:,} of {n:,} collectives ({share:.0%}; "
                     f"{exp_share:.0%} expected by chance), on average {fmt_ns(mean_late)} after the "
                     f"next-latest rank; at those the other {len(caused):,} rank(s) waited {each} each for it "
                     f"({fmt_ns(sum(caused))} in all)"
                     + (f" (mostly {row[0]} at {row[1]})" if row[1] else ""))))
    return out


def _straggler_step_z(run, rank: int, n: int):
    """z-score of rank's last arrivals counted per step: each step contributes the share of
    its collectives in which the rank arrived last, against the share expected by chance,
    with the variance of one trial per step (collectives of one step fully correlated). None
    where steps do not apply: unknown for most collectives, too few, or so coarse (a single
    mark_step() at the start) that a step is no longer one iteration."""
    w = run.table("waits")
    row = run.sql(f"""
        SELECT count(*), sum(x), sum(p), sum(p * (1 - p)), sum(nc) FROM (
            SELECT avg(CASE WHEN is_last THEN 1.0 ELSE 0.0 END) AS x, avg(1.0 / n_ranks) AS p,
                   count(*) AS nc
            FROM {w} WHERE rank = ? AND n_ranks >= 2 AND NOT first_of_pg AND step IS NOT NULL
            GROUP BY step)""", [rank]).fetchone()
    steps, sx, sp, var, nc = row
    if not steps or steps < STRAGGLER_MIN_STEPS or not var or var <= 0:
        return None
    if nc < 0.8 * n or nc > STRAGGLER_MAX_PER_STEP * steps:
        return None
    return (float(sx) - float(sp)) / float(var) ** 0.5


def late_p2p(run) -> list[Finding]:
    """late_sender / late_receiver per peer pair (metrics.md wait states)."""
    p = run.table("p2p")
    out = []
    rows = run.sql(f"""
        SELECT pg, src, dst, count(*) AS n,
               count(*) FILTER (WHERE late_sender_ns > {P2P_LATE_MIN_NS}),
               sum(late_sender_ns) FILTER (WHERE late_sender_ns > {P2P_LATE_MIN_NS}), max(late_sender_ns),
               count(*) FILTER (WHERE late_receiver_ns > {P2P_LATE_MIN_NS}),
               sum(late_receiver_ns) FILTER (WHERE late_receiver_ns > {P2P_LATE_MIN_NS}), max(late_receiver_ns),
               mode(send_site), mode(recv_site),
               min(least(send_enter_ns, recv_enter_ns)), max(greatest(send_leave_ns, recv_leave_ns))
        FROM {p} WHERE pair_seq > 1 AND send_enter_ns IS NOT NULL AND recv_enter_ns IS NOT NULL
        GROUP BY pg, src, dst""").fetchall()
    for pg, src, dst, n, ns_, ts_, ms_, nr_, tr_, mr_, ssite, rsite, t0, t1 in rows:
        for kind, n_late, total, mx, late_rank, peer, site, verb, op in (
                ("late_sender", ns_, ts_, ms_, src, dst, ssite, "sent late to", "send"),
                ("late_receiver", nr_, tr_, mr_, dst, src, rsite, "posted its receive late for", "recv")):
            if n_late < P2P_MIN_EVENTS or (total or 0) < P2P_MIN_TOTAL_NS:
                continue
            mean = total / n_late
            out.append(Finding(
                kind=kind, severity="warning", rank=int(late_rank), pg=pg, op=op,
                site=site, t_ns=_i(t0), t_end_ns=_i(t1), impact_ns=int(total),
                evidence={"src": int(src), "dst": int(dst), "count": int(n_late), "pairs": int(n),
                          "total_ns": int(total), "mean_ns": mean, "max_ns": int(mx)},
                message=(f"rank {late_rank} {verb} rank {peer} on pg {pg}: {n_late} of {n} transfers "
                         f"waited, {fmt_ns(total)} in total (mean {fmt_ns(mean)}, max {fmt_ns(mx)})")))
    return out


def collective_mismatch(run) -> list[Finding]:
    """op, dtype or sizes differ across ranks for one (pg, seq), by the Flight Recorder
    analyzer's rules: op and dtype always; the element count must agree for every op but
    all_to_all, gather and scatter (uneven splits are legal there); all_gather's output must be
    n x its input and reduce_scatter's input n x its output."""
    out = []
    t = run.table("ops")
    c = run.table("collectives")
    if not run.sql(f"SELECT count(*) FROM {c} WHERE differs").fetchone()[0]:
        return out
    rows = run.sql(f"""
        WITH x AS (SELECT x.pg, x.seq, x.rank, x.op, x.dtype, x.count, x.bytes, x.out_bytes, x.pg_size, x.site, x.t_enqueue_ns
                   FROM {t} x SEMI JOIN (SELECT ckey FROM {c} WHERE differs) d ON d.ckey = x.ckey),
        g AS (
            SELECT pg, seq, count(DISTINCT op) AS n_op, count(DISTINCT dtype) AS n_dtype,
                   count(DISTINCT count) AS n_count, mode(op) AS mop,
                   bool_or(op = 'all_gather' AND out_bytes IS NOT NULL AND bytes IS NOT NULL
                           AND pg_size IS NOT NULL AND out_bytes <> bytes * pg_size) AS ag_bad,
                   bool_or(op = 'reduce_scatter' AND out_bytes IS NOT NULL AND bytes IS NOT NULL
                           AND pg_size IS NOT NULL AND out_bytes * pg_size <> bytes) AS rs_bad
            FROM x GROUP BY pg, seq)
        , bad AS (
            SELECT g.pg, g.seq, g.n_op, g.n_dtype, g.n_count, g.ag_bad, g.rs_bad,
                   list(struct_pack(rank := x.rank, op := x.op, dtype := x.dtype, count := x.count,
                                    bytes := x.bytes, out_bytes := x.out_bytes, site := x.site,
                                    t := x.t_enqueue_ns) ORDER BY x.rank) AS entries
            FROM g JOIN x ON x.pg = g.pg AND x.seq = g.seq
            WHERE g.n_op > 1 OR g.n_dtype > 1 OR g.ag_bad OR g.rs_bad
               OR (g.n_count > 1 AND g.mop NOT IN ('all_to_all', 'gather', 'scatter'))
            GROUP BY ALL)
        SELECT *, count(*) OVER (PARTITION BY pg) AS n_in_pg,
               row_number() OVER (PARTITION BY pg ORDER BY seq) AS k
        FROM bad ORDER BY pg, seq""").fetchall()
    members_of = run.pg_members
    states = run.rank_states() if hasattr(run, "rank_states") else {}
    for pg, seq, n_op, n_dtype, n_count, ag_bad, rs_bad, entries, n_in_pg, k in rows:
        if k > MAX_PER_GROUP:
            continue
        what = []
        if n_op > 1:
            field_, what = "op", ["op"]
        elif n_dtype > 1:
            field_, what = "dtype", ["dtype"]
        elif n_count > 1:
            field_, what = "count", ["size"]
        else:
            field_, what = None, ["output size"]
        # members whose call is not in the trace (a rank that crashed before its rows were
        # written): each could side with either value
        unknown = sorted(set(int(m) for m in (members_of.get(pg) or [])) - {int(e["rank"]) for e in entries})
        if field_ and _ambiguous(entries, field_, len(unknown)):
            out.append(_ambiguous_mismatch(pg, seq, entries, field_, what[0], unknown, states, n_in_pg, k))
            continue
        culprits = _minority(entries, field_) if field_ else [
            e["rank"] for e in entries
            if (e["op"] == "all_gather" and e["out_bytes"] is not None and e["bytes"] is not None
                and e["out_bytes"] != e["bytes"] * len(entries))
            or (e["op"] == "reduce_scatter" and e["out_bytes"] is not None and e["bytes"] is not None
                and e["out_bytes"] * len(entries) != e["bytes"])]
        by_rank = {e["rank"]: e for e in entries}
        c0 = culprits[0] if culprits else entries[0]["rank"]
        ref = next((e for e in entries if e["rank"] not in culprits), entries[0])
        ce = by_rank[c0]
        if field_ == "count":
            detail = (f"rank {c0} passed {ce['count']} elements ({fmt_bytes(ce['bytes'])}) where rank "
                      f"{ref['rank']} passed {ref['count']} ({fmt_bytes(ref['bytes'])})")
        elif field_:
            detail = f"rank {c0} called {ce[field_]} where rank {ref['rank']} called {ref[field_]}"
        else:
            detail = f"rank {c0}'s output is {fmt_bytes(ce['out_bytes'])} for an input of {fmt_bytes(ce['bytes'])}"
        extra = f"; {n_in_pg} mismatched collectives on pg {pg} in all" if k == 1 and n_in_pg > 1 else ""
        out.append(Finding(
            kind="collective_mismatch", severity="error", rank=int(c0), pg=pg, seq=int(seq), op=ref["op"],
            site=ce["site"], t_ns=_i(min(e["t"] for e in entries if e["t"] is not None) if any(e["t"] is not None for e in entries) else None),
            impact_ns=0,
            evidence={"field": field_ or "out_bytes", "culprits": [int(r) for r in culprits],
                      "entries": [{kk: (vv if kk != "t" else None) for kk, vv in e.items() if kk != "t"} for e in entries],
                      "mismatched_in_pg": int(n_in_pg)},
            message=f"{what[0]} mismatch in {ref['op']} seq {seq} on pg {pg}: {detail}{extra}"))
    return out


def _ambiguous(entries, field_, n_unknown: int) -> bool:
    """True when the members whose call was not recorded (`n_unknown`) could make another
    value the majority: the recorded calls' most common value leads the next by fewer than
    `n_unknown` (a tie with any unknown member). Then no rank is named the culprit: on 3 ranks
    where the rank that aborted on the mismatch wrote nothing, the other two split 1 to 1 and
    the lowest rank is as likely right as wrong."""
    if n_unknown <= 0:
        return False
    counts: dict = {}
    for e in entries:
        counts[e[field_]] = counts.get(e[field_], 0) + 1
    top = sorted(counts.values(), reverse=True) + [0]
    return top[0] - top[1] < n_unknown


def _ambiguous_mismatch(pg, seq, entries, field_, what, unknown, states, n_in_pg, k) -> Finding:
    """A collective_mismatch whose culprit cannot be told (:func:`_ambiguous`): rank None,
    ``evidence.ambiguous``, the ranks on each side (``candidates``) and the members whose call
    is unknown, with how their process ended."""
    a = entries[0]
    b = next(e for e in entries if e[field_] != a[field_])
    # no "where": neither side is the reference
    if field_ == "count":
        detail = (f"rank {a['rank']} passed {a['count']} elements ({fmt_bytes(a['bytes'])}) and rank "
                  f"{b['rank']} {b['count']} ({fmt_bytes(b['bytes'])})")
    else:
        detail = f"rank {a['rank']} called {a[field_]} and rank {b['rank']} {b[field_]}"
    counts: dict = {}
    for e in entries:
        counts.setdefault(e[field_], []).append(int(e["rank"]))
    split = " to ".join(str(len(v)) for v in sorted(counts.values(), key=len, reverse=True))

    def how(r):
        st = states.get(r) or {}
        word = {"crashed": "crashed", "killed": "died", "exception": "exited on an exception",
                "alive": "has not joined", "exited": "exited"}.get(st.get("state"), "left no record")
        return f"rank {r} ({word}{', ' + st['signal'] if st.get('signal') and st.get('state') == 'crashed' else ''})"

    extra = f"; {n_in_pg} mismatched collectives on pg {pg} in all" if k == 1 and n_in_pg > 1 else ""
    ts = [e["t"] for e in entries if e["t"] is not None]
    return Finding(
        kind="collective_mismatch", severity="error", rank=None, pg=pg, seq=int(seq), op=a["op"],
        site=a["site"], t_ns=_i(min(ts)) if ts else None, impact_ns=0,
        evidence={"field": field_, "culprits": [], "ambiguous": True,
                  "candidates": sorted(int(e["rank"]) for e in entries),
                  "sides": {str(v): rs for v, rs in counts.items()},
                  "unrecorded": [int(r) for r in unknown],
                  "unrecorded_states": {str(r): (states.get(r) or {}).get("state") for r in unknown},
                  "entries": [{kk: vv for kk, vv in e.items() if kk != "t"} for e in entries],
                  "mismatched_in_pg": int(n_in_pg)},
        message=(f"{what} mismatch in {a['op']} seq {seq} on pg {pg}: {detail}; which rank is wrong is "
                 f"ambiguous: the recorded calls split {split} and "
                 + ", ".join(how(r) for r in unknown)
                 + f" did not record {'its' if len(unknown) == 1 else 'their'} call{extra}"))


def _minority(entries, field_) -> list[int]:
    """Ranks whose value is not the majority's; on a tie, those that differ from the lowest
    rank (the Flight Recorder analyzer compares every rank with the first)."""
    counts: dict = {}
    for e in entries:
        counts[e[field_]] = counts.get(e[field_], 0) + 1
    best = max(counts.values())
    modes = [v for v, c in counts.items() if c == best]
    ref = modes[0] if len(modes) == 1 else entries[0][field_]
    return [e["rank"] for e in entries if e[field_] != ref]


def fmt_bytes(b) -> str:
    if b is None:
        return "?"
    b = float(b)
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= div:
            return f"{b / div:.3g} {unit}"
    return f"{b:.0f} B"


def _incomplete_keys(run) -> str:
    """(pg, seq) of collectives that some member never issued."""
    c = run.table("collectives")
    return f"(SELECT ckey FROM {c} WHERE n_ranks < n_expected)"


def not_joined(run) -> list[Finding]:
    """Member ranks that never issued a collective that others issued: the hang culprit, named
    with its last completed op (members: metadata pg_ranks, else world for a world-size group,
    else the ranks that used the group)."""
    c = run.table("collectives")
    members = run.pg_members
    pairs = [(pg, int(r)) for pg, rs in members.items() for r in rs]
    mt = ("(SELECT * FROM (VALUES " + ", ".join(f"({quote(p)}, {r})" for p, r in pairs) + ") v(pg, rank))"
          if pairs else "(SELECT CAST(NULL AS VARCHAR) AS pg, CAST(NULL AS INTEGER) AS rank LIMIT 0)")
    rows = run.sql(f"""
        WITH inc AS (SELECT ckey, pg, seq, op, first_enter_ns, last_enter_ns, site, n_ranks
                     FROM {c} WHERE n_ranks < n_expected),
        issued AS (SELECT DISTINCT x.pg, x.seq, x.rank FROM {run.table('ops')} x SEMI JOIN inc ON x.ckey = inc.ckey),
        miss AS (SELECT inc.*, m.rank FROM inc JOIN {mt} m ON m.pg = inc.pg
                 ANTI JOIN issued i ON i.pg = inc.pg AND i.seq = inc.seq AND i.rank = m.rank)
        SELECT pg, rank, min(seq) AS seq, arg_min(op, seq), arg_min(first_enter_ns, seq), arg_min(site, seq),
               count(*) AS n_missing
        FROM miss GROUP BY pg, rank ORDER BY min(seq), rank""").fetchall()
    if not rows:
        return []
    last = run.last_completed()
    tmax = max([run.t_max_ns or 0] + list(run.snapshot_ns.values()))
    out = []
    present = set(run.ranks)
    states = run.rank_states() if hasattr(run, "rank_states") else {}
    for pg, r, seq, op, t_first, site, n_missing in rows:
        st = states.get(int(r)) or {}
        if st.get("state") in DIED_STATES:
            continue  # its process died: a rank_crashed finding, not a non-joiner
        waiting = run.sql(f"""
            SELECT list(rank ORDER BY rank), list(rank ORDER BY rank) FILTER (WHERE t_end_ns IS NULL)
            FROM {run.table('ops')} WHERE kind = 'op' AND pg = ? AND seq = ?""", [pg, seq]).fetchone()
        issued_by = waiting[0] or []
        still = waiting[1] or []
        lc = last.get(int(r))
        stacks = run.stacks().get(int(r), [])
        if int(r) in present:
            lc_txt = (f"its last completed op was {lc['op']} seq {lc['seq']} on pg {lc['pg']}"
                      + (f" at {lc['site']}" if lc.get("site") else "")) if lc else "it completed no op"
            sev = "error"
        else:
            lc_txt = "it left no trace at all"
            sev = "warning"
        where = None
        if st.get("state") == "alive":
            age = st.get("snapshot_age_s")
            lc_txt += f"; rank {r} is alive" + (f" (its snapshot is {age:.1f} s old)" if age is not None else "")
            where = _where(stacks)
            if where:
                lc_txt += f"; rank {r} is in {where['function']} at {where['site']}"
            sev = "error"
        waited = tmax - t_first if t_first is not None else 0
        out.append(Finding(
            kind="not_joined", severity=sev, rank=int(r), pg=pg, seq=int(seq), op=op,
            site=(lc or {}).get("site") or site, t_ns=_i(t_first), t_end_ns=_i(tmax), impact_ns=int(max(waited, 0)) * max(len(still), 1),
            evidence={"issued_by": [int(x) for x in issued_by], "waiting": [int(x) for x in still],
                      "last_completed": lc, "missing_collectives": int(n_missing),
                      "waited_ns": int(max(waited, 0)), "stacks": stacks, "collective_site": site,
                      "rank_state": st.get("state"), "where": where},
            message=(f"rank {r} never issued {op} seq {seq} on pg {pg}, which rank(s) "
                     f"{fmt_ranks(issued_by)} entered"
                     + (f" and {'are' if len(still) > 1 else 'is'} still waiting in ({fmt_ns(waited)} at the end of the trace)" if still else "")
                     + f"; {lc_txt}"
                     + (f" ({n_missing} collectives of pg {pg} missing in all)" if n_missing > 1 else ""))))
    return out


#: Rank states (analysis/job.py) of a process that died: labelled crashed, never a non-joiner.
DIED_STATES = ("crashed", "killed", "exception")


def _where(stacks: list[str]) -> dict | None:
    """The innermost user frame of the main thread in the newest stack dump that has one."""
    from .job import innermost_user_frame

    for path in reversed(stacks or []):
        w = innermost_user_frame(path)
        if w:
            return w
    return None


def rank_crashed(run) -> list[Finding]:
    """Ranks whose process died (a fatal signal, an uncaught exception, or killed without an exit
    flush while the job went on), with the first collective they never issued and where they
    were. One source of rank states: :func:`commtrace.analysis.job.rank_states`."""
    if not hasattr(run, "rank_states"):
        return []
    states = run.rank_states()
    died = {r: s for r, s in states.items() if s.get("state") in DIED_STATES}
    if not died:
        return []
    early = {}
    if any(s["state"] == "killed" for s in died.values()):
        from .report import ended_early
        early = {e["rank"]: e for e in ended_early(run)}
    c = run.table("collectives")
    last = run.last_completed()
    out = []
    for r, st in sorted(died.items()):
        if st["state"] == "killed" and r not in early:
            continue  # torn down with the others after a hang: not a crash of its own
        # The peers' view: collectives of its groups it has no row of. Those its peers completed
        # it joined (its rows were lost with the process); the first they did not complete is
        # where it died.
        miss = run.sql(f"""
            SELECT k.pg, k.seq, k.op, k.first_enter_ns, k.site, k.complete OR NOT EXISTS (
                       SELECT 1 FROM {run.table('ops')} y WHERE y.ckey = k.ckey AND y.t_end_ns IS NULL) AS done
            FROM {c} k
            WHERE k.n_ranks < k.n_expected AND NOT EXISTS (
                SELECT 1 FROM {run.table('ops')} x WHERE x.ckey = k.ckey AND x.rank = ?)
            ORDER BY k.first_enter_ns""", [int(r)]).fetchall()
        miss = [m for m in miss if int(r) in (run.pg_members.get(m[0]) or [])]
        joined = [m for m in miss if m[5]]
        died_at = next((m for m in miss if not m[5]), None)
        if st["state"] == "exception" and died_at is None:
            continue  # it issued everything its peers did: the exception is in its own rows
        if st["state"] == "crashed":
            how = f"crashed ({st.get('signal') or 'a fatal signal'})"
        elif st["state"] == "exception":
            how = f"exited on an uncaught exception ({st.get('error')})"
        else:
            how = "died without an exit flush (killed, or a crash commtrace could not record)"
        lc = last.get(int(r))
        where = None
        if st.get("crash_file"):
            from .job import innermost_user_frame
            where = innermost_user_frame(st["crash_file"])
        msg = f"rank {r} {how}"
        pg = seq = op = site = t0 = None
        if died_at is not None:
            pg, seq, op, t0, site, _d = died_at
            msg += f" in or before {op} seq {seq} on pg {pg}, which its peers entered and never completed"
        if lc:
            msg += (f"; its last completed op was {lc['op']} seq {lc['seq']} on pg {lc['pg']}"
                    + (f" at {lc['site']}" if lc.get("site") else ""))
        if joined:
            j = joined[-1]
            msg += (f"; its peers completed {j[2]} seq {j[1]} on pg {j[0]} with it "
                    f"({len(joined)} collective(s) of it known only from its peers)")
        if not lc and not joined:
            msg += "; no completed op of it was recorded"
        if where:
            msg += f"; it was in {where['function']} at {where['site']}"
        if st.get("crash_file"):
            msg += f" (stacks: {st['crash_file']})"
        out.append(Finding(
            kind="rank_crashed", severity="error", rank=int(r), pg=pg, seq=_i(seq), op=op,
            site=(where or {}).get("site") or (lc or {}).get("site") or site, t_ns=_i(t0),
            evidence={"rank_state": st.get("state"), "signal": st.get("signal"), "error": st.get("error"),
                      "crash_file": st.get("crash_file"), "last_completed": lc, "where": where,
                      "exit_code": st.get("exit_code"),
                      "joined_per_peers": ({"pg": joined[-1][0], "seq": _i(joined[-1][1])} if joined else None)},
            message=msg))
    return out


def not_completed(run) -> list[Finding]:
    """Ops issued but never completed (no completion, no returned wait), other than
    collectives that some member never joined (those are `not_joined`)."""
    inc = _incomplete_keys(run)
    snaps = run.snapshot_ns
    tmax = run.t_max_ns or 0
    rows = run.sql(f"""
        WITH x AS (
            SELECT rank, pg, seq, op, site, t_enqueue_ns, op_id, async_op, peer, ckey FROM {run.table('ops')}
            WHERE kind = 'op' AND t_end_ns IS NULL AND error IS NULL)
        SELECT pg, CASE WHEN op IN {COLLECTIVE_SQL} THEN seq END AS cseq,
               CASE WHEN op IN {COLLECTIVE_SQL} THEN NULL ELSE rank END AS prank,
               CASE WHEN op IN {COLLECTIVE_SQL} THEN NULL ELSE coalesce(op_id, seq) END AS pid,
               mode(op), mode(site), min(t_enqueue_ns), list(DISTINCT rank ORDER BY rank), min(peer), min(seq)
        FROM x WHERE ckey IS NULL OR ckey NOT IN {inc}
        GROUP BY ALL ORDER BY min(t_enqueue_ns) LIMIT {MAX_PER_GROUP * 5}""").fetchall()
    out = []
    for pg, cseq, prank, pid, op, site, t0, ranks, peer, seq in rows:
        end = max([snaps.get(int(r), tmax) for r in ranks] + [tmax])
        waited = (end - t0) if t0 is not None else 0
        if cseq is not None:
            msg = (f"{op} seq {cseq} on pg {pg} was issued by every member but never completed on rank(s) "
                   f"{fmt_ranks(ranks)} ({fmt_ns(waited)} pending at the end of the trace)")
        else:
            msg = (f"{op} on rank {prank} (peer {peer}, pg {pg}) was issued but never completed "
                   f"({fmt_ns(waited)} pending at the end of the trace)")
        out.append(Finding(
            kind="not_completed", severity="error", rank=int(ranks[0]), pg=pg, seq=_i(cseq if cseq is not None else seq),
            op=op, site=site, t_ns=_i(t0), t_end_ns=_i(end), impact_ns=int(max(waited, 0)),
            evidence={"ranks": [int(x) for x in ranks], "pending_ns": int(max(waited, 0)),
                      "peer": _i(peer), "op_id": _i(pid)},
            message=msg))
    return out


def sync_rules(run) -> list[Finding]:
    """sync_while_inflight (synchronize() while async comm was in flight) and redundant_sync
    (synchronize() right after wait(), nothing issued between), grouped per call site."""
    t = run.table("ops")
    out = []
    if not run.sql(f"SELECT count(*) FROM {t} WHERE kind = 'sync'").fetchone()[0]:
        return out
    rows = run.sql(f"""
        WITH s AS (
            SELECT rank, site, t_enqueue_ns, t_return_ns, inflight FROM {t} WHERE kind = 'sync'),
        f AS (
            SELECT s.*, coalesce(s.inflight,
                (SELECT count(*) FROM {t} o WHERE o.rank = s.rank AND o.kind = 'op' AND coalesce(o.async_op, false)
                   AND o.t_enqueue_ns < s.t_enqueue_ns AND coalesce(o.t_end_ns, o.t_wait_end_ns, {run.t_max_ns or 0}) > s.t_enqueue_ns)) AS n_inflight
            FROM s)
        SELECT site, list(DISTINCT rank ORDER BY rank), count(*), sum(t_return_ns - t_enqueue_ns), max(n_inflight),
               min(t_enqueue_ns), max(t_return_ns)
        FROM f WHERE n_inflight > 0 GROUP BY site ORDER BY sum(t_return_ns - t_enqueue_ns) DESC""").fetchall()
    for site, ranks, n, total, mx, t0, t1 in rows:
        out.append(Finding(
            kind="sync_while_inflight", severity="warning", rank=int(ranks[0]), site=site,
            t_ns=_i(t0), t_end_ns=_i(t1), impact_ns=int(total or 0),
            evidence={"ranks": [int(r) for r in ranks], "count": int(n), "sync_ns": int(total or 0),
                      "max_inflight": int(mx)},
            message=(f"synchronize() at {site or 'unknown site'} ran {n} time(s) on rank(s) {fmt_ranks(ranks)} "
                     f"with up to {mx} async op(s) in flight, draining every stream ({fmt_ns(total)} in all); "
                     f"the communication could not overlap")))
    rows = run.sql(f"""
        WITH s AS (SELECT rank, site, t_enqueue_ns, t_return_ns, inflight FROM {t}
                   WHERE kind = 'sync' AND coalesce(inflight, 0) = 0),
        w AS (SELECT rank AS wr, t_wait_end_ns AS we, t_enqueue_ns AS op_t FROM {t}
              WHERE kind = 'op' AND t_wait_end_ns IS NOT NULL AND rank IN (SELECT rank FROM s)),
        e AS (SELECT rank AS er, t_enqueue_ns AS et FROM {t} WHERE kind IN ('op', 'sync') AND t_enqueue_ns IS NOT NULL
              AND rank IN (SELECT rank FROM s)),
        j AS (SELECT s.*, w.we FROM s ASOF JOIN w ON s.rank = w.wr AND s.t_enqueue_ns >= w.we),
        k AS (SELECT j.*, e.et AS last_issue FROM j ASOF JOIN e ON j.rank = e.er AND j.t_enqueue_ns > e.et)
        SELECT site, list(DISTINCT rank ORDER BY rank), count(*), sum(t_return_ns - t_enqueue_ns),
               min(t_enqueue_ns), max(t_return_ns), avg(t_enqueue_ns - we)
        FROM k WHERE t_enqueue_ns - we <= {REDUNDANT_SYNC_GAP_NS} AND (last_issue IS NULL OR last_issue <= we)
        GROUP BY site ORDER BY sum(t_return_ns - t_enqueue_ns) DESC""").fetchall()
    for site, ranks, n, total, t0, t1, gap in rows:
        out.append(Finding(
            kind="redundant_sync", severity="warning", rank=int(ranks[0]), site=site,
            t_ns=_i(t0), t_end_ns=_i(t1), impact_ns=int(total or 0),
            evidence={"ranks": [int(r) for r in ranks], "count": int(n), "sync_ns": int(total or 0),
                      "mean_gap_ns": float(gap or 0)},
            message=(f"synchronize() at {site or 'unknown site'} follows wait() directly ({n} time(s) on "
                     f"rank(s) {fmt_ranks(ranks)}, {fmt_ns(gap)} after it): a full device drain "
                     f"({fmt_ns(total)} in all) that the wait() already made unnecessary")))
    return out


def wait_immediately(run) -> list[Finding]:
    """Async ops waited right after the issue (t_wait - t_return <= WAIT_IMMEDIATE_NS) with no
    other call of that rank in between: the async op bought no overlap. Its impact is the time
    the op was in flight after its call returned (``t_end - t_return``): what waiting later
    could have overlapped. The time inside the call could not (an H200's first functional
    collective held the host 4.1 s in the call and was then in flight 0.3 ms)."""
    t = run.table("ops")
    cand = f"""SELECT rank, op, pg, seq, site, t_enqueue_ns, t_return_ns, t_wait_ns, t_end_ns FROM {t}
               WHERE kind = 'op' AND coalesce(async_op, false) AND t_wait_ns IS NOT NULL
                 AND t_return_ns IS NOT NULL AND t_wait_ns - t_return_ns <= {WAIT_IMMEDIATE_NS}"""
    if not run.sql(f"SELECT count(*) FROM ({cand})").fetchone()[0]:
        return []
    # The next call of the rank after the issue returned (ASOF: smallest later enqueue).
    rows = run.sql(f"""
        WITH c AS ({cand}),
        e AS (SELECT rank AS er, t_enqueue_ns AS et FROM {t} WHERE kind <> 'mark' AND t_enqueue_ns IS NOT NULL
              AND rank IN (SELECT rank FROM c)),
        a AS (SELECT c.*, e.et AS next_t FROM c ASOF LEFT JOIN e ON c.rank = e.er AND c.t_return_ns < e.et)
        SELECT site, mode(op), list(DISTINCT rank ORDER BY rank), count(*),
               sum(greatest(coalesce(t_end_ns, t_wait_ns) - t_return_ns, 0)), min(t_enqueue_ns),
               max(t_wait_ns),
               avg(t_wait_ns - t_return_ns), min(pg), min(seq)
        FROM a WHERE next_t IS NULL OR next_t >= t_wait_ns
        GROUP BY site ORDER BY count(*) DESC""").fetchall()
    out = []
    for site, op, ranks, n, total, t0, t1, gap, pg, seq in rows:
        out.append(Finding(
            kind="wait_immediately", severity="info", rank=int(ranks[0]), op=op, pg=pg, seq=_i(seq) if n == 1 else None,
            site=site, t_ns=_i(t0), t_end_ns=_i(t1), impact_ns=int(total or 0),
            evidence={"ranks": [int(r) for r in ranks], "count": int(n), "inflight_ns": int(total or 0),
                      "mean_gap_ns": float(gap or 0)},
            message=(f"async {op} at {site or 'unknown site'} was waited {fmt_ns(gap)} after the issue with "
                     f"nothing in between ({n} time(s) on rank(s) {fmt_ranks(ranks)}): "
                     f"{fmt_ns(total)} of communication that could have overlapped with work")))
    return out


def _hazard_method(detail, api) -> str:
    if detail and detail in KINDS:
        detail = None  # plain-text hazard kind; the api names the method (Tensor.item)
    if detail:
        try:
            d = json.loads(detail)
            if isinstance(d, dict):
                for k in ("method", "api", "call", "type"):
                    if d.get(k):
                        return str(d[k])
        except ValueError:
            return str(detail)
    if api:
        return str(api).rsplit(".", 1)[-1]
    return "a host read"


def use_before_wait(run) -> list[Finding]:
    """kind="hazard" rows written live by the capture side: a host read of an async op's tensor
    before wait(); `ref_op_id` names the pending op."""
    t = run.table("ops")
    if not run.sql(f"SELECT count(*) FROM {t} WHERE kind = 'hazard'").fetchone()[0]:
        return []
    api = run.lazy_columns("kind = 'hazard'", ["api"])
    run.register("__hz_api", api)
    rows = run.sql(f"""
        SELECT h.site, h.detail, a.api, list(DISTINCT h.rank ORDER BY h.rank), count(*), min(h.t_enqueue_ns),
               max(h.t_enqueue_ns), mode(o.op), mode(o.pg), min(o.seq), mode(o.site), min(h.ref_op_id),
               max(coalesce(o.t_wait_ns, o.t_end_ns) - h.t_enqueue_ns)
        FROM {t} h LEFT JOIN {t} o ON o.rank = h.rank AND o.op_id = h.ref_op_id AND o.kind = 'op'
             LEFT JOIN __hz_api a ON a.rid = h.rid
        WHERE h.kind = 'hazard'
        GROUP BY h.site, h.detail, a.api ORDER BY min(h.t_enqueue_ns)""").fetchall()
    run.unregister("__hz_api")
    out = []
    for site, detail, api, ranks, n, t0, t1, op, pg, seq, osite, ref, early in rows:
        method = _hazard_method(detail, api)
        kind = "use_before_wait"
        if detail in KINDS:
            kind = detail
        else:
            try:
                d = json.loads(detail) if detail else {}
                if isinstance(d, dict) and d.get("hazard") in KINDS:
                    kind = d["hazard"]
            except ValueError:
                pass
        opdesc = f"async {op} (pg {pg}, seq {seq}{', issued at ' + osite if osite else ''})" if op else "a pending async op"
        short = method.rsplit(".", 1)[-1] if method.startswith(("Tensor.", "torch.")) else method
        m = short if short.startswith(".") or " " in short else f".{short}()"
        out.append(Finding(
            kind=kind, severity="error", rank=int(ranks[0]), pg=pg, seq=_i(seq), op=op, site=site,
            t_ns=_i(t0), t_end_ns=_i(t1), impact_ns=int(n) * 1_000_000_000,
            evidence={"ranks": [int(r) for r in ranks], "count": int(n), "method": method,
                      "ref_op_id": _i(ref), "op_site": osite, "before_wait_ns": _i(early)},
            message=(f"{m} at {site or 'unknown site'} read the tensor of {opdesc} before its wait() "
                     f"({n} time(s) on rank(s) {fmt_ranks(ranks)}): the value may be stale")))
    return out


#: `chan` of a group's collectives in first_op_init_stall (a p2p op's chan is its peer).
CHAN_COLL = -(1 << 62)


def first_op_init_stall(run) -> list[Finding]:
    """The first op on a group (collectives) or peer pair (p2p) whose host block, beyond its
    wait for other ranks, stands out against the later ops of that group or pair on the same
    rank (lazy communicator set-up). Column `first_on_pg` when recorded, else derived. Not on a
    simulated rank (torch's fake backend): it sets nothing up, so a slow first op there is the
    host's own delay (a loaded machine), not this finding."""
    t = run.table("ops")
    w = run.table("waits")
    sim = sorted(int(r) for r, m in run.meta.items() if m.get("simulated"))
    not_sim = f" AND rank NOT IN ({', '.join(map(str, sim))})" if sim else ""
    # chan: the group's collectives (CHAN_COLL) or the peer of a p2p op (NULL when unknown).
    x = f"""SELECT rank, pg, seq, ckey, op, site, t_enqueue_ns, t_return_ns - t_enqueue_ns AS block,
                   CASE WHEN op IN {COLLECTIVE_SQL} THEN {CHAN_COLL} ELSE CAST(peer AS BIGINT) END AS chan, first_on_pg
            FROM {t} WHERE kind = 'op' AND t_return_ns IS NOT NULL AND pg IS NOT NULL{not_sim}"""
    has_flag = run.sql(f"SELECT count(*) FROM {t} WHERE first_on_pg").fetchone()[0] > 0
    if has_flag:
        firsts = f"SELECT * FROM ({x}) WHERE first_on_pg AND block >= {INIT_STALL_MIN_NS}"
    else:
        firsts = f"""SELECT * FROM (SELECT rank, pg, chan, arg_min(seq, t_enqueue_ns) AS seq, arg_min(ckey, t_enqueue_ns) AS ckey,
                            arg_min(op, t_enqueue_ns) AS op,
                            arg_min(site, t_enqueue_ns) AS site, min(t_enqueue_ns) AS t_enqueue_ns,
                            arg_min(block, t_enqueue_ns) AS block
                     FROM ({x}) GROUP BY rank, pg, chan) WHERE block >= {INIT_STALL_MIN_NS}"""
    rows = run.sql(f"""
        WITH f0 AS ({firsts}),
        base AS (SELECT y.rank, y.pg, y.chan, median(y.block) AS med
                 FROM ({x}) y JOIN f0 ON f0.rank = y.rank AND f0.pg = y.pg AND f0.chan = y.chan
                 WHERE y.t_enqueue_ns > f0.t_enqueue_ns GROUP BY ALL),
        f AS (SELECT f0.*, f0.block - coalesce(wt.wait_ns, 0) AS own, coalesce(b.med, 0) AS med
              FROM f0 LEFT JOIN base b ON b.rank = f0.rank AND b.pg = f0.pg AND b.chan = f0.chan
                      LEFT JOIN {w} wt ON wt.rank = f0.rank AND wt.ckey = f0.ckey)
        -- the rank that stalled most; among equal stalls the lowest (the same answer every run)
        SELECT pg, chan <> {CHAN_COLL} AS is_p2p, list(rank ORDER BY rank), max(own - med), arg_max(rank, (own, -rank)),
               arg_max(op, (own, -rank)), arg_max(site, (own, -rank)), max(med), min(t_enqueue_ns), max(seq)
        FROM f WHERE own - med >= {INIT_STALL_MIN_NS} AND own >= {INIT_STALL_RATIO} * med
        GROUP BY pg, is_p2p""").fetchall()
    out = []
    for pg, is_p2p, ranks, stall, r, op, site, med, t0, seq in rows:
        what = "peer pair" if is_p2p else "group"
        out.append(Finding(
            kind="first_op_init_stall", severity="info", rank=int(r), pg=pg, op=op, site=site,
            seq=None if is_p2p else _i(seq), t_ns=_i(t0), impact_ns=int(stall),
            evidence={"ranks": sorted(set(int(x) for x in ranks)), "stall_ns": int(stall),
                      "typical_block_ns": float(med or 0), "p2p": bool(is_p2p)},
            message=(f"the first {op} on {'a ' + what + ' of ' if is_p2p else ''}pg {pg} blocked the host "
                     f"{fmt_ns(stall)} longer than later ones (typical {fmt_ns(med)}) on rank(s) "
                     f"{fmt_ranks(ranks)}: lazy communicator/connection set-up; warm it up before timing")))
    return out


def clock_violation(run) -> list[Finding]:
    """Matched collectives whose completion precedes an entry after clock alignment."""
    ck = run.clock()
    if not ck["violations"]:
        return []
    w = ck.get("worst") or {}
    culprit = ck["late_ranks"][0] if len(ck["late_ranks"]) == 1 else None
    return [Finding(
        kind="clock_violation", severity="warning", rank=culprit, pg=w.get("pg"), seq=_i(w.get("seq")),
        impact_ns=int(ck["max_violation_ns"]),
        evidence={"violations": ck["violations"], "matched": ck["matched"],
                  "max_violation_ns": ck["max_violation_ns"], "late_ranks": ck["late_ranks"],
                  "offsets_ns": ck["offsets_ns"]},
        message=(f"{ck['violations']} of {ck['matched']} matched collectives end on some rank before another "
                 f"rank entered them (by up to {fmt_ns(ck['max_violation_ns'])}) after clock alignment: the "
                 f"recorded clock offsets look wrong"
                 + (f" (rank(s) {fmt_ranks(ck['late_ranks'])} appear to enter late)" if ck["late_ranks"] else "")))]


DETECTORS = (not_joined, rank_crashed, not_completed, collective_mismatch, use_before_wait, straggler, late_p2p,
             sync_rules, wait_immediately, first_op_init_stall, clock_violation)


def sort_findings(fs: list[Finding]) -> list[Finding]:
    """By severity (error, warning, info), then impact (largest first)."""
    return sorted(fs, key=lambda f: (SEVERITY_ORDER.get(f.severity, 9), -(f.impact_ns or 0), f.kind,
                                     f.rank if f.rank is not None else -1, f.seq if f.seq is not None else -1))


def detect_all(run) -> list[Finding]:
    """Run every detector; a detector that fails on odd input adds a warning, not an error."""
    return annotate(run, detect(run))


def detect(run) -> list[Finding]:
    """detect_all without the root-cause annotation (`cost_s`, `gain_s`, `root_cause`): the
    detectors' findings, sorted by severity then impact."""
    fs: list[Finding] = []
    for det in DETECTORS:
        try:
            fs.extend(det(run))
        except Exception as e:  # noqa: BLE001 -- partial traces must still give a report
            run.warnings.append(f"finding detector {det.__name__} failed: {type(e).__name__}: {str(e).splitlines()[0]}")
    bad = getattr(run.files, "conflict_ranks", None)
    if bad:
        fs = [f for f in fs if not _involves(f, bad)]
    return sort_findings(fs)


def annotate(run, fs: list[Finding]) -> list[Finding]:
    """The root-cause annotation of detect()'s findings (rootcause.annotate_findings), ordered
    by projected gain; on failure the findings stand without it (and a warning)."""
    try:
        from .rootcause import annotate_findings
        fs = annotate_findings(run, fs)
    except Exception as e:  # noqa: BLE001 -- the findings stand without their what-if
        run.warnings.append(f"root cause / what-if failed: {type(e).__name__}: {str(e).splitlines()[0]}")
    return fs


#: Findings that compare ranks: none is drawn from a rank two processes wrote (its rows mix).
CROSS_RANK = ("straggler", "late_sender", "late_receiver", "collective_mismatch", "not_joined",
              "not_completed", "clock_violation", "rank_crashed")


def _involves(f: Finding, ranks: set) -> bool:
    if f.kind not in CROSS_RANK:
        return f.rank in ranks
    ev = f.evidence or {}
    inv = {f.rank} | set(ev.get("ranks") or []) | set(ev.get("culprits") or []) \
        | set(ev.get("issued_by") or []) | set(ev.get("waiting") or []) | set(ev.get("late_ranks") or [])
    if f.kind == "clock_violation":
        return True  # offsets of a mixed rank are meaningless
    return bool(inv & ranks)
