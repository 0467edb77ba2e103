"""Tests of alphafeat.dbn: databento conformance, chunking, ts_out, mixed streams, bad input."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import databento
import databento_dbn
import numpy as np
import pytest
import zstandard
from conftest import PROJECT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alphafeat.dbn import (
    BOOK_SCHEMAS,
    SCHEMA_RTYPES,
    DBNFile,
    iter_chunks,
    open_dbn,
    read_dbn,
    record_dtype,
)
from alphafeat.errors import InputError

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
MBO_ZST = DATA / "real" / "esh4-glbx-mdp3-20231225.mbo.dbn.zst"
CONFORMANCE_SCHEMAS = {"mbo", "mbp-10", "mbp-1", "tbbo", "trades", "definition", "ohlcv-1m"}

MBP10, MBO, SYMBOL_MAPPING, SYSTEM, TRADES = 0x0A, 0xA0, 0x16, 0x17, 0x00


def _need_data() -> None:
    if not DATA.is_dir():
        pytest.skip("../shared/data not present (fresh clone without the shared data)")


def _data_files() -> list:
    """The shared data's DBN files; one skipped parameter with the reason when they are absent
    (an empty list would skip with pytest's 'got empty parameter set')."""
    files = sorted(p for p in DATA.glob("*/*") if p.name.endswith((".dbn", ".dbn.zst"))) if DATA.is_dir() else []
    return files or [pytest.param(DATA, marks=pytest.mark.skip(reason="../shared/data not present (fresh clone "
                                                                      "without the shared data)"))]


def _concat(chunks: list[dict[int, np.ndarray]], rtype: int) -> np.ndarray:
    parts = [c[rtype] for c in chunks if rtype in c]
    return np.concatenate(parts) if parts else np.empty(0)


def _metadata(*, schema=databento_dbn.Schema.MBP_10, ts_out: bool = False) -> bytes:
    return databento_dbn.Metadata(
        dataset="GLBX.MDP3",
        schema=schema,
        start=1_700_000_000_000_000_000,
        stype_in=databento_dbn.SType.RAW_SYMBOL,
        stype_out=databento_dbn.SType.INSTRUMENT_ID,
        symbols=["ESZ3", "NQZ3"],
        partial=[],
        not_found=[],
        mappings=[],
        end=None,
        limit=None,
        ts_out=ts_out,
        version=3,
    ).encode()


def _mbp10(n: int, *, ts_out: bool = False, instrument_ids=(17077,)) -> np.ndarray:
    """n MBP-10 records with distinct, checkable values."""
    dtype = record_dtype(MBP10, 3, ts_out)
    a = np.zeros(n, dtype=dtype)
    a["length"] = dtype.itemsize // 4
    a["rtype"] = MBP10
    a["publisher_id"] = 1
    a["instrument_id"] = np.resize(np.asarray(instrument_ids, dtype=np.uint32), n)
    a["ts_event"] = 1_700_000_000_000_000_000 + np.arange(n, dtype=np.uint64) * 1000
    a["ts_recv"] = a["ts_event"] + 100_000
    a["price"] = 4_500_250_000_000 + np.arange(n, dtype=np.int64) * 250_000_000
    a["size"] = np.arange(n) % 7 + 1
    a["action"] = b"A"
    a["side"] = b"B"
    a["flags"] = 0x80
    a["sequence"] = np.arange(n)
    for lvl in range(10):
        a[f"bid_px_{lvl:02d}"] = a["price"] - lvl * 250_000_000
        a[f"ask_px_{lvl:02d}"] = a["price"] + (lvl + 1) * 250_000_000
        a[f"bid_sz_{lvl:02d}"] = 10 + lvl
        a[f"ask_sz_{lvl:02d}"] = 20 + lvl
    if ts_out:
        a["ts_out"] = a["ts_recv"] + 5_000
    return a


def _symbol_mappings(n: int, instrument_id: int = 17077) -> np.ndarray:
    dtype = record_dtype(SYMBOL_MAPPING, 3)
    a = np.zeros(n, dtype=dtype)
    a["length"] = dtype.itemsize // 4
    a["rtype"] = SYMBOL_MAPPING
    a["instrument_id"] = instrument_id + np.arange(n, dtype=np.uint32)
    a["ts_event"] = np.arange(n, dtype=np.uint64) + 7
    a["stype_in_symbol"] = [f"ES{i}".encode() for i in range(n)]
    a["stype_out_symbol"] = [str(instrument_id + i).encode() for i in range(n)]
    a["start_ts"] = 1
    a["end_ts"] = 2
    return a


def _write(path: Path, payload: bytes, *, zst: bool = False) -> Path:
    path.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(payload) if zst else payload)
    return path


