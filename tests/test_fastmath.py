"""The branch-free ``exp``, ``expm1``, ``log``, ``log1p`` of :mod:`alphafeat.features._vmath`
against independent references: libm through numpy (every value), and mpmath at 120 bits
(the exact value) where our result and libm's differ.

Bound asserted: at most 2 ulp from libm everywhere and under 1 ulp (|error| / ulp of the
exact value) from mpmath where checked; measured when written: at most 1 ulp from libm on
every value drawn here, and at most ~0.99 ulp from the exact value. Special values (NaN,
+-inf, +-0, subnormals, the overflow and underflow edges) equal libm's bit for bit.
"""

from __future__ import annotations

import platform

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alphafeat.features._vmath import vexp, vexp_expm1, vexpm1, vlog, vlog1p


@numba.njit(error_model="numpy")
def _apply(which, x, o):
    # the loop shape of the feature kernels: LLVM vectorises it
    if which == 0:
        for t in range(x.shape[0]):
            o[t] = vexp(x[t])
    elif which == 1:
        for t in range(x.shape[0]):
            o[t] = vexpm1(x[t])
    elif which == 2:
        for t in range(x.shape[0]):
            o[t] = vlog(x[t])
    else:
        for t in range(x.shape[0]):
            o[t] = vlog1p(x[t])


@numba.njit(error_model="numpy")
def _pair(x, e, em):
    for t in range(x.shape[0]):
        a, b = vexp_expm1(x[t])
        e[t] = a
        em[t] = b


@numba.njit
def _scalar(which, v):
    # one value, outside a vectorised loop (the patch-up paths call them that way)
    if which == 0:
        return vexp(v)
    if which == 1:
        return vexpm1(v)
    if which == 2:
        return vlog(v)
    return vlog1p(v)


FUNCS = {0: ("exp", np.exp), 1: ("expm1", np.expm1), 2: ("log", np.log), 3: ("log1p", np.log1p)}
RNG = np.random.default_rng(20261130)


def ours(which: int, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float64)
    o = np.empty_like(x)
    _apply(which, x, o)
    return o


