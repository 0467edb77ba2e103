"""A Databento download folder as it comes (``alphafeat.sources`` through ``make_plan``).

The real folder ``../shared/data/real`` holds an MBO hour of ESH4 (session 2023-12-26), an
MBP-1 and a trades file of ESU4 (session 2024-07-02) and definition files: one run takes each
session from the book schema that holds it; ``schema="mbp-1"`` takes the MBP-1 file only; a
generated NQ file (the ESU4 file renamed) and a copy on another venue are left out, named.
"""

from __future__ import annotations

import datetime as dt
import json
import re
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


# ---------------------------------------------------------------- the whole run (precompute)


def _precompute(capsys, *args: str) -> tuple[int, str, str]:
    from alphafeat.cli import main

    code = main(["precompute", "-q", "--device", "cpu", *args])
    got = capsys.readouterr()
    return code, got.out, got.err


def _table(out: str) -> dict[str, list[str]]:
    """The instrument table's rows by session: their cells."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) >= 5 and re.fullmatch(r"\d{4}-\d{2}-\d{2}", cells[0]):
            rows[cells[0]] = cells
    return rows


def test_whole_real_folder_in_one_run(tmp_path, capsys) -> None:
    """Each session's partition from its own schema, said by the table, the notes, the manifest
    and each partition; the record count is the chosen contracts' records, once, as databento's
    reader counts them."""
    import databento as db

    from alphafeat.cache import MANIFEST, partition_metadata

    out = tmp_path / "cache"
    code, text, err = _precompute(capsys, "--input", str(need(REAL)), "--out", str(out))
    assert code == 0, err
    rows = _table(text)
    assert rows["2023-12-26"][2:4] == ["ESH4", "mbo"] and rows["2024-07-02"][2:4] == ["ESU4", "mbp-1"]
    assert "book schema per session" in text and "mbp-1: 2024-07-02 ESU4" in text
    man = json.loads((out / MANIFEST).read_text())
    assert {r["session"]: r["schema"] for r in man["schedule"]}["2024-07-02"] == "mbp-1"
    parts = {p.parent.name: partition_metadata(p)["book_schema"] for p in out.rglob("*.arrow")}
    assert parts == {"session=2023-12-26": "mbo", "session=2024-07-02": "mbp-1"}
    want = sum(int((db.DBNStore.from_file(f).to_ndarray()["instrument_id"] == iid).sum())
               for f, iid in ((ESH4_MBO, 17077), (ESU4_MBP1, 118)))  # fmt: skip
    assert want == 68_792 + 2_288
    assert re.search(rf"book records \(chosen contracts, their sessions\)\s*│\s*{want:,}\s", text), text


def test_forced_schema_run_over_the_real_folder(tmp_path, capsys) -> None:
    code, text, err = _precompute(capsys, "--input", str(need(REAL)), "--out", str(tmp_path / "c"), "--schema",
                                  "mbp-1")  # fmt: skip
    assert code == 0, err
    assert list(_table(text)) == ["2024-07-02"] and _table(text)["2024-07-02"][3] == "mbp-1"
    assert f"--schema mbp-1: mbo book file not used: {ESH4_MBO}" in re.sub(r"\s*\n\s*", " ", text)
    assert [p.parent.name for p in (tmp_path / "c").rglob("*.arrow")] == ["session=2024-07-02"]


def test_nq_file_in_the_folder_skipped_with_a_note(tmp_path, capsys) -> None:
    folder = tmp_path / "download"
    folder.mkdir()
    for f in need(REAL).iterdir():
        (folder / f.name).symlink_to(f)
    nq = rename(folder / "nq-mbp-1.dbn.zst", ESU4_MBP1, MBP1, "NQU4", 4358)
    code, text, err = _precompute(capsys, "--input", str(folder), "--out", str(tmp_path / "c"))
    assert code == 0, err
    assert f"skipped {nq}: its symbols are of root NQ, not ES" in re.sub(r"\s*\n\s*", " ", text)
    assert sorted(_table(text)) == ["2023-12-25", "2023-12-26", "2024-07-02"]
