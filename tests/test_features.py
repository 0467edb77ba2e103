"""Features (CPU path): literature reference values and an independent slow reference.

Expected values come from /work/shared/guide/reference-values.md (papers) or from the plain
Python reference ``slow_features`` below, written from the formulas, never from the code
under test.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alphafeat.features import (
    FeatureParams,
    compute_features,
    cuda_available,
    feature_specs,
    irregular_ema,
    linear_scan,
    microprice,
    ofi_step,
    scan_compose,
    stoikov_imbalance,
    trade_rate_ema,
)
from alphafeat.types import LEVELS, BookArrays

NS = 1_000_000_000
T0 = 1_703_500_000 * NS  # an epoch-ns origin in Dec 2023


# ------------------------------------------------------------------------------------------
# inputs
# ------------------------------------------------------------------------------------------


def make_book(bid_px, bid_sz, ask_px, ask_sz, ts=None, buy=None, sell=None, count=None):
    """BookArrays from per-row level-1..k lists; missing deeper levels are empty."""
    n = len(bid_px)

    def mat(rows, fill):
        out = np.full((n, LEVELS), fill, dtype=np.float64)
        for i, r in enumerate(rows):
            r = np.atleast_1d(np.asarray(r, dtype=np.float64))
            out[i, : r.size] = r
        return out

    ts = np.asarray(ts if ts is not None else T0 + NS * np.arange(n), dtype=np.int64)
    z = np.zeros(n)
    return BookArrays(
        ts_event=ts.copy(),
        ts_recv=ts,
        bid_px=mat(bid_px, np.nan),
        ask_px=mat(ask_px, np.nan),
        bid_sz=mat(bid_sz, 0.0),
        ask_sz=mat(ask_sz, 0.0),
        bid_ct=np.zeros((n, LEVELS)),
        ask_ct=np.zeros((n, LEVELS)),
        buy_volume=np.asarray(buy if buy is not None else z, dtype=np.float64),
        sell_volume=np.asarray(sell if sell is not None else z, dtype=np.float64),
        trade_count=np.asarray(count if count is not None else z, dtype=np.float64),
    )


def random_book(n: int, seed: int) -> BookArrays:
    """ES-like random book: empty levels, one-sided and empty books, equal timestamps."""
    rng = np.random.default_rng(seed)
    mid_ticks = 18000 + np.cumsum(rng.integers(-2, 3, n))
    spread = rng.integers(1, 4, n)
    lv = np.arange(LEVELS)
    bid_px = (mid_ticks[:, None] - lv) * 0.25
    ask_px = (mid_ticks + spread)[:, None] * 0.25 + lv * 0.25
    bid_sz = rng.integers(1, 60, (n, LEVELS)).astype(np.float64)
    ask_sz = rng.integers(1, 60, (n, LEVELS)).astype(np.float64)
    for px, sz in ((bid_px, bid_sz), (ask_px, ask_sz)):
        hole = rng.random((n, LEVELS)) < 0.1  # scattered empty levels
        px[hole] = np.nan
        sz[hole] = 0.0
        side = rng.random(n) < 0.06  # a whole side empty
        px[side] = np.nan
        sz[side] = 0.0
        deep = rng.random(n) < 0.05  # MBP-1-like rows: only level 1
        px[deep, 1:] = np.nan
        sz[deep, 1:] = 0.0
    steps = rng.choice(np.array([0, 0, 0, 1, 13, 1_000, 10**6, 10**8, 7 * 10**8, 3 * NS]), n)
    ts = T0 + np.cumsum(steps).astype(np.int64)
    return BookArrays(
        ts_event=ts - 1000,
        ts_recv=ts,
        bid_px=bid_px,
        ask_px=ask_px,
        bid_sz=bid_sz,
        ask_sz=ask_sz,
        bid_ct=np.ones((n, LEVELS)),
        ask_ct=np.ones((n, LEVELS)),
        buy_volume=rng.integers(0, 6, n).astype(np.float64),
        sell_volume=rng.integers(0, 6, n).astype(np.float64),
        trade_count=rng.integers(0, 4, n).astype(np.float64),
    )


# ------------------------------------------------------------------------------------------
# slow reference, plain Python, from the formulas in reference-values.md and the brief
# ------------------------------------------------------------------------------------------


def _tau_name(tau: float) -> str:
    return {0.5: "0p5s", 1.0: "1s", 30.0: "30s", 60.0: "60s", 300.0: "300s"}[tau]


def slow_zm_ema(t_ns: list[int], z: list[float], tau: float, scheme: str) -> list[float]:
    """Zumbach–Müller EMA over the finite observations only, held in between, NaN before."""
    out: list[float] = []
    ema = math.nan
    t_prev = None
    z_prev = math.nan
    for t, zi in zip(t_ns, z):
        if math.isfinite(zi):
            if t_prev is None:
                ema = zi
            else:
                dt = max(t - t_prev, 0) / 1e9
                mu = math.exp(-dt / tau)
                if scheme == "previous":
                    nu = 1.0
                elif scheme == "next":
                    nu = mu
                else:  # linear: (1 - mu) tau / dt, limit 1 at dt = 0
                    nu = 1.0 if dt == 0 else -math.expm1(-dt / tau) / (dt / tau)
                ema = mu * ema + (nu - mu) * z_prev + (1.0 - nu) * zi
            t_prev = t
            z_prev = zi
        out.append(ema)
    return out


def slow_features(book: BookArrays, p: FeatureParams) -> dict[str, list[float]]:
    n = len(book)
    ts = [int(v) for v in book.ts_recv]
    nan = math.nan
    tick = p.tick_size

    def lv(i: int, m: int, side: str) -> tuple[float, float]:
        px = float((book.bid_px if side == "b" else book.ask_px)[i][m])
        sz = float((book.bid_sz if side == "b" else book.ask_sz)[i][m])
        if math.isnan(px):
            return (-math.inf if side == "b" else math.inf), 0.0
        return px, sz

    f: dict[str, list[float]] = {}
    mid, spread, micro, imb1, imb10 = [], [], [], [], []
    for i in range(n):
        pb, qb = lv(i, 0, "b")
        pa, qa = lv(i, 0, "a")
        if math.isinf(pb) or math.isinf(pa):
            for col in (mid, spread, micro, imb1, imb10):
                col.append(nan)
            continue
        mid.append((pb + pa) / 2)
        spread.append((pa - pb) / tick)
        if qb + qa > 0:
            w = qb / (qb + qa)
            micro.append(w * pa + (1 - w) * pb)
            imb1.append((qb - qa) / (qb + qa))
        else:
            micro.append(nan)
            imb1.append(nan)
        sb = sum(lv(i, m, "b")[1] for m in range(LEVELS))
        sa = sum(lv(i, m, "a")[1] for m in range(LEVELS))
        imb10.append((sb - sa) / (sb + sa) if sb + sa > 0 else nan)
    f.update(mid=mid, spread_ticks=spread, microprice=micro, imbalance_l1=imb1)
    f["imbalance_l10"] = imb10
    for m in range(p.ofi_levels):
        col = [nan]
        for i in range(1, n):
            pb0, qb0 = lv(i - 1, m, "b")
            pa0, qa0 = lv(i - 1, m, "a")
            pb1, qb1 = lv(i, m, "b")
            pa1, qa1 = lv(i, m, "a")
            e = (qb1 if pb1 >= pb0 else 0) - (qb0 if pb1 <= pb0 else 0)
            e += -(qa1 if pa1 <= pa0 else 0) + (qa0 if pa1 >= pa0 else 0)
            col.append(float(e))
        f[f"ofi_l{m + 1:02d}"] = col
    f["signed_volume"] = [float(book.buy_volume[i] - book.sell_volume[i]) for i in range(n)]
    f["log_dt"] = [nan] + [math.log(max((ts[i] - ts[i - 1]) / 1e9, 1e-9)) for i in range(1, n)]
    f["tick_return"] = [nan] + [(mid[i] - mid[i - 1]) / tick for i in range(1, n)]
    ret2 = [r * r for r in f["tick_return"]]
    for name, z in (("ema_mid", mid), ("ema_ret2", ret2), ("ema_spread", spread)):
        for tau in p.ema_taus_s:
            f[f"{name}_{_tau_name(tau)}"] = slow_zm_ema(ts, z, tau, p.ema_interpolation)
    for tau in p.ema_taus_s:
        lam, col = 0.0, []
        for i in range(n):
            dt = max(ts[i] - ts[i - 1], 0) / 1e9 if i else 0.0
            c = float(book.trade_count[i])
            lam = lam * math.exp(-dt / tau) + (c / tau if math.isfinite(c) else 0.0)
            col.append(lam)
        f[f"trade_rate_{_tau_name(tau)}"] = col
    return f


# ------------------------------------------------------------------------------------------
# reference values (reference-values.md)
# ------------------------------------------------------------------------------------------

# Cont, Kukanov & Stoikov (2014): start state and three next states (bid px, bid sz, ask px,
# ask sz). The reference e-values (+6, +12, -10) are each next state against the Start.
OFI_START = (100.00, 10.0, 100.25, 8.0)
OFI_NEXT = [(100.00, 13.0, 100.25, 5.0), (100.25, 4.0, 100.50, 7.0), (99.75, 20.0, 100.25, 8.0)]
OFI_EXPECTED = [6.0, 12.0, -10.0]


@pytest.mark.parametrize("k", range(3))
def test_ofi_reference_core(k: int) -> None:
    assert ofi_step(*OFI_START, *OFI_NEXT[k]) == OFI_EXPECTED[k]


@pytest.mark.parametrize("k", range(3))
def test_ofi_reference_through_compute_features(k: int) -> None:
    rows = [OFI_START, OFI_NEXT[k]]
    book = make_book(*[[r[c] for r in rows] for c in range(4)])
    f = compute_features(book)
    assert math.isnan(f["ofi_l01"][0])  # row 0: no previous snapshot
    assert f["ofi_l01"][1] == OFI_EXPECTED[k]
    # deeper levels are empty on both rows: no flow
    assert np.all(f["ofi_l10"][1:] == 0.0)


def test_ofi_chained_sequence() -> None:
    # Consecutive differences of Start -> next1 -> next2 -> next3, by hand from the formula:
    # (13-10) + (-5+8) = 6; bid up: +4, ask up: +5 -> 9; bid down: -4, ask down: -8 -> -12.
    rows = [OFI_START, *OFI_NEXT]
    book = make_book(*[[r[c] for r in rows] for c in range(4)])
    f = compute_features(book)
    np.testing.assert_array_equal(f["ofi_l01"][1:], [6.0, 9.0, -12.0])


def test_ofi_empty_levels() -> None:
    nan = math.nan
    # bid level appears (+q), vanishes (-q_prev); ask appears (-q), vanishes (+q_prev)
    assert ofi_step(nan, 0.0, 101.0, 4.0, 100.0, 7.0, 101.0, 4.0) == 7.0
    assert ofi_step(100.0, 7.0, 101.0, 4.0, nan, 0.0, 101.0, 4.0) == -7.0
    assert ofi_step(100.0, 7.0, nan, 0.0, 100.0, 7.0, 101.0, 3.0) == -3.0
    assert ofi_step(100.0, 7.0, 101.0, 3.0, 100.0, 7.0, nan, 0.0) == 3.0
    # both rows empty on both sides; a size left in an empty level is ignored
    assert ofi_step(nan, 5.0, nan, 5.0, nan, 9.0, nan, 9.0) == 0.0


def test_microprice_reference() -> None:
    # Stoikov (2018): Pb = 14.33, Qb = 20, Pa = 14.34, Qa = 471 -> I = 0.040733, W = 14.330407
    assert stoikov_imbalance(20.0, 471.0) == pytest.approx(0.040733, abs=5e-7)
    assert microprice(14.33, 20.0, 14.34, 471.0) == pytest.approx(14.330407, abs=5e-7)
    book = make_book([14.33], [20.0], [14.34], [471.0])
    f = compute_features(book, FeatureParams(tick_size=0.01))
    assert f["microprice"][0] == pytest.approx(14.330407, abs=5e-7)
    # Gould & Bonart form on [-1, 1] is 2I - 1
    assert f["imbalance_l1"][0] == pytest.approx(2 * 0.040733 - 1, abs=1e-6)
    assert f["spread_ticks"][0] == pytest.approx(1.0)
    assert math.isnan(microprice(math.nan, 20.0, 14.34, 471.0))


ZM_T = np.array([0, NS // 2, 2 * NS], dtype=np.int64)  # t = 0, 0.5, 2 s
ZM_Z = np.array([1.0, 2.0, 4.0])


@pytest.mark.parametrize(
    "scheme, expected",
    [
        ("next", [1.393469, 3.418404]),
        ("linear", [1.213061, 2.788584]),
        ("previous", [1.0, 1.776870]),
    ],
)
def test_irregular_ema_reference(scheme: str, expected: list[float]) -> None:
    ema = irregular_ema(ZM_T, ZM_Z, 1.0, scheme)
    assert ema[0] == 1.0
    np.testing.assert_allclose(ema[1:], expected, rtol=0, atol=5e-7)


def test_trade_rate_reference() -> None:
    lam = trade_rate_ema(np.array([0, NS, 2 * NS]), np.ones(3), 1.0)
    assert lam[-1] == pytest.approx(1.503215, abs=5e-7)
    assert lam[0] == 1.0  # one trade at t = 0, tau = 1 s -> 1/tau


@pytest.mark.parametrize("scheme", ["previous", "linear", "next"])
def test_ema_equal_timestamps(scheme: str) -> None:
    # dt = 0: mu = nu = 1 in every scheme, the EMA is unchanged; no division by zero.
    t = np.array([0, 0, 0, NS], dtype=np.int64)
    z = np.array([1.0, 5.0, 7.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ema = irregular_ema(t, z, 1.0, scheme)
    np.testing.assert_array_equal(ema[:3], [1.0, 1.0, 1.0])
    mu = math.exp(-1.0)
    nu = {"previous": 1.0, "linear": 1.0 - mu, "next": mu}[scheme]
    assert ema[3] == pytest.approx(mu * 1.0 + (nu - mu) * 7.0 + (1 - nu) * 2.0, rel=1e-14)
    # continuity of the linear weight as dt -> 0 (1 ns)
    t1 = np.array([0, 1, 2, NS], dtype=np.int64)
    assert irregular_ema(t1, z, 60.0, scheme)[2] == pytest.approx(1.0, abs=1e-9)


def test_ema_skips_nan() -> None:
    # NaN before the first finite value; held over NaN rows; next value uses the last finite
    t = np.array([0, 0, NS // 2, 2 * NS], dtype=np.int64)
    z = np.array([math.nan, 1.0, math.nan, 3.0])
    ema = irregular_ema(t, z, 1.0, "linear")
    assert math.isnan(ema[0])
    assert ema[1] == 1.0 and ema[2] == 1.0
    mu = math.exp(-2.0)
    nu = (1 - mu) / 2.0
    assert ema[3] == pytest.approx(mu * 1.0 + (nu - mu) * 1.0 + (1 - nu) * 3.0, rel=1e-14)


# ------------------------------------------------------------------------------------------
# linear scan and exact chunk carry
# ------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 1.0), st.floats(-1e3, 1e3)),
        min_size=0,
        max_size=60,
    ),
    st.integers(0, 60),
    st.floats(-10.0, 10.0),
)
def test_scan_chunks_compose(ab: list[tuple[float, float]], cut: int, x0: float) -> None:
    a = np.array([v[0] for v in ab], dtype=np.float64)
    b = np.array([v[1] for v in ab], dtype=np.float64)
    cut = min(cut, a.size)
    # plain-Python sequential reference
    ref, x = [], x0
    for ai, bi in zip(a, b):
        x = ai * x + bi
        ref.append(x)
    full = linear_scan(a, b, x0)
    np.testing.assert_array_equal(full, ref)
    A, B = scan_compose(a[:cut], b[:cut])
    carry = A * x0 + B
    expect_carry = ref[cut - 1] if cut else x0
    assert carry == pytest.approx(expect_carry, rel=1e-12, abs=1e-9)
    tail = linear_scan(a[cut:], b[cut:], carry)
    np.testing.assert_allclose(tail, ref[cut:], rtol=1e-12, atol=1e-9)


# ------------------------------------------------------------------------------------------
# every feature against the slow reference
# ------------------------------------------------------------------------------------------

PARAMS = [
    FeatureParams(),
    FeatureParams(ema_interpolation="previous", ema_taus_s=(0.5, 30.0), ofi_levels=3, fracdiff_threshold=0.01,
                  depth_levels=4, vol_taus_s=(0.5, 5.0, 50.0)),
    FeatureParams(ema_interpolation="next", ema_taus_s=(1.0, 300.0), tick_size=0.5, fracdiff_d=0.6,
                  fracdiff_threshold=0.002, hawkes_mu=0.2, hawkes_beta=3.0),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("params", PARAMS, ids=["default", "previous", "next"])
def test_all_features_match_slow_reference(seed: int, params: FeatureParams) -> None:
    book = random_book(400, seed)
    got = compute_features(book, params, device="cpu")
    names = [s.name for s in feature_specs(params)]
    assert list(got) == names
    ref = slow_features(book, params)
    assert set(ref) <= set(names)  # the first set; the rest: tests/test_features_full.py
    for name in ref:
        assert got[name].dtype == np.float64 and got[name].shape == (400,), name
        g, r = got[name], np.asarray(ref[name])
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12, equal_nan=True, err_msg=name)
    # the inputs did exercise the edge cases
    assert np.isnan(got["mid"]).any() and (np.diff(book.ts_recv) == 0).any()
    assert np.isnan(got["tick_return"][1:]).any() and np.isfinite(got["ofi_l01"][1:]).all()


def test_column_names_and_specs() -> None:
    specs = feature_specs(FeatureParams())
    names = [s.name for s in specs]
    assert names[:26] == [
        "mid", "spread_ticks", "microprice", "imbalance_l1", "imbalance_l10",
        *[f"ofi_l{m:02d}" for m in range(1, 11)],
        "signed_volume", "log_dt", "tick_return",
        "ema_mid_1s", "ema_mid_60s", "ema_ret2_1s", "ema_ret2_60s",
        "ema_spread_1s", "ema_spread_60s", "trade_rate_1s", "trade_rate_60s",
    ]  # fmt: skip
    assert all(s.unit and s.description and s.source for s in specs)
    assert len(set(names)) == len(names)


@pytest.mark.parametrize(
    "bad",
    [
        dict(tick_size=0.0),
        dict(ema_taus_s=(1.0, 1.0)),
        dict(ema_taus_s=(-1.0, 60.0)),
        dict(ema_interpolation="cubic"),
        dict(ofi_levels=0),
        dict(ofi_levels=11),
    ],
)
def test_bad_params(bad: dict) -> None:
    with pytest.raises(ValueError):
        feature_specs(FeatureParams(**bad))


def test_bad_device() -> None:
    from alphafeat import devices

    with pytest.raises(ValueError):
        compute_features(random_book(3, 0), device="tpu")
    with pytest.raises(ValueError, match="tpu"):
        devices.compute_features(random_book(3, 0), device="tpu")
    # the CPU path only: the choice of device lies above alphafeat.cuda (no import cycle)
    with pytest.raises(ValueError, match="alphafeat.devices.compute_features"):
        compute_features(random_book(3, 0), device="cuda")
    book = random_book(50, 1)
    for a, b in zip(compute_features(book).values(), devices.compute_features(book, n_chunks=3).values(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [0, 1])
def test_tiny_segments(n: int) -> None:
    book = random_book(max(n, 1), 3)
    if n == 0:
        book = BookArrays(*(getattr(book, k)[:0] for k in (
            "ts_event", "ts_recv", "bid_px", "ask_px", "bid_sz", "ask_sz",
            "bid_ct", "ask_ct", "buy_volume", "sell_volume", "trade_count")))  # fmt: skip
    f = compute_features(book)
    assert all(v.shape == (n,) and v.dtype == np.float64 for v in f.values())
    if n == 1:
        assert math.isnan(f["log_dt"][0]) and math.isnan(f["tick_return"][0])
        assert math.isnan(f["ofi_l01"][0])
        assert f["trade_rate_1s"][0] == book.trade_count[0]


def test_segments_restart() -> None:
    # one call = one segment: the second half computed alone equals a fresh computation on
    # those rows, and differs from the same rows inside the whole (state carried over).
    book = random_book(200, 5)
    half = BookArrays(*(getattr(book, k)[100:] for k in (
        "ts_event", "ts_recv", "bid_px", "ask_px", "bid_sz", "ask_sz",
        "bid_ct", "ask_ct", "buy_volume", "sell_volume", "trade_count")))  # fmt: skip
    alone = compute_features(half)
    ref = slow_features(half, FeatureParams())
    np.testing.assert_allclose(alone["ema_mid_60s"], ref["ema_mid_60s"], rtol=1e-12,
                               equal_nan=True)  # fmt: skip
    assert math.isnan(alone["tick_return"][0])
    whole = compute_features(book)
    assert not np.allclose(whole["trade_rate_60s"][100:], alone["trade_rate_60s"])


# ------------------------------------------------------------------------------------------
# no look-ahead
# ------------------------------------------------------------------------------------------


def perturb_after(book: BookArrays, t: int, seed: int) -> BookArrays:
    """Replace every row after t with rows of another random book (times kept increasing)."""
    other = random_book(len(book), seed)
    out = {}
    for k in ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct",
              "buy_volume", "sell_volume", "trade_count"):  # fmt: skip
        v = getattr(book, k).copy()
        v[t + 1 :] = getattr(other, k)[t + 1 :]
        out[k] = v
    ts = book.ts_recv.copy()
    ts[t + 1 :] = ts[t] + 1 + (other.ts_recv[t + 1 :] - other.ts_recv[t])
    return BookArrays(ts_event=ts.copy(), ts_recv=ts, **out)


@pytest.mark.parametrize("t", [0, 37, 150, 298])
def test_no_look_ahead(t: int) -> None:
    book = random_book(300, 11)
    changed = perturb_after(book, t, 99)
    for params in PARAMS:
        a = compute_features(book, params)
        b = compute_features(changed, params)
        for name in a:
            np.testing.assert_array_equal(a[name][: t + 1], b[name][: t + 1], err_msg=name)
        assert any(not np.array_equal(a[k][t + 1 :], b[k][t + 1 :], equal_nan=True) for k in a)


def test_cuda_available_is_bool() -> None:
    assert isinstance(cuda_available(), bool)


def _cached_toy(x: float) -> float:
    return x + 1.0


def test_not_compiled_until_numba_caches_the_kernel(tmp_path, monkeypatch) -> None:
    # the hint's test (precompute's and synth's): a cache=True kernel not yet compiled in this
    # environment has no cache index; once called, it has (numba's cache folder moved to tmp_path)
    import numba

    from alphafeat.precompute.workers import not_compiled

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    toy = numba.njit(cache=True)(_cached_toy)
    assert not_compiled(toy) is True
    assert toy(1.0) == 2.0
    assert not_compiled(toy) is False
    assert not_compiled(object()) is False  # not a numba kernel: no hint, no error


def test_first_use_hint_goes_once_compiled() -> None:
    # precompute's "compiling kernels" hint reads numba's cache index of the CPU kernel:
    # after one compute in this environment the index is on disk and the hint goes
    from alphafeat.precompute.workers import first_use

    compute_features(random_book(50, 0))
    assert first_use() is False
