"""Evaluation metrics (the baselines are in :mod:`alphamodel.supervised.baselines`).

AUC is the Mann–Whitney U statistic of the positive class divided by ``n_pos * n_neg``
(Mann & Whitney 1947; Hanley & McNeil 1982), with average ranks for tied scores, i.e. the
probability that a random positive scores above a random negative, ties counting one half.
"""

from __future__ import annotations

import numpy as np

__all__ = ["average_ranks", "auc", "base_rate"]


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x`` (float64, shape (n,)), tied values sharing their average rank."""
    x = np.asarray(x)
    n = x.size
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    # boundaries of tie groups in sorted order
    new = np.empty(n, dtype=bool)
    if n:
        new[0] = True
        new[1:] = xs[1:] != xs[:-1]
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], n)  # exclusive
    avg = (starts + ends + 1) / 2.0  # mean of ranks start+1 .. end
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve by Mann–Whitney with average ranks for ties.

    Parameters
    ----------
    scores : np.ndarray, shape (n,): higher means "label 1 more likely".
    labels : np.ndarray, shape (n,): 1, 0, or NaN (NaN entries are ignored).

    Returns
    -------
    float in [0, 1]; NaN when either class is absent.
    """
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    ok = ~np.isnan(labels) & ~np.isnan(scores)
    s, y = scores[ok], labels[ok] > 0.5
    n_pos = int(y.sum())
    n_neg = int(y.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = average_ranks(s)
    u = r[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def base_rate(labels: np.ndarray) -> float:
    """Fraction of label 1 among non-NaN labels (NaN when there is none)."""
    labels = np.asarray(labels, dtype=np.float64)
    ok = ~np.isnan(labels)
    return float(labels[ok].mean()) if ok.any() else float("nan")
