"""The order-level (MBO) book simulation of one instrument and one session (numba), with the
MBP-10 records derived in the same pass, and the assembly of a session's instruments.

See :mod:`alphafeat.synth` for the model. The hot loop (:func:`_simulate`, one
:func:`_step` per book event) writes whole DBN records as little-endian int64 words into
buffers whose layouts are the reader's (:mod:`alphafeat.synth.writer`).
"""

from __future__ import annotations

import datetime
import logging
import math
import time
import zlib
from dataclasses import dataclass

import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from alphafeat.synth.calendar import (
    BASE_RATE,
    P_MOVE_MAX,
    Contract,
    _fair_price,
    _index_level,
    _level,
    _profile_segments,
    _session_vol,
    _spread_share,
    contracts_for,
    session_bounds,
    volume_share,
)
from alphafeat.synth.records import (
    F_LAST,
    MBO_DTYPE,
    MBO_SIZE,
    MBO_W,
    MBP10_DTYPE,
    MBP_SIZE,
    MBP_W,
    PUBLISHER_ID,
    UNDEF_PRICE,
    Buffers,
    InstrumentRun,
    Session,
)
from alphafeat.validation import SignalKind, validate_enum, validate_signal

__all__ = ["SIGNAL_KINDS", "Signal", "activity_segments", "volatility_multipliers"]

logger = logging.getLogger(__name__)

#: Kinds of planted predictability (``--signal-kind``).
SIGNAL_KINDS = tuple(k.value for k in SignalKind)
#: Weight of the level-1 queue imbalance ``(Qb - Qa) / (Qb + Qa)`` in the leader's up-move
#: probability ``u = 1/2 + 1/2 clip(s_B I + s_H tanh(F / H0) + bridge)`` at strength 1.
SIGNAL_BOOK = 0.5
#: Weight of the slow signed-flow term at strength 1 (F: signed traded volume decayed by
#: ``exp(-1 / HISTORY_EVENTS)`` per book event, about the last minutes of trading).
SIGNAL_HISTORY = 0.015
#: Events over which the history signal's signed flow decays (e-folding), and its scale H0
#: (contracts).
HISTORY_EVENTS, HISTORY_SCALE = 600.0, 100.0
#: Default strength of the planted signal (``--signal``).
DEFAULT_SIGNAL = 1.0
#: Strength kappa of a non-leading instrument's response to order-flow imbalance (0 = none, < 1).
OFI_STRENGTH = 0.5
#: Weights of level-1 queue imbalance, signed-flow and reference-gap terms in a non-leading
#: instrument's signal (the first two scaled by the signal strength, at most 1).
W_IMB, W_FLOW, W_REF = 0.35, 0.35, 0.6
#: Size targets (contracts) of level 1 and of deeper levels.
T_LEVEL1, T_DEEP = 60.0, 55.0
#: Probability that a book event is a marketable order (outrights; the spread).
P_TRADE, P_TRADE_SPREAD = 0.07, 0.04
#: Share of limit add / cancel / modify events at level 1 (the rest decays geometrically
#: with ratio 0.8 over levels 2-10).
P_LEVEL0 = 0.35
#: Probability that a level-1 event on a best level holding a single order cancels it (quote
#: flicker; non-leading instruments), and that a marketable order clears the whole best level
#: (plus 0.05 |gap|).
P_FLICKER, P_SWEEP = 0.1, 0.05
#: Probability that an event opens a level inside a spread wider than one tick (non-leading
#: instruments; the leader's is :data:`FILL_PER_ACTIVITY` times the profile multiplier, at
#: most :data:`FILL_MAX`).
P_FILL = 0.2
FILL_PER_ACTIVITY, FILL_MAX = 0.12, 0.9
#: Probability that a mid move of the leader leaves a two-tick spread (a half move; the other
#: half comes with the next fill), times the profile's widening factor.
P_WIDEN = 0.25
#: Probability that a mid move of the leader cascades over further levels (1 + Geometric(1/2)
#: more ticks in one event): the jumps of the return tails.
P_JUMP = 0.05
#: Probability that the last order of a best level that goes is filled by a marketable order
#: (else cancelled).
P_MOVE_TRADE = 0.7
#: Share of the leader's marketable orders (those that do not move the mid) that follow the
#: running metaorder, and the tail exponent of metaorder lengths (Lillo & Farmer 2004: trade
#: signs decay as a power law with exponent alpha - 1).
META_SHARE, META_ALPHA = 0.9, 1.5
#: Longest metaorder (trades): the power law holds up to it.
META_MAX = 2000.0
#: Stochastic activity: the event rate is multiplied by ``exp(x - VOL_SD^2 / 2)``, x an
#: Ornstein-Uhlenbeck process over 1-minute steps with stationary s.d. VOL_SD and time constant
#: VOL_TAU_MIN minutes (volatility clustering).
VOL_SD, VOL_TAU_MIN = 0.35, 45.0
#: Stochastic volatility: the leader's move probability is multiplied by ``exp(y - SV_SD^2 / 2)``
#: (mean 1, so the session's variance and the bridge are unchanged on average), y an OU process
#: over 1-minute steps with s.d. SV_SD and time constant SV_TAU_MIN minutes (fat-tailed,
#: clustered returns at every scale: Clark 1973, Andersen & Bollerslev 1997).
SV_SD, SV_TAU_MIN = 0.8, 30.0
#: Probability that a limit-add event modifies (grows) a resting order instead of adding one,
#: and that a reduce event shrinks an order ('M') instead of cancelling it.
P_MODIFY_UP, P_MODIFY_DOWN = 0.15, 0.45
#: Rare cases: crossed pre-open per outright and session; a locked book per event at a
#: one-tick spread (for one event); F_BAD_TS_RECV per event (besides the opening snapshot,
#: whose records all carry F_SNAPSHOT | F_BAD_TS_RECV as Databento's do); a missing tail level
#: below 10 is refilled with probability P_REPLENISH per event (else the book stays thin).
P_CROSSED_PREOPEN, P_LOCK, P_BAD_TS, P_REPLENISH = 0.25, 2e-4, 1e-4, 0.9
#: Continuous trading starts this long after the session open (the snapshot and the pre-open
#: with its uncrossing trade come first), ns.
OPEN_DELAY_NS = 60_000_000_000
#: Burst structure of event times: mean events per burst, probability of a short gap, mean
#: short and long gap inside a burst (ns).
BURST_MEAN, BURST_P_SHORT, BURST_SHORT_NS, BURST_LONG_NS = 5.0, 0.7, 50_000.0, 4_000_000.0
#: A non-leading outright re-quotes (a level opens inside a wide spread, else its stale best
#: level is pulled) when its fair value is more than this many ticks from its mid.
FOLLOW_TICKS = 1.0


@dataclass(frozen=True)
class Signal:
    """The planted predictability of the leading outright's mid.

    Attributes
    ----------
    strength : float
        Multiplier of the default weights (:data:`SIGNAL_BOOK`, :data:`SIGNAL_HISTORY`), >= 0;
        0: the mid is a martingale (no predictability at any horizon from anything observable).
    kind : str
        ``"book"`` (the level-1 queue imbalance: visible in the current book), ``"history"``
        (signed traded volume over about the last :data:`HISTORY_EVENTS` events: visible only
        in the order flow's history) or ``"both"``.
    """

    strength: float = DEFAULT_SIGNAL
    kind: str = "both"

    def __post_init__(self) -> None:
        """Checks both as the CLI does (:func:`alphafeat.validation.validate_signal`, a
        :class:`~alphafeat.validation.SignalKind`): UsageError naming ``--signal`` or
        ``--signal-kind``."""
        object.__setattr__(self, "strength", validate_signal(self.strength, "--signal"))
        object.__setattr__(self, "kind", validate_enum(self.kind, SignalKind, "--signal-kind").value)

    @property
    def book(self) -> float:
        """Weight of the queue-imbalance term."""
        return self.strength * SIGNAL_BOOK if self.kind in ("book", "both") else 0.0

    @property
    def history(self) -> float:
        """Weight of the slow signed-flow term."""
        return self.strength * SIGNAL_HISTORY if self.kind in ("history", "both") else 0.0


# --------------------------------------------------------------------------------------------
# numba kernels: the order-level (MBO) book simulation and the MBP-10 records derived from it
# --------------------------------------------------------------------------------------------

#: Internal price levels per side kept by the simulation for outrights (top 10 are visible in
#: MBP-10; levels 10-11 are real resting orders that become visible when the book shifts).
LMAX_OUTRIGHT = 12
#: Levels per side of the calendar spread's book (so its MBP-10 levels 5-9 are UNDEF).
LMAX_SPREAD = 5
#: Most orders resting at one price level (further adds grow the last order with an 'M').
QMAX = 64
#: Records reserved per event when checking buffer room.
_RESERVE = 1024

