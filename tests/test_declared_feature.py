"""A feature declared in one place reaches every path.

The toy features below are declared here, in this file only (:class:`registry.Feature`,
registered for the duration of each test): nothing else in the project names them. They must
come out of the CPU kernels (sequential, in exact chunks, streamed block by block), the CUDA
kernels (``test_inprocess_*``: a GPU, or numba's simulator, run in a subprocess by
``test_declared_features_cuda_simulator`` when there is no GPU), the cache's columns (a small
``alphafeat precompute`` of the embedded sample, data/) and ``alphafeat features --json``.
The reference is a plain-Python evaluation of the declaration itself (its ``row`` function and
its :class:`registry.Decay` state) over the built-in columns.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads
import pytest
from test_features import random_book

from alphafeat.devices import compute_features
from alphafeat.features import FeatureParams, cuda_available, feature_specs
from alphafeat.features.cpu import FeatureStream
from alphafeat.features.inputs import prepare
from alphafeat.features.registry import Decay, Feature, make_plan, registered

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
IN_SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
HAVE_DEVICE = IN_SIM or cuda_available()
NS = 1_000_000_000


def _pressure(imbalance, spread, buy, sell):
    return imbalance * spread + (buy - sell)


def _top_depth(bid_sz, ask_sz, dt):
    return math.log1p(bid_sz + ask_sz) + dt


# a feature with state (an exponentially decayed sum of its row value) and one without
FLOW = Feature(
    name="toy_flow_pressure",
    unit="contracts",
    formula="sum_j exp(-(t_i - t_j)/tau) (imbalance_l1_j spread_ticks_j + buy_j - sell_j), tau = 2 s",
    source="test_declared_feature.py (toy)",
    row=_pressure,
    inputs=("imbalance_l1", "spread_ticks", "buy_volume", "sell_volume"),
    state=Decay(tau_s=2.0),
)
DEPTH = Feature(
    name="toy_top_depth",
    unit="log contracts + s",
    formula="log1p(bid_sz_00 + ask_sz_00) + dt_s",
    source="test_declared_feature.py (toy)",
    row=_top_depth,
    inputs=("bid_sz_00", "ask_sz_00", "dt_s"),
)
TOYS = (FLOW, DEPTH)


def slow_toys(feats: dict[str, np.ndarray], ts: np.ndarray, bid_sz0: np.ndarray, ask_sz0: np.ndarray,
              buy: np.ndarray, sell: np.ndarray) -> dict[str, np.ndarray]:  # fmt: skip
    """The toy columns from their declarations, row by row in Python."""
    n = len(ts)
    flow, depth = np.empty(n), np.empty(n)
    x = 0.0
    for i in range(n):
        dt = max(int(ts[i]) - int(ts[i - 1]), 0) / NS if i > 0 else 0.0
        z = FLOW.row(feats["imbalance_l1"][i], feats["spread_ticks"][i], buy[i], sell[i])
        x = math.exp(-dt / FLOW.state.tau_s) * x + (z if math.isfinite(z) else 0.0)
        flow[i] = x
        depth[i] = DEPTH.row(bid_sz0[i], ask_sz0[i], dt)
    return {FLOW.name: flow, DEPTH.name: depth}


def _sizes0(book) -> tuple[np.ndarray, np.ndarray]:
    """Level-1 sizes as the kernels read them (the raw column, NaN price or not)."""
    return book.bid_sz[:, 0].astype(np.float64), book.ask_sz[:, 0].astype(np.float64)


def test_declared_features_on_the_cpu() -> None:
    book = random_book(3000, 7)
    plain = compute_features(book)
    with registered(*TOYS):
        names = [s.name for s in feature_specs(FeatureParams())]
        assert names == [*plain, FLOW.name, DEPTH.name]
        seq = compute_features(book)
        chunked = compute_features(book, n_chunks=5, n_jobs=2)
        # streamed in blocks (each after the first with the previous block's last row)
        stream = FeatureStream(make_plan(FeatureParams()), 700)
        cols = prepare(book, FeatureParams())
        parts, pos = [], 0
        while pos < len(book):
            hi = min(pos + 613, len(book))
            lo = max(pos - 1, 0)
            parts.append(stream.push({k: v[lo:hi] for k, v in cols.items()}, pos > 0).copy())
            pos = hi
        streamed = np.concatenate(parts, axis=1)
    for name in plain:  # the built-in columns are untouched
        np.testing.assert_array_equal(seq[name], plain[name], err_msg=name)
    ref = slow_toys(seq, book.ts_recv, *_sizes0(book), book.buy_volume, book.sell_volume)
    for k, name in enumerate(seq):
        np.testing.assert_array_equal(streamed[k], seq[name], err_msg=name)  # streamed == one call, bit for bit
        np.testing.assert_allclose(chunked[name], seq[name], rtol=1e-12, atol=1e-12, err_msg=name)
    for name, want in ref.items():
        np.testing.assert_allclose(seq[name], want, rtol=1e-12, atol=1e-12, err_msg=name)
        assert np.isfinite(seq[name]).all()
    assert np.isnan(seq["imbalance_l1"]).any()  # the state skipped NaN row values (as 0)
    assert len(feature_specs(FeatureParams())) == len(plain)  # unregistered again


def test_declared_features_keep_the_implementation_strings_caches_store() -> None:
    """Caches store each column's spec with its ``cpu`` and ``cuda`` strings and take a changed one
    for a changed option (a stale cache): a declared feature's strings keep naming the row
    kernel's module by its former name, ``alphafeat.features._declared`` (now ``declared``)."""
    with registered(*TOYS):
        specs = {s.name: s for s in feature_specs(FeatureParams())}
    row = "test_declared_feature._top_depth"
    assert specs[DEPTH.name].cpu == f"{row} (numba.njit in alphafeat.features._declared.row_kernel)"
    assert specs[DEPTH.name].cuda == f"{row} (cuda.jit device function in alphafeat.features._declared.row_kernel)"
    assert specs[FLOW.name].cpu.startswith("test_declared_feature._pressure (numba.njit in alphafeat.features."
                                           "_declared.row_kernel) + alphafeat.features.cpu._scan_block")  # fmt: skip


