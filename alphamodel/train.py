"""Training: purged walk-forward split, AdamW with warm-up + cosine, early stopping, metrics.

:func:`train` is what ``alphamodel train`` runs. Steps:

1. open the cache (:class:`alphamodel.data.CacheData`, memory-mapped);
2. split rows in time order into train / validation / test blocks (walk-forward,
   :func:`alphafeat.splits.train_val_test_split`), purging *per horizon*: a label whose span
   ``[t0, t1_h]`` reaches into a later block is hidden (the row stays as input context);
3. fit the normalisation on the training rows only; it is stored with the model;
4. train on random windows of K rows inside the training block (loss on positions
   ``>= burn_in``), AdamW, linear warm-up then cosine decay, bf16 autocast on CUDA (the SSD
   scan and CfC gate stay float32), gradient clipping; validation each epoch is forward-only;
   early stopping on validation loss keeps the best weights;
5. on the test block: AUC per horizon (Mann–Whitney), base rate, and a logistic regression on
   the OFI / imbalance columns fitted on the training block; ``summary.json``, PNG curves,
   ``model.safetensors`` + ``config.json``.

A CPU run is repeatable: the same seed and thread count give the same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from alphafeat.errors import AlphafeatError
from alphafeat.splits import train_val_test_split
from alphamodel.data import CacheData, Normaliser, Window
from alphamodel.metrics import auc, base_rate, fit_logistic_baseline
from alphamodel.model import AlphaModel, ModelConfig, horizon_weights, masked_bce_loss

log = logging.getLogger(__name__)

__all__ = ["TrainConfig", "train", "load_model", "resolve_device", "purged_blocks", "compile_model"]


@dataclass
class TrainConfig:
    """Training parameters.

    window : K, snapshots per window.  burn_in : positions at the start of a window that do
    not count in the loss (context only).  batch_size, epochs, steps_per_epoch : optimisation
    length.  lr, weight_decay, warmup_steps, min_lr_frac : AdamW and schedule (cosine decay to
    ``min_lr_frac * lr``).  patience : epochs without validation improvement before stopping.
    val_frac, test_frac : block sizes of the walk-forward split.  horizon_weighting :
    ``window`` (w_h = min(1, K/h)) or ``equal``.  seed, device (auto|cpu|cuda), compile
    (torch.compile the blocks), grad_clip, eval_batch_size, threads (CPU threads; None =
    1 on CPU), baseline_max_rows (logistic-regression training rows), val_max_windows (at
    most this many validation windows, evenly spaced over the block, are scored after each
    epoch for early stopping; None = all; the test block is always scored in full).
    """

    window: int = 64
    burn_in: int = 16
    batch_size: int = 32
    epochs: int = 12
    steps_per_epoch: int = 20
    lr: float = 2e-3
    weight_decay: float = 0.1
    warmup_steps: int = 10
    min_lr_frac: float = 0.05
    patience: int = 4
    val_frac: float = 0.2
    test_frac: float = 0.2
    horizon_weighting: str = "window"
    seed: int = 0
    device: str = "auto"
    compile: bool = False
    grad_clip: float = 1.0
    eval_batch_size: int = 128
    threads: int | None = None
    baseline_max_rows: int = 200_000
    val_max_windows: int | None = None

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """Build from a dict, rejecting unknown keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        bad = set(d) - names
        if bad:
            raise ValueError(f"unknown train config keys: {sorted(bad)}")
        return cls(**d)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU.

    Raises
    ------
    AlphafeatError
        ``cuda`` without a usable GPU, or an unknown name.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise AlphafeatError("--device cuda: torch.cuda.is_available() is False (no GPU or a CPU build of torch)")
    if name not in ("cpu", "cuda"):
        raise AlphafeatError(f"--device: expected auto, cpu or cuda, got {name!r}")
    return torch.device(name)


def compile_model(model: AlphaModel) -> AlphaModel:
    """``torch.compile`` each Mamba2 block in place, and the chunk body of the CfC's fused scan
    (:meth:`alphamodel.cfc.CfC.compile_scan`; the loop reference compiles its cell)."""
    for blk in model.blocks:
        blk.compile()
    if model.cfc.impl == "fused":
        model.cfc.compile_scan()
    else:
        model.cfc.cell.compile()
    return model


