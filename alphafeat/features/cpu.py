"""CPU back end: numba ``njit`` kernels over blocks of rows, sequential or split into exact chunks.

Layout of the work
------------------
Rows are processed in blocks of :data:`BLOCK` rows. Within a block every feature is a loop
over a contiguous run of one output column (``out[c, b0:b1]``), the recurrences are loops
over contiguous coefficient rows, and the per-level book columns are read once into small
block-local arrays (empty levels masked once). Nothing is materialised at full size except
the output matrix itself.

Loops over a block avoid branches that depend on the data (``error_model="numpy"``: no
zero-division checks) so that LLVM can vectorise them:

* no libm call is left in the kernels. ``exp``, ``expm1``, ``log`` and ``log1p`` are our own
  branch-free float64 functions (:mod:`alphafeat.features._vmath`, inlined): Cody–Waite
  range reduction and polynomials (Taylor degree 13 for ``expm1`` of the reduced argument;
  fdlibm's minimax ``log`` kernel and ``log1p`` correction term; Muller, *Elementary
  Functions*, ch. 11), bits through int64 bit-casts, fused multiply-adds (``llvm.fma``),
  selects for the special values. Accuracy: under 1 ulp from the exact value, at most 1 ulp
  from libm on the whole float64 range (tests/test_fastmath.py); NaN, +-inf, +-0,
  subnormals and the overflow / underflow edges as libm. The CUDA path keeps libdevice,
  so CUDA and CPU differ by at most an ulp or two in these functions (well inside the
  1e-9 relative of the CUDA tests).
* ``exp(-dt/tau)`` and the 'linear' weight ``-expm1(-x)/x`` (``x = dt/tau``) of the common
  step ``dt = t_i - t_{i-1}``: one straight vectorised loop per distinct time constant fills
  both from one range reduction (:func:`vexp_expm1`; :func:`vexp` gives the same ``exp``);
  a Zumbach–Müller row whose last finite observation is older than the previous row (after
  a NaN run) gets its own factor in a patch-up pass (the same functions, scalar);
* ``log`` of the mid, of the spread and of the time step, and the post transforms
  ``log1p`` / signed ``log1p``, are vectorised loops over the block;
* ``log1p`` of integer-valued sizes, counts and flows, and ``log`` of the spread in ticks,
  come from tables filled with the same ``vlog1p`` / ``vlog``: a branch-free loop checks a
  block's column, which is then looked up (a scalar loop, cheaper still), or computed with
  the vectorised function when some value is not a table index (same values either way).
  Every CPU path (sequential, chunked modes, the skip-NaN carries of :func:`_z_at`, the
  window prefix of :func:`_fd_prefix`) gives the same value for the same argument;
* the coefficients ``(a_i, b_i)`` of every recurrence are built per block in vectorised
  loops, then one scan runs four recurrences side by side (their dependency chains overlap);
* fractional differencing accumulates ``w_k y_{i-k}`` for a block of rows, eight weights per
  pass (the sum of each row still runs k = 0, 1, ... as in the formula).

Sequential (one chunk): one pass, block by block (row-wise features, recurrences, post
transforms, fractional differencing). Chunked (k chunks, threads sharing the arrays; the
kernels release the GIL):

A. row-wise features of each chunk; per skip-NaN input, the chunk's last row with a finite
   value. Parent: for each chunk, the last finite row *before* it (``jprev``) -- the carry of
   the skip-NaN rule (the previous finite observation and its time are read at that row).
B. each recurrence ``x_i = a_i x_{i-1} + b_i`` composed over the chunk into ``(A, B)``.
   Parent: exact carries ``X_c = A_{c-1} X_{c-1} + B_{c-1}``, ``X_0 = 0``.
C. replay of the recurrences from ``X_c``, post-transforms (EMA masks, sqrt, z-scores,
   trend, logs) and fractional differencing; each chunk rebuilds the forward-filled log mid
   of the ``W - 1`` rows before it (the window overlap) from the mids of phase A.

With one chunk this is the sequential computation; with k chunks the only difference is the
association of the carries in B, so results agree to rounding (tests: 1e-12 relative).
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

import numba
import numpy as np

from alphafeat.arena import reserve
from alphafeat.cores import usable_cores
from alphafeat.errors import UsageError
from alphafeat.features._declared import row_kernel
from alphafeat.features._vmath import vexp, vexp_expm1, vlog, vlog1p
from alphafeat.features.registry import (
    K_DECAY,
    K_DEV,
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
    Plan,
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


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _lut() -> np.ndarray:
    """Row 0: ``vlog1p(k)``, row 1: ``vlog(k)``, k < :data:`LUT_N` (computed once, read-only)."""
    lut = _make_lut(LUT_N)
    lut.flags.writeable = False
    return lut


def _tau_tables(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct time constants of the plan, each series' index into them, and whether the
    'linear' weight is needed for each (a Zumbach–Müller series uses it)."""
    taus: list[float] = []
    tix = np.empty(plan.s_kind.shape[0], dtype=np.int64)
    for s, tau in enumerate(plan.s_tau):
        if plan.s_kind[s] == K_FFILL:  # no decay factor
            tix[s] = 0
            continue
        if float(tau) not in taus:
            taus.append(float(tau))
        tix[s] = taus.index(float(tau))
    nu = np.zeros(max(len(taus), 1), dtype=np.bool_)
    for s in range(plan.s_kind.shape[0]):
        if plan.s_kind[s] in (K_ZM, K_DEV) and plan.interp == 1:
            nu[tix[s]] = True
    return np.asarray(taus or [1.0], dtype=np.float64), tix, nu


