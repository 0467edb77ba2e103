"""The main job: DBN files -> features and labels -> Arrow cache, as plan -> map -> commit.

* **plan** (:func:`alphafeat.plan.make_plan`, once, cheap): headers, definitions, symbol
  mappings and trade volume give the front-month schedule and a list of
  :class:`~alphafeat.plan.Segment` (session x instrument x files).
* **map** (:func:`alphafeat.segment.run_segment`, per segment, in a worker): decode only that
  instrument's records of that session -> book -> features -> labels -> one Arrow table ->
  a staged partition. Workers are this process (``jobs=1``), joblib's loky processes
  (``jobs=N``), or the workers of a Dask distributed cluster (``scheduler`` /
  ``dask_local``), which must see the inputs and ``out`` on a shared filesystem.
* **commit** (:class:`alphafeat.cache.CacheWriter`): staged partitions move into place and the
  manifest is replaced, atomically; partitions already current (same fingerprint) are not
  recomputed.

Each segment restarts every recurrence at its first row and labels never look past its last,
so nothing crosses a session break or a roll, and the cache is the same whatever the workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

import alphafeat
from alphafeat.arena import release as release_buffers
from alphafeat.bars import volume_bars
from alphafeat.cache import FORMAT_VERSION, CacheWriter, check_folder, check_out, partition_metadata, staged_path
from alphafeat.cores import usable_cores
from alphafeat.dbn import file_identity
from alphafeat.errors import AlphafeatError, DataError, InputError, UsageError
from alphafeat.features import FeatureParams, compute_features, cuda_available, feature_specs
from alphafeat.features.registry import select_features
from alphafeat.instruments import Choice, session_end_ns
from alphafeat.labels import DEFAULT_HORIZONS, LabelStream, direction_labels_seconds
from alphafeat.plan import Plan, Segment, discover, make_plan
from alphafeat.segment import SegmentResult, book_slices, is_kept, kept_book, peak_rss, run_segment, stream_rows
from alphafeat.types import LEVELS, BookArrays
from alphafeat.validation import (
    Barrier,
    Compression,
    Device,
    Dtype,
    InstrumentMode,
    ModeKind,
    OnError,
    Predecoded,
    RollRule,
    validate_barrier,
    validate_bool,
    validate_enum,
    validate_horizons,
    validate_horizons_s,
    validate_instrument_mode,
    validate_int,
    validate_jobs,
    validate_path,
    validate_root,
    validate_sample,
    validate_scheduler,
)

__all__ = ["DEFAULT_DATA_DIR", "Job", "PrecomputeConfig", "Summary", "check_config", "discover", "feature_threads",
           "precompute", "resolve_device"]

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[1] / "data"


def default_predecoded_dir(out: str | os.PathLike[str]) -> Path:
    """``<parent of out>/.predecoded``: where books and plan scans are kept between runs."""
    return Path(out).resolve().parent / ".predecoded"


@dataclass
class PrecomputeConfig:
    """Parameters of one ``precompute`` run.

    Attributes
    ----------
    inputs : list of Path
        DBN files (``.dbn``, ``.dbn.zst``) or directories holding them. Book data (mbo,
        mbp-10 or mbp-1) is required; trades and definition files are optional companions.
    out : Path
        Cache directory to (re)write.
    instrument_mode : InstrumentMode
        ``all``, ``id=N`` or ``front-month``.
    root : str
        Product root for front-month selection (``ES``).
    device : str
        ``cpu``, ``cuda`` or ``auto`` (the CPU: its streamed path, features continued block by
        block beside the decode, ran a generated quarter in 44 s on a 16-core H200 host where
        ``cuda``, which builds each session's whole book for one GPU call per segment, took
        70 s and 3x the memory; ``bench/precompute.py``).
    horizons : tuple of int
        Label horizons in snapshots.
    features : FeatureParams
        Feature parameters (tick size, EMA time constants, ...).
    feature_set : str
        Which features are stored (``--features``): names and groups of
        :func:`alphafeat.features.registry.select_features`; ``default`` is
        :data:`~alphafeat.features.registry.DEFAULT_FEATURES` with the top of book, ``all``
        every feature and every book level. On the CPU only what the stored features need is
        computed (:func:`alphafeat.features.registry.prune_plan`; the same values), on a GPU
        every feature. A rerun that stores other features keeps the stored ones and computes
        the added ones from the kept books (:func:`relabel_table`).
    dtype : str
        ``float32`` (default) or ``float64``: storage of feature columns; price-level features
        (unit index points: mid, microprice, EMAs of the mid) and book prices stay float64,
        labels float32, times int64 ns.
    compression : str
        ``none`` (memory-mappable, default), ``lz4`` or ``zstd`` Arrow IPC buffer compression.
    roll_days : int
        Calendar-rule margin for the front month (days before expiration).
    horizons_s : tuple of float
        Extra label horizons in seconds (as-of mid), empty by default.
    barrier : str or None
        Triple-barrier widths: ``"ticks:K"`` (K ticks each side) or ``"vol:K"`` (K times the
        60 s realised volatility per snapshot, scaled by sqrt(barrier_horizon)); None for none.
    barrier_horizon : int
        Vertical barrier in snapshots.
    roll_rule : str
        ``volume`` (most traded volume in the previous session) or ``calendar``.
    on_error : str
        ``raise`` (a bad input file stops the run) or ``skip`` (warn, leave out the file or
        the segments it holds, list it in ``Summary.skipped``).
    jobs : int
        Worker processes (joblib, loky) computing segments in parallel; -1 for all the cores it may use. Each
        segment's CPU features use the cores left per worker (:func:`feature_threads`).
    scheduler : str or None
        Address of a Dask distributed scheduler (``tcp://host:8786``): segments run on its
        workers, which must see ``inputs`` and ``out`` at the same paths.
    dask_local : int
        Start a Dask ``LocalCluster`` of this many single-threaded worker processes (0: no).
    predecoded_dir : Path or None
        Where books and plan scans are kept (:mod:`alphafeat.segment`); None:
        ``<parent of out>/.predecoded``.
    keep_books : str
        ``auto`` (default: keep books rebuilt from MBO, whose rebuild is the costly part),
        ``keep`` (keep every book) or ``none`` (keep none, use none). A kept book lets a rerun
        with other features, horizons or output options skip decode and book (~360 bytes a
        row on disk); ``auto`` and ``keep`` use the books kept by earlier runs.
    rebuild_predecoded : bool
        Clear the predecoded folder first.
    prune : bool
        Delete the cache's partitions of sessions this run does not compute (``--prune``);
        without it they are kept (listed in the manifest as ``earlier_partitions``), or the
        run is refused when they were computed with other options
        (:meth:`alphafeat.cache.CacheWriter.others`).
    sample : str
        ``"snapshot"`` (a row per book snapshot) or ``"volume:V"``: a row per volume bar of V
        contracts (AFML ch. 2; :func:`alphafeat.bars.volume_bars`).
    """

    inputs: list[Path]
    out: Path
    instrument_mode: InstrumentMode = field(default_factory=lambda: InstrumentMode(ModeKind.FRONT_MONTH))
    root: str = "ES"
    device: str = "auto"
    horizons: tuple[int, ...] = DEFAULT_HORIZONS
    features: FeatureParams = field(default_factory=FeatureParams)
    feature_set: str = "default"
    dtype: str = "float32"
    compression: str = "none"
    roll_days: int = 8
    horizons_s: tuple[float, ...] = ()
    barrier: str | None = "ticks:4"
    barrier_horizon: int = 1000
    sample: str = "snapshot"
    roll_rule: str = "volume"
    on_error: str = "raise"
    jobs: int = 1
    scheduler: str | None = None
    dask_local: int = 0
    predecoded_dir: Path | None = None
    keep_books: str = "auto"
    rebuild_predecoded: bool = False
    prune: bool = False


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
    #: rows per block of the streamed CPU path (:func:`alphafeat.segment.stream_rows`; 0: its
    #: default; the values do not depend on it)
    block_rows: int = 0


@dataclass
class Summary:
    """What a run did; the CLI prints it as a table.

    ``stage_seconds`` sums worker time per stage (``plan`` is the parent's): ``book`` (decode
    and book, or the predecoded load), ``features``, ``labels``, ``write``; ``read`` for
    relabelled partitions (the earlier partition read back). ``peak_rss`` is the
    largest peak resident memory of any process of the run (bytes); ``cache_bytes`` the size
    of the run's partitions, those written and those already current; ``predecoded`` the
    folder where the plan's scans and the kept books are (:attr:`PrecomputeConfig.predecoded_dir`,
    default :func:`default_predecoded_dir`).
    """

    files: int = 0
    records: int = 0
    rows: int = 0
    rows_computed: int = 0  #: rows of the partitions this run wrote (not those already current)
    seconds: float = 0.0
    device: str = "cpu"
    out: Path | None = None
    schedule: list[Choice] = field(default_factory=list)
    partitions: list[Path] = field(default_factory=list)
    partitions_skipped: int = 0
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    peak_rss: int = 0
    cache_bytes: int = 0
    books_predecoded: int = 0
    predecoded: Path | None = None

    @property
    def bytes_per_row(self) -> float:
        return self.cache_bytes / self.rows if self.rows else 0.0

    @property
    def rows_per_second(self) -> float:
        """Rows computed (not already current) per second of the run."""
        return self.rows_computed / self.seconds if self.seconds else 0.0


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a CUDA GPU is usable, else ``cpu``.

    Raises
    ------
    UsageError
        An unknown name.
    AlphafeatError
        ``cuda`` without a usable GPU.
    """
    device = validate_enum(device, Device, "--device").value
    if device == Device.AUTO:
        return Device.CUDA.value if cuda_available() else Device.CPU.value
    if device == Device.CUDA and not cuda_available():
        raise AlphafeatError("--device cuda: no usable CUDA GPU (numba.cuda.is_available() is False)")
    return device