# Packed int64 state ``st`` of one instrument's book: scalars, event context, record counters,
# then per side and level the order count, the level size and the FIFO queue (order ids and
# sizes). One array instead of many, because numba reference-counts every array argument of
# every call between the kernel's helpers (atomic increments that dominated the run time).
_IB, _IA, _INB, _INA, _IOID, _ILOCK, _HMBO, _HMBP = range(8)
# event context: ts_event, ts_recv, sequence, ts_in_delta, flags, write switch
_ET, _ERC, _ESEQ, _ETID, _EFLAGS, _EWRITE = 8, 9, 10, 11, 12, 13
# records written so far (MBO, MBP-10); MBP-10 rows with F_LAST, those of them with an UNDEF
# level 10 on either side (a thin book), the volume and the number of the MBP-10 'T' records
_CMBO, _CMBP, _CLAST, _CTHIN, _CTVOL, _CTN = 14, 15, 16, 17, 18, 19
# MBO records are written (else only counted); the running metaorder's sign and the trades
# left in it (leading outright)
_WMBO, _IMSIGN, _IMLEFT = 20, 21, 22
#: Level stride per side in the packed state (>= LMAX_OUTRIGHT).
_LS = 16
_QN = 24  # orders at level k of side s: st[_QN + s * _LS + k]
_LSZ = _QN + 2 * _LS  # contracts at level k of side s
_QID = _LSZ + 2 * _LS  # id of order j at level k of side s: st[_QID + (s * _LS + k) * QMAX + j]
_QD = 2 * _LS * QMAX  # offset from an order's id to its size
_NST = _QID + 2 * _QD
# float-state indices (float64 array ``fst``): the leader's slowly decaying signed flow (the
# history signal), its bridge target at the close (mid, ticks) and the events left to it, the
# fill and widening probabilities of the time of day, a follower's fast signed flow, the
# stochastic volatility multiplying the leader's move probability
_FFLOW, _FTGT, _FREM, _FFILL, _FWIDEN, _FFAST, _FVOL = 0, 1, 2, 3, 4, 5, 6
_NFST = 8
#: int64 words per MBO / MBP-10 record (the kernel writes whole records as words).
_M32 = 0xFFFFFFFF
_UNDEF = UNDEF_PRICE
# parameter-vector indices (float64 array ``params``), see :func:`_params`
(
    _PKAPPA,
    _PWI,
    _PWF,
    _PWR,
    _PF0,
    _PDECAY,
    _PTRADE,
    _PFILL,
    _PT0,
    _PTD,
    _PMODE,
    _PSW0,
    _PSW1,
    _PLOCK,
    _PBADTS,
    _PREPL,
    _PLMAX,
    _PNMIN,
    _PTICK,
    _PMODUP,
    _PMODDN,
    _PL0,
    _PFLICK,
    _PFOLLOW,
    _PMOVE,
    _PSB,
    _PSH,
    _PH0,
    _PHDECAY,
    _PMETAQ,
    _PMETAA,
    _PJUMP,
    _PMOVETR,
) = range(33)
#: cumulative probabilities of the level of a limit event (levels 1..9 of 10), see :func:`_params`
_PLCUM = 33
_NPARAMS = _PLCUM + 9
assert LMAX_OUTRIGHT <= _LS and LMAX_SPREAD <= _LS


@intrinsic
def _borrow(typingctx, obj):
    """``obj`` (an array or a numpy ``Generator``) without its reference-counted owner
    (meminfo = NULL).

    numba increments and decrements (atomically) the owner's count of every array or generator
    passed to a function, ``rng.random()`` included; with no owner these become a null check.
    Only for objects that the caller keeps alive while the borrowed one is used."""
    if isinstance(obj, types.Array):

        def codegen(context, builder, sig, args):
            src = context.make_array(sig.args[0])(context, builder, args[0])
            out = context.make_array(sig.return_type)(context, builder)
            populate_array(
                out, data=src.data, shape=src.shape, strides=src.strides, itemsize=src.itemsize, meminfo=None
            )
            return out._getvalue()

        return obj(obj), codegen
    if isinstance(obj, types.NumPyRandomGeneratorType):

        def codegen_rng(context, builder, sig, args):
            src = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=args[0])
            out = cgutils.create_struct_proxy(sig.return_type)(context, builder)
            out.bit_generator = src.bit_generator
            out.parent = src.parent
            out.meminfo = cgutils.get_null_value(out.meminfo.type)
            return out._getvalue()

        return obj(obj), codegen_rng
    return None


@numba.njit(cache=True)
def _geometric(rng, p):
    """Geometric(p) on {1, 2, ...} by inversion of one uniform."""
    return np.int64(1 + math.floor(math.log(1.0 - rng.random()) / math.log(1.0 - p)))


@numba.njit(cache=True)
def _event_times(rng, seg_start, seg_end, seg_rate, mean_burst, p_short, short_ns, long_ns):
    """Event times (int64 ns, strictly increasing) of a bursty Poisson cluster process.

    Burst starts: Poisson with rate ``seg_rate / mean_burst`` (events/s) in each segment;
    burst size Geometric on {1, 2, ...} with mean ``mean_burst``; gaps inside a burst are
    Exp(``short_ns``) with probability ``p_short`` (same-packet / reaction bursts) else
    Exp(``long_ns``).
    """
    total = 0.0
    for s in range(seg_start.shape[0]):
        total += seg_rate[s] * (seg_end[s] - seg_start[s]) * 1e-9
    cap = max(1024, int(total * 1.3) + 1024)
    out = np.empty(cap, np.int64)
    n = 0
    last = np.int64(-1)
    p_geo = 1.0 / mean_burst
    for s in range(seg_start.shape[0]):
        rate = seg_rate[s] / mean_burst
        if rate <= 0.0 or seg_end[s] <= seg_start[s]:
            continue
        t = float(seg_start[s])
        end = float(seg_end[s])
        while True:
            t += rng.standard_exponential() / rate * 1e9
            if t >= end:
                break
            m = _geometric(rng, p_geo)
            tb = t
            for j in range(m):
                if j > 0:
                    g = short_ns if rng.random() < p_short else long_ns
                    tb += max(1.0, rng.standard_exponential() * g)
                if tb >= end:
                    break
                ti = np.int64(tb)
                if ti <= last:
                    ti = last + 1
                if ti >= seg_end[s]:
                    break
                if n == cap:
                    cap *= 2
                    tmp = np.empty(cap, np.int64)
                    tmp[:n] = out[:n]
                    out = tmp
                out[n] = ti
                last = ti
                n += 1
            t = max(t, tb)
    return out[:n]


@numba.njit(cache=True)
def _put_mbo(om, st, oid, px, size, action, side):
    """Append one whole MBOMsg (7 little-endian int64 words) to ``om`` (or only count it)."""
    n = st[_CMBO]
    st[_CMBO] = n + 1
    if st[_WMBO] == 0:
        return
    om[n, 0] = st[_HMBO]
    om[n, 1] = st[_ET]
    om[n, 2] = oid
    om[n, 3] = px
    # size u32 | flags u8 | channel_id u8 (0) | action u8 | side u8
    om[n, 4] = (size & _M32) | (st[_EFLAGS] << 32) | (np.int64(action) << 48) | (np.int64(side) << 56)
    om[n, 5] = st[_ERC]
    om[n, 6] = (st[_ETID] & _M32) | (st[_ESEQ] << 32)  # ts_in_delta i32 | sequence u32


@numba.njit(cache=True)
def _put_mbp(op, st, px, size, action, side, depth, tick):
    """Append one whole MBP10Msg (46 int64 words): the update and the current top-10 book."""
    n = st[_CMBP]
    op[n, 0] = st[_HMBP]
    op[n, 1] = st[_ET]
    op[n, 2] = px
    # size u32 | action u8 | side u8 | flags u8 | depth u8
    op[n, 3] = (
        (size & _M32)
        | (np.int64(action) << 32)
        | (np.int64(side) << 40)
        | (st[_EFLAGS] << 48)
        | (np.int64(depth) << 56)
    )
    op[n, 4] = st[_ERC]
    op[n, 5] = (st[_ETID] & _M32) | (st[_ESEQ] << 32)
    undef = np.int64(_UNDEF)
    b = st[_IB]
    a = st[_IA]
    nb = st[_INB]
    na = st[_INA]
    for k in range(10):
        w = 6 + 4 * k
        if k < nb:
            op[n, w] = (b - k) * tick
            bsz = st[_LSZ + k]
            bct = st[_QN + k]
        else:
            op[n, w] = undef
            bsz = np.int64(0)
            bct = np.int64(0)
        if k < na:
            op[n, w + 1] = (a + k) * tick
            asz = st[_LSZ + _LS + k]
            act = st[_QN + _LS + k]
        else:
            op[n, w + 1] = undef
            asz = np.int64(0)
            act = np.int64(0)
        op[n, w + 2] = (bsz & _M32) | (asz << 32)  # bid_sz u32 | ask_sz u32
        op[n, w + 3] = (bct & _M32) | (act << 32)  # bid_ct u32 | ask_ct u32
    st[_CMBP] = n + 1


