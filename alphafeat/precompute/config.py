"""The options of one ``precompute`` run (:class:`PrecomputeConfig`), their checks and the device.

Nothing here reads an input: :func:`check_config` checks and normalises every option
(:mod:`alphafeat.validation`), :func:`resolve_device` turns ``auto`` into a device.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from pathlib import Path

from alphafeat.cache import PREDECODED_NAME
from alphafeat.cores import usable_cores
from alphafeat.errors import AlphafeatError, UsageError
from alphafeat.features import FeatureParams, cuda_available
from alphafeat.labels import DEFAULT_HORIZONS
from alphafeat.options import as_text, check_fields, opt, optional
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
           "resolve_device", "validate_device"]

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "data"


def default_predecoded_dir(out: str | os.PathLike[str]) -> Path:
    """``<out>/.predecoded``: where books and plan scans are kept between runs by default, inside
    the cache (``alphafeat clean`` or deleting the cache removes them; ``pyarrow.dataset`` and
    the cache's readers skip names starting with ``.``)."""
    return Path(out).resolve() / PREDECODED_NAME


def validate_device(value: object, option: str = "--device") -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:I[,J...]`` (GPUs by id, each once; whether they
    exist is checked when the run starts): the value as a string. ``UsageError`` otherwise."""
    text = str(getattr(value, "value", value)).strip()
    head, colon, tail = text.partition(":")
    if colon and head == "cuda":
        ids = tail.split(",")
        if all(i.strip().isdigit() for i in ids) and len({int(i) for i in ids}) == len(ids):
            return "cuda:" + ",".join(str(int(i)) for i in ids)
        raise UsageError(option, "expected cuda:I[,J...] with distinct GPU ids", text)
    return validate_enum(text, Device, option).value


@dataclass
class PrecomputeConfig:
    """Parameters of one ``precompute`` run.

    Each option is declared once, on its field (:func:`alphafeat.options.opt`): its check, its
    flag and its ``--help`` text, from which ``alphafeat precompute``'s parser is built and
    ``docs/cli.md`` generated.

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
        the CPU path's workers (``--jobs``), which decode and build their books block by block,
        store the book columns, label and write as on the CPU, and hand the feature inputs to
        this process's GPU hub (:mod:`alphafeat.cuda.hub`: one GPU owner per visible device,
        shared-memory slots; recurrences carried on the device; memory bounded by the segments
        at once); volume bars keep whole books.
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

    inputs: list[Path] = opt(help="DBN files or directories", flag="--input", nargs="+", metavar="PATH",
                             check=validate_path, cli_default=None, default_text="the embedded sample in data/")
    out: Path = opt(help="cache directory", check=validate_path, cli_default=Path("cache"), default_text="./cache")
    instrument_mode: InstrumentMode = opt(help="all | id=N | front-month", check=validate_instrument_mode,
                                          default_factory=lambda: InstrumentMode(ModeKind.FRONT_MONTH))
    root: str = opt("ES", help="product root for front-month", check=validate_root)
    device: str = opt("auto", check=validate_device,
                      metavar="{auto,cpu,cuda,cuda:I[,J...]}",
                      help="where features are computed (cuda: every visible GPU; cuda:0,1: those); auto: the GPU "
                           "only where its streamed path measured faster (so far: nowhere, the CPU), else the CPU; "
                           "the summary says which and why")
    horizons: tuple[int, ...] = opt(DEFAULT_HORIZONS, help="label horizons in snapshots, comma-separated",
                                    check=validate_horizons)
    features: FeatureParams = field(default_factory=FeatureParams)
    feature_set: str = opt("default", flag="--features",
                           default_text="default, a documented subset with the top of book",
                           help="features stored: names and groups, comma-separated (all: every feature and book "
                                "level; default,book: all book levels; groups: ofi, depth, ema, flow, vol, price)")
    dtype: str = opt("float32", enum=Dtype, help="storage of feature columns (computed in float64; prices stay "
                     "float64)")
    compression: str = opt("none", enum=Compression, help="Arrow IPC buffer compression (none: memory-mappable)")
    roll_days: int = opt(8, check=partial(validate_int, lo=0, what="a number of days"),
                         help="calendar rule: roll this many days before expiration")
    horizons_s: tuple[float, ...] = opt((), help="extra label horizons in seconds (as-of mid)", cli=False,
                                        check=validate_horizons_s)
    barrier: str | None = opt("ticks:4", flag="--barrier", cli=False, check=as_text(validate_barrier),
                              help="triple-barrier widths: ticks:K or vol:K; None for none")
    barrier_horizon: int = opt(1000, cli=False, check=partial(validate_int, lo=1, what="a number of snapshots"),
                               help="vertical barrier in snapshots")
    sample: str = opt("snapshot", check=as_text(validate_sample),
                      help="snapshot (a row per book snapshot) or volume:V (a row per V-contract volume bar)")
    roll_rule: str = opt("volume", enum=RollRule,
                         help="front month: most volume in the previous session (volume), or calendar")
    on_error: str = opt("raise", enum=OnError, help="a bad input file stops the run (raise) or is skipped with a "
                        "warning (skip)")
    jobs: int = opt(1, check=validate_jobs,
                    help="worker processes: plan scans and session segments in parallel (-1: all the cores it may "
                         "use; each starts in ~1 s, so worth it for several full sessions, not a small "
                         "sample)")
    scheduler: str | None = opt(None, check=validate_scheduler, metavar="ADDRESS",
                                help="run segments on a Dask distributed cluster (inputs and --out on a shared "
                                     "filesystem)")
    dask_local: int = opt(0, metavar="N", help="run segments on a Dask LocalCluster of N worker processes (0: none)",
                          check=partial(validate_int, lo=0, what="a number of Dask workers (0: no Dask)"))
    predecoded_dir: Path | None = opt(None, flag="--predecoded-dir", metavar="DIR", check=optional(validate_path),
                                      default_text="<out>/.predecoded, inside the cache",
                                      help="where kept books and plan scans go (give two caches one folder to share "
                                           "it)")
    keep_books: str = opt("auto", flag="--predecoded", enum=Predecoded,
                          help="keep each segment's book in the predecoded folder so a rerun with other features, "
                               "horizons or options skips decode and book (~360 bytes a row of disk): auto for "
                               "books rebuilt from MBO, keep for all, none")
    rebuild_predecoded: bool = opt(False, check=validate_bool,
                                   help="clear the predecoded folder (kept books and plan scans) first")
    prune: bool = opt(False, check=validate_bool,
                      help="delete the cache's partitions of sessions not in this run (without it they are kept, "
                           "listed in the manifest as earlier_partitions)")
    schema: str | None = opt(None, check=validate_book_schema, metavar="{mbo,mbp-10,mbp-1}",
                             default_text="per session the richest the inputs hold: mbo, then mbp-10, then mbp-1",
                             help="use the book files of this schema only")
    preopen: str = opt("keep", check=validate_preopen, metavar="{keep,drop}",
                       help="crossed-book rows (the pre-open auction): keep (flagged in book_crossed, NaN labels and "
                            "price features) or drop (not written)")


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a CUDA GPU is usable, else ``cpu``; ``cuda:I[,J...]`` -> ``cuda``.

    Raises
    ------
    UsageError
        An unknown name.
    AlphafeatError
        ``cuda`` without a usable GPU.
    """
    given = validate_device(device)
    device = given.split(":")[0]
    if device == Device.AUTO:
        return Device.CUDA.value if cuda_available() else Device.CPU.value
    if device == Device.CUDA and not cuda_available():
        raise AlphafeatError(f"--device {given}: no usable CUDA GPU (numba.cuda.is_available() is False)")
    return device


#: ``--device auto`` takes the GPU from this many local workers (``--jobs``) on, where the
#: streamed GPU path measured faster than the CPU's; None: no case has measured faster yet
#: (docs/performance.md, "--device cuda", the GPU hub: 16 sessions on 16 cores as fast as the
#: CPU within the runs' spread, with less CPU time; one session on 2 cores and ``--features all``
#: slower), so ``auto`` stays on the CPU.
AUTO_GPU_MIN_JOBS: int | None = None


def choose_device(cfg: PrecomputeConfig) -> tuple[str, str]:
    """The device a run computes its features on, and why (the summary's ``device`` row).

    ``cpu`` and ``cuda`` as asked (``cuda`` without a usable GPU: AlphafeatError). ``auto``:
    the GPU where one is usable and the run maps its segments on this machine's workers with
    at least :data:`AUTO_GPU_MIN_JOBS` workers (the case where it measured faster), else the
    CPU (no GPU; too few workers or no case measured faster; a Dask cluster, whose workers
    are other processes).
    """
    device = validate_device(cfg.device)
    if device != Device.AUTO:
        return resolve_device(device), f"--device {device}"
    # the GPU is probed last: numba.cuda's import and the driver's start cost ~0.2-0.4 s
    if AUTO_GPU_MIN_JOBS is None:
        return Device.CPU.value, "auto: the streamed GPU path has not measured faster than the CPU yet"
    if cfg.scheduler or cfg.dask_local:
        return Device.CPU.value, "auto: a Dask cluster's workers (the GPU hub serves this machine's workers)"
    jobs = usable_cores() if cfg.jobs < 0 else max(1, cfg.jobs)
    if jobs < AUTO_GPU_MIN_JOBS:
        return Device.CPU.value, f"auto: --jobs {jobs} (the GPU measured faster from {AUTO_GPU_MIN_JOBS} workers)"
    if not cuda_available():
        return Device.CPU.value, "auto: no usable CUDA GPU"
    return Device.CUDA.value, f"auto: a CUDA GPU and --jobs {jobs} (measured faster than the CPU there)"


def check_config(cfg: PrecomputeConfig) -> PrecomputeConfig:
    """``cfg`` with every option checked by its field's check (a ``validate_*`` of
    :mod:`alphafeat.validation`, declared with the field: :func:`alphafeat.options.check_fields`)
    and normalised (enum options as their plain strings, int tuples, paths); ``cfg`` itself
    is left as it was.

    Raises
    ------
    UsageError
        The first bad option, named as the CLI spells it, with the value and what is allowed.
    AlphafeatError
        ``scheduler`` / ``dask_local`` without Dask distributed installed.
    """
    c = check_fields(cfg)  # each field by its own check (alphafeat.options), named as the CLI spells it
    c = dataclasses.replace(c, **{f.name: getattr(c, f.name).value for f in dataclasses.fields(c)
                                  if isinstance(getattr(c, f.name), Enum)})  # plain strings: manifests, plans
    if c.scheduler is not None and c.dask_local:
        raise UsageError("--scheduler and --dask-local", "expected one of them (a cluster's address, or a local one)",
                         f"--scheduler {c.scheduler} --dask-local {c.dask_local}")  # fmt: skip
    if (c.scheduler or c.dask_local) and importlib.util.find_spec("distributed") is None:
        raise AlphafeatError("--scheduler / --dask-local need Dask distributed: pip install 'dask[distributed]' "
                             "(or pip install -e '.[dask]')")  # fmt: skip
    return c
