"""``alphamodel backtest``: a C51 policy on the encoder's state, walk-forward, cost-aware.

For each walk-forward fold over sessions (:func:`fold_sessions`: expanding window, purged with
:func:`alphafeat.splits.purged_walk_forward` on the sessions' spans, an optional embargo of
whole sessions before the test block) the policy is trained on the fold's past sessions only
and evaluated on its test sessions in :class:`alphamodel.env.VecEnv`:

1. encoder: ``--model DIR`` (one ``alphamodel train`` checkpoint for every fold; it must have
   been trained before the first test session for the walk-forward to be honest: the summary
   says so) or, without it, one small encoder trained per fold on that fold's training
   sessions (``encoder_fold{k}/``);
2. frozen path (``c51``): the embeddings of every row computed once (:mod:`alphamodel.embed`),
   z-scored with the training rows' statistics; the policy input is ``[embedding, position,
   fee / fee_max]``; C51 (:mod:`alphamodel.c51`) with n-step returns, a replay buffer, a target
   network, Thompson exploration, a fee drawn per episode from ``[0, fee_max]`` (cost
   randomisation: one policy for every cost level) and the K = 3 trade-outcome head on
   ``tb_label`` (classes: stop / timeout / profit *of a long entered at the row*, i.e. the
   triple barrier's -1 / 0 / +1; masked where NaN; its cross-entropy weighted by inverse class
   frequency on the fold's training rows, :func:`alphamodel.c51.class_weights`, so it cannot win
   by always saying ``timeout``; ``aux_head`` reports accuracy, balanced accuracy and the
   majority-class rate);
3. fine-tune path (``c51-finetune``, ``--fine-tune``): the frozen policy trained further with
   the C51 loss back-propagated into the Mamba2 -> CfC encoder (windows of the model's length);
4. evaluation: greedy on the C51 means, Kelly-sized (:mod:`alphamodel.kelly`; ``c51-unit`` is
   the same policy at unit size) and the baselines — ``flat``, ``long``, ``ofi-sign`` (sign of
   the integrated OFI), ``logistic`` (logistic regression on all the row's input features, as
   ``alphamodel train``'s baseline, fitted on the training sessions, long above
   ``0.5 + threshold``, short below ``0.5 - threshold``),
   ``direction-head`` (the encoder's direction head at the horizon nearest the stride, same
   threshold), ``hindsight`` (the sign of the mid's move over the next stride: look-ahead,
   an upper bound, never a trial) and, on a generated cache whose sources have the planted
   signal's sidecar (``alphafeat synth --signal-file``, :mod:`alphafeat.synth.planted`),
   ``oracle`` / ``oracle-m0.2``: long where the true model's ``p_up`` (the probability that the
   next mid move is up, known at the row: the last sidecar value at or before the row's
   ts_recv) exceeds ``1/2 + margin``, short below ``1/2 - margin``, else flat (margins
   :data:`ORACLE_MARGINS`; not trials either) — all in the same environment, costs and stride.

Per strategy x fold x cost: annualised Sharpe of the daily (per session) PnL, deflated Sharpe
over the strategies tried at that fold and cost, PSR, win rate, trades and turnover per
session, max drawdown, PnL (:mod:`alphamodel.sharpe`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from alphafeat.cache import META_KEY, check_folder
from alphafeat.splits import purged_walk_forward
from alphafeat.synth.planted import SIGNAL_SUFFIX, asof, planted_path, read_planted
from alphamodel.c51 import (
    C51Config,
    C51Net,
    NStep,
    Replay,
    aux_loss,
    balanced_accuracy,
    c51_loss,
    class_weights,
    greedy,
    project,
    support,
    thompson,
)
from alphamodel.config import check_config, from_dict
from alphamodel.data import CacheData, Window
from alphamodel.embed import check_model_inputs, embed_segments
from alphamodel.env import Market, VecEnv, market_from_arrays
from alphamodel.errors import CacheError, DataError
from alphamodel.kelly import kelly_size
from alphamodel.outputs import save_tensors, staged_outputs
from alphamodel.sharpe import max_drawdown, sharpe, sharpe_stats

log = logging.getLogger(__name__)

__all__ = ["BacktestConfig", "backtest", "check_fold_count", "default_folds", "fold_sessions", "planted_rows",
           "DEFAULT_COSTS", "ORACLE_MARGINS", "RESULT_COLUMNS"]

DEFAULT_COSTS = (0.0, 0.0625, 0.125, 0.25, 0.5)
RESULT_COLUMNS = ("strategy", "fold", "cost_ticks", "sharpe", "deflated_sharpe", "win_rate", "trades_per_session",
                  "turnover", "max_drawdown", "pnl_ticks")
#: USD per tick per contract by product root (CME contract specs); others need tick_value.
TICK_VALUE = {"ES": 12.5, "MES": 1.25, "NQ": 5.0, "MNQ": 0.5}
#: Probability margins of the ``oracle`` strategies. ``oracle`` (0): the sign of the true drift,
#: the most expected mid gain per decision before costs. ``oracle-m0.2``: only where the next
#: mid move's expected gain ``2 (p_up - 1/2)`` ticks is at least 0.4 tick, close to the half
#: spread (0.5 tick at a one-tick spread) an entry pays; at the default signal strength p_up
#: lies in [0.235, 0.765], so no margin covers a whole round trip (1 tick) from one move: the
#: oracle knows the drift of the next move, not of the whole stride, and pays the spread.
ORACLE_MARGINS = (0.0, 0.2)
ORACLE_NAMES = tuple("oracle" if m == 0 else f"oracle-m{m:g}" for m in ORACLE_MARGINS)
NOT_TRIALS = ("hindsight", *ORACLE_NAMES)


@dataclass
class BacktestConfig:
    """Backtest parameters.

    folds : walk-forward folds (None: as many as the sessions allow, at most 5, at least 2).
    embargo : whole sessions dropped from training right before each test block.
    costs : fee levels evaluated, ticks per contract per side (each in [0, 10]).
    stride : rows between decisions. envs : parallel training environments.
    policy_steps : environment steps of C51 training per fold (each with one learning step).
    fine_tune, finetune_steps : the fine-tune path and its steps. kelly, kelly_k, kelly_max :
    sizing (see :mod:`alphamodel.kelly`). fee_max : training fees drawn from [0, fee_max].
    threshold : probability margin of the logistic / direction-head rules. reward_scale :
    rewards are divided by it before the C51 support. encoder_epochs, encoder_steps : the
    per-fold encoder when no model is given. tick_value : USD per tick (None: from the root).

    Each key is checked by :data:`alphamodel.config.BACKTEST_RULES` (:meth:`checked`,
    :meth:`from_dict`, and :func:`backtest` before anything is read).
    """

    folds: int | None = None
    embargo: int = 0
    costs: tuple[float, ...] = DEFAULT_COSTS
    stride: int = 200
    envs: int = 64
    policy_steps: int = 400
    fine_tune: bool = False
    finetune_steps: int = 60
    kelly: bool = True
    kelly_k: float = 2.0
    kelly_max: float = 2.0
    fee_max: float = 0.5
    threshold: float = 0.05
    reward_scale: float = 1.0
    encoder_epochs: int = 3
    encoder_steps: int = 20
    device: str = "auto"
    seed: int = 0
    tick_value: float | None = None
    plots: bool = True
    c51: C51Config = field(default_factory=C51Config)

    def checked(self) -> BacktestConfig:
        """A copy with every key checked and normalised (:func:`alphamodel.config.check_config`).

        Raises
        ------
        alphamodel.errors.UsageError
            Naming the key (``stride``, ``costs``, ``c51.n_atoms``), the value and what is allowed.
        """
        return check_config(self, "backtest")

    @classmethod
    def from_dict(cls, d: dict) -> BacktestConfig:
        """Build from a dict (``c51`` a dict of C51Config keys), each key checked; UsageError
        naming the key for an unknown key or a bad value."""
        return from_dict(cls, d, "backtest")


def default_folds(n: int, embargo: int = 0) -> int:
    """Walk-forward folds over ``n`` sessions when ``folds`` is not given: as many as the
    sessions allow after one training session and the embargo, between 2 and 5."""
    return max(2, min(5, n - 1 - embargo))


def check_fold_count(n: int, folds: int, embargo: int = 0) -> None:
    """Refuse ``folds`` walk-forward folds over ``n`` sessions when they are too few (one
    training session, plus ``embargo`` sessions, before ``folds`` test blocks).

    Raises
    ------
    alphamodel.errors.DataError
        ``n < folds + 1 + embargo``.
    """
    if n < folds + 1 + embargo:
        extra = " plus the embargo" if embargo else ""
        raise DataError(f"--folds {folds}: {n} session(s) are too few (need at least {folds + 1 + embargo}: "
                        f"one training session{extra} before {folds} test blocks)")


def fold_sessions(starts: np.ndarray, ends: np.ndarray, folds: int, embargo: int = 0
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Walk-forward folds over sessions: ``[(train, test)]`` int64 session indices.

    ``starts``/``ends``: (S,) first / last timestamp of each session, in time order. Purged with
    :func:`purged_walk_forward` (a training session overlapping the test block's span is
    dropped), then the ``embargo`` sessions just before the test block are dropped.

    Raises
    ------
    alphamodel.errors.DataError
        The sessions are too few for ``folds`` (+ embargo), or the embargo leaves a fold
        without training sessions.
    """
    check_fold_count(len(starts), folds, embargo)
    out = []
    for tr, te in purged_walk_forward(np.asarray(starts), np.asarray(ends), folds):
        tr = tr[tr < te.min() - embargo]
        if tr.size == 0:
            raise DataError(f"--embargo {embargo}: leaves a fold without training sessions")
        out.append((tr, te))
    return out


