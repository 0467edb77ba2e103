"""numba kernels of the order-level (MBO) book simulation and the MBP-10 records derived from it:
the packed state's layout, the book operations, the leader's and the followers' steps and the
session loop :func:`simulate`.

They stay in one file: numba's cache checks only the source file of the function it compiles, so
a kernel calling another file's kernel (or reading its constants) would run stale machine code
after an edit of that file alone."""

from __future__ import annotations

import math

import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from alphafeat.synth.records import (
    F_LAST,
    MBO_W,
    MBP_W,
    UNDEF_PRICE,
)

# --------------------------------------------------------------------------------------------
# numba kernels: the order-level (MBO) book simulation and the MBP-10 records derived from it
# --------------------------------------------------------------------------------------------

#: Longest metaorder (trades): the power law holds up to it.
META_MAX = 2000.0


#: Internal price levels per side kept by the simulation for outrights (top 10 are visible in
#: MBP-10; levels 10-11 are real resting orders that become visible when the book shifts).
LMAX_OUTRIGHT = 12


#: Levels per side of the calendar spread's book (so its MBP-10 levels 5-9 are UNDEF).
LMAX_SPREAD = 5


#: Most orders resting at one price level (further adds grow the last order with an 'M').
QMAX = 64


#: Records reserved per event when checking buffer room.
RESERVE = 1024


# Packed int64 state ``st`` of one instrument's book: scalars, event context, record counters,
# then per side and level the order count, the level size and the FIFO queue (order ids and
# sizes). One array instead of many, because numba reference-counts every array argument of
# every call between the kernel's helpers (atomic increments that dominated the run time).
IB, IA, INB, INA, IOID, ILOCK, HMBO, HMBP = range(8)


# event context: ts_event, ts_recv, sequence, ts_in_delta, flags, write switch
ET, ERC, ESEQ, ETID, EFLAGS, EWRITE = 8, 9, 10, 11, 12, 13


# records written so far (MBO, MBP-10); MBP-10 rows with F_LAST, those of them with an UNDEF
# level 10 on either side (a thin book), the volume and the number of the MBP-10 'T' records
CMBO, CMBP, CLAST, CTHIN, CTVOL, CTN = 14, 15, 16, 17, 18, 19


# MBO records are written (else only counted); the running metaorder's sign and the trades
# left in it (leading outright)
WMBO, IMSIGN, IMLEFT = 20, 21, 22


#: Level stride per side in the packed state (>= LMAX_OUTRIGHT).
LS = 16


QN = 24  # orders at level k of side s: st[QN + s * LS + k]


LSZ = QN + 2 * LS  # contracts at level k of side s


QID = LSZ + 2 * LS  # id of order j at level k of side s: st[QID + (s * LS + k) * QMAX + j]


QD = 2 * LS * QMAX  # offset from an order's id to its size


NST = QID + 2 * QD


# float-state indices (float64 array ``fst``): the leader's slowly decaying signed flow (the
# history signal), its bridge target at the close (mid, ticks) and the events left to it, the
# fill and widening probabilities of the time of day, a follower's fast signed flow, the
# stochastic volatility multiplying the leader's move probability
FFLOW, FTGT, FREM, FFILL, FWIDEN, FFAST, FVOL = 0, 1, 2, 3, 4, 5, 6


NFST = 8


#: int64 words per MBO / MBP-10 record (the kernel writes whole records as words).
M32 = 0xFFFFFFFF


UNDEF = UNDEF_PRICE


# parameter-vector indices (float64 array ``params``), see :func:`_params`
(
    PKAPPA,
    PWI,
    PWF,
    PWR,
    PF0,
    PDECAY,
    PTRADE,
    PFILL,
    PT0,
    PTD,
    PMODE,
    PSW0,
    PSW1,
    PLOCK,
    PBADTS,
    PREPL,
    PLMAX,
    PNMIN,
    PTICK,
    PMODUP,
    PMODDN,
    PL0,
    PFLICK,
    PFOLLOW,
    PMOVE,
    PSB,
    PSH,
    PH0,
    PHDECAY,
    PMETAQ,
    PMETAA,
    PJUMP,
    PMOVETR,
) = range(33)


#: cumulative probabilities of the level of a limit event (levels 1..9 of 10), see :func:`_params`
PLCUM = 33


NPARAMS = PLCUM + 9


assert LMAX_OUTRIGHT <= LS and LMAX_SPREAD <= LS


@intrinsic
def borrow(typingctx, obj):
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
def geometric(rng, p):
    """Geometric(p) on {1, 2, ...} by inversion of one uniform."""
    return np.int64(1 + math.floor(math.log(1.0 - rng.random()) / math.log(1.0 - p)))


