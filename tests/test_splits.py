"""Purged k-fold / walk-forward splits (AFML ch. 7) against the reference values and a slow loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alphafeat.splits import purge, purged_kfold, purged_walk_forward, train_val_test_split


def test_afml_reference_values():
    # reference-values.md, "Purged k-fold with embargo": N = 10, t_i1 = i + 2, 2 folds, pct = 0.1
    i = np.arange(10)
    folds = purged_kfold(i, i + 2, n_splits=2, pct_embargo=0.1)
    assert [te.tolist() for _, te in folds] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert folds[0][0].tolist() == [7, 8, 9]
    assert folds[1][0].tolist() == [0, 1, 2, 3]


def test_no_embargo_keeps_first_non_overlapping_sample():
    i = np.arange(10)
    train, _ = purged_kfold(i, i + 2, 2, 0.0)[0]
    assert train.tolist() == [6, 7, 8, 9]  # sample 6 starts when the last test label ends


def slow_purge(train, test, t0, t1, embargo):
    """Independent loop: AFML snippet 7.3 semantics written out element by element."""
    T0 = t0[min(test)]
    T1 = max(t1[j] for j in test)
    survivors = []
    for i in sorted(train):
        if i in test:
            continue
        if t0[i] < T1 and t1[i] > T0:  # spans overlap (touching endpoints allowed)
            continue
        survivors.append(i)
    # the embargo starts at the first sample starting at/after T1 (or right after the block)
    first = max(max(test) + 1, int(np.searchsorted(t0, T1, side="left")))
    embargoed = {i for i in survivors if first <= i < first + embargo}
    return [i for i in survivors if i not in embargoed]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=4, max_size=40),
    st.lists(st.integers(0, 12), min_size=40, max_size=40),
    st.integers(2, 4),
    st.sampled_from([0.0, 0.05, 0.1, 0.2]),
)
def test_kfold_matches_slow_loop_and_never_overlaps(gaps, lengths, k, pct):
    t0 = np.cumsum(gaps)
    t1 = t0 + np.array(lengths[: len(t0)])
    n = len(t0)
    if k > n:
        return
    emb = int(np.floor(pct * n))
    for train, test in purged_kfold(t0, t1, k, pct):
        assert train.tolist() == slow_purge(range(n), set(test.tolist()), t0, t1, emb)
        T0, T1 = t0[test[0]], t1[test].max()
        assert not np.any((t0[train] < T1) & (t1[train] > T0))
        assert not set(train.tolist()) & set(test.tolist())


def test_walk_forward_trains_only_on_the_past():
    rng = np.random.default_rng(1)
    t0 = np.cumsum(rng.integers(1, 5, 200))
    t1 = t0 + rng.integers(0, 30, 200)
    folds = purged_walk_forward(t0, t1, n_splits=4)
    assert len(folds) == 4
    for train, test in folds:
        assert train.max() < test.min()
        assert np.all(t1[train] <= t0[test[0]])  # no training label reaches into the test block
        # and nothing more than the overlap was dropped
        cand = np.arange(test[0])
        assert train.tolist() == cand[t1[cand] <= t0[test[0]]].tolist()


def test_train_val_test_split_purges_each_later_block():
    t0 = np.arange(100)
    t1 = t0 + 5
    train, val, test = train_val_test_split(t0, t1, 0.2, 0.2)
    assert test.tolist() == list(range(80, 100))
    assert val.tolist() == list(range(60, 76))  # 76..79 end after the test block starts (80)
    assert train.tolist() == list(range(0, 56))  # 56..59 end after the validation block starts (60)
    with pytest.raises(ValueError):
        train_val_test_split(t0[:2], t1[:2], 0.2, 0.2)


def test_bad_spans_are_rejected():
    with pytest.raises(ValueError):
        purged_kfold(np.array([0, 2, 1]), np.array([1, 3, 4]), 2)
    with pytest.raises(ValueError):
        purged_kfold(np.array([0, 1, 2]), np.array([1, 0, 4]), 2)


def test_purge_empty_inputs():
    t = np.arange(5)
    assert purge(np.array([], int), np.array([1]), t, t).size == 0
