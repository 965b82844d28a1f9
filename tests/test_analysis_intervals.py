"""Interval arithmetic of the overlap figures (commtrace/analysis/intervals.py) against a
brute-force reference."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from commtrace.analysis import intervals as IV

T = 120
segs = st.lists(st.tuples(st.integers(0, T - 1), st.integers(0, 25)), max_size=25)


def cover(pairs):
    c = np.zeros(T + 30, bool)
    for s, e in pairs:
        c[s:e] = True
    return c


@settings(max_examples=300, deadline=None)
@given(segs, segs)
def test_union_and_intersection_lengths(a, b):
    a_s = np.array([s for s, _ in a], np.int64)
    a_e = np.array([s + d for s, d in a], np.int64)
    b_s = np.array([s for s, _ in b], np.int64)
    b_e = np.array([s + d for s, d in b], np.int64)
    us, ue = IV.union(a_s, a_e)
    vs, ve = IV.union(b_s, b_e)
    ca, cb = cover(zip(a_s, a_e)), cover(zip(b_s, b_e))
    assert int((ue - us).sum()) == int(ca.sum())
    assert np.all(us[1:] > ue[:-1])  # disjoint, sorted, not touching
    xs, xe = IV.intersect(us, ue, vs, ve)
    assert int((xe - xs).sum()) == int((ca & cb).sum())
    assert np.all(xs[1:] >= xe[:-1])


@settings(max_examples=200, deadline=None)
@given(segs, st.integers(1, 17))
def test_coverage_bins(a, nb):
    s = np.array([x for x, _ in a], np.int64)
    e = np.array([x + d for x, d in a], np.int64)
    edges = np.linspace(10, 100, nb + 1).round().astype(np.int64)
    got = IV.coverage_bins(s, e, edges)
    for k in range(nb):
        lo, hi = edges[k], edges[k + 1]
        want = sum(max(0, min(y, hi) - max(x, lo)) for x, y in zip(s, e))
        assert got[k] == want


def test_per_rank_keys_do_not_mix():
    stride = IV.keyspace_stride(1000)
    s = np.array([0 * stride + 10, 1 * stride + 10, 1 * stride + 500], np.int64)
    e = np.array([0 * stride + 900, 1 * stride + 20, 1 * stride + 600], np.int64)
    us, ue = IV.union(s, e)
    assert list(IV.per_rank_sum(us, ue, stride, 2)) == [890, 110]