def kernel_of(plan: Plan) -> Kernel:
    """The :class:`Kernel` record of ``plan`` (derived once per plan, kept in ``plan.derived``)."""
    kp = plan.derived.get("cpu_kernel")
    if kp is None:
        lut = _lut()
        taus, tix, tau_nu = _tau_tables(plan)
        kp = plan.derived["cpu_kernel"] = Kernel(
            plan.layout, plan.depth_w, plan.s_kind, plan.s_code, plan.s_tau, plan.s_scale, tix, taus, tau_nu,
            plan.p_int, plan.p_tau, plan.fd_w, lut[0], lut[1], float(plan.tick), float(plan.hawkes_mu),
            float(plan.hawkes_alpha), int(plan.interp), int(plan.n_out), int(plan.fd_col), int(plan.n_codes),
            int(plan.row_groups),
        )  # fmt: skip
    return kp


def inputs_of(cols: dict[str, np.ndarray]) -> Inputs:
    """:class:`Inputs` of the prepared columns (:func:`alphafeat.features._prepare`)."""
    return Inputs(cols["bid_px"], cols["ask_px"], cols["bid_sz"], cols["ask_sz"], cols["ts_recv"],
                  cols["buy_volume"], cols["sell_volume"], cols["trade_count"])  # fmt: skip


#: Result matrices (flat) of earlier calls; one is reused when no view of it is alive.
_OUT_POOL: list[np.ndarray] = []
_POOL_LOCK = threading.Lock()


def _out_buffer(shape: tuple[int, int]) -> np.ndarray:
    """float64 result matrix of ``shape``.

    The matrix of an earlier call is reused only when nothing refers to it any more (its
    reference count is back to the pool's own), so results the caller keeps are never
    overwritten; fresh memory is paid for in page faults on first touch (a large part of the
    time on some hosts). At most one matrix is kept; :func:`release_buffers` drops it.
    """
    size = int(np.prod(shape))
    with _POOL_LOCK:
        for buf in _OUT_POOL:
            # references: the pool list, the loop variable, getrefcount's argument
            if sys.getrefcount(buf) <= 3 and buf.size >= size:
                return buf[:size].reshape(shape)
        _OUT_POOL.clear()
        buf = np.empty(size)
        _OUT_POOL.append(buf)
        return buf.reshape(shape)


