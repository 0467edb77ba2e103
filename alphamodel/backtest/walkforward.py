"""The walk-forward of a backtest: folds over sessions (:func:`fold_sessions`), and one fold's
run (:func:`run_fold`): its encoder and embeddings, the C51 policy trained on the fold's past
sessions only, the fine-tune path, the strategies evaluated on its test sessions and their
metrics."""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import functools
import importlib.util
import json
import logging
import math
import multiprocessing
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from alphafeat.cache import MANIFEST
from alphafeat.splits import purged_walk_forward
from alphamodel.backtest.config import NOT_TRIALS, ORACLE_BAND, ORACLE_MARGINS, ORACLE_NAMES, BacktestConfig
from alphamodel.backtest.market import Market, Rows, planted_drift_rows
from alphamodel.backtest.metrics import max_drawdown, session_readout, sharpe, sharpe_stats
from alphamodel.backtest.strategies import (
    c51_targets,
    evaluate,
    fill_env,
    logistic_scores,
    oracle_band,
    rule,
    threshold_dir,
)
from alphamodel.data.cache import CacheData
from alphamodel.errors import DataError
from alphamodel.nn.model import ModelConfig
from alphamodel.readout import MIN_SHARPE_SESSIONS, head_verdict
from alphamodel.rl.c51 import C51Net, balanced_accuracy, class_weights, support
from alphamodel.rl.learner import EncoderObs, Learner, Obs, train_policy
from alphamodel.supervised.checkpoint import load_model
from alphamodel.supervised.config import TrainConfig
from alphamodel.supervised.embed import embed_segments
from alphamodel.supervised.outputs import save_tensors
from alphamodel.supervised.train import train

log = logging.getLogger(__name__)

__all__ = ["GPU_EVAL_BATCH", "Run", "aux_report", "check_fold_count", "default_folds", "encoder_job", "encoder_jobs",
           "fine_tune", "fold_encoder", "fold_learner", "fold_logistic", "fold_mode", "fold_sessions", "make_run",
           "mode_generator", "mode_threads", "run_fold", "start_encoders", "train_encoder"]


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


def fold_encoder(data: CacheData, train_segs: np.ndarray, k: int, cfg: BacktestConfig, tmp: Path, progress: bool,
                 device: torch.device) -> tuple:
    """Train a small encoder on the fold's training sessions only (a view of the cache written in
    ``tmp``); returns :func:`~alphamodel.supervised.checkpoint.load_model`'s ``(model, norm, meta)``."""
    return load_model(train_encoder(data, train_segs, k, dataclasses.replace(cfg, device=device.type), tmp, progress),
                      str(device))


#: Streams scored at once by the per-fold encoder on a GPU (its validation and the embeddings):
#: the small model's forward is bound by launches, not by the rows it holds.
GPU_EVAL_BATCH = 2048


def train_encoder(data: CacheData, train_segs: np.ndarray, k: int, cfg: BacktestConfig, tmp: Path,
                  progress: bool) -> Path:
    """Train fold ``k``'s encoder (see :func:`fold_encoder`) into ``tmp/encoder_fold{k}`` on
    ``cfg.device``; returns that folder. On CUDA with triton installed its CfC runs as the Triton
    scan (``cfc_impl "triton"``; elsewhere the saved encoder loads with the torch scan,
    ``checkpoint.TRITON_FALLBACK``), the torch scan if that
    fails (logged), and its scoring takes :data:`GPU_EVAL_BATCH` streams at once."""
    view = tmp / f"_view_fold{k}"
    view.mkdir()
    manifest = dict(data.manifest)
    manifest["partitions"] = [str(data.segments[s].path.resolve()) for s in train_segs]
    (view / MANIFEST).write_text(json.dumps(manifest))
    enc = tmp / f"encoder_fold{k}"
    # one walk-forward fold inside the fold's training sessions (for early stopping), no baselines:
    # only the encoder is needed here
    gpu = {"eval_batch_size": GPU_EVAL_BATCH} if cfg.device == "cuda" else {}
    tc = TrainConfig(epochs=cfg.encoder_epochs, steps_per_epoch=cfg.encoder_steps, device=cfg.device, seed=cfg.seed,
                     patience=max(2, cfg.encoder_epochs), folds=1, baselines=(), **gpu)
    # the encoder run's own evaluation warnings (its inner fold, a horizon without an AUC there)
    # are not the backtest's: kept out of the terminal while it trains
    train_log = logging.getLogger(train.__module__)
    level = train_log.level
    train_log.setLevel(logging.ERROR)
    try:
        if cfg.device == "cuda" and importlib.util.find_spec("triton") is not None:
            # the CfC recurrence as one Triton kernel (equal to rounding) instead of ~10 launches a
            # position forward and more backward: the per-fold encoder's steps are launch-bound
            try:
                train(view, enc, ModelConfig(cfc_impl="triton"), tc, progress=progress)
            except Exception as e:  # noqa: BLE001 - the torch scan is the fallback, said in the log
                log.warning("fold %d: the encoder with the Triton CfC failed (%s); trained with the torch scan", k,
                            str(e).splitlines()[0] if str(e) else type(e).__name__)
                train(view, enc, ModelConfig(), tc, progress=progress)
        else:
            train(view, enc, ModelConfig(), tc, progress=progress)
    finally:
        train_log.setLevel(level)
    shutil.rmtree(view)
    return enc


