"""The main job: DBN files -> instrument selection -> book -> features -> labels -> Arrow cache.

:func:`precompute` runs the stages in order; ``alphafeat precompute`` is its command line.
Each kept instrument is processed one trading session at a time (a *segment*): EMAs and
other recurrences restart at the start of each segment, and labels never look past its
end, so nothing crosses a session break or a roll.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

import alphafeat
from alphafeat import book as bk
from alphafeat.bars import volume_bar_ends, volume_bars
from alphafeat.cache import FORMAT_VERSION, CacheWriter, check_folder, check_out, write_partition
from alphafeat.dbn import BOOK_SCHEMAS, SCHEMA_RTYPES, DBNFile, open_dbn
from alphafeat.errors import AlphafeatError, InputError, SelectionError
from alphafeat.features import FeatureParams, compute_features, cuda_available, feature_specs
from alphafeat.instruments import (
    Choice,
    InstrumentMode,
    Symbology,
    front_month_schedule,
    is_candidate,
    outright_pattern,
    session_dates,
    session_end_ns,
)
from alphafeat.labels import DEFAULT_HORIZONS, direction_labels, direction_labels_seconds, triple_barrier
from alphafeat.predecoded import default_cache_dir as default_predecoded_dir
from alphafeat.reader import SYMBOL_MAPPING_RTYPE, read_files
from alphafeat.types import LEVELS, UNDEF_PRICE, BookArrays

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[1] / "data"
_ROOT_RE = re.compile(r"^(.+?)[FGHJKMNQUVXZ]\d{1,2}(?:-.*)?$")


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
        ``auto`` (CUDA when available), ``cpu`` or ``cuda``.
    horizons : tuple of int
        Label horizons in snapshots.
    features : FeatureParams
        Feature parameters (tick size, EMA time constants, ...).
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
        ``volume`` (most traded volume in the previous session) or ``calendar`` (roll
        ``roll_days`` before expiration); see :mod:`alphafeat.instruments`.
    on_error : str
        ``raise`` (a bad input file stops the run) or ``skip`` (warn, process the other files,
        list the skipped ones in ``Summary.skipped``).
    jobs : int
        Processes (joblib, loky; -1 for all cores) decoding files in parallel; on the CPU also
        the segments: each worker builds one segment's book, features and labels and stages its
        partition (segments are independent, so the result equals the one-process run). On a
        GPU the segments run in order in this process (one device, pinned buffers).
    predecoded_dir : Path or None
        Where decoded, filtered columns of each source file are kept (:mod:`alphafeat.predecoded`);
        None: ``<parent of out>/.predecoded``.
    rebuild_predecoded : bool
        Clear the predecoded cache before reading.
    sample : str
        ``"snapshot"`` (a row per book snapshot) or ``"volume:V"``: a row per volume bar of V
        contracts (AFML ch. 2; :func:`alphafeat.bars.volume_bars`), the same features computed
        on the bar-close snapshots and label horizons counted in bars.
    """

    inputs: list[Path]
    out: Path
    instrument_mode: InstrumentMode = field(default_factory=lambda: InstrumentMode("front-month"))
    root: str = "ES"
    device: str = "auto"
    horizons: tuple[int, ...] = DEFAULT_HORIZONS
    features: FeatureParams = field(default_factory=FeatureParams)
    roll_days: int = 8
    horizons_s: tuple[float, ...] = ()
    barrier: str | None = "ticks:4"
    barrier_horizon: int = 1000
    sample: str = "snapshot"
    roll_rule: str = "volume"
    on_error: str = "raise"
    jobs: int = 1
    predecoded_dir: Path | None = None
    rebuild_predecoded: bool = False


