"""Evaluation a researcher can trust: walk-forward folds over sessions, purged, with an
embargo; AUC with a session-bootstrap 95% interval; the size of every block.

Folds (:func:`walk_forward_folds`): the sessions (in time order) are cut into ``folds + 2``
contiguous blocks; fold ``k`` trains on blocks ``0..k``, stops early on block ``k + 1`` and is
tested on block ``k + 2`` (expanding window, AFML ch. 12 "walk forward"). Labels are purged per
horizon with :func:`alphafeat.splits.purge` (AFML ch. 7): a training label whose span
``[t0, t1_h]`` overlaps the validation or test block is hidden, and so is a validation label
overlapping the test block (the row stays as input context). The embargo hides, in addition,
the labels of the last ``embargo`` rows that survived purging before each later block (AFML
7.4.2: serial correlation of the features across the boundary). With fewer than 3 sessions
the blocks are equal runs of rows.

Intervals (:func:`bootstrap_auc`): the rows of a block are resampled by group (a session;
when a block holds fewer than ``min_groups`` sessions, contiguous parts of its sessions, so
that there are about ``min_groups`` groups), ``n_boot`` times; the interval is the 2.5 and
97.5 percentiles of the replicate AUCs (percentile bootstrap, Efron & Tibshirani 1993 ch. 13).
Resampling whole sessions keeps the serial dependence of the rows inside each group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from alphafeat.splits import purge
from alphamodel.errors import DataError

__all__ = ["Fold", "walk_forward_folds", "session_groups", "bootstrap_auc", "bootstrap_aucs", "percentile_interval",
           "block_stats"]


@dataclass
class Fold:
    """One walk-forward fold: int64 global row ids of each block (time order) and the (N, H)
    bool mask of labels kept after purging and embargo."""

    index: int
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    keep: np.ndarray


def _units(sessions: np.ndarray, n_blocks: int) -> list[np.ndarray] | None:
    """Rows grouped into ``n_blocks`` contiguous blocks of whole sessions (None if too few)."""
    change = np.flatnonzero(sessions[1:] != sessions[:-1]) + 1
    runs = np.split(np.arange(sessions.size, dtype=np.int64), change)
    if len(runs) < n_blocks:
        return None
    cuts = np.array_split(np.arange(len(runs)), n_blocks)
    return [np.concatenate([runs[i] for i in c]).astype(np.int64) for c in cuts]


def _embargo(kept: np.ndarray, n: int) -> np.ndarray:
    """Drop the last ``n`` rows that survived purging (they end the block before a later one)."""
    return kept[: max(0, kept.size - n)]


def walk_forward_folds(t0: np.ndarray, t1s: list[np.ndarray], sessions: np.ndarray, folds: int,
                       embargo: int = 0) -> list[Fold]:
    """Expanding-window folds over sessions (see the module docstring).

    Parameters
    ----------
    t0 : int64 (N,) ns, non-decreasing: when each row's features are known.
    t1s : list of int64 (N,) ns, one per horizon: when each row's label is known.
    sessions : (N,) session key of each row (rows of a session contiguous).
    folds : int >= 1; fewer are made when there are fewer than ``folds + 2`` sessions
        (at least 1; with fewer than 3 sessions, blocks of rows instead).
    embargo : rows before each later block whose labels are also hidden.

    Raises
    ------
    alphamodel.errors.DataError
        When the rows cannot make 3 non-empty blocks.
    """
    n = t0.size
    n_sess = int(np.count_nonzero(sessions[1:] != sessions[:-1]) + 1) if n else 0
    folds = max(1, min(folds, n_sess - 2)) if n_sess >= 3 else max(1, folds)
    blocks = _units(sessions, folds + 2) if n_sess >= 3 else None
    if blocks is None:
        blocks = np.array_split(np.arange(n, dtype=np.int64), folds + 2)
    if any(b.size == 0 for b in blocks):
        raise DataError(f"{n} rows do not make {folds + 2} non-empty walk-forward blocks")
    out = []
    for k in range(folds):
        train, val, test = np.concatenate(blocks[: k + 1]), blocks[k + 1], blocks[k + 2]
        keep = np.zeros((n, len(t1s)), bool)
        for j, t1 in enumerate(t1s):
            tr = purge(purge(train, test, t0, t1), val, t0, t1)
            va = purge(val, test, t0, t1)
            if embargo:
                tr, va = _embargo(tr, embargo), _embargo(va, embargo)
            keep[tr, j] = keep[va, j] = keep[test, j] = True
        out.append(Fold(k, train, val, test, keep))
    return out


def session_groups(sessions: np.ndarray, min_groups: int = 20) -> tuple[np.ndarray, str]:
    """Bootstrap groups of rows: int64 (n,) group ids and a description of the unit.

    Whole sessions when there are at least ``min_groups`` of them, else each session cut into
    ``ceil(min_groups / n_sessions)`` contiguous parts.
    """
    n = sessions.size
    change = np.flatnonzero(sessions[1:] != sessions[:-1]) + 1 if n else np.zeros(0, np.int64)
    starts = np.concatenate([[0], change]).astype(np.int64) if n else np.zeros(0, np.int64)
    ends = np.append(starts[1:], n)
    if starts.size >= min_groups or n == 0:
        return np.repeat(np.arange(starts.size), ends - starts), "session"
    parts = math.ceil(min_groups / starts.size)
    gid = np.empty(n, np.int64)
    for i, (a, b) in enumerate(zip(starts, ends)):
        gid[a:b] = i * parts + (np.arange(b - a) * parts) // max(1, b - a)
    return gid, f"session part (each of {starts.size} sessions cut in {parts})"


@numba.njit(parallel=True, cache=True)
def _boot_pairs(gi: np.ndarray, y: np.ndarray, ties: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted Mann-Whitney pairs of one score on one stratum, for each weighting at once.

    ``gi`` (n,) int64 group of each row and ``y`` (n,) float64 1/0, both in ascending score
    order; ``ties`` (T,) int64 the first row of each run of equal scores; ``w`` (B, G) float64
    the weight of each group in each replicate. Returns ``(concordant pairs + half the tied
    ones, all positive-negative pairs)``, each (B,) float64: one pass over the rows per
    replicate, replicates in parallel (numba ``prange``).
    """
    n, n_t, n_b = gi.shape[0], ties.shape[0], w.shape[0]
    num, den = np.zeros(n_b), np.zeros(n_b)
    for b in numba.prange(n_b):
        below = pos = acc = 0.0
        for t in range(n_t):
            gp = gn = 0.0
            for i in range(ties[t], ties[t + 1] if t + 1 < n_t else n):
                x = w[b, gi[i]]
                if y[i] > 0.5:
                    gp += x
                else:
                    gn += x
            acc += gp * (below + 0.5 * gn)
            below += gn
            pos += gp
        num[b], den[b] = acc, pos * below
    return num, den