@numba.njit(cache=True)
def event_times(rng, seg_start, seg_end, seg_rate, mean_burst, p_short, short_ns, long_ns):
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
            m = geometric(rng, p_geo)
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
def put_mbo(om, st, oid, px, size, action, side):
    """Append one whole MBOMsg (7 little-endian int64 words) to ``om`` (or only count it)."""
    n = st[CMBO]
    st[CMBO] = n + 1
    if st[WMBO] == 0:
        return
    om[n, 0] = st[HMBO]
    om[n, 1] = st[ET]
    om[n, 2] = oid
    om[n, 3] = px
    # size u32 | flags u8 | channel_id u8 (0) | action u8 | side u8
    om[n, 4] = (size & M32) | (st[EFLAGS] << 32) | (np.int64(action) << 48) | (np.int64(side) << 56)
    om[n, 5] = st[ERC]
    om[n, 6] = (st[ETID] & M32) | (st[ESEQ] << 32)  # ts_in_delta i32 | sequence u32


@numba.njit(cache=True)
def _put_mbp(op, st, px, size, action, side, depth, tick):
    """Append one whole MBP10Msg (46 int64 words): the update and the current top-10 book."""
    n = st[CMBP]
    op[n, 0] = st[HMBP]
    op[n, 1] = st[ET]
    op[n, 2] = px
    # size u32 | action u8 | side u8 | flags u8 | depth u8
    op[n, 3] = (
        (size & M32)
        | (np.int64(action) << 32)
        | (np.int64(side) << 40)
        | (st[EFLAGS] << 48)
        | (np.int64(depth) << 56)
    )
    op[n, 4] = st[ERC]
    op[n, 5] = (st[ETID] & M32) | (st[ESEQ] << 32)
    undef = np.int64(UNDEF)
    b = st[IB]
    a = st[IA]
    nb = st[INB]
    na = st[INA]
    for k in range(10):
        w = 6 + 4 * k
        if k < nb:
            op[n, w] = (b - k) * tick
            bsz = st[LSZ + k]
            bct = st[QN + k]
        else:
            op[n, w] = undef
            bsz = np.int64(0)
            bct = np.int64(0)
        if k < na:
            op[n, w + 1] = (a + k) * tick
            asz = st[LSZ + LS + k]
            act = st[QN + LS + k]
        else:
            op[n, w + 1] = undef
            asz = np.int64(0)
            act = np.int64(0)
        op[n, w + 2] = (bsz & M32) | (asz << 32)  # bid_sz u32 | ask_sz u32
        op[n, w + 3] = (bct & M32) | (act << 32)  # bid_ct u32 | ask_ct u32
    st[CMBP] = n + 1


@numba.njit(cache=True)
def _emit(st, om, op, s, k, px, oid, q, action, tick):
    """Emit a book-changing MBO record and, when level ``k`` is in the top 10, its MBP-10
    record (the MBP-10 book is the state after the change)."""
    if st[EWRITE] == 0:
        return
    side = np.uint8(66) if s == 0 else np.uint8(65)
    put_mbo(om, st, oid, px, q, action, side)
    if k < 10:
        _put_mbp(op, st, px, q, action, side, k, tick)


@numba.njit(cache=True)
def lvl_px(st, s, k, tick):
    return (st[IB] - k) * tick if s == 0 else (st[IA] + k) * tick


@numba.njit(cache=True)
def _insert_level0(st, s):
    """Shift side ``s`` one level deeper and open an empty level 0 one tick better.

    The side must hold fewer than its maximum number of levels."""
    n = st[INB + s]
    base = s * LS
    for k in range(n, 0, -1):
        m = st[QN + base + k - 1]
        st[QN + base + k] = m
        st[LSZ + base + k] = st[LSZ + base + k - 1]
        src = QID + (base + k - 1) * QMAX
        dst = src + QMAX
        for j in range(m):
            st[dst + j] = st[src + j]
            st[QD + dst + j] = st[QD + src + j]
    st[QN + base] = 0
    st[LSZ + base] = 0
    st[INB + s] = n + 1
    if s == 0:
        st[IB] += 1
    else:
        st[IA] -= 1


@numba.njit(cache=True)
def _remove_level0(st, s):
    """Drop the (empty) level 0 of side ``s``; the next level becomes the best."""
    n = st[INB + s]
    base = s * LS
    for k in range(n - 1):
        m = st[QN + base + k + 1]
        st[QN + base + k] = m
        st[LSZ + base + k] = st[LSZ + base + k + 1]
        dst = QID + (base + k) * QMAX
        src = dst + QMAX
        for j in range(m):
            st[dst + j] = st[src + j]
            st[QD + dst + j] = st[QD + src + j]
    st[QN + base + n - 1] = 0
    st[LSZ + base + n - 1] = 0
    st[INB + s] = n - 1
    if s == 0:
        st[IB] -= 1
    else:
        st[IA] += 1