def _decompressed(path: Path) -> bytes:
    with open(path, "rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()


# ---------------------------------------------------------------------------------------
# conformance with databento.DBNStore
# ---------------------------------------------------------------------------------------


def test_shared_data_present() -> None:
    _need_data()
    assert MBO_ZST.is_file()


@pytest.mark.parametrize("path", _data_files(), ids=lambda p: p.name)
def test_conformance_with_databento(path: Path) -> None:
    store = databento.DBNStore.from_file(path)
    schema = str(store.schema)
    if schema not in CONFORMANCE_SCHEMAS:
        pytest.skip(f"schema {schema} not covered")
    ref = store.to_ndarray()
    dbn, recs = read_dbn(path)

    assert isinstance(dbn, DBNFile)
    assert dbn.schema == schema
    assert dbn.version == store.metadata.version
    assert dbn.compressed == path.name.endswith(".zst")
    assert dbn.ts_out is False
    raw = _decompressed(path) if dbn.compressed else path.read_bytes()
    assert dbn.header_size == 8 + struct.unpack_from("<I", raw, 4)[0]
    assert raw[:3] == b"DBN" and raw[3] == dbn.version

    assert list(recs) == [SCHEMA_RTYPES[schema]]
    got = recs[SCHEMA_RTYPES[schema]]
    assert got.dtype.names == ref.dtype.names
    assert got.dtype == ref.dtype
    assert len(got) == len(ref) > 0
    for name in ref.dtype.names:
        assert got[name].tobytes() == ref[name].tobytes(), name
    # open_dbn agrees with read_dbn and with databento's metadata
    head = open_dbn(path)
    assert head.header_size == dbn.header_size and head.version == dbn.version
    assert head.metadata.dataset == store.metadata.dataset
    assert list(head.metadata.symbols) == list(store.metadata.symbols)


def test_schema_tables() -> None:
    assert BOOK_SCHEMAS == ("mbo", "mbp-10", "mbp-1")
    for schema, rtype in SCHEMA_RTYPES.items():
        assert int(databento_dbn.RType.from_schema(databento_dbn.Schema(schema)).value) == rtype
    # version-specific layouts
    assert record_dtype(0x13, 1).itemsize == 360
    assert record_dtype(0x13, 2).itemsize == 400
    assert record_dtype(0x13, 3).itemsize == 520
    assert record_dtype(SYMBOL_MAPPING, 1).itemsize == 80
    assert record_dtype(SYMBOL_MAPPING, 3).itemsize == 176
    assert record_dtype(MBP10, 3, True).itemsize == 376
    assert record_dtype(MBP10, 3, True).names[-1] == "ts_out"
    with pytest.raises(ValueError):
        record_dtype(0x7F, 3)


# ---------------------------------------------------------------------------------------
# chunking
# ---------------------------------------------------------------------------------------


def test_tiny_chunks_equal_one_big_chunk() -> None:
    _need_data()
    big = list(iter_chunks(MBO_ZST))
    small = list(iter_chunks(MBO_ZST, chunk_bytes=1000))
    assert len(big) == 1
    assert len(small) > 3000
    assert all(len(c[MBO]) <= 1000 // 56 + 1 for c in small)
    a, b = _concat(big, MBO), _concat(small, MBO)
    assert len(a) == 68_792
    assert a.tobytes() == b.tobytes()
    # the instrument filter: the file holds only ESH4 (17077)
    only = _concat(list(iter_chunks(MBO_ZST, chunk_bytes=10_000, instrument_ids=[17077])), MBO)
    assert only.tobytes() == a.tobytes()
    assert not list(iter_chunks(MBO_ZST, instrument_ids=[1]))
    _, none = read_dbn(MBO_ZST, instrument_ids=[1])
    assert len(none[MBO]) == 0 and none[MBO].dtype == a.dtype


# ---------------------------------------------------------------------------------------
# ts_out
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("zst", [False, True])
def test_ts_out(tmp_path: Path, zst: bool) -> None:
    recs = _mbp10(50, ts_out=True)
    assert recs.dtype.itemsize == 368 + 8 and recs["length"][0] == 94
    path = _write(
        tmp_path / ("t.dbn.zst" if zst else "t.dbn"),
        _metadata(ts_out=True) + recs.tobytes(),
        zst=zst,
    )
    dbn, out = read_dbn(path)
    assert dbn.ts_out is True and dbn.version == 3 and dbn.schema == "mbp-10"
    got = out[MBP10]
    assert got.dtype.names[-1] == "ts_out"
    np.testing.assert_array_equal(got["ts_out"], recs["ts_recv"] + 5_000)
    np.testing.assert_array_equal(got["bid_px_09"], recs["price"] - 9 * 250_000_000)
    assert got.tobytes() == recs.tobytes()
    # records without the 8 trailing bytes in a ts_out file: length disagrees with the rtype
    bad = _mbp10(3)
    path = _write(tmp_path / "bad.dbn", _metadata(ts_out=True) + bad.tobytes())
    with pytest.raises(InputError, match="disagrees") as e:
        read_dbn(path)
    assert e.value.offset == len(_metadata(ts_out=True)) and e.value.record == 0


# ---------------------------------------------------------------------------------------
# mixed streams
# ---------------------------------------------------------------------------------------


def _mixed(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    mbp = _mbp10(40, instrument_ids=(17077, 5602))
    maps = _symbol_mappings(9)
    parts = []
    for i in range(40):
        if i % 5 == 0:
            parts.append(maps[i // 5 : i // 5 + 1].tobytes())
        parts.append(mbp[i : i + 1].tobytes())
    parts.append(maps[8:].tobytes())
    meta = databento_dbn.Metadata(
        dataset="GLBX.MDP3", schema=None, start=0, stype_in=None,
        stype_out=databento_dbn.SType.INSTRUMENT_ID, symbols=[], partial=[], not_found=[],
        mappings=[], end=None, limit=None, ts_out=False, version=3,
    ).encode()  # fmt: skip
    path = _write(tmp_path / "mixed.dbn.zst", meta + b"".join(parts), zst=True)
    return path, mbp, maps


@pytest.mark.parametrize("chunk_bytes", [64 << 20, 1000, 377])
def test_mixed_stream_splits_by_rtype(tmp_path: Path, chunk_bytes: int) -> None:
    path, mbp, maps = _mixed(tmp_path)
    chunks = list(iter_chunks(path, chunk_bytes=chunk_bytes))
    got_mbp, got_maps = _concat(chunks, MBP10), _concat(chunks, SYMBOL_MAPPING)
    assert got_mbp.dtype == mbp.dtype and got_maps.dtype == maps.dtype
    assert got_mbp.tobytes() == mbp.tobytes()
    assert got_maps.tobytes() == maps.tobytes()
    assert [bytes(s) for s in got_maps["stype_in_symbol"]] == [f"ES{i}".encode() for i in range(9)]
    dbn, recs = read_dbn(path)
    assert dbn.schema is None and set(recs) == {MBP10, SYMBOL_MAPPING}
    # databento agrees on the MBP-10 records of the mixed stream
    ref = databento.DBNStore.from_file(path).to_ndarray(schema="mbp-10")
    assert ref.tobytes() == recs[MBP10].tobytes()


def test_mixed_stream_instrument_filter_keeps_mappings(tmp_path: Path) -> None:
    path, mbp, maps = _mixed(tmp_path)
    _, recs = read_dbn(path, instrument_ids=[5602])
    assert len(recs[MBP10]) == 20
    assert (recs[MBP10]["instrument_id"] == 5602).all()
    assert recs[MBP10].tobytes() == mbp[mbp["instrument_id"] == 5602].tobytes()
    assert recs[SYMBOL_MAPPING].tobytes() == maps.tobytes()  # never filtered


# ---------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------


def _raises(path: Path, *, chunk_bytes: int = 64 << 20) -> InputError:
    """InputError from iter_chunks, naming the file; read_dbn fails the same way."""
    with pytest.raises(InputError) as e:
        for _ in iter_chunks(path, chunk_bytes=chunk_bytes):
            pass
    assert str(path) in str(e.value)
    with pytest.raises(InputError) as whole:
        read_dbn(path)
    assert str(path) in str(whole.value)
    assert whole.value.problem.split(" (")[0] == e.value.problem.split(" (")[0]
    assert (whole.value.offset, whole.value.record) == (e.value.offset, e.value.record)
    return e.value


def test_empty_file(tmp_path: Path) -> None:
    for name in ("e.dbn", "e.dbn.zst"):
        p = tmp_path / name
        p.write_bytes(b"")
        assert "empty" in str(_raises(p))
        with pytest.raises(InputError, match="empty"):
            open_dbn(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot open"):
        open_dbn(tmp_path / "nope.dbn")


def test_random_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    p = _write(tmp_path / "r.dbn.zst", b"XY" + rng.bytes(5000))
    err = _raises(p)
    assert "not a DBN file" in str(err) and err.offset == 0
    assert "decompressed" not in str(err)  # not zstd, whatever its name: the offset is the file's
    # zstd data that decompresses to something else than DBN
    p = _write(tmp_path / "r2.dbn.zst", b"PK" + rng.bytes(5000), zst=True)
    assert "not a DBN file" in str(_raises(p)) and "of the decompressed stream" in str(_raises(p))


def test_bad_version_and_metadata(tmp_path: Path) -> None:
    meta = bytearray(_metadata())
    meta[3] = 9
    err = _raises(_write(tmp_path / "v.dbn", bytes(meta)))
    assert "unsupported DBN version 9" in str(err)
    meta = bytearray(_metadata())
    meta[8:24] = b"\xff" * 16  # garbage dataset / schema fields
    meta[24:40] = b"\xff" * 16
    err = _raises(_write(tmp_path / "m.dbn", bytes(meta)))
    assert "metadata" in str(err) and err.offset == 8
    err = _raises(_write(tmp_path / "short.dbn", _metadata()[:50]))
    assert "inside the metadata" in str(err)


def _plain_mbp10(tmp_path: Path, n: int = 10) -> tuple[bytearray, int]:
    meta = _metadata()
    return bytearray(meta + _mbp10(n).tobytes()), len(meta)


def test_length_disagrees_with_rtype(tmp_path: Path) -> None:
    raw, h = _plain_mbp10(tmp_path)
    raw[h + 3 * 368] = 91  # record 3
    err = _raises(_write(tmp_path / "l.dbn", bytes(raw)))
    assert "disagrees" in str(err) and err.offset == h + 3 * 368 and err.record == 3
    raw, h = _plain_mbp10(tmp_path)
    raw[h + 4 * 368] = 0  # zero length
    err = _raises(_write(tmp_path / "z.dbn", bytes(raw)), chunk_bytes=1000)
    assert "length 0" in str(err) and err.offset == h + 4 * 368 and err.record == 4


def test_unknown_rtype(tmp_path: Path) -> None:
    raw, h = _plain_mbp10(tmp_path)
    raw[h + 2 * 368 + 1] = 0x7F
    err = _raises(_write(tmp_path / "u.dbn.zst", bytes(raw), zst=True))
    assert "unknown record type" in str(err) and "0x7F" in str(err)
    assert err.offset == h + 2 * 368 and err.record == 2


def test_trailing_partial_record(tmp_path: Path) -> None:
    raw, h = _plain_mbp10(tmp_path, n=6)
    cut = bytes(raw[: h + 5 * 368 + 100])
    for chunk_bytes in (64 << 20, 1000, 368):
        err = _raises(_write(tmp_path / "p.dbn", cut), chunk_bytes=chunk_bytes)
        assert "inside a record" in str(err)
        assert err.offset == h + 5 * 368 and err.record == 5


def test_corrupt_zstd_frame(tmp_path: Path) -> None:
    _need_data()
    data = bytearray(MBO_ZST.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(b ^ 0x5A for b in data[mid : mid + 64])
    p = tmp_path / "corrupt.dbn.zst"
    p.write_bytes(bytes(data))
    err = _raises(p)
    assert "corrupt zstd" in str(err)  # here the content checksum catches it (Databento writes one)
    assert err.offset is not None and 0 < err.offset <= 206 + 68_792 * 56


def _frame_ends(data: bytes) -> list[int]:
    """Compressed offsets where a zstd frame of ``data`` ends."""
    ends, pos = [], 0
    while pos < len(data):
        obj = zstandard.ZstdDecompressor().decompressobj()
        obj.decompress(data[pos:])
        assert obj.eof
        pos = len(data) - len(obj.unused_data)
        ends.append(pos)
    return ends


@pytest.fixture(scope="module")
def mbo_zst(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, np.ndarray, list[int], Path]:
    _need_data()
    data = MBO_ZST.read_bytes()
    _, recs = read_dbn(MBO_ZST)
    return data, recs[MBO], _frame_ends(data), tmp_path_factory.mktemp("cut")


def test_truncated_zstd_at_the_last_byte(mbo_zst) -> None:
    data, _, ends, tmp = mbo_zst
    assert ends[-1] == len(data) and len(ends) >= 2
    p = tmp / "last.dbn.zst"
    p.write_bytes(data[:-1])  # every record decodes, but the frame checksum is missing
    err = _raises(p)
    assert "truncated" in str(err) and err.offset == 206 + 68_792 * 56


def test_header_cut_short_names_where_the_file_ends(mbo_zst) -> None:
    """A file cut inside its first zstd frame gives no decompressed byte to point at: the error
    says where the file itself ends, inside the frame (a fresh-user walk read "at byte offset 0
    of the decompressed stream" as damage at the start)."""
    data, _, ends, tmp = mbo_zst
    sample = PROJECT / "data" / "glbx-mdp3-20240306.mbp-10.dbn.zst"  # one frame: its first block is large
    cases = [(data, ends[0] // 2)] + ([(sample.read_bytes(), 100)] if sample.is_file() else [])
    for raw, cut in cases:  # 100 bytes of the sample: the walk had passed the end (offset 2041 reported)
        p = tmp / "head.dbn.zst"
        p.write_bytes(raw[:cut])
        with pytest.raises(InputError) as e:
            open_dbn(p)
        assert "truncated" in str(e.value) and e.value.offset == cut
        assert str(e.value).endswith(f"(at byte offset {cut})")


def test_cut_at_a_frame_end_is_a_valid_shorter_stream(mbo_zst) -> None:
    """Known limit: a cut exactly between zstd frames leaves a valid DBN stream.

    Databento writes the metadata in its own frame; cut right after it, the file is a
    well-formed DBN file with no records (logged as a warning), indistinguishable from an
    empty query result.
    """
    data, _, ends, tmp = mbo_zst
    p = tmp / "frame.dbn.zst"
    p.write_bytes(data[: ends[0]])
    dbn, recs = read_dbn(p)
    assert dbn.header_size == 206 and len(recs[MBO]) == 0


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(frac=st.floats(min_value=0.0, max_value=1.0, exclude_max=True), small=st.booleans())
def test_truncated_zstd_anywhere(mbo_zst, frac: float, small: bool) -> None:
    data, full, ends, tmp = mbo_zst
    cut = int(frac * len(data)) if not small else int(frac * 400)
    p = tmp / "cut.dbn.zst"
    p.write_bytes(data[:cut])
    try:
        chunks = list(iter_chunks(p, chunk_bytes=1 << 20))
    except InputError as e:
        assert str(p) in str(e)
        with pytest.raises(InputError):
            read_dbn(p)
        return
    # no error: only possible when the cut falls exactly at the end of a zstd frame, and
    # then what came back is an exact prefix of the file's records
    assert cut in ends, f"cut at {cut} silently returned records"
    got = _concat(chunks, MBO)
    assert got.tobytes() == full[: len(got)].tobytes()


def test_zstd_stream_reader_is_silent_on_truncation(mbo_zst) -> None:
    """Why the reader walks the zstd frame headers first: ``stream_reader`` returns a short read, no error."""
    data, _, _, _ = mbo_zst
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data[: len(data) // 2]), read_across_frames=True)
    assert 0 < len(reader.read()) < 206 + 68_792 * 56


def test_damaged_bytes_anywhere_are_reported(tmp_path: Path) -> None:
    """A damaged block often still decodes (zstd alone cannot tell); the frame's content
    checksum, which Databento's files and the generator's carry, catches it. Eight bytes are
    overwritten at offsets spread over the whole compressed file: every case must end in an
    InputError naming the file (never a silent success with wrong records)."""
    src = PROJECT / "data" / "glbx-mdp3-20240306.trades.dbn.zst"
    if not src.exists():
        pytest.skip("data/ has no embedded sample")
    good = src.read_bytes()
    assert good[4] & 0x04, "the generator writes the zstd content checksum"
    _, ref = read_dbn(src)
    checksum_seen = 0
    for off in np.linspace(16, len(good) - 5, 24).astype(int):
        bad = bytearray(good)
        bad[off : off + 8] = b"\xde\xad\xbe\xef" * 2
        if bytes(bad) == good:
            continue
        p = tmp_path / f"damaged-{off}.dbn.zst"
        p.write_bytes(bytes(bad))
        try:
            _, got = read_dbn(p)
        except InputError as err:
            assert str(p) in str(err)
            checksum_seen += "checksum does not match" in str(err)
            continue
        raise AssertionError(f"damage at compressed offset {off} went unnoticed ({len(got[TRADES])} records)")
    assert len(ref[TRADES]) > 0 and checksum_seen > 0