# ---- data -----------------------------------------------------------------------------------
@dataclass
class _Rows:
    """Per-row arrays over the flattened cache (numpy, global row order)."""

    seg: np.ndarray
    ts: np.ndarray
    rv: np.ndarray
    ofi: np.ndarray
    tb: np.ndarray  # -1 / 0 / +1 / NaN


def _column(data: CacheData, k: int, name: str) -> np.ndarray | None:
    table = data.segments[k]._keep
    if name not in table.column_names:
        return None
    return table.column(name).to_numpy().astype(np.float64)


def _load_market(data: CacheData, cfg: BacktestConfig, device: torch.device) -> tuple[Market, _Rows, dict]:
    notes = {}
    need = ("bid_px_00", "ask_px_00")
    bids, asks = [], []
    for k, seg in enumerate(data.segments):
        cols = seg._keep.column_names
        missing = [c for c in need if c not in cols]
        if missing:
            raise CacheError(seg.path, f"missing column(s) {', '.join(missing)} (the top of book the backtest "
                             "fills at; precompute keeps them)")
        bids.append(_column(data, k, "bid_px_00"))
        asks.append(_column(data, k, "ask_px_00"))
    root = next((p.split("=", 1)[1] for p in data.segments[0].path.parts if p.startswith("root=")), "")
    tick_value = cfg.tick_value or TICK_VALUE.get(root)
    if tick_value is None:
        raise DataError(f"no tick value known for root {root!r}; set tick_value in the config", data.root)
    market = market_from_arrays(bids, asks, data.tick, tick_value, device, [s.path for s in data.segments])
    cols0 = data.segments[0]._keep.column_names
    rv_name = next((c for c in ("realized_vol_60s", "realized_vol_10s", "realized_vol_600s") if c in cols0),
                   next((c for c in cols0 if c.startswith("realized_vol_")), None))
    if cfg.kelly and rv_name is None:
        raise CacheError(data.root, "no realized_vol_* column for the Kelly sizing; pass --no-kelly")
    ofi_name = "ofi_integrated" if "ofi_integrated" in cols0 else ("ofi_l01" if "ofi_l01" in cols0 else None)
    if "tb_label" not in cols0:
        notes["aux_head"] = "the cache has no tb_label column: the K=3 trade-outcome head is off"
    notes["kelly_volatility"] = rv_name
    notes["ofi_sign_column"] = ofi_name
    if ofi_name is None:
        notes["ofi_sign"] = "the cache has no ofi_integrated / ofi_l01 column: the ofi-sign baseline is left out"
    n = [s.n for s in data.segments]
    cat = lambda name: np.concatenate([  # noqa: E731
        c if (c := _column(data, k, name)) is not None else np.full(n[k], np.nan) for k in range(len(n))]) \
        if name else np.full(sum(n), np.nan)
    rows = _Rows(np.repeat(np.arange(len(n)), n), np.concatenate([s.ts for s in data.segments]),
                 cat(rv_name), cat(ofi_name), cat("tb_label"))
    return market, rows, notes


