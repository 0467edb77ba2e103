"""Reruns of precompute: skipping unchanged partitions, concurrent writers, a killed run."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import PROJECT

from alphafeat.cache import compare, read_manifest
from alphafeat.instruments import InstrumentMode
from alphafeat.precompute import PrecomputeConfig, precompute

DATA = PROJECT / "data"


def _files(root: Path) -> dict[str, bytes]:
    """Every file's bytes; the manifest without its ``run`` record (that run's timings)."""
    out = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
           if p.is_file() and not p.name.startswith(".")}
    if "_alphafeat.json" in out:
        m = json.loads(out["_alphafeat.json"])
        assert set(m.pop("run")) >= {"seconds", "stage_seconds", "peak_rss", "bytes_per_row", "rows"}
        out["_alphafeat.json"] = json.dumps(m, sort_keys=True).encode()
    return out


def _cfg(inputs, out, mode="all") -> PrecomputeConfig:
    return PrecomputeConfig(inputs=list(inputs), out=out, instrument_mode=InstrumentMode.parse(mode), device="cpu")


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    if not any(DATA.glob("*.dbn.zst")):
        pytest.skip("data/ has no embedded sample")
    d = tmp_path_factory.mktemp("sample")
    for p in DATA.glob("*.dbn.zst"):
        shutil.copy2(p, d / p.name)
    return d


def test_rerun_skips_unchanged_and_adding_a_later_session_keeps_earlier(sample, tmp_path):
    first_two = sorted(p for p in sample.iterdir() if "20240308" not in p.name)
    out = tmp_path / "c"
    s1 = precompute(_cfg(first_two, out))
    assert s1.partitions_skipped == 0 and len(s1.partitions) > 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.arrow")}
    run1 = read_manifest(out)["run"]
    s2 = precompute(_cfg(first_two, out))
    assert s2.partitions_skipped == len(s2.partitions)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.arrow")} == before  # untouched
    assert read_manifest(out)["run"] == run1  # a rerun that computed nothing keeps the computing run's record
    crossed = [n for n in s1.notes if "crossed book" in n]  # counted again from the current partitions
    assert crossed and [n for n in s2.notes if "crossed book" in n] == crossed and s2.rows == s1.rows
    # a later session added: the earlier partitions stay current, the new ones are written
    s3 = precompute(_cfg(sorted(sample.iterdir()), out))
    assert s3.partitions_skipped == len(s2.partitions) < len(s3.partitions)
    fresh = tmp_path / "fresh"
    precompute(_cfg(sorted(sample.iterdir()), fresh))
    assert _files(out) == _files(fresh)
    # a changed feature parameter invalidates every partition (labels only: relabelled, below)
    cfg = _cfg(sorted(sample.iterdir()), out)
    cfg.horizons = (10, 20)
    cfg.features = dataclasses.replace(cfg.features, ofi_levels=3)
    s4 = precompute(cfg)
    assert s4.partitions_skipped == 0
    assert any(n.startswith(f"recomputed {len(s4.partitions)} partition(s) written earlier") for n in s4.notes)
    assert not any(n.startswith("recomputed") for n in s3.notes)  # new sessions are not "recomputed"
    assert read_manifest(out)["params"]["horizons"] == [10, 20]


def test_on_error_skip_keeps_the_manifest_and_the_files_in_step(sample, tmp_path):
    """A session whose input was cut after an earlier run: with --on-error skip its earlier
    partition stays and is listed (earlier_partitions, with a note) so readers of the folder and
    of the manifest see the same partitions; with --prune it is deleted and listed as pruned."""
    d = tmp_path / "in"
    shutil.copytree(sample, d)
    out = tmp_path / "c"
    precompute(_cfg(sorted(d.iterdir()), out, "front-month"))
    book = d / "glbx-mdp3-20240308.mbp-10.dbn.zst"
    book.write_bytes(book.read_bytes()[:100_000])
    for prune in (False, True):
        cfg = _cfg(sorted(d.iterdir()), out, "front-month")
        cfg.on_error, cfg.prune = "skip", prune
        s = precompute(cfg)
        m = read_manifest(out)
        on_disk = sorted(str(p.relative_to(out)) for p in out.rglob("*.arrow"))
        assert sorted(m["partitions"]) == on_disk, prune
        assert [str(p) for p, _ in s.skipped] == [str(book)]
        assert [e["path"] for e in m["skipped"]] == [str(book)] and "truncated" in m["skipped"][0]["problem"]
        assert str(book) not in m["skipped"][0]["problem"]  # the path once, in "path"
        day8 = [r for r in on_disk if "2024-03-08" in r]
        if not prune:
            assert len(day8) == 1 and m["earlier_partitions"] == day8
            assert any(n.startswith("--on-error skip: 1 partition(s) of an earlier run") and " kept, " in n
                       for n in s.notes)
        else:
            assert not day8 and any("2024-03-08" in r for r in m["pruned"])
            assert any(n.startswith("--on-error skip: 1 partition(s)") and "deleted (--prune" in n for n in s.notes)
        assert not any("of sessions not in this run" in n for n in s.notes)  # its session is in this run


def test_two_runs_at_once_do_not_corrupt(sample, tmp_path):
    out = tmp_path / "c"
    errors: list[BaseException] = []

    def run() -> None:
        try:
            precompute(_cfg(sorted(sample.iterdir()), out))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ref = tmp_path / "ref"
    precompute(_cfg(sorted(sample.iterdir()), ref))
    assert _files(out) == _files(ref)
    assert not list(out.glob(".staging-*"))


def test_killed_run_then_rerun_equals_uninterrupted(sample, tmp_path):
    ref = tmp_path / "ref"
    precompute(_cfg(sorted(sample.iterdir()), ref))
    out = tmp_path / "c"
    env = dict(os.environ, PYTHONPATH=str(PROJECT))
    cmd = [sys.executable, "-m", "cli.alphafeat", "precompute", "-q", "--instrument-mode", "all",
           "--input", str(sample), "--out", str(out), "--device", "cpu"]
    killed = False
    for _ in range(3):  # kill as soon as the run has staged a partition
        proc = subprocess.Popen(cmd, env=env, cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if any(out.glob(".staging-*/**/*.arrow.part")):
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
            time.sleep(0.002)
        proc.wait()
        if killed:
            break
        shutil.rmtree(out, ignore_errors=True)
    assert killed, "the run finished before it could be killed"
    assert not (out / "_alphafeat.json").exists()  # never a manifest for a half-written cache
    assert not list(out.glob("**/*.arrow"))  # a glob over the cache (polars' ** enters .staging-*) finds no partition
    precompute(_cfg([sample], out))
    assert _files(out) == _files(ref)
    assert compare(out, ref)["mismatches"] == []
    assert not list(out.glob(".staging-*"))


def _arrow(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.arrow"))
            if not any(q.name.startswith(".") for q in p.relative_to(root).parents)}


def test_relabel_keeps_the_label_columns_of_unchanged_options(sample, tmp_path, monkeypatch):
    """A relabel computes only the label columns whose options changed (the triple barrier of
    the same barrier, the horizons, in rows or seconds, the partition holds are kept as they
    are) and the files still equal a fresh run's byte for byte."""
    import alphafeat.labels as lb
    import alphafeat.precompute.relabel as pl

    days = sorted(p for p in sample.iterdir() if "20240308" not in p.name)
    out, fresh = tmp_path / "c", tmp_path / "fresh"
    precompute(dataclasses.replace(_cfg(days, out), horizons_s=(5.0,)))
    other = {"horizons": (30, 70, 6000), "horizons_s": (5.0, 2.5)}
    computed: list = []
    rows, seconds = lb.direction_labels, lb.direction_labels_seconds
    with monkeypatch.context() as m:
        m.setattr(lb, "triple_barrier", lambda *a, **k: pytest.fail("the kept triple barrier was computed"))
        m.setattr(lb, "direction_labels", lambda mid, hs, ts: computed.extend(hs) or rows(mid, hs, ts))
        m.setattr(pl, "direction_labels_seconds", lambda mid, ts, hs: computed.extend(hs) or seconds(mid, ts, hs))
        s = precompute(dataclasses.replace(_cfg(days, out), **other))
    n = len(s.partitions)
    assert s.records == 0 and any(x.startswith(f"relabelled {n} partition(s)") for x in s.notes), s.notes
    assert sorted(computed) == sorted([70, 2.5] * n)
    precompute(dataclasses.replace(_cfg(days, fresh), **other))
    assert _arrow(out) == _arrow(fresh)


