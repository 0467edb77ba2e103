"""The segment worker's building blocks against the old path they replace.

* :class:`alphafeat.book.MBPBookBuilder` fed one instrument's MBP-10 / MBP-1 records in random
  chunk splits equals ``mbp_snapshots`` -> the session's rows -> ``to_book_arrays`` with the
  session's trades, column by column, exactly (trades from the book stream or a trades file;
  bounds that cut a stream spanning two sessions, or a file in the middle).
* :func:`alphafeat.precompute.table.book_mid` equals the ``mid`` feature bit for bit.
* ``labels._triple_barrier_blocked`` equals the row code (``triple_barrier_row``, the CUDA
  kernel's) on every row, exactly.
* :func:`alphafeat.labels.direction_labels` equals a plain numpy reference.
"""

from __future__ import annotations

import datetime as dt
import math

import numba
import numpy as np
import pytest
from conftest import ESH4_MBO, ESU4_MBP1, ESU4_TRADES, PROJECT, need
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alphafeat import book as bk
from alphafeat import labels as lb
from alphafeat.dbn import RecordScanner, read_dbn
from alphafeat.features import compute_features
from alphafeat.features.inputs import prepare
from alphafeat.instruments import session_dates
from alphafeat.plan import session_bounds
from alphafeat.precompute.table import book_mid
from alphafeat.types import BookArrays

DATA = PROJECT / "data"
DAYS = (dt.date(2024, 3, 6), dt.date(2024, 3, 7), dt.date(2024, 3, 8))
ESH4, ESM4 = 17077, 5602
MBP10, MBP1, TRADES = 0x0A, 0x01, 0x00
_COLS = ("ts_event", "ts_recv", "bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct",
         "buy_volume", "sell_volume", "trade_count")  # fmt: skip


def _book_file(day: dt.date):
    p = DATA / f"glbx-mdp3-{day:%Y%m%d}.mbp-10.dbn.zst"
    if not p.is_file():
        pytest.skip("data/ has no embedded sample")
    return p


def _trades_file(day: dt.date):
    return DATA / f"glbx-mdp3-{day:%Y%m%d}.trades.dbn.zst"


def _records(path, iid: int, rtype: int) -> np.ndarray:
    return read_dbn(path, instrument_ids=[iid])[1][rtype]


def _reference(
    records: np.ndarray, bounds: tuple[int, int], trades: np.ndarray | None = None, day: dt.date | None = None
) -> BookArrays:
    """The old path: ``mbp_snapshots`` on the whole stream, the rows and trades of the session,
    ``to_book_arrays``. With ``day`` the session is chosen by ``session_dates``, else by ``bounds``."""
    raw, stream_trades = bk.mbp_snapshots(records)
    t = stream_trades if trades is None else bk.trades_from_records(trades)

    def inside(ts: np.ndarray) -> np.ndarray:
        if day is not None:
            return session_dates(ts) == np.datetime64(day)
        return (ts >= bounds[0]) & (ts < bounds[1])

    return bk.to_book_arrays(raw.take(inside(raw.ts_recv)), t.take(inside(t.ts_recv)))


def _splits(records: np.ndarray, rng: np.random.Generator, pieces: int) -> list[np.ndarray]:
    """``records`` cut at random places (empty pieces included)."""
    cuts = np.sort(rng.integers(0, len(records) + 1, size=pieces - 1))
    return np.split(records, cuts)


def _build(chunks, dtype: np.dtype, bounds: tuple[int, int], capacity: int, trades: np.ndarray | None = None):
    b = bk.MBPBookBuilder(dtype, *bounds, capacity=capacity)
    emitted = sum(b.add(c) for c in chunks)
    out = b.finish(None if trades is None else bk.trades_from_records(trades))
    assert emitted == len(out)
    return out, b.records


def assert_books_equal(got: BookArrays, ref: BookArrays) -> None:
    assert len(got) == len(ref)
    assert got.depth == ref.depth
    for k in _COLS:
        g, r = getattr(got, k), getattr(ref, k)
        assert g.shape == r.shape, k
        if k.startswith("ts_"):
            assert g.dtype == np.int64, k
            np.testing.assert_array_equal(g, r, err_msg=k)
        else:  # values exactly, NaN where NaN (counts are uint32 in the builder, float64 in the old path)
            np.testing.assert_array_equal(np.asarray(g, dtype=np.float64), r, err_msg=k, strict=True)


