"""Baselines scored on the same rows and folds as the model (``alphamodel train`` runs them all).

* ``base_rate`` — the training block's fraction of ups, a constant score: AUC 0.5 by
  construction, reported so that a table always has its floor;
* ``logistic`` — logistic regression (scikit-learn, L2, C = 1) on *all* the model's input
  features of the current row (normalised as the model's inputs);
* ``lightgbm`` — gradient-boosted trees (LightGBM, the optional extra ``lightgbm``) on the same
  features; skipped, with the reason in the summary, when the package is absent;
* ``mlp`` — a two-layer perceptron (PyTorch) on the current row, all horizons at once;
* ``ceiling`` — the generator's AUC ceiling per horizon, when the cache was built from
  ``alphafeat synth`` output (its ``synth-report.json`` beside the source files recorded in the
  manifest; see :func:`alphafeat.synth.auc_ceiling`): the best AUC any model can reach there.

Every fit uses the training block only (a seeded subset of at most ``max_rows`` rows).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from alphamodel.data.cache import CacheData, Normaliser

log = logging.getLogger(__name__)

__all__ = ["baseline_inputs", "ceiling_note", "fit_logistic", "fit_lightgbm", "fit_mlp", "generator_ceiling",
           "lightgbm_missing"]


def baseline_inputs(data: CacheData, train_rows: np.ndarray, test_rows: np.ndarray, max_rows: int, seed: int,
                    norm: Normaliser | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The baselines' inputs: ``(x_train (n, F) float32, y_train (n, H) float32 with NaN,
    x_test (m, F) float32)``, features normalised, of at most ``max_rows`` of the sorted global
    ``train_rows`` (a sorted random subset drawn with ``seed``) and of ``test_rows``. ``norm``:
    the model's normaliser; None fits one on the chosen training rows (``seed``)."""
    if train_rows.size > max_rows:
        train_rows = np.sort(np.random.default_rng(seed).choice(train_rows, max_rows, replace=False))
    if norm is None:
        norm = data.fit_normaliser(train_rows, seed=seed)
    x_tr, y_tr = data.gather(train_rows, norm.names)
    return norm(x_tr), y_tr, norm(data.gather(test_rows, norm.names)[0])