def check_config(cfg: PrecomputeConfig) -> PrecomputeConfig:
    """``cfg`` with every option checked by its ``validate_*`` (:mod:`alphafeat.validation`)
    and normalised (enum options as their plain strings, int tuples, paths); ``cfg`` itself
    is left as it was.

    Raises
    ------
    UsageError
        The first bad option, named as the CLI spells it, with the value and what is allowed.
    AlphafeatError
        ``scheduler`` / ``dask_local`` without Dask distributed installed.
    """
    validate_sample(cfg.sample)
    validate_barrier(cfg.barrier)
    c = dataclasses.replace(
        cfg,
        inputs=[validate_path(p, "--input") for p in cfg.inputs],
        out=validate_path(cfg.out, "--out"),
        instrument_mode=validate_instrument_mode(cfg.instrument_mode),
        root=validate_root(cfg.root),
        device=validate_enum(cfg.device, Device, "--device").value,
        horizons=validate_horizons(cfg.horizons),
        dtype=validate_enum(cfg.dtype, Dtype, "--dtype").value,
        compression=validate_enum(cfg.compression, Compression, "--compression").value,
        roll_days=validate_int(cfg.roll_days, "--roll-days", lo=0, what="a number of days"),
        horizons_s=validate_horizons_s(cfg.horizons_s),
        barrier_horizon=validate_int(cfg.barrier_horizon, "barrier_horizon", lo=1, what="a number of snapshots"),
        roll_rule=validate_enum(cfg.roll_rule, RollRule, "--roll-rule").value,
        on_error=validate_enum(cfg.on_error, OnError, "--on-error").value,
        jobs=validate_jobs(cfg.jobs),
        scheduler=validate_scheduler(cfg.scheduler),
        dask_local=validate_int(cfg.dask_local, "--dask-local", lo=0, what="a number of Dask workers (0: no Dask)"),
        predecoded_dir=None if cfg.predecoded_dir is None else validate_path(cfg.predecoded_dir, "predecoded_dir"),
        keep_books=validate_enum(cfg.keep_books, Predecoded, "--predecoded").value,
        rebuild_predecoded=validate_bool(cfg.rebuild_predecoded, "--rebuild-predecoded"),
        prune=validate_bool(cfg.prune, "--prune"),
    )
    if c.scheduler is not None and c.dask_local:
        raise UsageError("--scheduler and --dask-local", "expected one of them (a cluster's address, or a local one)",
                         f"--scheduler {c.scheduler} --dask-local {c.dask_local}")  # fmt: skip
    if (c.scheduler or c.dask_local) and importlib.util.find_spec("distributed") is None:
        raise AlphafeatError("--scheduler / --dask-local need Dask distributed: pip install 'dask[distributed]' "
                             "(or pip install -e '.[dask]')")  # fmt: skip
    return c


def make_job(cfg: PrecomputeConfig, device: str) -> Job:
    """The worker options of ``cfg`` (checked by :func:`check_config`); UsageError naming the
    option for a bad value."""
    return _job(check_config(cfg), device)


def _job(cfg: PrecomputeConfig, device: str) -> Job:
    """:func:`make_job` of a config :func:`check_config` already returned."""
    try:
        names, book = select_features(cfg.feature_set, cfg.features)
    except ValueError as e:
        raise UsageError("--features", str(e)) from None
    bar_volume = validate_sample(cfg.sample).volume
    return Job(cfg.features, tuple(names), LEVELS if book else 1, cfg.dtype, cfg.compression, cfg.horizons,
               cfg.horizons_s, cfg.barrier, cfg.barrier_horizon, bar_volume, device)  # fmt: skip


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
    return _threads_of(_at_once(cfg, segments))


def _threads_of(at_once: int) -> int:
    """Feature threads of a segment while ``at_once`` segments share this machine's cores."""
    per_worker = usable_cores() // max(1, at_once)
    return max(1, min(MAX_FEATURE_THREADS, per_worker - 1))


#: In the staging folder: how many of the run's segments are computing now (:func:`live_threads`).
IN_FLIGHT = ".in_flight"


def _set_in_flight(staging: Path, n: int) -> None:
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


def _at_once(cfg: PrecomputeConfig, segments: int) -> int:
    """Segments running at once on this machine: ``--jobs`` or ``--dask-local`` workers, at most
    one per segment (1 with ``--scheduler``: another machine's workers)."""
    if cfg.scheduler:
        return 1
    return max(1, min(cfg.dask_local or _local_jobs(cfg), segments))


def _local_jobs(cfg: PrecomputeConfig) -> int:
    """Worker processes of the local (joblib) map: ``--jobs``, the usable cores for -1."""
    return usable_cores() if cfg.jobs < 0 else max(1, cfg.jobs)


def _col(name: str, unit: str, description: str, source: str) -> dict:
    return {"name": name, "unit": unit, "description": description, "source": source}


def column_specs(job: Job) -> list[dict]:
    """Every cache column with its unit, meaning and source, in column order."""
    ns = "ns since UNIX epoch (UTC)"
    cols = [
        _col("ts_event", ns, "matching-engine time of the record that completed the snapshot", "DBN"),
        _col("ts_recv", ns, "capture time of that record; the clock features use", "DBN"),
        _col("instrument_id", "", "exchange instrument id", "DBN"),
        _col("raw_symbol", "", "symbol of instrument_id on the session date", "DBN symbology"),
    ]
    for lvl in range(job.book_levels):
        for side in ("bid", "ask"):
            at = f"{side} at level {lvl + 1}"
            cols.append(_col(f"{side}_px_{lvl:02d}", "index points", f"price {at}; NaN if empty", "book"))
            cols.append(_col(f"{side}_sz_{lvl:02d}", "contracts", f"size {at}; 0 if empty", "book"))
            cols.append(_col(f"{side}_ct_{lvl:02d}", "orders", f"order count {at}", "book"))
    since = "since the previous snapshot"
    cols += [
        _col("buy_volume", "contracts", f"buyer-initiated volume {since}", "trades"),
        _col("sell_volume", "contracts", f"seller-initiated volume {since}", "trades"),
        _col("trade_count", "trades", f"trades {since}", "trades"),
        _col("book_crossed", "bool", "best bid above best ask (crossed, e.g. pre-open); labels are NaN there",
             "book"),
        _col("book_complete", "bool", "False before the book is trustworthy: an MBO stream that starts without a "
             "snapshot misses the orders resting before it (rule: alphafeat.book.book_complete_from; the mark uses "
             "later records: a row filter, never an input)", "book"),
    ]
    specs = {s.name: s for s in feature_specs(job.features)}
    cols += [dataclasses.asdict(specs[n]) for n in job.names]
    src = "alphafeat.labels"
    t1 = "end time of the label (when its outcome is known); null where past the segment end"
    for h in job.horizons:
        what = f"sign of mid[t+{h}] - mid[t] within the session; NaN on tie, end of data, session break or roll"
        cols.append(_col(f"label_h{h}", "1 up / 0 down / NaN", what, src))
        cols.append(_col(f"t1_h{h}", ns, t1, src))
    for sec in job.horizons_s:
        what = f"sign of the as-of mid {sec:g} s ahead minus mid[t]; NaN on tie or past the segment end"
        cols.append(_col(f"label_h{sec:g}s", "1 up / 0 down / NaN", what, src))
        cols.append(_col(f"t1_h{sec:g}s", ns, t1, src))
    if job.barrier:
        what = (f"triple barrier ({job.barrier}, vertical {job.barrier_horizon} snapshots) on mid: +1 profit, "
                "-1 stop, 0 timeout, NaN where the vertical barrier passes the segment end untouched")
        cols.append(_col("tb_label", "+1 / -1 / 0 / NaN", what, "AFML ch. 3"))
        cols.append(_col("tb_t1", ns, "time of the barrier touch or of the vertical barrier", src))
    return cols


