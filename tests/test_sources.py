"""A Databento download folder as it comes (``alphafeat.sources`` through ``make_plan``).

The real folder ``../shared/data/real`` holds an MBO hour of ESH4 (session 2023-12-26), an
MBP-1 and a trades file of ESU4 (session 2024-07-02) and definition files: one run takes each
session from the book schema that holds it; ``schema="mbp-1"`` takes the MBP-1 file only; a
generated NQ file (the ESU4 file renamed) and a copy on another venue are left out, named.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from conftest import ESH4_MBO, ESU4_MBP1, ESU4_TRADES, REAL, need
from edit_dbn import rename

from alphafeat.errors import InputError, UsageError
from alphafeat.plan import make_plan
from alphafeat.sources import richest, symbol_root

MBP1 = 0x01


def _by_session(plan) -> dict[dt.date, tuple[str, str, list[str]]]:
    return {s.session: (s.raw_symbol, s.schema, [Path(p).name for p in s.book_files]) for s in plan.segments}


def test_whole_real_folder_takes_each_session_from_its_schema() -> None:
    plan = make_plan([need(REAL)])
    seg = _by_session(plan)
    assert seg[dt.date(2023, 12, 26)] == ("ESH4", "mbo", [ESH4_MBO.name])
    assert seg[dt.date(2024, 7, 2)] == ("ESU4", "mbp-1", [ESU4_MBP1.name])
    esu4 = next(s for s in plan.segments if s.raw_symbol == "ESU4")
    assert [Path(p).name for p in esu4.trade_files] == [ESU4_TRADES.name]
    assert plan.schema == "mbo" and not plan.skipped


def test_forced_schema_over_the_real_folder() -> None:
    plan = make_plan([need(REAL)], schema="mbp-1")
    assert _by_session(plan) == {dt.date(2024, 7, 2): ("ESU4", "mbp-1", [ESU4_MBP1.name])}
    assert any(ESH4_MBO.name in n and "--schema mbp-1" in n for n in plan.notes)
    assert {s.schema for s in make_plan([REAL], schema="mbo").segments} == {"mbo"}
    with pytest.raises(InputError, match="--schema mbp-10: no mbp-10 book file"):
        make_plan([REAL], schema="mbp-10")
    with pytest.raises(UsageError, match="--schema"):
        make_plan([REAL], schema="mbp-5")


def test_other_root_and_venue_skipped_with_a_note(tmp_path) -> None:
    folder = tmp_path / "download"
    folder.mkdir()
    for f in need(REAL).iterdir():
        (folder / f.name).symlink_to(f)
    nq = rename(folder / "nq-mbp-1.dbn.zst", ESU4_MBP1, MBP1, "NQU4", 4358)
    ice = rename(folder / "ice-mbp-1.dbn.zst", ESU4_MBP1, MBP1, "ESU4", 118, dataset="IFEU.IMPACT")
    plan = make_plan([folder])
    assert _by_session(plan)[dt.date(2024, 7, 2)] == ("ESU4", "mbp-1", [ESU4_MBP1.name])
    assert any(str(nq) in n and "root NQ, not ES" in n for n in plan.notes)
    assert any(str(ice) in n and "venue IFEU.IMPACT, not GLBX.MDP3" in n for n in plan.notes)
    assert nq not in {f.path for f in plan.files} and len(plan.files) == 6
    # a copy on the same venue is still refused: the same records twice
    (folder / "ice-mbp-1.dbn.zst").unlink()
    rename(folder / "copy-mbp-1.dbn.zst", ESU4_MBP1, MBP1, "ESU4", 118)
    with pytest.raises(InputError, match="overlaps"):
        make_plan([folder])


def test_symbol_roots() -> None:
    assert [symbol_root(s) for s in ("ESH4", "ESH4-ESM4", "ES.FUT", "ES.v.0", "NQZ24", "MESH4")] == [
        "ES", "ES", "ES", "ES", "NQ", "MES"]  # fmt: skip
    assert symbol_root("ALL_SYMBOLS") is None and symbol_root("17077") is None
    assert richest(["mbp-1", "mbo", "mbp-10"]) == "mbo" and richest(["mbp-1", "mbp-10"]) == "mbp-10"
