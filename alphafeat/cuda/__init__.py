"""CUDA twin of :mod:`alphafeat.features` (numba-cuda kernels in :mod:`alphafeat.cuda.kernels`).

Importing this package never touches CUDA: the kernels module (and ``numba.cuda``) is
imported on the first call of :func:`compute_features_cuda`. Under
``NUMBA_ENABLE_CUDASIM=1`` (set before numba is imported) the kernels run in numba's
simulator, which is how they are tested on machines without a GPU.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from alphafeat.features import FeatureParams
    from alphafeat.types import BookArrays

__all__ = ["compute_features_cuda"]


def compute_features_cuda(book: BookArrays, params: FeatureParams | None = None) -> dict[str, np.ndarray]:
    """Compute the feature set of :func:`alphafeat.features.compute_features` on a CUDA GPU.

    Parameters
    ----------
    book : BookArrays
        One contiguous segment (one instrument, one session), n rows in time order.
    params : FeatureParams, optional
        Feature parameters (default ``FeatureParams()``).

    Returns
    -------
    dict[str, np.ndarray]
        float64 arrays of shape (n,), keys in :func:`alphafeat.features.feature_specs` order;
        same values as the CPU path up to floating-point reassociation in the chunked scans.
        Input columns are copied to the device once and the results back once.
    """
    from alphafeat.cuda import kernels
    from alphafeat.features import (
        _EMA_QUANTITIES,
        INTERPOLATIONS,
        FeatureParams,
        _prepare,
        feature_specs,
    )

    if params is None:
        params = FeatureParams()
    names = [s.name for s in feature_specs(params)]
    cols = _prepare(book, params)
    with warnings.catch_warnings():
        # a short session launches small grids; numba's low-occupancy warning is noise here
        warnings.filterwarnings("ignore", message=".*Grid size .* low occupancy")
        host = kernels.run_features(
            cols,
            tick=float(params.tick_size),
            n_ofi=int(params.ofi_levels),
            taus=(float(params.ema_taus_s[0]), float(params.ema_taus_s[1])),
            interp=INTERPOLATIONS[params.ema_interpolation],
            n_features=len(names),
        )
    assert host.shape[0] == len(names) and len(_EMA_QUANTITIES) == 4
    return {name: host[k] for k, name in enumerate(names)}
