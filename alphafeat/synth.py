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
  (F0 = 10 contracts), R a reference mid: for the leading outright a latent fair value (a
  Brownian bridge over the session, see "Prices across sessions"), for the other outrights
  their fair value: the leader's latent value (1 s grid) times the carry ratio, for spreads
  the carry fair value;
  (w_I, w_F, w_R) = (0.35, 0.35, 0.6); up-pressure ``u = 0.5 + 0.5 * kappa * S``, kappa =
  :data:`OFI_STRENGTH` (0.5) is the planted strength of the response to order-flow imbalance;
* a locked book (below) is unlocked: the locking order is cancelled;
* a non-leading outright whose fair value R is over :data:`FOLLOW_TICKS` (1) from its mid
  re-quotes: a level opens inside a wide spread on R's side, else the stale best level on the
  other side is pulled (so thin contracts move with the front, not behind it);
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
Monte-Carlo continuations under the true model from :data:`AUC_STATES` states with
:data:`AUC_PATHS` paths each, and a bias-corrected estimator (:func:`ceiling_estimate`);
``generate`` writes it to ``synth-report.json`` and the CLI prints it.

Prices across sessions
----------------------
A spot-like index level ``S`` opens session d at ``level(d) exp(X(d))`` and closes it at
``level(d) exp(X(next d))`` (:func:`_index_level`; ``X`` an AR(1) of seeded session moves with
s.d. ``min(DAILY_VOL, SIGMA_EVENT_MAX sqrt(events) tick / S)``, so the next session of a
contract opens where this one closed, apart from the level table's trend, 0.06 % a calendar
day in 2024, in the overnight gap). Outright c is priced ``S exp(CARRY_RATE T_c)`` (T_c years
to its expiry): ESM4 trades about 60 points above ESH4 in March 2024, a calendar spread at
its front leg minus its deferred leg. The leading outright's latent fair value is a Brownian
bridge from its open to its close price over the session's events: no drift beyond the
session's random move, so direction labels are balanced (tested). Every other outright's fair
value is that latent value times its carry ratio ``exp(CARRY_RATE (T_c - T_lead))``: one
random walk for all months (the basis is constant within a session), so deferred and expiring
contracts move with the front, less often as they are thinner (tested).

Determinism: no wall clock; every random stream is a numpy ``Generator`` seeded from
``(seed, date, instrument id, stream)``; zstd level fixed (:data:`ZSTD_LEVEL`, single threaded).
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import math
import os
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
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
from numba.core import cgutils, types
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from alphafeat.errors import UsageError
from alphafeat.validation import (
    Scale,
    validate_date,
    validate_enum,
    validate_int,
    validate_jobs,
    validate_schemas,
)

__all__ = [
    "ACTIVITY_PROFILE",
    "DEFAULT_SAMPLE",
    "OFI_STRENGTH",
    "SCALES",
    "ZSTD_LEVEL",
    "Contract",
    "auc_ceiling",
    "ceiling_estimate",
    "contracts_for",
    "front_by_volume",
    "generate",
    "make_default_sample",
    "nominal_events",
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
#: zstd level of big sets (scales other than quiet) unless given. This module's level 1 is
#: zstd's fast strategy with a 128 KiB window, a 4096-entry hash table and 5-byte matches
#: (:data:`_FAST_PARAMS`): on MBP-10 records about as small as libzstd's level 1 and faster.
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
AUC_STATES = 192
#: Monte-Carlo paths per state and horizon (nested: a path serves every horizon up to its own).
AUC_PATHS = {30: 512, 100: 256, 300: 128, 1000: 64, 6000: 32}
#: Standard deviation of the index's log move over a session (ES about 0.8 % in 2024), unless
#: the scale is too sparse for it (:data:`SIGMA_EVENT_MAX`).
DAILY_VOL = 0.008
#: Largest standard deviation of the leading outright's latent fair value per book event, ticks
#: (keeps the latent within reach of the book, whose mid moves a few ticks per 100 events).
SIGMA_EVENT_MAX = 0.05
#: A non-leading outright re-quotes (a level opens inside a wide spread, else its stale best
#: level is pulled) when its fair value is more than this many ticks from its mid.
FOLLOW_TICKS = 1.0
#: Annualised cost of carry (interest minus dividend yield) pricing outrights from the index
#: level: ``F = S exp(CARRY_RATE * years to expiry)``.
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
    2018: 2690.0,
    2019: 2510.0,
    2020: 3230.0,
    2021: 3750.0,
    2022: 4770.0,
    2023: 3860.0,
    2024: 4780.0,
    2025: 5900.0,
    2026: 6900.0,
    2027: 7200.0,
}

MBP10_DTYPE = np.dtype(dbn.MBP10Msg._dtypes)
MBO_DTYPE = np.dtype(dbn.MBOMsg._dtypes)
_MBO_SIZE = MBO_DTYPE.itemsize
TRADE_DTYPE = np.dtype(dbn.TradeMsg._dtypes)
DEF_DTYPE = np.dtype(dbn.InstrumentDefMsg._dtypes)

# Byte layout the numba kernel writes through int64 / uint32 / uint8 views of a record.
_MBP_SIZE = MBP10_DTYPE.itemsize
_EXPECTED_OFFSETS = {
    "ts_event": 8,
    "price": 16,
    "size": 24,
    "action": 28,
    "side": 29,
    "flags": 30,
    "depth": 31,
    "ts_recv": 32,
    "ts_in_delta": 40,
    "sequence": 44,
    "bid_px_00": 48,
    "ask_px_00": 56,
    "bid_sz_00": 64,
    "ask_sz_00": 68,
    "bid_ct_00": 72,
    "ask_ct_00": 76,
    "bid_px_01": 80,
}
assert _MBP_SIZE == 368 and TRADE_DTYPE.itemsize == 48 and _MBO_SIZE == 56
assert sys.byteorder == "little"  # the kernel writes records as little-endian int64 words
assert [
    MBO_DTYPE.fields[k][1]
    for k in ("ts_event", "order_id", "price", "size", "flags", "action", "side", "ts_recv", "ts_in_delta", "sequence")
] == [8, 16, 24, 32, 36, 38, 39, 40, 48, 52]
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
        raise UsageError("contracts", "expected ES quarterly outrights (ESM4) or spreads of them", symbol)
    if not symbol[3].isdigit():
        raise UsageError("contracts", "expected ES quarterly outrights (ESM4) or spreads of them", symbol)
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
            raise UsageError("contracts", "expected a calendar spread of two outrights (ESH4-ESM4)", symbol)
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


