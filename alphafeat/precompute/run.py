"""The main job: DBN files -> features and labels -> Arrow cache, as plan -> map -> commit.

* **plan** (:func:`alphafeat.plan.make_plan`, once, cheap): headers, definitions, symbol
  mappings and trade volume give the front-month schedule and a list of
  :class:`~alphafeat.plan.Segment` (session x instrument x files).
* **decide** (:func:`_decide`): each segment's partition is current (kept), can be relabelled
  from the partition on disk (:func:`alphafeat.precompute.manifest.reusable`), or is computed.
* **map** (:func:`alphafeat.precompute.segment.run_segment`, per segment, in a worker): decode
  only that instrument's records of that session -> book -> features -> labels -> one Arrow
  table -> a staged partition. Workers are this process (``jobs=1``), joblib's loky processes
  (``jobs=N``), or the workers of a Dask distributed cluster (``scheduler`` /
  ``dask_local``), which must see the inputs and ``out`` on a shared filesystem
  (:func:`alphafeat.precompute.workers.map_segments`).
* **fold** (:class:`_Fold`): the workers' results into the :class:`Summary` and the manifest.
* **commit** (:class:`alphafeat.cache.CacheWriter`): staged partitions move into place and the
  manifest is replaced, atomically; partitions already current (same fingerprint) are not
  recomputed.

Each segment restarts every recurrence at its first row and labels never look past its last,
so nothing crosses a session break or a roll, and the cache is the same whatever the workers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from alphafeat.arena import release as release_buffers
from alphafeat.cache import (
    LOCK,
    PREDECODED_KEY,
    PREDECODED_NAME,
    CacheWriter,
    check_folder,
    check_out,
    partition_metadata,
    staged_path,
)
from alphafeat.cores import usable_cores
from alphafeat.errors import DataError, InputError
from alphafeat.instruments import Choice
from alphafeat.plan import Plan, Segment, make_plan
from alphafeat.precompute.books import peak_rss, stream_rows
from alphafeat.precompute.config import PrecomputeConfig, check_config, choose_device, default_predecoded_dir
from alphafeat.precompute.job import (
    IN_FLIGHT,
    Job,
    feature_threads,
    job_of,
    local_jobs,
    segments_at_once,
    set_in_flight,
)
from alphafeat.precompute.manifest import (
    common_metadata,
    data_notes,
    earlier_manifest,
    keep_or_prune,
    other_partition_notes,
    partition_stats,
    relabel_note,
    reusable,
    schedule_rows,
    segment_metadata,
    source_rows,
)
from alphafeat.precompute.segment import SegmentResult
from alphafeat.precompute.table import stored_rows
from alphafeat.precompute.workers import SegmentFailure, first_use, map_segments
from alphafeat.types import LEVELS

__all__ = ["Summary", "precompute"]

log = logging.getLogger(__name__)


@dataclass
class Summary:
    """What a run did; the CLI prints it as a table.

    ``stage_seconds`` sums worker time per stage (``plan`` is the parent's): ``book`` (decode
    and book, or the predecoded load), ``features``, ``labels``, ``write``; ``read`` for
    relabelled partitions (the earlier partition read back). ``peak_rss`` is the
    largest peak resident memory of any process of the run (bytes); ``segment_cpu`` the CPU
    seconds (``user``, ``sys``) of the workers' processes while they ran segments;
    ``started`` the run's start and ``segment_span`` the first segment's start and the last
    one's end (seconds since the epoch); ``cache_bytes`` the size
    of the run's partitions, those written and those already current; ``predecoded`` the
    folder where the plan's scans and the kept books are (:attr:`PrecomputeConfig.predecoded_dir`,
    default :func:`~alphafeat.precompute.config.default_predecoded_dir`).
    """

    files: int = 0
    records: int = 0
    rows: int = 0
    rows_computed: int = 0  #: rows of the partitions this run wrote (not those already current)
    seconds: float = 0.0
    device: str = "cpu"
    device_reason: str = ""  #: why this device (:func:`alphafeat.precompute.config.choose_device`)
    out: Path | None = None
    schedule: list[Choice] = field(default_factory=list)
    partitions: list[Path] = field(default_factory=list)
    partitions_skipped: int = 0
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    peak_rss: int = 0
    segment_cpu: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    segment_span: list[float] = field(default_factory=list)
    cache_bytes: int = 0
    books_predecoded: int = 0
    predecoded: Path | None = None
    #: the book schema of each (session, instrument_id) of the schedule with a segment
    schemas: dict[tuple, str] = field(default_factory=dict)

    @property
    def bytes_per_row(self) -> float:
        return self.cache_bytes / self.rows if self.rows else 0.0

    @property
    def rows_per_second(self) -> float:
        """Rows computed (not already current) per second of the run."""
        return self.rows_computed / self.seconds if self.seconds else 0.0


@dataclass
class _Fold:
    """What the run has found so far, segment by segment: the summary and what the notes and
    the manifest say of the partitions."""

    summary: Summary
    writer: CacheWriter
    others: dict[str, list[str]]  #: CacheWriter.others, with "skipped" (keep_or_prune)
    earlier: dict  #: the cache's manifest before this run
    recomputed: list[str] = field(default_factory=list)  # partitions whose fingerprint (options, inputs) changed
    relabelled: list[str] = field(default_factory=list)  # ... of which only the label options changed
    changes: set[str] = field(default_factory=set)  # what their relabels changed (relabel_changes)
    complete: dict[str, int | None] = field(default_factory=dict)  # manifest book_complete_from
    n_crossed: int = 0
    min_rows: int = 1 << 62

    def keep_complete(self, rel: str) -> None:
        """The earlier manifest's ``book_complete_from`` of partition ``rel``, where it has one."""
        if rel in self.earlier.get("book_complete_from", {}):
            self.complete[rel] = self.earlier["book_complete_from"][rel]

    def current(self, seg: Segment) -> None:
        """A partition already current: counted as it is on disk."""
        s, path = self.summary, self.writer.out / seg.relpath
        s.partitions_skipped += 1
        s.partitions.append(path)
        rows, n_x = partition_stats(path)
        self.keep_complete(seg.relpath)
        s.cache_bytes += path.stat().st_size
        s.rows += rows
        self.n_crossed += n_x
        self.min_rows = min(self.min_rows, rows)

    def failure(self, res: SegmentFailure, on_error: str, prune: bool) -> None:
        """A segment whose worker raised: raised here, or with ``on_error`` skip an input's
        error noted and the segment's earlier partition kept or pruned."""
        err = res.error
        if on_error != "skip" or not isinstance(err, InputError):
            raise err
        log.warning("skipping %s", err)
        self.summary.skipped.append((Path(err.path), err.detail))
        keep_or_prune(res.relpath, self.writer, self.others, prune)

    def result(self, res: SegmentResult, seg: Segment) -> None:
        """A computed (or relabelled) segment's result: its counts, times, notes and partition."""
        s = self.summary
        if res.relabelled:
            self.relabelled.append(res.relpath)
            self.changes.update(res.changes)
            self.keep_complete(res.relpath)
        s.records += res.records
        s.notes += res.notes
        s.books_predecoded += res.predecoded
        for k, v in res.seconds.items():
            s.stage_seconds[k] = s.stage_seconds.get(k, 0.0) + v
        s.peak_rss = max(s.peak_rss, res.peak_rss)
        for k, v in res.cpu.items():
            s.segment_cpu[k] = s.segment_cpu.get(k, 0.0) + v
        a, b = res.span
        s.segment_span = [min(s.segment_span[0], a), max(s.segment_span[1], b)] if s.segment_span else [a, b]
        if res.rows and res.complete_from >= 0:  # the stream started without a snapshot
            self.complete[res.relpath] = res.complete_ts
            when = "never within the session" if res.complete_ts is None else \
                f"from {np.datetime64(res.complete_ts, 'ns')}Z"  # fmt: skip
            s.notes.append(
                f"{seg.raw_symbol} {seg.session}: the MBO stream starts without a snapshot (mid-session start); "
                f"book trustworthy {when} ({min(res.complete_from, res.rows):,} of {res.rows:,} rows before: "
                "book_complete False; manifest book_complete_from)")  # fmt: skip
        if res.rows:
            self.writer.staged(res.relpath)
            s.partitions.append(self.writer.out / res.relpath)
            s.cache_bytes += staged_path(self.writer.staging, res.relpath).stat().st_size
            s.rows += res.rows
            s.rows_computed += res.rows
            self.min_rows = min(self.min_rows, res.rows)
            self.n_crossed += res.crossed
        else:
            s.notes.append(f"{seg.raw_symbol} has no {seg.schema} book rows in session {seg.session}")