def planted_rows(data: CacheData) -> tuple[np.ndarray, str]:
    """The generator's planted ``p_up`` per cache row (float64 (T,), NaN where unknown) and a
    note saying where it came from.

    For each segment, the sidecar ``glbx-mdp3-YYYYMMDD.signal.arrow`` of its session is looked
    up beside the DBN files the partition was computed from (its metadata's ``sources``) and
    joined as of the row's ts_recv (:func:`alphafeat.synth.planted.asof`: the last value at or
    before it, never a later one). A segment whose instrument is not the sidecar's (the
    generator's leading outright, e.g. a roll day where the cache's front month differs) or
    with no sidecar stays NaN.
    """
    out = np.full(data.n_rows, np.nan)
    found, missing, other = [], [], []
    for k, seg in enumerate(data.segments):
        try:
            meta = json.loads((seg._keep.schema.metadata or {})[META_KEY])
        except (KeyError, ValueError, AttributeError):
            meta = {}
        folders = sorted({str(Path(e["path"]).parent) for e in meta.get("sources", []) if "path" in e})
        path = next((q for f in folders if (q := planted_path(f, seg.session)).is_file()), None)
        if path is None:
            missing.append(seg.session)
            continue
        ts, p_up, side = read_planted(path)
        if meta.get("instrument_id") is not None and side.get("instrument_id") != meta.get("instrument_id"):
            other.append(seg.session)
            continue
        out[data.offsets[k]:data.offsets[k + 1]] = asof(seg.ts, ts, p_up)
        found.append(seg.session)
    if not found:
        note = (f"oracle not available: no planted-signal sidecar (glbx-mdp3-YYYYMMDD.{SIGNAL_SUFFIX}, written by "
                "`alphafeat synth --signal-file`) beside the cache's sources; 'hindsight' (sign of the mid's move "
                "over the next stride, look-ahead) is reported as an upper bound instead")
    else:
        note = (f"p_up of the generator's true model (bridge to the close excluded: no trader knows it) joined as "
                f"of ts_recv for {len(found)} of {len(data.segments)} segments; long above 1/2 + margin, short "
                f"below 1/2 - margin, margins {list(ORACLE_MARGINS)} ({', '.join(ORACLE_NAMES)}); an upper "
                "reference, not a trial")
        if missing:
            note += f"; no sidecar for {', '.join(missing)} (flat there)"
        if other:
            note += f"; sidecar of another instrument than the cache's front month on {', '.join(other)} (flat there)"
    return out, note


# ---- policy inputs ----------------------------------------------------------------------------
@dataclass
class _Obs:
    """Builds policy inputs ``[z-scored embedding, position, fee / fee_max]`` from rows."""

    emb: torch.Tensor  # (T, D) z-scored, rows outside the fold's segments are zeros
    fee_max: float

    def __call__(self, rows: torch.Tensor, pos: torch.Tensor, fee: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.emb[rows], torch.sign(pos)[:, None], (fee / max(self.fee_max, 1e-9))[:, None]], 1)


