"""Map: one segment (session x instrument) through decode -> book -> features -> labels -> write.

:func:`run_segment` is the function a worker runs (in this process, a joblib/loky process or a
Dask worker): it reads only the segment's instrument from the segment's files, keeps nothing
of any other session, and writes one Arrow IPC partition (one record batch) to a staging path.

Streamed CPU path (the default)
    MBP-10 / MBP-1 records are decoded (8 MiB chunks, filtered to the instrument while
    decoding) and turned into book rows (:class:`alphafeat.book.MBPBookBuilder`, numba) on a
    thread of their own, in blocks of :data:`BLOCK_ROWS` rows (both smaller when many segments
    run at once: :func:`stream_rows`) written into :data:`MBP_SETS` column sets used in turn.
    The calling thread takes each block and continues the features from the block before
    (:class:`alphafeat.features.cpu.FeatureStream`; with cores to spare, the row-wise features
    of the coming rows on threads of their own: :func:`alphafeat.pipeline.feature_threads`),
    fills the stored columns
    (:class:`alphafeat.pipeline.SegmentColumns`), and hands the rows whose label horizons are
    complete to a third thread (:class:`alphafeat.labels.LabelStream`). Memory: a few blocks
    and the session's stored columns, never the records nor the whole book. MBO: the
    instrument's records of the segment's files are rebuilt (:func:`alphafeat.book.rebuild_mbo`)
    from the start of the first file, cut to the session, then fed to the same path in blocks.
    Trades come from the trades files when the run has them, else from the book stream.
GPU and volume bars
    The session's whole book is built first (:func:`build_book`), then one GPU call
    (``compute_features(..., device="cuda")``) or the bars.
Kept books
    With ``--predecoded keep`` (or ``auto`` for MBO) a segment's book is kept under
    ``<predecoded>/book/<key>/`` (raw columns and ``book.json``; key: the segment's files'
    path, size and mtime, instrument, session, format) and memory-mapped by a later run, which
    then skips decode and book. About 360 bytes per row.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from alphafeat import book as bk
from alphafeat.cache import staged_path, write_partition
from alphafeat.dbn import SCHEMA_RTYPES, RecordScanner, file_identity, is_zstd
from alphafeat.errors import AlphafeatError, InputError
from alphafeat.plan import Segment
from alphafeat.types import LEVELS, BookArrays

__all__ = ["SegmentResult", "build_book", "load_book", "run_segment", "save_book"]

log = logging.getLogger(__name__)

#: Version of the predecoded book layout; bump to invalidate kept books.
BOOK_FORMAT = 3
#: Decompressed bytes per decode step of the segment reader.
READ_CHUNK = 8 << 20
_BOOK_COLS = ("ts_event", "ts_recv", "bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct",
              "buy_volume", "sell_volume", "trade_count")  # fmt: skip
_STORED = {"bid_sz": np.uint32, "ask_sz": np.uint32, "bid_ct": np.uint32, "ask_ct": np.uint32}


@dataclass
class SegmentResult:
    """What a worker reports for one segment (picklable).

    Attributes
    ----------
    relpath : str
        Partition path in the cache.
    rows : int
        Rows written (0: no book data in the session; nothing written).
    records : int
        Book records of the instrument read (0 when the book came from the predecoded folder).
    seconds : dict of str to float
        Time per stage: ``book`` (decode + book, or the predecoded load), ``features``,
        ``labels``, ``write``.
    peak_rss : int
        Peak resident memory of the worker process so far, bytes.
    crossed : int
        Rows whose book is crossed (best bid above best ask).
    predecoded : bool
        Whether the book came from the predecoded folder.
    notes : list of str
        Things to say in the summary.
    complete_from : int
        -1 when the book stream started with a snapshot; else the first row whose book is
        trustworthy (:func:`alphafeat.book.book_complete_from`; rows before it are stored
        with ``book_complete`` False).
    complete_ts : int or None
        ``ts_recv`` of that row (None: no row of the session is trustworthy, or a snapshot).
    relabelled : bool
        Whether only the labels were recomputed, from a partition written earlier.
    changes : tuple of str
        What that relabel changed (:func:`alphafeat.pipeline.relabel_changes`).
    """

    relpath: str
    rows: int = 0
    records: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    peak_rss: int = 0
    crossed: int = 0
    predecoded: bool = False
    notes: list[str] = field(default_factory=list)
    complete_from: int = -1
    complete_ts: int | None = None
    relabelled: bool = False
    changes: tuple[str, ...] = ()


def _prefetch(it: Iterable, depth: int = 2) -> Iterator:
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


def _records(paths: Iterable[str], iid: int, rtype: int, chunk_bytes: int | None = None) -> Iterator[np.ndarray]:
    """Records of ``rtype`` of one instrument from ``paths`` in order, chunk by chunk (of
    ``chunk_bytes`` decompressed bytes, :data:`READ_CHUNK` by default): views of the scanner's
    buffer, valid until the next chunk."""
    for p in paths:
        for chunk in RecordScanner(p, instrument_ids=[iid], chunk_bytes=chunk_bytes or READ_CHUNK):
            arr = chunk.get(rtype)
            if arr is not None and len(arr):
                yield arr


def _chunks(paths: Iterable[str], iid: int, rtype: int) -> Iterator[np.ndarray]:
    """:func:`_records` as owned copies (to keep them)."""
    for arr in _records(paths, iid, rtype):
        yield arr.copy()


def _trades(seg: Segment) -> bk.Trades | None:
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
        uint32; trade flow float64), the book records read, and notes (e.g. cancels of
        unknown orders in MBO).

    Raises
    ------
    InputError
        A bad file (named, with the byte offset).
    """
    s0, s1 = seg.bounds
    rtype = SCHEMA_RTYPES[seg.schema]
    trades = _trades(seg)
    notes: list[str] = []
    if seg.schema in ("mbp-10", "mbp-1"):
        builder = None
        for recs in _records(seg.book_files, seg.instrument_id, rtype):  # rows as decoded, no copies
            if builder is None:
                builder = bk.MBPBookBuilder(recs.dtype, s0, s1, _record_bound(seg.book_files, recs.dtype.itemsize))
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
    n = len(recs)
    del recs
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


