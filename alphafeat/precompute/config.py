"""The options of one ``precompute`` run (:class:`PrecomputeConfig`), their checks and the device.

Nothing here reads an input: :func:`check_config` checks and normalises every option
(:mod:`alphafeat.validation`), :func:`resolve_device` turns ``auto`` into a device.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

from alphafeat.cache import PREDECODED_NAME
from alphafeat.cores import usable_cores
from alphafeat.errors import AlphafeatError, UsageError
from alphafeat.features import FeatureParams, cuda_available
from alphafeat.labels import DEFAULT_HORIZONS
from alphafeat.validation import (
    Compression,
    Device,
    Dtype,
    InstrumentMode,
    ModeKind,
    OnError,
    Predecoded,
    RollRule,
    validate_barrier,
    validate_book_schema,
    validate_bool,
    validate_enum,
    validate_horizons,
    validate_horizons_s,
    validate_instrument_mode,
    validate_int,
    validate_jobs,
    validate_path,
    validate_preopen,
    validate_root,
    validate_sample,
    validate_scheduler,
)

__all__ = ["DEFAULT_DATA_DIR", "PrecomputeConfig", "check_config", "choose_device", "default_predecoded_dir",
           "resolve_device"]

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "data"


def default_predecoded_dir(out: str | os.PathLike[str]) -> Path:
    """``<out>/.predecoded``: where books and plan scans are kept between runs by default, inside
    the cache (``alphafeat clean`` or deleting the cache removes them; ``pyarrow.dataset`` and
    the cache's readers skip names starting with ``.``)."""
    return Path(out).resolve() / PREDECODED_NAME


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
        ``cpu``, ``cuda`` or ``auto`` (:func:`choose_device`). ``cuda``: the segments run on
        this process's threads, which decode and build their books block by block as the CPU
        path does and push the blocks to one GPU owner per device
        (:mod:`alphafeat.cuda.owner`: recurrences carried on the device, memory bounded by the
        block); volume bars keep whole books.
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
        the added ones from the kept books (:func:`~alphafeat.precompute.relabel.relabel_table`).
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
        segment's CPU features use the cores left per worker (:func:`~alphafeat.precompute.job.feature_threads`).
    scheduler : str or None
        Address of a Dask distributed scheduler (``tcp://host:8786``): segments run on its
        workers, which must see ``inputs`` and ``out`` at the same paths.
    dask_local : int
        Start a Dask ``LocalCluster`` of this many single-threaded worker processes (0: no).
    predecoded_dir : Path or None
        Where books and plan scans are kept (:mod:`alphafeat.precompute.books`;
        ``--predecoded-dir``); None: ``<out>/.predecoded``, inside the cache. Two caches given
        one folder share it (books are keyed by their files, instrument and session); the
        manifest names it (``predecoded_dir``) for ``alphafeat clean``.
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
    schema : str or None
        ``mbo``, ``mbp-10`` or ``mbp-1``: use the book files of that schema only (``--schema``);
        None (default): per session the richest book schema holding it (MBO, then MBP-10, then
        MBP-1; :mod:`alphafeat.sources`).
    preopen : str
        ``keep`` (default: crossed-book rows, the pre-open auction, are written, flagged in
        ``book_crossed``, with NaN labels and NaN price features) or ``drop`` (they are not
        written; the other rows' features and labels are those ``keep`` gives, a partition is
        always recomputed, never relabelled).
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
    schema: str | None = None
    preopen: str = "keep"


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


#: ``--device auto`` takes the GPU from this many local workers (``--jobs``) on, where the
#: streamed GPU path measured faster than the CPU's; None: no case has measured faster yet
#: (docs/performance-gpu-draft.md: on an H100 host, one session on 2 cores and 16 sessions on
#: 16 cores were both slower on the GPU path), so ``auto`` stays on the CPU.
AUTO_GPU_MIN_JOBS: int | None = None


def choose_device(cfg: PrecomputeConfig) -> tuple[str, str]:
    """The device a run computes its features on, and why (the summary's ``device`` row).

    ``cpu`` and ``cuda`` as asked (``cuda`` without a usable GPU: AlphafeatError). ``auto``:
    the GPU where one is usable and the run maps its segments on this machine's threads with
    at least :data:`AUTO_GPU_MIN_JOBS` workers (the case where it measured faster), else the
    CPU (no GPU; too few workers or no case measured faster; a Dask cluster, whose workers
    are other processes).
    """
    device = validate_enum(cfg.device, Device, "--device").value
    if device != Device.AUTO:
        return resolve_device(device), f"--device {device}"
    # the GPU is probed last: numba.cuda's import and the driver's start cost ~0.2-0.4 s
    if AUTO_GPU_MIN_JOBS is None:
        return Device.CPU.value, "auto: the streamed GPU path has not measured faster than the CPU yet"
    if cfg.scheduler or cfg.dask_local:
        return Device.CPU.value, "auto: a Dask cluster's workers (the GPU path runs on this process's threads)"
    jobs = usable_cores() if cfg.jobs < 0 else max(1, cfg.jobs)
    if jobs < AUTO_GPU_MIN_JOBS:
        return Device.CPU.value, f"auto: --jobs {jobs} (the GPU measured faster from {AUTO_GPU_MIN_JOBS} workers)"
    if not cuda_available():
        return Device.CPU.value, "auto: no usable CUDA GPU"
    return Device.CUDA.value, f"auto: a CUDA GPU and --jobs {jobs} (measured faster than the CPU there)"


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
        schema=validate_book_schema(cfg.schema),
        preopen=validate_preopen(cfg.preopen),
    )
    if c.scheduler is not None and c.dask_local:
        raise UsageError("--scheduler and --dask-local", "expected one of them (a cluster's address, or a local one)",
                         f"--scheduler {c.scheduler} --dask-local {c.dask_local}")  # fmt: skip
    if (c.scheduler or c.dask_local) and importlib.util.find_spec("distributed") is None:
        raise AlphafeatError("--scheduler / --dask-local need Dask distributed: pip install 'dask[distributed]' "
                             "(or pip install -e '.[dask]')")  # fmt: skip
    return c
