"""CPU back end, row-wise part: the layout tuples the kernels take (:class:`Inputs`, :class:`Kernel`,
:class:`Carry`, :class:`Scratch`), the log tables and the numba kernels of the row-wise features of a
block (:func:`_rowwise_block`). The layout of the work: :mod:`alphafeat.features.cpu`."""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np

from alphafeat.features._vmath import vlog, vlog1p
from alphafeat.features.registry import (
    L_AGGR,
    L_IMBW,
    L_LDA,
    L_LDB,
    L_LOGDT,
    L_LTC,
    L_NDEP,
    L_NOFI,
    L_OFI,
    L_OFI_INT,
    L_RET,
    L_SLOG_OFI1,
    L_SLOG_SV,
    L_SLOPE_A,
    L_SLOPE_B,
    L_SV,
    R_IMB10,
    R_IMBW,
    R_LOGDEPTH,
    R_OFI,
    R_SLOPE,
)

#: Rows per block of the CPU kernels.
BLOCK = 512


#: Size of the log tables (integer arguments 0 .. LUT_N - 1).
LUT_N = 4096


_MODE_ROWWISE, _MODE_COMPOSE, _MODE_REPLAY, _MODE_FUSED, _MODE_CONTINUE, _MODE_CONTINUE_SCAN = 0, 1, 2, 3, 4, 5


# --------------------------------------------------------------------------------------------
# the kernels' arguments: four records derived from the registry's plan
# --------------------------------------------------------------------------------------------


class Inputs(NamedTuple):
    """The book columns the features read (contiguous; see :func:`alphafeat.features._prepare`)."""

    bid_px: np.ndarray  #: float64 (n, L) index points, NaN = empty level
    ask_px: np.ndarray
    bid_sz: np.ndarray  #: float64 (n, L) contracts
    ask_sz: np.ndarray
    ts: np.ndarray  #: int64 (n,) ts_recv, ns
    buy: np.ndarray  #: float64 (n,) buy_volume
    sell: np.ndarray  #: float64 (n,) sell_volume
    cnt: np.ndarray  #: float64 (n,) trade_count


class Kernel(NamedTuple):
    """The plan of the registry as the CPU kernels read it (:func:`kernel_of`): read-only."""

    L: np.ndarray  #: int64 layout vector (registry.L_*, then the columns of the declared inputs)
    depth_w: np.ndarray  #: float64 (depth_levels,) weighted-imbalance weights
    s_kind: np.ndarray  #: int64 (S,) series kind (registry.K_*)
    s_code: np.ndarray  #: int64 (S,) input code (registry.Z_*, then declared inputs)
    s_tau: np.ndarray  #: float64 (S,) time constant, s
    s_scale: np.ndarray  #: float64 (S,)
    s_tix: np.ndarray  #: int64 (S,) index of the series' time constant in ``taus``
    taus: np.ndarray  #: float64 (T,) distinct time constants
    tau_nu: np.ndarray  #: bool (T,) the 'linear' weight is needed for that time constant
    p_int: np.ndarray  #: int64 (P, 5) post rows
    p_tau: np.ndarray  #: float64 (P,)
    fd_w: np.ndarray  #: float64 (W,) fractional-differencing weights
    lut1p: np.ndarray  #: float64 (LUT_N,) vlog1p(k)
    lutlog: np.ndarray  #: float64 (LUT_N,) vlog(k)
    tick: float
    h_mu: float
    h_alpha: float
    interp: int
    n_out: int
    fd_col: int
    n_codes: int  #: rows of the recurrence inputs Z (N_CODES + declared inputs)
    rows: int  #: row-wise groups computed (registry.R_* bits, -1: all)


class Carry(NamedTuple):
    """What one chunk hands to the next (a stream's state between pushes)."""

    x: np.ndarray  #: float64 (S,) recurrence states
    cj: np.ndarray  #: int64 (N_LF,) last finite row per skip-NaN input (-1: none)
    cz: np.ndarray  #: float64 (N_LF,) its value
    ct: np.ndarray  #: int64 (N_LF,) its time, ns
    y: np.ndarray  #: float64 (max(W - 1, 1),) forward-filled log mids of the window before


class Scratch(NamedTuple):
    """Block-local work arrays of one chunk (:func:`_scratch`); see :func:`_rowwise_block`
    and :func:`_scan_block` for their meaning."""

    PB: np.ndarray
    PA: np.ndarray
    QB: np.ndarray
    QA: np.ndarray
    TWO: np.ndarray
    S1: np.ndarray
    S2: np.ndarray
    Z: np.ndarray
    ST: np.ndarray
    E: np.ndarray
    NU: np.ndarray
    XS: np.ndarray
    Y: np.ndarray
    ACC: np.ndarray
    DT: np.ndarray
    HAS: np.ndarray
    ZP: np.ndarray
    GAP: np.ndarray
    GAPT: np.ndarray
    NG: np.ndarray
    CA: np.ndarray
    CB: np.ndarray
    A: np.ndarray
    B: np.ndarray


