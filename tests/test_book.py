"""MBO book rebuild against an independent slow reference, MBP pass-through, trade flow."""

from __future__ import annotations

import databento as db
import numpy as np
import pytest
from conftest import ESH4_MBO, ESU4_MBP1, ESU4_TRADES, need
from reference import slow_rebuild

from alphafeat import book as bk
from alphafeat.types import UNDEF_PRICE


def _pad(side_levels, levels=10):
    px = np.full(levels, UNDEF_PRICE, dtype=np.int64)
    sz = np.zeros(levels, dtype=np.int64)
    ct = np.zeros(levels, dtype=np.int64)
    for j, (p, s, c) in enumerate(side_levels):
        px[j], sz[j], ct[j] = p, s, c
    return px, sz, ct


def test_rebuild_matches_slow_reference_on_real_esh4():
    recs = db.DBNStore.from_file(need(ESH4_MBO)).to_ndarray()
    raw, trades, n_unknown = bk.rebuild_mbo(recs)
    ref = slow_rebuild(recs)
    assert len(raw) == len(ref) > 40_000
    assert n_unknown == 0
    idx = np.array([r[0] for r in ref])
    np.testing.assert_array_equal(raw.pos, idx)
    for name, side in (("bid", 1), ("ask", 2)):
        px = np.stack([_pad(r[side])[0] for r in ref])
        sz = np.stack([_pad(r[side])[1] for r in ref])
        ct = np.stack([_pad(r[side])[2] for r in ref])
        np.testing.assert_array_equal(getattr(raw, f"{name}_px"), px)
        np.testing.assert_array_equal(getattr(raw, f"{name}_sz"), sz)
        np.testing.assert_array_equal(getattr(raw, f"{name}_ct"), ct)
    # trades are the T records, aggressor from side
    t = recs[recs["action"] == b"T"]
    assert len(trades) == len(t)
    np.testing.assert_array_equal(trades.size, t["size"])
    np.testing.assert_array_equal(trades.aggressor, np.where(t["side"] == b"B", 1, np.where(t["side"] == b"A", -1, 0)))
    # ES prices are near 4800 index points, not 48 or 480000
    mid = (raw.bid_px[-1, 0] + raw.ask_px[-1, 0]) / 2 * 1e-9
    assert 4000 < mid < 6000


def _mbo(rows):
    dt = np.dtype([(n, "S1" if t.startswith("S") else t) for n, t in
                   [("length", "u1"), ("rtype", "u1"), ("publisher_id", "u2"), ("instrument_id", "u4"),
                    ("ts_event", "u8"), ("order_id", "u8"), ("price", "i8"), ("size", "u4"),
                    ("flags", "u1"), ("channel_id", "u1"), ("action", "S1"), ("side", "S1"),
                    ("ts_recv", "u8"), ("ts_in_delta", "i4"), ("sequence", "u4")]])
    a = np.zeros(len(rows), dtype=dt)
    for k, (act, side, oid, px, sz, flags) in enumerate(rows):
        a[k]["action"], a[k]["side"], a[k]["order_id"] = act, side, oid
        a[k]["price"], a[k]["size"], a[k]["flags"] = int(px * 1e9), sz, flags
        a[k]["ts_recv"] = a[k]["ts_event"] = 1_000 + k
    return a


def test_hand_built_events():
    L = 0x80
    recs = _mbo([
        (b"A", b"B", 1, 100.00, 5, 0),
        (b"A", b"B", 2, 100.00, 3, L),      # row 0: bid 100 x 8 (2 orders)
        (b"A", b"A", 3, 100.25, 4, L),      # row 1: ask 100.25 x 4
        (b"T", b"B", 0, 100.25, 2, 0),      # trade: no book change, no row
        (b"F", b"A", 3, 100.25, 2, 0),
        (b"C", b"A", 3, 100.25, 2, L),      # row 2: partial cancel -> ask x 2
        (b"M", b"B", 1, 99.75, 6, L),       # row 3: order 1 moves to 99.75
        (b"T", b"A", 0, 100.00, 1, L),      # F_LAST on a pure trade: no new row
        (b"R", b"N", 0, 0, 0, L),           # row 4: clear
    ])
    raw, trades, _ = bk.rebuild_mbo(recs)
    assert len(raw) == 5
    bid = raw.bid_px[:, 0] * 1e-9
    np.testing.assert_allclose(bid[:4], [100.0, 100.0, 100.0, 100.0])
    np.testing.assert_array_equal(raw.bid_sz[:4, 0], [8, 8, 8, 3])
    np.testing.assert_array_equal(raw.bid_sz[3, :2], [3, 6])
    np.testing.assert_array_equal(raw.ask_sz[1:4, 0], [4, 2, 2])
    assert raw.bid_px[4, 0] == UNDEF_PRICE and raw.ask_sz[4, 0] == 0
    # trade flow: trade at record 3 belongs to row 2 (first row after it), record 7 to row 4
    b = bk.to_book_arrays(raw, trades)
    np.testing.assert_array_equal(b.buy_volume, [0, 0, 2, 0, 0])
    np.testing.assert_array_equal(b.sell_volume, [0, 0, 0, 0, 1])
    np.testing.assert_array_equal(b.trade_count, [0, 0, 1, 0, 1])
    assert np.isnan(b.bid_px[4, 0])