def _record_bound(paths: Iterable[str], itemsize: int) -> int:
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


class _BookWriter:
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
    w = _BookWriter(d)
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
    decode chunk) in cache. Measured: the 16-core H200 host, 16 sessions with ``--jobs 16``, 8 Ki
    rows 8.2-9.2 s (88-95 user CPU-s) against 10.2-10.7 s (114-115) at 64 Ki, 2 runs each,
    interleaved (32 Ki 8.6-9.2 s, 16 Ki 9.5-9.9 s); the 2-core machine, one session: 64 Ki
    5-10% faster than 32 Ki or 8 Ki (4 runs each). Sizes between are interpolated, not
    measured. The cache's bytes do not depend on it."""
    shift = max(0, (max(1, at_once) - 1).bit_length() - 1)
    return max(BLOCK_ROWS >> shift, min(MIN_BLOCK_ROWS, BLOCK_ROWS))


def read_chunk(rows: int) -> int:
    """Decompressed bytes per decode step for blocks of ``rows`` rows: :data:`READ_CHUNK` at
    :data:`BLOCK_ROWS`, in proportion below, at most READ_CHUNK."""
    return min(READ_CHUNK, max(rows * _CHUNK_PER_ROW, 64 << 10))


def is_kept(kept: Path | None) -> bool:
    """Whether a complete kept book is under ``kept`` (its ``book.json`` is written last)."""
    return kept is not None and (kept / "book.json").is_file()


def _whole_book(seg: Segment, kept: Path | None, res: SegmentResult, widen: bool = True) -> BookArrays:
    """The segment's whole book: the one kept under ``kept`` (memory-mapped; sizes widened to
    float64 unless ``widen`` is False) when there is one, else built from its files. Sets
    ``res.predecoded``, ``res.records``, ``res.notes``, ``res.complete_from``."""
    if is_kept(kept):
        res.predecoded = True
        b = load_book(kept, widen=widen)
    else:
        b, res.records, res.notes = build_book(seg)
    res.complete_from = b.complete_from
    return b


#: A block of book rows for the features: ``(rows, halo, release)``; ``release()`` once the
#: rows are no longer read (the reader may then reuse their memory).
Block = tuple[BookArrays, bool, Callable[[], None]]

#: Column sets of the MBP reader thread: the block being built, the one waiting in the queue,
#: the one whose features are computed and one still being stored (SegmentColumns.add; the
#: reader waits when its worker is further behind).
MBP_SETS = 4


def _blocks(seg: Segment, kept: Path | None, res: SegmentResult, rows: int) -> Iterator[Block]:
    """The segment's book as blocks of ``rows`` new rows (see ``MBPBookBuilder.take``), from a
    kept book, from MBP records streamed chunk by chunk, or from the rebuilt MBO book. Sets
    ``res.records``, ``res.notes``, ``res.predecoded``."""
    if is_kept(kept) or seg.schema not in ("mbp-10", "mbp-1"):
        for b, halo in book_slices(_whole_book(seg, kept, res, widen=False), rows):
            yield b, halo, _nothing
    else:
        yield from _mbp_blocks(seg, res, rows)


def _nothing() -> None:
    return None