# --------------------------------------------------------------------------------------------
# scalar helpers
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def _make_lut(n):
    """Row 0: ``vlog1p(k)``; row 1: ``vlog(k)`` (NaN at k = 0, never read): the values the
    vectorised functions give for those arguments, so a look-up equals a computation."""
    lut = np.empty((2, n))
    for k in range(n):
        lut[0, k] = vlog1p(float(k))
        lut[1, k] = vlog(float(k)) if k > 0 else math.nan
    return lut


@numba.njit(cache=True, inline="always")
def _signed_log1p(x):
    """Signed log ``sign(x) log(1 + |x|)`` of any float64 (NaN stays NaN), branch-free."""
    y = vlog1p(abs(x))
    return -y if x < 0.0 else y


@numba.njit(cache=True, inline="always")
def _log1p_col(q, o, lut):
    """``o[t] = vlog1p(q[t])`` for every t: a vectorised check that every value is a table
    index, then plain table look-ups (LLVM keeps that loop scalar: no gathers on AVX2), or a
    vectorised :func:`vlog1p` loop for the whole run when some value is not (same values)."""
    top = float(lut.shape[0] - 1)
    nbad = 0
    for t in range(q.shape[0]):
        x = q[t]
        nbad += not ((x >= 0.0) & (x <= top) & (math.floor(x) == x))
    if nbad:
        for t in range(q.shape[0]):
            o[t] = vlog1p(q[t])
    else:
        for t in range(q.shape[0]):
            o[t] = lut[np.int32(q[t])]


@numba.njit(cache=True, inline="always")
def _slog_col(x, o, lut):
    """``o[t] = _signed_log1p(x[t])`` for every t (as :func:`_log1p_col`)."""
    top = float(lut.shape[0] - 1)
    nbad = 0
    for t in range(x.shape[0]):
        a = abs(x[t])
        nbad += not ((a <= top) & (math.floor(a) == a))
    if nbad:
        for t in range(x.shape[0]):
            o[t] = _signed_log1p(x[t])
    else:
        for t in range(x.shape[0]):
            v = x[t]
            r = lut[np.int32(abs(v))]
            o[t] = -r if v < 0.0 else r


@numba.njit(cache=True, inline="always")
def _isfinite(x):
    return x - x == 0.0


@numba.njit(cache=True)
def _z_at(code, i, out, L, buy, sell, cnt):
    """Observation of recurrence input ``code`` at row ``i`` (registry.Z_*), from the row-wise
    columns already in ``out`` (the same operations as the inputs stage of :func:`_scan_block`)."""
    if code == 0:
        return out[0, i]
    if code == 1:
        r = out[L[L_RET], i]
        return r * r
    if code == 2:
        return out[1, i]
    if code == 3:
        s = out[1, i]
        return vlog(s) if s > 0.0 else math.nan
    if code == 4:
        m = out[0, i]
        return vlog(m) if m > 0.0 else math.nan
    if code == 5:
        return cnt[i]
    if code == 6:
        return 1.0 if buy[i] > 0.0 else 0.0
    if code == 7:
        return 1.0 if sell[i] > 0.0 else 0.0
    return out[L[L_SV], i]


# --------------------------------------------------------------------------------------------
# row-wise features of one block
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True, inline="always")
def _imbalance_l10(QB, QA, TWO, S1, S2, out, n_lv, start, t0, t1):
    """imbalance_l10 (column 4) of the rows ``t0..t1`` of :func:`_rowwise_block`'s arrays."""
    for t in range(t0, t1):
        S1[t] = 0.0
        S2[t] = 0.0
    for m in range(min(n_lv, 10)):
        for t in range(t0, t1):
            S1[t] += QB[m, t]
            S2[t] += QA[m, t]
    for t in range(t0, t1):
        i = start + t
        tot = S1[t] + S2[t]
        out[4, i] = (S1[t] - S2[t]) / tot if (TWO[t] and tot > 0.0) else math.nan


