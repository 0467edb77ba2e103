"""The order-level (MBO) book simulation of one instrument and one session (numba), with the
MBP-10 records derived in the same pass, and the assembly of a session's instruments.

See :mod:`alphafeat.synth` for the model. The hot loop (:func:`alphafeat.synth.kernels.simulate`,
one step per book event) writes whole DBN records as little-endian int64 words into
buffers whose layouts are the reader's (:mod:`alphafeat.synth.writer`).
"""

from __future__ import annotations

import datetime
import logging
import math
import time
import zlib
from dataclasses import dataclass

import numpy as np

from alphafeat.synth.calendar import (
    BASE_RATE,
    P_MOVE_MAX,
    Contract,
    contracts_for,
    fair_price,
    index_level,
    profile_segments,
    session_bounds,
    session_vol,
    spread_share,
    trend_level,
    volume_share,
)
from alphafeat.synth.kernels import (
    LMAX_OUTRIGHT,
    LMAX_SPREAD,
    NFST,
    NPARAMS,
    NST,
    PBADTS,
    PDECAY,
    PF0,
    PFILL,
    PFLICK,
    PFOLLOW,
    PH0,
    PHDECAY,
    PJUMP,
    PKAPPA,
    PL0,
    PLCUM,
    PLMAX,
    PLOCK,
    PMETAA,
    PMETAQ,
    PMODDN,
    PMODE,
    PMODUP,
    PMOVE,
    PMOVETR,
    PNMIN,
    PREPL,
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
    RESERVE,
    event_times,
    simulate,
)
from alphafeat.synth.params import (
    BURST_LONG_NS,
    BURST_MEAN,
    BURST_P_SHORT,
    BURST_SHORT_NS,
    FILL_MAX,
    FILL_PER_ACTIVITY,
    FOLLOW_TICKS,
    HISTORY_EVENTS,
    HISTORY_SCALE,
    META_ALPHA,
    META_SHARE,
    OFI_STRENGTH,
    OPEN_DELAY_NS,
    P_BAD_TS,
    P_CROSSED_PREOPEN,
    P_FILL,
    P_FLICKER,
    P_JUMP,
    P_LEVEL0,
    P_LOCK,
    P_MODIFY_DOWN,
    P_MODIFY_UP,
    P_MOVE_TRADE,
    P_REPLENISH,
    P_SWEEP,
    P_TRADE,
    P_TRADE_SPREAD,
    P_WIDEN,
    SV_SD,
    SV_TAU_MIN,
    T_DEEP,
    T_LEVEL1,
    VOL_SD,
    VOL_TAU_MIN,
    W_FLOW,
    W_IMB,
    W_REF,
    Signal,
)
from alphafeat.synth.records import (
    MBO_DTYPE,
    MBO_SIZE,
    MBO_W,
    MBP10_DTYPE,
    MBP_SIZE,
    MBP_W,
    PUBLISHER_ID,
    Buffers,
    InstrumentRun,
    Session,
)

__all__ = ["activity_segments", "drift_estimate", "simulate_session", "volatility_multipliers"]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Session assembly
# --------------------------------------------------------------------------------------------


def _rng(seed: int, day: datetime.date, iid: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, day.toordinal(), iid, stream]))


