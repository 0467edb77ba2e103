"""What a backtest reports: the summary's notes and aggregate table, the PnL per session pooled
over every fold's test sessions with its interval and the sessions it needs, the probability of
backtest overfitting per cost and fill mode, the K=3 head's verdict, the fill modes, the equity plots, and JSON
cleaning of the results."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from alphamodel.backtest.config import FILL_MODES, NOT_TRIALS, BacktestConfig
from alphamodel.backtest.metrics import session_readout
from alphamodel.backtest.overfit import pbo_section
from alphamodel.readout import MIN_SHARPE_SESSIONS, head_verdict

__all__ = ["FILL_STATS", "aggregate", "cfg_dict", "clean", "fill_description", "fills_note", "given_model_note",
           "head_summary", "pbo_by_cost", "plots", "pooled_readout", "standing_notes"]


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


def fill_description(cfg: BacktestConfig) -> dict:
    """The fill modes of ``cfg`` (``modes``: ``cfg.fills``), what a fill pays in each
    (:func:`fills_note`) and the cost unit."""
    return {"modes": list(cfg.fills), "pays": fills_note(cfg), "cost_unit": "ticks per contract per side"}


def _mode_order(key: tuple) -> tuple:
    s, c, m = key
    return (FILL_MODES.index(m) if m in FILL_MODES else len(FILL_MODES), c, s)


def pooled_readout(daily: dict, seed: int = 0) -> list[dict]:
    """Per strategy x cost x fill mode, the PnL per session (ticks) pooled over every fold's test
    sessions (``daily``: ``{(strategy, cost, mode): PnL per session}``) with its 95% bootstrap
    interval, the sessions its interval needs to exclude 0, and a Sharpe and PSR only with at
    least :data:`~alphamodel.readout.MIN_SHARPE_SESSIONS` sessions
    (:func:`~alphamodel.backtest.metrics.session_readout`)."""
    return [{"strategy": s, "fill": m, "cost_ticks": c, **session_readout(daily[(s, c, m)], seed=seed)}
            for s, c, m in sorted(daily, key=_mode_order)]


def pbo_by_cost(daily: dict, cfg: BacktestConfig, out: Path | None) -> dict:
    """Per fill mode and cost (``{mode: {f"{cost:g}": section}}``), the probability of backtest
    overfitting (CSCV, :func:`~alphamodel.backtest.overfit.pbo_section`) over the strategies tried
    (all but the look-ahead and oracle references), on their PnL per test session of every fold in
    time order (``daily``: ``{(strategy, cost, mode): PnL per session}``); its logit histogram in
    ``out`` (None: no plot): ``pbo_cost{c}.png`` for the first mode, ``pbo_cost{c}_{mode}.png``
    for the others."""
    out_d: dict = {}
    for m in cfg.fills:
        for c in cfg.costs:
            trials = {s: d for (s, cc, mm), d in daily.items() if cc == c and mm == m and s not in NOT_TRIALS}
            name = f"pbo_cost{c:g}" + ("" if m == cfg.fills[0] else f"_{m}") + ".png"
            out_d.setdefault(m, {})[f"{c:g}"] = pbo_section(trials, out, name, f"cost {c:g} tick/side, {m} fills")
    return out_d


def head_summary(aux: list[dict], seed: int = 0) -> dict:
    """The K=3 trade-outcome head's verdict over the folds that trained it, their test decisions
    pooled (:func:`alphamodel.readout.head_verdict`): ``learns`` only when the 95% interval of its
    balanced accuracy lies above 1/3; ``{"available": False}`` when no fold measured it."""
    used = [a for a in aux if a.get("available") and "pred" in a]
    if not used:
        return {"available": False, "note": "the K=3 head was not measured (no tb_label, or aux_weight 0)"}
    v = head_verdict(np.concatenate([a["pred"] for a in used]), np.concatenate([a["labels"] for a in used]), seed=seed)
    v["folds"] = [a["fold"] for a in used]
    if not v["learns"]:
        v["note"] += "; the policy stops training it in the folds after (its loss weight 0)"
    return {"available": True, **v}


def standing_notes(cfg: BacktestConfig, results: list[dict]) -> dict:
    """The summary's notes on how its numbers are made."""
    ran = {r["strategy"] for r in results}
    return {
        "sharpe": f"annualised Sharpe of daily (per-session) PnL x sqrt(252), only in folds with at least "
                  f"{MIN_SHARPE_SESSIONS} test sessions (its standard error is about sqrt(252 / n) annualised: over "
                  "5 at fewer); elsewhere null, and 'pooled' gives PnL per session with its 95% bootstrap interval "
                  "and the sessions the interval needs",
        "pbo": "probability of backtest overfitting per fill mode and cost (CSCV, Bailey, Borwein, Lopez de Prado & "
               f"Zhu 2017) over the strategies tried (all but {', '.join(n for n in NOT_TRIALS if n in ran)}),"
               " on PnL per test session of every fold in time order; 16 blocks, fewer with under 32 sessions",
        "deflated_sharpe": "Bailey & Lopez de Prado 2014 over the strategies tried at the fold, cost and fill mode "
                           f"(all but {', '.join(n for n in NOT_TRIALS if n in ran)})",
        "sizing": "Kelly (alphamodel.backtest.metrics)" if cfg.kelly else "unit size (--no-kelly)",
        "embargo_sessions": cfg.embargo, "fills": fills_note(cfg)}


