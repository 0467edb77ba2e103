"""zstd frame structure, read without decompressing: whether a file is zstd (:func:`is_zstd`) and
where a cut one ends (:func:`zstd_problem`; RFC 8878 sections 3.1.1-3.1.2). The DBN reader
(:mod:`alphafeat.dbn`) uses both."""

from __future__ import annotations

import os
from typing import BinaryIO

import numba
import numpy as np

__all__ = ["is_zstd", "zstd_problem"]

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def is_zstd(head: bytes) -> bool:
    """Whether a file starting with ``head`` (its first 4 bytes) is zstd: a zstd frame or a
    skippable frame (RFC 8878 3.1.1, 3.1.2). The reader decides by this, never by the name."""
    skippable = len(head) == 4 and head[0] & 0xF0 == 0x50 and head[1:] == b"\x2a\x4d\x18"
    return head[:4] == _ZSTD_MAGIC or skippable


@numba.njit(cache=True, nogil=True)
def _walk_blocks(win: np.ndarray, off: int) -> tuple[int, int]:
    """Walk zstd block headers (RFC 8878 3.1.1.2) in ``win`` from ``off``: returns the offset
    reached and 0 (the next header is not wholly inside the window), 1 (past the frame's last
    block) or 2 (reserved block type at the offset returned)."""
    n = win.shape[0]
    while off + 3 <= n:
        h = np.int64(win[off]) | (np.int64(win[off + 1]) << 8) | (np.int64(win[off + 2]) << 16)
        btype = (h >> 1) & 3
        if btype == 3:
            return off, 2
        off += 3 + (1 if btype == 1 else h >> 3)
        if h & 1:
            return off, 1
    return off, 0


def zstd_problem(f: BinaryIO) -> tuple[int, str] | None:
    """Check the frame structure of a zstd file without decompressing it.

    ``zstandard``'s ``stream_reader`` returns a short read, not an error, when the input
    ends inside a frame (see ``tests/test_dbn.py``), so the frame and block headers are
    walked first (zstd format, RFC 8878 sections 3.1.1-3.1.2): a frame or block that runs
    past the end of the file, or a missing checksum, means the file was cut short.

    Returns ``(compressed offset, problem)`` or None when the structure is complete. Bytes
    that are not a frame at all are left to the decompressor, which rejects them.
    """
    fd = f.fileno()
    size = os.fstat(fd).st_size
    if size == 0:
        return None

    win = [0, b""]  # a 1 MiB window read with pread: no whole-file map, so RSS does not grow with the file

    def u(pos: int, n: int) -> int:  # little-endian integer of the n bytes at pos
        off = pos - win[0]
        if off < 0 or off + n > len(win[1]):
            win[0], win[1] = pos, os.pread(fd, 1 << 20, pos)
            off = 0
        return int.from_bytes(win[1][off : off + n], "little")

    pos = 0
    while pos < size:
        if pos + 4 > size:
            return pos, "zstd stream ends inside a frame magic (truncated file)"
        magic = u(pos, 4)
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # skippable frame
            if pos + 8 > size:
                return pos, "zstd stream ends inside a skippable frame (truncated file)"
            pos += 8 + u(pos + 4, 4)
            if pos > size:
                return size, "zstd stream ends inside a skippable frame (truncated file)"
            continue
        if magic != 0xFD2FB528:
            return None  # not zstd here: the decompressor reports it
        if pos + 5 > size:
            return pos, "zstd stream ends in the middle of a frame (truncated file)"
        fhd = u(pos + 4, 1)
        single = (fhd >> 5) & 1
        fcs = (1 if single else 0, 2, 4, 8)[fhd >> 6]
        pos += 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + fcs
        while True:  # block headers, walked in numba a window at a time
            if pos + 3 > size:  # a header or block walked past the end: the file ends inside it
                return min(pos, size), "zstd stream ends in the middle of a frame (truncated file)"
            u(pos, 3)  # the window holds this header
            off, state = _walk_blocks(np.frombuffer(win[1], dtype=np.uint8), pos - win[0])
            pos = win[0] + off
            if state == 2:
                return None  # reserved block type: corrupt, the decompressor reports it
            if state == 1:
                break
        if fhd & 0x04:
            pos += 4
        if pos > size:
            return size, "zstd stream ends in the middle of a frame (truncated file)"
    return None
