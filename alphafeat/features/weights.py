"""Weights of fractional differencing (a leaf module: the registry and the scalar helpers
import it; :func:`frac_diff_weights` is also exported by :mod:`alphafeat.features.registry`)."""

from __future__ import annotations

import numpy as np

from alphafeat.errors import UsageError


def frac_diff_weights(d: float, threshold: float | None = None, size: int | None = None) -> np.ndarray:
    """Weights of fractional differencing (López de Prado, AFML 2018, ch. 5).

    ``w_0 = 1``, ``w_k = -w_{k-1} (d - k + 1) / k``. With ``threshold``: the weights with
    ``|w_k| >= threshold`` up to the first that falls below (fixed-width window, AFML 5.5);
    with ``size``: exactly ``size`` weights (expanding window). Returns float64 ``w_0 ..``.
    """
    if (threshold is None) == (size is None):
        raise UsageError("threshold, size", "give exactly one of them")
    w = [1.0]
    k = 1
    while True:
        if size is not None and k >= size:
            break
        nxt = -w[-1] * (d - k + 1) / k
        if threshold is not None and abs(nxt) < threshold:
            break
        w.append(nxt)
        k += 1
        if k > 10_000_000:
            raise UsageError("fracdiff_threshold", "the window is over 10 million rows; raise the threshold")
    return np.asarray(w, dtype=np.float64)