def _level(day: datetime.date) -> float:
    """Deterministic ES level (index points) of trade date ``day``: :data:`_LEVELS_BY_YEAR`
    interpolated linearly (clamped to the table's years)."""
    years = sorted(_LEVELS_BY_YEAR)
    lo, hi = datetime.date(years[0], 1, 1), datetime.date(years[-1], 1, 1)
    clamped = min(max(day, lo), hi)
    if clamped.year == years[-1]:
        return _LEVELS_BY_YEAR[years[-1]]
    frac = (clamped - datetime.date(clamped.year, 1, 1)).days / 365.25
    return _LEVELS_BY_YEAR[clamped.year] * (1.0 - frac) + _LEVELS_BY_YEAR[clamped.year + 1] * frac


def _next_weekday(day: datetime.date) -> datetime.date:
    day += datetime.timedelta(days=1)
    while day.weekday() >= 5:
        day += datetime.timedelta(days=1)
    return day


def _session_vol(scale: float, level: float) -> float:
    """Standard deviation of the log index move over one session at ``scale``.

    ``min(DAILY_VOL, SIGMA_EVENT_MAX * sqrt(n) * 0.25 / level)`` with ``n`` the nominal book
    events of a contract holding all the volume (:func:`nominal_events`): a sparse session
    (``quiet``) moves less, so the book can follow its latent fair value event by event
    instead of chasing it in a steady drift."""
    return min(DAILY_VOL, SIGMA_EVENT_MAX * math.sqrt(nominal_events(scale)) * OUTRIGHT_TICK * 1e-9 / level)


@functools.lru_cache(maxsize=64)
def nominal_events(scale: float) -> float:
    """Expected book events of one outright with volume share 1 in a 23-hour session (cached:
    :func:`_index_level` needs it for some 1500 dates a session)."""
    hours = 0.0
    for a, b, m in ACTIVITY_PROFILE:
        ha, ma = map(int, a.split(":"))
        hb, mb = map(int, b.split(":"))
        hours += m * (((hb * 60 + mb) - (ha * 60 + ma)) % (24 * 60)) / 60.0
    return BASE_RATE * scale * hours * 3600.0


def _session_vols(scale: float, ords: Sequence[int]) -> np.ndarray:
    """:func:`_session_vol` of the trade dates with ordinals ``ords``."""
    return np.array([_session_vol_on(scale, o) for o in ords])


@functools.lru_cache(maxsize=1 << 14)
def _session_vol_on(scale: float, ordinal: int) -> float:
    """:func:`_session_vol` of the trade date with ordinal ``ordinal`` (cached: consecutive
    sessions share all but one of their :data:`_X_WINDOW` dates)."""
    return _session_vol(scale, _level(datetime.date.fromordinal(ordinal)))


def _index_level(day: datetime.date, seed: int, scale: float) -> tuple[float, float]:
    """Spot-like ES index level (index points) at the open and at the close of session ``day``.

    ``S_open(d) = level(d) * exp(X(d))``, ``S_close(d) = level(d) * exp(X(next(d)))`` with
    ``X`` an AR(1) (mean reverting, 250-session time constant) of the session moves
    ``X(next(d)) = rho X(d) + v(d) z_d``, ``z_d ~ N(0, 1)`` seeded by ``(seed, date)``,
    ``v`` = :func:`_session_vol`. The next session therefore opens where this one closes; the
    deterministic trend of the level table falls in the overnight gap (0.06 % a calendar day
    in 2024). ``X`` is summed over the last :data:`_X_WINDOW` weekdays (the older terms weigh
    below e^-6)."""
    rho = math.exp(-1.0 / 250.0)
    ords: list[int] = []
    d = day
    for _ in range(_X_WINDOW + 1):
        d -= datetime.timedelta(days=1)
        while d.weekday() >= 5:
            d -= datetime.timedelta(days=1)
        ords.append(d.toordinal())
    ords.reverse()  # oldest first; then ``day`` itself for the close
    ords.append(day.toordinal())
    z = _daily_shocks(seed, np.asarray(ords, np.int64))
    vols = _session_vols(scale, ords)
    x_open = 0.0
    for k in range(len(ords) - 1):
        x_open = rho * x_open + vols[k] * z[k]
    x_close = rho * x_open + vols[-1] * z[-1]
    lv = _level(day)
    return lv * math.exp(x_open), lv * math.exp(x_close)


#: Weekdays summed into the AR(1) index deviation X.
_X_WINDOW = 1500


def _daily_shocks(seed: int, ordinals: np.ndarray) -> np.ndarray:
    """One N(0, 1) shock per date ordinal, drawn by year (one stream per ``(seed, year)``)."""
    out = np.empty(ordinals.shape[0])
    years = np.array([datetime.date.fromordinal(int(o)).year for o in ordinals])
    for y in np.unique(years):
        z = np.random.default_rng(np.random.SeedSequence([seed, int(y), 7])).standard_normal(367)
        sel = years == y
        out[sel] = z[ordinals[sel] - datetime.date(int(y), 1, 1).toordinal()]
    return out


