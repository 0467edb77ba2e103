"""The plan's scans of DBN files (:mod:`alphafeat.plan`, whose docstring tells when a file is
scanned): per rtype, per (session, instrument), a record count, the traded volume and the first
``ts_recv``, plus in-band symbol mappings and definitions; kept in ``<predecoded dir>/survey/``
keyed by the file's :func:`identity` and :data:`SURVEY_VERSION`, and run in joblib processes
where that pays (:func:`scan_jobs`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from alphafeat import kept as kept_data
from alphafeat.dbn import BOOK_SCHEMAS, SCHEMA_RTYPES, DBNFile, RecordScanner
from alphafeat.errors import InputError
from alphafeat.instruments import Choice, session_dates
from alphafeat.types import UNDEF_TIMESTAMP

__all__ = ["SURVEY_VERSION", "file_range", "groups_of", "identity", "run_surveys", "scan_jobs", "sessions_of",
           "spawning_workers"]

log = logging.getLogger(__name__)

_TRADES, _DEFINITION, _SYMBOL_MAPPING = 0x00, 0x13, 0x16
_BOOK_RTYPES = {SCHEMA_RTYPES[s] for s in BOOK_SCHEMAS}
#: Version of the survey records kept on disk; bump to invalidate them.
SURVEY_VERSION = 2


def file_range(f: DBNFile) -> tuple[int, int | None]:
    start = int(f.metadata.start)
    end = getattr(f.metadata, "end", None)
    end = None if end is None or int(end) in (0, UNDEF_TIMESTAMP) else int(end)
    return start, end


def identity(path: Path) -> list:
    """What a kept scan or plan is keyed by for one file: its path as given and resolved, size,
    mtime, ctime, inode and device. Stricter than :func:`alphafeat.dbn.file_identity` (path,
    size, mtime): a file replaced by another of the same size whose mtime was kept (``cp -p``,
    ``rsync -t``) has another inode or ctime, so it is read again.

    Raises
    ------
    OSError
        The file cannot be stat'ed.
    """
    st = os.stat(path)
    return [str(path), os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _survey_key(path: Path) -> str:
    ident = [*identity(path), SURVEY_VERSION]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:32]


def _scan_file(path: Path, trades_only: bool) -> dict:
    """Per rtype of market data, per (session, instrument): [records, traded contracts, first
    ts_recv]; in-band symbol mappings and definitions. Book records count the size of their
    ``T`` records as volume. A live recording holds several rtypes: they are kept apart."""
    groups: dict[int, dict[tuple[int, int], list]] = {}
    maps: list[np.ndarray] = []
    defs: list[np.ndarray] = []
    epoch = dt.date(1970, 1, 1)
    for chunk in RecordScanner(path, chunk_bytes=16 << 20):
        for rt, arr in chunk.items():
            if rt == _SYMBOL_MAPPING:
                maps.append(arr.copy())
                continue
            if rt == _DEFINITION:
                defs.append(arr.copy())
                continue
            if rt not in _BOOK_RTYPES and rt != _TRADES:
                continue
            if trades_only and rt != _TRADES:
                continue
            ts = np.asarray(arr["ts_recv"]).astype(np.int64)
            days = (session_dates(ts) - np.datetime64(epoch)).astype(np.int64)
            key = days * (1 << 32) + np.asarray(arr["instrument_id"]).astype(np.int64)
            if rt == _TRADES:
                w = np.asarray(arr["size"]).astype(np.float64)
            else:
                w = np.where(np.asarray(arr["action"]) == b"T", np.asarray(arr["size"]), 0).astype(np.float64)
            uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
            cnt = np.bincount(inv, minlength=len(uniq))
            vol = np.bincount(inv, weights=w, minlength=len(uniq))
            g_rt = groups.setdefault(int(rt), {})
            for k, f0, c, v in zip(uniq.tolist(), first.tolist(), cnt.tolist(), vol.tolist()):
                g = g_rt.setdefault((k >> 32, k & 0xFFFFFFFF), [0, 0.0, int(ts[f0])])
                g[0] += c
                g[1] += v
    cat = lambda xs: np.concatenate(xs) if xs else None  # noqa: E731
    rtypes = sorted(groups) + ([_DEFINITION] if defs else []) + ([_SYMBOL_MAPPING] if maps else [])
    return {"by_rtype": groups, "rtypes": rtypes, "maps": cat(maps), "defs": cat(defs)}


def groups_of(survey: dict, schema: str) -> dict[tuple[int, int], list]:
    """The scan's (session, instrument) groups of the file's schema; a book file that also
    holds trade records (a live recording) takes its volume from those."""
    by_rt = survey["by_rtype"]
    groups = {k: list(v) for k, v in by_rt.get(SCHEMA_RTYPES[schema], {}).items()}
    if schema in BOOK_SCHEMAS and _TRADES in by_rt:
        for k, g in groups.items():
            t = by_rt[_TRADES].get(k)
            g[1] = t[1] if t else 0.0
    return groups


def _kept_scan(path: Path, store: str | None) -> tuple[Path | None, dict | None]:
    """Where the scan of ``path`` is kept in ``store`` (None: no store) and the scan kept there
    (None when there is none, or it cannot be read)."""
    if not store:
        return None, None
    kept = Path(store) / f"{_survey_key(path)}.json"
    scan = kept_data.load(kept, (DBNFile, Choice))
    return kept, scan if isinstance(scan, dict) and "by_rtype" in scan else None


def _survey(path: str, trades_only: bool, kept: Path | None) -> dict:
    """One task: the scan of ``path``, kept at ``kept`` (its place in the store, found by
    :func:`run_surveys`, which reads the scans kept there; None: not kept). A bad file's
    InputError is returned (the other tasks go on), itself."""
    p = Path(path)
    try:
        res = _scan_file(p, trades_only)
        if kept is not None:
            kept_data.dump(kept, res, f"scan of {p}")
        return res
    except InputError as e:
        return {"error": e}

def run_surveys(tasks: list[tuple[DBNFile, bool]], jobs: int, store: str | None, on_error: str,
                 skipped: list) -> dict[Path, dict]:  # fmt: skip
    """The scans of ``tasks`` (file, trades only): those kept in ``store`` read here, the others
    in parallel with ``jobs`` processes; a bad file raises, or is skipped with ``on_error="skip"``."""
    kept: dict[Path, tuple[Path | None, dict | None]] = {}  # where each scan is kept, and the kept scan
    for f, _ in tasks:
        try:
            kept[f.path] = _kept_scan(f.path, store)
        except (OSError, InputError):  # the task reports it
            kept[f.path] = (None, None)
    calls = [(str(f.path), only, kept[f.path][0]) for f, only in tasks if kept[f.path][1] is None]
    if jobs == 1 or len(calls) <= 1:
        scanned = [_survey(*c) for c in calls]
    else:
        import joblib  # here: a one-process plan need not load it

        with spawning_workers():
            gen = joblib.Parallel(n_jobs=jobs, return_as="generator")(joblib.delayed(_survey)(*c) for c in calls)
        scanned = list(gen)
    new = iter(scanned)
    results = [kept[f.path][1] if kept[f.path][1] is not None else next(new) for f, _ in tasks]
    surveys: dict[Path, dict] = {}
    for (f, _), res in zip(tasks, results, strict=True):
        if "error" in res:
            err = res["error"]
            if on_error != "skip":
                raise err
            log.warning("skipping %s", err)
            skipped.append((f.path, err.detail))
            continue
        surveys[f.path] = res
    return surveys



@contextmanager
def spawning_workers() -> Iterator[None]:
    """Around the call that starts joblib's worker processes (a ``Parallel(...)(...)`` returning a
    generator: it starts its workers and its first tasks before it returns): SIGINT is ignored
    meanwhile in the main thread, so the workers start with it ignored and keep it so (Python
    installs no Ctrl-C handler when SIGINT is ignored at start). A Ctrl-C then interrupts only
    this process, which stops the pool: no worker prints a traceback of its own, while starting,
    working or idle after the run. A no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def scan_jobs(jobs: int, tasks: list[tuple[DBNFile, bool]], book: list[DBNFile]) -> int:
    """Processes for the scans of ``tasks``: ``jobs`` when some read a book file (large) or the
    book files span more than one session (the map then runs on worker processes too, and joblib
    reuses those the plan started); else 1: starting workers (an interpreter, imports, numba's
    cache: ~1 CPU-second each) to read the trades and definition files of one session costs more
    than reading them."""
    if jobs == 1 or any(not trades_only for _, trades_only in tasks):
        return jobs
    sessions: set[dt.date] = set()
    for f in book:
        if file_range(f)[1] is None:  # open-ended (a live recording)
            return jobs
        sessions.update(sessions_of(f))
    return jobs if len(sessions) > 1 else 1


def sessions_of(f: DBNFile) -> list[dt.date]:
    """The sessions the file's time range (metadata start and end) overlaps."""
    start, end = file_range(f)
    days = session_dates(np.array([start, max(start, end - 1)], dtype=np.int64)).astype(object)
    return [days[0] + dt.timedelta(days=k) for k in range((days[1] - days[0]).days + 1)]
