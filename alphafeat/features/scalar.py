"""Scalar building blocks and small reference-scale helpers of the feature set (CPU).

OFI (Cont, Kukanov & Stoikov 2014), the weighted mid (Stoikov 2018), the irregular EMA
(Zumbach & Müller 2001), the trade-rate EMA, the linear scan with its exact chunk carry,
the Hawkes intensity with an exponential kernel (Hawkes 1971, recursion of Ozaki 1979) and
fractional differencing (López de Prado 2018, ch. 5). Conventions: :mod:`alphafeat.features`.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from alphafeat.features import twin
from alphafeat.features.registry import INTERPOLATIONS, frac_diff_weights

# --------------------------------------------------------------------------------------------
# scalar building blocks
# --------------------------------------------------------------------------------------------


#: The per-row functions of the CUDA kernels, compiled with ``numba.njit`` (one source).
_ROWS = twin.load("cpu")
_ofi_level = _ROWS.ofi_level


@numba.njit(cache=True)
def ofi_step(pb0: float, qb0: float, pa0: float, qa0: float, pb1: float, qb1: float, pa1: float, qa1: float) -> float:
    """Order-flow imbalance of one level between two snapshots (Cont, Kukanov & Stoikov 2014).

    ``e = 1{Pb1>=Pb0} qb1 - 1{Pb1<=Pb0} qb0 - 1{Pa1<=Pa0} qa1 + 1{Pa1>=Pa0} qa0``
    (non-strict inequalities). Index 0 is the previous snapshot, 1 the current one. Prices in
    index points, sizes in contracts; a NaN price is an empty level: bid price ``-inf``, ask
    price ``+inf``, size 0. Returns contracts (float). The formula is
    :func:`alphafeat.features._rows.ofi_level`, the one the CUDA kernels compile.
    """
    return _ofi_level(pb0, qb0, pa0, qa0, pb1, qb1, pa1, qa1)


@numba.njit(cache=True)
def stoikov_imbalance(qb: float, qa: float) -> float:
    """Stoikov (2018) imbalance ``I = Qb / (Qb + Qa)`` on [0, 1]; NaN if ``Qb + Qa <= 0``."""
    tot = qb + qa
    if not tot > 0.0:
        return math.nan
    return qb / tot


@numba.njit(cache=True)
def microprice(pb: float, qb: float, pa: float, qa: float) -> float:
    """Weighted mid ``W = I*Pa + (1 - I)*Pb``, ``I = Qb/(Qb+Qa)`` (Stoikov 2018).

    Prices in index points, sizes in contracts. NaN if a price is NaN or ``Qb + Qa <= 0``.
    """
    if math.isnan(pb) or math.isnan(pa):
        return math.nan
    i = stoikov_imbalance(qb, qa)
    return i * pa + (1.0 - i) * pb


@numba.njit(cache=True)
def _zm_coefficients(dt_s: float, tau_s: float, interp: int, z_prev: float, z: float):
    """(a, b) of one Zumbach–Müller EMA step over ``dt_s`` seconds (``dt_s >= 0``)."""
    x = dt_s / tau_s
    mu = math.exp(-x)
    if interp == 0:
        nu = 1.0
    elif interp == 1:
        nu = -math.expm1(-x) / x if x > 0.0 else 1.0
    else:
        nu = mu
    return mu, (nu - mu) * z_prev + (1.0 - nu) * z


# --------------------------------------------------------------------------------------------
# linear recurrences
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def _linear_scan(a: np.ndarray, b: np.ndarray, x0: float, out: np.ndarray) -> None:
    x = x0
    for i in range(a.shape[0]):
        x = a[i] * x + b[i]
        out[i] = x


def linear_scan(a: np.ndarray, b: np.ndarray, x0: float = 0.0) -> np.ndarray:
    """Run ``x_i = a_i x_{i-1} + b_i`` from ``x_{-1} = x0``.

    Parameters
    ----------
    a, b : np.ndarray, float64, shape (n,)
        Per-row coefficients.
    x0 : float
        State before row 0.

    Returns
    -------
    np.ndarray, float64, shape (n,)
        The states ``x_0 .. x_{n-1}``.
    """
    a = np.ascontiguousarray(a, dtype=np.float64)
    b = np.ascontiguousarray(b, dtype=np.float64)
    out = np.empty(a.shape[0], dtype=np.float64)
    _linear_scan(a, b, float(x0), out)
    return out


@numba.njit(cache=True)
def scan_compose(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Compose a block of the recurrence ``x_i = a_i x_{i-1} + b_i`` into one map.

    Returns ``(A, B)`` with ``x_last = A * x_before + B`` (identity ``(1, 0)`` for an empty
    block): the exact carry between chunks, ``(a, b) then (a', b') = (a' a, a' b + b')``.
    """
    A = 1.0
    B = 0.0
    for i in range(a.shape[0]):
        A = a[i] * A
        B = a[i] * B + b[i]
    return A, B


