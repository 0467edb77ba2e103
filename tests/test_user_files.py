"""Every file a Databento user holds (issue 16): continuous and live files, MBO without F_LAST,
recordings that start mid-session, selections that match nothing, reruns with fewer inputs,
a full disk. Each case runs on files the test makes from the generator's output
(:mod:`alphafeat.synth`) with :mod:`edit_dbn` (databento-dbn metadata, numpy records).
Error cases go through the command line: one line on stderr, exit 1 (2 for usage), no
traceback, nothing written or deleted.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
from pathlib import Path

import edit_dbn as E
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from reference import slow_rebuild

from alphafeat import book as bk
from alphafeat import cache, synth
from alphafeat.cache import MANIFEST
from alphafeat.instruments import InstrumentMode, session_dates
from alphafeat.plan import make_plan
from alphafeat.precompute import PrecomputeConfig, precompute
from cli.alphafeat import main

ESH4, ESM4 = 17077, 5602
FAST = dict(horizons=(5, 20), feature_set="mid,spread_ticks", barrier=None, keep_books="none")


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Two generated sessions over the ESH4 -> ESM4 roll (2024-03-07, -08): MBO, MBP-10,
    trades and definitions of the two outrights."""
    out = tmp_path_factory.mktemp("gen")
    paths = synth.generate(out, start=dt.date(2024, 3, 7), sessions=2, contracts=("ESH4", "ESM4"),
                           schemas=("mbo", "mbp-10", "trades", "definition"), report=False)  # fmt: skip
    by: dict[str, list[Path]] = {}
    for p in paths:
        by.setdefault(p.name.split(".")[1], []).append(p)
    return by


def _run(tmp: Path, inputs: list[Path], out: Path | None = None, **kw: object) -> tuple[object, Path]:
    out = out or tmp / "cache"
    cfg = PrecomputeConfig(inputs=list(inputs), out=out, **{**FAST, **kw})
    return precompute(cfg), out


