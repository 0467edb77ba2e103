"""Synthetic CME Globex E-mini S&P 500 (``ES.FUT``) data written as genuine Databento DBN v3.

:func:`generate` writes one zstd-compressed DBN v3 file per trading session and schema, named
like Databento's (``glbx-mdp3-YYYYMMDD.mbp-10.dbn.zst``, ``.trades.dbn.zst``,
``.definition.dbn.zst``, ``.mbo.dbn.zst``), readable by ``databento.DBNStore.from_file(path).to_ndarray()``.

Modules (one job each): :mod:`~alphafeat.synth.calendar` (contracts, sessions from
:func:`alphafeat.plan.session_bounds`, roll shares, activity profile, prices across sessions),
:mod:`~alphafeat.synth.simulator` (the numba order-level book simulation),
:mod:`~alphafeat.synth.writer` (DBN records with the reader's layouts, merge, definitions,
metadata, atomic zstd writes), :mod:`~alphafeat.synth.ceiling` (the AUC ceiling),
:mod:`~alphafeat.synth.generate` (sessions over joblib, the JSON report) and
:mod:`~alphafeat.synth.report` (``alphafeat synth --report``: stylised facts beside the real ES
files and the literature).

Instruments
-----------
By default the three nearest quarterly outrights at the session date (H/M/U/Z expire on the
third Friday of Mar/Jun/Sep/Dec, trading ends 08:30 CT that day) and the calendar spreads of
neighbours ``"<q1>-<q2>"``, ``"<q2>-<q3>"`` (instrument_class ``'S'``, price = front - back,
tick 0.05 index points as on CME; outrights tick 0.25). Instrument ids are exchange-like and
not in expiry order: a fixed table (ESH4 17077, ESM4 5602, ESH4-ESM4 17684, ESU4 118, ESZ4
183748, ...) else a CRC32 hash of the symbol. Prices are int64 in 1e-9 index points.

Sessions
--------
Trade date D (Mon-Fri; exchange holidays are not modelled) runs from 17:00 America/Chicago on
the calendar day before D to 16:00 America/Chicago on D (DST aware; Monday's session opens
Sunday 17:00). Every ``ts_recv`` of a session file lies in ``[start, end)``. Event rates follow
a piecewise-constant time-of-day profile (:data:`ACTIVITY_PROFILE`, U-shaped over the regular
hours 08:30-15:15 CT, which carry about 70 % of the events) times a stochastic activity common
to all instruments (:func:`activity_segments`: ``exp(x - s^2/2)``, x an Ornstein-Uhlenbeck
process over 1-minute steps, s.d. :data:`VOL_SD`, time constant :data:`VOL_TAU_MIN` minutes:
clustered activity); the leading outright's move probability is further multiplied by a
stochastic volatility (:func:`volatility_multipliers`: ``exp(y - s^2/2)``, y an OU process over
1-minute steps, s.d. :data:`SV_SD`, time constant :data:`SV_TAU_MIN` minutes; mean 1): fat-tailed,
clustered minute returns at every scale (Clark 1973; Andersen & Bollerslev 1997).

Roll (volume share)
-------------------
For an outright c with expiry date E_c, the fraction of volume that has rolled away from it on
trade date d is ``L_c(d) = 1 / (1 + exp(-(d - (E_c - 8.5 days)) / 0.8 days))``; its share is
``max((1 - L_c(d)) * L_prev(c)(d), floor)`` (``prev`` = the quarterly contract before c; floor
0.02 for the expiring contract, 0.005 for deferred ones). Event rates (book activity and
trades) are proportional to the share. For ESH4 (expiry 2024-03-15) the shares are
ESH4 0.65 / ESM4 0.35 on 2024-03-06, 0.35 / 0.65 on 2024-03-07, 0.13 / 0.87 on 2024-03-08.
So in the default sample the contract with most traded volume is **ESH4 in session
2024-03-06 and ESM4 from session 2024-03-07 on**; a "most volume in the previous session"
rule therefore switches from ESH4 to ESM4 at session **2024-03-08**. The spread's event rate is
``0.03 * (1 + 2 * 4 w (1 - w))`` of the base rate (w = rolled fraction of the front), i.e. thin.

The leading outright (:func:`alphafeat.synth.kernels._step_lead`)
-------------------------------------------------------------------
The outright with the largest volume share leads. State: best bid tick b, best ask tick a; per
side up to :data:`LMAX_OUTRIGHT` (12) contiguous price levels, each a FIFO queue of orders (id,
size). Event times: a cluster process (burst starts Poisson at the activity rate /
:data:`BURST_MEAN`; gaps inside a burst Exp(50 us) w.p. 0.7 else Exp(4 ms)). Its mid moves
**only** in move events, so what predicts it is exactly what is planted:

* up-move probability ``u = 1/2 + 1/2 clip(s_B I + s_H tanh(F / H0) + bridge, -1, 1)`` with I the
  level-1 queue imbalance ``(Qb - Qa) / (Qb + Qa)``, F the signed traded volume decayed by
  ``exp(-1/600)`` per event (the last few minutes of order flow), ``(s_B, s_H)`` =
  strength x (:data:`SIGNAL_BOOK`, :data:`SIGNAL_HISTORY`) for ``--signal-kind both``, only one
  of them for ``book`` / ``history``, none for ``--signal 0`` (:class:`Signal`);
* ``bridge`` = (target - mid) / (expected moves left): the mid is bridged to the session's close
  price (below) with the variance a free walk of its moves would have, so for an observer who
  does not know the close the mid is a martingale (the law of a Brownian bridge to a Gaussian
  end point of the walk's variance is the walk's);
* ``generate(..., signal_file=True)`` (``--signal-file``) writes ``u`` less the bridge, known
  after each event of the leading outright, as a sidecar beside the DBN files
  (:mod:`alphafeat.synth.planted`: ts_recv, p_up), and the expected mid change over the next
  K = 1, 10, 50, 100, 200 events under the same model (``drift_K``: Monte-Carlo continuations
  of the simulator's state, :func:`alphafeat.synth.simulator.drift_estimate`), for
  ``alphamodel backtest``'s oracle, which trades on the change expected over its holding period;
* at a one-tick spread, w.p. ``p_move = min(P_MOVE_MAX, (vol S / tick)^2 / events)`` times the
  stochastic volatility of the minute the mid
  moves one tick (up w.p. u): the best level against the move goes (its orders cancelled from
  the back but the first, which a marketable order fills w.p. :data:`P_MOVE_TRADE`) and a new
  level opens one tick better on the other side, in one event (``F_LAST`` at its end) — unless
  w.p. :data:`P_WIDEN` x the profile's widening factor it leaves a two-tick spread, which an
  order inside it closes w.p. :data:`FILL_PER_ACTIVITY` x activity (at most :data:`FILL_MAX`)
  per event, on the bid w.p. u; w.p. :data:`P_JUMP` the move runs over 1 + Geometric(1/2) more
  ticks (return tails);
* other events never move a best price: marketable orders (w.p. :data:`P_TRADE`; 1 contract
  w.p. 0.6 else 1 + Geometric(mean 4.5), never the whole best level) whose sign follows the
  running metaorder w.p. :data:`META_SHARE` (metaorder lengths Pareto with exponent
  :data:`META_ALPHA` = 1.5: trade signs long-memory, autocorrelation ~ lag^-0.5, Lillo & Farmer
  2004), else a coin; locks (an order at the opposite best for one event, w.p. :data:`P_LOCK`);
  limit activity at level k (probability :data:`P_LEVEL0` at level 1, geometric below): add
  w.p. ``T_k / (T_k + size_k)`` (T = :data:`T_LEVEL1`, :data:`T_DEEP`) a new order (size 1 w.p.
  0.7 else 1 + Geometric(mean 3)) or w.p. :data:`P_MODIFY_UP` an 'M' growing a resting order
  (loses priority); otherwise cancel a random order or w.p. :data:`P_MODIFY_DOWN` shrink it; the
  best level keeps at least one order.

So with ``--signal 0`` the leader's mid is a martingale: no feature of the past predicts its
direction at any horizon (tested: the AUC ceiling's interval covers 1/2, a logistic regression
on all features scores 1/2 on held-out sessions). With ``history`` only the flow's past predicts
it: a model given the last rows beats one given the current row (tested). The default strength
puts the ceiling in the range real studies report for ES-like books (next-move AUC from queue
imbalance about 0.7-0.8, fixed horizons of 10-100 events about 0.55-0.65 and less beyond:
Gould & Bonart 2016; Kolm, Turiel & Westray 2023, Math. Finance 33(4); Briola, Bartolucci &
Aste 2025, "Deep limit order book forecasting", Quant. Finance; Prata et al. 2024 LOBCAST);
``alphafeat synth --report`` measures it beside the stylised facts. At the default no oracle
(a trader who knows the planted drift) wins at a 1/4-tick fee in any fill mode, with hysteresis
or without (docs/performance.md, Backtest). :data:`TRADABLE_SIGNAL` (``--signal-kind history
--signal 64``) is the "tradable market" of the tests and benches: there the oracle with
hysteresis (``oracle-band``) also wins at 1/4 tick per side in ``taker``, ``mid`` and ``passive``
mode (PSR 1.000 at stride 200 on 50 quiet sessions).

Non-leading instruments (deferred outrights, calendar spreads)
--------------------------------------------------------------
Queue-reactive as before (:func:`alphafeat.synth.kernels._step_follow`): signal ``S = clip(w_I
I + w_F tanh(F_fast / 10) + w_R clip((R - mid) / 4 ticks, -1, 1), -1, 1)`` (F_fast decayed by
0.95 per event; (w_I, w_F) = (0.35, 0.35) x min(strength, 1), w_R = 0.6), up-pressure ``u =
1/2 + 1/2 kappa S`` (kappa = :data:`OFI_STRENGTH`). R is an outright's fair value (the leader's
mid on a 1 s grid times the carry ratio; a level opens inside a wide spread or the stale best
level is pulled when R is over :data:`FOLLOW_TICKS` from the mid, so thin contracts move with the
front) or a spread's carry value. Their direction is predictable from the leader's mid (a
lead-lag), as in real calendar structures; the signal knob concerns the leader.

Rare cases (stated rates, counted per session in ``synth-report.json``): each session opens
with a snapshot of every resting order (flags ``F_SNAPSHOT | F_BAD_TS_RECV``, as Databento's);
with probability :data:`P_CROSSED_PREOPEN` per outright two pre-open orders cross the book
(5 s and 15 s after the open) and an uncrossing trade 30 s after the open clears them;
continuous trading starts :data:`OPEN_DELAY_NS` after the open. A locked book (one event long)
w.p. :data:`P_LOCK` per event at a one-tick spread. ``F_BAD_TS_RECV`` on the records of an event
w.p. :data:`P_BAD_TS`. A side thinner than 10 levels is refilled w.p. :data:`P_REPLENISH` per
event, else it shows UNDEF_PRICE levels (the spreads always show 5 levels).

Records
-------
MBO (DBN ``MBOMsg``): 'A' add, 'C' cancel (size = quantity removed), 'M' modify (new size),
'T' trade (order id 0, side = aggressor, one per price level), 'F' fill (resting order, side
= resting side), then a 'C' per fill; ``F_LAST`` on the last record of every event. MBP-10 is
derived in the same pass: one record per book-changing MBO record whose level is in the top
10 (the book after the change; counts = orders per level), plus the 'T' records (book before
the trade), ``F_LAST`` on the last MBP-10 record of the event. So rebuilding the book from the
MBO file (:func:`alphafeat.book.rebuild_mbo`) gives exactly the MBP-10 file's top 10 at every
``F_LAST`` (tested). ``ts_recv = ts_event + 80 us + Exp(25 us)`` non-decreasing per
instrument; files sorted by ``ts_recv`` (stable). The trades file holds the MBP-10 'T'
records with ``F_LAST`` set.

Planted predictability: :func:`auc_ceiling` reports the best possible AUC per label horizon
(30, 100, 300, 1000, 6000 snapshots) for the leading outright of the first session, by
Monte-Carlo continuations under the true model from :data:`AUC_STATES` states with
:data:`AUC_PATHS` paths each, a bias-corrected estimator (:func:`ceiling_estimate`) and a
bootstrap interval (:func:`ceiling_interval`); ``generate`` writes them to
``synth-report.json`` and the CLI prints them.

Prices across sessions
----------------------
A spot-like index level ``S`` opens session d at ``level(d) exp(X(d))`` and closes it at
``level(d) exp(X(next d))`` (``X`` an AR(1) of seeded session moves with s.d.
``min(DAILY_VOL, sqrt(P_MOVE_MAX events) tick / S)``), so the next session of a contract opens
where this one closed, apart from the level table's trend (0.06 % a calendar day in 2024) in the
overnight gap. Outright c is priced ``S exp(CARRY_RATE T_c)`` (T_c years to its expiry): ESM4
trades about 60 points above ESH4 in March 2024, a calendar spread at its front leg minus its
deferred leg.

Determinism: no wall clock; every random stream is a numpy ``Generator`` seeded from
``(seed, date, instrument id, stream)``; zstd level fixed (:data:`ZSTD_LEVEL`, single threaded).
Speed: ``bench/synth.py``.
"""