@dataclass
class Summary:
    """What a run did; the CLI prints it as a table."""

    files: int = 0
    records: int = 0
    snapshots: int = 0
    snapshots_kept: int = 0
    rows: int = 0
    seconds: float = 0.0
    device: str = "cpu"
    out: Path | None = None
    schedule: list[Choice] = field(default_factory=list)
    partitions: list[Path] = field(default_factory=list)
    partitions_skipped: int = 0
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def discover(inputs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Expand directories into their ``*.dbn`` / ``*.dbn.zst`` files (sorted, not recursive).

    Raises
    ------
    InputError
        For a path that does not exist, or a directory with no DBN file.
    """
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.name.endswith((".dbn", ".dbn.zst")))
            if not found:
                raise InputError(p, "directory holds no .dbn or .dbn.zst file")
            files.extend(found)
        elif p.exists():
            files.append(p)
        else:
            raise InputError(p, "no such file or directory")
    return files


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a CUDA GPU is usable, else ``cpu``.

    Raises
    ------
    AlphafeatError
        For ``cuda`` without a usable GPU, or an unknown name.
    """
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise AlphafeatError("--device cuda: no usable CUDA GPU (numba.cuda.is_available() is False)")
    if device not in ("cpu", "cuda"):
        raise AlphafeatError(f"--device: expected auto, cpu or cuda, got {device!r}")
    return device


def _by_instrument(arr: np.ndarray) -> dict[int, np.ndarray]:
    """Split a record array by ``instrument_id``, keeping stream order within each."""
    ids = arr["instrument_id"]
    order = np.argsort(ids, kind="stable")
    uniq, starts = np.unique(ids[order], return_index=True)
    bounds = list(starts) + [len(order)]
    return {int(u): arr[order[bounds[k] : bounds[k + 1]]] for k, u in enumerate(uniq)}


def build_book(
    schema: str, book_recs: np.ndarray, trade_recs: np.ndarray | None = None
) -> tuple[bk.RawBook, bk.Trades, int]:
    """One instrument's snapshots and trades from its records in stream order.

    ``schema`` ``'mbo'``: the book is rebuilt (:func:`alphafeat.book.rebuild_mbo`); MBP-10 /
    MBP-1: read as they are (:func:`alphafeat.book.mbp_snapshots`). Trades come from
    ``trade_recs`` (a trades-schema array) when given, else from the book stream. Returns
    ``(raw, trades, cancels of unknown orders)`` (the count is 0 for MBP).
    """
    n_unknown = 0
    if schema == "mbo":
        raw, trades, n_unknown = bk.rebuild_mbo(book_recs)
    else:
        raw, trades = bk.mbp_snapshots(book_recs)
    if trade_recs is not None:
        trades = bk.trades_from_records(trade_recs)
    return raw, trades, n_unknown


def _utc_date(ts_ns: int) -> dt.date:
    return dt.datetime.fromtimestamp(int(ts_ns) // 1_000_000_000, dt.timezone.utc).date()


def _root_of(symbol: str) -> str:
    m = _ROOT_RE.match(symbol)
    return m.group(1) if m else symbol


def _classify(
    files: list[Path], on_error: str = "raise", skipped: list[tuple[Path, str]] | None = None
) -> tuple[list[DBNFile], list[DBNFile], list[DBNFile]]:
    """Open headers and split into book, trades and definition files.

    With ``on_error="skip"`` a file whose header is bad is logged, appended to ``skipped`` as
    ``(path, message)`` and left out.
    """
    book, trades, defs = [], [], []
    for p in files:
        try:
            f = open_dbn(p)
        except InputError as e:
            if on_error != "skip":
                raise
            log.warning("skipping %s", e)
            if skipped is not None:
                skipped.append((p, str(e)))
            continue
        if f.schema in BOOK_SCHEMAS:
            book.append(f)
        elif f.schema == "trades":
            trades.append(f)
        elif f.schema == "definition":
            defs.append(f)
        else:
            raise InputError(
                p, f"schema {f.schema!r} is not supported (need mbo, mbp-10, mbp-1, trades or definition)"
            )
    if not book and not trades and not defs:
        raise InputError(files[0], "every input file was skipped (--on-error skip)")
    if not book:
        first = (trades + defs)[0]
        raise InputError(
            first.path,
            f"schema {first.schema!r} is not book data; give at least one mbo, mbp-10 or mbp-1 file",
        )
    schemas = sorted({f.schema for f in book})
    if len(schemas) > 1:
        raise InputError(book[0].path, f"mixed book schemas {schemas}; give one kind of book data per run")
    key = lambda f: (int(f.metadata.start), str(f.path))  # noqa: E731
    return sorted(book, key=key), sorted(trades, key=key), defs


def _col(name: str, unit: str, description: str, source: str) -> dict:
    return {"name": name, "unit": unit, "description": description, "source": source}


def _column_specs(cfg: PrecomputeConfig) -> list[dict]:
    """Every cache column with its unit, meaning and source, in column order."""
    ns = "ns since UNIX epoch (UTC)"
    cols = [
        _col("ts_event", ns, "matching-engine time of the record that completed the snapshot", "DBN"),
        _col("ts_recv", ns, "capture time of that record; the clock features use", "DBN"),
        _col("instrument_id", "", "exchange instrument id", "DBN"),
        _col("raw_symbol", "", "symbol of instrument_id on the session date", "DBN symbology"),
    ]
    for lvl in range(LEVELS):
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
    ]
    cols += [dataclasses.asdict(s) for s in feature_specs(cfg.features)]
    src = "alphafeat.labels"
    t1 = "end time of the label (when its outcome is known); null where past the segment end"
    for h in cfg.horizons:
        what = f"sign of mid[t+{h}] - mid[t] within the session; NaN on tie, end of data, session break or roll"
        cols.append(_col(f"label_h{h}", "1 up / 0 down / NaN", what, src))
        cols.append(_col(f"t1_h{h}", ns, t1, src))
    for sec in cfg.horizons_s:
        what = f"sign of the as-of mid {sec:g} s ahead minus mid[t]; NaN on tie or past the segment end"
        cols.append(_col(f"label_h{sec:g}s", "1 up / 0 down / NaN", what, src))
        cols.append(_col(f"t1_h{sec:g}s", ns, t1, src))
    if cfg.barrier:
        what = (f"triple barrier ({cfg.barrier}, vertical {cfg.barrier_horizon} snapshots) on mid: +1 profit, "
                "-1 stop, 0 timeout, NaN where the vertical barrier passes the segment end untouched")
        cols.append(_col("tb_label", "+1 / -1 / 0 / NaN", what, "AFML ch. 3"))
        cols.append(_col("tb_t1", ns, "time of the barrier touch or of the vertical barrier", src))
    return cols


def _min_depth(cfg: PrecomputeConfig) -> dict[str, int]:
    """Book levels each feature needs (FeatureSpec.min_depth); shallower input gives NaN."""
    return {spec.name: spec.min_depth for spec in feature_specs(cfg.features)}


def _selection_rule(cfg: PrecomputeConfig) -> str:
    if cfg.instrument_mode.kind != "front-month":
        return str(cfg.instrument_mode)
    calendar = f"nearest expiration more than {cfg.roll_days} days ahead (calendar rule)"
    if cfg.roll_rule == "calendar":
        return f"front month of {cfg.root}: {calendar}"
    return (f"front month of {cfg.root}: most traded volume in the previous session; "
            f"first session: {calendar}")


def _bar_volume(sample: str) -> float:
    """0 for ``snapshot`` sampling, V for ``volume:V``; AlphafeatError otherwise."""
    if sample == "snapshot":
        return 0.0
    kind, _, v = sample.partition(":")
    try:
        vol = float(v)
    except ValueError:
        vol = -1.0
    if kind != "volume" or not vol > 0:
        raise AlphafeatError(f"--sample: expected snapshot or volume:V with V > 0 contracts, got {sample!r}")
    return vol


def _partition_rows(path: Path) -> int:
    """Rows of a partition file (memory-mapped; reads batch headers only)."""
    with pa.memory_map(str(path)) as src:
        reader = pa.ipc.open_file(src)
        return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))