def _subset(x: np.ndarray, y: np.ndarray, max_rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    ok = ~np.isnan(y)
    x, y = x[ok], y[ok]
    if len(y) > max_rows:
        pick = np.sort(np.random.default_rng(seed).choice(len(y), max_rows, replace=False))
        x, y = x[pick], y[pick]
    return x, y


def fit_logistic(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, max_rows: int = 200_000,
                 seed: int = 0) -> np.ndarray:
    """Logistic regression on one horizon. x (n, F) normalised, y (n,) 1/0/NaN -> scores (m,)
    float64 (NaN everywhere when the training labels hold one class)."""
    from sklearn.linear_model import LogisticRegression

    xt, yt = _subset(x_train, y_train, max_rows, seed)
    if len(np.unique(yt)) < 2:
        return np.full(len(x_test), np.nan)
    clf = LogisticRegression(C=1.0, max_iter=500)
    clf.fit(xt, yt.astype(int))
    return clf.predict_proba(x_test)[:, 1]


def lightgbm_missing() -> str | None:
    """None when LightGBM imports, else the reason it is skipped."""
    try:
        import lightgbm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means "skip, say why"
        return f"lightgbm not installed ({type(e).__name__}): pip install -e '.[lightgbm]'"
    return None


def fit_lightgbm(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, max_rows: int = 200_000,
                 seed: int = 0, threads: int = 1) -> np.ndarray:
    """Gradient-boosted trees on one horizon (200 trees of 31 leaves, learning rate 0.05,
    row/feature subsampling 0.8, min 100 rows per leaf). Shapes as :func:`fit_logistic`."""
    import lightgbm as lgb

    xt, yt = _subset(x_train, y_train, max_rows, seed)
    if len(np.unique(yt)) < 2:
        return np.full(len(x_test), np.nan)
    clf = lgb.LGBMClassifier(n_estimators=200, num_leaves=31, learning_rate=0.05, subsample=0.8,
                             subsample_freq=1, colsample_bytree=0.8, min_child_samples=100,
                             random_state=seed, n_jobs=threads, verbose=-1)
    clf.fit(xt, yt.astype(int))
    return clf.predict_proba(x_test)[:, 1]


def fit_mlp(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, max_rows: int = 200_000,
            seed: int = 0, epochs: int = 8, hidden: int = 64) -> np.ndarray:
    """Two hidden layers of ``hidden`` SiLU units on the current row, every horizon at once
    (masked BCE, Adam 1e-3, batches of 512). x (n, F), y (n, H) 1/0/NaN -> probabilities (m, H)."""
    import torch

    from alphamodel.nn.model import masked_bce_loss

    ok = ~np.isnan(y_train).all(axis=1)
    xt, yt = x_train[ok], y_train[ok]
    if len(yt) > max_rows:
        pick = np.sort(np.random.default_rng(seed).choice(len(yt), max_rows, replace=False))
        xt, yt = xt[pick], yt[pick]
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    f, h = x_train.shape[1], y_train.shape[1]
    net = torch.nn.Sequential(torch.nn.Linear(f, hidden), torch.nn.SiLU(), torch.nn.Linear(hidden, hidden),
                              torch.nn.SiLU(), torch.nn.Linear(hidden, h))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    X, Y = torch.from_numpy(xt.astype(np.float32)), torch.from_numpy(yt.astype(np.float32))
    for _ in range(epochs):
        for idx in torch.randperm(len(X), generator=g).split(512):
            loss = masked_bce_loss(net(X[idx]), Y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        out = torch.sigmoid(net(torch.from_numpy(x_test.astype(np.float32)))).numpy()
    return out.astype(np.float64)


def generator_ceiling(manifest: dict) -> tuple[dict[int, float], str | None]:
    """The generator's AUC ceiling per horizon (snapshots) and the report it came from.

    Looks for ``synth-report.json`` (:data:`alphafeat.synth.REPORT_NAME`) in the directories of
    the cache's source files (manifest ``sources``). Returns ``({}, None)`` when there is none
    (a cache of real data).
    """
    from alphafeat.synth import REPORT_NAME

    dirs = []
    for src in manifest.get("sources", []):
        d = Path(src.get("path", "")).parent
        if d not in dirs:
            dirs.append(d)
    for d in dirs:
        p = d / REPORT_NAME
        if p.is_file():
            try:
                rep = json.loads(p.read_text())
                auc = rep["auc_ceiling"]["auc"]
                return {int(h): float(v) for h, v in auc.items() if v is not None}, str(p)
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("%s: no AUC ceiling read (%s)", p, e)
    return {}, None


def ceiling_note(path: str | None) -> str | None:
    """Where the generator's AUC ceiling (:func:`generator_ceiling`, read from ``path``) comes
    from, in one line: its method, session, saved states and paths, and its 95% interval per
    horizon; None without a ceiling. A model's AUC above the ceiling is within the two
    intervals' noise (the model's over its test sessions, the ceiling's over the saved states
    of one session), not a model beating the true model."""
    if path is None:
        return None
    try:
        c = json.loads(Path(path).read_text())["auc_ceiling"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ci = c.get("interval_95") or {}
    ivs = ", ".join(f"{h}: [{v[0]:.3f}, {v[1]:.3f}]" for h, v in ci.items() if isinstance(v, (list, tuple)) and
                    len(v) == 2 and None not in v)
    return (f"generator ceiling from {path}: Monte-Carlo continuations under the true model of {c.get('states')} saved "
            f"states of one session ({c.get('session')}, {c.get('instrument')}), paths per state by horizon "
            f"{c.get('paths_per_state')}; 95% interval over the states by horizon {{{ivs}}}. It is an estimate on "
            "that session: a model above it is within the two intervals (the model's over its test sessions, the "
            "ceiling's over its states), not above the true model")
