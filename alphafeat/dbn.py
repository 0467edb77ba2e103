"""Streaming reader of Databento DBN files (v1, v2, v3; plain ``.dbn`` or ``.dbn.zst``).

Records come back as numpy structured arrays whose dtypes are exactly the ones that
``databento_dbn`` (and so ``databento.DBNStore.to_ndarray``) uses for the file's DBN version:
prices are int64 in 1e-9 fixed point (``UNDEF_PRICE`` = 2**63-1 when absent), timestamps are
uint64 ns since the UNIX epoch. No Python object is built per record: a chunk of the
decompressed stream is viewed with ``np.frombuffer`` when it holds one record type, and
split by record type with a small numba loop otherwise (live data interleaves symbol-mapping,
system and error records with market records).

Format (Databento DBN spec, https://databento.com/docs/standards-and-conventions/databento-binary-encoding):
``b"DBN"`` + version byte + u32 little-endian metadata length + metadata, then records. Every
record starts with ``length`` (u1, record size in 4-byte words), ``rtype`` (u1),
``publisher_id`` (u2), ``instrument_id`` (u4), ``ts_event`` (u8). When the metadata says
``ts_out``, every record carries an extra trailing u8 ``ts_out`` (counted in ``length``).
Metadata and symbology are decoded by ``databento_dbn.Metadata.decode``; record layouts are
taken from ``databento_dbn.v1`` / ``v2`` / ``v3``.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import BinaryIO

import databento_dbn
import numba
import numpy as np
import zstandard

from alphafeat.errors import InputError

__all__ = [
    "BOOK_SCHEMAS",
    "SCHEMA_RTYPES",
    "DBNFile",
    "iter_chunks",
    "open_dbn",
    "read_dbn",
    "record_dtype",
]

logger = logging.getLogger(__name__)

#: Record type (``rtype``) of the records of each DBN schema (DBN spec; checked against
#: ``databento_dbn.RType.from_schema``). ``tbbo`` shares ``mbp-1``'s rtype.
SCHEMA_RTYPES: dict[str, int] = {
    "mbo": 0xA0,
    "mbp-10": 0x0A,
    "mbp-1": 0x01,
    "tbbo": 0x01,
    "trades": 0x00,
    "definition": 0x13,
    "ohlcv-1s": 0x20,
    "ohlcv-1m": 0x21,
    "ohlcv-1h": 0x22,
    "ohlcv-1d": 0x23,
    "ohlcv-eod": 0x24,
    "statistics": 0x18,
    "status": 0x12,
    "imbalance": 0x14,
}

#: Schemas a book can be built from, deepest first.
BOOK_SCHEMAS = ("mbo", "mbp-10", "mbp-1")

#: rtype -> attribute of ``databento_dbn.v1`` / ``v2`` / ``v3`` holding its record class.
_RTYPE_CLASS: dict[int, str] = {
    0x00: "TradeMsg",
    0x01: "MBP1Msg",
    0x0A: "MBP10Msg",
    0x11: "OHLCVMsg",  # deprecated OHLCV rtype
    0x12: "StatusMsg",
    0x13: "InstrumentDefMsg",
    0x14: "ImbalanceMsg",
    0x15: "ErrorMsg",
    0x16: "SymbolMappingMsg",
    0x17: "SystemMsg",
    0x18: "StatMsg",
    0x20: "OHLCVMsg",
    0x21: "OHLCVMsg",
    0x22: "OHLCVMsg",
    0x23: "OHLCVMsg",
    0x24: "OHLCVMsg",
    0xA0: "MBOMsg",
    0xB1: "CMBP1Msg",
    0xC0: "CBBO1SMsg",
    0xC1: "CBBO1MMsg",
    0xC2: "TCBBOMsg",
    0xC3: "BBO1SMsg",
    0xC4: "BBO1MMsg",
}

#: Gateway records kept whatever the instrument filter: error, symbol mapping, system.
_ALWAYS_KEPT = frozenset({0x15, 0x16, 0x17})

_SUPPORTED_VERSIONS = (1, 2, 3)
_VERSION_MODULES = {1: databento_dbn.v1, 2: databento_dbn.v2, 3: databento_dbn.v3}
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_PREFIX_SIZE = 8  # b"DBN" + version byte + u32 metadata length


@dataclass(frozen=True)
class DBNFile:
    """What the header of a DBN file says.

    Attributes
    ----------
    path : Path
        The file.
    version : int
        DBN version (1, 2 or 3), from the header's version byte.
    metadata : databento_dbn.Metadata
        Decoded with ``databento_dbn.Metadata.decode`` as-is (no version upgrade).
    schema : str or None
        ``'mbo'``, ``'mbp-10'``, ... from the metadata; None for mixed (live) data.
    ts_out : bool
        Whether every record carries a trailing u8 ``ts_out`` (gateway send time, ns).
    compressed : bool
        Whether the file is zstd-compressed (decided by its magic, not its name).
    header_size : int
        Byte offset of the first record in the decompressed stream (8 + metadata length).
    """

    path: Path
    version: int
    metadata: databento_dbn.Metadata
    schema: str | None
    ts_out: bool
    compressed: bool
    header_size: int


@cache
def record_dtype(rtype: int, version: int, ts_out: bool = False) -> np.dtype:
    """Numpy dtype of one DBN record.

    Parameters
    ----------
    rtype : int
        Record type byte (e.g. 0xA0 MBO, 0x0A MBP-10, 0x16 symbol mapping).
    version : int
        DBN version 1, 2 or 3; the layouts of definition, symbol-mapping, system, error and
        statistics records differ between versions.
    ts_out : bool
        Append a ``('ts_out', '<u8')`` field (ns), as records of ``ts_out`` files carry.

    Returns
    -------
    np.dtype
        Packed structured dtype, field names and types from the ``databento_dbn`` record
        class ``_dtypes`` of that version (e.g. ``databento_dbn.v1.InstrumentDefMsg``), the
        same dtype ``databento.DBNStore.to_ndarray`` uses. ``itemsize`` is the record size
        in bytes (``length`` * 4).

    Raises
    ------
    ValueError
        Unknown rtype or unsupported version.
    """
    if version not in _VERSION_MODULES:
        raise ValueError(f"unsupported DBN version {version}")
    name = _RTYPE_CLASS.get(int(rtype))
    if name is None:
        raise ValueError(f"unknown DBN rtype 0x{int(rtype):02X}")
    cls = getattr(_VERSION_MODULES[version], name)
    fields = list(cls._dtypes)
    if ts_out:
        fields.append(("ts_out", "u8"))
    return np.dtype(fields)


@cache
def _size_table(version: int, ts_out: bool) -> np.ndarray:
    """int64[256]: record size in bytes per rtype for that version (0 = unknown rtype)."""
    sizes = np.zeros(256, dtype=np.int64)
    for rtype in _RTYPE_CLASS:
        sizes[rtype] = record_dtype(rtype, version, ts_out).itemsize
    sizes.setflags(write=False)
    return sizes


# --------------------------------------------------------------------------------------
# numba kernels
# --------------------------------------------------------------------------------------

_OK, _ERR_ZERO, _ERR_RTYPE, _ERR_LENGTH = 0, 1, 2, 3


@numba.njit(cache=True)
def _walk(buf: np.ndarray, sizes: np.ndarray, min_size: int) -> tuple[np.ndarray, int, int]:
    """Offsets of the complete records in ``buf``, where the walk stopped, and an error code.

    Stops at the first record that is incomplete (its offset is returned, error 0) or bad
    (zero length, unknown rtype, length disagreeing with the rtype's size).
    """
    n = buf.shape[0]
    offs = np.empty(n // min_size + 1, dtype=np.int64)
    k = 0
    pos = 0
    while pos + 2 <= n:
        length = np.int64(buf[pos]) * 4
        expected = sizes[buf[pos + 1]]
        if length == 0:
            return offs[:k], pos, _ERR_ZERO
        if expected == 0:
            return offs[:k], pos, _ERR_RTYPE
        if expected != length:
            return offs[:k], pos, _ERR_LENGTH
        if pos + length > n:
            break
        offs[k] = pos
        k += 1
        pos += length
    return offs[:k], pos, _OK


@numba.njit(cache=True)
def _gather(buf: np.ndarray, offs: np.ndarray, size: int) -> np.ndarray:
    """Copy the ``size``-byte records at ``offs`` of ``buf`` into one contiguous uint8 array."""
    out = np.empty(offs.shape[0] * size, dtype=np.uint8)
    for i in range(offs.shape[0]):
        o = offs[i]
        out[i * size : (i + 1) * size] = buf[o : o + size]
    return out


# --------------------------------------------------------------------------------------
# byte sources
# --------------------------------------------------------------------------------------


class _PlainSource:
    """Bytes of an uncompressed file."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self._f = f
        self._left = size - f.tell()
        self.exhausted = False

    def fill(self, prefix: bytes, want: int) -> bytearray:
        """``prefix`` + up to ``want`` more bytes (fewer only at the end of the file)."""
        want = max(0, min(want, self._left))
        buf = bytearray(len(prefix) + want)
        buf[: len(prefix)] = prefix
        got = len(prefix)
        with memoryview(buf) as view:
            while got < len(buf):
                n = self._f.readinto(view[got:])
                if not n:
                    break
                got += n
        self._left -= got - len(prefix)
        if got < len(buf) or self._left <= 0:
            self.exhausted = True
        del buf[got:]
        return buf

    def read_all(self, prefix: bytes) -> bytearray:
        """``prefix`` + the rest of the file."""
        return self.fill(prefix, self._left)


class _ZstdSource:
    """Decompressed bytes of a zstd file, one frame after another.

    ``zstandard``'s ``stream_reader`` (even with ``read_across_frames=True``) returns a short
    read, not an error, when the input ends inside a frame, so frames are decoded here with
    ``decompressobj`` objects, whose ``eof`` tells when a frame is complete: input that ends
    with a frame started and not finished is a truncated file.
    """

    def __init__(self, f: BinaryIO, path: Path, in_size: int) -> None:
        self._f = f
        self._path = path
        self._in_size = in_size
        self._dctx = zstandard.ZstdDecompressor()
        self._pieces: list[memoryview] = []
        self._pending = 0
        self._produced = 0
        self._gen = self._decode()
        self._done = False

    def _decode(self) -> Iterator[bytes]:
        obj = self._dctx.decompressobj()
        in_frame = False
        data = self._f.read(self._in_size)
        while data:
            try:
                out = obj.decompress(data)
            except zstandard.ZstdError as e:
                raise InputError(self._path, f"corrupt zstd data ({e})", offset=self._produced) from None
            if out:
                self._produced += len(out)
                yield out
            if obj.eof:
                data = obj.unused_data
                obj = self._dctx.decompressobj()
                in_frame = False
                if not data:
                    data = self._f.read(self._in_size)
            else:
                in_frame = True
                data = self._f.read(self._in_size)
        if in_frame:
            raise InputError(
                self._path,
                "zstd stream ends in the middle of a frame (truncated file)",
                offset=self._produced,
            )

    @property
    def exhausted(self) -> bool:
        """True once the stream has ended and every decompressed byte was handed out."""
        return self._done and self._pending == 0

    def fill(self, prefix: bytes, want: int) -> bytearray:
        """``prefix`` + up to ``want`` more bytes (fewer only at the end of the stream)."""
        while self._pending < want and not self._done:
            piece = next(self._gen, None)
            if piece is None:
                self._done = True
                break
            self._pieces.append(memoryview(piece))
            self._pending += len(piece)
        take: list[bytes | memoryview] = [prefix]
        got = 0
        while self._pieces and got < want:
            piece = self._pieces[0]
            if got + len(piece) <= want:
                take.append(piece)
                got += len(piece)
                self._pieces.pop(0)
            else:
                k = want - got
                take.append(piece[:k])
                self._pieces[0] = piece[k:]
                got += k
        self._pending -= got
        return bytearray().join(take)

    def read_all(self, prefix: bytes) -> bytearray:
        """``prefix`` + the rest of the stream, grown in place (one copy of each byte)."""
        buf = bytearray(prefix)
        for piece in self._pieces:
            buf += piece
        self._pieces.clear()
        self._pending = 0
        for piece in self._gen:
            buf += piece
        self._done = True
        return buf


def _open_source(path: Path, f: BinaryIO, chunk_bytes: int) -> tuple[_PlainSource | _ZstdSource, bool]:
    """Pick the source by the file's magic; errors for an empty file."""
    size = os.fstat(f.fileno()).st_size
    head = f.read(4)
    f.seek(0)
    if size == 0 or not head:
        raise InputError(path, "empty file (0 bytes), not a DBN file")
    is_skippable = len(head) == 4 and head[0] & 0xF0 == 0x50 and head[1:] == b"\x2a\x4d\x18"
    if head == _ZSTD_MAGIC or is_skippable:
        in_size = int(min(max(chunk_bytes // 16, 16 << 10), 1 << 20))
        return _ZstdSource(f, path, in_size), True
    return _PlainSource(f, size), False


def _read_header(path: Path, src: _PlainSource | _ZstdSource, compressed: bool) -> DBNFile:
    prefix = bytes(src.fill(b"", _PREFIX_SIZE))
    if len(prefix) == 0:
        raise InputError(path, "no data: the zstd stream decompresses to 0 bytes", offset=0)
    if not b"DBN".startswith(prefix[:3]):
        kind = "decompressed stream" if compressed else "file"
        raise InputError(
            path,
            f"not a DBN file: the {kind} starts with {prefix[:4]!r}, not b'DBN'",
            offset=0,
        )
    if len(prefix) < _PREFIX_SIZE:
        raise InputError(path, f"stream ends inside the 8-byte DBN prefix ({len(prefix)} bytes)", offset=0)
    version = prefix[3]
    if version not in _SUPPORTED_VERSIONS:
        raise InputError(path, f"unsupported DBN version {version} (this reader supports 1, 2 and 3)", offset=3)
    (meta_len,) = struct.unpack_from("<I", prefix, 4)
    body = src.fill(b"", meta_len)
    if len(body) < meta_len:
        raise InputError(
            path,
            f"stream ends inside the metadata ({len(body)} of its {meta_len} bytes)",
            offset=_PREFIX_SIZE + len(body),
        )
    try:
        metadata = databento_dbn.Metadata.decode(prefix + bytes(body), databento_dbn.VersionUpgradePolicy.AS_IS)
    except Exception as e:  # databento_dbn.DBNError, or anything its decoder raises
        raise InputError(path, f"DBN metadata fails to decode ({e})", offset=_PREFIX_SIZE) from None
    schema = None if metadata.schema is None else str(metadata.schema)
    return DBNFile(
        path=path,
        version=int(version),
        metadata=metadata,
        schema=schema,
        ts_out=bool(metadata.ts_out),
        compressed=compressed,
        header_size=_PREFIX_SIZE + meta_len,
    )


def _open(path: str | os.PathLike[str]) -> tuple[Path, BinaryIO]:
    p = Path(path)
    try:
        return p, open(p, "rb")  # closed by the callers
    except OSError as e:
        raise InputError(p, f"cannot open: {e.strerror or e}") from None


def open_dbn(path: str | os.PathLike[str]) -> DBNFile:
    """Read only the header (prefix and metadata) of a DBN file.

    Parameters
    ----------
    path : str or PathLike
        A ``.dbn`` or ``.dbn.zst`` file (compression is detected from the magic bytes).

    Returns
    -------
    DBNFile

    Raises
    ------
    InputError
        File unreadable or empty, not DBN (bad magic), unsupported version, truncated or
        corrupt zstd data, metadata that ``databento_dbn.Metadata.decode`` rejects.
    """
    p, f = _open(path)
    with f:
        src, compressed = _open_source(p, f, 1 << 16)
        return _read_header(p, src, compressed)


class _Parser:
    """Splits decompressed record bytes into per-rtype arrays."""

    def __init__(self, dbn: DBNFile, instrument_ids: Iterable[int] | None) -> None:
        self.dbn = dbn
        self.sizes = _size_table(dbn.version, dbn.ts_out)
        self.min_size = int(self.sizes[self.sizes > 0].min())
        if instrument_ids is None:
            self.ids: np.ndarray | None = None
        else:
            ids = np.unique(np.fromiter((int(i) for i in instrument_ids), dtype=np.int64))
            self.ids = ids[(ids >= 0) & (ids <= np.iinfo(np.uint32).max)].astype(np.uint32)

    def _error(self, code: int, a: np.ndarray, pos: int, offset: int, record: int) -> InputError:
        length, rtype = int(a[pos]), int(a[pos + 1])
        where = {"offset": offset + pos, "record": record}
        if code == _ERR_ZERO:
            return InputError(self.dbn.path, f"record length 0 (rtype 0x{rtype:02X})", **where)
        if code == _ERR_RTYPE:
            return InputError(
                self.dbn.path,
                f"unknown record type rtype 0x{rtype:02X} (length byte {length})",
                **where,
            )
        expected = int(self.sizes[rtype])
        ts = " with ts_out" if self.dbn.ts_out else ""
        return InputError(
            self.dbn.path,
            f"record length {length * 4} bytes (length byte {length}) disagrees with the "
            f"{expected} bytes of rtype 0x{rtype:02X} ({_RTYPE_CLASS[rtype]}) in DBN "
            f"v{self.dbn.version}{ts}",
            **where,
        )

    def _filter(self, rtype: int, arr: np.ndarray) -> np.ndarray:
        if self.ids is None or rtype in _ALWAYS_KEPT:
            return arr
        return arr[np.isin(arr["instrument_id"], self.ids)]

    def parse(self, buf: bytearray, final: bool, offset: int, record: int) -> tuple[dict[int, np.ndarray], int, int]:
        """Arrays of the complete records of ``buf``, bytes consumed, records consumed.

        ``offset`` / ``record``: stream offset and record index of ``buf[0]`` (for errors).
        """
        a = np.frombuffer(buf, dtype=np.uint8)
        n = a.shape[0]
        if n < 2:
            return {}, 0, 0
        length, rtype = int(a[0]) * 4, int(a[1])
        if length > 0 and int(self.sizes[rtype]) == length:
            m = n // length
            if m and (m * length == n or not final):
                rows = a[: m * length].reshape(m, length)
                if (rows[:, 0] == a[0]).all() and (rows[:, 1] == a[1]).all():
                    dtype = record_dtype(rtype, self.dbn.version, self.dbn.ts_out)
                    arr = self._filter(rtype, a[: m * length].view(dtype))
                    return ({rtype: arr} if len(arr) else {}), m * length, m
        offs, stop, code = _walk(a, self.sizes, self.min_size)
        if code != _OK:
            raise self._error(code, a, stop, offset, record + len(offs))
        out: dict[int, np.ndarray] = {}
        if len(offs):
            rtypes = a[offs + 1]
            for rt in np.unique(rtypes).tolist():
                dtype = record_dtype(rt, self.dbn.version, self.dbn.ts_out)
                sel = offs[rtypes == rt]
                arr = self._filter(rt, _gather(a, sel, dtype.itemsize).view(dtype))
                if len(arr):
                    out[rt] = arr
        return out, int(stop), len(offs)


def iter_chunks(
    path: str | os.PathLike[str],
    *,
    chunk_bytes: int = 64 << 20,
    instrument_ids: Iterable[int] | None = None,
) -> Iterator[dict[int, np.ndarray]]:
    """Stream the records of a DBN file, ``chunk_bytes`` of decompressed data at a time.

    Parameters
    ----------
    path : str or PathLike
        A ``.dbn`` or ``.dbn.zst`` file, DBN v1, v2 or v3.
    chunk_bytes : int
        Decompressed bytes per chunk (a record cut by a chunk edge goes whole into the next
        chunk, so memory stays bounded whatever the file size).
    instrument_ids : iterable of int, optional
        Keep only market records whose ``instrument_id`` is one of these; symbol-mapping,
        system and error records are always kept.

    Yields
    ------
    dict[int, np.ndarray]
        rtype -> structured array, shape (n,), of that chunk's records of that rtype in file
        order, dtype ``record_dtype(rtype, version, ts_out)`` (prices int64 1e-9 fixed point,
        times uint64 ns since the epoch). rtypes without records in the chunk are absent;
        chunks left without any record are not yielded.

    Raises
    ------
    InputError
        Everything ``open_dbn`` raises; zstd frame cut short (truncated file) or corrupt;
        stream ending inside a record; record length 0, unknown rtype, or length byte
        disagreeing with the rtype's size. Offsets are in the decompressed stream.
    """
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    p, f = _open(path)
    with f:
        src, compressed = _open_source(p, f, chunk_bytes)
        dbn = _read_header(p, src, compressed)
        yield from _iter_records(dbn, src, chunk_bytes, instrument_ids)


def _iter_records(
    dbn: DBNFile,
    src: _PlainSource | _ZstdSource,
    chunk_bytes: int | None,
    instrument_ids: Iterable[int] | None,
) -> Iterator[dict[int, np.ndarray]]:
    """Records after the header; ``chunk_bytes=None`` reads the rest of the stream at once."""
    parser = _Parser(dbn, instrument_ids)
    carry = b""
    offset = dbn.header_size
    record = 0
    while True:
        if chunk_bytes is None:
            buf, final = src.read_all(carry), True
        else:
            buf = src.fill(carry, chunk_bytes)
            final = src.exhausted or len(buf) == len(carry)
        arrays, used, nrec = parser.parse(buf, final, offset, record)
        if arrays:
            yield arrays
        carry = bytes(memoryview(buf)[used:])
        offset += used
        record += nrec
        if final:
            if carry:
                raise InputError(
                    dbn.path,
                    f"stream ends inside a record ({len(carry)} trailing bytes)",
                    offset=offset,
                    record=record,
                )
            break
    if record == 0:
        logger.warning("%s: DBN file holds no records", dbn.path)
    else:
        logger.debug("%s: %d records, %d bytes", dbn.path, record, offset)


def read_dbn(
    path: str | os.PathLike[str], *, instrument_ids: Iterable[int] | None = None
) -> tuple[DBNFile, dict[int, np.ndarray]]:
    """Read a whole DBN file: header and all records, per rtype.

    Parameters
    ----------
    path : str or PathLike
        A ``.dbn`` or ``.dbn.zst`` file, DBN v1, v2 or v3.
    instrument_ids : iterable of int, optional
        As in ``iter_chunks``.

    Returns
    -------
    (DBNFile, dict[int, np.ndarray])
        The header, and rtype -> structured array, shape (n,), of all records of that rtype
        in file order (dtype ``record_dtype(rtype, version, ts_out)``). The rtype of the
        file's schema is always present (possibly empty); other rtypes only when they occur.

    Raises
    ------
    InputError
        As ``iter_chunks``.
    """
    # Without a filter the whole stream is decoded into one growing buffer and viewed in
    # place (one copy of the data, no concatenation); with a filter it goes chunk by chunk so
    # memory stays bounded by the chunk plus what is kept.
    chunk_bytes = None if instrument_ids is None else 64 << 20
    p, f = _open(path)
    with f:
        src, compressed = _open_source(p, f, 64 << 20)
        dbn = _read_header(p, src, compressed)
        parts: dict[int, list[np.ndarray]] = {}
        for chunk in _iter_records(dbn, src, chunk_bytes, instrument_ids):
            for rtype, arr in chunk.items():
                parts.setdefault(rtype, []).append(arr)
    out = {rt: (arrs[0] if len(arrs) == 1 else np.concatenate(arrs)) for rt, arrs in parts.items()}
    if dbn.schema in SCHEMA_RTYPES:
        rt = SCHEMA_RTYPES[dbn.schema]
        if rt not in out and rt in _RTYPE_CLASS:
            out[rt] = np.empty(0, dtype=record_dtype(rt, dbn.version, dbn.ts_out))
    return dbn, out
