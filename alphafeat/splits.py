"""Purged cross-validation splits for overlapping labels (López de Prado, AFML 2018, ch. 7).

Every sample ``i`` spans ``[t0[i], t1[i]]``: ``t0`` is when its features are known, ``t1``
when its label is (for a direction label at row ``t`` and horizon ``h``, ``t1 = ts_recv[t+h]``).
Samples are given in time order (``t0`` non-decreasing). A training sample whose span overlaps
the span of a test block would leak the test labels into training; it is *purged*. A test
block's span is ``[T0, T1]`` with ``T0`` the first test sample's start and ``T1`` the latest
test label end.

Conventions (chosen so that the reference values of AFML snippet 7.3 hold):

* spans overlap when ``t0[i] < T1 and t1[i] > T0``: a training label that ends exactly when
  the test block starts (``t1[i] == T0``) is kept, as in snippet 7.3 (``t1 <= test start``);
* the embargo drops the first ``h = floor(pct_embargo * N)`` samples that follow the test
  block and survived purging, i.e. positions ``searchsorted(t0, T1) ... + h`` — again as in
  snippet 7.3 (``indices[maxT1Idx + mbrg:]``). It only concerns training samples *after* a
  test block, so a walk-forward split (train strictly before test) needs none.

Times may be any ordered numbers (ns timestamps, row ordinals, seconds); the functions only
compare them. All indices returned are ``int64`` positions into the input arrays.
"""

from __future__ import annotations

import math

import numpy as np

from alphafeat.errors import DataError, UsageError
from alphafeat.validation import validate_int

__all__ = ["check_spans", "purge", "purged_kfold", "purged_walk_forward", "train_val_test_split"]


def check_spans(t0: np.ndarray, t1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate and return sample spans as 1-D arrays.

    Parameters
    ----------
    t0, t1 : array-like, shape (N,)
        Start and end time of each sample (any ordered numeric dtype, e.g. int64 ns).

    Raises
    ------
    UsageError
        If the shapes differ.
    DataError
        If ``t0`` is not non-decreasing, or some ``t1 < t0``.
    """
    t0 = np.asarray(t0)
    t1 = np.asarray(t1)
    if t0.ndim != 1 or t0.shape != t1.shape:
        raise UsageError("t0, t1", "expected 1-D arrays of the same length", f"{t0.shape} and {t1.shape}")
    if t0.size and np.any(np.diff(t0) < 0):
        raise DataError("t0 must be in time order (non-decreasing)")
    if np.any(t1 < t0):
        raise DataError("every sample needs t1 >= t0 (a label ends after its features are known)")
    return t0, t1


def purge(
    train: np.ndarray, test: np.ndarray, t0: np.ndarray, t1: np.ndarray, embargo: int = 0
) -> np.ndarray:
    """Drop from ``train`` the samples whose spans overlap the test block, then the embargo.

    Parameters
    ----------
    train, test : np.ndarray of int, shape (n_train,), (n_test,)
        Candidate training positions and the test block's positions (a contiguous block in
        time order, as every splitter here makes).
    t0, t1 : np.ndarray, shape (N,)
        Sample spans (see the module docstring), ``t0`` non-decreasing.
    embargo : int
        Number of samples after the test block (first survivors of the purge) also dropped.

    Returns
    -------
    np.ndarray of int64: the surviving training positions, sorted.
    """
    train = np.asarray(train, dtype=np.int64)
    test = np.asarray(test, dtype=np.int64)
    if test.size == 0 or train.size == 0:
        return np.sort(train)
    T0 = t0[test.min()]
    T1 = t1[test].max()
    keep = ~((t0[train] < T1) & (t1[train] > T0))
    keep &= ~np.isin(train, test)
    if embargo > 0:
        start = max(int(test.max()) + 1, int(np.searchsorted(t0, T1, side="left")))
        keep &= ~((train >= start) & (train < start + embargo))
    return np.sort(train[keep])


def purged_kfold(
    t0: np.ndarray, t1: np.ndarray, n_splits: int, pct_embargo: float = 0.0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Purged k-fold with embargo (AFML ch. 7, snippet 7.3).

    The N samples are cut into ``n_splits`` contiguous test blocks (``np.array_split``); each
    fold trains on the rest, purged of overlaps with the test block, with an embargo of
    ``floor(pct_embargo * N)`` samples after it.

    Parameters
    ----------
    t0, t1 : array-like, shape (N,)
        Sample spans in time order.
    n_splits : int
        Number of folds, 2 <= n_splits <= N.
    pct_embargo : float
        Embargo as a fraction of N.

    Returns
    -------
    list of ``(train, test)`` int64 position arrays, one per fold.

    Examples
    --------
    The AFML reference: N = 10, t1 = i + 2, 2 folds, 10 % embargo:

    >>> i = np.arange(10)
    >>> [(tr.tolist(), te.tolist()) for tr, te in purged_kfold(i, i + 2, 2, 0.1)]
    [([7, 8, 9], [0, 1, 2, 3, 4]), ([0, 1, 2, 3], [5, 6, 7, 8, 9])]
    """
    t0, t1 = check_spans(t0, t1)
    n = t0.size
    validate_int(n_splits, "n_splits", lo=2)
    if n_splits > n:
        raise DataError(f"{n} samples cannot make {n_splits} folds")
    embargo = int(math.floor(pct_embargo * n))
    idx = np.arange(n, dtype=np.int64)
    out = []
    for test in np.array_split(idx, n_splits):
        out.append((purge(idx, test, t0, t1, embargo), test))
    return out