def libm(which: int, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return FUNCS[which][1](np.asarray(x, dtype=np.float64))


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Number of float64 values between a and b (0: identical; NaN == NaN; +0 == -0 only
    when both are zero is *not* assumed: signs must agree). 2**62 for a sign or NaN mismatch."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    big = np.int64(2**62)
    d = np.abs(a.view(np.int64) - b.view(np.int64))  # same sign: no overflow
    same = (np.signbit(a) == np.signbit(b)) & ~np.isnan(a) & ~np.isnan(b)
    d = np.where(same, d, big)
    return np.where(np.isnan(a) & np.isnan(b), 0, d)


def check(which: int, x: np.ndarray, max_ulp: int = 2) -> int:
    got = ours(which, x)
    ref = libm(which, x)
    d = ulp_distance(got, ref)
    worst = int(d.max()) if d.size else 0
    if worst > max_ulp:
        i = int(np.argmax(d))
        raise AssertionError(f"{FUNCS[which][0]}({x[i]!r}) = {got[i]!r}, libm {ref[i]!r}: {d[i]} ulp")
    return worst


def _positive_doubles(n: int) -> np.ndarray:
    """Uniform over the bit patterns of positive finite doubles (every binade, subnormals
    included)."""
    return RNG.integers(1, 0x7FF0000000000000, n, dtype=np.int64).view(np.float64)


# ------------------------------------------------------------------------------------------
# dense grids over the ranges the kernels use, and beyond
# ------------------------------------------------------------------------------------------


def test_exp_grid() -> None:
    x = np.concatenate([
        np.linspace(-750.0, 712.0, 300_001),  # every exponent, subnormal results, overflow
        -RNG.exponential(0.3, 100_000),  # -dt / tau of the decay factors
        -np.geomspace(1e-18, 50.0, 50_000),
        RNG.uniform(-0.36, 0.36, 50_000),  # inside one reduction interval
        np.geomspace(1e-300, 1e-16, 2_000) * RNG.choice([-1.0, 1.0], 2_000),
    ])  # fmt: skip
    assert check(0, x) <= 1


def test_expm1_grid() -> None:
    x = np.concatenate([
        np.linspace(-60.0, 712.0, 300_001),
        -RNG.exponential(0.3, 100_000),  # expm1(-dt / tau) of the 'linear' weight
        -np.geomspace(1e-18, 50.0, 50_000),
        RNG.uniform(-1.2, 1.2, 100_000),  # k = -1, 0, 1 around the cancellation
        np.geomspace(5e-324, 1e-8, 20_000) * RNG.choice([-1.0, 1.0], 20_000),
    ])  # fmt: skip
    assert check(1, x) <= 1


def test_log_grid() -> None:
    x = np.concatenate([
        _positive_doubles(200_000),  # every binade, subnormals included
        RNG.uniform(0.5, 2.0, 100_000),  # around 1
        1.0 + np.geomspace(1e-16, 1e-3, 10_000) * RNG.choice([-1.0, 1.0], 10_000),
        np.arange(1.0, 5000.0),  # spreads in ticks (the table)
        RNG.uniform(100.0, 20_000.0, 100_000),  # mids, index points
        np.geomspace(1e-9, 1e6, 100_000),  # time steps, seconds
        np.geomspace(5e-324, 2.2250738585072014e-308, 5_000),  # subnormals
    ])  # fmt: skip
    assert check(2, x) <= 1


def test_log1p_grid() -> None:
    x = np.concatenate([
        _positive_doubles(100_000),
        np.arange(0.0, 5000.0),  # sizes, counts (the table)
        RNG.uniform(-1.0, 1.0, 200_000),
        -1.0 + np.geomspace(1e-16, 0.5, 20_000),  # near -1
        np.geomspace(5e-324, 1e-3, 50_000) * RNG.choice([-1.0, 1.0], 50_000),  # near 0
        RNG.exponential(3.0, 50_000),  # trade rates
        RNG.uniform(0.0, 1e6, 50_000),  # |flows|
    ])  # fmt: skip
    assert check(3, x) <= 1


# ------------------------------------------------------------------------------------------
# special values: exactly libm's
# ------------------------------------------------------------------------------------------

TINY = 5e-324
MINN = 2.2250738585072014e-308
BIG = 1.7976931348623157e308
SPECIAL = np.array([
    np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, TINY, -TINY, MINN, -MINN, BIG, -BIG, 1.0, -1.0,
    2.0, 0.5, -0.5, np.nextafter(-1.0, 0.0), np.nextafter(-1.0, -2.0), 1e-300, -1e-300,
    709.782712893384, 709.7827128933841, 709.79, 710.0, 800.0, 1e300,
    -708.39, -708.4, -744.44, -745.1332191019411, -745.1332191019412, -745.2, -746.0, -800.0, -1e300,
    -36.0, -37.5, -38.0, -40.0, -41.0, -60.0, 0.34657359027997264, -0.34657359027997264,
])  # fmt: skip


@pytest.mark.parametrize("which", [0, 1, 2, 3])
def test_special_values_exact(which: int) -> None:
    got = ours(which, SPECIAL)
    ref = libm(which, SPECIAL)
    # results that are NaN, +-inf or +-0, and those of +-0 / +-inf arguments: bit for bit; the
    # rest (subnormal results included) within 1 ulp
    exact = ~np.isfinite(ref) | (ref == 0.0) | ~np.isfinite(SPECIAL) | (SPECIAL == 0)
    for x, g, r, e in zip(SPECIAL, got, ref, exact, strict=True):
        if np.isnan(r):
            assert np.isnan(g), (FUNCS[which][0], x, g)
        elif e:
            assert g == r and np.signbit(g) == np.signbit(r), (FUNCS[which][0], x, g, r)
    assert ulp_distance(got, ref).max() <= 1
    # the same values outside a vectorised loop
    for x, g in zip(SPECIAL, got, strict=True):
        s = _scalar(which, x)
        assert s == g or (np.isnan(s) and np.isnan(g)), (FUNCS[which][0], x, s, g)


def test_named_special_values() -> None:
    ex = lambda w, v: float(ours(w, np.array([v]))[0])  # noqa: E731
    assert ex(0, -np.inf) == 0.0 and ex(0, np.inf) == np.inf and ex(0, -1000.0) == 0.0
    assert ex(0, 0.0) == 1.0 and ex(0, 1000.0) == np.inf
    assert ex(1, -np.inf) == -1.0 and ex(1, np.inf) == np.inf and ex(1, 0.0) == 0.0
    assert np.signbit(ex(1, -0.0)) and np.signbit(ex(3, -0.0))
    assert ex(2, 0.0) == -np.inf and ex(2, -0.0) == -np.inf and ex(2, 1.0) == 0.0
    assert np.isnan(ex(2, -1.0)) and np.isnan(ex(2, -np.inf)) and ex(2, np.inf) == np.inf
    assert ex(3, -1.0) == -np.inf and np.isnan(ex(3, -1.5)) and np.isnan(ex(3, -np.inf))
    assert ex(3, np.inf) == np.inf and ex(3, TINY) == TINY and ex(3, -TINY) == -TINY
    for w in range(4):
        assert np.isnan(ex(w, np.nan))


# ------------------------------------------------------------------------------------------
# random draws (hypothesis): any float64
# ------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True), min_size=1, max_size=64))
def test_any_float64_within_2_ulp(xs: list[float]) -> None:
    x = np.array(xs, dtype=np.float64)
    for which in range(4):
        check(which, x)
        got = ours(which, x)
        ref = libm(which, x)
        assert np.array_equal(np.isnan(got), np.isnan(ref))
        inf = np.isinf(ref)
        assert np.array_equal(got[inf], ref[inf])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=64))
