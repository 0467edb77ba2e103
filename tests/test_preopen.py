"""The pre-open: no feature of an uncrossed row depends on a crossed row's book.

The real ESH4 hour (``../shared/data/real``) opens with 891 crossed-book rows (the pre-open
auction, best bid up to 94 ticks above the best ask). Changing the prices and sizes of those
rows -- keeping them crossed -- must change no feature of any uncrossed row, for every feature
of the registry (declared features too), on the CPU sequentially, in exact chunks and streamed
block by block (the pipeline's path); the CUDA kernels are held equal on crossed rows in
``tests/test_cuda_features.py``. The EMAs hold through the crossed rows: after them they equal
the EMAs of the book with the crossed rows taken out. Each feature's documented behaviour
(``FeatureSpec.crossed``, shown by ``alphafeat features``) that promises NaN is checked.
"""

from __future__ import annotations

import dataclasses
import math

import databento as db
import numpy as np
import pytest
from conftest import ESH4_MBO, need
from test_features import make_book

import alphafeat.book as bk
from alphafeat.features import FeatureParams, compute_features, feature_specs
from alphafeat.features.cpu import FeatureStream
from alphafeat.features.crossed import X_FLOW, X_NAN
from alphafeat.features.inputs import crossed_rows, prepare
from alphafeat.features.registry import Decay, Feature, make_plan, registered
from alphafeat.types import BookArrays


def _bid_pressure(bid_px, ask_sz, dt):
    return bid_px * 0.001 + ask_sz + dt


def _ask_level2(ask_px):
    return ask_px


# declared features reading raw book levels: one with state, one without
TOYS = (
    Feature("toy_bid_pressure", "mixed", "decayed bid_px_00/1000 + ask_sz_00 + dt_s", "test_preopen.py (toy)",
            _bid_pressure, ("bid_px_00", "ask_sz_00", "dt_s"), state=Decay(tau_s=5.0)),
    Feature("toy_ask_l2", "index points", "ask_px_01", "test_preopen.py (toy)", _ask_level2, ("ask_px_01",)),
)  # fmt: skip


@pytest.fixture(scope="module")
def esh4() -> BookArrays:
    recs = db.DBNStore.from_file(need(ESH4_MBO)).to_ndarray()
    raw, trades, _ = bk.rebuild_mbo(recs)
    return bk.to_book_arrays(raw, trades)


def _rows(b: BookArrays, sel: slice | np.ndarray) -> BookArrays:
    """A copy of the rows ``sel`` of ``b``."""
    arrays = [f.name for f in dataclasses.fields(b) if isinstance(getattr(b, f.name), np.ndarray)]
    return dataclasses.replace(b, **{k: np.array(getattr(b, k)[sel]) for k in arrays})


def perturb_crossed(b: BookArrays, seed: int) -> BookArrays:
    """``b`` with every crossed row's book moved by a random number of ticks (both sides by the
    same amount, so the row stays crossed) and its sizes drawn anew; other rows untouched."""
    rng = np.random.default_rng(seed)
    out = _rows(b, slice(None))
    x = crossed_rows(b.bid_px, b.ask_px)
    shift = rng.integers(-400, 400, x.sum())[:, None] * 0.25
    out.bid_px[x] += shift
    out.ask_px[x] += shift - 0.25 * rng.integers(0, 3, (x.sum(), 1))  # more crossed, or as much
    for k in ("bid_sz", "ask_sz"):
        getattr(out, k)[x] = rng.integers(1, 500, getattr(out, k)[x].shape)
    assert (crossed_rows(out.bid_px, out.ask_px) == x).all()
    return out


def _streamed(b: BookArrays, params: FeatureParams, block: int) -> dict[str, np.ndarray]:
    """The pipeline's CPU path: blocks of ``block`` rows, each after the first led by the previous
    block's last row, each prepared on its own."""
    names = [s.name for s in feature_specs(params)]
    stream = FeatureStream(make_plan(params), block + 1)
    parts, pos = [], 0
    while pos < len(b):
        hi, lo = min(pos + block, len(b)), max(pos - 1, 0)
        piece = _rows(b, slice(lo, hi))
        parts.append(stream.push(prepare(piece, params), pos > 0).copy())
        pos = hi
    out = np.concatenate(parts, axis=1)
    return {name: out[k] for k, name in enumerate(names)}


def _paths(b: BookArrays, params: FeatureParams) -> dict[str, dict[str, np.ndarray]]:
    return {"sequential": compute_features(b, params), "chunked": compute_features(b, params, n_chunks=7, n_jobs=2),
            "streamed": _streamed(b, params, 4099)}  # fmt: skip


def test_crossed_rows_reach_no_uncrossed_feature_real_esh4(esh4: BookArrays) -> None:
    x = crossed_rows(esh4.bid_px, esh4.ask_px)
    assert x.sum() == 891 and not x[:34].any() and x[34:925].all() and not x[925:].any()
    assert (esh4.bid_px[x, 0] - esh4.ask_px[x, 0]).max() == 94 * 0.25  # the auction book
    params = FeatureParams()
    with registered(*TOYS):
        names = [s.name for s in feature_specs(params)]
        base = _paths(esh4, params)
        moved = [_paths(perturb_crossed(esh4, seed), params) for seed in (1, 2)]
    assert len(names) > 60 and names[-2:] == [t.name for t in TOYS]
    for path, feats in base.items():
        assert list(feats) == names
        for other in moved:
            for name in names:  # every feature of every uncrossed row, bit for bit
                np.testing.assert_array_equal(other[path][name][~x], feats[name][~x], err_msg=f"{path} {name}")
        for name in names:  # the three CPU paths agree
            np.testing.assert_allclose(feats[name], base["sequential"][name], rtol=1e-12, atol=1e-12,
                                       equal_nan=True, err_msg=f"{path} {name}")  # fmt: skip
    seq = base["sequential"]
    assert np.isfinite(seq["ema_mid_60s"][925:]).all() and np.isfinite(seq["mid"][925:]).mean() > 0.99