def purged_walk_forward(
    t0: np.ndarray, t1: np.ndarray, n_splits: int, min_train_blocks: int = 1
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Expanding-window walk-forward splits with purging (AFML ch. 7, ch. 12 "walk forward").

    The samples are cut into ``n_splits + min_train_blocks`` contiguous blocks; fold ``k``
    tests on block ``min_train_blocks + k`` and trains on every earlier sample whose label
    ends no later than the test block starts (``t1 <= T0``). Training never follows the test
    block, so no embargo is needed.

    Returns
    -------
    list of ``(train, test)`` int64 position arrays, ``n_splits`` of them.
    """
    t0, t1 = check_spans(t0, t1)
    n = t0.size
    blocks = np.array_split(np.arange(n, dtype=np.int64), n_splits + min_train_blocks)
    if any(b.size == 0 for b in blocks):
        raise DataError(f"too few samples ({n}) for {n_splits} walk-forward folds")
    out = []
    for k in range(min_train_blocks, len(blocks)):
        test = blocks[k]
        before = np.arange(int(test[0]), dtype=np.int64)
        out.append((purge(before, test, t0, t1), test))
    return out


def train_val_test_split(
    t0: np.ndarray, t1: np.ndarray, val_frac: float = 0.2, test_frac: float = 0.2
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One walk-forward split into train, validation and test blocks, in time order, purged.

    Train is the first ``1 - val_frac - test_frac`` of the samples, then validation, then test.
    Training samples whose spans overlap the validation or the test block are purged, and
    validation samples whose spans overlap the test block are purged (so neither early
    stopping nor training sees a test label).

    Returns
    -------
    ``(train, val, test)``: int64 position arrays.

    Raises
    ------
    DataError
        If a block would be empty (both are ValueErrors too).
    """
    t0, t1 = check_spans(t0, t1)
    n = t0.size
    n_test = int(round(test_frac * n))
    n_val = int(round(val_frac * n))
    n_train = n - n_val - n_test
    if min(n_train, n_val, n_test) <= 0:
        raise DataError(f"{n} samples do not make non-empty train/val/test blocks "
                         f"(val_frac={val_frac}, test_frac={test_frac})")
    idx = np.arange(n, dtype=np.int64)
    train, val, test = idx[:n_train], idx[n_train : n_train + n_val], idx[n_train + n_val :]
    val = purge(val, test, t0, t1)
    train = purge(purge(train, test, t0, t1), idx[n_train : n_train + n_val], t0, t1)
    return train, val, test