def _tasks(progress: object | None) -> tuple[Callable[[str, int], object], Callable[[object], None]]:
    def task(desc: str, total: int) -> object | None:
        return progress.add_task(desc, total=total) if progress is not None else None

    def advance(t: object | None) -> None:
        if progress is not None and t is not None:
            progress.advance(t)

    return task, advance


def _start(cfg: PrecomputeConfig) -> tuple[PrecomputeConfig, Job, Summary]:
    """The checked config, its job and an empty summary; the output and predecoded folders
    checked (a wrong one fails now, not after the compute), the latter cleared with
    ``rebuild_predecoded``."""
    cfg = check_config(cfg)
    device, why = choose_device(cfg)
    job = job_of(cfg, device)
    summary = Summary(device=device, device_reason=why, out=Path(cfg.out))
    check_out(cfg.out)  # a wrong --out (or predecoded folder) fails now, not after the compute
    pre_dir = check_folder(cfg.predecoded_dir or default_predecoded_dir(cfg.out))
    summary.predecoded = pre_dir
    if cfg.rebuild_predecoded and pre_dir.is_dir():
        shutil.rmtree(pre_dir)
    return cfg, job, summary


def _plan(cfg: PrecomputeConfig, summary: Summary, task: Callable, advance: Callable, t0: float) -> Plan:
    """The run's plan (:func:`alphafeat.plan.make_plan`, its scans kept in the predecoded
    folder); its files, skipped inputs, notes and schedule into ``summary``."""
    t_plan = task("plan (headers, definitions, trade volume)", 1)
    plan: Plan = make_plan(
        cfg.inputs, mode=cfg.instrument_mode, root=cfg.root, roll_rule=cfg.roll_rule, roll_days=cfg.roll_days,
        on_error=cfg.on_error, jobs=cfg.jobs, survey_dir=summary.predecoded, schema=cfg.schema,
    )  # fmt: skip
    advance(t_plan)
    summary.stage_seconds["plan"] = time.perf_counter() - t0
    summary.files = len(plan.files) + len(plan.skipped)
    summary.skipped += plan.skipped
    summary.notes += plan.notes
    summary.schedule = plan.schedule
    summary.schemas = {(s.session, s.instrument_id): s.schema for s in plan.segments}
    return plan


