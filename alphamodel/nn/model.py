"""The model: input projection -> Mamba2 stack -> CfC -> multi-horizon direction heads.

Shapes: features (B, K, F) float32 (normalised, NaN-free), time steps (B, K) float32 seconds
since the previous snapshot; output logits (B, K, H), one per label horizon, causal (the
logit at position k sees positions <= k only).

Sources: Mamba2 / SSD — Dao & Gu (2024); CfC — Hasani et al. (2022); pre-norm residual
blocks as in the Mamba2 reference language model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from alphafeat.validation import validate_bool, validate_enum
from alphamodel.enums import CfcImpl, HorizonWeighting, SsdImpl
from alphamodel.errors import UsageError
from alphamodel.nn.cfc import CfC
from alphamodel.nn.ema import InputEMA
from alphamodel.nn.mamba2 import Mamba2, RMSNormGated
from alphamodel.ops.triton.checks import check_tiles
from alphamodel.rules import SIZE, Rule, build, check_fields, enum_rule, float_rule, int_rule

__all__ = ["MODEL_RULES", "ModelConfig", "ModelState", "AlphaModel", "masked_bce_loss", "horizon_weights"]


def _scales(v: Any, o: str) -> tuple[float, ...]:
    """A list of time scales > 0 (rows), possibly empty."""
    if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)):
        raise UsageError(o, "expected a list of time scales in rows (e.g. [32, 128, 512, 2048])", v)
    return tuple(float(float_rule(0.0, open_=True)(x, o)) for x in v)


#: ModelConfig keys and their checks (:meth:`ModelConfig.checked`).
MODEL_RULES: dict[str, Rule] = {
    "n_features": int_rule(0), "n_horizons": SIZE, "d_model": SIZE, "n_layers": SIZE, "d_state": SIZE,
    "headdim": SIZE, "expand": SIZE, "d_conv": SIZE, "chunk_size": SIZE, "cfc_hidden": SIZE,
    "dropout": float_rule(0.0, 1.0), "cfc_impl": enum_rule(CfcImpl), "ssd_impl": enum_rule(SsdImpl),
    "dt_min": float_rule(0.0, open_=True), "dt_max": float_rule(0.0, open_=True), "ema_rows": _scales,
    "ema_encoder": validate_bool,
}  # fmt: skip


@dataclass
class ModelConfig:
    """Model sizes (all ints unless said).

    n_features : input width F (set from the data).
    n_horizons : number of label horizons H (set from the cache metadata).
    d_model, n_layers : residual width and number of Mamba2 blocks.
    d_state, headdim, expand, d_conv, chunk_size : Mamba2 parameters.
    cfc_hidden : CfC units.  cfc_impl : ``"fused"`` (the chunked scan), ``"triton"`` (its
        recurrence as Triton kernels, CUDA) or ``"loop"`` (the reference loop over
        :class:`alphamodel.nn.cfc.CfCCell`), see :class:`alphamodel.nn.cfc.CfC`.
    ssd_impl : ``"chunked"`` (:func:`alphamodel.nn.mamba2.ssd_chunked`, torch) or ``"triton"``
        (:func:`alphamodel.ops.triton.ssd_triton.ssd_scan` and the convolution with its SiLU by
        :func:`alphamodel.ops.triton.conv_triton.causal_conv_silu`: CUDA; ``chunk_size``, ``headdim`` and
        ``d_state`` powers of two >= 16), the same function. With ``"chunked"`` on CUDA, ``mamba_ssm``'s
        kernel runs instead when that optional package imports (:class:`alphamodel.nn.mamba2.Mamba2`).
    The defaults are the small model of ``alphamodel train`` without ``--cache`` (the embedded
    sample: ~16k training rows, which this model starts to memorise within 40 steps, hence the
    dropout); other caches pass sizes with ``--config`` (examples in ``alphamodel/configs/``).
    dropout : float, on the residual stream of each block and on the sequence features (CfC
        state and encoder output) that the heads read; the heads' direct ("wide") path on the
        row's own inputs is never dropped, so the per-row linear model is always available.
    dt_min, dt_max : float, range of the Mamba2 heads' initial step (see :class:`Mamba2`).
    ema_rows : time scales (rows) of the input EMA bank (:class:`alphamodel.nn.ema.InputEMA`),
        empty for none: the averages of every input over each scale join the heads' wide path
        (and, with ``ema_encoder``, the encoder's inputs); the bank's state is carried with the
        rest. On 24 generated quiet sessions feeding them to the encoder too overfitted (the
        validation loss rose from the first epoch), hence the default ``ema_encoder=False``.
    """

    n_features: int = 0
    n_horizons: int = 5
    d_model: int = 32
    n_layers: int = 2
    d_state: int = 16
    headdim: int = 16
    expand: int = 2
    d_conv: int = 4
    chunk_size: int = 32
    cfc_hidden: int = 32
    dropout: float = 0.3
    cfc_impl: str = "fused"
    ssd_impl: str = "chunked"
    dt_min: float = 1e-3
    dt_max: float = 0.1
    ema_rows: tuple[float, ...] = ()
    ema_encoder: bool = False

    def checked(self) -> ModelConfig:
        """A copy with every key checked and normalised (:data:`MODEL_RULES`).

        Raises
        ------
        alphamodel.errors.UsageError
            Naming the key (``model.d_model``), the value and what is allowed; also for keys that
            do not fit together (``expand * d_model`` not a multiple of ``headdim``, a Triton
            scan's sizes not powers of two >= 16).
        """
        v = check_fields(self, MODEL_RULES, "model.")
        if (v["expand"] * v["d_model"]) % v["headdim"]:
            raise UsageError("model.headdim", f"expected a divisor of expand * d_model = {v['expand'] * v['d_model']}",
                             v["headdim"])  # fmt: skip
        if v["cfc_impl"] == CfcImpl.TRITON:
            check_tiles({"model.cfc_hidden": v["cfc_hidden"]}, "cfc_impl 'triton'")
        if v["ssd_impl"] == SsdImpl.TRITON:
            check_tiles({f"model.{k}": v[k] for k in ("chunk_size", "headdim", "d_state")}, "ssd_impl 'triton'")
        return dataclasses.replace(self, **v)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        """Build from a dict, each key checked (:meth:`checked`; UsageError naming ``model.KEY``
        for an unknown key or a bad value)."""
        return build(cls, d, "model").checked()


class _Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = RMSNormGated(cfg.d_model)
        self.mixer = Mamba2(cfg.d_model, d_state=cfg.d_state, headdim=cfg.headdim, expand=cfg.expand,
                            d_conv=cfg.d_conv, chunk_size=cfg.chunk_size, dt_min=cfg.dt_min, dt_max=cfg.dt_max,
                            ssd_impl=cfg.ssd_impl)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, state: tuple | None = None, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, tuple]:
        y, new = self.mixer(self.norm(x), state=state, mask=mask, return_state=True)
        return x + self.drop(y), new


@dataclass
class ModelState:
    """The recurrent state of :class:`AlphaModel` after a window, per stream (batch row).

    blocks : one ``(conv_state, ssm_state)`` per Mamba2 block (see :meth:`Mamba2.forward`).
    cfc : (B, cfc_hidden) float32, the CfC state.
    ema : (B, n_features, len(ema_rows)) float32, the input EMA bank's averages, or None
        (no bank).
    """

    blocks: list[tuple[torch.Tensor, torch.Tensor]]
    cfc: torch.Tensor
    ema: torch.Tensor | None = None

    def detach(self) -> ModelState:
        """The same values cut from the graph (truncated back-propagation between windows)."""
        return ModelState([(c.detach(), s.detach()) for c, s in self.blocks], self.cfc.detach(),
                          None if self.ema is None else self.ema.detach())

    def reset(self, rows: torch.Tensor) -> ModelState:
        """Zero the state of the streams where ``rows`` (B,) bool is True (a new session starts)."""
        def z(t: torch.Tensor) -> torch.Tensor:
            return torch.where(rows.view(-1, *([1] * (t.dim() - 1))), torch.zeros_like(t), t)
        return ModelState([(z(c), z(s)) for c, s in self.blocks], z(self.cfc),
                          None if self.ema is None else z(self.ema))


class AlphaModel(nn.Module):
    """Mamba2 -> CfC -> heads. ``forward(x (B,K,F), dt (B,K)) -> logits (B,K,H)`` float32.

    The heads are linear in the CfC state, the encoder output and the position's own inputs
    (so a per-row logistic regression is a special case of the model), and, with
    ``cfg.ema_rows``, in the inputs' moving averages over those time scales (then a logistic
    regression on the averages is one too).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.n_features <= 0:
            raise UsageError("model.n_features", "expected the number of input features >= 1", cfg.n_features)
        self.cfg = cfg
        self.ema = InputEMA(cfg.n_features, cfg.ema_rows) if cfg.ema_rows else None
        n_in = cfg.n_features + (self.ema.n_out if self.ema is not None else 0)
        self.embed = nn.Linear(n_in if cfg.ema_encoder else cfg.n_features, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.norm_f = RMSNormGated(cfg.d_model)
        self.cfc = CfC(cfg.d_model, cfg.cfc_hidden, impl=cfg.cfc_impl)
        # heads read the CfC state, the encoder output and (a linear "wide" path) the row's inputs
        self.heads = nn.Linear(cfg.cfc_hidden + cfg.d_model + n_in, cfg.n_horizons)
        if self.ema is not None:  # the averages start with no say in the logits (large inputs, many)
            with torch.no_grad():
                self.heads.weight[:, -self.ema.n_out :] = 0.0
        self.drop_seq = nn.Dropout(cfg.dropout)

    def inputs(self, x: torch.Tensor, state: ModelState | None = None, mask: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The row's inputs as the heads' wide path reads them: ``x`` (B, K, F), with
        ``cfg.ema_rows`` followed by the EMA bank's outputs (B, K, F * S), and the bank's state
        after the window (None without a bank). ``state``, ``mask``: as in :meth:`forward`."""
        if self.ema is None:
            return x, None
        y, e = self.ema(x, None if state is None else state.ema, mask)
        return torch.cat([x, y.to(x.dtype)], dim=-1), e

    def encode(self, x: torch.Tensor, state: ModelState | None = None, mask: torch.Tensor | None = None,
               return_state: bool = False) -> torch.Tensor | tuple[torch.Tensor, list]:
        """The Mamba2 stack: (B, K, F) -> (B, K, d_model) (with ``cfg.ema_encoder`` ``x`` is the
        widened input of :meth:`inputs`); with ``return_state`` also each block's ``(conv_state,
        ssm_state)`` after the window (``state``, ``mask``: as in :meth:`forward`)."""
        h = self.embed(x)
        states = []
        for i, blk in enumerate(self.blocks):
            h, st = blk(h, None if state is None else state.blocks[i], mask)
            states.append(st)
        h = self.norm_f(h)
        return (h, states) if return_state else h

    def forward(self, x: torch.Tensor, dt: torch.Tensor, mask: torch.Tensor | None = None,
                state: ModelState | None = None, return_state: bool = False
                ) -> torch.Tensor | tuple[torch.Tensor, ModelState]:
        """Logits (B, K, H) float32 of windows ``x`` (B, K, F) with steps ``dt`` (B, K) seconds.

        ``mask`` (B, K) bool: False positions are padding, neutral for the real ones (their
        logits are meaningless). ``state``: the :class:`ModelState` after the previous window
        of each stream (stateful context: consecutive windows equal one long window);
        ``return_state=True`` also returns the state after this window.
        """
        seq, wide, after = self._run(x, dt, mask, state)
        logits = self.heads(torch.cat([self.drop_seq(seq), wide.to(seq.dtype)], dim=-1)).float()
        if return_state:
            return logits, after
        return logits

    def embedding(self, x: torch.Tensor, dt: torch.Tensor, mask: torch.Tensor | None = None,
                  state: ModelState | None = None) -> tuple[torch.Tensor, ModelState]:
        """What the heads read besides the row's own inputs: ``concat(CfC state, Mamba2 output)``
        at every position, and the :class:`ModelState` after the window.

        ``x`` (B, K, F) float32 normalised features, ``dt`` (B, K) float32 seconds since the
        previous row; ``mask`` and ``state`` as in :meth:`forward`. Returns the embedding
        (B, K, cfc_hidden + d_model) in the encoder's dtype (float32, or bfloat16 under autocast;
        no dropout) and the state. (Named ``embedding``: ``embed`` is the input projection.)
        """
        seq, _, after = self._run(x, dt, mask, state)
        return seq, after

    def scores(self, x: torch.Tensor, dt: torch.Tensor, mask: torch.Tensor | None = None,
               state: ModelState | None = None) -> tuple[torch.Tensor, torch.Tensor, ModelState]:
        """Forward-only scoring in one pass: the logits (B, K, H) float32 of :meth:`forward`
        without dropout, the :meth:`embedding` they read, and the state after the window
        (arguments as in :meth:`forward`)."""
        seq, wide, after = self._run(x, dt, mask, state)
        return self.heads(torch.cat([seq, wide.to(seq.dtype)], dim=-1)).float(), seq, after

    def _run(self, x: torch.Tensor, dt: torch.Tensor, mask: torch.Tensor | None, state: ModelState | None
             ) -> tuple[torch.Tensor, torch.Tensor, ModelState]:
        """``(embedding, widened inputs, state after)`` of one window."""
        wide, ema = self.inputs(x, state, mask)
        h, blocks = self.encode(wide if self.cfg.ema_encoder else x, state, mask, return_state=True)
        s = self.cfc(h, dt, None if state is None else state.cfc, mask)
        return torch.cat([s.to(h.dtype), h], dim=-1), wide, ModelState(blocks, s[:, -1].float(), ema)


def horizon_weights(horizons: Sequence[int], window: int, scheme: str = "window") -> torch.Tensor:
    """Per-horizon loss weights, float32 shape (H,).

    ``"window"``: ``w_h = min(1, K / h)`` for window length K (a horizon far beyond the window
    counts less); ``"equal"``: all ones.
    """
    if validate_enum(scheme, HorizonWeighting, "horizon_weighting") == HorizonWeighting.EQUAL:
        return torch.ones(len(horizons))
    return torch.tensor([min(1.0, window / h) for h in horizons], dtype=torch.float32)


def masked_bce_loss(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Binary cross-entropy over horizons, ignoring NaN labels.

    ``l = BCEWithLogits(reduction="none")`` on every entry; entries with a NaN label (or
    ``mask`` False) are removed with ``torch.where`` (NaN * 0 would be NaN). Each horizon's
    loss is the mean over its valid entries; the result is the ``weights``-weighted mean of
    those, over horizons that have at least one valid entry (0 when none has).

    Parameters
    ----------
    logits : torch.Tensor, shape (..., H)
    labels : torch.Tensor, shape (..., H), values 1, 0 or NaN
    weights : torch.Tensor, shape (H,), optional (default ones)
    mask : torch.Tensor of bool, shape (...) (without H), optional: positions that count.

    Returns
    -------
    torch.Tensor, scalar float32.
    """
    logits = logits.float()
    labels = labels.float()
    valid = ~torch.isnan(labels)
    if mask is not None:
        valid = valid & mask.unsqueeze(-1)
    target = torch.where(valid, labels, torch.zeros_like(labels))
    loss = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    dims = tuple(range(loss.dim() - 1))
    count = valid.sum(dim=dims)
    per_h = loss.sum(dim=dims) / count.clamp_min(1)
    w = torch.ones_like(per_h) if weights is None else weights.to(per_h)
    w = w * (count > 0)
    return (w * per_h).sum() / w.sum().clamp_min(1e-12)
