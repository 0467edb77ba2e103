"""The features on a device: :func:`compute_features` on the CPU (:mod:`alphafeat.features`) or
a CUDA GPU (:mod:`alphafeat.cuda`).

It lies above both: :mod:`alphafeat.cuda` reads the leaf modules of :mod:`alphafeat.features`
(registry, inputs, row code), so the choice of device cannot live in :mod:`alphafeat.features`
without an import cycle (``tests/test_layers.py``).
"""

from __future__ import annotations

import numpy as np

from alphafeat.errors import UsageError
from alphafeat.features import FeatureParams, cuda_available
from alphafeat.features import compute_features as compute_features_cpu
from alphafeat.types import BookArrays

__all__ = ["compute_features", "cuda_available"]


def compute_features(
    book: BookArrays,
    params: FeatureParams = FeatureParams(),  # noqa: B008 (frozen dataclass, immutable)
    device: str = "cpu",
    n_chunks: int = 1,
    n_jobs: int | None = 1,
) -> dict[str, np.ndarray]:
    """Compute the feature set on one contiguous segment of book snapshots, on ``device``.

    Parameters
    ----------
    book : BookArrays
        Snapshots of one instrument over one session, in time order (n rows); see
        :func:`alphafeat.features.compute_features`.
    params : FeatureParams
        Feature parameters.
    device : str
        ``'cpu'`` (:func:`alphafeat.features.compute_features`, numba njit), ``'cuda'``
        (:func:`alphafeat.cuda.compute_features_cuda`) or ``'auto'`` (``'cuda'`` when
        :func:`cuda_available`, else ``'cpu'``).
    n_chunks, n_jobs : int
        CPU only: exact chunks and their worker threads (:func:`alphafeat.features.compute_features`).

    Returns
    -------
    dict[str, np.ndarray]
        float64 arrays of shape (n,), keys in :func:`alphafeat.features.feature_specs` order; the
        GPU's equal the CPU's up to libdevice rounding and the association of the chunked scans
        (tests: 1e-9).

    Raises
    ------
    UsageError
        An unknown ``device``.
    """
    if device == "auto":
        device = "cuda" if cuda_available() else "cpu"
    if device == "cpu":
        return compute_features_cpu(book, params, n_chunks=n_chunks, n_jobs=n_jobs)
    if device == "cuda":
        from alphafeat.cuda import compute_features_cuda

        return compute_features_cuda(book, params)
    raise UsageError("device", "expected 'cpu', 'cuda' or 'auto'", device)
