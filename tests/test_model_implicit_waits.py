"""The model's implicit DDP waits (analysis/model.py `_implicit_waits`), vectorised, against the
per-row definition written out as a plain loop: same wait events on random rows (ties,
missing times, several ranks), and one planted case with a known answer."""

import numpy as np

from commtrace.analysis.model import _implicit_waits

NUL = np.iinfo(np.int64).min


def _reference(cand, rank_r, t_enq, t_ret, t_end, t_w, t_we):
    """The definition (model._implicit_waits' docstring) row by row."""
    n = len(rank_r)
    cand = cand & (t_w == NUL) & (t_end != NUL) & (t_ret != NUL) & (t_enq != NUL)
    best = {}
    for j in np.flatnonzero(cand):
        same = np.flatnonzero(rank_r == rank_r[j])
        before = [i for i in same if t_enq[i] < t_end[j]]
        if not before:
            continue
        b = max(before)  # rows of a rank are in t_enqueue order
        if b < j or t_ret[b] >= t_end[j]:
            continue
        if b not in best or t_end[j] > t_end[best[b]]:
            best[b] = j
    for b, j in best.items():
        t_w[j] = t_ret[b]
        t_we[j] = t_end[j]
    assert n == len(t_w)


def test_planted_bucket_waits():
    # one rank: three bucket all_reduces (rows 0-2) issued during backward, then call 3
    # returns at 50; buckets complete at 60 and 70 (after it: the rank blocked until 70) and
    # at 40 (during call 3: no block). Row 4 starts at 80.
    rank = np.zeros(5, np.int64)
    enq = np.array([0, 10, 20, 30, 80])
    ret = np.array([1, 11, 21, 50, 81])
    end = np.array([60, 70, 40, 55, 90])
    tw, twe = np.full(5, NUL), np.full(5, NUL)
    cand = np.array([True, True, True, False, False])
    _implicit_waits(cand, rank, enq, ret, end, tw, twe, NUL)
    assert tw.tolist() == [NUL, 50, NUL, NUL, NUL]
    assert twe.tolist() == [NUL, 70, NUL, NUL, NUL]


def test_same_as_definition_on_random_rows():
    rng = np.random.default_rng(7)
    for _ in range(1500):
        n = int(rng.integers(1, 30))
        rank = np.sort(rng.integers(0, 3, n))
        enq = rng.integers(0, 80, n)
        o = np.lexsort((enq, rank))
        rank, enq = rank[o], enq[o]
        ret = np.where(rng.random(n) < 0.05, NUL, enq + rng.integers(0, 10, n))
        end = np.where(rng.random(n) < 0.1, NUL, enq + rng.integers(0, 50, n))
        tw = np.where(rng.random(n) < 0.3, enq + 5, NUL)
        cand = rng.random(n) < 0.6
        a = [x.copy() for x in (enq, ret, end, tw, tw)]
        b = [x.copy() for x in (enq, ret, end, tw, tw)]
        _reference(cand, rank, *a)
        _implicit_waits(cand, rank, *b, NUL)
        for x, y in zip(a, b):
            assert x.tolist() == y.tolist()