def encoder_job(cache: str, train_segs: list[int], k: int, cfg: BacktestConfig, tmp: str) -> str:
    """:func:`train_encoder` in a worker process (the cache opened there, no progress bar, two
    torch threads); returns the encoder's folder."""
    torch.set_num_threads(2)
    return str(train_encoder(CacheData.open(cache), np.asarray(train_segs), k, cfg, Path(tmp), False))


def mode_threads(cfg: BacktestConfig, device: torch.device, n_modes: int) -> int:
    """Threads training and evaluating a fold's fill modes at once: ``cfg.mode_threads``, else
    one per mode on a GPU, 1 on a CPU. The results are the same either way (each mode has its
    own generator, :func:`mode_generator`)."""
    if cfg.mode_threads is not None:
        return min(cfg.mode_threads, n_modes)
    return n_modes if device.type == "cuda" else 1


def encoder_jobs(cfg: BacktestConfig, device: torch.device, n_folds: int) -> int:
    """Processes training the per-fold encoders at once: ``cfg.encoder_jobs`` (default 1: on one
    GPU, processes are contexts the device time-slices, so their small kernels do not overlap)."""
    return min(cfg.encoder_jobs or 1, n_folds)


def start_encoders(run: Run, folds: list) -> concurrent.futures.Executor | None:
    """With more than one :func:`encoder_jobs` and no given model, submit every fold's encoder to a
    pool of spawned processes (``run.encoders[k]``: its future; :func:`fold_inputs` waits for
    it), so that later folds' encoders train on other CPU cores while the first folds' policies
    do. Returns the pool (None: the encoders train in turn, in this process)."""
    jobs = encoder_jobs(run.cfg, run.device, len(folds))
    if run.given is not None or jobs <= 1:
        return None
    pool = concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
    cfg = dataclasses.replace(run.cfg, device=run.device.type)
    for k, (tr_s, _) in enumerate(folds):
        run.encoders[k] = pool.submit(encoder_job, str(run.data.root), [int(s) for s in tr_s], k, cfg, str(run.tmp))
    return pool


@torch.no_grad()
def aux_report(learner: Learner, obs, tb: torch.Tensor, tr_rows: np.ndarray, te_rows: np.ndarray,
               cfg: BacktestConfig, device: torch.device, k: int) -> dict:
    """Class balance and loss weights (training rows), test accuracy and balanced accuracy
    (mean per-class recall) at decision rows beside the majority rate, the balanced accuracy's
    95% bootstrap interval and whether it lies above chance (``learns``,
    :func:`alphamodel.readout.head_verdict`); ``pred`` / ``labels`` (numpy, the test decisions)
    for the verdict pooled over folds (the caller drops them from the summary)."""
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
    verdict = head_verdict(pred.cpu().numpy(), y[ok].cpu().numpy(), seed=cfg.seed + k)
    return {"fold": k, "available": True, "classes": ["stop (-1)", "timeout (0)", "profit (+1)"],
            "balanced_accuracy_ci": verdict["interval"], "learns": verdict["learns"],
            "pred": pred.cpu().numpy(), "labels": y[ok].cpu().numpy(),
            "train_balance": bal.tolist(), "test_decisions": int(ok.sum()),
            "loss_weights": learner.aux_w.tolist() if learner.aux_w is not None else None,
            "test_accuracy": float((pred == y[ok]).float().mean()),
            "test_balanced_accuracy": balanced_accuracy(pred, y[ok]),
            "test_majority_rate": float((y[ok] == majority).float().mean()),
            "test_predicted_balance": (torch.bincount(pred, minlength=3).float() / pred.numel()).tolist()}


