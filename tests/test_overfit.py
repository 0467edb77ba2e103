"""Probability of backtest overfitting by CSCV (alphamodel.backtest.overfit): a hand-worked case, a
slow loop reference, unskilled trials near 1/2, a real edge near 0, the histogram PNG."""

import itertools
import math

import numpy as np
import pytest

from alphamodel.backtest.overfit import block_count, pbo, pbo_section, plot_logits


def _slow_pbo(m: np.ndarray, S: int) -> tuple[float, np.ndarray]:
    """Bailey et al. 2017, section 2, written as loops over the splits (independent reference)."""
    T, N = m.shape
    parts = np.array_split(np.arange(T), S)
    lams = []
    for blk in itertools.combinations(range(S), S // 2):
        tr = np.concatenate([parts[b] for b in blk])
        te = np.concatenate([parts[b] for b in range(S) if b not in blk])
        r = [np.mean(m[tr, n]) / np.std(m[tr, n], ddof=1) for n in range(N)]
        rb = [np.mean(m[te, n]) / np.std(m[te, n], ddof=1) for n in range(N)]
        best = int(np.argmax(r))
        rank = sum(1.0 for x in rb if x < rb[best]) + (sum(1.0 for x in rb if x == rb[best]) + 1) / 2
        w = rank / (N + 1)
        lams.append(math.log(w / (1 - w)))
    lams = np.array(lams)
    return float(np.mean(lams <= 0)), lams


def test_hand_worked_mean():
    # blocks {rows 0,1}, {rows 2,3}; block means [2, 0, 1] and [2, 2, 0.5]
    m = np.array([[1, 0, 2], [3, 0, 0], [4, 1, 0], [0, 3, 1]], float)
    r = pbo(m, statistic="mean")
    assert (r.blocks, r.splits, r.trials, r.rows) == (2, 2, 3, 4)
    # split 1: best in sample trial 0 (2), out of sample ranks [2.5, 2.5, 1] -> w = 2.5/4
    # split 2: best in sample trial 0 (first of the tied 2s), out of sample ranks [3, 1, 2] -> w = 3/4
    np.testing.assert_allclose(r.logits, [math.log(5 / 3), math.log(3)])
    assert r.pbo == 0.0 and r.prob_loss == 0.0
    assert math.isnan(r.slope)  # R[n*] = 2 on both splits
    # swap columns so that the in-sample winner loses out of sample on one split
    m2 = np.array([[3, 0, 0], [3, 0, 0], [0, 1, 1], [0, 1, 1]], float)
    # split 1: best 0, oos [0, 1, 1] -> rank 1, w 1/4; split 2: best 1, oos [3, 0, 0] -> 1.5/4
    r2 = pbo(m2, statistic="mean")
    np.testing.assert_allclose(r2.logits, [math.log(1 / 3), math.log(1.5 / 2.5)])
    assert r2.pbo == 1.0


@pytest.mark.parametrize("T,N,S", [(12, 3, 4), (22, 5, 16), (40, 4, 8)])
def test_matches_slow_reference(T, N, S):
    m = np.random.default_rng(T).standard_normal((T, N))
    want, lam = _slow_pbo(m, block_count(T, S))
    r = pbo(m, blocks=S)
    np.testing.assert_allclose(r.logits, lam, rtol=1e-9)
    assert r.pbo == want


def test_short_series_reduce_blocks_and_bad_input():
    assert block_count(22) == 10 and block_count(64) == 16 and block_count(5) == 2
    with pytest.raises(ValueError, match="too few"):
        pbo(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="even"):
        pbo(np.zeros((10, 2)), blocks=5)
    with pytest.raises(ValueError, match="2 trials"):
        pbo(np.zeros((10, 1)))
    with pytest.raises(ValueError, match="non-finite"):
        pbo(np.full((10, 2), np.nan))


def test_flat_trial_is_rankable():
    m = np.random.default_rng(1).standard_normal((16, 3))
    m[:, 0] = 0.0  # flat: zero spread, Sharpe 0
    r = pbo(m, blocks=4)
    assert np.isfinite(r.logits).all()


def test_unskilled_trials_near_half():
    # exchangeable trials: the in-sample best's out-of-sample rank is uniform on 1..N, so
    # E[PBO] = 1/2 for even N; one draw's PBO spreads widely (SD 0.24 measured over 200 draws
    # at T=32, N=8, S=8), so average 100 draws: SE 0.024, band +-0.08 (3.3 SE)
    rng = np.random.default_rng(0)
    v = [pbo(rng.standard_normal((32, 8)), blocks=8).pbo for _ in range(100)]
    assert abs(np.mean(v) - 0.5) < 0.08


def test_real_edge_gives_small_pbo(tmp_path):
    rng = np.random.default_rng(3)
    m = rng.standard_normal((64, 10))
    m[:, 3] += 0.8  # a daily Sharpe of 0.8 among nine unskilled trials
    r = pbo(m)
    assert r.blocks == 16 and r.splits == 12870
    assert r.pbo < 0.1 and r.prob_loss < 0.1
    png = plot_logits(r, tmp_path / "pbo.png", "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    s = r.summary()
    assert s["pbo"] == r.pbo and len(s["logit_quartiles"]) == 3


def test_pbo_section_for_a_summary(tmp_path):
    rng = np.random.default_rng(4)
    trials = {f"s{i}@0.25": rng.standard_normal(20) for i in range(4)}
    sec = pbo_section(trials, tmp_path, "pbo.png", "mid")
    assert sec["trial_names"] == sorted(trials) and sec["blocks"] == 10 and 0 <= sec["pbo"] <= 1
    assert (tmp_path / "pbo.png").is_file() and sec["plot"] == "pbo.png"
    assert pbo_section({"a": np.zeros(3), "b": np.ones(3)})["pbo"] is None
    assert pbo_section({"a": np.zeros(9)})["pbo"] is None


def test_summary_parts_pbo_by_cost_pooled_and_head(tmp_path):
    """The backtest summary's pbo (per fill mode and cost, the look-ahead and oracle references
    left out, a PNG each), pooled (PnL per session over every test session, Sharpe only with 10+) and the K=3
    head's verdict over the folds that trained it."""
    from alphamodel.backtest.config import BacktestConfig
    from alphamodel.backtest.report import head_summary, pbo_by_cost, pooled_readout

    rng = np.random.default_rng(5)
    cfg = BacktestConfig(costs=(0.0, 0.25), fills=("taker", "mid"))
    daily = {(s, c, m): rng.standard_normal(12) - c for s in ("c51", "long", "logistic", "oracle", "hindsight")
             for c in cfg.costs for m in cfg.fills}
    pbo_d = pbo_by_cost(daily, cfg, tmp_path)
    assert set(pbo_d) == {"taker", "mid"} and all(set(v) == {"0", "0.25"} for v in pbo_d.values())
    for sec in (x for v in pbo_d.values() for x in v.values()):
        assert sec["trial_names"] == ["c51", "logistic", "long"] and (tmp_path / sec["plot"]).is_file()
    assert pbo_d["taker"]["0.25"]["plot"] == "pbo_cost0.25.png"
    assert pbo_d["mid"]["0.25"]["plot"] == "pbo_cost0.25_mid.png"
    daily[("c51", 0.0, "mid")] = daily[("c51", 0.0, "mid")] + 50.0  # one mode's trial changed: the other's PBO not
    assert pbo_by_cost(daily, cfg, None)["taker"]["0"]["pbo"] == pbo_d["taker"]["0"]["pbo"]
    pooled = pooled_readout(daily)
    assert len(pooled) == 20 and all(p["sessions"] == 12 and p["sharpe"] is not None for p in pooled)
    assert [p["fill"] for p in pooled[:10]] == ["taker"] * 10  # taker first (FILL_MODES order)
    mid_c51 = next(p for p in pooled if p["strategy"] == "c51" and p["fill"] == "mid" and p["cost_ticks"] == 0.0)
    assert mid_c51["pnl_per_session"] > 40
    y = rng.integers(0, 3, 400)
    aux = [{"fold": 0, "available": True, "pred": y.copy(), "labels": y},  # a head that is always right
           {"fold": 1, "available": False}]
    h = head_summary(aux)
    assert h["learns"] and h["folds"] == [0] and h["balanced_accuracy"] == 1.0
    aux[0]["pred"] = np.zeros(400, np.int64)
    assert not head_summary(aux)["learns"] and "stops training it" in head_summary(aux)["note"]
    assert head_summary([{"fold": 0, "available": False}]) == {
        "available": False, "note": "the K=3 head was not measured (no tb_label, or aux_weight 0)"}