@numba.njit(cache=True)
def _emit(st, om, op, s, k, px, oid, q, action, tick):
    """Emit a book-changing MBO record and, when level ``k`` is in the top 10, its MBP-10
    record (the MBP-10 book is the state after the change)."""
    if st[_EWRITE] == 0:
        return
    side = np.uint8(66) if s == 0 else np.uint8(65)
    _put_mbo(om, st, oid, px, q, action, side)
    if k < 10:
        _put_mbp(op, st, px, q, action, side, k, tick)


@numba.njit(cache=True)
def _lvl_px(st, s, k, tick):
    return (st[_IB] - k) * tick if s == 0 else (st[_IA] + k) * tick


@numba.njit(cache=True)
def _insert_level0(st, s):
    """Shift side ``s`` one level deeper and open an empty level 0 one tick better.

    The side must hold fewer than its maximum number of levels."""
    n = st[_INB + s]
    base = s * _LS
    for k in range(n, 0, -1):
        m = st[_QN + base + k - 1]
        st[_QN + base + k] = m
        st[_LSZ + base + k] = st[_LSZ + base + k - 1]
        src = _QID + (base + k - 1) * QMAX
        dst = src + QMAX
        for j in range(m):
            st[dst + j] = st[src + j]
            st[_QD + dst + j] = st[_QD + src + j]
    st[_QN + base] = 0
    st[_LSZ + base] = 0
    st[_INB + s] = n + 1
    if s == 0:
        st[_IB] += 1
    else:
        st[_IA] -= 1


@numba.njit(cache=True)
def _remove_level0(st, s):
    """Drop the (empty) level 0 of side ``s``; the next level becomes the best."""
    n = st[_INB + s]
    base = s * _LS
    for k in range(n - 1):
        m = st[_QN + base + k + 1]
        st[_QN + base + k] = m
        st[_LSZ + base + k] = st[_LSZ + base + k + 1]
        dst = _QID + (base + k) * QMAX
        src = dst + QMAX
        for j in range(m):
            st[dst + j] = st[src + j]
            st[_QD + dst + j] = st[_QD + src + j]
    st[_QN + base + n - 1] = 0
    st[_LSZ + base + n - 1] = 0
    st[_INB + s] = n - 1
    if s == 0:
        st[_IB] -= 1
    else:
        st[_IA] += 1


@numba.njit(cache=True)
def _add(st, om, op, s, k, q, tick):
    """Add an order of ``q`` contracts at level ``k`` (``k`` = level count opens a new tail)."""
    n = st[_INB + s]
    if k == n:
        st[_INB + s] = n + 1
    px = _lvl_px(st, s, k, tick)
    lv = s * _LS + k
    qo = _QID + lv * QMAX
    j = st[_QN + lv]
    if j == QMAX:  # full queue: grow the last order instead
        st[_QD + qo + j - 1] += q
        st[_LSZ + lv] += q
        _emit(st, om, op, s, k, px, st[qo + j - 1], st[_QD + qo + j - 1], np.uint8(77), tick)
        return
    oid = st[_IOID]
    st[_IOID] += 1
    st[qo + j] = oid
    st[_QD + qo + j] = q
    st[_QN + lv] = j + 1
    st[_LSZ + lv] += q
    _emit(st, om, op, s, k, px, oid, q, np.uint8(65), tick)


@numba.njit(cache=True)
def _cancel(st, om, op, s, k, j, q, tick):
    """Cancel ``q`` contracts of order ``j`` at level ``k`` (the whole order when that is all it
    has); an emptied level 0 is removed (the side shifts), an emptied tail level dropped."""
    px = _lvl_px(st, s, k, tick)
    lv = s * _LS + k
    qo = _QID + lv * QMAX
    oid = st[qo + j]
    st[_QD + qo + j] -= q
    st[_LSZ + lv] -= q
    if st[_QD + qo + j] <= 0:
        m = st[_QN + lv]
        for jj in range(j, m - 1):
            st[qo + jj] = st[qo + jj + 1]
            st[_QD + qo + jj] = st[_QD + qo + jj + 1]
        st[_QN + lv] = m - 1
    if st[_QN + lv] == 0:
        if k == 0:
            _remove_level0(st, s)
        else:
            st[_INB + s] -= 1
    _emit(st, om, op, s, k, px, oid, q, np.uint8(67), tick)


@numba.njit(cache=True)
def _modify(st, om, op, s, k, j, new, tick):
    """Change order ``j``'s size to ``new`` > 0; a size increase loses queue priority."""
    px = _lvl_px(st, s, k, tick)
    lv = s * _LS + k
    qo = _QID + lv * QMAX
    oid = st[qo + j]
    old = st[_QD + qo + j]
    st[_LSZ + lv] += new - old
    if new > old:
        m = st[_QN + lv]
        for jj in range(j, m - 1):
            st[qo + jj] = st[qo + jj + 1]
            st[_QD + qo + jj] = st[_QD + qo + jj + 1]
        st[qo + m - 1] = oid
        st[_QD + qo + m - 1] = new
    else:
        st[_QD + qo + j] = new
    _emit(st, om, op, s, k, px, oid, new, np.uint8(77), tick)


@numba.njit(cache=True)
def _drop_tail(st, om, op, s, tick):
    """Cancel every order of side ``s``'s deepest level (it leaves the simulated depth)."""
    k = st[_INB + s] - 1
    lv = s * _LS + k
    qo = _QID + lv * QMAX
    while st[_INB + s] == k + 1 and st[_QN + lv] > 0:
        m = st[_QN + lv]
        _cancel(st, om, op, s, k, m - 1, st[_QD + qo + m - 1], tick)


@numba.njit(cache=True)
def _order_size(rng):
    """Limit-order size, contracts: 1 with probability 0.7, else 1 + Geometric(1/3) (mean 1.9)."""
    if rng.random() < 0.7:
        return np.int64(1)
    return np.int64(1 + _geometric(rng, 1.0 / 3.0))


@numba.njit(cache=True)
def _new_level(rng, st, om, op, s, k, target, tick):
    """Open level ``k`` (a new tail) with orders summing to about ``target`` contracts."""
    goal = max(1, np.int64(target * (0.3 + 1.0 * rng.random())))
    lv = s * _LS + k
    while st[_LSZ + lv] < goal or st[_QN + lv] == 0:
        _add(st, om, op, s, k, _order_size(rng), tick)
        if st[_QN + lv] >= QMAX:
            break


@numba.njit(cache=True)
def _trade(st, om, op, buy, qty, tick):
    """A marketable order of ``qty`` contracts (capped below the resting depth).

    MBO: one 'T' per price level traded (side = aggressor, order id 0), one 'F' per resting
    order filled (side = resting), then one 'C' per fill removing the filled quantity. MBP-10:
    the 'T' records (book before the trade) and the 'C' records. Returns the quantity traded."""
    s = 1 if buy else 0
    base = s * _LS
    n = st[_INB + s]
    total = 0
    for k in range(n):
        total += st[_LSZ + base + k]
    qty = min(qty, total - 1)
    if qty <= 0:
        return 0
    aggr = np.uint8(66) if buy else np.uint8(65)
    rest = np.uint8(65) if buy else np.uint8(66)
    if st[_EWRITE] != 0:
        rem = qty
        k = 0
        while rem > 0:
            f = min(rem, st[_LSZ + base + k])
            px = _lvl_px(st, s, k, tick)
            _put_mbo(om, st, 0, px, f, np.uint8(84), aggr)
            if k < 10:
                _put_mbp(op, st, px, f, np.uint8(84), aggr, k, tick)
                st[_CTVOL] += f
                st[_CTN] += 1
            rem -= f
            k += 1
        rem = qty
        k = 0
        j = 0
        while rem > 0:
            qo = _QID + (base + k) * QMAX
            f = min(rem, st[_QD + qo + j])
            _put_mbo(om, st, st[qo + j], _lvl_px(st, s, k, tick), f, np.uint8(70), rest)
            rem -= f
            j += 1
            if j == st[_QN + base + k]:
                k += 1
                j = 0
    rem = qty
    q0 = _QD + _QID + base * QMAX
    while rem > 0:
        f = min(rem, st[q0])
        _cancel(st, om, op, s, 0, 0, f, tick)
        rem -= f
    return qty


@numba.njit(cache=True)
def _replenish(rng, p, st, om, op, tick):
    """Refill sides thinner than ``nmin`` levels: each missing tail level with probability
    ``p_repl`` (an empty side always gets one level)."""
    nmin = np.int64(p[_PNMIN])
    for s in range(2):
        while st[_INB + s] < nmin:
            if st[_INB + s] > 0 and rng.random() >= p[_PREPL]:
                break
            _new_level(rng, st, om, op, s, st[_INB + s], p[_PTD], tick)