def _params(c: Contract, signal: Signal, follow: float = 0.0, p_move: float = 0.0) -> np.ndarray:
    """Parameter vector of the book model for contract ``c`` (indices ``_P*``); ``follow`` > 0:
    re-quote threshold (ticks) of a non-leading outright (:data:`FOLLOW_TICKS`); ``p_move`` > 0:
    the leading outright (mid-move probability per event)."""
    p = np.zeros(NPARAMS)
    p[PKAPPA] = OFI_STRENGTH
    damp = min(signal.strength, 1.0)
    p[PWI], p[PWF], p[PWR] = W_IMB * damp, W_FLOW * damp, W_REF
    p[PF0], p[PDECAY] = 10.0, 0.95
    p[PTRADE] = P_TRADE_SPREAD if c.is_spread else P_TRADE
    p[PFILL] = P_FILL
    p[PT0], p[PTD] = T_LEVEL1, T_DEEP
    p[PSW1] = 0.05
    p[PLOCK] = P_LOCK
    p[PBADTS] = P_BAD_TS
    p[PREPL] = P_REPLENISH
    p[PLMAX] = LMAX_SPREAD if c.is_spread else LMAX_OUTRIGHT
    p[PNMIN] = LMAX_SPREAD if c.is_spread else 10
    p[PTICK] = c.tick
    p[PMODUP], p[PMODDN] = P_MODIFY_UP, P_MODIFY_DOWN
    p[PL0] = P_LEVEL0
    p[PFLICK] = P_FLICKER
    p[PSW0] = P_SWEEP
    p[PFOLLOW] = follow
    p[PMODE] = 1.0 if p_move > 0 else 0.0
    p[PMOVE] = p_move
    p[PSB], p[PSH] = signal.book, signal.history
    p[PH0], p[PHDECAY] = HISTORY_SCALE, math.exp(-1.0 / HISTORY_EVENTS)
    p[PMETAQ], p[PMETAA] = META_SHARE, META_ALPHA
    p[PJUMP], p[PMOVETR] = P_JUMP, P_MOVE_TRADE
    # level k of a limit event: P_LEVEL0 at k = 0, then geometric (ratio 0.8) over k = 1..9
    acc = P_LEVEL0
    for k in range(9):
        p[PLCUM + k] = acc
        acc += (1.0 - P_LEVEL0) * 0.2 * 0.8**k / (1.0 - 0.8**9)
    return p