def _mbp_blocks(seg: Segment, res: SegmentResult, rows: int) -> Iterator[Block]:
    """MBP book blocks built on a thread of their own while the caller uses the ones before.

    The thread decodes the records (RecordScanner: zstd and the scan release the GIL) and turns
    them into book rows (:class:`alphafeat.book.MBPBookBuilder`, numba) in :data:`MBP_SETS`
    column sets used in turn: it starts filling a set only once the caller has released the
    block it held (one semaphore per set), so nothing is copied between the threads.
    """
    s0, s1 = seg.bounds
    trades = _trades(seg)
    if trades is not None:
        trades = trades.take((trades.ts_recv >= s0) & (trades.ts_recv < s1))
        trades = trades.take(np.argsort(trades.ts_recv, kind="stable"))
    free = [threading.Semaphore(1) for _ in range(MBP_SETS)]
    stop = threading.Event()

    def produce() -> Iterator[tuple[BookArrays, bool, int]]:
        builder, cur = None, 0
        chunk = read_chunk(rows)
        for recs in _records(seg.book_files, seg.instrument_id, SCHEMA_RTYPES[seg.schema], chunk):
            if builder is None:
                limit = rows + chunk // recs.dtype.itemsize + 1
                builder = bk.MBPBookBuilder(recs.dtype, s0, s1, limit + 1, sets=MBP_SETS)
                free[0].acquire()
            if builder.rows + len(recs) > limit or builder.rows >= rows:
                yield (*builder.take(trades), cur)
                cur = (cur + 1) % MBP_SETS
                free[cur].acquire()
                if stop.is_set():
                    return
                builder.keep_last()
            builder.add(recs)
            res.records = builder.records
        if builder is not None and builder.rows > (1 if builder._taken else 0):
            yield (*builder.take(trades), cur)

    it = _prefetch(produce(), depth=1)
    try:
        for b, halo, which in it:
            yield b, halo, free[which].release
    finally:
        stop.set()
        for sem in free:  # a thread waiting for a set is let go; it sees stop and ends
            sem.release()
        it.close()


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


def run_segment(
    seg: Segment, staging: str, meta: dict, job: object, predecoded_dir: str | None, keep: bool = False,
    relabel: str | None = None,
) -> SegmentResult:
    """Compute one segment and write its partition to ``staging/seg.relpath``.

    On the CPU with snapshot sampling the book flows through in blocks of :data:`BLOCK_ROWS`
    rows (decode on a reader thread -> book rows -> features continued from the block before ->
    output columns), so memory is a few blocks plus the stored columns of the session; labels,
    which look ahead, are computed at the end from the mid. On a GPU, or with volume bars,
    the session's whole book is built first.

    Parameters
    ----------
    seg : Segment
        What to compute.
    staging : str
        The cache's staging folder (the partition goes to ``staging/seg.relpath``).
    meta : dict
        The partition's schema metadata (JSON-able), fingerprint included.
    job : alphafeat.pipeline.Job
        Output options: features, dtype, compression, labels, device.
    predecoded_dir : str or None
        Where books are kept between runs (module docstring): a book kept there is used; None
        reads none.
    keep : bool
        Keep this segment's book there when it has to be built.
    relabel : str or None
        A partition of this segment written earlier with other label options or features only
        (:func:`alphafeat.pipeline.reuse_key`): its book columns and the features ``job`` stores
        are kept, the features it lacks computed from the kept book, its labels recomputed
        (:func:`alphafeat.pipeline.relabel_table`); no input file is read.

    Returns
    -------
    SegmentResult

    Raises
    ------
    InputError
        A bad file. A worker on another machine that cannot see a path names it.
    """
    res = SegmentResult(seg.relpath)
    try:
        kept = kept_book(seg, predecoded_dir)
        if relabel:
            _relabel_segment(seg, staging, meta, job, relabel, kept, res)
        else:
            _map_segment(seg, staging, meta, job, kept, keep, res)
    finally:
        res.peak_rss = peak_rss()
    return res


