"""CUDA twin of :mod:`alphafeat.features` (numba-cuda kernels in :mod:`alphafeat.cuda.kernels`).

Importing this package never touches CUDA: the kernels module (and ``numba.cuda``) is
imported on the first call. Under ``NUMBA_ENABLE_CUDASIM=1`` (set before numba is imported)
the kernels run in numba's simulator, which is how they are tested on machines without a GPU.

Imports go one way: this package reads the leaf modules :mod:`alphafeat.features.registry`,
:mod:`alphafeat.features.inputs` and the row code, and :mod:`alphafeat.features` never imports it;
:func:`alphafeat.devices.compute_features` (``device='cuda'``) and the precompute call it.
"""

from __future__ import annotations

import fcntl
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np

from alphafeat.validation import validate_horizon

if TYPE_CHECKING:
    from alphafeat.features.registry import FeatureParams
    from alphafeat.types import BookArrays

__all__ = ["compute_features_cuda", "compute_features_cuda_many", "direction_labels_cuda", "gpu_turn", "pinned_empty"]

#: GPU memory given to one segment's features when segments of a run share the GPU: a full
#: generated ES session (up to ~4.3 M rows) holds its inputs and every feature's float64 output
#: there, about 6-8 GB by an estimate from its sizes (not measured); :func:`gpu_turn` lets total
#: memory // this many segments use it at once.
SLOT_BYTES = 12 << 30


@contextmanager
def gpu_turn(lock_dir: str | Path) -> Iterator[None]:
    """A turn on the GPU for one segment among the worker processes of a run.

    Waits until fewer than ``slots`` segments hold a turn (``slots`` = the GPU's total memory //
    :data:`SLOT_BYTES`, at least 1; an exclusive ``flock`` on one of the files ``.gpu-<k>`` in
    ``lock_dir``, polled every 10 ms), and when the segment is done frees the device memory and
    the pinned host memory it used (:func:`alphafeat.cuda.kernels.release_buffers`): use the
    results inside the turn. Each worker process keeps its buffers between calls otherwise: 16
    workers held 16 sessions' device buffers at once (a generated quarter with ``--jobs 16
    --device cuda`` ran out of the GPU's memory, CUDA_ERROR_OUT_OF_MEMORY) and, with the device
    buffers freed, still their pinned host pools (that quarter's host memory, summed over the
    processes, was over three times the CPU path's: by the sizes, most of it each worker's whole
    book; docs/performance.md). ``lock_dir`` must be on a filesystem the
    workers share (the run's staging folder)."""
    from alphafeat.cuda import kernels

    total = kernels.total_memory()
    slots = max(1, min(total // SLOT_BYTES, 1024))
    fh = _take_slot(Path(lock_dir), slots)
    try:
        yield
    finally:
        try:
            kernels.release_buffers()
        finally:
            fh.close()  # the lock goes with the descriptor


def _take_slot(lock_dir: Path, slots: int) -> IO[bytes]:
    """The open lock file of a free turn among ``slots`` (locked), waiting until one is free."""
    while True:
        for k in range(slots):
            fh = open(lock_dir / f".gpu-{k}", "ab")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fh
            except BlockingIOError:
                fh.close()
        time.sleep(0.01)


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