def _barrier_widths(mid: np.ndarray, ret2: np.ndarray | None, barrier: Barrier, job: Job) -> np.ndarray:
    """Triple-barrier half-width per row, index points (``barrier``: ``job.barrier`` parsed; see
    PrecomputeConfig.barrier)."""
    tick = job.features.tick_size
    if barrier.kind == "ticks":
        return np.full(mid.shape, barrier.k * tick)
    return barrier.k * np.sqrt(ret2) * tick * np.sqrt(job.barrier_horizon)


def crossed(b: BookArrays) -> np.ndarray:
    """bool (n,): the best bid is above the best ask (a crossed book, e.g. in the pre-open)."""
    with np.errstate(invalid="ignore"):
        return b.bid_px[:, 0] > b.ask_px[:, 0]


def book_mid(b: BookArrays) -> np.ndarray:
    """The mid price, float64 (n,), as the ``mid`` feature computes it: ``0.5 * (bid + ask)``
    of the best levels, NaN where either is empty (the same operations, so bit-identical)."""
    return _mid(b.bid_px[:, 0], b.ask_px[:, 0])


def _mid(bid: np.ndarray, ask: np.ndarray) -> np.ndarray:
    return 0.5 * (bid + ask)


def label_mid(bid: np.ndarray, ask: np.ndarray, crossed: np.ndarray) -> np.ndarray:
    """The mid the labels read, float64 (n,), from the best bid and ask (n,): :func:`book_mid`,
    NaN where the book is crossed (no label there). A partition's stored ``bid_px_00``,
    ``ask_px_00`` and ``book_crossed`` give the same bits (:func:`relabel_table`)."""
    return np.where(crossed, np.nan, _mid(bid, ask))


def feature_dtypes(job: Job, names: Iterable[str]) -> dict[str, type]:
    """The dtype each feature of ``names`` is stored in: float64 for price levels (unit index
    points), else ``job.dtype``."""
    fdt = np.float32 if job.dtype == "float32" else np.float64
    units = {s.name: s.unit for s in feature_specs(job.features)}
    return {k: np.float64 if units[k] == "index points" else fdt for k in names}


def _min_depth(params: FeatureParams) -> dict[str, int]:
    """Book levels each feature needs (FeatureSpec.min_depth); shallower input gives NaN."""
    return {spec.name: spec.min_depth for spec in feature_specs(params)}


def _pruned_stream(job: Job, index: dict[str, int], names: Iterable[str]) -> object:
    """A CPU :class:`~alphafeat.features.cpu.FeatureStream` computing only what features
    ``names`` need (:func:`~alphafeat.features.registry.prune_plan`: the same bits), in pieces
    of :data:`_PIECE` rows on ``job.feature_threads`` threads (up to :data:`MAX_FEATURE_THREADS`
    with ``job.in_flight``); ``index``: each feature's column."""
    from alphafeat.features.cpu import FeatureStream
    from alphafeat.features.registry import make_plan, prune_plan

    plan = prune_plan(make_plan(job.features), [index[n] for n in names])
    return FeatureStream(plan, _PIECE, MAX_FEATURE_THREADS if job.in_flight else job.feature_threads)