def _cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _one_line_error(code: int, err: str, want: int = 1) -> str:
    assert code == want, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _tree(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` (names and bytes) but the lock."""
    if not out.exists():
        return {}
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
            and p.name != cache.LOCK}  # fmt: skip


def _rows(out: Path) -> dict[str, pa.Table]:
    return {str(p.relative_to(out)): pa.ipc.open_file(pa.memory_map(str(p))).read_all()
            for p in sorted(out.rglob("*.arrow")) if not p.name.startswith(".")}  # fmt: skip


def _mbp_rows_expected(recs: np.ndarray) -> int:
    """Book rows an MBP-10 stream gives (F_LAST records that are not trades or fills), counted
    with numpy: each lies in exactly one session, so a run that drops no record has them all."""
    a = recs["action"]
    return int((((recs["flags"] & 0x80) != 0) & (a != b"T") & (a != b"F")).sum())


# ---------------------------------------------------------------- continuous symbology


def test_continuous_file_keeps_every_record_and_names_the_contracts(gen, tmp_path):
    """ES.v.0 maps ESH4 up to 2024-03-07 (UTC) and ESM4 from 2024-03-08: session 2024-03-08
    holds both (the roll at UTC midnight). Every book row of the file is in the cache (the
    volume rule dropped ESM4's), each contract in its own partition named after it."""
    path, recs = E.continuous(tmp_path / "es-v0.mbp-10.dbn.zst", gen["mbp-10"], dt.date(2024, 3, 8), ESH4, ESM4)
    s, out = _run(tmp_path, [path, *gen["definition"]])
    held = [(c.session.isoformat(), c.raw_symbol) for c in s.schedule]
    assert held == [("2024-03-07", "ESH4"), ("2024-03-08", "ESH4"), ("2024-03-08", "ESM4")]
    tables = _rows(out)
    assert sorted(tables) == ["root=ES/session=2024-03-07/ESH4.arrow", "root=ES/session=2024-03-08/ESH4.arrow",
                              "root=ES/session=2024-03-08/ESM4.arrow"]  # fmt: skip
    assert sum(t.num_rows for t in tables.values()) == _mbp_rows_expected(recs)
    for rel, t in tables.items():  # each partition holds one contract, of its session only
        iid = {"ESH4": ESH4, "ESM4": ESM4}[rel.split("/")[-1][:4]]
        assert set(t.column("instrument_id").to_pylist()) == {iid}
        day = session_dates(t.column("ts_recv").cast(pa.int64()).to_numpy())
        assert set(day.astype(str)) == {rel.split("/")[1].split("=")[1]}
    assert any("ES.v.0" in n and "2024-03-08: ESH4 (id 17077) then ESM4 (id 5602)" in n for n in s.notes)


def test_continuous_all_mode_partitions_do_not_collide(gen, tmp_path):
    """--instrument-mode all on a continuous file without definitions: partitions named by the
    real contract's id, never two on one path."""
    path, recs = E.continuous(tmp_path / "es-v0.mbp-10.dbn.zst", gen["mbp-10"], dt.date(2024, 3, 8), ESH4, ESM4)
    s, out = _run(tmp_path, [path], instrument_mode=InstrumentMode("all"))
    assert sorted(_rows(out)) == ["root=ES/session=2024-03-07/id17077.arrow",
                                  "root=ES/session=2024-03-08/id17077.arrow",
                                  "root=ES/session=2024-03-08/id5602.arrow"]  # fmt: skip
    assert sum(t.num_rows for t in _rows(out).values()) == _mbp_rows_expected(recs)
    assert any("give the definition file" in n for n in s.notes)


def test_continuous_mixed_with_raw_symbol_files_is_refused(gen, tmp_path, capsys):
    path, _ = E.continuous(tmp_path / "es-v0.mbp-10.dbn.zst", gen["mbp-10"][:1], dt.date(2024, 3, 8), ESH4, ESM4)
    out = tmp_path / "cache"
    code, _, err = _cli(capsys, "precompute", "-q", "--input", str(path), str(gen["mbp-10"][1]), "--out", str(out))
    line = _one_line_error(code, err)
    assert "mixed with the continuous-symbology file" in line and str(gen["mbp-10"][1]) in line
    assert not out.exists()


def test_summary_names_the_predecoded_folder(gen, tmp_path, capsys):
    """The summary says where the plan's scans (and kept books) went: ``<parent of --out>/.predecoded``,
    which is there."""
    import re

    both = [str(gen["mbp-10"][0]), str(gen["trades"][0])]
    code, table, err = _cli(capsys, "precompute", "--input", *both, "--out", str(tmp_path / "a" / "c"))
    assert code == 0, err
    where = tmp_path / "a" / ".predecoded"
    assert "predecoded folder" in table and str(where) in re.sub(r"[\s│]", "", table), table
    assert where.is_dir()


# ---------------------------------------------------------------- live recordings


def test_live_recording_is_read_by_rtype(gen, tmp_path, capsys):
    """A live recording (no schema, mixed rtypes, in-band mappings with an undefined end_ts):
    the schema is inferred, the mappings name the contracts, and the cache equals the one of
    the same records delivered as historical files."""
    # named .dbn but zstd inside: rows are bounded from the magic, not the name
    live, parts = E.live(tmp_path / "live.dbn", gen["mbp-10"][0], gen["trades"][0], gen["definition"][0])
    s_live, out_live = _run(tmp_path, [live], out=tmp_path / "live-cache")
    s_ref, out_ref = _run(tmp_path, [gen["mbp-10"][0]], out=tmp_path / "ref-cache")
    assert [(c.session, c.raw_symbol) for c in s_live.schedule] == [(c.session, c.raw_symbol) for c in s_ref.schedule]
    a, b = _rows(out_live), _rows(out_ref)
    assert sorted(a) == sorted(b)
    for rel in a:
        for col in ("ts_recv", "bid_px_00", "ask_sz_00", "buy_volume", "sell_volume", "mid", "label_h5"):
            x, y = (np.asarray(t.column(col).cast(pa.int64()) if col == "ts_recv" else t.column(col))
                    for t in (a[rel], b[rel]))  # fmt: skip
            assert np.array_equal(x, y, equal_nan=True), (rel, col)
    assert any("live recording" in n and "mbp-10 inferred" in n for n in s_live.notes)
    code, table, err = _cli(capsys, "roll-schedule", "--input", str(live))  # an OutOfBoundsDatetime before
    assert code == 0 and "Traceback" not in err
    assert s_ref.schedule[0].raw_symbol in table


# ---------------------------------------------------------------- MBO without F_LAST


def test_mbo_without_f_last_gives_a_row_per_ts_recv_group(gen, tmp_path):
    """F_LAST stripped from every record: a row per ts_recv group that changed the book, each
    equal to the row the flagged file gives at that group's last F_LAST record."""
    stripped, recs = E.strip_flags(tmp_path / "nolast.mbo.dbn.zst", gen["mbo"][0])
    plan = make_plan([stripped])
    seg = plan.segments[0]
    from alphafeat.precompute.books import build_book

    got, _, notes = build_book(seg)
    assert any("carries F_LAST" in n for n in notes)
    _, orig = E.records([gen["mbo"][0]], E.MBO)
    mine = orig[orig["instrument_id"] == seg.instrument_id]
    s0, s1 = seg.bounds
    ts = mine["ts_recv"].astype(np.int64)
    changes = np.isin(mine["action"], [b"A", b"C", b"M", b"R"])
    ends = np.r_[ts[1:] != ts[:-1], True]
    group = np.cumsum(np.r_[0, ends[:-1]])  # group number of every record
    changed = np.bincount(group, weights=changes) > 0
    in_session = (ts[ends] >= s0) & (ts[ends] < s1)
    assert len(got) == int((changed & in_session).sum()) > 100
    ref, _, _ = build_book(make_plan([gen["mbo"][0]]).segments[0])  # flags kept: rows at F_LAST records
    last_of_group = np.r_[ref.ts_recv[1:] != ref.ts_recv[:-1], True]
    idx = np.searchsorted(got.ts_recv, ref.ts_recv[last_of_group])
    assert np.array_equal(got.ts_recv[idx], ref.ts_recv[last_of_group])
    assert np.array_equal(got.bid_px[idx], ref.bid_px[last_of_group], equal_nan=True)
    assert np.array_equal(got.ask_sz[idx], ref.ask_sz[last_of_group])
    s, out = _run(tmp_path, [stripped])
    assert sum(t.num_rows for t in _rows(out).values()) == len(got)
    assert any("F_LAST" in n for n in s.notes)


# ---------------------------------------------------------------- selection matching nothing


def test_instrument_mode_with_no_match_names_files_and_ids(gen, tmp_path, capsys):
    out = tmp_path / "cache"
    f = gen["mbp-10"][0]
    code, _, err = _cli(capsys, "precompute", "-q", "--input", str(f), "--instrument-mode", "id=999", "--out", str(out))
    line = _one_line_error(code, err)
    assert str(f) in line and "instrument ids present: " in line and str(ESH4) in line and str(ESM4) in line
    empty = E.write(tmp_path / "empty.mbp-10.dbn.zst", b"", schema=E.databento_dbn.Schema.MBP_10,
                    start=1_709_766_000 * 10**9, end=1_709_852_400 * 10**9, stype_in=E.databento_dbn.SType.PARENT,
                    symbols=["ES.FUT"])  # fmt: skip
    code, _, err = _cli(capsys, "precompute", "-q", "--input", str(empty), "--instrument-mode", "all",
                        "--out", str(out))  # fmt: skip
    line = _one_line_error(code, err)
    assert str(empty) in line and "instrument ids present: none" in line
    assert not out.exists()


# ---------------------------------------------------------------- reruns, failures, disk full


def test_rerun_with_fewer_inputs_keeps_earlier_sessions_and_prune_deletes(gen, tmp_path, capsys):
    both = [*gen["mbp-10"], *gen["trades"]]
    s1, out = _run(tmp_path, both)
    first = _tree(out)
    assert len([k for k in first if k.endswith(".arrow")]) == 2
    s2, _ = _run(tmp_path, [gen["mbp-10"][1], gen["trades"][1]])  # the second session only
    m = json.loads((out / MANIFEST).read_text())
    earlier = [p for p in first if p.endswith(".arrow") and "2024-03-07" in p]
    assert m["earlier_partitions"] == earlier and set(earlier) <= set(m["partitions"])
    assert (out / earlier[0]).read_bytes() == first[earlier[0]]
    assert any("earlier run" in n for n in s2.notes)
    # another --features with fewer inputs: refused, nothing changed
    before = _tree(out)
    code, _, err = _cli(capsys, "precompute", "-q", "--input", str(gen["mbp-10"][1]), "--features", "mid",
                        "--out", str(out), "--predecoded", "none")  # fmt: skip
    assert "--prune" in _one_line_error(code, err)
    assert _tree(out) == before
    s3, _ = _run(tmp_path, [gen["mbp-10"][1], gen["trades"][1]], prune=True)
    m = json.loads((out / MANIFEST).read_text())
    assert m["pruned"] == earlier and not (out / earlier[0]).exists() and m["earlier_partitions"] == []
    assert any("--prune: deleted 1" in n for n in s3.notes)


def _enospc(monkeypatch: pytest.MonkeyPatch, fail_at: int) -> list[Path]:
    """The partition writer writes part of the file, then the disk is full, at its
    ``fail_at``-th call (1-based)."""
    real, calls = cache._write_ipc, []

    def write(path: Path, table: pa.Table, options: object) -> None:
        calls.append(path)
        if len(calls) == fail_at:
            path.write_bytes(b"ARROW1" + b"\0" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, table, options)

    monkeypatch.setattr(cache, "_write_ipc", write)
    return calls


def test_disk_full_names_the_path_and_leaves_the_cache_as_it_was(gen, tmp_path, capsys, monkeypatch):
    both = [*gen["mbp-10"], *gen["trades"]]
    out = tmp_path / "cache"
    calls = _enospc(monkeypatch, 1)  # a fresh cache: nothing left behind
    code, _, err = _cli(capsys, "precompute", "-q", "--input", *map(str, both), "--out", str(out),
                        "--predecoded", "none")  # fmt: skip
    line = _one_line_error(code, err)
    assert "disk full (ENOSPC)" in line and "bytes needed" in line and str(calls[0]) in line
    assert not out.exists()
    monkeypatch.undo()
    _run(tmp_path, [gen["mbp-10"][0], gen["trades"][0]])  # a cache of the first session
    before = _tree(out)
    calls = _enospc(monkeypatch, 1)  # the second session's partition fails: the first stays as it was
    code, _, err = _cli(capsys, "precompute", "-q", "--input", *map(str, both), "--out", str(out),
                        "--horizons", "5,20", "--features", "mid,spread_ticks", "--predecoded", "none")  # fmt: skip
    assert "disk full" in _one_line_error(code, err)
    assert _tree(out) == before and not list(out.glob(".staging-*"))


def test_failed_run_leaves_no_stray_partition(gen, tmp_path, monkeypatch):
    """A run that fails at its second partition after staging the first leaves the earlier
    cache byte for byte (no data file added, none removed)."""
    s, out = _run(tmp_path, [gen["mbp-10"][0], gen["trades"][0]])
    before = _tree(out)
    _enospc(monkeypatch, 2)
    from alphafeat.errors import AlphafeatError

    with pytest.raises(AlphafeatError, match="disk full"):
        _run(tmp_path, [*gen["mbp-10"], *gen["trades"]], instrument_mode=InstrumentMode("all"))
    assert _tree(out) == before


# ---------------------------------------------------------------- mid-session start


def test_mid_session_start_is_flagged_and_rows_marked(gen, tmp_path):
    """An MBO recording that starts 2 h into the session, without the snapshot: the summary and
    the manifest give book_complete_from; rows before it have book_complete False. The rule
    (alphafeat.book.book_complete_from) is checked against a plain-Python replay."""
    _, full = E.records([gen["mbo"][0]], E.MBO)
    s0 = int(full["ts_recv"][0])
    late, recs = E.cut(tmp_path / "late.mbo.dbn.zst", gen["mbo"][0], s0 + 2 * 3600 * 10**9)
    s, out = _run(tmp_path, [late])
    seg = make_plan([late]).segments[0]
    mine = recs[recs["instrument_id"] == seg.instrument_id]
    unknown: list[int] = []  # the rule, from an independent plain-Python replay
    slow_rebuild(mine, 10, unknown)
    last_unknown = unknown[-1]
    assert last_unknown > 0 and not (mine["flags"] & bk.F_SNAPSHOT).any() and mine["action"][0] != b"R"
    m = json.loads((out / MANIFEST).read_text())
    (rel, ts), = m["book_complete_from"].items()
    t = _rows(out)[rel]
    complete = np.asarray(t.column("book_complete").to_numpy(zero_copy_only=False))
    ts_col = t.column("ts_recv").cast(pa.int64()).to_numpy()
    k = int(np.argmax(complete))
    assert not complete[:k].any() and complete[k:].all() and 0 < k < len(complete)
    assert ts == ts_col[k] and ts >= int(mine["ts_recv"][last_unknown])
    assert ts_col[k - 1] <= int(mine["ts_recv"][last_unknown])
    assert any("starts without a snapshot" in n and "book_complete False" in n for n in s.notes)
    s_full, out_full = _run(tmp_path, [gen["mbo"][0]], out=tmp_path / "full")  # with its snapshot: all complete
    assert json.loads((out_full / MANIFEST).read_text())["book_complete_from"] == {}
    assert all(pc.all(t.column("book_complete")).as_py() for t in _rows(out_full).values())


# ---------------------------------------------------------------- roll-schedule default input


def test_roll_schedule_without_input_uses_precompute_default(capsys, monkeypatch, tmp_path):
    import alphafeat.precompute as pl

    code, table, err = _cli(capsys, "roll-schedule")
    assert code == 0 and "2024-03-06" in table and "ESH4" in table  # the embedded sample in data/
    monkeypatch.setattr(pl, "DEFAULT_DATA_DIR", tmp_path / "nowhere")
    code, _, err = _cli(capsys, "roll-schedule")
    line = _one_line_error(code, err)
    code2, _, err2 = _cli(capsys, "precompute", "-q", "--out", str(tmp_path / "c"))
    line2 = _one_line_error(code2, err2)  # the same line, each after its command's name
    assert line.removeprefix("alphafeat roll-schedule: ") == line2.removeprefix("alphafeat precompute: ")
    assert line.startswith("alphafeat roll-schedule: error: ") and "default sample is missing" in line