def _map_segment(
    seg: Segment, staging: str, meta: dict, job: object, kept: Path | None, keep: bool, res: SegmentResult
) -> None:
    """The body of :func:`run_segment` (``kept``: where the segment's book is kept); fills ``res``."""
    from alphafeat.pipeline import SegmentColumns, segment_table

    t0 = time.perf_counter()
    for p in seg.book_files + seg.trade_files:
        if not os.path.exists(p):
            raise InputError(p, f"not visible from this worker ({os.uname().nodename}); inputs and --out must be "
                                "on a filesystem every worker shares")  # fmt: skip
    if job.device != "cpu" or job.bar_volume:
        b = _whole_book(seg, kept, res)
        if keep and kept is not None and not res.predecoded and len(b):
            save_book(b, kept)
        res.seconds["book"] = time.perf_counter() - t0
        if not len(b):
            return
        k = b.complete_from
        if k >= 0:  # the stream started without a snapshot: when the book became trustworthy
            res.complete_ts = int(b.ts_recv[k]) if k < len(b) else None
        table, res.crossed = segment_table(b, seg, job, res.seconds, gpu_locks=staging)
        del b
    else:
        writer = _BookWriter(kept) if keep and kept is not None and not is_kept(kept) else None
        cols = SegmentColumns(seg, job, _row_bound(seg, kept))
        t_map = 0.0
        try:
            depth = LEVELS
            with closing(_blocks(seg, kept, res, job.block_rows or BLOCK_ROWS)) as blocks:
                for b, halo, release in blocks:
                    t1 = time.perf_counter()
                    if writer is not None:
                        writer.add(b, 1 if halo else 0)
                    cols.add(b, halo, release=release)  # release: once stored, on cols' worker
                    depth = b.depth
                    t_map += time.perf_counter() - t1
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        if writer is not None:
            if cols.rows:
                writer.close(depth, res.complete_from)
            else:
                writer.abort()
        res.seconds["book"] = time.perf_counter() - t0 - t_map  # decode and book rows (what the blocks waited for)
        if not cols.rows:
            return
        cols.mark_complete(res.complete_from)
        table, res.crossed = cols.table(res.seconds)
        del cols
        if res.complete_from >= 0:  # the stream started without a snapshot: when the book became trustworthy
            k = res.complete_from
            res.complete_ts = int(table.column("ts_recv")[k].value) if k < table.num_rows else None
    t1 = time.perf_counter()
    _stage(staging, seg, table, meta, job.compression)
    res.rows = table.num_rows
    res.seconds["write"] = time.perf_counter() - t1


def _relabel_segment(seg: Segment, staging: str, meta: dict, job: object, src: str, kept: Path | None,
                     res: SegmentResult) -> None:
    """The body of :func:`run_segment` for ``relabel``: read the partition ``src``, compute the
    features it lacks from the book kept under ``kept``, recompute its labels, write it to
    staging; fills ``res`` (``relabelled``, ``rows``, ``crossed``)."""
    import pyarrow as pa

    from alphafeat.pipeline import added_features, column_array, relabel_changes, relabel_table

    t0 = time.perf_counter()
    with pa.memory_map(src) as f:
        table = pa.ipc.open_file(f).read_all()
    res.seconds["read"] = time.perf_counter() - t0  # the partition's columns, read back
    res.changes = relabel_changes(table, job)
    missing = [n for n in job.names if table.schema.get_field_index(n) < 0]
    added = None
    if missing:
        t1 = time.perf_counter()
        if not is_kept(kept):
            raise AlphafeatError(f"{seg.relpath}: the kept book to add features {missing[:3]} to is gone ({kept})")
        b = load_book(kept, widen=False)
        res.predecoded = True
        if len(b) != table.num_rows:
            raise AlphafeatError(f"{seg.relpath}: the kept book has {len(b):,} rows, the partition "
                                 f"{table.num_rows:,}; not relabelled")  # fmt: skip
        res.seconds["book"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        added = added_features(b, job, missing, seg.relpath, gpu_locks=staging)
        del b
        res.seconds["features"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    table = relabel_table(table, job, added)
    res.seconds["labels"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    _stage(staging, seg, table, meta, job.compression)
    res.seconds["write"] = time.perf_counter() - t1
    res.rows, res.relabelled = table.num_rows, True
    res.crossed = int(column_array(table, "book_crossed", np.bool_).sum())


def _stage(staging: str, seg: Segment, table: object, meta: dict, compression: str) -> None:
    """Write the segment's partition into the run's staging folder, which must still exist: a
    worker that outlived its run (aborted, its staging removed) must not make the folders again
    (an orphaned ``.staging-*`` in ``--out`` without the cache's lock, which a rerun refuses)."""
    if not os.path.isdir(staging):
        raise AlphafeatError(f"{staging}: the run's staging folder is gone (the run was stopped); not written")
    write_partition(staged_path(staging, seg.relpath), table, meta, compression)


def _row_bound(seg: Segment, kept: Path | None) -> int:
    """Rows the segment can have at most (a kept book's count, else from the files' sizes)."""
    if is_kept(kept):
        return int(json.loads((kept / "book.json").read_text())["rows"]) + 1
    from alphafeat.dbn import record_dtype

    rt = SCHEMA_RTYPES[seg.schema]
    return _record_bound(seg.book_files, record_dtype(rt, 1).itemsize)