def _decide(plan: Plan, fold: _Fold, metas: list[dict], job: Job, pre: str | None,
            advance: Callable[[], None]) -> list[tuple[Segment, dict, str | None]]:  # fmt: skip
    """Each segment's fate: current (counted in ``fold`` as it is), or to compute, as
    ``(segment, metadata, relabel)`` with ``relabel`` the partition to relabel (None: from
    the inputs), the largest first (a run does not end waiting for a big one started last)."""
    writer, calls = fold.writer, []
    for seg, meta in zip(plan.segments, metas, strict=True):
        path = writer.out / seg.relpath
        old = partition_metadata(path)  # None: no partition there (or not readable)
        if writer.current(seg.relpath, meta["fingerprint"], old):
            fold.current(seg)
            advance()
        else:
            relabel = str(path) if reusable(old, meta, seg, job, pre) else None
            if relabel is None and path.is_file():
                fold.recomputed.append(seg.relpath)
            calls.append((seg, meta, relabel))
    calls.sort(key=_work, reverse=True)
    return calls


def _sized(cfg: PrecomputeConfig, job: Job, staging: Path, segments: int) -> tuple[Job, int]:
    """``job`` with the threads and block rows of ``segments`` segments on the configured
    workers, and how many run at once; with several at once on this machine, the file of those
    computing now (:func:`alphafeat.precompute.job.live_threads`) started."""
    threads = feature_threads(cfg, segments)
    at_once = segments_at_once(cfg, segments)
    log.debug("%d segment(s) to compute, %d at once on this machine; CPU features of each on %d thread(s) "
              "(%d core(s))", segments, at_once, threads, usable_cores())  # fmt: skip
    in_flight = None
    if at_once > 1 and not cfg.scheduler:  # segments share this machine's cores
        set_in_flight(staging, at_once)
        in_flight = str(staging / IN_FLIGHT)
    rows = stream_rows(at_once)  # book blocks (the GPU hub gathers them into larger blocks of its own)
    return dataclasses.replace(job, feature_threads=threads, block_rows=rows, in_flight=in_flight), at_once


