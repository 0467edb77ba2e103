"""Queue-position models of a resting order at one price level (torch, elementwise over N).

A resting order at price ``P`` tracks ``ahead``: the displayed size in front of it at ``P``.
Trades at ``P`` always advance it (:func:`advance_by_trades`; what trades beyond ``ahead``
fills the order). What the level's *size* change says, once the row's trades are taken out,
depends on the model (:func:`depth_update`):

``riskaverse``
    Only trades advance the order; a smaller level caps it (nobody can be ahead of us for more
    than the level holds): ``ahead = min(ahead, size)``. hftbacktest's ``RiskAdverseQueueModel``.
``power:N`` / ``log``
    hftbacktest's ``ProbQueueModel`` (``hftbacktest/src/backtest/models/queue.rs``,
    ``ProbQueueModel::depth``; the numba version ``hftbacktest/models/queue.py``): when the level
    falls from ``prev`` to ``new`` and the trades at it in the same interval were ``v``, the
    cancelled quantity is ``chg = prev - new - v``. For ``chg < 0`` (the level grew) only the cap
    applies. Otherwise, with ``front = ahead`` and ``back = prev - front``,

        prob  = f(back) / (f(back) + f(front))          (the cancel was *behind* us; NaN -> 1)
        est   = front - (1 - prob) chg + min(back - prob chg, 0)
        ahead = min(est, new)

    with ``f(x) = x**N`` (``PowerProbQueueFunc``) or ``f(x) = log(1 + x)`` (``LogProbQueueFunc``).
    Hand case: ahead 10, behind 10, the level drops by 6 with no trade, ``power:2``:
    ``prob = 100 / 200``, ``est = 10 - 0.5 * 6 + min(10 - 3, 0) = 7``. Unlike hftbacktest, a
    cancel never *fills* the order: ``ahead`` is floored at 0 (only trades and the far side
    fill; a fill without a trade is the complaint these models are known for).
``through``
    Never advanced by the queue (``ahead`` infinite at our level): the order fills only when
    the far side reaches its price or trades go *through* it. A lower bound on fills.

Every model here satisfies ``ahead(power/log) <= ahead(riskaverse) <= ahead(through)`` given
the same inputs, so fills are ordered the other way round (a test holds this).
"""

from __future__ import annotations

import torch

from alphamodel.backtest.config import QUEUE_KINDS, parse_queue

__all__ = ["QUEUE_KINDS", "QTY_EPS", "parse_queue", "advance_by_trades", "depth_update"]

#: Contracts below which a quantity is float rounding (the probabilistic models give fractional
#: queue positions; float32 sums of them differ from float64 by ~1e-6).
QTY_EPS = 1e-4


def advance_by_trades(ahead: torch.Tensor, traded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Trades of ``traded`` contracts at the order's price: ``(new ahead >= 0, excess)``, the
    excess being what traded beyond the queue ahead in whole contracts (rounded down, as
    hftbacktest's ``is_filled`` rounds to the lot; a probabilistic queue is fractional): it
    fills the order, up to its size."""
    a = ahead - traded
    return a.clamp_min(0.0), torch.floor((-a).clamp_min(0.0) + QTY_EPS)


def _f(x: torch.Tensor, kind: str, n: float) -> torch.Tensor:
    return torch.log1p(x) if kind == "log" else x ** n


def depth_update(ahead: torch.Tensor, prev: torch.Tensor, new: torch.Tensor, traded: torch.Tensor, kind: str,
                 n: float) -> torch.Tensor:
    """Queue ahead after the level's displayed size went from ``prev`` to ``new`` while
    ``traded`` contracts traded at it (``ahead`` already advanced by those trades); all (N,)
    float, contracts. ``kind``/``n`` from :func:`parse_queue`. Returns the new ``ahead``, in
    ``[0, new]`` (``through``: unchanged)."""
    if kind == "through":
        return ahead
    capped = torch.minimum(ahead, new)
    if kind == "riskaverse":
        return capped
    chg = prev - new - traded
    front, back = ahead, prev - ahead
    fb, ff = _f(back, kind, n), _f(front, kind, n)
    prob = fb / (fb + ff)
    prob = torch.where(torch.isfinite(prob), prob, torch.ones_like(prob))
    est = front - (1.0 - prob) * chg + (back - prob * chg).clamp_max(0.0)
    return torch.where(chg < 0, capped, torch.minimum(est, new)).clamp_min(0.0)
