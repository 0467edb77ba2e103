"""The plan -> map -> commit precompute against the old building blocks, and its output options.

* Exactness: every feature, book and label column of a ``feature_set="all", dtype="float64"``
  cache equals ``mbp_snapshots`` / ``rebuild_mbo`` -> session rows -> ``to_book_arrays`` ->
  ``compute_features`` -> ``direction_labels`` computed here independently (embedded MBP-10
  sample with its trades files; the real ESH4 MBO file).
* Default output: float32 features (index-point ones float64), at most 256 bytes a row.
* ``compression`` lz4 / zstd caches read back equal; a Dask LocalCluster writes the same bytes.
* Kept books: a rerun with other features and horizons loads every book and gives the same columns.
* Bad options through the CLI: exit status, one error line naming the option, no traceback.
* A segment whose file is gone when the worker runs: an InputError saying so.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pytest
from conftest import ESH4_MBO, PROJECT, need

from alphafeat import book as bk
from alphafeat.cache import MANIFEST, META_KEY
from alphafeat.dbn import read_dbn
from alphafeat.errors import InputError
from alphafeat.features import FeatureParams, compute_features, feature_specs
from alphafeat.features.registry import DEFAULT_FEATURES
from alphafeat.instruments import InstrumentMode, session_dates
from alphafeat.labels import direction_labels
from alphafeat.plan import make_plan
from alphafeat.precompute import PrecomputeConfig, precompute
from alphafeat.precompute.job import make_job
from alphafeat.precompute.segment import run_segment
from alphafeat.types import LEVELS, BookArrays
from cli.alphafeat import main

DATA = PROJECT / "data"
MBP10, TRADES, MBO = 0x0A, 0x00, 0xA0
FEATURES = [s.name for s in feature_specs(FeatureParams())]
UNITS = {s.name: s.unit for s in feature_specs(FeatureParams())}


@pytest.fixture(scope="module")
def data() -> Path:
    if not any(DATA.glob("*.mbp-10.dbn.zst")):
        pytest.skip("data/ has no embedded sample")
    return DATA


def _read(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as src:
        return pa.ipc.open_file(src).read_all()


def _meta(path: Path) -> dict:
    return json.loads(pa.ipc.open_file(str(path)).schema.metadata[META_KEY])


def _partitions(out: Path) -> list[Path]:
    return sorted(out.rglob("*.arrow"))


def _ints(col: pa.ChunkedArray) -> np.ndarray:
    """A timestamp column as int64 ns, -1 where null."""
    return col.cast(pa.int64()).fill_null(-1).to_numpy()


def assert_columns_equal(got: pa.Table, ref: pa.Table) -> None:
    """Same columns, types and values; floats compared bit for bit (NaN equal to NaN)."""
    assert got.schema.remove_metadata() == ref.schema.remove_metadata()
    for name in ref.column_names:
        g, r = got[name].combine_chunks(), ref[name].combine_chunks()
        if pa.types.is_floating(r.type):
            assert g.null_count == r.null_count == 0, name
            gv, rv = g.to_numpy(), r.to_numpy()
            np.testing.assert_array_equal(gv.view(f"u{gv.itemsize}"), rv.view(f"u{rv.itemsize}"), err_msg=name)
        else:
            assert g.equals(r), name


def _cfg(inputs, out: Path, **kw) -> PrecomputeConfig:
    return PrecomputeConfig(inputs=list(inputs), out=out, device="cpu", **kw)


# --------------------------------------------------------------------------------------
# exactness against the old building blocks
# --------------------------------------------------------------------------------------


def _check_partition(tab: pa.Table, b: BookArrays, horizons=(30,)) -> None:
    """``tab`` (a feature_set="all", float64 partition) against the reference book ``b``."""
    n = len(b)
    assert tab.num_rows == n > 0
    np.testing.assert_array_equal(_ints(tab["ts_recv"]), b.ts_recv)
    np.testing.assert_array_equal(_ints(tab["ts_event"]), b.ts_event)
    for lvl in range(LEVELS):
        for side in ("bid", "ask"):
            px = tab[f"{side}_px_{lvl:02d}"].to_numpy()
            assert px.dtype == np.float64
            np.testing.assert_array_equal(px, getattr(b, f"{side}_px")[:, lvl], err_msg=f"{side}_px_{lvl:02d}")
            for q in ("sz", "ct"):
                got = tab[f"{side}_{q}_{lvl:02d}"].to_numpy()
                assert got.dtype == np.uint32
                np.testing.assert_array_equal(got, getattr(b, f"{side}_{q}")[:, lvl], err_msg=f"{side}_{q}_{lvl:02d}")
    for k in ("buy_volume", "sell_volume", "trade_count"):
        got = tab[k].to_numpy()
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, getattr(b, k), err_msg=k)
    with np.errstate(invalid="ignore"):
        crossed = b.bid_px[:, 0] > b.ask_px[:, 0]
    np.testing.assert_array_equal(tab["book_crossed"].to_numpy(), crossed)
    feats = compute_features(b)
    assert [c for c in tab.column_names if c in UNITS] == FEATURES
    for name in FEATURES:
        got = tab[name].to_numpy()
        assert got.dtype == np.float64, name
        np.testing.assert_allclose(got, feats[name], rtol=1e-12, atol=0, equal_nan=True, err_msg=name)
    mid = np.where(crossed, np.nan, feats["mid"])
    ref = direction_labels(mid, horizons, ts=b.ts_recv)
    for h in horizons:
        np.testing.assert_array_equal(tab[f"label_h{h}"].to_numpy(), ref[f"label_h{h}"], err_msg=f"label_h{h}")
        np.testing.assert_array_equal(_ints(tab[f"t1_h{h}"]), ref[f"t1_h{h}"], err_msg=f"t1_h{h}")


def _embedded_reference(data: Path, day: dt.date, iid: int) -> BookArrays:
    """The old path: the instrument's records of every book file, ``mbp_snapshots``, the rows
    of the session, the trades files' trades of the session, ``to_book_arrays``."""
    recs = np.concatenate([read_dbn(p, instrument_ids=[iid])[1][MBP10] for p in sorted(data.glob("*.mbp-10.*"))])
    raw, _ = bk.mbp_snapshots(recs)
    tr = np.concatenate([read_dbn(p, instrument_ids=[iid])[1][TRADES] for p in sorted(data.glob("*.trades.*"))])
    trades = bk.trades_from_records(tr)
    d = np.datetime64(day)
    return bk.to_book_arrays(raw.take(session_dates(raw.ts_recv) == d), trades.take(session_dates(trades.ts_recv) == d))


