"""Synthetic CME Globex E-mini S&P 500 (``ES.FUT``) data written as genuine Databento DBN v3.

:func:`generate` writes one zstd-compressed DBN v3 file per trading session and schema, named
like Databento's (``glbx-mdp3-YYYYMMDD.mbp-10.dbn.zst``, ``.trades.dbn.zst``,
``.definition.dbn.zst``, ``.mbo.dbn.zst``), readable by ``databento.DBNStore.from_file(path).to_ndarray()``.

Instruments
-----------
By default the three nearest quarterly outrights at the session date (H/M/U/Z expire on the
third Friday of Mar/Jun/Sep/Dec, trading ends 08:30 CT that day) and the calendar spreads of
neighbours ``"<q1>-<q2>"``, ``"<q2>-<q3>"`` (instrument_class ``'S'``, price = front - back, tick 0.05 index points as
on CME; outrights tick 0.25). Instrument ids are exchange-like and not in expiry order: a fixed
table (ESH4 17077, ESM4 5602, ESH4-ESM4 17684, ESU4 118, ESZ4 183748, ...) else a CRC32 hash
of the symbol. Prices are int64 in 1e-9 index points.

Sessions
--------
Trade date D (Mon-Fri; exchange holidays are not modelled) runs from 17:00 America/Chicago on
the calendar day before D to 16:00 America/Chicago on D (zoneinfo, DST aware; Monday's session
opens Sunday 17:00). Every ``ts_recv`` of a session file lies in ``[start, end)``. Event rates
follow a piecewise-constant time-of-day profile (:data:`ACTIVITY_PROFILE`): the regular session
08:30-15:15 CT carries about 70 % of the events.

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

Book model (per instrument, :func:`_simulate`, numba): order level (MBO)
-------------------------------------------------------------------------
State: best bid tick b, best ask tick a; per side up to :data:`LMAX_OUTRIGHT` (12; 5 for the
spread, :data:`LMAX_SPREAD`) contiguous price levels, each a FIFO queue of orders (id, size).
Event times: a cluster process (burst starts Poisson at the profile rate / :data:`BURST_MEAN`;
gaps inside a burst Exp(50 us) with probability 0.7 else Exp(4 ms)). Each event:

* signal ``S = clip(w_I * I + w_F * tanh(F / F0) + w_R * clip((R - mid) / 4 ticks, -1, 1), -1, 1)``
  with I the level-1 queue imbalance, F the signed aggressor volume decayed by 0.95 per event
  (F0 = 10 contracts), R a reference mid: for the leading outright a latent random walk
  (per-event N(0, sigma^2), daily s.d. :data:`DAILY_VOL` of the price), for the other outrights
  the leader's mid (1 s grid) + carry, for spreads the carry fair value;
  (w_I, w_F, w_R) = (0.35, 0.35, 0.6); up-pressure ``u = 0.5 + 0.5 * kappa * S``, kappa =
  :data:`OFI_STRENGTH` (0.5) is the planted strength of the response to order-flow imbalance;
* a locked book (below) is unlocked: the locking order is cancelled;
* spread > 1 tick: with probability :data:`P_FILL` an order opens a level inside it, on the
  bid with probability u;
* else with probability :data:`P_TRADE` a marketable order, buy with probability u: it clears
  the best level with probability :data:`P_SWEEP` + 0.05 |gap term|, else 1 contract
  (probability 0.6) or 1 + Geometric(mean 4.5); it fills resting orders FIFO, level by level;
* else limit activity at level k (probability :data:`P_LEVEL0` at level 1, geometric below):
  add with probability ``T_k / (T_k + size_k)`` (T = :data:`T_LEVEL1`, :data:`T_DEEP`
  contracts; at level 1 times 2u on the bid and 2(1 - u) on the ask, so pressure feeds one
  side and depletes the other), as a new order (size 1 w.p. 0.7 else 1 + Geometric(mean 3)) or,
  w.p. :data:`P_MODIFY_UP`, an 'M' growing a resting order (loses priority); otherwise a random
  order is cancelled or, w.p. :data:`P_MODIFY_DOWN`, shrunk by an 'M'. A lone order at level 1
  is pulled w.p. :data:`P_FLICKER`. Inner levels never empty; an emptied level 1 shifts the side.

Rare cases (stated rates, counted per session in ``synth-report.json``): each session opens
with a snapshot of every resting order (flags ``F_SNAPSHOT | F_BAD_TS_RECV``, as Databento's);
with probability :data:`P_CROSSED_PREOPEN` per outright two pre-open orders cross the book
(5 s and 15 s after the open) and an uncrossing trade 30 s after the open clears them;
continuous trading starts :data:`OPEN_DELAY_NS` after the open. A locked book (an order at the
opposite best, one event long) w.p. :data:`P_LOCK` per event at a one-tick spread.
``F_BAD_TS_RECV`` on the records of an event w.p. :data:`P_BAD_TS`. A side thinner than 10
levels is refilled w.p. :data:`P_REPLENISH` per event, else it shows UNDEF_PRICE levels (the
spreads always show 5 levels).

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
Monte-Carlo continuations under the true model; ``generate`` writes it to
``synth-report.json`` and the CLI prints it.

Determinism: no wall clock; every random stream is a numpy ``Generator`` seeded from
``(seed, date, instrument id, stream)``; zstd level fixed (:data:`ZSTD_LEVEL`, single threaded).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import databento_dbn as dbn
import joblib
import numba
import numpy as np
import zstandard

__all__ = [
    "ACTIVITY_PROFILE",
    "DEFAULT_SAMPLE",
    "OFI_STRENGTH",
    "SCALES",
    "ZSTD_LEVEL",
    "Contract",
    "auc_ceiling",
    "contracts_for",
    "front_by_volume",
    "generate",
    "make_default_sample",
    "session_bounds",
    "trade_dates",
    "volume_share",
]

logger = logging.getLogger(__name__)

CT = ZoneInfo("America/Chicago")
UTC = datetime.timezone.utc

#: Databento's null price (i64::MAX), 1e-9 fixed point.
UNDEF_PRICE = 2**63 - 1
#: Flag marking the last record of an event.
F_LAST = 0x80
#: GLBX.MDP3 publisher id.
PUBLISHER_ID = 1
#: Outright tick, 1e-9 index points (0.25).
OUTRIGHT_TICK = 250_000_000
#: Calendar-spread tick, 1e-9 index points (0.05).
SPREAD_TICK = 50_000_000
#: Fixed zstd compression level (output bytes depend only on the arguments).
ZSTD_LEVEL = 12
#: Strength kappa of the mid's response to order-flow imbalance (0 = none, < 1).
OFI_STRENGTH = 0.5
#: Event-rate multipliers of the ``scale`` argument.
SCALES = {"quiet": 1.0, "normal": 10.0, "busy": 100.0, "full": 300.0}
#: zstd level of big sets (scales other than quiet) unless given.
FAST_ZSTD_LEVEL = 1
#: Name of the JSON report written next to the data.
REPORT_NAME = "synth-report.json"
#: Book events per second per unit of profile multiplier and unit volume share at scale 1.
BASE_RATE = 0.085
#: Weights of level-1 queue imbalance, signed-flow and reference-gap terms in the signal S.
W_IMB, W_FLOW, W_REF = 0.35, 0.35, 0.6
#: Size targets (contracts) of level 1 and of deeper levels.
T_LEVEL1, T_DEEP = 35.0, 55.0
#: Probability that a book event is a marketable order (outrights; the spread).
P_TRADE, P_TRADE_SPREAD = 0.07, 0.04
#: Share of limit add / cancel / modify events at level 1 (the rest decays geometrically
#: with ratio 0.8 over levels 2-10).
P_LEVEL0 = 0.35
#: Probability that a level-1 event on a best level holding a single order cancels it (quote
#: flicker), and that a marketable order clears the whole best level (plus 0.05 |gap|).
P_FLICKER, P_SWEEP = 0.1, 0.05
#: Probability that an event opens a level inside a spread wider than one tick.
P_FILL = 0.2
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
#: Label horizons (snapshots) of the AUC ceiling, saved states and paths per state.
AUC_HORIZONS = (30, 100, 300, 1000, 6000)
AUC_STATES, AUC_PATHS = 160, 32
#: Daily standard deviation of the leading outright's latent fair value, fraction of price.
DAILY_VOL = 0.005
#: Annualised cost of carry used to price deferred contracts (back = front * (1 + c * years)).
CARRY_RATE = 0.045

#: Time-of-day activity profile, CT wall clock: (start "HH:MM", end "HH:MM", multiplier).
#: Segments starting at or after 17:00 lie on the calendar day before the trade date.
ACTIVITY_PROFILE: tuple[tuple[str, str, float], ...] = (
    ("17:00", "18:00", 1.0),
    ("18:00", "02:00", 0.5),
    ("02:00", "07:00", 1.0),
    ("07:00", "08:30", 1.8),
    ("08:30", "09:00", 8.0),
    ("09:00", "14:30", 4.5),
    ("14:30", "15:15", 6.0),
    ("15:15", "16:00", 1.5),
)

DEFAULT_SAMPLE = dict(
    start=datetime.date(2024, 3, 6),
    sessions=3,
    seed=20240306,
    schemas=("mbp-10", "trades"),
    scale="quiet",
)

_SCHEMAS = {
    "mbo": dbn.Schema.MBO,
    "mbp-10": dbn.Schema.MBP_10,
    "trades": dbn.Schema.TRADES,
    "definition": dbn.Schema.DEFINITION,
}
_MONTH_CODES = {3: "H", 6: "M", 9: "U", 12: "Z"}
_CODE_MONTHS = {v: k for k, v in _MONTH_CODES.items()}
#: Known exchange ids (GLBX.MDP3); others are hashed.
_KNOWN_IDS = {
    "ESH1": 5482,
    "ESM3": 95414,
    "ESH4": 17077,
    "ESM4": 5602,
    "ESU4": 118,
    "ESZ4": 183748,
    "ESH4-ESM4": 17684,
}
#: Approximate ES level at 1 January of each year (index points), interpolated linearly.
_LEVELS_BY_YEAR = {
    2018: 2690.0, 2019: 2510.0, 2020: 3230.0, 2021: 3750.0, 2022: 4770.0,
    2023: 3860.0, 2024: 4780.0, 2025: 5900.0, 2026: 6900.0, 2027: 7200.0,
}

MBP10_DTYPE = np.dtype(dbn.MBP10Msg._dtypes)
MBO_DTYPE = np.dtype(dbn.MBOMsg._dtypes)
_MBO_SIZE = MBO_DTYPE.itemsize
TRADE_DTYPE = np.dtype(dbn.TradeMsg._dtypes)
DEF_DTYPE = np.dtype(dbn.InstrumentDefMsg._dtypes)

# Byte layout the numba kernel writes through int64 / uint32 / uint8 views of a record.
_MBP_SIZE = MBP10_DTYPE.itemsize
_EXPECTED_OFFSETS = {
    "ts_event": 8, "price": 16, "size": 24, "action": 28, "side": 29, "flags": 30,
    "depth": 31, "ts_recv": 32, "ts_in_delta": 40, "sequence": 44,
    "bid_px_00": 48, "ask_px_00": 56, "bid_sz_00": 64, "ask_sz_00": 68, "bid_ct_00": 72,
    "ask_ct_00": 76, "bid_px_01": 80,
}
assert _MBP_SIZE == 368 and TRADE_DTYPE.itemsize == 48 and _MBO_SIZE == 56
assert [MBO_DTYPE.fields[k][1] for k in ("ts_event", "order_id", "price", "size", "flags", "action", "side",
        "ts_recv", "ts_in_delta", "sequence")] == [8, 16, 24, 32, 36, 38, 39, 40, 48, 52]
assert all(MBP10_DTYPE.fields[k][1] == v for k, v in _EXPECTED_OFFSETS.items())
assert TRADE_DTYPE.names == MBP10_DTYPE.names[: len(TRADE_DTYPE.names)]


# --------------------------------------------------------------------------------------------
# Calendar, contracts, shares
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contract:
    """One instrument of the ``ES.FUT`` parent.

    Attributes
    ----------
    symbol : str
        Raw symbol, e.g. ``"ESH4"`` or ``"ESH4-ESM4"``.
    instrument_id : int
        Exchange-like id (not in expiry order).
    expiration_ns : int
        End of trading, ns since the UNIX epoch (08:30 CT on the third Friday; for a spread
        the first leg's).
    legs : tuple[str, ...]
        The two outrights of a calendar spread (front, back); empty for an outright.
    """

    symbol: str
    instrument_id: int
    expiration_ns: int
    legs: tuple[str, ...] = ()

    @property
    def is_spread(self) -> bool:
        """True for a calendar spread."""
        return bool(self.legs)

    @property
    def tick(self) -> int:
        """Minimum price increment, 1e-9 index points."""
        return SPREAD_TICK if self.legs else OUTRIGHT_TICK


def _third_friday(year: int, month: int) -> datetime.date:
    first = datetime.date(year, month, 1)
    return first + datetime.timedelta(days=(4 - first.weekday()) % 7 + 14)


def _quarterly_symbol(year: int, month: int) -> str:
    return f"ES{_MONTH_CODES[month]}{year % 10}"


def _parse_outright(symbol: str, near: datetime.date) -> tuple[int, int]:
    """(year, month) of an outright symbol like ``ESM4``; the decade is the one nearest ``near``."""
    if len(symbol) != 4 or not symbol.startswith("ES") or symbol[2] not in _CODE_MONTHS:
        raise ValueError(f"not an ES quarterly outright symbol: {symbol!r}")
    if not symbol[3].isdigit():
        raise ValueError(f"not an ES quarterly outright symbol: {symbol!r}")
    digit = int(symbol[3])
    base = near.year - near.year % 10 + digit
    year = min((base - 10, base, base + 10), key=lambda y: abs(y - near.year - 0.5))
    return year, _CODE_MONTHS[symbol[2]]


def _expiry_date(symbol: str, near: datetime.date) -> datetime.date:
    return _third_friday(*_parse_outright(symbol, near))


def _expiration_ns(day: datetime.date) -> int:
    return _ns(datetime.datetime(day.year, day.month, day.day, 8, 30, tzinfo=CT))


def _instrument_id(symbol: str) -> int:
    if symbol in _KNOWN_IDS:
        return _KNOWN_IDS[symbol]
    iid = 1000 + zlib.crc32(symbol.encode()) % 900_000
    while iid in _KNOWN_IDS.values():
        iid += 1
    return iid


def _ns(t: datetime.datetime) -> int:
    delta = t.astimezone(UTC) - datetime.datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _make_contract(symbol: str, near: datetime.date) -> Contract:
    if "-" in symbol:
        legs = tuple(symbol.split("-"))
        if len(legs) != 2:
            raise ValueError(f"not a calendar spread symbol: {symbol!r}")
        exp = min(_expiry_date(s, near) for s in legs)
        return Contract(symbol, _instrument_id(symbol), _expiration_ns(exp), legs)
    return Contract(symbol, _instrument_id(symbol), _expiration_ns(_expiry_date(symbol, near)))


def _next_quarterlies(day: datetime.date, count: int) -> list[str]:
    out: list[str] = []
    year, month = day.year, 3 * ((day.month - 1) // 3 + 1)
    while len(out) < count:
        if _third_friday(year, month) >= day:
            out.append(_quarterly_symbol(year, month))
        month += 3
        if month > 12:
            year, month = year + 1, 3
    return out


def contracts_for(day: datetime.date, contracts: Sequence[str] | None = None) -> list[Contract]:
    """Instruments trading in session ``day``.

    Parameters
    ----------
    day : datetime.date
        Trade date.
    contracts : sequence of str, optional
        Raw symbols to use; default: the two nearest quarterly outrights not yet expired on
        ``day`` and their calendar spread. Contracts already expired on ``day`` are dropped.

    Returns
    -------
    list[Contract]
    """
    if contracts is None:
        q1, q2, q3 = _next_quarterlies(day, 3)
        symbols: list[str] = [q1, q2, q3, f"{q1}-{q2}", f"{q2}-{q3}"]
    else:
        symbols = list(dict.fromkeys(contracts))
    out = [_make_contract(s, day) for s in symbols]
    day_ns = _expiration_ns(day)
    return [c for c in out if c.expiration_ns >= day_ns]


def _logistic(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _rolled_fraction(symbol: str, day: datetime.date) -> float:
    """Fraction of volume rolled away from outright ``symbol`` by trade date ``day`` (0..1)."""
    center = _expiry_date(symbol, day).toordinal() - 8.5
    return _logistic((day.toordinal() - center) / 0.8)


def _previous_quarterly(symbol: str, day: datetime.date) -> str:
    year, month = _parse_outright(symbol, day)
    month -= 3
    if month < 3:
        year, month = year - 1, 12
    return _quarterly_symbol(year, month)


def volume_share(symbol: str, day: datetime.date) -> float:
    """Share of ES volume (and of book activity) of outright ``symbol`` on trade date ``day``.

    ``max((1 - L_c(d)) * L_prev(d), floor)`` with ``L`` the logistic rolled fraction centred
    8.5 days before expiry (scale 0.8 days); floor 0.02 for the expiring contract (it keeps
    trading until expiry) and 0.005 for deferred ones.
    """
    prev = _previous_quarterly(symbol, day)
    rolled_in = _rolled_fraction(prev, day) if _expiry_date(prev, day) >= day else 1.0
    share = (1.0 - _rolled_fraction(symbol, day)) * rolled_in
    floor = 0.02 if rolled_in > 0.5 else 0.005
    return max(share, floor)


def _spread_share(c: Contract, day: datetime.date) -> float:
    w = _rolled_fraction(c.legs[0], day)
    return 0.03 * (1.0 + 2.0 * 4.0 * w * (1.0 - w))


def front_by_volume(day: datetime.date, contracts: Sequence[str] | None = None) -> str:
    """Outright with the largest :func:`volume_share` (the planted front month) on ``day``."""
    outs = [c.symbol for c in contracts_for(day, contracts) if not c.is_spread]
    return max(outs, key=lambda s: volume_share(s, day))


def trade_dates(start: datetime.date, sessions: int) -> list[datetime.date]:
    """The first ``sessions`` weekdays on or after ``start`` (holidays are not modelled)."""
    out: list[datetime.date] = []
    day = start
    while len(out) < sessions:
        if day.weekday() < 5:
            out.append(day)
        day += datetime.timedelta(days=1)
    return out


def session_bounds(day: datetime.date) -> tuple[int, int]:
    """``[start, end)`` of trade date ``day`` in ns since the epoch: D-1 17:00 CT to D 16:00 CT."""
    prev = day - datetime.timedelta(days=1)
    t0 = datetime.datetime(prev.year, prev.month, prev.day, 17, 0, tzinfo=CT)
    t1 = datetime.datetime(day.year, day.month, day.day, 16, 0, tzinfo=CT)
    return _ns(t0), _ns(t1)


def _profile_segments(day: datetime.date) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Profile segments of session ``day``: start ns, end ns, multiplier (DST aware)."""
    prev = day - datetime.timedelta(days=1)
    starts, ends, mults = [], [], []
    for a, b, m in ACTIVITY_PROFILE:
        ha, ma = map(int, a.split(":"))
        hb, mb = map(int, b.split(":"))
        da = prev if ha >= 17 else day
        db_ = da if (hb, mb) > (ha, ma) else da + datetime.timedelta(days=1)
        starts.append(_ns(datetime.datetime(da.year, da.month, da.day, ha, ma, tzinfo=CT)))
        ends.append(_ns(datetime.datetime(db_.year, db_.month, db_.day, hb, mb, tzinfo=CT)))
        mults.append(m)
    return np.array(starts, np.int64), np.array(ends, np.int64), np.array(mults, np.float64)


def _anchor_price(day: datetime.date, seed: int) -> float:
    """Front-contract level (index points) around which session ``day`` opens.

    A yearly level table interpolated linearly, times ``exp(0.008 * sum of 20 daily N(0,1)
    shocks)`` over the last 20 weekdays (so consecutive sessions move ~1.1 % apart).
    """
    years = sorted(_LEVELS_BY_YEAR)
    lo, hi = datetime.date(years[0], 1, 1), datetime.date(years[-1], 1, 1)
    clamped = min(max(day, lo), hi)
    if clamped.year == years[-1]:
        level = _LEVELS_BY_YEAR[years[-1]]
    else:
        frac = (clamped - datetime.date(clamped.year, 1, 1)).days / 365.25
        level = (_LEVELS_BY_YEAR[clamped.year] * (1.0 - frac)
                 + _LEVELS_BY_YEAR[clamped.year + 1] * frac)
    shock = 0.0
    d = day
    for _ in range(20):
        while d.weekday() >= 5:
            d -= datetime.timedelta(days=1)
        rng = np.random.default_rng(np.random.SeedSequence([seed, d.toordinal(), 0, 1]))
        shock += float(rng.standard_normal())
        d -= datetime.timedelta(days=1)
    return level * math.exp(0.008 * shock)


def _fair_price(c: Contract, day: datetime.date, anchor: float) -> float:
    """Fair price in index points: anchor carried to the contract's expiry (spread: leg diff)."""
    nearest = _expiry_date(_next_quarterlies(day, 1)[0], day)

    def outright(sym: str) -> float:
        years = (_expiry_date(sym, day) - nearest).days / 365.0
        return anchor * (1.0 + CARRY_RATE * years)

    if c.is_spread:
        return outright(c.legs[0]) - outright(c.legs[1])
    return outright(c.symbol)


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

# scalar-state indices (int64 array ``ist``)
_IB, _IA, _INB, _INA, _IOID, _ILOCK = 0, 1, 2, 3, 4, 5
# float-state indices (float64 array ``fst``)
_FFLOW, _FLAT = 0, 1
# event-context indices (int64 array ``ev``)
_ET, _ERC, _ESEQ, _ETID, _EFLAGS, _EWRITE = 0, 1, 2, 3, 4, 5
# parameter-vector indices (float64 array ``params``), see :func:`_params`
(_PKAPPA, _PWI, _PWF, _PWR, _PF0, _PDECAY, _PTRADE, _PFILL, _PT0, _PTD, _PSIGMA, _PSW0, _PSW1,
 _PLOCK, _PBADTS, _PREPL, _PLMAX, _PNMIN, _PTICK, _PMODUP, _PMODDN, _PL0, _PFLICK) = range(23)
_NPARAMS = 23


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
def _put_mbo(o8, o4, o1, n, ev, oid, px, size, action, side):
    """Write one MBOMsg body (header fields are filled later for the whole array)."""
    o8[n, 1] = ev[_ET]
    o8[n, 2] = oid
    o8[n, 3] = px
    o4[n, 8] = size
    o1[n, 36] = ev[_EFLAGS]
    o1[n, 38] = action
    o1[n, 39] = side
    o8[n, 5] = ev[_ERC]
    o4[n, 12] = ev[_ETID]
    o4[n, 13] = ev[_ESEQ]


@numba.njit(cache=True)
def _put_mbp(i8, u4, u1, n, ev, px, size, action, side, depth, ist, qn, lsz, tick):
    """Write one MBP10Msg: the update fields and the top-10 book of the current state."""
    i8[n, 1] = ev[_ET]
    i8[n, 2] = px
    i8[n, 4] = ev[_ERC]
    u4[n, 6] = size
    u4[n, 10] = ev[_ETID]
    u4[n, 11] = ev[_ESEQ]
    u1[n, 28] = action
    u1[n, 29] = side
    u1[n, 30] = ev[_EFLAGS]
    u1[n, 31] = depth
    undef = np.int64(9223372036854775807)
    b = ist[_IB]
    a = ist[_IA]
    nb = ist[_INB]
    na = ist[_INA]
    for k in range(10):
        if k < nb:
            i8[n, 6 + 4 * k] = (b - k) * tick
            u4[n, 16 + 8 * k] = lsz[0, k]
            u4[n, 18 + 8 * k] = qn[0, k]
        else:
            i8[n, 6 + 4 * k] = undef
            u4[n, 16 + 8 * k] = 0
            u4[n, 18 + 8 * k] = 0
        if k < na:
            i8[n, 7 + 4 * k] = (a + k) * tick
            u4[n, 17 + 8 * k] = lsz[1, k]
            u4[n, 19 + 8 * k] = qn[1, k]
        else:
            i8[n, 7 + 4 * k] = undef
            u4[n, 17 + 8 * k] = 0
            u4[n, 19 + 8 * k] = 0


@numba.njit(cache=True)
def _emit(s, k, px, oid, q, action, ist, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1):
    """Emit a book-changing MBO record and, when level ``k`` is in the top 10, its MBP-10
    record (the MBP-10 book is the state after the change)."""
    if ev[_EWRITE] == 0:
        return
    side = np.uint8(66) if s == 0 else np.uint8(65)
    _put_mbo(o8, o4, o1, cnt[0], ev, oid, px, q, action, side)
    cnt[0] += 1
    if k < 10:
        _put_mbp(i8, u4, u1, cnt[1], ev, px, q, action, side, k, ist, qn, lsz, tick)
        cnt[1] += 1


@numba.njit(cache=True)
def _lvl_px(ist, s, k, tick):
    return (ist[_IB] - k) * tick if s == 0 else (ist[_IA] + k) * tick


@numba.njit(cache=True)
def _insert_level0(s, ist, qid, qsz, qn, lsz):
    """Shift side ``s`` one level deeper and open an empty level 0 one tick better.

    The side must hold fewer than its maximum number of levels."""
    n = ist[_INB + s]
    for k in range(n, 0, -1):
        qn[s, k] = qn[s, k - 1]
        lsz[s, k] = lsz[s, k - 1]
        for j in range(qn[s, k]):
            qid[s, k, j] = qid[s, k - 1, j]
            qsz[s, k, j] = qsz[s, k - 1, j]
    qn[s, 0] = 0
    lsz[s, 0] = 0
    ist[_INB + s] = n + 1
    if s == 0:
        ist[_IB] += 1
    else:
        ist[_IA] -= 1


@numba.njit(cache=True)
def _remove_level0(s, ist, qid, qsz, qn, lsz):
    """Drop the (empty) level 0 of side ``s``; the next level becomes the best."""
    n = ist[_INB + s]
    for k in range(n - 1):
        qn[s, k] = qn[s, k + 1]
        lsz[s, k] = lsz[s, k + 1]
        for j in range(qn[s, k]):
            qid[s, k, j] = qid[s, k + 1, j]
            qsz[s, k, j] = qsz[s, k + 1, j]
    qn[s, n - 1] = 0
    lsz[s, n - 1] = 0
    ist[_INB + s] = n - 1
    if s == 0:
        ist[_IB] -= 1
    else:
        ist[_IA] += 1


@numba.njit(cache=True)
def _add(s, k, q, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1):
    """Add an order of ``q`` contracts at level ``k`` (``k`` = level count opens a new tail)."""
    n = ist[_INB + s]
    if k == n:
        ist[_INB + s] = n + 1
    px = _lvl_px(ist, s, k, tick)
    j = qn[s, k]
    if j == QMAX:  # full queue: grow the last order instead
        qsz[s, k, j - 1] += q
        lsz[s, k] += q
        _emit(s, k, px, qid[s, k, j - 1], qsz[s, k, j - 1], np.uint8(77), ist, qn, lsz, tick, ev,
              cnt, o8, o4, o1, i8, u4, u1)
        return
    oid = ist[_IOID]
    ist[_IOID] += 1
    qid[s, k, j] = oid
    qsz[s, k, j] = q
    qn[s, k] = j + 1
    lsz[s, k] += q
    _emit(s, k, px, oid, q, np.uint8(65), ist, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)


@numba.njit(cache=True)
def _cancel(s, k, j, q, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1):
    """Cancel ``q`` contracts of order ``j`` at level ``k`` (the whole order when that is all it
    has); an emptied level 0 is removed (the side shifts), an emptied tail level dropped."""
    px = _lvl_px(ist, s, k, tick)
    oid = qid[s, k, j]
    qsz[s, k, j] -= q
    lsz[s, k] -= q
    if qsz[s, k, j] <= 0:
        m = qn[s, k]
        for jj in range(j, m - 1):
            qid[s, k, jj] = qid[s, k, jj + 1]
            qsz[s, k, jj] = qsz[s, k, jj + 1]
        qn[s, k] = m - 1
    if qn[s, k] == 0:
        if k == 0:
            _remove_level0(s, ist, qid, qsz, qn, lsz)
        else:
            ist[_INB + s] -= 1
    _emit(s, k, px, oid, q, np.uint8(67), ist, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)


@numba.njit(cache=True)
def _modify(s, k, j, new, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1):
    """Change order ``j``'s size to ``new`` > 0; a size increase loses queue priority."""
    px = _lvl_px(ist, s, k, tick)
    oid = qid[s, k, j]
    lsz[s, k] += new - qsz[s, k, j]
    if new > qsz[s, k, j]:
        m = qn[s, k]
        for jj in range(j, m - 1):
            qid[s, k, jj] = qid[s, k, jj + 1]
            qsz[s, k, jj] = qsz[s, k, jj + 1]
        qid[s, k, m - 1] = oid
        qsz[s, k, m - 1] = new
    else:
        qsz[s, k, j] = new
    _emit(s, k, px, oid, new, np.uint8(77), ist, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)


@numba.njit(cache=True)
def _drop_tail(s, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1):
    """Cancel every order of side ``s``'s deepest level (it leaves the simulated depth)."""
    k = ist[_INB + s] - 1
    while ist[_INB + s] == k + 1 and qn[s, k] > 0:
        _cancel(s, k, qn[s, k] - 1, qsz[s, k, qn[s, k] - 1], ist, qid, qsz, qn, lsz, tick, ev, cnt,
                o8, o4, o1, i8, u4, u1)


@numba.njit(cache=True)
def _order_size(rng):
    """Limit-order size, contracts: 1 with probability 0.7, else 1 + Geometric(1/3) (mean 1.9)."""
    if rng.random() < 0.7:
        return np.int64(1)
    return np.int64(1 + _geometric(rng, 1.0 / 3.0))


@numba.njit(cache=True)
def _new_level(rng, s, k, target, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1):
    """Open level ``k`` (a new tail) with orders summing to about ``target`` contracts."""
    goal = max(1, np.int64(target * (0.3 + 1.0 * rng.random())))
    while lsz[s, k] < goal or qn[s, k] == 0:
        _add(s, k, _order_size(rng), ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)
        if qn[s, k] >= QMAX:
            break


@numba.njit(cache=True)
def _trade(rng, buy, qty, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1):
    """A marketable order of ``qty`` contracts (capped below the resting depth).

    MBO: one 'T' per price level traded (side = aggressor, order id 0), one 'F' per resting
    order filled (side = resting), then one 'C' per fill removing the filled quantity. MBP-10:
    the 'T' records (book before the trade) and the 'C' records. Returns the quantity traded."""
    s = 1 if buy else 0
    n = ist[_INB + s]
    total = 0
    for k in range(n):
        total += lsz[s, k]
    qty = min(qty, total - 1)
    if qty <= 0:
        return 0
    aggr = np.uint8(66) if buy else np.uint8(65)
    rest = np.uint8(65) if buy else np.uint8(66)
    write = ev[_EWRITE] != 0
    if write:
        rem = qty
        k = 0
        while rem > 0:
            f = min(rem, lsz[s, k])
            px = _lvl_px(ist, s, k, tick)
            _put_mbo(o8, o4, o1, cnt[0], ev, 0, px, f, np.uint8(84), aggr)
            cnt[0] += 1
            if k < 10:
                _put_mbp(i8, u4, u1, cnt[1], ev, px, f, np.uint8(84), aggr, k, ist, qn, lsz, tick)
                cnt[1] += 1
            rem -= f
            k += 1
        rem = qty
        k = 0
        j = 0
        while rem > 0:
            f = min(rem, qsz[s, k, j])
            _put_mbo(o8, o4, o1, cnt[0], ev, qid[s, k, j], _lvl_px(ist, s, k, tick), f,
                     np.uint8(70), rest)
            cnt[0] += 1
            rem -= f
            j += 1
            if j == qn[s, k]:
                k += 1
                j = 0
    rem = qty
    while rem > 0:
        f = min(rem, qsz[s, 0, 0])
        _cancel(s, 0, 0, f, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)
        rem -= f
    return qty


@numba.njit(cache=True)
def _replenish(rng, p, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1):
    """Refill sides thinner than ``nmin`` levels: each missing tail level with probability
    ``p_repl`` (an empty side always gets one level)."""
    nmin = np.int64(p[_PNMIN])
    for s in range(2):
        while ist[_INB + s] < nmin:
            if ist[_INB + s] > 0 and rng.random() >= p[_PREPL]:
                break
            _new_level(rng, s, ist[_INB + s], p[_PTD], ist, qid, qsz, qn, lsz, tick, ev, cnt,
                       o8, o4, o1, i8, u4, u1)


@numba.njit(cache=True)
def _open_inside(rng, s, q, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1, lmax):
    """A new best level one tick better on side ``s`` (the deepest level leaves if full)."""
    if ist[_INB + s] >= lmax:
        _drop_tail(s, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)
    _insert_level0(s, ist, qid, qsz, qn, lsz)
    _add(s, 0, q, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)


@numba.njit(cache=True)
def _step(rng, p, ref, ref_t0, ist, fst, qid, qsz, qn, lsz, ev, cnt, o8, o4, o1, i8, u4, u1):
    """One event of the book model (see the module docstring). Returns an event code:
    0 liquidity, 1 inside-spread level, 2 trade, 3 lock, 4 unlock."""
    tick = np.int64(p[_PTICK])
    lmax = np.int64(p[_PLMAX])
    b = ist[_IB]
    a = ist[_IA]
    fst[_FFLOW] *= p[_PDECAY]
    l0b = lsz[0, 0] if ist[_INB] > 0 else 0
    l0a = lsz[1, 0] if ist[_INA] > 0 else 0
    imb = (l0b - l0a) / max(1, l0b + l0a)
    sig = p[_PWI] * imb + p[_PWF] * math.tanh(fst[_FFLOW] / p[_PF0])
    gap = 0.0
    if p[_PSIGMA] > 0.0:
        fst[_FLAT] += p[_PSIGMA] * rng.standard_normal()
        gap = min(max((fst[_FLAT] - 0.5 * (a + b)) / 4.0, -1.0), 1.0)
    elif p[_PWR] != 0.0:
        gi = (ev[_ET] - ref_t0) // 1_000_000_000
        gi = min(max(gi, 0), ref.shape[0] - 1)
        gap = min(max((ref[gi] - 0.5 * (a + b)) / 4.0, -1.0), 1.0)
    sig = min(max(sig + p[_PWR] * gap, -1.0), 1.0)
    u = 0.5 + 0.5 * p[_PKAPPA] * sig
    code = 0
    if ist[_ILOCK] != 0:  # a locked book lasts one event: the locking order is cancelled
        s = ist[_ILOCK] - 1
        _cancel(s, 0, 0, qsz[s, 0, 0], ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)
        ist[_ILOCK] = 0
        code = 4
    elif a - b > 1 and rng.random() < p[_PFILL]:
        s = 0 if rng.random() < u else 1
        _open_inside(rng, s, _order_size(rng), ist, qid, qsz, qn, lsz, tick, ev, cnt,
                     o8, o4, o1, i8, u4, u1, lmax)
        code = 1
    elif rng.random() < p[_PTRADE]:
        buy = rng.random() < u
        s = 1 if buy else 0
        if rng.random() < p[_PSW0] + p[_PSW1] * abs(gap):
            qty = lsz[s, 0]  # clears the best level
        elif rng.random() < 0.6:
            qty = np.int64(1)
        else:
            qty = np.int64(min(1 + _geometric(rng, 1.0 / 4.5), 200))
        qty = _trade(rng, buy, qty, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)
        if qty > 0:
            fst[_FFLOW] += qty if buy else -qty
            code = 2
        else:
            _add(s, 0, _order_size(rng), ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)
    elif a - b == 1 and rng.random() < p[_PLOCK]:
        s = 0 if rng.random() < 0.5 else 1
        _open_inside(rng, s, _order_size(rng), ist, qid, qsz, qn, lsz, tick, ev, cnt,
                     o8, o4, o1, i8, u4, u1, lmax)
        ist[_ILOCK] = s + 1
        code = 3
    else:
        x = rng.random()
        k = 0
        acc = p[_PL0]
        while k < 9 and x > acc:
            k += 1
            acc += (1.0 - p[_PL0]) * (1.0 - 0.8) * 0.8 ** (k - 1) / (1.0 - 0.8 ** 9)
        s = 0 if rng.random() < 0.5 else 1
        n = ist[_INB + s]
        if k >= n:  # thin side: the event opens a new tail level
            if n < lmax:
                _add(s, n, _order_size(rng), ist, qid, qsz, qn, lsz, tick, ev, cnt,
                     o8, o4, o1, i8, u4, u1)
            else:
                _add(s, n - 1, _order_size(rng), ist, qid, qsz, qn, lsz, tick, ev, cnt,
                     o8, o4, o1, i8, u4, u1)
        else:
            sz = lsz[s, k]
            tgt = p[_PT0] if k == 0 else p[_PTD]
            p_add = tgt / (tgt + sz)
            if k == 0:
                p_add *= 2.0 * u if s == 0 else 2.0 * (1.0 - u)
            p_add = min(max(p_add, 0.02), 0.98)
            m = qn[s, k]
            if qn[s, k] <= 1 and 0 < k < n - 1:
                p_add = 1.0  # inner levels never empty (no holes in the book)
            elif k == 0 and m == 1 and n > 1 and rng.random() < p[_PFLICK]:
                p_add = 0.0  # a lone best order (typically just placed) is pulled: flicker
            if rng.random() < p_add:
                q = _order_size(rng)
                if m > 0 and rng.random() < p[_PMODUP]:
                    j = np.int64(rng.random() * m)
                    _modify(s, k, j, qsz[s, k, j] + q, ist, qid, qsz, qn, lsz, tick, ev, cnt,
                            o8, o4, o1, i8, u4, u1)
                else:
                    _add(s, k, q, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)
            else:
                j = np.int64(rng.random() * m)
                osz = qsz[s, k, j]
                if osz > 1 and rng.random() < p[_PMODDN]:
                    new = osz - min(_order_size(rng), osz - 1)
                    _modify(s, k, j, new, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)
                else:
                    _cancel(s, k, j, osz, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)
    if code != 3 and code != 4:
        _replenish(rng, p, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)
    return code


@numba.njit(cache=True)
def _mark_last(cnt, c0, c1, o1, u1):
    if cnt[0] > c0:
        o1[cnt[0] - 1, 36] |= 0x80
    if cnt[1] > c1:
        u1[cnt[1] - 1, 30] |= 0x80


@numba.njit(cache=True)
def _simulate(rng, times, t_open, b0, p, ref, ref_t0, seq0, oid0, cross, nlev0,
              o8, o4, o1, i8, u4, u1, sample_at, s_ist, s_fst, s_qsz, s_qn, s_lsz, stats):
    """Run one instrument's session: opening snapshot, optional crossed pre-open and its
    uncrossing trade, then one :func:`_step` per event time.

    Writes MBO records through the int64 / uint32 / uint8 views ``o8, o4, o1`` of a zeroed
    MBOMsg buffer and MBP-10 records through ``i8, u4, u1``. ``cross`` = -1 (no crossed
    pre-open), 0 (bids cross the ask) or 1 (asks cross the bid). States at the event indices
    ``sample_at`` (sorted) are copied into ``s_*`` for the Monte-Carlo AUC ceiling.
    ``stats`` (int64[8]) receives: events, locks, bad-ts events, trade events.
    Returns (n_mbo, n_mbp), or (-1, -1) when a buffer is too small.
    """
    tick = np.int64(p[_PTICK])
    lmax = np.int64(p[_PLMAX])
    capm = o8.shape[0]
    capp = i8.shape[0]
    ist = np.zeros(8, np.int64)
    fst = np.zeros(4, np.float64)
    qid = np.zeros((2, lmax, QMAX), np.int64)
    qsz = np.zeros((2, lmax, QMAX), np.int64)
    qn = np.zeros((2, lmax), np.int64)
    lsz = np.zeros((2, lmax), np.int64)
    cnt = np.zeros(2, np.int64)
    ev = np.zeros(6, np.int64)
    ist[_IB] = b0
    ist[_IA] = b0 + 1
    ist[_IOID] = oid0
    fst[_FLAT] = b0 + 0.5
    # opening snapshot: every resting order, flags F_SNAPSHOT | F_BAD_TS_RECV as Databento's
    ev[_ET] = t_open
    ev[_ERC] = t_open
    ev[_ESEQ] = seq0
    ev[_EFLAGS] = 0x28
    ev[_EWRITE] = 1
    for k in range(nlev0):
        for s in range(2):
            _new_level(rng, s, k, p[_PT0] if k == 0 else p[_PTD], ist, qid, qsz, qn, lsz, tick,
                       ev, cnt, o8, o4, o1, i8, u4, u1)
    _mark_last(cnt, 0, 0, o1, u1)
    ev[_EFLAGS] = 0
    if cross >= 0:  # crossed pre-open: two crossing orders, then the uncrossing trade
        s = cross
        for i in range(3):
            ev[_ET] = t_open + (5 + 10 * i) * 1_000_000_000
            ev[_ERC] = ev[_ET] + 90_000
            ev[_ESEQ] = seq0 + 1 + i
            c0 = cnt[0]
            c1 = cnt[1]
            if i < 2:
                _open_inside(rng, s, 1 + np.int64(3 * rng.random()), ist, qid, qsz, qn, lsz, tick,
                             ev, cnt, o8, o4, o1, i8, u4, u1, lmax)
            else:
                q = lsz[s, 0] + lsz[s, 1]
                _trade(rng, s == 0, q, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)
                for _ in range(2):  # the two crossing orders (one per level) are filled
                    _put_mbo(o8, o4, o1, cnt[0], ev, qid[s, 0, 0], _lvl_px(ist, s, 0, tick),
                             qsz[s, 0, 0], np.uint8(70), np.uint8(66) if s == 0 else np.uint8(65))
                    cnt[0] += 1
                    _cancel(s, 0, 0, qsz[s, 0, 0], ist, qid, qsz, qn, lsz, tick, ev, cnt,
                            o8, o4, o1, i8, u4, u1)
                _replenish(rng, p, ist, qid, qsz, qn, lsz, tick, ev, cnt, o8, o4, o1, i8, u4, u1)
            _mark_last(cnt, c0, c1, o1, u1)
    last_rc = ev[_ERC]
    si = 0
    ns = sample_at.shape[0]
    for e in range(times.shape[0]):
        if cnt[0] + _RESERVE > capm or cnt[1] + _RESERVE > capp:
            return -1, -1
        while si < ns and sample_at[si] == e:
            s_ist[si, :] = ist
            s_fst[si, :] = fst
            s_qsz[si] = qsz
            s_qn[si] = qn
            s_lsz[si] = lsz
            si += 1
        t = times[e]
        lat = np.int64(80_000 + min(rng.standard_exponential() * 25_000.0, 5_000_000.0))
        rc = max(t + lat, last_rc)
        last_rc = rc
        ev[_ET] = t
        ev[_ERC] = rc
        ev[_ESEQ] = seq0 + 4 + e
        ev[_ETID] = np.int64(15_000 + 15_000.0 * rng.random())
        ev[_EFLAGS] = 0x08 if rng.random() < p[_PBADTS] else 0
        c0 = cnt[0]
        c1 = cnt[1]
        code = _step(rng, p, ref, ref_t0, ist, fst, qid, qsz, qn, lsz, ev, cnt, o8, o4, o1, i8, u4, u1)
        _mark_last(cnt, c0, c1, o1, u1)
        stats[0] += 1
        if code == 3:
            stats[1] += 1
        if ev[_EFLAGS] != 0:
            stats[2] += 1
        if code == 2:
            stats[3] += 1
    return cnt[0], cnt[1]


@numba.njit(cache=True)
def _mc_outcomes(rng, p, s_ist, s_fst, s_qsz, s_qn, s_lsz, horizons, n_paths, out):
    """Monte-Carlo continuations of saved states under the true model (nothing written).

    ``out[i, r, h]`` = sign of the mid change (ticks x 2) after ``horizons[h]`` events on path
    ``r`` from saved state ``i`` (every event changes the book, so events = snapshots)."""
    lmax = np.int64(p[_PLMAX])
    ref = np.zeros(1)
    ev = np.zeros(6, np.int64)
    cnt = np.zeros(2, np.int64)
    d8 = np.zeros((1, 1), np.int64)
    d4 = np.zeros((1, 1), np.uint32)
    d1 = np.zeros((1, 1), np.uint8)
    qid = np.zeros((2, lmax, QMAX), np.int64)
    hmax = horizons[horizons.shape[0] - 1]
    for i in range(s_ist.shape[0]):
        for r in range(n_paths):
            ist = s_ist[i].copy()
            fst = s_fst[i].copy()
            qsz = s_qsz[i].copy()
            qn = s_qn[i].copy()
            lsz = s_lsz[i].copy()
            m0 = ist[_IB] + ist[_IA]
            h = 0
            for e in range(1, hmax + 1):
                _step(rng, p, ref, 0, ist, fst, qid, qsz, qn, lsz, ev, cnt, d8, d4, d1, d8, d4, d1)
                if e == horizons[h]:
                    d = ist[_IB] + ist[_IA] - m0
                    out[i, r, h] = 1 if d > 0 else (-1 if d < 0 else 0)
                    h += 1


# --------------------------------------------------------------------------------------------
# Session assembly
# --------------------------------------------------------------------------------------------


def _rng(seed: int, day: datetime.date, iid: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, day.toordinal(), iid, stream]))