class SegmentColumns:
    """The stored columns of one segment, filled block by block, then labelled and tabled.

    :meth:`add` takes the segment's book in blocks (each after the first led by the previous
    block's last row, a *halo*; see :meth:`alphafeat.book.MBPBookBuilder.take`) and, on the CPU,
    continues the features from the block before
    (:class:`alphafeat.features.cpu.FeatureStream`: identical values to one call over the
    whole segment); or one whole book with its features already computed (GPU path).
    :meth:`table` adds the labels, which look ahead, from the kept mid and returns the Arrow
    table. Columns and types: :func:`column_specs`. Buffers come from the process's reserve
    (:func:`alphafeat.arena.reserve`): a worker's memory is that of its largest segment.

    Parameters
    ----------
    seg : Segment
        The segment (instrument id and symbol of every row).
    job : Job
        Stored features, book levels, dtype, labels.
    capacity : int
        Rows the segment can have at most (untouched capacity is address space only).
    """

    def __init__(self, seg: Segment, job: Job, capacity: int) -> None:
        from alphafeat.arena import reserve

        self.seg, self.job = seg, job
        self.rows = 0
        self.crossed = 0
        cap = max(int(capacity), 1)
        fdt = np.float32 if job.dtype == "float32" else np.float64
        self.dtypes: dict[str, type] = {"ts_event": np.int64, "ts_recv": np.int64}
        for lvl in range(job.book_levels):
            for side in ("bid", "ask"):
                self.dtypes.update({f"{side}_px_{lvl:02d}": np.float64, f"{side}_sz_{lvl:02d}": np.uint32,
                                    f"{side}_ct_{lvl:02d}": np.uint32})  # fmt: skip
        self.dtypes.update({"buy_volume": fdt, "sell_volume": fdt, "trade_count": fdt, "book_crossed": np.bool_,
                            "book_complete": np.bool_})  # fmt: skip
        self.dtypes.update(feature_dtypes(job, job.names))
        self.barrier = validate_barrier(job.barrier) if job.barrier else None
        label_inputs = {"_mid": np.float64, **({"_w": np.float64} if job.barrier else {}),
                        **({"_ema": np.float64} if self.barrier and self.barrier.kind == "vol" else {})}  # fmt: skip
        self.cols = {k: reserve(f"col:{k}", (cap,), dt) for k, dt in {**self.dtypes, **label_inputs}.items()}
        self.index = {s.name: k for k, s in enumerate(feature_specs(job.features))}
        self.min_depth = _min_depth(job.features)
        self.stream = None
        self.labels = _label_stream(job, cap)
        self.seconds = {"features": 0.0, "store": 0.0, "labels": 0.0}  # "store" and "labels": the worker's
        self._worker = ThreadPoolExecutor(1)  # stores and labels block by block beside the next block's features
        self._pending: list[Future] = []

    def add(self, b: BookArrays, halo: bool, feats: dict[str, np.ndarray] | None = None,
            release: Callable[[], None] | None = None) -> None:
        """Append the new rows of block ``b`` (all but the halo row); features from ``feats``
        (whole-book rows, no halo; ``ema_ret2_60s`` among them for a ``vol`` barrier) or
        computed here on the CPU, continuing the stream :data:`_PIECE` rows at a time, each
        piece's stored features copied out while its result matrix is still in cache. The book
        columns are copied, and the rows whose label horizons are all within the rows so far
        labelled (:class:`alphafeat.labels.LabelStream`), on a worker thread beside the next
        block's features; ``release()`` is called there once ``b`` is no longer read."""
        t0 = time.perf_counter()
        lo = 1 if halo else 0
        m = len(b) - lo
        if m <= 0:
            if release is not None:
                release()
            return
        k0, k1 = self.rows, self.rows + m
        if k1 > self.cols["ts_recv"].shape[0]:
            raise AlphafeatError(f"{self.seg.relpath}: more rows than the {self.cols['ts_recv'].shape[0]:,} "
                                 "reserved for the segment")  # fmt: skip
        self._wait(2)  # the worker keeps up (it holds the blocks it has still to store)
        if feats is None:
            self._stream_features(b, lo, k0)
        else:
            self._store_features(feats, b.depth, k0, k1)
        self.rows = k1
        self.seconds["features"] += time.perf_counter() - t0
        self._pending.append(self._worker.submit(self._store, b, lo, k0, k1, release))

    def _stream_features(self, b: BookArrays, lo: int, k0: int) -> None:
        """The CPU features of block ``b``'s new rows (from its row ``lo``) into the columns from
        row ``k0``, piece by piece (each piece after the block's first led by its halo row)."""
        from alphafeat.features import _prepare

        wanted = (*self.job.names, "ema_ret2_60s")
        if self.stream is None:  # only what the stored features need
            self.stream = _pruned_stream(self.job, self.index, wanted)

        def take(i0: int, i1: int, out: np.ndarray, which: frozenset[int]) -> None:
            """The stored features among the final columns ``which`` of rows ``i0:i1`` of ``b``."""
            feats = {name: out[self.index[name]] for name in wanted if self.index[name] in which}
            self._store_features(feats, b.depth, k0 + i0 - lo, k0 + i1 - lo)

        self.stream.push_block(_prepare(b, self.job.features), lo, take, live_threads(self.job))

    def _store_features(self, feats: dict[str, np.ndarray], depth: int, k0: int, k1: int) -> None:
        """Rows ``k0:k1`` of the stored feature columns among ``feats`` (all of them, or the
        part of a threaded stream's piece that is final: :meth:`FeatureStream.push_block`)."""
        c = self.cols
        for name in self.job.names:
            if name in feats:
                c[name][k0:k1] = np.nan if self.min_depth[name] > depth else feats[name]
        if "_ema" in c and "ema_ret2_60s" in feats:  # a vol barrier's widths read it
            c["_ema"][k0:k1] = feats["ema_ret2_60s"]

    def _wait(self, most: int) -> None:
        """Wait until at most ``most`` blocks are still being stored; raises what a store raised."""
        while len(self._pending) > most:
            self._pending.pop(0).result()

    def _store(self, b: BookArrays, lo: int, k0: int, k1: int, release: Callable[[], None] | None) -> None:
        """The worker's part of :meth:`add`: rows ``k0:k1`` of the book columns from block ``b``
        (from its row ``lo``), the mid (and barrier widths), then the labels that are complete."""
        t0 = time.perf_counter()
        c = self.cols
        c["ts_event"][k0:k1] = b.ts_event[lo:]
        c["ts_recv"][k0:k1] = b.ts_recv[lo:]
        for lvl in range(self.job.book_levels):
            for side, px, sz, ct in (("bid", b.bid_px, b.bid_sz, b.bid_ct), ("ask", b.ask_px, b.ask_sz, b.ask_ct)):
                c[f"{side}_px_{lvl:02d}"][k0:k1] = px[lo:, lvl]
                c[f"{side}_sz_{lvl:02d}"][k0:k1] = sz[lo:, lvl]
                c[f"{side}_ct_{lvl:02d}"][k0:k1] = ct[lo:, lvl]
        for k in ("buy_volume", "sell_volume", "trade_count"):
            c[k][k0:k1] = getattr(b, k)[lo:]
        x = crossed(b)[lo:]
        c["book_crossed"][k0:k1] = x
        c["book_complete"][k0:k1] = True  # until mark_complete says otherwise
        self.crossed += int(x.sum())
        mid = c["_mid"][k0:k1]
        mid[:] = label_mid(b.bid_px[lo:, 0], b.ask_px[lo:, 0], x)
        if release is not None:
            release()
        if self.job.barrier:
            c["_w"][k0:k1] = _barrier_widths(mid, c["_ema"][k0:k1] if "_ema" in c else None, self.barrier, self.job)
        t1 = time.perf_counter()
        self.seconds["store"] += t1 - t0
        self.labels.update(c["_mid"][:k1], c["ts_recv"][:k1], c["_w"][:k1] if self.job.barrier else None)
        self.seconds["labels"] += time.perf_counter() - t1

    def mark_complete(self, first: int) -> None:
        """Rows before ``first`` (the book's first trustworthy row; <= 0: every row) get
        ``book_complete`` False."""
        self._wait(0)  # the stores set it True
        if first > 0:
            self.cols["book_complete"][: min(first, self.rows)] = False

    def table(self, seconds: dict[str, float]) -> tuple[pa.Table, int]:
        """The Arrow table of the rows added, labels included (their time in ``seconds``);
        returns ``(table, crossed rows)``."""
        n = self.rows
        c = {k: v[:n] for k, v in self.cols.items()}
        self._wait(0)
        self._worker.shutdown()
        if self.stream is not None:
            self.stream.close()
        t0 = time.perf_counter()
        labels = _finish_labels(self.labels, c["_mid"], c["ts_recv"], c.get("_w"), self.job)
        seconds["features"] = seconds.get("features", 0.0) + self.seconds["features"] + self.seconds["store"]
        seconds["labels"] = self.seconds["labels"] + time.perf_counter() - t0
        ts = pa.timestamp("ns", tz="UTC")
        cols: dict[str, pa.Array] = {
            "ts_event": _from_numpy(c["ts_event"], ts),
            "ts_recv": _from_numpy(c["ts_recv"], ts),
            "instrument_id": _from_numpy(np.full(n, self.seg.instrument_id, dtype=np.uint32)),
            "raw_symbol": _symbol_column(self.seg.raw_symbol, n),
        }
        for k in self.dtypes:
            if k not in cols:
                cols[k] = _from_numpy(c[k])
        del c
        cols.update(_label_arrays(labels))
        return pa.table(cols), self.crossed


def _label_stream(job: Job, capacity: int) -> LabelStream:
    """The labels of ``job`` (direction horizons, triple barrier) for a segment of at most ``capacity`` rows."""
    return LabelStream(job.horizons, job.barrier_horizon if job.barrier else None, capacity)


def _finish_labels(stream: LabelStream, mid: np.ndarray, ts: np.ndarray, w: np.ndarray | None,
                   job: Job) -> dict[str, np.ndarray]:
    """The segment's labels: the rest of ``stream``'s (rows), then those in seconds."""
    labels = stream.finish(mid, ts, w)
    if job.horizons_s:
        labels.update(direction_labels_seconds(mid, ts, job.horizons_s))
    return labels


def _is_label(name: str) -> bool:
    """Whether a cache column is a label column (``label_*``, ``t1_*``, ``tb_*``)."""
    return name.startswith(("label_", "t1_", "tb_"))


def _label_arrays(labels: dict[str, np.ndarray | pa.ChunkedArray]) -> dict[str, pa.Array | pa.ChunkedArray]:
    """The label columns as Arrow arrays: end times as UTC timestamps, null where unknown (< 0);
    a column already in Arrow (kept from a partition) as it is."""
    ts = pa.timestamp("ns", tz="UTC")
    return {k: v if isinstance(v, pa.ChunkedArray) else
            _from_numpy(v, ts, v < 0) if k.startswith("t1_") or k == "tb_t1" else _from_numpy(v, pa.float32())
            for k, v in labels.items()}  # fmt: skip


def _from_numpy(v: np.ndarray, type: pa.DataType | None = None, null: np.ndarray | None = None) -> pa.Array:
    """A numpy array (n,) of fixed-width values or bools as an Arrow array of ``type`` (default:
    the dtype's) over its buffer (bools packed), null where ``null``: what ``pa.array(v, type,
    mask=null)`` gives (the same IPC bytes), without the pandas that any ``pa.array`` call loads
    (~0.2-0.3 s: of a relabel, and of every worker process that writes a partition)."""
    v = np.ascontiguousarray(v)
    type = pa.from_numpy_dtype(v.dtype) if type is None else type
    if v.ndim != 1 or (8 * v.dtype.itemsize != type.bit_width and not (v.dtype == np.bool_ and type == pa.bool_())):
        raise AlphafeatError(f"{v.dtype} {v.shape} is not a column of {type}")
    data = np.packbits(v, bitorder="little") if v.dtype == np.bool_ else v
    k = 0 if null is None else int(null.sum())
    valid = pa.py_buffer(np.packbits(~null, bitorder="little")) if k else None
    return pa.Array.from_buffers(type, len(v), [valid, pa.py_buffer(data)], null_count=k)


def _symbol_column(symbol: str, n: int) -> pa.DictionaryArray:
    """``raw_symbol`` of ``n`` rows: a dictionary of the one symbol (int8 indices), built from
    buffers (no pandas; see :func:`_from_numpy`)."""
    text = symbol.encode()
    offsets = np.array([0, len(text)], dtype=np.int32)
    dictionary = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(text)])
    return pa.DictionaryArray.from_arrays(_from_numpy(np.zeros(n, dtype=np.int8)), dictionary)


