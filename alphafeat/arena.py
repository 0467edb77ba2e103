"""Large buffers reused within one process.

Fresh memory costs page faults on first touch (on some hosts most of a segment's time), so a
worker that maps many segments keeps its big buffers and hands them to the next segment once
nothing refers to them any more; its memory then stays that of its largest segment.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["release", "reserve"]

_KEPT: dict[str, np.ndarray] = {}
_LOCK = threading.Lock()
#: A new buffer is this much larger than asked for: the next segment's bound (from its files'
#: sizes) is often a little larger, and a buffer too small is replaced by fresh memory.
HEADROOM = 1.5


def reserve(tag: str, shape: tuple[int, ...], dtype: type | np.dtype) -> np.ndarray:
    """An uninitialised array of ``shape`` and ``dtype``.

    It is a view of the buffer kept under ``tag`` when that is large enough and no array refers
    to it (its reference count is back to the pool's own), else of a new buffer kept under
    ``tag`` in its place, :data:`HEADROOM` times the size asked for. Callers must not keep two
    live arrays of one tag at once by design; if they do, the second is simply new memory.
    Untouched parts cost address space only.
    """
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    with _LOCK:
        buf = _KEPT.get(tag)
        # references: the dict, the local name, getrefcount's argument
        if buf is None or buf.nbytes < nbytes or sys.getrefcount(buf) > 3:
            buf = np.empty(max(int(nbytes * HEADROOM), 1), dtype=np.uint8)
            _KEPT[tag] = buf
        return buf[:nbytes].view(dtype).reshape(shape)


def release() -> int:
    """Drop every kept buffer (memory goes back once no array refers to it); returns how many.
    :func:`alphafeat.precompute.precompute` calls it when it returns, so a notebook keeps none."""
    with _LOCK:
        n = len(_KEPT)
        _KEPT.clear()
        return n
