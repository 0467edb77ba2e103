"""A vectorised trading environment over an alphafeat cache (torch; CPU or GPU, same code).

N environments step together; each sits at a row ``t`` of the flattened cache (all segments —
one front-month contract in one session each — end to end) and holds a position ``pos``
(contracts, signed). A step is one *decision*: the policy gives a target position ``q`` per
environment, the environment trades ``q - pos`` at row ``t`` and holds ``q`` for ``stride``
rows, or up to the segment's last row, whichever comes first. Everything is a handful of
elementwise tensor ops over the N environments (no Python per environment).

Prices are in ticks (``mid / tick``; float32 is exact for half-tick prices below 2^23 ticks).
Fills cross the spread: a buy fills at the ask, a sell at the bid of the row where it is
decided (the cache's top of book, ``bid_px_00`` / ``ask_px_00``), plus ``fee`` ticks per
contract per side. Equity is marked to the mid, so a step's reward is

    reward = q (mid[t'] - mid[t]) - |q - pos| (half_spread[t] + fee) - close,   t' = min(t + stride, end)

in ticks (ES: 0.25 index points = 1 tick = 12.50 USD): the change of the marked-to-mid equity
minus costs. When ``t'`` is the segment's last row (a session end or a roll: segments never
span either), the position is closed there at its bid/ask plus fee (``close = |q|
(half_spread[t'] + fee)``) and the environment is ``done``: no position is ever held across a
break. Rows whose bid or ask is missing (an empty side) carry the last valid quote of the
segment (the first valid one before it); a crossed quote counts a zero half spread.

Per environment the environment also counts, for the metrics: ``pnl`` (ticks), ``turnover``
(contracts traded), ``entries`` (trades opened), ``closed`` and ``wins`` (closed trades and
those with a positive PnL, entry and exit costs included).
"""

from __future__ import annotations

import torch

from alphafeat.validation import validate_int
from alphamodel.backtest.market import Market

__all__ = ["VecEnv", "env_step"]


class VecEnv:
    """N environments on a :class:`Market` (see the module docstring).

    State tensors (N,): ``t`` int64 row, ``pos`` float32 contracts, ``fee`` float32 ticks per
    contract per side, ``acc`` float32 PnL of the open trade so far; counters ``pnl``,
    ``turnover``, ``entries``, ``closed``, ``wins`` (float32, since the last :meth:`clear`).
    ``compile=True`` runs the step through ``torch.compile`` (fused kernels on a GPU).
    """

    def __init__(self, market: Market, n: int, stride: int, compile: bool = False) -> None:
        stride = validate_int(stride, "stride", lo=1, what="a number of rows")  # UsageError otherwise
        self.m, self.n, self.stride = market, int(n), int(stride)
        # the step is a pure function of tensors; torch.compile fuses its ~40 elementwise ops
        self.step_fn = torch.compile(env_step, dynamic=False) if compile else env_step
        dev = market.device
        self.t = market.seg_start[torch.zeros(n, dtype=torch.long, device=dev)].clone()
        z = torch.zeros(n, dtype=torch.float32, device=dev)
        self.pos, self.fee, self.acc = z.clone(), z.clone(), z.clone()
        self.clear()

    def clear(self) -> None:
        """Zero the counters."""
        z = torch.zeros_like(self.pos)
        self.pnl, self.turnover, self.entries, self.closed, self.wins = (z.clone() for _ in range(5))

    def reset(self, mask: torch.Tensor, rows: torch.Tensor, fee: torch.Tensor | None = None) -> None:
        """Put the environments where ``mask`` (N,) bool at ``rows`` (N,) flat, with ``fee`` (N,)."""
        self.t = torch.where(mask, rows, self.t)
        self.pos = torch.where(mask, torch.zeros_like(self.pos), self.pos)
        self.acc = torch.where(mask, torch.zeros_like(self.acc), self.acc)
        if fee is not None:
            self.fee = torch.where(mask, fee.to(self.fee), self.fee)

    def step(self, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Trade to ``target`` (N,) float contracts at the current rows and hold for one stride.

        Returns ``(reward (N,) float32 ticks, done (N,) bool)``; ``done`` environments are flat
        at their segment's last row (call :meth:`reset` to move them).
        """
        m = self.m
        state = (self.t, self.pos, self.fee, self.acc, self.pnl, self.turnover, self.entries, self.closed, self.wins)
        reward, done, state = self.step_fn(m.mid, m.half_spread, m.end, state, target.to(self.pos.dtype),
                                           self.stride)
        (self.t, self.pos, self.fee, self.acc, self.pnl, self.turnover, self.entries, self.closed,
         self.wins) = state
        return reward, done


def env_step(mid: torch.Tensor, half_spread: torch.Tensor, end_of: torch.Tensor, state: tuple, q: torch.Tensor,
             stride: int) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """One decision of N environments (see the module docstring); pure, no Python per env.

    ``state = (t, pos, fee, acc, pnl, turnover, entries, closed, wins)``, each (N,); returns
    ``(reward, done, new state)``.
    """
    t, p, fee, acc0, pnl, turnover, entries, closed_n, wins = state
    end = end_of[t]
    t2 = torch.minimum(t + stride, end)
    cost0 = half_spread[t] + fee
    change = q != p
    c_exit = torch.where(change, p.abs() * cost0, 0.0)
    c_entry = torch.where(change, q.abs() * cost0, 0.0)
    closed = change & (p != 0)
    move = q * (mid[t2] - mid[t])
    acc = torch.where(change, -c_entry, acc0) + move
    done = t2 == end
    c_close = torch.where(done, q.abs() * (half_spread[t2] + fee), 0.0)
    shut = done & (q != 0)
    wins = wins + (closed & (acc0 - c_exit > 0)).float() + (shut & (acc - c_close > 0)).float()
    closed_n = closed_n + closed.float() + shut.float()
    entries = entries + (change & (q != 0)).float()
    reward = move - c_exit - c_entry - c_close
    turnover = turnover + (q - p).abs() + torch.where(done, q.abs(), 0.0)
    zero = torch.zeros_like(q)
    return reward, done, (t2, torch.where(done, zero, q), fee, torch.where(done, zero, acc), pnl + reward, turnover,
                          entries, closed_n, wins)
