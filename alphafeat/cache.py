"""The feature/label cache: a Hive-partitioned directory of Arrow IPC files.

Layout::

    OUT/_alphafeat.json                                  manifest (same JSON as the metadata)
    OUT/root=ES/session=2024-03-06/ESH4.arrow            one file per kept instrument

Files are uncompressed Arrow IPC (memory-mappable); each file's schema metadata holds, under
the key ``alphafeat``, a JSON document with the columns (unit, meaning, source), the
parameters, the instrument chosen per session and the source files. ``pyarrow.dataset``,
pandas and polars open the directory without project code (files whose names start with
``_`` or ``.`` are skipped by ``pyarrow.dataset``).

The whole cache is written into a temporary sibling directory and renamed into place at the
end, so an interrupted run leaves either the previous cache or nothing, never a half cache.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.dataset as pads

from alphafeat.errors import AlphafeatError

FORMAT_VERSION = 1
MANIFEST = "_alphafeat.json"
META_KEY = b"alphafeat"


class CacheWriter:
    """Write partitions into a temporary directory, then swap it in atomically.

    Use as a context manager; call :meth:`commit` at the end. Leaving the block without
    committing (an exception, Ctrl-C) removes the temporary directory.

    Raises
    ------
    AlphafeatError
        When ``out`` exists and is neither empty nor an alphafeat cache (we never delete a
        directory we did not write).
    """

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.out = Path(out).resolve()
        if self.out.exists() and not is_cache(self.out):
            if not self.out.is_dir() or any(self.out.iterdir()):
                raise AlphafeatError(
                    f"{self.out}: exists and is not an alphafeat cache; refusing to overwrite it"
                )
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.out.parent / f".{self.out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.tmp.mkdir()
        self.files: list[Path] = []
        self._done = False

    def write(self, relpath: str, table: pa.Table, metadata: dict) -> Path:
        """Write ``table`` to ``relpath`` (under the temporary root) with ``metadata``."""
        path = self.tmp / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(table.schema.metadata or {})
        meta[META_KEY] = json.dumps(metadata, sort_keys=True).encode()
        table = table.replace_schema_metadata(meta)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        self.files.append(Path(relpath))
        return self.out / relpath

    def commit(self, manifest: dict) -> None:
        """Write the manifest and move the finished cache to ``out`` (replacing an old one)."""
        (self.tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        old = None
        if self.out.exists():
            old = self.out.parent / f".{self.out.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(self.out, old)
        os.replace(self.tmp, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._done = True

    def abort(self) -> None:
        """Remove the temporary directory."""
        shutil.rmtree(self.tmp, ignore_errors=True)
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


def is_cache(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a directory holding an alphafeat manifest."""
    return (Path(path) / MANIFEST).is_file()


def read_manifest(path: str | os.PathLike[str]) -> dict:
    """The cache's manifest (columns, parameters, schedule, sources).

    Raises
    ------
    AlphafeatError
        If ``path`` is not an alphafeat cache or its format version is not this one.
    """
    p = Path(path) / MANIFEST
    if not p.is_file():
        raise AlphafeatError(f"{path}: not an alphafeat cache (no {MANIFEST})")
    manifest = json.loads(p.read_text())
    if manifest.get("format_version") != FORMAT_VERSION:
        raise AlphafeatError(
            f"{path}: cache format version {manifest.get('format_version')} is not "
            f"{FORMAT_VERSION}; rerun alphafeat precompute to rebuild it"
        )
    return manifest


def open_dataset(path: str | os.PathLike[str]) -> pads.Dataset:
    """The cache as a ``pyarrow.dataset.Dataset`` with Hive partitions ``root`` and ``session``."""
    read_manifest(path)
    return pads.dataset(str(path), format="ipc", partitioning="hive")
