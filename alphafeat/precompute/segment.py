"""Map: one segment (session x instrument) through decode -> book -> features -> labels -> write.

:func:`run_segment` is the function a worker runs (in this process, a joblib/loky process or a
Dask worker): it reads only the segment's instrument from the segment's files, keeps nothing
of any other session, and writes one Arrow IPC partition (one record batch) to a staging path.

Streamed CPU path (the default)
    MBP-10 / MBP-1 records are decoded (8 MiB chunks, filtered to the instrument while
    decoding) and turned into book rows (:class:`alphafeat.book.MBPBookBuilder`, numba) on a
    thread of their own, in blocks of :data:`~alphafeat.precompute.books.BLOCK_ROWS` rows (both
    smaller when many segments run at once: :func:`~alphafeat.precompute.books.stream_rows`)
    written into :data:`MBP_SETS` column sets used in turn.
    The calling thread takes each block and continues the features from the block before
    (:class:`alphafeat.features.cpu.FeatureStream`; with cores to spare, the row-wise features
    of the coming rows on threads of their own: :func:`alphafeat.precompute.job.feature_threads`),
    fills the stored columns
    (:class:`alphafeat.precompute.table.SegmentColumns`), and hands the rows whose label horizons are
    complete to a third thread (:class:`alphafeat.labels.LabelStream`). Memory: a few blocks
    and the session's stored columns, never the records nor the whole book. MBO: the
    instrument's records of the segment's files are rebuilt (:func:`alphafeat.book.rebuild_mbo`)
    from the start of the first file, cut to the session, then fed to the same path in blocks.
    Trades come from the trades files when the run has them, else from the book stream.
Streamed GPU path (``--device cuda``)
    The same blocks, the same book columns, labels and write on the same workers; only the
    features go to the parent's GPU hub (:mod:`alphafeat.cuda.hub`: shared-memory slots,
    recurrences carried on the device), which this worker fills ahead of the results
    (:meth:`alphafeat.precompute.table.SegmentColumns.add`). On a Dask cluster's workers, the
    worker's own GPU owner (:func:`alphafeat.cuda.owner.shared`).
Volume bars
    The session's whole book is built first (:func:`~alphafeat.precompute.books.build_book`),
    then the bars and their features (on the CPU, or one GPU call).
Kept books
    :mod:`alphafeat.precompute.books`.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from alphafeat import book as bk
from alphafeat.cache import staged_path, write_partition
from alphafeat.dbn import SCHEMA_RTYPES
from alphafeat.errors import AlphafeatError, InputError
from alphafeat.plan import Segment
from alphafeat.precompute import books
from alphafeat.precompute.books import (
    BookWriter,
    book_slices,
    build_book,
    is_kept,
    kept_book,
    load_book,
    peak_rss,
    prefetch,
    read_chunk,
    read_records,
    record_bound,
    save_book,
    segment_trades,
)
from alphafeat.precompute.relabel import added_features, relabel_changes, relabel_table
from alphafeat.precompute.table import SegmentColumns, column_array, segment_table
from alphafeat.types import LEVELS, BookArrays

__all__ = ["SegmentResult", "run_segment"]

log = logging.getLogger(__name__)


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
        The instrument's book records of the segment's session (``ts_recv`` in its bounds; each
        record counts in one segment, whatever was read around it; 0 when the book came from
        the predecoded folder).
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
        What that relabel changed (:func:`alphafeat.precompute.relabel.relabel_changes`).
    cpu : dict of str to float
        CPU seconds of the worker process while it ran the segment, ``user`` and ``sys``
        (``getrusage``; every thread of the process, so a worker's other work at the same time
        counts too).
    span : tuple of float
        Wall-clock start and end of the segment, seconds since the epoch.
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
    cpu: dict[str, float] = field(default_factory=dict)
    span: tuple[float, float] = (0.0, 0.0)


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
    trades = segment_trades(seg)
    if trades is not None:
        trades = trades.take((trades.ts_recv >= s0) & (trades.ts_recv < s1))
        trades = trades.take(np.argsort(trades.ts_recv, kind="stable"))
    free = [threading.Semaphore(1) for _ in range(MBP_SETS)]
    stop = threading.Event()

    def produce() -> Iterator[tuple[BookArrays, bool, int]]:
        builder, cur = None, 0
        chunk = read_chunk(rows)
        for recs in read_records(seg.book_files, seg.instrument_id, SCHEMA_RTYPES[seg.schema], chunk):
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

    it = prefetch(produce(), depth=1)
    try:
        for b, halo, which in it:
            yield b, halo, free[which].release
    finally:
        stop.set()
        for sem in free:  # a thread waiting for a set is let go; it sees stop and ends
            sem.release()
        it.close()


def run_segment(
    seg: Segment, staging: str, meta: dict, job: object, predecoded_dir: str | None, keep: bool = False,
    relabel: str | None = None,
) -> SegmentResult:
    """Compute one segment and write its partition to ``staging/seg.relpath``.

    On the CPU with snapshot sampling the book flows through in blocks of :data:`~alphafeat.precompute.books.BLOCK_ROWS`
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
    job : alphafeat.precompute.job.Job
        Output options: features, dtype, compression, labels, device.
    predecoded_dir : str or None
        Where books are kept between runs (module docstring): a book kept there is used; None
        reads none.
    keep : bool
        Keep this segment's book there when it has to be built.
    relabel : str or None
        A partition of this segment written earlier with other label options or features only
        (:func:`alphafeat.precompute.manifest.reuse_key`): its book columns and the features ``job`` stores
        are kept, the features it lacks computed from the kept book, its labels recomputed
        (:func:`alphafeat.precompute.relabel.relabel_table`); no input file is read.

    Returns
    -------
    SegmentResult

    Raises
    ------
    InputError
        A bad file. A worker on another machine that cannot see a path names it.
    """
    res = SegmentResult(seg.relpath)
    t0, ru0 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    try:
        kept = kept_book(seg, predecoded_dir)
        if relabel:
            _relabel_segment(seg, staging, meta, job, relabel, kept, res)
        else:
            _map_segment(seg, staging, meta, job, kept, keep, res)
    finally:
        res.peak_rss = peak_rss()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        res.cpu = {"user": ru.ru_utime - ru0.ru_utime, "sys": ru.ru_stime - ru0.ru_stime}
        res.span = (t0, time.time())
    return res


def _map_segment(
    seg: Segment, staging: str, meta: dict, job: object, kept: Path | None, keep: bool, res: SegmentResult
) -> None:
    """The body of :func:`run_segment` (``kept``: where the segment's book is kept); fills ``res``."""

    t0 = time.perf_counter()
    for p in seg.book_files + seg.trade_files:
        if not os.path.exists(p):
            raise InputError(p, f"not visible from this worker ({os.uname().nodename}); inputs and --out must be "
                                "on a filesystem every worker shares")  # fmt: skip
    if job.bar_volume:  # whole books (CPU or GPU features); else blocks (CPU stream, or the GPU owner)
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
        writer = BookWriter(kept) if keep and kept is not None and not is_kept(kept) else None
        cols = SegmentColumns(seg, job, _row_bound(seg, kept))
        t_map = 0.0
        try:
            depth = LEVELS
            with closing(_blocks(seg, kept, res, job.block_rows or books.BLOCK_ROWS)) as blocks:
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
        if res.complete_from >= 0:  # the stream started without a snapshot: when the book became trustworthy
            k = res.complete_from  # (a row of the book: before --preopen drop leaves rows out)
            res.complete_ts = int(cols.cols["ts_recv"][k]) if k < cols.rows else None
        table, res.crossed = cols.table(res.seconds)
        del cols
    t1 = time.perf_counter()
    _stage(staging, seg, table, meta, job.compression)
    res.rows = table.num_rows
    res.seconds["write"] = time.perf_counter() - t1


def _relabel_segment(seg: Segment, staging: str, meta: dict, job: object, src: str, kept: Path | None,
                     res: SegmentResult) -> None:
    """The body of :func:`run_segment` for ``relabel``: read the partition ``src``, compute the
    features it lacks from the book kept under ``kept``, recompute its labels, write it to
    staging; fills ``res`` (``relabelled``, ``rows``, ``crossed``)."""
    import pyarrow as pa  # here: a segment computed afresh decodes its first records without it

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
    return record_bound(seg.book_files, record_dtype(rt, 1).itemsize)