def test_pair_equals_single_functions(xs: list[float]) -> None:
    # vexp_expm1 gives the same values as vexp and vexpm1 (every CPU code path agrees)
    x = np.array(xs + [0.0, -0.0, -1e-310, np.nan, -np.inf, np.inf, -745.5, 709.9])
    e = np.empty_like(x)
    em = np.empty_like(x)
    _pair(x, e, em)
    np.testing.assert_array_equal(e, ours(0, x))
    np.testing.assert_array_equal(em, ours(1, x))


# ------------------------------------------------------------------------------------------
# exact reference where we and libm differ
# ------------------------------------------------------------------------------------------


def test_error_against_exact_values() -> None:
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 120
    mfun = {0: mpmath.exp, 1: mpmath.expm1, 2: mpmath.log, 3: mpmath.log1p}
    doms = {
        0: np.concatenate([np.linspace(-745.0, 709.0, 100_001), RNG.uniform(-0.36, 0.36, 20_000)]),
        1: np.concatenate([np.linspace(-40.0, 709.0, 100_001), RNG.uniform(-1.2, 1.2, 50_000)]),
        2: np.concatenate([_positive_doubles(50_000), RNG.uniform(0.5, 2.0, 50_000)]),
        3: np.concatenate([RNG.uniform(-0.999, 3.0, 50_000), _positive_doubles(20_000)]),
    }
    worst = {}
    for which, x in doms.items():
        got = ours(which, x)
        d = ulp_distance(got, libm(which, x))
        idx = np.flatnonzero(d > 0)
        idx = idx[np.argsort(-d[idx], kind="stable")][:150]  # the largest disagreements first
        w = 0.0
        for i in idx:
            exact = mfun[which](mpmath.mpf(float(x[i])))
            ulp = mpmath.mpf(float(np.spacing(abs(float(exact)))))  # ulp at the exact value
            w = max(w, float(abs(mpmath.mpf(float(got[i])) - exact) / ulp))
        worst[FUNCS[which][0]] = w
    assert all(w < 1.0 for w in worst.values()), worst


# ------------------------------------------------------------------------------------------
# the loops vectorise (the point of these functions)
# ------------------------------------------------------------------------------------------


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 assembly check")
def test_loops_vectorise() -> None:
    ours(0, np.ones(8))
    asm = "\n".join(_apply.inspect_asm().values())
    assert "mulpd" in asm  # packed double multiplies: the loops are vector loops (no libm calls)
    assert "exp@" not in asm and "log@" not in asm and "log1p@" not in asm
