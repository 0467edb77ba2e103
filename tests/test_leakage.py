"""A leaky split inflates the score of a trivial classifier; the purged split does not.

Generated data (the embedded sample, through the real pipeline) with heavily overlapping
labels (label_h1000: each label shares 999 of its 1000 future snapshots with its neighbour)
and a slow feature (the 60 s EMA of mid). A 5-nearest-neighbour classifier on that one
feature finds, under a shuffled k-fold, the test row's own neighbours in time in the training
set — with almost the same feature and the same overlapping label — and scores far above
chance. Purged k-fold (AFML ch. 7) drops every training row whose label span overlaps the
test block, and the score falls to chance.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import KFold
from sklearn.neighbors import KNeighborsClassifier

from alphafeat.cache import open_dataset
from alphafeat.pipeline import DEFAULT_DATA_DIR, PrecomputeConfig, precompute
from alphafeat.splits import purged_kfold, purged_walk_forward


def _oos_auc(x, y, splits) -> float:
    p = np.full(len(y), np.nan)
    for train, test in splits:
        p[test] = KNeighborsClassifier(5).fit(x[train], y[train]).predict_proba(x[test])[:, 1]
    m = ~np.isnan(p)
    return float(roc_auc_score(y[m], p[m]))


def test_leaky_split_inflates_purged_does_not(tmp_path):
    if not any(DEFAULT_DATA_DIR.glob("*.dbn.zst")):
        pytest.skip("data/ has no embedded sample")
    cache = tmp_path / "c"
    precompute(PrecomputeConfig(inputs=[DEFAULT_DATA_DIR], out=cache, device="cpu"))
    t = open_dataset(cache).to_table().sort_by([("session", "ascending"), ("ts_recv", "ascending")])
    y = t.column("label_h1000").to_numpy()
    x = t.column("ema_mid_60s").to_numpy()
    t0 = t.column("ts_recv").cast(pa.int64()).to_numpy()
    t1 = t.column("t1_h1000").cast(pa.int64()).to_numpy(zero_copy_only=False)
    m = ~np.isnan(y) & ~np.isnan(x)
    y, x, t0, t1 = y[m], x[m].reshape(-1, 1), t0[m], t1[m]
    assert len(y) > 10_000

    leaky = _oos_auc(x, y, KFold(5, shuffle=True, random_state=0).split(x))
    purged = _oos_auc(x, y, purged_kfold(t0, t1, 5, pct_embargo=0.01))
    walk = _oos_auc(x, y, purged_walk_forward(t0, t1, 4))
    assert leaky > 0.85, leaky
    assert 0.35 < purged < 0.6, purged
    assert 0.35 < walk < 0.65, walk