from alphafeat.synth.calendar import (
    ACTIVITY_PROFILE,
    BASE_RATE,
    P_MOVE_MAX,
    SCALES,
    Contract,
    contracts_for,
    front_by_volume,
    nominal_events,
    session_bounds,
    trade_dates,
    volume_share,
)
from alphafeat.synth.ceiling import (
    AUC_HORIZONS,
    AUC_PATHS,
    AUC_STATES,
    auc_ceiling,
    ceiling_estimate,
    ceiling_interval,
    soft_auc,
)
from alphafeat.synth.generate import DEFAULT_SAMPLE, REPORT_NAME, generate, make_default_sample
from alphafeat.synth.kernels import LMAX_OUTRIGHT
from alphafeat.synth.params import (
    BURST_MEAN,
    DEFAULT_SIGNAL,
    FILL_MAX,
    FILL_PER_ACTIVITY,
    FOLLOW_TICKS,
    META_ALPHA,
    META_SHARE,
    OFI_STRENGTH,
    OPEN_DELAY_NS,
    P_CROSSED_PREOPEN,
    P_JUMP,
    P_LEVEL0,
    P_LOCK,
    P_MODIFY_DOWN,
    P_MODIFY_UP,
    P_MOVE_TRADE,
    P_TRADE,
    P_WIDEN,
    SIGNAL_BOOK,
    SIGNAL_HISTORY,
    SIGNAL_KINDS,
    SV_SD,
    SV_TAU_MIN,
    T_DEEP,
    T_LEVEL1,
    TRADABLE_SIGNAL,
    VOL_SD,
    VOL_TAU_MIN,
    Signal,
)
from alphafeat.synth.records import UNDEF_PRICE
from alphafeat.synth.simulator import activity_segments, simulate_session, volatility_multipliers
from alphafeat.synth.writer import FAST_ZSTD_LEVEL, ZSTD_LEVEL

