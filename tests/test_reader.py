"""alphafeat.reader and alphafeat.predecoded: parallel reads, Dask backend, cache keys, errors, CLI."""

from __future__ import annotations

import os
from pathlib import Path

import joblib
import numpy as np
import pytest
import zstandard
from test_dbn import _mbp10, _metadata

from alphafeat import predecoded
from alphafeat.dbn import read_dbn
from alphafeat.errors import InputError
from alphafeat.reader import read_files
from cli.alphafeat import main

MBP10 = 0x0A
DATA = Path(__file__).resolve().parents[1] / "data"


def _file(tmp: Path, name: str, n: int = 50, ids=(17077, 5602)) -> tuple[Path, np.ndarray]:
    recs = _mbp10(n, instrument_ids=ids)
    p = tmp / name
    p.write_bytes(zstandard.ZstdCompressor().compress(_metadata() + recs.tobytes()))
    return p, recs


def test_parallel_equals_serial_and_filters(tmp_path: Path) -> None:
    files = [_file(tmp_path, f"f{i}.dbn.zst", 40 + i)[0] for i in range(3)]
    serial = read_files(files, instrument_ids=[5602])
    par = read_files(files, instrument_ids=[5602], n_jobs=2)
    assert [f.path for f in par.files] == files
    for a, b, p in zip(serial.files, par.files, files, strict=True):
        ref = read_dbn(p)[1][MBP10]
        assert a.arrays[MBP10].tobytes() == b.arrays[MBP10].tobytes() == ref[ref["instrument_id"] == 5602].tobytes()
        assert a.records == len(ref)
    groups = par.by_instrument(MBP10)
    assert list(groups) == [5602] and len(groups[5602]) == 3


def test_dask_backend(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    files = [_file(tmp_path, f"d{i}.dbn.zst")[0] for i in range(2)]
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cl:
        with distributed.Client(cl), joblib.parallel_config(backend="dask"):
            got = read_files(files, n_jobs=2, cache_dir=tmp_path / "pre")
    assert [len(f.arrays[MBP10]) for f in got.files] == [50, 50]
    assert all(isinstance(f.arrays[MBP10], np.memmap) for f in got.files)


def test_predecoded_cache_keys_and_invalidation(tmp_path: Path) -> None:
    p, recs = _file(tmp_path, "c.dbn.zst")
    pre = tmp_path / "pre"
    cold = predecoded.read_predecoded(p, pre, [17077])
    warm = predecoded.read_predecoded(p, pre, [17077])
    assert not cold.from_cache and warm.from_cache
    assert warm.arrays[MBP10].tobytes() == recs[recs["instrument_id"] == 17077].tobytes()
    assert isinstance(np.load(warm.entry / "rtype_0A.npy", mmap_mode="r"), np.memmap)
    # another selection is another entry
    assert not predecoded.read_predecoded(p, pre, None).from_cache
    assert len(list(pre.iterdir())) == 2
    # a changed source invalidates (mtime), so does a new format version
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    assert predecoded.load(pre, p, [17077]) is None
    key = predecoded.cache_key(p, [17077])
    old = predecoded.FORMAT_VERSION
    try:
        predecoded.FORMAT_VERSION = old + 1
        assert predecoded.cache_key(p, [17077]) != key
    finally:
        predecoded.FORMAT_VERSION = old
    # rebuild clears; no temporary directory is ever left behind
    assert predecoded.clear(pre) == 2
    assert not read_files([p], cache_dir=pre, rebuild=True).files[0].from_cache
    assert not [c for c in pre.iterdir() if ".tmp-" in c.name]


def test_failed_decode_leaves_no_entry(tmp_path: Path) -> None:
    p, _ = _file(tmp_path, "bad.dbn.zst")
    p.write_bytes(p.read_bytes()[:-7])
    with pytest.raises(InputError, match="truncated"):
        predecoded.read_predecoded(p, tmp_path / "pre")
    assert not (tmp_path / "pre").exists()  # the folder this call made is gone too
    (tmp_path / "pre").mkdir()  # a folder that was there before stays
    with pytest.raises(InputError, match="truncated"):
        predecoded.read_predecoded(p, tmp_path / "pre")
    assert list((tmp_path / "pre").iterdir()) == []


def _bad_files(tmp: Path) -> dict[str, Path]:
    good = _mbp10(5)
    raw = bytearray(_metadata() + good.tobytes())
    h = len(_metadata())
    length = bytearray(raw)
    length[h + 368] = 50  # second record: length byte disagrees with MBP-10
    rtype = bytearray(raw)
    rtype[h + 2 * 368 + 1] = 0x7E  # third record: unknown rtype
    z = zstandard.ZstdCompressor(write_checksum=True).compress(bytes(raw))
    corrupt = bytearray(z)
    corrupt[len(z) // 2 : len(z) // 2 + 16] = bytes(16)
    out = {}
    for name, data in {
        "cut": z[: len(z) - 9],
        "corrupt": bytes(corrupt),
        "length": zstandard.ZstdCompressor().compress(bytes(length)),
        "rtype": zstandard.ZstdCompressor().compress(bytes(rtype)),
    }.items():
        out[name] = tmp / f"{name}.mbp-10.dbn.zst"
        out[name].write_bytes(data)
    return out


def test_bad_inputs_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _bad_files(tmp_path)
    expect = {"cut": "truncated", "corrupt": "corrupt zstd", "length": "disagrees", "rtype": "unknown record type"}
    for name, p in bad.items():
        assert main(["roll-schedule", "--input", str(p), "--out", str(tmp_path / "c")]) == 1
        err = capsys.readouterr().err.replace("\n", "")
        assert p.name in err and expect[name] in err and "byte offset" in err, err
    # skip: a warning per bad file, the good files read, the skipped ones listed
    good = sorted(str(q) for q in DATA.glob("*.dbn.zst"))
    args = ["roll-schedule", "--input", *good, *map(str, bad.values()), "--on-error", "skip",
            "--out", str(tmp_path / "c")]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out.replace("\n", "")
    for p in bad.values():
        assert f"skipped: {p}" in out
    assert "ESM4" in out and "ESH4" in out


def test_skip_in_read_files(tmp_path: Path) -> None:
    bad = _bad_files(tmp_path)
    p, recs = _file(tmp_path, "ok.dbn.zst")
    rr = read_files([bad["length"], p, bad["rtype"]], on_error="skip", n_jobs=2)
    assert [f.path for f in rr.files] == [p] and rr.files[0].arrays[MBP10].tobytes() == recs.tobytes()
    assert [s for s, _ in rr.skipped] == [bad["length"], bad["rtype"]]
    with pytest.raises(InputError, match="disagrees"):
        read_files([p, bad["length"]], n_jobs=2)
