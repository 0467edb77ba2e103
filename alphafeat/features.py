"""Per-snapshot order-book features: CPU (numba ``njit``) implementation and feature table.

One call of :func:`compute_features` handles one contiguous segment (one instrument, one
trading session, in time order): every difference and every recurrence starts fresh at row 0,
so state restarts at session breaks and rolls because the caller calls once per segment.

The CUDA twin lives in :mod:`alphafeat.cuda` (kernels in :mod:`alphafeat.cuda.kernels`);
tests hold the two equal.

Conventions (shared by the CPU and CUDA paths)
----------------------------------------------
Empty levels
    A level whose price is NaN is empty and its size counts as 0, whatever the size column
    holds. In OFI comparisons an empty bid level has price ``-inf`` and an empty ask level
    ``+inf``: a level that appears contributes ``+q`` (bid) / ``-q`` (ask), one that vanishes
    ``-q_prev`` (bid) / ``+q_prev`` (ask), one empty on both rows contributes 0.
Two-sided features
    ``mid``, ``spread_ticks``, ``microprice``, ``imbalance_l1`` and ``imbalance_l10`` are NaN
    when either best level (level 1) is empty; ``microprice`` and the imbalances are also NaN
    when their denominator (summed size) is 0.
Row 0
    Differenced features (``ofi_lNN``, ``log_dt``, ``tick_return``) are NaN at row 0: there is
    no previous snapshot in the segment. ``signed_volume`` is defined at row 0 (volume since
    the start of the segment's data).
Time
    ``ts_recv`` (int64 ns) is the clock. Time steps are taken as exact int64 differences and
    converted to seconds by ``/ 1e9``; a negative step (out-of-order input) is clipped to 0.
Irregular EMAs (Zumbach & Müller 2001)
    ``EMA_n = mu EMA_{n-1} + (nu - mu) z_{n-1} + (1 - nu) z_n``, ``mu = exp(-dt/tau)``,
    ``nu = 1`` ('previous'), ``(1 - mu) tau/dt`` ('linear', evaluated as
    ``-expm1(-x)/x`` with ``x = dt/tau`` and its limit 1 at ``dt = 0``), ``mu`` ('next').
    The EMA starts at the first finite observation (``EMA = z``) and is NaN before it.
    Non-finite observations (NaN mid when a side is empty, NaN tick return) are skipped: the
    EMA holds its value on those rows and the next finite observation is combined with the
    last finite one (``z_{n-1}``) and the time elapsed since it. I.e. the EMA equals the
    Zumbach–Müller EMA of the subsequence of finite observations, held between them.
    With ``dt = 0`` every scheme gives ``mu = nu = 1``: the EMA is unchanged.
Trade-rate EMA
    ``lambda_i = exp(-dt_i/tau) lambda_{i-1} + count_i / tau`` with ``lambda_{-1} = 0`` and
    ``dt_0 = 0`` (trades/s); a NaN count counts as 0 trades.
Linear recurrences
    Every EMA is ``x_i = a_i x_{i-1} + b_i`` with ``x_{-1} = 0``: the coefficients are built
    per row (:func:`ema_coefficients`, :func:`trade_rate_coefficients`) and the state is
    produced by :func:`linear_scan`. Chunks compose exactly with
    ``(a, b) then (a', b') = (a' a, a' b + b')`` (:func:`scan_compose`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from alphafeat.types import LEVELS, BookArrays

__all__ = [
    "INTERPOLATIONS",
    "FeatureParams",
    "FeatureSpec",
    "compute_features",
    "cuda_available",
    "ema_coefficients",
    "feature_specs",
    "irregular_ema",
    "linear_scan",
    "microprice",
    "ofi_step",
    "scan_compose",
    "stoikov_imbalance",
    "trade_rate_coefficients",
    "trade_rate_ema",
]

#: Interpolation schemes of the Zumbach–Müller EMA and their integer codes in the kernels.
INTERPOLATIONS: dict[str, int] = {"previous": 0, "linear": 1, "next": 2}

#: Number of row-wise columns before the OFI block (mid, spread, microprice, 2 imbalances).
_N_HEAD = 5
#: Quantities that get an EMA pair, in column order (the last is the trade rate).
_EMA_QUANTITIES = ("ema_mid", "ema_ret2", "ema_spread", "trade_rate")


@dataclass(frozen=True)
class FeatureParams:
    """Parameters of the feature set.

    Attributes
    ----------
    tick_size : float
        Minimum price increment in index points (ES: 0.25). Divides spreads and returns.
    ema_taus_s : tuple[float, float]
        The two EMA time constants, seconds (> 0, distinct).
    ema_interpolation : str
        Zumbach–Müller interpolation scheme: ``'previous'``, ``'linear'`` or ``'next'``.
    ofi_levels : int
        Number of per-level OFI columns, 1..10 (``ofi_l01`` .. ``ofi_lNN``).
    """

    tick_size: float = 0.25
    ema_taus_s: tuple[float, float] = (1.0, 60.0)
    ema_interpolation: str = "linear"
    ofi_levels: int = 10


@dataclass(frozen=True)
class FeatureSpec:
    """One output column: its name, unit, formula in words and literature source."""

    name: str
    unit: str
    description: str
    source: str


def _tau_label(tau: float) -> str:
    """Column suffix of a time constant: 1.0 -> '1s', 60 -> '60s', 0.5 -> '0p5s'."""
    return f"{float(tau):g}".replace(".", "p").replace("+", "") + "s"


def _validate(params: FeatureParams) -> None:
    if not (math.isfinite(params.tick_size) and params.tick_size > 0):
        raise ValueError(f"tick_size must be a positive number, got {params.tick_size!r}")
    taus = tuple(params.ema_taus_s)
    if len(taus) != 2:
        raise ValueError(f"ema_taus_s must hold two time constants, got {taus!r}")
    for tau in taus:
        if not (math.isfinite(tau) and tau > 0):
            raise ValueError(f"EMA time constants must be positive seconds, got {taus!r}")
    if _tau_label(taus[0]) == _tau_label(taus[1]):
        raise ValueError(f"the two EMA time constants must differ, got {taus!r}")
    if params.ema_interpolation not in INTERPOLATIONS:
        raise ValueError(f"ema_interpolation must be one of {sorted(INTERPOLATIONS)}, got {params.ema_interpolation!r}")
    if not (1 <= int(params.ofi_levels) <= LEVELS) or int(params.ofi_levels) != params.ofi_levels:
        raise ValueError(f"ofi_levels must be an integer in 1..{LEVELS}, got {params.ofi_levels!r}")


def feature_specs(params: FeatureParams) -> list[FeatureSpec]:
    """The output columns of :func:`compute_features`, in column order.

    Parameters
    ----------
    params : FeatureParams
        Feature parameters (validated; ``ValueError`` if invalid).

    Returns
    -------
    list[FeatureSpec]
        One spec per column: ``mid, spread_ticks, microprice, imbalance_l1, imbalance_l10,
        ofi_l01..ofi_lNN, signed_volume, log_dt, tick_return``, then for each quantity
        ``ema_mid, ema_ret2, ema_spread, trade_rate`` one column per time constant
        (``ema_mid_1s, ema_mid_60s, ...``).
    """
    _validate(params)
    tick = params.tick_size
    interp = params.ema_interpolation
    zm = f"Zumbach & Müller (2001), irregular EMA, '{interp}' interpolation"
    specs = [
        FeatureSpec(
            "mid",
            "index points",
            "(bid_px[0] + ask_px[0]) / 2; NaN if either side is empty",
            "standard",
        ),
        FeatureSpec(
            "spread_ticks",
            "ticks",
            f"(ask_px[0] - bid_px[0]) / tick_size (tick_size = {tick:g}); NaN if a side is empty",
            "standard",
        ),
        FeatureSpec(
            "microprice",
            "index points",
            "weighted mid I*ask_px[0] + (1-I)*bid_px[0], I = Qb/(Qb+Qa) on level 1; "
            "NaN if a side is empty or Qb+Qa = 0",
            "Stoikov (2018), Quantitative Finance 18(12): weighted mid",
        ),
        FeatureSpec(
            "imbalance_l1",
            "dimensionless [-1, 1]",
            "(Qb - Qa)/(Qb + Qa) on level 1; NaN if a side is empty or Qb+Qa = 0",
            "Gould & Bonart (2016), queue imbalance on [-1, 1]",
        ),
        FeatureSpec(
            "imbalance_l10",
            "dimensionless [-1, 1]",
            "(sum Qb - sum Qa)/(sum Qb + sum Qa) over levels 1-10 (empty levels count 0); "
            "NaN if a best level is empty or the sum is 0",
            "Gould & Bonart (2016), depth imbalance on [-1, 1]",
        ),
    ]
    for m in range(1, params.ofi_levels + 1):
        specs.append(
            FeatureSpec(
                f"ofi_l{m:02d}",
                "contracts",
                f"order-flow imbalance of level {m} between consecutive snapshots: "
                "1{Pb>=Pb'}qb - 1{Pb<=Pb'}qb' - 1{Pa<=Pa'}qa + 1{Pa>=Pa'}qa' (primes = previous "
                "row); empty bid = -inf, empty ask = +inf, empty size 0; NaN at row 0",
                "Cont, Kukanov & Stoikov (2014); per level: Xu, Gould & Howison (2019)",
            )
        )
    specs += [
        FeatureSpec(
            "signed_volume",
            "contracts",
            "buy_volume - sell_volume since the previous snapshot (aggressor side)",
            "standard",
        ),
        FeatureSpec(
            "log_dt",
            "log seconds",
            "log(max(ts_recv[i] - ts_recv[i-1], 1 ns) in seconds); NaN at row 0",
            "standard",
        ),
        FeatureSpec(
            "tick_return",
            "ticks",
            "(mid[i] - mid[i-1]) / tick_size; NaN at row 0 or if either mid is NaN",
            "standard",
        ),
    ]
    what = {
        "ema_mid": ("index points", "EMA of mid"),
        "ema_ret2": ("ticks^2", "EMA of tick_return^2 (realised variance per snapshot)"),
        "ema_spread": ("ticks", "EMA of spread_ticks"),
    }
    for q in _EMA_QUANTITIES:
        for tau in params.ema_taus_s:
            name = f"{q}_{_tau_label(tau)}"
            if q == "trade_rate":
                specs.append(
                    FeatureSpec(
                        name,
                        "trades/s",
                        f"lambda <- lambda*exp(-dt/tau) + trade_count/tau, tau = {tau:g} s, lambda = 0 before row 0",
                        "exponentially decayed trade rate (Hawkes-type recursion, Ozaki 1979)",
                    )
                )
            else:
                unit, desc = what[q]
                specs.append(
                    FeatureSpec(
                        name,
                        unit,
                        f"{desc}, tau = {tau:g} s; NaN observations skipped (EMA held), "
                        "NaN before the first finite observation",
                        zm,
                    )
                )
    return specs


# --------------------------------------------------------------------------------------------
# scalar building blocks
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def ofi_step(pb0: float, qb0: float, pa0: float, qa0: float, pb1: float, qb1: float, pa1: float, qa1: float) -> float:
    """Order-flow imbalance of one level between two snapshots (Cont, Kukanov & Stoikov 2014).

    ``e = 1{Pb1>=Pb0} qb1 - 1{Pb1<=Pb0} qb0 - 1{Pa1<=Pa0} qa1 + 1{Pa1>=Pa0} qa0``
    (non-strict inequalities). Index 0 is the previous snapshot, 1 the current one. Prices in
    index points, sizes in contracts; a NaN price is an empty level: bid price ``-inf``, ask
    price ``+inf``, size 0. Returns contracts (float).
    """
    if math.isnan(pb0):
        pb0 = -math.inf
        qb0 = 0.0
    if math.isnan(pb1):
        pb1 = -math.inf
        qb1 = 0.0
    if math.isnan(pa0):
        pa0 = math.inf
        qa0 = 0.0
    if math.isnan(pa1):
        pa1 = math.inf
        qa1 = 0.0
    e = 0.0
    if pb1 >= pb0:
        e += qb1
    if pb1 <= pb0:
        e -= qb0
    if pa1 <= pa0:
        e -= qa1
    if pa1 >= pa0:
        e += qa0
    return e


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
# row-wise features
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def _rowwise(
    bid_px: np.ndarray,
    ask_px: np.ndarray,
    bid_sz: np.ndarray,
    ask_sz: np.ndarray,
    ts: np.ndarray,
    buy: np.ndarray,
    sell: np.ndarray,
    tick: float,
    n_ofi: int,
    out: np.ndarray,
) -> None:
    """Row-wise features into ``out[0 : 8 + n_ofi]`` (layout of :func:`feature_specs`)."""
    n = ts.shape[0]
    n_lv = bid_px.shape[1]
    c_sv = _N_HEAD + n_ofi
    for i in range(n):
        pb = bid_px[i, 0]
        pa = ask_px[i, 0]
        two_sided = not (math.isnan(pb) or math.isnan(pa))
        if two_sided:
            mid = 0.5 * (pb + pa)
            out[0, i] = mid
            out[1, i] = (pa - pb) / tick
            qb = bid_sz[i, 0]
            qa = ask_sz[i, 0]
            out[2, i] = microprice(pb, qb, pa, qa)
            tot = qb + qa
            out[3, i] = (qb - qa) / tot if tot > 0.0 else math.nan
            sb = 0.0
            sa = 0.0
            for m in range(min(n_lv, LEVELS)):
                if not math.isnan(bid_px[i, m]):
                    sb += bid_sz[i, m]
                if not math.isnan(ask_px[i, m]):
                    sa += ask_sz[i, m]
            tot = sb + sa
            out[4, i] = (sb - sa) / tot if tot > 0.0 else math.nan
        else:
            for c in range(_N_HEAD):
                out[c, i] = math.nan
        for m in range(n_ofi):
            if i == 0:
                out[_N_HEAD + m, i] = math.nan
            else:
                out[_N_HEAD + m, i] = ofi_step(
                    bid_px[i - 1, m],
                    bid_sz[i - 1, m],
                    ask_px[i - 1, m],
                    ask_sz[i - 1, m],
                    bid_px[i, m],
                    bid_sz[i, m],
                    ask_px[i, m],
                    ask_sz[i, m],
                )
        out[c_sv, i] = buy[i] - sell[i]
        if i == 0:
            out[c_sv + 1, i] = math.nan
            out[c_sv + 2, i] = math.nan
        else:
            dt = (ts[i] - ts[i - 1]) / 1e9
            out[c_sv + 1, i] = math.log(max(dt, 1e-9))
            pb0 = bid_px[i - 1, 0]
            pa0 = ask_px[i - 1, 0]
            if two_sided and not (math.isnan(pb0) or math.isnan(pa0)):
                out[c_sv + 2, i] = (0.5 * (pb + pa) - 0.5 * (pb0 + pa0)) / tick
            else:
                out[c_sv + 2, i] = math.nan


def _prepare(book: BookArrays, params: FeatureParams) -> dict[str, np.ndarray]:
    """Validate and coerce the input columns the features read (contiguous, fixed dtypes)."""
    _validate(params)
    n = len(book)
    cols: dict[str, np.ndarray] = {"ts_recv": np.ascontiguousarray(book.ts_recv, dtype=np.int64)}
    for k in ("bid_px", "ask_px", "bid_sz", "ask_sz"):
        v = np.ascontiguousarray(getattr(book, k), dtype=np.float64)
        if v.ndim != 2 or v.shape[0] != n or not (params.ofi_levels <= v.shape[1] <= LEVELS):
            raise ValueError(
                f"BookArrays.{k} must have shape (n, L) with n = {n} and "
                f"{params.ofi_levels} <= L <= {LEVELS}, got {v.shape}"
            )
        cols[k] = v
    for k in ("buy_volume", "sell_volume", "trade_count"):
        v = np.ascontiguousarray(getattr(book, k), dtype=np.float64)
        if v.shape != (n,):
            raise ValueError(f"BookArrays.{k} must have shape ({n},), got {v.shape}")
        cols[k] = v
    return cols


def _compute_cpu(book: BookArrays, params: FeatureParams) -> np.ndarray:
    """All features as one float64 array of shape (n_features, n) (rows in spec order)."""
    cols = _prepare(book, params)
    n = cols["ts_recv"].shape[0]
    n_ofi = int(params.ofi_levels)
    n_row = _N_HEAD + n_ofi + 3
    out = np.empty((n_row + 2 * len(_EMA_QUANTITIES), n), dtype=np.float64)
    if n == 0:
        return out
    ts = cols["ts_recv"]
    _rowwise(
        cols["bid_px"],
        cols["ask_px"],
        cols["bid_sz"],
        cols["ask_sz"],
        ts,
        cols["buy_volume"],
        cols["sell_volume"],
        float(params.tick_size),
        n_ofi,
        out,
    )
    ret = out[n_row - 1]
    sources = (out[0], ret * ret, out[1])
    row = n_row
    for z in sources:
        for tau in params.ema_taus_s:
            a, b, started = ema_coefficients(ts, z, tau, params.ema_interpolation)
            _linear_scan(a, b, 0.0, out[row])
            out[row][~started] = np.nan
            row += 1
    for tau in params.ema_taus_s:
        a, b = trade_rate_coefficients(ts, cols["trade_count"], tau)
        _linear_scan(a, b, 0.0, out[row])
        row += 1
    return out


def compute_features(
    book: BookArrays,
    params: FeatureParams = FeatureParams(),  # noqa: B008 (frozen dataclass, immutable)
    device: str = "cpu",
) -> dict[str, np.ndarray]:
    """Compute the feature set on one contiguous segment of book snapshots.

    Parameters
    ----------
    book : BookArrays
        Snapshots of one instrument over one session, in time order (n rows). Reads
        ``ts_recv`` (int64 ns), ``bid_px/ask_px`` (float64 index points, NaN = empty level),
        ``bid_sz/ask_sz`` (float64 contracts), ``buy_volume/sell_volume/trade_count``.
    params : FeatureParams
        Tick size, EMA time constants and interpolation, number of OFI levels.
    device : str
        ``'cpu'`` (numba njit), ``'cuda'`` (:mod:`alphafeat.cuda` kernels) or ``'auto'``
        (``'cuda'`` when :func:`cuda_available`, else ``'cpu'``).

    Returns
    -------
    dict[str, np.ndarray]
        float64 arrays of shape (n,), keys ``[s.name for s in feature_specs(params)]`` in that
        order. Units, formulas and sources: :func:`feature_specs`; conventions (empty levels,
        row 0, NaN handling): module docstring. Each call restarts every recurrence at row 0.
    """
    if device == "auto":
        device = "cuda" if cuda_available() else "cpu"
    names = [s.name for s in feature_specs(params)]
    if device == "cpu":
        out = _compute_cpu(book, params)
        return {name: out[k] for k, name in enumerate(names)}
    if device == "cuda":
        from alphafeat.cuda import compute_features_cuda

        return compute_features_cuda(book, params)
    raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {device!r}")


def cuda_available() -> bool:
    """True when numba can use a CUDA GPU (``numba.cuda.is_available()``); False on any error.

    Under ``NUMBA_ENABLE_CUDASIM=1`` this reports the simulator as available.
    """
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:
        return False
