"""Cache writer: atomic swap, manifest checks, and the cache comparison."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from alphafeat.cache import FORMAT_VERSION, MANIFEST, CacheWriter, compare, open_dataset, read_manifest
from alphafeat.errors import AlphafeatError


def _write(out, values, manifest=None):
    t = pa.table({"ts_recv": pa.array(np.arange(len(values)), pa.int64()),
                  "instrument_id": pa.array(np.ones(len(values), np.uint32)),
                  "x": pa.array(np.asarray(values, dtype=np.float64))})
    with CacheWriter(out) as w:
        w.write("root=ES/session=2024-01-02/ESH4.arrow", t, {"k": 1})
        w.commit(manifest or {"format_version": FORMAT_VERSION})


def test_compare_detects_value_and_nan_differences(tmp_path):
    _write(tmp_path / "a", [1.0, 2.0, np.nan])
    _write(tmp_path / "b", [1.0, 2.0 + 1e-12, np.nan])
    _write(tmp_path / "c", [1.0, 2.001, np.nan])
    _write(tmp_path / "d", [1.0, 2.0, 3.0])
    assert compare(tmp_path / "a", tmp_path / "b")["mismatches"] == []
    assert compare(tmp_path / "a", tmp_path / "c")["mismatches"] == ["x"]
    assert compare(tmp_path / "a", tmp_path / "d")["mismatches"] == ["x"]


def test_interrupted_write_leaves_nothing_and_old_cache_survives(tmp_path):
    out = tmp_path / "cache"
    _write(out, [1.0])
    with pytest.raises(RuntimeError):
        with CacheWriter(out) as w:
            w.write("root=ES/session=2024-01-03/ESH4.arrow", pa.table({"x": [2.0]}), {})
            raise RuntimeError("killed")
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]
    assert open_dataset(out).to_table().column("x").to_pylist() == [1.0]


def test_old_format_version_gets_a_clear_message(tmp_path):
    out = tmp_path / "cache"
    _write(out, [1.0])
    (out / MANIFEST).write_text(json.dumps({"format_version": 0}))
    with pytest.raises(AlphafeatError, match="format version 0"):
        read_manifest(out)


def test_a_replaced_partition_is_freed_after_the_commit_and_never_globbed(tmp_path, monkeypatch):
    """Commit keeps a replaced partition aside (a hard link in a hidden ``.trash-*`` folder, not
    named ``*.arrow``) and a detached ``rm`` deletes it; the new partition is in place at once;
    a ``.trash-*`` folder left behind (a killed ``rm``) goes with the next run."""
    import time

    import alphafeat.cache as cache

    out = tmp_path / "cache"
    _write(out, [1.0])
    part = out / "root=ES/session=2024-01-02/ESH4.arrow"
    old_inode = part.stat().st_ino
    later = []
    monkeypatch.setattr(cache, "_remove_later", later.append)  # look before the rm runs
    _write(out, [2.0, 3.0])
    assert open_dataset(out).to_table().column("x").to_pylist() == [2.0, 3.0]
    (trash,) = later
    kept = list(trash.iterdir())
    assert trash.name.startswith(".trash-") and [p.stat().st_ino for p in kept] == [old_inode]
    assert [p.name for p in out.rglob("*.arrow")] == ["ESH4.arrow"]  # the kept file is not globbed
    monkeypatch.undo()

    def gone() -> bool:  # within 10 s: the rm is detached
        for _ in range(200):
            if not list(out.glob(".trash-*")):
                return True
            time.sleep(0.05)
        return False

    cache._remove_later(trash)  # the detached rm
    assert gone()
    (out / ".trash-123-stale").mkdir()  # left by a killed rm: the next run removes it
    _write(out, [4.0])
    assert gone() and open_dataset(out).to_table().column("x").to_pylist() == [4.0]
