"""The feature/label cache: a Hive-partitioned directory of Arrow IPC files.

Layout::

    OUT/_alphafeat.json                              manifest: columns, parameters, schedule, sources
    OUT/root=ES/session=2024-03-06/ESH4.arrow        one file per kept instrument and session
    OUT/.alphafeat.lock                              held while a run writes
    OUT/.predecoded/                                 kept books and plan scans (default place)

Files are uncompressed Arrow IPC (memory-mappable); each file's schema metadata holds, under
the key ``alphafeat``, a JSON document with the columns (unit, meaning, source), the
parameters, the format and package versions, the instrument chosen for its session, the
roll schedule up to its session, the source files it was computed from (path, size, mtime)
and a ``fingerprint`` of all of these. ``pyarrow.dataset``, pandas, polars and duckdb open the
directory without project code (``pyarrow.dataset`` skips names starting with ``_`` or ``.``).

Writing (:class:`CacheWriter`)
    * A run takes an exclusive ``flock`` on ``OUT/.alphafeat.lock``: a second run on the same
      cache waits for the first, then finds its partitions current and skips them.
    * A partition whose file already carries the same fingerprint is skipped (rerun of an
      unchanged input). New partitions are written to ``OUT/.staging-*`` (named ``*.arrow.part``,
      :func:`staged_path`) and moved into place
      at commit (``os.replace``; over an existing partition an atomic swap of the names,
      :func:`move_into_place`) and the manifest is replaced atomically. An interrupted run
      (error, Ctrl-C, kill) leaves the previous cache as it was; its staging directory is
      removed by the next run. A partition replaced or deleted at commit is first opened and
      its descriptor handed to a detached ``sleep`` (:func:`_free_later`): its name goes at
      once, and the file system frees its blocks when that process exits a few seconds later,
      so the command does not wait for it (0.35-0.7 s per 0.9 GB partition on ext4); nothing of
      it is left to see in ``OUT``.
    * Nothing is deleted quietly (:meth:`CacheWriter.others`): partitions of sessions this run
      does not compute (a rerun with fewer inputs) are kept when computed with the same
      options, and the manifest lists them under ``earlier_partitions``; a partition of a
      session this run recomputes for another instrument is replaced (listed under
      ``replaced``); partitions computed with other options are refused with one line unless
      ``prune`` (``--prune``) deletes them (listed under ``pruned``).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import json
import logging
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from alphafeat.errors import CacheError

if TYPE_CHECKING:  # pyarrow is imported where it is used: a run decodes its first records without it
    import pyarrow as pa
    import pyarrow.dataset as pads

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
MANIFEST = "_alphafeat.json"
LOCK = ".alphafeat.lock"
META_KEY = b"alphafeat"


def partition_metadata(path: str | os.PathLike[str]) -> dict | None:
    """The ``alphafeat`` schema metadata of one partition file, or None if unreadable."""
    if not os.path.isfile(path):  # none there (a cold run's every partition): pyarrow not needed yet
        return None
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as src:
            meta = pa.ipc.open_file(src).schema.metadata or {}
        return json.loads(meta[META_KEY])
    except (OSError, KeyError, ValueError, pa.ArrowException):
        return None


#: Suffix of a staged partition's name until the commit moves it into place (``ESH4.arrow.part``):
#: a glob over the cache for ``*.arrow`` (polars' ``**`` enters hidden folders) never reads a
#: staged or half-written partition that a hard-killed run left in its ``.staging-*`` folder.
STAGED_SUFFIX = ".part"


def staged_path(staging: str | os.PathLike[str], relpath: str) -> Path:
    """Where the partition ``relpath`` is written in the staging folder ``staging``."""
    return Path(staging) / (relpath + STAGED_SUFFIX)


def write_partition(path: str | os.PathLike[str], table: pa.Table, metadata: dict, compression: str = "none") -> None:
    """Write ``table`` as an Arrow IPC file at ``path`` (parents created) with ``metadata``
    (JSON-able) under the schema key ``alphafeat``; ``compression`` none, lz4 or zstd. Used for
    staged files only: the rename into the cache is :meth:`CacheWriter.commit`'s.

    Raises
    ------
    AlphafeatError
        The file system refused the write (disk full: the bytes needed); the partial file is
        removed.
    """
    import pyarrow as pa

    path = Path(path)
    meta = dict(table.schema.metadata or {})
    meta[META_KEY] = json.dumps(metadata, sort_keys=True).encode()
    table = table.replace_schema_metadata(meta)
    opts = pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_ipc(path, table, opts)
    except OSError as e:  # pyarrow's write errors are OSErrors too
        path.unlink(missing_ok=True)
        raise disk_error(path, e, table.nbytes) from None


def _write_ipc(path: Path, table: pa.Table, options: pa.ipc.IpcWriteOptions) -> None:
    """Write ``table`` as an IPC file at ``path``; uncompressed, into blocks allocated first
    (:func:`_preallocate`), the file then cut to what was written."""
    import pyarrow as pa

    with open(path, "wb", buffering=0) as fh, pa.PythonFile(fh, mode="w") as sink:
        bound = 0 if options.compression else table.nbytes + _IPC_SLACK
        if bound:
            _preallocate(fh.fileno(), bound)
        with pa.ipc.new_file(sink, table.schema, options=options) as w:
            w.write_table(table)
        if bound:
            os.ftruncate(fh.fileno(), sink.tell())


#: Bytes an uncompressed IPC file holds beyond its table's buffers, at most assumed: schema,
#: metadata, padding and footer (a bound too small only leaves the rest to be allocated as written).
_IPC_SLACK = 4 << 20


def _preallocate(fd: int, size: int) -> None:
    """Allocate ``size`` bytes of the file ``fd`` before it is written (``fallocate(2)``): ext4
    then writes into blocks it has, instead of reserving each block as it is written (a large
    partition is written faster so: docs/performance.md). Nothing where the file system or the C
    library has no ``fallocate`` (no emulation by writing zeros, as ``posix_fallocate`` does
    there); a full disk is raised as the write would raise it."""
    fallocate = _libc("fallocate")
    if fallocate is None or fallocate(fd, 0, ctypes.c_int64(0), ctypes.c_int64(size)) == 0:
        return
    err = ctypes.get_errno()
    if err == errno.ENOSPC:
        raise OSError(err, os.strerror(err))


def check_folder(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` is, or can be made, a folder this process may write; returns it
    resolved. Used before any work for the cache and the predecoded folder.

    Raises
    ------
    CacheError
        ``path`` is a regular file; or lies below one; or it (or its nearest existing folder)
        is not writable (a folder made there and removed at once, as permission bits do not
        tell a read-only mount).
    """
    path = Path(path).resolve()
    if path.exists() and not path.is_dir():
        raise CacheError(path, "is a file, not a folder")
    base = path
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        raise CacheError(path, f"cannot be made: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise CacheError(path, f"cannot be written: no write permission on {base}")
    probe = base / f".alphafeat-probe-{uuid.uuid4().hex[:8]}"  # what the permission bits do not say
    try:  # (a read-only mount, /sys or /proc, root's access to anything)
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        raise CacheError(path, f"cannot be written: making a folder in {base} failed ({e.strerror or e})") from None
    return path


def check_out(out: str | os.PathLike[str]) -> Path:
    """Check, before any work, that a cache can be written at ``out``; returns it resolved.

    Raises
    ------
    CacheError
        ``out`` is a folder that is neither empty nor an alphafeat cache (we never delete a
        folder we did not write; its predecoded folder alone, :data:`PREDECODED_NAME`, left by
        an earlier run that failed or by ``roll-schedule --out``, does not count); or as
        :func:`check_folder`.
    """
    path = check_folder(out)
    if path.exists() and not is_cache(path) and any(p.name != PREDECODED_NAME for p in path.iterdir()):
        raise CacheError(path, "a folder that is not empty and not an alphafeat cache; refusing to overwrite it")
    return path


class CacheWriter:
    """Stage partitions, then swap them into ``out`` at :meth:`commit` (rules in the module doc).

    Use as a context manager; leaving the block without committing removes the staging
    directory and leaves ``out`` as it was.

    Raises
    ------
    CacheError
        When ``out`` exists and is neither empty nor an alphafeat cache (we never delete a
        directory we did not write).
    """

    def __init__(self, out: str | os.PathLike[str], prune: bool = False) -> None:
        self.out = check_out(out)
        self.prune = prune
        self.drop: list[str] = []
        self.earlier: list[str] = []
        self._created = not self.out.exists()
        self.out.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.out / LOCK, "a+")  # noqa: SIM115 (held until commit/abort)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("%s: another run is writing this cache; waiting for it", self.out)
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        for stale in self.out.glob(".staging-*"):
            shutil.rmtree(stale, ignore_errors=True)
        self.staging = self.out / f".staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.staging.mkdir()
        self.written: list[str] = []
        self.kept: list[str] = []
        self._done = False

    def current(self, relpath: str, fingerprint: str, meta: dict | None) -> bool:
        """True (and the file is kept) when ``meta``, the metadata of ``out/relpath``
        (:func:`partition_metadata`; None: no readable partition there), has this fingerprint."""
        if meta is not None and meta.get("fingerprint") == fingerprint:
            self.kept.append(relpath)
            return True
        return False

    def others(self, relpaths: Sequence[str], sessions: set[str], common: dict) -> dict[str, list[str]]:
        """Decide what becomes of the partitions already in the cache that this run does not
        produce (``relpaths``: this run's; ``sessions``: its ISO session dates; ``common``: the
        options every partition's metadata carries). Returns ``{"earlier": kept from an earlier
        run, "replaced": sessions recomputed for another instrument, "pruned": deleted by
        prune}``; the deletions happen at :meth:`commit`.

        Raises
        ------
        AlphafeatError
            Without ``prune``, when partitions of other sessions were computed with other
            options (they would be mixed in): one line naming how many and the first.
        """
        ours = set(relpaths)
        want = json.loads(json.dumps({k: common.get(k) for k in _SAME_OPTIONS}))  # as the files hold it
        out: dict[str, list[str]] = {"earlier": [], "replaced": [], "pruned": []}
        other_opts = []
        for f in sorted(self.out.rglob("*.arrow")):
            rel = str(f.relative_to(self.out))
            if rel in ours or any(p.name.startswith(".") for p in f.relative_to(self.out).parents):
                continue
            meta = partition_metadata(f) or {}
            if self.prune:
                out["pruned"].append(rel)
            elif meta.get("session") in sessions:
                out["replaced"].append(rel)
            elif any(meta.get(k) != want[k] for k in _SAME_OPTIONS):
                other_opts.append(rel)
            else:
                out["earlier"].append(rel)
        if other_opts:
            raise CacheError(
                self.out, f"holds {len(other_opts)} partition(s) of sessions not in this run computed with other "
                f"options (first: {other_opts[0]}); keeping them would mix two kinds of rows and nothing is deleted "
                "quietly: pass --prune to delete them, or write to another --out"
            )
        self.drop = out["replaced"] + out["pruned"]
        self.earlier = out["earlier"]
        return out

    def write(self, relpath: str, table: pa.Table, metadata: dict) -> Path:
        """Stage ``table`` for ``relpath`` with ``metadata`` (JSON-able) in its schema."""
        write_partition(staged_path(self.staging, relpath), table, metadata)
        return self.staged(relpath)

    def staged(self, relpath: str) -> Path:
        """Record ``relpath`` as staged: another process wrote :func:`staged_path` with
        :func:`write_partition`. Returns its final path (valid after :meth:`commit`)."""
        path = staged_path(self.staging, relpath)
        if not path.is_file():
            raise CacheError(path, "partition was not staged")
        self.written.append(relpath)
        return self.out / relpath

    def commit(self, manifest: dict) -> None:
        """Move staged partitions into place, delete those :meth:`others` decided to drop,
        write the manifest."""
        missing = [r for r in self.written if not staged_path(self.staging, r).is_file()]
        if missing:  # checked before anything moves: a failed commit leaves the cache as it was
            raise CacheError(staged_path(self.staging, missing[0]),
                             "staged partition is missing; the cache is unchanged")
        tmp = self.out / f".{MANIFEST}.tmp"
        write_text(tmp, json.dumps(manifest, indent=1, sort_keys=True))  # disk full fails here, before any move
        live = {self.out / r for r in self.written + self.kept + self.earlier}
        gone = [self.out / r for r in self.written] + [f for f in (self.out / r for r in self.drop) if f not in live]
        _free_later(gone)  # their blocks are freed by another process, not in the moves below
        for rel in self.written:
            dst = self.out / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            move_into_place(staged_path(self.staging, rel), dst)
        for rel in self.drop:
            f = self.out / rel
            if f not in live and f.is_file():
                f.unlink()
        if self.drop:  # the folders they leave empty go too
            for d in sorted((p for p in self.out.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                if not d.name.startswith(".") and not any(d.iterdir()):
                    d.rmdir()
        os.replace(tmp, self.out / MANIFEST)
        self._finish()

    def abort(self) -> None:
        """Remove the staging directory (and ``out`` itself if this run created it empty)."""
        self._finish()
        if self._created and not any(p for p in self.out.iterdir() if p.name != LOCK):
            shutil.rmtree(self.out, ignore_errors=True)

    def _finish(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        if not self._lock.closed:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
        self._done = True

    def __enter__(self) -> CacheWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._done:
            self.abort()


#: ``renameat2``'s flag: swap two names atomically (Linux 3.15, ext4, xfs, btrfs, tmpfs).
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def move_into_place(src: Path, dst: Path) -> None:
    """``os.replace(src, dst)``; where ``dst`` exists, as an atomic swap of the two names
    (``renameat2(RENAME_EXCHANGE)``; the old file is then at ``src``, in the staging folder
    that goes at the end of the commit). ext4 (its default ``auto_da_alloc``) starts writing a
    file back when it is renamed over another one, in the rename (a tenth of a rerun that adds
    features: docs/performance.md); a swap does not, so the
    replaced partition is left to the kernel's writeback like a new one. Where the swap is not
    available (no ``renameat2`` in the C library, a file system that refuses it), a replace."""
    swap = _libc("renameat2")
    if swap is not None and dst.exists():
        if swap(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_EXCHANGE) == 0:
            return
    os.replace(src, dst)


@functools.cache
def _libc(name: str) -> Callable[..., int] | None:
    """Function ``name`` of the C library (``renameat2``: glibc 2.28, musl 1.2.2;
    ``fallocate``), setting ``errno``; None where it has none."""
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name, None)
    except OSError:
        return None


def _free_later(paths: Sequence[Path]) -> None:
    """Hand open descriptors of the files among ``paths`` (partitions about to be replaced or
    deleted) to a detached ``sleep`` of a few seconds, and close ours. Their names then go at
    once (``os.replace``, ``unlink``) and the file system frees their blocks when that process
    exits, not in this one: an unlink of a large partition on ext4 took a third of a rerun that
    adds features (docs/performance.md). Nothing is left in the cache to see; the space shows
    in ``df`` until then. Where no process can be started the unlink pays as before."""
    fds = []
    for p in paths:
        try:
            fds.append(os.open(p, os.O_RDONLY))
        except OSError:  # not there (a new partition): nothing to free
            pass
    if not fds:
        return
    try:  # sh exits at once; its background sleep, inheriting the descriptors, outlives this process
        subprocess.run(["sh", "-c", "sleep 5 &"], pass_fds=fds, start_new_session=True, check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError):
        pass
    finally:
        for fd in fds:
            os.close(fd)


#: Partition metadata that must agree for partitions of two runs to share a cache.
_SAME_OPTIONS = ("format_version", "instrument_mode", "root", "params", "columns")


def disk_error(path: str | os.PathLike[str], e: OSError, need: int | None = None) -> CacheError:
    """One line for a write that the file system refused: the path, the reason, and for a full
    disk (ENOSPC) the bytes needed when known and the bytes free there."""
    why = e.strerror or str(e)
    if e.errno == errno.ENOSPC or "No space left" in str(e):
        why = "disk full (ENOSPC)"
        if need is not None:
            why += f": about {need:,} bytes needed"
        try:
            base = Path(path)
            while not base.exists():
                base = base.parent
            why += f", {shutil.disk_usage(base).free:,} free there"
        except OSError:
            pass
    return CacheError(path, f"cannot write: {why}; nothing of it was kept")


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path``; a refused write (disk full, ...) removes what was written and
    raises :func:`disk_error`'s AlphafeatError."""
    try:
        path.write_text(text)
    except OSError as e:
        path.unlink(missing_ok=True)
        raise disk_error(path, e, len(text.encode())) from None


def is_cache(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a directory holding an alphafeat manifest or lock file."""
    return (Path(path) / MANIFEST).is_file() or (Path(path) / LOCK).is_file()


def read_manifest(path: str | os.PathLike[str]) -> dict:
    """The cache's manifest (columns, parameters, schedule, sources).

    Raises
    ------
    CacheError
        If ``path`` is not an alphafeat cache or its format version is not this one.
    """
    p = Path(path) / MANIFEST
    if not Path(path).exists():
        raise CacheError(path, "no such folder")
    if not Path(path).is_dir():
        raise CacheError(path, "is a file, not a cache directory")
    if not p.is_file():
        raise CacheError(path, f"not an alphafeat cache (no {MANIFEST})")
    try:
        manifest = json.loads(p.read_text())
    except ValueError as e:
        raise CacheError(p, f"not a readable manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        manifest = manifest if isinstance(manifest, dict) else {}
        raise CacheError(
            path,
            f"cache format version {manifest.get('format_version')} was written by an older "
            f"alphafeat ({manifest.get('package_version', '?')}); this one reads version {FORMAT_VERSION}: "
            "rerun alphafeat precompute with the same --out to rebuild it"
        )
    return manifest


#: The predecoded folder's name inside a cache (its default place: ``<cache>/.predecoded``).
PREDECODED_NAME = ".predecoded"
#: What a predecoded folder holds (:mod:`alphafeat.segment`, :mod:`alphafeat.plan`): a folder
#: holding anything else is not removed by :func:`clean_cache`.
PREDECODED_ENTRIES = frozenset({"book", "plan", "survey"})
#: Manifest key of the predecoded folder a run used (absolute path).
PREDECODED_KEY = "predecoded_dir"


def clean_cache(path: str | os.PathLike[str], keep_predecoded: bool = False) -> list[Path]:
    """Remove the cache at ``path`` and its kept books; returns the folders removed.

    The predecoded folder the manifest names (:data:`PREDECODED_KEY`: where the run kept its
    books and plan scans; relative to the cache when inside it) goes too: inside the cache
    (the default, ``<cache>/.predecoded``) with it; elsewhere (``--predecoded-dir``) unless
    ``keep_predecoded`` (a folder shared between caches) or it holds anything but a
    predecoded folder's entries
    (:data:`PREDECODED_ENTRIES`). Waits for a run writing the cache (its lock) to end.

    Raises
    ------
    CacheError
        ``path`` is not an alphafeat cache (no manifest): nothing is removed.
    """
    root = Path(path)
    if not root.is_dir():
        raise CacheError(path, "no such folder" if not root.exists() else "is a file, not a cache directory")
    if not (root / MANIFEST).is_file():
        raise CacheError(path, f"not an alphafeat cache (no {MANIFEST}); nothing removed")
    root = root.resolve()
    try:
        pre = json.loads((root / MANIFEST).read_text()).get(PREDECODED_KEY)
    except (OSError, ValueError, AttributeError):
        pre = None
    removed = []
    with open(root / LOCK, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a run writing the cache finishes first
        shutil.rmtree(root)
        removed.append(root)
    if pre and not keep_predecoded:
        pre = root / pre  # relative: inside the cache (removed with it); absolute: elsewhere
        inside = pre == root or root in pre.parents
        if not inside and pre.is_dir() and {e.name for e in pre.iterdir()} <= PREDECODED_ENTRIES:
            shutil.rmtree(pre)
            removed.append(pre)
    return removed


def open_dataset(path: str | os.PathLike[str]) -> pads.Dataset:
    """The cache as a ``pyarrow.dataset.Dataset`` with Hive partitions ``root`` and ``session``."""
    import pyarrow.dataset as pads  # imported here: it costs the main job 0.15 s at start

    read_manifest(path)
    return pads.dataset(str(path), format="ipc", partitioning="hive")


def compare(a: str | os.PathLike[str], b: str | os.PathLike[str], rtol: float = 1e-9) -> dict:
    """Compare two caches column by column (e.g. one written with ``--device cpu``, one with cuda).

    Float columns must agree in their NaN pattern and within ``|x - y| <= rtol * max(1, |x|)``;
    other columns exactly.

    Returns
    -------
    dict with ``rows`` (int), ``columns`` (int), ``max_rel_err`` (float, over float columns) and
    ``mismatches`` (list of column names that differ beyond the tolerance; empty when equal).
    """
    import numpy as np
    import pyarrow as pa

    ta = open_dataset(a).to_table()
    tb = open_dataset(b).to_table()
    if ta.schema.names != tb.schema.names or ta.num_rows != tb.num_rows:
        return {"rows": ta.num_rows, "columns": ta.num_columns, "max_rel_err": float("inf"),
                "mismatches": ["<schema or row count>"]}
    keys = [("session", "ascending"), ("instrument_id", "ascending"), ("ts_recv", "ascending")]
    ta, tb = ta.sort_by(keys), tb.sort_by(keys)
    worst, bad = 0.0, []
    for name in ta.schema.names:
        if not pa.types.is_floating(ta.schema.field(name).type):
            if not ta.column(name).equals(tb.column(name)):
                bad.append(name)
            continue
        x = ta.column(name).to_numpy(zero_copy_only=False)
        y = tb.column(name).to_numpy(zero_copy_only=False)
        nan = np.isnan(x)
        m = ~nan
        err = np.abs(x[m] - y[m]) / np.maximum(1.0, np.abs(x[m]))
        e = float(err.max(initial=0.0))
        worst = max(worst, e)
        if not np.array_equal(nan, np.isnan(y)) or e > rtol:
            bad.append(name)
    return {"rows": ta.num_rows, "columns": ta.num_columns, "max_rel_err": worst, "mismatches": bad}