def activity_segments(day: datetime.date, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One-minute segments of session ``day`` shared by all its instruments: start, end (int64
    ns), activity multiplier (the time-of-day profile times the stochastic activity
    ``exp(x - VOL_SD^2 / 2)``, x an OU process of 1-minute steps, seeded by ``(seed, day)``) and
    the profile's widening factor (float64)."""
    starts, ends, mults, widen = profile_segments(day)
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


def drift_estimate(means: np.ndarray, w: np.ndarray, n_paths: int) -> tuple[np.ndarray, np.ndarray]:
    """The expected mid change per event and horizon from the statistics of
    :func:`alphafeat.synth.kernels._drift_paths`.

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


@dataclass
class _LeadOut:
    """The leading outright's per-event outputs, filled by the kernel (empty for the other
    instruments): its mid (ticks), the planted p_up, the ts_recv, the drift horizons (events) and
    the Monte-Carlo mid changes over them."""

    lat: np.ndarray
    pup: np.ndarray
    rc: np.ndarray
    drift_h: np.ndarray
    drift_ev: np.ndarray


def _lead_out(lead: bool, n: int, drift: tuple[int, ...]) -> _LeadOut:
    """Step of :func:`_simulate_instrument`: the arrays the kernel fills for the leader of ``n``
    events (``drift``: its horizons), empty ones for another instrument."""
    if not lead:
        return _LeadOut(np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 0, 2)))
    drift_h = np.array(sorted(drift), np.int64) if drift else np.zeros(0, np.int64)
    drift_ev = np.empty((n, drift_h.shape[0], 2)) if drift else np.zeros((0, 0, 2))
    return _LeadOut(np.empty(n), np.empty(n), np.empty(n, np.int64), drift_h, drift_ev)


def _times(c: Contract, day: datetime.date, seed: int, rate: float, mk: _Market) -> tuple[np.ndarray, np.ndarray]:
    """Step of :func:`_simulate_instrument`: the book-event times (ns) of the instrument and the
    activity segments' ends (ns), clipped to its expiration and the session's close."""
    starts, ends, mults, _ = mk.seg
    stop = min(mk.t1 - 10_000_000, c.expiration_ns)
    ends = np.minimum(ends, stop)
    starts = np.maximum(starts, mk.t0 + OPEN_DELAY_NS)  # continuous trading after the opening
    times = event_times(
        _rng(seed, day, c.instrument_id, 1),
        starts,
        ends,
        mults * rate,
        BURST_MEAN,
        BURST_P_SHORT,
        BURST_SHORT_NS,
        BURST_LONG_NS,
    )
    return times, ends


def _run_kernel(c: Contract, day: datetime.date, seed: int, args: tuple, sampled: tuple, out: _LeadOut,
                drift_paths: int, bufs: Buffers | None, slot: int, caps: tuple[int, int]) -> tuple:  # fmt: skip
    """Step of :func:`_simulate_instrument`: the kernel run (``args``: its arguments before the
    buffers; ``sampled``: the sample indices and their state arrays) into buffers of ``caps``
    (MBO, MBP-10) records, doubled and run again until they hold every record. Returns the MBO
    and MBP-10 record counts, both buffers, the stats and the drift's weights."""
    cap_m, cap_p = caps
    n = args[0].shape[0]
    while True:
        # the kernel writes every byte of every record (header included): no zeroing needed
        if bufs is None:
            mbo = np.empty(cap_m, MBO_DTYPE)
            mbp = np.empty(cap_p, MBP10_DTYPE)
        else:
            mbo = bufs.get(("mbo", slot), MBO_DTYPE, cap_m)
            mbp = bufs.get(("mbp", slot), MBP10_DTYPE, cap_p)
        stats = np.zeros(8, np.int64)
        drift_w = np.zeros((0, 0))
        if out.drift_h.shape[0]:
            drift_w = np.zeros((2 * out.drift_h.shape[0], 2 * out.drift_h.shape[0]))
        tk = time.perf_counter()
        nm, npp = simulate(
            _rng(seed, day, c.instrument_id, 2),
            *args,
            mbo.view(np.int64).reshape(cap_m, MBO_W),
            mbp.view(np.int64).reshape(cap_p, MBP_W),
            *sampled,
            stats,
            out.lat,
            out.pup,
            out.rc,
            _rng(seed, day, c.instrument_id, 6),
            out.drift_h,
            drift_paths,
            out.drift_ev,
            drift_w,
        )
        logger.debug("%s %s: %d events, %d MBP-10 records in %.3f s", c.symbol, day, n, npp, time.perf_counter() - tk)
        if nm >= 0:
            return nm, npp, mbo, mbp, stats, drift_w
        cap_m *= 2
        cap_p *= 2


