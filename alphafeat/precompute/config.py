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

__all__ = ["DEFAULT_DATA_DIR", "PrecomputeConfig", "check_config", "default_predecoded_dir", "resolve_device"]

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "data"


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
        block beside the decode, was faster than ``cuda``, which builds each session's whole book
        for one GPU call per segment, and took a third of its memory on a generated quarter;
        ``bench/precompute.py``, figures in docs/performance.md).
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
        Where books and plan scans are kept (:mod:`alphafeat.precompute.books`); None:
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
