"""Calendar, contracts and prices of the synthetic ES.FUT market (no randomness beyond the seeded
daily index moves).

Sessions come from the project's session calendar (:func:`alphafeat.plan.session_bounds`:
trade date D runs from 17:00 America/Chicago on the day before to 16:00 on D, zoneinfo, DST
aware) and expirations from :func:`alphafeat.instruments.third_friday`. This module adds what
only a generator needs: which contracts list on a day, their exchange-like ids, each one's share
of the volume around a roll, the time-of-day activity profile, the index level across sessions
and the fair price of every contract (cost of carry). See :mod:`alphafeat.synth` for the model.
"""

from __future__ import annotations

import datetime
import functools
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import numpy as np

from alphafeat.errors import UsageError
from alphafeat.instruments import third_friday
from alphafeat.plan import session_bounds as _plan_session_bounds

__all__ = [
    "ACTIVITY_PROFILE",
    "BASE_RATE",
    "SCALES",
    "Contract",
    "contracts_for",
    "front_by_volume",
    "nominal_events",
    "session_bounds",
    "trade_dates",
    "volume_share",
]

CT = ZoneInfo("America/Chicago")
#: CME Globex's daily maintenance break (16:00-17:00 CT) that opens each session of
#: :func:`alphafeat.plan.session_bounds`; the generated market trades after it.
BREAK_NS = 3_600_000_000_000
UTC = datetime.timezone.utc

#: Outright tick, 1e-9 index points (0.25).
OUTRIGHT_TICK = 250_000_000
#: Calendar-spread tick, 1e-9 index points (0.05).
SPREAD_TICK = 50_000_000
#: Event-rate multipliers of the ``scale`` argument.
SCALES = {"quiet": 1.0, "normal": 10.0, "busy": 100.0, "full": 300.0}
#: Book events per second per unit of profile multiplier and unit volume share at scale 1.
BASE_RATE = 0.085
#: Standard deviation of the index's log move over a session (ES about 0.8 % in 2024), unless
#: the scale is too sparse for it (:data:`P_MOVE_MAX`).
DAILY_VOL = 0.008
#: Largest probability that a book event of the leading outright moves its mid (one tick): a
#: sparse scale moves less over a session (its session volatility is ``sqrt(P_MOVE_MAX n)`` ticks
#: for ``n`` events), a dense one moves less often per event (the daily volatility is kept).
P_MOVE_MAX = 0.04
#: Annualised cost of carry (interest minus dividend yield) pricing outrights from the index
#: level: ``F = S exp(CARRY_RATE * years to expiry)``.
CARRY_RATE = 0.045

#: Time-of-day activity profile, CT wall clock: (start "HH:MM", end "HH:MM", multiplier,
#: spread-widening factor). Segments starting at or after 17:00 lie on the calendar day before
#: the trade date. Regular hours 08:30-15:15 carry about 70 % of the events, U-shaped: the first
#: hour about 2.6x and the last about 1.7x the 10:00-14:00 rate (ES-like: Admati & Pfleiderer
#: 1988; the CME's own hourly volume profile); the spread widens twice as often after the open
#: and before the close.
ACTIVITY_PROFILE: tuple[tuple[str, str, float, float], ...] = (
    ("17:00", "18:00", 1.0, 1.0),
    ("18:00", "02:00", 0.5, 1.0),
    ("02:00", "07:00", 1.0, 1.0),
    ("07:00", "08:30", 1.8, 1.0),
    ("08:30", "09:00", 12.0, 3.0),
    ("09:00", "10:00", 6.0, 1.5),
    ("10:00", "14:00", 3.5, 1.0),
    ("14:00", "15:00", 5.0, 1.0),
    ("15:00", "15:15", 9.0, 2.0),
    ("15:15", "16:00", 1.5, 1.0),
)

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


def _quarterly_symbol(year: int, month: int) -> str:
    return f"ES{_MONTH_CODES[month]}{year % 10}"


def parse_outright(symbol: str, near: datetime.date) -> tuple[int, int]:
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
    return third_friday(*parse_outright(symbol, near))


def _expiration_ns(day: datetime.date) -> int:
    return ns_of(datetime.datetime(day.year, day.month, day.day, 8, 30, tzinfo=CT))


