"""Cache writer: atomic swap, manifest checks, and the cache comparison."""

from __future__ import annotations

import glob
import json
import os
import signal
import time

import numpy as np
import pyarrow as pa
import pytest

from alphafeat.cache import (
    FORMAT_VERSION,
    MANIFEST,
    META_KEY,
    CacheWriter,
    _libc,
    compare,
    move_into_place,
    open_dataset,
    read_manifest,
    write_partition,
)
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


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_partition_written_into_allocated_blocks_has_pyarrows_bytes(tmp_path, compression):
    """An uncompressed partition is written into blocks allocated first, the file then cut to
    its bytes: the same bytes as pyarrow writing it plainly, no allocated tail left."""
    t = pa.table({"x": np.arange(300_000, dtype=np.float64), "y": np.ones(300_000, dtype=np.float32)})
    write_partition(tmp_path / "a.arrow", t, {"k": 1}, compression)
    plain = t.replace_schema_metadata({META_KEY: json.dumps({"k": 1}, sort_keys=True).encode()})
    opts = pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as sink, pa.ipc.new_file(sink, plain.schema, options=opts) as w:
        w.write_table(plain)
    assert (tmp_path / "a.arrow").read_bytes() == (tmp_path / "b.arrow").read_bytes()
    st = (tmp_path / "a.arrow").stat()
    assert st.st_blocks * 512 < st.st_size + (1 << 20)


def test_move_into_place_swaps_names_over_an_existing_file(tmp_path):
    """Over an existing file the names are swapped (the old file left at the source, in the
    staging folder the commit removes), where the C library has renameat2; to a new name it
    is a rename."""
    src, dst = tmp_path / "staged", tmp_path / "part.arrow"
    src.write_text("new")
    dst.write_text("old")
    ino = src.stat().st_ino
    move_into_place(src, dst)
    assert dst.read_text() == "new" and dst.stat().st_ino == ino
    assert (src.read_text() == "old") if _libc("renameat2") is not None else not src.exists()
    src.unlink(missing_ok=True)
    src.write_text("newer")
    move_into_place(src, tmp_path / "fresh.arrow")
    assert (tmp_path / "fresh.arrow").read_text() == "newer" and not src.exists()


def test_replaced_partition_is_freed_by_another_process(tmp_path):
    """A partition replaced at commit leaves no name behind in the cache, and its file is still
    open in another process (whose exit frees the blocks), not freed by the commit itself."""
    out = tmp_path / "cache"
    _write(out, [1.0] * 1000)
    old = out / "root=ES/session=2024-01-02/ESH4.arrow"
    before = old.stat()
    _write(out, [2.0] * 1000)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != ".alphafeat.lock") == [
        "_alphafeat.json", "root=ES/session=2024-01-02/ESH4.arrow"]
    assert open_dataset(out).to_table().column("x").to_pylist() == [2.0] * 1000
    holders = []
    for fd in glob.glob("/proc/[0-9]*/fd/*"):  # (Linux)
        try:
            st = os.stat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino, st.st_nlink) == (before.st_dev, before.st_ino, 0):
            holders.append(int(fd.split("/")[2]))
    assert holders and os.getpid() not in holders, holders
    for pid in holders:  # do not leave the sleep behind the test
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.05)