#: Options that change only the label columns of a partition (a rerun that changes only these
#: relabels the partitions on disk: :func:`relabel_table`); the compression is rewritten too.
LABEL_OPTIONS = ("horizons", "horizons_s", "barrier", "barrier_horizon", "compression")


def reuse_key(meta: dict) -> str:
    """What a partition's rows and book columns were computed from: its schema metadata without
    the label options, the stored feature set, the label and feature columns and the fingerprint
    (JSON text). Equal keys: the same rows and book columns, and every feature of the partition
    has the bytes a fresh run would store (the feature parameters are in the key)."""
    params = meta.get("params") or {}
    try:
        names = {s.name for s in feature_specs(FeatureParams(**_tuples(params.get("features") or {})))}
    except (TypeError, ValueError):
        return json.dumps(meta, sort_keys=True)  # unreadable parameters: equal to nothing but itself
    m = {k: v for k, v in meta.items() if k not in ("fingerprint", "columns", "params")}
    m["params"] = {k: v for k, v in params.items() if k not in (*LABEL_OPTIONS, "feature_set")}
    m["columns"] = [c for c in meta.get("columns") or [] if not _is_label(str(c.get("name", "")))
                    and c.get("name") not in names]  # fmt: skip
    return json.dumps(m, sort_keys=True)


def _tuples(d: dict) -> dict:
    """JSON lists back to tuples (the form of FeatureParams' fields)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def can_relabel(job: Job) -> bool:
    """Whether labels can be recomputed from a partition's own columns: the mid from
    ``bid_px_00``/``ask_px_00``/``book_crossed`` (stored in float64, so bit-identical), and a
    triple barrier only of fixed width (a ``vol`` barrier reads a feature the cache may not hold)."""
    return job.book_levels >= 1 and (not job.barrier or validate_barrier(job.barrier).kind == "ticks")


def relabel_changes(table: pa.Table, job: Job) -> tuple[str, ...]:
    """What a relabel of the partition ``table`` into ``job``'s options changes, for the
    summary: ``"labels"`` (other horizons or barrier), ``"features added"`` (stored features it
    lacks, computed from the kept book), ``"features dropped"`` (stored features ``job`` does not
    ask for), ``"compression"``."""
    old, have = _label_params(table), set(table.column_names)
    ours = {c["name"] for c in column_specs(job)}
    labels = (old["horizons"] != list(job.horizons) or old["horizons_s"] != [float(x) for x in job.horizons_s]
              or old["barrier"] != job.barrier or bool(job.barrier) and old["barrier_horizon"] != job.barrier_horizon)
    dropped = any(n not in ours and not _is_label(n) for n in have)
    return tuple(k for k, yes in (("labels", labels), ("features added", any(n not in have for n in job.names)),
                                  ("features dropped", dropped), ("compression", old["compression"] != job.compression))
                 if yes)  # fmt: skip


def relabel_table(table: pa.Table, job: Job, added: dict[str, np.ndarray] | None = None) -> pa.Table:
    """``table`` (a partition) with ``job``'s features and labels: the same values and columns
    as computing the segment afresh (``tests/test_cache_runs.py``).

    Its book columns are kept; its features that ``job`` stores are kept, the others dropped,
    and those it lacks come from ``added`` (stored columns by name, :func:`added_features`);
    its labels are recomputed for ``job``'s label options from its own mid and ``ts_recv``.
    A label column whose options the partition's metadata (``alphafeat`` schema key) shows
    unchanged is kept as it is (it was computed from the same mid: ``label_h{h}`` / ``t1_h{h}``
    of a horizon it holds, the triple barrier of the same ``barrier`` and ``barrier_horizon``,
    a horizon in seconds it holds); the others are computed whole-segment
    (:func:`alphafeat.labels.direction_labels`, numpy; :func:`alphafeat.labels.triple_barrier`
    and :func:`alphafeat.labels.direction_labels_seconds`), which equal the streamed labels of
    a fresh run bit for bit. Requires :func:`can_relabel`."""
    from alphafeat.labels import direction_labels, triple_barrier

    old = _label_params(table)
    mid: list[np.ndarray] = []  # computed once, when a label needs it

    def inputs() -> tuple[np.ndarray, np.ndarray]:
        if not mid:
            x = column_array(table, "book_crossed", np.bool_)
            mid.append(label_mid(column_array(table, "bid_px_00", np.float64),
                                 column_array(table, "ask_px_00", np.float64), x))  # fmt: skip
            mid.append(column_array(table, "ts_recv", np.int64).copy())  # writable: the kernels' types
        return mid[0], mid[1]

    def kept(names: list[str], same: bool) -> dict[str, pa.ChunkedArray] | None:
        ok = same and all(table.schema.get_field_index(k) >= 0 for k in names)  # -1: absent (or twice)
        return {k: table.column(k) for k in names} if ok else None

    labels: dict[str, np.ndarray | pa.ChunkedArray] = {}
    for h in job.horizons:
        names = [f"label_h{h}", f"t1_h{h}"]
        labels.update(kept(names, h in old["horizons"]) or direction_labels(inputs()[0], [h], ts=inputs()[1]))
    if job.barrier:
        same = old["barrier"] == job.barrier and old["barrier_horizon"] == job.barrier_horizon
        tb = kept(["tb_label", "tb_t1"], same)
        if tb is None:
            m, ts = inputs()
            w = _barrier_widths(m, None, validate_barrier(job.barrier), job)
            y, t1, _ = triple_barrier(m, w, w, job.barrier_horizon, ts)
            tb = {"tb_label": y, "tb_t1": t1}
        labels.update(tb)
    for sec in job.horizons_s:
        names = [f"label_h{sec:g}s", f"t1_h{sec:g}s"]
        labels.update(kept(names, old["horizons_s"].count(sec) == 1) or
                      direction_labels_seconds(*inputs(), [sec]))  # fmt: skip
    names = {s.name for s in feature_specs(job.features)}
    book = {k: table.column(k) for k in table.column_names if not _is_label(k) and k not in names}
    feats = {k: table.column(k) if table.schema.get_field_index(k) >= 0 else _from_numpy((added or {})[k])
             for k in job.names}  # fmt: skip
    return pa.table({**book, **feats, **_label_arrays(labels)})


def added_features(b: BookArrays, job: Job, names: list[str], where: str = "",
                   gpu_locks: str | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """The stored columns (n,) of features ``names`` of the whole book ``b`` (a segment's kept
    book, :func:`alphafeat.segment.load_book`), with the dtypes, the values and the NaN of too
    shallow a book that a fresh run stores: on the CPU a
    :class:`~alphafeat.features.cpu.FeatureStream` of the plan pruned to these features
    (:func:`~alphafeat.features.registry.prune_plan`: the same operations on the same rows,
    so the same bits), block by block; on a GPU every feature, as a fresh run computes them
    (:func:`device_features`: ``where`` names the segment, ``gpu_locks`` the run's turns)."""
    from alphafeat.features import _prepare

    index = {s.name: k for k, s in enumerate(feature_specs(job.features))}
    out = {n: np.empty(len(b), dt) for n, dt in feature_dtypes(job, names).items()}
    if job.device == "cpu":
        stream = _pruned_stream(job, index, names)
        try:
            k0 = 0
            for blk, halo in book_slices(b):
                lo = 1 if halo else 0

                def take(i0: int, i1: int, res: np.ndarray, which: frozenset[int], k: int = k0 - lo) -> None:
                    for n in names:
                        if index[n] in which:
                            out[n][k + i0 : k + i1] = res[index[n]]

                stream.push_block(_prepare(blk, job.features), lo, take)
                k0 += len(blk) - lo
        finally:
            stream.close()
    else:
        wide = dataclasses.replace(b, bid_sz=np.asarray(b.bid_sz, np.float64), ask_sz=np.asarray(b.ask_sz, np.float64))

        def use(feats: dict[str, np.ndarray]) -> None:
            for n in names:
                out[n][:] = feats[n]

        device_features(wide, job, where, gpu_locks, use)
    need = _min_depth(job.features)
    for n in names:
        if need[n] > b.depth:
            out[n][:] = np.nan
    return out


def column_array(table: pa.Table, name: str, dtype: type) -> np.ndarray:
    """Column ``name`` of ``table`` as a numpy array of ``dtype`` (n,): a read-only view of
    Arrow's buffer for fixed-width values (timestamps as their int64 ns), bools unpacked from
    their bits; a copy where the column has nulls or several chunks. Unlike pyarrow's
    ``to_numpy``, it never loads pandas (~0.2-0.3 s, which a relabel would otherwise spend)."""
    col = table.column(name)
    arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    n, off = len(arr), arr.offset
    if arr.null_count:
        return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)
    if pa.types.is_boolean(arr.type):
        bits = np.frombuffer(arr.buffers()[1], dtype=np.uint8) if n else np.zeros(0, np.uint8)
        return np.unpackbits(bits, count=off + n, bitorder="little")[off:].view(np.bool_)
    dt = np.dtype(dtype)
    if arr.type.bit_width != 8 * dt.itemsize:
        raise AlphafeatError(f"column {name}: {arr.type} is not {dt}")
    if not n:
        return np.empty(0, dtype=dt)
    return np.frombuffer(arr.buffers()[1], dtype=dt, count=n, offset=off * dt.itemsize)


