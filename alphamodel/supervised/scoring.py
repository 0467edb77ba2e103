"""Scoring a trained model on cache rows: every row once, with its context
(:func:`score_rows`), and the pieces and batches it runs on."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from alphamodel.data.cache import Batch, CacheData, Normaliser, Window
from alphamodel.nn.model import AlphaModel, ModelState
from alphamodel.supervised.config import TrainConfig

__all__ = ["fit_input_ema", "pieces", "score_rows", "scoring_config", "to_device"]


def to_device(batch: Batch, device: torch.device) -> tuple[torch.Tensor, ...]:
    """x, dt, y, scored mask, real-row mask on ``device`` (pinned host copies on CUDA)."""
    arrs = (batch.x, batch.dt, batch.y, batch.mask, batch.rows >= 0)
    out = []
    for a in arrs:
        t = torch.from_numpy(np.ascontiguousarray(a))
        if device.type == "cuda":
            t = t.pin_memory()
        out.append(t.to(device, non_blocking=True))
    return tuple(out)


def pieces(data: CacheData, rows: np.ndarray, tc: TrainConfig) -> list[tuple[int, int, int, int]]:
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

    ``tc.context == "stateful"``: each piece of rows (:func:`pieces`) runs as one long
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
        x, dt, _, _, real = to_device(b, device)
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
        plan = sorted(pieces(data, rows, tc), key=lambda p: p[3] - p[1], reverse=True)
        for i in range(0, len(plan), tc.eval_batch_size):
            group = plan[i : i + tc.eval_batch_size]
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


def fit_input_ema(model: AlphaModel, data: CacheData, rows: np.ndarray, norm: Normaliser,
                  max_rows: int = 2_000_000) -> None:
    """Fit the output statistics of the model's input EMA bank (:meth:`alphamodel.nn.ema.InputEMA.fit`)
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