def fine_tune(learner: Learner, model, norm, data: CacheData, window: int, mu: torch.Tensor, sd: torch.Tensor,
              market: Market, pool: torch.Tensor, cfg: BacktestConfig, gen: torch.Generator, bar, task,
              mode: str = "taker") -> tuple:
    """Continue the frozen policy's training (filled by ``mode``) with the C51 loss flowing into a
    copy of the encoder; returns the fine-tuned policy network, its inputs (:class:`~alphamodel.rl.learner.EncoderObs`)
    and a report (the encoder's total absolute change, whether its gradients stayed finite)."""
    enc = copy.deepcopy(model).train()
    for m in enc.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    obs = EncoderObs(enc, norm, data, window, mu, sd, cfg.fee_max).to(market.device)
    net = copy.deepcopy(learner.net)
    before = {n: p.detach().clone() for n, p in enc.named_parameters()}
    opt = torch.optim.Adam([{"params": net.parameters(), "lr": cfg.c51.lr},
                            {"params": enc.parameters(), "lr": cfg.c51.lr * 0.2}])
    ft = Learner(net, copy.deepcopy(net), obs, learner.z, opt, learner.tb_class, cfg.c51, learner.aux_w,
                 target_obs=copy.deepcopy(obs))
    train_policy(ft, fill_env(market, min(cfg.envs, 16), cfg, mode), pool, cfg.finetune_steps, gen,
                 fee_max=cfg.fee_max, reward_scale=cfg.reward_scale, bar=bar, task=task)
    grads_finite = all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in enc.parameters())
    change = float(sum((p.detach() - before[n]).abs().sum() for n, p in enc.named_parameters()))
    enc.eval()
    return net, obs, {"encoder_abs_change": change, "grads_finite": grads_finite, "steps": ft.steps}


@dataclass
class Run:
    """What every fold of one backtest shares: the cache, its market and per-row arrays, the
    config, where to run and write, the C51 support, the one random generator of the policies,
    the trade-outcome class (-1 / 0 / 1 / 2: undefined, stop, timeout, profit) and volatility per
    row, the direction horizon's index, the fixed rules' directions per row, and the given model
    (None: one encoder trained per fold) with its embeddings once computed."""

    data: CacheData
    market: Market
    cfg: BacktestConfig
    device: torch.device
    tmp: Path
    progress: bool
    z: torch.Tensor
    gen: torch.Generator
    tb: torch.Tensor
    rv: torch.Tensor
    h_pick: int
    hindsight: torch.Tensor
    ofi_dir: torch.Tensor | None
    oracle: dict[str, torch.Tensor]
    given: tuple | None = None
    given_emb: dict = field(default_factory=dict)
    encoders: dict = field(default_factory=dict)  # fold -> future of its encoder's folder (start_encoders)
    drift: np.ndarray | None = None  # (T,) float64 ticks, the sidecar's drift_K per row (None: no oracle)


