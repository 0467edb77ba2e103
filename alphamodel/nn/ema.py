"""Multi-scale exponential moving averages of the inputs, per row, with a carried state.

A fixed bank of linear leaky integrators on the model's (normalised) inputs, one per input and
time scale ``T`` (rows):

    e_t = lam * e_(t-1) + (1 - lam) * x_t        lam = exp(-1 / T)
    out_t = clip((e_t - mean) / std, -clip, clip)

``mean`` and ``std`` per input and scale are fitted on the training rows (:meth:`InputEMA.fit`,
as the inputs' own normaliser is); before a fit they are ``0`` and ``1 / g`` with
``g = sqrt((1 + lam) / (1 - lam))``, the scale that gives white noise of unit variance unit
variance again. Without the fit, persistent inputs (a volatility, a trade rate) would leave the
bank multiplied by ``g`` (64 at 2048 rows) and sit at the clip: a per-session level that the
heads memorise; with it every output enters at the scale of a normalised input.

Why: a signal carried by the order flow of the last few hundred rows (the generator's
``history`` signal integrates signed volume with an e-folding of 600 book events) must be
summed over that many rows. The Mamba2 heads initialise with time scales of at most a few
hundred rows, and truncated back-propagation over a window of K rows gives almost no gradient
towards longer ones; this bank has no parameter before the sum, so nothing about it needs a
gradient through time — the heads and the encoder learn which averages to use from the
window's gradient alone. The same device as the damped EMA of MEGA (Ma et al. 2023, "Mega:
Moving Average Equipped Gated Attention", ICLR), here with fixed, log-spaced time scales.

Masked positions (padding) have ``lam = 1`` and no input: the state passes through them
unchanged, so they are neutral for the real positions and for the carried state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from alphamodel.errors import UsageError
from alphamodel.nn.mamba2 import segsum

__all__ = ["InputEMA"]


class InputEMA(nn.Module):
    """The EMA bank: ``forward(x (B, L, F), state (B, F, S) | None, mask (B, L) | None)`` ->
    ``(out (B, L, F * S), state (B, F, S))``, float32 (float64 for float64 input).

    ``out[..., f * S + s]`` is input ``f`` averaged over time scale ``rows[s]``. ``state`` holds
    the un-scaled averages ``e`` after the last real row (zeros for a new stream). No trained
    parameters (``mean`` and ``std`` are buffers set by :meth:`fit`);
    ``chunk`` rows are summed at once (a (chunk x chunk) decay matrix per scale, as the SSD's
    within-chunk form), the chunks chained through the state; exact, equal to the row-by-row
    recursion (:meth:`reference`) to rounding.
    """

    def __init__(self, n_features: int, rows: Sequence[float], clip: float = 10.0, chunk: int = 64) -> None:
        super().__init__()
        if not rows or any(not math.isfinite(float(r)) or float(r) <= 0 for r in rows):
            raise UsageError("ema_rows", "expected time scales > 0 (rows)", list(rows))
        self.n_features, self.rows, self.clip, self.chunk = n_features, [float(r) for r in rows], clip, chunk
        lam = torch.tensor([math.exp(-1.0 / r) for r in self.rows], dtype=torch.float64)
        self.register_buffer("log_lam", torch.log(lam), persistent=False)  # (S,)
        gain = torch.sqrt((1 + lam) / (1 - lam)).to(torch.float32)
        # output statistics (F, S), saved with the model; fitted on training rows by fit()
        self.register_buffer("mean", torch.zeros(n_features, len(self.rows)))
        self.register_buffer("std", (1.0 / gain).expand(n_features, -1).clone())

    @property
    def n_out(self) -> int:
        """Width of the output: ``n_features * len(rows)``."""
        return self.n_features * len(self.rows)

    def _out(self, e: torch.Tensor) -> torch.Tensor:
        """(B, L, F, S) averages -> (B, L, F * S) standardised, clipped outputs."""
        y = ((e - self.mean.to(e.dtype)) / self.std.to(e.dtype)).clamp(-self.clip, self.clip)
        return y.reshape(*e.shape[:2], -1)

    @torch.no_grad()
    def fit(self, runs: Iterable[torch.Tensor], min_std: float = 1e-6) -> None:
        """Set ``mean`` and ``std`` to the statistics of the averages over ``runs``: each a
        (L, F) tensor of consecutive normalised input rows of one stream, started from a zero
        state (a session, or a run of training rows in it). Memory: one run at a time."""
        n, s1, s2 = 0, 0.0, 0.0
        for x in runs:
            e = self._averages(x.unsqueeze(0).to(torch.float64))[0][0]  # (L, F, S)
            n, s1, s2 = n + e.shape[0], s1 + e.sum(0), s2 + (e * e).sum(0)
        if n == 0:
            return
        mean = s1 / n
        std = (s2 / n - mean * mean).clamp_min(0).sqrt()
        self.mean.copy_(mean.to(self.mean.dtype))
        self.std.copy_(torch.where(std > min_std, std, torch.ones_like(std)).to(self.std.dtype))

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(device_type=x.device.type, enabled=False):  # the sums stay in fp32
            e, last = self._averages(x, state, mask)
            return self._out(e), last

    def _averages(self, x: torch.Tensor, state: torch.Tensor | None = None, mask: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The un-scaled averages (B, L, F, S) and the state after the window."""
        b, L, f = x.shape
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        S = len(self.rows)
        log_lam = self.log_lam.to(work)
        keep = torch.ones(b, L, dtype=work, device=x.device) if mask is None else mask.to(work)
        e = torch.zeros(b, f, S, dtype=work, device=x.device) if state is None else state.to(work)
        a = keep.unsqueeze(-1) * log_lam  # (B, L, S): log decay of each row, 0 where masked
        u = x.to(work) * keep.unsqueeze(-1)  # (B, L, F)
        outs = []
        for s0 in range(0, L, self.chunk):
            ac = a[:, s0 : s0 + self.chunk].transpose(1, 2)  # (B, S, Q)
            # the input weight of row j is (1 - lam_j) (0 where masked: lam_j = 1)
            w = -torch.expm1(ac)  # (B, S, Q)
            dec = torch.exp(segsum(ac))  # (B, S, Q, Q): prod of lam over rows j+1..t
            inner = torch.einsum("bstj,bsj,bjf->btfs", dec, w, u[:, s0 : s0 + self.chunk])
            carry = torch.exp(torch.cumsum(ac, dim=-1)).transpose(1, 2).unsqueeze(2) * e.unsqueeze(1)
            ec = inner + carry  # (B, Q, F, S)
            e = ec[:, -1]
            outs.append(ec)
        return torch.cat(outs, dim=1), e

    @torch.no_grad()
    def reference(self, x: torch.Tensor, state: torch.Tensor | None = None, mask: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same, row by row (the slow reference of the tests)."""
        b, L, f = x.shape
        lam = torch.exp(self.log_lam).to(torch.float64)
        e = torch.zeros(b, f, len(self.rows), dtype=torch.float64) if state is None else state.to(torch.float64)
        outs = []
        for t in range(L):
            new = lam * e + (1 - lam) * x[:, t].to(torch.float64).unsqueeze(-1)
            e = new if mask is None else torch.where(mask[:, t].view(-1, 1, 1), new, e)
            outs.append(e)
        return self._out(torch.stack(outs, dim=1)), e
