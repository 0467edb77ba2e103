"""Training and evaluation: walk-forward folds over sessions, stateful context, baselines.

:func:`train` is what ``alphamodel train`` runs. Steps:

1. open the cache (:class:`alphamodel.data.cache.CacheData`, memory-mapped) and check it: labels
   and every input column present in every partition (one line, before any training);
2. cut the sessions into walk-forward folds (:func:`alphamodel.supervised.evaluation.walk_forward_folds`:
   expanding training block, a validation block for early stopping, then the test block;
   labels purged per horizon with :func:`alphafeat.splits.purge`, plus an embargo);
3. per fold: fit the normalisation on the training rows only; train on windows of K rows
   (``context="stateful"``: B streams walk consecutive windows of a session and carry the
   model's state between them, truncated back-propagation; ``"window"``: independent random
   windows), AdamW, warm-up + cosine, bf16 autocast on CUDA (SSD scan and CfC state in fp32,
   TF32 matmuls), gradient clipping; the loss going NaN stops the run with its step;
   after each epoch the *whole* validation block is scored; early stopping on its loss keeps
   the best weights;
4. per fold, on the test block: the model and the baselines (:mod:`alphamodel.supervised.baselines`,
   fitted on the same training rows) scored on the same rows; AUC per horizon with a
   session-bootstrap 95% interval (:func:`alphamodel.supervised.evaluation.bootstrap_aucs`), and the
   same pooled over every fold's test block (``fold = "all"``; pairs of rows are compared
   within a fold only, as each fold's model scores on its own level); the model's lift over the best
   baseline per horizon with its paired-bootstrap interval;
5. ``summary.json`` (``evaluation``: one record per model × fold × horizon; ``folds``: rows,
   sessions, labels and positives per block), PNG curves, and the last fold's model
   (``model.safetensors`` + ``config.json``).

A CPU run is repeatable: the same seed and thread count give the same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from alphafeat.cache import check_folder
from alphamodel.data.cache import Batch, CacheData, Normaliser, Window
from alphamodel.errors import DataError as TrainDataError
from alphamodel.errors import TrainingError
from alphamodel.errors import UsageError as TrainUsageError
from alphamodel.nn.model import AlphaModel, ModelConfig, ModelState, horizon_weights, masked_bce_loss
from alphamodel.nn.optim import param_groups
from alphamodel.supervised import baselines as bl
from alphamodel.supervised.checkpoint import check_device, resolve_device, save_model
from alphamodel.supervised.config import BASELINES, TrainConfig
from alphamodel.supervised.evaluation import Fold, block_stats, walk_forward_folds
from alphamodel.supervised.metrics import auc, base_rate
from alphamodel.supervised.outputs import staged_outputs
from alphamodel.supervised.report import add_sessions_needed, nan_none, per_horizon, plots, records, warnings_of
from alphamodel.supervised.scoring import fit_input_ema, score_rows, to_device

log = logging.getLogger(__name__)

__all__ = ["Streams", "compile_model", "label_counts", "train"]


def compile_model(model: AlphaModel) -> AlphaModel:
    """``torch.compile`` each Mamba2 block in place, and the chunk body of the CfC's fused scan
    (:meth:`alphamodel.nn.cfc.CfC.compile_scan`; the loop reference compiles its cell, the Triton
    scan the CfC's forward around its kernels)."""
    for blk in model.blocks:
        blk.compile()
    if model.cfc.impl == "fused":
        model.cfc.compile_scan()
    elif model.cfc.impl == "triton":
        model.cfc.compile()
    else:
        model.cfc.cell.compile()
    return model


def label_counts(data: CacheData, keep: np.ndarray) -> dict[str, dict[str, int]]:
    """Labels (not rows) per horizon that purging kept and hid: ``labels_kept_after_purge``
    and ``labels_purged`` (hidden by purging or by the embargo), ``{"h30": count, ...}``. A row
    whose label is NaN (tie, end of session, crossed book) counts in neither. The cache's labels
    are read as stored (a mask set with :meth:`~alphamodel.data.cache.CacheData.set_label_mask` does
    not change the counts)."""
    y = np.concatenate([np.stack(s.labels, axis=-1) for s in data.segments])
    has = ~np.isnan(y)
    hs = [f"h{h}" for h in data.horizons]
    return {"labels_kept_after_purge": dict(zip(hs, (has & keep).sum(0).tolist())),
            "labels_purged": dict(zip(hs, (has & ~keep).sum(0).tolist()))}


def _lr_lambda(warmup: int, total: int, min_frac: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * p))
    return f