def make_run(data: CacheData, market: Market, rows: Rows, given: tuple | None, cfg: BacktestConfig,
             device: torch.device, tmp: Path, notes: dict, progress: bool) -> Run:
    """The :class:`Run` of a backtest; ``notes["oracle"]`` says where the planted signal came from
    (:func:`~alphamodel.backtest.market.planted_drift_rows`: the oracle trades on the expected
    mid change over the holding period, ``stride`` rows)."""
    c = cfg.c51
    z = support(c.n_atoms, c.v_min, c.v_max, device)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    T = data.n_rows
    tb = torch.as_tensor(np.where(np.isnan(rows.tb), -1, rows.tb + 1), dtype=torch.long, device=device)
    rv = torch.as_tensor(rows.rv, dtype=torch.float32, device=device)
    mid, end = market.mid, market.end
    ahead = torch.minimum(torch.arange(T, device=device) + cfg.stride, end)
    hindsight = torch.sign(mid[ahead] - mid)
    drift, k_used, notes["oracle"] = planted_drift_rows(data, cfg.stride)
    drift = np.nan_to_num(drift, nan=0.0)
    oracle = {name: torch.as_tensor(np.where(drift > m, 1.0, np.where(drift < -m, -1.0, 0.0)), dtype=torch.float32,
                                    device=device)
              for name, m in zip(ORACLE_NAMES, ORACLE_MARGINS)} if k_used is not None else {}
    ofi_dir = torch.as_tensor(np.sign(np.nan_to_num(rows.ofi)), dtype=torch.float32, device=device)
    h_pick = int(np.argmin([abs(h - cfg.stride) for h in data.horizons]))
    return Run(data, market, cfg, device, tmp, progress, z, gen, tb, rv, h_pick, hindsight,
               ofi_dir if notes["ofi_sign_column"] else None, oracle, given,
               drift=drift if k_used is not None else None)


@dataclass
class FoldInputs:
    """A fold's encoder (``model``, ``norm``, its training ``window``), the z-scored embedding of
    every row of its sessions (T, D) (zeros elsewhere) with the training rows' ``mu``/``sd``, the
    direction head's up-probability per row (0.5 elsewhere), its training and test rows."""

    model: torch.nn.Module
    norm: object
    window: int
    emb: torch.Tensor
    mu: torch.Tensor
    sd: torch.Tensor
    phead: np.ndarray
    tr_rows: np.ndarray
    te_rows: np.ndarray
    logistic: np.ndarray | None = None


def fold_inputs(run: Run, k: int, tr_s: np.ndarray, te_s: np.ndarray) -> FoldInputs:
    """The encoder of fold ``k`` (the given model, or one trained on its training sessions) and the
    embeddings of its sessions."""
    data, device = run.data, run.device
    given = run.given
    t0 = time.perf_counter()
    if given is not None:
        model, norm, meta = given
    elif k in run.encoders:
        model, norm, meta = load_model(run.encoders.pop(k).result(), str(device))
    else:
        model, norm, meta = fold_encoder(data, tr_s, k, run.cfg, run.tmp, run.progress, device)
    t1 = time.perf_counter()
    tcm = meta.get("train", {})
    window = int(tcm.get("window", 64))  # the fine-tuned encoder's windows (they end at the row)
    segs = sorted(set(tr_s.tolist()) | set(te_s.tolist()))
    if given is None:
        emb_np = embed_segments(model, norm, data, segs, tcm, device)
    else:  # one model for every fold: its embeddings are computed once
        if not run.given_emb:
            run.given_emb.update(embed_segments(model, norm, data, list(range(len(data.segments))), tcm, device))
        emb_np = {s: run.given_emb[s] for s in segs}
    log.info("fold %d: encoder %.1f s, embeddings of %d sessions %.1f s", k, t1 - t0, len(segs),
             time.perf_counter() - t1)
    T = data.n_rows
    D = next(iter(emb_np.values()))[0].shape[1]
    emb = torch.zeros(T, D, device=device)
    phead = np.full(T, 0.5)
    for s, (e, p) in emb_np.items():
        a, b = data.offsets[s], data.offsets[s + 1]
        emb[a:b] = torch.from_numpy(e).to(device)
        phead[a:b] = p[:, run.h_pick]
    tr_rows = data.segment_rows(tr_s)
    te_rows = data.segment_rows(te_s)
    assert tr_rows.max() < te_rows.min()
    tr_t = torch.as_tensor(tr_rows, device=device)
    mu, sd = emb[tr_t].mean(0), emb[tr_t].std(0).clamp_min(1e-6)
    return FoldInputs(model, norm, window, (emb - mu) / sd, mu, sd, phead, tr_rows, te_rows)


def horizon_seconds(run: Run, ts: np.ndarray, tr_s: np.ndarray) -> float:
    """Seconds per return horizon (``n_step`` decisions of ``stride`` rows), the mean measured on
    the training sessions ``tr_s`` (``ts``: ts_recv per row, ns); 1 when they hold no decision."""
    data, stride = run.data, run.cfg.stride
    dts = [(ts[min(r + stride, data.offsets[s + 1] - 1)] - ts[r]) / 1e9
           for s in tr_s for r in range(int(data.offsets[s]), int(data.offsets[s + 1]) - 1, stride)]
    return float(np.mean(dts)) * run.cfg.c51.n_step if dts else 1.0