@numba.njit(cache=True)
def add(st, om, op, s, k, q, tick):
    """Add an order of ``q`` contracts at level ``k`` (``k`` = level count opens a new tail)."""
    n = st[INB + s]
    if k == n:
        st[INB + s] = n + 1
    px = lvl_px(st, s, k, tick)
    lv = s * LS + k
    qo = QID + lv * QMAX
    j = st[QN + lv]
    if j == QMAX:  # full queue: grow the last order instead
        st[QD + qo + j - 1] += q
        st[LSZ + lv] += q
        _emit(st, om, op, s, k, px, st[qo + j - 1], st[QD + qo + j - 1], np.uint8(77), tick)
        return
    oid = st[IOID]
    st[IOID] += 1
    st[qo + j] = oid
    st[QD + qo + j] = q
    st[QN + lv] = j + 1
    st[LSZ + lv] += q
    _emit(st, om, op, s, k, px, oid, q, np.uint8(65), tick)


@numba.njit(cache=True)
def cancel(st, om, op, s, k, j, q, tick):
    """Cancel ``q`` contracts of order ``j`` at level ``k`` (the whole order when that is all it
    has); an emptied level 0 is removed (the side shifts), an emptied tail level dropped."""
    px = lvl_px(st, s, k, tick)
    lv = s * LS + k
    qo = QID + lv * QMAX
    oid = st[qo + j]
    st[QD + qo + j] -= q
    st[LSZ + lv] -= q
    if st[QD + qo + j] <= 0:
        m = st[QN + lv]
        for jj in range(j, m - 1):
            st[qo + jj] = st[qo + jj + 1]
            st[QD + qo + jj] = st[QD + qo + jj + 1]
        st[QN + lv] = m - 1
    if st[QN + lv] == 0:
        if k == 0:
            _remove_level0(st, s)
        else:
            st[INB + s] -= 1
    _emit(st, om, op, s, k, px, oid, q, np.uint8(67), tick)


@numba.njit(cache=True)
def _modify(st, om, op, s, k, j, new, tick):
    """Change order ``j``'s size to ``new`` > 0; a size increase loses queue priority."""
    px = lvl_px(st, s, k, tick)
    lv = s * LS + k
    qo = QID + lv * QMAX
    oid = st[qo + j]
    old = st[QD + qo + j]
    st[LSZ + lv] += new - old
    if new > old:
        m = st[QN + lv]
        for jj in range(j, m - 1):
            st[qo + jj] = st[qo + jj + 1]
            st[QD + qo + jj] = st[QD + qo + jj + 1]
        st[qo + m - 1] = oid
        st[QD + qo + m - 1] = new
    else:
        st[QD + qo + j] = new
    _emit(st, om, op, s, k, px, oid, new, np.uint8(77), tick)


@numba.njit(cache=True)
def _drop_tail(st, om, op, s, tick):
    """Cancel every order of side ``s``'s deepest level (it leaves the simulated depth)."""
    k = st[INB + s] - 1
    lv = s * LS + k
    qo = QID + lv * QMAX
    while st[INB + s] == k + 1 and st[QN + lv] > 0:
        m = st[QN + lv]
        cancel(st, om, op, s, k, m - 1, st[QD + qo + m - 1], tick)


@numba.njit(cache=True)
def order_size(rng):
    """Limit-order size, contracts: 1 with probability 0.7, else 1 + Geometric(1/3) (mean 1.9)."""
    if rng.random() < 0.7:
        return np.int64(1)
    return np.int64(1 + geometric(rng, 1.0 / 3.0))


@numba.njit(cache=True)
def new_level(rng, st, om, op, s, k, target, tick):
    """Open level ``k`` (a new tail) with orders summing to about ``target`` contracts."""
    goal = max(1, np.int64(target * (0.3 + 1.0 * rng.random())))
    lv = s * LS + k
    while st[LSZ + lv] < goal or st[QN + lv] == 0:
        add(st, om, op, s, k, order_size(rng), tick)
        if st[QN + lv] >= QMAX:
            break