class Streams:
    """Training windows for stateful truncated back-propagation.

    ``batch`` streams each walk consecutive windows of K rows through a run of training rows
    (one session), starting at a random row of a random run (runs drawn by length); a stream
    whose run has fewer than K rows left starts a new one, and its state is reset. The first
    window after a reset scores positions ``>= burn_in`` only. With ``stateful=False`` every
    window is a fresh random one (the state is never carried).
    """

    def __init__(self, data: CacheData, rows: np.ndarray, tc: TrainConfig, rng: np.random.Generator,
                 stateful: bool) -> None:
        self.K, self.burn_in, self.rng, self.stateful = tc.window, tc.burn_in, rng, stateful
        self.runs = [(s, a, b) for s, a, b in data.runs(rows) if b - a >= self.K]
        if not self.runs:
            raise TrainDataError(f"no run of {self.K} consecutive training rows; use a shorter --window", data.root)
        span = np.array([b - a - self.K + 1 for _, a, b in self.runs], np.float64)
        self.p = span / span.sum()
        B = tc.batch_size
        self.seg = np.zeros(B, np.int64)
        self.cur = np.zeros(B, np.int64)
        self.end = np.zeros(B, np.int64)  # cur + K > end: start a new run

    def next(self) -> tuple[list[Window], np.ndarray]:
        """The next window of each stream and the (B,) bool of streams whose state restarts."""
        fresh = (self.cur + self.K > self.end) | (not self.stateful)
        wins = []
        for i in range(self.seg.size):
            if fresh[i]:
                s, a, b = self.runs[int(self.rng.choice(len(self.runs), p=self.p))]
                self.seg[i], self.cur[i], self.end[i] = s, int(self.rng.integers(a, b - self.K + 1)), b
            c = int(self.cur[i])
            wins.append(Window(int(self.seg[i]), c, c + self.K, self.burn_in if fresh[i] else 0))
            self.cur[i] += self.K
        return wins, fresh


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p.astype(np.float64), 1e-12, 1 - 1e-12)
    return np.log(p / (1 - p))


@dataclass
class _FoldRun:
    """What training one fold leaves: the model with its best weights, its history, sizes."""

    model: AlphaModel
    history: list[dict]
    best_epoch: int
    n_params: int


def _loss_value(loss: torch.Tensor, step: int, epoch: int, last: tuple[float, int] | None) -> float:
    v = float(loss.detach())
    if not math.isfinite(v):
        before = f"last finite loss {last[0]:.6g} at step {last[1]}" if last else "no finite loss before it"
        raise TrainingError(f"training diverged: loss is {v} at step {step} (epoch {epoch}); {before}; "
                            "lower the learning rate (train.lr) or check the inputs")
    return v


@dataclass
class _Loop:
    """One fold's optimisation between steps: the model (``fwd`` its compiled form), AdamW and its
    schedule, the horizons' loss weights, the carried state, the step count and the last finite
    loss ``(value, step)``."""

    model: AlphaModel
    fwd: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    weights: torch.Tensor
    state: ModelState | None = None
    step: int = 0
    last: tuple[float, int] | None = None


def _make_loop(data: CacheData, fold: Fold, norm: Normaliser, mc: ModelConfig, tc: TrainConfig,
               device: torch.device) -> _Loop:
    """A fresh model for ``fold`` (seeded by ``tc.seed + fold.index``; its input EMA fitted on the
    training rows), AdamW with warm-up + cosine."""
    torch.manual_seed(tc.seed + fold.index)
    model = AlphaModel(mc)
    fit_input_ema(model, data, fold.train, norm)
    model = model.to(device)
    fwd = compile_model(model) if tc.compile else model
    weights = horizon_weights(data.horizons, tc.window, tc.horizon_weighting).to(device)
    opt = torch.optim.AdamW(param_groups(model, tc.weight_decay), lr=tc.lr)
    total = tc.epochs * tc.steps_per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(tc.warmup_steps, total, tc.min_lr_frac))
    return _Loop(model, fwd, opt, sched, weights)