def test_embedded_all_float64_equals_old_path(data, tmp_path):
    out = tmp_path / "cache"
    s = precompute(_cfg([data], out, feature_set="all", dtype="float64", horizons=(30, 100)))
    parts = _partitions(out)
    assert len(parts) == len(s.schedule) == 3
    assert {(c.session.isoformat(), c.instrument_id) for c in s.schedule} == {
        (_meta(p)["session"], _meta(p)["instrument_id"]) for p in parts
    }
    rows = 0
    for p in parts:
        m = _meta(p)
        b = _embedded_reference(data, dt.date.fromisoformat(m["session"]), m["instrument_id"])
        tab = _read(p)
        _check_partition(tab, b, horizons=(30, 100))
        rows += tab.num_rows
    assert rows == s.rows


def _most_active_id(path: Path) -> int:
    ids, counts = np.unique(read_dbn(path)[1][MBO]["instrument_id"], return_counts=True)
    return int(ids[np.argmax(counts)])


@pytest.mark.parametrize("mode", ["all", "id"])
def test_real_mbo_all_float64_equals_old_path(mode, tmp_path):
    path = need(ESH4_MBO)
    iid = _most_active_id(path)
    text = "all" if mode == "all" else f"id={iid}"
    out = tmp_path / "cache"
    s = precompute(_cfg([path], out, instrument_mode=InstrumentMode.parse(text), feature_set="all",
                        dtype="float64", horizons=(30,)))  # fmt: skip
    # the old path: rebuild the whole file, then cut to each session
    raw, trades, _ = bk.rebuild_mbo(read_dbn(path, instrument_ids=[iid])[1][MBO])
    days = session_dates(raw.ts_recv)
    tdays = session_dates(trades.ts_recv)
    parts = _partitions(out)
    # the file's records span the 2023-12-25 and 12-26 sessions; the book is rebuilt from the
    # file's start and only the rows of each partition's session are kept
    assert set(np.unique(session_dates(read_dbn(path)[1][MBO]["ts_recv"])).astype(str)) == {"2023-12-25", "2023-12-26"}
    assert len(parts) == len(np.unique(days)) >= 1
    for p in parts:
        m = _meta(p)
        assert m["instrument_id"] == iid
        d = np.datetime64(m["session"])
        _check_partition(_read(p), bk.to_book_arrays(raw.take(days == d), trades.take(tdays == d)))
    assert s.rows == len(raw)