def _label_params(table: pa.Table) -> dict:
    """The label options a partition's metadata records (those absent: empty / None, so that
    none of its label columns is kept)."""
    from alphafeat.cache import META_KEY

    try:
        params = json.loads((table.schema.metadata or {})[META_KEY]).get("params") or {}
    except (KeyError, ValueError, AttributeError):
        params = {}
    return {"horizons": [int(h) for h in params.get("horizons") or []],
            "horizons_s": [float(s) for s in params.get("horizons_s") or []],
            "barrier": params.get("barrier"), "barrier_horizon": params.get("barrier_horizon"),
            "compression": params.get("compression")}  # fmt: skip


#: Rows of one push of the CPU features (:meth:`SegmentColumns.add`): their float64 result
#: matrix (~2.3 MB at the default features) stays in cache until the stored ones are copied out.
_PIECE = 4096


def device_features(b: BookArrays, job: Job, where: str, gpu_locks: str | None,
                    use: Callable[[dict[str, np.ndarray]], None]) -> None:  # fmt: skip
    """Every feature of the whole book ``b`` on ``job.device`` (:func:`compute_features`),
    handed to ``use`` (which copies out what it keeps); on a GPU, with ``gpu_locks`` (the run's
    staging folder), in a turn among the run's segments (:func:`alphafeat.cuda.gpu_turn`: bounded
    GPU memory) that ends after ``use``, freeing the device and pinned host memory the features
    lie in. A GPU out of memory (numba-cuda's ``CudaAPIError``) raises an AlphafeatError line
    naming ``where`` (the segment)."""
    if job.device != "cuda":
        use(compute_features(b, job.features, device=job.device))
        return
    from alphafeat.cuda import gpu_turn

    try:
        with gpu_turn(gpu_locks) if gpu_locks else contextlib.nullcontext():
            use(compute_features(b, job.features, device=job.device))
    except Exception as e:
        if type(e).__name__ == "CudaAPIError" and "OUT_OF_MEMORY" in str(e):
            raise AlphafeatError(f"{where}: --device cuda: the GPU ran out of memory for the {len(b):,} rows of "
                                 "this session (its whole book and features are held there); use --device cpu"
                                 ) from None  # fmt: skip
        raise


def segment_table(b: BookArrays, seg: Segment, job: Job, seconds: dict[str, float],
                  gpu_locks: str | None = None) -> tuple[pa.Table, int]:  # fmt: skip
    """Features, labels and the stored book columns of one whole segment book (the GPU and
    volume-bar path) as an Arrow table; returns ``(table, crossed rows)`` and adds
    ``features`` and ``labels`` to ``seconds``. Columns and types: :func:`column_specs`.
    With ``gpu_locks`` (the run's staging folder) GPU features wait for a turn among the
    run's segments (:func:`alphafeat.cuda.gpu_turn`: bounded GPU memory)."""
    t0 = time.perf_counter()
    k = b.complete_from
    if job.bar_volume:
        t = b.ts_recv[k] if 0 < k < len(b) else None
        b = volume_bars(b, job.bar_volume)
        k = k if k <= 0 else (len(b) if t is None else int(np.searchsorted(b.ts_recv, t)))  # first bar after it
    cols = SegmentColumns(seg, job, len(b))

    def use(feats: dict[str, np.ndarray]) -> None:
        seconds["features"] = time.perf_counter() - t0
        cols.add(b, False, feats)

    device_features(b, job, seg.relpath, gpu_locks, use)
    cols.mark_complete(k)
    return cols.table(seconds)


def _partition_metadata(common: dict, seg: Segment, schedule: list[dict], sources: list[tuple[int, dict]]) -> dict:
    """Schema metadata of one partition and its fingerprint.

    It holds what the partition was computed from and nothing later: the roll schedule up to
    its session and the source files that start before its session ends (a later file cannot
    change an earlier session, so adding one leaves earlier partitions current).
    """
    end = session_end_ns(seg.session)
    day = seg.session.isoformat()
    meta = dict(
        common,
        session=day,
        instrument_id=seg.instrument_id,
        schedule=[c for c in schedule if c["session"] <= day],
        sources=[e for start, e in sources if start < end],
    )
    meta["fingerprint"] = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()
    return meta


def _first_use() -> bool:
    """Whether numba has no cached machine code yet for the CPU feature kernel: the first run
    in an environment compiles the kernels (~30-60 s)."""
    from alphafeat.features.cpu import _run_chunk

    return not_compiled(_run_chunk)


def not_compiled(kernel: object) -> bool:
    """Whether numba has no cached machine code yet for the ``cache=True`` kernel ``kernel``
    (its cache index is missing): a command's first run in an environment compiles it and its
    kind, which a hint should say. False when numba's internals moved (no hint)."""
    try:
        return not os.path.exists(kernel._cache._cache_file._index_path)
    except Exception:
        return False


def _keep_or_prune(rel: str, writer: CacheWriter, others: dict[str, list[str]], prune: bool) -> None:
    """A skipped segment's partition left by an earlier run (``rel``): listed with the earlier
    partitions, or with ``prune`` deleted at commit, so that the manifest always lists every
    partition on disk; ``others["skipped"]`` names it for its own note."""
    if not (writer.out / rel).is_file():
        return
    others["skipped"].append(rel)
    if prune:
        others["pruned"].append(rel)
        writer.drop.append(rel)
    else:
        others["earlier"].append(rel)  # the writer's list too: kept at commit


def _keep_worker() -> None:
    """In a loky worker: let it keep the buffers of its segments (:mod:`alphafeat.arena`).

    After each task loky compares the worker's resident memory with the one after its first
    task (a plan scan here) and, 300 MB above it, runs ``gc.collect()`` and then replaces the
    worker as leaking. A worker that keeps a session's buffers (1-2 GB) was so replaced after
    every segment: a new interpreter, its imports and numba's kernels again for each (~1 CPU-s),
    its fresh memory touched again, and results came back up to 1.8 s after their segments
    ended (16 sessions on the H200 host; a generated quarter there 31.4 s against 26.6 s with
    this, one run each, side by side). Our buffers are bounded by design (a
    worker's memory is that of its largest segment), so the check's margin is raised to the
    machine's memory here; loky has no public option for it (joblib 1.6,
    ``joblib/externals/loky/process_executor.py``). A no-op outside loky's workers."""
    mod = sys.modules.get("joblib.externals.loky.process_executor")
    if mod is not None and hasattr(mod, "_MAX_MEMORY_LEAK_SIZE"):
        import psutil

        mod._MAX_MEMORY_LEAK_SIZE = max(mod._MAX_MEMORY_LEAK_SIZE, psutil.virtual_memory().total)


def _map_one(seg: Segment, staging: str, meta: dict, job: Job, pre: str | None, keep: bool,
             relabel: str | None) -> SegmentResult | tuple:
    """Worker entry: :func:`run_segment`, with a user error returned as a picklable tuple (the
    segment's partition path last)."""
    _keep_worker()
    try:
        return run_segment(seg, staging, meta, job, pre, keep, relabel)
    except InputError as e:
        return ("input", e.path, e.problem, e.offset, e.record, seg.relpath)
    except AlphafeatError as e:
        return ("error", str(e), seg.relpath)


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


