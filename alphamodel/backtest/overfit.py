"""Probability of backtest overfitting (PBO) by combinatorially symmetric cross-validation (CSCV).

Bailey, Borwein, López de Prado & Zhu (2017), "The probability of backtest overfitting",
Journal of Computational Finance 20(4), section 2:

1. ``M``: a T x N matrix of performance per period (here: PnL per test session) of N trials
   (strategy x configuration pairs tried);
2. the T rows are cut, in order, into ``S`` (even) blocks; every one of the ``C(S, S/2)`` ways
   of choosing S/2 blocks gives a training set ``J`` (those blocks) and a test set ``J̄`` (the
   others), each keeping its rows' order;
3. on each split c the performance statistic (default: Sharpe ratio, mean / SD) of every trial
   on ``J`` (``R``) and on ``J̄`` (``R̄``); ``n*`` = the trial best in sample; ``ω̄_c`` = the
   relative rank of ``R̄[n*]`` among ``R̄``, ``rank / (N + 1)`` (ranks 1..N, ties averaged);
   the logit ``λ_c = ln(ω̄_c / (1 - ω̄_c))``;
4. ``PBO = #{c : λ_c <= 0} / C(S, S/2)``: how often the in-sample best does no better than the
   median trial out of sample. Unskilled trials give PBO near 1/2; a trial with a real edge
   that is chosen in sample and stays above the median out of sample drives it towards 0.

Also the paper's performance degradation (section 2.3): the OLS line of ``R̄[n*]`` on
``R[n*]`` over the splits (a negative slope: what wins in sample loses out of sample) and the
probability of loss ``P(R̄[n*] < 0)``.

Blocks: ``S = 16`` by default; with fewer rows than ``2 S`` (the Sharpe ratio needs two rows
in each half) ``S`` drops to the largest even number with at least two rows per half, i.e.
``2 * (T // 4)`` (so T >= 4 is required; T = 22 test sessions give S = 10). When S does not
divide T, the blocks differ in length by at most one row (:func:`numpy.array_split`).

A trial whose PnL has zero spread on a half (e.g. ``flat``) has Sharpe 0 there if its mean is
0, else +-inf (it always won or always lost): a finite, rankable statistic.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from alphamodel.errors import DataError, UsageError

__all__ = ["DEFAULT_BLOCKS", "PBOResult", "block_count", "pbo", "pbo_section", "plot_logits"]

#: Blocks of the CSCV (the paper's S; its experiments use 16).
DEFAULT_BLOCKS = 16


@dataclass(frozen=True)
class PBOResult:
    """Result of :func:`pbo`.

    pbo : float in [0, 1], the fraction of splits with ``λ_c <= 0``.
    logits : float64 (C,), ``λ_c`` per split, in ``[-ln N, ln N]`` (finite: ``ω̄_c`` lies in
        ``[1/(N+1), N/(N+1)]``).
    is_best, oos_best : float64 (C,), ``R[n*]`` and ``R̄[n*]`` per split (the statistic's units,
        per period: not annualised).
    slope, intercept : the OLS line ``R̄[n*] ≈ intercept + slope R[n*]`` (NaN where the
        ``R[n*]`` do not vary or are not finite).
    prob_loss : fraction of splits with ``R̄[n*] < 0``.
    blocks, splits, trials, rows : S, C(S, S/2), N, T.
    """

    pbo: float
    logits: np.ndarray
    is_best: np.ndarray
    oos_best: np.ndarray
    slope: float
    intercept: float
    prob_loss: float
    blocks: int
    splits: int
    trials: int
    rows: int

    def summary(self) -> dict:
        """A JSON-able dict: everything but the per-split arrays, plus the logits' quartiles."""
        q = np.quantile(self.logits, [0.25, 0.5, 0.75]).tolist() if self.logits.size else []
        return {"pbo": self.pbo, "blocks": self.blocks, "splits": self.splits, "trials": self.trials,
                "sessions": self.rows, "logit_quartiles": q, "degradation_slope": _finite(self.slope),
                "degradation_intercept": _finite(self.intercept), "prob_oos_loss": self.prob_loss,
                "source": "CSCV, Bailey, Borwein, Lopez de Prado & Zhu (2017); statistic: per-session Sharpe"}


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def block_count(rows: int, blocks: int = DEFAULT_BLOCKS) -> int:
    """The S used for ``rows`` periods: ``blocks`` (even, >= 2), or ``2 * (rows // 4)`` when
    there are fewer than two rows per half. Raises alphamodel.errors.DataError when ``rows < 4``, UsageError when
    ``blocks`` is odd or below 2 (both ValueErrors)."""
    if blocks < 2 or blocks % 2:
        raise UsageError("blocks", "out of range: an even number >= 2", blocks)
    if rows < 4:
        raise DataError(f"{rows} periods: too few for CSCV (at least 4, two per half)")
    return min(blocks, 2 * (rows // 4))


def _sharpe(s1: np.ndarray, s2: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Sharpe ratio (ddof 1) from sums ``s1``, sums of squares ``s2`` (C, N) and counts ``n`` (C, 1)."""
    mean = s1 / n
    var = np.maximum(s2 - s1 * mean, 0.0) / (n - 1)
    sd = np.sqrt(var)
    with np.errstate(divide="ignore", invalid="ignore"):
        sr = mean / sd
    tiny = sd <= 1e-12 * np.maximum(1.0, np.abs(mean))
    edge = np.where(np.abs(mean) <= 1e-12, 0.0, np.copysign(np.inf, mean))
    return np.where(tiny, edge, sr)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Row-wise ranks 1..N of ``x`` (C, N), ties averaged."""
    from scipy.stats import rankdata

    return rankdata(x, axis=1, method="average")


def pbo(pnl: np.ndarray, blocks: int = DEFAULT_BLOCKS, statistic: str = "sharpe") -> PBOResult:
    """Probability of backtest overfitting of N trials by CSCV (see the module docstring).

    Parameters
    ----------
    pnl : float array (T, N): performance per period (row, in time order) of each trial
        (column), e.g. PnL per test session in ticks. Finite values only.
    blocks : S, even (default 16); reduced for short T (:func:`block_count`).
    statistic : ``"sharpe"`` (mean / SD per period, the paper's choice) or ``"mean"``.

    Returns
    -------
    PBOResult

    Raises
    ------
    alphamodel.errors.DataError, alphamodel.errors.UsageError (ValueErrors)
        ``pnl`` not 2-D, with fewer than 2 trials or 4 rows, non-finite values, an odd
        ``blocks`` or an unknown ``statistic``.
    """
    m = np.asarray(pnl, np.float64)
    if m.ndim != 2 or m.shape[1] < 2:
        raise DataError(f"pnl of shape {m.shape}: need a 2-D (sessions, trials) matrix with >= 2 trials")
    if not np.isfinite(m).all():
        raise DataError("pnl has non-finite values")
    if statistic not in ("sharpe", "mean"):
        raise UsageError("statistic", "unknown: 'sharpe' or 'mean'", statistic)
    T, N = m.shape
    S = block_count(T, blocks)
    parts = np.array_split(np.arange(T), S)
    cnt = np.array([len(p) for p in parts], np.float64)
    b1 = np.stack([m[p].sum(0) for p in parts])  # (S, N) block sums
    b2 = np.stack([(m[p] ** 2).sum(0) for p in parts])
    combos = list(itertools.combinations(range(S), S // 2))
    ind = np.zeros((len(combos), S))
    for c, blk in enumerate(combos):
        ind[c, list(blk)] = 1.0
    out = 1.0 - ind

    def stat(w: np.ndarray) -> np.ndarray:
        n = (w @ cnt)[:, None]
        return _sharpe(w @ b1, w @ b2, n) if statistic == "sharpe" else (w @ b1) / n

    r_is, r_oos = stat(ind), stat(out)
    best = np.argmax(r_is, axis=1)  # first of tied maxima
    pick = np.arange(len(combos))
    omega = _ranks(r_oos)[pick, best] / (N + 1)
    lam = np.log(omega / (1.0 - omega))
    x, y = r_is[pick, best], r_oos[pick, best]
    ok = np.isfinite(x) & np.isfinite(y)
    slope = intercept = math.nan
    if ok.sum() >= 2 and np.ptp(x[ok]) > 0:
        slope, intercept = (float(v) for v in np.polyfit(x[ok], y[ok], 1))
    return PBOResult(pbo=float(np.mean(lam <= 0)), logits=lam, is_best=x, oos_best=y, slope=slope,
                     intercept=intercept, prob_loss=float(np.mean(y < 0)), blocks=S, splits=len(combos),
                     trials=N, rows=T)


def plot_logits(result: PBOResult, path: str | Path, title: str = "") -> Path:
    """Draw the histogram of the logits ``λ_c`` (PNG, matplotlib's Agg backend) with the PBO
    (the mass at or left of 0) in the title; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    lam = result.logits
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bins = min(40, max(5, int(np.sqrt(lam.size))))
    ax.hist(lam, bins=bins, color="tab:blue", alpha=0.8, density=True)
    ax.axvline(0.0, color="tab:red", lw=1.2, ls="--", label="λ = 0 (median rank out of sample)")
    ax.set_xlabel("λ = logit of the in-sample best's out-of-sample relative rank")
    ax.set_ylabel("density over splits")
    head = f"{title}: " if title else ""
    ax.set_title(f"{head}PBO = {result.pbo:.2f} ({result.trials} trials, {result.rows} sessions, "
                 f"S = {result.blocks}, {result.splits} splits)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def pbo_section(trials: dict[str, np.ndarray], out_dir: str | Path | None = None, name: str = "pbo_logits.png",
                title: str = "", blocks: int = DEFAULT_BLOCKS) -> dict:
    """The ``pbo`` entry of a backtest summary: the PBO of ``trials`` (trial name -> PnL per
    test session, float (T,), the same T sessions in time order for every trial; non-finite
    values count as 0: no trade) with its logit histogram ``out_dir / name`` (when given).

    Returns :meth:`PBOResult.summary` plus ``trial_names`` and ``plot`` (the PNG's name), or
    ``{"pbo": None, "note": ...}`` when there are fewer than 2 trials or 4 sessions."""
    names = sorted(trials)
    if len(names) < 2:
        return {"pbo": None, "note": f"{len(names)} trial(s): the PBO needs at least 2"}
    lens = {len(trials[n]) for n in names}
    if len(lens) != 1:
        raise DataError(f"trials cover different numbers of sessions: {sorted(lens)}")
    m = np.nan_to_num(np.stack([np.asarray(trials[n], np.float64) for n in names], axis=1), nan=0.0,
                      posinf=0.0, neginf=0.0)
    if m.shape[0] < 4:
        return {"pbo": None, "note": f"{m.shape[0]} test session(s): the PBO (CSCV) needs at least 4"}
    res = pbo(m, blocks)
    out = {**res.summary(), "trial_names": names}
    if out_dir is not None:
        plot_logits(res, Path(out_dir) / name, title)
        out["plot"] = name
    return out