def purged_blocks(data: CacheData, val_frac: float, test_frac: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Walk-forward blocks of global rows and the per-horizon label mask.

    Returns ``(train, val, test, keep)``: int64 row ids of each block (time order) and a bool
    (N, H) mask of the labels that survive purging (AFML ch. 7, via
    :func:`alphafeat.splits.train_val_test_split` on each horizon's spans).
    """
    t0, t1s = data.spans()
    order = np.argsort(t0, kind="stable")
    t0s = t0[order]
    try:
        b_tr, b_va, b_te = train_val_test_split(t0s, t0s, val_frac, test_frac)
    except ValueError as e:
        raise AlphafeatError(f"{data.root}: {e}") from e
    keep = np.zeros((t0.size, len(t1s)), bool)
    for j, t1 in enumerate(t1s):
        tr, va, te = train_val_test_split(t0s, t1[order], val_frac, test_frac)
        keep[order[np.concatenate([tr, va, te])], j] = True
    return np.sort(order[b_tr]), np.sort(order[b_va]), np.sort(order[b_te]), keep


def _lr_lambda(warmup: int, total: int, min_frac: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * p))
    return f


def _to(batch, device: torch.device) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(a).to(device, non_blocking=True) for a in (batch.x, batch.dt, batch.y, batch.mask))


@torch.no_grad()
def evaluate(model: AlphaModel, data: CacheData, windows: list[Window], norm: Normaliser, window: int,
             weights: torch.Tensor, device: torch.device, batch_size: int = 128
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Forward-only pass over ``windows``.

    Returns ``(rows (M,), probs (M, H) float32, labels (M, H) float32, loss)``: each scored row
    once, sorted by row id; ``loss`` is the masked BCE over them (NaN when no label).
    """
    model.eval()
    rows, probs, labels = [], [], []
    for i in range(0, len(windows), batch_size):
        b = data.batch(windows[i : i + batch_size], window, norm)
        x, dt, _, _ = _to(b, device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x, dt)
        m = b.mask
        rows.append(b.rows[m])
        probs.append(logits.float().cpu().numpy()[m])
        labels.append(b.y[m])
    if not rows:
        H = len(data.horizons)
        return np.zeros(0, np.int64), np.zeros((0, H), np.float32), np.zeros((0, H), np.float32), float("nan")
    r, p, y = np.concatenate(rows), np.concatenate(probs), np.concatenate(labels)
    o = np.argsort(r, kind="stable")
    r, p, y = r[o], p[o], y[o]
    has = ~np.isnan(y)
    loss = float(masked_bce_loss(torch.from_numpy(p), torch.from_numpy(y), weights)) if has.any() else float("nan")
    return r, 1.0 / (1.0 + np.exp(-p)), y, loss


def _save(out: Path, model: AlphaModel, norm: Normaliser, meta: dict) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    state["norm.mean"] = torch.from_numpy(norm.mean.astype(np.float64))
    state["norm.std"] = torch.from_numpy(norm.std.astype(np.float64))
    save_file(state, str(out / "model.safetensors"), metadata={"format": "alphamodel-1"})
    (out / "config.json").write_text(json.dumps(meta, indent=1))


def load_model(out: str | os.PathLike[str], device: str = "cpu") -> tuple[AlphaModel, Normaliser, dict]:
    """Load ``model.safetensors`` + ``config.json`` written by :func:`train`.

    Returns ``(model in eval mode, normaliser, config dict)``.

    Raises
    ------
    AlphafeatError
        When either file is missing or does not match.
    """
    from safetensors.torch import load_file

    out = Path(out)
    cfg_path, w_path = out / "config.json", out / "model.safetensors"
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise AlphafeatError(f"{p}: missing (not an alphamodel output directory)")
    meta = json.loads(cfg_path.read_text())
    model = AlphaModel(ModelConfig.from_dict(meta["model"]))
    state = load_file(str(w_path), device=device)
    state.pop("norm.mean", None)
    state.pop("norm.std", None)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise AlphafeatError(f"{w_path}: weights do not match {cfg_path} ({str(e).splitlines()[0]})") from e
    return model.to(device).eval(), Normaliser.from_dict(meta["normaliser"]), meta


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


def train(
    cache: str | os.PathLike[str],
    out: str | os.PathLike[str],
    model_cfg: ModelConfig | None = None,
    train_cfg: TrainConfig | None = None,
    progress: bool = True,
) -> dict:
    """Train on the cache at ``cache`` and write the model, metrics and plots to ``out``.

    Returns
    -------
    dict: the content of ``out/summary.json`` (per-horizon test AUC of the model and of the
    logistic baseline, base rates, per-epoch history, sizes, timings).

    Raises
    ------
    AlphafeatError
        Missing or bad cache, a window longer than the training runs, no GPU for ``cuda``.
    """
    t_start = time.perf_counter()
    tc = train_cfg or TrainConfig()
    mc = dataclasses.replace(model_cfg) if model_cfg else ModelConfig()
    if not 0 <= tc.burn_in < tc.window:
        raise AlphafeatError(f"burn_in {tc.burn_in} must be in [0, window={tc.window})")
    device = resolve_device(tc.device)
    if device.type == "cpu":
        # small models are bound by per-op overhead: one thread is as fast and is not slowed
        # down by OpenMP spinning on a busy machine; it also makes runs repeatable.
        torch.set_num_threads(tc.threads or 1)
    elif tc.threads:
        torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    rng = np.random.default_rng(tc.seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    data = CacheData.open(cache)
    H = len(data.horizons)
    tr_rows, va_rows, te_rows, keep = purged_blocks(data, tc.val_frac, tc.test_frac)
    data.set_label_mask(keep)
    norm = data.fit_normaliser(tr_rows, seed=tc.seed)
    mc.n_features, mc.n_horizons = len(norm.names), H
    model = AlphaModel(mc).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    fwd = compile_model(model) if tc.compile else model
    weights = horizon_weights(data.horizons, tc.window, tc.horizon_weighting).to(device)
    seg_ids, starts = data.train_starts(tr_rows, tc.window)
    val_windows = data.eval_windows(va_rows, tc.window, tc.burn_in)
    if tc.val_max_windows and len(val_windows) > tc.val_max_windows:
        pick = np.linspace(0, len(val_windows) - 1, tc.val_max_windows).round().astype(np.int64)
        val_windows = [val_windows[i] for i in np.unique(pick)]
    test_windows = data.eval_windows(te_rows, tc.window, tc.burn_in)
    log.info("rows: train %d, val %d, test %d; %d training windows; %d parameters; device %s",
             tr_rows.size, va_rows.size, te_rows.size, starts.size, n_params, device)

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.dim() < 2 or name.endswith(("A_log", "D", "dt_bias", "log_tau")) else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=tc.lr)
    total = tc.epochs * tc.steps_per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(tc.warmup_steps, total, tc.min_lr_frac))

    history: list[dict] = []
    best = (math.inf, -1)
    best_state = None
    bad_epochs = 0
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not progress, transient=False) as bar:
        task = bar.add_task("train", total=total)
        for epoch in range(1, tc.epochs + 1):
            model.train()
            t_ep = time.perf_counter()
            losses = []
            for _ in range(tc.steps_per_epoch):
                pick = rng.integers(0, starts.size, tc.batch_size)
                wins = [Window(int(seg_ids[i]), int(starts[i]), int(starts[i]) + tc.window) for i in pick]
                x, dt, y, m = _to(data.batch(wins, tc.window, norm, score_from=tc.burn_in), device)
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                    logits = fwd(x, dt)
                loss = masked_bce_loss(logits, y, weights, m)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if tc.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
                opt.step()
                sched.step()
                losses.append(float(loss.detach()))
                bar.update(task, advance=1, description=f"epoch {epoch}/{tc.epochs} loss {np.mean(losses):.4f}")
            _, vp, vy, vloss = evaluate(fwd, data, val_windows, norm, tc.window, weights, device, tc.eval_batch_size)
            vauc = [auc(vp[:, j], vy[:, j]) if len(vy) else float("nan") for j in range(H)]
            train_loss = float(np.mean(losses))
            vloss_h = [float(masked_bce_loss(torch.from_numpy(_logit(vp[:, j : j + 1])),
                                             torch.from_numpy(vy[:, j : j + 1]))) if len(vy) else float("nan")
                       for j in range(H)]
            history.append({"epoch": epoch, "train_loss": train_loss, "val_loss": _nan_none(vloss),
                            "val_loss_per_horizon": [_nan_none(v) if (~np.isnan(vy[:, j])).any() else None
                                                     for j, v in enumerate(vloss_h)],
                            "val_auc": [_nan_none(a) for a in vauc], "lr": sched.get_last_lr()[0],
                            "seconds": time.perf_counter() - t_ep})
            crit = vloss if math.isfinite(vloss) else train_loss
            log.info("epoch %d: train %.4f val %.4f val AUC %s", epoch, train_loss, vloss,
                     " ".join(f"{a:.3f}" for a in vauc))
            if crit < best[0] - 1e-6:
                best, bad_epochs = (crit, epoch), 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            else:
                bad_epochs += 1
                if bad_epochs >= tc.patience:
                    log.info("early stop after epoch %d (best %d)", epoch, best[1])
                    break
    if best_state is not None:
        model.load_state_dict(best_state)

    # ---- test metrics --------------------------------------------------------------------
    rows, probs, ylab, test_loss = evaluate(model, data, test_windows, norm, tc.window, weights, device,
                                            tc.eval_batch_size)
    bnames = data.baseline_names
    bnorm = Normaliser(bnames, norm.mean[[norm.names.index(n) for n in bnames]],
                       norm.std[[norm.names.index(n) for n in bnames]], norm.clip)
    xb_tr, yb_tr = data.gather(tr_rows, bnames)
    xb_te, _ = data.gather(rows, bnames)
    # the validation rows scored by the best model (model selection reads these, never the test)
    vrows, vprobs, vylab, _ = evaluate(model, data, val_windows, norm, tc.window, weights, device,
                                       tc.eval_batch_size)
    xb_va, _ = data.gather(vrows, bnames)
    per_h = []
    for j, h in enumerate(data.horizons):
        if bnames:
            both = fit_logistic_baseline(bnorm(xb_tr), yb_tr[:, j], bnorm(np.concatenate([xb_te, xb_va])),
                                         tc.baseline_max_rows, tc.seed)
            lr_scores, lr_val = both[: len(rows)], both[len(rows):]
        else:
            lr_scores, lr_val = np.full(len(rows), np.nan), np.full(len(vrows), np.nan)
        per_h.append({
            "horizon": h,
            "n_test": int((~np.isnan(ylab[:, j])).sum()),
            "base_rate_test": _nan_none(base_rate(ylab[:, j])),
            "base_rate_train": _nan_none(base_rate(yb_tr[:, j])),
            "auc_model": _nan_none(auc(probs[:, j], ylab[:, j])),
            "auc_logistic": _nan_none(auc(lr_scores, ylab[:, j])),
            "auc_model_val": _nan_none(auc(vprobs[:, j], vylab[:, j])) if len(vylab) else None,
            "auc_logistic_val": _nan_none(auc(lr_val, vylab[:, j])) if len(vylab) else None,
            "weight": float(weights[j]),
        })

    meta = {
        "model": dataclasses.asdict(mc), "train": dataclasses.asdict(tc),
        "horizons": data.horizons, "features": norm.names, "normaliser": norm.to_dict(),
        "tick_size": data.tick, "cache": str(Path(cache).resolve()),
        "sources": "Mamba2/SSD: Dao & Gu 2024; CfC: Hasani et al. 2022; purged splits: AFML ch. 7",
    }
    _save(out, model, norm, meta)
    plots = _plots(out, history, data.horizons)
    summary = {
        "cache": str(Path(cache).resolve()), "out": str(out.resolve()), "device": str(device),
        "seconds": time.perf_counter() - t_start, "parameters": n_params,
        "rows": {"total": data.n_rows, "train": int(tr_rows.size), "val": int(va_rows.size),
                 "test": int(te_rows.size), "val_scored_per_epoch": int(len(vrows))},
        "labels_kept_after_purge": {f"h{h}": int(keep[:, j].sum()) for j, h in enumerate(data.horizons)},
        "best_epoch": best[1], "epochs_run": len(history), "test_loss": _nan_none(test_loss),
        "horizons": per_h, "history": history, "plots": plots,
        "baseline_features": bnames, "config": {"model": meta["model"], "train": meta["train"]},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