@numba.njit(cache=True)
def _open_inside(st, om, op, s, q, tick, lmax):
    """A new best level one tick better on side ``s`` (the deepest level leaves if full)."""
    if st[_INB + s] >= lmax:
        _drop_tail(st, om, op, s, tick)
    _insert_level0(st, s)
    _add(st, om, op, s, 0, q, tick)




@numba.njit(cache=True)
def _limit_event(rng, p, st, om, op, f_bid, f_ask, fragile):
    """Limit-order activity at a level drawn from the level profile: add (a new order or, w.p.
    :data:`P_MODIFY_UP`, an 'M' growing one) with probability ``T_k / (T_k + size_k)``, times
    ``f_bid`` / ``f_ask`` at level 1; else cancel an order or, w.p. :data:`P_MODIFY_DOWN`, shrink
    it. Inner levels never empty; ``fragile``: a lone best order may be pulled (flicker) and the
    best level may empty (so the side shifts); otherwise the best level keeps an order."""
    tick = np.int64(p[_PTICK])
    lmax = np.int64(p[_PLMAX])
    x = rng.random()
    k = 0
    while k < 9 and x > p[_PLCUM + k]:
        k += 1
    s = 0 if rng.random() < 0.5 else 1
    n = st[_INB + s]
    if k >= n:  # thin side: the event opens a new tail level
        _add(st, om, op, s, min(n, lmax - 1), _order_size(rng), tick)
        return
    lv = s * _LS + k
    qo = _QID + lv * QMAX
    sz = st[_LSZ + lv]
    tgt = p[_PT0] if k == 0 else p[_PTD]
    p_add = tgt / (tgt + sz)
    if k == 0:
        p_add *= f_bid if s == 0 else f_ask
    p_add = min(max(p_add, 0.02), 0.98)
    m = st[_QN + lv]
    if m <= 1 and (0 < k < n - 1 or (k == 0 and not fragile)):
        p_add = 1.0  # inner levels never empty (no holes in the book)
    elif fragile and k == 0 and m == 1 and n > 1 and rng.random() < p[_PFLICK]:
        p_add = 0.0  # a lone best order (typically just placed) is pulled: flicker
    if rng.random() < p_add:
        q = _order_size(rng)
        if m > 0 and rng.random() < p[_PMODUP]:
            j = np.int64(rng.random() * m)
            _modify(st, om, op, s, k, j, st[_QD + qo + j] + q, tick)
        else:
            _add(st, om, op, s, k, q, tick)
    else:
        j = np.int64(rng.random() * m)
        osz = st[_QD + qo + j]
        if osz > 1 and rng.random() < p[_PMODDN]:
            new = osz - min(_order_size(rng), osz - 1)
            _modify(st, om, op, s, k, j, new, tick)
        else:
            _cancel(st, om, op, s, k, j, osz, tick)


@numba.njit(cache=True)
def _trade_size(rng):
    """Size of a marketable order, contracts: 1 w.p. 0.6, else 1 + Geometric (mean 4.5), <= 200."""
    if rng.random() < 0.6:
        return np.int64(1)
    return np.int64(min(1 + _geometric(rng, 1.0 / 4.5), 200))


@numba.njit(cache=True)
def _unlock(st, om, op, tick):
    """A locked book lasts one event: the locking order is cancelled."""
    s = st[_ILOCK] - 1
    _cancel(st, om, op, s, 0, 0, st[_QD + _QID + s * _LS * QMAX], tick)
    st[_ILOCK] = 0


@numba.njit(cache=True)
def _lock(rng, st, om, op, tick, lmax):
    """An order at the opposite best (a locked book for one event)."""
    s = 0 if rng.random() < 0.5 else 1
    _open_inside(st, om, op, s, _order_size(rng), tick, lmax)
    st[_ILOCK] = s + 1


@numba.njit(cache=True)
def _step(rng, p, ref, ref_t0, st, fst, om, op):
    """One event of the book model (see :mod:`alphafeat.synth`). Returns an event code:
    0 liquidity, 1 inside-spread level, 2 trade, 3 lock, 4 unlock, 5 re-quote, 6 mid move."""
    if p[_PMODE] != 0.0:
        return _step_lead(rng, p, st, fst, om, op)
    return _step_follow(rng, p, ref, ref_t0, st, fst, om, op)


@numba.njit(cache=True)
def _ref_gap(p, ref, ref_t0, st):
    """(reference mid - mid) / 4 ticks, clipped to [-1, 1]; ``ref`` on a 1 s grid from ``ref_t0``."""
    gi = (st[_ET] - ref_t0) // 1_000_000_000
    gi = min(max(gi, 0), ref.shape[0] - 1)
    return min(max((ref[gi] - 0.5 * (st[_IA] + st[_IB])) / 4.0, -1.0), 1.0)


@numba.njit(cache=True)
def _step_follow(rng, p, ref, ref_t0, st, fst, om, op):
    """One event of a non-leading instrument (a deferred outright or a calendar spread):
    queue-reactive, pulled towards its reference mid ``ref`` (1 s grid from ``ref_t0``)."""
    tick = np.int64(p[_PTICK])
    lmax = np.int64(p[_PLMAX])
    b = st[_IB]
    a = st[_IA]
    fst[_FFAST] *= p[_PDECAY]
    l0b = st[_LSZ] if st[_INB] > 0 else 0
    l0a = st[_LSZ + _LS] if st[_INA] > 0 else 0
    imb = (l0b - l0a) / max(1, l0b + l0a)
    sig = p[_PWI] * imb + p[_PWF] * math.tanh(fst[_FFAST] / p[_PF0])
    gap = _ref_gap(p, ref, ref_t0, st) if p[_PWR] != 0.0 else 0.0
    sig = min(max(sig + p[_PWR] * gap, -1.0), 1.0)
    u = 0.5 + 0.5 * p[_PKAPPA] * sig
    code = 0
    if st[_ILOCK] != 0:
        _unlock(st, om, op, tick)
        code = 4
    elif p[_PFOLLOW] > 0.0 and abs(gap) * 4.0 > p[_PFOLLOW] and st[_INB] > 1 and st[_INA] > 1:
        # re-quote of a non-leading outright whose fair value moved away from its book: a level
        # opens inside a wide spread on the side the fair value moved to, else the stale best
        # level of the other side is pulled; repeated (at most 16 ticks) until the mid is within
        # the threshold of the fair value, so a thin contract catches up in one event
        up = gap > 0.0
        for _ in range(16):
            a = st[_IA]
            b = st[_IB]
            if abs(_ref_gap(p, ref, ref_t0, st)) * 4.0 <= p[_PFOLLOW] or st[_INB] < 2 or st[_INA] < 2:
                break
            if a - b > 1:
                _open_inside(st, om, op, 0 if up else 1, _order_size(rng), tick, lmax)
            else:
                s = 1 if up else 0
                lv = s * _LS
                qo = _QID + lv * QMAX
                while st[_INB + s] > 1 and (st[_IA] == a if up else st[_IB] == b):
                    m = st[_QN + lv]
                    _cancel(st, om, op, s, 0, m - 1, st[_QD + qo + m - 1], tick)
            _replenish(rng, p, st, om, op, tick)
        code = 5
    elif a - b > 1 and rng.random() < p[_PFILL]:
        s = 0 if rng.random() < u else 1
        _open_inside(st, om, op, s, _order_size(rng), tick, lmax)
        code = 1
    elif rng.random() < p[_PTRADE]:
        buy = rng.random() < u
        s = 1 if buy else 0
        if rng.random() < p[_PSW0] + p[_PSW1] * abs(gap):
            qty = st[_LSZ + s * _LS]  # clears the best level
        else:
            qty = _trade_size(rng)
        qty = _trade(st, om, op, buy, qty, tick)
        if qty > 0:
            fst[_FFAST] += qty if buy else -qty
            code = 2
        else:
            _add(st, om, op, s, 0, _order_size(rng), tick)
    elif a - b == 1 and rng.random() < p[_PLOCK]:
        _lock(rng, st, om, op, tick, lmax)
        code = 3
    else:
        _limit_event(rng, p, st, om, op, 2.0 * u, 2.0 * (1.0 - u), True)
    if code != 3 and code != 4:
        _replenish(rng, p, st, om, op, tick)
    return code


@numba.njit(cache=True)
def _meta_sign(rng, p, st):
    """Sign (+1 buy, -1 sell) of a marketable order that does not move the mid: w.p.
    ``p[_PMETAQ]`` the sign of the running metaorder (lengths Pareto with tail exponent
    ``p[_PMETAA]``, so trade signs are long-memory: Lillo & Farmer 2004), else a fair coin."""
    if st[_IMLEFT] <= 0:
        st[_IMSIGN] = 1 if rng.random() < 0.5 else -1
        st[_IMLEFT] = np.int64(min((1.0 - rng.random()) ** (-1.0 / p[_PMETAA]), META_MAX))
    if rng.random() < p[_PMETAQ]:
        st[_IMLEFT] -= 1
        return st[_IMSIGN]
    return 1 if rng.random() < 0.5 else -1