@numba.njit(cache=True)
def trade(st, om, op, buy, qty, tick):
    """A marketable order of ``qty`` contracts (capped below the resting depth).

    MBO: one 'T' per price level traded (side = aggressor, order id 0), one 'F' per resting
    order filled (side = resting), then one 'C' per fill removing the filled quantity. MBP-10:
    the 'T' records (book before the trade) and the 'C' records. Returns the quantity traded."""
    s = 1 if buy else 0
    base = s * LS
    n = st[INB + s]
    total = 0
    for k in range(n):
        total += st[LSZ + base + k]
    qty = min(qty, total - 1)
    if qty <= 0:
        return 0
    aggr = np.uint8(66) if buy else np.uint8(65)
    rest = np.uint8(65) if buy else np.uint8(66)
    if st[EWRITE] != 0:
        rem = qty
        k = 0
        while rem > 0:
            f = min(rem, st[LSZ + base + k])
            px = lvl_px(st, s, k, tick)
            put_mbo(om, st, 0, px, f, np.uint8(84), aggr)
            if k < 10:
                _put_mbp(op, st, px, f, np.uint8(84), aggr, k, tick)
                st[CTVOL] += f
                st[CTN] += 1
            rem -= f
            k += 1
        rem = qty
        k = 0
        j = 0
        while rem > 0:
            qo = QID + (base + k) * QMAX
            f = min(rem, st[QD + qo + j])
            put_mbo(om, st, st[qo + j], lvl_px(st, s, k, tick), f, np.uint8(70), rest)
            rem -= f
            j += 1
            if j == st[QN + base + k]:
                k += 1
                j = 0
    rem = qty
    q0 = QD + QID + base * QMAX
    while rem > 0:
        f = min(rem, st[q0])
        cancel(st, om, op, s, 0, 0, f, tick)
        rem -= f
    return qty


@numba.njit(cache=True)
def replenish(rng, p, st, om, op, tick):
    """Refill sides thinner than ``nmin`` levels: each missing tail level with probability
    ``p_repl`` (an empty side always gets one level)."""
    nmin = np.int64(p[PNMIN])
    for s in range(2):
        while st[INB + s] < nmin:
            if st[INB + s] > 0 and rng.random() >= p[PREPL]:
                break
            new_level(rng, st, om, op, s, st[INB + s], p[PTD], tick)


@numba.njit(cache=True)
def open_inside(st, om, op, s, q, tick, lmax):
    """A new best level one tick better on side ``s`` (the deepest level leaves if full)."""
    if st[INB + s] >= lmax:
        _drop_tail(st, om, op, s, tick)
    _insert_level0(st, s)
    add(st, om, op, s, 0, q, tick)


@numba.njit(cache=True)
def limit_event(rng, p, st, om, op, f_bid, f_ask, fragile):
    """Limit-order activity at a level drawn from the level profile: add (a new order or, w.p.
    :data:`P_MODIFY_UP`, an 'M' growing one) with probability ``T_k / (T_k + size_k)``, times
    ``f_bid`` / ``f_ask`` at level 1; else cancel an order or, w.p. :data:`P_MODIFY_DOWN`, shrink
    it. Inner levels never empty; ``fragile``: a lone best order may be pulled (flicker) and the
    best level may empty (so the side shifts); otherwise the best level keeps an order."""
    tick = np.int64(p[PTICK])
    lmax = np.int64(p[PLMAX])
    x = rng.random()
    k = 0
    while k < 9 and x > p[PLCUM + k]:
        k += 1
    s = 0 if rng.random() < 0.5 else 1
    n = st[INB + s]
    if k >= n:  # thin side: the event opens a new tail level
        add(st, om, op, s, min(n, lmax - 1), order_size(rng), tick)
        return
    lv = s * LS + k
    qo = QID + lv * QMAX
    sz = st[LSZ + lv]
    tgt = p[PT0] if k == 0 else p[PTD]
    p_add = tgt / (tgt + sz)
    if k == 0:
        p_add *= f_bid if s == 0 else f_ask
    p_add = min(max(p_add, 0.02), 0.98)
    m = st[QN + lv]
    if m <= 1 and (0 < k < n - 1 or (k == 0 and not fragile)):
        p_add = 1.0  # inner levels never empty (no holes in the book)
    elif fragile and k == 0 and m == 1 and n > 1 and rng.random() < p[PFLICK]:
        p_add = 0.0  # a lone best order (typically just placed) is pulled: flicker
    if rng.random() < p_add:
        q = order_size(rng)
        if m > 0 and rng.random() < p[PMODUP]:
            j = np.int64(rng.random() * m)
            _modify(st, om, op, s, k, j, st[QD + qo + j] + q, tick)
        else:
            add(st, om, op, s, k, q, tick)
    else:
        j = np.int64(rng.random() * m)
        osz = st[QD + qo + j]
        if osz > 1 and rng.random() < p[PMODDN]:
            new = osz - min(order_size(rng), osz - 1)
            _modify(st, om, op, s, k, j, new, tick)
        else:
            cancel(st, om, op, s, k, j, osz, tick)


