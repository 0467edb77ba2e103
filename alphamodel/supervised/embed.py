"""Per-row embeddings of a trained ``alphamodel train`` model (the frozen-encoder path).

The embedding of row t is what the model's heads read, without the row's own inputs: the CfC
state and the Mamba2 stack's output at t, ``concat(cfc, encoder)`` — shape
``(cfc_hidden + d_model,)`` float32 — computed as the model's training scored its test rows
(:func:`alphamodel.supervised.scoring.score_rows`: with a stateful model, each session in long pieces whose
windows carry the state; otherwise windows of the training length ``K`` with its burn-in).
Beside it the direction probabilities of the heads, one per horizon.

:func:`write_embeddings` (``alphamodel embed CACHE --model DIR``) writes them as an Arrow
dataset beside the cache: ``CACHE-embeddings/root=../session=../NAME.arrow`` with columns
``ts_recv``, ``emb_000 ...`` and ``p_h{h}``, and ``_embeddings.json`` naming the model.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from alphamodel.data.cache import CacheData, Normaliser
from alphamodel.errors import CacheError, DataError
from alphamodel.nn.model import AlphaModel
from alphamodel.supervised.checkpoint import load_model, resolve_device
from alphamodel.supervised.scoring import score_rows, scoring_config

__all__ = ["embed_segments", "check_model_inputs", "write_embeddings"]


def check_model_inputs(data: CacheData, norm: Normaliser, where: str) -> None:
    """Raise :class:`~alphamodel.errors.DataError` (naming the model ``where`` and the cache)
    when the model reads features the cache does not have."""
    missing = [n for n in norm.names if n not in data.feature_names]
    if missing:
        raise DataError(f"the model reads feature(s) the cache {data.root} lacks: "
                        f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}", where)


def embed_segments(model: AlphaModel, norm: Normaliser, data: CacheData, segs: list[int], train_meta: dict,
                   device: torch.device) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Embeddings and direction probabilities of every row of the segments ``segs``, scored as
    the model's training scored its validation and test rows (:func:`alphamodel.supervised.scoring.score_rows`
    with the ``train`` section of its config: stateful, the state carried across windows, or
    windows with burn-in).

    Returns ``{seg: (emb (n, D) float32, probs (n, H) float32)}``.
    """
    rows, probs, _, emb = score_rows(model, data, data.segment_rows(segs), norm, scoring_config(train_meta),
                                     device, embeddings=True)
    seg_of = data.segment_of(rows)
    return {k: (emb[seg_of == k], probs[seg_of == k]) for k in segs}


def write_embeddings(cache: str | os.PathLike[str], model_dir: str | os.PathLike[str],
                     out: str | os.PathLike[str] | None = None, device: str = "cpu") -> Path:
    """``alphamodel embed``: write the embeddings of every row of ``cache`` (see module docstring).

    The dataset is written under a temporary name and renamed when complete; an existing
    ``out`` is refused (never replaced quietly). Returns the dataset's path.

    Raises
    ------
    alphamodel.errors.CacheError
        ``out`` exists; no cache at ``cache`` (or a bad one).
    alphafeat.errors.InputError
        A model checkpoint that is missing or does not fit its config.
    alphamodel.errors.DataError
        The model reads features the cache lacks.
    alphamodel.errors.UsageError
        An unknown ``device``.
    """
    import pyarrow as pa

    cache = Path(cache)
    out = Path(out) if out else cache.parent / (cache.name + "-embeddings")
    if out.exists():
        raise CacheError(out, "exists; remove it or pass another --out")
    dev = resolve_device(device)
    model, norm, meta = load_model(model_dir, str(dev))
    data = CacheData.open(cache)
    check_model_inputs(data, norm, str(model_dir))
    tc = meta.get("train", {})
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        for k, seg in enumerate(data.segments):
            emb, probs = embed_segments(model, norm, data, [k], tc, dev)[k]
            cols = {"ts_recv": pa.array(seg.ts, pa.timestamp("ns", tz="UTC"))}
            cols.update({f"emb_{j:03d}": pa.array(emb[:, j]) for j in range(emb.shape[1])})
            cols.update({f"p_h{h}": pa.array(probs[:, j]) for j, h in enumerate(data.horizons)})
            rel = seg.path.relative_to(cache) if seg.path.is_relative_to(cache) else Path(seg.path.name)
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            table = pa.table(cols)
            with pa.OSFile(str(tmp / rel), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
                w.write_table(table)
        (tmp / "_embeddings.json").write_text(json.dumps({
            "cache": str(cache.resolve()), "model": str(Path(model_dir).resolve()), "dim": int(emb.shape[1]),
            "horizons": data.horizons, "layout": "emb = concat(CfC state, Mamba2 output) at the row",
            "model_sessions_seen": meta.get("sessions_seen")}, indent=1))  # trained / early-stopped on
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