def fills_note(cfg: BacktestConfig) -> str:
    """What a fill pays in each mode of ``cfg`` (one line)."""
    what = {"taker": "taker: buys at the ask, sells at the bid (half a spread per side) plus the cost",
            "mid": "mid: at the mid plus the cost, an upper bound (no spread paid, no adverse selection)",
            "passive": f"passive: post-only at our best after {cfg.latency_ns} ns, queue {cfg.queue}, partial fills, "
                       f"after {cfg.timeout} rows {'taken at the touch' if cfg.on_timeout == 'cross' else 'cancelled'}"}
    fees = (f"; exchange fees on top: maker {cfg.fee_maker:g} USD, taker {cfg.fee_taker:g} USD per contract per side"
            if cfg.fee_maker or cfg.fee_taker else "")
    return ("cost = ticks per contract per side paid by every fill; " + "; ".join(what[m] for m in cfg.fills)
            + fees + "; every position closes at a session's end at the touch")


def cfg_dict(cfg: BacktestConfig) -> dict:
    """``cfg`` as the summary records it."""
    d = dataclasses.asdict(cfg)
    d["costs"] = list(cfg.costs)
    return d


#: The fill statistics a result row carries (``fill_`` + name, :func:`~alphamodel.backtest.execution.fill_summary`).
FILL_STATS = ("fill_rate", "ttf_rows", "ttf_s", "markout_1", "markout_10", "markout_100")


def aggregate(results: list[dict]) -> list[dict]:
    """Per strategy x fill mode x cost: the mean and SD over the folds of each metric (non-finite
    values left out; ``folds``: the folds that report a Sharpe, ``folds_run``: all)."""
    keys = sorted({(r["strategy"], r["cost_ticks"], r.get("fill", "taker")) for r in results}, key=_mode_order)
    out = []
    for s, c, f in keys:
        rs = [r for r in results if r["strategy"] == s and r.get("fill", "taker") == f and r["cost_ticks"] == c]
        row = {"strategy": s, "fill": f, "cost_ticks": c, "folds": sum(math.isfinite(r["sharpe"]) for r in rs),
               "folds_run": len(rs)}
        for m in ("sharpe", "deflated_sharpe", "win_rate", "trades_per_session", "turnover", "max_drawdown",
                  "pnl_ticks", *(f"fill_{x}" for x in FILL_STATS)):
            v = np.array([r.get(m, math.nan) for r in rs], float)
            v = v[np.isfinite(v)]
            row[m + "_mean"] = float(v.mean()) if v.size else math.nan
            row[m + "_sd"] = float(v.std(ddof=1)) if v.size > 1 else math.nan
        out.append(row)
    return out


def plots(out: Path, curves: dict, cfg: BacktestConfig) -> list[str]:
    """One equity PNG per fold x cost x fill mode in ``out`` (``curves``: ``{(fold, cost,
    strategy, mode): equity}``; the first mode's files are ``equity_fold{f}_cost{c}.png``, the
    others' end in ``_{mode}``); returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for fold, cost, mode in sorted({(k[0], k[1], k[3]) for k in curves}):
        fig, ax = plt.subplots(figsize=(7, 4))
        for (f, c, s, m), eq in curves.items():
            if f == fold and c == cost and m == mode:
                ax.plot(np.arange(1, len(eq) + 1), eq, label=s, lw=1.2 if s.startswith("c51") else 0.8,
                        ls=":" if s in NOT_TRIALS else "-")
        ax.set_xlabel(f"decision (every {cfg.stride} rows), test sessions end to end")
        ax.set_ylabel("equity, ticks per contract (marked to mid)")
        bound = " (upper bound: no spread, no adverse selection)" if mode == "mid" else ""
        ax.set_title(f"fold {fold}, cost {cost:g} tick/side, {mode} fills{bound}", fontsize=9)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        name = f"equity_fold{fold}_cost{cost:g}" + ("" if mode == cfg.fills[0] else f"_{mode}") + ".png"
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        names.append(name)
    return names
