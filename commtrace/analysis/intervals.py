"""Vectorised interval arithmetic per rank (numpy; no Python loop over ops).

Intervals of many ranks are handled in one pass by mapping (rank, t) to one key
``rank * stride + t`` with ``t`` relative to the run's start: sorting keys sorts by rank then
time, and no interval can reach into the next rank's range. This serves the overlap figures of
``shared/reference/metrics.md`` ("Overlap": the union C of comm intervals, the union of blocked
intervals, |C ∩ B|) and the time bins of the dashboard.
"""

from __future__ import annotations

import numpy as np


def keyspace_stride(span_ns: int) -> int:
    """Stride between ranks in key space: larger than any relative time."""
    return int(max(span_ns, 1)) + 1


def union(keys_s: np.ndarray, keys_e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals [s, e) given as keys: returns sorted disjoint segments (s, e).

    Sort by start, take the running maximum of the ends; a new segment starts where a start
    lies beyond every earlier end."""
    if len(keys_s) == 0:
        return keys_s.astype(np.int64), keys_e.astype(np.int64)
    order = np.argsort(keys_s, kind="stable")
    s = keys_s[order]
    e = np.maximum(keys_e[order], s)
    run_max = np.maximum.accumulate(e)
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > run_max[:-1]
    starts = np.flatnonzero(new)
    ends_at = np.r_[starts[1:] - 1, len(s) - 1]
    return s[starts], run_max[ends_at]


def intersect(a_s, a_e, b_s, b_e) -> tuple[np.ndarray, np.ndarray]:
    """Intersection of two unions of disjoint sorted segments: the segments covered by both,
    sorted.

    For each A segment, the B segments that overlap it form a contiguous index range (both
    lists are sorted and disjoint): [first B ending after a_s, first B starting at/after a_e).
    The pairs are expanded with repeat/cumsum (at most len(A) + len(B) of them) and clipped."""
    a_s, a_e, b_s, b_e = (np.asarray(x, dtype=np.int64) for x in (a_s, a_e, b_s, b_e))
    if len(a_s) == 0 or len(b_s) == 0:
        z = np.zeros(0, np.int64)
        return z, z
    lo = np.searchsorted(b_e, a_s, side="right")
    hi = np.searchsorted(b_s, a_e, side="left")
    cnt = np.maximum(hi - lo, 0)
    total = int(cnt.sum())
    if total == 0:
        z = np.zeros(0, np.int64)
        return z, z
    ai = np.repeat(np.arange(len(a_s)), cnt)
    start = np.cumsum(cnt) - cnt
    bi = np.repeat(lo, cnt) + (np.arange(total) - np.repeat(start, cnt))
    s = np.maximum(a_s[ai], b_s[bi])
    e = np.minimum(a_e[ai], b_e[bi])
    keep = e > s
    return s[keep], e[keep]


def per_rank_sum(keys_s, keys_e, stride: int, nranks: int) -> np.ndarray:
    """Total length of segments per rank (segments never straddle ranks)."""
    if len(keys_s) == 0:
        return np.zeros(nranks, np.int64)
    r = (keys_s // stride).astype(np.int64)
    return np.bincount(r, weights=(keys_e - keys_s).astype(np.float64), minlength=nranks)[:nranks]


def coverage_bins(s: np.ndarray, e: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Summed length of intervals [s, e) inside each bin [edges[k], edges[k+1]).

    Uses F(t) = sum_i clip(t - s_i, 0, e_i - s_i) = sum_{s_i<t}(t - s_i) - sum_{e_i<t}(t - e_i),
    evaluated at the edges with sorted starts/ends and prefix sums; exact in int64 for times
    relative to the window (overlapping intervals add up)."""
    nb = len(edges) - 1
    if len(s) == 0 or nb <= 0:
        return np.zeros(max(nb, 0), np.int64)
    lo, hi = int(edges[0]), int(edges[-1])
    e = np.clip(np.maximum(e, s), lo, hi) - lo
    s = np.clip(s, lo, hi) - lo
    edges = edges - lo
    s = np.sort(s)
    e = np.sort(e)
    cs = np.r_[0, np.cumsum(s, dtype=np.int64)]
    ce = np.r_[0, np.cumsum(e, dtype=np.int64)]
    ks = np.searchsorted(s, edges, side="left")
    ke = np.searchsorted(e, edges, side="left")
    F = (ks * edges - cs[ks]) - (ke * edges - ce[ke])
    return np.diff(F)