class _EncoderObs(torch.nn.Module):
    """Policy inputs through the encoder (fine-tune path): the embedding of row t is computed
    from the window of the model's length ending at t (left-padded at a segment start)."""

    def __init__(self, model: torch.nn.Module, norm, data: CacheData, window: int, mean: torch.Tensor,
                 std: torch.Tensor, fee_max: float) -> None:
        super().__init__()
        self.model, self.norm, self.data, self.window = model, norm, data, window
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)
        self.fee_max = fee_max

    def forward(self, rows: torch.Tensor, pos: torch.Tensor, fee: torch.Tensor) -> torch.Tensor:
        r = rows.cpu().numpy()
        seg = self.data.segment_of(r)
        local = r - self.data.offsets[seg]
        wins = [Window(int(s), int(max(0, i - self.window + 1)), int(i) + 1) for s, i in zip(seg, local)]
        b = self.data.batch(wins, self.window, self.norm)
        dev = self.mean.device
        x, dt = torch.from_numpy(b.x).to(dev), torch.from_numpy(b.dt).to(dev)
        real = torch.from_numpy(b.rows >= 0).to(dev)  # left padding, masked: neutral for the real rows
        e = self.model.embedding(x, dt, real)[0][:, -1].float()
        e = (e - self.mean) / self.std
        return torch.cat([e, torch.sign(pos)[:, None], (fee / max(self.fee_max, 1e-9))[:, None]], 1)


# ---- training ---------------------------------------------------------------------------------
@dataclass
class _Learner:
    net: C51Net
    target: C51Net
    obs: object
    z: torch.Tensor
    opt: torch.optim.Optimizer
    tb_class: torch.Tensor  # (T,) int64, -1 where undefined
    cfg: BacktestConfig
    aux_w: torch.Tensor | None = None  # (3,) inverse class frequency on the fold's training rows
    target_obs: object = None
    steps: int = 0
    losses: list = field(default_factory=list)

    def learn(self, batch: dict[str, torch.Tensor], gen: torch.Generator) -> None:
        c = self.cfg.c51
        logits, aux = self.net(self.obs(batch["s_row"], batch["s_pos"], batch["s_fee"]))
        with torch.no_grad():
            tobs = (self.target_obs or self.obs)(batch["n_row"], batch["n_pos"], batch["n_fee"])
            p_next = torch.softmax(self.target(tobs)[0].float(), -1)
            a_star = greedy(p_next, self.z)
            p_star = p_next[torch.arange(len(a_star), device=a_star.device), a_star]
            m = project(p_star, batch["reward"], batch["disc"], self.z)
        loss = c51_loss(logits, batch["action"], m)
        if c.aux_weight > 0:
            loss = loss + c.aux_weight * aux_loss(aux, self.tb_class[batch["s_row"]], self.aux_w)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for g in self.opt.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        self.opt.step()
        self.steps += 1
        self.losses.append(float(loss.detach()))
        if self.steps % c.target_every == 0:
            self.sync()

    def sync(self) -> None:
        self.target.load_state_dict(self.net.state_dict())
        if self.target_obs is not None:
            self.target_obs.load_state_dict(self.obs.state_dict())


