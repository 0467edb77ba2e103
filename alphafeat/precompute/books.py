"""A segment's book: decoded from its files (:func:`build_book`, or block by block from the
records :func:`read_records` yields), kept between runs and read back (:func:`save_book`,
:func:`load_book`), and cut into blocks (:func:`book_slices`, :func:`stream_rows`).

Kept books
    With ``--predecoded keep`` (or ``auto`` for MBO) a segment's book is kept under
    ``<predecoded>/book/<key>/`` (raw columns and ``book.json``; key: the segment's files'
    path, size and mtime, instrument, session, format) and memory-mapped by a later run, which
    then skips decode and book. About 360 bytes per row.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from alphafeat import book as bk
from alphafeat.dbn import SCHEMA_RTYPES, RecordScanner, file_identity
from alphafeat.plan import Segment
from alphafeat.types import LEVELS, BookArrays
from alphafeat.validation import env_count
from alphafeat.zstd_frames import is_zstd

__all__ = ["BLOCK_ROWS", "BOOK_FORMAT", "BookWriter", "book_key", "book_slices", "build_book", "is_kept",
           "kept_book", "load_book", "peak_rss", "read_records", "save_book", "stream_rows"]


#: Version of the predecoded book layout; bump to invalidate kept books.
BOOK_FORMAT = 3


#: Decompressed bytes per decode step of the segment reader.
READ_CHUNK = 8 << 20


_BOOK_COLS = ("ts_event", "ts_recv", "bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct",
              "buy_volume", "sell_volume", "trade_count")  # fmt: skip


_STORED = {"bid_sz": np.uint32, "ask_sz": np.uint32, "bid_ct": np.uint32, "ask_ct": np.uint32}


def prefetch(it: Iterable, depth: int = 2) -> Iterator:
    """Run ``it`` on a thread, ``depth`` items ahead; its errors are raised here."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for x in it:
                if stop.is_set():
                    return
                q.put(x)
            q.put(done)
        except BaseException as e:  # handed to the consumer
            q.put(e)

    th = threading.Thread(target=produce, daemon=True)
    th.start()
    try:
        while True:
            x = q.get()
            if x is done:
                return
            if isinstance(x, BaseException):
                raise x
            yield x
    finally:
        stop.set()
        while th.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                th.join(0.01)


def read_records(paths: Iterable[str], iid: int, rtype: int, chunk_bytes: int | None = None) -> Iterator[np.ndarray]:
    """Records of ``rtype`` of one instrument from ``paths`` in order, chunk by chunk (of
    ``chunk_bytes`` decompressed bytes, :data:`READ_CHUNK` by default): views of the scanner's
    buffer, valid until the next chunk."""
    for p in paths:
        for chunk in RecordScanner(p, instrument_ids=[iid], chunk_bytes=chunk_bytes or READ_CHUNK):
            arr = chunk.get(rtype)
            if arr is not None and len(arr):
                yield arr


def _chunks(paths: Iterable[str], iid: int, rtype: int) -> Iterator[np.ndarray]:
    """:func:`read_records` as owned copies (to keep them)."""
    for arr in read_records(paths, iid, rtype):
        yield arr.copy()


def segment_trades(seg: Segment) -> bk.Trades | None:
    """The instrument's trades from the segment's trades files, or None without any."""
    if not seg.trade_files:
        return None
    parts = list(_chunks(seg.trade_files, seg.instrument_id, SCHEMA_RTYPES["trades"]))
    if not parts:
        return bk.trades_from_records(np.empty(0, dtype=_trade_dtype(seg.trade_files[0])))
    return bk.trades_from_records(np.concatenate(parts))


def _trade_dtype(path: str) -> np.dtype:
    from alphafeat.dbn import open_dbn, record_dtype

    d = open_dbn(path)
    return record_dtype(SCHEMA_RTYPES["trades"], d.version, d.ts_out)


