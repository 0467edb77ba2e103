"""The stored columns of one segment: their specs (:func:`column_specs`), the features and
labels of its rows (:class:`SegmentColumns`, block by block; :func:`segment_table`, a whole
book) and the Arrow arrays they become, built from buffers (no pandas)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from alphafeat.bars import volume_bars
from alphafeat.errors import AlphafeatError
from alphafeat.features import FeatureParams, compute_features, feature_specs
from alphafeat.features.inputs import crossed_rows, prepare
from alphafeat.labels import LabelStream, direction_labels_seconds
from alphafeat.plan import Segment
from alphafeat.precompute.job import MAX_FEATURE_THREADS, Job, live_threads
from alphafeat.types import BookArrays
from alphafeat.validation import Barrier, validate_barrier

if TYPE_CHECKING:  # pyarrow is imported where it is used: a run decodes its first records without it
    import pyarrow as pa

__all__ = ["SegmentColumns", "book_mid", "column_array", "column_specs", "crossed", "device_features",
           "feature_dtypes", "from_numpy", "label_mid", "segment_table"]


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


def barrier_widths(mid: np.ndarray, ret2: np.ndarray | None, barrier: Barrier, job: Job) -> np.ndarray:
    """Triple-barrier half-width per row, index points (``barrier``: ``job.barrier`` parsed; see
    PrecomputeConfig.barrier)."""
    tick = job.features.tick_size
    if barrier.kind == "ticks":
        return np.full(mid.shape, barrier.k * tick)
    return barrier.k * np.sqrt(ret2) * tick * np.sqrt(job.barrier_horizon)


def crossed(b: BookArrays) -> np.ndarray:
    """bool (n,): the best bid is above the best ask (a crossed book, e.g. in the pre-open): the
    rows the features see as an empty book (:func:`alphafeat.features.inputs.crossed_rows`)."""
    return crossed_rows(b.bid_px, b.ask_px)


def book_mid(b: BookArrays) -> np.ndarray:
    """The mid price, float64 (n,), as the ``mid`` feature computes it: ``0.5 * (bid + ask)``
    of the best levels, NaN where either is empty or the book is crossed (the features see a
    crossed row as an empty book; the same operations, so bit-identical): :func:`label_mid`."""
    return label_mid(b.bid_px[:, 0], b.ask_px[:, 0], crossed(b))


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


def min_depth(params: FeatureParams) -> dict[str, int]:
    """Book levels each feature needs (FeatureSpec.min_depth); shallower input gives NaN."""
    return {spec.name: spec.min_depth for spec in feature_specs(params)}


def stored_rows(job: Job) -> tuple[str, ...]:
    """The features a segment keeps: those stored, and ``ema_ret2_60s`` (a ``vol`` barrier's
    widths read it), each once."""
    return tuple(dict.fromkeys((*job.names, "ema_ret2_60s")))


def pruned_stream(job: Job, index: dict[str, int], names: Iterable[str]) -> object:
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
        self.min_depth = min_depth(job.features)
        self.stream = None
        self.labels = _label_stream(job, cap)
        self.seconds = {"features": 0.0, "store": 0.0, "labels": 0.0}  # "store" and "labels": the worker's
        self._worker = ThreadPoolExecutor(1)  # stores and labels block by block beside the next block's features
        self._pending: list[Future] = []
        # features from the GPU hub come back blocks later: a vol barrier's widths (and so the
        # labels) wait for them (_labels_upto); other labels need the mid only
        self._deferred = job.gpu is not None and job.device == "cuda" and self.barrier is not None and \
            self.barrier.kind == "vol"  # fmt: skip
        self._feat_rows = self._w_done = 0

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
        if self._deferred and self._feat_rows > self._w_done:  # after the stores of those rows
            self._pending.append(self._worker.submit(self._labels_upto, self._feat_rows))

    def _stream_features(self, b: BookArrays, lo: int, k0: int) -> None:
        """The CPU features of block ``b``'s new rows (from its row ``lo``) into the columns from
        row ``k0``, piece by piece (each piece after the block's first led by its halo row); on
        ``cuda``, from the process's GPU owner."""
        wanted = stored_rows(self.job)
        if self.job.device == "cuda" and self.job.gpu is not None:
            self._hub_features(prepare(b, self.job.features), lo, wanted, b.depth)
            return
        if self.job.device == "cuda":
            self._gpu_features(prepare(b, self.job.features), lo, k0, wanted, b.depth)
            return
        if self.stream is None:  # only what the stored features need
            self.stream = pruned_stream(self.job, self.index, wanted)

        def take(i0: int, i1: int, out: np.ndarray, which: frozenset[int]) -> None:
            """The stored features among the final columns ``which`` of rows ``i0:i1`` of ``b``."""
            feats = {name: out[self.index[name]] for name in wanted if self.index[name] in which}
            self._store_features(feats, b.depth, k0 + i0 - lo, k0 + i1 - lo)

        self.stream.push_block(prepare(b, self.job.features), lo, take, live_threads(self.job))

    def _gpu_features(self, cols: dict[str, np.ndarray], lo: int, k0: int, wanted: tuple[str, ...],
                      depth: int) -> None:  # fmt: skip
        """The features of the block's new rows (``cols`` from row ``lo``) from this process's GPU
        owner (:func:`alphafeat.cuda.owner.shared`: recurrences carried on the device from
        block to block), in pieces of at most its block rows, each led by its halo row."""
        if self.stream is None:
            from alphafeat.cuda.owner import shared
            from alphafeat.features.registry import make_plan

            # only the rows stored come back from the device
            self.stream = shared().open(make_plan(self.job.features), self.seg.relpath,
                                        [self.index[name] for name in wanted])  # fmt: skip
        n, step = int(cols["ts_recv"].shape[0]), self.stream.owner.block_rows
        for i0 in range(lo, n, step):
            i1 = min(i0 + step, n)
            a = i0 - 1 if i0 > 0 else 0
            out = self.stream.push({k: v[a:i1] for k, v in cols.items()}, i0 > 0)
            self._store_features({name: out[j] for j, name in enumerate(wanted)}, depth, k0 + i0 - lo, k0 + i1 - lo)

    def _hub_features(self, cols: dict[str, np.ndarray], lo: int, wanted: tuple[str, ...], depth: int) -> None:
        """Hand the block's new rows (``cols`` from row ``lo``) to the parent's GPU hub
        (:class:`alphafeat.cuda.hub.HubStream`: shared-memory slots, recurrences carried on the
        device); the features of earlier rows are stored as they come back, while this
        worker goes on with the next blocks."""
        if self.stream is None:
            from alphafeat.cuda.hub import HubStream

            def store(out: np.ndarray, k0: int, k1: int) -> None:
                self._store_features({name: out[j] for j, name in enumerate(wanted)}, depth, k0, k1)
                self._feat_rows = k1

            self.stream = HubStream(self.job.gpu, self.job.features, [self.index[name] for name in wanted],
                                    self.seg.relpath, store)  # fmt: skip
        self.stream.add(cols, lo)

    def _labels_upto(self, k: int) -> None:
        """On the worker, with features from the GPU hub and a ``vol`` barrier (its widths read
        ``ema_ret2_60s``): the barrier widths of the rows up to ``k`` and the labels complete there."""
        t0 = time.perf_counter()
        c, w0 = self.cols, self._w_done
        if k > w0:
            c["_w"][w0:k] = barrier_widths(c["_mid"][w0:k], c["_ema"][w0:k], self.barrier, self.job)
            self._w_done = k
            self.labels.update(c["_mid"][:k], c["ts_recv"][:k], c["_w"][:k])
        self.seconds["labels"] += time.perf_counter() - t0

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
        if self._deferred:
            self.seconds["store"] += time.perf_counter() - t0
            return
        if self.job.barrier:
            c["_w"][k0:k1] = barrier_widths(mid, c["_ema"][k0:k1] if "_ema" in c else None, self.barrier, self.job)
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
        returns ``(table, crossed rows)``. With ``job.preopen`` drop the crossed rows are left
        out of the table after the labels (so the other rows' labels are those of ``keep``)."""
        n = self.rows
        c = {k: v[:n] for k, v in self.cols.items()}
        if self.stream is not None and hasattr(self.stream, "finish"):  # the GPU hub's last blocks
            t0 = time.perf_counter()
            self.stream.finish()
            if self._deferred:
                self._pending.append(self._worker.submit(self._labels_upto, n))
            self.seconds["features"] += time.perf_counter() - t0
        self._wait(0)
        self._worker.shutdown()
        if self.stream is not None:
            self.stream.close()
            self.stream = None  # the hub's stream holds a closure over self: no cycle left for the gc
        t0 = time.perf_counter()
        labels = _finish_labels(self.labels, c["_mid"], c["ts_recv"], c.get("_w"), self.job)
        seconds["features"] = seconds.get("features", 0.0) + self.seconds["features"] + self.seconds["store"]
        seconds["labels"] = self.seconds["labels"] + time.perf_counter() - t0
        import pyarrow as pa

        ts = pa.timestamp("ns", tz="UTC")
        cols: dict[str, pa.Array] = {
            "ts_event": from_numpy(c["ts_event"], ts),
            "ts_recv": from_numpy(c["ts_recv"], ts),
            "instrument_id": from_numpy(np.full(n, self.seg.instrument_id, dtype=np.uint32)),
            "raw_symbol": _symbol_column(self.seg.raw_symbol, n),
        }
        for k in self.dtypes:
            if k not in cols:
                cols[k] = from_numpy(c[k])
        del c
        cols.update(label_arrays(labels))
        table = pa.table(cols)
        if self.job.preopen == "drop" and self.crossed:
            import pyarrow.compute as pc

            table = table.filter(pc.invert(table.column("book_crossed")))
        return table, self.crossed


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


def is_label(name: str) -> bool:
    """Whether a cache column is a label column (``label_*``, ``t1_*``, ``tb_*``)."""
    return name.startswith(("label_", "t1_", "tb_"))


def label_arrays(labels: dict[str, np.ndarray | pa.ChunkedArray]) -> dict[str, pa.Array | pa.ChunkedArray]:
    """The label columns as Arrow arrays: end times as UTC timestamps, null where unknown (< 0);
    a column already in Arrow (kept from a partition) as it is."""
    import pyarrow as pa

    ts = pa.timestamp("ns", tz="UTC")
    return {k: v if isinstance(v, pa.ChunkedArray) else
            from_numpy(v, ts, v < 0) if k.startswith("t1_") or k == "tb_t1" else from_numpy(v, pa.float32())
            for k, v in labels.items()}  # fmt: skip


def from_numpy(v: np.ndarray, type: pa.DataType | None = None, null: np.ndarray | None = None) -> pa.Array:
    """A numpy array (n,) of fixed-width values or bools as an Arrow array of ``type`` (default:
    the dtype's) over its buffer (bools packed), null where ``null``: what ``pa.array(v, type,
    mask=null)`` gives (the same IPC bytes), without the pandas that any ``pa.array`` call loads
    (~0.2-0.3 s: of a relabel, and of every worker process that writes a partition)."""
    import pyarrow as pa

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
    buffers (no pandas; see :func:`from_numpy`)."""
    import pyarrow as pa

    text = symbol.encode()
    offsets = np.array([0, len(text)], dtype=np.int32)
    dictionary = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(text)])
    return pa.DictionaryArray.from_arrays(from_numpy(np.zeros(n, dtype=np.int8)), dictionary)


def column_array(table: pa.Table, name: str, dtype: type) -> np.ndarray:
    """Column ``name`` of ``table`` as a numpy array of ``dtype`` (n,): a read-only view of
    Arrow's buffer for fixed-width values (timestamps as their int64 ns), bools unpacked from
    their bits; a copy where the column has nulls or several chunks. Unlike pyarrow's
    ``to_numpy``, it never loads pandas (~0.2-0.3 s, which a relabel would otherwise spend)."""
    import pyarrow as pa

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


#: Rows of one push of the CPU features (:meth:`SegmentColumns.add`): their float64 result
#: matrix (~2.3 MB at the default features) stays in cache until the stored ones are copied out.
_PIECE = 4096


def device_features(b: BookArrays, job: Job, where: str, gpu_locks: str | None,
                    use: Callable[[dict[str, np.ndarray]], None]) -> None:  # fmt: skip
    """Every feature of the whole book ``b`` on ``job.device`` (:func:`compute_features`, on a GPU
    :func:`alphafeat.cuda.compute_features_cuda`), handed to ``use`` (which copies out what it
    keeps); on a GPU, with ``gpu_locks`` (the run's
    staging folder), in a turn among the run's segments (:func:`alphafeat.cuda.gpu_turn`: bounded
    GPU memory) that ends after ``use``, freeing the device and pinned host memory the features
    lie in. A GPU out of memory (numba-cuda's ``CudaAPIError``) raises an AlphafeatError line
    naming ``where`` (the segment)."""
    if job.device != "cuda":
        use(compute_features(b, job.features, device=job.device))
        return
    from alphafeat.cuda import compute_features_cuda, gpu_turn

    try:
        with gpu_turn(gpu_locks) if gpu_locks else contextlib.nullcontext():
            use(compute_features_cuda(b, job.features))
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