def fold_learner(run: Run, k: int, fi: FoldInputs, use_aux: bool = True) -> tuple[Learner, Obs]:
    """Fold ``k``'s C51 learner, freshly initialised (torch's global seed set to ``seed + k``, so
    every fill mode's policy starts alike), and its inputs: the frozen embeddings of its rows;
    without ``use_aux`` the K=3 trade-outcome head is not trained (its loss weight 0)."""
    cfg, c, device = run.cfg, run.cfg.c51, run.device
    if not use_aux:
        c = dataclasses.replace(c, aux_weight=0.0)
    obs = Obs(fi.emb, cfg.fee_max)
    torch.manual_seed(cfg.seed + k)
    net = C51Net(fi.emb.shape[1] + 2, 3, c.n_atoms, c.hidden).to(device)
    aux_w = class_weights(run.tb[torch.as_tensor(fi.tr_rows, device=device)])  # inverse class frequency, training rows
    opt = torch.optim.Adam(net.parameters(), lr=c.lr, fused=device.type == "cuda")  # one kernel a step on a GPU
    return Learner(net, copy.deepcopy(net), obs, run.z, opt, run.tb, c, aux_w), obs


def mode_generator(run: Run, k: int, i: int) -> torch.Generator:
    """The random generator of fold ``k``'s policy in its ``i``-th fill mode (exploration,
    episode starts, fees, replay): its own stream, so that the modes can train at once."""
    return torch.Generator(device=run.device).manual_seed(run.cfg.seed * 1_000_003 + 1000 * k + i)


def fold_policy(run: Run, k: int, learner: Learner, pool: torch.Tensor, bar, n_folds: int, mode: str,
                gen: torch.Generator) -> int:
    """Train fold ``k``'s ``learner`` filled by ``mode`` from the rows ``pool`` (where an episode
    may start) with the generator ``gen``; returns its task on the progress bar ``bar``."""
    cfg = run.cfg
    n_steps = cfg.policy_steps + (cfg.finetune_steps if cfg.fine_tune else 0)
    what = "" if cfg.fills == ("taker",) else f", {mode} fills"
    task = bar.add_task(f"fold {k} ({k + 1} of {n_folds}) c51{what}", total=n_steps)
    train_policy(learner, fill_env(run.market, cfg.envs, cfg, mode), pool, cfg.policy_steps, gen,
                 fee_max=cfg.fee_max, reward_scale=cfg.reward_scale, bar=bar, task=task)
    return task


def fold_logistic(run: Run, fi: FoldInputs) -> np.ndarray:
    """The logistic baseline's up-probability per row (NaN outside the test rows): one fit per
    fold, whatever the fill modes (kept in ``fi.logistic``)."""
    if fi.logistic is None:
        fi.logistic = np.full(run.data.n_rows, np.nan)
        fi.logistic[fi.te_rows] = logistic_scores(run.data, fi.tr_rows, fi.te_rows, run.h_pick, run.cfg.seed)
    return fi.logistic


def fold_strategies(run: Run, fi: FoldInputs, learner: Learner, obs: Obs, pool: torch.Tensor, horizon_s: float,
                    bar, task, mode: str, gen: torch.Generator) -> tuple[dict, dict | None]:
    """Every strategy of a fold (the C51 policies, then the rules in the summary's order) and the
    fine-tune path's report (None without ``fine_tune``); the fine-tune trains in ``mode`` with
    the generator ``gen``."""
    cfg, device, data, T = run.cfg, run.device, run.data, run.data.n_rows
    pol = functools.partial(c51_targets, z=run.z, rv=run.rv, cfg=cfg, horizon_s=horizon_s)
    strategies = {"c51": functools.partial(pol, learner.net, obs, kelly=cfg.kelly)}
    if cfg.kelly:
        strategies["c51-unit"] = functools.partial(pol, learner.net, obs, kelly=False)
    ft_info = None
    if cfg.fine_tune:
        ft_net, ft_obs, ft_info = fine_tune(learner, fi.model, fi.norm, data, fi.window, fi.mu, fi.sd, run.market,
                                            pool, cfg, gen, bar, task, mode)
        strategies["c51-finetune"] = functools.partial(pol, ft_net, ft_obs, kelly=cfg.kelly)
    lab = fold_logistic(run, fi)
    direction = lambda p: rule(torch.as_tensor(threshold_dir(p, cfg.threshold), dtype=torch.float32,  # noqa: E731
                                               device=device))
    strategies.update({
        "flat": rule(torch.zeros(T, device=device)), "long": rule(torch.ones(T, device=device)),
        **({"ofi-sign": rule(run.ofi_dir)} if run.ofi_dir is not None else {}),
        "logistic": direction(np.nan_to_num(lab, nan=0.5)), "direction-head": direction(fi.phead),
        "hindsight": rule(run.hindsight)})
    strategies.update({name: rule(d) for name, d in run.oracle.items()})
    if run.drift is not None:  # hysteresis: its entry band is the round trip of the mode and cost level
        strategies[ORACLE_BAND] = oracle_band(run.drift, run.market, cfg, mode)
    return strategies, ft_info