def _map(calls: list[tuple], cfg: PrecomputeConfig, device: str) -> Iterator[SegmentResult | tuple]:
    """Run ``_map_one`` over ``calls`` on the configured workers, results as they complete."""
    if not calls:
        return
    if cfg.scheduler or cfg.dask_local > 0:
        client = _dask_client(cfg)
        from dask.distributed import as_completed
        from distributed.scheduler import KilledWorker

        try:
            futures = client.map(_map_one, *zip(*calls), pure=False)
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
    n_jobs = _local_jobs(cfg)
    if n_jobs == 1 or len(calls) == 1:
        for c in calls:
            yield _map_one(*c)
        return
    from joblib import Parallel, delayed

    from alphafeat._command import stop_pool_workers
    from alphafeat.plan import spawning_workers

    par = Parallel(n_jobs=min(n_jobs, len(calls)), return_as="generator_unordered", pre_dispatch="n_jobs")
    with spawning_workers():
        results = par(delayed(_map_one)(*c) for c in calls)
    with warnings.catch_warnings():  # a run stopped by an error or Ctrl-C says so in one line of its own
        warnings.filterwarnings("ignore", message=".*tasks which were still being processed by the workers have "
                                "been cancelled", category=UserWarning)  # fmt: skip
        yield from results
    # every segment is back: stop the workers, each holding a session's buffers (_keep_worker),
    # which Python's exit would otherwise wait to see torn down (16 sessions on the H200 host:
    # 7.8-8.3 s against 8.5-9.4 s, 3 runs each, interleaved). Nothing of theirs is needed (their
    # partitions staged, their results here); the next run in this process (a notebook) starts new ones.
    stop_pool_workers()


def _tasks(progress: object | None) -> tuple[Callable[[str, int], object], Callable[[object], None]]:
    def task(desc: str, total: int) -> object | None:
        return progress.add_task(desc, total=total) if progress is not None else None

    def advance(t: object | None) -> None:
        if progress is not None and t is not None:
            progress.advance(t)

    return task, advance


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
    cfg = check_config(cfg)
    # auto is the CPU here: see PrecomputeConfig.device
    device = Device.CPU.value if cfg.device == Device.AUTO else resolve_device(cfg.device)
    job = _job(cfg, device)
    summary = Summary(device=device, out=Path(cfg.out))
    check_out(cfg.out)  # a wrong --out (or predecoded folder) fails now, not after the compute
    pre_dir = check_folder(cfg.predecoded_dir or default_predecoded_dir(cfg.out))
    summary.predecoded = pre_dir
    if cfg.rebuild_predecoded and pre_dir.is_dir():
        import shutil

        shutil.rmtree(pre_dir)
    task, advance = _tasks(progress)
    t_plan = task("plan (headers, definitions, trade volume)", 1)
    plan: Plan = make_plan(
        cfg.inputs, mode=cfg.instrument_mode, root=cfg.root, roll_rule=cfg.roll_rule, roll_days=cfg.roll_days,
        on_error=cfg.on_error, jobs=cfg.jobs, survey_dir=pre_dir,
    )  # fmt: skip
    advance(t_plan)
    summary.stage_seconds["plan"] = time.perf_counter() - t0
    summary.files = len(plan.files) + len(plan.skipped)
    summary.skipped += plan.skipped
    summary.notes += plan.notes
    summary.schedule = plan.schedule
    mode = cfg.instrument_mode
    selection = (f"front month of {cfg.root}: most traded volume in the previous session; first session: "
                 f"nearest expiration more than {cfg.roll_days} days ahead (calendar rule)")  # fmt: skip
    if mode.kind != "front-month":
        selection = str(mode)
    elif cfg.roll_rule == "calendar":
        selection = f"front month of {cfg.root}: nearest expiration more than {cfg.roll_days} days ahead"
    common = {
        "format_version": FORMAT_VERSION,
        "package_version": alphafeat.__version__,
        "instrument_mode": str(mode),
        "root": cfg.root,
        "selection_rule": selection,
        "session_rule": "CME Globex trade date D = [D-1 16:00, D 16:00) America/Chicago",
        "params": {
            "features": dataclasses.asdict(cfg.features),
            "feature_set": list(job.names),
            "book_levels": job.book_levels,
            "dtype": job.dtype,
            "compression": job.compression,
            "horizons": list(cfg.horizons),
            "horizons_s": list(cfg.horizons_s),
            "barrier": cfg.barrier,
            "barrier_horizon": cfg.barrier_horizon,
            "roll_days": cfg.roll_days,
            "roll_rule": cfg.roll_rule,
            "book_schema": plan.schema,
            "sample": cfg.sample,
        },
        "columns": column_specs(job),
    }
    schedule = [
        {"session": c.session.isoformat(), "instrument_id": c.instrument_id, "raw_symbol": c.raw_symbol,
         "expiration": c.expiration.isoformat() if c.expiration else None, "reason": c.reason}
        for c in plan.schedule
    ]  # fmt: skip
    sources = []
    for f in plan.files:
        path, size, mtime_ns = file_identity(f.path)
        sources.append((int(f.metadata.start), {"path": path, "size": size, "mtime_ns": mtime_ns,
                                                "schema": f.schema, "dbn_version": f.version}))  # fmt: skip
    keep = cfg.keep_books == "keep" or (cfg.keep_books == "auto" and plan.schema == "mbo")
    pre = None if cfg.keep_books == "none" else str(pre_dir)  # books kept earlier are used unless "none"
    n_crossed, min_rows = 0, 1 << 62
    if _first_use():
        log.warning("first use in this environment: numba compiles the kernels once (~30-60 s)")
    t_map = task(f"segments: decode, book, features, labels, write ({device})", len(plan.segments))
    with CacheWriter(cfg.out, prune=cfg.prune) as writer:
        others = writer.others([seg.relpath for seg in plan.segments],
                               {seg.session.isoformat() for seg in plan.segments}, common)  # fmt: skip
        others["skipped"] = []  # earlier partitions of segments skipped in this run (_keep_or_prune)
        recomputed: list[str] = []  # partitions on disk whose fingerprint (options, inputs) changed
        relabelled: list[str] = []  # ... of which only the label options changed: labels recomputed
        changes: set[str] = set()  # what their relabels changed (relabel_changes)
        earlier = _earlier_manifest(writer.out)
        complete: dict[str, int | None] = {}
        calls = []
        for seg in plan.segments:
            meta = _partition_metadata(common, seg, schedule, sources)
            path = writer.out / seg.relpath
            old = partition_metadata(path)  # None: no partition there (or not readable)
            if writer.current(seg.relpath, meta["fingerprint"], old):
                summary.partitions_skipped += 1
                summary.partitions.append(writer.out / seg.relpath)
                rows, n_x = _partition_stats(writer.out / seg.relpath)
                if seg.relpath in earlier.get("book_complete_from", {}):
                    complete[seg.relpath] = earlier["book_complete_from"][seg.relpath]
                summary.cache_bytes += (writer.out / seg.relpath).stat().st_size
                summary.rows += rows
                n_crossed += n_x
                min_rows = min(min_rows, rows)
                advance(t_map)
            else:
                relabel = str(path) if _reusable(old, meta, seg, job, pre) else None
                if relabel is None and path.is_file():
                    recomputed.append(seg.relpath)
                calls.append((seg, str(writer.staging), meta, relabel))
        calls.sort(key=_work, reverse=True)  # the largest first: a run does not end waiting for a big one started last
        threads = feature_threads(cfg, len(calls))
        at_once = _at_once(cfg, len(calls))
        log.debug("%d segment(s) to compute, %d at once on this machine; CPU features of each on %d thread(s) "
                  "(%d core(s))", len(calls), at_once, threads, usable_cores())  # fmt: skip
        in_flight = None
        if at_once > 1 and not cfg.scheduler:  # segments share this machine's cores
            _set_in_flight(writer.staging, at_once)
            in_flight = str(writer.staging / IN_FLIGHT)
        job_t = dataclasses.replace(job, feature_threads=threads, block_rows=stream_rows(at_once), in_flight=in_flight)
        calls = [(seg, staging, meta, job_t, pre, keep, relabel) for seg, staging, meta, relabel in calls]
        by_rel = {c[0].relpath: c[0] for c in calls}
        for done, res in enumerate(_map(calls, cfg, device), 1):
            if in_flight and len(calls) - done < at_once:  # fewer segments left than workers
                _set_in_flight(writer.staging, len(calls) - done)
            if isinstance(res, tuple):
                err = InputError(*res[1:3], offset=res[3], record=res[4]) if res[0] == "input" else \
                    AlphafeatError(res[1])  # fmt: skip
                if cfg.on_error != "skip" or not isinstance(err, InputError):
                    raise err
                log.warning("skipping %s", err)
                summary.skipped.append((Path(err.path), err.detail))
                _keep_or_prune(res[-1], writer, others, cfg.prune)
                advance(t_map)
                continue
            seg = by_rel[res.relpath]
            if res.relabelled:
                relabelled.append(res.relpath)
                changes.update(res.changes)
                if res.relpath in earlier.get("book_complete_from", {}):
                    complete[res.relpath] = earlier["book_complete_from"][res.relpath]
            summary.records += res.records
            summary.notes += res.notes
            summary.books_predecoded += res.predecoded
            for k, v in res.seconds.items():
                summary.stage_seconds[k] = summary.stage_seconds.get(k, 0.0) + v
            summary.peak_rss = max(summary.peak_rss, res.peak_rss)
            if res.rows and res.complete_from >= 0:  # the stream started without a snapshot
                complete[res.relpath] = res.complete_ts
                when = "never within the session" if res.complete_ts is None else \
                    f"from {np.datetime64(res.complete_ts, 'ns')}Z"  # fmt: skip
                summary.notes.append(
                    f"{seg.raw_symbol} {seg.session}: the MBO stream starts without a snapshot (mid-session start); "
                    f"book trustworthy {when} ({min(res.complete_from, res.rows):,} of {res.rows:,} rows before: "
                    "book_complete False; manifest book_complete_from)")  # fmt: skip
            if res.rows:
                writer.staged(res.relpath)
                summary.partitions.append(writer.out / res.relpath)
                summary.cache_bytes += staged_path(writer.staging, res.relpath).stat().st_size
                summary.rows += res.rows
                summary.rows_computed += res.rows
                min_rows = min(min_rows, res.rows)
                n_crossed += res.crossed
            else:
                summary.notes.append(f"{seg.raw_symbol} has no {seg.schema} book rows in session {seg.session}")
            advance(t_map)
        if not summary.partitions:
            raise DataError("no book rows for the chosen instruments in the inputs; nothing to write", cfg.out)
        for key, what in (("earlier", "kept {n} partition(s) of sessions not in this run, from an earlier run with "
                                      "the same options (manifest: earlier_partitions; --prune deletes them)"),
                          ("replaced", "replaced {n} partition(s) of sessions this run recomputed for another "
                                       "instrument (manifest: replaced)"),
                          ("pruned", "--prune: deleted {n} partition(s) of sessions not in this run (manifest: "
                                     "pruned)")):  # fmt: skip
            listed = [r for r in others[key] if r not in others["skipped"]]  # those have a note of their own
            if listed:
                summary.notes.append(what.format(n=len(listed)) + f": {_first(listed, 5)}")
        recomputed = [r for r in recomputed if r not in others["skipped"]]
        if recomputed:
            summary.notes.append(f"recomputed {len(recomputed)} partition(s) written earlier with other options or "
                                 f"inputs (each replaced when this run commits): {_first(recomputed, 3)}")
        if relabelled:
            done = {"labels": "label columns of changed options recomputed from their mid",
                    "features added": "features they lack computed from the kept books",
                    "features dropped": "features no longer asked for dropped",
                    "compression": f"rewritten with --compression {job.compression}"}  # fmt: skip
            what = [v for k, v in done.items() if k in changes] or ["rewritten"]
            summary.notes.append(f"relabelled {len(relabelled)} partition(s) written earlier with other label, "
                                 "feature or output options (their book columns and the stored features still asked "
                                 f"for kept): {'; '.join(what)}: {_first(sorted(relabelled), 3)}")  # fmt: skip
        if others["skipped"]:
            fate = ("deleted (--prune; manifest: pruned)" if cfg.prune else "kept, with the data of the input as it "
                    "was then (manifest: earlier_partitions; --prune deletes them)")  # fmt: skip
            summary.notes.append(f"--on-error skip: {len(others['skipped'])} partition(s) of an earlier run for "
                                 f"sessions whose input failed in this run {fate}: "
                                 f"{', '.join(others['skipped'][:5])}")  # fmt: skip
        if n_crossed:
            summary.notes.append(f"{n_crossed:,} snapshot{'s have' if n_crossed > 1 else ' has'} a crossed book "
                                 "(bid above ask, e.g. pre-open): flagged in book_crossed, with NaN labels")
        depth = min((_depth_of(p) for p in plan.files if p.schema == plan.schema), default=LEVELS)
        if depth < LEVELS:
            limited = [n for n, need in _min_depth(cfg.features).items() if depth < need and n in job.names]
            summary.notes.append(f"{plan.schema} input carries {depth} book level(s): depth features "
                                 f"{', '.join(limited) or '(none stored)'} are NaN and deeper book columns empty")
        unit = "bars" if job.bar_volume else "snapshots"
        long = [h for h in cfg.horizons if h >= min_rows]
        if long:
            summary.notes.append(f"label horizons {long} ({unit}) reach past the end of a session of {min_rows:,} "
                                 f"{unit}: those labels are NaN there")
        summary.seconds = time.perf_counter() - t0
        stats = {
            "seconds": round(summary.seconds, 3),
            "stage_seconds": {k: round(v, 3) for k, v in summary.stage_seconds.items()},
            "rows": summary.rows,
            "peak_rss": max(summary.peak_rss, peak_rss()),
            "bytes_per_row": round(summary.bytes_per_row, 1),
            "books_predecoded": summary.books_predecoded,
            "rows_per_second": round(summary.rows_per_second),
        }
        ours = sorted(str(p.relative_to(writer.out)) for p in summary.partitions)
        computed = summary.partitions_skipped < len(summary.partitions)  # else the computing run's record stays
        for rel in others["earlier"]:
            if rel in earlier.get("book_complete_from", {}):
                complete[rel] = earlier["book_complete_from"][rel]
        manifest = dict(common, schedule=schedule, sources=[e for _, e in sources], notes=summary.notes,
                        partitions=sorted(ours + others["earlier"]), earlier_partitions=others["earlier"],
                        replaced=others["replaced"], pruned=others["pruned"], book_complete_from=complete,
                        skipped=[{"path": str(p), "problem": why} for p, why in summary.skipped],
                        run=stats if computed else earlier.get("run", stats))  # fmt: skip
        writer.commit(manifest)
    summary.peak_rss = max(summary.peak_rss, peak_rss())
    summary.seconds = time.perf_counter() - t0
    release_buffers()  # the buffers this process kept for its segments (arena) go back
    log.info("%s: %d rows in %d partitions, %d of them already current", cfg.out, summary.rows,
             len(summary.partitions), summary.partitions_skipped)  # fmt: skip
    return summary


