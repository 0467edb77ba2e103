"""Sessions in Chicago time, outright matching, expirations and the front-month rule."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alphafeat.errors import AlphafeatError
from alphafeat.instruments import (
    InstrumentMode,
    Symbology,
    expiration_from_symbol,
    front_month_schedule,
    outright_pattern,
    session_dates,
    third_friday,
)

CT = ZoneInfo("America/Chicago")


def slow_session(ts_ns: int) -> dt.date:
    """Per-timestamp reference: Chicago wall time at or after 16:00 belongs to the next day."""
    t = dt.datetime.fromtimestamp(ts_ns / 1e9, dt.timezone.utc).astimezone(CT)
    return t.date() + dt.timedelta(days=1) if t.hour >= 16 else t.date()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1_577_836_800, 1_893_456_000), min_size=1, max_size=50))
def test_session_dates_match_per_row_reference(secs):
    ts = np.array(secs, dtype=np.int64) * 1_000_000_000 + 123
    got = session_dates(ts)
    assert [d.item() for d in got] == [slow_session(int(t)) for t in ts]


def test_session_boundary_is_chicago_not_utc_midnight_across_dst():
    # 2024-03-08 (CST, UTC-6): 16:00 CT = 22:00 UTC. 2024-03-11 (CDT, UTC-5): 16:00 CT = 21:00 UTC.
    def ns(y, m, d, h, mi=0):
        return int(dt.datetime(y, m, d, h, mi, tzinfo=dt.timezone.utc).timestamp()) * 10**9

    ts = np.array([ns(2024, 3, 8, 21, 59), ns(2024, 3, 8, 22, 0), ns(2024, 3, 11, 20, 59),
                   ns(2024, 3, 11, 21, 0), ns(2024, 3, 12, 0, 30)])
    got = [d.item().isoformat() for d in session_dates(ts)]
    assert got == ["2024-03-08", "2024-03-09", "2024-03-11", "2024-03-12", "2024-03-12"]


def test_outright_pattern_never_matches_spreads():
    pat = outright_pattern("ES")
    for s in ["ESH4", "ESZ24", "ESM0"]:
        assert pat.fullmatch(s)
    for s in ["ESH4-ESM4", "ESU3-ESZ3", "NQH4", "ES", "ESH", "ESA4", "MESH4", "ESH444"]:
        assert not pat.fullmatch(s)


def test_expirations():
    assert third_friday(2024, 3) == dt.date(2024, 3, 15)
    assert third_friday(2023, 12) == dt.date(2023, 12, 15)
    assert expiration_from_symbol("ESH4", "ES", dt.date(2024, 3, 6)) == dt.date(2024, 3, 15)
    assert expiration_from_symbol("ESH0", "ES", dt.date(2029, 6, 1)) == dt.date(2030, 3, 15)
    assert expiration_from_symbol("ESZ3", "ES", dt.date(2023, 12, 15)) == dt.date(2023, 12, 15)
    assert expiration_from_symbol("ESH4-ESM4", "ES", dt.date(2024, 1, 1)) is None


def test_instrument_mode_parse():
    assert InstrumentMode.parse("id=17077").instrument_id == 17077
    assert str(InstrumentMode.parse("front-month")) == "front-month"
    with pytest.raises(AlphafeatError, match="instrument-mode"):
        InstrumentMode.parse("id=x")


def test_front_month_rule_uses_previous_session_volume_only():
    sym = Symbology.build([])
    d1, d2, d3 = dt.date(2024, 3, 6), dt.date(2024, 3, 7), dt.date(2024, 3, 8)
    cand = {d: {17077: "ESH4", 5602: "ESM4"} for d in (d1, d2, d3)}
    # ESM4 out-trades ESH4 from d2 on; the switch must show on d3, not d2 (no look-ahead)
    vol = {(d1, 17077): 900, (d1, 5602): 100, (d2, 17077): 300, (d2, 5602): 700,
           (d3, 17077): 100, (d3, 5602): 900}
    sched = front_month_schedule(cand, vol, sym, "ES")
    assert [c.raw_symbol for c in sched] == ["ESH4", "ESH4", "ESM4"]
    assert "calendar" in sched[0].reason and "previous" in sched[1].reason
    # first session after the calendar roll date (8 days before 2024-03-15) -> ESM4
    late = {dt.date(2024, 3, 12): {17077: "ESH4", 5602: "ESM4"}}
    assert front_month_schedule(late, {}, sym, "ES")[0].raw_symbol == "ESM4"
