"""Synthetic CME Globex E-mini S&P 500 (``ES.FUT``) data written as genuine Databento DBN v3.

:func:`generate` writes one zstd-compressed DBN v3 file per trading session and schema, named
like Databento's (``glbx-mdp3-YYYYMMDD.mbp-10.dbn.zst``, ``.trades.dbn.zst``,
``.definition.dbn.zst``), readable by ``databento.DBNStore.from_file(path).to_ndarray()``.

Instruments
-----------
By default the two nearest quarterly outrights at the session date (H/M/U/Z expire on the third
Friday of Mar/Jun/Sep/Dec, trading ends 08:30 CT that day) and their calendar spread
``"<front>-<back>"`` (instrument_class ``'S'``, price = front - back, tick 0.05 index points as
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

Book model (per instrument, :func:`_simulate`, numba)
-----------------------------------------------------
State: best bid tick b, best ask tick a >= b + 1, sizes/order counts on ``n_levels``
consecutive ticks per side (10 for outrights, 5 for the spread; deeper levels UNDEF).
Events arrive in bursts (cluster process: burst starts are Poisson with the profile rate /
mean burst size 2.5, gaps inside a burst exponential with mean 150 us). Each event:

* signal ``S = clip(w_I * I + w_F * tanh(F / F0) + w_R * clip((R - mid) / 4 ticks, -1, 1), -1, 1)``
  with I = (bid_sz_0 - ask_sz_0) / (bid_sz_0 + ask_sz_0) the level-1 queue imbalance,
  F the signed aggressor volume (buy +, sell -) decayed by 0.95 per event, F0 = 10 contracts,
  R a reference mid in ticks: for the leading (most active) outright a latent random walk
  (per-event N(0, sigma^2), sigma set so the daily s.d. is :data:`DAILY_VOL` = 0.5 % of price),
  for the other outright the leader's mid (1 s grid) + carry, for the spread its constant carry
  fair value; (w_I, w_F, w_R) = :data:`W_IMB`, :data:`W_FLOW`, :data:`W_REF` = (0.35, 0.35, 0.6);
  up-pressure ``u = 0.5 + 0.5 * kappa * S``; ``kappa`` = :data:`OFI_STRENGTH` (0.5) is the
  strength of the mid's response to order-flow imbalance.
* if the spread is wider than one tick, with probability 0.65 a new level is added inside it,
  on the bid with probability u (else on the ask) - this is how the mid moves;
* else with probability p_trade (0.15 outrights, 0.06 spread) a market order: buy with
  probability u; with probability 0.02 + 0.05 |gap term| it clears the whole best level, else
  size 1 with probability 0.6 or 1 + Geometric(mean 4.5) (about 60 % size 1, mean ~3);
  fills level 0 and sweeps deeper if needed;
* else a limit add / cancel / modify at level k (P(k) decreasing with k): adds are chosen with
  probability T_k / (T_k + size) (T_0 = 45, T_k = 55 contracts: measured medians ~6-15 at
  level 1, ~45-55 deeper, spread 1 tick ~92 %) so sizes mean-revert; at
  level 0 that probability is multiplied by 2u on the bid and 2(1 - u) on the ask, so positive
  pressure depletes the ask and feeds the bid. Only level 0 can be emptied by a cancel; a
  removed level 0 shifts the side and a fresh level enters at the tail.

The planted effect: the next mid move is predicted by I and by recent signed trade flow, with
strength ``kappa``. No crossed or locked books are planted: every record has
bid_px_00 < ask_px_00.

Records
-------
MBP-10 records per book change: ``action`` 'A' (size added), 'C' (size cancelled or filled,
incl. a level removed), 'M' (an order modified: size changed, 15 % of reductions and 10 % of
additions), 'T' (trade: side = aggressor, 'B' buy / 'A' sell, ``depth`` = level traded, book
unchanged); ``size`` is the quantity of the change (contracts), ``price`` the level's price,
``depth`` the level index after the change (0 for level-0 changes). A market order emits one 'T'
per price level it trades at, then one 'C' per level consumed (side = resting side). F_LAST
(0x80) marks the last record of each event; the book snapshot of a record is the state after
it. ``ts_recv = ts_event + 80 us + Exp(25 us)`` (median about 97 us) made non-decreasing per
instrument, records of one event share both timestamps, files are sorted by ``ts_recv``
(stable). ``sequence`` counts events per instrument. The trades file holds exactly the 'T'
records of the MBP-10 file (same ts_event, ts_recv, price, size, side, depth, sequence), with
F_LAST set on each, as Databento's trades schema does.

Determinism: no wall clock; every random stream is a numpy ``Generator`` seeded from
``(seed, date, instrument id, stream)``; zstd level fixed (:data:`ZSTD_LEVEL`, single threaded).
"""

