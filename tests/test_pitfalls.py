"""The public pitfalls of DBN futures data (issue 3), each with a small input.

Databento's own decoder (``databento.DBNStore``) is the oracle for the decoded records.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import databento
import databento_dbn
import numpy as np
import zstandard
from test_dbn import _mbp10, _metadata

from alphafeat import book as bk
from alphafeat.dbn import read_dbn, record_dtype
from alphafeat.instruments import Symbology, insert_symbol_mappings, session_dates
from alphafeat.plan import Segment, make_plan
from alphafeat.precompute.books import build_book, load_book, save_book
from alphafeat.types import UNDEF_PRICE

MBP10, MBO, SMAP = 0x0A, 0xA0, 0x16
NS = 10**9


class _Iv:
    def __init__(self, a: dt.date, b: dt.date, sym: str) -> None:
        self.start_date, self.end_date, self.symbol = a, b, sym


class _Map:
    def __init__(self, raw: str, ivs: list[_Iv]) -> None:
        self.raw_symbol, self.intervals = raw, ivs


def _meta(*, schema=databento_dbn.Schema.MBP_10, version: int = 3, mappings=(), stype_in=None,
          symbols=("ES.FUT",), start: int = 1_709_500_000 * NS) -> bytes:  # fmt: skip
    return databento_dbn.Metadata(
        dataset="GLBX.MDP3", schema=schema, start=start,
        stype_in=stype_in or databento_dbn.SType.PARENT, stype_out=databento_dbn.SType.INSTRUMENT_ID,
        symbols=list(symbols), partial=[], not_found=[], mappings=list(mappings), end=None, limit=None,
        ts_out=False, version=version,
    ).encode()  # fmt: skip


def _oracle(path: Path) -> np.ndarray:
    return databento.DBNStore.from_file(path).to_ndarray()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(zstandard.ZstdCompressor().compress(data))
    return path


def _ct(y: int, m: int, d: int, h: int, mi: int = 0) -> int:
    """ns of a Chicago wall time."""
    from zoneinfo import ZoneInfo

    return int(dt.datetime(y, m, d, h, mi, tzinfo=ZoneInfo("America/Chicago")).timestamp()) * NS


def test_ts_out_through_segment_books(tmp_path: Path) -> None:
    """A trailing ts_out on every record: the segment reader steps over it; the book (built,
    then kept and read back) is that of the same records without it."""
    recs = _mbp10(20, ts_out=True)
    p = _write(tmp_path / "t.dbn.zst", _metadata(ts_out=True) + recs.tobytes())
    q = _write(tmp_path / "n.dbn.zst", _metadata() + _mbp10(20).tobytes())  # the same records, no ts_out
    day = session_dates(np.asarray(recs["ts_recv"][:1]).astype(np.int64))[0].astype(dt.date)
    seg = Segment(day, 17077, "ESZ3", "ES", "mbp-10", (str(p),), (), "root=ES/x.arrow")
    got, n, _ = build_book(seg)
    ref, _, _ = build_book(Segment(day, 17077, "ESZ3", "ES", "mbp-10", (str(q),), (), "root=ES/x.arrow"))
    assert n == 20 and len(got) == len(ref) > 0
    save_book(got, tmp_path / "pre" / "book")
    warm = load_book(tmp_path / "pre" / "book")  # what a rerun reads
    for f in ("ts_event", "ts_recv", "bid_px", "ask_px", "bid_sz", "ask_sz", "buy_volume", "sell_volume"):
        assert np.array_equal(getattr(got, f), getattr(ref, f), equal_nan=True), f
        assert np.array_equal(getattr(warm, f), getattr(ref, f), equal_nan=True), f


def test_v1_and_v3_symbol_lengths(tmp_path: Path) -> None:
    """v1 metadata / mapping records carry 22-byte symbols, v2+ 71-byte ones."""
    day = dt.date(2024, 3, 6)
    for version, width in ((1, 22), (3, 71)):
        dtype = record_dtype(SMAP, version)
        assert dtype["stype_in_symbol"].itemsize == width
        m = np.zeros(2, dtype=dtype)
        m["length"], m["rtype"] = dtype.itemsize // 4, SMAP
        m["instrument_id"] = [17077, 5602]
        m["ts_event"] = _ct(2024, 3, 5, 17)
        m["stype_in_symbol"] = [b"ESH4", b"ESM4"]
        m["stype_out_symbol"] = [b"17077", b"5602"]
        m["start_ts"], m["end_ts"] = _ct(2024, 3, 5, 17), _ct(2024, 3, 7, 16)
        meta = _meta(schema=None, version=version, symbols=["ES.FUT"])
        p = _write(tmp_path / f"live{version}.dbn.zst", meta + m.tobytes())
        dbn, out = read_dbn(p)
        assert dbn.version == version and out[SMAP].tobytes() == m.tobytes()
        sym = Symbology.build([dbn.metadata], symbol_mappings=[out[SMAP]])
        assert sym.resolve(17077, day) == "ESH4" and sym.resolve(5602, day) == "ESM4"
        assert sym.resolve(17077, dt.date(2024, 3, 20)) is None


def test_undef_price_levels_become_nan_and_prices_are_index_points(tmp_path: Path) -> None:
    recs = _mbp10(4)
    recs["price"] = 4_800_250_000_000
    for lvl in range(10):
        recs[f"bid_px_{lvl:02d}"] = 4_800_000_000_000 - lvl * 250_000_000
    for lvl in range(6, 10):  # a thin book: levels 7-10 empty
        recs[f"bid_px_{lvl:02d}"] = UNDEF_PRICE
        recs[f"bid_sz_{lvl:02d}"] = 0
    p = _write(tmp_path / "u.dbn.zst", _metadata() + recs.tobytes())
    _, out = read_dbn(p)
    assert out[MBP10].tobytes() == _oracle(p).tobytes()
    raw, trades = bk.mbp_snapshots(out[MBP10])
    b = bk.to_book_arrays(raw, trades)
    assert np.isnan(b.bid_px[:, 6:]).all() and np.isfinite(b.bid_px[:, :6]).all()
    assert 4700 < b.bid_px[0, 0] < 4900  # index points: not 48, not 4.8e12
    assert b.bid_px[0, 0] == 4800.0 and b.bid_px[0, 1] == 4799.75


def test_tick_prices_convert_to_exact_quarters() -> None:
    """Every ES tick price from 4000 to 6000 points converts to the exact quarter (as Python's
    correctly rounded int / 10**9 gives it); ``x * 1e-9`` is one bit off for about 5 % of them."""
    ticks = np.arange(4000 * 4, 6000 * 4 + 1, dtype=np.int64)
    raw = ticks * 250_000_000
    n = len(raw)
    book = bk.RawBook(
        ts_event=np.arange(n, dtype=np.int64), ts_recv=np.arange(n, dtype=np.int64),
        bid_px=np.repeat(raw[:, None], 10, 1), ask_px=np.repeat(raw[:, None] + 250_000_000, 10, 1),
        bid_sz=np.ones((n, 10), np.int64), ask_sz=np.ones((n, 10), np.int64),
        bid_ct=np.ones((n, 10), np.int64), ask_ct=np.ones((n, 10), np.int64), pos=np.arange(n, dtype=np.int64),
    )  # fmt: skip
    empty = np.zeros(0, dtype=np.int64)
    b = bk.to_book_arrays(book, bk.Trades(empty, empty, empty, empty, empty, empty))
    expect = np.array([int(x) / 10**9 for x in raw])
    np.testing.assert_array_equal(b.bid_px[:, 0], expect)
    np.testing.assert_array_equal(b.bid_px[:, 0] * 4, ticks.astype(np.float64))


def test_bad_ts_recv_and_maybe_bad_book_flags_are_kept(tmp_path: Path) -> None:
    recs = _mbp10(6)
    recs["flags"] = [0x80, 0x80 | bk.F_BAD_TS_RECV, 0x80 | bk.F_MAYBE_BAD_BOOK, 0x80, 0x88, 0x84]
    p = _write(tmp_path / "f.dbn.zst", _metadata() + recs.tobytes())
    _, out = read_dbn(p)
    ref = _oracle(p)
    np.testing.assert_array_equal(out[MBP10]["flags"], ref["flags"])
    assert ((out[MBP10]["flags"] & bk.F_BAD_TS_RECV) != 0).sum() == 2
    assert len(bk.mbp_snapshots(out[MBP10])[0]) == 6  # decoded, not silently dropped


def test_snapshot_records_of_size_zero(tmp_path: Path) -> None:
    """A clear ('R') and F_SNAPSHOT adds of size 0 (empty book at snapshot time)."""
    dtype = record_dtype(MBO, 3)
    a = np.zeros(4, dtype=dtype)
    a["length"], a["rtype"], a["instrument_id"] = dtype.itemsize // 4, MBO, 17077
    a["ts_event"] = a["ts_recv"] = _ct(2024, 3, 6, 8) + np.arange(4)
    a["action"] = [b"R", b"A", b"A", b"A"]
    a["side"] = [b"N", b"B", b"A", b"B"]
    a["flags"] = [0x20, 0x20, 0x20 | 0x80, 0x80]
    a["size"] = [0, 0, 0, 5]
    a["price"] = [UNDEF_PRICE, 4_800_000_000_000, 4_800_250_000_000, 4_800_000_000_000]
    a["order_id"] = [0, 1, 2, 3]
    p = _write(tmp_path / "s.dbn.zst", _meta(schema=databento_dbn.Schema.MBO) + a.tobytes())
    _, out = read_dbn(p)
    assert out[MBO].tobytes() == _oracle(p).tobytes()
    raw, _, _ = bk.rebuild_mbo(out[MBO])
    assert len(raw) >= 1
    last = bk.to_book_arrays(raw, bk.Trades(*[np.empty(0, np.int64)] * 5, np.empty(0, np.int8)))
    assert last.bid_sz[-1, 0] == 5  # the size-0 snapshot adds leave no phantom size


def test_session_boundary_is_16_00_chicago(tmp_path: Path) -> None:
    ts = np.array([_ct(2024, 3, 8, 15, 59), _ct(2024, 3, 8, 16, 0), _ct(2024, 3, 11, 15, 59)], dtype=np.int64)
    assert [d.item().isoformat() for d in session_dates(ts)] == ["2024-03-08", "2024-03-09", "2024-03-11"]
    # 2024-03-08 22:30 UTC is still March 8 in UTC, but the next session in Chicago
    assert session_dates(np.array([_ct(2024, 3, 8, 16, 30)]))[0].item() == dt.date(2024, 3, 9)


def _book_file(path: Path, rows: list[tuple[int, int, str]], mappings) -> Path:
    """MBP-10 records (ts, instrument_id, action) under ES.FUT mappings."""
    recs = _mbp10(len(rows))
    recs["ts_event"] = recs["ts_recv"] = [t for t, _, _ in rows]
    recs["instrument_id"] = [i for _, i, _ in rows]
    recs["action"] = [a.encode() for _, _, a in rows]
    return _write(path, _meta(mappings=mappings) + recs.tobytes())


def test_roll_where_the_old_contract_still_trades(tmp_path: Path) -> None:
    ivs = lambda s, i: _Map(s, [_Iv(dt.date(2024, 3, 1), dt.date(2024, 3, 20), str(i))])  # noqa: E731
    maps = [ivs("ESH4", 17077), ivs("ESM4", 5602), ivs("ESH4-ESM4", 42140)]
    rows = []
    for day, (n_old, n_new) in zip((6, 7, 8, 11), ((9, 1), (3, 8), (4, 9), (2, 9)), strict=True):
        t = _ct(2024, 3, day, 9)
        rows += [(t + k, 17077, "T") for k in range(n_old)] + [(t + 100 + k, 5602, "T") for k in range(n_new)]
        rows += [(t + 200 + k, 42140, "T") for k in range(20)]  # the spread trades most: never chosen
    p = _book_file(tmp_path / "roll.mbp-10.dbn.zst", rows, maps)
    sched = make_plan([p]).schedule
    assert [c.raw_symbol for c in sched] == ["ESH4", "ESH4", "ESM4", "ESM4"]  # no switch back
    assert [c.session.day for c in sched] == [6, 7, 8, 11]
    cal = make_plan([p], roll_rule="calendar", roll_days=8).schedule  # ESH4 expires 2024-03-15
    assert [c.raw_symbol for c in cal] == ["ESH4", "ESM4", "ESM4", "ESM4"]


def test_instrument_id_reused_for_another_symbol_later(tmp_path: Path) -> None:
    maps = [
        _Map("ESH4", [_Iv(dt.date(2024, 3, 1), dt.date(2024, 3, 16), "777")]),
        _Map("ESZ5", [_Iv(dt.date(2024, 3, 18), dt.date(2024, 3, 30), "777")]),
    ]
    p = _book_file(tmp_path / "reuse.dbn.zst", [(_ct(2024, 3, 6, 9), 777, "T"), (_ct(2024, 3, 19, 9), 777, "T")], maps)
    plan = make_plan([p])
    got = [(c.session.isoformat(), c.raw_symbol) for c in plan.schedule]
    assert got == [("2024-03-06", "ESH4"), ("2024-03-19", "ESZ5")]
    sym = Symbology.build([plan.files[0].metadata])
    assert sym.resolve(777, dt.date(2024, 3, 6)) == "ESH4" and sym.resolve(777, dt.date(2024, 3, 19)) == "ESZ5"


def test_continuous_symbol_file_follows_the_mapped_instrument(tmp_path: Path) -> None:
    maps = [_Map("ES.v.0", [_Iv(dt.date(2024, 3, 1), dt.date(2024, 3, 8), "17077"),
                            _Iv(dt.date(2024, 3, 8), dt.date(2024, 3, 20), "5602")])]  # fmt: skip
    recs = _mbp10(2)
    recs["ts_event"] = recs["ts_recv"] = [_ct(2024, 3, 6, 9), _ct(2024, 3, 11, 9)]
    recs["instrument_id"] = [17077, 5602]
    meta = _meta(mappings=maps, stype_in=databento_dbn.SType.CONTINUOUS, symbols=["ES.v.0"])
    p = _write(tmp_path / "cont.dbn.zst", meta + recs.tobytes())
    sched = make_plan([p]).schedule
    # each date's contract, named by its id without definitions (tests/test_user_files.py names them)
    assert [(c.instrument_id, c.raw_symbol) for c in sched] == [(17077, "id17077"), (5602, "id5602")]
    m = np.zeros(1, dtype=record_dtype(SMAP, 3))
    imap = Symbology.build([]).imap
    insert_symbol_mappings(imap, m[:0])  # no record: nothing inserted, no error