def release_buffers() -> None:
    """Drop the result matrix kept for reuse."""
    with _POOL_LOCK:
        _OUT_POOL.clear()


def _bounds(n: int, k: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, n, k + 1).round().astype(np.int64)
    return [(int(edges[c]), int(edges[c + 1])) for c in range(k) if edges[c + 1] > edges[c]]


def compute_cpu(cols: dict[str, np.ndarray], plan: Plan, n_chunks: int = 1, n_jobs: int | None = 1) -> np.ndarray:
    """All features as a float64 matrix ``(n_out, n)``.

    ``cols``: contiguous input columns (:func:`alphafeat.features._prepare`). ``n_chunks``:
    number of contiguous chunks (>= 1); ``n_jobs``: worker threads for the chunks (1:
    in-process, None or -1: all cores; joblib's threading backend, the kernels release the
    GIL). Results equal the sequential ones to rounding, on any split. The declared features
    (:func:`alphafeat.features.registry.register`) are filled by their generated row kernel
    (:func:`alphafeat.features._declared.row_kernel`) between the row-wise stage and the
    recurrences.
    """
    n = int(cols["ts_recv"].shape[0])
    n_chunks = max(1, min(int(n_chunks), max(n, 1)))
    if n_jobs is None or n_jobs < 0:
        n_jobs = usable_cores()
    n_jobs = max(1, min(int(n_jobs), n_chunks))
    if n == 0:
        return np.empty((plan.n_out, 0))
    out = _out_buffer((plan.n_out, n))
    inp = inputs_of(cols)
    kp = kernel_of(plan)
    declared = row_kernel(plan, "cpu")
    S = plan.s_kind.shape[0]
    no_cz, no_ct, no_y = np.zeros(N_LF), np.zeros(N_LF, dtype=np.int64), np.zeros(1)

    def chunk(mode: int, lo: int, hi: int, jprev: np.ndarray, x0: np.ndarray):
        lastf = np.full(N_LF, -1, dtype=np.int64)
        ab = np.empty((2, S))
        _run_chunk(mode, inp, kp, out, lo, hi, 0, Carry(x0, jprev, no_cz, no_ct, no_y), lastf, ab)
        if mode == _MODE_ROWWISE and declared is not None:
            declared(inp, out, lo, hi)
        return lastf if mode == _MODE_ROWWISE else ab

    none = np.full(N_LF, -1, dtype=np.int64)
    if n_chunks == 1:
        if declared is None:
            chunk(_MODE_FUSED, 0, n, none, np.zeros(S))
        else:  # the same operations, the row-wise stage (and the declared rows) first
            chunk(_MODE_ROWWISE, 0, n, none, np.zeros(S))
            chunk(_MODE_REPLAY, 0, n, none, np.zeros(S))
        return out
    bounds = _bounds(n, n_chunks)
    if n_jobs == 1:
        run = lambda tasks: [chunk(*t) for t in tasks]  # noqa: E731
    else:
        from joblib import Parallel, delayed

        par = Parallel(n_jobs=n_jobs, backend="threading")
        run = lambda tasks: par(delayed(chunk)(*t) for t in tasks)  # noqa: E731
    zero = np.zeros(S)
    lastf = run([(_MODE_ROWWISE, lo, hi, none, zero) for lo, hi in bounds])
    jprev = np.full((len(bounds), N_LF), -1, dtype=np.int64)
    for c in range(1, len(bounds)):
        jprev[c] = np.where(lastf[c - 1] >= 0, lastf[c - 1], jprev[c - 1])
    x0 = np.zeros((len(bounds), S))
    if len(bounds) > 1:
        abs_ = run([(_MODE_COMPOSE, lo, hi, jprev[c], zero) for c, (lo, hi) in enumerate(bounds[:-1])])
        for c in range(1, len(bounds)):
            A, B = abs_[c - 1]
            x0[c] = A * x0[c - 1] + B
    run([(_MODE_REPLAY, lo, hi, jprev[c], x0[c]) for c, (lo, hi) in enumerate(bounds)])
    return out