def _partition_metadata(
    common: dict, day: dt.date, iid: int, schedule: list[dict], sources: list[tuple[int, dict]]
) -> dict:
    """Schema metadata of one partition and its fingerprint.

    It holds what the partition was computed from and nothing later: the roll schedule up to
    its session and the source files that start before its session ends (a later file cannot
    change an earlier session, so adding one leaves earlier partitions current).
    """
    end = session_end_ns(day)
    meta = dict(
        common,
        session=day.isoformat(),
        instrument_id=iid,
        schedule=[c for c in schedule if c["session"] <= day.isoformat()],
        sources=[e for start, e in sources if start < end],
    )
    meta["fingerprint"] = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()
    return meta


def _segment_table(
    b: BookArrays, raw: bk.RawBook, iid: int, symbol: str, cfg: PrecomputeConfig, device: str
) -> pa.Table:
    feats = compute_features(b, cfg.features, device=device)
    for name, need in _min_depth(cfg).items():
        if b.depth < need:
            feats[name] = np.full(len(b), np.nan)
    is_crossed = crossed(b)
    labels = _labels(feats, b, is_crossed, cfg, device)
    n = len(b)
    cols: dict[str, pa.Array] = {
        "ts_event": pa.array(b.ts_event, pa.timestamp("ns", tz="UTC")),
        "ts_recv": pa.array(b.ts_recv, pa.timestamp("ns", tz="UTC")),
        "instrument_id": pa.array(np.full(n, iid, dtype=np.uint32)),
        "raw_symbol": pa.DictionaryArray.from_arrays(np.zeros(n, dtype=np.int32), pa.array([symbol])),
    }
    for lvl in range(LEVELS):
        for side, px, sz, ct in (
            ("bid", b.bid_px, raw.bid_sz, raw.bid_ct),
            ("ask", b.ask_px, raw.ask_sz, raw.ask_ct),
        ):
            cols[f"{side}_px_{lvl:02d}"] = pa.array(px[:, lvl])
            cols[f"{side}_sz_{lvl:02d}"] = pa.array(sz[:, lvl].astype(np.uint32))
            cols[f"{side}_ct_{lvl:02d}"] = pa.array(ct[:, lvl].astype(np.uint32))
    cols["buy_volume"] = pa.array(b.buy_volume)
    cols["sell_volume"] = pa.array(b.sell_volume)
    cols["trade_count"] = pa.array(b.trade_count)
    cols["book_crossed"] = pa.array(is_crossed)
    for k, v in feats.items():
        cols[k] = pa.array(np.asarray(v, dtype=np.float64))
    for k, v in labels.items():
        if k.startswith("t1_") or k == "tb_t1":
            cols[k] = pa.array(np.where(v >= 0, v, 0), pa.timestamp("ns", tz="UTC"), mask=v < 0)
        else:
            cols[k] = pa.array(v)
    return pa.table(cols)


