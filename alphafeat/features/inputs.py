"""The input columns of the feature kernels (CPU and CUDA), checked in one place.

A leaf module (it imports the registry only), so that both back ends -- :mod:`alphafeat.features.cpu`
and :mod:`alphafeat.cuda` -- depend on it without depending on each other or on the
:mod:`alphafeat.features` API that dispatches to them.
"""

from __future__ import annotations

import numpy as np

from alphafeat.errors import DataError
from alphafeat.features.registry import FeatureParams, make_plan
from alphafeat.types import LEVELS, BookArrays


def crossed_rows(bid_px: np.ndarray, ask_px: np.ndarray) -> np.ndarray:
    """bool (n,): the rows whose best bid is above the best ask (a crossed book, e.g. the
    pre-open auction), from the level-1 prices of ``bid_px, ask_px`` float64 (n, L) index points
    (NaN = empty: an empty side crosses nothing). The pipeline's ``book_crossed`` column is
    the same test."""
    with np.errstate(invalid="ignore"):
        return bid_px[:, 0] > ask_px[:, 0]


def prepare(book: BookArrays, params: FeatureParams) -> dict[str, np.ndarray]:
    """The input columns the features read, validated and coerced (contiguous, fixed dtypes):
    ``ts_recv`` int64 (n,); ``bid_px, ask_px, bid_sz, ask_sz`` float64 (n, L);
    ``buy_volume, sell_volume, trade_count`` float64 (n,). ``ValueError`` on a bad shape or
    bad ``params``.

    Crossed rows (:func:`crossed_rows`: an auction book that did not trade, e.g. the
    pre-open) are given to the kernels as an empty book: every price level NaN and every size
    0 (copies; the caller's arrays are untouched). So no feature of any row reads a crossed
    row's prices or sizes: the price features are NaN on crossed rows, the recurrences skip
    them as they skip any NaN observation (EMAs hold, the forward-filled log mid holds), and
    the first uncrossed row after them sees the book appear, as after any empty book.
    Per feature: the ``crossed`` entry of :func:`alphafeat.features.feature_specs`."""
    make_plan(params)  # validates
    need = max(int(params.ofi_levels), int(params.depth_levels))
    n = len(book)
    cols: dict[str, np.ndarray] = {"ts_recv": np.ascontiguousarray(book.ts_recv, dtype=np.int64)}
    for k in ("bid_px", "ask_px", "bid_sz", "ask_sz"):
        v = np.ascontiguousarray(getattr(book, k), dtype=np.float64)
        if v.ndim != 2 or v.shape[0] != n or not (need <= v.shape[1] <= LEVELS):
            levels = f"L = {LEVELS}" if need == LEVELS else f"{need} <= L <= {LEVELS}"
            raise DataError(f"BookArrays.{k} must have shape (n, L) with n = {n} and {levels}, got {v.shape}")
        cols[k] = v
    x = crossed_rows(cols["bid_px"], cols["ask_px"])
    if x.any():
        for k, empty in (("bid_px", np.nan), ("ask_px", np.nan), ("bid_sz", 0.0), ("ask_sz", 0.0)):
            cols[k] = cols[k].copy()
            cols[k][x] = empty
    for k in ("buy_volume", "sell_volume", "trade_count"):
        v = np.ascontiguousarray(getattr(book, k), dtype=np.float64)
        if v.shape != (n,):
            raise DataError(f"BookArrays.{k} must have shape ({n},), got {v.shape}")
        cols[k] = v
    return cols
