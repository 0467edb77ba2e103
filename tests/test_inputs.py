"""Reading DBN inputs: the plan's scans (parallel, Dask backend, kept between runs), a
segment's reads (its instrument only), kept books, and bad inputs (one-line errors with the
byte offset, ``--on-error skip``) through the CLI and the API."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import joblib
import numpy as np
import pytest
import zstandard
from test_dbn import _mbp10, _metadata

from alphafeat import book as bk
from alphafeat import plan as plan_mod
from alphafeat import plan_scan
from alphafeat.cli import main
from alphafeat.errors import InputError
from alphafeat.instruments import InstrumentMode
from alphafeat.plan import make_plan
from alphafeat.precompute import books as segment

DATA = Path(__file__).resolve().parents[1] / "data"
ALL = InstrumentMode("all")


def _file(tmp: Path, name: str, n: int = 50, ids=(17077, 5602)) -> tuple[Path, np.ndarray]:
    recs = _mbp10(n, instrument_ids=ids)
    p = tmp / name
    p.write_bytes(zstandard.ZstdCompressor().compress(_metadata() + recs.tobytes()))
    return p, recs


def _segments(plan: plan_mod.Plan) -> list[tuple]:
    return [(s.session, s.instrument_id, s.raw_symbol, s.book_files, s.relpath) for s in plan.segments]


def _same_book(a, b) -> bool:
    return all(
        np.array_equal(np.asarray(getattr(a, f.name), float), np.asarray(getattr(b, f.name), float), equal_nan=True)
        if isinstance(getattr(a, f.name), np.ndarray) else getattr(a, f.name) == getattr(b, f.name)
        for f in dataclasses.fields(a)
    )  # fmt: skip


def test_parallel_plan_equals_serial_and_a_segment_reads_only_its_instrument(tmp_path: Path) -> None:
    files, recs = zip(*(_file(tmp_path, f"f{i}.dbn.zst", 40 + i) for i in range(3)), strict=True)
    serial = make_plan(files, mode=ALL)
    par = make_plan(files, mode=ALL, jobs=2)
    assert _segments(par) == _segments(serial)
    assert par.scanned == 3  # no symbol mappings in the metadata: the records answer
    assert sorted(s.instrument_id for s in par.segments) == [5602, 17077]
    seg = next(s for s in par.segments if s.instrument_id == 5602)
    assert seg.book_files == tuple(str(f) for f in files) and seg.trade_files == ()
    got, n, notes = segment.build_book(seg)
    mine = np.concatenate(recs)
    mine = mine[mine["instrument_id"] == 5602]
    assert n == len(mine) == 20 + 20 + 21 and not notes
    assert _same_book(got, bk.to_book_arrays(*bk.mbp_snapshots(mine)))


def test_dask_backend(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    files = [_file(tmp_path, f"d{i}.dbn.zst")[0] for i in range(2)]
    ref = make_plan(files, mode=ALL)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cl:
        with distributed.Client(cl) as client, joblib.parallel_config(backend="dask"):
            got = make_plan(files, mode=ALL, jobs=2)
            book, n, _ = client.submit(segment.build_book, got.segments[0]).result()
    assert _segments(got) == _segments(ref)
    assert n == 50 and _same_book(book, segment.build_book(ref.segments[0])[0])


def test_plan_scans_kept_and_invalidated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p, _ = _file(tmp_path, "c.dbn.zst")
    pre = tmp_path / "pre"
    cold = make_plan([p], mode=ALL, survey_dir=pre)
    kept = sorted((pre / "survey").iterdir())
    assert len(kept) == 1 and kept[0].suffix == ".json"
    scan = plan_scan._scan_file
    monkeypatch.setattr(plan_scan, "_scan_file", lambda *a: pytest.fail("a kept scan was read again"))
    assert _segments(make_plan([p], mode=ALL, survey_dir=pre)) == _segments(cold)
    # a changed source (mtime) is scanned again under a new key, so is a new survey version
    monkeypatch.setattr(plan_scan, "_scan_file", scan)
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    assert _segments(make_plan([p], mode=ALL, survey_dir=pre)) == _segments(cold)
    assert len(list((pre / "survey").iterdir())) == 2
    key = plan_scan._survey_key(p)
    monkeypatch.setattr(plan_scan, "SURVEY_VERSION", plan_scan.SURVEY_VERSION + 1)
    assert plan_scan._survey_key(p) != key
    assert not [c for c in (pre / "survey").iterdir() if c.name.startswith(".")]  # no temporary left


def _plain(tmp: Path, name: str, ids=(17077, 5602)) -> Path:
    """An uncompressed MBP-10 file of 50 records (its size does not depend on the ids)."""
    p = tmp / name
    p.write_bytes(_metadata() + _mbp10(50, instrument_ids=ids).tobytes())
    return p


def _same_plan(a: plan_mod.Plan, b: plan_mod.Plan) -> bool:
    heads = lambda p: [(f.path, f.version, f.schema, f.ts_out, f.compressed, f.header_size, f.metadata.start,  # noqa: E731
                        f.metadata.end, f.metadata.symbols, f.metadata.mappings, str(f.metadata.stype_in))
                       for f in p.files]  # fmt: skip
    return (heads(a) == heads(b) and a.schedule == b.schedule and a.segments == b.segments and a.notes == b.notes
            and (a.schema, a.skipped, a.scanned, a.continuous) == (b.schema, b.skipped, b.scanned, b.continuous))


def test_plan_kept_and_never_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rerun over the same files takes the kept plan (no header opened, no scan read); a
    touched file, a file replaced (even by one of the same size with its mtime kept), a file
    added to the input folder or other plan options plan again, and that plan sees the new data."""
    d = tmp_path / "in"
    d.mkdir()
    p, q = _plain(d, "p.dbn"), _plain(d, "q.dbn")
    pre = tmp_path / "pre"
    opened: list[Path] = []
    open_dbn = plan_mod.open_dbn
    monkeypatch.setattr(plan_mod, "open_dbn", lambda f: opened.append(f) or open_dbn(f))

    def plan(**kw: object) -> plan_mod.Plan:
        opened.clear()
        return make_plan([d], mode=kw.pop("mode", ALL), survey_dir=pre, **kw)

    def planned_again(**kw: object) -> bool:  # the plan opened every file, and equals one made afresh
        got = plan(**kw)
        n = len(opened)
        return n == len(list(d.iterdir())) and _same_plan(got, make_plan([d], mode=kw.get("mode", ALL)))

    cold = plan()
    assert len(opened) == 2 and len(list((pre / "plan").glob("*.json"))) == 1
    assert _same_plan(plan(), cold) and opened == []  # the kept plan: nothing opened
    assert _same_plan(make_plan([d], mode=ALL), cold)  # equal to a plan made afresh
    assert planned_again(mode=InstrumentMode.parse("id=5602"))  # other options
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))  # touched
    assert planned_again()
    # q replaced by another file of the same size, its mtime kept: the new instrument is seen
    mtime = q.stat().st_mtime_ns
    r = _plain(tmp_path, "r.dbn", ids=(17077, 9999))
    assert r.stat().st_size == q.stat().st_size
    os.replace(r, q)
    os.utime(q, ns=(mtime, mtime))
    assert planned_again()
    assert {s.instrument_id for s in plan().segments} == {17077, 5602, 9999}
    _plain(d, "s.dbn", ids=(4242,))  # a file added to the input folder
    assert planned_again()
    assert 4242 in {s.instrument_id for s in plan().segments}
    assert not [c for c in (pre / "plan").iterdir() if c.name.startswith(".")]  # no temporary left