def row_columns(plan: Plan) -> frozenset[int]:
    """Columns the row-wise stage leaves final (no state: a function of rows i and i - 1,
    declared rows included): every output column but the post-transform targets and the
    fractional difference, which the recurrence stage writes."""
    rest = {int(c) for c in plan.p_int[:, 1]} | {int(plan.fd_col)}
    return frozenset(c for c in range(plan.n_out) if c not in rest)


def _rows_of(cols: dict[str, np.ndarray], i0: int, i1: int) -> dict[str, np.ndarray]:
    """Rows ``[i0, i1)`` of ``cols`` led by their halo row ``i0 - 1`` when ``i0 > 0``."""
    a = i0 - 1 if i0 > 0 else 0
    return {k: v[a:i1] for k, v in cols.items()}


#: Row-wise pieces a threaded stream computes ahead per pool thread (its result matrices: this
#: many per pool thread, and two more whose results are being taken).
_AHEAD = 2


class FeatureStream:
    """The CPU features of one segment computed block by block as its rows arrive.

    Each :meth:`push` runs the sequential kernel over the new rows, continuing from the carries
    of the rows before (a :class:`Carry`: recurrence states, the skip-NaN rule's last finite
    row, value and time per input, the fractional-difference window): the same operations in
    the same order as one :func:`compute_cpu` call over the whole segment, so the values are
    identical (``tests/test_segment.py``), while memory is one block's result matrix.

    :meth:`push_block` pushes a block in pieces; with ``threads > 1`` it splits each piece's
    work by feature along the kernel's own stages: the row-wise features (no state, the
    columns of :func:`row_columns`) of the coming pieces on ``threads - 1`` pool threads, the
    recurrences, post transforms and fractional difference (which carry state from piece to
    piece and read the row-wise mid, spread, return and signed volume) on the calling thread,
    piece by piece in order; the caller's copies of the results on the pool threads. Every
    feature is computed by the same code on the same rows as in one :meth:`push` (the kernels
    release the GIL), so the values are identical whatever the thread count
    (``tests/test_features_threads.py``).

    Parameters
    ----------
    plan : Plan
        :func:`alphafeat.features.registry.make_plan` of the feature parameters.
    max_rows : int
        Most new rows one push (one piece of :meth:`push_block`) may bring (the result
        matrices are allocated once for them).
    threads : int
        Most threads :meth:`push_block` computes on (1: the calling thread only); each call
        may use fewer (its ``threads``). The pool threads start at the first call using them.
    """

    def __init__(self, plan: Plan, max_rows: int, threads: int = 1) -> None:
        S = plan.s_kind.shape[0]
        W = plan.fd_w.shape[0]
        self.plan = plan
        self.rows = 0  # segment rows pushed so far
        self.carry = Carry(np.zeros(S), np.full(N_LF, -1, dtype=np.int64), np.zeros(N_LF),
                           np.zeros(N_LF, dtype=np.int64), np.full(max(W - 1, 1), np.nan))  # fmt: skip
        self.max_rows = int(max_rows)
        # one flat buffer; each push views its start as a C-contiguous (n_out, rows) matrix, so the
        # kernel has one compiled form (a column slice of a wider matrix would be another: a second
        # cached version for numba to load in every process)
        self.out = reserve("features:stream", (plan.n_out * (self.max_rows + 1),), np.float64)
        self._kernel = kernel_of(plan)
        self._declared = row_kernel(plan, "cpu")
        self.threads = max(1, int(threads))
        self.row_cols = row_columns(plan)
        self.rest_cols = frozenset(range(plan.n_out)) - self.row_cols
        self.all_cols = frozenset(range(plan.n_out))
        # the row-wise stage's carry: read by the kernel (copied), never changed
        self._still = Carry(np.zeros(S), np.full(N_LF, -1, dtype=np.int64), np.zeros(N_LF),
                            np.zeros(N_LF, dtype=np.int64), np.zeros(1))  # fmt: skip
        self._pool = None  # the pool threads and their result buffers, made at the first threaded push_block
        self._ring: list[np.ndarray] = []

    def close(self) -> None:
        """Let the pool threads go (a threaded stream)."""
        if self._pool is not None:
            self._pool.shutdown()

    def push(self, cols: dict[str, np.ndarray], halo: bool) -> np.ndarray:
        """Features of the new rows of ``cols`` as a float64 view ``(n_out, m)``, valid until
        the next push.

        ``cols``: contiguous input columns (:func:`alphafeat.features._prepare`) of the new
        rows, preceded when ``halo`` by the last row of the previous push (the row-wise
        differences read it). The first push has no halo.
        """
        n = self._check(cols, halo)
        out = self._matrix(self.out, n)
        if n - halo <= 0:
            return out[:, :0]
        if self._declared is None:
            return self._continue(_MODE_CONTINUE, cols, halo, out)
        self._row_stage(cols, halo, out)  # row-wise stage, declared rows, then the rest
        return self._continue(_MODE_CONTINUE_SCAN, cols, halo, out)

    def push_block(self, cols: dict[str, np.ndarray], lo: int,
                   take: Callable[[int, int, np.ndarray, frozenset[int]], None], threads: int | None = None) -> None:
        """Push rows ``lo`` on of ``cols`` (row ``lo - 1`` is the halo when ``lo > 0``; ``lo`` is
        0 only for the first push) in pieces of at most ``max_rows`` rows, on ``threads`` threads
        (default and at most the stream's ``threads``; it may change from block to block).

        For each piece ``[i0, i1)`` of ``cols``, ``take(i0, i1, out, which)`` gets its features,
        ``out`` a float64 view ``(n_out, i1 - i0)`` valid during the call, of which the columns
        in ``which`` are final: with one thread, one call per piece with :attr:`all_cols`, in
        order; with more, on the pool threads in any order, one call with :attr:`row_cols`
        (after the piece's row-wise stage) and one with :attr:`rest_cols` (after its
        recurrences, which run on the calling thread in row order). Every call is done when
        this returns.
        """
        n = int(cols["ts_recv"].shape[0])
        spans = [(i0, min(i0 + self.max_rows, n)) for i0 in range(lo, n, self.max_rows)]
        use = self.threads if threads is None else max(1, min(int(threads), self.threads))
        if use == 1:
            for i0, i1 in spans:
                take(i0, i1, self.push(_rows_of(cols, i0, i1), i0 > 0), self.all_cols)
            return
        from concurrent.futures import wait

        pool, ring = self._threaded(use)
        rows, rest = [], []  # per piece: its row-wise stage, the take of its other columns
        try:
            for j, (i0, i1) in enumerate(spans):
                # row-wise stages ahead, each in the buffer of the piece len(ring) before, taken by now
                while len(rows) < min(j + len(ring) - 1, len(spans)):
                    k = len(rows)
                    if k >= len(ring):
                        rest[k - len(ring)].result()
                    rows.append(pool.submit(self._rows_piece, cols, spans[k], ring[k % len(ring)], take))
                rows[j].result()
                piece = _rows_of(cols, i0, i1)
                out = self._matrix(ring[j % len(ring)], self._check(piece, i0 > 0))
                new = self._continue(_MODE_CONTINUE_SCAN, piece, i0 > 0, out)
                rest.append(pool.submit(take, i0, i1, new, self.rest_cols))
        finally:
            wait(rows + rest)  # nothing of the block is read after this returns
        for f in rest:
            f.result()

    def _threaded(self, use: int) -> tuple[object, list[np.ndarray]]:
        """The pool (``threads - 1`` threads, made once) and the result buffers of a push_block
        on ``use`` threads: :data:`_AHEAD` pieces ahead per pool thread used."""
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="features-rows")
            self._ring = [reserve(f"features:ring{k}", self.out.shape, np.float64)
                          for k in range(_AHEAD * (self.threads - 1) + 2)]  # fmt: skip
        return self._pool, self._ring[: _AHEAD * (use - 1) + 2]

    def _rows_piece(self, cols: dict[str, np.ndarray], span: tuple[int, int], buf: np.ndarray,
                    take: Callable[[int, int, np.ndarray, frozenset[int]], None]) -> None:
        """A pool thread's part of :meth:`push_block`: the row-wise stage of one piece into ``buf``."""
        i0, i1 = span
        lo = 1 if i0 > 0 else 0
        out = self._matrix(buf, i1 - i0 + lo)
        self._row_stage(_rows_of(cols, i0, i1), i0 > 0, out)
        take(i0, i1, out[:, lo:], self.row_cols)

    def _matrix(self, buf: np.ndarray, n: int) -> np.ndarray:
        """The start of the flat ``buf`` as a C-contiguous ``(n_out, n)`` matrix."""
        return buf[: self.plan.n_out * n].reshape(self.plan.n_out, n)

    def _check(self, cols: dict[str, np.ndarray], halo: bool) -> int:
        """Rows of ``cols`` (halo included); UsageError on a halo out of place or too many rows."""
        n = int(cols["ts_recv"].shape[0])
        if halo != (self.rows > 0):
            raise UsageError("halo", "FeatureStream.push: the first push has no halo row, every later push has one")
        if n - halo > self.max_rows:
            raise UsageError("cols", f"FeatureStream.push: {n - halo} rows, more than max_rows = {self.max_rows}")
        return n

    def _row_stage(self, cols: dict[str, np.ndarray], halo: bool, out: np.ndarray) -> None:
        """The row-wise features and declared rows of the new rows of ``cols`` into ``out``
        (they read rows i and i - 1 only: no carry, any thread, any order)."""
        n = out.shape[1]
        lo = 1 if halo else 0
        lastf, ab = np.empty(N_LF, np.int64), np.empty((2, self.plan.s_kind.shape[0]))
        _run_chunk(_MODE_ROWWISE, inputs_of(cols), self._kernel, out, lo, n, 0, self._still, lastf, ab)
        if self._declared is not None:
            self._declared(inputs_of(cols), out, lo, n)

    def _continue(self, mode: int, cols: dict[str, np.ndarray], halo: bool, out: np.ndarray) -> np.ndarray:
        """Kernel ``mode`` (fused, or the stages after the row-wise one) over the new rows of
        ``cols`` into ``out``, continuing the carry; returns the new rows' columns."""
        n = out.shape[1]
        lo = 1 if halo else 0
        g0 = self.rows - lo  # segment row of array row 0
        far = np.int64(2**62)  # a last finite row before the arrays: "seen, not the previous row"
        cj = self.carry.cj
        jloc = np.where(cj >= 0, np.maximum(cj - g0, 0), -1)
        jloc = np.where((cj >= 0) & (cj < g0), far, jloc).astype(np.int64)
        io = self.carry._replace(cj=jloc)
        lastf, ab = np.empty(N_LF, np.int64), np.empty((2, self.plan.s_kind.shape[0]))
        _run_chunk(mode, inputs_of(cols), self._kernel, out, lo, n, g0, io, lastf, ab)
        self.carry = io._replace(cj=np.where((jloc >= 0) & (jloc < far) & (jloc >= lo), jloc + g0, cj))
        self.rows += n - lo
        return out[:, lo:]
