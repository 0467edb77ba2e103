"""alphamodel's config files: :func:`read_config` (``alphamodel train --config FILE``) and
:func:`read_backtest_config` (``alphamodel backtest --config FILE``), with the command line's
values laid over the file's.

Each config checks itself (``checked()``, ``from_dict()``, by :mod:`alphamodel.rules`): this
module only reads files and names them in errors. :func:`check_config` and :func:`from_dict`
are the same checks for any of the four configs (:class:`~alphamodel.nn.model.ModelConfig`,
:class:`~alphamodel.supervised.config.TrainConfig`, :class:`~alphamodel.rl.config.C51Config`,
:class:`~alphamodel.backtest.config.BacktestConfig`). The top layer of alphamodel: nothing in
the package imports it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TypeVar

from alphafeat import errors as af
from alphamodel.backtest.config import BacktestConfig
from alphamodel.errors import ConfigError
from alphamodel.nn.model import ModelConfig
from alphamodel.supervised.config import TrainConfig

__all__ = ["check_config", "from_dict", "read_backtest_config", "read_config"]

T = TypeVar("T")


def check_config(cfg: T) -> T:
    """``cfg`` (a ModelConfig, TrainConfig, BacktestConfig or C51Config) with each key checked and
    normalised (its ``checked()``); a copy.

    Raises
    ------
    alphamodel.errors.UsageError
        Naming the key (``train.epochs``, ``stride``, ``c51.n_atoms``), the value and what is
        allowed; also for keys that do not fit together (``burn_in`` >= ``window``,
        ``expand * d_model`` not a multiple of ``headdim``, ``v_min`` >= ``v_max``).
    """
    return cfg.checked()  # type: ignore[attr-defined]


def from_dict(cls: type[T], d: dict) -> T:
    """``cls(**d)`` checked (``cls.from_dict``); unknown keys are refused (UsageError)."""
    return cls.from_dict(d)  # type: ignore[attr-defined]


def read_config(path: str | os.PathLike[str] | None, train: dict | None = None) -> tuple[ModelConfig, TrainConfig]:
    """``(ModelConfig, TrainConfig)`` from a JSON file ``{"model": {...}, "train": {...}}``
    (either may be left out; None for no file: the defaults), with ``train`` (checked values,
    e.g. from the command line) laid over the file's ``train``.

    Raises
    ------
    alphamodel.errors.ConfigError
        The file cannot be read or is not such an object, or a key or value is bad: one line
        naming the file and the key (``train.epochs``).
    alphamodel.errors.UsageError
        Without a file, a bad value in ``train``.
    """
    if path is None:
        return ModelConfig(), TrainConfig.from_dict(dict(train or {}))
    p = Path(path)
    doc = _read_object(p, "with 'model' and/or 'train'")
    bad = sorted(set(doc) - {"model", "train"})
    if bad:
        raise ConfigError(p, "", f"unknown top-level key(s) {', '.join(bad)} (use 'model' and 'train')")
    try:
        tcfg = doc.get("train", {})
        if isinstance(tcfg, dict):
            tcfg = {**tcfg, **(train or {})}
        return ModelConfig.from_dict(doc.get("model", {})), TrainConfig.from_dict(tcfg)
    except af.UsageError as e:  # alphafeat's validate_* or ours
        given = train or {}
        if e.option.removeprefix("train.") in given:
            raise  # the command line's value: a usage error of that option, not of the file
        problem = e.problem
        if e.option == "train.burn_in" and "window" in given:
            problem += f" (window {given['window']} from the command line)"
        raise ConfigError(p, e.option, problem) from None


def _read_object(p: Path, what: str) -> dict:
    """The JSON object in ``p``; ConfigError naming ``p`` when unreadable or not an object."""
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(p, "", f"cannot read the config ({e})") from None
    if not isinstance(doc, dict):
        raise ConfigError(p, "", f"expected a JSON object {what}")
    return doc


def read_backtest_config(path: str | os.PathLike[str] | None, options: dict | None = None) -> BacktestConfig:
    """A checked :class:`~alphamodel.backtest.config.BacktestConfig`: the JSON object in ``path``
    (BacktestConfig keys, ``c51`` an object of C51Config keys; None for no file) with
    ``options`` (checked values, e.g. from the command line) laid over it.

    Raises
    ------
    alphamodel.errors.ConfigError
        The file cannot be read or is not such an object, or a key or value is bad: one line
        naming the file and the key (``stride``, ``c51.n_atoms``).
    alphamodel.errors.UsageError
        Without a file, a bad value in ``options``.
    """
    if path is None:
        return BacktestConfig.from_dict(dict(options or {}))
    p = Path(path)
    doc = _read_object(p, "of BacktestConfig keys (with 'c51': {...C51Config keys})")
    try:
        return BacktestConfig.from_dict({**doc, **(options or {})})
    except af.UsageError as e:
        raise ConfigError(p, e.option, e.problem) from None