def _run_map(cfg: PrecomputeConfig, fold: _Fold, calls: list[tuple], at_once: int, in_flight: bool,
             advance: Callable[[], None]) -> None:  # fmt: skip
    """Map ``calls`` (:func:`alphafeat.precompute.workers.map_one`'s arguments) over the
    workers and fold each result as it comes back; this process's GPU owners (``--device
    cuda``) are stopped after, whatever happened."""
    by_rel = {c[0].relpath: c[0] for c in calls}
    staging = fold.writer.staging
    try:
        for done, res in enumerate(map_segments(calls, cfg), 1):
            if in_flight and len(calls) - done < at_once:  # fewer segments left than workers
                set_in_flight(staging, len(calls) - done)
            if isinstance(res, SegmentFailure):
                fold.failure(res, cfg.on_error, cfg.prune)
            else:
                fold.result(res, by_rel[res.relpath])
            advance()
    finally:
        if calls and calls[0][3].device == "cuda":
            from alphafeat.cuda.owner import release_shared

            release_shared()  # their device memory goes back


def _manifest(fold: _Fold, common: dict, schedule: list[dict], sources: list[tuple[int, dict]]) -> dict:
    """The manifest the run commits (its ``run`` record: this run's, unless every partition
    was already current, then the computing run's)."""
    s, others, earlier = fold.summary, fold.others, fold.earlier
    stats = {
        "seconds": round(s.seconds, 3),
        "stage_seconds": {k: round(v, 3) for k, v in s.stage_seconds.items()},
        "rows": s.rows,
        "peak_rss": max(s.peak_rss, peak_rss()),
        "segment_cpu_s": {k: round(v, 3) for k, v in s.segment_cpu.items()},
        "segments_s": [round(t - s.started, 3) for t in s.segment_span],
        "bytes_per_row": round(s.bytes_per_row, 1),
        "books_predecoded": s.books_predecoded,
        "rows_per_second": round(s.rows_per_second),
    }
    ours = sorted(str(p.relative_to(fold.writer.out)) for p in s.partitions)
    computed = s.partitions_skipped < len(s.partitions)  # else the computing run's record stays
    for rel in others["earlier"]:
        fold.keep_complete(rel)
    return dict(common, schedule=schedule, sources=[e for _, e in sources], notes=s.notes,
                partitions=sorted(ours + others["earlier"]), earlier_partitions=others["earlier"],
                replaced=others["replaced"], pruned=others["pruned"], book_complete_from=fold.complete,
                skipped=[{"path": str(p), "problem": why} for p, why in s.skipped],
                **{PREDECODED_KEY: _where(s.predecoded, fold.writer.out)},
                run=stats if computed else earlier.get("run", stats))  # fmt: skip


def precompute(cfg: PrecomputeConfig, progress: object | None = None) -> Summary:
    """Run the main job (plan -> map -> commit) and write the cache to ``cfg.out``.

    Parameters
    ----------
    cfg : PrecomputeConfig
        What to read, how to select, what to store, where to write, on which workers.
    progress : rich.progress.Progress, optional
        When given, a task for the plan and one for the segments are shown on it.

    Returns
    -------
    Summary
        Counts, per-stage timings, peak memory, bytes per row, the schedule and notes.

    Raises
    ------
    UsageError
        A bad option value (:func:`check_config`), before anything is read or written.
    InputError
        A bad input file (named, with the byte offset where it helps).
    SelectionError
        Nothing matches the instrument mode (e.g. no outright of the root).
    AlphafeatError
        Other user errors (an option's value, device, output folder). The cache is left as
        it was on any error.
    """
    t0 = time.perf_counter()
    cfg, job, summary = _start(cfg)
    with _removed_on_failure(Path(cfg.out)):
        _run(cfg, job, summary, progress, t0)
    summary.peak_rss = max(summary.peak_rss, peak_rss())
    summary.seconds = time.perf_counter() - t0
    release_buffers()  # the buffers this process kept for its segments (arena) go back
    log.info("%s: %d rows in %d partitions, %d of them already current", cfg.out, summary.rows,
             len(summary.partitions), summary.partitions_skipped)  # fmt: skip
    return summary


@contextmanager
def _removed_on_failure(out: Path) -> Iterator[None]:
    """``out`` removed when the block fails and this run made it and left in it only what it
    makes before the commit (the predecoded folder's plan scans, the lock): a failed first run
    leaves no cache folder behind."""
    made = not out.exists()
    try:
        yield
    except BaseException:
        if made and out.is_dir() and all(p.name in (PREDECODED_NAME, LOCK) for p in out.iterdir()):
            shutil.rmtree(out, ignore_errors=True)
        raise


def _run(cfg: PrecomputeConfig, job: Job, summary: Summary, progress: object | None, t0: float) -> None:
    """The body of :func:`precompute` (options checked): plan, map, commit into ``summary``."""
    task, advance = _tasks(progress)
    with _gpu_hub(cfg, job) as gpu:  # started before the plan: the device's start runs beside it
        plan = _plan(cfg, summary, task, advance, t0)
        _map_commit(cfg, job, summary, plan, task, advance, t0, gpu)