from __future__ import annotations

import datetime
import math
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import databento_dbn as dbn
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
    "contracts_for",
    "front_by_volume",
    "generate",
    "make_default_sample",
    "session_bounds",
    "trade_dates",
    "volume_share",
]

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
SCALES = {"quiet": 1.0, "normal": 10.0, "busy": 100.0}
#: Book events per second per unit of profile multiplier and unit volume share at scale 1.
BASE_RATE = 0.085
#: Weights of level-1 queue imbalance, signed-flow and reference-gap terms in the signal S.
W_IMB, W_FLOW, W_REF = 0.35, 0.35, 0.6
#: Size targets (contracts) of level 1 and of deeper levels.
T_LEVEL1, T_DEEP = 45.0, 55.0
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
assert _MBP_SIZE == 368 and TRADE_DTYPE.itemsize == 48
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
        front, back = _next_quarterlies(day, 2)
        symbols: list[str] = [front, back, f"{front}-{back}"]
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
# numba kernels
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def _geometric(rng, p):
    """Geometric(p) on {1, 2, ...} by inversion of one uniform."""
    return np.int64(1 + math.floor(math.log(1.0 - rng.random()) / math.log(1.0 - p)))


@numba.njit(cache=True)
def _event_times(rng, seg_start, seg_end, seg_rate, mean_burst, burst_gap_ns):
    """Event times (int64 ns, strictly increasing) of a bursty Poisson cluster process.

    Burst starts: Poisson with rate ``seg_rate / mean_burst`` (events/s) in each segment;
    burst size 1 + Geometric (mean ``mean_burst``); gaps inside a burst Exp(``burst_gap_ns``).
    """
    cap = 1024
    total = 0.0
    for s in range(seg_start.shape[0]):
        total += seg_rate[s] * (seg_end[s] - seg_start[s]) * 1e-9
    cap = max(cap, int(total * 1.3) + 1024)
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
                    tb += max(1.0, rng.standard_exponential() * burst_gap_ns)
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
def _write(i8, u4, u1, n, ts_ev, ts_rc, price, size, action, side, flags, depth, seq, tid,
           b, a, tick, nlev, bsz, asz):
    i8[n, 1] = ts_ev
    i8[n, 2] = price
    i8[n, 4] = ts_rc
    u4[n, 6] = size
    u4[n, 10] = tid
    u4[n, 11] = seq
    u1[n, 28] = action
    u1[n, 29] = side
    u1[n, 30] = flags
    u1[n, 31] = depth
    undef = np.int64(9223372036854775807)
    for k in range(10):
        if k < nlev:
            i8[n, 6 + 4 * k] = (b - k) * tick
            i8[n, 7 + 4 * k] = (a + k) * tick
            sb = bsz[k]
            sa = asz[k]
            u4[n, 16 + 8 * k] = sb
            u4[n, 17 + 8 * k] = sa
            u4[n, 18 + 8 * k] = max(1, (sb * 3 + 3) // 5)
            u4[n, 19 + 8 * k] = max(1, (sa * 3 + 3) // 5)
        else:
            i8[n, 6 + 4 * k] = undef
            i8[n, 7 + 4 * k] = undef
            u4[n, 16 + 8 * k] = 0
            u4[n, 17 + 8 * k] = 0
            u4[n, 18 + 8 * k] = 0
            u4[n, 19 + 8 * k] = 0


@numba.njit(cache=True)
def _draw_level_size(rng, target):
    return max(1, np.int64(target * (0.4 + 1.2 * rng.random())))


@numba.njit(cache=True)
def _draw_order_size(rng):
    if rng.random() < 0.55:
        return np.int64(1)
    return np.int64(1 + _geometric(rng, 0.3))


@numba.njit(cache=True)
def _simulate(rng, times, b0, a0, tick, nlev, params, ref, ref_t0, seq0, i8, u4, u1):
    """Run the book model over event ``times`` and write MBP-10 records.

    Parameters: ``params`` = [kappa, w_I, w_F, w_R, F0, decay, p_trade, p_fill, T0, Tdeep];
    ``ref`` = reference mid in ticks on a 1 s grid from ``ref_t0``. Writes into the int64 /
    uint32 / uint8 views of a zeroed MBP10 buffer; returns the number of records, or -1 if the
    buffer is too small.
    """
    kappa = params[0]
    w_i = params[1]
    w_f = params[2]
    w_r = params[3]
    f0 = params[4]
    decay = params[5]
    p_trade = params[6]
    p_fill = params[7]
    t0 = params[8]
    tdeep = params[9]
    sigma = params[10]
    p_sweep0 = params[11]
    p_sweep1 = params[12]
    latent = 0.5 * (b0 + a0)
    cap = i8.shape[0]
    b = np.int64(b0)
    a = np.int64(a0)
    bsz = np.zeros(10, np.int64)
    asz = np.zeros(10, np.int64)
    for k in range(nlev):
        tgt = t0 if k == 0 else tdeep
        bsz[k] = _draw_level_size(rng, tgt)
        asz[k] = _draw_level_size(rng, tgt)
    # cumulative level probabilities for liquidity events
    lvl_w = np.empty(nlev)
    acc = 0.0
    for k in range(nlev):
        acc += 0.35 if k == 0 else 0.65 * 0.8 ** (k - 1)
        lvl_w[k] = acc
    flow = 0.0
    last_rc = np.int64(0)
    n = 0
    nref = ref.shape[0]
    fills_px = np.empty(10, np.int64)
    fills_q = np.empty(10, np.int64)
    A_ = np.uint8(65)  # 'A'
    B_ = np.uint8(66)  # 'B'
    C_ = np.uint8(67)  # 'C'
    M_ = np.uint8(77)  # 'M'
    T_ = np.uint8(84)  # 'T'
    for e in range(times.shape[0]):
        if n + 25 > cap:
            return -1
        t = times[e]
        flow *= decay
        imb = (bsz[0] - asz[0]) / (bsz[0] + asz[0])
        s = w_i * imb + w_f * math.tanh(flow / f0)
        gap = 0.0
        if sigma > 0.0:
            latent += sigma * rng.standard_normal()
            gap = min(max((latent - 0.5 * (a + b)) / 4.0, -1.0), 1.0)
        elif w_r != 0.0:
            gi = (t - ref_t0) // 1_000_000_000
            gi = min(max(gi, 0), nref - 1)
            gap = min(max((ref[gi] - 0.5 * (a + b)) / 4.0, -1.0), 1.0)
        s += w_r * gap
        s = min(max(s, -1.0), 1.0)
        u = 0.5 + 0.5 * kappa * s
        lat = np.int64(80_000 + min(rng.standard_exponential() * 25_000.0, 5_000_000.0))
        rc = max(t + lat, last_rc)
        last_rc = rc
        tid = np.int64(15_000 + 15_000.0 * rng.random())
        seq = seq0 + e
        if a - b > 1 and rng.random() < p_fill:
            q = _draw_order_size(rng)
            if rng.random() < u:  # new best bid inside the spread
                for k in range(nlev - 1, 0, -1):
                    bsz[k] = bsz[k - 1]
                b += 1
                bsz[0] = q
                _write(i8, u4, u1, n, t, rc, b * tick, q, A_, B_, F_LAST, 0, seq, tid,
                       b, a, tick, nlev, bsz, asz)
            else:
                for k in range(nlev - 1, 0, -1):
                    asz[k] = asz[k - 1]
                a -= 1
                asz[0] = q
                _write(i8, u4, u1, n, t, rc, a * tick, q, A_, A_, F_LAST, 0, seq, tid,
                       b, a, tick, nlev, bsz, asz)
            n += 1
        elif rng.random() < p_trade:
            buy = rng.random() < u
            if rng.random() < p_sweep0 + p_sweep1 * abs(gap):
                qty = asz[0] if buy else bsz[0]  # clears the best level
            elif rng.random() < 0.6:
                qty = np.int64(1)
            else:
                qty = np.int64(min(1 + _geometric(rng, 1.0 / 4.5), 200))
            flow += qty if buy else -qty
            # fills against the resting side, level by level (pre-trade book)
            nf = 0
            rem = qty
            while rem > 0 and nf < nlev:
                lvl_sz = asz[nf] if buy else bsz[nf]
                f = min(rem, lvl_sz)
                fills_px[nf] = (a + nf) * tick if buy else (b - nf) * tick
                fills_q[nf] = f
                rem -= f
                nf += 1
            aggr = B_ if buy else A_
            rest = A_ if buy else B_
            for j in range(nf):
                _write(i8, u4, u1, n, t, rc, fills_px[j], fills_q[j], T_, aggr, 0, j, seq, tid,
                       b, a, tick, nlev, bsz, asz)
                n += 1
            for j in range(nf):
                last = F_LAST if j == nf - 1 else 0
                if buy:
                    asz[0] -= fills_q[j]
                    if asz[0] == 0:
                        for k in range(nlev - 1):
                            asz[k] = asz[k + 1]
                        asz[nlev - 1] = _draw_level_size(rng, tdeep)
                        a += 1
                else:
                    bsz[0] -= fills_q[j]
                    if bsz[0] == 0:
                        for k in range(nlev - 1):
                            bsz[k] = bsz[k + 1]
                        bsz[nlev - 1] = _draw_level_size(rng, tdeep)
                        b -= 1
                _write(i8, u4, u1, n, t, rc, fills_px[j], fills_q[j], C_, rest, last, 0, seq,
                       tid, b, a, tick, nlev, bsz, asz)
                n += 1
        else:
            x = rng.random() * lvl_w[nlev - 1]
            k = 0
            while k < nlev - 1 and x > lvl_w[k]:
                k += 1
            bid = rng.random() < 0.5
            sz = bsz[k] if bid else asz[k]
            tgt = t0 if k == 0 else tdeep
            p_add = tgt / (tgt + sz)
            if k == 0:
                p_add *= 2.0 * u if bid else 2.0 * (1.0 - u)
            p_add = min(max(p_add, 0.02), 0.98)
            q = _draw_order_size(rng)
            if sz <= 1 and k > 0:
                p_add = 1.0
            side = B_ if bid else A_
            px = (b - k) * tick if bid else (a + k) * tick
            if rng.random() < p_add:
                act = M_ if rng.random() < 0.1 else A_
                if bid:
                    bsz[k] += q
                else:
                    asz[k] += q
                _write(i8, u4, u1, n, t, rc, px, q, act, side, F_LAST, k, seq, tid,
                       b, a, tick, nlev, bsz, asz)
            else:
                q = min(q, sz) if k == 0 else min(q, sz - 1)
                act = M_ if (rng.random() < 0.15 and q < sz) else C_
                depth = k
                if bid:
                    bsz[k] -= q
                    if bsz[k] == 0:
                        for kk in range(nlev - 1):
                            bsz[kk] = bsz[kk + 1]
                        bsz[nlev - 1] = _draw_level_size(rng, tdeep)
                        b -= 1
                else:
                    asz[k] -= q
                    if asz[k] == 0:
                        for kk in range(nlev - 1):
                            asz[kk] = asz[kk + 1]
                        asz[nlev - 1] = _draw_level_size(rng, tdeep)
                        a += 1
                _write(i8, u4, u1, n, t, rc, px, q, act, side, F_LAST, depth, seq, tid,
                       b, a, tick, nlev, bsz, asz)
            n += 1
    return n


# --------------------------------------------------------------------------------------------
# Session assembly
# --------------------------------------------------------------------------------------------


def _rng(seed: int, day: datetime.date, iid: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, day.toordinal(), iid, stream]))


