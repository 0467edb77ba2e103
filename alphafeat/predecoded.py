"""Predecoded cache: the filtered records of each DBN source file, kept on disk as ``.npy``.

The first read of a file decodes it with :class:`alphafeat.dbn.RecordScanner` and streams
the kept records of each rtype straight into a ``.npy`` file (memory stays bounded by the
scanner's chunk, whatever the file size); later reads memory-map those files
(``np.load(mmap_mode="r")``) instead of decompressing again.

Layout
    ``<cache_dir>/<key>/manifest.json`` and ``<cache_dir>/<key>/rtype_XX.npy`` (one per
    rtype present, e.g. ``rtype_0A.npy`` for MBP-10), where ``key`` is the SHA-256 (first 32
    hex digits) of the source's resolved path, size in bytes, modification time (ns), the
    predecoded :data:`FORMAT_VERSION` and the instrument selection (sorted ids, or all).
    A changed source (size or mtime) or format version gives another key, so a stale
    entry is never read; ``clear`` removes them all (``--rebuild-predecoded``).

Default location (:func:`default_cache_dir`)
    ``<parent of the cache output dir>/.predecoded`` when an output dir is known, else
    ``$XDG_CACHE_HOME/alphafeat/predecoded`` (``~/.cache/alphafeat/predecoded``).

Atomicity
    An entry is written into ``<key>.tmp-<pid>-<random>`` and renamed to ``<key>`` only when
    complete (the manifest last), so a crash or an error leaves no entry that looks valid;
    a concurrent writer of the same key loses the rename race harmlessly.

Each ``.npy`` holds a 1-D structured array with the dtype of
:func:`alphafeat.dbn.record_dtype` (prices int64 1e-9 fixed point, times uint64 ns).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from alphafeat.dbn import CHUNK_BYTES, SCHEMA_RTYPES, RecordScanner, record_dtype

__all__ = [
    "FORMAT_VERSION",
    "Predecoded",
    "cache_key",
    "clear",
    "decode_to_cache",
    "default_cache_dir",
    "load",
    "read_predecoded",
]

log = logging.getLogger(__name__)

#: Version of the predecoded layout; bump it to invalidate every existing entry.
FORMAT_VERSION = 1

_NPY_MAGIC = b"\x93NUMPY\x01\x00"


@dataclass
class Predecoded:
    """The filtered records of one source file, from the predecoded cache.

    Attributes
    ----------
    source : Path
        The DBN file they come from.
    entry : Path
        The cache entry directory.
    version : int
        DBN version of the source (the record layouts of ``arrays``).
    schema : str or None
        Schema in the source's metadata (None for mixed live data).
    ts_out : bool
        Whether records carry a trailing ``ts_out``.
    records : int
        Records in the source file (all instruments, before filtering).
    arrays : dict[int, np.ndarray]
        rtype -> read-only memory-mapped structured array, shape (n,), in file order. The
        rtype of the source's schema is always present (possibly empty).
    from_cache : bool
        True when read from an existing entry (warm), False when just decoded (cold).
    """

    source: Path
    entry: Path
    version: int
    schema: str | None
    ts_out: bool
    records: int
    arrays: dict[int, np.ndarray]
    from_cache: bool


def default_cache_dir(out: str | os.PathLike[str] | None = None) -> Path:
    """``<parent of out>/.predecoded`` when ``out`` is given, else the user cache dir."""
    if out is not None:
        return Path(out).resolve().parent / ".predecoded"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "alphafeat" / "predecoded"


def _ids_key(instrument_ids: Iterable[int] | None) -> list[int] | str:
    return "all" if instrument_ids is None else sorted({int(i) for i in instrument_ids})


def cache_key(path: str | os.PathLike[str], instrument_ids: Iterable[int] | None = None) -> str:
    """Key of a source file's entry: hash of path, size, mtime_ns, format version, selection.

    Raises
    ------
    OSError
        When the source cannot be ``stat``-ed.
    """
    p = Path(path).resolve()
    st = p.stat()
    ident = {
        "path": str(p),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "format_version": FORMAT_VERSION,
        "instrument_ids": _ids_key(instrument_ids),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


def clear(cache_dir: str | os.PathLike[str]) -> int:
    """Remove every entry (and leftover temporary directory) of ``cache_dir``; returns how many."""
    d = Path(cache_dir)
    if not d.is_dir():
        return 0
    n = 0
    for child in d.iterdir():
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
            n += 1
    log.info("cleared %d predecoded entries in %s", n, d)
    return n


def _npy_header(dtype: np.dtype, n: int, reserve: int | None = None) -> bytes:
    """A .npy v1.0 header for a 1-D array of ``n`` records, padded to ``reserve`` bytes."""
    d = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)}
    text = repr(d).encode("latin1")
    size = reserve if reserve is not None else -(-(len(_NPY_MAGIC) + 2 + len(text) + 1) // 64) * 64
    pad = size - (len(_NPY_MAGIC) + 2 + len(text) + 1)
    if pad < 0:
        raise ValueError("npy header does not fit its reserved space")
    return _NPY_MAGIC + struct.pack("<H", size - len(_NPY_MAGIC) - 2) + text + b" " * pad + b"\n"


class _NpyWriter:
    """Appends records of one dtype to a .npy file; the header is fixed up on close."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path = path
        self.dtype = dtype
        self.n = 0
        self.reserve = len(_npy_header(dtype, 10**15))
        self.f = open(path, "wb")  # closed in close()
        self.f.write(b"\0" * self.reserve)

    def write(self, arr: np.ndarray) -> None:
        self.f.write(memoryview(np.ascontiguousarray(arr)).cast("B"))
        self.n += len(arr)

    def close(self) -> None:
        self.f.seek(0)
        self.f.write(_npy_header(self.dtype, self.n, self.reserve))
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()