@numba.njit(cache=True, inline="always")
def _imbalance_weighted(QB, QA, TWO, S1, S2, out, n_dep, depth_w, c, start, t0, t1):
    """The depth-weighted imbalance into column ``c``."""
    for t in range(t0, t1):
        S1[t] = 0.0
        S2[t] = 0.0
    for m in range(n_dep):
        wm = depth_w[m]
        for t in range(t0, t1):
            qbm = QB[m, t]
            qam = QA[m, t]
            S1[t] += wm * (qbm - qam)
            S2[t] += wm * (qbm + qam)
    for t in range(t0, t1):
        den = S2[t]
        out[c, start + t] = S1[t] / den if (TWO[t] and den > 0.0) else math.nan


@numba.njit(cache=True, inline="always")
def _book_slopes(PB, PA, QB, QA, S1, S2, out, n_dep, tick, c_bid, c_ask, start, t0, t1):
    """The book slope per side (levels in the outer loop: the rows vectorise)."""
    inf = math.inf
    for side in range(2):
        P = PB if side == 0 else PA
        Q = QB if side == 0 else QA
        lim = -inf if side == 0 else inf
        c = c_bid if side == 0 else c_ask
        for t in range(t0, t1):
            S1[t] = 0.0
            S2[t] = P[0, t]
        for m in range(n_dep):
            for t in range(t0, t1):
                pm = P[m, t]
                S1[t] += Q[m, t]  # 0 on an empty level
                S2[t] = pm if pm != lim else S2[t]
        for t in range(t0, t1):
            p1 = P[0, t]
            v = S1[t] / (1.0 + abs(p1 - S2[t]) / tick)
            out[c, start + t] = v if p1 != lim else math.nan