def _params(c: Contract, sigma: float) -> np.ndarray:
    """Parameter vector of the book model for contract ``c`` (indices ``_P*``)."""
    p = np.zeros(_NPARAMS)
    p[_PKAPPA] = OFI_STRENGTH
    p[_PWI], p[_PWF], p[_PWR] = W_IMB, W_FLOW, W_REF
    p[_PF0], p[_PDECAY] = 10.0, 0.95
    p[_PTRADE] = P_TRADE_SPREAD if c.is_spread else P_TRADE
    p[_PFILL] = P_FILL
    p[_PT0], p[_PTD] = T_LEVEL1, T_DEEP
    p[_PSIGMA] = sigma
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
    return p


@dataclass
class _InstrumentRun:
    mbo: np.ndarray
    mbp: np.ndarray
    stats: np.ndarray
    crossed: bool
    saved: tuple[np.ndarray, ...] | None
    params: np.ndarray


def _simulate_instrument(
    c: Contract,
    day: datetime.date,
    seed: int,
    rate: float,
    fair: float,
    ref: np.ndarray | None,
    t0: int,
    t1: int,
    n_samples: int = 0,
) -> _InstrumentRun:
    """MBO and MBP-10 records (time order) of one instrument in one session.

    ``ref`` is the reference mid (ticks, 1 s grid from ``t0``); None for the leading outright,
    which tracks its own latent random walk instead (daily s.d. :data:`DAILY_VOL` of its price).
    ``rate`` is the book-event rate (events/s) at profile multiplier 1.
    """
    starts, ends, mults = _profile_segments(day)
    stop = min(t1 - 10_000_000, c.expiration_ns)
    ends = np.minimum(ends, stop)
    starts = np.maximum(starts, t0 + OPEN_DELAY_NS)  # continuous trading after the opening
    times = _event_times(_rng(seed, day, c.instrument_id, 1), starts, ends, mults * rate,
                         BURST_MEAN, BURST_P_SHORT, BURST_SHORT_NS, BURST_LONG_NS)
    tick = c.tick
    b0 = int(math.floor(fair * 1e9 / tick))
    sigma = 0.0
    if ref is None:
        sigma = DAILY_VOL * abs(fair) * 1e9 / tick / math.sqrt(max(times.shape[0], 1))
        ref = np.zeros(1)
    p = _params(c, sigma)
    lmax = int(p[_PLMAX])
    rng_x = _rng(seed, day, c.instrument_id, 3)
    cross = -1
    if not c.is_spread and rng_x.random() < P_CROSSED_PREOPEN:
        cross = int(rng_x.random() < 0.5)
    seq0 = 1_000_000 + zlib.crc32(f"{c.symbol}{day.isoformat()}".encode()) % 50_000_000
    oid0 = 6_400_000_000_000 + (c.instrument_id % 10_000) * 100_000_000 + (day.toordinal() % 97) * 1_000_000
    n = times.shape[0]
    sample_at = np.unique(np.linspace(0, max(n - 1, 0), n_samples).astype(np.int64)) if n_samples else \
        np.zeros(0, np.int64)
    ns = sample_at.shape[0]
    s_ist = np.zeros((ns, 8), np.int64)
    s_fst = np.zeros((ns, 4))
    s_qsz = np.zeros((ns, 2, lmax, QMAX), np.int64)
    s_qn = np.zeros((ns, 2, lmax), np.int64)
    s_lsz = np.zeros((ns, 2, lmax), np.int64)
    cap_m = int(1.6 * n) + 8 * _RESERVE
    cap_p = int(1.4 * n) + 8 * _RESERVE
    while True:
        # every byte of a record is written by the kernel or below, so no zeroing is needed
        mbo = np.empty(cap_m, MBO_DTYPE)
        mbp = np.empty(cap_p, MBP10_DTYPE)
        rm = mbo.view(np.uint8).reshape(cap_m, _MBO_SIZE)
        rp = mbp.view(np.uint8).reshape(cap_p, _MBP_SIZE)
        stats = np.zeros(8, np.int64)
        tk = time.perf_counter()
        nm, npp = _simulate(_rng(seed, day, c.instrument_id, 2), times, t0, b0, p, ref, t0, seq0, oid0,
                            cross, lmax, rm.view(np.int64), rm.view(np.uint32), rm,
                            rp.view(np.int64), rp.view(np.uint32), rp,
                            sample_at, s_ist, s_fst, s_qsz, s_qn, s_lsz, stats)
        logger.debug("%s %s: %d events, %d MBP-10 records in %.3f s", c.symbol, day, n, npp,
                     time.perf_counter() - tk)
        if nm >= 0:
            break
        cap_m *= 2
        cap_p *= 2
    mbo = mbo[:nm]
    mbp = mbp[:npp]
    for arr, size, rtype in ((mbo, _MBO_SIZE, 0xA0), (mbp, _MBP_SIZE, 0x0A)):
        arr["length"] = size // 4
        arr["rtype"] = rtype
        arr["publisher_id"] = PUBLISHER_ID
        arr["instrument_id"] = c.instrument_id
    mbo["channel_id"] = 0
    saved = (s_ist, s_fst, s_qsz, s_qn, s_lsz) if ns else None
    return _InstrumentRun(mbo, mbp, stats, cross >= 0, saved, p)


