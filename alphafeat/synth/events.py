"""numba kernels of the simulation's events: the leader's and the followers' steps (signal, metaorders,
reference gaps) and the session loop :func:`simulate` over them (:mod:`alphafeat.synth.book_ops`)."""

from __future__ import annotations

import math

import numba
import numpy as np

from alphafeat.synth.book_ops import (
    add,
    cancel,
    geometric,
    limit_event,
    lock,
    lvl_px,
    new_level,
    open_inside,
    order_size,
    put_mbo,
    replenish,
    trade,
    trade_size,
    unlock,
)
from alphafeat.synth.layout import (
    CLAST,
    CMBO,
    CMBP,
    CTHIN,
    CTN,
    CTVOL,
    EFLAGS,
    ERC,
    ESEQ,
    ET,
    ETID,
    EWRITE,
    FFAST,
    FFILL,
    FFLOW,
    FREM,
    FTGT,
    FVOL,
    FWIDEN,
    HMBO,
    HMBP,
    IA,
    IB,
    ILOCK,
    IMLEFT,
    IMSIGN,
    INA,
    INB,
    IOID,
    LS,
    LSZ,
    META_MAX,
    NFST,
    NST,
    PBADTS,
    PDECAY,
    PF0,
    PFILL,
    PFOLLOW,
    PH0,
    PHDECAY,
    PJUMP,
    PKAPPA,
    PLMAX,
    PLOCK,
    PMETAA,
    PMETAQ,
    PMODE,
    PMOVE,
    PMOVETR,
    PSB,
    PSH,
    PSW0,
    PSW1,
    PT0,
    PTD,
    PTICK,
    PTRADE,
    PWF,
    PWI,
    PWR,
    QD,
    QID,
    QMAX,
    QN,
    RESERVE,
    UNDEF,
    WMBO,
    borrow,
)
from alphafeat.synth.records import (
    F_LAST,
)


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
    no bridge) and ``rc_out`` the event's ts_recv (ns).
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
    return st_own[CMBO], st_own[CMBP]