def _step(loop: _Loop, batch: Batch, fresh: np.ndarray, tc: TrainConfig, device: torch.device, epoch: int) -> float:
    """One optimiser step on ``batch`` (the state carried, reset where ``fresh``); its loss."""
    x, dt, y, m, _ = to_device(batch, device)
    if loop.state is not None and tc.context == "stateful":
        loop.state = loop.state.reset(torch.from_numpy(fresh).to(device))
    else:
        loop.state = None
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits, new = loop.fwd(x, dt, state=loop.state, return_state=True)
    loss = masked_bce_loss(logits, y, loop.weights, m)
    loop.step += 1
    v = _loss_value(loss, loop.step, epoch, loop.last)
    loop.opt.zero_grad(set_to_none=True)
    loss.backward()
    if tc.grad_clip:
        torch.nn.utils.clip_grad_norm_(loop.model.parameters(), tc.grad_clip)
    loop.opt.step()
    loop.sched.step()
    loop.state = new.detach()
    loop.last = (v, loop.step)
    return v


def _validate(loop: _Loop, data: CacheData, fold: Fold, norm: Normaliser, tc: TrainConfig, device: torch.device,
              epoch: int, losses: list[float], t_ep: float) -> tuple[dict, float]:
    """The epoch's history record (the whole validation block scored) and the early-stopping
    criterion (the validation loss, else the training loss)."""
    vr, vp, vy = score_rows(loop.model, data, fold.val, norm, tc, device)
    has = ~np.isnan(vy)
    vloss = (float(masked_bce_loss(torch.from_numpy(_logit(vp)), torch.from_numpy(vy), loop.weights.cpu()))
             if has.any() else float("nan"))
    vauc = [auc(vp[:, j], vy[:, j]) for j in range(len(data.horizons))]
    train_loss = float(np.mean(losses))
    record = {"epoch": epoch, "train_loss": train_loss, "val_loss": nan_none(vloss),
              "val_rows_scored": int(vr.size), "val_auc": [nan_none(a) for a in vauc],
              "lr": loop.sched.get_last_lr()[0], "seconds": time.perf_counter() - t_ep}
    log.info("fold %d epoch %d: train %.4f val %.4f (%d rows) val AUC %s", fold.index, epoch, train_loss,
             vloss, vr.size, " ".join(f"{a:.3f}" for a in vauc))
    return record, vloss if math.isfinite(vloss) else train_loss


