"""Streaming reader of Databento DBN files (v1, v2, v3; plain ``.dbn`` or ``.dbn.zst``).

Records come back as numpy structured arrays whose dtypes are exactly the ones that
``databento_dbn`` (and so ``databento.DBNStore.to_ndarray``) uses for the file's DBN version:
prices are int64 in 1e-9 fixed point (``UNDEF_PRICE`` = 2**63-1 when absent), timestamps are
uint64 ns since the UNIX epoch. No Python object is built per record:
a numba loop walks the records of each chunk, checks each ``length`` against its rtype,
tests ``instrument_id`` against the filter and moves the kept records (whole runs at a time)
towards the start of the same reused buffer the chunk was decompressed into
(``stream_reader.readinto``), so nothing leaves the cache; chunks kept whole are not moved
at all. Live data
interleaves symbol-mapping, system and error records with market records: they are split by
rtype and always kept.

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import BinaryIO

import databento_dbn
import numba
import numpy as np
import zstandard
from numba.core import cgutils, types
from numba.extending import intrinsic

from alphafeat.errors import InputError, UsageError
from alphafeat.validation import validate_int
from alphafeat.zstd_frames import is_zstd, zstd_problem

__all__ = [
    "BOOK_SCHEMAS",
    "SCHEMA_RTYPES",
    "DBNFile",
    "RecordScanner",
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
_PREFIX_SIZE = 8  # b"DBN" + version byte + u32 metadata length


def file_identity(path: str | os.PathLike[str]) -> tuple[str, int, int]:
    """``(resolved path, size in bytes, mtime in ns)``: what a kept scan, a kept book and a
    partition's ``sources`` are keyed by (a changed file is read again)."""
    st = os.stat(path)
    return str(Path(path).resolve()), st.st_size, st.st_mtime_ns

