"""CUDA twin of :mod:`alphafeat.features` (numba-cuda kernels in :mod:`alphafeat.cuda.kernels`).

Importing this package never touches CUDA: the kernels module (and ``numba.cuda``) is
imported on the first call. Under ``NUMBA_ENABLE_CUDASIM=1`` (set before numba is imported)
the kernels run in numba's simulator, which is how they are tested on machines without a GPU.

Imports go one way: :func:`alphafeat.features.compute_features` calls this package (on
``device='cuda'``), which reads only the leaf modules :mod:`alphafeat.features.registry`,
:mod:`alphafeat.features.inputs` and the row code, never the :mod:`alphafeat.features` API.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from alphafeat.validation import validate_horizon

if TYPE_CHECKING:
    from alphafeat.features.registry import FeatureParams
    from alphafeat.types import BookArrays

__all__ = ["compute_features_cuda", "compute_features_cuda_many", "direction_labels_cuda", "pinned_empty"]


def pinned_empty(shape, dtype=np.float64) -> np.ndarray:
    """An uninitialised array in page-locked host memory (plain array under the simulator).

    Book columns held in such arrays go to the GPU without the staging copy that
    :func:`compute_features_cuda` otherwise makes (one host pass over the input saved).
    """
    from alphafeat.cuda import kernels

    return kernels.pinned_empty(shape, dtype)


def compute_features_cuda(
    book: BookArrays, params: FeatureParams | None = None, dtype: str | np.dtype = "float64"
) -> dict[str, np.ndarray]:
    """Compute the feature set of :func:`alphafeat.features.compute_features` on a CUDA GPU.

    Parameters
    ----------
    book : BookArrays
        One contiguous segment (one instrument, one session), n rows in time order.
    params : FeatureParams, optional
        Feature parameters (default ``FeatureParams()``).
    dtype : str or numpy dtype
        ``float64`` (default) or ``float32``: the float64 results rounded once on the GPU,
        half the bytes to bring back (for callers that store float32).

    Returns
    -------
    dict[str, np.ndarray]
        Arrays of shape (n,) and ``dtype`` (views of one pinned host matrix), keys in
        :func:`alphafeat.features.feature_specs` order; same values as the CPU path up to
        libdevice rounding and the association of the chunked scans (tests: 1e-9).
        Input columns go to the device once, results come back once, overlapped in steps
        (:func:`alphafeat.cuda.kernels.run_features`); columns in page-locked memory
        (:func:`pinned_empty`) skip the host staging copy. The pinned matrix is reused by a later
        call only once no view of it is alive, so kept results are never overwritten.
    """
    return next(compute_features_cuda_many([book], params, dtype))


def compute_features_cuda_many(
    books: Iterable[BookArrays], params: FeatureParams | None = None, dtype: str | np.dtype = "float64"
) -> Iterator[dict[str, np.ndarray]]:
    """:func:`compute_features_cuda` of each segment of ``books``, streamed through the device.

    Segment k+1 is submitted (:func:`alphafeat.cuda.kernels.submit_features`) before the
    results of segment k are handed out, so its input copies run while segment k is computed
    and its results come back: across segments the device's two copy engines and its cores
    stay busy, instead of filling and draining the pipeline once per segment (a segment
    submitted while another is in flight goes in fewer, larger steps). Each segment is
    computed on its own (every recurrence restarts at its row 0), exactly as one
    :func:`compute_features_cuda` call.

    Yields, in the order of ``books``, the dict :func:`compute_features_cuda` returns. A
    yielded dict stays valid while the caller holds it (its pinned matrix is reused only once
    no view of it is alive); holding more than one at a time costs a new pinned allocation
    each. Raises ``ValueError`` for a bad book or dtype, as :func:`compute_features_cuda`:
    this is a generator, so at the ``next()`` that reaches that book.
    """
    from alphafeat.cuda import kernels
    from alphafeat.features.inputs import prepare
    from alphafeat.features.registry import FeatureParams, feature_specs, make_plan

    if params is None:
        params = FeatureParams()
    names = [s.name for s in feature_specs(params)]
    plan = make_plan(params)

    def submit(book: BookArrays, overlapped: bool) -> kernels.Pending:
        cols = prepare(book, params)
        with warnings.catch_warnings():
            # a short session launches small grids; numba's low-occupancy warning is noise here
            warnings.filterwarnings("ignore", message=".*Grid size .* low occupancy")
            return kernels.submit_features(cols, plan, dtype=dtype, overlapped=overlapped)

    def unpack(p: kernels.Pending) -> dict[str, np.ndarray]:
        host = p.result()
        return {name: host[k] for k, name in enumerate(names)}

    pending = None
    try:
        for book in books:
            done, pending = pending, submit(book, overlapped=pending is not None)
            if done is not None:
                yield unpack(done)
            del done
        if pending is not None:
            done, pending = pending, None
            yield unpack(done)
    finally:
        if pending is not None:  # a stream left early: the device finishes with its buffers first
            pending.result()


def direction_labels_cuda(
    mid: np.ndarray, horizons: Sequence[int] = (30, 100, 300, 1000, 6000)
) -> dict[str, np.ndarray]:
    """Direction labels on the GPU, equal to :func:`alphafeat.labels.direction_labels`.

    ``y_h[t] = 1`` if ``mid[t+h] > mid[t]``, 0 if lower, NaN on a tie, a NaN mid or past the
    segment end. ``mid`` float64 (n,) index points; ``horizons`` positive integers
    (snapshots). Returns ``{"label_h{h}": float32 (n,)}``.
    """
    from alphafeat.cuda import kernels

    hs = [validate_horizon(h, "horizons") for h in horizons]
    mid = np.ascontiguousarray(mid, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Grid size .* low occupancy")
        y = kernels.direction_labels_device(mid, np.asarray(hs, dtype=np.int64))
    return {f"label_h{h}": y[k] for k, h in enumerate(hs)}
