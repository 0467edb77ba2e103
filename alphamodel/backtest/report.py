"""What a backtest reports: the summary's notes and aggregate table, the equity plots, and JSON
cleaning of the results."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from alphamodel.backtest.config import NOT_TRIALS, BacktestConfig

__all__ = ["aggregate", "cfg_dict", "clean", "given_model_note", "plots", "standing_notes"]


def clean(x):
    """``x`` as JSON can hold it: keys as strings, tuples as lists, numpy numbers as Python's,
    non-finite floats as None."""
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def given_model_note(model_dir: str, seen: list[str] | None, tests: list[set[str]]) -> str:
    """The note on a given ``--model``: which folds test on sessions it trained or early-stopped on
    (``seen``: its config's ``sessions_seen``; ``tests``: each fold's test sessions)."""
    if seen is None:  # a model saved before the sessions were recorded
        return (f"{model_dir}: one encoder for every fold; the walk-forward is out of sample only if it was "
                "trained on sessions before the first test session (this model does not record its sessions)")
    inside = [(k, sorted(t & set(seen))) for k, t in enumerate(tests) if t & set(seen)]
    if not inside:
        return (f"{model_dir}: one encoder for every fold, trained on {len(seen)} session(s) up to {max(seen)}, "
                "none of them a test session: out of sample")
    return (f"{model_dir}: one encoder for every fold; it trained or early-stopped on test sessions of fold(s) "
            f"{', '.join(str(k) for k, _ in inside)} ({', '.join(s for _, ss in inside for s in ss)}): those "
            "folds are in sample, their results flattered")


def standing_notes(cfg: BacktestConfig, results: list[dict]) -> dict:
    """The summary's notes on how its numbers are made."""
    ran = {r["strategy"] for r in results}
    return {
        "sharpe": "annualised Sharpe of daily (per-session) PnL x sqrt(252); NaN (null) with fewer than 2 test "
                  "sessions in a fold",
        "deflated_sharpe": "Bailey & Lopez de Prado 2014 over the strategies tried at the fold and cost "
                           f"(all but {', '.join(n for n in NOT_TRIALS if n in ran)})",
        "sizing": "Kelly (alphamodel.backtest.metrics)" if cfg.kelly else "unit size (--no-kelly)",
        "embargo_sessions": cfg.embargo}


def cfg_dict(cfg: BacktestConfig) -> dict:
    """``cfg`` as the summary records it."""
    d = dataclasses.asdict(cfg)
    d["costs"] = list(cfg.costs)
    return d


def aggregate(results: list[dict]) -> list[dict]:
    """Per strategy x cost: the mean and SD over the folds of each metric (non-finite values left out)."""
    keys = sorted({(r["strategy"], r["cost_ticks"]) for r in results}, key=lambda x: (x[1], x[0]))
    out = []
    for s, c in keys:
        rs = [r for r in results if r["strategy"] == s and r["cost_ticks"] == c]
        row = {"strategy": s, "cost_ticks": c, "folds": len(rs)}
        for m in ("sharpe", "deflated_sharpe", "win_rate", "trades_per_session", "turnover", "max_drawdown",
                  "pnl_ticks"):
            v = np.array([r[m] for r in rs], float)
            v = v[np.isfinite(v)]
            row[m + "_mean"] = float(v.mean()) if v.size else math.nan
            row[m + "_sd"] = float(v.std(ddof=1)) if v.size > 1 else math.nan
        out.append(row)
    return out


def plots(out: Path, curves: dict, cfg: BacktestConfig) -> list[str]:
    """One equity PNG per fold x cost in ``out`` (``curves``: ``{(fold, cost, strategy): equity}``);
    returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for fold, cost in sorted({(k[0], k[1]) for k in curves}):
        fig, ax = plt.subplots(figsize=(7, 4))
        for (f, c, s), eq in curves.items():
            if f == fold and c == cost:
                ax.plot(np.arange(1, len(eq) + 1), eq, label=s, lw=1.2 if s.startswith("c51") else 0.8,
                        ls=":" if s in NOT_TRIALS else "-")
        ax.set_xlabel(f"decision (every {cfg.stride} rows), test sessions end to end")
        ax.set_ylabel("equity, ticks per contract (marked to mid)")
        ax.set_title(f"fold {fold}, cost {cost:g} tick/side")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        name = f"equity_fold{fold}_cost{cost:g}.png"
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        names.append(name)
    return names
