"""What a segment's worker needs of the run (:class:`Job`, picklable) and how many threads
each segment's CPU features use (:func:`feature_threads`, :func:`live_threads`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from alphafeat.cores import usable_cores
from alphafeat.errors import UsageError
from alphafeat.features import FeatureParams
from alphafeat.features.registry import select_features
from alphafeat.precompute.config import PrecomputeConfig, check_config
from alphafeat.types import LEVELS
from alphafeat.validation import validate_sample

__all__ = ["IN_FLIGHT", "MAX_FEATURE_THREADS", "Job", "feature_threads", "job_of", "live_threads", "local_jobs",
           "make_job", "segments_at_once", "set_in_flight"]


@dataclass(frozen=True)
class Job:
    """The per-segment options a worker needs (picklable; built from the config once)."""

    features: FeatureParams
    names: tuple[str, ...]
    book_levels: int
    dtype: str
    compression: str
    horizons: tuple[int, ...]
    horizons_s: tuple[float, ...]
    barrier: str | None
    barrier_horizon: int
    bar_volume: float
    device: str
    #: threads of each segment's CPU features (:func:`feature_threads`; the values do not depend on it)
    feature_threads: int = 1
    #: the run's file of the segments computing now (:func:`live_threads`: a segment takes the cores
    #: others leave as they end); None: ``feature_threads`` throughout
    in_flight: str | None = None
    #: rows per block of the streamed CPU path (:func:`alphafeat.precompute.books.stream_rows`; 0: its
    #: default; the values do not depend on it)
    block_rows: int = 0
    #: crossed-book rows written (``keep``) or not (``drop``): :attr:`PrecomputeConfig.preopen`
    preopen: str = "keep"
    #: ``--device cuda``: the address of the parent's GPU hub (:attr:`alphafeat.cuda.hub.Hub.address`)
    #: the segments hand their feature inputs to; None: the worker's own GPU owner
    gpu: tuple | None = None


def make_job(cfg: PrecomputeConfig, device: str) -> Job:
    """The worker options of ``cfg`` (checked by :func:`check_config`); UsageError naming the
    option for a bad value."""
    return job_of(check_config(cfg), device)


def job_of(cfg: PrecomputeConfig, device: str) -> Job:
    """:func:`make_job` of a config :func:`check_config` already returned."""
    try:
        names, book = select_features(cfg.feature_set, cfg.features)
    except ValueError as e:
        raise UsageError("--features", str(e)) from None
    bar_volume = validate_sample(cfg.sample).volume
    return Job(cfg.features, tuple(names), LEVELS if book else 1, cfg.dtype, cfg.compression, cfg.horizons,
               cfg.horizons_s, cfg.barrier, cfg.barrier_horizon, bar_volume, device, preopen=cfg.preopen)  # fmt: skip


#: Most threads one segment's CPU features use: the recurrences (one thread, in row order) set the
#: pace once the row-wise features of the coming pieces are spread over two or three more.
MAX_FEATURE_THREADS = 4


def feature_threads(cfg: PrecomputeConfig, segments: int) -> int:
    """Threads for each segment's CPU features (:meth:`alphafeat.features.cpu.FeatureStream.push_block`):
    the cores each worker has while ``segments`` segments run on the configured workers
    (:func:`alphafeat.cores.usable_cores` over the workers running at once: ``--jobs`` or ``--dask-local``, at
    most one per segment), less one for the segment's decode thread, at most
    :data:`MAX_FEATURE_THREADS`, at least 1; 1 on a ``--scheduler``'s workers (their cores are
    not known here)."""
    if cfg.scheduler:
        return 1
    return _threads_of(segments_at_once(cfg, segments))


def _threads_of(at_once: int) -> int:
    """Feature threads of a segment while ``at_once`` segments share this machine's cores."""
    per_worker = usable_cores() // max(1, at_once)
    return max(1, min(MAX_FEATURE_THREADS, per_worker - 1))


#: In the staging folder: how many of the run's segments are computing now (:func:`live_threads`).
IN_FLIGHT = ".in_flight"


def set_in_flight(staging: Path, n: int) -> None:
    """Write ``n``, the segments computing now, for the workers (replaced whole: never half read)."""
    tmp = staging / f"{IN_FLIGHT}.tmp"
    tmp.write_text(str(n))
    os.replace(tmp, staging / IN_FLIGHT)


def live_threads(job: Job) -> int:
    """Feature threads of a segment's next block: with ``job.in_flight`` those of
    :func:`feature_threads` for the segments computing now (the main process rewrites the file
    as results come back, so the last segments of a run take the cores the others left), at
    least ``job.feature_threads``; without it, or where it cannot be read, ``job.feature_threads``."""
    if not job.in_flight:
        return job.feature_threads
    try:
        n = int(Path(job.in_flight).read_bytes())
    except (OSError, ValueError):
        return job.feature_threads
    return max(job.feature_threads, _threads_of(n))


def segments_at_once(cfg: PrecomputeConfig, segments: int) -> int:
    """Segments running at once on this machine: ``--jobs`` or ``--dask-local`` workers, at most
    one per segment (1 with ``--scheduler``: another machine's workers)."""
    if cfg.scheduler:
        return 1
    return max(1, min(cfg.dask_local or local_jobs(cfg), segments))


def local_jobs(cfg: PrecomputeConfig) -> int:
    """Worker processes of the local (joblib) map: ``--jobs``, the usable cores for -1."""
    return usable_cores() if cfg.jobs < 0 else max(1, cfg.jobs)
