"""Read many DBN files in parallel (joblib processes, or any joblib backend such as Dask).

:func:`read_files` decodes each file with the streaming, filtering
:class:`alphafeat.dbn.RecordScanner`, through the predecoded cache when one is given
(:mod:`alphafeat.predecoded`: cold reads decode and store, warm reads memory-map). Work is
spread one file per task with ``joblib.Parallel``; the backend is whatever
``joblib.parallel_config`` says (``loky`` processes by default, ``dask`` with a
``distributed`` client to scale out without new code). With a predecoded cache, workers
return only the entry location and the parent memory-maps the arrays, so nothing large is
pickled back.

Errors (``on_error``)
    ``"raise"``: the first bad file's :class:`alphafeat.errors.InputError` (naming the file
    and the decompressed byte offset) propagates. ``"skip"``: a bad file is logged as a
    warning and listed in :attr:`ReadResult.skipped`; the other files are read.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import joblib
import numpy as np

from alphafeat import predecoded
from alphafeat.dbn import CHUNK_BYTES, SCHEMA_RTYPES, DBNFile, RecordScanner, open_dbn, record_dtype
from alphafeat.errors import AlphafeatError, InputError, SelectionError
from alphafeat.instruments import Choice, Symbology, front_month_schedule, is_candidate, session_dates

__all__ = ["ON_ERROR", "FileRecords", "ReadResult", "read_files", "roll_schedule"]

log = logging.getLogger(__name__)

ON_ERROR = ("raise", "skip")

IdSelection = Iterable[int] | None


@dataclass
class FileRecords:
    """The kept records of one file.

    Attributes
    ----------
    path : Path
        The source file.
    dbn : DBNFile
        Its header (metadata, version, schema, ts_out).
    arrays : dict[int, np.ndarray]
        rtype -> structured array, shape (n,), in file order (``record_dtype`` of the file's
        version); read-only memory maps when a predecoded cache is used. The schema's rtype
        is always present.
    records : int
        Records in the file before filtering.
    from_cache : bool
        Whether they came from an existing predecoded entry.
    """

    path: Path
    dbn: DBNFile
    arrays: dict[int, np.ndarray]
    records: int
    from_cache: bool = False


@dataclass
class ReadResult:
    """What :func:`read_files` returns: the files read, in input order, and the skipped ones."""

    files: list[FileRecords] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def by_instrument(self, rtype: int) -> dict[int, list[np.ndarray]]:
        """instrument_id -> the records of ``rtype`` of each file (file order, stream order)."""
        out: dict[int, list[np.ndarray]] = {}
        for fr in self.files:
            arr = fr.arrays.get(rtype)
            if arr is None or not len(arr):
                continue
            ids = np.asarray(arr["instrument_id"])
            order = np.argsort(ids, kind="stable")
            uniq, starts = np.unique(ids[order], return_index=True)
            bounds = [*starts.tolist(), len(order)]
            for k, u in enumerate(uniq.tolist()):
                out.setdefault(int(u), []).append(arr[order[bounds[k] : bounds[k + 1]]])
        return out


def _ids_for(instrument_ids: IdSelection | Mapping[Path, IdSelection], path: Path) -> list[int] | None:
    if isinstance(instrument_ids, Mapping):
        sel = instrument_ids.get(path)
    else:
        sel = instrument_ids
    return None if sel is None else sorted({int(i) for i in sel})


def _work(path: Path, ids: list[int] | None, cache_dir: str | None, chunk_bytes: int) -> dict:
    """One task: decode one file. Returns plain, picklable data (never a Metadata object)."""
    try:
        if cache_dir is not None:
            pre = predecoded.read_predecoded(path, cache_dir, ids, chunk_bytes=chunk_bytes)
            return {"entry": str(pre.entry), "records": pre.records, "from_cache": pre.from_cache}

        scanner = RecordScanner(path, instrument_ids=ids, chunk_bytes=chunk_bytes)
        parts: dict[int, list[np.ndarray]] = {}
        for chunk in scanner:
            for rt, arr in chunk.items():
                parts.setdefault(rt, []).append(arr.copy())
        arrays = {rt: np.concatenate(a) if len(a) > 1 else a[0] for rt, a in parts.items()}
        return {"arrays": arrays, "records": scanner.records, "from_cache": False}
    except InputError as e:  # returned, not raised: InputError does not survive pickling
        return {"error": str(e), "exc": (e.path, e.problem, e.offset, e.record)}


def read_files(
    paths: Sequence[str | os.PathLike[str]],
    *,
    instrument_ids: IdSelection | Mapping[Path, IdSelection] = None,
    n_jobs: int = 1,
    cache_dir: str | os.PathLike[str] | None = None,
    on_error: str = "raise",
    rebuild: bool = False,
    chunk_bytes: int = CHUNK_BYTES,
) -> ReadResult:
    """Decode and filter DBN files, one task per file, in parallel.

    Parameters
    ----------
    paths : sequence of path
        ``.dbn`` / ``.dbn.zst`` files (DBN v1-v3).
    instrument_ids : iterable of int, or {Path: iterable of int or None}, optional
        Records kept (by ``instrument_id``; symbol-mapping, system and error records are
        always kept). One selection for all files, or one per file (keys as in ``paths``,
        as ``Path``). None keeps everything.
    n_jobs : int
        joblib ``n_jobs`` (1: in this process; -1: all cores). The backend comes from
        ``joblib.parallel_config`` (default ``loky`` processes; ``dask`` works too).
    cache_dir : path, optional
        Predecoded cache root (:func:`alphafeat.predecoded.default_cache_dir`); None reads
        into memory without caching.
    on_error : {"raise", "skip"}
        What a bad file does (module docstring).
    rebuild : bool
        Clear ``cache_dir`` first (``--rebuild-predecoded``).
    chunk_bytes : int
        Decompressed bytes per decoding step (memory per worker is about twice this).

    Returns
    -------
    ReadResult
        ``files`` in the order of ``paths`` (skipped ones left out), ``skipped`` as
        (path, one-line reason).

    Raises
    ------
    InputError
        A bad file, with ``on_error="raise"``.
    AlphafeatError
        Unknown ``on_error``.
    """
    if on_error not in ON_ERROR:
        raise AlphafeatError(f"--on-error: expected raise or skip, got {on_error!r}")
    files = [Path(p) for p in paths]
    if cache_dir is not None and rebuild:
        predecoded.clear(cache_dir)
    skip = on_error == "skip"
    cdir = None if cache_dir is None else str(cache_dir)
    tasks = (joblib.delayed(_work)(p, _ids_for(instrument_ids, p), cdir, chunk_bytes) for p in files)
    if n_jobs == 1 or len(files) <= 1:
        results = [_work(p, _ids_for(instrument_ids, p), cdir, chunk_bytes) for p in files]
    else:
        results = joblib.Parallel(n_jobs=n_jobs)(tasks)
    out = ReadResult()
    for p, res in zip(files, results, strict=True):
        if "error" in res and not skip:
            path, problem, offset, record = res["exc"]
            raise InputError(path, problem, offset=offset, record=record)
        if "error" in res:
            log.warning("skipped %s", res["error"])
            out.skipped.append((p, res["error"]))
            continue
        if "entry" in res:
            pre = predecoded._open_entry(Path(res["entry"]), p, from_cache=res["from_cache"])
            arrays = pre.arrays
        else:
            arrays = res["arrays"]
        try:
            dbn = open_dbn(p)
        except InputError as e:  # the file changed after it was read
            if not skip:
                raise
            out.skipped.append((p, str(e)))
            continue

        if dbn.schema in SCHEMA_RTYPES and SCHEMA_RTYPES[dbn.schema] not in arrays:
            rt = SCHEMA_RTYPES[dbn.schema]
            arrays[rt] = np.empty(0, dtype=record_dtype(rt, dbn.version, dbn.ts_out))
        out.files.append(FileRecords(p, dbn, arrays, int(res["records"]), bool(res["from_cache"])))
    return out


_BOOK_RTYPES = {SCHEMA_RTYPES[s] for s in ("mbo", "mbp-10", "mbp-1")}
_TRADES, _DEFINITION, _SYMBOL_MAPPING = 0x00, 0x13, 0x16
#: rtype of in-band SymbolMappingMsg records.
SYMBOL_MAPPING_RTYPE = _SYMBOL_MAPPING


def _session_groups(arr: np.ndarray, weights: np.ndarray | None = None) -> dict[tuple[dt.date, int], tuple[int, float]]:
    """(session, instrument_id) -> (index of its first record, sum of weights), vectorized."""
    if not len(arr):
        return {}
    days = session_dates(np.asarray(arr["ts_recv"])).astype(np.int64)
    key = days * (1 << 32) + np.asarray(arr["instrument_id"]).astype(np.int64)
    uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
    sums = np.bincount(inv, weights=weights, minlength=len(uniq)) if weights is not None else np.zeros(len(uniq))
    epoch = dt.date(1970, 1, 1)
    return {
        (epoch + dt.timedelta(days=int(k >> 32)), int(k & 0xFFFFFFFF)): (int(f), float(v))
        for k, f, v in zip(uniq.tolist(), first.tolist(), sums.tolist(), strict=True)
    }


def roll_schedule(
    paths: Sequence[str | os.PathLike[str]],
    *,
    root: str = "ES",
    rule: str = "volume",
    roll_days: int = 8,
    n_jobs: int = 1,
    cache_dir: str | os.PathLike[str] | None = None,
    on_error: str = "raise",
    rebuild: bool = False,
) -> tuple[list[Choice], ReadResult]:
    """The front-month schedule of ``root`` over DBN files (``alphafeat roll-schedule``).

    Book files (mbo, mbp-10, mbp-1) give the candidates: per CME Globex session, every
    instrument with book records whose symbol on that date (metadata mappings, in-band
    symbol-mapping records, definitions; resolved per date) is an outright of ``root`` or a
    rank-0 continuous symbol (:func:`alphafeat.instruments.is_candidate`). Volume per
    session and instrument comes from trades files when given, else from the ``T`` records
    of the book stream. Parent (``ES.FUT``), per-contract and continuous (``ES.v.0``) files
    all work.

    Returns
    -------
    (list of Choice, ReadResult)
        One choice per session in date order, and what was read (with skipped files).

    Raises
    ------
    SelectionError
        No candidate of ``root`` in the book files.
    InputError, AlphafeatError
        As :func:`read_files` and :func:`alphafeat.instruments.front_month_schedule`.
    """
    rr = read_files(paths, n_jobs=n_jobs, cache_dir=cache_dir, on_error=on_error, rebuild=rebuild)
    defs = [f.arrays[_DEFINITION] for f in rr.files if _DEFINITION in f.arrays]
    maps = [f.arrays[_SYMBOL_MAPPING] for f in rr.files if _SYMBOL_MAPPING in f.arrays]
    symbology = Symbology.build([f.dbn.metadata for f in rr.files], defs, maps)
    candidates: dict[dt.date, dict[int, str]] = {}
    volume: dict[tuple[dt.date, int], float] = {}
    have_trades = any(_TRADES in f.arrays and f.dbn.schema == "trades" for f in rr.files)
    found: set[str] = set()
    for f in rr.files:
        for rt, arr in f.arrays.items():
            if rt in _BOOK_RTYPES:
                is_trade = np.asarray(arr["action"]) == b"T"
                w = np.where(is_trade, np.asarray(arr["size"]), 0).astype(np.float64)
                for (day, iid), (first, vol) in _session_groups(arr, w).items():
                    utc = dt.datetime.fromtimestamp(int(arr["ts_recv"][first]) // 10**9, dt.timezone.utc).date()
                    sym = symbology.resolve(iid, utc) or f"id{iid}"
                    found.add(sym)
                    if is_candidate(sym, root):
                        candidates.setdefault(day, {})[iid] = sym
                    if not have_trades:
                        volume[(day, iid)] = volume.get((day, iid), 0.0) + vol
            elif rt == _TRADES and f.dbn.schema == "trades":
                w = np.asarray(arr["size"]).astype(np.float64)
                for key, (_, vol) in _session_groups(arr, w).items():
                    volume[key] = volume.get(key, 0.0) + vol
    if not candidates:
        raise SelectionError(
            f"no outright or continuous contract of root {root!r} in the book data; "
            f"symbols found: {', '.join(sorted(found)[:20]) or 'none'}"
        )
    return front_month_schedule(candidates, volume, symbology, root, roll_days, rule), rr