def _latent(times: np.ndarray, t0: int, t1: int, mid0: float, lat: np.ndarray) -> np.ndarray:
    """Step of :func:`_simulate_instrument`: the leader's mid (ticks) at the end of every 1 s step
    from ``t0`` to ``t1`` (ns), from its mid ``lat`` after each event at ``times``; ``mid0``
    (the opening mid) before the first event."""
    grid = t0 + np.arange((t1 - t0) // 1_000_000_000 + 1, dtype=np.int64) * 1_000_000_000
    i = np.searchsorted(times, grid, side="right") - 1
    return np.where(i >= 0, lat[np.maximum(i, 0)] if times.shape[0] else mid0, mid0)


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
    _, _, mults, widen = mk.seg
    times, ends = _times(c, day, seed, rate, mk)
    tick = c.tick
    lat0 = fair * 1e9 / tick
    lat1 = close * 1e9 / tick
    b0 = int(math.floor(lat0 - 0.5))  # the opening mid b0 + 0.5 within half a tick of fair
    n = times.shape[0]
    lead = ref is None
    out = _lead_out(lead, n, mk.drift)
    p_move = min(P_MOVE_MAX, (vol * abs(lat0)) ** 2 / max(n, 1)) if lead else 0.0
    if lead:
        ref = np.zeros(1)
    p = _params(c, mk.signal, FOLLOW_TICKS if follow else 0.0, p_move)
    seg_fw = np.stack(
        [np.minimum(FILL_MAX, FILL_PER_ACTIVITY * mults), np.minimum(0.9, P_WIDEN * widen), mk.vol], axis=1
    )
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
    s_st = np.zeros((ns, NST), np.int64)
    s_fst = np.zeros((ns, NFST))
    hdr_mbo = (MBO_SIZE // 4) | (0xA0 << 8) | (PUBLISHER_ID << 16) | (c.instrument_id << 32)
    hdr_mbp = (MBP_SIZE // 4) | (0x0A << 8) | (PUBLISHER_ID << 16) | (c.instrument_id << 32)
    # records per event: about 1.5 MBP-10 (1.8 MBO) for the leader, 1.6 for spreads and over 4
    # for a following outright (its re-quotes); a too small buffer reruns the simulation
    per_ev = 2.0 if lead else (6.0 if follow else 2.0)
    cap_m = int((per_ev + 0.4) * n) + 8 * RESERVE if write_mbo else 0
    cap_p = int(per_ev * n) + 8 * RESERVE
    args = (times, t0, b0, lat0, lat1, p, ends, seg_fw, ref, t0, seq0, oid0, cross, int(p[PLMAX]), hdr_mbo, hdr_mbp)
    nm, npp, mbo, mbp, stats, drift_w = _run_kernel(c, day, seed, args, (sample_at, s_st, s_fst), out,
                                                    mk.drift_paths, bufs, slot, (cap_m, cap_p))  # fmt: skip
    mbo = mbo[: nm if write_mbo else 0]
    mbp = mbp[:npp]
    saved = (s_st, s_fst) if ns else None
    latent = _latent(times, t0, t1, b0 + 0.5, out.lat) if lead else None
    planted = (out.rc, out.pup) if lead else None
    drift = rel = None
    if lead and out.drift_h.shape[0]:
        drift, rel = drift_estimate(out.drift_ev, drift_w, mk.drift_paths)
    return InstrumentRun(int(nm), mbo, mbp, stats, cross >= 0, saved, p, latent, planted, drift,
                         out.lat if drift is not None else None, rel)


def simulate_session(
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
    each event (:func:`drift_estimate`; ``InstrumentRun.drift``)."""
    t0, t1 = session_bounds(day)
    seg = activity_segments(day, seed)
    mk = _Market(t0, t1, seg, volatility_multipliers(day, seed, seg[0].shape[0]), signal, tuple(drift),
                 drift_paths if drift else 0)
    cons = contracts_for(day, contracts)
    s_open, s_close = index_level(day, seed, scale)
    vol = session_vol(scale, trend_level(day))
    outs = sorted((c for c in cons if not c.is_spread), key=lambda c: (-volume_share(c.symbol, day), c.expiration_ns))
    spreads = [c for c in cons if c.is_spread]
    runs: dict[str, InstrumentRun] = {}
    leader_grid: np.ndarray | None = None
    leader: Contract | None = None
    for c in outs:
        fair = fair_price(c, day, s_open)
        rate = BASE_RATE * scale * volume_share(c.symbol, day)
        slot = len(runs)
        if leader is None:
            close = fair_price(c, day, s_close)
            run = _simulate_instrument(c, day, seed, rate, fair, None, mk, n_samples, bufs, slot, write_mbo, close, vol)
            leader, leader_grid = c, run.latent
        else:
            assert leader_grid is not None
            # the leader's mid times the carry ratio (a constant over the session)
            ratio = fair / fair_price(leader, day, s_open) * leader.tick / c.tick
            run = _simulate_instrument(c, day, seed, rate, fair, leader_grid * ratio, mk, 0, bufs, slot, write_mbo,
                                       follow=True)
        runs[c.symbol] = run
    for c in spreads:
        fair = fair_price(c, day, s_open)
        rate = BASE_RATE * scale * spread_share(c, day)
        ref = np.full(1, fair * 1e9 / c.tick)
        runs[c.symbol] = _simulate_instrument(c, day, seed, rate, fair, ref, mk, 0, bufs, len(runs), write_mbo)
    return Session(day, cons, runs, leader.symbol if leader else "", bufs)