@numba.njit(cache=True)
def _deplete(rng, p, st, fst, om, op, s):
    """The best level of side ``s`` goes: its orders are cancelled from the back of the queue
    but the first, which a marketable order fills (w.p. ``p[_PMOVETR]``, aggressor against
    ``s``) or its owner cancels. The side shifts to its next level."""
    tick = np.int64(p[_PTICK])
    if st[_INB + s] < 2:
        _new_level(rng, st, om, op, s, st[_INB + s], p[_PTD], tick)
    lv = s * _LS
    qo = _QID + lv * QMAX
    while st[_QN + lv] > 1:
        m = st[_QN + lv]
        _cancel(st, om, op, s, 0, m - 1, st[_QD + qo + m - 1], tick)
    q = st[_QD + qo]
    if rng.random() < p[_PMOVETR]:
        buy = s == 1
        q = _trade(st, om, op, buy, q, tick)
        fst[_FFLOW] += q if buy else -q
    else:
        _cancel(st, om, op, s, 0, 0, q, tick)


@numba.njit(cache=True)
def _planted(p, st, flow):
    """The planted signal ``s_B I + s_H tanh(F / H0)`` of the leader's next mid move without
    the bridge (I: level-1 queue imbalance of the book ``st``, F: the decayed signed flow
    ``flow``); the up-move probability is ``1/2 + 1/2 clip(signal + bridge, -1, 1)``."""
    l0b = st[_LSZ] if st[_INB] > 0 else 0
    l0a = st[_LSZ + _LS] if st[_INA] > 0 else 0
    imb = (l0b - l0a) / max(1, l0b + l0a)
    return p[_PSB] * imb + p[_PSH] * math.tanh(flow / p[_PH0])


@numba.njit(cache=True)
def _step_lead(rng, p, st, fst, om, op):
    """One event of the leading outright (see :mod:`alphafeat.synth`): its mid moves only in
    move events (probability ``p[_PMOVE]``), up with probability ``u`` = 1/2 plus the planted
    signal and the bridge's drift; all other events leave both best prices alone."""
    tick = np.int64(p[_PTICK])
    lmax = np.int64(p[_PLMAX])
    b = st[_IB]
    a = st[_IA]
    fst[_FFLOW] *= p[_PHDECAY]
    sig = _planted(p, st, fst[_FFLOW])
    r = fst[_FREM]
    if r >= 1.0:  # bridge: the expected move per mid move that reaches the close's target
        sig += (fst[_FTGT] - 0.5 * (a + b)) / max(1.0, p[_PMOVE] * r)
        fst[_FREM] = r - 1.0
    u = 0.5 + 0.5 * min(max(sig, -1.0), 1.0)
    code = 0
    if st[_ILOCK] != 0:
        _unlock(st, om, op, tick)
        code = 4
    elif a - b > 1 and rng.random() < fst[_FFILL]:
        _open_inside(st, om, op, 0 if rng.random() < u else 1, _order_size(rng), tick, lmax)
        code = 1
    elif a - b == 1 and rng.random() < p[_PMOVE] * fst[_FVOL]:
        up = rng.random() < u
        n_moves = 1
        if rng.random() < p[_PJUMP]:
            n_moves += _geometric(rng, 1.0 / 3.0)
        for j in range(n_moves):
            _deplete(rng, p, st, fst, om, op, 1 if up else 0)
            if j < n_moves - 1 or rng.random() >= fst[_FWIDEN]:
                _open_inside(st, om, op, 0 if up else 1, _order_size(rng), tick, lmax)
        code = 6
    elif rng.random() < p[_PTRADE]:
        buy = _meta_sign(rng, p, st) > 0
        s = 1 if buy else 0
        qty = min(_trade_size(rng), st[_LSZ + s * _LS] - 1)  # never the whole best level
        if qty > 0:
            qty = _trade(st, om, op, buy, qty, tick)
            fst[_FFLOW] += qty if buy else -qty
            code = 2
        else:
            _add(st, om, op, s, 0, _order_size(rng), tick)
    elif a - b == 1 and rng.random() < p[_PLOCK]:
        _lock(rng, st, om, op, tick, lmax)
        code = 3
    else:
        _limit_event(rng, p, st, om, op, 1.0, 1.0, False)
    if code != 3 and code != 4:
        _replenish(rng, p, st, om, op, tick)
    return code


@numba.njit(cache=True)
def _lead_drift(p, st, fst):
    """Expected mid change (ticks) of the leader's next event given its state before it, no
    bridge: what :func:`_step_lead` draws, averaged over its random choices. NaN on a locked
    book (the next event unlocks it: a deterministic move, taken as realised on a path's first
    step; later on a path it undoes a lock of random side, mean 0). At a two-tick or
    wider spread an order opens inside it w.p. ``fill`` on the bid w.p. ``u`` (+1/2 tick) else on
    the ask (-1/2); at one tick the mid moves w.p. ``p_move x vol``, up w.p. ``u``, over
    ``1 + Geometric(1/3)`` ticks w.p. ``P_JUMP`` (mean ``1 + 3 P_JUMP`` ticks), the last tick
    only half w.p. ``widen`` (a two-tick spread, closed by a later fill); locks are symmetric
    (mean 0); nothing else moves the mid."""
    if st[_ILOCK] != 0:
        return np.nan
    sig = _planted(p, st, fst[_FFLOW] * p[_PHDECAY])
    e = min(max(sig, -1.0), 1.0)  # 2u - 1
    gap = st[_IA] - st[_IB]
    if gap > 1:
        return fst[_FFILL] * 0.5 * e
    if gap == 1:
        return p[_PMOVE] * fst[_FVOL] * e * (1.0 + 3.0 * p[_PJUMP] - 0.5 * fst[_FWIDEN])
    return 0.0


@numba.njit(cache=True)
def _drift_paths(rng, p, st0, fst0, st, fst, horizons, n_paths, out, w, dm, dp, acc):
    """Monte-Carlo continuations of the leader's state ``st0``, ``fst0`` (after an event) under
    the true model without the bridge, over ``horizons`` (H events, increasing).

    On path r, ``S_h`` = the sum of :func:`_lead_drift` over the next ``horizons[h]`` events
    (expected steps, not realised ones: Rao-Blackwell; the first is exact and the same on every
    path) and ``Z_h`` = the sum of (realised - expected) steps, a control variate of mean 0 (a
    realised move is followed by the queue imbalance it leaves, which pulls the expected steps
    after it back). ``out`` (float64 (H, 2)) receives the paths' mean S and mean Z; ``w``
    (float64 (2H, 2H)) accumulates the paths' sums of products of (S, Z) about their means
    (pooled over events by :func:`drift_estimate`). The continuation keeps the time of day's
    fill, widening and volatility of the event; nothing is written (``dm``, ``dp``: one-record
    scratch buffers; ``acc``: float64 (n_paths, 2H))."""
    nh = horizons.shape[0]
    kmax = horizons[nh - 1]
    ref_own = np.zeros(1)
    ref = _borrow(ref_own)
    for r in range(n_paths):
        st[:] = st0
        fst[:] = fst0
        for x in range(_ET, _CMBP + 1):  # no event context, nothing written
            st[x] = 0
        fst[_FREM] = 0.0  # no bridge: the close the mid is bridged to is not known
        s_sum = 0.0
        z_sum = 0.0
        h = 0
        for j in range(1, kmax + 1):
            c = _lead_drift(p, st, fst)
            m0 = st[_IB] + st[_IA]
            _step(rng, p, ref, 0, st, fst, dm, dp)
            d = 0.5 * (st[_IB] + st[_IA] - m0)
            if np.isnan(c):  # a locked book: its unlock is deterministic from the first state;
                # later in the path it undoes a lock of random side (mean 0): left in Z
                c = d if j == 1 else 0.0
            s_sum += c
            z_sum += d - c
            while h < nh and horizons[h] == j:
                acc[r, h] = s_sum
                acc[r, nh + h] = z_sum
                h += 1
    m = 2 * nh
    for a in range(m):
        mean = 0.0
        for r in range(n_paths):
            mean += acc[r, a]
        mean /= n_paths
        if a < nh:
            out[a, 0] = mean
        else:
            out[a - nh, 1] = mean
        for r in range(n_paths):
            acc[r, a] -= mean
    for a in range(m):
        for b in range(a, m):
            t = 0.0
            for r in range(n_paths):
                t += acc[r, a] * acc[r, b]
            w[a, b] += t
            if b != a:
                w[b, a] += t
    ref_own[0] = 0.0  # the owner stays alive to here