def _simulate_instrument(
    c: Contract,
    day: datetime.date,
    seed: int,
    rate: float,
    fair: float,
    ref: np.ndarray | None,
    t0: int,
    t1: int,
) -> np.ndarray:
    """MBP-10 records (time order) of one instrument in one session.

    ``ref`` is the reference mid (ticks, 1 s grid from ``t0``); None for the leading outright,
    which tracks its own latent random walk instead (daily s.d. :data:`DAILY_VOL` of its price).
    """
    starts, ends, mults = _profile_segments(day)
    stop = min(t1 - 10_000_000, c.expiration_ns)
    ends = np.minimum(ends, stop)
    times = _event_times(_rng(seed, day, c.instrument_id, 1), starts, ends, mults * rate,
                         2.5, 150_000.0)
    tick = c.tick
    b0 = int(math.floor(fair * 1e9 / tick))
    sigma = 0.0
    if ref is None:
        sigma = DAILY_VOL * abs(fair) * 1e9 / tick / math.sqrt(max(times.shape[0], 1))
        ref = np.zeros(1)
    params = np.array([
        OFI_STRENGTH, W_IMB, W_FLOW, W_REF, 10.0, 0.95, 0.06 if c.is_spread else 0.15, 0.65,
        T_LEVEL1, T_DEEP, sigma, 0.02, 0.05,
    ])
    nlev = 5 if c.is_spread else 10
    seq0 = 1_000_000 + zlib.crc32(f"{c.symbol}{day.isoformat()}".encode()) % 50_000_000
    cap = 2 * times.shape[0] + 64
    while True:
        buf = np.zeros(cap, MBP10_DTYPE)
        raw = buf.view(np.uint8).reshape(cap, _MBP_SIZE)
        n = _simulate(_rng(seed, day, c.instrument_id, 2), times, b0, b0 + 1, tick, nlev,
                      params, ref, t0, seq0, raw.view(np.int64), raw.view(np.uint32), raw)
        if n >= 0:
            break
        cap *= 2
    buf = buf[:n]
    buf["length"] = _MBP_SIZE // 4
    buf["rtype"] = 0x0A
    buf["publisher_id"] = PUBLISHER_ID
    buf["instrument_id"] = c.instrument_id
    return buf