@numba.njit(cache=True)
def _ema_coefficients(
    t_ns: np.ndarray,
    z: np.ndarray,
    tau_s: float,
    interp: int,
    a: np.ndarray,
    b: np.ndarray,
    started: np.ndarray,
) -> None:
    j = -1  # last row with a finite observation
    for i in range(z.shape[0]):
        zi = z[i]
        if not math.isfinite(zi):
            a[i] = 1.0
            b[i] = 0.0
            started[i] = j >= 0
        elif j < 0:
            a[i] = 0.0
            b[i] = zi
            started[i] = True
            j = i
        else:
            dt = max(t_ns[i] - t_ns[j], 0) / 1e9
            ai, bi = _zm_coefficients(dt, tau_s, interp, z[j], zi)
            a[i] = ai
            b[i] = bi
            started[i] = True
            j = i


def ema_coefficients(
    t_ns: np.ndarray, z: np.ndarray, tau_s: float, interpolation: str = "linear"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row coefficients of the irregular EMA (Zumbach & Müller 2001) as a linear scan.

    Parameters
    ----------
    t_ns : np.ndarray, int64, shape (n,)
        Observation times, ns (``ts_recv``).
    z : np.ndarray, float64, shape (n,)
        Observations; non-finite values are skipped (see the module docstring).
    tau_s : float
        Time constant, seconds.
    interpolation : str
        ``'previous'``, ``'linear'`` or ``'next'``.

    Returns
    -------
    a, b : np.ndarray, float64, shape (n,)
        ``EMA_i = a_i EMA_{i-1} + b_i`` with ``EMA_{-1} = 0``.
    started : np.ndarray, bool, shape (n,)
        False on rows before the first finite observation (where the EMA is NaN).
    """
    t_ns = np.ascontiguousarray(t_ns, dtype=np.int64)
    z = np.ascontiguousarray(z, dtype=np.float64)
    n = z.shape[0]
    a = np.empty(n, dtype=np.float64)
    b = np.empty(n, dtype=np.float64)
    started = np.empty(n, dtype=np.bool_)
    _ema_coefficients(t_ns, z, float(tau_s), INTERPOLATIONS[interpolation], a, b, started)
    return a, b, started


def irregular_ema(t_ns: np.ndarray, z: np.ndarray, tau_s: float, interpolation: str = "linear") -> np.ndarray:
    """Irregularly spaced EMA (Zumbach & Müller 2001), float64 shape (n,), unit of ``z``.

    ``EMA_n = mu EMA_{n-1} + (nu - mu) z_{n-1} + (1 - nu) z_n``, ``mu = exp(-dt/tau)``,
    ``nu`` = 1 / ``(1 - mu) tau/dt`` / ``mu`` for 'previous' / 'linear' / 'next';
    ``EMA_0 = z_0``. ``t_ns`` int64 ns, ``tau_s`` seconds. NaN observations are skipped
    (EMA held; NaN before the first finite one).
    """
    a, b, started = ema_coefficients(t_ns, z, tau_s, interpolation)
    out = linear_scan(a, b, 0.0)
    out[~started] = np.nan
    return out


@numba.njit(cache=True)
def _trade_rate_coefficients(t_ns: np.ndarray, counts: np.ndarray, tau_s: float, a: np.ndarray, b: np.ndarray) -> None:
    for i in range(counts.shape[0]):
        dt = max(t_ns[i] - t_ns[i - 1], 0) / 1e9 if i > 0 else 0.0
        a[i] = math.exp(-dt / tau_s)
        c = counts[i]
        b[i] = c / tau_s if math.isfinite(c) else 0.0


def trade_rate_coefficients(t_ns: np.ndarray, counts: np.ndarray, tau_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-row ``(a, b)`` of the trade-rate EMA ``lambda_i = a_i lambda_{i-1} + b_i``.

    ``a_i = exp(-dt_i/tau)`` (``dt_0 = 0``), ``b_i = count_i / tau`` (NaN count -> 0).
    ``t_ns`` int64 ns shape (n,), ``counts`` float64 shape (n,), ``tau_s`` seconds.
    """
    t_ns = np.ascontiguousarray(t_ns, dtype=np.int64)
    counts = np.ascontiguousarray(counts, dtype=np.float64)
    n = counts.shape[0]
    a = np.empty(n, dtype=np.float64)
    b = np.empty(n, dtype=np.float64)
    _trade_rate_coefficients(t_ns, counts, float(tau_s), a, b)
    return a, b


def trade_rate_ema(t_ns: np.ndarray, counts: np.ndarray, tau_s: float) -> np.ndarray:
    """Exponentially decayed trade rate, trades/s, float64 shape (n,).

    ``lambda_i = exp(-dt_i/tau) lambda_{i-1} + count_i / tau``, ``lambda_{-1} = 0``.
    ``t_ns`` int64 ns, ``counts`` trades per row, ``tau_s`` seconds.
    """
    a, b = trade_rate_coefficients(t_ns, counts, tau_s)
    return linear_scan(a, b, 0.0)


# --------------------------------------------------------------------------------------------
# Hawkes intensity and fractional differencing
# --------------------------------------------------------------------------------------------


def hawkes_intensity(
    t_ns: np.ndarray, counts: np.ndarray, mu: float, alpha: float, beta: float, after: bool = False
) -> np.ndarray:
    """Hawkes intensity with the exponential kernel at each row, events/s, float64 (n,).

    ``lambda(t) = mu + sum_{t_j < t} alpha exp(-beta (t - t_j))`` (Hawkes 1971), by Ozaki's
    (1979) recursion ``R_i = exp(-beta dt_i) (R_{i-1} + n_{i-1})``, ``R_0 = 0``: returns
    ``mu + alpha R_i`` = ``lambda(t_i-)`` (events of row i excluded), or with ``after=True``
    ``mu + alpha (R_i + n_i)`` = ``lambda(t_i+)`` (the feature columns ``hawkes_buy/sell``).
    ``t_ns`` int64 ns, ``counts`` events per row, ``mu``/``alpha``/``beta`` in 1/s.
    """
    t_ns = np.asarray(t_ns, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.float64)
    out = np.empty(counts.shape[0])
    s = 0.0  # R_i + n_i
    for i in range(counts.shape[0]):
        dt = max(int(t_ns[i] - t_ns[i - 1]), 0) / 1e9 if i else 0.0
        r = math.exp(-beta * dt) * s if i else 0.0
        s = r + counts[i]
        out[i] = mu + alpha * (s if after else r)
    return out


def frac_diff_ffd(x: np.ndarray, d: float, threshold: float) -> np.ndarray:
    """Fixed-width-window fractional differencing (AFML 5.5), float64 (n,).

    ``y_i = sum_{k<W} w_k x_{i-k}`` with the weights of :func:`frac_diff_weights`
    (``|w_k| >= threshold``); NaN for ``i < W - 1``. The ``fracdiff_log_mid`` column applies
    this to the forward-filled log mid.
    """
    x = np.asarray(x, dtype=np.float64)
    w = frac_diff_weights(d, threshold=threshold)
    out = np.full(x.shape[0], np.nan)
    for i in range(w.size - 1, x.shape[0]):
        out[i] = float(np.dot(w, x[i - w.size + 1 : i + 1][::-1]))
    return out


def frac_diff_expanding(x: np.ndarray, d: float) -> np.ndarray:
    """Expanding-window fractional differencing (AFML 5.4 without the weight-loss cut):
    ``y_i = sum_{k<=i} w_k x_{i-k}``, float64 (n,)."""
    x = np.asarray(x, dtype=np.float64)
    w = frac_diff_weights(d, size=max(x.shape[0], 1))
    return np.array([float(np.dot(w[: i + 1], x[: i + 1][::-1])) for i in range(x.shape[0])])
