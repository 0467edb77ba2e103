"""What a backtest or training result can say from the sessions it has: a Sharpe ratio only
where there are enough sessions for one, else PnL per session with a bootstrap interval; and
how many sessions an interval would need to resolve an effect.

* :data:`MIN_SHARPE_SESSIONS`: the annualised Sharpe of daily PnL over ``n`` sessions has a
  standard error of about ``sqrt(252 (1 + SR_d^2 / 2) / n)`` (Lo 2002, i.i.d. returns; SR_d the
  daily Sharpe), i.e. at least 5.0 at n = 10 and 7.1 at n = 5, and its denominator (the sample
  SD) has a relative standard error of ``1 / sqrt(2 (n - 1))``, 33 % at n = 5. Below 10 test
  sessions a fold's Sharpe is reported as not meaningful and PnL per session with its
  bootstrap interval is given instead (:func:`alphamodel.backtest.metrics.session_readout`).

Only numpy and scipy: the lowest layer, for ``alphamodel train`` and ``backtest`` alike.
* :func:`bootstrap_ci`: percentile bootstrap of the mean (Efron & Tibshirani 1993, ch. 13;
  :func:`scipy.stats.bootstrap`), seeded.
* :func:`sessions_needed`: an interval's half-width shrinks as ``1 / sqrt(n)`` (the standard
  error of a mean of i.i.d. sessions), so the half-width ``h`` measured at ``n`` sessions falls
  below an effect ``e`` at about ``n (h / e)^2`` sessions.
* :func:`head_verdict`: whether a K-class head learns: its balanced accuracy (mean per-class
  recall; chance = 1/K whatever the class balance) with a percentile-bootstrap interval over
  the decisions; it learns only when the interval's lower end is above 1/K.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["MIN_SHARPE_SESSIONS", "balanced_accuracy_ci", "bootstrap_ci", "head_verdict", "needed_note",
           "sessions_needed"]

#: Fewest test sessions for a Sharpe ratio to be reported (see the module docstring).
MIN_SHARPE_SESSIONS = 10
#: Bootstrap resamples and the interval's confidence level.
N_BOOT, LEVEL = 2000, 0.95


def bootstrap_ci(x: np.ndarray, level: float = LEVEL, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval ``(lo, hi)`` of the mean of ``x`` (1-D float, NaN ignored):
    ``(nan, nan)`` with fewer than 2 values; ``(v, v)`` when all values equal ``v``."""
    from scipy.stats import bootstrap

    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x)]
    if x.size < 2:
        return math.nan, math.nan
    if np.ptp(x) == 0:
        return float(x[0]), float(x[0])
    r = bootstrap((x,), np.mean, confidence_level=level, n_resamples=n_boot, method="percentile",
                  random_state=np.random.default_rng(seed), vectorized=True)
    return float(r.confidence_interval.low), float(r.confidence_interval.high)


def sessions_needed(n: int, lo: float, hi: float, effect: float | None = None) -> float:
    """Sessions for the interval ``[lo, hi]`` measured over ``n`` sessions to have a half-width
    below ``|effect|`` (default: its centre, i.e. for the interval to exclude 0), assuming the
    ``1 / sqrt(n)`` scaling: ``ceil(n (h / |effect|)^2)``, at least 2. ``math.inf`` when the
    effect is 0 or not finite, NaN when the interval is not finite or ``n < 1``."""
    if n < 1 or not (math.isfinite(lo) and math.isfinite(hi)):
        return math.nan
    e = abs((lo + hi) / 2 if effect is None else effect)
    if not math.isfinite(e) or e == 0:
        return math.inf
    h = (hi - lo) / 2
    return float(max(2, math.ceil(n * (h / e) ** 2 - 1e-9)))


def needed_note(n: int, lo: float, hi: float, unit: str, effect: float | None = None) -> str:
    """One line: the interval at ``n`` sessions and about how many it needs (:func:`sessions_needed`)."""
    need = sessions_needed(n, lo, hi, effect)
    what = "exclude 0" if effect is None else f"fall within +-{abs(effect):g} {unit}"
    if math.isnan(need):
        return f"{n} session(s): no interval (at least 2 needed)"
    if math.isinf(need):
        return (f"{n} sessions: 95% interval [{lo:.3g}, {hi:.3g}] {unit}, centred on 0: no number of sessions "
                "resolves it")
    state = "resolved" if need <= n else f"about {int(need)} sessions for it to {what} (1/sqrt(n) scaling)"
    return f"{n} sessions: 95% interval [{lo:.3g}, {hi:.3g}] {unit}; {state}"


def _balanced(pred: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """Balanced accuracy of each row of ``pred``, ``y`` (B, n) int: the mean over the classes
    present in that row's ``y`` of the recall."""
    rec = []
    for c in range(k):
        m = y == c
        cnt = m.sum(-1)
        hit = (m & (pred == c)).sum(-1)
        rec.append(np.where(cnt > 0, hit / np.maximum(cnt, 1), np.nan))
    return np.nanmean(np.stack(rec), axis=0)


def balanced_accuracy_ci(pred: np.ndarray, y: np.ndarray, k: int = 3, level: float = LEVEL, n_boot: int = N_BOOT,
                         seed: int = 0) -> tuple[float, float, float]:
    """Balanced accuracy (mean per-class recall over the classes present) of predictions
    ``pred`` for labels ``y`` (int arrays (n,), classes 0..k-1) and its percentile-bootstrap
    interval (decisions resampled with replacement): ``(ba, lo, hi)``; NaNs with no decision."""
    pred = np.asarray(pred, np.int64)
    y = np.asarray(y, np.int64)
    if y.size == 0:
        return math.nan, math.nan, math.nan
    ba = float(_balanced(pred[None], y[None], k)[0])
    rng = np.random.default_rng(seed)
    boot = np.concatenate([_balanced(pred[i], y[i], k)
                           for i in (rng.integers(0, y.size, (min(200, n_boot - b), y.size))
                                     for b in range(0, n_boot, 200))])
    a = (1 - level) / 2
    return ba, float(np.nanquantile(boot, a)), float(np.nanquantile(boot, 1 - a))


def head_verdict(pred: np.ndarray, y: np.ndarray, k: int = 3, seed: int = 0) -> dict:
    """Does a K-class head learn? ``{"balanced_accuracy", "interval", "chance", "decisions",
    "learns", "note"}``: it learns when the 95% interval of its balanced accuracy
    (:func:`balanced_accuracy_ci`) lies above chance ``1/k``."""
    ba, lo, hi = balanced_accuracy_ci(pred, y, k, seed=seed)
    chance = 1.0 / k
    learns = bool(math.isfinite(lo) and lo > chance)
    if not math.isfinite(ba):
        note = "no test decision with a label: not measured"
    elif learns:
        note = f"learns: balanced accuracy {ba:.3f}, 95% interval [{lo:.3f}, {hi:.3f}] above chance {chance:.3f}"
    else:
        note = (f"does not learn: balanced accuracy {ba:.3f}, 95% interval [{lo:.3f}, {hi:.3f}] does not exclude "
                f"chance {chance:.3f} from above")
    return {"balanced_accuracy": ba, "interval": [lo, hi], "chance": chance, "decisions": int(np.size(y)),
            "learns": learns, "note": note}