def drift_estimate(means: np.ndarray, w: np.ndarray, n_paths: int) -> tuple[np.ndarray, np.ndarray]:
    """The expected mid change per event and horizon from :func:`_drift_paths`' statistics.

    ``means`` float64 (n, H, 2): the paths' mean S and Z per event and horizon; ``w`` float64
    (2H, 2H): the within-event sums of products of (S, Z), pooled over the n events. With the
    per-path covariance ``C = w / (n (M - 1))`` (M = ``n_paths``):

    1. control variate per horizon: ``v_h = mean S_h - beta_h mean Z_h``, ``beta_h = C_SZ / C_ZZ``
       (unbiased for any beta: E[Z] = 0); its Monte-Carlo noise covariance ``N = A C A' / M``;
    2. the noise left would flatten a regression of the realised change on ``v`` (errors in
       variables), so ``v`` is replaced by the best linear predictor of the true drift given all
       horizons' estimates, ``E[x | v] = v Sigma^-1 (Sigma - N)`` (``Sigma = v'v / n``, the model's
       mean being 0; the true drifts' covariance ``Sigma - N`` with negative eigenvalues
       clipped): the long horizons borrow the short ones' precision, and a regression of the
       realised change on it has slope 1. Only the session's states enter, never its prices.

    Returns (drift float64 (n, H) ticks, reliability float64 (H,): the share of each horizon's
    true-drift variance the estimate carries)."""
    n, nh, _ = means.shape
    if n == 0 or n_paths < 2:
        return means[:, :, 0].copy(), np.ones(nh)
    c = w / (n * (n_paths - 1))
    idx = np.arange(nh)
    czz = c[nh + idx, nh + idx]
    beta = np.where(czz > 0, c[idx, nh + idx] / np.where(czz > 0, czz, 1.0), 0.0)
    a = np.zeros((nh, 2 * nh))
    a[idx, idx] = 1.0
    a[idx, nh + idx] = -beta
    v = means[:, :, 0] - beta * means[:, :, 1]
    noise = a @ c @ a.T / n_paths
    sigma = v.T @ v / n
    lam, vec = np.linalg.eigh(sigma - noise)
    sx = (vec * np.maximum(lam, 0.0)) @ vec.T
    coef = np.linalg.pinv(sigma, rcond=1e-10, hermitian=True) @ sx
    drift = v @ coef
    expl = np.diag(sx @ coef)
    true = np.diag(sx)
    rel = np.where(true > 0, expl / np.where(true > 0, true, 1.0), 1.0)
    return drift, np.clip(rel, 0.0, 1.0)


@numba.njit(cache=True)
def _mark_last(st, c0, c1, om, op):
    """Set F_LAST on the last MBO and MBP-10 record written since counts ``c0``, ``c1``."""
    if st[_CMBO] > c0 and st[_WMBO] != 0:
        om[st[_CMBO] - 1, 4] |= np.int64(F_LAST) << 32
    if st[_CMBP] > c1:
        r = st[_CMBP] - 1
        op[r, 3] |= np.int64(F_LAST) << 48
        st[_CLAST] += 1
        if op[r, 42] == _UNDEF or op[r, 43] == _UNDEF:  # bid_px_09, ask_px_09
            st[_CTHIN] += 1


@numba.njit(cache=True)
def _simulate(
    rng_own,
    times,
    t_open,
    b0,
    lat0,
    lat1,
    p,
    seg_end,
    seg_fw,
    ref,
    ref_t0,
    seq0,
    oid0,
    cross,
    nlev0,
    hdr_mbo,
    hdr_mbp,
    om,
    op,
    sample_at,
    s_st,
    s_fst,
    stats,
    lat_out,
    pup_out,
    rc_out,
    rng_drift_own,
    drift_h,
    drift_n,
    drift_out,
    drift_w,
):
    """Run one instrument's session: opening snapshot, optional crossed pre-open and its
    uncrossing trade, then one :func:`_step` per event time.

    Writes whole MBO records as int64 words into ``om`` (rows of 7) and MBP-10 records into
    ``op`` (rows of 46); ``hdr_mbo`` / ``hdr_mbp`` are the records' first words (length, rtype,
    publisher and instrument id); with no rows in ``om`` MBO records are only counted.
    ``cross`` = -1 (no crossed pre-open), 0 (bids cross the ask) or 1 (asks cross the bid).
    The book opens with best bid ``b0`` (ticks); the leading outright's mid is bridged from
    about ``lat0`` to ``lat1`` (ticks) over its events. ``seg_end`` (int64 ns, increasing) and
    ``seg_fw`` (float64, (n, 3)) give the fill and widening probabilities and the volatility
    multiplier of the leader's move probability in the time segments
    (an event at or past the last end keeps the last segment's).
    States at the event indices ``sample_at`` (sorted) are copied into ``s_st``, ``s_fst`` for
    the Monte-Carlo AUC ceiling. ``stats`` (int64[8]) receives:
    events, locks, bad-ts events, trade events, MBP-10 rows with F_LAST, those of them with an
    UNDEF level 10 on either side (thin book), volume and number of the MBP-10 'T' records.
    ``lat_out`` (empty, or one per event) receives the mid (ticks) after each event, and then
    ``pup_out`` the planted up-move probability of the next mid move known after the event
    (:func:`_planted` on the book after it, the flow decayed once more as the next event does;
    no bridge) and ``rc_out`` the event's ts_recv (ns). With ``drift_h`` (int64 horizons in
    events, increasing; empty: skipped) ``drift_out[e]`` (H, 2) and ``drift_w`` (2H, 2H) receive
    the Monte-Carlo statistics of the mid change (ticks) over the ``drift_h[h]`` events after
    event ``e``, no bridge (:func:`_drift_paths`, ``drift_n`` paths drawn from
    ``rng_drift_own``, so the records do not change; :func:`drift_estimate` turns them into the
    expected change).
    Returns (n_mbo, n_mbp), or (-1, -1) when a buffer is too small.
    """
    tick = np.int64(p[_PTICK])
    lmax = np.int64(p[_PLMAX])
    capm = om.shape[0]
    capp = op.shape[0]
    st_own = np.zeros(_NST, np.int64)
    fst_own = np.zeros(_NFST, np.float64)
    st = _borrow(st_own)
    fst = _borrow(fst_own)
    om = _borrow(om)
    op = _borrow(op)
    p = _borrow(p)
    ref = _borrow(ref)
    rng = _borrow(rng_own)
    rng_d = _borrow(rng_drift_own)
    d_st_own = np.zeros(_NST, np.int64)
    d_fst_own = np.zeros(_NFST)
    d_m_own = np.zeros((1, MBO_W), np.int64)
    d_p_own = np.zeros((1, MBP_W), np.int64)
    d_acc_own = np.zeros((max(drift_n, 1), 2 * drift_h.shape[0]))
    d_st, d_fst, d_m, d_p = _borrow(d_st_own), _borrow(d_fst_own), _borrow(d_m_own), _borrow(d_p_own)
    d_acc = _borrow(d_acc_own)
    keep_drift = drift_h.shape[0] > 0
    st[_IB] = b0
    st[_IA] = b0 + 1
    st[_IOID] = oid0
    st[_HMBO] = hdr_mbo
    st[_HMBP] = hdr_mbp
    st[_WMBO] = 1 if capm > 0 else 0
    fst[_FTGT] = lat1
    fst[_FREM] = times.shape[0]
    # opening snapshot: every resting order, flags F_SNAPSHOT | F_BAD_TS_RECV as Databento's
    st[_ET] = t_open
    st[_ERC] = t_open
    st[_ESEQ] = seq0
    st[_EFLAGS] = 0x28
    st[_EWRITE] = 1
    for k in range(nlev0):
        for s in range(2):
            _new_level(rng, st, om, op, s, k, p[_PT0] if k == 0 else p[_PTD], tick)
    _mark_last(st, 0, 0, om, op)
    st[_EFLAGS] = 0
    if cross >= 0:  # crossed pre-open: two crossing orders, then the uncrossing trade
        s = cross
        q0 = _QID + s * _LS * QMAX
        for i in range(3):
            st[_ET] = t_open + (5 + 10 * i) * 1_000_000_000
            st[_ERC] = st[_ET] + 90_000
            st[_ESEQ] = seq0 + 1 + i
            c0 = st[_CMBO]
            c1 = st[_CMBP]
            if i < 2:
                _open_inside(st, om, op, s, 1 + np.int64(3 * rng.random()), tick, lmax)
            else:
                q = st[_LSZ + s * _LS] + st[_LSZ + s * _LS + 1]
                _trade(st, om, op, s == 0, q, tick)
                for _ in range(2):  # the two crossing orders (one per level) are filled
                    _put_mbo(
                        om,
                        st,
                        st[q0],
                        _lvl_px(st, s, 0, tick),
                        st[_QD + q0],
                        np.uint8(70),
                        np.uint8(66) if s == 0 else np.uint8(65),
                    )
                    _cancel(st, om, op, s, 0, 0, st[_QD + q0], tick)
                _replenish(rng, p, st, om, op, tick)
            _mark_last(st, c0, c1, om, op)
    last_rc = st[_ERC]
    si = 0
    ns = sample_at.shape[0]
    keep_lat = lat_out.shape[0] > 0
    gi = 0
    ng = seg_end.shape[0]
    for e in range(times.shape[0]):
        if (st[_WMBO] != 0 and st[_CMBO] + _RESERVE > capm) or st[_CMBP] + _RESERVE > capp:
            return -1, -1
        while si < ns and sample_at[si] == e:
            s_st[si, :] = st
            s_fst[si, :] = fst
            si += 1
        t = times[e]
        while gi < ng - 1 and t >= seg_end[gi]:
            gi += 1
        fst[_FFILL] = seg_fw[gi, 0]
        fst[_FWIDEN] = seg_fw[gi, 1]
        fst[_FVOL] = seg_fw[gi, 2]
        lat = np.int64(80_000 + min(rng.standard_exponential() * 25_000.0, 5_000_000.0))
        rc = max(t + lat, last_rc)
        last_rc = rc
        st[_ET] = t
        st[_ERC] = rc
        st[_ESEQ] = seq0 + 4 + e
        st[_ETID] = np.int64(15_000 + 15_000.0 * rng.random())
        st[_EFLAGS] = 0x08 if rng.random() < p[_PBADTS] else 0
        c0 = st[_CMBO]
        c1 = st[_CMBP]
        code = _step(rng, p, ref, ref_t0, st, fst, om, op)
        if keep_lat:
            lat_out[e] = 0.5 * (st[_IB] + st[_IA])
            pup_out[e] = 0.5 + 0.5 * min(max(_planted(p, st, fst[_FFLOW] * p[_PHDECAY]), -1.0), 1.0)
            rc_out[e] = rc
        if keep_drift:
            _drift_paths(rng_d, p, st, fst, d_st, d_fst, drift_h, drift_n, drift_out[e], drift_w, d_m, d_p, d_acc)
        _mark_last(st, c0, c1, om, op)
        stats[0] += 1
        if code == 3:
            stats[1] += 1
        if st[_EFLAGS] != 0:
            stats[2] += 1
        if code == 2:
            stats[3] += 1
    stats[4] = st[_CLAST]
    stats[5] = st[_CTHIN]
    stats[6] = st[_CTVOL]
    stats[7] = st[_CTN]
    # the local owners stay alive to here (the views do not hold them; the caller holds the
    # arguments)
    fst_own[_FFLOW] = fst[_FFLOW]
    d_st_own[0] = d_fst_own[0] + d_m_own[0, 0] + d_p_own[0, 0] + d_acc_own[0, 0]
    return st_own[_CMBO], st_own[_CMBP]




