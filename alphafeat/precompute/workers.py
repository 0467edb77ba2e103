"""Where the segments run: this process (``jobs=1``), joblib's loky processes (``jobs=N``) or
the workers of a Dask distributed cluster (:func:`map_segments`); what each worker runs
(:func:`map_one`), and numba's first-use check (:func:`first_use`)."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

from alphafeat.errors import AlphafeatError
from alphafeat.plan import Segment
from alphafeat.precompute.config import PrecomputeConfig
from alphafeat.precompute.job import Job, local_jobs
from alphafeat.precompute.segment import SegmentResult, run_segment

__all__ = ["SegmentFailure", "first_use", "keep_worker", "map_one", "map_segments", "not_compiled"]


@dataclass
class SegmentFailure:
    """A segment whose worker raised a user error (picklable: the error crosses as itself).

    Attributes
    ----------
    relpath : str
        The segment's partition path in the cache.
    error : AlphafeatError
        What its worker raised (an :class:`~alphafeat.errors.InputError` keeps its ``path``,
        ``offset`` and ``record``).
    """

    relpath: str
    error: AlphafeatError


def first_use() -> bool:
    """Whether numba has no cached machine code yet for the CPU feature kernel: the first run
    in an environment compiles the kernels (~30-60 s)."""
    from alphafeat.features.cpu_kernels import run_chunk

    return not_compiled(run_chunk)


def not_compiled(kernel: object) -> bool:
    """Whether numba has no cached machine code yet for the ``cache=True`` kernel ``kernel``
    (its cache index is missing): a command's first run in an environment compiles it and its
    kind, which a hint should say. False when numba's internals moved (no hint)."""
    try:
        return not os.path.exists(kernel._cache._cache_file._index_path)
    except Exception:
        return False


def keep_worker() -> None:
    """In a loky worker: let it keep the buffers of its segments (:mod:`alphafeat.arena`).

    After each task loky compares the worker's resident memory with the one after its first
    task (a plan scan here) and, 300 MB above it, runs ``gc.collect()`` and then replaces the
    worker as leaking. A worker that keeps a session's buffers (1-2 GB) was so replaced after
    every segment: a new interpreter, its imports and numba's kernels again for each (~1 CPU-s),
    its fresh memory touched again, and results came back late (a generated quarter ran slower
    than with this: docs/performance.md). Our buffers are bounded by design (a
    worker's memory is that of its largest segment), so the check's margin is raised to the
    machine's memory here; loky has no public option for it (joblib 1.6,
    ``joblib/externals/loky/process_executor.py``). A no-op outside loky's workers."""
    mod = sys.modules.get("joblib.externals.loky.process_executor")
    if mod is not None and hasattr(mod, "_MAX_MEMORY_LEAK_SIZE"):
        import psutil

        mod._MAX_MEMORY_LEAK_SIZE = max(mod._MAX_MEMORY_LEAK_SIZE, psutil.virtual_memory().total)


def map_one(seg: Segment, staging: str, meta: dict, job: Job, pre: str | None, keep: bool,
            relabel: str | None) -> SegmentResult | SegmentFailure:  # fmt: skip
    """Worker entry: :func:`run_segment`; a user error is returned as a :class:`SegmentFailure`
    holding the error itself (the map goes on with the other segments; the parent decides)."""
    keep_worker()
    try:
        return run_segment(seg, staging, meta, job, pre, keep, relabel)
    except AlphafeatError as e:
        return SegmentFailure(seg.relpath, e)


def _dask_client(cfg: PrecomputeConfig) -> object:
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise AlphafeatError("--scheduler / --dask-local need Dask: pip install 'dask[distributed]' "
                             "(or pip install -e '.[dask]')") from None  # fmt: skip
    if cfg.scheduler:
        try:
            return Client(cfg.scheduler, timeout="20s")
        except (OSError, ValueError, TimeoutError) as e:
            raise AlphafeatError(f"--scheduler {cfg.scheduler}: cannot connect ({e})") from None
    cluster = LocalCluster(n_workers=cfg.dask_local, threads_per_worker=1, processes=True,
                           dashboard_address=None, silence_logs=logging.WARNING)  # fmt: skip
    return Client(cluster)


def map_segments(calls: list[tuple], cfg: PrecomputeConfig) -> Iterator[SegmentResult | SegmentFailure]:
    """Run ``map_one`` over ``calls`` on the configured workers, results as they complete."""
    if not calls:
        return
    if cfg.scheduler or cfg.dask_local > 0:
        client = _dask_client(cfg)
        from dask.distributed import as_completed
        from distributed.scheduler import KilledWorker

        try:
            futures = client.map(map_one, *zip(*calls), pure=False)
            segment = {f.key: c[0] for f, c in zip(futures, calls, strict=True)}
            for fut in as_completed(futures):
                try:
                    res = fut.result()
                except KilledWorker:  # Dask ran it again on other workers (allowed-failures) first
                    raise AlphafeatError(
                        f"a Dask worker died while computing {segment[fut.key].relpath} (and so did each worker the "
                        "scheduler retried it on: distributed.scheduler.allowed-failures); nothing committed, the "
                        "cache is as the last complete run left it: run again") from None  # fmt: skip
                yield res
        finally:
            cluster = getattr(client, "cluster", None) if not cfg.scheduler else None
            client.close()
            if cluster is not None:
                cluster.close()
        return
    n_jobs = local_jobs(cfg)
    if n_jobs == 1 or len(calls) == 1:
        for c in calls:
            yield map_one(*c)
        return
    from joblib import Parallel, delayed

    from alphafeat._command import stop_pool_workers
    from alphafeat.plan import spawning_workers

    par = Parallel(n_jobs=min(n_jobs, len(calls)), return_as="generator_unordered", pre_dispatch="n_jobs")
    with spawning_workers():
        results = par(delayed(map_one)(*c) for c in calls)
    with warnings.catch_warnings():  # a run stopped by an error or Ctrl-C says so in one line of its own
        warnings.filterwarnings("ignore", message=".*tasks which were still being processed by the workers have "
                                "been cancelled", category=UserWarning)  # fmt: skip
        yield from results
    # every segment is back: stop the workers, each holding a session's buffers (keep_worker),
    # which Python's exit would otherwise wait to see torn down (measured on 16 sessions:
    # docs/performance.md). Nothing of theirs is needed (their
    # partitions staged, their results here); the next run in this process (a notebook) starts new ones.
    stop_pool_workers()
