"""Walk-forward folds over sessions and the session-bootstrap AUC interval."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from alphamodel.supervised.evaluation import bootstrap_auc, bootstrap_aucs, session_groups, walk_forward_folds
from alphamodel.supervised.metrics import auc


def test_bootstrap_interval_covers_the_true_auc():
    """Scores N(mu * y, 1): the true AUC is Phi(mu / sqrt 2). The 95% interval from 30 groups
    of 20 rows must cover it in >= 90% of 100 independent repeats."""
    rng = np.random.default_rng(0)
    mu = 0.8
    true = norm.cdf(mu / np.sqrt(2))
    groups = np.repeat(np.arange(30), 20)
    covered, widths = 0, []
    for r in range(100):
        y = (rng.random(600) < 0.4).astype(float)
        s = rng.normal(size=600) + mu * y
        a, lo, hi = bootstrap_auc(s, y, groups, n_boot=200, seed=r)
        assert a == pytest.approx(auc(s, y), abs=1e-12)  # the point estimate is the plain AUC
        covered += lo <= true <= hi
        widths.append(hi - lo)
    assert covered >= 90
    assert 0.05 < np.mean(widths) < 0.2  # not trivially wide


def test_bootstrap_pairs_the_columns_and_skips_nan_labels():
    rng = np.random.default_rng(1)
    y = (rng.random(400) < 0.5).astype(float)
    s = rng.normal(size=400) + y
    y[::7] = np.nan
    point, reps = bootstrap_aucs(np.stack([s, s], 1), y, np.repeat(np.arange(20), 20), 50)
    assert point[0] == pytest.approx(auc(s, y)) and np.array_equal(reps[:, 0], reps[:, 1])
    assert np.isnan(bootstrap_auc(s, np.ones(400), np.zeros(400))[0])  # one class: NaN, not a number


def test_pooled_auc_compares_rows_within_their_fold_only():
    """Folds as strata: the AUC is the pair-weighted mean of the folds' AUCs (a slow count of
    the positive-negative pairs within each fold), not moved by the folds' score levels."""
    rng = np.random.default_rng(2)
    fold = np.repeat([0, 1, 2], 150)
    y = (rng.random(450) < np.array([0.2, 0.5, 0.8])[fold]).astype(float)
    s = rng.normal(size=450) + 0.5 * y + np.array([-3.0, 0.0, 3.0])[fold]  # a level per fold, following its base rate
    num = den = 0.0
    for f in range(3):
        p, n = s[(fold == f) & (y == 1)], s[(fold == f) & (y == 0)]
        num += (p[:, None] > n[None, :]).sum() + 0.5 * (p[:, None] == n[None, :]).sum()
        den += p.size * n.size
    point, reps = bootstrap_aucs(s, y, np.arange(450) // 15, 30, strata=fold)
    assert point[0] == pytest.approx(num / den, abs=1e-12)
    assert auc(s, y) > point[0] + 0.1  # pooled without strata, the levels alone lift it
    const = np.array([0.2, 0.5, 0.8])[fold]  # a per-fold base rate: no skill within any fold
    assert bootstrap_aucs(const, y, np.arange(450) // 15, 0, strata=fold)[0][0] == pytest.approx(0.5)


def test_walk_forward_folds_over_sessions_purged_with_embargo():
    sess = np.repeat(np.arange(7), 10)
    t0 = np.arange(70)
    t1 = [t0 + 2]
    folds = walk_forward_folds(t0, t1, sess, 3, embargo=1)
    assert len(folds) == 3
    for f in folds:
        assert f.train.max() < f.val.min() and f.val.max() < f.test.min()
        assert np.all(np.isin(np.unique(sess[f.test]), np.unique(sess[f.test])))  # whole sessions
        assert not set(sess[f.test]) & set(sess[f.train]) and not set(sess[f.val]) & set(sess[f.train])
        k = f.keep[:, 0]
        # no kept training label reaches the validation block; none of validation reaches the test
        assert np.all(t1[0][f.train[k[f.train]]] <= t0[f.val[0]])
        assert np.all(t1[0][f.val[k[f.val]]] <= t0[f.test[0]])
        # embargo: the row before each later block loses its label even where purging kept it
        assert not k[f.val[0] - 2] and k[f.val[0] - 3]
        assert k[f.test].all()
    assert folds[-1].test.max() == 69 and folds[1].train.size > folds[0].train.size  # expanding
    # too few sessions: blocks of rows instead
    f1 = walk_forward_folds(t0, t1, np.zeros(70, int), 2)
    assert len(f1) == 2 and f1[0].test.size == 70 // 4 + (1 if 70 % 4 > 2 else 0)


def test_session_groups_cut_sessions_when_few():
    g, unit = session_groups(np.repeat([0, 1], 6), min_groups=6)
    assert unit.startswith("session part") and np.unique(g).size == 6
    assert np.all(np.diff(g) >= 0)  # contiguous parts
    g, unit = session_groups(np.repeat(np.arange(25), 3), min_groups=20)
    assert unit == "session" and np.unique(g).size == 25


def test_bootstrap_replicates_equal_the_auc_of_the_drawn_rows():
    """Each replicate equals the plain AUC of the rows of the groups drawn, repeated as often as
    drawn (ties included): the weighted pair count is the resample's, not an approximation."""
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(12), 25)
    y = (rng.random(300) < 0.45).astype(float)
    s = np.round(rng.normal(size=300) + 0.7 * y, 1)  # coarse: many ties
    _, reps = bootstrap_aucs(s, y, groups, 6, seed=9)
    draw = np.random.default_rng(9)
    for b in range(6):
        counts = np.bincount(draw.integers(0, 12, 12), minlength=12)[groups]
        assert reps[b, 0] == pytest.approx(auc(np.repeat(s, counts), np.repeat(y, counts)), abs=1e-12)