def _weighted_aucs(preps: list, y: np.ndarray, gi: np.ndarray, w: np.ndarray) -> np.ndarray:
    """AUC (B,) from the pairs of each stratum (``preps``: its rows, their sort order and tie
    starts) for each row of group weights ``w`` (B, G); NaN where a class has no weight."""
    num, den = np.zeros(w.shape[0]), np.zeros(w.shape[0])
    for rows, order, ties in preps:
        a, b = _boot_pairs(gi[rows][order], y[rows][order], ties, w)
        num, den = num + a, den + b
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def bootstrap_aucs(scores: np.ndarray, labels: np.ndarray, groups: np.ndarray, n_boot: int = 200,
                   seed: int = 0, strata: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """AUCs of several scores of the same rows and their paired group-bootstrap replicates.

    Parameters
    ----------
    scores : (n, M) float, one column per model; labels : (n,) 1/0/NaN (NaN rows ignored);
    groups : (n,) int group id of each row (resampled whole, with replacement);
    strata : (n,) int, optional
        Only pairs within one stratum are compared: the AUC is the pair-weighted mean of the
        strata's AUCs (Mann-Whitney pairs pooled over strata). The walk-forward folds are the
        strata of the pooled test blocks: each fold's model scores on its own level, and
        comparing a row of one fold with a row of another would rank the folds' levels
        (with base rates that differ by fold, that can lift or sink a pooled AUC by itself).

    Returns
    -------
    ``(auc (M,), reps (n_boot, M))`` float64: the AUC of each column (ties count one half, as
    :func:`alphamodel.supervised.metrics.auc`; NaN where a class is absent or the column has NaN scores)
    and the same on each replicate, every column on the same draw (so differences between
    columns have their own interval). A replicate weights a row by how often its group was
    drawn. ``reps`` has 0 rows when there are fewer than 2 groups.
    """
    s = np.asarray(scores, np.float64)
    s = s[:, None] if s.ndim == 1 else s
    y = np.asarray(labels, np.float64)
    ok = ~np.isnan(y)
    s, y, g = s[ok], (y[ok] > 0.5).astype(np.float64), np.asarray(groups)[ok]
    st = np.zeros(y.size, np.int64) if strata is None else np.asarray(strata)[ok]
    m = s.shape[1]
    if y.size == 0 or y.min() == y.max():
        return np.full(m, np.nan), np.zeros((0, m))
    uniq, gi = np.unique(g, return_inverse=True)
    parts = [np.flatnonzero(st == v) for v in np.unique(st)]
    prep = []
    for k in range(m):
        if np.isnan(s[:, k]).any():
            prep.append(None)
            continue
        per = []
        for rows in parts:
            order = np.argsort(s[rows, k], kind="stable")
            ss = s[rows, k][order]
            per.append((rows, order, np.flatnonzero(np.r_[True, ss[1:] != ss[:-1]])))
        prep.append(per)
    gi = gi.astype(np.int64)
    ones = np.ones((1, uniq.size))
    point = np.array([_weighted_aucs(p, y, gi, ones)[0] if p else np.nan for p in prep])
    if uniq.size < 2 or n_boot <= 0:
        return point, np.zeros((0, m))
    rng = np.random.default_rng(seed)
    w = np.stack([np.bincount(rng.integers(0, uniq.size, uniq.size), minlength=uniq.size) for _ in range(n_boot)])
    reps = np.full((n_boot, m), np.nan)
    for k, p in enumerate(prep):
        if p:
            reps[:, k] = _weighted_aucs(p, y, gi, w.astype(np.float64))
    return point, reps


def percentile_interval(reps: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The ``level`` percentile interval of bootstrap replicates (NaN ones dropped)."""
    r = np.asarray(reps, np.float64)
    r = r[np.isfinite(r)]
    if r.size < 2:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    return float(np.quantile(r, a)), float(np.quantile(r, 1 - a))


def bootstrap_auc(scores: np.ndarray, labels: np.ndarray, groups: np.ndarray, n_boot: int = 200,
                  seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """AUC of one score and its group-bootstrap percentile interval: ``(auc, low, high)``
    (NaN where a class is absent, or for the interval with fewer than 2 groups)."""
    point, reps = bootstrap_aucs(np.asarray(scores)[:, None], labels, groups, n_boot, seed)
    lo, hi = percentile_interval(reps[:, 0], level) if len(reps) else (float("nan"), float("nan"))
    return float(point[0]), lo, hi


def block_stats(rows: np.ndarray, sessions: np.ndarray, labels: np.ndarray, horizons: list[int]) -> dict:
    """Rows, sessions and labelled / positive rows per horizon of one block (for the summary).

    rows : int64 global row ids of the block; sessions : session key of every global row;
    labels : (len(rows), H) float32 1/0/NaN as the block sees them (after purging).
    """
    out = {"rows": int(rows.size), "sessions": int(np.unique(sessions[rows]).size) if rows.size else 0}
    for j, h in enumerate(horizons):
        lab = labels[:, j]
        out[f"labels_h{h}"] = int((~np.isnan(lab)).sum())
        out[f"positives_h{h}"] = int((lab > 0.5).sum())
    return out