def build_book(seg: Segment) -> tuple[BookArrays, int, list[str]]:
    """The session's book of the segment's instrument, from its files.

    Returns
    -------
    (BookArrays, records, notes)
        The rows (prices float64 index points, NaN where empty; sizes float64; counts
        uint32; trade flow float64), the instrument's book records of the session
        (``ts_recv`` in its bounds: each record counts in one session; an MBO rebuild also
        reads those before it), and notes (e.g. cancels of unknown orders in MBO).

    Raises
    ------
    InputError
        A bad file (named, with the byte offset).
    """
    s0, s1 = seg.bounds
    rtype = SCHEMA_RTYPES[seg.schema]
    trades = segment_trades(seg)
    notes: list[str] = []
    if seg.schema in ("mbp-10", "mbp-1"):
        builder = None
        for recs in read_records(seg.book_files, seg.instrument_id, rtype):  # rows as decoded, no copies
            if builder is None:
                builder = bk.MBPBookBuilder(recs.dtype, s0, s1, record_bound(seg.book_files, recs.dtype.itemsize))
            builder.add(recs)
        if builder is None:
            return _empty_book(), 0, notes
        return builder.finish(trades), builder.records, notes
    parts = list(_chunks(seg.book_files, seg.instrument_id, rtype))
    if not parts:
        return _empty_book(), 0, notes
    recs = np.concatenate(parts)
    del parts
    flags = None
    if not (recs["flags"] & bk.F_LAST).any():  # flags stripped: a row per ts_recv group
        flags = bk.group_last_flags(recs)
        notes.append(f"{seg.raw_symbol} {seg.session}: no MBO record of {', '.join(seg.book_files)} carries F_LAST "
                     "(flags stripped?): a book row per group of records with one ts_recv")  # fmt: skip
    raw, stream_trades, n_unknown = bk.rebuild_mbo(recs, flags=flags)
    snapshot, complete = bk.book_complete_from(recs, raw.last_unknown)
    ts = recs["ts_recv"]
    n = int(np.count_nonzero((ts >= np.uint64(s0)) & (ts < np.uint64(s1))))
    del recs, ts
    if n_unknown:
        notes.append(f"{seg.raw_symbol} {seg.session}: {n_unknown} cancels of unknown orders "
                     "(the first file starts without a snapshot)")
    keep = (raw.ts_recv >= s0) & (raw.ts_recv < s1)
    raw = raw.take(keep)
    t = stream_trades if trades is None else trades
    t = t.take((t.ts_recv >= s0) & (t.ts_recv < s1))
    b = bk.to_book_arrays(raw, t)
    b.bid_ct, b.ask_ct = raw.bid_ct.astype(np.uint32), raw.ask_ct.astype(np.uint32)
    b.complete_from = -1 if snapshot else int(np.searchsorted(raw.pos, complete))  # -1: from a snapshot
    return b, n, notes


def record_bound(paths: Iterable[str], itemsize: int) -> int:
    """Records the files can hold at most, from their sizes: a plain file's size over the record
    size; a zstd file's size times 40 (DBN market data compresses 5-15x) over it. A bound
    that proves short only costs a copy (:class:`alphafeat.book.MBPBookBuilder` grows)."""
    total = 0
    for p in paths:
        size = os.path.getsize(p)
        with open(p, "rb") as fh:  # compressed or not by its magic, as the reader decides (not by its name)
            zst = is_zstd(fh.read(4))
        total += size * (40 if zst else 1) // itemsize
    return total + 1


def _empty_book() -> BookArrays:
    z1, z2 = np.empty(0), np.empty((0, LEVELS))
    zi = np.empty(0, np.int64)
    zc = np.empty((0, LEVELS), np.uint32)
    return BookArrays(zi, zi, z2, z2, z2, z2, zc, zc, z1, z1, z1)


def book_key(seg: Segment) -> str:
    """Key of a segment's kept book: its files' identity, instrument, session and format."""
    files = [list(file_identity(p)) for p in seg.book_files + seg.trade_files]
    ident = [files, seg.instrument_id, seg.session.isoformat(), seg.schema, BOOK_FORMAT]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:32]


def kept_book(seg: Segment, predecoded_dir: str | os.PathLike[str] | None) -> Path | None:
    """Where the segment's book is kept under ``predecoded_dir`` (None: books are not kept)."""
    return Path(predecoded_dir) / "book" / book_key(seg) if predecoded_dir else None


class BookWriter:
    """Append a book's rows block by block to raw column files in a temporary folder, renamed to
    ``d`` by :meth:`close` (a crash leaves no folder that looks complete)."""

    def __init__(self, d: Path) -> None:
        self.d = d
        self.tmp = d.with_name(f".{d.name}.tmp-{uuid.uuid4().hex[:8]}")
        self.tmp.mkdir(parents=True)
        self.files = {k: open(self.tmp / f"{k}.bin", "wb") for k in _BOOK_COLS}  # noqa: SIM115
        self.rows = 0
        self.shapes: dict[str, list] = {}

    def add(self, b: BookArrays, lo: int = 0) -> None:
        from alphafeat.cache import disk_error

        for k, fh in self.files.items():
            a = getattr(b, k)[lo:]
            a = np.ascontiguousarray(a, dtype=_STORED.get(k, a.dtype))
            self.shapes[k] = [str(a.dtype), list(a.shape[1:])]
            try:
                fh.write(memoryview(a).cast("B"))
            except OSError as e:  # disk full: one line naming the kept book's folder
                raise disk_error(self.tmp / f"{k}.bin", e, a.nbytes) from None
        self.rows += len(b) - lo

    def close(self, depth: int, complete_from: int = -1) -> None:
        for fh in self.files.values():
            fh.close()
        (self.tmp / "book.json").write_text(json.dumps({"rows": self.rows, "depth": int(depth),
                                                        "complete_from": int(complete_from),
                                                        "columns": self.shapes}))  # fmt: skip
        try:
            os.replace(self.tmp, self.d)
        except OSError:
            shutil.rmtree(self.tmp, ignore_errors=True)
            if not (self.d / "book.json").is_file():
                raise

    def abort(self) -> None:
        for fh in self.files.values():
            fh.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def save_book(b: BookArrays, d: Path) -> None:
    """Keep ``b`` under ``d`` (raw column files and ``book.json``; written to a temporary folder
    and renamed when complete). Sizes and counts are stored as uint32, the rest as they are."""
    w = BookWriter(d)
    try:
        w.add(b)
    except BaseException:
        w.abort()
        raise
    w.close(b.depth, b.complete_from)