def _fair_price(c: Contract, day: datetime.date, index: float) -> float:
    """Fair price in index points of ``c`` at index level ``index`` on trade date ``day``.

    An outright is ``index * exp(CARRY_RATE * T)`` with ``T`` its years to expiry (cost of
    carry: deferred months above the front by about ``index * CARRY_RATE / 4`` a quarter, 56
    points at 5000); a calendar spread is its front leg minus its deferred leg (negative)."""

    def outright(sym: str) -> float:
        years = (_expiry_date(sym, day) - day).days / 365.0
        return index * math.exp(CARRY_RATE * years)

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
# MBO records are written (else only counted)
_WMBO = 20
#: Level stride per side in the packed state (>= LMAX_OUTRIGHT).
_LS = 16
_QN = 24  # orders at level k of side s: st[_QN + s * _LS + k]
_LSZ = _QN + 2 * _LS  # contracts at level k of side s
_QID = _LSZ + 2 * _LS  # id of order j at level k of side s: st[_QID + (s * _LS + k) * QMAX + j]
_QD = 2 * _LS * QMAX  # offset from an order's id to its size
_NST = _QID + 2 * _QD
# float-state indices (float64 array ``fst``): signed flow, latent fair value (ticks), its
# bridge target at the close (ticks) and the events left to the close
_FFLOW, _FLAT, _FTGT, _FREM = 0, 1, 2, 3
#: int64 words per MBO / MBP-10 record (the kernel writes whole records as words).
_MBO_W, _MBP_W = _MBO_SIZE // 8, _MBP_SIZE // 8
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
    _PSIGMA,
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
) = range(24)
#: cumulative probabilities of the level of a limit event (levels 1..9 of 10), see :func:`_params`
_PLCUM = 24
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
def _step(rng, p, ref, ref_t0, st, fst, om, op):
    """One event of the book model (see the module docstring). Returns an event code:
    0 liquidity, 1 inside-spread level, 2 trade, 3 lock, 4 unlock."""
    tick = np.int64(p[_PTICK])
    lmax = np.int64(p[_PLMAX])
    b = st[_IB]
    a = st[_IA]
    fst[_FFLOW] *= p[_PDECAY]
    l0b = st[_LSZ] if st[_INB] > 0 else 0
    l0a = st[_LSZ + _LS] if st[_INA] > 0 else 0
    imb = (l0b - l0a) / max(1, l0b + l0a)
    sig = p[_PWI] * imb + p[_PWF] * math.tanh(fst[_FFLOW] / p[_PF0])
    gap = 0.0
    if p[_PSIGMA] > 0.0:  # Brownian bridge to the close's fair value, then a free walk
        r = fst[_FREM]
        if r >= 1.0:
            fst[_FLAT] += (fst[_FTGT] - fst[_FLAT]) / r + p[_PSIGMA] * math.sqrt((r - 1.0) / r) * rng.standard_normal()
            fst[_FREM] = r - 1.0
        else:
            fst[_FLAT] += p[_PSIGMA] * rng.standard_normal()
        gap = min(max((fst[_FLAT] - 0.5 * (a + b)) / 4.0, -1.0), 1.0)
    elif p[_PWR] != 0.0:
        gi = (st[_ET] - ref_t0) // 1_000_000_000
        gi = min(max(gi, 0), ref.shape[0] - 1)
        gap = min(max((ref[gi] - 0.5 * (a + b)) / 4.0, -1.0), 1.0)
    sig = min(max(sig + p[_PWR] * gap, -1.0), 1.0)
    u = 0.5 + 0.5 * p[_PKAPPA] * sig
    code = 0
    if st[_ILOCK] != 0:  # a locked book lasts one event: the locking order is cancelled
        s = st[_ILOCK] - 1
        _cancel(st, om, op, s, 0, 0, st[_QD + _QID + s * _LS * QMAX], tick)
        st[_ILOCK] = 0
        code = 4
    elif p[_PFOLLOW] > 0.0 and abs(gap) * 4.0 > p[_PFOLLOW] and st[_INB] > 1 and st[_INA] > 1:
        # re-quote of a non-leading outright whose fair value moved away from its book: a level
        # opens inside a wide spread on the side the fair value moved to, else the stale best
        # level of the other side is pulled
        up = gap > 0.0
        if a - b > 1:
            _open_inside(st, om, op, 0 if up else 1, _order_size(rng), tick, lmax)
        else:
            s = 1 if up else 0
            lv = s * _LS
            qo = _QID + lv * QMAX
            while st[_INB + s] > 1 and (st[_IA] == a if up else st[_IB] == b):
                m = st[_QN + lv]
                _cancel(st, om, op, s, 0, m - 1, st[_QD + qo + m - 1], tick)
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
        elif rng.random() < 0.6:
            qty = np.int64(1)
        else:
            qty = np.int64(min(1 + _geometric(rng, 1.0 / 4.5), 200))
        qty = _trade(st, om, op, buy, qty, tick)
        if qty > 0:
            fst[_FFLOW] += qty if buy else -qty
            code = 2
        else:
            _add(st, om, op, s, 0, _order_size(rng), tick)
    elif a - b == 1 and rng.random() < p[_PLOCK]:
        s = 0 if rng.random() < 0.5 else 1
        _open_inside(st, om, op, s, _order_size(rng), tick, lmax)
        st[_ILOCK] = s + 1
        code = 3
    else:
        x = rng.random()
        k = 0
        while k < 9 and x > p[_PLCUM + k]:
            k += 1
        s = 0 if rng.random() < 0.5 else 1
        n = st[_INB + s]
        if k >= n:  # thin side: the event opens a new tail level
            if n < lmax:
                _add(st, om, op, s, n, _order_size(rng), tick)
            else:
                _add(st, om, op, s, n - 1, _order_size(rng), tick)
        else:
            lv = s * _LS + k
            qo = _QID + lv * QMAX
            sz = st[_LSZ + lv]
            tgt = p[_PT0] if k == 0 else p[_PTD]
            p_add = tgt / (tgt + sz)
            if k == 0:
                p_add *= 2.0 * u if s == 0 else 2.0 * (1.0 - u)
            p_add = min(max(p_add, 0.02), 0.98)
            m = st[_QN + lv]
            if m <= 1 and 0 < k < n - 1:
                p_add = 1.0  # inner levels never empty (no holes in the book)
            elif k == 0 and m == 1 and n > 1 and rng.random() < p[_PFLICK]:
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
    if code != 3 and code != 4:
        _replenish(rng, p, st, om, op, tick)
    return code


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
):
    """Run one instrument's session: opening snapshot, optional crossed pre-open and its
    uncrossing trade, then one :func:`_step` per event time.

    Writes whole MBO records as int64 words into ``om`` (rows of 7) and MBP-10 records into
    ``op`` (rows of 46); ``hdr_mbo`` / ``hdr_mbp`` are the records' first words (length, rtype,
    publisher and instrument id); with no rows in ``om`` MBO records are only counted.
    ``cross`` = -1 (no crossed pre-open), 0 (bids cross the ask) or 1 (asks cross the bid).
    The book opens with best bid ``b0`` (ticks); the latent fair value (leading outright, ticks)
    runs from ``lat0`` to ``lat1`` over the events (a Brownian bridge).
    States at the event indices ``sample_at`` (sorted) are copied into ``s_st``, ``s_fst`` for
    the Monte-Carlo AUC ceiling. ``stats`` (int64[8]) receives:
    events, locks, bad-ts events, trade events, MBP-10 rows with F_LAST, those of them with an
    UNDEF level 10 on either side (thin book), volume and number of the MBP-10 'T' records.
    ``lat_out`` (empty, or one per event) receives the latent fair value after each event.
    Returns (n_mbo, n_mbp), or (-1, -1) when a buffer is too small.
    """
    tick = np.int64(p[_PTICK])
    lmax = np.int64(p[_PLMAX])
    capm = om.shape[0]
    capp = op.shape[0]
    st_own = np.zeros(_NST, np.int64)
    fst_own = np.zeros(4, np.float64)
    st = _borrow(st_own)
    fst = _borrow(fst_own)
    om = _borrow(om)
    op = _borrow(op)
    p = _borrow(p)
    ref = _borrow(ref)
    rng = _borrow(rng_own)
    st[_IB] = b0
    st[_IA] = b0 + 1
    st[_IOID] = oid0
    st[_HMBO] = hdr_mbo
    st[_HMBP] = hdr_mbp
    st[_WMBO] = 1 if capm > 0 else 0
    fst[_FLAT] = lat0
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
    for e in range(times.shape[0]):
        if (st[_WMBO] != 0 and st[_CMBO] + _RESERVE > capm) or st[_CMBP] + _RESERVE > capp:
            return -1, -1
        while si < ns and sample_at[si] == e:
            s_st[si, :] = st
            s_fst[si, :] = fst
            si += 1
        t = times[e]
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
            lat_out[e] = fst[_FLAT]
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
    return st_own[_CMBO], st_own[_CMBP]


