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

import math

import torch
from torch import nn

from alphamodel.errors import UsageError

__all__ = ["CfCCell", "CfC", "lecun_tanh"]


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


class CfC(nn.Module):
    """A CfC cell run across positions: (B, L, input) with steps (B, L) -> states (B, L, hidden).

    ``forward(u, dt, x0=None)`` returns all states (B, L, hidden); ``x0`` (B, hidden) is the
    state before position 0 (zeros by default).
    """

    def __init__(self, input_size: int, hidden_size: int, **kw: float) -> None:
        super().__init__()
        self.cell = CfCCell(input_size, hidden_size, **kw)

    def forward(self, u: torch.Tensor, dt: torch.Tensor, x0: torch.Tensor | None = None) -> torch.Tensor:
        b, L, _ = u.shape
        if dt.shape != (b, L):
            raise UsageError("dt", f"expected time steps of shape ({b}, {L})", tuple(dt.shape))
        work = torch.promote_types(u.dtype, torch.float32)
        x = x0 if x0 is not None else torch.zeros(b, self.cell.hidden_size, dtype=work, device=u.device)
        out = []
        for t in range(L):
            x = self.cell(u[:, t], x, dt[:, t : t + 1])
            out.append(x)
        return torch.stack(out, dim=1)