def fold_mode(run: Run, k: int, te_s: np.ndarray, fi: FoldInputs, learner: Learner, obs: Obs, pool: torch.Tensor,
              horizon_s: float, bar, n_folds: int, mode: str, gen: torch.Generator) -> dict:
    """Fold ``k`` in one fill mode: the policy trained (:func:`fold_policy`), every strategy
    evaluated on the test sessions ``te_s`` at every cost, their results (:func:`fold_results`);
    returns ``results``, ``curves``, ``daily``, ``loss`` and ``fine_tune``."""
    task = fold_policy(run, k, learner, pool, bar, n_folds, mode, gen)
    strategies, ft_info = fold_strategies(run, fi, learner, obs, pool, horizon_s, bar, task, mode, gen)
    ev = evaluate(strategies, run.market, te_s, tuple(run.cfg.costs), run.cfg, mode)
    res, cur = fold_results(run, k, te_s, strategies, ev, mode)
    return {"results": res, "curves": cur, "daily": {(s, c, mode): r["daily"] for (s, c), r in ev.items()},
            "loss": float(np.mean(learner.loss_values(20))) if learner.losses else None, "fine_tune": ft_info}


def fold_results(run: Run, k: int, te_s: np.ndarray, strategies: dict, ev: dict, mode: str = "taker"
                 ) -> tuple[list[dict], dict]:
    """The result rows of fold ``k`` filled by ``mode`` (strategy x cost; the deflated Sharpe over
    the strategies tried at this fold, cost and mode; the fill statistics) and each one's equity
    curve over the test sessions end to end, keyed ``(fold, cost, strategy, mode)``. With fewer
    than :data:`alphamodel.readout.MIN_SHARPE_SESSIONS` test sessions the fold's Sharpe, PSR and
    DSR are NaN (they would not mean anything); its PnL per session and 95% bootstrap interval
    are always there."""
    results, curves = [], {}
    J = len(te_s)
    enough = J >= MIN_SHARPE_SESSIONS  # else no Sharpe, PSR or DSR: PnL per session with its interval
    for cost in run.cfg.costs:
        trials = [sharpe(ev[(s, cost)]["daily"]) for s in strategies if s not in NOT_TRIALS]
        for s in strategies:
            r = ev[(s, cost)]
            st = sharpe_stats(r["daily"], np.array(trials))
            if not enough:
                st = {m: math.nan for m in st}
            ro = session_readout(r["daily"], seed=run.cfg.seed)
            eq = np.concatenate([r["curve"][j] + (r["daily"][:j].sum() if j else 0.0) for j in range(J)])
            results.append({
                "strategy": s, "fold": k, "cost_ticks": cost, "sharpe": st["sharpe"],
                "pnl_per_session": ro["pnl_per_session"], "pnl_ci": ro["pnl_ci"],
                "deflated_sharpe": st["deflated_sharpe"] if s not in NOT_TRIALS else math.nan,
                "win_rate": float(r["wins"].sum() / r["closed"].sum()) if r["closed"].sum() else math.nan,
                "trades_per_session": float(r["entries"].sum() / J), "turnover": float(r["turnover"].sum() / J),
                "max_drawdown": max_drawdown(eq), "pnl_ticks": float(r["daily"].sum()),
                "pnl_usd": float(r["daily"].sum() * run.market.tick_value), "psr": st["psr"],
                "sharpe_daily": st["sharpe_daily"], "autocorr1": st["autocorr1"], "sessions": J, "fill": mode,
                **{f"fill_{m}": v for m, v in r["fills"].items()}})
            curves[(k, cost, s, mode)] = eq
    return results, curves