def test_kept_plan_unreadable_or_of_other_code_is_planned_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    p = _plain(tmp_path, "p.dbn")
    pre = tmp_path / "pre"
    cold = make_plan([p], mode=ALL, survey_dir=pre)
    (kept,) = (pre / "plan").glob("*.json")
    kept.write_bytes(b"not json")
    assert _same_plan(make_plan([p], mode=ALL, survey_dir=pre), cold)  # planned again, and kept again
    assert kept.read_bytes() != b"not json"
    key = plan_mod.plan_key([p], ["all"])
    monkeypatch.setattr(plan_mod, "PLAN_VERSION", plan_mod.PLAN_VERSION + 1)
    assert plan_mod.plan_key([p], ["all"]) != key
    monkeypatch.setattr(plan_mod, "PLAN_VERSION", plan_mod.PLAN_VERSION - 1)
    monkeypatch.setattr(plan_mod, "_PLAN_CODE", (*plan_mod._PLAN_CODE, "bars.py"))  # the code hashed
    assert plan_mod.plan_key([p], ["all"]) != key


def test_kept_plan_headers_round_trip_every_dbn_version(tmp_path: Path) -> None:
    """A kept plan stores each header's metadata encoded; decoded again it equals the header
    read from the file, for DBN v1, v2 and v3 samples and the real files."""
    from conftest import REAL, SAMPLES, SKIP_REASON

    files = sorted(SAMPLES.glob("*.dbn*")) + sorted(REAL.glob("*.dbn*"))
    if not files:
        pytest.skip(SKIP_REASON)
    heads = [plan_mod.open_dbn(f) for f in files]
    plan = plan_mod.Plan("mbo", heads, [], [])
    kept = tmp_path / "plan.json"
    plan_mod._keep(kept, plan_mod._frozen(plan), "plan")
    back = plan_mod._thawed(plan_mod._load_kept(kept))
    assert {f.version for f in back.files} == {1, 2, 3}
    for a, b in zip(heads, back.files, strict=True):
        assert dataclasses.replace(a, metadata=None) == dataclasses.replace(b, metadata=None)
        for k in ("dataset", "schema", "start", "end", "limit", "stype_in", "stype_out", "symbols", "partial",
                  "not_found", "mappings", "ts_out", "version", "symbol_cstr_len"):  # fmt: skip
            assert getattr(a.metadata, k) == getattr(b.metadata, k), (a.path, k)


