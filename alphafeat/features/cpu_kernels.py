"""CPU back end, the numba kernels: the argument tuples they take (:class:`Inputs`, :class:`Kernel`,
:class:`Carry`, :class:`Scratch`), the log tables, the row-wise features of a block
(:func:`_rowwise_block`), the recurrences, post transforms and fractional differencing of a block
(:func:`_scan_block`) and a chunk of rows in each mode (:func:`_run_chunk`). The layout of the
work, and the driver: :mod:`alphafeat.features.cpu`.

The kernels stay in one file: numba's cache checks only the source file of the function it
compiles, so a kernel calling another file's kernel would run stale machine code after an edit of
that file alone."""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np

from alphafeat.features._vmath import vexp, vexp_expm1, vlog, vlog1p
from alphafeat.features.registry import (
    K_DECAY,
    K_FFILL,
    K_ZM,
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
    N_CODES,
    N_LAYOUT,
    N_LF,
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


# --------------------------------------------------------------------------------------------
# recurrences, post transforms and fractional differencing of one block
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _scan_block(mode, inp, kp, cy, scr, out, b0, b1, g0):
    """Recurrences over rows ``[b0, b1)``.

    ``mode`` 1: compose into ``A, B``; 2: replay from ``X`` (updated in place), post
    transforms into ``out`` and fractional differencing (``Y``: forward-filled log mid,
    ``Y[W - 1 + t]`` = row ``b0 + t``, the ``W - 1`` rows before already in place). ``cy``
    (:class:`Carry`, updated): states ``X``; skip-NaN carries per input code: ``cj`` last
    finite row, ``cz`` its value, ``ct`` its time. ``inp``, ``kp``, ``scr``: :class:`Inputs`,
    :class:`Kernel`, :class:`Scratch`.
    ``g0``: segment row of array row 0 (the fractional difference is NaN for segment rows < W - 1).

    Stages, each a loop over the block that LLVM vectorises unless noted: inputs ``Z``; decay
    factors ``E``, ``NU`` per distinct time constant of the common step; per skip-NaN input
    (sequential) the previous finite value ``ZP``, whether there is one (``HAS``) and the rows
    after a gap (``GAP``, their previous finite time ``GAPT``); coefficients ``CA``, ``CB`` of
    every recurrence (gap rows patched with their own decay); one scan running all
    recurrences side by side (independent dependency chains overlap); post transforms.
    """
    nan = math.nan
    ts, buy, sell, cnt = inp.ts, inp.buy, inp.sell, inp.cnt
    L, n_out, lutlog, interp, tick = kp.L, kp.n_out, kp.lutlog, kp.interp, kp.tick
    h_mu, h_alpha, fd_col = kp.h_mu, kp.h_alpha, kp.fd_col
    s_kind, s_code, s_tau, s_scale, s_tix = kp.s_kind, kp.s_code, kp.s_tau, kp.s_scale, kp.s_tix
    taus, tau_nu = kp.taus, kp.tau_nu
    p_int, p_tau, fd_w = kp.p_int, kp.p_tau, kp.fd_w
    X, cj, cz, ct = cy.x, cy.cj, cy.cz, cy.ct
    A, B, Z, ST, E, NU, XS, Y, ACC = scr.A, scr.B, scr.Z, scr.ST, scr.E, scr.NU, scr.XS, scr.Y, scr.ACC
    DT, HAS, ZP, GAP, GAPT, NG, CA, CB = scr.DT, scr.HAS, scr.ZP, scr.GAP, scr.GAPT, scr.NG, scr.CA, scr.CB
    nb = b1 - b0
    S = s_kind.shape[0]
    # ---- inputs ----------------------------------------------------------------------------
    c_ret = L[L_RET]
    c_sv = L[L_SV]
    top = float(lutlog.shape[0] - 1)
    nbad = 0
    for t in range(nb):  # log of the spread (ticks: small integers) from the table
        s = out[1, b0 + t]
        ok = (s >= 1.0) & (s <= top)
        k = np.int32(s if ok else 1.0)
        good = ok & (k == s)
        nbad += not good
        Z[3, t] = lutlog[k]
    if nbad:
        for t in range(nb):
            s = out[1, b0 + t]
            Z[3, t] = vlog(s) if s > 0.0 else nan
    for t in range(nb):
        m = out[0, b0 + t]
        Z[4, t] = vlog(m) if m > 0.0 else nan
    for t in range(nb):
        i = b0 + t
        r = out[c_ret, i]
        Z[0, t] = out[0, i]
        Z[1, t] = r * r
        Z[2, t] = out[1, i]
        Z[5, t] = cnt[i]
        Z[6, t] = 1.0 if buy[i] > 0.0 else 0.0
        Z[7, t] = 1.0 if sell[i] > 0.0 else 0.0
        Z[8, t] = out[c_sv, i]
    for e in range(kp.n_codes - N_CODES):  # declared inputs: a column of out (registry.Feature)
        ce = L[N_LAYOUT + e]
        for t in range(nb):
            Z[N_CODES + e, t] = out[ce, b0 + t]
    for t in range(nb):
        i = b0 + t
        ip = i - 1 if i > 0 else 0
        DT[t] = max(ts[i] - ts[ip], 0) / 1e9
    # ---- decay factors of the common step t_i - t_{i-1}, per distinct time constant -------
    for k in range(taus.shape[0]):
        tau = taus[k]
        Ek = E[k]
        if tau_nu[k]:
            NUk = NU[k]
            for t in range(nb):
                x = DT[t] / tau
                e, em = vexp_expm1(-x)
                Ek[t] = e
                NUk[t] = -em / x if x > 0.0 else 1.0
        else:
            for t in range(nb):
                Ek[t] = vexp(-(DT[t] / tau))
    # ---- skip-NaN inputs: previous finite value, started flags, rows after a gap -----------
    for c in range(N_LF):
        j = cj[c]
        zp = cz[c]
        tj = ct[c]
        ng = 0
        for t in range(nb):
            i = b0 + t
            HAS[c, t] = j >= 0
            ZP[c, t] = zp
            z = Z[c, t]
            if _isfinite(z):
                if j >= 0 and j != i - 1:
                    GAP[c, ng] = t
                    GAPT[c, ng] = tj
                    ng += 1
                j = i
                zp = z
                tj = ts[i]
            ST[c, t] = j >= 0
        NG[c] = ng
        cj[c] = j
        cz[c] = zp
        ct[c] = tj
    # ---- coefficients of every recurrence ----------------------------------------------------
    for s in range(S):
        kind = s_kind[s]
        code = s_code[s]
        k = s_tix[s]
        zc = Z[code]
        ca = CA[s]
        cb = CB[s]
        if kind == K_DECAY:
            scale = s_scale[s]
            Ek = E[k]
            for t in range(nb):
                z = zc[t]
                ca[t] = Ek[t]
                cb[t] = scale * z if _isfinite(z) else 0.0
        elif kind == K_FFILL:
            for t in range(nb):
                z = zc[t]
                f = _isfinite(z)
                ca[t] = 0.0 if f else 1.0
                cb[t] = z if f else 0.0
        else:  # Zumbach–Müller level (K_ZM) or deviation (K_DEV)
            Ek = E[k]
            NUk = NU[k]
            hc = HAS[code]
            zpc = ZP[code]
            zm = kind == K_ZM
            for t in range(nb):
                z = zc[t]
                zp = zpc[t]
                mu = Ek[t]
                nu = 1.0 if interp == 0 else (NUk[t] if interp == 1 else mu)
                f = _isfinite(z)
                h = hc[t]
                if zm:
                    b = ((nu - mu) * zp + (1.0 - nu) * z) if h else z
                else:
                    b = (nu * (z - zp)) if h else 0.0
                a = mu if h else 0.0
                ca[t] = a if f else 1.0
                cb[t] = b if f else 0.0
            # rows whose previous finite observation is not the previous row: own decay
            tau = s_tau[s]
            for g in range(NG[code]):
                t = GAP[code, g]
                i = b0 + t
                x = (max(ts[i] - GAPT[code, g], 0) / 1e9) / tau
                e, em = vexp_expm1(-x)
                mu = e
                if interp == 0:
                    nu = 1.0
                elif interp == 1:
                    nu = -em / x if x > 0.0 else 1.0
                else:
                    nu = mu
                z = zc[t]
                zp = zpc[t]
                ca[t] = mu
                cb[t] = ((nu - mu) * zp + (1.0 - nu) * z) if zm else nu * (z - zp)
    # ---- all recurrences, four at a time (independent dependency chains overlap) ----------------
    g = 0
    while g + 4 <= S:
        a0 = CA[g]
        a1 = CA[g + 1]
        a2 = CA[g + 2]
        a3 = CA[g + 3]
        q0 = CB[g]
        q1 = CB[g + 1]
        q2 = CB[g + 2]
        q3 = CB[g + 3]
        if mode != _MODE_REPLAY:
            A0, A1, A2, A3 = A[g], A[g + 1], A[g + 2], A[g + 3]
            B0, B1, B2, B3 = B[g], B[g + 1], B[g + 2], B[g + 3]
            for t in range(nb):
                A0 = a0[t] * A0
                B0 = a0[t] * B0 + q0[t]
                A1 = a1[t] * A1
                B1 = a1[t] * B1 + q1[t]
                A2 = a2[t] * A2
                B2 = a2[t] * B2 + q2[t]
                A3 = a3[t] * A3
                B3 = a3[t] * B3 + q3[t]
            A[g], A[g + 1], A[g + 2], A[g + 3] = A0, A1, A2, A3
            B[g], B[g + 1], B[g + 2], B[g + 3] = B0, B1, B2, B3
        else:
            x0, x1, x2, x3 = X[g], X[g + 1], X[g + 2], X[g + 3]
            o0 = XS[g]
            o1 = XS[g + 1]
            o2 = XS[g + 2]
            o3 = XS[g + 3]
            for t in range(nb):
                x0 = a0[t] * x0 + q0[t]
                o0[t] = x0
                x1 = a1[t] * x1 + q1[t]
                o1[t] = x1
                x2 = a2[t] * x2 + q2[t]
                o2[t] = x2
                x3 = a3[t] * x3 + q3[t]
                o3[t] = x3
            X[g], X[g + 1], X[g + 2], X[g + 3] = x0, x1, x2, x3
        g += 4
    for s in range(g, S):
        a0 = CA[s]
        q0 = CB[s]
        if mode != _MODE_REPLAY:
            A0 = A[s]
            B0 = B[s]
            for t in range(nb):
                A0 = a0[t] * A0
                B0 = a0[t] * B0 + q0[t]
            A[s] = A0
            B[s] = B0
        else:
            x0 = X[s]
            o0 = XS[s]
            for t in range(nb):
                x0 = a0[t] * x0 + q0[t]
                o0[t] = x0
            X[s] = x0
    if mode != _MODE_REPLAY:
        return
    # ---- post transforms ---------------------------------------------------------------------
    W = fd_w.shape[0]
    for r in range(p_int.shape[0]):
        typ = p_int[r, 0]
        col = p_int[r, 1]
        s1 = p_int[r, 2]
        s2 = p_int[r, 3]
        s3 = p_int[r, 4]
        always = s_kind[s1] == K_DECAY
        c1 = s_code[s1] if not always else 0
        x1 = XS[s1]
        stc = ST[c1]
        if col >= n_out:  # scratch: forward-filled log mid, into Y
            for t in range(nb):
                Y[W - 1 + t] = x1[t] if (always | stc[t]) else nan
            continue
        o = out[col, b0:b1]
        if typ == 0:
            for t in range(nb):
                o[t] = x1[t] if (always | stc[t]) else nan
        elif typ == 1:
            for t in range(nb):
                o[t] = x1[t]
        elif typ == 2:
            for t in range(nb):
                o[t] = h_mu + h_alpha * x1[t]
        elif typ == 3:
            for t in range(nb):
                o[t] = math.sqrt(x1[t])
        elif typ == 4:
            pt = p_tau[r]
            x2 = XS[s2]
            for t in range(nb):  # no branches (sqrt of var <= 0 is discarded)
                var = x2[t] * pt
                v = x1[t] / tick / math.sqrt(var)
                o[t] = v if ((always | stc[t]) & (var > 0.0)) else nan
        elif typ == 5:
            pt = p_tau[r]
            x2 = XS[s2]
            x3 = XS[s3]
            for t in range(nb):
                var = x3[t] * pt
                v = (x1[t] - x2[t]) / tick / math.sqrt(var)
                o[t] = v if ((always | stc[t]) & (var > 0.0)) else nan
        elif typ == 6:
            for t in range(nb):
                o[t] = vlog1p(x1[t])
        else:
            for t in range(nb):
                o[t] = _signed_log1p(x1[t])
    # ---- fractional differencing: sum_k w_k Y[W - 1 + t - k], k = 0, 1, ... per row ----------
    # eight (then four, then one) weights per pass (fewer loads and stores of the sums; same order of the terms)
    acc = ACC[:nb]
    acc[:] = 0.0
    kk = 0
    while kk + 8 <= W:
        w0 = fd_w[kk]
        w1 = fd_w[kk + 1]
        w2 = fd_w[kk + 2]
        w3 = fd_w[kk + 3]
        w4 = fd_w[kk + 4]
        w5 = fd_w[kk + 5]
        w6 = fd_w[kk + 6]
        w7 = fd_w[kk + 7]
        y0 = Y[W - 1 - kk : W - 1 - kk + nb]
        y1 = Y[W - 2 - kk : W - 2 - kk + nb]
        y2 = Y[W - 3 - kk : W - 3 - kk + nb]
        y3 = Y[W - 4 - kk : W - 4 - kk + nb]
        y4 = Y[W - 5 - kk : W - 5 - kk + nb]
        y5 = Y[W - 6 - kk : W - 6 - kk + nb]
        y6 = Y[W - 7 - kk : W - 7 - kk + nb]
        y7 = Y[W - 8 - kk : W - 8 - kk + nb]
        for t in range(nb):
            a = (((acc[t] + w0 * y0[t]) + w1 * y1[t]) + w2 * y2[t]) + w3 * y3[t]
            acc[t] = (((a + w4 * y4[t]) + w5 * y5[t]) + w6 * y6[t]) + w7 * y7[t]
        kk += 8
    while kk < W:
        wk = fd_w[kk]
        y = Y[W - 1 - kk : W - 1 - kk + nb]
        for t in range(nb):
            acc[t] += wk * y[t]
        kk += 1
    o = out[fd_col, b0:b1]
    for t in range(nb):
        o[t] = ACC[t] if g0 + b0 + t >= W - 1 else nan
    # slide the window: keep the last W - 1 values in front
    for q in range(W - 1):
        Y[q] = Y[nb + q]


@numba.njit(cache=True, nogil=True)
def _fd_prefix(out, lo, W, Y):
    """``Y[0 : W - 1]`` = forward-filled log mid of rows ``[lo - W + 1, lo)`` (NaN before the
    first positive finite mid and for rows < 0), from the mids in ``out[0]``."""
    r0 = lo - (W - 1)
    first = max(r0, 0)
    val = math.nan
    # the last valid mid at or before ``first - 1``
    for j in range(first - 1, -1, -1):
        m = out[0, j]
        if m > 0.0 and m < math.inf:
            val = vlog(m)
            break
    for r in range(r0, lo):
        if r >= 0:
            m = out[0, r]
            if m > 0.0 and m < math.inf:
                val = vlog(m)
            Y[r - r0] = val
        else:
            Y[r - r0] = math.nan


@numba.njit(cache=True, nogil=True)
def _scratch(n_lv, S, T, W, n_codes):
    """The :class:`Scratch` arrays of one chunk (blocks of :data:`BLOCK` rows)."""
    Bk = BLOCK
    return Scratch(
        np.empty((n_lv, Bk + 1)), np.empty((n_lv, Bk + 1)), np.empty((n_lv, Bk + 1)), np.empty((n_lv, Bk + 1)),
        np.empty(Bk + 1, dtype=np.bool_), np.empty(Bk + 1), np.empty(Bk + 1),
        np.empty((n_codes, Bk)), np.empty((N_LF, Bk), dtype=np.bool_), np.empty((T, Bk)), np.ones((T, Bk)),
        np.empty((S, Bk)), np.empty(W - 1 + Bk), np.empty(Bk), np.empty(Bk),
        np.empty((N_LF, Bk), dtype=np.bool_), np.empty((N_LF, Bk)), np.empty((N_LF, Bk), dtype=np.int64),
        np.empty((N_LF, Bk), dtype=np.int64), np.zeros(N_LF, dtype=np.int64), np.empty((S, Bk)), np.empty((S, Bk)),
        np.ones(S), np.zeros(S),
    )  # fmt: skip


@numba.njit(cache=True, nogil=True)
def _run_chunk(mode, inp, kp, out, lo, hi, g0, io, lastf, ab):
    """One chunk ``[lo, hi)`` of :class:`Inputs` ``inp`` with the :class:`Kernel` ``kp``: mode 0
    row-wise (+ ``lastf``, the chunk's last finite row per skip-NaN input), 1 compose (``ab``:
    the chunk's maps), 2 replay + post + fractional differencing, 3 all of it from the segment
    start, 4 all of it continuing a stream (:class:`FeatureStream`), 5 as 4 without the
    row-wise features (already in ``out``). ``io`` (:class:`Carry`): the states ``x`` and last
    finite rows ``cj`` the chunk starts from; in modes 4 and 5 every carry comes in and goes
    back out through it (``cz``, ``ct``: value and time of the last finite rows, ``y``: the
    forward-filled log mids of the ``W - 1`` rows before). ``g0``: segment row of array row 0."""
    S = kp.s_kind.shape[0]
    W = kp.fd_w.shape[0]
    scr = _scratch(inp.bid_px.shape[1], S, kp.taus.shape[0], W, kp.n_codes)
    cont = mode == _MODE_CONTINUE or mode == _MODE_CONTINUE_SCAN
    cy = Carry(
        io.x.copy(), io.cj.copy(), io.cz.copy() if cont else np.zeros(N_LF),
        io.ct.copy() if cont else np.zeros(N_LF, dtype=np.int64), io.y,
    )  # fmt: skip
    Y = scr.Y
    smode = _MODE_COMPOSE if mode == _MODE_COMPOSE else _MODE_REPLAY
    if cont:
        for q in range(W - 1):
            Y[q] = io.y[q]
    elif mode != _MODE_ROWWISE:
        for c in range(N_LF):
            j = cy.cj[c]
            if j >= 0:
                cy.cz[c] = _z_at(c, j, out, kp.L, inp.buy, inp.sell, inp.cnt)
                cy.ct[c] = inp.ts[j]
        if mode != _MODE_COMPOSE:
            _fd_prefix(out, lo, W, Y)
    rows = mode == _MODE_ROWWISE or mode == _MODE_FUSED or mode == _MODE_CONTINUE
    for b0 in range(lo, hi, BLOCK):
        b1 = min(b0 + BLOCK, hi)
        if rows:
            _rowwise_block(inp, kp, scr, out, b0, b1)
        if mode != _MODE_ROWWISE:
            _scan_block(smode, inp, kp, cy, scr, out, b0, b1, g0)
    if mode == _MODE_ROWWISE:
        for c in range(N_LF):
            lastf[c] = -1
            for i in range(hi - 1, lo - 1, -1):
                if _isfinite(_z_at(c, i, out, kp.L, inp.buy, inp.sell, inp.cnt)):
                    lastf[c] = i
                    break
    if mode == _MODE_COMPOSE:
        ab[0, :] = scr.A
        ab[1, :] = scr.B
    if cont:
        io.x[:] = cy.x
        io.cj[:] = cy.cj
        io.cz[:] = cy.cz
        io.ct[:] = cy.ct
        for q in range(W - 1):
            io.y[q] = Y[q]


#: The public names of what the driver (:mod:`alphafeat.features.cpu`) uses (its body keeps the
#: names it had when the back end was one file).
MODE_COMPOSE = _MODE_COMPOSE
MODE_CONTINUE = _MODE_CONTINUE
MODE_CONTINUE_SCAN = _MODE_CONTINUE_SCAN
MODE_FUSED = _MODE_FUSED
MODE_REPLAY = _MODE_REPLAY
MODE_ROWWISE = _MODE_ROWWISE
make_lut = _make_lut
run_chunk = _run_chunk