def run_fold(run: Run, k: int, tr_s: np.ndarray, te_s: np.ndarray, ts: np.ndarray, bar, n_folds: int,
             use_aux: bool = True) -> dict:
    """Fold ``k`` (training sessions ``tr_s``, test sessions ``te_s``) end to end, one policy per
    fill mode (trained in the mode it is evaluated in); writes its policies
    (``policy_fold{k}.safetensors`` for the first mode, ``policy_fold{k}_{mode}.safetensors`` for
    the others) to ``run.tmp``. Returns ``results``, ``curves``, ``aux`` (:func:`aux_report`, of
    the first mode's policy; without ``use_aux`` the head is not trained and not reported),
    ``daily`` (``{(strategy, cost, mode): PnL per test session}``), ``fold`` (the summary's record
    of it) and ``embedding_dim``."""
    data, device, modes = run.data, run.device, run.cfg.fills
    t0 = time.perf_counter()
    fi = fold_inputs(run, k, tr_s, te_s)
    horizon_s = horizon_seconds(run, ts, tr_s)
    pool = torch.as_tensor(data.segment_rows(tr_s, drop_last=1), device=device)
    fold_logistic(run, fi)
    t1 = time.perf_counter()
    learners = [fold_learner(run, k, fi, use_aux) for _ in modes]  # initialised in turn: the global seed
    jobs = [functools.partial(fold_mode, run, k, te_s, fi, lrn, obs, pool, horizon_s, bar, n_folds, mode,
                              mode_generator(run, k, i)) for i, (mode, (lrn, obs)) in enumerate(zip(modes, learners))]
    if mode_threads(run.cfg, device, len(modes)) > 1:
        # the modes' steps are small and launch-bound: threads overlap their launches (one CUDA context)
        with concurrent.futures.ThreadPoolExecutor(len(modes)) as ex:
            done = [f.result() for f in [ex.submit(j) for j in jobs]]
    else:
        done = [j() for j in jobs]
    log.info("fold %d: policies and evaluation of %s %.1f s (fold so far %.1f s)", k, ",".join(modes),
             time.perf_counter() - t1, time.perf_counter() - t0)
    results, curves, daily = [], {}, {}
    for d in done:
        results += d["results"]
        curves.update(d["curves"])
        daily.update(d["daily"])
    losses = {m: d["loss"] for m, d in zip(modes, done)}
    learner, obs = learners[0]
    aux = aux_report(learner, obs, run.tb, fi.tr_rows, fi.te_rows, run.cfg, device, k) if use_aux else {
        "fold": k, "available": False, "off": "not trained: aux_weight 0, or it did not learn in the earlier "
        "folds (aux_head_verdict)"}
    for mode, (lrn, _) in zip(modes, learners):
        state = {f"net.{n}": v.detach().cpu().contiguous() for n, v in lrn.net.state_dict().items()}
        state.update({"emb.mean": fi.mu.cpu(), "emb.std": fi.sd.cpu(), "support": run.z.cpu()})
        name = f"policy_fold{k}.safetensors" if mode == modes[0] else f"policy_fold{k}_{mode}.safetensors"
        save_tensors(state, run.tmp / name, "alphamodel-c51-1")
    ft_infos = {m: d["fine_tune"] for m, d in zip(modes, done)}
    first = run.cfg.fills[0]
    fold = {
        "fold": k, "train_sessions": [data.segments[s].session for s in tr_s],
        "test_sessions": [data.segments[s].session for s in te_s],
        "train_rows": [int(fi.tr_rows.min()), int(fi.tr_rows.max())],
        "test_rows": [int(fi.te_rows.min()), int(fi.te_rows.max())],
        "policy_loss_last": losses[first], "policy_loss_last_by_fill": losses,
        "horizon_s": horizon_s, "fine_tune": ft_infos[first]}
    return {"results": results, "curves": curves, "aux": aux, "daily": daily, "fold": fold,
            "embedding_dim": fi.emb.shape[1]}
