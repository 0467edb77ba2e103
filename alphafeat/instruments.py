"""Instrument selection: trading sessions, symbology, contract expirations and the front month.

Trading session
    CME Globex trades E-mini futures Sunday-Friday 17:00-16:00 America/Chicago, with a daily
    break 16:00-17:00 CT. A record belongs to the session of trade date ``D`` when its time
    in Chicago lies in ``[D-1 16:00, D 16:00)``: the break and the pre-open belong to the
    session that follows them. Daylight saving is handled by ``zoneinfo``; boundaries are
    computed once per calendar day, then rows are assigned with ``np.searchsorted``.

Front month (``--instrument-mode front-month``)
    Candidates are the outright contracts of the root present in a session: whole symbols
    matching ``{root}[FGHJKMNQUVXZ]\\d{1,2}`` (so calendar spreads ``ESH4-ESM4`` never match).
    For each session in date order the front month is:

    1. the candidate with the most traded volume (contracts) in the **previous** session of
       the data, when any candidate traded there (no look-ahead: a session's choice uses only
       earlier data);
    2. otherwise (first session, or no earlier trades) the calendar rule: the nearest-expiring
       candidate whose expiration is more than ``roll_days`` (default 8) calendar days after
       the session date; if every candidate expires sooner, the latest-expiring one.

    Expirations come from definition records when given, else from the month code: the third
    Friday of the contract month, with the year digit resolved by the data's date (``ESH0``
    in 2029 data is March 2030).

    ``--roll-rule calendar`` skips step 1: every session takes the calendar rule, i.e. the
    contract rolls ``roll_days`` calendar days before its expiration.

Symbology
    Instrument ids are resolved per date (exchanges reuse them) from the metadata mappings of
    every file (parent ``ES.FUT``, raw symbols, or continuous ``ES.v.0`` whose instrument
    changes at the roll), from in-band SymbolMappingMsg records
    (``InstrumentMap.insert_symbol_mapping_msg``) and from definitions. A rank-0 continuous
    symbol of the root is a candidate too (:func:`is_candidate`).

Rolls and state
    The pipeline processes one segment per (session, chosen instrument): EMAs and every
    other recurrence restart at each segment start and labels never look past its end, so
    no label or EMA crosses a session break or a roll; records of the old contract after the
    switch are simply not in the kept segments.
"""

from __future__ import annotations

import bisect
import datetime as dt
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import numpy as np

from alphafeat.errors import DataError
from alphafeat.types import UNDEF_TIMESTAMP
from alphafeat.validation import InstrumentMode, RollRule, validate_enum  # noqa: F401 (InstrumentMode: re-exported)

CHICAGO = ZoneInfo("America/Chicago")
MONTH_CODES = "FGHJKMNQUVXZ"
SESSION_END_HOUR_CT = 16

_NS = 1_000_000_000

#: Databento continuous symbol ``ROOT.{c,n,v}.RANK`` (calendar, open interest, volume rank).
CONTINUOUS_RE = re.compile(r"(?P<root>[A-Za-z0-9]+)\.(?P<rule>[cnv])\.(?P<rank>\d+)")


def is_candidate(symbol: str, root: str) -> bool:
    """Whether ``symbol`` can be the front month of ``root``: an outright of the root
    (``ESH4``; never a spread ``ESH4-ESM4``) or a rank-0 continuous symbol (``ES.v.0``, whose
    instrument changes at Databento's roll)."""
    if outright_pattern(root).fullmatch(symbol):
        return True
    m = CONTINUOUS_RE.fullmatch(symbol)
    return bool(m and m.group("root") == root and m.group("rank") == "0")


