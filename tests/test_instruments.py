"""Sessions in Chicago time, outright matching, expirations and the front-month rule."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
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


class _Meta:
    """The attributes both maps read from a ``databento_dbn.Metadata``."""

    def __init__(self, mappings: dict, stype_in, stype_out) -> None:
        self.mappings, self.stype_in, self.stype_out = mappings, stype_in, stype_out


class _Msg:
    """A SymbolMappingMsg as databento's InstrumentMap reads it (pandas timestamps)."""

    def __init__(self, rec: np.void) -> None:
        import pandas as pd

        from alphafeat.types import UNDEF_TIMESTAMP

        self.instrument_id = int(rec["instrument_id"])
        self.start_ts, self.end_ts = int(rec["start_ts"]), int(rec["end_ts"])
        self.stype_in_symbol = bytes(rec["stype_in_symbol"]).rstrip(b"\x00").decode()
        self.stype_out_symbol = bytes(rec["stype_out_symbol"]).rstrip(b"\x00").decode()
        u = UNDEF_TIMESTAMP
        self.pretty_start_ts = pd.Timestamp.min if self.start_ts == u else pd.Timestamp(self.start_ts, tz="UTC")
        self.pretty_end_ts = pd.Timestamp.max if self.end_ts == u else pd.Timestamp(self.end_ts, tz="UTC")


_D0 = dt.date(2024, 3, 1)
_interval = st.tuples(st.integers(0, 40), st.integers(0, 12), st.sampled_from(["ESH4", "ESM4", "ES.v.0", "", "NQZ4"]),
                      st.integers(1, 6))  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.lists(_interval, max_size=12), st.lists(_interval, max_size=6), st.booleans())
def test_instrument_map_resolves_as_databentos(meta_ivs, msg_ivs, ids_in) -> None:
    """Our InstrumentMap (no databento import) resolves every id on every date as
    ``databento.common.symbology.InstrumentMap`` on the same metadata mappings (instrument id
    on either side, empty symbols, overlapping and reused ids) and mapping records (open-ended
    undefined timestamps, numeric output symbols)."""
    import databento_dbn
    from databento.common.symbology import InstrumentMap as Reference

    from alphafeat.dbn import record_dtype
    from alphafeat.instruments import InstrumentMap, insert_symbol_mappings
    from alphafeat.types import UNDEF_TIMESTAMP

    by_id, raw = databento_dbn.SType.INSTRUMENT_ID, databento_dbn.SType.RAW_SYMBOL
    mappings: dict = {}
    for start, days, sym, iid in meta_ivs:
        iv = {"start_date": _D0 + dt.timedelta(start), "end_date": _D0 + dt.timedelta(start + days)}
        if ids_in:  # stype_in instrument_id: keyed by the id, the symbol out
            mappings.setdefault(str(iid), []).append({**iv, "symbol": sym})
        elif sym:
            mappings.setdefault(sym, []).append({**iv, "symbol": str(iid)})
    meta = _Meta(mappings, by_id if ids_in else raw, raw if ids_in else by_id)
    recs = np.zeros(len(msg_ivs), dtype=record_dtype(0x16, 3))
    for k, (start, days, sym, iid) in enumerate(msg_ivs):
        t0 = int(dt.datetime(2024, 3, 1, 17, tzinfo=dt.timezone.utc).timestamp()) * 10**9 + start * 86_400 * 10**9
        recs[k]["instrument_id"] = iid
        recs[k]["stype_in_symbol"] = (sym or "ESU4").encode()
        recs[k]["stype_out_symbol"] = str(iid).encode() if k % 2 else b"ESZ4"
        recs[k]["start_ts"] = UNDEF_TIMESTAMP if start == 0 else t0
        recs[k]["end_ts"] = UNDEF_TIMESTAMP if days == 0 else t0 + days * 86_400 * 10**9
    ours, ref = InstrumentMap(), Reference()
    ours.insert_metadata(meta)
    ref.insert_metadata(meta)
    insert_symbol_mappings(ours, recs)
    for rec in recs:
        ref.insert_symbol_mapping_msg(_Msg(rec))
    for iid in range(0, 8):
        for day in range(-2, 60):
            d = _D0 + dt.timedelta(day)
            assert ours.resolve(iid, d) == ref.resolve(iid, d), (iid, d)


def test_instrument_map_of_the_sample_as_databentos() -> None:
    """The embedded sample's metadata resolves as with databento's InstrumentMap."""
    from databento.common.symbology import InstrumentMap as Reference

    from alphafeat.dbn import open_dbn
    from alphafeat.instruments import InstrumentMap

    files = sorted((Path(__file__).resolve().parents[1] / "data").glob("*.dbn.zst"))
    if not files:
        pytest.skip("data/ has no embedded sample")
    ours, ref = InstrumentMap(), Reference()
    for f in files:
        ours.insert_metadata(open_dbn(f).metadata)
        ref.insert_metadata(open_dbn(f).metadata)
    for iid in {int(iv["symbol"]) for f in files for ivs in open_dbn(f).metadata.mappings.values() for iv in ivs}:
        for day in range(-3, 12):
            d = dt.date(2024, 3, 3) + dt.timedelta(day)
            assert ours.resolve(iid, d) == ref.resolve(iid, d)