def _instrument_id(symbol: str) -> int:
    if symbol in _KNOWN_IDS:
        return _KNOWN_IDS[symbol]
    iid = 1000 + zlib.crc32(symbol.encode()) % 900_000
    while iid in _KNOWN_IDS.values():
        iid += 1
    return iid


def ns_of(t: datetime.datetime) -> int:
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
        if third_friday(year, month) >= day:
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
    year, month = parse_outright(symbol, day)
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


def spread_share(c: Contract, day: datetime.date) -> float:
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
    """``[start, end)`` of the generated session of trade date ``day``, ns since the epoch: the
    project's session (:func:`alphafeat.plan.session_bounds`, D-1 16:00 CT to D 16:00 CT) after
    the daily break, i.e. D-1 17:00 CT to D 16:00 CT."""
    start, end = _plan_session_bounds(day)
    return start + BREAK_NS, end


def profile_segments(day: datetime.date) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Profile segments of session ``day``: start ns, end ns, multiplier, widening factor (DST
    aware)."""
    prev = day - datetime.timedelta(days=1)
    starts, ends, mults, widen = [], [], [], []
    for a, b, m, w in ACTIVITY_PROFILE:
        ha, ma = map(int, a.split(":"))
        hb, mb = map(int, b.split(":"))
        da = prev if ha >= 17 else day
        db_ = da if (hb, mb) > (ha, ma) else da + datetime.timedelta(days=1)
        starts.append(ns_of(datetime.datetime(da.year, da.month, da.day, ha, ma, tzinfo=CT)))
        ends.append(ns_of(datetime.datetime(db_.year, db_.month, db_.day, hb, mb, tzinfo=CT)))
        mults.append(m)
        widen.append(w)
    f8 = np.float64
    return np.array(starts, np.int64), np.array(ends, np.int64), np.array(mults, f8), np.array(widen, f8)


def trend_level(day: datetime.date) -> float:
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


def session_vol(scale: float, level: float) -> float:
    """Standard deviation of the log index move over one session at ``scale``.

    ``min(DAILY_VOL, sqrt(P_MOVE_MAX * n) * 0.25 / level)`` with ``n`` the nominal book events
    of a contract holding all the volume (:func:`nominal_events`): the leading outright's mid is
    a walk of one-tick moves, at most :data:`P_MOVE_MAX` of its events, so a sparse session
    (``quiet``) moves less than ES's daily volatility."""
    return min(DAILY_VOL, math.sqrt(P_MOVE_MAX * nominal_events(scale)) * OUTRIGHT_TICK * 1e-9 / level)


@functools.lru_cache(maxsize=64)
def nominal_events(scale: float) -> float:
    """Expected book events of one outright with volume share 1 in a 23-hour session (cached:
    :func:`index_level` needs it for some 1500 dates a session)."""
    hours = 0.0
    for a, b, m, _ in ACTIVITY_PROFILE:
        ha, ma = map(int, a.split(":"))
        hb, mb = map(int, b.split(":"))
        hours += m * (((hb * 60 + mb) - (ha * 60 + ma)) % (24 * 60)) / 60.0
    return BASE_RATE * scale * hours * 3600.0


def _session_vols(scale: float, ords: Sequence[int]) -> np.ndarray:
    """:func:`session_vol` of the trade dates with ordinals ``ords``."""
    return np.array([_session_vol_on(scale, o) for o in ords])


@functools.lru_cache(maxsize=1 << 14)
def _session_vol_on(scale: float, ordinal: int) -> float:
    """:func:`session_vol` of the trade date with ordinal ``ordinal`` (cached: consecutive
    sessions share all but one of their :data:`_X_WINDOW` dates)."""
    return session_vol(scale, trend_level(datetime.date.fromordinal(ordinal)))


def index_level(day: datetime.date, seed: int, scale: float) -> tuple[float, float]:
    """Spot-like ES index level (index points) at the open and at the close of session ``day``.

    ``S_open(d) = level(d) * exp(X(d))``, ``S_close(d) = level(d) * exp(X(next(d)))`` with
    ``X`` an AR(1) (mean reverting, 250-session time constant) of the session moves
    ``X(next(d)) = rho X(d) + v(d) z_d``, ``z_d ~ N(0, 1)`` seeded by ``(seed, date)``,
    ``v`` = :func:`session_vol`. The next session therefore opens where this one closes; the
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
    lv = trend_level(day)
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


def fair_price(c: Contract, day: datetime.date, index: float) -> float:
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

