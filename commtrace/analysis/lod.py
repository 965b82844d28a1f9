"""Level-of-detail timeline bins at interactive speed.

:meth:`commtrace.analysis.run.Run.timeline_bins` answers each window with a query over the rows
in it (O(rows)). A dashboard asks for a new window on every zoom, so :class:`TimelineBins`
prepares, once, per rank and per kind of interval, the sorted starts and ends with their prefix
sums; any window and bin count is then O(nbins log rows) and gives the same table as
`Run.timeline_bins` (same columns, same integers).

The summed length of intervals [s_i, e_i) up to t is
F(t) = sum_{s_i < t} (t - s_i) - sum_{e_i < t} (t - e_i) (the identity behind
:func:`commtrace.analysis.intervals.coverage_bins`), so a bin [t0, t1) holds F(t1) - F(t0):
overlapping intervals add up, as in `timeline_bins`."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Kinds of interval, in `timeline_bins`' column order.
KINDS = ("blocked_ns", "inflight_ns", "wait_ns", "sync_ns")
#: Prefix sums stay exact in int64 below this (|sum of times| < 2**62).
_SAFE = 2 ** 62


def _np(t: pa.Table, name: str) -> np.ndarray:
    a = t[name]
    return pc.fill_null(a, -(2 ** 62)).to_numpy(zero_copy_only=False).astype(np.int64)


class _Sorted:
    """Sorted starts and ends of one set of intervals, relative to `base`, with prefix sums."""

    __slots__ = ("s", "e", "cs", "ce")

    def __init__(self, s: np.ndarray, e: np.ndarray):
        e = np.maximum(e, s)
        self.s, self.e = np.sort(s), np.sort(e)
        self.cs = np.r_[0, np.cumsum(self.s, dtype=np.int64)]
        self.ce = np.r_[0, np.cumsum(self.e, dtype=np.int64)]

    def F(self, t: np.ndarray) -> np.ndarray:
        """Summed length of the intervals' parts before each t (int64, exact)."""
        ks = np.searchsorted(self.s, t, side="left")
        ke = np.searchsorted(self.e, t, side="left")
        return (ks * t - self.cs[ks]) - (ke * t - self.ce[ke])