def test_documented_crossed_behaviour(esh4: BookArrays) -> None:
    x = crossed_rows(esh4.bid_px, esh4.ask_px)
    with registered(*TOYS):
        specs = feature_specs(FeatureParams())
        feats = compute_features(esh4)
    assert all(s.crossed for s in specs)  # every feature says what it does there
    nan = [s.name for s in specs if s.crossed.startswith(X_NAN)]
    assert {"mid", "spread_ticks", "microprice", "imbalance_l1", "book_slope_bid", "mid_z_600s", "trend"} <= set(nan)
    for name in nan:
        assert np.isnan(feats[name][x]).all(), name
    assert (np.nan_to_num(esh4.bid_px[x, 0] - esh4.ask_px[x, 0]) > 0).all()  # the input is not changed
    by = {s.name: s.crossed for s in specs}
    assert by["signed_volume"] == by["trade_rate_60s"] == X_FLOW and by["toy_ask_l2"] != X_FLOW
    assert np.isnan(feats["tick_return"][925]) and (feats["log_depth_bid_l01"][x] == 0).all()


def test_emas_hold_through_crossed_rows(esh4: BookArrays) -> None:
    """After the auction the EMAs equal those of the book without its crossed rows: they held."""
    x = crossed_rows(esh4.bid_px, esh4.ask_px)
    kept = _rows(esh4, ~x)
    full, cut = compute_features(esh4), compute_features(kept)
    for name in ("ema_mid_1s", "ema_mid_60s", "ema_spread_1s", "ema_spread_60s", "ema_log_spread_60s"):
        np.testing.assert_allclose(full[name][~x], cut[name], rtol=1e-12, err_msg=name)


def test_hand_built_auction() -> None:
    """Three rows before, two crossed rows (bid 5002 over ask 4999), three after: the mid's EMA
    resumes from 5000.125 with the time since the last uncrossed row."""
    tick = 0.25
    bid = [5000.0, 5000.0, 5000.0, 5002.0, 5003.0, 5000.25, 5000.25, 5000.5]
    ask = [5000.25, 5000.25, 5000.25, 4999.0, 4998.0, 5000.5, 5000.5, 5000.75]
    book = make_book(bid, [3] * 8, ask, [4] * 8)
    feats = compute_features(book, FeatureParams(ema_taus_s=(1.0, 60.0), ema_interpolation="previous"))
    assert np.isnan(feats["mid"][3:5]).all() and np.isnan(feats["spread_ticks"][3:5]).all()
    assert np.isnan(feats["tick_return"][5]) and feats["tick_return"][6] == 0.0
    # 'previous' interpolation: EMA_5 = mu EMA_2 + (1 - mu) z_2 with mu = exp(-dt/tau), dt = 3 s
    e2 = feats["ema_mid_1s"][2]
    assert feats["ema_mid_1s"][3] == feats["ema_mid_1s"][4] == e2
    mu = math.exp(-3.0)
    assert feats["ema_mid_1s"][5] == pytest.approx(mu * e2 + (1 - mu) * 5000.125, rel=1e-15)
    assert feats["spread_ticks"][5] == (5000.5 - 5000.25) / tick


def test_preopen_drop_writes_no_crossed_row_and_changes_no_other(tmp_path) -> None:
    """``--preopen drop`` on the real ESH4 hour: the 891 crossed rows are not written; every
    other row holds the bytes ``keep`` writes (features and labels); a drop partition is
    recomputed, not relabelled, when only the horizons change."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    from alphafeat.precompute import PrecomputeConfig, precompute

    def run(out, **kw):
        s = precompute(PrecomputeConfig(inputs=[need(ESH4_MBO)], out=tmp_path / out, device="cpu",
                                         feature_set="all", **kw))  # fmt: skip
        return s, pads.dataset(str(tmp_path / out), format="ipc", partitioning="hive").to_table()

    s_keep, keep = run("keep")
    s_drop, drop = run("drop", preopen="drop")
    crossed = keep.column("book_crossed")
    assert pc.sum(crossed).as_py() == 891 and drop.num_rows == keep.num_rows - 891
    assert pc.sum(drop.column("book_crossed")).as_py() == 0
    kept = keep.filter(pc.invert(crossed))
    assert drop.schema.names == kept.schema.names
    for name in drop.schema.names:  # the same bytes (Table.equals counts NaN != NaN)
        a, b = drop.column(name).to_numpy(), kept.column(name).to_numpy()
        if a.dtype.kind in "fMmiub":
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=name)
        else:
            assert (a == b).all(), name
    assert any("--preopen drop: 891 snapshots" in n for n in s_drop.notes)
    s2, _ = run("drop", preopen="drop", horizons=(30, 100))
    assert not any(n.startswith("relabelled") for n in s2.notes) and s2.records > 0