def _stage_segment(
    path: Path, raw_seg: bk.RawBook, trades_seg: bk.Trades, iid: int, symbol: str, meta: dict,
    cfg: PrecomputeConfig, device: str, bar_volume: float, buffer: object | None = None,
) -> int:
    """Build one segment's book, features and labels and write its partition to ``path``
    (a staging file); returns its row count. Runs in a worker process on the CPU path."""
    b = bk.to_book_arrays(raw_seg, trades_seg, buffer=buffer)
    if bar_volume:
        raw_seg = raw_seg.take(volume_bar_ends(b, bar_volume))
        b = volume_bars(b, bar_volume)
    table = _segment_table(b, raw_seg, iid, symbol, cfg, device)
    write_partition(path, table, meta)
    return table.num_rows


def _barrier_widths(feats: dict[str, np.ndarray], cfg: PrecomputeConfig) -> np.ndarray:
    """Triple-barrier half-width per row, index points (see PrecomputeConfig.barrier)."""
    kind, _, k = (cfg.barrier or "").partition(":")
    try:
        mult = float(k)
    except ValueError:
        mult = -1.0
    if kind not in ("ticks", "vol") or not mult > 0:
        raise AlphafeatError(f"--barrier: expected ticks:K or vol:K with K > 0, got {cfg.barrier!r}")
    tick = cfg.features.tick_size
    if kind == "ticks":
        return np.full(feats["mid"].shape, mult * tick)
    sigma_ticks = np.sqrt(feats["ema_ret2_60s"]) if "ema_ret2_60s" in feats else np.nan
    return mult * sigma_ticks * tick * np.sqrt(cfg.barrier_horizon)


def _first_use() -> bool:
    """Whether numba has no cached machine code yet for the CPU feature kernel (its cache
    index is missing): the first run in an environment compiles the kernels (~30 s)."""
    try:
        from alphafeat.features.cpu import _run_chunk

        return not os.path.exists(_run_chunk._cache._cache_file._index_path)
    except Exception:  # numba internals moved: no hint
        return False


def crossed(b: BookArrays) -> np.ndarray:
    """bool (n,): the best bid is above the best ask (a crossed book, e.g. in the pre-open)."""
    with np.errstate(invalid="ignore"):
        return b.bid_px[:, 0] > b.ask_px[:, 0]