def _fit_fold(data: CacheData, fold: Fold, norm: Normaliser, mc: ModelConfig, tc: TrainConfig,
              device: torch.device, progress: bool) -> _FoldRun:
    """Train one fold's model (AdamW, warm-up + cosine, early stopping on the whole validation block)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    loop = _make_loop(data, fold, norm, mc, tc, device)
    streams = Streams(data, fold.train, tc, np.random.default_rng(tc.seed + fold.index), tc.context == "stateful")
    history: list[dict] = []
    best, best_state, bad_epochs = (math.inf, -1), None, 0
    # the next batches are gathered from the memory-mapped cache on a thread while the model runs
    pool = ThreadPoolExecutor(max(1, tc.loader_threads))

    def plan() -> tuple:
        wins, fresh = streams.next()
        return pool.submit(data.batch, wins, tc.window, norm), fresh

    queue = [plan() for _ in range(max(1, tc.loader_threads) + 1)]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not progress, transient=False, console=Console(stderr=True)) as bar, pool:
        task = bar.add_task(f"fold {fold.index}", total=tc.epochs * tc.steps_per_epoch)
        for epoch in range(1, tc.epochs + 1):
            loop.model.train()
            t_ep = time.perf_counter()
            losses = []
            for _ in range(tc.steps_per_epoch):
                fut, fresh = queue.pop(0)
                queue.append(plan())
                losses.append(_step(loop, fut.result(), fresh, tc, device, epoch))
                bar.update(task, advance=1, description=f"fold {fold.index} epoch {epoch}/{tc.epochs} "
                                                        f"loss {np.mean(losses):.4f}")
            record, crit = _validate(loop, data, fold, norm, tc, device, epoch, losses, t_ep)
            history.append(record)
            if crit < best[0] - 1e-6:
                best, bad_epochs = (crit, epoch), 0
                best_state = {k: v.detach().clone() for k, v in loop.model.state_dict().items()}
            else:
                bad_epochs += 1
                if bad_epochs >= tc.patience:
                    log.info("fold %d: early stop after epoch %d (best %d)", fold.index, epoch, best[1])
                    bar.update(task, total=bar.tasks[0].completed, description=f"fold {fold.index} stopped "
                               f"early after epoch {epoch}/{tc.epochs} (best {best[1]})")  # fmt: skip
                    break
        for fut, _ in queue:
            fut.cancel()
    if best_state is not None:
        loop.model.load_state_dict(best_state)
    return _FoldRun(loop.model, history, best[1], sum(p.numel() for p in loop.model.parameters()))


def _baseline_scores(data: CacheData, fold: Fold, norm: Normaliser, test_rows: np.ndarray, tc: TrainConfig,
                     skipped: dict[str, str]) -> dict[str, np.ndarray]:
    """Scores (M, H) of each baseline on ``test_rows``, fitted on the fold's training rows."""
    H = len(data.horizons)
    x_tr, y_tr, x_te = bl.baseline_inputs(data, fold.train, test_rows, tc.baseline_max_rows, tc.seed, norm)
    out: dict[str, np.ndarray] = {}
    for name in tc.baselines:
        t = time.perf_counter()
        if name == "base_rate":
            out[name] = np.tile([base_rate(y_tr[:, j]) for j in range(H)], (len(test_rows), 1))
        elif name == "logistic":
            out[name] = np.stack([bl.fit_logistic(x_tr, y_tr[:, j], x_te, tc.baseline_max_rows, tc.seed)
                                  for j in range(H)], axis=1)
        elif name == "lightgbm":
            why = bl.lightgbm_missing()
            if why:
                skipped[name] = why
                continue
            out[name] = np.stack([bl.fit_lightgbm(x_tr, y_tr[:, j], x_te, tc.baseline_max_rows, tc.seed,
                                                  tc.threads or 1) for j in range(H)], axis=1)
        elif name == "mlp":
            out[name] = bl.fit_mlp(x_tr, y_tr, x_te, tc.baseline_max_rows, tc.seed)
        else:
            raise TrainUsageError("train.baselines", f"expected names of {', '.join(BASELINES)}", name)
        log.info("fold %d: baseline %s in %.1f s", fold.index, name, time.perf_counter() - t)
    return out