def test_plan_that_skipped_a_file_is_not_kept(tmp_path: Path) -> None:
    good, bad = _plain(tmp_path, "good.dbn"), tmp_path / "bad.dbn"
    bad.write_bytes(b"DBN\x09 not a dbn file")
    pre = tmp_path / "pre"
    plan = make_plan([good, bad], mode=ALL, on_error="skip", survey_dir=pre)
    assert [p for p, _ in plan.skipped] == [bad]
    assert not list((pre / "plan").glob("*.json"))


def test_kept_book_keys_and_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p, _ = _file(tmp_path, "k.dbn.zst")
    seg = make_plan([p], mode=ALL).segments[0]
    book, _, _ = segment.build_book(seg)
    key = segment.book_key(seg)
    d = tmp_path / "pre" / "book" / key
    segment.save_book(book, d)
    assert _same_book(segment.load_book(d), book)
    assert isinstance(segment.load_book(d).bid_px, np.memmap)
    assert not [c for c in d.parent.iterdir() if ".tmp-" in c.name]
    other = next(s for s in make_plan([p], mode=ALL).segments if s.instrument_id != seg.instrument_id)
    assert segment.book_key(other) != key  # another instrument, another book
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    assert segment.book_key(seg) != key  # a changed source
    key = segment.book_key(seg)
    monkeypatch.setattr(segment, "BOOK_FORMAT", segment.BOOK_FORMAT + 1)
    assert segment.book_key(seg) != key  # a new layout


def test_failed_decode_leaves_nothing_kept(tmp_path: Path) -> None:
    good, _ = _file(tmp_path, "good.dbn.zst")
    p, _ = _file(tmp_path, "bad.dbn.zst")
    p.write_bytes(p.read_bytes()[:-7])
    with pytest.raises(InputError, match="truncated"):
        make_plan([p], mode=ALL, survey_dir=tmp_path / "pre")
    assert not (tmp_path / "pre").exists()
    seg = dataclasses.replace(make_plan([good], mode=ALL).segments[0], book_files=(str(p),))
    with pytest.raises(InputError, match="truncated") as e:
        segment.build_book(seg)
    assert p.name in str(e.value) and "byte offset" in str(e.value)


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