def test_column_array_and_from_numpy_equal_pyarrow() -> None:
    """The pandas-free conversions a relabel uses equal pyarrow's own (sliced arrays, nulls,
    several chunks, empty)."""
    import numpy as np
    import pyarrow as pa

    from alphafeat.precompute.table import column_array, from_numpy

    rng = np.random.default_rng(7)
    ts = pa.timestamp("ns", tz="UTC")
    for n in (0, 1, 13, 1000):
        b = rng.random(n) < 0.3
        f = rng.normal(size=n)
        t = rng.integers(0, 2**62, size=n)
        table = pa.table({"b": pa.array(b), "f": pa.array(f), "t": pa.array(t, ts)})
        for k in (0, min(n, 3)):  # a slice: Arrow offsets into its buffers
            sl = table.slice(k)
            assert np.array_equal(column_array(sl, "b", np.bool_), b[k:])
            assert np.array_equal(column_array(sl, "f", np.float64), f[k:])
            assert np.array_equal(column_array(sl, "t", np.int64), t[k:])
        two = pa.concat_tables([table, table])
        assert np.array_equal(column_array(two, "f", np.float64), np.concatenate([f, f]))
        y = rng.random(n).astype(np.float32)
        assert from_numpy(y, pa.float32()).equals(pa.array(y))
        null = t % 3 == 0
        assert from_numpy(t, ts, null).equals(pa.array(t, ts, mask=null))
    g = pa.table({"f": pa.array([1.0, None, 3.0])})
    assert np.array_equal(column_array(g, "f", np.float64), [1.0, np.nan, 3.0], equal_nan=True)