@pytest.mark.skipif(not HAVE_DEVICE, reason="no CUDA device (covered by test_declared_features_cuda_simulator)")
def test_inprocess_declared_features_cuda_equal_cpu() -> None:
    book = random_book(80 if IN_SIM else 20_000, 11)
    with registered(*TOYS):
        cpu = compute_features(book)
        gpu = compute_features(book, device="cuda")
    assert list(gpu) == list(cpu) and list(cpu)[-2:] == [FLOW.name, DEPTH.name]
    for name in cpu:
        np.testing.assert_allclose(gpu[name], cpu[name], rtol=1e-9, atol=1e-9, equal_nan=True, err_msg=name)


def test_declared_features_cuda_simulator() -> None:
    """Run the in-process GPU test above in a subprocess with NUMBA_ENABLE_CUDASIM=1."""
    if IN_SIM:
        pytest.skip("already running under the simulator")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "inprocess"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and re.search(r"\b1 passed", out), out


def test_declared_features_in_cache_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from alphafeat.cli import main

    day = sorted(DATA.glob("*20240307*.dbn.zst"))
    if not day:
        pytest.skip("data/ has no embedded sample")
    out = tmp_path / "cache"
    with registered(*TOYS):
        rc = main(["precompute", "-q", "--input", *map(str, day), "--out", str(out), "--device", "cpu",
                   "--dtype", "float64", "--features", f"default,{FLOW.name},{DEPTH.name}"])  # fmt: skip
        assert rc == 0
        capsys.readouterr()
        assert main(["features", "--json"]) == 0
        rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert {"default", "ofi"} <= set(rows["ofi_l01"]["groups"]) and rows["ofi_l01"]["groups"][0] == "default"
    assert "flow" in rows["hawkes_buy"]["groups"] and "ofi" not in rows["hawkes_buy"]["groups"]
    for f in TOYS:
        r = rows[f.name]
        assert (r["unit"], r["formula"], r["source"], tuple(r["inputs"])) == (f.unit, f.formula, f.source, f.inputs)
        assert bool(r["state"]) == (f.state is not None)
    t = pads.dataset(str(out), format="ipc", partitioning="hive").to_table()
    assert {FLOW.name, DEPTH.name} <= set(t.column_names)
    assert len(set(t["session"].to_pylist())) == 1  # one segment: the state runs through every row
    t = t.sort_by("ts_recv")
    keys = ("ts_recv", "imbalance_l1", "spread_ticks", "buy_volume", "sell_volume", "bid_sz_00", "ask_sz_00",
            "bid_px_00", "ask_px_00", FLOW.name, DEPTH.name)  # fmt: skip
    c = {k: t[k].to_numpy() for k in keys}
    assert len(c["ts_recv"]) > 1000
    # the cache keeps the top of book; where a side is empty its size is NaN there
    bsz = np.where(np.isnan(c["bid_px_00"]), 0.0, c["bid_sz_00"])
    asz = np.where(np.isnan(c["ask_px_00"]), 0.0, c["ask_sz_00"])
    ref = slow_toys(c, c["ts_recv"], bsz, asz, c["buy_volume"], c["sell_volume"])
    for name, want in ref.items():
        got = c[name]
        ok = np.isfinite(c["bid_px_00"]) & np.isfinite(c["ask_px_00"]) if name == DEPTH.name else slice(None)
        np.testing.assert_allclose(got[ok], want[ok], rtol=1e-9, atol=1e-9, err_msg=name)