def _train_policy(learner: _Learner, market: Market, pool: torch.Tensor, n_envs: int, steps: int,
                  gen: torch.Generator, bar=None, task=None) -> None:
    """Roll ``n_envs`` environments from random rows of ``pool`` with Thompson actions and
    learn after every step (unit size, fees drawn from [0, fee_max] per episode)."""
    cfg, c = learner.cfg, learner.cfg.c51
    dev = market.device
    env = VecEnv(market, n_envs, cfg.stride)

    def draw(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = pool[torch.randint(0, pool.numel(), (k,), device=dev, generator=gen)]
        return rows, torch.rand(k, device=dev, generator=gen) * cfg.fee_max

    everyone = torch.ones(n_envs, dtype=torch.bool, device=dev)
    env.reset(everyone, *draw(n_envs))
    nstep = NStep(c.n_step, c.gamma)
    replay = Replay(min(c.replay, max(steps * n_envs, 1)), dev)
    for _ in range(steps):
        state = {"row": env.t, "pos": env.pos, "fee": env.fee}
        with torch.no_grad():
            probs = torch.softmax(learner.net(learner.obs(env.t, env.pos, env.fee))[0].float(), -1)
        a = thompson(probs, learner.z, gen)
        reward, done = env.step((a - 1).float())
        tr = nstep.push(state, a, reward / cfg.reward_scale, done.float(),
                        {"row": env.t, "pos": env.pos, "fee": env.fee})
        if tr is not None:
            replay.add(**tr)
        if done.any():
            rows, fee = draw(n_envs)
            env.reset(done, rows, fee)
        if replay.size >= min(c.batch_size, replay.capacity):
            learner.learn(replay.sample(c.batch_size, gen), gen)
        if bar is not None:
            bar.update(task, advance=1)


# ---- evaluation -------------------------------------------------------------------------------
def _c51_targets(net: C51Net, obs, env: VecEnv, sl: slice, *, z: torch.Tensor, rv: torch.Tensor,
                 cfg: BacktestConfig, horizon_s: float, kelly: bool) -> torch.Tensor:
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


def _evaluate(strategies: dict, market: Market, seg_ids: np.ndarray, costs: tuple[float, ...], cfg: BacktestConfig
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


def _rule(direction: torch.Tensor):
    def f(env: VecEnv, sl: slice) -> torch.Tensor:
        return direction[env.t[sl]]
    return f


def _threshold_dir(p: np.ndarray, thr: float) -> np.ndarray:
    return np.where(p > 0.5 + thr, 1.0, np.where(p < 0.5 - thr, -1.0, 0.0))


# ---- the run --------------------------------------------------------------------------------
def backtest(cache: str | os.PathLike[str], out: str | os.PathLike[str],
             model_dir: str | os.PathLike[str] | None = None, cfg: BacktestConfig | None = None,
             progress: bool = True) -> dict:
    """Walk-forward backtest of the C51 policy and baselines; writes results to ``out``.

    Everything is written into a temporary directory inside ``out`` and moved into place at
    the end (an error or an interrupt leaves no half-written result).

    Returns the content of ``out/summary.json``.

    Raises
    ------
    alphamodel.errors.UsageError
        A config key out of range (:meth:`BacktestConfig.checked`), before anything is read.
    alphafeat.errors.InputError
        A model checkpoint that is missing or does not fit its config (wrong shape).
    alphamodel.errors.CacheError
        No cache at ``cache``, a cache without the needed columns; ``out`` a file.
    alphamodel.errors.DataError
        Too few sessions for the folds, a stride not below the shortest session, a model that
        reads features the cache lacks.
    """
    cfg = (cfg or BacktestConfig()).checked()
    t_start = time.perf_counter()
    from alphamodel.train import load_model, resolve_device

    check_folder(out)
    device = resolve_device(cfg.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    given = load_model(model_dir, str(device)) if model_dir is not None else None
    data = CacheData.open(cache)
    market, rows, notes = _load_market(data, cfg, device)
    n_seg = len(data.segments)
    min_len = min(s.n for s in data.segments)
    if cfg.stride >= min_len:
        raise DataError(f"stride {cfg.stride} (--stride, or \"stride\" in --config): out of range, the shortest "
                        f"session has {min_len} rows (stride must be below it)", data.root)
    folds_n = cfg.folds or default_folds(n_seg, cfg.embargo)
    starts = np.array([s.ts[0] for s in data.segments])
    ends = np.array([s.ts[-1] for s in data.segments])
    folds = fold_sessions(starts, ends, folds_n, cfg.embargo)
    if given is not None:
        check_model_inputs(data, given[1], str(model_dir))
        notes["model"] = _given_model_note(str(model_dir), given[2].get("sessions_seen"),
                                           [{data.segments[int(k)].session for k in te} for _, te in folds])
    out = Path(out)
    with staged_outputs(out) as st:
        summary = _run(data, market, rows, folds, given, cfg, device, st.dir, notes, progress)
        own_cache = Path(cache).resolve()  # the embedded sample's cache may live in out
        summary.update(cache=str(own_cache), out=str(out.resolve()), device=str(device),
                       seconds=time.perf_counter() - t_start, replaced=st.replacing("summary.json"),
                       left_from_earlier=[n for n in st.left_over("summary.json") if (out / n).resolve() != own_cache])
        (st.dir / "summary.json").write_text(json.dumps(_clean(summary), indent=1))
    return json.loads((out / "summary.json").read_text())


def _clean(x):
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def _fold_encoder(data: CacheData, train_segs: np.ndarray, k: int, cfg: BacktestConfig, tmp: Path, progress: bool,
                  device: torch.device):
    """Train a small encoder on the fold's training sessions only (a view of the cache)."""
    from alphafeat.cache import MANIFEST
    from alphamodel.model import ModelConfig
    from alphamodel.train import TrainConfig, load_model, train

    view = tmp / f"_view_fold{k}"
    view.mkdir()
    manifest = dict(data.manifest)
    manifest["partitions"] = [str(data.segments[s].path.resolve()) for s in train_segs]
    (view / MANIFEST).write_text(json.dumps(manifest))
    enc = tmp / f"encoder_fold{k}"
    # one walk-forward fold inside the fold's training sessions (for early stopping), no baselines:
    # only the encoder is needed here
    tc = TrainConfig(epochs=cfg.encoder_epochs, steps_per_epoch=cfg.encoder_steps, device=cfg.device, seed=cfg.seed,
                     patience=max(2, cfg.encoder_epochs), folds=1, baselines=())
    # the encoder run's own evaluation warnings (its inner fold, a horizon without an AUC there)
    # are not the backtest's: kept out of the terminal while it trains
    train_log = logging.getLogger("alphamodel.train")
    level = train_log.level
    train_log.setLevel(logging.ERROR)
    try:
        train(view, enc, ModelConfig(), tc, progress=progress)
    finally:
        train_log.setLevel(level)
    shutil.rmtree(view)
    return load_model(enc, str(device))


def _logistic_scores(data: CacheData, tr_rows: np.ndarray, te_rows: np.ndarray, h: int, seed: int,
                     max_rows: int = 200_000) -> np.ndarray:
    """Up-probabilities of the logistic baseline (:func:`alphamodel.baselines.fit_logistic`, all
    input features of the row, as ``alphamodel train``'s) at horizon index ``h`` on ``te_rows``,
    fitted on at most ``max_rows`` of ``tr_rows`` (NaN with one class); its inputs
    (:func:`alphamodel.baselines.baseline_inputs`) normalised by a fit on those rows."""
    from alphamodel.baselines import baseline_inputs, fit_logistic

    xtr, ytr, xte = baseline_inputs(data, tr_rows, te_rows, max_rows, seed)
    return fit_logistic(xtr, ytr[:, h], xte, max_rows, seed)


def _run(data: CacheData, market: Market, rows: _Rows, folds, given, cfg: BacktestConfig, device: torch.device,
         tmp: Path, notes: dict, progress: bool) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    c = cfg.c51
    z = support(c.n_atoms, c.v_min, c.v_max, device)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    T = data.n_rows
    tb = torch.as_tensor(np.where(np.isnan(rows.tb), -1, rows.tb + 1), dtype=torch.long, device=device)
    rv = torch.as_tensor(rows.rv, dtype=torch.float32, device=device)
    mid, end = market.mid, market.end
    ahead = torch.minimum(torch.arange(T, device=device) + cfg.stride, end)
    hindsight = torch.sign(mid[ahead] - mid)
    p_up, notes["oracle"] = planted_rows(data)
    oracle = {name: torch.as_tensor(_threshold_dir(np.nan_to_num(p_up, nan=0.5), m), dtype=torch.float32,
                                    device=device)
              for name, m in zip(ORACLE_NAMES, ORACLE_MARGINS)} if np.isfinite(p_up).any() else {}
    ofi_dir = torch.as_tensor(np.sign(np.nan_to_num(rows.ofi)), dtype=torch.float32, device=device)
    h_pick = int(np.argmin([abs(h - cfg.stride) for h in data.horizons]))
    results, fold_info, aux_info = [], [], []
    curves: dict = {}
    given_emb: dict = {}
    n_steps = cfg.policy_steps + (cfg.finetune_steps if cfg.fine_tune else 0)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not progress, transient=False, console=Console(stderr=True)) as bar:
        for k, (tr_s, te_s) in enumerate(folds):
            # encoder and embeddings of the fold's sessions
            model, norm, meta = given if given is not None else _fold_encoder(data, tr_s, k, cfg, tmp, progress, device)
            tcm = meta.get("train", {})
            window = int(tcm.get("window", 64))  # the fine-tuned encoder's windows (they end at the row)
            segs = sorted(set(tr_s.tolist()) | set(te_s.tolist()))
            if given is None:
                emb_np = embed_segments(model, norm, data, segs, tcm, device)
            else:  # one model for every fold: its embeddings are computed once
                if not given_emb:
                    given_emb.update(embed_segments(model, norm, data, list(range(len(data.segments))), tcm, device))
                emb_np = {s: given_emb[s] for s in segs}
            D = next(iter(emb_np.values()))[0].shape[1]
            emb = torch.zeros(T, D, device=device)
            phead = np.full(T, 0.5)
            for s, (e, p) in emb_np.items():
                a, b = data.offsets[s], data.offsets[s + 1]
                emb[a:b] = torch.from_numpy(e).to(device)
                phead[a:b] = p[:, h_pick]
            tr_rows = data.segment_rows(tr_s)
            te_rows = data.segment_rows(te_s)
            assert tr_rows.max() < te_rows.min()
            tr_t = torch.as_tensor(tr_rows, device=device)
            mu, sd = emb[tr_t].mean(0), emb[tr_t].std(0).clamp_min(1e-6)
            emb = (emb - mu) / sd
            obs = _Obs(emb, cfg.fee_max)
            # seconds per return horizon (n-step decisions), measured on the training sessions
            ts = rows.ts
            dts = [(ts[min(r + cfg.stride, data.offsets[s + 1] - 1)] - ts[r]) / 1e9
                   for s in tr_s for r in range(int(data.offsets[s]), int(data.offsets[s + 1]) - 1, cfg.stride)]
            horizon_s = float(np.mean(dts)) * c.n_step if dts else 1.0
            # C51 on the frozen embeddings
            torch.manual_seed(cfg.seed + k)
            net = C51Net(D + 2, 3, c.n_atoms, c.hidden).to(device)
            aux_w = class_weights(tb[tr_t])  # inverse class frequency on this fold's training rows
            learner = _Learner(net, copy.deepcopy(net), obs, z, torch.optim.Adam(net.parameters(), lr=c.lr), tb, cfg,
                               aux_w)
            pool = torch.as_tensor(data.segment_rows(tr_s, drop_last=1), device=device)
            task = bar.add_task(f"fold {k} ({k + 1} of {len(folds)}) c51", total=n_steps)
            _train_policy(learner, market, pool, cfg.envs, cfg.policy_steps, gen, bar, task)
            pol = functools.partial(_c51_targets, z=z, rv=rv, cfg=cfg, horizon_s=horizon_s)
            strategies = {"c51": functools.partial(pol, net, obs, kelly=cfg.kelly)}
            if cfg.kelly:
                strategies["c51-unit"] = functools.partial(pol, net, obs, kelly=False)
            ft_info = None
            if cfg.fine_tune:
                ft_net, ft_obs, ft_info = _fine_tune(learner, model, norm, data, window, mu, sd, market, pool, cfg,
                                                     gen, bar, task)
                strategies["c51-finetune"] = functools.partial(pol, ft_net, ft_obs, kelly=cfg.kelly)
            # baselines
            lab = np.full(T, np.nan)
            lab[te_rows] = _logistic_scores(data, tr_rows, te_rows, h_pick, cfg.seed)
            flat = torch.zeros(T, device=device)
            strategies.update({
                "flat": _rule(flat), "long": _rule(torch.ones(T, device=device)),
                **({"ofi-sign": _rule(ofi_dir)} if notes["ofi_sign_column"] else {}),
                "logistic": _rule(torch.as_tensor(_threshold_dir(np.nan_to_num(lab, nan=0.5), cfg.threshold),
                                                  dtype=torch.float32, device=device)),
                "direction-head": _rule(torch.as_tensor(_threshold_dir(phead, cfg.threshold), dtype=torch.float32,
                                                        device=device)),
                "hindsight": _rule(hindsight)})
            strategies.update({name: _rule(d) for name, d in oracle.items()})
            ev = _evaluate(strategies, market, te_s, tuple(cfg.costs), cfg)
            # metrics with the deflated Sharpe over the strategies tried at this fold x cost
            for cost in cfg.costs:
                trials = [sharpe(ev[(s, cost)]["daily"]) for s in strategies if s not in NOT_TRIALS]
                for s in strategies:
                    r = ev[(s, cost)]
                    st = sharpe_stats(r["daily"], np.array(trials))
                    eq = np.concatenate([r["curve"][j] + (r["daily"][:j].sum() if j else 0.0)
                                         for j in range(len(te_s))])
                    J = len(te_s)
                    results.append({
                        "strategy": s, "fold": k, "cost_ticks": cost, "sharpe": st["sharpe"],
                        "deflated_sharpe": st["deflated_sharpe"] if s not in NOT_TRIALS else math.nan,
                        "win_rate": float(r["wins"].sum() / r["closed"].sum()) if r["closed"].sum() else math.nan,
                        "trades_per_session": float(r["entries"].sum() / J), "turnover": float(r["turnover"].sum() / J),
                        "max_drawdown": max_drawdown(eq), "pnl_ticks": float(r["daily"].sum()),
                        "pnl_usd": float(r["daily"].sum() * market.tick_value), "psr": st["psr"],
                        "sharpe_daily": st["sharpe_daily"], "autocorr1": st["autocorr1"], "sessions": J})
                    curves[(k, cost, s)] = eq
            aux_info.append(_aux_report(learner, obs, tb, tr_rows, te_rows, cfg, device, k))
            state = {f"net.{n}": v.detach().cpu().contiguous() for n, v in net.state_dict().items()}
            state.update({"emb.mean": mu.cpu(), "emb.std": sd.cpu(), "support": z.cpu()})
            save_tensors(state, tmp / f"policy_fold{k}.safetensors", "alphamodel-c51-1")
            fold_info.append({
                "fold": k, "train_sessions": [data.segments[s].session for s in tr_s],
                "test_sessions": [data.segments[s].session for s in te_s],
                "train_rows": [int(tr_rows.min()), int(tr_rows.max())],
                "test_rows": [int(te_rows.min()), int(te_rows.max())],
                "policy_loss_last": float(np.mean(learner.losses[-20:])) if learner.losses else None,
                "horizon_s": horizon_s, "fine_tune": ft_info})
    (tmp / "policy_config.json").write_text(json.dumps(_clean({
        "c51": dataclasses.asdict(c), "obs": "[z-scored embedding (D), sign(position), fee / fee_max]",
        "actions": ["short", "flat", "long"], "embedding_dim": D, "backtest": _cfg_dict(cfg),
        "checkpoints": [f"policy_fold{k}.safetensors" for k in range(len(folds))]}), indent=1))
    plots = _plots(tmp, curves, cfg) if cfg.plots else []
    return {"results": results, "aggregate": _aggregate(results), "folds": fold_info, "aux_head": aux_info,
            "plots": plots, "notes": {**_standing_notes(cfg, results), **notes}, "config": _cfg_dict(cfg),
            "columns": list(RESULT_COLUMNS), "tick_value_usd": market.tick_value,
            "direction_horizon": data.horizons[h_pick]}


def _given_model_note(model_dir: str, seen: list[str] | None, tests: list[set[str]]) -> str:
    """The note on a given ``--model``: which folds test on sessions it trained or early-stopped on
    (``seen``: its config's ``sessions_seen``; ``tests``: each fold's test sessions)."""
    if seen is None:  # a model saved before the sessions were recorded
        return (f"{model_dir}: one encoder for every fold; the walk-forward is out of sample only if it was "
                "trained on sessions before the first test session (this model does not record its sessions)")
    inside = [(k, sorted(t & set(seen))) for k, t in enumerate(tests) if t & set(seen)]
    if not inside:
        return (f"{model_dir}: one encoder for every fold, trained on {len(seen)} session(s) up to {max(seen)}, "
                "none of them a test session: out of sample")
    return (f"{model_dir}: one encoder for every fold; it trained or early-stopped on test sessions of fold(s) "
            f"{', '.join(str(k) for k, _ in inside)} ({', '.join(s for _, ss in inside for s in ss)}): those "
            "folds are in sample, their results flattered")


def _standing_notes(cfg: BacktestConfig, results: list[dict]) -> dict:
    ran = {r["strategy"] for r in results}
    return {
        "sharpe": "annualised Sharpe of daily (per-session) PnL x sqrt(252); NaN (null) with fewer than 2 test "
                  "sessions in a fold",
        "deflated_sharpe": "Bailey & Lopez de Prado 2014 over the strategies tried at the fold and cost "
                           f"(all but {', '.join(n for n in NOT_TRIALS if n in ran)})",
        "sizing": "Kelly (alphamodel.kelly)" if cfg.kelly else "unit size (--no-kelly)",
        "embargo_sessions": cfg.embargo}


def _cfg_dict(cfg: BacktestConfig) -> dict:
    d = dataclasses.asdict(cfg)
    d["costs"] = list(cfg.costs)
    return d


def _aggregate(results: list[dict]) -> list[dict]:
    keys = sorted({(r["strategy"], r["cost_ticks"]) for r in results}, key=lambda x: (x[1], x[0]))
    out = []
    for s, c in keys:
        rs = [r for r in results if r["strategy"] == s and r["cost_ticks"] == c]
        row = {"strategy": s, "cost_ticks": c, "folds": len(rs)}
        for m in ("sharpe", "deflated_sharpe", "win_rate", "trades_per_session", "turnover", "max_drawdown",
                  "pnl_ticks"):
            v = np.array([r[m] for r in rs], float)
            v = v[np.isfinite(v)]
            row[m + "_mean"] = float(v.mean()) if v.size else math.nan
            row[m + "_sd"] = float(v.std(ddof=1)) if v.size > 1 else math.nan
        out.append(row)
    return out


@torch.no_grad()
def _aux_report(learner: _Learner, obs, tb: torch.Tensor, tr_rows: np.ndarray, te_rows: np.ndarray,
                cfg: BacktestConfig, device: torch.device, k: int) -> dict:
    """Class balance and loss weights (training rows), test accuracy and balanced accuracy
    (mean per-class recall) at decision rows beside the majority rate."""
    y_tr = tb[torch.as_tensor(tr_rows, device=device)]
    y_tr = y_tr[y_tr >= 0]
    dec = torch.as_tensor(te_rows[:: cfg.stride], device=device)
    y = tb[dec]
    ok = y >= 0
    if y_tr.numel() == 0 or not ok.any():
        return {"fold": k, "available": False}
    bal = torch.bincount(y_tr, minlength=3).float() / y_tr.numel()
    z = torch.zeros_like(dec, dtype=torch.float32)
    pred = learner.net(obs(dec[ok], z[ok], z[ok]))[1].argmax(-1)
    majority = int(bal.argmax())
    return {"fold": k, "available": True, "classes": ["stop (-1)", "timeout (0)", "profit (+1)"],
            "train_balance": bal.tolist(), "test_decisions": int(ok.sum()),
            "loss_weights": learner.aux_w.tolist() if learner.aux_w is not None else None,
            "test_accuracy": float((pred == y[ok]).float().mean()),
            "test_balanced_accuracy": balanced_accuracy(pred, y[ok]),
            "test_majority_rate": float((y[ok] == majority).float().mean()),
            "test_predicted_balance": (torch.bincount(pred, minlength=3).float() / pred.numel()).tolist()}


def _fine_tune(learner: _Learner, model, norm, data: CacheData, window: int, mu: torch.Tensor, sd: torch.Tensor,
               market: Market, pool: torch.Tensor, cfg: BacktestConfig, gen: torch.Generator, bar, task):
    """Continue the frozen policy's training with the C51 loss flowing into a copy of the encoder."""
    enc = copy.deepcopy(model).train()
    for m in enc.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    obs = _EncoderObs(enc, norm, data, window, mu, sd, cfg.fee_max).to(market.device)
    net = copy.deepcopy(learner.net)
    before = {n: p.detach().clone() for n, p in enc.named_parameters()}
    opt = torch.optim.Adam([{"params": net.parameters(), "lr": cfg.c51.lr},
                            {"params": enc.parameters(), "lr": cfg.c51.lr * 0.2}])
    ft = _Learner(net, copy.deepcopy(net), obs, learner.z, opt, learner.tb_class, cfg, learner.aux_w,
                  target_obs=copy.deepcopy(obs))
    _train_policy(ft, market, pool, min(cfg.envs, 16), cfg.finetune_steps, gen, bar, task)
    grads_finite = all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in enc.parameters())
    change = float(sum((p.detach() - before[n]).abs().sum() for n, p in enc.named_parameters()))
    enc.eval()
    return net, obs, {"encoder_abs_change": change, "grads_finite": grads_finite, "steps": ft.steps}


def _plots(out: Path, curves: dict, cfg: BacktestConfig) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for fold, cost in sorted({(k[0], k[1]) for k in curves}):
        fig, ax = plt.subplots(figsize=(7, 4))
        for (f, c, s), eq in curves.items():
            if f == fold and c == cost:
                ax.plot(np.arange(1, len(eq) + 1), eq, label=s, lw=1.2 if s.startswith("c51") else 0.8,
                        ls=":" if s in NOT_TRIALS else "-")
        ax.set_xlabel(f"decision (every {cfg.stride} rows), test sessions end to end")
        ax.set_ylabel("equity, ticks per contract (marked to mid)")
        ax.set_title(f"fold {fold}, cost {cost:g} tick/side")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        name = f"equity_fold{fold}_cost{cost:g}.png"
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        names.append(name)
    return names
