"""The main job end to end: real ES files, the embedded default, bad input, CPU == CUDA."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import databento as db
import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pytest
import zstandard
from conftest import ESH4_MBO, ESU4_MBP1, ESU4_TRADES, PROJECT, REAL, need
from reference import slow_rebuild
from test_instruments import slow_session

from alphafeat.cache import MANIFEST, read_manifest
from alphafeat.cli import main


def _run(*args: str) -> int:
    return main(["precompute", "-q", *args])


def _table(out: Path) -> pa.Table:
    return pads.dataset(str(out), format="ipc", partitioning="hive").to_table()


@pytest.fixture(scope="module")
def esh4_cache(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("esh4") / "cache"
    assert _run("--instrument-mode", "front-month", "--input", str(need(ESH4_MBO)), "--out", str(out),
                "--device", "cpu") == 0
    return out


def test_real_mbo_cache_top_of_book_equals_slow_reference(esh4_cache):
    recs = db.DBNStore.from_file(ESH4_MBO).to_ndarray()
    ref = slow_rebuild(recs)
    tab = _table(esh4_cache).sort_by([("session", "ascending"), ("ts_recv", "ascending")])
    assert tab.num_rows >= 40_000
    assert tab.num_rows == len(ref)  # one instrument; every snapshot kept, in some session
    sessions = [slow_session(int(recs["ts_recv"][k])) for k, _, _ in ref]
    assert sorted(set(tab.column("session").to_pylist())) == sorted({d.isoformat() for d in sessions})
    bid = np.array([r[1][0][0] * 1e-9 if r[1] else np.nan for r in ref])
    ask = np.array([r[2][0][0] * 1e-9 if r[2] else np.nan for r in ref])
    bsz = np.array([r[1][0][1] if r[1] else 0 for r in ref])
    asz = np.array([r[2][0][1] if r[2] else 0 for r in ref])
    np.testing.assert_array_equal(tab.column("bid_px_00").to_numpy(), bid)
    np.testing.assert_array_equal(tab.column("ask_px_00").to_numpy(), ask)
    np.testing.assert_array_equal(tab.column("bid_sz_00").to_numpy(), bsz)
    np.testing.assert_array_equal(tab.column("ask_sz_00").to_numpy(), asz)
    ts = np.array([recs["ts_recv"][k] for k, _, _ in ref], dtype=np.int64)
    np.testing.assert_array_equal(tab.column("ts_recv").cast(pa.int64()).to_numpy(), ts)


def test_cache_metadata_and_readers(esh4_cache):
    man = read_manifest(esh4_cache)
    assert man["instrument_mode"] == "front-month"
    assert {c["raw_symbol"] for c in man["schedule"]} == {"ESH4"}
    assert man["sources"][0]["path"].endswith(ESH4_MBO.name)
    names = {c["name"]: c for c in man["columns"]}
    assert names["mid"]["unit"] == "index points" and "label_h6000" in names
    f = next(esh4_cache.rglob("*.arrow"))
    meta = json.loads(pa.ipc.open_file(str(f)).schema.metadata[b"alphafeat"])
    assert meta["schedule"] == man["schedule"]
    # the column list in the metadata is exactly the file's columns
    assert [c["name"] for c in meta["columns"]] == pa.ipc.open_file(str(f)).schema.names
    import pandas as pd
    import polars as pl

    df = pd.read_feather(f)
    assert len(df) > 0 and "ofi_l01" in df.columns
    lf = pl.scan_ipc(str(esh4_cache / "**" / "*.arrow"), hive_partitioning=True).collect()
    assert lf.height == _table(esh4_cache).num_rows


def test_labels_never_cross_a_session(esh4_cache):
    tab = _table(esh4_cache)
    for sess in set(tab.column("session").to_pylist()):
        part = tab.filter(pa.compute.equal(tab.column("session"), sess))
        n = part.num_rows
        for h in (30, 100, 300, 1000, 6000):
            y = part.column(f"label_h{h}").to_numpy()
            assert np.isnan(y[max(n - h, 0):]).all()


def test_mbp1_with_trades_depth_features_nan(tmp_path, capsys):
    out = tmp_path / "c"
    assert _run("--input", str(need(ESU4_MBP1)), str(need(ESU4_TRADES)), "--out", str(out), "--device", "cpu") == 0
    printed = capsys.readouterr().out
    assert "ofi_l02" in printed and "NaN" in printed  # the summary states the missing depth
    tab = _table(out)
    assert tab.num_rows > 1000
    assert np.isnan(tab.column("ofi_l02").to_numpy()).all()
    assert np.isnan(tab.column("imbalance_l10").to_numpy()).all()
    assert not np.isnan(tab.column("ofi_l01").to_numpy()[1:]).all()
    assert tab.column("buy_volume").to_numpy().sum() + tab.column("sell_volume").to_numpy().sum() > 0
    assert set(tab.column("raw_symbol").to_pylist()) == {"ESU4"}


def test_no_outright_exits_nonzero(tmp_path, capsys):
    # the only instrument is asked for by a root that has no outright in the data
    out = tmp_path / "c"
    assert _run("--root", "NQ", "--input", str(need(ESU4_MBP1)), "--out", str(out)) == 1
    err = capsys.readouterr().err
    assert "no outright contract of root 'NQ'" in err and "ESU4" in err
    assert not out.exists()


def _bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    mbo = need(ESH4_MBO).read_bytes()
    empty = tmp / "empty.dbn"
    empty.write_bytes(b"")
    notdbn = tmp / "notes.dbn"
    notdbn.write_bytes(b"hello, this is not DBN\n" * 10)
    cut = tmp / "cut.mbo.dbn.zst"
    cut.write_bytes(mbo[: len(mbo) // 2])
    return {
        "empty": (empty, "empty"),
        "not dbn": (notdbn, "DBN"),
        "cut zst": (cut, ""),
        "definition": (need(REAL / "futures_definition.dbn.zst"), "definition"),
    }


@pytest.mark.parametrize("case", ["empty", "not dbn", "cut zst", "definition"])
def test_bad_input_one_line_nonzero_no_cache(tmp_path, capsys, case):
    path, word = _bad_inputs(tmp_path)[case]
    out = tmp_path / "cache"
    assert _run("--input", str(path), "--out", str(out), "--device", "cpu") == 1
    err = capsys.readouterr().err.strip()
    assert str(path) in err.replace("\n", "") and word in err
    assert "Traceback" not in err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".cache")]  # no temp dirs left
    assert not (tmp_path / ".predecoded").exists()  # nor an empty predecoded cache


def test_bad_input_keeps_previous_cache(tmp_path, capsys):
    out = tmp_path / "cache"
    assert _run("--input", str(need(ESU4_MBP1)), "--out", str(out), "--device", "cpu") == 0
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    path, _ = _bad_inputs(tmp_path)["cut zst"]
    assert _run("--input", str(path), "--out", str(out), "--device", "cpu") == 1
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_refuses_to_overwrite_foreign_directory(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    assert _run("--input", str(need(ESU4_MBP1)), "--out", str(out), "--device", "cpu") == 1
    assert (out / "thesis.tex").read_text() == "precious"
    assert "not an alphafeat cache" in capsys.readouterr().err
    assert not (tmp_path / ".predecoded").exists()  # refused before any decoding


@pytest.mark.parametrize("case", ["out is a file", "out below a file", "predecoded is a file"])
def test_bad_out_fails_first_in_one_line(tmp_path, capsys, case):
    # a wrong --out (or the predecoded folder beside it) is found before the inputs are
    # decoded: one line naming it, nothing written
    if case == "predecoded is a file":  # --predecoded-dir naming a file
        f = tmp_path / "books"
        f.write_text("mine")
        assert _run("--input", str(need(ESU4_MBP1)), "--out", str(tmp_path / "cache"), "--predecoded-dir", str(f)) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and str(f) in err and "is a file, not a folder" in err
        assert sorted(p.name for p in tmp_path.iterdir()) == [f.name]
        return
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    out = {"out is a file": f, "out below a file": f / "cache"}[case]
    assert _run("--input", str(need(ESU4_MBP1)), "--out", str(out), "--device", "cpu") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert str(f) in err and "is a file, not a folder" in err
    assert f.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f.name]  # no .predecoded, no temp


def test_out_where_no_folder_can_be_made_fails_first_in_one_line(capsys):
    # permission bits pass (as for root) but no folder can be made there: found before the
    # plan (which would otherwise warn once per scan it cannot keep), one line
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here (Linux): no folder where making one fails whatever the permissions")
    assert _run("--input", str(need(ESU4_MBP1)), "--out", "/proc/alphafeat-cache", "--device", "cpu") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "/proc/alphafeat-cache: cannot be written: making a folder in /proc failed" in err


def test_os_error_is_one_line_naming_the_path(capsys):
    import argparse

    from alphafeat.commandline import run

    def full(args):
        raise OSError(28, "No space left on device", "/data/cache/x.arrow")

    ap = argparse.ArgumentParser()
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.set_defaults(func=full)
    assert run(ap, []) == 1
    err = capsys.readouterr()
    text = err.out + err.err
    assert "/data/cache/x.arrow: No space left on device" in text and "Traceback" not in text


def test_embedded_default_front_month_switches(tmp_path, capsys):
    data = PROJECT / "data"
    if not any(data.glob("*.dbn.zst")):
        pytest.skip("data/ has no embedded sample yet")
    out = tmp_path / "c"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["precompute", "-q", "--instrument-mode", "front-month", "--out", str(out),
                     "--device", "cpu"]) == 0
    finally:
        os.chdir(cwd)
    man = read_manifest(out)
    # the run's notes (horizon 6000 is longer than these sessions) are saved with the cache
    assert any("label horizons [6000]" in n for n in man["notes"])
    syms = [c["raw_symbol"] for c in man["schedule"]]
    assert syms[0] == "ESH4" and syms[-1] == "ESM4"
    assert all("-" not in s for s in syms)  # the calendar spread is never front
    # the schedule switches where the previous session's volume says it should
    vol: dict[tuple[str, str], float] = {}
    for p in sorted(data.glob("*.trades.dbn.zst")):
        store = db.DBNStore.from_file(p)
        a = store.to_ndarray()
        imap = {int(iv["symbol"]): sym for sym, ivs in store.metadata.mappings.items() for iv in ivs}
        for iid in np.unique(a["instrument_id"]):
            day = slow_session(int(a["ts_recv"][0])).isoformat()
            vol[(day, imap[int(iid)])] = float(a["size"][a["instrument_id"] == iid].sum())
    days = [c["session"] for c in man["schedule"]]
    for k in range(1, len(days)):
        prev = {s: v for (d, s), v in vol.items() if d == days[k - 1] and "-" not in s}
        assert syms[k] == max(prev, key=prev.get)


CUDA_SCRIPT = r"""
import sys
sys.path.insert(0, "tests")
from simulator import simulator_settings
simulator_settings()  # as tests/conftest.py under the simulator
from alphafeat.cache import compare
from alphafeat.cli import main
inp, out = sys.argv[1], sys.argv[2]
for dev in ("cpu", "cuda"):
    assert main(["precompute", "-q", "--input", inp, "--out", f"{out}/{dev}", "--device", dev]) == 0