def _open_entry(entry: Path, source: Path, from_cache: bool) -> Predecoded:
    man = json.loads((entry / "manifest.json").read_text())
    arrays = {}
    for rt_hex, info in man["arrays"].items():
        arr = np.load(entry / info["file"], mmap_mode="r") if info["count"] else None
        if arr is None:
            arr = np.empty(0, dtype=record_dtype(int(rt_hex, 16), man["version"], man["ts_out"]))
        arrays[int(rt_hex, 16)] = arr
    return Predecoded(
        source=source,
        entry=entry,
        version=man["version"],
        schema=man["schema"],
        ts_out=man["ts_out"],
        records=man["records"],
        arrays=arrays,
        from_cache=from_cache,
    )


def load(
    cache_dir: str | os.PathLike[str], path: str | os.PathLike[str], instrument_ids: Iterable[int] | None = None
) -> Predecoded | None:
    """The cached records of ``path`` for this selection, or None when there is no valid entry."""
    try:
        key = cache_key(path, instrument_ids)
    except OSError:
        return None
    entry = Path(cache_dir) / key
    if not (entry / "manifest.json").is_file():
        return None
    try:
        pre = _open_entry(entry, Path(path), from_cache=True)
    except (OSError, ValueError, KeyError) as e:
        log.warning("%s: unreadable predecoded entry %s (%s); decoding again", path, entry, e)
        shutil.rmtree(entry, ignore_errors=True)
        return None
    log.debug("%s: predecoded entry %s", path, entry)
    return pre


def decode_to_cache(
    path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str],
    instrument_ids: Iterable[int] | None = None,
    *,
    chunk_bytes: int = CHUNK_BYTES,
) -> Predecoded:
    """Decode ``path`` (filtered) into a new cache entry and return it memory-mapped.

    Peak memory is the scanner's two chunk buffers: records go to disk as they are decoded.

    Parameters
    ----------
    path : str or PathLike
        A ``.dbn`` / ``.dbn.zst`` file.
    cache_dir : str or PathLike
        Cache root (created when missing).
    instrument_ids : iterable of int, optional
        Selection as in :class:`alphafeat.dbn.RecordScanner`; part of the key.
    chunk_bytes : int
        Decompressed bytes per step.

    Returns
    -------
    Predecoded
        With ``from_cache=False``.

    Raises
    ------
    InputError
        Whatever :class:`alphafeat.dbn.RecordScanner` raises (nothing is left in the cache).
    """
    ids = None if instrument_ids is None else sorted({int(i) for i in instrument_ids})
    src = Path(path)
    key = cache_key(src, ids)
    st = src.stat()
    root = Path(cache_dir)
    created = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{key}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    writers: dict[int, _NpyWriter] = {}
    try:
        scanner = RecordScanner(src, instrument_ids=ids, chunk_bytes=chunk_bytes)
        dbn = scanner.dbn
        for chunk in scanner:
            for rt, arr in chunk.items():
                w = writers.get(rt)
                if w is None:
                    w = writers[rt] = _NpyWriter(tmp / f"rtype_{rt:02X}.npy", arr.dtype)
                w.write(arr)
        if dbn.schema in SCHEMA_RTYPES and SCHEMA_RTYPES[dbn.schema] not in writers:
            rt = SCHEMA_RTYPES[dbn.schema]
            writers[rt] = _NpyWriter(tmp / f"rtype_{rt:02X}.npy", record_dtype(rt, dbn.version, dbn.ts_out))
        for w in writers.values():
            w.close()
        manifest = {
            "format_version": FORMAT_VERSION,
            "source": {"path": str(src.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns},
            "instrument_ids": _ids_key(ids),
            "version": dbn.version,
            "schema": dbn.schema,
            "ts_out": dbn.ts_out,
            "header_size": dbn.header_size,
            "records": scanner.records,
            "arrays": {f"{rt:02X}": {"file": w.path.name, "count": w.n} for rt, w in writers.items()},
        }
        with open(tmp / "manifest.json.tmp", "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp / "manifest.json.tmp", tmp / "manifest.json")
        now = src.stat()
        if (now.st_size, now.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            log.warning("%s changed while it was decoded; not cached", src)
            return _open_entry(tmp, src, from_cache=False)  # tmp stays until the next clear
        entry = root / key
        try:
            os.rename(tmp, entry)
        except OSError:  # another process stored the same key first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        return _open_entry(entry, src, from_cache=False)
    except BaseException:
        for w in writers.values():
            if not w.f.closed:
                w.f.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if created:  # a cache folder this call made and nothing else filled: gone too
            with contextlib.suppress(OSError):
                root.rmdir()
        raise


def read_predecoded(
    path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str],
    instrument_ids: Iterable[int] | None = None,
    *,
    chunk_bytes: int = CHUNK_BYTES,
) -> Predecoded:
    """:func:`load` when a valid entry exists (warm), else :func:`decode_to_cache` (cold)."""
    return load(cache_dir, path, instrument_ids) or decode_to_cache(
        path, cache_dir, instrument_ids, chunk_bytes=chunk_bytes
    )