class TimelineBins:
    """`Run.timeline_bins` for any window, from arrays prepared once from a loaded run.

    Built from the analysis API only: `run.ops(kinds=("op", "sync"))` (host calls, waits,
    in-flight spans, synchronize(); pass `ops` when you already hold a `run.ops()` table with
    these kinds, other kinds are ignored) and `run.waits()` (Scalasca wait states). Use
    :meth:`bins` like `timeline_bins`; `exact` is False when the run's times are too large for
    exact int64 prefix sums, and :meth:`bins` then asks `run.timeline_bins` instead."""

    def __init__(self, run, ops: pa.Table | None = None):
        self.run = run
        self.t_min_ns = int(run.t_min_ns or 0)
        self.t_max_ns = int(run.t_max_ns or self.t_min_ns)
        self.ranks = sorted(int(r) for r in run.ranks)
        base = self.t_min_ns
        t = run.ops(kinds=("op", "sync")) if ops is None else ops
        rank = t["rank"].to_numpy(zero_copy_only=False).astype(np.int64)
        kind = t["kind"].to_numpy(zero_copy_only=False)
        cols = {c: _np(t, c) for c in ("t_enqueue_ns", "t_return_ns", "t_end_ns", "t_wait_ns", "t_wait_end_ns")}
        w = run.waits()
        w_rank = w["rank"].to_numpy(zero_copy_only=False).astype(np.int64)
        w_s = _np(w, "t_enqueue_ns")
        w_ns = pc.fill_null(w["wait_ns"], 0).to_numpy(zero_copy_only=False).astype(np.int64)
        null = -(2 ** 62)
        is_op, is_sync = kind == "op", kind == "sync"
        # The intervals timeline_bins draws: (kind, mask, start, end), nulls dropped.
        spans = [
            (0, is_op, cols["t_enqueue_ns"], cols["t_return_ns"]),
            (0, is_op, cols["t_wait_ns"], cols["t_wait_end_ns"]),
            (1, is_op, cols["t_enqueue_ns"], cols["t_end_ns"]),
            (3, is_sync, cols["t_enqueue_ns"], cols["t_return_ns"]),
        ]
        self._iv: dict[tuple[int, int], _Sorted] = {}
        biggest = 0
        parts: dict[tuple[int, int], list] = {}
        for k, m, s, e in spans:
            m = m & (s != null) & (e != null)
            for r in np.unique(rank[m]).tolist():
                mr = m & (rank == r)
                parts.setdefault((int(r), k), []).append((s[mr] - base, e[mr] - base))
        mw = (w_ns > 0) & (w_s != null)
        for r in np.unique(w_rank[mw]).tolist():
            mr = mw & (w_rank == r)
            parts.setdefault((int(r), 2), []).append((w_s[mr] - base, w_s[mr] + w_ns[mr] - base))
        for key, ps in parts.items():
            s = np.concatenate([p[0] for p in ps])
            e = np.concatenate([p[1] for p in ps])
            if len(s):
                biggest = max(biggest, len(s) * int(max(np.abs(s).max(), np.abs(e).max()) + 1))
            self._iv[key] = _Sorted(s, e)
        # ops entered, per rank (for the `ops` column)
        self._enter = {int(r): np.sort(cols["t_enqueue_ns"][is_op & (rank == r) & (cols["t_enqueue_ns"] != null)] - base)
                       for r in np.unique(rank[is_op]).tolist()}
        span = self.t_max_ns - base + 1
        self.exact = biggest < _SAFE and span * 4 * max((len(v.s) for v in self._iv.values()), default=1) < _SAFE

    def bins(self, t0=None, t1=None, nbins: int = 200) -> pa.Table:
        """Per (rank, bin) over [t0, t1) ns: the table of `Run.timeline_bins(t0, t1, nbins)`."""
        t0 = self.t_min_ns if t0 is None else int(t0)
        t1 = (self.t_max_ns + 1) if t1 is None else int(t1)
        nbins = max(1, int(nbins))
        if not self.exact or t1 <= t0:
            return self.run.timeline_bins(t0, t1, nbins=nbins)
        edges = np.linspace(t0, t1, nbins + 1).round().astype(np.int64)
        edges[0], edges[-1] = t0, t1
        rel = edges - self.t_min_ns
        nr = len(self.ranks)
        out = np.zeros((4, nr, nbins), np.int64)
        ops = np.zeros((nr, nbins), np.int64)
        for i, r in enumerate(self.ranks):
            for k in range(4):
                iv = self._iv.get((r, k))
                if iv is not None:
                    out[k, i] = np.diff(iv.F(rel))
            en = self._enter.get(r)
            if en is not None and len(en):
                # timeline_bins' bin of an op: floor((t - t0) * nbins / (t1 - t0)), in doubles
                x = en[np.searchsorted(en, rel[0], "left"):np.searchsorted(en, rel[-1], "left")] - rel[0]
                b = np.floor((x * nbins).astype(np.float64) / float(t1 - t0)).astype(np.int64)
                b = b[(b >= 0) & (b < nbins)]
                ops[i] = np.bincount(b, minlength=nbins)
        return pa.table({
            "rank": pa.array(np.repeat(np.array(self.ranks, np.int32), nbins)),
            "bin": pa.array(np.tile(np.arange(nbins, dtype=np.int64), nr)),
            "t0_ns": pa.array(np.tile(edges[:-1], nr)), "t1_ns": pa.array(np.tile(edges[1:], nr)),
            **{name: pa.array(out[k].ravel()) for k, name in enumerate(KINDS)},
            "ops": pa.array(ops.ravel())})