@numba.njit(cache=True)
def trade_size(rng):
    """Size of a marketable order, contracts: 1 w.p. 0.6, else 1 + Geometric (mean 4.5), <= 200."""
    if rng.random() < 0.6:
        return np.int64(1)
    return np.int64(min(1 + geometric(rng, 1.0 / 4.5), 200))


@numba.njit(cache=True)
def unlock(st, om, op, tick):
    """A locked book lasts one event: the locking order is cancelled."""
    s = st[ILOCK] - 1
    cancel(st, om, op, s, 0, 0, st[QD + QID + s * LS * QMAX], tick)
    st[ILOCK] = 0


@numba.njit(cache=True)
def lock(rng, st, om, op, tick, lmax):
    """An order at the opposite best (a locked book for one event)."""
    s = 0 if rng.random() < 0.5 else 1
    open_inside(st, om, op, s, order_size(rng), tick, lmax)
    st[ILOCK] = s + 1


@numba.njit(cache=True)
def step(rng, p, ref, ref_t0, st, fst, om, op):
    """One event of the book model (see :mod:`alphafeat.synth`). Returns an event code:
    0 liquidity, 1 inside-spread level, 2 trade, 3 lock, 4 unlock, 5 re-quote, 6 mid move."""
    if p[PMODE] != 0.0:
        return _step_lead(rng, p, st, fst, om, op)
    return _step_follow(rng, p, ref, ref_t0, st, fst, om, op)


@numba.njit(cache=True)
def _ref_gap(p, ref, ref_t0, st):
    """(reference mid - mid) / 4 ticks, clipped to [-1, 1]; ``ref`` on a 1 s grid from ``ref_t0``."""
    gi = (st[ET] - ref_t0) // 1_000_000_000
    gi = min(max(gi, 0), ref.shape[0] - 1)
    return min(max((ref[gi] - 0.5 * (st[IA] + st[IB])) / 4.0, -1.0), 1.0)


@numba.njit(cache=True)
def _step_follow(rng, p, ref, ref_t0, st, fst, om, op):
    """One event of a non-leading instrument (a deferred outright or a calendar spread):
    queue-reactive, pulled towards its reference mid ``ref`` (1 s grid from ``ref_t0``)."""
    tick = np.int64(p[PTICK])
    lmax = np.int64(p[PLMAX])
    b = st[IB]
    a = st[IA]
    fst[FFAST] *= p[PDECAY]
    l0b = st[LSZ] if st[INB] > 0 else 0
    l0a = st[LSZ + LS] if st[INA] > 0 else 0
    imb = (l0b - l0a) / max(1, l0b + l0a)
    sig = p[PWI] * imb + p[PWF] * math.tanh(fst[FFAST] / p[PF0])
    gap = _ref_gap(p, ref, ref_t0, st) if p[PWR] != 0.0 else 0.0
    sig = min(max(sig + p[PWR] * gap, -1.0), 1.0)
    u = 0.5 + 0.5 * p[PKAPPA] * sig
    code = 0
    if st[ILOCK] != 0:
        unlock(st, om, op, tick)
        code = 4
    elif p[PFOLLOW] > 0.0 and abs(gap) * 4.0 > p[PFOLLOW] and st[INB] > 1 and st[INA] > 1:
        # re-quote of a non-leading outright whose fair value moved away from its book: a level
        # opens inside a wide spread on the side the fair value moved to, else the stale best
        # level of the other side is pulled; repeated (at most 16 ticks) until the mid is within
        # the threshold of the fair value, so a thin contract catches up in one event
        up = gap > 0.0
        for _ in range(16):
            a = st[IA]
            b = st[IB]
            if abs(_ref_gap(p, ref, ref_t0, st)) * 4.0 <= p[PFOLLOW] or st[INB] < 2 or st[INA] < 2:
                break
            if a - b > 1:
                open_inside(st, om, op, 0 if up else 1, order_size(rng), tick, lmax)
            else:
                s = 1 if up else 0
                lv = s * LS
                qo = QID + lv * QMAX
                while st[INB + s] > 1 and (st[IA] == a if up else st[IB] == b):
                    m = st[QN + lv]
                    cancel(st, om, op, s, 0, m - 1, st[QD + qo + m - 1], tick)
            replenish(rng, p, st, om, op, tick)
        code = 5
    elif a - b > 1 and rng.random() < p[PFILL]:
        s = 0 if rng.random() < u else 1
        open_inside(st, om, op, s, order_size(rng), tick, lmax)
        code = 1
    elif rng.random() < p[PTRADE]:
        buy = rng.random() < u
        s = 1 if buy else 0
        if rng.random() < p[PSW0] + p[PSW1] * abs(gap):
            qty = st[LSZ + s * LS]  # clears the best level
        else:
            qty = trade_size(rng)
        qty = trade(st, om, op, buy, qty, tick)
        if qty > 0:
            fst[FFAST] += qty if buy else -qty
            code = 2
        else:
            add(st, om, op, s, 0, order_size(rng), tick)
    elif a - b == 1 and rng.random() < p[PLOCK]:
        lock(rng, st, om, op, tick, lmax)
        code = 3
    else:
        limit_event(rng, p, st, om, op, 2.0 * u, 2.0 * (1.0 - u), True)
    if code != 3 and code != 4:
        replenish(rng, p, st, om, op, tick)
    return code