def test_rerun_with_other_label_options_relabels_to_the_same_bytes(sample, tmp_path):
    """Only label options changed: the partitions' labels are recomputed from their own mid
    (no input read), and the files equal a fresh run's byte for byte; a feature or a vol
    barrier change computes afresh."""
    days = sorted(p for p in sample.iterdir() if "20240308" not in p.name)
    out, fresh = tmp_path / "c", tmp_path / "fresh"
    precompute(_cfg(days, out))
    other = {"horizons": (50, 500, 6000), "horizons_s": (5.0,), "barrier": "ticks:6", "barrier_horizon": 300,
             "compression": "zstd"}  # fmt: skip
    s = precompute(dataclasses.replace(_cfg(days, out), **other))
    assert s.records == 0 and len(s.partitions) > 0
    note = next(n for n in s.notes if n.startswith(f"relabelled {len(s.partitions)} partition(s)"))
    said = note.split("kept):")[1]
    assert "label columns of changed options" in said and "--compression zstd" in said and "features" not in said
    assert not any(n.startswith("recomputed") for n in s.notes)
    precompute(dataclasses.replace(_cfg(days, fresh), **other))
    assert _arrow(out) == _arrow(fresh)
    assert read_manifest(out)["params"]["horizons"] == [50, 500, 6000]
    for change in ({"barrier": "vol:2"}, {"features": dataclasses.replace(_cfg(days, out).features, ofi_levels=3)}):
        s = precompute(dataclasses.replace(_cfg(days, out), **{**other, **change}))
        assert s.records > 0 and not any(n.startswith("relabelled") for n in s.notes), change
        assert any(n.startswith("recomputed") for n in s.notes)


def test_rerun_with_other_features_adds_them_from_the_kept_books(sample, tmp_path, monkeypatch):
    """A rerun that stores other features (and other horizons) keeps the partitions' book
    columns and the features they hold, computes only the added features from the kept books
    (no input read), drops the ones no longer stored, and writes the bytes of a fresh run;
    without kept books it computes afresh."""
    import alphafeat.precompute.segment as pl

    days = sorted(p for p in sample.iterdir() if "20240308" not in p.name)
    out, fresh, bare = tmp_path / "c", tmp_path / "f" / "fresh", tmp_path / "b" / "bare"  # f, b: no kept books
    precompute(dataclasses.replace(_cfg(days, out), keep_books="keep"))
    asked: list[list[str]] = []
    real = pl.added_features
    monkeypatch.setattr(pl, "added_features",
                        lambda b, job, names, *a, **k: asked.append(list(names)) or real(b, job, names, *a, **k))
    for i, change in enumerate(({"feature_set": "default,flow"}, {"feature_set": "mid,ofi", "horizons": (50, 500)},
                                {"feature_set": "mid", "dtype": "float64"})):  # fmt: skip
        s = precompute(dataclasses.replace(_cfg(days, out), **change))
        precompute(dataclasses.replace(_cfg(days, fresh / str(i)), **change))
        assert _arrow(out) == _arrow(fresh / str(i)), change
        note = next((n for n in s.notes if n.startswith(f"relabelled {len(s.partitions)} partition(s)")), "")
        assert bool(note) == ("dtype" not in change) and s.records == 0, (change, s.notes)  # dtype: from the books
        if note:  # the note says what changed, and only that
            said = ("label columns" in note, "features they lack" in note, "no longer asked for dropped" in note)
            assert said == ("horizons" in change, True, i > 0), note
    flow = {"log1p_trade_count", "log_trade_rate_1s", "log_trade_rate_60s", "slog_signed_volume",
            "slog_propagator_flow"}  # fmt: skip
    assert set(asked[0]) == flow and len(asked) == 2 * len(s.partitions)  # then the OFI levels and slog_ofi_l01
    assert {"ofi_l04", "slog_ofi_l01"} <= set(asked[-1]) and "mid" not in asked[-1]
    precompute(_cfg(days, bare))  # books not kept (MBP-10, --predecoded auto): features computed afresh
    s = precompute(dataclasses.replace(_cfg(days, bare), feature_set="default,flow"))
    assert s.records > 0 and not any(n.startswith("relabelled") for n in s.notes)
