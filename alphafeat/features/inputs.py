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


def prepare(book: BookArrays, params: FeatureParams) -> dict[str, np.ndarray]:
    """The input columns the features read, validated and coerced (contiguous, fixed dtypes):
    ``ts_recv`` int64 (n,); ``bid_px, ask_px, bid_sz, ask_sz`` float64 (n, L);
    ``buy_volume, sell_volume, trade_count`` float64 (n,). ``ValueError`` on a bad shape or
    bad ``params``."""
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
    for k in ("buy_volume", "sell_volume", "trade_count"):
        v = np.ascontiguousarray(getattr(book, k), dtype=np.float64)
        if v.shape != (n,):
            raise DataError(f"BookArrays.{k} must have shape ({n},), got {v.shape}")
        cols[k] = v
    return cols
