"""A strategy's metrics: Sharpe-ratio statistics of its PnL (annualised, probabilistic and
deflated), and its Kelly position size.

Sharpe ratios.

Conventions and sources:

* per-period Sharpe ``SR = mean(x) / std(x, ddof=1)`` of a PnL series (no risk-free rate:
  futures PnL is already excess); NaN with fewer than 2 values or zero spread;
* annualised Sharpe of **daily** PnL: ``SR_daily * sqrt(252)`` (Lo 2002; serial correlation can
  overstate it, so :func:`sharpe_stats` also reports the lag-1 autocorrelation);
* probabilistic Sharpe ratio (Bailey & López de Prado 2012)
  ``PSR(SR*) = Phi((SR - SR*) sqrt(n - 1) / sqrt(1 - g3 SR + (g4 - 1) / 4 SR^2))`` with the
  sample skewness ``g3`` and (non-excess) kurtosis ``g4`` of the series;
* deflated Sharpe ratio (Bailey & López de Prado 2014): ``DSR = PSR(SR*)`` with
  ``SR* = sqrt(V) ((1 - gE) Phi^-1(1 - 1/N) + gE Phi^-1(1 - 1/(N e)))``, the expected maximum
  Sharpe of ``N`` unskilled trials whose Sharpe ratios have variance ``V`` (gE = Euler's
  constant). With ``N < 2`` trials ``SR* = 0`` (DSR = PSR(0)).

All Sharpe ratios passed between these functions are per period (not annualised).

Regime-volatility Kelly position sizing (:func:`kelly_size`). For a bet whose PnL per contract
over the holding horizon has mean ``mu`` and variance ``sigma^2``, the growth-optimal (Kelly)
exposure is ``f* = mu / sigma^2`` times the capital (Kelly 1956; the continuous-time form ``f* =
mu / sigma^2`` of Merton 1969 and Thorp 2006, "The Kelly criterion in blackjack, sports betting
and the stock market", section 7). Here:

    size = clip(k * edge / sigma^2, 0, max_size)      (contracts, fractional)

* ``edge`` — the policy's expected PnL of the chosen direction over its return horizon minus
  that of staying flat, from the C51 means (ticks per contract);
* ``sigma^2 = rv^2 * horizon_s`` — the variance of the mid over the same horizon from the
  regime volatility ``rv``: the cache's irregular-time EMA of realised volatility
  (``realized_vol_*``, ticks / sqrt(s), Andersen & Bollerslev 1998) at the decision row, and
  ``horizon_s`` the mean duration of the horizon in seconds measured on the *training*
  sessions; floored at ``var_floor`` ticks^2 (a quiet book or a NaN volatility does not blow
  the size up);
* ``k`` — capital times the Kelly fraction, in ticks (fractional Kelly: the full fraction is
  known to be too aggressive under estimation error, MacLean, Thorp & Ziemba 2010).

Sizes are fractional contracts (a scale of exposure; round them for live trading). Unit size
(``--no-kelly``) is the plain ``{-1, 0, +1}`` policy.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.stats import kurtosis, norm, skew

from alphamodel.readout import MIN_SHARPE_SESSIONS, bootstrap_ci, sessions_needed

__all__ = ["session_readout", "sharpe", "psr", "expected_max_sharpe", "deflated_sharpe", "max_drawdown", "sharpe_stats",
           "TRADING_DAYS", "kelly_size"]

TRADING_DAYS = 252
EULER_GAMMA = 0.5772156649015329


def sharpe(x: np.ndarray) -> float:
    """Per-period Sharpe ratio of ``x`` (1-D float): mean / sample SD; NaN if undefined."""
    x = np.asarray(x, np.float64)
    if x.size < 2:
        return math.nan
    sd = float(np.std(x, ddof=1))
    return float(np.mean(x)) / sd if sd > 0 else math.nan


def psr(sr: float, n: int, g3: float, g4: float, sr_star: float = 0.0) -> float:
    """Probabilistic Sharpe ratio ``P(true SR > sr_star)`` (Bailey & López de Prado 2012).

    ``sr``, ``sr_star`` per period; ``n`` observations; ``g3`` skewness; ``g4`` kurtosis (3 for
    a normal). NaN when ``sr`` is NaN, ``n < 2`` or the variance term is not positive.
    """
    if not math.isfinite(sr) or n < 2:
        return math.nan
    var = 1.0 - g3 * sr + (g4 - 1.0) / 4.0 * sr * sr
    if not var > 0:
        return math.nan
    return float(norm.cdf((sr - sr_star) * math.sqrt(n - 1) / math.sqrt(var)))


def expected_max_sharpe(var_trials: float, n_trials: int) -> float:
    """``SR*``: expected maximum per-period Sharpe of ``n_trials`` unskilled trials with variance
    ``var_trials`` of their Sharpe ratios (Bailey & López de Prado 2014, eq. for the DSR); 0 when
    ``n_trials < 2`` or the variance is not finite."""
    if n_trials < 2 or not math.isfinite(var_trials):
        return 0.0
    return math.sqrt(max(var_trials, 0.0)) * (
        (1 - EULER_GAMMA) * norm.ppf(1 - 1 / n_trials) + EULER_GAMMA * norm.ppf(1 - 1 / (n_trials * math.e)))


def deflated_sharpe(x: np.ndarray, trial_sharpes: np.ndarray) -> float:
    """Deflated Sharpe ratio of the PnL series ``x`` among trials with per-period Sharpe ratios
    ``trial_sharpes`` (NaN entries ignored; ``x``'s own configuration is one of them)."""
    x = np.asarray(x, np.float64)
    t = np.asarray(trial_sharpes, np.float64)
    t = t[np.isfinite(t)]
    sr_star = expected_max_sharpe(float(np.var(t, ddof=1)) if t.size > 1 else math.nan, int(t.size))
    g3, g4 = _moments(x)
    return psr(sharpe(x), x.size, g3, g4, sr_star)


def _moments(x: np.ndarray) -> tuple[float, float]:
    if x.size < 3 or np.std(x) == 0:
        return 0.0, 3.0
    return float(skew(x)), float(kurtosis(x, fisher=False))


def max_drawdown(equity: np.ndarray) -> float:
    """Largest peak-to-trough fall of a cumulative PnL curve (same units; >= 0), the curve
    starting from 0."""
    e = np.concatenate([[0.0], np.asarray(equity, np.float64)])
    return float(np.max(np.maximum.accumulate(e) - e))


def sharpe_stats(daily: np.ndarray, trial_sharpes: np.ndarray | None = None) -> dict:
    """Statistics of a daily PnL series: ``sharpe`` (annualised, x sqrt(252)), ``sharpe_daily``,
    ``psr`` (PSR(0)), ``deflated_sharpe`` (needs ``trial_sharpes``, per period), ``autocorr1``."""
    d = np.asarray(daily, np.float64)
    sr = sharpe(d)
    g3, g4 = _moments(d)
    ac = float(np.corrcoef(d[:-1], d[1:])[0, 1]) if d.size > 2 and np.std(d[:-1]) > 0 and np.std(d[1:]) > 0 \
        else math.nan
    return {"sharpe": sr * math.sqrt(TRADING_DAYS), "sharpe_daily": sr, "psr": psr(sr, d.size, g3, g4),
            "deflated_sharpe": deflated_sharpe(d, trial_sharpes) if trial_sharpes is not None else math.nan,
            "autocorr1": ac}


def kelly_size(edge: torch.Tensor, rv: torch.Tensor, horizon_s: float, k: float = 2.0, max_size: float = 2.0,
               var_floor: float = 0.25) -> torch.Tensor:
    """``clip(k * edge / max(rv^2 * horizon_s, var_floor), 0, max_size)``.

    edge : (N,) ticks per contract. rv : (N,) ticks / sqrt(s) (NaN reads as 0, hence the floor).
    Returns (N,) float32 contracts.
    """
    var = torch.nan_to_num(rv.float(), nan=0.0).square() * float(horizon_s)
    return (k * edge.float() / var.clamp_min(var_floor)).clamp(0.0, max_size)


def session_readout(daily: np.ndarray, min_sessions: int = MIN_SHARPE_SESSIONS, seed: int = 0) -> dict:
    """What a fold's per-session PnL ``daily`` (1-D float, one value per test session, any unit)
    can report: always ``pnl_per_session`` (mean), its 95% bootstrap interval ``pnl_ci`` and
    ``sessions_needed`` (for the interval to exclude 0); ``sharpe`` (annualised,
    :func:`sharpe_stats`) and ``psr`` only when there are at least
    ``min_sessions`` sessions (``sharpe_reportable``), else None with the reason in ``note``."""
    d = np.asarray(daily, np.float64)
    n = int(d.size)
    lo, hi = bootstrap_ci(d, seed=seed)
    out = {"sessions": n, "pnl_per_session": float(d.mean()) if n else math.nan, "pnl_ci": [lo, hi],
           "sessions_needed": sessions_needed(n, lo, hi), "sharpe_reportable": n >= min_sessions,
           "sharpe": None, "psr": None, "note": ""}
    if n >= min_sessions:
        st = sharpe_stats(d)
        out.update(sharpe=st["sharpe"], psr=st["psr"])
    else:
        out["note"] = (f"{n} test session(s) < {min_sessions}: a Sharpe ratio would not mean anything (its standard "
                       f"error is about {math.sqrt(252 / max(n, 1)):.0f} annualised); PnL per session with its 95% "
                       "bootstrap interval instead")
    return out
