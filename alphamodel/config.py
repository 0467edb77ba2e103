"""Checks of alphamodel's configs: every key of :class:`~alphamodel.model.ModelConfig`,
:class:`~alphamodel.train.TrainConfig`, :class:`~alphamodel.backtest.BacktestConfig` and
:class:`~alphamodel.c51.C51Config` by a ``validate_*`` of :mod:`alphafeat.validation`.

Used by the configs' ``from_dict`` (config files), by :func:`alphamodel.train.train` and
:func:`alphamodel.backtest.backtest` (configs built in Python) and by ``alphamodel train
--config FILE`` / ``alphamodel backtest --config FILE``, so a bad value is one line naming the
key, the value and what is allowed, before anything is read or trained. Keys without a rule
here are checked by their annotated type (``int``, ``float``, ``bool``, ``str``, ``... | None``).

Keys are named as the config file holds them: ``train.epochs``, ``model.d_model`` (a train
config has ``model`` and ``train`` sections); ``stride``, ``c51.n_atoms`` (a backtest config is
one object of BacktestConfig keys, its ``c51`` an object of C51Config keys).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from alphafeat import errors as af
from alphafeat.validation import (
    CfcImpl,
    Context,
    Device,
    HorizonWeighting,
    SsdImpl,
    validate_baselines,
    validate_bool,
    validate_costs,
    validate_enum,
    validate_float,
    validate_int,
)
from alphamodel.errors import ConfigError, UsageError

__all__ = ["BACKTEST_RULES", "C51_RULES", "MAX_COST_TICKS", "MODEL_RULES", "TRAIN_RULES", "check_config", "from_dict",
           "read_backtest_config", "read_config"]

T = TypeVar("T")
Rule = Callable[[Any, str], Any]


def _number(rule: Rule, what: str) -> Rule:
    """``rule`` for a number in a config: text (``"3"``) is the wrong type there."""

    def check(v: Any, o: str) -> Any:
        if isinstance(v, str):
            raise UsageError(o, f"expected {what}, not text", v)
        return rule(v, o)

    return check


def _int(lo: int | None = None, what: str = "a whole number") -> Rule:
    return _number(lambda v, o: validate_int(v, o, lo=lo, what=what), what)


def _float(lo: float | None = None, hi: float | None = None, open_: bool = False, hi_open: bool | None = None
           ) -> Rule:
    """A number in ``[lo, hi]``; ``open_`` excludes both bounds, ``hi_open`` the upper one alone."""
    h = open_ if hi_open is None else hi_open
    return _number(lambda v, o: validate_float(v, o, lo=lo, hi=hi, lo_open=open_, hi_open=h), "a number")


def _optional(rule: Rule) -> Rule:
    return lambda v, o: None if v is None else rule(v, o)


def _enum(enum: type) -> Rule:
    return lambda v, o: validate_enum(v, enum, o)


def _str(v: Any, o: str) -> str:
    if not isinstance(v, str):
        raise UsageError(o, "expected a string", v)
    return v


_SIZE = _int(1)


def _scales(v: Any, o: str) -> tuple[float, ...]:
    """A list of time scales > 0 (rows), possibly empty."""
    if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)):
        raise UsageError(o, "expected a list of time scales in rows (e.g. [32, 128, 512, 2048])", v)
    return tuple(float(_float(0.0, open_=True)(x, o)) for x in v)


#: TrainConfig keys and their checks.
TRAIN_RULES: dict[str, Rule] = {
    "window": _int(1, "a number of snapshots"), "burn_in": _int(0, "a number of snapshots"),
    "context": _enum(Context), "batch_size": _SIZE, "epochs": _SIZE, "steps_per_epoch": _SIZE,
    "lr": _float(0.0, open_=True), "weight_decay": _float(0.0), "warmup_steps": _int(0),
    "min_lr_frac": _float(0.0, 1.0),
    "patience": _SIZE, "folds": _int(1, "a number of walk-forward folds"), "embargo": _float(0.0, 1.0, hi_open=True),
    "n_boot": _int(2, "a number of bootstrap replicates"), "baselines": validate_baselines,
    "horizon_weighting": _enum(HorizonWeighting), "seed": _int(0), "device": _enum(Device),
    "compile": validate_bool, "grad_clip": _float(0.0), "eval_batch_size": _SIZE,
    "eval_piece": _int(1, "a number of rows"), "eval_warmup": _int(0, "a number of rows"), "threads": _optional(_SIZE),
    "loader_threads": _int(1, "a number of threads"), "baseline_max_rows": _SIZE,
}  # fmt: skip
#: ModelConfig keys and their checks.
MODEL_RULES: dict[str, Rule] = {
    "n_features": _int(0), "n_horizons": _SIZE, "d_model": _SIZE, "n_layers": _SIZE, "d_state": _SIZE,
    "headdim": _SIZE, "expand": _SIZE, "d_conv": _SIZE, "chunk_size": _SIZE, "cfc_hidden": _SIZE,
    "dropout": _float(0.0, 1.0), "cfc_impl": _enum(CfcImpl), "ssd_impl": _enum(SsdImpl),
    "dt_min": _float(0.0, open_=True), "dt_max": _float(0.0, open_=True), "ema_rows": _scales,
    "ema_encoder": validate_bool,
}  # fmt: skip
#: Highest fee level of a backtest, ticks per contract per side.
MAX_COST_TICKS = 10.0


def _c51(v: Any, o: str) -> Any:
    """The ``c51`` key of a backtest config: a C51Config, or an object of its keys."""
    from alphamodel.c51 import C51Config

    return check_config(v, "c51") if isinstance(v, C51Config) else from_dict(C51Config, v, "c51")


#: BacktestConfig keys and their checks (the command line's options by the same validate_*).
BACKTEST_RULES: dict[str, Rule] = {
    "folds": _optional(_int(2, "a number of walk-forward folds")), "embargo": _int(0, "a number of sessions"),
    "costs": lambda v, o: validate_costs(v, o, hi=MAX_COST_TICKS), "stride": _int(1, "a number of rows"),
    "envs": _SIZE, "policy_steps": _SIZE, "fine_tune": validate_bool, "finetune_steps": _SIZE,
    "kelly": validate_bool, "kelly_k": _float(0.0, open_=True), "kelly_max": _float(0.0, open_=True),
    "fee_max": _float(0.0, MAX_COST_TICKS), "threshold": _float(0.0, 0.5, hi_open=True),
    "reward_scale": _float(0.0, open_=True), "encoder_epochs": _SIZE, "encoder_steps": _SIZE,
    "device": _enum(Device), "seed": _int(0), "tick_value": _optional(_float(0.0, open_=True)),
    "plots": validate_bool, "c51": _c51,
}  # fmt: skip
#: C51Config keys and their checks.
C51_RULES: dict[str, Rule] = {
    "n_atoms": _int(2, "a number of atoms"), "v_min": _float(), "v_max": _float(), "hidden": _SIZE,
    "gamma": _float(0.0, 1.0), "n_step": _SIZE, "lr": _float(0.0, open_=True), "batch_size": _SIZE, "replay": _SIZE,
    "target_every": _SIZE, "aux_weight": _float(0.0),
}  # fmt: skip
_RULES = {"train": TRAIN_RULES, "model": MODEL_RULES, "backtest": BACKTEST_RULES, "c51": C51_RULES}
#: How a section's keys are named: a backtest config's keys are its top level.
_PREFIX = {"backtest": ""}
_BY_TYPE: dict[str, Rule] = {"int": _int(), "float": _float(), "bool": validate_bool, "str": _str}


def _rule(field: dataclasses.Field, rules: dict[str, Rule]) -> Rule | None:
    if field.name in rules:
        return rules[field.name]
    kind = str(field.type).replace(" ", "")
    if kind.endswith("|None") and kind[:-5] in _BY_TYPE:
        return _optional(_BY_TYPE[kind[:-5]])
    return _BY_TYPE.get(kind)


def _key(section: str, name: str) -> str:
    return _PREFIX.get(section, f"{section}.") + name


def check_config(cfg: T, section: str) -> T:
    """``cfg`` (a ModelConfig, TrainConfig, BacktestConfig or C51Config; ``section`` is
    ``model``, ``train``, ``backtest`` or ``c51``) with each key checked and normalised; a copy.

    Raises
    ------
    alphamodel.errors.UsageError
        Naming the key (``train.epochs``, ``stride``, ``c51.n_atoms``), the value and what is
        allowed; also for keys that do not fit together (``burn_in`` >= ``window``,
        ``expand * d_model`` not a multiple of ``headdim``, ``v_min`` >= ``v_max``).
    """
    rules = _RULES[section]
    values = {}
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        rule = _rule(f, rules)
        v = getattr(cfg, f.name)
        values[f.name] = v if rule is None else rule(v, _key(section, f.name))
    _check_together(values, section)
    return dataclasses.replace(cfg, **values)  # type: ignore[type-var]


def _check_together(v: dict[str, Any], section: str) -> None:
    if section == "c51":
        if v["v_min"] >= v["v_max"]:
            raise UsageError("c51.v_min", f"expected a number below v_max={v['v_max']:g}", v["v_min"])
    elif section == "backtest":
        pass
    elif section == "train":
        if v["burn_in"] >= v["window"]:
            raise UsageError(f"{section}.burn_in", f"expected a number of snapshots in [0, window={v['window']})",
                             v["burn_in"])  # fmt: skip
    elif (v["expand"] * v["d_model"]) % v["headdim"]:
        raise UsageError(f"{section}.headdim", f"expected a divisor of expand * d_model = {v['expand'] * v['d_model']}",
                         v["headdim"])  # fmt: skip
    else:
        if v["cfc_impl"] == CfcImpl.TRITON:
            check_tiles({f"{section}.cfc_hidden": v["cfc_hidden"]}, "cfc_impl 'triton'")
        if v["ssd_impl"] == SsdImpl.TRITON:
            check_tiles({f"{section}.{k}": v[k] for k in ("chunk_size", "headdim", "d_state")}, "ssd_impl 'triton'")


#: What the Triton CfC and SSD scans need of their sizes (``tl.dot`` tiles): the problem of a size that is not.
TILE_SIZE = "expected a power of two >= 16"


def is_tile_size(v: int) -> bool:
    """Whether ``v`` can be a size of the Triton CfC or SSD scan (:func:`alphamodel.cfc.check_triton`):
    a power of two >= 16."""
    return v >= 16 and not v & (v - 1)


def check_tiles(sizes: dict[str, int], what: str) -> None:
    """UsageError naming the first of ``sizes`` (option name -> value) that is not a tile size
    (:func:`is_tile_size`), as needed by ``what`` (e.g. ``"ssd_impl 'triton'"``)."""
    for name, v in sizes.items():
        if not is_tile_size(v):
            raise UsageError(name, f"{TILE_SIZE} with {what} (its tl.dot tiles)", v)


def from_dict(cls: type[T], d: dict, section: str) -> T:
    """``cls(**d)`` checked by :func:`check_config`; unknown keys are refused (UsageError).

    For ``train``, a ``burn_in`` not given is lowered to ``window // 4`` when the default
    would not fit the window.
    """
    where = _key(section, "").rstrip(".") or section
    if not isinstance(d, dict):
        raise UsageError(where, "expected an object of keys and values", d)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    bad = sorted(set(d) - set(names))
    if bad:
        raise UsageError(where, f"unknown key(s) {', '.join(bad)}; known: {', '.join(names)}")
    cfg = cls(**d)
    if section == "train" and "burn_in" not in d and "window" in d:
        window = validate_int(d["window"], "train.window", lo=1, what="a number of snapshots")
        if cfg.burn_in >= window:  # type: ignore[attr-defined]
            cfg = dataclasses.replace(cfg, burn_in=window // 4)  # type: ignore[type-var]
    return check_config(cfg, section)


def read_config(path: str | os.PathLike[str] | None, train: dict | None = None) -> tuple[Any, Any]:
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
    from alphamodel.model import ModelConfig
    from alphamodel.train import TrainConfig

    if path is None:
        return ModelConfig(), from_dict(TrainConfig, dict(train or {}), "train")
    p = Path(path)
    doc = _read_object(p, "with 'model' and/or 'train'")
    bad = sorted(set(doc) - {"model", "train"})
    if bad:
        raise ConfigError(p, "", f"unknown top-level key(s) {', '.join(bad)} (use 'model' and 'train')")
    try:
        tcfg = doc.get("train", {})
        if isinstance(tcfg, dict):
            tcfg = {**tcfg, **(train or {})}
        return from_dict(ModelConfig, doc.get("model", {}), "model"), from_dict(TrainConfig, tcfg, "train")
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


def read_backtest_config(path: str | os.PathLike[str] | None, options: dict | None = None) -> Any:
    """A checked :class:`~alphamodel.backtest.BacktestConfig`: the JSON object in ``path``
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
    from alphamodel.backtest import BacktestConfig

    if path is None:
        return from_dict(BacktestConfig, dict(options or {}), "backtest")
    p = Path(path)
    doc = _read_object(p, "of BacktestConfig keys (with 'c51': {...C51Config keys})")
    try:
        return from_dict(BacktestConfig, {**doc, **(options or {})}, "backtest")
    except af.UsageError as e:
        raise ConfigError(p, e.option, e.problem) from None
