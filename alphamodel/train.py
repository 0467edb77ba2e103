"""Training and evaluation: walk-forward folds over sessions, stateful context, baselines.

:func:`train` is what ``alphamodel train`` runs. Steps:

1. open the cache (:class:`alphamodel.data.CacheData`, memory-mapped) and check it: labels
   and every input column present in every partition (one line, before any training);
2. cut the sessions into walk-forward folds (:func:`alphamodel.evaluation.walk_forward_folds`:
   expanding training block, a validation block for early stopping, then the test block;
   labels purged per horizon with :func:`alphafeat.splits.purge`, plus an embargo);
3. per fold: fit the normalisation on the training rows only; train on windows of K rows
   (``context="stateful"``: B streams walk consecutive windows of a session and carry the
   model's state between them, truncated back-propagation; ``"window"``: independent random
   windows), AdamW, warm-up + cosine, bf16 autocast on CUDA (SSD scan and CfC state in fp32,
   TF32 matmuls), gradient clipping; the loss going NaN stops the run with its step;
   after each epoch the *whole* validation block is scored; early stopping on its loss keeps
   the best weights;
4. per fold, on the test block: the model and the baselines (:mod:`alphamodel.baselines`,
   fitted on the same training rows) scored on the same rows; AUC per horizon with a
   session-bootstrap 95% interval (:func:`alphamodel.evaluation.bootstrap_aucs`), and the
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
from alphafeat.errors import InputError, UsageError
from alphafeat.validation import Baseline, Device, validate_enum
from alphamodel import baselines as bl
from alphamodel.config import check_config, from_dict
from alphamodel.data import Batch, CacheData, Normaliser, Window
from alphamodel.errors import AlphamodelError, ConfigError, TrainingError
from alphamodel.errors import DataError as TrainDataError
from alphamodel.errors import UsageError as TrainUsageError
from alphamodel.evaluation import (
    Fold,
    block_stats,
    bootstrap_aucs,
    percentile_interval,
    session_groups,
    walk_forward_folds,
)
from alphamodel.metrics import auc, base_rate
from alphamodel.model import AlphaModel, ModelConfig, ModelState, horizon_weights, masked_bce_loss
from alphamodel.optim import param_groups
from alphamodel.outputs import save_tensors, staged_outputs

log = logging.getLogger(__name__)

__all__ = ["TrainConfig", "train", "load_model", "resolve_device", "compile_model", "scoring_config",
           "score_rows", "fit_input_ema", "BASELINES"]

#: Baselines fitted beside the model (see :mod:`alphamodel.baselines`; declared as
#: :class:`alphafeat.validation.Baseline`).
BASELINES: tuple[str, ...] = tuple(str(b) for b in Baseline)


@dataclass
class TrainConfig:
    """Training parameters.

    window : K, snapshots per window.  burn_in : positions at the start of a window without
    carried state that do not count in the loss (context only).  context : ``"stateful"`` (the
    state is carried across consecutive windows of a session, in training and scoring) or
    ``"window"`` (each window starts from a zero state; scoring tiles the rows with windows
    that overlap by ``burn_in``).  batch_size, epochs, steps_per_epoch : optimisation length
    (per fold).  lr, weight_decay, warmup_steps, min_lr_frac : AdamW and schedule (cosine decay
    to ``min_lr_frac * lr``).  patience : epochs without validation improvement before stopping.
    folds : walk-forward folds (sessions in ``folds + 2`` blocks).  embargo : fraction of all
    rows (AFML's pct_embargo): that many rows before each later block lose their labels too.
    n_boot : bootstrap replicates of the intervals.
    baselines : which of :data:`BASELINES` to fit.  horizon_weighting : ``window``
    (w_h = min(1, K/h)) or ``equal``.  seed, device (auto|cpu|cuda), compile (torch.compile
    the blocks and the CfC scan), grad_clip, eval_batch_size (streams scored at once),
    eval_piece / eval_warmup (stateful scoring: a run of rows is scored in pieces of
    ``eval_piece`` rows, each preceded by up to ``eval_warmup`` unscored rows of the same
    session whose state it carries; pieces run in parallel), threads (CPU threads; None = 1 on
    CPU), loader_threads (threads gathering the next batches from the memory-mapped cache while
    the model runs; ``loader_threads + 1`` batches are in flight), baseline_max_rows (training
    rows of each baseline).
    """

    window: int = 64
    burn_in: int = 16
    context: str = "stateful"
    batch_size: int = 32
    epochs: int = 12
    steps_per_epoch: int = 20
    lr: float = 2e-3
    weight_decay: float = 0.1
    warmup_steps: int = 10
    min_lr_frac: float = 0.05
    patience: int = 4
    folds: int = 3
    embargo: float = 0.01
    n_boot: int = 200
    baselines: tuple[str, ...] = BASELINES
    horizon_weighting: str = "window"
    seed: int = 0
    device: str = "auto"
    compile: bool = False
    grad_clip: float = 1.0
    eval_batch_size: int = 128
    eval_piece: int = 2048
    eval_warmup: int = 1024
    threads: int | None = None
    loader_threads: int = 2
    baseline_max_rows: int = 200_000

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """Build from a dict, each key checked (:func:`alphamodel.config.from_dict`; UsageError
        naming ``train.KEY`` for an unknown key or a bad value)."""
        return from_dict(cls, d, "train")


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU.

    Raises
    ------
    UsageError
        An unknown name.
    AlphamodelError
        ``cuda`` without a usable GPU.
    """
    name = validate_enum(name, Device, "--device")
    if name == Device.AUTO:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == Device.CUDA and not torch.cuda.is_available():
        raise AlphamodelError("--device cuda: torch.cuda.is_available() is False (no GPU or a CPU build of torch)")
    return torch.device(name)


def compile_model(model: AlphaModel) -> AlphaModel:
    """``torch.compile`` each Mamba2 block in place, and the chunk body of the CfC's fused scan
    (:meth:`alphamodel.cfc.CfC.compile_scan`; the loop reference compiles its cell, the Triton
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
    are read as stored (a mask set with :meth:`~alphamodel.data.CacheData.set_label_mask` does
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


def _to(batch: Batch, device: torch.device) -> tuple[torch.Tensor, ...]:
    """x, dt, y, scored mask, real-row mask on ``device`` (pinned host copies on CUDA)."""
    arrs = (batch.x, batch.dt, batch.y, batch.mask, batch.rows >= 0)
    out = []
    for a in arrs:
        t = torch.from_numpy(np.ascontiguousarray(a))
        if device.type == "cuda":
            t = t.pin_memory()
        out.append(t.to(device, non_blocking=True))
    return tuple(out)


class _Streams:
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


def _pieces(data: CacheData, rows: np.ndarray, tc: TrainConfig) -> list[tuple[int, int, int, int]]:
    """Stateful scoring plan: ``(seg, context_start, score_start, end)`` per piece of each run."""
    out = []
    for seg, a, b in data.runs(rows):
        for p in range(a, b, tc.eval_piece):
            out.append((seg, max(0, p - tc.eval_warmup), p, min(b, p + tc.eval_piece)))
    return out


@torch.no_grad()
def score_rows(model: AlphaModel, data: CacheData, rows: np.ndarray, norm: Normaliser, tc: TrainConfig,
               device: torch.device, embeddings: bool = False) -> tuple[np.ndarray, ...]:
    """Forward-only scores of every given row, once.

    ``tc.context == "stateful"``: each piece of rows (:func:`_pieces`) runs as one long
    sequence, in windows of K with the state carried (right-padded at its end, masked);
    ``"window"``: windows tiling each run with ``burn_in`` rows of overlap (left-padded, masked).

    Returns ``(rows (M,) int64 sorted, probs (M, H) float32, labels (M, H) float32 NaN)``, and
    with ``embeddings`` also what the heads read besides the row's inputs
    (:meth:`AlphaModel.embedding`, (M, cfc_hidden + d_model) float32), in the same order.
    """
    model.eval()
    K = tc.window
    amp = device.type == "cuda"
    out_r, out_p, out_y, out_e = [], [], [], []

    def run(b: Batch, state: ModelState | None) -> ModelState:
        x, dt, _, _, real = _to(b, device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            logits, seq, new = model.scores(x, dt, real, state)
        m = b.mask
        out_r.append(b.rows[m])
        out_p.append(logits.float().cpu().numpy()[m])
        out_y.append(b.y[m])
        if embeddings:
            out_e.append(seq.float().cpu().numpy()[m])
        return new

    if tc.context == "stateful":
        pieces = sorted(_pieces(data, rows, tc), key=lambda p: p[3] - p[1], reverse=True)
        for i in range(0, len(pieces), tc.eval_batch_size):
            group = pieces[i : i + tc.eval_batch_size]
            state = None
            for w in range(math.ceil((group[0][3] - group[0][1]) / K)):
                wins = []
                for seg, c, p, e in group:
                    s = min(c + w * K, e)
                    wins.append(Window(seg, s, min(s + K, e), max(0, p - s)))
                state = run(data.batch(wins, K, norm, pad="right"), state)
    else:
        wins = data.eval_windows(rows, K, tc.burn_in)
        for i in range(0, len(wins), tc.eval_batch_size):
            run(data.batch(wins[i : i + tc.eval_batch_size], K, norm), None)
    H, D = len(data.horizons), model.cfg.cfc_hidden + model.cfg.d_model
    if not out_r:
        empty = (np.zeros(0, np.int64), np.zeros((0, H), np.float32), np.zeros((0, H), np.float32))
        return (*empty, np.zeros((0, D), np.float32)) if embeddings else empty
    r, p, y = np.concatenate(out_r), np.concatenate(out_p), np.concatenate(out_y)
    o = np.argsort(r, kind="stable")
    scored = (r[o], (1.0 / (1.0 + np.exp(-p[o].astype(np.float64)))).astype(np.float32), y[o])
    return (*scored, np.concatenate(out_e)[o]) if embeddings else scored


def scoring_config(train_meta: dict) -> TrainConfig:
    """The :class:`TrainConfig` that :func:`score_rows` needs (window, burn-in, context, pieces,
    batch) from a saved model's ``config.json`` ``train`` section; defaults for keys it lacks."""
    keys = ("window", "burn_in", "context", "eval_piece", "eval_warmup", "eval_batch_size")
    return dataclasses.replace(TrainConfig(), **{k: train_meta[k] for k in keys if k in train_meta})


def _save(out: Path, model: AlphaModel, norm: Normaliser, meta: dict) -> None:
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    state["norm.mean"] = torch.from_numpy(norm.mean.astype(np.float64))
    state["norm.std"] = torch.from_numpy(norm.std.astype(np.float64))
    save_tensors(state, out / "model.safetensors", "alphamodel-1")
    (out / "config.json").write_text(json.dumps(meta, indent=1))


#: The torch form of each Triton implementation (the same weights and function), for devices other than CUDA.
TRITON_FALLBACK = {"cfc_impl": "fused", "ssd_impl": "chunked"}


def check_device(mc: ModelConfig, device: torch.device) -> None:
    """UsageError (``model.cfc_impl`` or ``model.ssd_impl``) when the model cannot run on
    ``device``: the Triton kernels run on CUDA only."""
    for key, other in TRITON_FALLBACK.items():
        if getattr(mc, key) == "triton" and device.type != "cuda":
            raise TrainUsageError(f"model.{key}", f"'triton' runs on CUDA (train.device is {device.type}); use "
                                  f"'{other}'", "triton")


def load_model(out: str | os.PathLike[str], device: str = "cpu") -> tuple[AlphaModel, Normaliser, dict]:
    """Load ``model.safetensors`` + ``config.json`` written by :func:`train`.

    Returns ``(model in eval mode, normaliser, config dict)``. A model trained with
    ``cfc_impl: "triton"`` or ``ssd_impl: "triton"`` loads with the torch scan (same weights and
    function, :data:`TRITON_FALLBACK`) on a device other than CUDA.

    Raises
    ------
    InputError
        When either file is missing, cannot be read, or they do not match (a checkpoint of
        the wrong shape); :class:`~alphamodel.errors.ConfigError` (an InputError) for a bad
        value in ``config.json``.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    out = Path(out)
    cfg_path, w_path = out / "config.json", out / "model.safetensors"
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise InputError(p, "missing (not an alphamodel output directory)")
    try:
        meta = json.loads(cfg_path.read_text())
        model_cfg, norm = meta["model"], Normaliser.from_dict(meta["normaliser"])
    except KeyError as e:
        raise InputError(cfg_path, f"not an alphamodel config (no key {e.args[0]!r})") from e
    except (OSError, ValueError, TypeError) as e:
        raise InputError(cfg_path, f"not an alphamodel config ({type(e).__name__}: {e})") from e
    for key, other in TRITON_FALLBACK.items():
        if model_cfg.get(key) == "triton" and torch.device(device).type != "cuda":
            # the same weights and function; the Triton kernels run on CUDA only
            log.info("%s: %s 'triton' runs as '%s' on %s", cfg_path, key, other, device)
            model_cfg = {**model_cfg, key: other}
    try:
        model = AlphaModel(ModelConfig.from_dict(model_cfg))
    except UsageError as e:
        raise ConfigError(cfg_path, e.option, e.problem) from None
    try:
        state = load_file(str(w_path), device=device)
    except (OSError, SafetensorError) as e:
        raise InputError(w_path, f"cannot be read as safetensors ({e})") from e
    state.pop("norm.mean", None)
    state.pop("norm.std", None)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # torch's first line is a header; name the first tensor that differs
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        first = (lines[1] if len(lines) > 1 else lines[0] if lines else "no detail").rstrip(".")
        more = f"; {len(lines) - 2} more" if len(lines) > 2 else ""
        raise InputError(w_path, f"weights do not match {cfg_path} ({first}{more})") from e
    return model.to(device).eval(), norm, meta


def _plots(out: Path, history: list[dict], horizons: list[int]) -> list[str]:
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


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p.astype(np.float64), 1e-12, 1 - 1e-12)
    return np.log(p / (1 - p))


def _nan_none(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)



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


def fit_input_ema(model: AlphaModel, data: CacheData, rows: np.ndarray, norm: Normaliser,
                  max_rows: int = 2_000_000) -> None:
    """Fit the output statistics of the model's input EMA bank (:meth:`alphamodel.ema.InputEMA.fit`)
    on the runs of consecutive ``rows`` (the training rows), each run from a zero state, in
    order, until ``max_rows`` rows; nothing without a bank."""
    if model.ema is None:
        return
    def runs():
        left = max_rows
        for seg, a, b in data.runs(rows):
            if left <= 0:
                return
            b = min(b, a + left)
            left -= b - a
            yield torch.from_numpy(norm(data.raw_features(seg, np.arange(a, b), norm.names)))
    model.ema.fit(runs())


def _fit_fold(data: CacheData, fold: Fold, norm: Normaliser, mc: ModelConfig, tc: TrainConfig,
              device: torch.device, progress: bool) -> _FoldRun:
    """Train one fold's model (AdamW, warm-up + cosine, early stopping on the whole validation block)."""
    torch.manual_seed(tc.seed + fold.index)
    rng = np.random.default_rng(tc.seed + fold.index)
    H = len(data.horizons)
    model = AlphaModel(mc)
    fit_input_ema(model, data, fold.train, norm)
    model = model.to(device)
    fwd = compile_model(model) if tc.compile else model
    weights = horizon_weights(data.horizons, tc.window, tc.horizon_weighting).to(device)
    streams = _Streams(data, fold.train, tc, rng, tc.context == "stateful")
    opt = torch.optim.AdamW(param_groups(model, tc.weight_decay), lr=tc.lr)
    total = tc.epochs * tc.steps_per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(tc.warmup_steps, total, tc.min_lr_frac))
    amp = device.type == "cuda"
    history: list[dict] = []
    best, best_state, bad_epochs, step, last = (math.inf, -1), None, 0, 0, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # the next batches are gathered from the memory-mapped cache on a thread while the model runs
    pool = ThreadPoolExecutor(max(1, tc.loader_threads))

    def plan() -> tuple:
        wins, fresh = streams.next()
        return pool.submit(data.batch, wins, tc.window, norm), fresh

    queue = [plan() for _ in range(max(1, tc.loader_threads) + 1)]
    state: ModelState | None = None
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not progress, transient=False, console=Console(stderr=True)) as bar, pool:
        task = bar.add_task(f"fold {fold.index}", total=total)
        for epoch in range(1, tc.epochs + 1):
            model.train()
            t_ep = time.perf_counter()
            losses = []
            for _ in range(tc.steps_per_epoch):
                fut, fresh = queue.pop(0)
                queue.append(plan())
                x, dt, y, m, _ = _to(fut.result(), device)
                if state is not None and tc.context == "stateful":
                    state = state.reset(torch.from_numpy(fresh).to(device))
                else:
                    state = None
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
                    logits, new = fwd(x, dt, state=state, return_state=True)
                loss = masked_bce_loss(logits, y, weights, m)
                step += 1
                v = _loss_value(loss, step, epoch, last)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if tc.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
                opt.step()
                sched.step()
                state = new.detach()
                last = (v, step)
                losses.append(v)
                bar.update(task, advance=1, description=f"fold {fold.index} epoch {epoch}/{tc.epochs} "
                                                        f"loss {np.mean(losses):.4f}")
            vr, vp, vy = score_rows(model, data, fold.val, norm, tc, device)
            has = ~np.isnan(vy)
            vloss = (float(masked_bce_loss(torch.from_numpy(_logit(vp)), torch.from_numpy(vy), weights.cpu()))
                     if has.any() else float("nan"))
            vauc = [auc(vp[:, j], vy[:, j]) for j in range(H)]
            train_loss = float(np.mean(losses))
            history.append({"epoch": epoch, "train_loss": train_loss, "val_loss": _nan_none(vloss),
                            "val_rows_scored": int(vr.size), "val_auc": [_nan_none(a) for a in vauc],
                            "lr": sched.get_last_lr()[0], "seconds": time.perf_counter() - t_ep})
            crit = vloss if math.isfinite(vloss) else train_loss
            log.info("fold %d epoch %d: train %.4f val %.4f (%d rows) val AUC %s", fold.index, epoch, train_loss,
                     vloss, vr.size, " ".join(f"{a:.3f}" for a in vauc))
            if crit < best[0] - 1e-6:
                best, bad_epochs = (crit, epoch), 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
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
        model.load_state_dict(best_state)
    return _FoldRun(model, history, best[1], sum(p.numel() for p in model.parameters()))


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