r = compare(f"{out}/cpu", f"{out}/cuda", rtol=1e-9)
assert r["rows"] > 0 and not r["mismatches"], r
print("OK", r["rows"], r["max_rel_err"])
"""


def _head_of_dbn(src: Path, dst: Path, n: int) -> Path:
    """The first ``n`` records of a DBN file, written as a plain ``.dbn`` with the same header."""
    with open(src, "rb") as f:
        raw = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()
    header = 8 + int.from_bytes(raw[4:8], "little")
    size = raw[header] * 4  # the first record's length byte, in 4-byte words
    dst.write_bytes(raw[: header + n * size])
    return dst


def test_cuda_cache_equals_cpu_cache_under_simulator(tmp_path):
    """--device cuda and --device cpu write the same cache (CUDA simulator is slow: 160 real records)."""
    small = _head_of_dbn(need(ESU4_MBP1), tmp_path / "esu4-head.mbp-1.dbn", 160)
    assert len(db.DBNStore.from_file(small).to_ndarray()) == 160
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(PROJECT))
    r = subprocess.run([sys.executable, "-c", CUDA_SCRIPT, str(small), str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=600, cwd=PROJECT)
    assert r.returncode == 0, r.stderr[-3000:]
    ok = r.stdout.strip().splitlines()[-1].split()
    assert ok[0] == "OK" and int(ok[1]) >= 100  # rows compared


def test_session_partition_names_are_trade_dates(esh4_cache):
    parts = sorted(p.parent.name for p in esh4_cache.rglob("*.arrow"))
    assert "session=2023-12-26" in parts
    assert (esh4_cache / MANIFEST).is_file()
    assert dt.date.fromisoformat(parts[-1].split("=")[1]) == dt.date(2023, 12, 26)


def test_volume_bar_sampling(tmp_path, capsys):
    if not any((PROJECT / "data").glob("*.dbn.zst")):
        pytest.skip("data/ has no embedded sample")
    snap, bars = tmp_path / "s", tmp_path / "b"
    assert _run("--input", str(PROJECT / "data"), "--out", str(snap), "--device", "cpu") == 0
    capsys.readouterr()
    assert _run("--input", str(PROJECT / "data"), "--out", str(bars), "--device", "cpu", "--sample", "volume:50") == 0
    out = capsys.readouterr().out
    assert "reach past the end of a session" in out  # long horizons in bars are said
    assert "without a snapshot" not in out  # MBP books are whole from their first row (the MBO note is not said)
    ts, tb = _table(snap), _table(bars)
    assert read_manifest(bars)["params"]["sample"] == "volume:50"
    assert read_manifest(bars)["book_complete_from"] == {}
    assert tb.column("book_complete").to_numpy(zero_copy_only=False).all()
    for sess in set(ts.column("session").to_pylist()):
        s = ts.filter(pa.compute.equal(ts.column("session"), sess))
        b = tb.filter(pa.compute.equal(tb.column("session"), sess))
        total = (s.column("buy_volume").to_numpy() + s.column("sell_volume").to_numpy()).sum()
        vol = b.column("buy_volume").to_numpy() + b.column("sell_volume").to_numpy()
        assert 0 < b.num_rows <= total // 50
        assert (vol >= 50).all()  # every bar holds at least V contracts
        # each bar closes on a real snapshot of the snapshot-sampled cache
        assert set(b.column("ts_recv").to_pylist()) <= set(s.column("ts_recv").to_pylist())
    assert _run("--input", str(PROJECT / "data"), "--out", str(tmp_path / "x"), "--sample", "volume:0") == 2  # usage


def test_crossed_book_rows_flagged_and_unlabelled(esh4_cache):
    tab = _table(esh4_cache)
    bid, ask = tab.column("bid_px_00").to_numpy(), tab.column("ask_px_00").to_numpy()
    flag = tab.column("book_crossed").to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(flag, bid > ask)
    assert flag.sum() > 100  # the real pre-open book is crossed for a while
    for name in ("label_h30", "label_h1000", "tb_label"):
        assert np.isnan(tab.column(name).to_numpy()[flag]).all()
    y = tab.column("label_h30").to_numpy()
    assert not np.isnan(y[~flag]).all()


def test_parallel_segments_equal_one_process(tmp_path):
    """--jobs 2 on the CPU computes and stages the session partitions in worker processes; the
    cache is the same as the one-process run's, partition by partition."""
    data = PROJECT / "data"
    if not any(data.glob("*.dbn.zst")):
        pytest.skip("data/ has no embedded sample")
    one, two = tmp_path / "one", tmp_path / "two"
    assert _run("--input", str(data), "--out", str(one), "--device", "cpu") == 0
    assert _run("--input", str(data), "--out", str(two), "--device", "cpu", "--jobs", "2") == 0
    parts = sorted(p.relative_to(one) for p in one.rglob("*.arrow"))
    assert len(parts) >= 3 and parts == sorted(p.relative_to(two) for p in two.rglob("*.arrow"))
    for rel in parts:
        a, b = (pa.ipc.open_file(str(d / rel)).read_all() for d in (one, two))
        assert a.num_rows > 0 and a.schema.equals(b.schema, check_metadata=True), rel
        for name in a.column_names:  # bit for bit; NaN where NaN
            x, y = a.column(name), b.column(name)
            if pa.types.is_floating(x.type):
                assert np.array_equal(x.to_numpy(), y.to_numpy(), equal_nan=True), (rel, name)
            else:
                assert x.equals(y), (rel, name)
    m1, m2 = read_manifest(one), read_manifest(two)
    assert m1["schedule"] == m2["schedule"] and m1["partitions"] == m2["partitions"]


def test_first_use_hint_is_its_own_log_line(tmp_path, caplog, monkeypatch) -> None:
    """A first run in an environment says numba compiles the kernels in a warning line of its
    own (it had been appended to the progress bar's text, which is cut at the terminal width)."""
    import logging

    from alphafeat import precompute as pipeline
    from alphafeat.precompute import run

    data = PROJECT / "data"
    if not any(data.glob("*.dbn.zst")):
        pytest.skip("the embedded default sample (data/) is absent")
    monkeypatch.setattr(run, "first_use", lambda: True)
    with caplog.at_level(logging.WARNING, logger="alphafeat.precompute"):
        pipeline.precompute(pipeline.PrecomputeConfig(inputs=[data / "glbx-mdp3-20240306.mbp-10.dbn.zst"],
                                                      out=tmp_path / "c", keep_books="none"))
    assert "first use in this environment: numba compiles the kernels once" in caplog.text
