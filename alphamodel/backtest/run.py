"""``alphamodel backtest``: a C51 policy on the encoder's state, walk-forward, cost-aware.

:func:`backtest` reads the cache's market (:mod:`~alphamodel.backtest.market`), cuts the
sessions into folds and runs each (:mod:`~alphamodel.backtest.walkforward`), and writes the
summary (:mod:`~alphamodel.backtest.report`).

For each walk-forward fold over sessions
(:func:`~alphamodel.backtest.walkforward.fold_sessions`: expanding window, purged with
:func:`alphafeat.splits.purged_walk_forward` on the sessions' spans, an optional embargo of
whole sessions before the test block) the policy is trained on the fold's past sessions only and
evaluated on its test sessions, once per fill mode (``fills``: taker, mid, passive; trained in the
mode it is evaluated in) in :class:`alphamodel.backtest.execution.ExecEnv`:

1. encoder: ``--model DIR`` (one ``alphamodel train`` checkpoint for every fold; it must have
   been trained before the first test session for the walk-forward to be honest: the summary
   says so) or, without it, one small encoder trained per fold on that fold's training
   sessions (``encoder_fold{k}/``);
2. frozen path (``c51``): the embeddings of every row computed once (:mod:`alphamodel.supervised.embed`),
   z-scored with the training rows' statistics; the policy input is ``[embedding, position,
   fee / fee_max]``; C51 (:mod:`alphamodel.rl.c51`) with n-step returns, a replay buffer, a target
   network, Thompson exploration, a fee drawn per episode from ``[0, fee_max]`` (cost
   randomisation: one policy for every cost level) and the K = 3 trade-outcome head on
   ``tb_label`` (classes: stop / timeout / profit *of a long entered at the row*, i.e. the
   triple barrier's -1 / 0 / +1; masked where NaN; its cross-entropy weighted by inverse class
   frequency on the fold's training rows, :func:`alphamodel.rl.c51.class_weights`, so it cannot win
   by always saying ``timeout``; ``aux_head`` reports accuracy, balanced accuracy and the
   majority-class rate);
3. fine-tune path (``c51-finetune``, ``--fine-tune``): the frozen policy trained further with
   the C51 loss back-propagated into the Mamba2 -> CfC encoder (windows of the model's length);
4. evaluation: greedy on the C51 means, Kelly-sized (:mod:`alphamodel.backtest.metrics`; ``c51-unit`` is
   the same policy at unit size) and the baselines — ``flat``, ``long``, ``ofi-sign`` (sign of
   the integrated OFI), ``logistic`` (logistic regression on all the row's input features, as
   ``alphamodel train``'s baseline, fitted on the training sessions, long above
   ``0.5 + threshold``, short below ``0.5 - threshold``),
   ``direction-head`` (the encoder's direction head at the horizon nearest the stride, same
   threshold), ``hindsight`` (the sign of the mid's move over the next stride: look-ahead,
   an upper bound, never a trial) and, on a generated cache whose sources have the planted
   signal's sidecar (``alphafeat synth --signal-file``, :mod:`alphafeat.synth.planted`),
   ``oracle`` / ``oracle-m0.5``: long where the true model's expected mid change over the
   holding period (the sidecar's ``drift_K``, K = the stride, known at the row: its own event,
   :func:`~alphamodel.backtest.market.planted_drift_rows`) exceeds the margin, short below minus
   it, else flat (margins :data:`~alphamodel.backtest.config.ORACLE_MARGINS`, ticks), and
   ``oracle-band``, the same drift with hysteresis (:data:`~alphamodel.backtest.config.ORACLE_BAND`:
   enter beyond the round trip of the fill mode and cost level, leave when it turns against the
   position; :func:`~alphamodel.backtest.strategies.oracle_band`); not trials either — all in the
   same environment, costs and stride.

Per strategy x fill mode x fold x cost: the fill statistics (fill rate, time to fill, markouts),
annualised Sharpe of the daily (per session) PnL, deflated Sharpe
over the strategies tried at that fold and cost, PSR, win rate, trades and turnover per
session, max drawdown, PnL (:mod:`alphamodel.backtest.metrics`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from alphafeat.cache import check_folder
from alphamodel.backtest.config import RESULT_COLUMNS, BacktestConfig
from alphamodel.backtest.market import load_market
from alphamodel.backtest.report import (
    aggregate,
    cfg_dict,
    clean,
    fill_description,
    given_model_note,
    head_summary,
    pbo_by_cost,
    plots,
    pooled_readout,
    standing_notes,
)
from alphamodel.backtest.walkforward import default_folds, fold_sessions, make_run, run_fold, start_encoders
from alphamodel.data.cache import CacheData
from alphamodel.errors import DataError
from alphamodel.readout import MIN_SHARPE_SESSIONS
from alphamodel.supervised.checkpoint import load_model, resolve_device
from alphamodel.supervised.embed import check_model_inputs
from alphamodel.supervised.outputs import staged_outputs

__all__ = ["backtest"]


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
    check_folder(out)
    device = resolve_device(cfg.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    given = load_model(model_dir, str(device)) if model_dir is not None else None
    data = CacheData.open(cache)
    market, rows, notes = load_market(data, cfg, device)
    folds = _folds(data, cfg)
    if given is not None:
        check_model_inputs(data, given[1], str(model_dir))
        notes["model"] = given_model_note(str(model_dir), given[2].get("sessions_seen"),
                                          [{data.segments[int(k)].session for k in te} for _, te in folds])
    out = Path(out)
    with staged_outputs(out) as st:
        run = make_run(data, market, rows, given, cfg, device, st.dir, notes, progress)
        summary = _run(run, folds, rows.ts, notes)
        own_cache = Path(cache).resolve()  # the embedded sample's cache may live in out
        summary.update(cache=str(own_cache), out=str(out.resolve()), device=str(device),
                       seconds=time.perf_counter() - t_start, replaced=st.replacing("summary.json"),
                       left_from_earlier=[n for n in st.left_over("summary.json") if (out / n).resolve() != own_cache])
        (st.dir / "summary.json").write_text(json.dumps(clean(summary), indent=1))
    return json.loads((out / "summary.json").read_text())


def _folds(data: CacheData, cfg: BacktestConfig) -> list[tuple[np.ndarray, np.ndarray]]:
    """The walk-forward folds over the cache's sessions; DataError for a stride not below the
    shortest session or too few sessions."""
    min_len = min(s.n for s in data.segments)
    if cfg.stride >= min_len:
        raise DataError(f"stride {cfg.stride} (--stride, or \"stride\" in --config): out of range, the shortest "
                        f"session has {min_len} rows (stride must be below it)", data.root)
    folds_n = cfg.folds or default_folds(len(data.segments), cfg.embargo)
    starts = np.array([s.ts[0] for s in data.segments])
    ends = np.array([s.ts[-1] for s in data.segments])
    return fold_sessions(starts, ends, folds_n, cfg.embargo)


def _run(run, folds: list, ts: np.ndarray, notes: dict) -> dict:
    """Every fold (:func:`~alphamodel.backtest.walkforward.run_fold`) under one progress bar, then
    ``policy_config.json`` and the plots in ``run.tmp``; returns the summary."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    cfg = run.cfg
    done = []
    use_aux = cfg.c51.aux_weight > 0 and "aux_head" not in notes
    pool = start_encoders(run, folds)  # None: each fold's encoder trains in turn, here
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      disable=not run.progress, transient=False, console=Console(stderr=True)) as bar:
            for k, (tr_s, te_s) in enumerate(folds):
                done.append(run_fold(run, k, tr_s, te_s, ts, bar, len(folds), use_aux))
                # walk-forward: the head is used in the next fold only while the folds so far show it learns
                use_aux = use_aux and bool(head_summary([f["aux"] for f in done], cfg.seed).get("learns", True))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    aux = [f["aux"] for f in done]
    head = head_summary(aux, cfg.seed)
    for a in aux:
        a.pop("pred", None)
        a.pop("labels", None)
    results = [r for f in done for r in f["results"]]
    curves = {key: eq for f in done for key, eq in f["curves"].items()}
    (run.tmp / "policy_config.json").write_text(json.dumps(clean({
        "c51": dataclasses.asdict(cfg.c51), "obs": "[z-scored embedding (D), sign(position), fee / fee_max]",
        "actions": ["short", "flat", "long"], "embedding_dim": done[-1]["embedding_dim"], "backtest": cfg_dict(cfg),
        "checkpoints": [f"policy_fold{k}.safetensors" for k in range(len(folds))]}), indent=1))
    names = plots(run.tmp, curves, cfg) if cfg.plots else []
    daily = {key: np.concatenate([f["daily"][key] for f in done]) for key in done[0]["daily"]}
    pbo = pbo_by_cost(daily, cfg, run.tmp if cfg.plots else None)
    names += [p["plot"] for by_cost in pbo.values() for p in by_cost.values() if p.get("plot")]
    n_test = sum(len(te) for _, te in folds)
    return {"results": results, "aggregate": aggregate(results), "pooled": pooled_readout(daily, cfg.seed),
            "pbo": pbo, "folds": [f["fold"] for f in done], "test_sessions": n_test,
            "folds_reporting_sharpe": sum(len(te) >= MIN_SHARPE_SESSIONS for _, te in folds),
            "min_sharpe_sessions": MIN_SHARPE_SESSIONS, "fill": fill_description(cfg),
            "aux_head": aux, "aux_head_verdict": head, "plots": names,
            "notes": {**standing_notes(cfg, results), **notes}, "config": cfg_dict(cfg),
            "columns": list(RESULT_COLUMNS), "tick_value_usd": run.market.tick_value,
            "direction_horizon": run.data.horizons[run.h_pick]}