def _resolvable(name: str, names: set[str]) -> bool:
    """An input of a spec: a feature, a book or trade column (``ROW_INPUTS`` or ``ts_recv``), or
    a range ``first..last`` of them."""
    from alphafeat.features.registry import ROW_INPUTS

    first = name.split("..")[0]
    return first in names or first in ROW_INPUTS or first == "ts_recv"


@pytest.mark.parametrize("declared", [(), TOYS], ids=["built-in", "with-toys"])
def test_every_spec_declares_inputs_and_state(declared: tuple[Feature, ...]) -> None:
    """The registry's table: every column names its unit, formula, source and inputs (each one
    a feature or a book column), and says what state it carries exactly when a recurrence or a
    window (not the row-wise stage) computes it."""
    with registered(*declared):
        specs = feature_specs(FeatureParams())
        plan = make_plan(FeatureParams())
    names = {s.name for s in specs}
    from_states = {int(c) for c in plan.p_int[:, 1] if c < plan.n_out} | {plan.fd_col}
    for k, s in enumerate(specs):
        assert s.unit and s.formula and s.source and s.inputs, s.name
        assert all(_resolvable(x, names) for x in s.inputs), (s.name, s.inputs)
        assert bool(s.state) == (k in from_states), s.name
    assert [s.name for s in specs[len(specs) - len(declared) :]] == [f.name for f in declared]


@pytest.mark.parametrize(
    "bad, match",
    [
        (Feature("mid", "x", "f", "s", _top_depth, ("bid_sz_00", "ask_sz_00", "dt_s")), "name is taken"),
        (Feature("toy_bad_input", "x", "f", "s", _top_depth, ("bid_sz_00", "no_such", "dt_s")), "unknown input"),
        (Feature("toy_bad_state", "x", "f", "s", _top_depth, ("bid_sz_00", "ask_sz_00", "dt_s"), Decay(0.0)),
         "tau_s > 0"),
        (Feature("toy_reads_state", "x", "f", "s", _top_depth, ("bid_sz_00", "ema_mid_1s", "dt_s")), "unknown input"),
    ],
)  # fmt: skip
def test_bad_declarations(bad: Feature, match: str) -> None:
    with registered(bad), pytest.raises(ValueError, match=match):
        feature_specs(FeatureParams())
    with registered(DEPTH), pytest.raises(ValueError, match="already registered"), registered(DEPTH):
        pass
