"""The dashboard's cache of one loaded run: every derived table the views need, computed once at
server start through the analysis API (`commtrace.load`), kept as numpy arrays so that each
interaction is a numpy slice, not a query. Nothing here reads a file."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..analysis.lod import TimelineBins
from ..analysis.report import build_report
from ..ops import P2P_OPS

#: ns -> s for the x axis (time since the start of the run).
NS = 1e9


def _col(t: pa.Table, name: str, dtype=None, fill=None) -> np.ndarray:
    """Column `name` of `t` as numpy; nulls become `fill` (NaN for floats)."""
    a = t[name]
    if fill is not None:
        a = pc.fill_null(a, fill)
    out = a.to_numpy(zero_copy_only=False)
    return out.astype(dtype) if dtype is not None else out


def _codes(t: pa.Table, name: str) -> tuple[np.ndarray, list]:
    """Dictionary-encode a string column: (int32 codes with -1 for null, values)."""
    d = pc.dictionary_encode(t[name].combine_chunks() if t.num_rows else pa.array([], pa.string()))
    codes = pc.fill_null(d.indices, -1).to_numpy(zero_copy_only=False).astype(np.int32)
    return codes, [None if v is None else str(v) for v in d.dictionary.to_pylist()]


class RunData:
    """Everything the dashboard draws from, derived from one :class:`commtrace.analysis.run.Run`.

    Times are float seconds since `t_min_ns` (the run's first aligned event), per metrics.md's
    timestamps; ops are ordered by `t_enqueue_ns` so a time window is a searchsorted slice."""

    def __init__(self, run, nbins: int = 400):
        self.run = run
        self.t_min_ns = int(run.t_min_ns or 0)
        self.t_max_ns = int(run.t_max_ns or self.t_min_ns)
        self.duration_s = max((self.t_max_ns - self.t_min_ns) / NS, 1e-9)
        #: the range slider's step (its value is kept on this grid so that it does not echo)
        self.slider_step = self.duration_s / 10000
        self.ranks = [int(r) for r in run.ranks]
        self.row_of = {r: i for i, r in enumerate(self.ranks)}
        self.nbins = nbins
        self._lock = threading.Lock()
        self._bins_cache: OrderedDict = OrderedDict()

        t = run.ops(kinds=("op", "sync", "hazard"))
        # Prefix sums of every interval, so that any window's bins take milliseconds.
        self.lod = TimelineBins(run, ops=t)
        kind, kinds = _codes(t, "kind")
        order = np.argsort(_col(t, "t_enqueue_ns", np.int64, 0), kind="stable")
        t = t.take(pa.array(order))
        kind = kind[order]
        is_op = kind == (kinds.index("op") if "op" in kinds else -2)
        is_sync = kind == (kinds.index("sync") if "sync" in kinds else -2)
        is_haz = kind == (kinds.index("hazard") if "hazard" in kinds else -2)


        self.o = self._ops_arrays(t.filter(pa.array(is_op)))
        self.sync = self._ops_arrays(t.filter(pa.array(is_sync)))
        self.hazards = self._ops_arrays(t.filter(pa.array(is_haz)))
        self._p2p_codes = [i for i, v in enumerate(self.o["op_values"]) if v in P2P_OPS]
        # Longest op span, so that a window query also finds ops entered before it that are
        # still running inside it.
        o = self.o
        # fmax ignores NaN without warning (an op still pending has no end yet)
        span = (np.fmax(np.fmax(o["t_return"], o["t_end"]), o["t_wait_end"]) - o["t_enqueue"]) if len(o["rank"]) else np.zeros(0)
        self.max_span_s = float(np.nanmax(span)) if len(span) and np.isfinite(span).any() else 0.0

        self.collectives = run.collectives()
        c = self.collectives
        self.coll_index = {(pg, int(s)): i for i, (pg, s) in enumerate(zip(c["pg"].to_pylist(), c["seq"].to_pylist()))}
        self.per_rank = run.per_rank()
        self.per_step = run.per_step()
        self.stragglers = run.stragglers()
        self.p2p = run.p2p()
        self.summary = run.collectives_summary()
        self.findings = list(run.findings())
        self.clock = run.clock()
        self.full_bins = self.lod.bins(nbins=nbins)
        # The report JSON (`commtrace report --format json`): every number the views print comes
        # from it or from the same cached analysis tables, so that they cannot disagree.
        self.report = build_report(run)
        self.overview = self.report["overview"]
        self.critical = self._critical_arrays(run)

    def _critical_arrays(self, run) -> dict | None:
        """The critical path's segments (`commtrace.analysis.critical_path.segments`, the table
        behind the report's `critical_path` section) with times relative (s) and the timeline
        row of each; None when the report has no critical path (skipped on large runs, or the
        analysis failed: the report's warnings say which)."""
        if self.report.get("critical_path") is None:
            return None
        from ..analysis.rootcause import segments
        t = segments(run)
        rank = _col(t, "rank", np.int64, 0)
        rows = np.array([self.row_of.get(int(r), -1) for r in rank.tolist()], np.int64)
        return {"rank": rank, "row": rows,
                "t0": (_col(t, "t0_ns", np.int64, 0) - self.t_min_ns) / NS,
                "t1": (_col(t, "t1_ns", np.int64, 0) - self.t_min_ns) / NS,
                "kind": t["kind"].to_pylist(), "op": t["op"].to_pylist(), "pg": t["pg"].to_pylist(),
                "seq": t["seq"].to_pylist(), "step": t["step"].to_pylist()}

    def _ops_arrays(self, t: pa.Table) -> dict:
        """The columns the timeline draws, as numpy, times relative (s)."""
        def rel(name):
            a = _col(t, name, np.float64)
            return (a - self.t_min_ns) / NS

        out = {"rank": _col(t, "rank", np.int64, 0)}
        for name in ("t_enqueue", "t_return", "t_end", "t_wait", "t_wait_end"):
            out[name] = rel(name + "_ns")
        out["seq"] = _col(t, "seq", np.int64, -1)
        out["bytes"] = _col(t, "bytes", np.int64, 0)
        out["inflight"] = _col(t, "inflight", np.int64, 0)
        out["peer"] = _col(t, "peer", np.int64, -1)
        for name in ("op", "pg", "site", "api"):
            out[name], out[name + "_values"] = _codes(t, name)
        rows = np.full(max(self.ranks, default=0) + 1, -1, np.int64)
        for r, i in self.row_of.items():
            rows[r] = i
        out["row"] = rows[out["rank"]] if len(out["rank"]) else np.zeros(0, np.int64)
        return out

    # ------------------------------------------------------------------ windows
    def window(self, a: float, b: float) -> np.ndarray:
        """Indices of ops drawn in [a, b] (s): entered before b and not finished before a."""
        o = self.o
        lo = np.searchsorted(o["t_enqueue"], a - self.max_span_s, "left")
        hi = np.searchsorted(o["t_enqueue"], b, "right")
        idx = np.arange(lo, hi)
        if not len(idx):
            return idx
        last = np.nanmax(np.c_[o["t_return"][idx], o["t_end"][idx], o["t_wait_end"][idx], o["t_enqueue"][idx]], axis=1)
        return idx[last >= a]

    def count_in(self, a: float, b: float) -> int:
        """Ops entered in [a, b] (cheap upper-bound estimate of what the exact view would draw)."""
        e = self.o["t_enqueue"]
        return int(np.searchsorted(e, b, "right") - np.searchsorted(e, a, "left"))

    def bins(self, a: float, b: float, nbins: int | None = None) -> pa.Table:
        """`Run.timeline_bins` over [a, b] (s) (computed by :class:`TimelineBins`, same table),
        cached per window (LRU of 32)."""
        nbins = nbins or self.nbins
        if a <= 0 and b >= self.duration_s and nbins == self.nbins:
            return self.full_bins
        key = (round(a, 9), round(b, 9), nbins)
        with self._lock:
            if key in self._bins_cache:
                self._bins_cache.move_to_end(key)
                return self._bins_cache[key]
        t = self.lod.bins(self.t_min_ns + int(a * NS), self.t_min_ns + int(b * NS), nbins=nbins)
        with self._lock:
            self._bins_cache[key] = t
            while len(self._bins_cache) > 32:
                self._bins_cache.popitem(last=False)
        return t

    def copies(self, pg: str, seq: int) -> np.ndarray:
        """Indices of every rank's op of collective (pg, seq)."""
        o = self.o
        if pg not in o["pg_values"]:
            return np.zeros(0, np.int64)
        m = (o["pg"] == o["pg_values"].index(pg)) & (o["seq"] == int(seq))
        return np.flatnonzero(m & ~np.isin(o["op"], self._p2p_codes))

    def collective(self, pg: str, seq: int) -> dict | None:
        """The `collectives()` row of (pg, seq) as a dict, or None (p2p, unmatched)."""
        i = self.coll_index.get((pg, int(seq)))
        return None if i is None else self.collectives.slice(i, 1).to_pylist()[0]