# --------------------------------------------------------------------------------------
# default output: float32 features, bytes per row
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_cache(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("default") / "cache"
    precompute(_cfg([data], out))
    return out


def test_default_output_float32_and_bytes_per_row(default_cache):
    man = json.loads((default_cache / MANIFEST).read_text())
    names = man["params"]["feature_set"]
    assert names == [n for n in FEATURES if n in DEFAULT_FEATURES] and len(names) == len(DEFAULT_FEATURES)
    units = {c["name"]: c["unit"] for c in man["columns"]}
    parts = _partitions(default_cache)
    assert len(parts) == 3
    for p in parts:
        tab = _read(p)
        for name in names:
            want = pa.float64() if units[name] == "index points" else pa.float32()
            assert tab.schema.field(name).type == want, name
        assert {n for n in names if units[n] == "index points"} >= {"mid", "microprice"}
        assert "bid_px_00" in tab.column_names and "bid_px_01" not in tab.column_names
        assert tab.schema.field("bid_px_00").type == pa.float64()
        assert tab.schema.field("buy_volume").type == pa.float32()
        assert tab.schema.field("label_h30").type == pa.float32()
        per_row = tab.nbytes / tab.num_rows
        assert per_row <= 256, (p.name, per_row)


# --------------------------------------------------------------------------------------
# compression, Dask
# --------------------------------------------------------------------------------------


def _dataset(out: Path) -> pa.Table:
    return pads.dataset(str(out), format="ipc", partitioning="hive").to_table().replace_schema_metadata(None)


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compressed_caches_read_back_equal(compression, default_cache, data, tmp_path):
    out = tmp_path / "cache"
    precompute(_cfg([data], out, compression=compression))
    got, ref = _dataset(out), _dataset(default_cache)
    assert got.num_rows == ref.num_rows > 0
    assert_columns_equal(got, ref)
    for p in _partitions(out):
        assert _meta(p)["params"]["compression"] == compression
        assert p.stat().st_size < (default_cache / p.relative_to(out)).stat().st_size


def _files(root: Path) -> dict[str, bytes]:
    out = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.arrow"))}
    man = json.loads((root / MANIFEST).read_text())
    man.pop("run")
    out[MANIFEST] = json.dumps(man, sort_keys=True).encode()
    return out


def test_dask_local_cluster_writes_the_same_bytes(default_cache, data, tmp_path):
    pytest.importorskip("dask.distributed")
    import dask

    out = tmp_path / "cache"
    with dask.config.set({"temporary-directory": str(tmp_path / "dask")}):
        s = precompute(_cfg([data], out, dask_local=2))
    assert len(s.partitions) == 3
    assert (tmp_path / "dask").is_dir()  # the workers' scratch space went under tmp_path
    got, ref = _files(out), _files(default_cache)
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert got[k] == ref[k], k


# --------------------------------------------------------------------------------------
# kept books
# --------------------------------------------------------------------------------------


def test_kept_books_rerun_with_other_features(data, tmp_path):
    out = tmp_path / "kept" / "cache"
    s1 = precompute(_cfg([data], out, keep_books="keep", horizons=(30,)))
    assert s1.books_predecoded == 0 and s1.records > 0
    books = [d for d in (tmp_path / "kept" / ".predecoded" / "book").iterdir() if (d / "book.json").is_file()]
    assert len(books) == len(s1.schedule) == 3
    s2 = precompute(_cfg([data], out, keep_books="keep", horizons=(100, 300), feature_set="default,flow"))
    assert s2.books_predecoded == len(s2.schedule) == 3
    assert s2.records == 0 and s2.partitions_skipped == 0
    fresh = tmp_path / "fresh" / "cache"
    s3 = precompute(_cfg([data], fresh, keep_books="none", horizons=(100, 300), feature_set="default,flow"))
    assert s3.books_predecoded == 0 and s3.rows == s2.rows
    assert not (tmp_path / "fresh" / ".predecoded" / "book").exists()
    for p in _partitions(fresh):
        got, ref = _read(out / p.relative_to(fresh)), _read(p)
        assert "label_h100" in got.column_names and "label_h30" not in got.column_names
        assert set(DEFAULT_FEATURES) <= set(got.column_names)
        assert_columns_equal(got, ref)


# --------------------------------------------------------------------------------------
# bad options through the CLI
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [("--features", "bogus"), ("--dtype", "float16"), ("--compression", "gzip"), ("--predecoded", "maybe"),
     ("--jobs", "0"), ("--dask-local", "-1")],
)  # fmt: skip
def test_bad_options_through_the_cli(option, value, data, tmp_path, capsys):
    out = tmp_path / "cache"
    rc = main(["precompute", "-q", "--input", str(data), "--out", str(out), option, value])
    err = capsys.readouterr().err
    assert rc == 2  # a usage error
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "error:" in lines[0], err
    assert option in lines[0] and value in lines[0]
    assert not out.exists()