def _map_commit(cfg: PrecomputeConfig, job: Job, summary: Summary, plan: Plan, task: Callable, advance: Callable,
                t0: float, gpu: tuple | None) -> None:  # fmt: skip
    """The map and the commit of :func:`_run` (``gpu``: the GPU hub's address, or None)."""
    common = common_metadata(cfg, job, plan)
    schedule, sources = schedule_rows(plan), source_rows(plan)
    pre = None if cfg.keep_books == "none" else str(summary.predecoded)  # books kept earlier are used unless "none"
    if first_use():
        log.warning("first use in this environment: numba compiles the kernels once (~30-60 s)")
    t_map = task(f"segments: decode, book, features, labels, write ({job.device})", len(plan.segments))
    with CacheWriter(cfg.out, prune=cfg.prune) as writer:
        others = writer.others([seg.relpath for seg in plan.segments],
                               {seg.session.isoformat() for seg in plan.segments}, common)  # fmt: skip
        others["skipped"] = []  # earlier partitions of segments skipped in this run (keep_or_prune)
        fold = _Fold(summary, writer, others, earlier_manifest(writer.out))
        metas = [segment_metadata(common, seg, schedule, sources) for seg in plan.segments]
        decided = _decide(plan, fold, metas, job, pre, lambda: advance(t_map))
        job_t, at_once = _sized(cfg, dataclasses.replace(job, gpu=gpu), writer.staging, len(decided))
        calls = [(seg, str(writer.staging), meta, job_t, pre, _keep(cfg, seg), relabel)
                 for seg, meta, relabel in decided]
        _run_map(cfg, fold, calls, at_once, job_t.in_flight is not None, lambda: advance(t_map))
        if not summary.partitions:
            raise DataError("no book rows for the chosen instruments in the inputs; nothing to write", cfg.out)
        summary.notes += other_partition_notes(others, fold.recomputed)
        summary.notes += relabel_note(fold.relabelled, fold.changes, job)
        summary.notes += data_notes(cfg, job, plan, others["skipped"], fold.n_crossed, fold.min_rows)
        summary.seconds = time.perf_counter() - t0
        writer.commit(_manifest(fold, common, schedule, sources))


@contextmanager
def _gpu_hub(cfg: PrecomputeConfig, job: Job) -> Iterator[tuple | None]:
    """The address of this process's GPU hub (:class:`alphafeat.cuda.hub.Hub`: the GPU owners of
    every visible device, serving the segments' workers through shared memory) for a ``--device
    cuda`` run of snapshots on local workers, stopped after; None otherwise (volume bars keep
    whole books; a Dask cluster's workers use their own GPU owner). The hub warms up beside
    the plan: contexts, kernels, and the slots of as many segments as run at once (books of
    every level, the rows ``job`` stores)."""
    if job.device != "cuda" or job.bar_volume or cfg.scheduler or cfg.dask_local:
        yield None
        return
    from alphafeat.cuda.hub import Hub
    from alphafeat.cuda.owner import parse_devices

    warm = (job.features, LEVELS, len(stored_rows(job)), min(local_jobs(cfg), 64))
    with Hub(parse_devices(cfg.device if cfg.device.startswith("cuda") else "cuda"), warm=warm) as hub:
        yield hub.address


def _where(pre: Path | None, out: Path) -> str | None:
    """The manifest's ``predecoded_dir``: relative to the cache when inside it (the default,
    ``.predecoded``: the manifest stays the same wherever the cache is moved), else absolute."""
    if pre is None:
        return None
    pre, out = Path(pre).resolve(), Path(out).resolve()
    return str(pre.relative_to(out)) if out in pre.parents else str(pre)


def _keep(cfg: PrecomputeConfig, seg: Segment) -> bool:
    """Whether the segment's book is kept in the predecoded folder: ``--predecoded keep``, or
    ``auto`` and rebuilt from MBO (the costly part)."""
    return cfg.keep_books == "keep" or (cfg.keep_books == "auto" and seg.schema == "mbo")


def _work(call: tuple) -> int:
    """A map call's work, to run the largest first: the bytes of its segment's book files (0
    for a relabel, which reads none; a file holding several sessions counts whole for each)."""
    seg, relabel = call[0], call[-1]
    return 0 if relabel else sum(os.path.getsize(f) for f in seg.book_files if os.path.exists(f))
