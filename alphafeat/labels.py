"""Multi-horizon mid-price direction labels.

Convention (reference-values.md, "Direction labels"): for horizon ``h`` snapshots,

    y_h[t] = 1    if mid[t+h] > mid[t]
           = 0    if mid[t+h] < mid[t]
           = NaN  if mid[t+h] == mid[t] (tie), if either mid is NaN, or if t+h is past the end
                  of the segment.

A segment is one instrument in one trading session, so no label crosses a session break or
a roll: the caller passes one segment at a time. Unlike FI-2010/DeepLOB there is no
smoothing and no threshold; the label at ``t`` is known at ``t1 = ts_recv[t+h]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_HORIZONS: tuple[int, ...] = (30, 100, 300, 1000, 6000)


def direction_labels(mid: np.ndarray, horizons: Sequence[int] = DEFAULT_HORIZONS) -> dict[str, np.ndarray]:
    """Binary direction of the mid price ``h`` snapshots ahead, per horizon.

    Parameters
    ----------
    mid : np.ndarray, float64, shape (n,)
        Mid price (index points) of one segment; NaN where undefined.
    horizons : sequence of int
        Horizons in snapshots, each >= 1.

    Returns
    -------
    dict ``{"label_h{h}": np.ndarray float32 shape (n,)}`` with values 1, 0 or NaN.

    Raises
    ------
    ValueError
        If a horizon is not a positive integer.
    """
    mid = np.asarray(mid, dtype=np.float64)
    n = mid.shape[0]
    out: dict[str, np.ndarray] = {}
    for h in horizons:
        if int(h) != h or h < 1:
            raise ValueError(f"label horizon must be a positive integer, got {h!r}")
        h = int(h)
        y = np.full(n, np.nan, dtype=np.float32)
        if h < n:
            d = mid[h:] - mid[:-h]
            v = np.full(d.shape, np.nan, dtype=np.float32)
            v[d > 0] = 1.0
            v[d < 0] = 0.0
            y[: n - h] = v
        out[f"label_h{h}"] = y
    return out
