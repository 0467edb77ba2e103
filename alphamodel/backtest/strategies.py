"""The strategies a backtest compares, each a function ``(env, slice) -> target positions`` of
the environments in the slice: the C51 policy (:func:`c51_targets`), rules on a direction per
row (:func:`rule`: flat, long, OFI sign, the logistic baseline, the direction head, hindsight,
the oracle), and :func:`evaluate`, which runs them all x costs x test sessions in one
:class:`~alphamodel.backtest.env.VecEnv`."""

from __future__ import annotations

import numpy as np
import torch

from alphamodel.backtest.config import BacktestConfig
from alphamodel.backtest.env import VecEnv
from alphamodel.backtest.market import Market
from alphamodel.backtest.metrics import kelly_size
from alphamodel.data.cache import CacheData
from alphamodel.rl.c51 import C51Net
from alphamodel.supervised.baselines import baseline_inputs, fit_logistic

__all__ = ["c51_targets", "evaluate", "logistic_scores", "rule", "threshold_dir"]


def c51_targets(net: C51Net, obs, env: VecEnv, sl: slice, *, z: torch.Tensor, rv: torch.Tensor,
                cfg: BacktestConfig, horizon_s: float, kelly: bool) -> torch.Tensor:
    """The C51 policy's target positions for the environments ``sl`` of ``env``: greedy on the
    means of ``net``'s distributions (rescaled by ``reward_scale``), unit size or Kelly-sized
    (:func:`alphamodel.backtest.metrics.kelly_size` from the edge over flat and the row's
    volatility ``rv``; a position already held in the chosen direction is kept)."""
    rows, pos, fee = env.t[sl], env.pos[sl], env.fee[sl]
    with torch.no_grad():
        probs = torch.softmax(net(obs(rows, pos, fee))[0].float(), -1)
    mean = (probs * z).sum(-1) * cfg.reward_scale
    a = mean.argmax(-1)
    d = (a - 1).float()
    if not kelly:
        return d
    edge = mean.gather(1, a[:, None])[:, 0] - mean[:, 1]
    size = kelly_size(edge, rv[rows], horizon_s, cfg.kelly_k, cfg.kelly_max)
    keep = (torch.sign(pos) == d) & (d != 0)
    return torch.where(keep, pos, d * size)


def evaluate(strategies: dict, market: Market, seg_ids: np.ndarray, costs: tuple[float, ...], cfg: BacktestConfig
             ) -> dict:
    """Run every strategy x cost x test session in one VecEnv; returns per (strategy, cost) the
    daily PnL (sessions,), counts and the equity curve (sessions, steps)."""
    dev = market.device
    names = list(strategies)
    S, C, J = len(names), len(costs), len(seg_ids)
    n = S * C * J
    env = VecEnv(market, n, cfg.stride)
    segs = torch.as_tensor(seg_ids, device=dev)
    starts = market.seg_start[segs].repeat(S * C)
    fees = torch.tensor(costs, dtype=torch.float32, device=dev).repeat_interleave(J).repeat(S)
    env.reset(torch.ones(n, dtype=torch.bool, device=dev), starts, fees)
    lens = (market.seg_end[segs] - market.seg_start[segs] + 1).cpu().numpy()
    steps = int(np.ceil(lens.max() / cfg.stride)) + 1
    finished = torch.zeros(n, dtype=torch.bool, device=dev)
    curve = torch.zeros(steps, n, device=dev)
    for k in range(steps):
        parts = []
        for i, name in enumerate(names):
            sl = slice(i * C * J, (i + 1) * C * J)
            parts.append(strategies[name](env, sl))
        target = torch.where(finished, 0.0, torch.cat(parts).float())
        _, done = env.step(target)
        finished |= done
        curve[k] = env.pnl
    out = {}
    view = lambda x: x.view(S, C, J).cpu().numpy()  # noqa: E731
    pnl, ent, turn, clo, wins = (view(x) for x in (env.pnl, env.entries, env.turnover, env.closed, env.wins))
    cur = curve.view(steps, S, C, J).cpu().numpy()
    for i, name in enumerate(names):
        for j, c in enumerate(costs):
            out[(name, c)] = {"daily": pnl[i, j], "entries": ent[i, j], "turnover": turn[i, j], "closed": clo[i, j],
                              "wins": wins[i, j], "curve": cur[:, i, j, :].T}
    return out


def rule(direction: torch.Tensor):
    """A strategy that holds ``direction[t]`` (-1 / 0 / +1, (T,)) at each decision row t."""
    def f(env: VecEnv, sl: slice) -> torch.Tensor:
        return direction[env.t[sl]]
    return f


def threshold_dir(p: np.ndarray, thr: float) -> np.ndarray:
    """+1 where the up-probability ``p`` is above ``1/2 + thr``, -1 below ``1/2 - thr``, else 0."""
    return np.where(p > 0.5 + thr, 1.0, np.where(p < 0.5 - thr, -1.0, 0.0))


def logistic_scores(data: CacheData, tr_rows: np.ndarray, te_rows: np.ndarray, h: int, seed: int,
                     max_rows: int = 200_000) -> np.ndarray:
    """Up-probabilities of the logistic baseline (:func:`alphamodel.supervised.baselines.fit_logistic`, all
    input features of the row, as ``alphamodel train``'s) at horizon index ``h`` on ``te_rows``,
    fitted on at most ``max_rows`` of ``tr_rows`` (NaN with one class); its inputs
    (:func:`alphamodel.supervised.baselines.baseline_inputs`) normalised by a fit on those rows."""
    xtr, ytr, xte = baseline_inputs(data, tr_rows, te_rows, max_rows, seed)
    return fit_logistic(xtr, ytr[:, h], xte, max_rows, seed)