@numba.njit(cache=True)
def _meta_sign(rng, p, st):
    """Sign (+1 buy, -1 sell) of a marketable order that does not move the mid: w.p.
    ``p[PMETAQ]`` the sign of the running metaorder (lengths Pareto with tail exponent
    ``p[PMETAA]``, so trade signs are long-memory: Lillo & Farmer 2004), else a fair coin."""
    if st[IMLEFT] <= 0:
        st[IMSIGN] = 1 if rng.random() < 0.5 else -1
        st[IMLEFT] = np.int64(min((1.0 - rng.random()) ** (-1.0 / p[PMETAA]), META_MAX))
    if rng.random() < p[PMETAQ]:
        st[IMLEFT] -= 1
        return st[IMSIGN]
    return 1 if rng.random() < 0.5 else -1


@numba.njit(cache=True)
def _deplete(rng, p, st, fst, om, op, s):
    """The best level of side ``s`` goes: its orders are cancelled from the back of the queue
    but the first, which a marketable order fills (w.p. ``p[PMOVETR]``, aggressor against
    ``s``) or its owner cancels. The side shifts to its next level."""
    tick = np.int64(p[PTICK])
    if st[INB + s] < 2:
        new_level(rng, st, om, op, s, st[INB + s], p[PTD], tick)
    lv = s * LS
    qo = QID + lv * QMAX
    while st[QN + lv] > 1:
        m = st[QN + lv]
        cancel(st, om, op, s, 0, m - 1, st[QD + qo + m - 1], tick)
    q = st[QD + qo]
    if rng.random() < p[PMOVETR]:
        buy = s == 1
        q = trade(st, om, op, buy, q, tick)
        fst[FFLOW] += q if buy else -q
    else:
        cancel(st, om, op, s, 0, 0, q, tick)


@numba.njit(cache=True)
def _planted(p, st, flow):
    """The planted signal ``s_B I + s_H tanh(F / H0)`` of the leader's next mid move without
    the bridge (I: level-1 queue imbalance of the book ``st``, F: the decayed signed flow
    ``flow``); the up-move probability is ``1/2 + 1/2 clip(signal + bridge, -1, 1)``."""
    l0b = st[LSZ] if st[INB] > 0 else 0
    l0a = st[LSZ + LS] if st[INA] > 0 else 0
    imb = (l0b - l0a) / max(1, l0b + l0a)
    return p[PSB] * imb + p[PSH] * math.tanh(flow / p[PH0])