#: Decompressed bytes per scanner step. 1 MiB keeps the decompressed chunk and the packed
#: output in the L2/L3 cache while the kept records are copied (4 MiB was slower on a busy
#: synthetic MBP-10 session, ``bench/decode.py``: docs/performance.md).
CHUNK_BYTES = 1 << 20
#: Decompressed bytes per zstd call at most (calls end on its multiples, so the offset of a
#: corrupt block is reported the same whatever the chunk size).
_ZSTD_STEP = 1 << 17


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
    UsageError
        Unknown rtype or unsupported version (a ValueError too).
    """
    if version not in _VERSION_MODULES:
        raise UsageError("version", f"expected a DBN version among {sorted(_VERSION_MODULES)}", version)
    name = _RTYPE_CLASS.get(int(rtype))
    if name is None:
        raise UsageError("rtype", "expected a DBN rtype of a known record", f"0x{int(rtype):02X}")
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
# numba kernel
# --------------------------------------------------------------------------------------

_OK, _ERR_ZERO, _ERR_RTYPE, _ERR_LENGTH = 0, 1, 2, 3


@intrinsic
def _memmove(typingctx, dst, d0, src, s0, nbytes):  # noqa: ARG001 (numba intrinsic signature)
    """``dst[d0:d0+nbytes] = src[s0:s0+nbytes]`` for 1-D uint8 arrays, as one ``llvm.memmove``
    (the ranges may overlap: the scanner compacts kept records within its own buffer).

    A plain element loop is not turned into a library copy by LLVM (the arrays may alias),
    and copies several times slower (docs/performance.md). No bounds check: the caller
    guarantees the ranges.
    """
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)):
        return None
    sig = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        d = context.make_array(signature.args[0])(context, builder, args[0])
        s = context.make_array(signature.args[2])(context, builder, args[2])
        cgutils.raw_memmove(builder, builder.gep(d.data, [args[1]]), builder.gep(s.data, [args[3]]), args[4], 1)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def _scan(
    buf: np.ndarray,
    buf32: np.ndarray,
    n: int,
    sizes: np.ndarray,
    keep_rtype: np.ndarray,
    ids: np.ndarray,
    out: np.ndarray,
    out_rt: np.ndarray,
) -> tuple[int, int, int, int, int]:
    """Walk the records of ``buf[:n]``, copying the kept ones into ``out`` in one pass.

    A record is kept when its rtype is always kept (``keep_rtype[rtype] == 2``) or when the
    filter is off (``ids`` empty) or its ``instrument_id`` (u4 at byte 4; ``buf32`` is the
    uint32 view of ``buf``) is in the sorted ``ids``. Kept records are packed back to back
    into ``out`` (uint8; may be ``buf`` itself, compacted in place: a record only moves
    towards the start), whole runs of consecutive kept records at a time (one memmove
    each); a run that starts at byte 0 and is never broken is not copied at all and
    ``-1`` is returned as the byte count (the kept records are ``buf[:consumed]``).
    ``out_rt[k]`` is the rtype of the k-th kept record. Stops at the first incomplete
    record (error 0) or a bad one (zero length, unknown rtype, length disagreeing with the
    rtype's size).

    Returns (bytes consumed, records walked, records kept, bytes kept or -1, error code).
    """
    pos = 0
    walked = 0
    kept = 0
    opos = 0
    run = -1
    code = _OK
    n_ids = ids.shape[0]
    while pos + 2 <= n:
        length = np.int64(buf[pos]) * 4
        rt = buf[pos + 1]
        expected = sizes[rt]
        if length == 0:
            code = _ERR_ZERO
            break
        if expected == 0:
            code = _ERR_RTYPE
            break
        if expected != length:
            code = _ERR_LENGTH
            break
        if pos + length > n:
            break
        keep = keep_rtype[rt] == 2 or n_ids == 0
        if not keep:
            iid = buf32[(pos >> 2) + 1]
            lo, hi = 0, n_ids
            while lo < hi:
                mid = (lo + hi) // 2
                if ids[mid] < iid:
                    lo = mid + 1
                else:
                    hi = mid
            keep = lo < n_ids and ids[lo] == iid
        if keep:
            if run < 0:
                run = pos
            out_rt[kept] = rt
            kept += 1
        elif run >= 0:
            _memmove(out, opos, buf, run, pos - run)
            opos += pos - run
            run = -1
        walked += 1
        pos += length
    if run >= 0:
        if run == 0 and opos == 0:
            return pos, walked, kept, -1, code
        _memmove(out, opos, buf, run, pos - run)
        opos += pos - run
    return pos, walked, kept, opos, code


@numba.njit(cache=True, nogil=True)
def _one_rtype(out_rt: np.ndarray, kept: int) -> int:
    """The rtype shared by all ``out_rt[:kept]``, or -1 when they differ."""
    rt = out_rt[0]
    for k in range(1, kept):
        if out_rt[k] != rt:
            return -1
    return int(rt)


@numba.njit(cache=True, nogil=True)
def _split(out: np.ndarray, out_rt: np.ndarray, kept: int, sizes: np.ndarray, rt: int) -> np.ndarray:
    """Bytes of the kept records of rtype ``rt`` (of a mixed chunk), packed, in order."""
    size = sizes[rt]
    m = 0
    for k in range(kept):
        if out_rt[k] == rt:
            m += 1
    res = np.empty(m * size, dtype=np.uint8)
    pos = 0
    j = 0
    for k in range(kept):
        s = sizes[out_rt[k]]
        if out_rt[k] == rt:
            res[j : j + s] = out[pos : pos + s]
            j += s
        pos += s
    return res


# --------------------------------------------------------------------------------------
# byte stream
# --------------------------------------------------------------------------------------


class _Stream:
    """Decompressed bytes of a DBN file, read straight into caller buffers.

    zstd data is decoded with ``ZstdDecompressor.stream_reader(...).readinto`` into a reused
    buffer (no allocation per block: about twice the throughput of ``decompressobj`` here);
    a cut file is detected by :func:`~alphafeat.zstd_frames.zstd_problem` and reported when the stream runs dry.
    """

    def __init__(self, path: Path, f: BinaryIO, *, check: bool = True) -> None:
        self.path = path
        self.produced = 0
        size = os.fstat(f.fileno()).st_size
        head = f.read(4)
        f.seek(0)
        if size == 0 or not head:
            raise InputError(path, "empty file (0 bytes), not a DBN file")
        self.compressed = is_zstd(head)
        self._problem: tuple[int, str] | None = None
        if self.compressed:
            self._problem = zstd_problem(f) if check else None
            self._r: BinaryIO = zstandard.ZstdDecompressor().stream_reader(
                f, read_size=1 << 17, read_across_frames=True, closefd=False
            )
        else:
            self._r = f

    def readinto(self, view: memoryview) -> int:
        """Fill ``view``; fewer bytes only at the end of the stream.

        Raises InputError for corrupt zstd data (at the last multiple of ``_ZSTD_STEP``
        decompressed bytes before the bad block, whatever the caller's buffer size), or at
        the end of a cut zstd stream.
        """
        got = 0
        want = len(view)
        while got < want:
            step = want - got
            if self.compressed:  # calls end on multiples of _ZSTD_STEP: error offsets do not depend on len(view)
                step = min(step, _ZSTD_STEP - (self.produced + got) % _ZSTD_STEP)
            try:
                k = self._r.readinto(view[got : got + step])
            except zstandard.ZstdError as e:
                kib = _ZSTD_STEP >> 10
                if "checksum" in str(e):
                    problem = (f"corrupt zstd frame: its content checksum does not match the decompressed data "
                               f"(the frame ends at most {kib} KiB past this offset; every record of it is suspect)")
                else:
                    problem = f"corrupt zstd data ({e}) in a block that starts at most {kib} KiB past this offset"
                raise InputError(self.path, problem, offset=self.produced + got) from None
            if not k:
                break
            got += k
        self.produced += got
        if got < want and self._problem is not None:
            raise InputError(self.path, self._problem[1], offset=self.produced)
        return got

    def read(self, n: int) -> bytes:
        buf = bytearray(n)
        with memoryview(buf) as v:
            k = self.readinto(v)
        return bytes(buf[:k])


def _read_header(path: Path, src: _Stream) -> DBNFile:
    def bad(problem: str, offset: int) -> InputError:  # offsets of what the reader read, as it decided
        return InputError(path, problem, offset=offset, decompressed=src.compressed)

    prefix = src.read(_PREFIX_SIZE)
    if len(prefix) == 0:
        raise bad("no data: the zstd stream decompresses to 0 bytes", 0)
    if not b"DBN".startswith(prefix[:3]):
        kind = "decompressed stream" if src.compressed else "file"
        raise bad(f"not a DBN file: the {kind} starts with {prefix[:4]!r}, not b'DBN'", 0)
    if len(prefix) < _PREFIX_SIZE:
        raise bad(f"stream ends inside the 8-byte DBN prefix ({len(prefix)} bytes)", 0)
    version = prefix[3]
    if version not in _SUPPORTED_VERSIONS:
        raise bad(f"unsupported DBN version {version} (this reader supports 1, 2 and 3)", 3)
    (meta_len,) = struct.unpack_from("<I", prefix, 4)
    body = src.read(meta_len)
    if len(body) < meta_len:
        raise bad(f"stream ends inside the metadata ({len(body)} of its {meta_len} bytes)", _PREFIX_SIZE + len(body))
    try:
        metadata = databento_dbn.Metadata.decode(prefix + body, databento_dbn.VersionUpgradePolicy.AS_IS)
    except Exception as e:  # databento_dbn.DBNError, or anything its decoder raises
        raise bad(f"DBN metadata fails to decode ({e})", _PREFIX_SIZE) from None
    schema = None if metadata.schema is None else str(metadata.schema)
    return DBNFile(
        path=path,
        version=int(version),
        metadata=metadata,
        schema=schema,
        ts_out=bool(metadata.ts_out),
        compressed=src.compressed,
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
        src = _Stream(p, f, check=False)  # only the header is read: a cut tail is found by a full read
        try:
            return _read_header(p, src)
        except InputError:
            problem = zstd_problem(f) if src.compressed else None  # a header cut short: say why
            if problem is None:
                raise
            # the header was not decompressed: where the file itself ends inside the frame
            raise InputError(p, problem[1], offset=problem[0], decompressed=False) from None


def _normalize_ids(instrument_ids: Iterable[int] | None) -> np.ndarray | None:
    if instrument_ids is None:
        return None
    ids = np.unique(np.fromiter((int(i) for i in instrument_ids), dtype=np.int64))
    return ids[(ids >= 0) & (ids <= np.iinfo(np.uint32).max)].astype(np.uint32)


class RecordScanner:
    """Stream a DBN file: decode and filter by ``instrument_id`` in one pass, bounded memory.

    Iterating yields, per chunk of ``chunk_bytes`` decompressed bytes, ``{rtype: records}``
    where ``records`` is a structured array (dtype ``record_dtype(rtype, version, ts_out)``)
    **viewing a buffer reused by the next chunk**: copy or write it out before advancing.
    Memory is two buffers of about ``chunk_bytes`` whatever the file size. No Python object
    is built per record: a numba loop walks the records, checks ``length`` against the
    rtype, tests ``instrument_id`` and copies kept records back to back.

    Parameters
    ----------
    path : str or PathLike
        A ``.dbn`` or ``.dbn.zst`` file, DBN v1, v2 or v3.
    instrument_ids : iterable of int, optional
        Keep only records whose ``instrument_id`` is one of these; error, symbol-mapping and
        system records (rtypes 0x15, 0x16, 0x17) are always kept. None keeps everything.
    chunk_bytes : int
        Decompressed bytes per chunk (default ``CHUNK_BYTES``, 1 MiB, a size that stays in cache).

    Attributes
    ----------
    dbn : DBNFile
        The header, read on construction.
    records : int
        Records walked so far (all rtypes, before filtering).
    offset : int
        Decompressed stream offset reached so far (bytes).

    Raises
    ------
    InputError
        On construction: everything ``open_dbn`` raises. While iterating: zstd data corrupt
        or cut short; stream ending inside a record; record length 0, unknown rtype, or a
        length byte disagreeing with the rtype's size. ``offset`` is in the decompressed
        stream, ``record`` the index of the bad record.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        instrument_ids: Iterable[int] | None = None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        chunk_bytes = validate_int(chunk_bytes, "chunk_bytes", lo=1)
        self.path, self._f = _open(path)
        try:
            self._src = _Stream(self.path, self._f)
            self.dbn = _read_header(self.path, self._src)
        except BaseException:
            self._f.close()
            raise
        self.chunk_bytes = int(chunk_bytes)
        self.sizes = _size_table(self.dbn.version, self.dbn.ts_out)
        ids = _normalize_ids(instrument_ids)
        self._ids = np.empty(0, dtype=np.uint32) if ids is None else ids
        self._filter_off = ids is None
        keep = np.zeros(256, dtype=np.uint8)
        keep[self.sizes > 0] = 1
        keep[list(_ALWAYS_KEPT)] = 2
        self._keep = keep
        self.records = 0
        self.offset = self.dbn.header_size

    def close(self) -> None:
        """Close the file (iteration to the end closes it too)."""
        self._f.close()

    def __enter__(self) -> RecordScanner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _error(self, code: int, a: np.ndarray, pos: int) -> InputError:
        length, rtype = int(a[pos]), int(a[pos + 1])
        where = {"offset": self.offset + pos, "record": self.records}
        if code == _ERR_ZERO:
            return InputError(self.path, f"record length 0 (rtype 0x{rtype:02X})", **where)
        if code == _ERR_RTYPE:
            return InputError(self.path, f"unknown record type rtype 0x{rtype:02X} (length byte {length})", **where)
        expected = int(self.sizes[rtype])
        ts = " with ts_out" if self.dbn.ts_out else ""
        return InputError(
            self.path,
            f"record length {length * 4} bytes (length byte {length}) disagrees with the "
            f"{expected} bytes of rtype 0x{rtype:02X} ({_RTYPE_CLASS[rtype]}) in DBN "
            f"v{self.dbn.version}{ts}",
            **where,
        )

    def __iter__(self) -> Iterator[dict[int, np.ndarray]]:
        try:
            yield from self._chunks()
        finally:
            self._f.close()

    def _chunks(self) -> Iterator[dict[int, np.ndarray]]:
        """Two buffers in turn: a thread decompresses the next chunk into one (zstd releases the
        GIL) while the chunk in the other is scanned and handed out. Each buffer holds up to one
        record's bytes of head room before its data, where the tail of the chunk before (a
        record cut by the chunk edge) is copied so that the records stay contiguous."""
        max_rec = int(self.sizes.max())
        head = (max_rec + 7) // 8 * 8
        cap = (head + self.chunk_bytes + 15) // 8 * 8
        bufs = [np.empty(cap, dtype=np.uint8) for _ in range(2)]
        views = [memoryview(b)[head : head + self.chunk_bytes] for b in bufs]
        out_rt = np.empty(cap // int(self.sizes[self.sizes > 0].min()) + 1, dtype=np.uint8)
        ids = np.empty(0, dtype=np.uint32) if self._filter_off else self._ids
        version, ts_out = self.dbn.version, self.dbn.ts_out
        reader = ThreadPoolExecutor(1)
        try:
            pending = reader.submit(self._src.readinto, views[0])
            carry, k = 0, 0
            while True:
                got = pending.result()  # the reader's error (corrupt or cut data) is raised here
                final = got < self.chunk_bytes
                buf = bufs[k]
                if not final:  # the other buffer's chunk is no longer read: fill it next
                    pending = reader.submit(self._src.readinto, views[1 - k])
                n = carry + got
                b8 = buf[head - carry : head - carry + (n + 7) // 8 * 8]  # whole words
                used, walked, kept, nbytes, code = _scan(b8, b8.view(np.uint32), n, self.sizes, self._keep, ids,
                                                         b8, out_rt)  # fmt: skip
                nbytes = used if nbytes < 0 else nbytes  # < 0: every record kept, in place
                if code != _OK:
                    self.records += walked
                    raise self._error(code, b8, used)
                if kept:
                    rt = _one_rtype(out_rt, kept)
                    if rt >= 0:
                        chunk = {rt: b8[:nbytes].view(record_dtype(rt, version, ts_out))}
                    else:
                        rts = np.unique(out_rt[:kept])
                        chunk = {
                            int(rt): _split(b8, out_rt, kept, self.sizes, int(rt)).view(
                                record_dtype(int(rt), version, ts_out)
                            )
                            for rt in rts
                        }
                    yield chunk
                self.records += walked
                self.offset += used
                carry = n - used
                if final:
                    if carry:
                        raise InputError(
                            self.path,
                            f"stream ends inside a record ({carry} trailing bytes)",
                            offset=self.offset,
                            record=self.records,
                        )
                    break
                # the cut record goes before the next chunk (head room the reader does not touch)
                bufs[1 - k][head - carry : head] = buf[head + got - carry : head + got]
                k = 1 - k
        finally:
            reader.shutdown(cancel_futures=True)
            for v in views:
                v.release()
        if self.records == 0:
            logger.warning("%s: DBN file holds no records", self.path)
        else:
            logger.debug("%s: %d records, %d bytes", self.path, self.records, self.offset)


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
        times uint64 ns since the epoch); each array owns its memory (unlike
        :class:`RecordScanner`). Chunks left without any record are not yielded.

    Raises
    ------
    InputError
        As :class:`RecordScanner`.
    """
    scanner = RecordScanner(path, instrument_ids=instrument_ids, chunk_bytes=chunk_bytes)
    for chunk in scanner:
        yield {rt: arr.copy() for rt, arr in chunk.items()}


def read_dbn(
    path: str | os.PathLike[str],
    *,
    instrument_ids: Iterable[int] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[DBNFile, dict[int, np.ndarray]]:
    """Read a whole DBN file: header and all (kept) records, per rtype, in memory.

    For files larger than memory use :class:`RecordScanner` or
    :func:`alphafeat.precompute.books.build_book` (one instrument of one session, chunk by chunk).

    Parameters
    ----------
    path : str or PathLike
        A ``.dbn`` or ``.dbn.zst`` file, DBN v1, v2 or v3.
    instrument_ids : iterable of int, optional
        As in ``iter_chunks``.
    chunk_bytes : int
        Decompressed bytes per step.

    Returns
    -------
    (DBNFile, dict[int, np.ndarray])
        The header, and rtype -> structured array, shape (n,), of all records of that rtype
        in file order (dtype ``record_dtype(rtype, version, ts_out)``). The rtype of the
        file's schema is always present (possibly empty); other rtypes only when they occur.

    Raises
    ------
    InputError
        As :class:`RecordScanner`.
    """
    scanner = RecordScanner(path, instrument_ids=instrument_ids, chunk_bytes=chunk_bytes)
    parts: dict[int, list[np.ndarray]] = {}
    for chunk in scanner:
        for rtype, arr in chunk.items():
            parts.setdefault(rtype, []).append(arr.copy())
    dbn = scanner.dbn
    out = {rt: (arrs[0] if len(arrs) == 1 else np.concatenate(arrs)) for rt, arrs in parts.items()}
    if dbn.schema in SCHEMA_RTYPES:
        rt = SCHEMA_RTYPES[dbn.schema]
        if rt not in out and rt in _RTYPE_CLASS:
            out[rt] = np.empty(0, dtype=record_dtype(rt, dbn.version, dbn.ts_out))
    return dbn, out
