"""What ``alphamodel train`` reports: evaluation records with session-bootstrap intervals, the
model's lift over the best baseline, the pooled per-horizon table, the warnings, the plots."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from alphamodel.supervised.config import TrainConfig
from alphamodel.supervised.evaluation import bootstrap_aucs, percentile_interval, session_groups
from alphamodel.supervised.metrics import base_rate

__all__ = ["lift", "nan_none", "per_horizon", "plots", "records", "warnings_of"]


def plots(out: Path, history: list[dict], horizons: list[int]) -> list[str]:
    """``loss.png`` (training and validation loss per epoch) and ``auc.png`` (validation AUC per
    horizon per epoch) in ``out``; returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = [h["epoch"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ep, [h["train_loss"] for h in history], "o-", label="train")
    ax.plot(ep, [h["val_loss"] for h in history], "o-", label="validation")
    ax.set_xlabel("epoch")
    ax.set_ylabel("masked BCE (weighted over horizons)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for j, h in enumerate(horizons):
        ax.plot(ep, [e["val_auc"][j] for e in history], "o-", label=f"h={h}")
    ax.axhline(0.5, color="grey", lw=0.8)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation AUC")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "auc.png", dpi=100)
    plt.close(fig)
    return ["loss.png", "auc.png"]


def nan_none(x: float) -> float | None:
    """``x`` as a float, or None when it is None or not finite (JSON's null)."""
    return None if x is None or not math.isfinite(x) else float(x)


def records(fold: str | int, rows: np.ndarray, y: np.ndarray, scores: dict[str, np.ndarray],
             sessions: np.ndarray, horizons: list[int], tc: TrainConfig, lifts: dict | None = None,
             strata: np.ndarray | None = None) -> list[dict]:
    """Evaluation records of every model on one block (or the pooled test blocks, with the fold
    of each row as ``strata``: pairs compared within a fold), and (``lifts``) the model's lift
    over the best baseline per horizon with its paired-bootstrap interval (:func:`lift`: never
    below chance)."""
    groups, unit = session_groups(sessions[rows])
    names = list(scores)
    recs = []
    for j, h in enumerate(horizons):
        mat = np.stack([scores[n][:, j] for n in names], axis=1)
        point, reps = bootstrap_aucs(mat, y[:, j], groups, tc.n_boot, tc.seed + j, strata)
        n = int((~np.isnan(y[:, j])).sum())
        for k, name in enumerate(names):
            lo, hi = percentile_interval(reps[:, k]) if len(reps) else (math.nan, math.nan)
            recs.append({"model": name, "fold": fold, "horizon": h, "auc": nan_none(point[k]),
                         "auc_ci_low": nan_none(lo), "auc_ci_high": nan_none(hi), "n": n,
                         "base_rate": nan_none(base_rate(y[:, j])), "bootstrap_unit": unit})
        if lifts is not None and np.isfinite(point[0]):
            lifts[h] = lift(names, point, reps)
    return recs


def lift(names: list[str], point: np.ndarray, reps: np.ndarray) -> dict:
    """The lift of the model (column 0) over the best baseline, with its paired-bootstrap
    interval. The bar is at least chance: a constant score (the base rate) has AUC 0.5 whether or
    not its own AUC could be computed (a fold without training labels leaves it NaN), so no
    baseline scoring below 0.5 is the bar."""
    cand = [k for k, nm in enumerate(names) if nm not in ("alphamodel", "base_rate") and np.isfinite(point[k])]
    kb = max(cand, key=lambda k: point[k], default=None)
    if kb is None or point[kb] < 0.5:
        best, bar, bar_reps = "base_rate", 0.5, 0.5
    else:
        best, bar, bar_reps = names[kb], float(point[kb]), reps[:, kb]
    lo, hi = percentile_interval(reps[:, 0] - bar_reps) if len(reps) else (math.nan, math.nan)
    return {"best_baseline": best, "lift": float(point[0] - bar), "lift_ci_low": nan_none(lo),
            "lift_ci_high": nan_none(hi)}


def warnings_of(evaluation: list[dict], fold_info: list[dict], horizons: list[int], tc: TrainConfig,
                n_folds: int, n_sessions: int, skipped: dict[str, str]) -> list[str]:
    """The summary's warnings: fewer folds than asked, blocks without an AUC, skipped baselines,
    intervals that resample rows rather than sessions, horizons whose training rows hold one class."""
    warnings = []
    if n_folds < tc.folds:
        warnings.append(f"folds: {tc.folds} asked, {n_folds} made: {n_sessions} "
                        f"session(s) give at most that many walk-forward folds (folds + 2 blocks)")
    for r in evaluation:
        if r["model"] == "alphamodel" and r["auc"] is None:
            warnings.append(f"fold {r['fold']} horizon {r['horizon']}: no AUC for the model "
                            f"({r['n']} labels, base rate {r['base_rate']}): one class only or no label in the block")
        elif r["model"] not in ("alphamodel", "ceiling") and r["fold"] == "all" and r["auc"] is None:
            warnings.append(f"horizon {r['horizon']}: no AUC for the {r['model']} baseline: one class only in its "
                            "training or test rows")
    for name, why in skipped.items():
        warnings.append(f"baseline {name} skipped: {why}")
    unit = next((r["bootstrap_unit"] for r in evaluation if r.get("bootstrap_unit") not in (None, "session")), None)
    if unit is not None:
        warnings.append(f"the 95% intervals resample by {unit}: fewer than 20 test sessions, and rows within a "
                        "session are dependent (overlapping label horizons, one market day), so the intervals "
                        "are too narrow; 20+ test sessions give session-level intervals")
    for f in fold_info:  # a horizon the training rows hold one class of: scores there learned nothing
        for h in horizons:
            n, pos = f["train"][f"labels_h{h}"], f["train"][f"positives_h{h}"]
            if pos in (0, n):
                warnings.append(f"fold {f['fold']} horizon {h}: the training rows hold "
                                f"{'no' if n == 0 else 'one class of'} label ({n} labels, {pos} up): the model's and "
                                "the MLP's scores there learned nothing from them")
    return warnings


def per_horizon(evaluation: list[dict], y: np.ndarray, horizons: list[int], last_fold: dict, lifts: dict) -> list[dict]:
    """The pooled table, one row per horizon: test labels, base rates, each model's AUC with its
    interval, the lift over the best baseline (``y``: the pooled test labels (M, H))."""
    out = []
    for j, h in enumerate(horizons):
        row = {"horizon": h, "n_test": int((~np.isnan(y[:, j])).sum()), "base_rate_test": nan_none(base_rate(y[:, j])),
               "base_rate_train": last_fold["train"][f"positives_h{h}"] / max(1, last_fold["train"][f"labels_h{h}"])}
        for r in evaluation:
            if r["fold"] == "all" and r["horizon"] == h:
                key = "model" if r["model"] == "alphamodel" else r["model"]
                row[f"auc_{key}"] = r["auc"]
                row[f"auc_{key}_ci"] = [r["auc_ci_low"], r["auc_ci_high"]]
        row.update(lifts.get(h, {"best_baseline": None, "lift": None, "lift_ci_low": None, "lift_ci_high": None}))
        out.append(row)
    return out


def add_sessions_needed(per_h: list[dict], n_test_sessions: int) -> None:
    """Per horizon row of the pooled table (:func:`per_horizon`), ``sessions_needed``: about how
    many test sessions the lift's 95% interval needs to exclude 0 (its half-width shrinking as
    1/sqrt(sessions) from the ``n_test_sessions`` it has; :func:`alphamodel.readout.sessions_needed`),
    None without an interval."""
    from alphamodel.readout import sessions_needed

    for row in per_h:
        lo, hi = row.get("lift_ci_low"), row.get("lift_ci_high")
        row["sessions_needed"] = None if lo is None or hi is None else sessions_needed(n_test_sessions, lo, hi)
