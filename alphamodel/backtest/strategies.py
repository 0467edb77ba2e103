"""The strategies a backtest compares, each a function ``(env, slice) -> target positions`` of
the environments in the slice: the C51 policy (:func:`c51_targets`), rules on a direction per
row (:func:`rule`: flat, long, OFI sign, the logistic baseline, the direction head, hindsight,
the oracle), ``oracle-band`` (:func:`oracle_band`: a position with hysteresis, one direction per
row and cost level, :func:`band_directions`), and :func:`evaluate`, which runs them all x costs x test sessions in one
:class:`~alphamodel.backtest.execution.ExecEnv` of a fill mode (:func:`fill_env`)."""

from __future__ import annotations

import numpy as np
import torch

from alphamodel.backtest.config import ORACLE_BAND_EXIT, BacktestConfig
from alphamodel.backtest.env import VecEnv
from alphamodel.backtest.execution import ExecEnv, FillModel, fill_summary
from alphamodel.backtest.market import Market
from alphamodel.backtest.metrics import kelly_size
from alphamodel.data.cache import CacheData
from alphamodel.rl.c51 import C51Net
from alphamodel.supervised.baselines import baseline_inputs, fit_logistic

__all__ = ["band_directions", "c51_targets", "cost_rule", "evaluate", "fill_env", "fill_model", "logistic_scores",
           "oracle_band", "round_trip", "rule", "threshold_dir"]


def fill_model(cfg: BacktestConfig, mode: str) -> FillModel:
    """The :class:`~alphamodel.backtest.execution.FillModel` of ``mode`` with ``cfg``'s passive keys."""
    return FillModel(mode, cfg.queue, cfg.latency_ns, cfg.timeout, cfg.on_timeout).checked()


def fill_env(market: Market, n: int, cfg: BacktestConfig, mode: str) -> ExecEnv:
    """``n`` environments on ``market`` filled by ``mode`` (:class:`~alphamodel.backtest.execution.ExecEnv`;
    the maker / taker fees of ``cfg``, USD, in ticks of the market)."""
    return ExecEnv(market.book, n, cfg.stride, fill_model(cfg, mode), fee_maker=cfg.fee_maker / market.tick_value,
                   fee_taker=cfg.fee_taker / market.tick_value)