def _mid_grid(buf: np.ndarray, t0: int, t1: int, tick: int, initial: float) -> np.ndarray:
    """Mid (in ticks) at the end of every 1 s step from ``t0``: last F_LAST book before it."""
    grid = t0 + 1_000_000_000 * np.arange((t1 - t0) // 1_000_000_000 + 1, dtype=np.int64)
    last = buf[(buf["flags"] & F_LAST) != 0]
    mid = (last["bid_px_00"].astype(np.float64) + last["ask_px_00"]) / 2.0 / tick
    idx = np.searchsorted(last["ts_event"].astype(np.int64), grid, side="right") - 1
    out = np.where(idx >= 0, mid[np.maximum(idx, 0)], initial)
    return out.astype(np.float64)


def _session_mbp(
    day: datetime.date, seed: int, scale: float, contracts: Sequence[str] | None
) -> tuple[np.ndarray, list[Contract]]:
    t0, t1 = session_bounds(day)
    cons = contracts_for(day, contracts)
    anchor = _anchor_price(day, seed)
    outs = sorted((c for c in cons if not c.is_spread),
                  key=lambda c: (-volume_share(c.symbol, day), c.expiration_ns))
    spreads = [c for c in cons if c.is_spread]
    parts: list[np.ndarray] = []
    leader_grid: np.ndarray | None = None
    leader: Contract | None = None
    for c in outs:
        fair = _fair_price(c, day, anchor)
        rate = BASE_RATE * scale * volume_share(c.symbol, day)
        if leader is None:
            buf = _simulate_instrument(c, day, seed, rate, fair, None, t0, t1)
            leader, leader_grid = c, _mid_grid(buf, t0, t1, c.tick, fair * 1e9 / c.tick)
        else:
            assert leader_grid is not None
            offset = (fair - _fair_price(leader, day, anchor)) * 1e9 / c.tick
            buf = _simulate_instrument(c, day, seed, rate, fair, leader_grid + offset, t0, t1)
        parts.append(buf)
    for c in spreads:
        fair = _fair_price(c, day, anchor)
        rate = BASE_RATE * scale * _spread_share(c, day)
        ref = np.full(1, fair * 1e9 / c.tick)
        parts.append(_simulate_instrument(c, day, seed, rate, fair, ref, t0, t1))
    if parts:
        allrec = np.concatenate(parts)
    else:
        allrec = np.zeros(0, MBP10_DTYPE)
    order = np.argsort(allrec["ts_recv"], kind="stable")
    return allrec[order], cons


def _trades_from_mbp(mbp: np.ndarray) -> np.ndarray:
    """TradeMsg records equal to the 'T' records of an MBP-10 array (F_LAST set)."""
    sel = mbp[mbp["action"] == b"T"]
    out = np.zeros(sel.shape[0], TRADE_DTYPE)
    out_raw = out.view(np.uint8).reshape(-1, TRADE_DTYPE.itemsize)
    out_raw[:] = sel.view(np.uint8).reshape(-1, _MBP_SIZE)[:, : TRADE_DTYPE.itemsize]
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


def _write_atomic(path: Path, header: bytes, records: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=0)
    data = records.view(np.uint8).reshape(-1)
    chunk = 64 << 20
    try:
        with open(tmp, "wb") as fh:
            cobj = cctx.compressobj(size=len(header) + data.nbytes)
            fh.write(cobj.compress(header))
            for i in range(0, data.nbytes, chunk):
                fh.write(cobj.compress(data[i : i + chunk].tobytes()))
            fh.write(cobj.flush())
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def generate(
    out_dir: str | os.PathLike[str],
    *,
    start: datetime.date,
    sessions: int,
    seed: int = 0,
    schemas: tuple[str, ...] = ("mbp-10", "trades"),
    scale: str = "quiet",
    contracts: tuple[str, ...] | None = None,
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
        Non-negative seed; the same arguments give byte-identical files.
    schemas : tuple of str
        Any of ``"mbp-10"``, ``"trades"``, ``"definition"``.
    scale : str
        ``"quiet"`` (about 15k MBP-10 records per session over all instruments), ``"normal"``
        (x10) or ``"busy"`` (x100): multiplies every event rate.
    contracts : tuple of str, optional
        Raw symbols (outrights ``ESM4``, spreads ``ESH4-ESM4``); default: the two nearest
        quarterly outrights and their spread, chosen per session.

    Returns
    -------
    list[Path]
        Paths written, per session in the order of ``schemas``.
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
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for day in trade_dates(start, sessions):
        t0, t1 = session_bounds(day)
        mbp: np.ndarray | None = None
        cons = contracts_for(day, contracts)
        if "mbp-10" in schemas or "trades" in schemas:
            mbp, cons = _session_mbp(day, seed, SCALES[scale], contracts)
        stem = f"glbx-mdp3-{day:%Y%m%d}"
        for schema in schemas:
            if schema == "mbp-10":
                assert mbp is not None
                recs = mbp
            elif schema == "trades":
                assert mbp is not None
                recs = _trades_from_mbp(mbp)
            else:
                recs = _definitions(cons, day, t0)
            path = out / f"{stem}.{schema}.dbn.zst"
            _write_atomic(path, _metadata(schema, cons, t0, t1), recs)
            written.append(path)
    return written


def make_default_sample(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write the project's default sample: ``generate(out_dir, **DEFAULT_SAMPLE)``."""
    return generate(out_dir, **DEFAULT_SAMPLE)  # type: ignore[arg-type]
