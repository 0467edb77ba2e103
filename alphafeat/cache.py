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

    ta = open_dataset(a).to_table()
    tb = open_dataset(b).to_table()
    if ta.schema.names != tb.schema.names or ta.num_rows != tb.num_rows:
        return {"rows": ta.num_rows, "columns": ta.num_columns, "max_rel_err": float("inf"),
                "mismatches": ["<schema or row count>"]}
    keys = [("session", "ascending"), ("instrument_id", "ascending"), ("ts_recv", "ascending")]
    ta, tb = ta.sort_by(keys), tb.sort_by(keys)
    worst, bad = 0.0, []
    for name in ta.schema.names:
        x = ta.column(name).to_numpy(zero_copy_only=False)
        y = tb.column(name).to_numpy(zero_copy_only=False)
        if x.dtype.kind == "f":
            nan = np.isnan(x)
            m = ~nan
            err = np.abs(x[m] - y[m]) / np.maximum(1.0, np.abs(x[m]))
            e = float(err.max(initial=0.0))
            worst = max(worst, e)
            if not np.array_equal(nan, np.isnan(y)) or e > rtol:
                bad.append(name)
        elif not np.array_equal(x, y):
            bad.append(name)
    return {"rows": ta.num_rows, "columns": ta.num_columns, "max_rel_err": worst, "mismatches": bad}