def load_book(d: Path, widen: bool = True) -> BookArrays:
    """A book kept by :func:`save_book`, memory-mapped (copy-on-write); sizes widened to float64
    unless ``widen`` is False (then uint32 memory maps, to widen block by block)."""
    meta = json.loads((d / "book.json").read_text())
    n = int(meta["rows"])
    if not n:
        b = _empty_book()
        b.depth = int(meta["depth"])
        b.complete_from = int(meta.get("complete_from", -1))
        return b
    c = {}
    for k in _BOOK_COLS:
        dtype, rest = meta["columns"][k]
        c[k] = np.memmap(d / f"{k}.bin", dtype=dtype, mode="c", shape=(n, *rest))
    if widen:
        for k in ("bid_sz", "ask_sz"):
            c[k] = np.asarray(c[k], dtype=np.float64)
    return BookArrays(**c, depth=int(meta["depth"]), complete_from=int(meta.get("complete_from", -1)))


def peak_rss() -> int:
    """Peak resident memory of this process so far, bytes (``getrusage``)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


#: Rows per block of the streamed CPU path (book rows, features, output columns) when one or
#: two segments run at once; fewer with more (:func:`stream_rows`).
BLOCK_ROWS = 64 << 10


#: The fewest rows per block :func:`stream_rows` gives.
MIN_BLOCK_ROWS = 8 << 10


#: Decompressed bytes read per block row: the decode chunk is :data:`READ_CHUNK` at BLOCK_ROWS.
_CHUNK_PER_ROW = 128


def stream_rows(at_once: int) -> int:
    """Rows per block of each segment's streamed CPU path when ``at_once`` segments run at the
    same time on this machine: :data:`BLOCK_ROWS` for one or two, halved each time they double
    beyond, at least :data:`MIN_BLOCK_ROWS` (16 at once: 8 Ki). The decode chunk shrinks in
    proportion (:func:`read_chunk`). Segments at once share the memory bandwidth and the
    last-level cache; smaller blocks keep more of each one's working set (four book blocks, the
    decode chunk) in cache. Measured (docs/performance.md): 16 sessions at once ran fastest
    with 8 Ki rows, one session alone with 64 Ki; sizes between are interpolated, not
    measured. The cache's bytes do not depend on it. ``ALPHAFEAT_BLOCK_ROWS`` (a positive
    integer) replaces it, for measurements."""
    shift = max(0, (max(1, at_once) - 1).bit_length() - 1)
    return env_count("ALPHAFEAT_BLOCK_ROWS", max(BLOCK_ROWS >> shift, min(MIN_BLOCK_ROWS, BLOCK_ROWS)))


def read_chunk(rows: int) -> int:
    """Decompressed bytes per decode step for blocks of ``rows`` rows: :data:`READ_CHUNK` at
    :data:`BLOCK_ROWS`, in proportion below, at most READ_CHUNK."""
    return min(READ_CHUNK, max(rows * _CHUNK_PER_ROW, 64 << 10))


def is_kept(kept: Path | None) -> bool:
    """Whether a complete kept book is under ``kept`` (its ``book.json`` is written last)."""
    return kept is not None and (kept / "book.json").is_file()


def book_slices(b: BookArrays, rows: int | None = None) -> Iterator[tuple[BookArrays, bool]]:
    """A whole book as blocks of ``rows`` (:data:`BLOCK_ROWS`) new rows, each after the first
    with its halo row."""
    n = len(b)
    rows = rows or BLOCK_ROWS
    for lo in range(0, n, rows):
        hi = min(lo + rows, n)
        a = lo - 1 if lo else 0
        blk = BookArrays(*(getattr(b, k)[a:hi] for k in _BOOK_COLS), depth=b.depth)
        for k in ("bid_sz", "ask_sz"):
            setattr(blk, k, np.asarray(getattr(blk, k), dtype=np.float64))
        yield blk, lo > 0