@numba.njit(cache=True, nogil=True)
def _mc_outcomes(rng_own, p, s_st, s_fst, horizons, n_steps, out):
    """Monte-Carlo continuations of saved states under the true model (nothing written).

    Path ``r`` of state ``i`` runs ``n_steps[r]`` events; ``out[i, r, h]`` = sign of the mid
    change after ``horizons[h]`` events (every event changes the book, so events = snapshots)
    for the horizons within ``n_steps[r]`` (others are left alone). Releases the GIL."""
    ref_own = np.zeros(1)
    dm_own = np.zeros((1, _MBO_W), np.int64)
    dp_own = np.zeros((1, _MBP_W), np.int64)
    st_own = np.zeros(_NST, np.int64)
    fst_own = np.zeros(4)
    ref, dm, dp, st, fst, p = (
        _borrow(ref_own),
        _borrow(dm_own),
        _borrow(dp_own),
        _borrow(st_own),
        _borrow(fst_own),
        _borrow(p),
    )
    rng = _borrow(rng_own)
    nh = horizons.shape[0]
    for i in range(s_st.shape[0]):
        for r in range(n_steps.shape[0]):
            st[:] = s_st[i]
            fst[:] = s_fst[i]
            for x in range(_ET, _CMBP + 1):  # no event context, nothing written
                st[x] = 0
            fst[_FREM] = 0.0  # the latent walks freely: the close it is bridged to is not known
            m0 = st[_IB] + st[_IA]
            h = 0
            for e in range(1, n_steps[r] + 1):
                _step(rng, p, ref, 0, st, fst, dm, dp)
                if h < nh and e == horizons[h]:
                    d = st[_IB] + st[_IA] - m0
                    out[i, r, h] = 1 if d > 0 else (-1 if d < 0 else 0)
                    h += 1
    # the owners stay alive to here (the borrowed views do not hold them)
    st_own[0] = ref_own[0] + dm_own[0, 0] + dp_own[0, 0] + fst_own[0]


# --------------------------------------------------------------------------------------------
# Session assembly
# --------------------------------------------------------------------------------------------


def _rng(seed: int, day: datetime.date, iid: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, day.toordinal(), iid, stream]))


def _params(c: Contract, sigma: float, follow: float = 0.0) -> np.ndarray:
    """Parameter vector of the book model for contract ``c`` (indices ``_P*``); ``follow`` > 0:
    re-quote threshold (ticks) of a non-leading outright (:data:`FOLLOW_TICKS`)."""
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
    p[_PFOLLOW] = follow
    # level k of a limit event: P_LEVEL0 at k = 0, then geometric (ratio 0.8) over k = 1..9
    acc = P_LEVEL0
    for k in range(9):
        p[_PLCUM + k] = acc
        acc += (1.0 - P_LEVEL0) * 0.2 * 0.8**k / (1.0 - 0.8**9)
    return p