def _check_labels(data: CacheData, fold: Fold) -> None:
    """One line, before training, when the training block has no label at all."""
    _, y = data.gather(fold.train[:: max(1, fold.train.size // 200_000)], data.feature_names[:1])
    if y.size == 0 or np.isnan(y).all():
        raise TrainDataError(f"no label value in the training rows of fold {fold.index} "
                             f"(every label_h* is NaN): nothing to train on", data.root)


def train(
    cache: str | os.PathLike[str],
    out: str | os.PathLike[str],
    model_cfg: ModelConfig | None = None,
    train_cfg: TrainConfig | None = None,
    progress: bool = True,
) -> dict:
    """Train on the cache at ``cache`` (walk-forward folds) and write the model, metrics and plots to ``out``.

    Returns
    -------
    dict: the content of ``out/summary.json``: ``evaluation`` (one record per model-or-baseline
    × fold × horizon: ``model``, ``fold`` (int or ``"all"``: every test block pooled), ``horizon``,
    ``auc``, ``auc_ci_low``, ``auc_ci_high``, ``n``, ``base_rate``), ``horizons`` (the pooled
    table: the model, each baseline, the ceiling, the lift over the best baseline), ``folds``
    (rows, sessions, labels, positives per block; ``labels_kept_after_purge`` and
    ``labels_purged`` per horizon, counting labels, not rows; history), ``warnings``.

    Raises
    ------
    UsageError
        A bad config value (:meth:`TrainConfig.checked`, :meth:`ModelConfig.checked`), before anything is read.
    AlphafeatError
        Missing or bad cache (no labels, a missing column), too few rows or sessions, no GPU for
        ``cuda``, ``out`` not a folder that can be written; :class:`~alphamodel.errors.TrainingError`
        for the loss going NaN (with its step and the last finite loss). Nothing is written to
        ``out`` before training has finished.
    """
    t_start = time.perf_counter()
    tc = (train_cfg or TrainConfig()).checked()
    mc = (model_cfg or ModelConfig()).checked()
    check_folder(out)
    device = _device(tc, mc)
    out = Path(out)
    data = CacheData.open(cache)
    skey, folds = _folds(data, tc)
    ceiling, ceiling_src = bl.generator_ceiling(data.manifest)
    skipped: dict[str, str] = {}
    fold_info, runs, fold_recs = [], [], []
    pooled: dict[str, list] = {"rows": [], "y": [], "alphamodel": []}
    for fold in folds:
        fr, norm, info = _train_fold(data, fold, mc, tc, device, progress, skey, skipped, pooled, fold_recs)
        fold_info.append(info)
        runs.append((fr, norm))
    y, evaluation, lifts = _pooled_evaluation(data, pooled, len(folds), skey, tc, fold_recs, ceiling, ceiling_src)
    n_sessions = int(skey.max()) + 1 if skey.size else 0
    warnings = warnings_of(evaluation, fold_info, data.horizons, tc, len(folds), n_sessions, skipped)
    for w in warnings:  # in the summary (the CLI prints them once); logged for API callers at info
        log.info("%s", w)
    per_h = per_horizon(evaluation, y, data.horizons, fold_info[-1], lifts)
    n_test = int(np.unique(skey[np.concatenate(pooled["rows"])]).size) if pooled["rows"] else 0
    add_sessions_needed(per_h, n_test)
    fr, norm = runs[-1]
    meta = {
        "model": dataclasses.asdict(mc), "train": dataclasses.asdict(tc),
        "horizons": data.horizons, "features": norm.names, "normaliser": norm.to_dict(),
        "tick_size": data.tick, "cache": str(Path(cache).resolve()), "fold": folds[-1].index,
        # what the saved (last fold's) model trained and early-stopped on: a backtest with it checks these
        "sessions_seen": data.sessions_of(np.concatenate([folds[-1].train, folds[-1].val])),
        "sources": "Mamba2/SSD: Dao & Gu 2024; CfC: Hasani et al. 2022; purged walk-forward: AFML ch. 7, 12",
    }
    with staged_outputs(out) as st:
        save_model(st.dir, fr.model, norm, meta)
        names = plots(st.dir, fr.history, data.horizons)
        summary = {
            "cache": str(Path(cache).resolve()), "out": str(out.resolve()), "device": str(device),
            "seconds": time.perf_counter() - t_start, "parameters": fr.n_params, "context": tc.context,
            "rows": {"total": data.n_rows, "sessions": int(np.unique(skey).size),
                     "test_pooled": sum(len(r) for r in pooled["rows"])},
            "folds": fold_info, "best_epoch": fr.best_epoch, "epochs_run": len(fr.history),
            "horizons": per_h, "evaluation": evaluation, "warnings": warnings, "baselines_skipped": skipped,
            "ceiling_source": ceiling_src, "ceiling_note": bl.ceiling_note(ceiling_src), "test_sessions": n_test,
            "history": fr.history, "plots": names,
            "config": {"model": meta["model"], "train": meta["train"]}, "replaced": st.replacing("summary.json"),
        }
        (st.dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _device(tc: TrainConfig, mc: ModelConfig) -> torch.device:
    """Where the run trains (UsageError when the model cannot run there), with torch's threads set."""
    device = resolve_device(tc.device)
    check_device(mc, device)
    if device.type == "cpu":
        # small models are bound by per-op overhead: one thread is as fast and is not slowed
        # down by OpenMP spinning on a busy machine; it also makes runs repeatable.
        torch.set_num_threads(tc.threads or 1)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        if tc.threads:
            torch.set_num_threads(tc.threads)
    return device


def _folds(data: CacheData, tc: TrainConfig) -> tuple[np.ndarray, list[Fold]]:
    """The session key of every row (int64, sessions in order) and the walk-forward folds; one
    line, before any training, when a fold's training block has no label."""
    t0, t1s = data.spans()
    sessions = np.concatenate([np.full(s.n, s.session or f"segment {k}", dtype=object)
                               for k, s in enumerate(data.segments)])
    skey = np.unique(sessions, return_inverse=True)[1].astype(np.int64)
    try:
        folds = walk_forward_folds(t0, t1s, skey, tc.folds, int(tc.embargo * t0.size))
    except TrainDataError as e:
        raise TrainDataError(e.problem, data.root) from None
    for fold in folds:
        data.set_label_mask(fold.keep)
        _check_labels(data, fold)
    return skey, folds


def _train_fold(data: CacheData, fold: Fold, mc: ModelConfig, tc: TrainConfig, device: torch.device, progress: bool,
                skey: np.ndarray, skipped: dict, pooled: dict, fold_recs: list) -> tuple[_FoldRun, Normaliser, dict]:
    """Train ``fold``'s model, score it and the baselines on its test block: its evaluation records
    go to ``fold_recs``, its test rows, labels and scores to ``pooled``; returns the run, the
    normaliser and the fold's summary record."""
    data.set_label_mask(fold.keep)
    norm = data.fit_normaliser(fold.train, seed=tc.seed)
    mc.n_features, mc.n_horizons = len(norm.names), len(data.horizons)
    log.info("fold %d: rows train %d, val %d, test %d; device %s", fold.index, fold.train.size,
             fold.val.size, fold.test.size, device)
    fr = _fit_fold(data, fold, norm, mc, tc, device, progress)
    rows, probs, y = score_rows(fr.model, data, fold.test, norm, tc, device)
    bad = int((~np.isfinite(probs)).any(axis=1).sum())
    if bad:
        raise TrainingError(f"fold {fold.index}: the trained model's scores are not finite on {bad} of "
                            f"{len(rows)} test rows (training diverged); no result is reported")
    scores = {"alphamodel": probs.astype(np.float64), **_baseline_scores(data, fold, norm, rows, tc, skipped)}
    fold_recs += records(fold.index, rows, y, scores, skey, data.horizons, tc)
    for k, v in (("rows", rows), ("y", y), ("fold", np.full(len(rows), fold.index)), *scores.items()):
        pooled.setdefault(k, []).append(v)
    blocks = {}
    for name, r in (("train", fold.train), ("val", fold.val), ("test", fold.test)):
        blocks[name] = block_stats(r, skey, data.gather(r, data.feature_names[:1])[1], data.horizons)
    info = {"fold": fold.index, **blocks, **label_counts(data, fold.keep), "best_epoch": fr.best_epoch,
            "epochs_run": len(fr.history), "history": fr.history}
    return fr, norm, info


def _pooled_evaluation(data: CacheData, pooled: dict, n_folds: int, skey: np.ndarray, tc: TrainConfig,
                       fold_recs: list[dict], ceiling: dict, ceiling_src: str | None
                       ) -> tuple[np.ndarray, list[dict], dict[int, dict]]:
    """The pooled test labels (M, H), every evaluation record (pooled first, then per fold, then the
    generator's ceiling) and the lift per horizon."""
    rows, y = np.concatenate(pooled["rows"]), np.concatenate(pooled["y"])
    of_fold = np.concatenate(pooled["fold"])
    scores = {k: np.concatenate(v) for k, v in pooled.items()
              if k not in ("rows", "y", "fold") and len(v) == n_folds}
    lifts: dict[int, dict] = {}
    evaluation = records("all", rows, y, scores, skey, data.horizons, tc, lifts, of_fold) + fold_recs
    for h in data.horizons:
        if h in ceiling:
            evaluation.append({"model": "ceiling", "fold": "all", "horizon": h, "auc": ceiling[h],
                               "auc_ci_low": None, "auc_ci_high": None, "n": None, "base_rate": None,
                               "bootstrap_unit": None, "source": ceiling_src})
    return y, evaluation, lifts
