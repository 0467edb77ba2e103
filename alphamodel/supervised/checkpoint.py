"""A trained model on disk: :func:`save_model` writes ``model.safetensors`` + ``config.json``,
:func:`load_model` reads them back; :func:`resolve_device` and :func:`check_device` say where a
model can run."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import torch

from alphafeat import errors as af
from alphafeat.validation import Device, validate_enum
from alphamodel.data.cache import Normaliser
from alphamodel.errors import AlphamodelError, ConfigError, UsageError
from alphamodel.nn.model import AlphaModel, ModelConfig
from alphamodel.supervised.outputs import save_tensors

log = logging.getLogger(__name__)

__all__ = ["TRITON_FALLBACK", "check_device", "load_model", "resolve_device", "save_model"]


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


def save_model(out: Path, model: AlphaModel, norm: Normaliser, meta: dict) -> None:
    """Write ``out/model.safetensors`` (the weights, and the normaliser as ``norm.mean`` / ``norm.std``
    float64; metadata ``{"format": "alphamodel-1"}``) and ``out/config.json`` (``meta``), as
    :func:`load_model` reads them."""
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
            raise UsageError(f"model.{key}", f"'triton' runs on CUDA (train.device is {device.type}); use "
                                  f"'{other}'", "triton")


def load_model(out: str | os.PathLike[str], device: str = "cpu") -> tuple[AlphaModel, Normaliser, dict]:
    """Load ``model.safetensors`` + ``config.json`` written by :func:`save_model` (at the end of
    :func:`alphamodel.supervised.train.train`).

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
            raise af.InputError(p, "missing (not an alphamodel output directory)")
    try:
        meta = json.loads(cfg_path.read_text())
        model_cfg, norm = meta["model"], Normaliser.from_dict(meta["normaliser"])
    except KeyError as e:
        raise af.InputError(cfg_path, f"not an alphamodel config (no key {e.args[0]!r})") from e
    except (OSError, ValueError, TypeError) as e:
        raise af.InputError(cfg_path, f"not an alphamodel config ({type(e).__name__}: {e})") from e
    for key, other in TRITON_FALLBACK.items():
        if model_cfg.get(key) == "triton" and torch.device(device).type != "cuda":
            # the same weights and function; the Triton kernels run on CUDA only
            log.info("%s: %s 'triton' runs as '%s' on %s", cfg_path, key, other, device)
            model_cfg = {**model_cfg, key: other}
    try:
        model = AlphaModel(ModelConfig.from_dict(model_cfg))
    except af.UsageError as e:
        raise ConfigError(cfg_path, e.option, e.problem) from None
    try:
        state = load_file(str(w_path), device=device)
    except (OSError, SafetensorError) as e:
        raise af.InputError(w_path, f"cannot be read as safetensors ({e})") from e
    state.pop("norm.mean", None)
    state.pop("norm.std", None)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # torch's first line is a header; name the first tensor that differs
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        first = (lines[1] if len(lines) > 1 else lines[0] if lines else "no detail").rstrip(".")
        more = f"; {len(lines) - 2} more" if len(lines) > 2 else ""
        raise af.InputError(w_path, f"weights do not match {cfg_path} ({first}{more})") from e
    return model.to(device).eval(), norm, meta