def _mid_grid(buf: np.ndarray, t0: int, t1: int, tick: int, initial: float) -> np.ndarray:
    """Mid (in ticks) at the end of every 1 s step from ``t0``: last F_LAST book before it."""
    grid = t0 + 1_000_000_000 * np.arange((t1 - t0) // 1_000_000_000 + 1, dtype=np.int64)
    bid, ask = buf["bid_px_00"], buf["ask_px_00"]  # column views: no structured gather
    sel = ((buf["flags"] & F_LAST) != 0) & (bid != UNDEF_PRICE) & (ask != UNDEF_PRICE)
    mid = (bid[sel].astype(np.float64) + ask[sel]) / 2.0 / tick
    idx = np.searchsorted(buf["ts_event"][sel].astype(np.int64), grid, side="right") - 1
    out = np.where(idx >= 0, mid[np.maximum(idx, 0)], initial)
    return out.astype(np.float64)


@dataclass
class _Session:
    day: datetime.date
    contracts: list[Contract]
    mbo: np.ndarray
    mbp: np.ndarray
    runs: dict[str, _InstrumentRun]
    leader: str


def _simulate_session(
    day: datetime.date, seed: int, scale: float, contracts: Sequence[str] | None, n_samples: int = 0
) -> _Session:
    """Simulate every instrument of session ``day``; records of all instruments sorted by
    ``ts_recv`` (stable). ``n_samples`` states of the leading outright are saved for the
    Monte-Carlo AUC ceiling."""
    t0, t1 = session_bounds(day)
    cons = contracts_for(day, contracts)
    anchor = _anchor_price(day, seed)
    outs = sorted((c for c in cons if not c.is_spread),
                  key=lambda c: (-volume_share(c.symbol, day), c.expiration_ns))
    spreads = [c for c in cons if c.is_spread]
    runs: dict[str, _InstrumentRun] = {}
    leader_grid: np.ndarray | None = None
    leader: Contract | None = None
    for c in outs:
        fair = _fair_price(c, day, anchor)
        rate = BASE_RATE * scale * volume_share(c.symbol, day)
        if leader is None:
            run = _simulate_instrument(c, day, seed, rate, fair, None, t0, t1, n_samples)
            leader, leader_grid = c, _mid_grid(run.mbp, t0, t1, c.tick, fair * 1e9 / c.tick)
        else:
            assert leader_grid is not None
            offset = (fair - _fair_price(leader, day, anchor)) * 1e9 / c.tick
            run = _simulate_instrument(c, day, seed, rate, fair, leader_grid + offset, t0, t1)
        runs[c.symbol] = run
    for c in spreads:
        fair = _fair_price(c, day, anchor)
        rate = BASE_RATE * scale * _spread_share(c, day)
        ref = np.full(1, fair * 1e9 / c.tick)
        runs[c.symbol] = _simulate_instrument(c, day, seed, rate, fair, ref, t0, t1)
    mbo = _merge([r.mbo for r in runs.values()], MBO_DTYPE)
    mbp = _merge([r.mbp for r in runs.values()], MBP10_DTYPE)
    return _Session(day, cons, mbo, mbp, runs, leader.symbol if leader else "")


@numba.njit(cache=True)
def _gather_rows(parts_u8, order_part, order_row, out):
    """``out[i] = parts_u8[order_part[i]][order_row[i]]`` row by row (records as 8-byte words)."""
    for i in range(order_part.shape[0]):
        src = parts_u8[order_part[i]]
        r = order_row[i]
        for b in range(out.shape[1]):
            out[i, b] = src[r, b]


def _merge(parts: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """Records of all instruments in ``ts_recv`` order (stable: instrument order breaks ties).

    Structured-array fancy indexing is slow, so rows are gathered as bytes by numba."""
    if not parts:
        return np.zeros(0, dtype)
    ts = np.concatenate([p["ts_recv"] for p in parts])
    order = np.argsort(ts, kind="stable")
    sizes = np.array([p.shape[0] for p in parts], np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    order_part = np.searchsorted(offsets, order, side="right") - 1
    order_row = order - offsets[order_part]
    out = np.empty(order.shape[0], dtype)
    w = dtype.itemsize // 8  # record sizes (56, 368) are multiples of 8 bytes
    typed = numba.typed.List([p.view(np.uint64).reshape(p.shape[0], w) for p in parts])
    _gather_rows(typed, order_part, order_row, out.view(np.uint64).reshape(-1, w))
    return out


# --------------------------------------------------------------------------------------------
# Planted predictability: the AUC ceiling under the true model
# --------------------------------------------------------------------------------------------


def _soft_auc(score: np.ndarray, w_pos: np.ndarray, w_neg: np.ndarray) -> float:
    """AUC of ``score`` when item i is positive with weight ``w_pos[i]`` and negative with
    ``w_neg[i]`` (ties in score count one half)."""
    order = np.argsort(score, kind="stable")
    s, wp, wn = score[order], w_pos[order], w_neg[order]
    uniq, start = np.unique(s, return_index=True)
    gp = np.add.reduceat(wp, start) if s.size else np.zeros(0)
    gn = np.add.reduceat(wn, start) if s.size else np.zeros(0)
    below = np.concatenate([[0.0], np.cumsum(gn)[:-1]])
    num = float(np.sum(gp * (below + 0.5 * gn)))
    den = float(gp.sum() * gn.sum())
    return num / den if den > 0 else float("nan")


def auc_ceiling(run: _InstrumentRun, horizons: Sequence[int], n_paths: int, seed: int) -> dict[str, float]:
    """Best possible AUC per label horizon for the leading outright, by Monte-Carlo.

    From each saved state (evenly spaced over the session's events) ``n_paths`` continuations
    are simulated under the true model with fresh randomness. With the paths split in halves
    A and B, the Bayes score is ``P_A(up | not tie)`` and the soft labels are B's up and down
    frequencies, so the AUC is that of the optimal score ``P(up | full state)`` (independent
    halves keep the estimate unbiased by the score's own noise). The full state includes the
    hidden latent fair value, so this bounds any model on observable features from above.
    """
    assert run.saved is not None
    hs = np.asarray(sorted(horizons), np.int64)
    s_ist, s_fst, s_qsz, s_qn, s_lsz = run.saved
    out = np.zeros((s_ist.shape[0], n_paths, hs.shape[0]), np.int8)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 9_999]))
    _mc_outcomes(rng, run.params, s_ist, s_fst, s_qsz, s_qn, s_lsz, hs, n_paths, out)
    half = n_paths // 2
    res: dict[str, float] = {}
    for j, h in enumerate(hs):
        a, b = out[:, :half, j], out[:, half:, j]
        up_a, dn_a = (a > 0).sum(1), (a < 0).sum(1)
        score = np.where(up_a + dn_a > 0, up_a / np.maximum(up_a + dn_a, 1), 0.5)
        res[str(int(h))] = round(_soft_auc(score, (b > 0).mean(1), (b < 0).mean(1)), 4)
    return res