def _work(call: tuple) -> int:
    """A map call's work, to run the largest first: the bytes of its segment's book files (0
    for a relabel, which reads none; a file holding several sessions counts whole for each)."""
    seg, relabel = call[0], call[-1]
    return 0 if relabel else sum(os.path.getsize(f) for f in seg.book_files if os.path.exists(f))


def _reusable(old: dict | None, meta: dict, seg: Segment, job: Job, pre: str | None) -> bool:
    """Whether the partition on disk (metadata ``old``) can be relabelled into this run's
    (:func:`relabel_table`): the same rows and book columns (:func:`reuse_key`), labels
    computable from its columns, and the features it lacks computable from the segment's
    kept book (not for volume bars, whose rows are not the book's)."""
    if old is None or not can_relabel(job) or reuse_key(old) != reuse_key(json.loads(json.dumps(meta))):
        return False  # (json: as the file holds it)
    missing = set(job.names) - {c.get("name") for c in old.get("columns") or []}
    return not missing or (pre is not None and not job.bar_volume and is_kept(kept_book(seg, pre)))


def _first(items: list[str], k: int) -> str:
    """The first ``k`` of ``items`` for a note, comma-separated, `` ...`` when there are more."""
    return ", ".join(items[:k]) + (" ..." if len(items) > k else "")


def _earlier_manifest(out: Path) -> dict:
    """The cache's manifest before this run ({} when none or unreadable)."""
    from alphafeat.cache import MANIFEST

    try:
        return json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def _depth_of(f: object) -> int:
    return 1 if f.schema == "mbp-1" else LEVELS


def _partition_stats(path: Path) -> tuple[int, int]:
    """Rows and crossed-book rows of a partition file (memory-mapped; one column read)."""
    with pa.memory_map(str(path)) as src:
        table = pa.ipc.open_file(src).read_all()
        return table.num_rows, int(column_array(table, "book_crossed", np.bool_).sum())

