"""``alphamodel backtest``: a C51 policy on the encoder's state, walk-forward, cost-aware
(:func:`~alphamodel.backtest.run.backtest`, :class:`~alphamodel.backtest.config.BacktestConfig`).

Modules, each importing only those before it: :mod:`~alphamodel.backtest.config`,
:mod:`~alphamodel.backtest.queue` (queue-position models), :mod:`~alphamodel.backtest.execution`
(fill models: taker, mid, passive; fees; fill statistics), :mod:`~alphamodel.backtest.market`
(the cache's columns), :mod:`~alphamodel.backtest.env` (the taker-only vectorised environment),
:mod:`~alphamodel.backtest.metrics` (Sharpe, PSR/DSR, Kelly),
:mod:`~alphamodel.backtest.strategies`, :mod:`~alphamodel.backtest.walkforward` (folds, one
fold's run), :mod:`~alphamodel.backtest.overfit` (the probability of backtest overfitting),
:mod:`~alphamodel.backtest.report`, :mod:`~alphamodel.backtest.run`.

``backtest`` is imported on first use: the config (and the command line that reads it) imports
no torch.
"""

from __future__ import annotations

from typing import Any

from alphamodel.backtest.config import BacktestConfig

__all__ = ["BacktestConfig", "backtest"]


def __getattr__(name: str) -> Any:
    if name == "backtest":
        from alphamodel.backtest.run import backtest

        return backtest
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