def _records(fold: str | int, rows: np.ndarray, y: np.ndarray, scores: dict[str, np.ndarray],
             sessions: np.ndarray, horizons: list[int], tc: TrainConfig, lifts: dict | None = None,
             strata: np.ndarray | None = None) -> list[dict]:
    """Evaluation records of every model on one block (or the pooled test blocks, with the fold
    of each row as ``strata``: pairs compared within a fold), and (``lifts``) the model's lift
    over the best baseline per horizon with its paired-bootstrap interval (:func:`_lift`: never
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
            recs.append({"model": name, "fold": fold, "horizon": h, "auc": _nan_none(point[k]),
                         "auc_ci_low": _nan_none(lo), "auc_ci_high": _nan_none(hi), "n": n,
                         "base_rate": _nan_none(base_rate(y[:, j])), "bootstrap_unit": unit})
        if lifts is not None and np.isfinite(point[0]):
            lifts[h] = _lift(names, point, reps)
    return recs


def _lift(names: list[str], point: np.ndarray, reps: np.ndarray) -> dict:
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
    return {"best_baseline": best, "lift": float(point[0] - bar), "lift_ci_low": _nan_none(lo),
            "lift_ci_high": _nan_none(hi)}


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
        A bad config value (:func:`alphamodel.config.check_config`), before anything is read.
    AlphafeatError
        Missing or bad cache (no labels, a missing column), too few rows or sessions, no GPU for
        ``cuda``, ``out`` not a folder that can be written; :class:`~alphamodel.errors.TrainingError`
        for the loss going NaN (with its step and the last finite loss). Nothing is written to
        ``out`` before training has finished.
    """
    t_start = time.perf_counter()
    tc = check_config(train_cfg or TrainConfig(), "train")
    mc = check_config(model_cfg or ModelConfig(), "model")
    check_folder(out)
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
    out = Path(out)
    data = CacheData.open(cache)
    H = len(data.horizons)
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
    ceiling, ceiling_src = bl.generator_ceiling(data.manifest)
    skipped: dict[str, str] = {}
    fold_info, runs = [], []
    pooled: dict[str, list] = {"rows": [], "y": [], "alphamodel": []}
    fold_recs: list[dict] = []
    for fold in folds:
        data.set_label_mask(fold.keep)
        norm = data.fit_normaliser(fold.train, seed=tc.seed)
        mc.n_features, mc.n_horizons = len(norm.names), H
        log.info("fold %d: rows train %d, val %d, test %d; device %s", fold.index, fold.train.size,
                 fold.val.size, fold.test.size, device)
        fr = _fit_fold(data, fold, norm, mc, tc, device, progress)
        rows, probs, y = score_rows(fr.model, data, fold.test, norm, tc, device)
        bad = int((~np.isfinite(probs)).any(axis=1).sum())
        if bad:
            raise TrainingError(f"fold {fold.index}: the trained model's scores are not finite on {bad} of "
                                f"{len(rows)} test rows (training diverged); no result is reported")
        scores = {"alphamodel": probs.astype(np.float64), **_baseline_scores(data, fold, norm, rows, tc, skipped)}
        fold_recs += _records(fold.index, rows, y, scores, skey, data.horizons, tc)
        for k, v in (("rows", rows), ("y", y), ("fold", np.full(len(rows), fold.index)), *scores.items()):
            pooled.setdefault(k, []).append(v)
        blocks = {}
        for name, r in (("train", fold.train), ("val", fold.val), ("test", fold.test)):
            blocks[name] = block_stats(r, skey, data.gather(r, data.feature_names[:1])[1], data.horizons)
        fold_info.append({"fold": fold.index, **blocks, **label_counts(data, fold.keep), "best_epoch": fr.best_epoch,
                          "epochs_run": len(fr.history), "history": fr.history})
        runs.append((fr, norm))
    rows, y = np.concatenate(pooled.pop("rows")), np.concatenate(pooled.pop("y"))
    of_fold = np.concatenate(pooled.pop("fold"))
    scores = {k: np.concatenate(v) for k, v in pooled.items() if len(v) == len(folds)}
    lifts: dict[int, dict] = {}
    evaluation = _records("all", rows, y, scores, skey, data.horizons, tc, lifts, of_fold) + fold_recs
    for h in data.horizons:
        if h in ceiling:
            evaluation.append({"model": "ceiling", "fold": "all", "horizon": h, "auc": ceiling[h],
                               "auc_ci_low": None, "auc_ci_high": None, "n": None, "base_rate": None,
                               "bootstrap_unit": None, "source": ceiling_src})
    warnings = []
    if len(folds) < tc.folds:
        warnings.append(f"folds: {tc.folds} asked, {len(folds)} made: {int(skey.max()) + 1 if skey.size else 0} "
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
        for h in data.horizons:
            n, pos = f["train"][f"labels_h{h}"], f["train"][f"positives_h{h}"]
            if pos in (0, n):
                warnings.append(f"fold {f['fold']} horizon {h}: the training rows hold "
                                f"{'no' if n == 0 else 'one class of'} label ({n} labels, {pos} up): the model's and "
                                "the MLP's scores there learned nothing from them")
    for w in warnings:  # in the summary (the CLI prints them once); logged for API callers at info
        log.info("%s", w)

    per_h = []
    for j, h in enumerate(data.horizons):
        row = {"horizon": h, "n_test": int((~np.isnan(y[:, j])).sum()), "base_rate_test": _nan_none(base_rate(y[:, j])),
               "base_rate_train": fold_info[-1]["train"][f"positives_h{h}"]
               / max(1, fold_info[-1]["train"][f"labels_h{h}"])}
        for r in evaluation:
            if r["fold"] == "all" and r["horizon"] == h:
                key = "model" if r["model"] == "alphamodel" else r["model"]
                row[f"auc_{key}"] = r["auc"]
                row[f"auc_{key}_ci"] = [r["auc_ci_low"], r["auc_ci_high"]]
        row.update(lifts.get(h, {"best_baseline": None, "lift": None, "lift_ci_low": None, "lift_ci_high": None}))
        per_h.append(row)

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
        _save(st.dir, fr.model, norm, meta)
        plots = _plots(st.dir, fr.history, data.horizons)
        summary = {
            "cache": str(Path(cache).resolve()), "out": str(out.resolve()), "device": str(device),
            "seconds": time.perf_counter() - t_start, "parameters": fr.n_params, "context": tc.context,
            "rows": {"total": data.n_rows, "sessions": int(np.unique(skey).size),
                     "test_pooled": int(rows.size)},
            "folds": fold_info, "best_epoch": fr.best_epoch, "epochs_run": len(fr.history),
            "horizons": per_h, "evaluation": evaluation, "warnings": warnings, "baselines_skipped": skipped,
            "ceiling_source": ceiling_src, "history": fr.history, "plots": plots,
            "config": {"model": meta["model"], "train": meta["train"]}, "replaced": st.replacing("summary.json"),
        }
        (st.dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
