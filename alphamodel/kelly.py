"""Regime-volatility Kelly position sizing.

For a bet whose PnL per contract over the holding horizon has mean ``mu`` and variance
``sigma^2``, the growth-optimal (Kelly) exposure is ``f* = mu / sigma^2`` times the capital
(Kelly 1956; the continuous-time form ``f* = mu / sigma^2`` of Merton 1969 and Thorp 2006,
"The Kelly criterion in blackjack, sports betting and the stock market", section 7). Here:

    size = clip(k * edge / sigma^2, 0, max_size)      (contracts, fractional)

* ``edge`` — the policy's expected PnL of the chosen direction over its return horizon minus
  that of staying flat, from the C51 means (ticks per contract);
* ``sigma^2 = rv^2 * horizon_s`` — the variance of the mid over the same horizon from the
  regime volatility ``rv``: the cache's irregular-time EMA of realised volatility
  (``realized_vol_*``, ticks / sqrt(s), Andersen & Bollerslev 1998) at the decision row, and
  ``horizon_s`` the mean duration of the horizon in seconds measured on the *training*
  sessions; floored at ``var_floor`` ticks^2 (a quiet book or a NaN volatility does not blow
  the size up);
* ``k`` — capital times the Kelly fraction, in ticks (fractional Kelly: the full fraction is
  known to be too aggressive under estimation error, MacLean, Thorp & Ziemba 2010).

Sizes are fractional contracts (a scale of exposure; round them for live trading). Unit size
(``--no-kelly``) is the plain ``{-1, 0, +1}`` policy.
"""

from __future__ import annotations

import torch

__all__ = ["kelly_size"]


def kelly_size(edge: torch.Tensor, rv: torch.Tensor, horizon_s: float, k: float = 2.0, max_size: float = 2.0,
               var_floor: float = 0.25) -> torch.Tensor:
    """``clip(k * edge / max(rv^2 * horizon_s, var_floor), 0, max_size)``.

    edge : (N,) ticks per contract. rv : (N,) ticks / sqrt(s) (NaN reads as 0, hence the floor).
    Returns (N,) float32 contracts.
    """
    var = torch.nan_to_num(rv.float(), nan=0.0).square() * float(horizon_s)
    return (k * edge.float() / var.clamp_min(var_floor)).clamp(0.0, max_size)