# --------------------------------------------------------------------------------------------
# Session assembly
# --------------------------------------------------------------------------------------------


def _rng(seed: int, day: datetime.date, iid: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, day.toordinal(), iid, stream]))


def _params(c: Contract, signal: Signal, follow: float = 0.0, p_move: float = 0.0) -> np.ndarray:
    """Parameter vector of the book model for contract ``c`` (indices ``_P*``); ``follow`` > 0:
    re-quote threshold (ticks) of a non-leading outright (:data:`FOLLOW_TICKS`); ``p_move`` > 0:
    the leading outright (mid-move probability per event)."""
    p = np.zeros(_NPARAMS)
    p[_PKAPPA] = OFI_STRENGTH
    damp = min(signal.strength, 1.0)
    p[_PWI], p[_PWF], p[_PWR] = W_IMB * damp, W_FLOW * damp, W_REF
    p[_PF0], p[_PDECAY] = 10.0, 0.95
    p[_PTRADE] = P_TRADE_SPREAD if c.is_spread else P_TRADE
    p[_PFILL] = P_FILL
    p[_PT0], p[_PTD] = T_LEVEL1, T_DEEP
    p[_PSW1] = 0.05
    p[_PLOCK] = P_LOCK
    p[_PBADTS] = P_BAD_TS
    p[_PREPL] = P_REPLENISH
    p[_PLMAX] = LMAX_SPREAD if c.is_spread else LMAX_OUTRIGHT
    p[_PNMIN] = LMAX_SPREAD if c.is_spread else 10
    p[_PTICK] = c.tick
    p[_PMODUP], p[_PMODDN] = P_MODIFY_UP, P_MODIFY_DOWN
    p[_PL0] = P_LEVEL0
    p[_PFLICK] = P_FLICKER
    p[_PSW0] = P_SWEEP
    p[_PFOLLOW] = follow
    p[_PMODE] = 1.0 if p_move > 0 else 0.0
    p[_PMOVE] = p_move
    p[_PSB], p[_PSH] = signal.book, signal.history
    p[_PH0], p[_PHDECAY] = HISTORY_SCALE, math.exp(-1.0 / HISTORY_EVENTS)
    p[_PMETAQ], p[_PMETAA] = META_SHARE, META_ALPHA
    p[_PJUMP], p[_PMOVETR] = P_JUMP, P_MOVE_TRADE
    # level k of a limit event: P_LEVEL0 at k = 0, then geometric (ratio 0.8) over k = 1..9
    acc = P_LEVEL0
    for k in range(9):
        p[_PLCUM + k] = acc
        acc += (1.0 - P_LEVEL0) * 0.2 * 0.8**k / (1.0 - 0.8**9)
    return p