@numba.njit(cache=True, inline="always")
def _ofi(PB, PA, QB, QA, S1, S2, out, n_ofi, c_ofi, c_int, b0, start, t0, t1):
    """OFI per level and integrated (NaN at segment row 0)."""
    nan = math.nan
    tt0 = t0
    if b0 == 0:
        for m in range(n_ofi):
            out[c_ofi + m, 0] = nan
        out[c_int, 0] = nan
        tt0 = t0 + 1
    for t in range(tt0, t1):
        S1[t] = 0.0
        S2[t] = 0.0
    for m in range(n_ofi):
        cm = c_ofi + m
        for t in range(tt0, t1):
            pb0 = PB[m, t - 1]
            qb0 = QB[m, t - 1]
            pa0 = PA[m, t - 1]
            qa0 = QA[m, t - 1]
            pb1 = PB[m, t]
            qb1 = QB[m, t]
            pa1 = PA[m, t]
            qa1 = QA[m, t]
            e = 0.0
            e = e + qb1 if pb1 >= pb0 else e
            e = e - qb0 if pb1 <= pb0 else e
            e = e - qa1 if pa1 <= pa0 else e
            e = e + qa0 if pa1 >= pa0 else e
            out[cm, start + t] = e
            S1[t] += e
            S2[t] = (S2[t] + (qb1 + qa1)) + (qb0 + qa0)
    four_m = 4.0 * n_ofi
    for t in range(tt0, t1):
        dep = S2[t] / four_m
        out[c_int, start + t] = S1[t] / dep if dep > 0.0 else nan


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _rowwise_block(inp, k, scr, out, b0, b1):
    """Every row-wise feature of rows ``[b0, b1)`` into ``out[:, b0:b1]`` (``inp``: :class:`Inputs`,
    ``k``: :class:`Kernel`, ``scr``: :class:`Scratch`).

    Local arrays (index ``t = i - b0 + 1``; ``t = 0`` is row ``b0 - 1``): ``PB, PA`` prices
    with empty levels at ``-inf`` / ``+inf``, ``QB, QA`` sizes with empty levels at 0,
    ``TWO`` both best levels present; ``S1, S2`` scratch.
    """
    bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, cnt = inp
    tick, L, depth_w, lut1p = k.tick, k.L, k.depth_w, k.lut1p
    PB, PA, QB, QA, TWO, S1, S2 = scr.PB, scr.PA, scr.QB, scr.QA, scr.TWO, scr.S1, scr.S2
    nan = math.nan
    inf = math.inf
    g = k.rows
    deep = (g & (R_IMB10 | R_IMBW | R_SLOPE | R_LOGDEPTH | R_OFI)) != 0
    n_lv = bid_px.shape[1] if deep else 1  # the levels read: level 1 only when no deep group is wanted
    n_ofi = L[L_NOFI]
    n_dep = L[L_NDEP]
    start = b0 - 1 if b0 > 0 else b0
    t0 = b0 - start  # first t of the block's own rows (1, or 0 at row 0)
    nb = b1 - b0
    t1 = t0 + nb
    for i in range(start, b1):
        t = i - start
        for m in range(n_lv):  # sizes loaded unconditionally: no branches
            p = bid_px[i, m]
            q = bid_sz[i, m]
            e = p != p
            PB[m, t] = -inf if e else p
            QB[m, t] = 0.0 if e else q
        for m in range(n_lv):
            p = ask_px[i, m]
            q = ask_sz[i, m]
            e = p != p
            PA[m, t] = inf if e else p
            QA[m, t] = 0.0 if e else q
    for t in range(t1):
        TWO[t] = PB[0, t] != -inf and PA[0, t] != inf
    # ---- level-1 features --------------------------------------------------------------
    for t in range(t0, t1):
        i = start + t
        if TWO[t]:
            out[0, i] = 0.5 * (PB[0, t] + PA[0, t])
        else:
            out[0, i] = nan
    for t in range(t0, t1):
        i = start + t
        if TWO[t]:
            out[1, i] = (PA[0, t] - PB[0, t]) / tick
        else:
            out[1, i] = nan
    for t in range(t0, t1):
        i = start + t
        v2 = nan
        v3 = nan
        if TWO[t]:
            qb = QB[0, t]
            qa = QA[0, t]
            tot = qb + qa
            if tot > 0.0:
                w = qb / tot
                v2 = w * PA[0, t] + (1.0 - w) * PB[0, t]
                v3 = (qb - qa) / tot
        out[2, i] = v2
        out[3, i] = v3
    if g & R_IMB10:
        _imbalance_l10(QB, QA, TWO, S1, S2, out, n_lv, start, t0, t1)
    if g & R_IMBW:
        _imbalance_weighted(QB, QA, TWO, S1, S2, out, n_dep, depth_w, L[L_IMBW], start, t0, t1)
    if g & R_SLOPE:
        _book_slopes(PB, PA, QB, QA, S1, S2, out, n_dep, tick, L[L_SLOPE_B], L[L_SLOPE_A], start, t0, t1)
    if g & R_LOGDEPTH:
        for m in range(n_dep):
            _log1p_col(QB[m, t0:t1], out[L[L_LDB] + m, b0:b1], lut1p)
            _log1p_col(QA[m, t0:t1], out[L[L_LDA] + m, b0:b1], lut1p)
    tt0 = t0 + 1 if b0 == 0 else t0  # rows with a previous row
    if g & R_OFI:
        _ofi(PB, PA, QB, QA, S1, S2, out, n_ofi, L[L_OFI], L[L_OFI_INT], b0, start, t0, t1)
        _slog_col(out[L[L_OFI], b0:b1], out[L[L_SLOG_OFI1], b0:b1], lut1p)
    # ---- trade flow ----------------------------------------------------------------------
    c_sv = L[L_SV]
    c_ssv = L[L_SLOG_SV]
    c_ag = L[L_AGGR]
    c_tc = L[L_LTC]
    for i in range(b0, b1):
        sv = buy[i] - sell[i]
        out[c_sv, i] = sv
        vol = buy[i] + sell[i]
        out[c_ag, i] = sv / vol if vol > 0.0 else 0.0
    _slog_col(out[c_sv, b0:b1], out[c_ssv, b0:b1], lut1p)
    _log1p_col(cnt[b0:b1], out[c_tc, b0:b1], lut1p)
    # ---- time step and tick return -------------------------------------------------------
    c_dt = L[L_LOGDT]
    c_r = L[L_RET]
    for t in range(tt0, t1):  # rows i >= 1 (row 0: NaN, below)
        i = start + t
        dt = (ts[i] - ts[i - 1]) / 1e9
        out[c_dt, i] = vlog(max(dt, 1e-9))
    for t in range(tt0, t1):
        i = start + t
        r = (0.5 * (PB[0, t] + PA[0, t]) - 0.5 * (PB[0, t - 1] + PA[0, t - 1])) / tick
        out[c_r, i] = r if (TWO[t] and TWO[t - 1]) else nan
    if b0 == 0:
        out[c_dt, 0] = nan
        out[c_r, 0] = nan


#: The public names of what the other parts of the CPU back end use (their bodies keep the
#: names they had when the back end was one file).
MODE_COMPOSE = _MODE_COMPOSE
MODE_CONTINUE = _MODE_CONTINUE
MODE_CONTINUE_SCAN = _MODE_CONTINUE_SCAN
MODE_FUSED = _MODE_FUSED
MODE_REPLAY = _MODE_REPLAY
MODE_ROWWISE = _MODE_ROWWISE
isfinite = _isfinite
make_lut = _make_lut
rowwise_block = _rowwise_block
signed_log1p = _signed_log1p
z_at = _z_at
