"""Readout helpers (alphamodel.readout): when a Sharpe is reported, bootstrap intervals, and
the sessions an interval needs."""

import math

import numpy as np
import pytest

from alphamodel.backtest.metrics import session_readout, sharpe_stats
from alphamodel.readout import (
    MIN_SHARPE_SESSIONS,
    balanced_accuracy_ci,
    bootstrap_ci,
    head_verdict,
    needed_note,
    sessions_needed,
)


def test_sessions_needed_hand_worked():
    # half-width 2 at 10 sessions, centre 1: (2 / 1)^2 x 10 = 40
    assert sessions_needed(10, -1.0, 3.0) == 40
    assert sessions_needed(10, -1.0, 3.0, effect=4.0) == 3  # ceil(2.5): already narrower than the effect
    assert sessions_needed(9, 1.0, 2.0, effect=0.25) == 36  # (0.5 / 0.25)^2 x 9
    assert math.isinf(sessions_needed(10, -1.0, 1.0))
    assert math.isnan(sessions_needed(1, math.nan, math.nan))
    assert "about 40 sessions" in needed_note(10, -1.0, 3.0, "ticks")


def test_sessions_needed_predicts_the_interval():
    # the interval at the predicted session count is about as wide as the effect
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 3.0, 12)
    lo, hi = bootstrap_ci(x)
    need = int(sessions_needed(12, lo, hi, effect=1.0))
    widths = []
    for s in range(20):
        y = np.random.default_rng(s + 1).normal(1.0, 3.0, need)
        a, b = bootstrap_ci(y, n_boot=500)
        widths.append((b - a) / 2)
    # measured at 12 sessions the SD estimate is itself noisy; the median half-width at the
    # predicted count is within a factor 1.6 of the effect
    assert 1 / 1.6 < np.median(widths) < 1.6


def test_bootstrap_ci_covers_and_degenerates():
    x = np.random.default_rng(2).normal(5.0, 1.0, 40)
    lo, hi = bootstrap_ci(x)
    assert lo < x.mean() < hi and lo < 5.0 < hi
    assert all(math.isnan(v) for v in bootstrap_ci(np.array([3.0])))
    assert bootstrap_ci(np.array([2.0, 2.0, 2.0])) == (2.0, 2.0)


@pytest.mark.parametrize("n", [4, MIN_SHARPE_SESSIONS])
def test_sharpe_only_with_enough_sessions(n):
    d = np.random.default_rng(n).normal(0.5, 1.0, n)
    r = session_readout(d)
    assert r["sessions"] == n and r["pnl_ci"][0] < r["pnl_per_session"] < r["pnl_ci"][1]
    if n < MIN_SHARPE_SESSIONS:
        assert r["sharpe"] is None and not r["sharpe_reportable"] and "bootstrap" in r["note"]
    else:
        assert r["sharpe"] == pytest.approx(sharpe_stats(d)["sharpe"]) and r["psr"] is not None


def test_balanced_accuracy_by_hand_and_verdicts():
    y = np.array([0, 0, 1, 1, 2, 2, 2, 2])
    pred = np.array([0, 1, 1, 1, 2, 2, 0, 0])  # recalls 1/2, 1, 1/2
    ba, lo, hi = balanced_accuracy_ci(pred, y)
    assert ba == pytest.approx(2 / 3) and lo <= ba <= hi
    import torch

    from alphamodel.rl.c51 import balanced_accuracy
    assert ba == pytest.approx(balanced_accuracy(torch.as_tensor(pred), torch.as_tensor(y)))
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 3000)
    assert not head_verdict(np.ones(3000, np.int64), y)["learns"]  # always one class: 1/3
    assert not head_verdict(rng.integers(0, 3, 3000), y)["learns"]  # guessing
    good = np.where(rng.random(3000) < 0.5, y, rng.integers(0, 3, 3000))  # right half the time
    v = head_verdict(good, y)
    assert v["learns"] and v["interval"][0] > 1 / 3 and "learns" in v["note"]