def c51_targets(net: C51Net, obs, env: VecEnv | ExecEnv, sl: slice, *, z: torch.Tensor, rv: torch.Tensor,
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


def evaluate(strategies: dict, market: Market, seg_ids: np.ndarray, costs: tuple[float, ...], cfg: BacktestConfig,
             mode: str = "taker") -> dict:
    """Run every strategy x cost x test session in one environment filled by ``mode``
    (:func:`fill_env`); returns per (strategy, cost) the daily PnL (sessions,), counts, the
    equity curve (sessions, steps) and the fill statistics (``fills``:
    :func:`~alphamodel.backtest.execution.fill_summary`)."""
    dev = market.device
    names = list(strategies)
    S, C, J = len(names), len(costs), len(seg_ids)
    n = S * C * J
    env = fill_env(market, n, cfg, mode)
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
            a = (i * C + j) * J
            out[(name, c)] = {"daily": pnl[i, j], "entries": ent[i, j], "turnover": turn[i, j], "closed": clo[i, j],
                              "wins": wins[i, j], "curve": cur[:, i, j, :].T,
                              "fills": fill_summary(env.state, mode, slice(a, a + J))}
    return out


def rule(direction: torch.Tensor):
    """A strategy that holds ``direction[t]`` (-1 / 0 / +1, (T,)) at each decision row t."""
    def f(env: VecEnv | ExecEnv, sl: slice) -> torch.Tensor:
        return direction[env.t[sl]]
    return f


def cost_rule(costs: tuple[float, ...], directions: torch.Tensor):
    """A strategy that holds ``directions[i, t]`` (-1 / 0 / +1, (C, T), one row per cost level of
    ``costs``) at each decision row t of an environment whose cost level (``env.fee``, ticks per
    contract per side) is ``costs[i]``."""
    c = torch.as_tensor(costs, dtype=torch.float32, device=directions.device)

    def f(env: VecEnv | ExecEnv, sl: slice) -> torch.Tensor:
        i = (env.fee[sl, None].to(c) - c[None, :]).abs().argmin(1)
        return directions[i, env.t[sl]].float()
    return f


def band_directions(drift: np.ndarray, seg_start: np.ndarray, seg_end: np.ndarray, stride: int,
                    entry: np.ndarray | float, exit_band: float = ORACLE_BAND_EXIT) -> np.ndarray:
    """Target directions of a position with hysteresis on ``drift`` at the decision rows.

    drift : (T,) float, ticks (the expected mid change over the hold; NaN counts as 0).
    seg_start, seg_end : (S,) int, first / last row of each segment; decisions at
    ``seg_start + k * stride`` before ``seg_end`` (the environments' grid), each segment from flat.
    entry : (T,) or scalar float, ticks, the entry band of each row (>= 0).
    exit_band : ticks (>= 0).

    At each decision: long if drift > entry, short if drift < -entry; else a long is kept unless
    drift < -exit_band (then flat), a short unless drift > exit_band, flat stays flat. Returns
    (T,) int8: the direction at each decision row, carried to the rows up to the next decision
    (a row's value depends on the drift at that segment's decision rows at or before it only).
    """
    drift = np.nan_to_num(np.asarray(drift, np.float64), nan=0.0)
    T = drift.size
    entry = np.broadcast_to(np.asarray(entry, np.float64), (T,))
    s0 = np.asarray(seg_start, np.int64)
    s1 = np.asarray(seg_end, np.int64)
    out = np.zeros(T, np.int8)
    if not s0.size:
        return out
    n_steps = int(((s1 - s0) // stride).max()) + 1
    states = np.zeros((n_steps, s0.size), np.int8)  # direction after decision k of each segment
    state = np.zeros(s0.size, np.int8)
    for k in range(n_steps):  # one vector op per decision over every segment still running
        live = s0 + k * stride <= s1
        t = (s0 + k * stride)[live]
        d, e, st = drift[t], entry[t], state[live]
        state[live] = np.where(d > e, 1, np.where(d < -e, -1, np.where(
            (st == 1) & (d < -exit_band), 0, np.where((st == -1) & (d > exit_band), 0, st))))
        states[k] = state
    seg = np.repeat(np.arange(s0.size), s1 - s0 + 1)
    rows = np.concatenate([np.arange(a, b + 1) for a, b in zip(s0, s1)])
    out[rows] = states[(rows - s0[seg]) // stride, seg]
    return out


def round_trip(market: Market, cfg: BacktestConfig, mode: str, cost: float) -> np.ndarray:
    """The entry band of ``oracle-band`` per row (T,) float64, ticks: the round trip of one
    contract at cost level ``cost`` (ticks per contract per side), two fees (cost plus
    ``cfg.fee_maker`` in ``passive`` mode, ``cfg.fee_taker`` else, USD in ticks of the market),
    plus the row's spread in ``taker`` mode (zero in ``mid``; ``passive`` posts at our best)."""
    extra = (cfg.fee_maker if mode == "passive" else cfg.fee_taker) / market.tick_value
    band = np.full(market.mid.numel(), 2.0 * (cost + extra))
    if mode == "taker":
        band = band + 2.0 * market.half_spread.double().cpu().numpy()
    return band


def oracle_band(drift: np.ndarray, market: Market, cfg: BacktestConfig, mode: str,
                costs: tuple[float, ...] | None = None):
    """The ``oracle-band`` strategy in ``mode``: :func:`band_directions` of ``drift`` ((T,) ticks,
    the sidecar's drift_K per row) with the entry band :func:`round_trip` of each cost level of
    ``costs`` (default ``cfg.costs``) and the exit band
    :data:`~alphamodel.backtest.config.ORACLE_BAND_EXIT`, on the decision grid of ``cfg.stride``;
    a :func:`cost_rule` (each environment holds its cost level's directions)."""
    costs = tuple(cfg.costs if costs is None else costs)
    s0, s1 = market.seg_start.cpu().numpy(), market.seg_end.cpu().numpy()
    dirs = np.stack([band_directions(drift, s0, s1, cfg.stride, round_trip(market, cfg, mode, c)) for c in costs])
    return cost_rule(costs, torch.as_tensor(dirs, device=market.device))


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