class _Buffers:
    """Grow-only record buffers reused by the sessions one process simulates: first touches of
    fresh memory (page faults, huge-page compaction) cost about as much as the simulation."""

    def __init__(self) -> None:
        self._bufs: dict[Any, np.ndarray] = {}

    def get(self, key: Any, dtype: np.dtype, n: int) -> np.ndarray:
        """An uninitialised array of ``n`` records of ``dtype`` (reuses the buffer of ``key``)."""
        nbytes = n * dtype.itemsize
        buf = self._bufs.get(key)
        if buf is None or buf.nbytes < nbytes:
            self._bufs.pop(key, None)
            # 1/8 headroom: a slightly bigger later session reuses the touched pages (pages
            # never written cost no memory)
            buf = np.empty(nbytes + nbytes // 8, np.uint8)
            self._bufs[key] = buf
        return buf[:nbytes].view(dtype)

    def clear(self) -> None:
        self._bufs.clear()


#: The pool of the sessions simulated by this process through :func:`_session_job`.
_POOL = _Buffers()


@dataclass
class _InstrumentRun:
    n_mbo: int  # MBO records (``mbo`` holds them when they were written, else none)
    mbo: np.ndarray
    mbp: np.ndarray
    stats: np.ndarray
    crossed: bool
    saved: tuple[np.ndarray, ...] | None
    params: np.ndarray
    latent: np.ndarray | None = None  # leading outright: latent fair value (ticks), 1 s grid


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
    bufs: _Buffers | None = None,
    slot: int = 0,
    write_mbo: bool = True,
    close: float = 0.0,
    vol: float = 0.0,
    follow: bool = False,
) -> _InstrumentRun:
    """MBO and MBP-10 records (time order) of one instrument in one session.

    ``fair`` is the fair price at the open (index points). ``ref`` is the reference mid
    (ticks, 1 s grid from ``t0``); None for the leading outright, which tracks its own latent
    fair value instead: a Brownian bridge over its events from ``fair`` to ``close`` (index
    points) with per-event s.d. ``vol * fair / sqrt(events)`` (``vol``: the session's log s.d.).
    ``follow``: a non-leading outright whose ``ref`` is its fair value (the leader's latent
    times the carry ratio): its book re-quotes when that is over :data:`FOLLOW_TICKS` from
    its mid. ``rate`` is the book-event rate (events/s) at profile multiplier 1. With ``bufs`` the
    records live in that pool's buffers of ``slot`` (valid until the slot is served again).
    Without ``write_mbo`` the MBO records are only counted (``mbo`` is empty).
    """
    starts, ends, mults = _profile_segments(day)
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
    sigma = 0.0
    lat_ev = np.zeros(0)
    lead = ref is None
    if lead:
        sigma = vol * abs(lat0) / math.sqrt(max(times.shape[0], 1))
        ref = np.zeros(1)
        lat_ev = np.empty(times.shape[0])
    p = _params(c, sigma, FOLLOW_TICKS if follow else 0.0)
    lmax = int(p[_PLMAX])
    rng_x = _rng(seed, day, c.instrument_id, 3)
    cross = -1
    if not c.is_spread and rng_x.random() < P_CROSSED_PREOPEN:
        cross = int(rng_x.random() < 0.5)
    seq0 = 1_000_000 + zlib.crc32(f"{c.symbol}{day.isoformat()}".encode()) % 50_000_000
    oid0 = 6_400_000_000_000 + (c.instrument_id % 10_000) * 100_000_000 + (day.toordinal() % 97) * 1_000_000
    n = times.shape[0]
    sample_at = (
        np.unique(np.linspace(0, max(n - 1, 0), n_samples).astype(np.int64)) if n_samples else np.zeros(0, np.int64)
    )
    ns = sample_at.shape[0]
    s_st = np.zeros((ns, _NST), np.int64)
    s_fst = np.zeros((ns, 4))
    hdr_mbo = (_MBO_SIZE // 4) | (0xA0 << 8) | (PUBLISHER_ID << 16) | (c.instrument_id << 32)
    hdr_mbp = (_MBP_SIZE // 4) | (0x0A << 8) | (PUBLISHER_ID << 16) | (c.instrument_id << 32)
    # records per event: about 1.2 MBP-10 (1.4 MBO) for the leader, 1.6 for spreads and over 4
    # for a following outright (its re-quotes); a too small buffer reruns the simulation
    per_ev = 1.4 if lead else (6.0 if follow else 2.0)
    cap_m = int((per_ev + 0.2) * n) + 8 * _RESERVE if write_mbo else 0
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
        tk = time.perf_counter()
        nm, npp = _simulate(
            _rng(seed, day, c.instrument_id, 2),
            times,
            t0,
            b0,
            lat0,
            lat1,
            p,
            ref,
            t0,
            seq0,
            oid0,
            cross,
            lmax,
            hdr_mbo,
            hdr_mbp,
            mbo.view(np.int64).reshape(cap_m, _MBO_W),
            mbp.view(np.int64).reshape(cap_p, _MBP_W),
            sample_at,
            s_st,
            s_fst,
            stats,
            lat_ev,
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
    if lat_ev.shape[0] or sigma > 0.0:  # the latent at the end of every 1 s step from t0
        grid = t0 + np.arange((t1 - t0) // 1_000_000_000 + 1, dtype=np.int64) * 1_000_000_000
        i = np.searchsorted(times, grid, side="right") - 1
        latent = np.where(i >= 0, lat_ev[np.maximum(i, 0)] if n else lat0, lat0)
    return _InstrumentRun(int(nm), mbo, mbp, stats, cross >= 0, saved, p, latent)


@dataclass
class _Session:
    """The runs of every instrument of one session; records of all instruments are merged by
    ``ts_recv`` (stable: instrument order breaks ties) on demand, chunk by chunk."""

    day: datetime.date
    contracts: list[Contract]
    runs: dict[str, _InstrumentRun]
    leader: str
    bufs: _Buffers | None = None

    def parts(self, kind: str) -> tuple[np.ndarray, ...]:
        """Per-instrument records of ``kind`` ("mbo" / "mbp") as 2-D int64 word arrays (a tuple:
        numba compiles and caches one kernel per tuple length; a ``numba.typed.List`` would
        compile its methods anew in every process, about 3 s)."""
        w = _MBO_W if kind == "mbo" else _MBP_W
        arrs = [getattr(r, kind) for r in self.runs.values()]
        return tuple(a.view(np.int64).reshape(a.shape[0], w) for a in arrs)

    def chunks(self, kind: str, rows: int = 0, trades: np.ndarray | None = None) -> Iterator[np.ndarray]:
        """The merged records of ``kind`` as consecutive byte chunks (one reused buffer).

        Merged and copied in one pass (:func:`_merge_rows`; no merged order is stored). With
        ``trades`` (kind "mbp", :data:`TRADE_DTYPE`, one per MBP-10 'T' record: the sum of the
        runs' ``stats[7]``) the pass also fills it with the TradeMsg of each 'T' record."""
        w = _MBO_W if kind == "mbo" else _MBP_W
        rows = rows or max(1, _CHUNK_BYTES // (8 * w))
        parts = self.parts(kind)
        n = sum(p.shape[0] for p in parts)
        m = min(rows, max(n, 1))
        if self.bufs is None:
            buf = np.empty((m, w), np.int64)
        else:  # reused by the next files (their pages are already touched)
            buf = self.bufs.get("chunk", np.dtype(np.int64), m * w).reshape(m, w)
        tw = TRADE_DTYPE.itemsize // 8
        tr = np.zeros((0, tw), np.int64) if trades is None else trades.view(np.int64).reshape(-1, tw)
        pos = np.zeros(len(parts), np.int64)
        done = 0
        nt = 0
        while done < n:
            got, nt = _merge_rows(parts, 5 if kind == "mbo" else 4, pos, buf, tr, nt)
            done += got
            yield buf[:got].view(np.uint8).reshape(-1)
        if nt != tr.shape[0]:
            raise RuntimeError(f"{nt} trade records merged, {tr.shape[0]} expected")

    def trades(self) -> np.ndarray:
        """TradeMsg records equal to the merged MBP-10 'T' records (F_LAST set), from a merge
        pass of :meth:`chunks` whose MBP-10 chunks are dropped."""
        out = np.empty(sum(int(r.stats[7]) for r in self.runs.values()), TRADE_DTYPE)
        for _ in self.chunks("mbp", trades=out):
            pass
        return out


def _simulate_session(
    day: datetime.date,
    seed: int,
    scale: float,
    contracts: Sequence[str] | None,
    n_samples: int = 0,
    bufs: _Buffers | None = None,
    write_mbo: bool = True,
) -> _Session:
    """Simulate every instrument of session ``day``. ``n_samples`` states of the leading outright
    are saved for the Monte-Carlo AUC ceiling; ``bufs``: a buffer pool for the records; without
    ``write_mbo`` MBO records are only counted."""
    t0, t1 = session_bounds(day)
    cons = contracts_for(day, contracts)
    s_open, s_close = _index_level(day, seed, scale)
    vol = _session_vol(scale, _level(day))
    outs = sorted((c for c in cons if not c.is_spread), key=lambda c: (-volume_share(c.symbol, day), c.expiration_ns))
    spreads = [c for c in cons if c.is_spread]
    runs: dict[str, _InstrumentRun] = {}
    leader_grid: np.ndarray | None = None
    leader: Contract | None = None
    for c in outs:
        fair = _fair_price(c, day, s_open)
        rate = BASE_RATE * scale * volume_share(c.symbol, day)
        slot = len(runs)
        if leader is None:
            run = _simulate_instrument(
                c,
                day,
                seed,
                rate,
                fair,
                None,
                t0,
                t1,
                n_samples,
                bufs,
                slot,
                write_mbo,
                _fair_price(c, day, s_close),
                vol,
            )
            leader, leader_grid = c, run.latent
        else:
            assert leader_grid is not None
            # the common latent value times the carry ratio (a constant over the session)
            ratio = fair / _fair_price(leader, day, s_open) * leader.tick / c.tick
            ref = leader_grid * ratio
            run = _simulate_instrument(c, day, seed, rate, fair, ref, t0, t1, 0, bufs, slot, write_mbo, follow=True)
        runs[c.symbol] = run
    for c in spreads:
        fair = _fair_price(c, day, s_open)
        rate = BASE_RATE * scale * _spread_share(c, day)
        ref = np.full(1, fair * 1e9 / c.tick)
        runs[c.symbol] = _simulate_instrument(c, day, seed, rate, fair, ref, t0, t1, 0, bufs, len(runs), write_mbo)
    return _Session(day, cons, runs, leader.symbol if leader else "", bufs)


#: Bytes per chunk of merged records handed to zstd: big chunks cut the per-call overhead of
#: the streaming compressor (about 10 % faster than 1 MiB chunks; the frame is the same).
_CHUNK_BYTES = 1 << 24


@numba.njit(cache=True)
def _merge_rows(parts, col, pos, out, trades, nt):
    """Next rows of the k-way merge of the parts (each non-decreasing in word ``col``, ts_recv;
    equal keys keep part order, as a stable sort of the concatenation), copied into ``out``.

    ``pos[p]``: the next row of part ``p`` (advanced; the merge resumes from it). The best part
    is copied in runs: while its key stays below those of the parts before it and at most those
    after it. With rows in ``trades`` (kind mbp-10), each 'T' record also goes to
    ``trades[nt]`` as TradeMsg words (:func:`_trade_into`). Returns (rows copied, nt)."""
    k = len(parts)
    m = out.shape[0]
    w = out.shape[1]
    want = trades.shape[0] > 0
    big = np.iinfo(np.int64).max
    i = 0
    while i < m:
        best = -1
        bt = np.int64(0)
        for p in range(k):
            if pos[p] < parts[p].shape[0]:
                t = parts[p][pos[p], col]
                if best < 0 or t < bt:
                    best = p
                    bt = t
        if best < 0:
            break
        lo = big  # keys of earlier parts: the run's keys must stay strictly below
        hi = big  # keys of later parts: at most equal
        lo_set = False
        for q in range(k):
            if q != best and pos[q] < parts[q].shape[0]:
                t = parts[q][pos[q], col]
                if q < best:
                    if t < lo:
                        lo = t
                        lo_set = True
                elif t < hi:
                    hi = t
        src = parts[best]
        r = pos[best]
        end = src.shape[0]
        while i < m and r < end:
            t = src[r, col]
            if t > hi or (lo_set and t >= lo):
                break
            if r > 0 and t < src[r - 1, col]:
                raise ValueError("records of an instrument are not in ts_recv order")
            for b in range(w):
                out[i, b] = src[r, b]
            if want and _trade_into(src, r, trades, nt):
                nt += 1
            r += 1
            i += 1
        pos[best] = r
    return i, nt


@numba.njit(cache=True, inline="always")
def _trade_into(src, r, out, m):
    """When MBP-10 record ``src[r]`` (int64 words) is a trade (action 'T'), write its TradeMsg
    (first 6 words, length 12, rtype 0, F_LAST set) to ``out[m]`` and return True."""
    if ((src[r, 3] >> 32) & 0xFF) != 84:  # action 'T'
        return False
    for b in range(6):
        out[m, b] = src[r, b]
    out[m, 0] = (out[m, 0] & ~np.int64(0xFFFF)) | 12  # length 48 // 4, rtype 0
    out[m, 3] |= np.int64(F_LAST) << 48
    return True


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


def ceiling_estimate(up: np.ndarray, down: np.ndarray) -> float:
    """Best possible AUC from Monte-Carlo outcomes: ``up[i, r]`` / ``down[i, r]`` (bool) say
    whether path ``r`` from state ``i`` ended up / down (neither: a tie, no label).

    With ``a_i``, ``b_i`` the probabilities of up and down from state ``i``, the Bayes score
    ranks states by ``a_i / (a_i + b_i)`` and its AUC over the states is exactly
    ``1/2 + sum_{i<j} |a_i b_j - a_j b_i| / (2 D)``, ``D = sum_{i != j} a_i b_j``. ``D`` is
    estimated without bias from the path frequencies; ``|.|`` is not: the plug-in
    ``|a^_i b^_j - a^_j b^_i|`` is biased up by the paths' noise (by ``+c var`` to first
    order) and the split-half ``(Z_B sign Z_A)`` (score from half A, labels from half B, the
    usual held-out AUC) is biased down (by ``-2 c var_half = -4 c var``); ``(2 plug-in +
    split) / 3`` cancels the first-order terms. ``tests/test_synth.py`` checks it against the
    exact value on known probabilities and for convergence in the number of paths."""
    h = up.shape[1] // 2
    a, b = up.mean(1), down.mean(1)
    d = float(a.sum() * b.sum() - np.sum(a * b))
    if d <= 0:
        return float("nan")

    def z(ap: np.ndarray, bp: np.ndarray) -> np.ndarray:  # Z[i, j] = a_i b_j - a_j b_i
        m = np.outer(ap, bp)
        return m - m.T

    plug = np.abs(z(a, b)).sum() / 2.0  # each unordered pair twice in the matrix
    z_a = z(up[:, :h].mean(1), down[:, :h].mean(1))
    z_b = z(up[:, h:].mean(1), down[:, h:].mean(1))
    split = (z_b * np.sign(z_a) + z_a * np.sign(z_b)).sum() / 4.0  # both halves as the score
    return float(0.5 + (2.0 * plug + split) / 3.0 / (2.0 * d))


def auc_ceiling(
    run: _InstrumentRun, horizons: Sequence[int], paths: dict[int, int] | int, seed: int, threads: int | None = None
) -> dict[str, float]:
    """Best possible AUC per label horizon for the leading outright, by Monte-Carlo.

    From each saved state (evenly spaced over the session's events), ``paths[h]`` continuations
    (nested: the paths of a longer horizon serve the shorter ones too) are simulated under the
    true model with fresh randomness, and :func:`ceiling_estimate` turns their outcomes into
    the AUC of the Bayes score ``P(up | state, no tie)`` over the states. The state includes
    the hidden latent fair value, so the value bounds any model on observable features from
    above; the continuations let the latent walk freely (per-event s.d. as in the session)
    rather than towards the session's close, which no model can know (given the past, the
    bridged latent is such a walk). The states run in ``threads`` threads
    (default: all cores) in blocks seeded by ``(seed, block)``: the result does not depend on
    the thread count. Its accuracy (bias from the paths' noise plus the spread from the
    sampled states) is checked in ``tests/test_synth.py`` (doubling the paths moves it < 0.015).
    """
    assert run.saved is not None
    hs = np.asarray(sorted(horizons), np.int64)
    if isinstance(paths, int):
        paths = {int(h): paths for h in hs}
    k = max(paths.values())
    # path r runs to the longest horizon that uses it
    n_steps = np.array([max([int(h) for h in hs if r < paths[int(h)]] or [0]) for r in range(k)], np.int64)
    s_st, s_fst = run.saved
    out = np.zeros((s_st.shape[0], k, hs.shape[0]), np.int8)
    block = 8
    blocks = list(range(0, s_st.shape[0], block))

    def work(lo: int) -> None:
        rng = np.random.default_rng(np.random.SeedSequence([seed, 9_999, lo]))
        hi = lo + block
        _mc_outcomes(rng, run.params, s_st[lo:hi], s_fst[lo:hi], hs, n_steps, out[lo:hi])

    threads = threads or os.cpu_count() or 1
    if threads > 1 and len(blocks) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(work, blocks))
    else:
        for lo in blocks:
            work(lo)
    res: dict[str, float] = {}
    for j, h in enumerate(hs):
        o = out[:, : paths[int(h)], j]
        res[str(int(h))] = round(ceiling_estimate(o > 0, o < 0), 4)
    return res


# --------------------------------------------------------------------------------------------
# Records, files
# --------------------------------------------------------------------------------------------


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
        for f in (
            "leg_ratio_price_numerator",
            "leg_ratio_price_denominator",
            "leg_ratio_qty_numerator",
            "leg_ratio_qty_denominator",
        ):
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
            intervals=[SimpleNamespace(start_date=first, end_date=end_date, symbol=str(c.instrument_id))],
        )
        for c in cons
    ]
    md = dbn.Metadata(
        dataset="GLBX.MDP3",
        schema=_SCHEMAS[schema],
        start=t0,
        stype_in=dbn.SType.PARENT,
        stype_out=dbn.SType.INSTRUMENT_ID,
        symbols=["ES.FUT"],
        partial=[],
        not_found=[],
        mappings=mappings,
        end=t1,
        limit=None,
        ts_out=False,
        version=3,
    )
    return bytes(md.encode())


_FAST_PARAMS = dict(
    window_log=17,
    hash_log=12,
    chain_log=12,
    search_log=1,
    min_match=5,
    target_length=1,
    strategy=zstandard.STRATEGY_FAST,
)


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """Single-threaded zstd compressor of ``level`` (level 1: :data:`_FAST_PARAMS`). Frames
    carry the XXH64 content checksum, as Databento's files do: a reader detects corrupt data
    (zstd alone cannot: a damaged block often still decodes)."""
    if level == FAST_ZSTD_LEVEL:
        return zstandard.ZstdCompressor(
            compression_params=zstandard.ZstdCompressionParameters(**_FAST_PARAMS, threads=0, write_checksum=1)
        )
    return zstandard.ZstdCompressor(level=level, threads=0, write_checksum=True)


def _write_atomic(
    path: Path, header: bytes, chunks: Iterable[np.ndarray], nbytes: int, level: int = ZSTD_LEVEL
) -> None:
    """Write ``header`` and the record bytes ``chunks`` (``nbytes`` in all) as one zstd frame
    (single threaded; the bytes do not depend on how the records are chunked)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    cctx = _compressor(level)
    try:
        with open(tmp, "wb") as fh:
            cobj = cctx.compressobj(size=len(header) + nbytes)
            fh.write(cobj.compress(header))
            done = 0
            for data in chunks:
                fh.write(cobj.compress(data))
                done += data.nbytes
            if done != nbytes:
                raise RuntimeError(f"{path.name}: {done} record bytes written, {nbytes} announced")
            fh.write(cobj.flush())
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def _session_job(
    day: datetime.date,
    seed: int,
    scale: float,
    contracts: tuple[str, ...] | None,
    schemas: tuple[str, ...],
    out: Path,
    level: int,
    mc: tuple[tuple[int, ...], int, dict[int, int]] | None,
) -> dict[str, Any]:
    """Simulate and write one session; returns the paths and a summary (JSON-able)."""
    t0, t1 = session_bounds(day)
    sess = _simulate_session(day, seed, scale, contracts, mc[1] if mc else 0, _POOL, "mbo" in schemas)
    stem = f"glbx-mdp3-{day:%Y%m%d}"
    counts: dict[str, int] = {}
    n_mbp = sum(r.mbp.shape[0] for r in sess.runs.values())
    n_mbo = sum(r.n_mbo for r in sess.runs.values())
    trades: np.ndarray | None = None
    if "mbp-10" in schemas and "trades" in schemas:  # the trades are collected as mbp-10 is merged
        n_tr = sum(int(r.stats[7]) for r in sess.runs.values())
        trades = np.empty(n_tr, TRADE_DTYPE) if sess.bufs is None else sess.bufs.get("trades", TRADE_DTYPE, n_tr)
    for schema in sorted(schemas, key=lambda s: s != "mbp-10"):  # mbp-10 first (files are independent)
        path = out / f"{stem}.{schema}.dbn.zst"
        header = _metadata(schema, sess.contracts, t0, t1)
        if schema in ("mbp-10", "mbo"):  # merged chunk by chunk: no session-sized copy
            kind, n = ("mbp", n_mbp) if schema == "mbp-10" else ("mbo", n_mbo)
            size = _MBP_SIZE if kind == "mbp" else _MBO_SIZE
            _write_atomic(path, header, sess.chunks(kind, trades=trades if kind == "mbp" else None), n * size, level)
        else:
            if schema == "trades":
                recs = trades if trades is not None else sess.trades()
            else:
                recs = _definitions(sess.contracts, day, t0)
            n = recs.shape[0]
            _write_atomic(path, header, [recs.view(np.uint8).reshape(-1)], recs.nbytes, level)
        counts[schema] = int(n)
    paths = [str(out / f"{stem}.{schema}.dbn.zst") for schema in schemas]
    counts = {schema: counts[schema] for schema in schemas}  # in the order of ``schemas``
    inst = {}
    c_ids = {c.symbol: c.instrument_id for c in sess.contracts}
    for sym, r in sess.runs.items():
        inst[sym] = {
            "instrument_id": c_ids[sym] if r.n_mbo else None,
            "events": int(r.stats[0]),
            "mbo_records": r.n_mbo,
            "mbp10_records": int(r.mbp.shape[0]),
            "trade_events": int(r.stats[3]),
            "traded_volume": int(r.stats[6]),
            "crossed_preopen": bool(r.crossed),
            "locked_events": int(r.stats[1]),
            "bad_ts_recv_events": int(r.stats[2]),
            "thin_book_row_fraction": round(float(r.stats[5]) / float(r.stats[4]) if r.stats[4] else 0.0, 6),
        }
    res: dict[str, Any] = {
        "session": day.isoformat(),
        "paths": paths,
        "records": counts,
        "mbp10_records": int(n_mbp),
        "mbo_records": int(n_mbo),
        "leader": sess.leader,
        "instruments": inst,
    }
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
    summary: list[dict[str, Any]] | None = None,
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
    summary : list, optional
        Receives one dict per session (record counts per schema and instrument, rare cases).

    Returns
    -------
    list[Path]
        Paths written, per session in the order of ``schemas`` (the report not included).
    """
    start, sessions = validate_date(start, "--start"), validate_int(sessions, "--sessions", lo=1)
    seed, scale = validate_int(seed, "--seed", lo=0), validate_enum(scale, Scale, "--scale").value
    schemas, jobs = tuple(s.value for s in validate_schemas(schemas)), validate_jobs(jobs)
    if zstd_level is not None:
        zstd_level = validate_int(zstd_level, "--zstd-level", lo=1, hi=22)
    level = zstd_level if zstd_level is not None else (ZSTD_LEVEL if scale == "quiet" else FAST_ZSTD_LEVEL)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    days = trade_dates(start, sessions)
    mc = (AUC_HORIZONS, AUC_STATES, AUC_PATHS)
    tasks = [
        (d, seed, SCALES[scale], contracts, tuple(schemas), out, level, mc if (report and i == 0) else None)
        for i, d in enumerate(days)
    ]
    results: list[dict[str, Any]] = []
    if jobs <= 1 or len(tasks) == 1:
        try:
            for t in tasks:
                results.append(_session_job(*t))
                if progress:
                    progress(1)
        finally:
            _POOL.clear()  # worker processes keep theirs for their next sessions
    else:
        par = joblib.Parallel(n_jobs=jobs, backend="loky", return_as="generator")
        for r in par(joblib.delayed(_session_job)(*t) for t in tasks):
            results.append(r)
            if progress:
                progress(1)
    written = [Path(p) for r in results for p in r["paths"]]
    if summary is not None:
        summary.extend(results)
    if report:
        rep = {
            "generator": "alphafeat.synth",
            "start": start.isoformat(),
            "sessions": sessions,
            "seed": seed,
            "scale": scale,
            "schemas": list(schemas),
            "zstd_level": level,
            "model": {
                "ofi_strength_kappa": OFI_STRENGTH,
                "w_imbalance": W_IMB,
                "w_flow": W_FLOW,
                "w_reference": W_REF,
                "daily_vol": DAILY_VOL,
                "sigma_event_max_ticks": SIGMA_EVENT_MAX,
                "session_vol": round(_session_vol(SCALES[scale], _level(days[0])), 6),
                "carry_rate": CARRY_RATE,
                "rare_case_rates": {
                    "crossed_preopen_per_outright_session": P_CROSSED_PREOPEN,
                    "locked_book_per_event_at_one_tick_spread": P_LOCK,
                    "bad_ts_recv_per_event": P_BAD_TS,
                    "tail_level_not_replenished": 1.0 - P_REPLENISH,
                },
            },
            "auc_ceiling": {
                "horizons_snapshots": list(AUC_HORIZONS),
                "instrument": results[0]["leader"],
                "session": results[0]["session"],
                "states": AUC_STATES,
                "paths_per_state": AUC_PATHS,
                "auc": results[0].get("auc_ceiling", {}),
                "method": "Monte-Carlo continuations under the true model, bias-corrected estimator "
                "(see synth.auc_ceiling, synth.ceiling_estimate)",
            },
            "mbp10_records": sum(r["mbp10_records"] for r in results),
            "mbo_records": sum(r["mbo_records"] for r in results),
            "sessions_detail": [{k: v for k, v in r.items() if k not in ("paths", "auc_ceiling")} for r in results],
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
