"""The feature registry: parameters, one :class:`FeatureSpec` per output column, and the
integer plan (column layout, recurrences, post-transforms) that both back ends execute.

Each spec names its formula, unit, literature source, the parameters it uses, the minimum
book depth it needs and its CPU (``@njit``) and CUDA (``@cuda.jit``) implementations. The
CPU implementations are the block-wise kernels of :mod:`alphafeat.features.cpu`; the CUDA
ones compile the per-row source :mod:`alphafeat.features._rows` (tests hold them equal).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from alphafeat.errors import UsageError
from alphafeat.types import LEVELS
from alphafeat.validation import validate_float, validate_int

__all__ = [
    "INTERPOLATIONS",
    "ROW_INPUTS",
    "Decay",
    "Feature",
    "register",
    "registered",
    "unregister",
    "FeatureParams",
    "FeatureSpec",
    "Plan",
    "DEFAULT_FEATURES",
    "FEATURE_GROUPS",
    "feature_specs",
    "frac_diff_weights",
    "select_features",
    "make_plan",
    "prune_plan",
    "R_ALL",
]

#: Interpolation schemes of the Zumbach–Müller EMA and their integer codes in the kernels.
INTERPOLATIONS: dict[str, int] = {"previous": 0, "linear": 1, "next": 2}

# series kinds (recurrences x_i = a_i x_{i-1} + b_i)
K_ZM = 0  #: Zumbach–Müller EMA of a skip-NaN input
K_DEV = 1  #: deviation z - EMA_ZM(z): d_i = mu d_{i-1} + nu (z_i - z_prev)
K_FFILL = 2  #: last finite value (a = 0, b = z on finite rows; a = 1, b = 0 otherwise)
K_DECAY = 3  #: exponentially decayed sum x_i = exp(-dt_i/tau) x_{i-1} + scale * z_i

# input codes of the recurrences (alphafeat.features._rows.z_input)
Z_MID, Z_RET2, Z_SPREAD, Z_LOGSPREAD, Z_LOGMID, Z_COUNT, Z_BUYEV, Z_SELLEV, Z_SV = range(9)
#: Built-in input codes; code ``N_CODES + e`` reads the column ``L[N_LAYOUT + e]`` (a declared
#: :class:`Feature`'s row value).
N_CODES = 9
#: Inputs whose last finite row is tracked (skip-NaN rule): codes 0..N_LF-1.
N_LF = 5

# post-transform codes (alphafeat.features._rows.post_row)
P_MASKED, P_PLAIN, P_HAWKES, P_SQRT, P_ZSCORE, P_TREND, P_LOG1P, P_SLOG = range(8)

# entries of the layout vector L (column indices of row-wise features)
(
    L_OFI,
    L_SV,
    L_LOGDT,
    L_RET,
    L_OFI_INT,
    L_LDB,
    L_LDA,
    L_IMBW,
    L_SLOPE_B,
    L_SLOPE_A,
    L_AGGR,
    L_LTC,
    L_SLOG_OFI1,
    L_SLOG_SV,
    L_NOFI,
    L_NDEP,
    L_SCRATCH,
) = range(17)
N_LAYOUT = 17

#: Groups of row-wise features the CPU row kernel can leave out (:attr:`Plan.row_groups`, a
#: bit mask; the level-1 features, trade flow, time step and return are always computed: the
#: recurrences read them). Every group but these needs the book below level 1.
R_IMB10, R_IMBW, R_SLOPE, R_LOGDEPTH, R_OFI = 1, 2, 4, 8, 16
R_ALL = -1


@dataclass(frozen=True)
class FeatureParams:
    """Parameters of the feature set (every time in seconds, every rate per second).

    Attributes
    ----------
    tick_size : float
        Minimum price increment in index points (ES: 0.25). Divides spreads and returns.
    ema_taus_s : tuple[float, float]
        Time constants of the EMA pairs (``ema_*``, ``trade_rate_*``, ``ema_log_spread_*``,
        ``log_trade_rate_*``), seconds, distinct.
    ema_interpolation : str
        Zumbach–Müller interpolation scheme: ``'previous'``, ``'linear'`` or ``'next'``.
    ofi_levels : int
        Number of per-level OFI columns, 1..10; ``ofi_integrated`` sums these levels.
    depth_levels : int
        Levels of the depth features (log depth, weighted imbalance, slope), 1..10.
    depth_weight_decay : float
        Weighted imbalance weights ``w_m = exp(-decay * (m - 1))``, m = 1..depth_levels.
    vol_taus_s : tuple[float, float, float]
        Fast, medium and slow time constants, seconds, increasing: realised volatility at all
        three, mid z-scores at medium and slow, trend = fast minus slow.
    hawkes_mu, hawkes_alpha, hawkes_beta : float
        Hawkes intensity ``mu + sum alpha exp(-beta (t - t_j))``: baseline (1/s), jump (1/s)
        and decay (1/s). Fixed, not fitted (a fit on the data would look ahead).
    propagator_tau_s : float
        Decay time of the exponential propagator kernel, seconds.
    fracdiff_d : float
        Order of fractional differencing of log mid, 0 < d < 1.
    fracdiff_threshold : float
        Fixed window: keep weights with ``|w_k| >= threshold`` (AFML 5.5).
    """

    tick_size: float = 0.25
    ema_taus_s: tuple[float, float] = (1.0, 60.0)
    ema_interpolation: str = "linear"
    ofi_levels: int = 10
    depth_levels: int = 10
    depth_weight_decay: float = 0.5
    vol_taus_s: tuple[float, float, float] = (10.0, 60.0, 600.0)
    hawkes_mu: float = 0.0
    hawkes_alpha: float = 0.5
    hawkes_beta: float = 1.0
    propagator_tau_s: float = 10.0
    fracdiff_d: float = 0.4
    fracdiff_threshold: float = 1e-4


@dataclass(frozen=True)
class FeatureSpec:
    """One output column.

    ``name``, ``unit``, ``description`` (formula in words), ``source`` (literature);
    ``formula`` (symbolic), ``parameters`` (FeatureParams fields it uses, with values),
    ``min_depth`` (book levels the input must carry for the column to be meaningful: the
    pipeline sets the column to NaN when ``BookArrays.depth < min_depth``), ``cpu`` and
    ``cuda`` (the implementing functions).
    """

    name: str
    unit: str
    description: str
    source: str
    formula: str = ""
    parameters: dict = field(default_factory=dict)
    min_depth: int = 1
    cpu: str = "alphafeat.features.cpu._rowwise_block (njit)"
    cuda: str = "alphafeat.cuda.kernels.rowwise_kernel"
    inputs: tuple[str, ...] = ()  #: book columns and features it reads
    state: str = ""  #: what it carries from row to row ("" for none: a function of rows i, i-1)


#: Per-row inputs a declared :class:`Feature` may read (besides the row-wise features, by name):
#: book levels ``bid_px_MM, ask_px_MM`` (index points, NaN = empty), ``bid_sz_MM, ask_sz_MM``
#: (contracts), MM = 00..09; the interval's ``buy_volume, sell_volume, trade_count``; ``dt_s``
#: (seconds since the previous row, 0 at row 0).
ROW_INPUTS: dict[str, str] = {
    **{f"{k}_{m:02d}": f"{k}[i, {m}]" for k in ("bid_px", "ask_px", "bid_sz", "ask_sz") for m in range(LEVELS)},
    "buy_volume": "buy[i]",
    "sell_volume": "sell[i]",
    "trade_count": "cnt[i]",
    "dt_s": "(max(ts[i] - ts[i - 1], 0) / 1e9 if i > 0 else 0.0)",
}


@dataclass(frozen=True)
class Decay:
    """State of a declared feature: ``x_i = exp(-dt_i / tau_s) x_{i-1} + scale * z_i`` with
    ``x_{-1} = 0``, ``dt_i`` the time step in seconds (0 at row 0), ``z_i`` the feature's row
    value (NaN counts 0). Chunks and streamed blocks carry it exactly (a linear recurrence)."""

    tau_s: float
    scale: float = 1.0


@dataclass(frozen=True, eq=False)
class Feature:
    """A feature declared in one place; :func:`register` adds it to every path.

    ``row(*inputs)`` is the per-row formula: a plain scalar Python function of the values of
    ``inputs`` at row i (names of :data:`ROW_INPUTS`, of row-wise features, or of declared
    features registered before it without state), compiled with ``numba.njit`` for the CPU and
    ``numba.cuda.jit(device=True)`` for the GPU (so: ``math`` functions and arithmetic only).
    ``state``: None (the column is ``row``), or a :class:`Decay` of ``row`` (the column is the
    state). The column follows the built-in ones, in registration order, in the results of
    every back end, in the cache (when selected by name or ``all``) and in ``alphafeat features``.
    """

    name: str
    unit: str
    formula: str
    source: str
    row: Callable[..., float]
    inputs: tuple[str, ...]
    state: Decay | None = None
    description: str = ""
    parameters: tuple[tuple[str, object], ...] = ()
    min_depth: int = 1


#: Declared features (:func:`register`), in registration order.
_DECLARED: list[Feature] = []


def register(feature: Feature) -> Feature:
    """Add ``feature`` to the feature set (after the built-in columns); returns it.

    ``ValueError`` if its name is taken or an input is unknown (checked when the set is built:
    :func:`feature_specs`). Worker processes see it when the module that registers it is
    imported there too.
    """
    if any(f.name == feature.name for f in _DECLARED):
        raise UsageError("feature", "already registered", feature.name)
    _DECLARED.append(feature)
    return feature


def unregister(name: str) -> None:
    """Remove the declared feature ``name`` (``KeyError`` if there is none)."""
    for k, f in enumerate(_DECLARED):
        if f.name == name:
            del _DECLARED[k]
            return
    raise UsageError("name", "no declared feature of that name", name)


@contextmanager
def registered(*features: Feature) -> Iterator[tuple[Feature, ...]]:
    """Register ``features`` for the duration of a ``with`` block."""
    done: list[Feature] = []
    try:
        for f in features:
            done.append(register(f))
        yield features
    finally:
        for f in done:
            unregister(f.name)


def _tau_label(tau: float) -> str:
    """Column suffix of a time constant: 1.0 -> '1s', 60 -> '60s', 0.5 -> '0p5s'."""
    return f"{float(tau):g}".replace(".", "p").replace("+", "") + "s"


def _pos(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _number(value: object, option: str, **bounds: float | bool) -> float:
    """:func:`alphafeat.validation.validate_float` of a parameter; text is refused too (the
    parameters are used as given, and a feature parameter is a number, not a string)."""
    if isinstance(value, str):
        raise UsageError(option, "expected a number", value)
    return validate_float(value, option, **bounds)  # type: ignore[arg-type]


def _taus(value: object, option: str, count: int) -> tuple[float, ...]:
    """``count`` positive time constants (s)."""
    taus = tuple(value)  # type: ignore[call-overload]
    if len(taus) != count:
        raise UsageError(option, f"expected {count} positive time constants (s)", taus)
    return tuple(_number(t, option, lo=0.0, lo_open=True) for t in taus)


def _validate(p: FeatureParams) -> None:
    _number(p.tick_size, "tick_size", lo=0.0, lo_open=True)
    taus = _taus(p.ema_taus_s, "ema_taus_s", 2)
    if _tau_label(taus[0]) == _tau_label(taus[1]):
        raise UsageError("ema_taus_s", "the two EMA time constants must differ", taus)
    if p.ema_interpolation not in INTERPOLATIONS:
        raise UsageError("ema_interpolation", f"expected one of {', '.join(INTERPOLATIONS)}", p.ema_interpolation)
    for k in ("ofi_levels", "depth_levels"):
        validate_int(getattr(p, k), k, lo=1, hi=LEVELS)
    vt = _taus(p.vol_taus_s, "vol_taus_s", 3)
    if not (vt[0] < vt[1] < vt[2]):
        raise UsageError("vol_taus_s", "expected three increasing positive time constants (s)", vt)
    _number(p.depth_weight_decay, "depth_weight_decay", lo=0.0)
    _number(p.hawkes_mu, "hawkes_mu", lo=0.0)
    _number(p.hawkes_alpha, "hawkes_alpha")
    for k in ("hawkes_beta", "propagator_tau_s"):
        _number(getattr(p, k), k, lo=0.0, lo_open=True)
    for k in ("fracdiff_d", "fracdiff_threshold"):
        _number(getattr(p, k), k, lo=0.0, hi=1.0, lo_open=True, hi_open=True)


def frac_diff_weights(d: float, threshold: float | None = None, size: int | None = None) -> np.ndarray:
    """Weights of fractional differencing (López de Prado, AFML 2018, ch. 5).

    ``w_0 = 1``, ``w_k = -w_{k-1} (d - k + 1) / k``. With ``threshold``: the weights with
    ``|w_k| >= threshold`` up to the first that falls below (fixed-width window, AFML 5.5);
    with ``size``: exactly ``size`` weights (expanding window). Returns float64 ``w_0 ..``.
    """
    if (threshold is None) == (size is None):
        raise UsageError("threshold, size", "give exactly one of them")
    w = [1.0]
    k = 1
    while True:
        if size is not None and k >= size:
            break
        nxt = -w[-1] * (d - k + 1) / k
        if threshold is not None and abs(nxt) < threshold:
            break
        w.append(nxt)
        k += 1
        if k > 10_000_000:
            raise UsageError("fracdiff_threshold", "the window is over 10 million rows; raise the threshold")
    return np.asarray(w, dtype=np.float64)


@dataclass
class Plan:
    """Integer plan executed by both back ends (built by :func:`make_plan`)."""

    n_out: int  #: output columns
    layout: np.ndarray  #: int64 (N_LAYOUT,)
    s_kind: np.ndarray  #: int64 (S,) series kind
    s_code: np.ndarray  #: int64 (S,) input code
    s_tau: np.ndarray  #: float64 (S,) time constant, s
    s_scale: np.ndarray  #: float64 (S,) multiplier of the input (K_DECAY)
    p_int: np.ndarray  #: int64 (P, 5) post rows: type, column, s1, s2, s3
    p_tau: np.ndarray  #: float64 (P,) tau of z-score / trend rows
    depth_w: np.ndarray  #: float64 (depth_levels,) weighted-imbalance weights
    fd_w: np.ndarray  #: float64 (W,) fractional-differencing weights
    fd_col: int  #: output column of fracdiff_log_mid
    interp: int
    tick: float
    hawkes_mu: float
    hawkes_alpha: float
    n_codes: int = N_CODES  #: input codes of the recurrences (built-in, then declared rows)
    #: declared features (:func:`register`): ``(row function, column, input expressions)``;
    #: each writes its row value into its column before the recurrences (a stateful one's
    #: recurrence then reads it there and writes its state over it).
    declared: tuple = ()
    #: what the back ends derive from the plan once (compiled row kernels, packed arguments).
    derived: dict = field(default_factory=dict, repr=False, compare=False)
    #: row-wise groups the CPU row kernel computes (``R_*`` bits; :data:`R_ALL`: every one;
    #: :func:`prune_plan` leaves out those no wanted column needs)
    row_groups: int = R_ALL


def _build(p: FeatureParams, declared: tuple[Feature, ...] = ()) -> tuple[list[FeatureSpec], Plan]:
    _validate(p)
    tick = p.tick_size
    t1, t2 = (float(t) for t in p.ema_taus_s)
    tf, tm, ts_ = (float(t) for t in p.vol_taus_s)
    n_ofi, n_dep = int(p.ofi_levels), int(p.depth_levels)
    zm = f"Zumbach & Müller (2001), irregular EMA, '{p.ema_interpolation}' interpolation"
    specs: list[FeatureSpec] = []
    lay = np.zeros(N_LAYOUT, dtype=np.int64)
    scan_cpu = "alphafeat.features.cpu._scan_block (njit, chunked linear scan with exact carries)"
    scan_cuda = (
        "alphafeat.cuda.kernels.scan_compose_kernel + scan_carry_kernel + scan_replay_kernel (MODE_REC) + post_kernel"
    )

    def add(name, unit, desc, source, formula="", params=None, min_depth=1, inputs=(), state="") -> int:
        """One column: its spec (``state``: what it carries, "" for a row-wise feature)."""
        impl = (scan_cpu, scan_cuda) if state else ("alphafeat.features.cpu._rowwise_block (njit)",
                                                    "alphafeat.cuda.kernels.rowwise_kernel")
        specs.append(FeatureSpec(name, unit, desc, source, formula, dict(params or {}), min_depth, *impl,
                                 tuple(inputs), state))  # fmt: skip
        return len(specs) - 1

    top = ("bid_px_00", "ask_px_00")
    top_q = (*top, "bid_sz_00", "ask_sz_00")
    zm_state = "Zumbach–Müller EMA; the last finite observation and its time (skip-NaN rule)"
    decay_state = "exponentially decayed sum (one float64)"

    tk = {"tick_size": tick}
    add("mid", "index points", "(bid_px[0] + ask_px[0]) / 2; NaN if either side is empty", "standard",
        "(Pb1 + Pa1) / 2", inputs=top)
    add("spread_ticks", "ticks", f"(ask_px[0] - bid_px[0]) / tick_size (tick_size = {tick:g}); NaN if a side is empty",
        "standard", "(Pa1 - Pb1) / tick", tk, inputs=top)
    add("microprice", "index points",
        "weighted mid I*ask_px[0] + (1-I)*bid_px[0], I = Qb/(Qb+Qa) on level 1; NaN if a side is empty or Qb+Qa = 0",
        "Stoikov (2018), Quantitative Finance 18(12): weighted mid", "I Pa1 + (1 - I) Pb1, I = Qb1/(Qb1 + Qa1)",
        inputs=top_q)
    add("imbalance_l1", "dimensionless [-1, 1]", "(Qb - Qa)/(Qb + Qa) on level 1; NaN if a side is empty or Qb+Qa = 0",
        "Gould & Bonart (2016), queue imbalance on [-1, 1]", "(Qb1 - Qa1)/(Qb1 + Qa1)",
        inputs=top_q)
    add("imbalance_l10", "dimensionless [-1, 1]",
        "(sum Qb - sum Qa)/(sum Qb + sum Qa) over levels 1-10 (empty levels count 0); "
        "NaN if a best level is empty or the sum is 0",
        "Gould & Bonart (2016), depth imbalance on [-1, 1]", "sum_m (Qbm - Qam) / sum_m (Qbm + Qam)",
        min_depth=LEVELS, inputs=(*top, "bid_sz_00..09", "ask_sz_00..09"))
    lay[L_OFI] = len(specs)
    for m in range(1, n_ofi + 1):
        add(f"ofi_l{m:02d}", "contracts",
            f"order-flow imbalance of level {m} between consecutive snapshots: "
            "1{Pb>=Pb'}qb - 1{Pb<=Pb'}qb' - 1{Pa<=Pa'}qa + 1{Pa>=Pa'}qa' (primes = previous "
            "row); empty bid = -inf, empty ask = +inf, empty size 0; NaN at row 0",
            "Cont, Kukanov & Stoikov (2014); per level: Xu, Gould & Howison (2019)",
            "e_m = 1{Pb>=Pb'}qb - 1{Pb<=Pb'}qb' - 1{Pa<=Pa'}qa + 1{Pa>=Pa'}qa'", min_depth=m,
            inputs=tuple(f"{k}_{m - 1:02d}" for k in ("bid_px", "bid_sz", "ask_px", "ask_sz")))
    lay[L_SV] = add("signed_volume", "contracts",
                    "buy_volume - sell_volume since the previous snapshot (aggressor side)", "standard",
                    "V_buy - V_sell", inputs=("buy_volume", "sell_volume"))
    lay[L_LOGDT] = add("log_dt", "log seconds", "log(max(ts_recv[i] - ts_recv[i-1], 1 ns) in seconds); NaN at row 0",
                       "standard", "log(max(dt, 1e-9))", inputs=("ts_recv",))
    lay[L_RET] = add("tick_return", "ticks", "(mid[i] - mid[i-1]) / tick_size; NaN at row 0 or if either mid is NaN",
                     "standard", "(mid_i - mid_{i-1}) / tick", tk, inputs=("mid",))

    # ---- recurrences: series table ------------------------------------------------------
    series: list[tuple[int, int, float, float]] = []

    def ser(kind: int, code: int, tau: float, scale: float = 1.0) -> int:
        series.append((kind, code, tau, scale))
        return len(series) - 1

    post: list[tuple[int, int, int, int, int, float]] = []
    ema_p = {"ema_taus_s": (t1, t2), "ema_interpolation": p.ema_interpolation}
    skip = "NaN observations skipped (EMA held), NaN before the first finite observation"
    for q, code, unit, desc, src in (
        ("ema_mid", Z_MID, "index points", "EMA of mid", "mid"),
        ("ema_ret2", Z_RET2, "ticks^2", "EMA of tick_return^2 (realised variance per snapshot)", "tick_return"),
        ("ema_spread", Z_SPREAD, "ticks", "EMA of spread_ticks", "spread_ticks"),
    ):
        for tau in (t1, t2):
            c = add(f"{q}_{_tau_label(tau)}", unit, f"{desc}, tau = {tau:g} s; {skip}", zm,
                    "EMA_n = mu EMA_{n-1} + (nu - mu) z_{n-1} + (1 - nu) z_n, mu = exp(-dt/tau)", ema_p,
                    inputs=(src,), state=zm_state)
            post.append((P_MASKED, c, ser(K_ZM, code, tau), 0, 0, 0.0))
    rate_series = []
    for tau in (t1, t2):
        c = add(f"trade_rate_{_tau_label(tau)}", "trades/s",
                f"lambda <- lambda*exp(-dt/tau) + trade_count/tau, tau = {tau:g} s, lambda = 0 before row 0",
                "exponentially decayed trade rate (Hawkes-type recursion, Ozaki 1979)",
                "lambda_i = exp(-dt_i/tau) lambda_{i-1} + n_i/tau", {"ema_taus_s": (t1, t2)},
                inputs=("trade_count",), state=decay_state)
        s = ser(K_DECAY, Z_COUNT, tau, 1.0 / tau)
        rate_series.append(s)
        post.append((P_PLAIN, c, s, 0, 0, 0.0))

    # ---- new row-wise features ---------------------------------------------------------------
    lay[L_OFI_INT] = add(
        "ofi_integrated", "dimensionless",
        f"sum of ofi_l01..ofi_l{n_ofi:02d} divided by the average level depth "
        "(mean of bid and ask sizes over those levels on this and the previous row); equal "
        "level weights (a PCA fit would look ahead); NaN at row 0 or on zero depth",
        "Cont, Cucuringu & Zhang (2023), integrated OFI; depth normalisation as in Cont et al. (2014)",
        "sum_m e_m / ((1/(4M)) sum_m (qb_m + qa_m + qb'_m + qa'_m))", {"ofi_levels": n_ofi}, min_depth=n_ofi,
        inputs=(f"ofi_l01..ofi_l{n_ofi:02d}", f"bid_sz_00..{n_ofi - 1:02d}", f"ask_sz_00..{n_ofi - 1:02d}"))
    lay[L_LDB] = len(specs)
    for side, sname in (("bid", "bid"), ("ask", "ask")):
        if side == "ask":
            lay[L_LDA] = len(specs)
        for m in range(1, n_dep + 1):
            add(f"log_depth_{sname}_l{m:02d}", "log(1 + contracts)",
                f"log(1 + {side}_sz[{m - 1}]); an empty level counts 0 contracts", "standard (log depth)",
                "log1p(q_m)", min_depth=m, inputs=(f"{side}_px_{m - 1:02d}", f"{side}_sz_{m - 1:02d}"))
    lay[L_IMBW] = add(
        "imbalance_weighted", "dimensionless [-1, 1]",
        f"sum_m w_m (Qb_m - Qa_m) / sum_m w_m (Qb_m + Qa_m), w_m = exp(-{p.depth_weight_decay:g} (m-1)), "
        f"m = 1..{n_dep}; NaN if a best level is empty or the sum is 0",
        "depth-weighted order-book imbalance (Cao, Hansch & Wang 2009; Cartea, Donnelly & Jaimungal 2018)",
        "sum w(Qb - Qa) / sum w(Qb + Qa)", {"depth_levels": n_dep, "depth_weight_decay": p.depth_weight_decay},
        min_depth=n_dep, inputs=(*top, f"bid_sz_00..{n_dep - 1:02d}", f"ask_sz_00..{n_dep - 1:02d}"))
    for side, key in (("bid", L_SLOPE_B), ("ask", L_SLOPE_A)):
        lay[key] = add(
            f"book_slope_{side}", "contracts/tick",
            f"total {side} size over the non-empty levels 1..{n_dep} divided by (1 + distance in ticks from the "
            "best to the deepest non-empty level); NaN if the best level is empty",
            "book slope (Næs & Skjeltorp 2006), depth per tick", "sum_m q_m / (1 + |P_1 - P_last| / tick)",
            {"depth_levels": n_dep, **tk}, min_depth=2,
            inputs=(f"{side}_px_00..{n_dep - 1:02d}", f"{side}_sz_00..{n_dep - 1:02d}"))
    lay[L_AGGR] = add("aggressor_imbalance", "dimensionless [-1, 1]",
                      "(buy_volume - sell_volume) / (buy_volume + sell_volume) in the interval; 0 without trades",
                      "standard (trade-sign imbalance)", "(Vb - Vs)/(Vb + Vs)",
                      inputs=("buy_volume", "sell_volume"))
    lay[L_LTC] = add("log1p_trade_count", "log(1 + trades)", "log(1 + trade_count) in the interval",
                     "standard", "log1p(n)", inputs=("trade_count",))

    # ---- new recurrences ---------------------------------------------------------------------
    hp = {"hawkes_mu": p.hawkes_mu, "hawkes_alpha": p.hawkes_alpha, "hawkes_beta": p.hawkes_beta}
    for side, code in (("buy", Z_BUYEV), ("sell", Z_SELLEV)):
        c = add(f"hawkes_{side}", "events/s",
                f"Hawkes intensity of {side} market orders just after the row, mu + alpha * S, "
                "S_i = exp(-beta dt_i) S_{i-1} + n_i; an event = an interval with "
                f"{side}_volume > 0 (one aggressive order per book update)",
                "Hawkes (1971); exponential-kernel recursion Ozaki (1979)",
                "lambda(t_i+) = mu + alpha sum_{t_j <= t_i} exp(-beta (t_i - t_j))", hp,
                inputs=(f"{side}_volume",), state=decay_state)
        post.append((P_HAWKES, c, ser(K_DECAY, code, 1.0 / p.hawkes_beta, 1.0), 0, 0, 0.0))
    s_prop = ser(K_DECAY, Z_SV, float(p.propagator_tau_s), 1.0)
    c_prop = add("propagator_flow", "contracts",
                 f"exponential-kernel propagator of signed volume, P_i = exp(-dt/tau) P_(i-1) + signed_volume_i, "
                 f"tau = {p.propagator_tau_s:g} s",
                 "Bouchaud, Gefen, Potters & Wyart (2004) propagator; exponential kernel (Obizhaeva & Wang 2013)",
                 "sum_j exp(-(t_i - t_j)/tau) eps_j v_j", {"propagator_tau_s": p.propagator_tau_s},
                 inputs=("signed_volume",), state=decay_state)
    post.append((P_PLAIN, c_prop, s_prop, 0, 0, 0.0))
    vp = {"vol_taus_s": (tf, tm, ts_), "tick_size": tick}
    s_rv = {}
    for tau in (tf, tm, ts_):
        s_rv[tau] = ser(K_DECAY, Z_RET2, tau, 1.0 / tau)
        c = add(f"realized_vol_{_tau_label(tau)}", "ticks/sqrt(s)",
                f"sqrt(v), v_i = exp(-dt/tau) v_(i-1) + tick_return_i^2 / tau, tau = {tau:g} s (NaN return -> 0)",
                "realised volatility (Andersen & Bollerslev 1998), exponentially weighted in time",
                "sqrt(sum_j exp(-(t_i - t_j)/tau) r_j^2 / tau)", vp, inputs=("tick_return",), state=decay_state)
        post.append((P_SQRT, c, s_rv[tau], 0, 0, 0.0))
    s_dev = {tau: ser(K_DEV, Z_MID, tau) for tau in (tf, tm, ts_)}
    for tau in (tm, ts_):
        c = add(f"mid_z_{_tau_label(tau)}", "dimensionless",
                f"(mid - EMA_tau(mid)) / tick / sqrt(v_tau * tau), tau = {tau:g} s: deviation from the irregular "
                "EMA over the realised volatility of that horizon; NaN before the first mid or on zero volatility",
                zm + "; z-score as in Avellaneda & Lee (2010)", "(mid - EMA_tau) / (tick sqrt(v_tau tau))",
                {**vp, **ema_p}, inputs=("mid", "tick_return"), state=f"{zm_state}; {decay_state} of r^2")
        post.append((P_ZSCORE, c, s_dev[tau], s_rv[tau], 0, tau))
    c = add("trend", "dimensionless",
            f"(EMA_fast(mid) - EMA_slow(mid)) / tick / sqrt(v_slow * tau_slow), fast {tf:g} s, slow {ts_:g} s",
            "moving-average crossover over volatility (Moskowitz, Ooi & Pedersen 2012; Baz et al. 2015)",
            "(EMA_f - EMA_s) / (tick sqrt(v_s tau_s))", {**vp, **ema_p}, inputs=("mid", "tick_return"),
            state=f"two {zm_state}; {decay_state} of r^2")
    post.append((P_TREND, c, s_dev[ts_], s_dev[tf], s_rv[ts_], ts_))
    for tau in (t1, t2):
        c = add(f"ema_log_spread_{_tau_label(tau)}", "log ticks",
                f"EMA of log(spread_ticks) (spread <= 0 skipped), tau = {tau:g} s; {skip}", zm,
                "EMA_ZM(log spread)", ema_p, inputs=("spread_ticks",), state=zm_state)
        post.append((P_MASKED, c, ser(K_ZM, Z_LOGSPREAD, tau), 0, 0, 0.0))
    for tau, s in zip((t1, t2), rate_series):
        c = add(f"log_trade_rate_{_tau_label(tau)}", "log(1 + trades/s)",
                f"log(1 + trade_rate_{_tau_label(tau)})", "signed-log transform of the trade-rate EMA",
                "log1p(lambda)", {"ema_taus_s": (t1, t2)}, inputs=("trade_count",), state=decay_state)
        post.append((P_LOG1P, c, s, 0, 0, 0.0))
    fd_w = frac_diff_weights(float(p.fracdiff_d), threshold=float(p.fracdiff_threshold))
    fd_col = add("fracdiff_log_mid", "log points",
                 f"sum_k w_k y_(i-k), k < {fd_w.size}, y = log mid forward-filled, w_k = -w_(k-1)(d-k+1)/k, "
                 f"d = {p.fracdiff_d:g}, weights down to |w| >= {p.fracdiff_threshold:g} (fixed window); "
                 "NaN for the first window-1 rows and while the window reaches before the first mid",
                 "López de Prado (2018), AFML ch. 5, fixed-width window fractional differentiation",
                 "sum_{k<W} w_k log(mid)_{i-k}", {"fracdiff_d": p.fracdiff_d, "fracdiff_threshold":
                                                  p.fracdiff_threshold, "window": int(fd_w.size)},
                 inputs=("mid",), state=f"the {fd_w.size - 1} forward-filled log mids before the row")
    specs[fd_col] = dataclasses.replace(specs[fd_col],
                                        cpu="alphafeat.features.cpu._scan_block (njit, block-wise window sums)",
                                        cuda="alphafeat.cuda.kernels.fracdiff_kernel")
    slog_src = "signed log sign(x) log(1 + |x|)"
    lay[L_SLOG_OFI1] = add("slog_ofi_l01", "log contracts", "sign(ofi_l01) log(1 + |ofi_l01|)", slog_src,
                           "sign(x) log1p(|x|)", inputs=("ofi_l01",))
    lay[L_SLOG_SV] = add("slog_signed_volume", "log contracts", "sign(signed_volume) log(1 + |signed_volume|)",
                         slog_src, "sign(x) log1p(|x|)", inputs=("signed_volume",))
    c = add("slog_propagator_flow", "log contracts", "sign(propagator_flow) log(1 + |propagator_flow|)",
            slog_src, "sign(x) log1p(|x|)", inputs=("signed_volume",), state=decay_state)
    post.append((P_SLOG, c, s_prop, 0, 0, 0.0))
    ext, ext_z = _declared_columns(declared, specs, add, post, ser)
    n_out = len(specs)
    s_ff = ser(K_FFILL, Z_LOGMID, 1.0)
    post.append((P_MASKED, n_out, s_ff, 0, 0, 0.0))  # scratch row: forward-filled log mid
    lay[L_NOFI] = n_ofi
    lay[L_NDEP] = n_dep
    lay[L_SCRATCH] = n_out
    plan = Plan(
        n_out=n_out,
        layout=np.concatenate([lay, np.asarray(ext_z, dtype=np.int64)]),
        s_kind=np.array([s[0] for s in series], dtype=np.int64),
        s_code=np.array([s[1] for s in series], dtype=np.int64),
        s_tau=np.array([s[2] for s in series], dtype=np.float64),
        s_scale=np.array([s[3] for s in series], dtype=np.float64),
        p_int=np.array([r[:5] for r in post], dtype=np.int64),
        p_tau=np.array([r[5] for r in post], dtype=np.float64),
        depth_w=np.exp(-float(p.depth_weight_decay) * np.arange(n_dep, dtype=np.float64)),
        fd_w=fd_w,
        fd_col=fd_col,
        interp=INTERPOLATIONS[p.ema_interpolation],
        tick=float(tick),
        hawkes_mu=float(p.hawkes_mu),
        hawkes_alpha=float(p.hawkes_alpha),
        n_codes=N_CODES + len(ext_z),
        declared=ext,
    )
    return specs, plan


def _declared_columns(declared, specs, add, post, ser) -> tuple[tuple, list[int]]:
    """The columns of the declared features (:func:`register`), after the built-in ones: for
    each, ``(row function, column, source expressions of its inputs)``; and the columns whose
    row value feeds a recurrence (input code ``N_CODES + e`` reads ``ext_z[e]``)."""
    rowwise = {sp.name: k for k, sp in enumerate(specs) if not sp.state}  # computed before the declared rows
    taken = {sp.name for sp in specs}
    ext, ext_z = [], []
    for f in declared:
        if f.name in taken:
            raise UsageError(f"feature {f.name}", "the name is taken")
        args = []
        for name in f.inputs:
            if name in ROW_INPUTS:
                args.append(ROW_INPUTS[name])
            elif name in rowwise:
                args.append(f"out[{rowwise[name]}, i]")
            else:
                raise UsageError(f"feature {f.name}", "unknown input (allowed: a row input such as bid_px_00, "
                                 "trade_count or dt_s, or a feature without state such as mid)", name)  # fmt: skip
        st = f.state
        if st is not None and not (_pos(st.tau_s) and math.isfinite(st.scale)):
            raise UsageError(f"feature {f.name}", "Decay needs tau_s > 0 and a finite scale", st)
        state = "" if st is None else f"exponentially decayed sum (tau = {st.tau_s:g} s, scale {st.scale:g})"
        c = add(f.name, f.unit, f.description or f.formula, f.source, f.formula, dict(f.parameters), f.min_depth,
                inputs=tuple(f.inputs), state=state)  # fmt: skip
        fn = f"{getattr(f.row, '__module__', '?')}.{getattr(f.row, '__qualname__', '?')}"
        specs[c] = dataclasses.replace(specs[c], cpu=f"{fn} (numba.njit in alphafeat.features._declared.row_kernel)"
                                       + (" + " + specs[c].cpu if st else ""),
                                       cuda=f"{fn} (cuda.jit device function in alphafeat.features._declared."
                                       "row_kernel)" + (" + " + specs[c].cuda if st else ""))  # fmt: skip
        ext.append((f.row, c, tuple(args)))
        taken.add(f.name)
        if st is None:
            rowwise[f.name] = c
        else:
            post.append((P_PLAIN, c, ser(K_DECAY, N_CODES + len(ext_z), float(st.tau_s), float(st.scale)), 0, 0, 0.0))
            ext_z.append(c)
    return tuple(ext), ext_z


_CACHE: dict[tuple, tuple[list[FeatureSpec], Plan]] = {}


def _built(p: FeatureParams) -> tuple[list[FeatureSpec], Plan]:
    declared = tuple(_DECLARED)
    key = (p, declared)
    try:
        hit = _CACHE.get(key)
    except TypeError:  # unhashable field values (lists): build without caching
        return _build(p, declared)
    if hit is None:
        if len(_CACHE) >= 32:
            _CACHE.clear()
        hit = _CACHE[key] = _build(p, declared)
    return hit


def feature_specs(params: FeatureParams) -> list[FeatureSpec]:
    """The output columns of :func:`alphafeat.features.compute_features`, in column order.

    ``ValueError`` if ``params`` is invalid. The first 26 columns (default parameters) are
    the first feature set (``mid`` .. ``trade_rate_60s``) in their original order; the rest
    follow (see each spec's formula, unit, source and ``min_depth``).
    """
    return list(_built(params)[0])


def make_plan(params: FeatureParams) -> Plan:
    """The integer plan of ``params`` (validated) that the CPU and CUDA back ends execute."""
    return _built(params)[1]


def prune_plan(plan: Plan, columns: Iterable[int]) -> Plan:
    """``plan`` computing only what output ``columns`` need of its recurrences, post transforms
    and fractional difference; the row-wise stage (and declared rows) runs whole, as the
    recurrences read its mid, spread, return and signed volume.

    Each kept recurrence and post transform is the same operation on the same inputs as in
    ``plan``, so the ``columns`` are equal bit for bit (``tests/test_features_prune.py``); every
    other column not written by the row-wise stage is left undefined. A rerun that adds
    features to a cache computes only the added ones this way
    (:func:`alphafeat.precompute.relabel.relabel_table`).

    Parameters
    ----------
    plan : Plan
        From :func:`make_plan`.
    columns : iterable of int
        Output columns wanted (indices into :func:`feature_specs`).

    Returns
    -------
    Plan
        The same ``n_out`` and layout (the columns keep their places); fewer series and post
        rows; one zero fractional-difference weight when ``fracdiff_log_mid`` is not wanted.
    """
    want = {int(c) for c in columns}
    fd = plan.fd_col in want
    rows = [r for r in range(plan.p_int.shape[0])
            if int(plan.p_int[r, 1]) in want or (fd and int(plan.p_int[r, 1]) >= plan.n_out)]  # fmt: skip
    reads = {P_ZSCORE: 1, P_TREND: 2}  # the series a post row reads besides its first
    used = sorted({int(plan.p_int[r, 2 + k]) for r in rows for k in range(1 + reads.get(int(plan.p_int[r, 0]), 0))})
    index = np.zeros(max(plan.s_kind.shape[0], 1), dtype=np.int64)
    index[used] = np.arange(len(used))
    p_int = plan.p_int[rows].copy()
    for r, typ in enumerate(p_int[:, 0]):
        for k in range(1 + reads.get(int(typ), 0)):
            p_int[r, 2 + k] = index[p_int[r, 2 + k]]
    return dataclasses.replace(
        plan, s_kind=plan.s_kind[used], s_code=plan.s_code[used], s_tau=plan.s_tau[used],
        s_scale=plan.s_scale[used], p_int=p_int.reshape(len(rows), 5), p_tau=plan.p_tau[rows],
        fd_w=plan.fd_w if fd else np.zeros(1), derived={}, row_groups=_row_groups(plan, want),
    )  # fmt: skip


def _row_groups(plan: Plan, want: set[int]) -> int:
    """The ``R_*`` groups of row-wise features among the columns ``want`` (every group when
    the plan has declared features: their row functions may read any row-wise column)."""
    if plan.declared:
        return R_ALL
    L = plan.layout
    n_ofi, n_dep = int(L[L_NOFI]), int(L[L_NDEP])
    cols = {R_IMB10: {4}, R_IMBW: {int(L[L_IMBW])}, R_SLOPE: {int(L[L_SLOPE_B]), int(L[L_SLOPE_A])},
            R_LOGDEPTH: {int(L[k]) + m for k in (L_LDB, L_LDA) for m in range(n_dep)},
            R_OFI: {int(L[L_OFI]) + m for m in range(n_ofi)} | {int(L[L_OFI_INT]), int(L[L_SLOG_OFI1])}}  # fmt: skip
    return sum(bit for bit, cs in cols.items() if cs & want)


#: The features stored by default (``--features default``): price, spread, microprice,
#: imbalances, OFI at the first three levels and integrated, trade flow, time step, return,
#: volatility, trade rates, Hawkes and propagator flow, z-score, trend, book slopes and the
#: fractionally differenced log mid. With the top of book, trade flow, timestamps and the
#: default labels this is about 250 bytes a row at float32 (``bench/precompute.py``).
DEFAULT_FEATURES: tuple[str, ...] = (
    "mid", "spread_ticks", "microprice", "imbalance_l1", "imbalance_l10", "imbalance_weighted",
    "ofi_l01", "ofi_l02", "ofi_l03", "ofi_integrated", "signed_volume", "aggressor_imbalance",
    "log_dt", "tick_return", "ema_ret2_60s", "trade_rate_1s", "trade_rate_60s", "hawkes_buy",
    "hawkes_sell", "propagator_flow", "realized_vol_60s", "mid_z_600s", "trend", "fracdiff_log_mid",
    "book_slope_bid", "book_slope_ask",
)  # fmt: skip

#: Named groups for ``--features`` (entries ending in ``_`` are name prefixes, the others whole
#: names), besides ``default``, ``all`` and ``book``.
#: ``book`` is not a feature: it stores every book level (price, size, orders) instead of the
#: top of book.
FEATURE_GROUPS: dict[str, tuple[str, ...]] = {
    "ofi": ("ofi_", "ofi_integrated", "slog_ofi_"),
    "depth": ("log_depth_", "imbalance_", "book_slope_"),
    "ema": ("ema_",),
    "flow": ("signed_volume", "aggressor_imbalance", "trade_rate_", "log_trade_rate_", "log1p_trade_count",
             "hawkes_", "propagator_flow", "slog_signed_volume", "slog_propagator_flow"),
    "vol": ("realized_vol_", "mid_z_", "trend", "ema_ret2_"),
    "price": ("mid", "spread_ticks", "microprice", "tick_return", "log_dt", "fracdiff_log_mid"),
}


def select_features(text: str, params: FeatureParams) -> tuple[list[str], bool]:
    """Parse ``--features``: comma-separated feature names and groups.

    Parameters
    ----------
    text : str
        E.g. ``"default"``, ``"all"``, ``"default,book"``, ``"mid,ofi,vol"``. Groups:
        ``default`` (:data:`DEFAULT_FEATURES`), ``all`` (every feature and every book level),
        ``book`` (every book level instead of the top of book), and :data:`FEATURE_GROUPS`.
    params : FeatureParams
        The feature parameters (they decide the names, e.g. ``ema_mid_60s``).

    Returns
    -------
    (list of str, bool)
        Feature names in registry order, and whether every book level is stored.

    Raises
    ------
    ValueError
        An unknown name or group (the message lists what is allowed).
    """
    names = [s.name for s in feature_specs(params)]
    want: set[str] = set()
    book = False
    toks = [t.strip() for t in text.split(",")]
    if not any(toks):
        raise UsageError("", "no feature or group given (e.g. default, all, default,book, mid,ofi)")
    if not all(toks):
        raise UsageError("", "an empty name between commas", text)
    for tok in toks:
        if tok == "all":
            want.update(names)
            book = True
        elif tok == "default":
            want.update(n for n in DEFAULT_FEATURES if n in names)
        elif tok == "book":
            book = True
        elif tok in FEATURE_GROUPS:  # entries ending in "_" are prefixes, the others whole names
            pats = FEATURE_GROUPS[tok]
            want.update(n for n in names for g in pats if (n.startswith(g) if g.endswith("_") else n == g))
        elif tok in names:
            want.add(tok)
        else:
            groups = ", ".join(["default", "all", "book", *FEATURE_GROUPS])
            raise UsageError("", f"unknown feature or group {tok!r}; groups: {groups}; names: `alphafeat features`")
    return [n for n in names if n in want], book