__all__ = [
    "ACTIVITY_PROFILE",
    "AUC_HORIZONS",
    "AUC_PATHS",
    "AUC_STATES",
    "BASE_RATE",
    "BURST_MEAN",
    "DEFAULT_SAMPLE",
    "DEFAULT_SIGNAL",
    "FAST_ZSTD_LEVEL",
    "FILL_MAX",
    "FILL_PER_ACTIVITY",
    "FOLLOW_TICKS",
    "LMAX_OUTRIGHT",
    "META_ALPHA",
    "META_SHARE",
    "OFI_STRENGTH",
    "OPEN_DELAY_NS",
    "P_CROSSED_PREOPEN",
    "P_JUMP",
    "P_LEVEL0",
    "P_LOCK",
    "P_MODIFY_DOWN",
    "P_MODIFY_UP",
    "P_MOVE_MAX",
    "P_MOVE_TRADE",
    "P_TRADE",
    "P_WIDEN",
    "REPORT_NAME",
    "SCALES",
    "SIGNAL_BOOK",
    "SIGNAL_HISTORY",
    "SIGNAL_KINDS",
    "SV_SD",
    "SV_TAU_MIN",
    "T_DEEP",
    "T_LEVEL1",
    "TRADABLE_SIGNAL",
    "UNDEF_PRICE",
    "VOL_SD",
    "VOL_TAU_MIN",
    "ZSTD_LEVEL",
    "Contract",
    "Signal",
    "simulate_session",
    "soft_auc",
    "activity_segments",
    "auc_ceiling",
    "ceiling_estimate",
    "ceiling_interval",
    "contracts_for",
    "front_by_volume",
    "generate",
    "make_default_sample",
    "nominal_events",
    "session_bounds",
    "trade_dates",
    "volatility_multipliers",
    "volume_share",
]