@numba.njit(cache=True)
def _step_lead(rng, p, st, fst, om, op):
    """One event of the leading outright (see :mod:`alphafeat.synth`): its mid moves only in
    move events (probability ``p[PMOVE]``), up with probability ``u`` = 1/2 plus the planted
    signal and the bridge's drift; all other events leave both best prices alone."""
    tick = np.int64(p[PTICK])
    lmax = np.int64(p[PLMAX])
    b = st[IB]
    a = st[IA]
    fst[FFLOW] *= p[PHDECAY]
    sig = _planted(p, st, fst[FFLOW])
    r = fst[FREM]
    if r >= 1.0:  # bridge: the expected move per mid move that reaches the close's target
        sig += (fst[FTGT] - 0.5 * (a + b)) / max(1.0, p[PMOVE] * r)
        fst[FREM] = r - 1.0
    u = 0.5 + 0.5 * min(max(sig, -1.0), 1.0)
    code = 0
    if st[ILOCK] != 0:
        unlock(st, om, op, tick)
        code = 4
    elif a - b > 1 and rng.random() < fst[FFILL]:
        open_inside(st, om, op, 0 if rng.random() < u else 1, order_size(rng), tick, lmax)
        code = 1
    elif a - b == 1 and rng.random() < p[PMOVE] * fst[FVOL]:
        up = rng.random() < u
        n_moves = 1
        if rng.random() < p[PJUMP]:
            n_moves += geometric(rng, 1.0 / 3.0)
        for j in range(n_moves):
            _deplete(rng, p, st, fst, om, op, 1 if up else 0)
            if j < n_moves - 1 or rng.random() >= fst[FWIDEN]:
                open_inside(st, om, op, 0 if up else 1, order_size(rng), tick, lmax)
        code = 6
    elif rng.random() < p[PTRADE]:
        buy = _meta_sign(rng, p, st) > 0
        s = 1 if buy else 0
        qty = min(trade_size(rng), st[LSZ + s * LS] - 1)  # never the whole best level
        if qty > 0:
            qty = trade(st, om, op, buy, qty, tick)
            fst[FFLOW] += qty if buy else -qty
            code = 2
        else:
            add(st, om, op, s, 0, order_size(rng), tick)
    elif a - b == 1 and rng.random() < p[PLOCK]:
        lock(rng, st, om, op, tick, lmax)
        code = 3
    else:
        limit_event(rng, p, st, om, op, 1.0, 1.0, False)
    if code != 3 and code != 4:
        replenish(rng, p, st, om, op, tick)
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
    if st[ILOCK] != 0:
        return np.nan
    sig = _planted(p, st, fst[FFLOW] * p[PHDECAY])
    e = min(max(sig, -1.0), 1.0)  # 2u - 1
    gap = st[IA] - st[IB]
    if gap > 1:
        return fst[FFILL] * 0.5 * e
    if gap == 1:
        return p[PMOVE] * fst[FVOL] * e * (1.0 + 3.0 * p[PJUMP] - 0.5 * fst[FWIDEN])
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
    ref = borrow(ref_own)
    for r in range(n_paths):
        st[:] = st0
        fst[:] = fst0
        for x in range(ET, CMBP + 1):  # no event context, nothing written
            st[x] = 0
        fst[FREM] = 0.0  # no bridge: the close the mid is bridged to is not known
        s_sum = 0.0
        z_sum = 0.0
        h = 0
        for j in range(1, kmax + 1):
            c = _lead_drift(p, st, fst)
            m0 = st[IB] + st[IA]
            step(rng, p, ref, 0, st, fst, dm, dp)
            d = 0.5 * (st[IB] + st[IA] - m0)
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


@numba.njit(cache=True)
def _mark_last(st, c0, c1, om, op):
    """Set F_LAST on the last MBO and MBP-10 record written since counts ``c0``, ``c1``."""
    if st[CMBO] > c0 and st[WMBO] != 0:
        om[st[CMBO] - 1, 4] |= np.int64(F_LAST) << 32
    if st[CMBP] > c1:
        r = st[CMBP] - 1
        op[r, 3] |= np.int64(F_LAST) << 48
        st[CLAST] += 1
        if op[r, 42] == UNDEF or op[r, 43] == UNDEF:  # bid_px_09, ask_px_09
            st[CTHIN] += 1