def activity_segments(day: datetime.date, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One-minute segments of session ``day`` shared by all its instruments: start, end (int64
    ns), activity multiplier (the time-of-day profile times the stochastic activity
    ``exp(x - VOL_SD^2 / 2)``, x an OU process of 1-minute steps, seeded by ``(seed, day)``) and
    the profile's widening factor (float64)."""
    starts, ends, mults, widen = _profile_segments(day)
    minute = 60_000_000_000
    t0, t1 = session_bounds(day)
    grid = np.arange(t0, t1, minute, dtype=np.int64)
    x = _ou(_rng(seed, day, 0, 4), grid.shape[0], VOL_SD, VOL_TAU_MIN)
    seg = np.clip(np.searchsorted(starts, grid, side="right") - 1, 0, starts.shape[0] - 1)
    inside = (grid >= starts[seg]) & (grid < ends[seg])
    m = np.where(inside, mults[seg], 0.0) * np.exp(x - 0.5 * VOL_SD**2)
    return grid, np.minimum(grid + minute, t1), m, np.where(inside, widen[seg], 1.0)


def _ou(rng: np.random.Generator, n: int, sd: float, tau: float) -> np.ndarray:
    """A stationary Ornstein-Uhlenbeck path of ``n`` unit steps: s.d. ``sd``, time constant
    ``tau`` steps."""
    phi = math.exp(-1.0 / tau)
    z = rng.standard_normal(n)
    x = np.empty(n)
    acc = sd * z[0] if n else 0.0
    for i in range(n):
        if i:
            acc = phi * acc + sd * math.sqrt(1.0 - phi * phi) * z[i]
        x[i] = acc
    return x


def volatility_multipliers(day: datetime.date, seed: int, n: int) -> np.ndarray:
    """Per one-minute segment of session ``day``, the multiplier ``exp(y - SV_SD^2 / 2)`` of the
    leading outright's move probability (y: :func:`_ou` with :data:`SV_SD`, :data:`SV_TAU_MIN`,
    seeded by ``(seed, day)``)."""
    return np.exp(_ou(_rng(seed, day, 0, 5), n, SV_SD, SV_TAU_MIN) - 0.5 * SV_SD**2)


@dataclass
class _Market:
    """What every instrument of a session shares: its bounds (ns), the one-minute activity
    segments (:func:`activity_segments`), the leader's volatility multiplier per segment
    (:func:`volatility_multipliers`) and the planted signal."""

    t0: int
    t1: int
    seg: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    vol: np.ndarray
    signal: Signal
    # the leader's expected mid change over these horizons (events) after each event, and the
    # Monte-Carlo paths behind it (none: not computed)
    drift: tuple[int, ...] = ()
    drift_paths: int = 0


def _simulate_instrument(
    c: Contract,
    day: datetime.date,
    seed: int,
    rate: float,
    fair: float,
    ref: np.ndarray | None,
    mk: _Market,
    n_samples: int = 0,
    bufs: Buffers | None = None,
    slot: int = 0,
    write_mbo: bool = True,
    close: float = 0.0,
    vol: float = 0.0,
    follow: bool = False,
) -> InstrumentRun:
    """MBO and MBP-10 records (time order) of one instrument in one session.

    ``fair`` is the fair price at the open (index points). ``ref`` is the reference mid
    (ticks, 1 s grid from the session's start); None for the leading outright, whose mid is a
    walk of one-tick moves bridged from ``fair`` to ``close`` (index points): each event moves
    it w.p. ``min(P_MOVE_MAX, (vol * fair / tick)^2 / events)`` (``vol``: the session's log
    s.d.), so the bridge's spread matches the free walk's and the mid stays a martingale for an
    observer who does not know the close. ``follow``: a non-leading outright whose ``ref`` is its
    fair value (the leader's mid times the carry ratio): its book re-quotes when that is over
    :data:`FOLLOW_TICKS` from its mid. ``rate`` is the book-event rate (events/s) at activity
    multiplier 1. With ``bufs`` the records live in that pool's buffers of ``slot`` (valid until
    the slot is served again). Without ``write_mbo`` the MBO records are only counted.
    """
    t0, t1 = mk.t0, mk.t1
    starts, ends, mults, widen = mk.seg
    stop = min(t1 - 10_000_000, c.expiration_ns)
    ends = np.minimum(ends, stop)
    starts = np.maximum(starts, t0 + OPEN_DELAY_NS)  # continuous trading after the opening
    times = _event_times(
        _rng(seed, day, c.instrument_id, 1),
        starts,
        ends,
        mults * rate,
        BURST_MEAN,
        BURST_P_SHORT,
        BURST_SHORT_NS,
        BURST_LONG_NS,
    )
    tick = c.tick
    lat0 = fair * 1e9 / tick
    lat1 = close * 1e9 / tick
    b0 = int(math.floor(lat0 - 0.5))  # the opening mid b0 + 0.5 within half a tick of fair
    n = times.shape[0]
    lat_ev = np.zeros(0)
    pup_ev = np.zeros(0)
    rc_ev = np.zeros(0, np.int64)
    lead = ref is None
    p_move = 0.0
    drift_h = np.zeros(0, np.int64)
    drift_ev = np.zeros((0, 0, 2))
    drift_w = np.zeros((0, 0))
    if lead:
        p_move = min(P_MOVE_MAX, (vol * abs(lat0)) ** 2 / max(n, 1))
        ref = np.zeros(1)
        lat_ev = np.empty(n)
        pup_ev = np.empty(n)
        rc_ev = np.empty(n, np.int64)
        if mk.drift:
            drift_h = np.array(sorted(mk.drift), np.int64)
            drift_ev = np.empty((n, drift_h.shape[0], 2))
    p = _params(c, mk.signal, FOLLOW_TICKS if follow else 0.0, p_move)
    seg_fw = np.stack(
        [np.minimum(FILL_MAX, FILL_PER_ACTIVITY * mults), np.minimum(0.9, P_WIDEN * widen), mk.vol], axis=1
    )
    lmax = int(p[_PLMAX])
    rng_x = _rng(seed, day, c.instrument_id, 3)
    cross = -1
    if not c.is_spread and rng_x.random() < P_CROSSED_PREOPEN:
        cross = int(rng_x.random() < 0.5)
    seq0 = 1_000_000 + zlib.crc32(f"{c.symbol}{day.isoformat()}".encode()) % 50_000_000
    oid0 = 6_400_000_000_000 + (c.instrument_id % 10_000) * 100_000_000 + (day.toordinal() % 97) * 1_000_000
    sample_at = (
        np.unique(np.linspace(0, max(n - 1, 0), n_samples).astype(np.int64)) if n_samples else np.zeros(0, np.int64)
    )
    ns = sample_at.shape[0]
    s_st = np.zeros((ns, _NST), np.int64)
    s_fst = np.zeros((ns, _NFST))
    hdr_mbo = (MBO_SIZE // 4) | (0xA0 << 8) | (PUBLISHER_ID << 16) | (c.instrument_id << 32)
    hdr_mbp = (MBP_SIZE // 4) | (0x0A << 8) | (PUBLISHER_ID << 16) | (c.instrument_id << 32)
    # records per event: about 1.5 MBP-10 (1.8 MBO) for the leader, 1.6 for spreads and over 4
    # for a following outright (its re-quotes); a too small buffer reruns the simulation
    per_ev = 2.0 if lead else (6.0 if follow else 2.0)
    cap_m = int((per_ev + 0.4) * n) + 8 * _RESERVE if write_mbo else 0
    cap_p = int(per_ev * n) + 8 * _RESERVE
    while True:
        # the kernel writes every byte of every record (header included): no zeroing needed
        if bufs is None:
            mbo = np.empty(cap_m, MBO_DTYPE)
            mbp = np.empty(cap_p, MBP10_DTYPE)
        else:
            mbo = bufs.get(("mbo", slot), MBO_DTYPE, cap_m)
            mbp = bufs.get(("mbp", slot), MBP10_DTYPE, cap_p)
        stats = np.zeros(8, np.int64)
        if drift_h.shape[0]:
            drift_w = np.zeros((2 * drift_h.shape[0], 2 * drift_h.shape[0]))
        tk = time.perf_counter()
        nm, npp = _simulate(
            _rng(seed, day, c.instrument_id, 2),
            times,
            t0,
            b0,
            lat0,
            lat1,
            p,
            ends,
            seg_fw,
            ref,
            t0,
            seq0,
            oid0,
            cross,
            lmax,
            hdr_mbo,
            hdr_mbp,
            mbo.view(np.int64).reshape(cap_m, MBO_W),
            mbp.view(np.int64).reshape(cap_p, MBP_W),
            sample_at,
            s_st,
            s_fst,
            stats,
            lat_ev,
            pup_ev,
            rc_ev,
            _rng(seed, day, c.instrument_id, 6),
            drift_h,
            mk.drift_paths,
            drift_ev,
            drift_w,
        )
        logger.debug("%s %s: %d events, %d MBP-10 records in %.3f s", c.symbol, day, n, npp, time.perf_counter() - tk)
        if nm >= 0:
            break
        cap_m *= 2
        cap_p *= 2
    mbo = mbo[: nm if write_mbo else 0]
    mbp = mbp[:npp]
    saved = (s_st, s_fst) if ns else None
    latent = None
    if lead:  # the mid at the end of every 1 s step from t0
        grid = t0 + np.arange((t1 - t0) // 1_000_000_000 + 1, dtype=np.int64) * 1_000_000_000
        i = np.searchsorted(times, grid, side="right") - 1
        mid0 = b0 + 0.5
        latent = np.where(i >= 0, lat_ev[np.maximum(i, 0)] if n else mid0, mid0)
    planted = (rc_ev, pup_ev) if lead else None
    drift = rel = None
    if lead and drift_h.shape[0]:
        drift, rel = drift_estimate(drift_ev, drift_w, mk.drift_paths)
    return InstrumentRun(int(nm), mbo, mbp, stats, cross >= 0, saved, p, latent, planted, drift,
                         lat_ev if drift is not None else None, rel)


def _simulate_session(
    day: datetime.date,
    seed: int,
    scale: float,
    contracts: tuple[str, ...] | list[str] | None,
    n_samples: int = 0,
    bufs: Buffers | None = None,
    write_mbo: bool = True,
    signal: Signal = Signal(),  # noqa: B008 (frozen dataclass)
    drift: tuple[int, ...] = (),
    drift_paths: int = 0,
) -> Session:
    """Simulate every instrument of session ``day``. ``n_samples`` states of the leading outright
    are saved for the Monte-Carlo AUC ceiling; ``bufs``: a buffer pool for the records; without
    ``write_mbo`` MBO records are only counted; ``signal``: the planted predictability;
    ``drift`` (horizons in events) and ``drift_paths``: the leader's expected mid change after
    each event (:func:`_drift_paths`; ``InstrumentRun.drift``)."""
    t0, t1 = session_bounds(day)
    seg = activity_segments(day, seed)
    mk = _Market(t0, t1, seg, volatility_multipliers(day, seed, seg[0].shape[0]), signal, tuple(drift),
                 drift_paths if drift else 0)
    cons = contracts_for(day, contracts)
    s_open, s_close = _index_level(day, seed, scale)
    vol = _session_vol(scale, _level(day))
    outs = sorted((c for c in cons if not c.is_spread), key=lambda c: (-volume_share(c.symbol, day), c.expiration_ns))
    spreads = [c for c in cons if c.is_spread]
    runs: dict[str, InstrumentRun] = {}
    leader_grid: np.ndarray | None = None
    leader: Contract | None = None
    for c in outs:
        fair = _fair_price(c, day, s_open)
        rate = BASE_RATE * scale * volume_share(c.symbol, day)
        slot = len(runs)
        if leader is None:
            close = _fair_price(c, day, s_close)
            run = _simulate_instrument(c, day, seed, rate, fair, None, mk, n_samples, bufs, slot, write_mbo, close, vol)
            leader, leader_grid = c, run.latent
        else:
            assert leader_grid is not None
            # the leader's mid times the carry ratio (a constant over the session)
            ratio = fair / _fair_price(leader, day, s_open) * leader.tick / c.tick
            run = _simulate_instrument(c, day, seed, rate, fair, leader_grid * ratio, mk, 0, bufs, slot, write_mbo,
                                       follow=True)
        runs[c.symbol] = run
    for c in spreads:
        fair = _fair_price(c, day, s_open)
        rate = BASE_RATE * scale * _spread_share(c, day)
        ref = np.full(1, fair * 1e9 / c.tick)
        runs[c.symbol] = _simulate_instrument(c, day, seed, rate, fair, ref, mk, 0, bufs, len(runs), write_mbo)
    return Session(day, cons, runs, leader.symbol if leader else "", bufs)