def test_skip_in_make_plan(tmp_path: Path) -> None:
    bad = _bad_files(tmp_path)
    p, recs = _file(tmp_path, "ok.dbn.zst")
    plan = make_plan([bad["length"], p, bad["rtype"]], mode=ALL, on_error="skip", jobs=2)
    assert [s for s, _ in plan.skipped] == [bad["length"], bad["rtype"]]
    assert all("byte offset" in why for _, why in plan.skipped)
    assert {s.book_files for s in plan.segments} == {(str(p),)}
    assert sum(segment.build_book(s)[1] for s in plan.segments) == len(recs)
    with pytest.raises(InputError, match="disagrees"):
        make_plan([p, bad["length"]], mode=ALL, jobs=2)


def test_kept_scans_and_plans_are_json_data_never_code(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The plan's scans and the plan itself are kept as JSON with a format version (no pickle: a
    folder others can write runs no code here); a kept file that is corrupt, of another format
    version or not ours is ignored with a logged note, planned again and replaced."""
    import json
    import logging

    from alphafeat import kept as kept_data

    p = _plain(tmp_path, "p.dbn")
    pre = tmp_path / "pre"
    cold = make_plan([p], mode=ALL, survey_dir=pre)
    files = sorted((pre / "survey").glob("*.json")) + sorted((pre / "plan").glob("*.json"))
    assert len(files) == 2
    for f in files:
        doc = json.loads(f.read_text())
        assert doc["format"] == "alphafeat-kept" and doc["format_version"] == kept_data.FORMAT_VERSION
        assert f.read_bytes()[:1] == b"{"  # text, not a pickle stream
    survey, plan = files
    bad = {"corrupt": b"{\"format\": \"alphafeat-kept\", \"format_v",
           "other version": json.dumps({"format": "alphafeat-kept", "format_version": 999, "data": {}}).encode(),
           "not ours": json.dumps({"format": "something", "data": 1}).encode(),
           "a pickle": b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01.",
           "unknown class": json.dumps({"format": "alphafeat-kept", "format_version": kept_data.FORMAT_VERSION,
                                        "data": {"__kept__": "dataclass", "cls": "Popen", "v": {}}}).encode()}
    for why, content in bad.items():
        for f in (survey, plan):
            f.write_bytes(content)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="alphafeat.kept"):
            got = make_plan([p], mode=ALL, survey_dir=pre)
        assert _same_plan(got, cold), why
        assert "ignored (computed again)" in caplog.text, why
        assert all(f.read_bytes() != content for f in (survey, plan)), why  # kept again


def test_kept_values_round_trip() -> None:
    """What a kept scan or plan holds comes back equal and of the same types: tuples, dicts
    with tuple and int keys, dates, paths, bytes, numpy scalars, NaN and structured record
    arrays (padding and sub-arrays kept, every DBN schema and version)."""
    import datetime as dt

    from alphafeat import kept as kept_data
    from alphafeat.dbn import SCHEMA_RTYPES, record_dtype

    value = {"g": {160: {(19789, 17077): [3, 2.5, 10**18]}}, "p": Path("/a b"), "d": dt.date(2024, 3, 6),
             "t": (1, "x", None), "n": np.int64(-5), "f": float("nan"), "b": b"\x00\xff", "e": np.zeros(0)}
    back = kept_data.decode(kept_data.encode(value), {})
    assert back.keys() == value.keys() and np.isnan(back.pop("f")) and type(back["n"]) is np.int64
    assert back == {k: v for k, v in value.items() if k not in ("f", "e")} | {"e": back["e"]}
    for rt in sorted(set(SCHEMA_RTYPES.values())):
        for version in (1, 2, 3):
            a = np.zeros(4, record_dtype(rt, version))
            a.view(np.uint8)[:] = np.arange(a.nbytes) % 251
            b = kept_data.decode(kept_data.encode(a), {})
            assert b.dtype == a.dtype and b.tobytes() == a.tobytes(), (rt, version)
    with pytest.raises(kept_data.NotKept):
        kept_data.encode(np.array([object()]))