# --------------------------------------------------------------------------------------------
# Records, files
# --------------------------------------------------------------------------------------------


def _trades_from_mbp(mbp: np.ndarray) -> np.ndarray:
    """TradeMsg records equal to the 'T' records of an MBP-10 array (F_LAST set)."""
    idx = np.flatnonzero(mbp["action"] == b"T")
    out = np.zeros(idx.shape[0], TRADE_DTYPE)
    out_raw = out.view(np.uint8).reshape(-1, TRADE_DTYPE.itemsize)
    out_raw[:] = mbp.view(np.uint8).reshape(-1, _MBP_SIZE)[idx, : TRADE_DTYPE.itemsize]
    out["length"] = TRADE_DTYPE.itemsize // 4
    out["rtype"] = 0x00
    out["flags"] |= F_LAST
    return out


def _definitions(cons: Sequence[Contract], day: datetime.date, t0: int) -> np.ndarray:
    """One InstrumentDefMsg per contract (null fields set to DBN's sentinels)."""
    out = np.zeros(len(cons), DEF_DTYPE)
    for name in DEF_DTYPE.names:
        if DEF_DTYPE[name].kind in "iu":
            out[name] = np.iinfo(DEF_DTYPE[name]).max
    for i, c in enumerate(cons):
        r = out[i : i + 1]
        year, month = _parse_outright(c.legs[0] if c.is_spread else c.symbol, day)
        exp_day = _third_friday(year, month)
        act = exp_day - datetime.timedelta(days=7 * 65)
        r["length"] = DEF_DTYPE.itemsize // 4
        r["rtype"] = 0x13
        r["publisher_id"] = PUBLISHER_ID
        r["instrument_id"] = c.instrument_id
        r["raw_instrument_id"] = c.instrument_id
        r["ts_event"] = t0
        r["ts_recv"] = t0
        r["min_price_increment"] = c.tick
        r["display_factor"] = 1_000_000_000
        r["expiration"] = c.expiration_ns
        r["activation"] = _ns(datetime.datetime(act.year, act.month, act.day, 17, 0, tzinfo=CT))
        r["unit_of_measure_qty"] = 50_000_000_000
        r["min_price_increment_amount"] = c.tick * 50
        r["underlying_id"] = 0
        r["market_depth_implied"] = 2
        r["market_depth"] = 10
        r["market_segment_id"] = 64
        r["max_trade_vol"] = 3000
        r["min_lot_size"] = 1
        r["min_lot_size_block"] = 1
        r["min_lot_size_round_lot"] = 1
        r["min_trade_vol"] = 1
        r["contract_multiplier"] = 50
        r["appl_id"] = 310
        r["maturity_year"] = year
        r["channel_id"] = 0
        r["leg_count"] = 0
        r["leg_index"] = 0
        r["leg_instrument_id"] = 0
        r["leg_underlying_id"] = 0
        for f in ("leg_ratio_price_numerator", "leg_ratio_price_denominator",
                  "leg_ratio_qty_numerator", "leg_ratio_qty_denominator"):
            r[f] = 0
        r["currency"] = b"USD"
        r["settl_currency"] = b"USD"
        r["secsubtype"] = b"SP" if c.is_spread else b""
        r["raw_symbol"] = c.symbol.encode()
        r["group"] = b"ES"
        r["exchange"] = b"XCME"
        r["asset"] = b"ES"
        r["cfi"] = b"FMIXSX" if c.is_spread else b"FFIXSX"
        r["security_type"] = b"FUT"
        r["unit_of_measure"] = b"IPNT"
        r["instrument_class"] = b"S" if c.is_spread else b"F"
        r["match_algorithm"] = b"F"
        r["underlying_product"] = 5
        r["security_update_action"] = b"A"
        r["maturity_month"] = month
        r["user_defined_instrument"] = b"N"
        r["contract_multiplier_unit"] = 127
        r["flow_schedule_type"] = 127
        r["leg_instrument_class"] = b""
        r["leg_side"] = b""
    return out


