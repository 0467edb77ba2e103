"""The full feature set: reference values (guide), a plain-Python slow reference of every new
column, exact chunking (hypothesis), joblib processes, registry table.

Expected values come from /work/shared/guide/reference-values.md or from ``slow_new`` below,
written from the formulas in plain Python, never from the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_features import NS, PARAMS, random_book, slow_zm_ema

from alphafeat.features import (
    FeatureParams,
    compute_features,
    compute_features_chunked,
    feature_specs,
    feature_table,
    frac_diff_expanding,
    frac_diff_ffd,
    frac_diff_weights,
    hawkes_intensity,
)
from alphafeat.types import LEVELS, BookArrays

# ------------------------------------------------------------------------------------------
# reference values (reference-values.md)
# ------------------------------------------------------------------------------------------


def test_hawkes_reference() -> None:
    # mu = 0, alpha = beta = 1, events at t = 0, 1, 2 -> R = 0, 0.367879, 0.503215
    t = np.array([0, NS, 2 * NS])
    r = hawkes_intensity(t, np.ones(3), 0.0, 1.0, 1.0)
    np.testing.assert_allclose(r, [0.0, 0.367879, 0.503215], atol=5e-7)
    # the feature column is the intensity just after the row's events: R + 1
    np.testing.assert_allclose(hawkes_intensity(t, np.ones(3), 0.0, 1.0, 1.0, after=True), r + 1.0, rtol=1e-15)


def test_hawkes_column_reference() -> None:
    # buy events (buy_volume > 0) at t = 0, 1, 2 s; column = mu + alpha (R + 1)
    from test_features import make_book

    book = make_book([100.0] * 3, [5.0] * 3, [100.25] * 3, [5.0] * 3, ts=[0, NS, 2 * NS],
                     buy=[1.0, 2.0, 7.0], count=[1.0, 1.0, 1.0])  # fmt: skip
    f = compute_features(book, FeatureParams(hawkes_mu=0.0, hawkes_alpha=1.0, hawkes_beta=1.0))
    np.testing.assert_allclose(f["hawkes_buy"], [1.0, 1.367879, 1.503215], atol=5e-7)
    np.testing.assert_array_equal(f["hawkes_sell"], [0.0, 0.0, 0.0])


def test_fracdiff_reference() -> None:
    np.testing.assert_allclose(frac_diff_weights(0.5, size=5), [1, -0.5, -0.125, -0.0625, -0.0390625], rtol=1e-15)
    x = np.array([1.0, 2.0, 4.0, 7.0, 0.0])
    np.testing.assert_allclose(frac_diff_ffd(x, 0.5, 0.1), [np.nan, np.nan, 2.875, 4.75, -4.0], rtol=1e-15)
    np.testing.assert_allclose(frac_diff_expanding(x, 0.5), [1, 1.5, 2.875, 4.6875, -4.1640625], rtol=1e-15)
    assert frac_diff_weights(0.5, threshold=1e-5).size == 927


def test_fracdiff_column_reference() -> None:
    # the column is the fixed window on log mid: exp(mid) = x gives log mid = x
    from test_features import make_book

    x = np.array([1.0, 2.0, 4.0, 7.0, 0.0])
    mid = np.exp(x)
    book = make_book(list(mid - 0.001), [5.0] * 5, list(mid + 0.001), [5.0] * 5)
    f = compute_features(book, FeatureParams(fracdiff_d=0.5, fracdiff_threshold=0.1, tick_size=0.001))
    np.testing.assert_allclose(f["fracdiff_log_mid"], [np.nan, np.nan, 2.875, 4.75, -4.0], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------
# slow reference of the new columns (plain Python from the formulas)
# ------------------------------------------------------------------------------------------


def _lab(tau: float) -> str:
    return f"{float(tau):g}".replace(".", "p") + "s"


def _slog(x: float) -> float:
    return math.copysign(math.log1p(abs(x)), x) if x == x else math.nan


def _decayed(ts: list[int], z: list[float], tau: float, scale: float) -> list[float]:
    out, x = [], 0.0
    for i, zi in enumerate(z):
        dt = max(ts[i] - ts[i - 1], 0) / 1e9 if i else 0.0
        x = math.exp(-dt / tau) * x + (scale * zi if math.isfinite(zi) else 0.0)
        out.append(x)
    return out


def slow_new(book: BookArrays, p: FeatureParams) -> dict[str, list[float]]:
    n = len(book)
    ts = [int(v) for v in book.ts_recv]
    tick = p.tick_size
    nan = math.nan

    def q(side: str, i: int, m: int) -> float:
        px = (book.bid_px if side == "b" else book.ask_px)[i][m]
        return 0.0 if math.isnan(px) else float((book.bid_sz if side == "b" else book.ask_sz)[i][m])

    f: dict[str, list[float]] = {}
    mid = [nan if (math.isnan(book.bid_px[i][0]) or math.isnan(book.ask_px[i][0]))
           else (book.bid_px[i][0] + book.ask_px[i][0]) / 2 for i in range(n)]  # fmt: skip
    spread = [(book.ask_px[i][0] - book.bid_px[i][0]) / tick for i in range(n)]
    ret = [nan] + [(mid[i] - mid[i - 1]) / tick for i in range(1, n)]
    sv = [float(book.buy_volume[i] - book.sell_volume[i]) for i in range(n)]
    M = p.ofi_levels
    oi = [nan]
    for i in range(1, n):
        e_tot = 0.0
        for m in range(M):
            def lv(j: int, s: str, m: int = m) -> tuple[float, float]:
                px = float((book.bid_px if s == "b" else book.ask_px)[j][m])
                if math.isnan(px):
                    return (-math.inf if s == "b" else math.inf), 0.0
                return px, q(s, j, m)
            pb0, qb0 = lv(i - 1, "b")
            pa0, qa0 = lv(i - 1, "a")
            pb1, qb1 = lv(i, "b")
            pa1, qa1 = lv(i, "a")
            e_tot += (qb1 if pb1 >= pb0 else 0) - (qb0 if pb1 <= pb0 else 0)
            e_tot += -(qa1 if pa1 <= pa0 else 0) + (qa0 if pa1 >= pa0 else 0)
        dep = sum(q("b", i, m) + q("a", i, m) + q("b", i - 1, m) + q("a", i - 1, m) for m in range(M)) / (4 * M)
        oi.append(e_tot / dep if dep > 0 else nan)
    f["ofi_integrated"] = oi
    D = p.depth_levels
    for m in range(D):
        f[f"log_depth_bid_l{m + 1:02d}"] = [math.log(1 + q("b", i, m)) for i in range(n)]
        f[f"log_depth_ask_l{m + 1:02d}"] = [math.log(1 + q("a", i, m)) for i in range(n)]
    w = [math.exp(-p.depth_weight_decay * m) for m in range(D)]
    imw = []
    for i in range(n):
        num = sum(w[m] * (q("b", i, m) - q("a", i, m)) for m in range(D))
        den = sum(w[m] * (q("b", i, m) + q("a", i, m)) for m in range(D))
        imw.append(nan if (math.isnan(mid[i]) or den <= 0) else num / den)
    f["imbalance_weighted"] = imw
    for side, s in (("bid", "b"), ("ask", "a")):
        px = book.bid_px if s == "b" else book.ask_px
        col = []
        for i in range(n):
            lv = [m for m in range(D) if not math.isnan(px[i][m])]
            if math.isnan(px[i][0]):
                col.append(nan)
            else:
                col.append(sum(q(s, i, m) for m in lv) / (1 + abs(px[i][0] - px[i][lv[-1]]) / tick))
        f[f"book_slope_{side}"] = col
    vol = [float(book.buy_volume[i] + book.sell_volume[i]) for i in range(n)]
    f["aggressor_imbalance"] = [sv[i] / vol[i] if vol[i] > 0 else 0.0 for i in range(n)]
    f["log1p_trade_count"] = [math.log(1 + float(c)) for c in book.trade_count]
    for side, v in (("buy", book.buy_volume), ("sell", book.sell_volume)):
        s_ = _decayed(ts, [1.0 if x > 0 else 0.0 for x in v], 1 / p.hawkes_beta, 1.0)
        f[f"hawkes_{side}"] = [p.hawkes_mu + p.hawkes_alpha * x for x in s_]
    prop = _decayed(ts, sv, p.propagator_tau_s, 1.0)
    f["propagator_flow"] = prop
    r2 = [r * r for r in ret]
    var = {tau: _decayed(ts, r2, tau, 1 / tau) for tau in p.vol_taus_s}
    ema = {tau: slow_zm_ema(ts, mid, tau, p.ema_interpolation) for tau in p.vol_taus_s}
    for tau in p.vol_taus_s:
        f[f"realized_vol_{_lab(tau)}"] = [math.sqrt(v) for v in var[tau]]

    def z(num: float, v: float) -> float:
        return num / tick / math.sqrt(v) if (v > 0 and num == num) else nan

    for tau in p.vol_taus_s[1:]:
        # mid is held (last finite) where NaN: the deviation of the last finite mid
        last, col = nan, []
        for i in range(n):
            last = mid[i] if mid[i] == mid[i] else last
            col.append(z(last - ema[tau][i], var[tau][i] * tau))
        f[f"mid_z_{_lab(tau)}"] = col
    tf, _, tsl = p.vol_taus_s
    f["trend"] = [z(ema[tf][i] - ema[tsl][i], var[tsl][i] * tsl) for i in range(n)]
    lsp = [math.log(s) if s > 0 else nan for s in spread]
    for tau in p.ema_taus_s:
        f[f"ema_log_spread_{_lab(tau)}"] = slow_zm_ema(ts, lsp, tau, p.ema_interpolation)
        lam = _decayed(ts, [float(c) for c in book.trade_count], tau, 1 / tau)
        f[f"log_trade_rate_{_lab(tau)}"] = [math.log(1 + x) for x in lam]
    wts = frac_diff_weights(p.fracdiff_d, threshold=p.fracdiff_threshold)
    y, last = [], nan
    for i in range(n):
        if mid[i] == mid[i] and mid[i] > 0:
            last = math.log(mid[i])
        y.append(last)
    f["fracdiff_log_mid"] = [nan if i < len(wts) - 1 else sum(wts[k] * y[i - k] for k in range(len(wts)))
                             for i in range(n)]  # fmt: skip
    f["slog_signed_volume"] = [_slog(x) for x in sv]
    f["slog_propagator_flow"] = [_slog(x) for x in prop]
    return f


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("params", PARAMS, ids=["default", "previous", "next"])
def test_new_features_match_slow_reference(seed: int, params: FeatureParams) -> None:
    book = random_book(300, seed)
    got = compute_features(book, params)
    ref = slow_new(book, params)
    names = [s.name for s in feature_specs(params)]
    assert set(ref) <= set(names)
    for name in ref:
        # mid z-score: the reference differences two separately computed values (EMA and
        # mid), the code runs the deviation recurrence: equal up to cancellation at 1e-9
        tol = 1e-9 if name.startswith(("mid_z", "trend")) else 1e-12
        np.testing.assert_allclose(got[name], np.asarray(ref[name], dtype=float), rtol=tol, atol=tol,
                                   equal_nan=True, err_msg=name)  # fmt: skip
    np.testing.assert_allclose(got["slog_ofi_l01"], [_slog(x) for x in got["ofi_l01"]], rtol=1e-15, equal_nan=True)
    if params.fracdiff_threshold >= 0.002:
        assert np.isfinite(got["fracdiff_log_mid"]).sum() > 100  # the window was exercised


# ------------------------------------------------------------------------------------------
# exact chunking
# ------------------------------------------------------------------------------------------


def _assert_close(a: dict, b: dict, rtol: float = 1e-12) -> None:
    assert list(a) == list(b)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=rtol, atol=rtol, equal_nan=True, err_msg=k)


_BOOKS = {seed: random_book(400, seed) for seed in range(3)}


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2), st.integers(1, 400), st.integers(1, 40), st.integers(0, 2))
def test_chunked_equals_sequential(seed: int, n: int, k: int, pi: int) -> None:
    full = _BOOKS[seed]
    book = BookArrays(*(getattr(full, f)[:n] for f in (
        "ts_event", "ts_recv", "bid_px", "ask_px", "bid_sz", "ask_sz",
        "bid_ct", "ask_ct", "buy_volume", "sell_volume", "trade_count")))  # fmt: skip
    p = PARAMS[pi]
    _assert_close(compute_features(book, p), compute_features(book, p, n_chunks=k, n_jobs=1))


def test_chunked_in_processes() -> None:
    book = random_book(3000, 8)
    p = PARAMS[1]
    seq = compute_features(book, p)
    _assert_close(seq, compute_features(book, p, n_chunks=7, n_jobs=2))
    _assert_close(seq, compute_features_chunked(book, p, n_chunks=3, n_jobs=2))


def test_chunk_boundary_inside_nan_run() -> None:
    # a long run of one-sided rows across chunk boundaries: the skip-NaN carry must hold
    book = random_book(200, 4)
    book.bid_px[50:150, 0] = np.nan
    _assert_close(compute_features(book, PARAMS[2]), compute_features(book, PARAMS[2], n_chunks=9))


# ------------------------------------------------------------------------------------------
# registry
# ------------------------------------------------------------------------------------------


def test_registry_table() -> None:
    rows = feature_table()
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names)) == 69
    for r in rows:
        assert r["unit"] and r["source"] and r["formula"] and r["cpu"] and r["cuda"], r["name"]
        assert 1 <= r["min_depth"] <= LEVELS
    by = {r["name"]: r for r in rows}
    assert by["ofi_l07"]["min_depth"] == 7 and by["imbalance_l10"]["min_depth"] == 10
    assert by["fracdiff_log_mid"]["parameters"]["window"] == frac_diff_weights(0.4, threshold=1e-4).size
    for bad in (dict(vol_taus_s=(60.0, 10.0, 600.0)), dict(fracdiff_d=1.5), dict(depth_levels=0)):
        with pytest.raises(ValueError):
            feature_specs(FeatureParams(**bad))


def test_result_matrix_reused_only_when_released() -> None:
    # the CPU result matrix is recycled by the next call only once no view of it is alive
    book = random_book(500, 9)
    a = compute_features(book)
    ref = {k: v.copy() for k, v in a.items()}
    b = compute_features(book, n_chunks=3)
    assert not np.shares_memory(a["mid"], b["mid"])
    for k in ref:
        np.testing.assert_array_equal(a[k], ref[k], err_msg=k)
    ptr = b["mid"].__array_interface__["data"][0]  # the pool keeps the latest matrix
    del a, b
    c = compute_features(book)
    assert c["mid"].__array_interface__["data"][0] == ptr
    for k in ref:
        np.testing.assert_array_equal(c[k], ref[k], err_msg=k)
