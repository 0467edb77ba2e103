"""The layout of one shared-memory *slot* of the GPU hub (:mod:`alphafeat.cuda.hub`): a block's
feature inputs and its results, laid out once, read the same way by the parent that made it
and by the worker process that fills it (its descriptor passed over the hub's socket). A leaf
module: numpy only (no CUDA)."""

from __future__ import annotations

import mmap
import os
import tempfile

import numpy as np

#: The input columns of a block (:func:`alphafeat.features.inputs.prepare`), in transfer order.
IN_COLS = ("ts_recv", "bid_px", "ask_px", "bid_sz", "ask_sz", "buy_volume", "sell_volume", "trade_count")
#: Column of the book levels: (rows, levels); the others are (rows,).
LEVEL_COLS = ("bid_px", "ask_px", "bid_sz", "ask_sz")
#: Alignment of each array in a slot, bytes.
ALIGN = 64


def layout(levels: int, k: int, rows: int) -> tuple[list[tuple[str, tuple[int, ...], np.dtype, int]], int]:
    """``([(name, shape, dtype, offset), ...], total bytes)`` of a slot for blocks of up to
    ``rows`` new rows (``rows + 1`` input rows: the halo row first), books of ``levels``
    levels and ``k`` result rows (float64 ``out``, ``(k, rows)``).

    The results lie over the inputs (both from offset 0): the device has read a block's inputs
    before it writes its results back (one CUDA stream orders the copy in, the kernels and the
    copy back), and the worker refills the slot only after it has taken the results. So a slot
    is the larger of the two, not their sum."""
    items, off = [], 0
    for name in IN_COLS:
        shape: tuple[int, ...] = (int(rows) + 1, int(levels)) if name in LEVEL_COLS else (int(rows) + 1,)
        dt = np.dtype(np.int64 if name == "ts_recv" else np.float64)
        items.append((name, shape, dt, off))
        off += -(-int(np.prod(shape)) * dt.itemsize // ALIGN) * ALIGN
    items.append(("out", (int(k), int(rows)), np.dtype(np.float64), 0))
    return items, max(off, int(k) * int(rows) * 8, ALIGN)


def views(buf: object, levels: int, k: int, rows: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``(input columns, out)``: numpy views of the slot ``buf`` (a writable buffer of at least
    :func:`layout`'s bytes)."""
    items, _ = layout(levels, k, rows)
    arrs = {name: np.ndarray(shape, dt, buffer=buf, offset=off) for name, shape, dt, off in items}
    out = arrs.pop("out")
    return arrs, out


def create(name: str, nbytes: int) -> tuple[int, mmap.mmap]:
    """``(fd, mapping)`` of a new anonymous shared-memory file of ``nbytes`` (``memfd_create``;
    where there is none, a file in the temp folder, unlinked at once): nothing is left behind
    once the last process holding it closes it or ends, whatever way it ends."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name)
    else:
        fd, path = tempfile.mkstemp(prefix=name)
        os.unlink(path)
    try:
        os.ftruncate(fd, nbytes)
        return fd, mmap.mmap(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise


def attach(fd: int, nbytes: int) -> mmap.mmap:
    """The slot made by :func:`create` (``fd``: this process's descriptor of it, closed here), mapped shared."""
    try:
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