def _labels(
    feats: dict[str, np.ndarray], b: BookArrays, is_crossed: np.ndarray, cfg: PrecomputeConfig, device: str = "cpu"
) -> dict[str, np.ndarray]:
    """Direction labels (snapshots, seconds) and the triple barrier (on ``device``), each with
    its end time.

    The mid of a crossed book is not a price: labels are computed on a mid that is NaN there,
    so a label is NaN where its start or end row is crossed.
    """
    mid = np.where(is_crossed, np.nan, feats["mid"])
    out = direction_labels(mid, cfg.horizons, ts=b.ts_recv)
    if cfg.horizons_s:
        out.update(direction_labels_seconds(mid, b.ts_recv, cfg.horizons_s))
    if cfg.barrier:
        w = _barrier_widths(feats, cfg)
        y, t1, _ = triple_barrier(mid, w, w, cfg.barrier_horizon, ts=b.ts_recv, device=device)
        out["tb_label"] = y
        out["tb_t1"] = t1
    return out


def precompute(cfg: PrecomputeConfig, progress: object | None = None) -> Summary:
    """Run the main job and write the cache to ``cfg.out``.

    Parameters
    ----------
    cfg : PrecomputeConfig
        What to read, how to select, where to write.
    progress : rich.progress.Progress, optional
        When given, one task per stage is shown on it.

    Returns
    -------
    Summary
        Counts, timings, the per-session instrument choice and notes.

    Raises
    ------
    InputError
        A bad input file (named, with the byte offset where it helps).
    SelectionError
        Nothing matches the instrument mode (e.g. no outright of the root).
    AlphafeatError
        Other user errors (device, output directory). Nothing is written on any error.
    """
    t0 = time.perf_counter()
    device = resolve_device(cfg.device)
    bar_volume = _bar_volume(cfg.sample)
    summary = Summary(device=device, out=Path(cfg.out))
    check_out(cfg.out)  # a wrong --out (or predecoded folder) fails now, not after the compute
    pre_dir = check_folder(cfg.predecoded_dir or default_predecoded_dir(cfg.out))
    files = discover(cfg.inputs)
    book_files, trade_files, def_files = _classify(files, cfg.on_error, summary.skipped)
    summary.files = len(files)
    mode = cfg.instrument_mode
    only = [mode.instrument_id] if mode.kind == "id" else None

    def task(desc: str, total: int) -> object | None:
        return progress.add_task(desc, total=total) if progress is not None else None

    def advance(t: object | None) -> None:
        if progress is not None and t is not None:
            progress.advance(t)

    # ---- read ------------------------------------------------------------------------
    # streaming decode + instrument filter, joblib processes over files, predecoded cache
    t_read = task("read DBN", len(files))
    selection = {f.path: (None if f in def_files else only) for f in book_files + trade_files + def_files}
    rr = read_files(
        list(selection), instrument_ids=selection, n_jobs=cfg.jobs, cache_dir=pre_dir,
        on_error=cfg.on_error, rebuild=cfg.rebuild_predecoded,
    )  # fmt: skip
    summary.skipped += rr.skipped
    read = {fr.path: fr for fr in rr.files}
    book_files = [f for f in book_files if f.path in read]
    trade_files = [f for f in trade_files if f.path in read]
    def_files = [f for f in def_files if f.path in read]
    if not book_files:
        raise InputError(summary.skipped[0][0], "every book file was skipped (--on-error skip)")
    defs = []
    maps = []
    for fr in rr.files:
        summary.records += sum(len(a) for a in fr.arrays.values())
        if SYMBOL_MAPPING_RTYPE in fr.arrays:
            maps.append(np.asarray(fr.arrays[SYMBOL_MAPPING_RTYPE]))
        advance(t_read)
    for f in def_files:
        arr = read[f.path].arrays.get(SCHEMA_RTYPES["definition"])
        if arr is not None:
            defs.append(arr)
    schema = book_files[0].schema
    rtype = SCHEMA_RTYPES[schema]
    book_parts: dict[int, list[np.ndarray]] = {}
    for f in book_files:
        arr = read[f.path].arrays.get(rtype)
        if arr is not None and len(arr):
            for iid, a in _by_instrument(arr).items():
                book_parts.setdefault(iid, []).append(a)
    trade_parts: dict[int, list[np.ndarray]] = {}
    for f in trade_files:
        arr = read[f.path].arrays.get(SCHEMA_RTYPES["trades"])
        if arr is not None and len(arr):
            for iid, a in _by_instrument(arr).items():
                trade_parts.setdefault(iid, []).append(a)
    symbology = Symbology.build([f.metadata for f in book_files + trade_files + def_files], defs, maps)

    if only is not None and only[0] not in book_parts:
        raise SelectionError(
            f"instrument_id {only[0]} has no {schema} records in the inputs "
            f"({', '.join(str(f.path) for f in book_files)})"
        )

    # ---- book ------------------------------------------------------------------------
    t_book = task(f"book ({schema})", len(book_parts))
    books: dict[int, tuple[bk.RawBook, bk.Trades, np.ndarray, np.ndarray]] = {}
    for iid, parts in book_parts.items():
        trade_recs = np.concatenate(trade_parts[iid]) if iid in trade_parts else None
        raw, trades, n_unknown = build_book(schema, np.concatenate(parts), trade_recs)
        if n_unknown:
            summary.notes.append(
                f"instrument {iid}: {n_unknown} cancels of unknown orders (stream starts without a snapshot)"
            )
        summary.snapshots += len(raw)
        books[iid] = (raw, trades, session_dates(raw.ts_recv), session_dates(trades.ts_recv))
        advance(t_book)

    # ---- select ----------------------------------------------------------------------
    segments: list[tuple[dt.date, int, str]] = []
    symbols: dict[tuple[dt.date, int], str] = {}
    for iid, (raw, _, sess, _) in books.items():
        for day in np.unique(sess):
            first = raw.ts_recv[np.argmax(sess == day)]
            sym = symbology.resolve(iid, _utc_date(first)) or f"id{iid}"
            symbols[(day.item(), iid)] = sym
    if mode.kind == "front-month":
        pat = outright_pattern(cfg.root)  # for the message; candidates also allow ES.v.0
        candidates: dict[dt.date, dict[int, str]] = {}
        for (day, iid), sym in symbols.items():
            if is_candidate(sym, cfg.root):
                candidates.setdefault(day, {})[iid] = sym
        if not candidates:
            found = sorted(set(symbols.values()))
            raise SelectionError(
                f"no outright contract of root {cfg.root!r} (a whole symbol matching "
                f"{pat.pattern}) in the inputs; symbols found: {', '.join(found[:20]) or 'none'}"
            )
        volume: dict[tuple[dt.date, int], float] = {}
        for iid, (_, trades, _, tsess) in books.items():
            for day in np.unique(tsess):
                volume[(day.item(), iid)] = float(trades.size[tsess == day].sum())
        summary.schedule = front_month_schedule(
            candidates, volume, symbology, cfg.root, cfg.roll_days, rule=cfg.roll_rule
        )
        segments = [(c.session, c.instrument_id, c.raw_symbol) for c in summary.schedule]
    else:
        segments = [(day, iid, sym) for (day, iid), sym in sorted(symbols.items())]
        summary.schedule = [Choice(d, i, s, None, str(mode)) for d, i, s in segments]

    # ---- features, labels, cache -----------------------------------------------------
    specs = _column_specs(cfg)
    depths = {books[i][0].depth for _, i, _ in segments}
    if min(depths) < LEVELS:
        limited = [name for name, need in _min_depth(cfg).items() if min(depths) < need]
        summary.notes.append(
            f"{schema} input carries {min(depths)} book level(s): depth features "
            f"{', '.join(limited)} are NaN and deeper book columns are empty"
        )
    common = {
        "format_version": FORMAT_VERSION,
        "package_version": alphafeat.__version__,
        "instrument_mode": str(mode),
        "root": cfg.root,
        "selection_rule": _selection_rule(cfg),
        "session_rule": "CME Globex trade date D = [D-1 16:00, D 16:00) America/Chicago",
        "params": {
            "features": dataclasses.asdict(cfg.features),
            "horizons": list(cfg.horizons),
            "horizons_s": list(cfg.horizons_s),
            "barrier": cfg.barrier,
            "barrier_horizon": cfg.barrier_horizon,
            "roll_days": cfg.roll_days,
            "roll_rule": cfg.roll_rule,
            "book_schema": schema,
            "sample": cfg.sample,
        },
        "columns": specs,
    }
    schedule = [
        {
            "session": c.session.isoformat(),
            "instrument_id": c.instrument_id,
            "raw_symbol": c.raw_symbol,
            "expiration": c.expiration.isoformat() if c.expiration else None,
            "reason": c.reason,
        }
        for c in summary.schedule
    ]
    sources = [
        (int(f.metadata.start),
         {"path": str(f.path.resolve()), "size": f.path.stat().st_size,
          "mtime_ns": f.path.stat().st_mtime_ns, "schema": f.schema, "dbn_version": f.version})
        for f in book_files + trade_files + def_files
    ]
    n_crossed, min_rows = 0, 1 << 62
    first = " - first use: compiling kernels, ~30 s" if _first_use() else ""
    t_feat = task(f"features + labels ({device}){first}", len(segments))
    pinned = None  # on a GPU the book is built in page-locked memory: sent without a staging copy
    if device == "cuda" and not bar_volume:
        from alphafeat.cuda.kernels import pinned_buffer as pinned
    with CacheWriter(cfg.out) as writer:
        staged: list[tuple[str, int]] = []  # (relpath, index into segments) of partitions to write
        metas: dict[int, dict] = {}

        def stage_calls():  # the arguments of each partition to write, cut as the workers take them
            for rel, k in staged:
                day, iid, sym = segments[k]
                raw, trades, sess, tsess = books[iid]
                yield (rel, raw.take(sess == day), trades.take(tsess == day), iid, sym, metas[k])

        for k, (day, iid, sym) in enumerate(segments):
            root = cfg.root if mode.kind == "front-month" else _root_of(sym)
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", sym)
            rel = f"root={root}/session={day.isoformat()}/{safe}.arrow"
            meta = _partition_metadata(common, day, iid, schedule, sources)
            summary.partitions.append(writer.out / rel)
            raw, _, sess, _ = books[iid]
            in_seg = sess == day
            summary.snapshots_kept += int(in_seg.sum())
            if writer.current(rel, meta["fingerprint"]):
                summary.partitions_skipped += 1
                rows = _partition_rows(writer.out / rel)
                summary.rows += rows
                min_rows = min(min_rows, rows)
                advance(t_feat)
            else:
                staged.append((rel, k))
                metas[k] = meta
            bp, ap = raw.bid_px[in_seg, 0], raw.ask_px[in_seg, 0]
            n_crossed += int(((bp != UNDEF_PRICE) & (ap != UNDEF_PRICE) & (bp > ap)).sum())
        n_jobs = (os.cpu_count() or 1) if cfg.jobs < 0 else max(1, cfg.jobs)
        if device == "cpu" and n_jobs > 1 and len(staged) > 1:
            # CPU: one partition per joblib process (each segment restarts its state: independent)
            from joblib import Parallel, delayed

            # at most n_jobs segments cut ahead of the workers (each a copy of its rows)
            par = Parallel(n_jobs=min(n_jobs, len(staged)), return_as="generator", pre_dispatch="n_jobs")
            done = par(delayed(_stage_segment)(writer.staging / rel, *args, cfg, device, bar_volume)
                       for rel, *args in stage_calls())  # fmt: skip
        else:
            done = (_stage_segment(writer.staging / rel, *args, cfg, device, bar_volume, buffer=pinned)
                    for rel, *args in stage_calls())  # fmt: skip
        for (rel, _), rows in zip(staged, done):
            writer.staged(rel)
            summary.rows += rows
            min_rows = min(min_rows, rows)
            advance(t_feat)
        if n_crossed:
            summary.notes.append(f"{n_crossed:,} snapshot{'s have' if n_crossed > 1 else ' has'} a crossed book "
                                 "(bid above ask, e.g. pre-open): "
                                 "flagged in book_crossed, with NaN labels")
        unit = "bars" if bar_volume else "snapshots"
        long = [h for h in cfg.horizons if h >= min_rows]
        if long:
            summary.notes.append(f"label horizons {long} ({unit}) reach past the end of a session of {min_rows:,} "
                                 f"{unit}: those labels are NaN there")
        manifest = dict(common, schedule=schedule, sources=[e for _, e in sources], notes=summary.notes,
                        partitions=[str(p.relative_to(writer.out)) for p in summary.partitions])
        writer.commit(manifest)
    summary.seconds = time.perf_counter() - t0
    log.info("wrote %d rows in %d partitions to %s", summary.rows, len(summary.partitions), cfg.out)
    return summary
