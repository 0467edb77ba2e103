"""Closed-form continuous-time (CfC) recurrent cell, Hasani et al. (2022).

Reference: R. Hasani, M. Lechner, A. Amini, L. Liebenwein, A. Ray, M. Tschaikowski,
G. Teschl, D. Rus, "Closed-form continuous-time neural networks", Nature Machine
Intelligence 4, 992-1003 (2022), eq. (10):

    x(t + dt) = sigma(-f * dt) * g + (1 - sigma(-f * dt)) * h

with ``f, g, h`` heads on a shared backbone of the input and the previous state. Here the
elapsed time enters through trainable, positive time constants ``tau`` (seconds, one per
unit): ``sigma(-f * dt / tau)``; ``g`` and ``h`` use tanh, the backbone LeCun's tanh
(1.7159 tanh(2x/3)), as in the paper's reference code.

The time step is per sample: shape (B, 1) (or (B,), reshaped), broadcast over the units of
that sample only — the ``ncps`` package broadcasts a (B,) step against (B, units) wrongly
for some shapes, so this is an implementation of its own.
"""

from __future__ import annotations

import importlib.util
import math

import torch
from torch import nn

from alphafeat.validation import validate_enum
from alphamodel.enums import CfcImpl
from alphamodel.errors import UsageError
from alphamodel.ops.triton.checks import check_tiles

__all__ = ["CfCCell", "CfC", "check_triton", "lecun_tanh"]


def lecun_tanh(x: torch.Tensor) -> torch.Tensor:
    """LeCun's scaled tanh, ``1.7159 * tanh(2x / 3)`` (LeCun et al. 1998)."""
    return 1.7159 * torch.tanh(0.666 * x)