# --------------------------------------------------------------------------------------
# a file gone before the worker runs
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("gone", ["book", "trades"])
def test_segment_whose_file_disappeared(gone, data, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for p in data.glob("glbx-mdp3-20240306.*.dbn.zst"):
        shutil.copy2(p, src / p.name)
    cfg = _cfg([src], tmp_path / "cache")
    plan = make_plan(cfg.inputs)
    (seg,) = plan.segments
    assert seg.book_files and seg.trade_files
    missing = (seg.book_files if gone == "book" else seg.trade_files)[0]
    Path(missing).unlink()
    job = make_job(cfg, "cpu")
    staging = tmp_path / "staging"
    with pytest.raises(InputError, match="not visible from this worker") as info:
        run_segment(seg, str(staging), {}, job, None)
    assert info.value.path == missing
    assert missing in str(info.value)
    assert not staging.exists() or not any(staging.rglob("*.arrow*"))


# --------------------------------------------------------------------------------------
# the same data twice, bad values of the new options
# --------------------------------------------------------------------------------------


def test_a_path_given_twice_is_read_once(data, tmp_path):
    book = data / "glbx-mdp3-20240306.mbp-10.dbn.zst"
    once = precompute(_cfg([book], tmp_path / "once"))
    twice = precompute(_cfg([book, book, data / ".." / "data" / book.name], tmp_path / "twice"))
    assert once.rows == twice.rows > 0


def test_a_copy_under_another_name_is_refused(data, tmp_path):
    """Two files of one schema overlapping in time and instruments would double every record
    (rows out of order, wrong features): one line naming both, nothing written."""
    book = data / "glbx-mdp3-20240306.mbp-10.dbn.zst"
    copy = tmp_path / "copy.mbp-10.dbn.zst"
    shutil.copy2(book, copy)
    with pytest.raises(InputError, match="overlaps .* in time and instruments"):
        precompute(_cfg([book, copy], tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("value", ["0", "-5", "abc", "30,30", ""])
def test_bad_horizons_one_line(value, data, tmp_path, capsys):
    rc = main(["precompute", "-q", "--input", str(data), "--out", str(tmp_path / "c"), "--horizons", value])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and "--horizons" in err and len(err.strip().splitlines()) == 1


def test_feature_groups_are_exact() -> None:
    from alphafeat.features import FeatureParams
    from alphafeat.features.registry import select_features

    p = FeatureParams()
    price, _ = select_features("price", p)
    assert "mid" in price and not any(n.startswith("mid_z") for n in price)
    assert select_features("default,book", p)[1] and not select_features("default", p)[1]
    with pytest.raises(ValueError, match="no feature or group"):
        select_features(" , ", p)


def test_arena_reuses_a_buffer_for_a_slightly_larger_segment() -> None:
    """A worker's next segment often has a bound a little above its last one's: the kept
    buffer (HEADROOM larger than asked) serves it, instead of fresh memory (page faults)."""
    from alphafeat import arena

    tag = "test:arena-headroom"
    a = arena.reserve(tag, (1000,), np.float64)
    addr = a.ctypes.data
    del a
    b = arena.reserve(tag, (1400,), np.float64)  # 1.4x: within the headroom, same memory
    assert b.ctypes.data == addr
    c = arena.reserve(tag, (1400,), np.float64)  # b is still alive: new memory, never shared
    assert c.ctypes.data != b.ctypes.data
    del b, c
    arena.release()


def test_cli_keeps_blas_to_one_thread_unless_set(tmp_path) -> None:
    """The CLI sets OPENBLAS_NUM_THREADS=1 before numpy loads (no spinning BLAS pools in every
    worker); a value the user set is kept."""
    import os
    import subprocess
    import sys

    code = "import cli.alphafeat, os, sys; print(os.environ['OPENBLAS_NUM_THREADS'], 'numpy' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=PROJECT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "False"]
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OPENBLAS_NUM_THREADS": "3"}, cwd=PROJECT,
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.split()[0] == "3"