# --------------------------------------------------------------------------------------
# MBPBookBuilder == mbp_snapshots + to_book_arrays
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("iid", [ESH4, ESM4])
@pytest.mark.parametrize("day", DAYS)
@pytest.mark.parametrize("with_trades_file", [False, True])
def test_builder_random_splits_equal_old_path(iid, day, with_trades_file):
    recs = _records(_book_file(day), iid, MBP10)
    trades = _records(_trades_file(day), iid, TRADES) if with_trades_file else None
    assert len(recs) > 500
    bounds = session_bounds(day)
    ref = _reference(recs, bounds, trades, day=day)
    assert len(ref) > 100 and ref.trade_count.sum() > 0
    rng = np.random.default_rng(iid * 7 + day.day)
    for pieces, capacity in ((1, len(recs)), (7, 16), (40, 1), (len(recs) // 50, 1 << 20)):
        got, n = _build(_splits(recs, rng, pieces), recs.dtype, bounds, capacity, trades)
        assert n == len(recs)
        assert_books_equal(got, ref)


@pytest.mark.parametrize("chunk_bytes", [997, 4096, 65_536])
def test_builder_fed_by_record_scanner(chunk_bytes):
    day = DAYS[1]
    path = _book_file(day)
    recs = _records(path, ESH4, MBP10)
    bounds = session_bounds(day)
    b = None
    chunks = 0
    for chunk in RecordScanner(path, instrument_ids=[ESH4], chunk_bytes=chunk_bytes):
        arr = chunk.get(MBP10)
        if arr is None:
            continue
        if b is None:
            b = bk.MBPBookBuilder(arr.dtype, *bounds, capacity=64)
        b.add(arr)  # a view of the scanner's buffer, consumed before it is reused
        chunks += 1
    assert chunks > 1 and b.records == len(recs)
    assert_books_equal(b.finish(), _reference(recs, bounds, day=day))
    trades = _records(_trades_file(day), ESH4, TRADES)
    b2 = bk.MBPBookBuilder(recs.dtype, *bounds)
    for chunk in RecordScanner(path, instrument_ids=[ESH4], chunk_bytes=chunk_bytes):
        if MBP10 in chunk:
            b2.add(chunk[MBP10])
    assert_books_equal(b2.finish(bk.trades_from_records(trades)), _reference(recs, bounds, trades, day=day))


@pytest.mark.parametrize("with_trades_file", [False, True])
def test_builder_stream_spanning_two_sessions(with_trades_file):
    """Two sessions' records in one stream, bounds of the second: the first session's rows
    are dropped and its trades not counted (neither in the first row of the second)."""
    d0, d1 = DAYS[0], DAYS[1]
    recs = np.concatenate([_records(_book_file(d), ESH4, MBP10) for d in (d0, d1)])
    trades = np.concatenate([_records(_trades_file(d), ESH4, TRADES) for d in (d0, d1)]) if with_trades_file else None
    days = session_dates(recs["ts_recv"])
    assert (days == np.datetime64(d0)).sum() > 1000 and (days == np.datetime64(d1)).sum() > 1000
    for day in (d0, d1):
        bounds = session_bounds(day)
        ref = _reference(recs, bounds, trades, day=day)
        got, _ = _build(_splits(recs, np.random.default_rng(day.day), 13), recs.dtype, bounds, 1 << 10, trades)
        assert_books_equal(got, ref)
        assert np.all(session_dates(got.ts_recv) == np.datetime64(day))
    # the first row of the second session carries only trades of that session
    bounds = session_bounds(d1)
    got, _ = _build([recs], recs.dtype, bounds, len(recs), trades)
    raw, stream = bk.mbp_snapshots(recs)
    t = stream if trades is None else bk.trades_from_records(trades)
    first = got.ts_recv[0]
    first_pos = raw.pos[raw.ts_recv == first][0]
    before = (t.ts_recv >= bounds[0]) & (t.ts_recv <= first) & ((t.pos < 0) | (t.pos < first_pos))
    assert got.trade_count[0] == before.sum()
    assert got.trade_count.sum() <= ((t.ts_recv >= bounds[0]) & (t.ts_recv < bounds[1])).sum()
    assert got.trade_count.sum() < len(t)  # the first session's trades are not counted


@pytest.mark.parametrize("with_trades_file", [False, True])
def test_builder_bounds_cut_a_file_in_the_middle(with_trades_file):
    day = DAYS[2]
    recs = _records(_book_file(day), ESM4, MBP10)
    trades = _records(_trades_file(day), ESM4, TRADES) if with_trades_file else None
    ts = np.sort(recs["ts_recv"].astype(np.int64))
    bounds = (int(ts[len(ts) // 3]), int(ts[2 * len(ts) // 3]))
    ref = _reference(recs, bounds, trades)
    got, _ = _build(_splits(recs, np.random.default_rng(5), 9), recs.dtype, bounds, 1, trades)
    assert_books_equal(got, ref)
    assert len(got) > 100
    assert got.ts_recv.min() >= bounds[0] and got.ts_recv.max() < bounds[1]
    n_all = len(bk.mbp_snapshots(recs)[0])
    assert len(got) < n_all // 2  # rows outside the bounds dropped
    full, _ = _build([recs], recs.dtype, session_bounds(day), len(recs), trades)
    assert got.trade_count.sum() < full.trade_count.sum()  # trades outside not counted


@pytest.mark.parametrize("with_trades_file", [False, True])
@pytest.mark.parametrize("cut", [False, True])
def test_builder_real_mbp1(with_trades_file, cut):
    recs = _records(need(ESU4_MBP1), 118, MBP1)
    trades = _records(need(ESU4_TRADES), 118, TRADES) if with_trades_file else None
    day = session_dates(recs["ts_recv"][:1]).astype(object)[0]
    if cut:
        ts = np.sort(recs["ts_recv"].astype(np.int64))
        bounds = (int(ts[len(ts) // 4]), int(ts[len(ts) // 2]))
        ref = _reference(recs, bounds, trades)
    else:
        bounds = session_bounds(day)
        ref = _reference(recs, bounds, trades, day=day)
    assert ref.depth == 1 and len(ref) > 100
    for seed in range(3):
        got, _ = _build(_splits(recs, np.random.default_rng(seed), 5 + 10 * seed), recs.dtype, bounds, 8, trades)
        assert_books_equal(got, ref)
        assert np.isnan(got.bid_px[:, 1:]).all() and (got.ask_sz[:, 1:] == 0).all()
    if with_trades_file or not cut:
        assert ref.trade_count.sum() > 0


def test_builder_books_stay_independent():
    """Books built one after another (as a worker does for its segments): a book still held is
    not overwritten by the next, and a book built after earlier ones were dropped is still exact."""
    cases = [(DAYS[0], ESH4), (DAYS[1], ESM4), (DAYS[2], ESM4), (DAYS[2], ESH4)]
    recs = {c: _records(_book_file(c[0]), c[1], MBP10) for c in cases}
    trades = {c: _records(_trades_file(c[0]), c[1], TRADES) for c in cases}
    refs = {c: _reference(recs[c], session_bounds(c[0]), trades[c], day=c[0]) for c in cases}
    held = []
    for c in cases:  # every book kept while the next is built
        got, _ = _build(
            _splits(recs[c], np.random.default_rng(1), 5), recs[c].dtype, session_bounds(c[0]), 16, trades[c]
        )
        held.append((c, got))
    for c, got in held:
        assert_books_equal(got, refs[c])
    for (_, a), (_, b) in zip(held, held[1:]):
        for k in _COLS:
            assert not np.shares_memory(getattr(a, k), getattr(b, k)), k
    del held, got
    for c in cases[::-1]:  # each dropped before the next is built
        got, _ = _build([recs[c]], recs[c].dtype, session_bounds(c[0]), len(recs[c]), trades[c])
        assert_books_equal(got, refs[c])
        mid = book_mid(got)
        del got
        again, _ = _build([recs[c]], recs[c].dtype, session_bounds(c[0]), 1)
        np.testing.assert_array_equal(book_mid(again), mid)
        del again


def test_builder_empty_and_out_of_session():
    recs = _records(_book_file(DAYS[0]), ESH4, MBP10)
    b = bk.MBPBookBuilder(recs.dtype, *session_bounds(DAYS[1]), capacity=4)
    assert b.add(recs[:0]) == 0
    assert b.add(recs) == 0  # nothing of that session
    out = b.finish(bk.trades_from_records(_records(_trades_file(DAYS[0]), ESH4, TRADES)))
    assert len(out) == 0 and out.trade_count.shape == (0,)
    assert b.records == 0 and b.read == len(recs)  # read, none of that session


# --------------------------------------------------------------------------------------
# book_mid == compute_features(...)["mid"], bit for bit
# --------------------------------------------------------------------------------------


def _bits_equal(a: np.ndarray, b: np.ndarray) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype == np.float64
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    ok = ~np.isnan(a)
    np.testing.assert_array_equal(a[ok].view(np.uint64), b[ok].view(np.uint64))


def _books():
    for day in DAYS:
        for iid in (ESH4, ESM4):
            recs = _records(_book_file(day), iid, MBP10)
            yield _build([recs], recs.dtype, session_bounds(day), len(recs))[0]
    if ESU4_MBP1.exists():
        recs = _records(ESU4_MBP1, 118, MBP1)
        day = session_dates(recs["ts_recv"][:1]).astype(object)[0]
        yield _build([recs], recs.dtype, session_bounds(day), len(recs), _records(ESU4_TRADES, 118, TRADES))[0]


def test_book_mid_equals_mid_feature_bit_for_bit():
    n = 0
    for b in _books():
        _bits_equal(book_mid(b), compute_features(b)["mid"])
        n += 1
    assert n >= 6
    # empty levels give NaN in both
    b = next(_books())
    b.bid_px[::7, 0] = np.nan
    b.ask_px[::11, 0] = np.nan
    mid = book_mid(b)
    assert np.isnan(mid[::7]).all() and np.isnan(mid[::11]).all()
    _bits_equal(mid, compute_features(b)["mid"])


# --------------------------------------------------------------------------------------
# _triple_barrier_blocked == the row code on every row, exactly
# --------------------------------------------------------------------------------------


@numba.njit
def _row_code(price, upper, lower, h, ts, out_y, out_t1, out_k):
    """The row code on every row (what the CUDA kernel runs, one thread per row): no block
    skipping, no reuse of the next row's outcome."""
    for t in range(price.shape[0]):
        lb._R.triple_barrier_row(price, upper, lower, h, ts, out_y, out_t1, out_k, t)


def _both_barriers(price, upper, lower, h, ts):
    n = price.shape[0]
    outs = []
    for fn in (_row_code, lb._triple_barrier_blocked):
        y = np.full(n, 7.0)  # garbage: every row must be written
        t1 = np.full(n, 123, dtype=np.int64)
        k = np.full(n, 456, dtype=np.int64)
        fn(price, upper, lower, h, ts, y, t1, k)
        outs.append((y, t1, k))
    (y0, t0, k0), (y1, t1_, k1) = outs
    np.testing.assert_array_equal(y1, y0)
    np.testing.assert_array_equal(t1_, t0)
    np.testing.assert_array_equal(k1, k0)
    return y0, t0, k0


def _widths(rng: np.random.Generator, n: int, mode: str, tick: float) -> np.ndarray:
    if mode == "const":
        return np.full(n, tick * rng.choice([0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 13.0, 1e-9]))
    if mode == "huge":
        return np.full(n, 1e6)
    # "grid": whole ticks, so block extrema land exactly on a barrier; "vary": anywhere
    w = tick * (rng.integers(1, 12, size=n) if mode == "grid" or rng.random() < 0.5 else rng.uniform(0.1, 12.0, n))
    if mode == "noisy":  # NaN, zero, negative, infinite and tiny widths mixed in
        pick = rng.integers(0, 12, size=n)
        w[pick == 0] = np.nan
        w[pick == 1] = 0.0
        w[pick == 2] = -tick * rng.uniform(0.1, 5.0, size=(pick == 2).sum())
        w[pick == 3] = np.inf
        w[pick == 4] = 5e-324
    return w


def _path(rng: np.random.Generator, n: int, tick: float, nan_runs: int, jumps: bool) -> np.ndarray:
    steps = rng.choice([-1, 0, 0, 0, 1], size=n)
    if jumps:
        steps = steps + (rng.random(n) < 0.02) * rng.integers(-12, 13, size=n)
    p = 4800.0 + tick * np.cumsum(steps)
    for _ in range(nan_runs):
        if n:
            a = int(rng.integers(0, n))
            p[a : a + int(rng.integers(1, 200))] = np.nan
    return p


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.one_of(st.integers(0, 5), st.integers(0, 2000), st.integers(1500, 2000)),
    h=st.one_of(
        st.integers(1, 3), st.sampled_from([63, 64, 65, 127, 128, 129, 192]), st.integers(1, 300), st.integers(200, 300)
    ),
    tick=st.sampled_from([0.25, 0.25, 0.1, 1.0 / 3.0]),
    nan_runs=st.integers(0, 6),
    jumps=st.booleans(),
    up_mode=st.sampled_from(["const", "const", "grid", "vary", "noisy", "huge"]),
    dn_mode=st.sampled_from(["const", "const", "grid", "vary", "noisy", "huge"]),
)
def test_blocked_triple_barrier_equals_row_code(seed, n, h, tick, nan_runs, jumps, up_mode, dn_mode):
    rng = np.random.default_rng(seed)
    price = _path(rng, n, tick, nan_runs, jumps)
    up, dn = _widths(rng, n, up_mode, tick), _widths(rng, n, dn_mode, tick)
    ts = np.cumsum(rng.integers(1, 10**6, size=n)).astype(np.int64) + 1_700_000_000 * 10**9
    y, t1, k = _both_barriers(price, up, dn, h, ts)
    # sanity of the shared conventions
    bad = ~(np.isfinite(price) & np.isfinite(up) & np.isfinite(dn) & (up > 0) & (dn > 0))
    assert np.isnan(y[bad]).all() and (k[bad] == -1).all()
    hit = k >= 0
    assert np.all(k[hit] <= np.arange(n)[hit] + h) and np.all(t1[hit] == ts[k[hit]])


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.one_of(st.sampled_from([-1, 0, 0, 1]), st.integers(-3, 3), st.just(None)), max_size=400),
    h=st.one_of(st.integers(1, 300), st.integers(64, 300)),
    w=st.one_of(st.sampled_from([0.25, 0.5, 0.75, 1.0]), st.floats(-1.0, 3.0), st.just(math.nan), st.just(0.0)),
    w2=st.one_of(st.sampled_from([0.25, 0.5, 1.0, 1.5]), st.floats(0.0, 3.0), st.just(math.nan)),
    reps=st.integers(1, 40),
)
def test_blocked_triple_barrier_equals_row_code_lists(steps, h, w, w2, reps):
    """Shrinkable paths: tick steps with NaN holes (repeated ``reps`` times, so that paths are
    long enough for whole blocks), one width pair for every row."""
    step = np.tile([0 if s is None else s for s in steps], reps)
    px = np.cumsum(step).astype(np.float64) * 0.25 + 100.0
    px[np.tile([s is None for s in steps], reps).astype(bool)] = np.nan
    n = len(px)
    _both_barriers(px, np.full(n, w), np.full(n, w2), h, np.arange(n, dtype=np.int64))


def _barrier_cases(mid: np.ndarray, vol: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, int]]:
    n = len(mid)
    return [
        (np.full(n, 1.0), np.full(n, 1.0), 1000),
        (vol, vol, 1000),
        (np.full(n, 0.25), np.full(n, 3.0), 300),
        (vol, np.full(n, 0.5), 64),
        (np.full(n, 2.0), np.full(n, 2.0), 6000),
    ]


def test_blocked_triple_barrier_equals_row_code_on_the_embedded_mid():
    recs = _records(_book_file(DAYS[1]), ESM4, MBP10)
    b = _build([recs], recs.dtype, session_bounds(DAYS[1]), len(recs))[0]
    mid = book_mid(b)
    assert len(mid) > 5000
    vol = 2.0 * np.sqrt(compute_features(b)["ema_ret2_60s"]) * 0.25 * np.sqrt(1000)
    touched = 0
    for up, dn, h in _barrier_cases(mid, vol):
        y, _, _ = _both_barriers(mid, up, dn, h, b.ts_recv)
        touched += int((np.abs(y) == 1).sum())
    assert touched > 0


def test_blocked_triple_barrier_equals_row_code_on_a_real_mid():
    """The real ESH4 MBO mid (both sessions of the file), widths fixed and volatility-scaled."""
    recs = _records(need(ESH4_MBO), ESH4, 0xA0)
    raw, trades, _ = bk.rebuild_mbo(recs)
    days = session_dates(raw.ts_recv)
    for day in np.unique(days):
        b = bk.to_book_arrays(raw.take(days == day), trades.take(session_dates(trades.ts_recv) == day))
        mid = np.where(b.bid_px[:, 0] > b.ask_px[:, 0], np.nan, book_mid(b))
        vol = 2.0 * np.sqrt(compute_features(b)["ema_ret2_60s"]) * 0.25 * np.sqrt(1000)
        seen = set()
        for up, dn, h in _barrier_cases(mid, vol):
            y, _, _ = _both_barriers(mid, up, dn, h, b.ts_recv)
            seen |= set(np.unique(y[~np.isnan(y)]).tolist())
        if len(mid) > 20_000:
            assert seen == {-1.0, 0.0, 1.0}
        # the public function (CPU) is the blocked kernel
        y, t1, k = lb.triple_barrier(mid, 1.0, 1.0, 1000, ts=b.ts_recv)
        y0, t0, k0 = _both_barriers(mid, np.full(len(mid), 1.0), np.full(len(mid), 1.0), 1000, b.ts_recv)
        np.testing.assert_array_equal(y, y0.astype(np.float32))
        np.testing.assert_array_equal(t1, t0)
        np.testing.assert_array_equal(k, k0)


# --------------------------------------------------------------------------------------
# direction_labels == plain numpy
# --------------------------------------------------------------------------------------


def numpy_direction(mid: np.ndarray, ts: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray]:
    n = len(mid)
    y = np.full(n, np.nan, dtype=np.float32)
    t1 = np.full(n, -1, dtype=np.int64)
    if h < n:
        a, b = mid[: n - h], mid[h:]
        with np.errstate(invalid="ignore"):
            y[: n - h][b > a] = 1.0
            y[: n - h][b < a] = 0.0
        t1[: n - h] = ts[h:]
    return y, t1


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 3000),
    horizons=st.lists(st.integers(1, 3500), min_size=1, max_size=5, unique=True),
    nan_runs=st.integers(0, 5),
)
def test_direction_labels_equal_numpy(seed, n, horizons, nan_runs):
    rng = np.random.default_rng(seed)
    mid = _path(rng, n, 0.25, nan_runs, jumps=bool(seed & 1))
    if n and seed & 2:
        mid[rng.integers(0, n, size=3)] = np.inf * rng.choice([-1, 1])
    ts = np.cumsum(rng.integers(0, 10**6, size=n)).astype(np.int64)
    got = lb.direction_labels(mid, horizons, ts=ts)
    plain = lb.direction_labels(mid, horizons)
    for h in horizons:
        y, t1 = numpy_direction(mid, ts, h)
        assert got[f"label_h{h}"].dtype == np.float32 and got[f"t1_h{h}"].dtype == np.int64
        np.testing.assert_array_equal(got[f"label_h{h}"], y)
        np.testing.assert_array_equal(got[f"t1_h{h}"], t1)
        np.testing.assert_array_equal(plain[f"label_h{h}"], y)
        assert f"t1_h{h}" not in plain


def test_direction_labels_equal_numpy_on_real_mids():
    for b in _books():
        mid = book_mid(b)
        for h in (1, 30, 100, 1000, 6000):
            got = lb.direction_labels(mid, [h], ts=b.ts_recv)
            y, t1 = numpy_direction(mid, b.ts_recv, h)
            np.testing.assert_array_equal(got[f"label_h{h}"], y)
            np.testing.assert_array_equal(got[f"t1_h{h}"], t1)


# ---- the streamed CPU path: features continued block by block, books taken in blocks ----------


def test_feature_stream_equals_one_call_on_random_blocks() -> None:
    """FeatureStream over random block splits (each block after the first led by its halo row)
    gives every feature bit for bit as one compute_features call over the whole segment."""
    from alphafeat.features import FeatureParams
    from alphafeat.features.cpu import FeatureStream
    from alphafeat.features.registry import make_plan

    rng = np.random.default_rng(7)
    params = FeatureParams()
    books = []
    for day in DAYS:
        s0, s1 = session_bounds(day)
        b = bk.MBPBookBuilder(_records(_book_file(day), ESH4, MBP10).dtype, s0, s1, 1 << 16)
        b.add(_records(_book_file(day), ESH4, MBP10))
        books.append(b.finish())
    for book in books:
        ref = compute_features(book, params)
        cols = prepare(book, params)
        n = len(book)
        for k in (1, 2, 17, 60):
            cuts = np.sort(rng.choice(np.arange(1, n), size=k - 1, replace=False)) if k > 1 else np.array([], int)
            bounds = [0, *cuts.tolist(), n]
            fs = FeatureStream(make_plan(params), max(np.diff(bounds)))
            got = []
            for a, c in zip(bounds[:-1], bounds[1:]):
                got.append(fs.push({name: v[max(a - 1, 0) : c] for name, v in cols.items()}, a > 0).copy())
            got = np.concatenate(got, axis=1)
            for j, name in enumerate(ref):
                assert np.array_equal(got[j], ref[name], equal_nan=True), (name, k)
    with pytest.raises(ValueError, match="halo"):
        FeatureStream(make_plan(params), 10).push({name: v[:5] for name, v in cols.items()}, True)


@pytest.mark.parametrize("with_trades_file", [False, True])
def test_builder_blocks_equal_finish(with_trades_file: bool) -> None:
    """Blocks taken from the builder (halo row first, flow of a trades file given per block)
    hold the rows of one finish() call, in order, exactly."""
    day = DAYS[0]
    s0, s1 = session_bounds(day)
    recs = _records(_book_file(day), ESH4, MBP10)
    trades = None
    if with_trades_file:
        t = bk.trades_from_records(_records(_trades_file(day), ESH4, TRADES))
        trades = t.take((t.ts_recv >= s0) & (t.ts_recv < s1))
        trades = trades.take(np.argsort(trades.ts_recv, kind="stable"))
    whole = bk.MBPBookBuilder(recs.dtype, s0, s1, len(recs))
    whole.add(recs)
    ref = whole.finish(trades)
    got: dict[str, list] = {k: [] for k in _COLS}
    builder = bk.MBPBookBuilder(recs.dtype, s0, s1, 2000)
    for piece in np.array_split(recs, 37):
        builder.add(piece)
        if builder.rows >= 500:
            b, halo = builder.take(trades)
            for k in _COLS:
                got[k].append(np.array(getattr(b, k)[1 if halo else 0 :]))
            builder.keep_last()
    b, halo = builder.take(trades)
    for k in _COLS:
        got[k].append(np.array(getattr(b, k)[1 if halo else 0 :]))
    for k in _COLS:
        assert np.array_equal(np.concatenate(got[k]), getattr(ref, k), equal_nan=True), k


def test_small_blocks_give_the_same_cache(tmp_path, monkeypatch) -> None:
    """precompute with blocks of ~200 rows (many blocks, decode chunks of 64 KiB, feature pieces
    of 37 rows) writes the same partition bytes as with the default blocks (one block per
    embedded session); the vol barrier reads a stored feature column."""
    from alphafeat.precompute import PrecomputeConfig, books, precompute, table

    if not any(DATA.glob("*.dbn.zst")):
        pytest.skip("data/ has no embedded sample")

    def run(out):
        precompute(PrecomputeConfig(inputs=[DATA], out=out, device="cpu", feature_set="all", keep_books="none",
                                    barrier="vol:1.5"))
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.arrow"))}

    ref = run(tmp_path / "one")
    monkeypatch.setattr(books, "BLOCK_ROWS", 200)
    monkeypatch.setattr(books, "READ_CHUNK", 64 << 10)
    monkeypatch.setattr(table, "_PIECE", 37)
    got = run(tmp_path / "many")
    assert len(ref) == 3 and got == ref


def test_label_stream_equals_whole_segment_labels() -> None:
    """LabelStream updated at random row counts gives the labels of direction_labels and
    triple_barrier on the whole segment, exactly (rows labelled early never change)."""
    rng = np.random.default_rng(3)
    for n in (0, 1, 50, 3000, 20000):
        mid = 5000 + 0.25 * np.cumsum(rng.integers(-1, 2, n)).astype(float)
        mid[rng.random(n) < 0.02] = np.nan
        ts = np.cumsum(rng.integers(1, 10**6, n)).astype(np.int64)
        width = np.where(rng.random(n) < 0.05, np.nan, rng.choice([0.25, 0.5, 1.0], n))
        ref = lb.direction_labels(mid, (3, 30, 700), ts=ts)
        y, t1, _ = lb.triple_barrier(mid, width, width, 400, ts=ts)
        ls = lb.LabelStream((3, 30, 700), 400, n + 1)
        for cut in sorted(rng.integers(0, n + 1, 7)):
            ls.update(mid[:cut], ts[:cut], width[:cut])
        got = ls.finish(mid, ts, width)
        for k, v in ref.items():
            assert np.array_equal(got[k], v, equal_nan=True), (n, k)
        assert np.array_equal(got["tb_label"], y, equal_nan=True) and np.array_equal(got["tb_t1"], t1), n


def test_a_worker_whose_run_is_gone_does_not_make_its_folders_again(tmp_path):
    """A worker that outlives its run (the run aborted and removed its staging folder) raises
    instead of making ``--out/.staging-*`` again (an orphan without the cache's lock, which a
    rerun would refuse as a foreign folder); with the folder there, it writes."""
    from types import SimpleNamespace

    import pyarrow as pa

    from alphafeat.errors import AlphafeatError
    from alphafeat.precompute.segment import _stage

    seg = SimpleNamespace(relpath="root=ES/session=2024-03-06/ESH4.arrow")
    table = pa.table({"x": pa.array([1.0])})
    gone = tmp_path / "out" / ".staging-1-dead"
    with pytest.raises(AlphafeatError, match="staging folder is gone"):
        _stage(str(gone), seg, table, {}, "none")
    assert not (tmp_path / "out").exists()
    gone.mkdir(parents=True)
    _stage(str(gone), seg, table, {}, "none")
    assert (gone / (seg.relpath + ".part")).is_file() and not any(gone.rglob("*.arrow"))


def test_stream_rows_shrink_with_segments_at_once(monkeypatch) -> None:
    """Blocks of BLOCK_ROWS rows for one or two segments at once, halved as they double, at
    least MIN_BLOCK_ROWS; the decode chunk in proportion; a smaller BLOCK_ROWS (a test's) wins."""
    from alphafeat.precompute import books as segment

    got = [segment.stream_rows(w) for w in (0, 1, 2, 3, 4, 5, 8, 9, 16, 64)]
    k = 1024
    assert got == [64 * k, 64 * k, 64 * k, 32 * k, 32 * k, 16 * k, 16 * k, 8 * k, 8 * k, 8 * k]
    assert segment.read_chunk(64 * k) == segment.READ_CHUNK and segment.read_chunk(8 * k) == 1 << 20
    monkeypatch.setattr(segment, "BLOCK_ROWS", 200)
    assert {segment.stream_rows(w) for w in (1, 16)} == {200}


def test_block_rows_setting_for_measurements(monkeypatch) -> None:
    """``ALPHAFEAT_BLOCK_ROWS`` replaces the blocks' rows whatever runs at once; a value that
    is not a positive integer is a usage error naming the variable."""
    from alphafeat.errors import UsageError
    from alphafeat.precompute import books

    monkeypatch.setenv("ALPHAFEAT_BLOCK_ROWS", "32768")
    assert {books.stream_rows(w) for w in (1, 16)} == {32768}
    for bad in ("0", "-3", "8k"):
        monkeypatch.setenv("ALPHAFEAT_BLOCK_ROWS", bad)
        with pytest.raises(UsageError, match="ALPHAFEAT_BLOCK_ROWS.*positive integer"):
            books.stream_rows(16)
