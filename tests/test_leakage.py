"""A leaky split inflates the score of a trivial classifier; the purged split does not.

Generated data with nothing to predict: a random walk of the mid on a tick grid, irregular
times, direction labels at a horizon of 100 snapshots made by :mod:`alphafeat.labels` (so
each label shares 99 of its 100 future steps with its neighbour, and its end time ``t1`` is
known), and one slow feature (an EMA of the mid level). A 5-nearest-neighbour classifier on
that feature finds, under a shuffled k-fold, the test row's own neighbours in time in the
training set — with almost the same feature and the same overlapping label — and scores far
above chance. Purged k-fold with embargo and purged walk-forward (AFML ch. 7,
:mod:`alphafeat.splits`) drop every training row whose label span overlaps the test block, and
the score falls back to chance. The AUC is averaged over folds and over 8 seeds: with
overlapping labels a single path holds few independent outcomes, so one path alone is noisy.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import KFold
from sklearn.neighbors import KNeighborsClassifier

from alphafeat.labels import direction_labels
from alphafeat.splits import purged_kfold, purged_walk_forward

H = 100


def _fold_auc(x, y, splits) -> float:
    aucs = []
    for train, test in splits:
        clf = KNeighborsClassifier(5).fit(x[train], y[train])
        classes = list(clf.classes_)  # a training block can hold one class only
        p = clf.predict_proba(x[test])[:, classes.index(1.0)] if 1.0 in classes else np.zeros(len(test))
        if len(np.unique(y[test])) == 2:
            aucs.append(roc_auc_score(y[test], p))
    return float(np.mean(aucs))


def _path(seed: int, n: int = 20_000):
    rng = np.random.default_rng(seed)
    ts = np.cumsum(rng.exponential(1e8, n)).astype(np.int64)  # ~0.1 s between snapshots
    mid = 5000 + 0.25 * np.cumsum(rng.choice([-1, 0, 1], n, p=[0.2, 0.6, 0.2]))
    lab = direction_labels(mid, [H], ts=ts)
    ema = np.empty(n)
    e = mid[0]
    for i in range(n):
        e = 0.01 * mid[i] + 0.99 * e
        ema[i] = e
    y, t1 = lab[f"label_h{H}"], lab[f"t1_h{H}"]
    m = ~np.isnan(y)
    return ema[m].reshape(-1, 1), y[m], ts[m], t1[m]


def test_leaky_split_inflates_purged_does_not():
    scores = []
    for seed in range(8):
        x, y, t0, t1 = _path(seed)
        assert (t1 > t0).all()
        scores.append((
            _fold_auc(x, y, KFold(5, shuffle=True, random_state=0).split(x)),
            _fold_auc(x, y, purged_kfold(t0, t1, 5, pct_embargo=0.01)),
            _fold_auc(x, y, purged_walk_forward(t0, t1, 4)),
        ))
    leaky, purged, walk = np.mean(scores, axis=0)
    print(f"mean AUC: shuffled k-fold {leaky:.3f}, purged k-fold {purged:.3f}, purged walk-forward {walk:.3f}")
    assert leaky > 0.65
    assert abs(purged - 0.5) < 0.06
    assert abs(walk - 0.5) < 0.07
    assert leaky - max(purged, walk) > 0.1