@numba.njit(cache=True)
def simulate(
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
    uncrossing trade, then one :func:`step` per event time.

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
    ``rng_drift_own``, so the records do not change;
    :func:`alphafeat.synth.simulator.drift_estimate` turns them into the expected change).
    Returns (n_mbo, n_mbp), or (-1, -1) when a buffer is too small.
    """
    tick = np.int64(p[PTICK])
    lmax = np.int64(p[PLMAX])
    capm = om.shape[0]
    capp = op.shape[0]
    st_own = np.zeros(NST, np.int64)
    fst_own = np.zeros(NFST, np.float64)
    st = borrow(st_own)
    fst = borrow(fst_own)
    om = borrow(om)
    op = borrow(op)
    p = borrow(p)
    ref = borrow(ref)
    rng = borrow(rng_own)
    rng_d = borrow(rng_drift_own)
    d_st_own = np.zeros(NST, np.int64)
    d_fst_own = np.zeros(NFST)
    d_m_own = np.zeros((1, MBO_W), np.int64)
    d_p_own = np.zeros((1, MBP_W), np.int64)
    d_acc_own = np.zeros((max(drift_n, 1), 2 * drift_h.shape[0]))
    d_st, d_fst, d_m, d_p = borrow(d_st_own), borrow(d_fst_own), borrow(d_m_own), borrow(d_p_own)
    d_acc = borrow(d_acc_own)
    keep_drift = drift_h.shape[0] > 0
    st[IB] = b0
    st[IA] = b0 + 1
    st[IOID] = oid0
    st[HMBO] = hdr_mbo
    st[HMBP] = hdr_mbp
    st[WMBO] = 1 if capm > 0 else 0
    fst[FTGT] = lat1
    fst[FREM] = times.shape[0]
    # opening snapshot: every resting order, flags F_SNAPSHOT | F_BAD_TS_RECV as Databento's
    st[ET] = t_open
    st[ERC] = t_open
    st[ESEQ] = seq0
    st[EFLAGS] = 0x28
    st[EWRITE] = 1
    for k in range(nlev0):
        for s in range(2):
            new_level(rng, st, om, op, s, k, p[PT0] if k == 0 else p[PTD], tick)
    _mark_last(st, 0, 0, om, op)
    st[EFLAGS] = 0
    if cross >= 0:  # crossed pre-open: two crossing orders, then the uncrossing trade
        s = cross
        q0 = QID + s * LS * QMAX
        for i in range(3):
            st[ET] = t_open + (5 + 10 * i) * 1_000_000_000
            st[ERC] = st[ET] + 90_000
            st[ESEQ] = seq0 + 1 + i
            c0 = st[CMBO]
            c1 = st[CMBP]
            if i < 2:
                open_inside(st, om, op, s, 1 + np.int64(3 * rng.random()), tick, lmax)
            else:
                q = st[LSZ + s * LS] + st[LSZ + s * LS + 1]
                trade(st, om, op, s == 0, q, tick)
                for _ in range(2):  # the two crossing orders (one per level) are filled
                    put_mbo(
                        om,
                        st,
                        st[q0],
                        lvl_px(st, s, 0, tick),
                        st[QD + q0],
                        np.uint8(70),
                        np.uint8(66) if s == 0 else np.uint8(65),
                    )
                    cancel(st, om, op, s, 0, 0, st[QD + q0], tick)
                replenish(rng, p, st, om, op, tick)
            _mark_last(st, c0, c1, om, op)
    last_rc = st[ERC]
    si = 0
    ns = sample_at.shape[0]
    keep_lat = lat_out.shape[0] > 0
    gi = 0
    ng = seg_end.shape[0]
    for e in range(times.shape[0]):
        if (st[WMBO] != 0 and st[CMBO] + RESERVE > capm) or st[CMBP] + RESERVE > capp:
            return -1, -1
        while si < ns and sample_at[si] == e:
            s_st[si, :] = st
            s_fst[si, :] = fst
            si += 1
        t = times[e]
        while gi < ng - 1 and t >= seg_end[gi]:
            gi += 1
        fst[FFILL] = seg_fw[gi, 0]
        fst[FWIDEN] = seg_fw[gi, 1]
        fst[FVOL] = seg_fw[gi, 2]
        lat = np.int64(80_000 + min(rng.standard_exponential() * 25_000.0, 5_000_000.0))
        rc = max(t + lat, last_rc)
        last_rc = rc
        st[ET] = t
        st[ERC] = rc
        st[ESEQ] = seq0 + 4 + e
        st[ETID] = np.int64(15_000 + 15_000.0 * rng.random())
        st[EFLAGS] = 0x08 if rng.random() < p[PBADTS] else 0
        c0 = st[CMBO]
        c1 = st[CMBP]
        code = step(rng, p, ref, ref_t0, st, fst, om, op)
        if keep_lat:
            lat_out[e] = 0.5 * (st[IB] + st[IA])
            pup_out[e] = 0.5 + 0.5 * min(max(_planted(p, st, fst[FFLOW] * p[PHDECAY]), -1.0), 1.0)
            rc_out[e] = rc
        if keep_drift:
            _drift_paths(rng_d, p, st, fst, d_st, d_fst, drift_h, drift_n, drift_out[e], drift_w, d_m, d_p, d_acc)
        _mark_last(st, c0, c1, om, op)
        stats[0] += 1
        if code == 3:
            stats[1] += 1
        if st[EFLAGS] != 0:
            stats[2] += 1
        if code == 2:
            stats[3] += 1
    stats[4] = st[CLAST]
    stats[5] = st[CTHIN]
    stats[6] = st[CTVOL]
    stats[7] = st[CTN]
    # the local owners stay alive to here (the views do not hold them; the caller holds the
    # arguments)
    fst_own[FFLOW] = fst[FFLOW]
    d_st_own[0] = d_fst_own[0] + d_m_own[0, 0] + d_p_own[0, 0] + d_acc_own[0, 0]
    return st_own[CMBO], st_own[CMBP]
