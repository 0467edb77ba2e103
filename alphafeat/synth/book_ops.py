"""numba kernels of one instrument's order-level book: event times, MBO and MBP-10 records, adds,
cancels, modifies and trades on the packed state (:mod:`alphafeat.synth.layout`)."""

from __future__ import annotations

import math

import numba
import numpy as np

from alphafeat.synth.layout import (
    CMBO,
    CMBP,
    CTN,
    CTVOL,
    EFLAGS,
    ERC,
    ESEQ,
    ET,
    ETID,
    EWRITE,
    HMBO,
    HMBP,
    IA,
    IB,
    ILOCK,
    INA,
    INB,
    IOID,
    LS,
    LSZ,
    M32,
    PFLICK,
    PLCUM,
    PLMAX,
    PMODDN,
    PMODUP,
    PNMIN,
    PREPL,
    PT0,
    PTD,
    PTICK,
    QD,
    QID,
    QMAX,
    QN,
    UNDEF,
    WMBO,
)


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