def _metadata(schema: str, cons: Sequence[Contract], t0: int, t1: int) -> bytes:
    first = datetime.datetime.fromtimestamp(t0 // 1_000_000_000, UTC).date()
    last = datetime.datetime.fromtimestamp((t1 - 1) // 1_000_000_000, UTC).date()
    end_date = last + datetime.timedelta(days=1)
    mappings = [
        SimpleNamespace(
            raw_symbol=c.symbol,
            intervals=[SimpleNamespace(start_date=first, end_date=end_date,
                                       symbol=str(c.instrument_id))],
        )
        for c in cons
    ]
    md = dbn.Metadata(
        dataset="GLBX.MDP3", schema=_SCHEMAS[schema], start=t0, stype_in=dbn.SType.PARENT,
        stype_out=dbn.SType.INSTRUMENT_ID, symbols=["ES.FUT"], partial=[], not_found=[],
        mappings=mappings, end=t1, limit=None, ts_out=False, version=3,
    )
    return bytes(md.encode())


def _write_atomic(path: Path, header: bytes, records: np.ndarray, level: int = ZSTD_LEVEL) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    cctx = zstandard.ZstdCompressor(level=level, threads=0)
    data = records.view(np.uint8).reshape(-1)
    chunk = 64 << 20
    try:
        with open(tmp, "wb") as fh:
            cobj = cctx.compressobj(size=len(header) + data.nbytes)
            fh.write(cobj.compress(header))
            for i in range(0, data.nbytes, chunk):
                fh.write(cobj.compress(data[i : i + chunk]))
            fh.write(cobj.flush())
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def _thin_fraction(mbp: np.ndarray) -> float:
    """Fraction of F_LAST book rows with an UNDEF price among the top 10 levels."""
    last = mbp[(mbp["flags"] & F_LAST) != 0]
    if last.shape[0] == 0:
        return 0.0
    return float(np.mean((last["bid_px_09"] == UNDEF_PRICE) | (last["ask_px_09"] == UNDEF_PRICE)))


def _session_job(
    day: datetime.date,
    seed: int,
    scale: float,
    contracts: tuple[str, ...] | None,
    schemas: tuple[str, ...],
    out: Path,
    level: int,
    mc: tuple[tuple[int, ...], int, int] | None,
) -> dict[str, Any]:
    """Simulate and write one session; returns the paths and a summary (JSON-able)."""
    t0, t1 = session_bounds(day)
    sess = _simulate_session(day, seed, scale, contracts, mc[1] if mc else 0)
    stem = f"glbx-mdp3-{day:%Y%m%d}"
    paths: list[str] = []
    counts: dict[str, int] = {}
    for schema in schemas:
        if schema == "mbp-10":
            recs = sess.mbp
        elif schema == "mbo":
            recs = sess.mbo
        elif schema == "trades":
            recs = _trades_from_mbp(sess.mbp)
        else:
            recs = _definitions(sess.contracts, day, t0)
        path = out / f"{stem}.{schema}.dbn.zst"
        _write_atomic(path, _metadata(schema, sess.contracts, t0, t1), recs, level)
        paths.append(str(path))
        counts[schema] = int(recs.shape[0])
    inst = {}
    for sym, r in sess.runs.items():
        inst[sym] = {
            "instrument_id": int(r.mbo["instrument_id"][0]) if r.mbo.shape[0] else None,
            "events": int(r.stats[0]),
            "mbo_records": int(r.mbo.shape[0]),
            "mbp10_records": int(r.mbp.shape[0]),
            "trade_events": int(r.stats[3]),
            "traded_volume": int(r.mbp["size"][r.mbp["action"] == b"T"].sum()),
            "crossed_preopen": bool(r.crossed),
            "locked_events": int(r.stats[1]),
            "bad_ts_recv_events": int(r.stats[2]),
            "thin_book_row_fraction": round(_thin_fraction(r.mbp), 6),
        }
    res: dict[str, Any] = {"session": day.isoformat(), "paths": paths, "records": counts,
                           "mbp10_records": int(sess.mbp.shape[0]), "mbo_records": int(sess.mbo.shape[0]),
                           "leader": sess.leader, "instruments": inst}
    if mc:
        res["auc_ceiling"] = auc_ceiling(sess.runs[sess.leader], mc[0], mc[2], seed)
    return res


def generate(
    out_dir: str | os.PathLike[str],
    *,
    start: datetime.date,
    sessions: int,
    seed: int = 0,
    schemas: tuple[str, ...] = ("mbp-10", "trades"),
    scale: str = "quiet",
    contracts: tuple[str, ...] | None = None,
    jobs: int = 1,
    zstd_level: int | None = None,
    report: bool = True,
    progress: Callable[[int], None] | None = None,
) -> list[Path]:
    """Write synthetic ES.FUT DBN v3 files, one per trading session and schema.

    Parameters
    ----------
    out_dir : path
        Directory to write into (created if missing).
    start : datetime.date
        First trade date; weekend dates are skipped (the next weekday is used).
    sessions : int
        Number of trading sessions (weekdays) to generate, >= 1.
    seed : int
        Non-negative seed; the same arguments give byte-identical files (any ``jobs``).
    schemas : tuple of str
        Any of ``"mbo"``, ``"mbp-10"``, ``"trades"``, ``"definition"``.
    scale : str
        A key of :data:`SCALES`: ``"quiet"`` (about 20k MBP-10 records per session over all
        instruments), ``"normal"`` (x10), ``"busy"`` (x100), ``"full"`` (x300, ES-like, about
        4 M MBP-10 records per session): multiplies every event rate.
    contracts : tuple of str, optional
        Raw symbols (outrights ``ESM4``, spreads ``ESH4-ESM4``); default: the three nearest
        quarterly outrights and the calendar spreads of neighbours, chosen per session.
    jobs : int
        Worker processes (joblib, one session per task); 1 runs in this process.
    zstd_level : int, optional
        zstd level; default :data:`ZSTD_LEVEL` for ``quiet`` and :data:`FAST_ZSTD_LEVEL`
        otherwise (compression dominates the run time of big sets at high levels).
    report : bool
        Also write ``synth-report.json`` (parameters, per-session counts and rare cases, and
        the AUC ceiling per label horizon from :func:`auc_ceiling` on the first session).
    progress : callable, optional
        Called with 1 after each session is written.

    Returns
    -------
    list[Path]
        Paths written, per session in the order of ``schemas`` (the report not included).
    """
    if sessions < 1:
        raise ValueError(f"sessions must be >= 1, got {sessions}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {sorted(SCALES)}, got {scale!r}")
    bad = [s for s in schemas if s not in _SCHEMAS]
    if bad or not schemas:
        raise ValueError(f"schemas must be among {sorted(_SCHEMAS)}, got {schemas!r}")
    level = zstd_level if zstd_level is not None else (ZSTD_LEVEL if scale == "quiet" else FAST_ZSTD_LEVEL)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    days = trade_dates(start, sessions)
    mc = (AUC_HORIZONS, AUC_STATES, AUC_PATHS)
    tasks = [(d, seed, SCALES[scale], contracts, tuple(schemas), out, level, mc if (report and i == 0) else None)
             for i, d in enumerate(days)]
    results: list[dict[str, Any]] = []
    if jobs <= 1 or len(tasks) == 1:
        for t in tasks:
            results.append(_session_job(*t))
            if progress:
                progress(1)
    else:
        par = joblib.Parallel(n_jobs=jobs, backend="loky", return_as="generator")
        for r in par(joblib.delayed(_session_job)(*t) for t in tasks):
            results.append(r)
            if progress:
                progress(1)
    written = [Path(p) for r in results for p in r["paths"]]
    if report:
        rep = {
            "generator": "alphafeat.synth",
            "start": start.isoformat(), "sessions": sessions, "seed": seed, "scale": scale,
            "schemas": list(schemas), "zstd_level": level,
            "model": {
                "ofi_strength_kappa": OFI_STRENGTH, "w_imbalance": W_IMB, "w_flow": W_FLOW,
                "w_reference": W_REF, "daily_vol": DAILY_VOL,
                "rare_case_rates": {
                    "crossed_preopen_per_outright_session": P_CROSSED_PREOPEN,
                    "locked_book_per_event_at_one_tick_spread": P_LOCK,
                    "bad_ts_recv_per_event": P_BAD_TS,
                    "tail_level_not_replenished": 1.0 - P_REPLENISH,
                },
            },
            "auc_ceiling": {
                "horizons_snapshots": list(AUC_HORIZONS),
                "instrument": results[0]["leader"], "session": results[0]["session"],
                "states": AUC_STATES, "paths_per_state": AUC_PATHS,
                "auc": results[0].get("auc_ceiling", {}),
                "method": "Monte-Carlo continuations under the true model (see synth.auc_ceiling)",
            },
            "mbp10_records": sum(r["mbp10_records"] for r in results),
            "mbo_records": sum(r["mbo_records"] for r in results),
            "sessions_detail": [{k: v for k, v in r.items() if k not in ("paths", "auc_ceiling")}
                                for r in results],
        }
        for s in rep["sessions_detail"]:
            s["files"] = [Path(p).name for p in next(r["paths"] for r in results if r["session"] == s["session"])]
        path = out / REPORT_NAME
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rep, indent=1, sort_keys=False) + "\n")
        os.replace(tmp, path)
        logger.info("AUC ceiling per horizon: %s", rep["auc_ceiling"]["auc"])
    return written


def make_default_sample(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write the project's default sample: ``generate(out_dir, **DEFAULT_SAMPLE)``."""
    return generate(out_dir, **DEFAULT_SAMPLE)  # type: ignore[arg-type]