def _utc_date(ts: int, undefined: dt.date) -> dt.date:
    """UTC date of ``ts`` (ns since the epoch); ``undefined`` for DBN's undefined timestamp."""
    if ts == UNDEF_TIMESTAMP:
        return undefined
    return dt.datetime.fromtimestamp(ts // _NS, dt.timezone.utc).date()


class InstrumentMap:
    """Instrument id -> symbol over date intervals: databento's
    ``databento.common.symbology.InstrumentMap`` (0.88) rule for rule, built from
    ``databento_dbn`` metadata and records alone.

    databento's class would import the whole ``databento`` package (pandas, aiohttp, its
    HTTP clients: most of a cold ``precompute``'s imports, ``bench/import_profile.py``); its
    rules, which ``tests/test_instruments.py`` compares with it on the same mappings:

    * an interval ``[start_date, end_date)`` maps an id to a symbol; an id is resolved on a
      date by the interval of the latest start on or before that date, if the date is
      before its end (ids are reused by the exchange);
    * metadata mappings: with ``stype_in`` instrument id the input symbol is the id and the
      output the symbol, else the output is the id (``ValueError`` if neither side is one);
      empty symbols are skipped;
    * symbol-mapping records: the output symbol unless it is all digits, then the input;
      undefined start / end timestamps are open-ended (``date.min`` / ``date.max``).
    """

    def __init__(self) -> None:
        self._by_id: dict[int, list[tuple[dt.date, dt.date, str]]] = {}

    def _insert(self, instrument_id: int, start: dt.date, end: dt.date, symbol: str) -> None:
        ivs = self._by_id.setdefault(int(instrument_id), [])
        ivs.append((start, end, symbol))
        ivs.sort(key=lambda iv: iv[0])  # stable: equal starts keep their order of insertion

    def insert_metadata(self, metadata: object) -> None:
        """The intervals of a ``databento_dbn.Metadata``'s ``mappings``."""
        import databento_dbn

        by_id = databento_dbn.SType.INSTRUMENT_ID
        stype_in, stype_out = getattr(metadata, "stype_in", None), getattr(metadata, "stype_out", None)
        for symbol_in, entries in (getattr(metadata, "mappings", None) or {}).items():
            for entry in entries:
                if not entry["symbol"]:
                    continue
                if stype_in == by_id:
                    symbol, iid = str(entry["symbol"]), _as_id(symbol_in)
                elif stype_out == by_id:
                    symbol, iid = str(symbol_in), _as_id(entry["symbol"])
                else:
                    raise DataError("symbol mappings: neither stype_in nor stype_out is instrument_id")
                self._insert(iid, _as_date(entry["start_date"]), _as_date(entry["end_date"]), symbol)

    def insert_symbol_mapping_msg(self, rec: np.void) -> None:
        """One in-band SymbolMappingMsg record (a row of a structured array, DBN v1-v3)."""
        s_in = bytes(rec["stype_in_symbol"]).rstrip(b"\x00").decode()
        s_out = bytes(rec["stype_out_symbol"]).rstrip(b"\x00").decode()
        start = _utc_date(int(rec["start_ts"]), dt.date.min)
        end = _utc_date(int(rec["end_ts"]), dt.date.max)
        self._insert(int(rec["instrument_id"]), start, end, s_in if s_out.isdigit() else s_out)

    def resolve(self, instrument_id: int, date: dt.date) -> str | None:
        """The symbol of ``instrument_id`` on ``date``, or None when no interval covers it."""
        ivs = self._by_id.get(int(instrument_id))
        if not ivs:
            return None
        pos = bisect.bisect_right([iv[0] for iv in ivs], date) - 1
        if pos < 0:
            return None
        start, end, symbol = ivs[pos]
        return symbol if date < end else None


def _as_id(value: object) -> int:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise DataError(f"symbol mappings: {value!r} is not an instrument id") from None


def _as_date(value: object) -> dt.date:
    """A mapping's ``start_date`` / ``end_date`` (a ``datetime.date`` from databento_dbn, or ISO text)."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.timezone.utc).date() if value.tzinfo else value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value)[:10])
    except ValueError:
        raise DataError(f"symbol mappings: {value!r} is not a date") from None


def insert_symbol_mappings(imap: InstrumentMap, records: np.ndarray) -> None:
    """Insert in-band SymbolMappingMsg records (rtype 0x16, DBN v1-v3) into ``imap``
    (:meth:`InstrumentMap.insert_symbol_mapping_msg`: the non-numeric side of the mapping as
    the symbol, valid over the UTC dates of ``[start_ts, end_ts]``). One Python step per
    mapping record: they are few."""
    for rec in records:
        imap.insert_symbol_mapping_msg(rec)


def outright_pattern(root: str) -> re.Pattern[str]:
    """Regex matching a whole outright futures symbol of ``root`` (``ESH4``, ``ESZ24``)."""
    return re.compile(rf"{re.escape(root)}([{MONTH_CODES}])(\d{{1,2}})")


def session_end_ns(date: dt.date) -> int:
    """End of the session of trade date ``date``: 16:00 America/Chicago, in ns since the epoch."""
    end = dt.datetime(date.year, date.month, date.day, SESSION_END_HOUR_CT, tzinfo=CHICAGO)
    return int(end.timestamp()) * _NS


def session_dates(ts_ns: np.ndarray) -> np.ndarray:
    """Trade date of each timestamp.

    Parameters
    ----------
    ts_ns : np.ndarray, int64 or uint64, shape (n,)
        Times in ns since the UNIX epoch (UTC).

    Returns
    -------
    np.ndarray, datetime64[D], shape (n,)
        The trade date of the CME Globex session each time belongs to (see module docstring).
    """
    ts = np.asarray(ts_ns, dtype=np.int64)
    if ts.size == 0:
        return np.empty(0, dtype="datetime64[D]")
    lo = dt.datetime.fromtimestamp(int(ts.min()) // _NS, dt.timezone.utc).date()
    hi = dt.datetime.fromtimestamp(int(ts.max()) // _NS, dt.timezone.utc).date()
    days = [lo + dt.timedelta(days=k) for k in range(-1, (hi - lo).days + 3)]
    ends = np.array([session_end_ns(d) for d in days], dtype=np.int64)
    idx = np.searchsorted(ends, ts, side="right")
    return np.array(days, dtype="datetime64[D]")[idx]


def third_friday(year: int, month: int) -> dt.date:
    """Third Friday of a month: the expiration day of CME quarterly equity-index futures."""
    first = dt.date(year, month, 1)
    return first + dt.timedelta(days=(4 - first.weekday()) % 7 + 14)


def expiration_from_symbol(symbol: str, root: str, on: dt.date) -> dt.date | None:
    """Expiration date from a month-code symbol, the year resolved by the data's date.

    The year is the smallest ``y >= on.year - 1`` ending in the symbol's digit(s) whose
    expiration (third Friday of the contract month) is not before ``on``: a contract still
    trading on ``on`` has not expired. ``None`` when the symbol is not an outright of ``root``.
    """
    m = outright_pattern(root).fullmatch(symbol)
    if m is None:
        return None
    month = MONTH_CODES.index(m.group(1)) + 1
    digits = m.group(2)
    mod = 10 ** len(digits)
    y = on.year - 1
    while y % mod != int(digits) or third_friday(y, month) < on:
        y += 1
    return third_friday(y, month)


@dataclass
class Symbology:
    """Instrument id -> raw symbol per date, from DBN metadata, plus definition expirations.

    Wraps an :class:`InstrumentMap` (ids can be reused by the exchange, so resolution is per
    date).
    """

    imap: InstrumentMap
    expirations: dict[str, dt.date]
    fallback: dict[int, str]

    @classmethod
    def build(
        cls,
        metadatas: Iterable[object],
        definitions: Sequence[np.ndarray] = (),
        symbol_mappings: Sequence[np.ndarray] = (),
    ) -> Symbology:
        """Collect mappings from DBN metadata, in-band symbol-mapping records and definitions.

        Parameters
        ----------
        metadatas : iterable of databento_dbn.Metadata
            Their ``mappings`` (date intervals per symbol, parent / raw / continuous stype_in).
        definitions : sequence of np.ndarray (InstrumentDefMsg dtype, any DBN version)
            ``raw_symbol`` per id (used when no mapping covers a date) and ``expiration``.
        symbol_mappings : sequence of np.ndarray (SymbolMappingMsg dtype, rtype 0x16, v1-v3)
            In-band mapping records (live data, or files written with ``map_symbols``);
            inserted with :meth:`InstrumentMap.insert_symbol_mapping_msg`. v1 records carry
            22-byte symbols, v2/v3 71-byte ones: both are read from the record's own dtype.
        """
        imap = InstrumentMap()
        fallback: dict[int, str] = {}
        for md in metadatas:
            if getattr(md, "mappings", None):
                imap.insert_metadata(md)
        for arr in symbol_mappings:
            insert_symbol_mappings(imap, arr)
        expirations: dict[str, dt.date] = {}
        for d in definitions:
            for rec in d:
                sym = rec["raw_symbol"].decode().rstrip("\x00")
                fallback[int(rec["instrument_id"])] = sym
                exp = int(rec["expiration"])
                if 0 < exp < 2**63:
                    expirations[sym] = dt.datetime.fromtimestamp(exp // _NS, dt.timezone.utc).date()
        return cls(imap, expirations, fallback)

    def resolve(self, instrument_id: int, date: dt.date) -> str | None:
        """Raw symbol of ``instrument_id`` on UTC ``date``, or None when unknown.

        Ids are resolved per date (the exchange reuses them). A continuous symbol
        (``ES.v.0``, from a file requested with stype_in continuous) is replaced by the
        definition's raw symbol when definitions are given.
        """
        sym = self.imap.resolve(int(instrument_id), date)
        fb = self.fallback.get(int(instrument_id))
        if sym is not None and CONTINUOUS_RE.fullmatch(sym) and fb is not None:
            return fb
        return sym if sym is not None else fb

    def mapped(self, instrument_id: int, date: dt.date) -> str | None:
        """The symbol the mappings give ``instrument_id`` on ``date`` (``ES.v.0`` for a
        continuous file), without the definitions' raw symbol; None when unmapped."""
        return self.imap.resolve(int(instrument_id), date)

    def expiration(self, symbol: str, root: str, on: dt.date) -> dt.date | None:
        """Expiration of ``symbol``: from definitions when known, else from the month code."""
        return self.expirations.get(symbol) or expiration_from_symbol(symbol, root, on)


@dataclass(frozen=True)
class Choice:
    """The instrument kept for one session and why."""

    session: dt.date
    instrument_id: int
    raw_symbol: str
    expiration: dt.date | None
    reason: str


def front_month_schedule(
    candidates: dict[dt.date, dict[int, str]],
    volume: dict[tuple[dt.date, int], float],
    symbology: Symbology,
    root: str,
    roll_days: int = 8,
    rule: str = "volume",
) -> list[Choice]:
    """Choose one outright per session (rules in the module docstring).

    Parameters
    ----------
    candidates : {session date: {instrument_id: raw_symbol}}
        Outrights of the root that have book data in each session.
    volume : {(session date, instrument_id): contracts traded}
        Traded volume per session and instrument (any instrument; only outrights are read).
    symbology : Symbology
        For expirations.
    root : str
        Product root, e.g. ``"ES"``.
    roll_days : int
        Calendar-rule margin in days before expiration.
    rule : {"volume", "calendar"}
        ``volume``: most outright volume in the previous session, the calendar rule only
        when there is none; ``calendar``: always the calendar rule (roll ``roll_days``
        calendar days before expiration).

    Returns
    -------
    list of Choice, one per session with candidates, in date order.

    Raises
    ------
    UsageError
        Unknown ``rule``.
    """
    rule = validate_enum(rule, RollRule, "--roll-rule").value
    sessions = sorted(candidates)
    out: list[Choice] = []
    for k, day in enumerate(sessions):
        cand = candidates[day]
        prev = sessions[k - 1] if k else None
        prev_vol = {i: volume.get((prev, i), 0.0) for i in cand} if prev and rule == "volume" else {}
        if prev_vol and max(prev_vol.values()) > 0:
            best = max(prev_vol.values())
            iid = min(i for i, v in prev_vol.items() if v == best)
            reason = f"most volume in previous session {prev} ({best:.0f})"
        else:
            exps = {i: symbology.expiration(s, root, day) for i, s in cand.items()}
            known = {i: e for i, e in exps.items() if e is not None}
            if not known:
                iid = min(cand)
                reason = "only candidate without expiration"
            else:
                later = {i: e for i, e in known.items() if (e - day).days > roll_days}
                pool = later or known
                pick = min if later else max
                iid = pick(pool, key=lambda i: (pool[i], i))
                reason = f"calendar: first expiry > {roll_days} days ahead"
        sym = cand[iid]
        out.append(Choice(day, int(iid), sym, symbology.expiration(sym, root, day), reason))
    return out