def test_mbp1_passthrough_with_trades_file():
    recs = db.DBNStore.from_file(need(ESU4_MBP1)).to_ndarray()
    tr = db.DBNStore.from_file(need(ESU4_TRADES)).to_ndarray()
    raw, stream_trades = bk.mbp_snapshots(recs)
    assert raw.depth == 1
    keep = (recs["flags"] & 0x80 != 0) & ~np.isin(recs["action"], [b"T", b"F"])
    np.testing.assert_array_equal(raw.bid_px[:, 0], recs["bid_px_00"][keep])
    np.testing.assert_array_equal(raw.ask_sz[:, 0], recs["ask_sz_00"][keep])
    assert np.all(raw.bid_px[:, 1:] == UNDEF_PRICE)
    trades = bk.trades_from_records(tr)
    b = bk.to_book_arrays(raw, trades)
    # independent assignment: each trade goes to the first row with ts_recv >= its ts_recv
    exp_buy = np.zeros(len(raw))
    for t in tr.tolist():
        rec = dict(zip(tr.dtype.names, t))
        i = next((i for i, ts in enumerate(raw.ts_recv) if ts >= rec["ts_recv"]), None)
        if i is not None and rec["side"] == b"B":
            exp_buy[i] += rec["size"]
    np.testing.assert_array_equal(b.buy_volume, exp_buy)
    assert b.buy_volume.sum() + b.sell_volume.sum() > 0


@pytest.mark.parametrize("n_levels", [1, 10])
def test_mbp_depth_columns(n_levels):
    raw = bk.RawBook(
        np.arange(3), np.arange(3), np.arange(3),
        np.full((3, 10), UNDEF_PRICE), np.full((3, 10), UNDEF_PRICE),
        np.zeros((3, 10), np.int64), np.zeros((3, 10), np.int64),
        np.zeros((3, 10), np.int64), np.zeros((3, 10), np.int64), n_levels,
    )
    empty = bk.Trades(*(np.zeros(0, np.int64) for _ in range(5)), np.zeros(0, np.int8))
    b = bk.to_book_arrays(raw, empty)
    assert b.depth == n_levels and np.isnan(b.bid_px).all() and (b.trade_count == 0).all()


def test_book_in_a_reused_buffer_equals_fresh_arrays_and_is_never_overwritten_while_alive():
    """to_book_arrays(buffer=pinned_buffer) gives the same values; the pool hands out a
    buffer again only once no array of the book built in it is alive."""
    from pathlib import Path

    from alphafeat.cuda.kernels import pinned_buffer
    from alphafeat.dbn import read_dbn

    data = Path(__file__).resolve().parents[1] / "data"
    _, recs = read_dbn(data / "glbx-mdp3-20240306.mbp-10.dbn.zst")
    mbp = recs[0x0A]
    iid = np.bincount(mbp["instrument_id"]).argmax()
    _, tr = read_dbn(data / "glbx-mdp3-20240306.trades.dbn.zst", instrument_ids=[int(iid)])
    raw, _ = bk.mbp_snapshots(mbp[mbp["instrument_id"] == iid])
    trades = bk.trades_from_records(tr[0x00])
    fresh = bk.to_book_arrays(raw, trades)
    assert trades.size.sum() > 0 and fresh.buy_volume.sum() + fresh.sell_volume.sum() == trades.size.sum()
    names = ["bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct", "buy_volume", "sell_volume", "trade_count"]
    b1 = bk.to_book_arrays(raw, trades, buffer=pinned_buffer)
    b2 = bk.to_book_arrays(raw.take(np.arange(len(raw)) < len(raw) // 2), trades, buffer=pinned_buffer)
    for name in names:
        np.testing.assert_array_equal(getattr(b1, name), getattr(fresh, name), err_msg=name)
        assert not np.shares_memory(getattr(b1, name), getattr(b2, name))  # b1 alive: not reused
    snapshot = {name: getattr(b1, name).copy() for name in names}
    b3 = bk.to_book_arrays(raw, trades, buffer=pinned_buffer)  # b1 and b2 alive: a third buffer
    for name in names:
        np.testing.assert_array_equal(getattr(b1, name), snapshot[name], err_msg=name)
        np.testing.assert_array_equal(getattr(b3, name), snapshot[name], err_msg=name)