class CfCCell(nn.Module):
    """One CfC step (Hasani et al. 2022, eq. 10) with per-sample elapsed time.

    Parameters
    ----------
    input_size : int
        Width of the input u_t.
    hidden_size : int
        Number of units of the state x_t.
    backbone_size : int
        Width of the shared backbone layer (default: ``hidden_size``).
    tau_min, tau_max : float
        Range (seconds) of the initial time constants, log-uniform.

    ``forward(u, x, dt)``: u (B, input_size), x (B, hidden_size), dt (B, 1) or (B,) seconds,
    returns the new state (B, hidden_size) in float32 (float64 for a float64 state), also under
    bf16 autocast (the time gate is never computed in bf16).
    """

    def __init__(
        self, input_size: int, hidden_size: int, backbone_size: int | None = None,
        tau_min: float = 1e-3, tau_max: float = 10.0,
    ) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        bb = backbone_size or hidden_size
        self.backbone = nn.Linear(input_size + hidden_size, bb)
        self.fgh = nn.Linear(bb, 3 * hidden_size)  # the f, g and h heads, fused: [f | g | h]
        log_tau = torch.empty(hidden_size).uniform_(math.log(tau_min), math.log(tau_max))
        self.log_tau = nn.Parameter(log_tau)  # tau = exp(log_tau) > 0, in seconds

    @staticmethod
    def check_dt(dt: torch.Tensor, batch: int) -> torch.Tensor:
        """Return ``dt`` as (B, 1); UsageError (a ValueError) for any other shape (no silent broadcast)."""
        if dt.dim() == 1 and dt.shape[0] == batch:
            return dt.unsqueeze(1)
        if dt.dim() == 2 and dt.shape == (batch, 1):
            return dt
        raise UsageError("dt", f"expected a time step of shape ({batch}, 1) or ({batch},)", tuple(dt.shape))

    def forward(self, u: torch.Tensor, x: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        dt = self.check_dt(dt, u.shape[0])
        work = torch.promote_types(x.dtype, torch.float32)  # the gate and state: float32 at least
        z = lecun_tanh(self.backbone(torch.cat([u, x.to(u.dtype)], dim=-1)))
        f, g, h = self.fgh(z).to(work).chunk(3, dim=-1)
        gate = torch.sigmoid(-f * dt.to(work) / torch.exp(self.log_tau.to(work)))
        return gate * torch.tanh(g) + (1.0 - gate) * torch.tanh(h)


def _steps(uw: torch.Tensor, dt: torch.Tensor, keep: torch.Tensor, x: torch.Tensor, w_x: torch.Tensor,
           w_fgh: torch.Tensor, b_fgh: torch.Tensor, inv_tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``T`` CfC steps of the fused scan (the body that ``torch.compile`` turns into one kernel set).

    uw (B, T, bb): the input part of the backbone, ``W_u u_t + b``, for every position at once;
    dt (B, T) seconds; keep (B, T) bool (False: a masked position, the state is carried
    unchanged); x (B, n) the state before the chunk. Returns the states (B, T, n) and the last.
    """
    n = x.shape[-1]
    out = []
    for t in range(uw.shape[1]):
        z = lecun_tanh(uw[:, t] + x.to(w_x.dtype) @ w_x.t())
        fgh = torch.addmm(b_fgh, z, w_fgh.t()).to(x.dtype)
        f, g, h = fgh[:, :n], fgh[:, n : 2 * n], fgh[:, 2 * n :]
        gate = torch.sigmoid(-f * (dt[:, t : t + 1] * inv_tau))
        th = torch.tanh(h)
        new = th + gate * (torch.tanh(g) - th)
        x = torch.where(keep[:, t : t + 1], new, x)
        out.append(x)
    return torch.stack(out, dim=1), x


class CfC(nn.Module):
    """A CfC cell run across positions: (B, L, input) with steps (B, L) -> states (B, L, hidden).

    ``forward(u, dt, x0=None, mask=None)`` returns all states (B, L, hidden); ``x0`` (B, hidden)
    is the state before position 0 (zeros by default; pass the last state of the previous window
    to carry it, see :meth:`alphamodel.nn.model.AlphaModel.forward`). ``mask`` (B, L) bool: False
    positions (padding) leave the state unchanged, so they are neutral for the real positions.

    ``impl``: ``"loop"`` calls :class:`CfCCell` at each position (the slow reference);
    ``"fused"`` (default) computes the input half of the backbone for all positions in one
    matrix product and runs the recurrent half in chunks of ``chunk`` steps through
    :func:`_steps`, which :meth:`compile_scan` hands to ``torch.compile`` (one fused kernel set
    per chunk, forward and backward, instead of ~10 kernels per position); ``"triton"`` runs the
    same recurrent half as one Triton kernel for all positions, and its backward as one more
    (:mod:`alphamodel.ops.triton.cfc_triton`; CUDA, float32 state; ``block_b`` batch rows, ``num_warps``
    warps and ``num_stages`` pipeline stages per program, see :func:`alphamodel.ops.triton.cfc_triton.scan`;
    the hidden and backbone sizes must be powers of two >= 16, else UsageError, as without the
    triton package). All are equal to rounding (tests/test_model_context.py,
    tests/test_cfc_triton.py). The cell is nonlinear in the state (the state enters the
    backbone's tanh), so there is no exact parallel (associative-scan) form.
    """

    def __init__(self, input_size: int, hidden_size: int, impl: str = "fused", chunk: int = 16,
                 block_b: int = 16, num_warps: int = 8, num_stages: int | None = None, **kw: float) -> None:
        super().__init__()
        impl = validate_enum(impl, CfcImpl, "impl")
        self.cell = CfCCell(input_size, hidden_size, **kw)
        self.impl, self.chunk = impl, chunk
        self.block_b, self.num_warps, self.num_stages = block_b, num_warps, num_stages
        self._steps = _steps
        if impl == CfcImpl.TRITON:
            check_triton(self.cell, block_b)

    def compile_scan(self, **kw: object) -> None:
        """``torch.compile`` the chunk body of the fused scan (``kw`` go to ``torch.compile``)."""
        self._steps = torch.compile(_steps, dynamic=False, **kw)

    def forward(self, u: torch.Tensor, dt: torch.Tensor, x0: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        b, L, _ = u.shape
        if dt.shape != (b, L):
            raise UsageError("dt", f"expected time steps of shape ({b}, {L})", tuple(dt.shape))
        work = torch.promote_types(u.dtype, torch.float32)
        if x0 is None:
            x0 = torch.zeros(b, self.cell.hidden_size, dtype=work, device=u.device)
        x = x0.to(work)
        if self.impl == "loop":
            out = []
            for t in range(L):
                new = self.cell(u[:, t], x, dt[:, t : t + 1])
                x = new if mask is None else torch.where(mask[:, t : t + 1], new, x)
                out.append(x)
            return torch.stack(out, dim=1)
        uw, w_x, w_fgh, b_fgh = self._recurrent_weights(u)
        inv_tau = torch.exp(-self.cell.log_tau.to(work))
        keep = torch.ones(b, L, dtype=torch.bool, device=u.device) if mask is None else mask.bool()
        if self.impl == CfcImpl.TRITON:
            return self._triton(uw, dt, keep, x, w_x, w_fgh, b_fgh, inv_tau).to(work)
        outs = []
        with torch.autocast(device_type=u.device.type, enabled=False):
            for s in range(0, L, self.chunk):
                e = min(L, s + self.chunk)
                y, x = self._steps(uw[:, s:e], dt[:, s:e].to(work), keep[:, s:e], x, w_x, w_fgh, b_fgh, inv_tau)
                outs.append(y)
        return torch.cat(outs, dim=1)

    def _recurrent_weights(self, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(uw, w_x, w_fgh, b_fgh)`` of the fused scans: ``uw = W_u u + b`` (B, L, bb) for all
        positions in one product, ``w_x`` (bb, n) the state's half of the backbone, the heads
        (3n, bb) and (3n,); all in the autocast dtype under autocast, else in float32 at least."""
        c = self.cell
        n_in = c.input_size
        w = c.backbone.weight
        # under autocast the products run in bf16; the gate and the state stay in float32
        uw = nn.functional.linear(u, w[:, :n_in], c.backbone.bias)
        parts = (uw, w[:, n_in:], c.fgh.weight, c.fgh.bias)
        if torch.is_autocast_enabled(u.device.type):
            lp = torch.get_autocast_dtype(u.device.type)
            return tuple(p.to(lp) for p in parts)
        work = torch.promote_types(u.dtype, torch.float32)
        return tuple(p.to(work) for p in parts)

    def _triton(self, uw: torch.Tensor, dt: torch.Tensor, keep: torch.Tensor, x0: torch.Tensor,
                w_x: torch.Tensor, w_fgh: torch.Tensor, b_fgh: torch.Tensor, inv_tau: torch.Tensor) -> torch.Tensor:
        """The scan in :mod:`alphamodel.ops.triton.cfc_triton` (float32 states; float64 inputs run in float32)."""
        from alphamodel.ops.triton import cfc_triton

        cfc_triton.check_device(uw, "impl")
        f32 = torch.float32
        if uw.dtype == torch.float64:
            uw, w_x, w_fgh, b_fgh = uw.to(f32), w_x.to(f32), w_fgh.to(f32), b_fgh.to(f32)
        return cfc_triton.scan(uw, dt.to(f32), keep, x0.to(f32), w_x, w_fgh, b_fgh, inv_tau.to(f32),
                               self.block_b, self.num_warps, self.num_stages)


def check_triton(cell: CfCCell, block_b: int = 16) -> None:
    """UsageError unless ``impl="triton"`` can run ``cell``: the triton package importable, and
    the hidden size, the backbone width and ``block_b`` powers of two >= 16 (``tl.dot`` tiles)."""
    if importlib.util.find_spec("triton") is None:
        raise UsageError("impl", "'triton' needs the triton package (pip install triton; it comes with CUDA "
                         "builds of torch)", "triton")
    check_tiles({"hidden_size": cell.hidden_size, "backbone_size": cell.fgh.in_features, "block_b": block_b},
                "impl 'triton'")
