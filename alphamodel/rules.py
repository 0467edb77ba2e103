"""How alphamodel's config dataclasses check themselves: each key declared once, on its field
(:func:`alphafeat.options.opt`: its help, its check, whether the command line has it), each
check a ``validate_*`` of :mod:`alphafeat.validation` or :mod:`alphamodel.enums`.

Each config (:class:`~alphamodel.nn.model.ModelConfig`,
:class:`~alphamodel.supervised.config.TrainConfig`, :class:`~alphamodel.rl.config.C51Config`,
:class:`~alphamodel.backtest.config.BacktestConfig`) calls :func:`check_fields` in its
``checked()`` and :func:`build` in its ``from_dict()``, so a bad value is one line naming the
key, the value and what is allowed, before anything is read or trained. A config file is
stricter than the command line about types: text for a number (``"3"``) is refused there.
Keys without a check are checked by their annotated type (``int``, ``float``, ``bool``,
``str``, ``... | None``).

Keys are named as the config file holds them: ``train.epochs``, ``model.d_model`` (a train
config has ``model`` and ``train`` sections); ``stride``, ``c51.n_atoms`` (a backtest config is
one object of BacktestConfig keys, its ``c51`` an object of C51Config keys).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from alphafeat.options import KEY, optional
from alphafeat.validation import validate_bool, validate_enum, validate_float, validate_int
from alphamodel.errors import UsageError

__all__ = ["SIZE", "Rule", "build", "check_fields", "enum_rule", "float_rule", "int_rule", "optional", "rule_of",
           "str_rule"]  # fmt: skip

T = TypeVar("T")
#: A key's check: ``rule(value, option=KEY NAME) -> the checked, normalised value`` (UsageError otherwise).
Rule = Callable[..., Any]


def int_rule(lo: int | None = None, what: str = "a whole number") -> Rule:
    """A whole number ``>= lo`` (:func:`~alphafeat.validation.validate_int`)."""
    return functools.partial(validate_int, lo=lo, what=what)


def float_rule(lo: float | None = None, hi: float | None = None, open_: bool = False, hi_open: bool | None = None
               ) -> Rule:
    """A number in ``[lo, hi]``; ``open_`` excludes both bounds, ``hi_open`` the upper one alone."""
    return functools.partial(validate_float, lo=lo, hi=hi, lo_open=open_, hi_open=open_ if hi_open is None else hi_open)


def enum_rule(enum: type) -> Rule:
    """A member of ``enum`` (or its string)."""
    return functools.partial(validate_enum, enum=enum)


def str_rule(value: Any, option: str) -> str:
    """Any string."""
    if not isinstance(value, str):
        raise UsageError(option, "expected a string", value)
    return value


def _number(rule: Rule, what: str) -> Rule:
    """``rule`` for a number in a config: text (``"3"``) is the wrong type there."""

    def check(value: Any, option: str) -> Any:
        if isinstance(value, str):
            raise UsageError(option, f"expected {what}, not text", value)
        return rule(value, option=option)

    return check


#: A size: a whole number >= 1.
SIZE = int_rule(1)
_WHAT = {"int": "a whole number", "float": "a number"}
_BY_TYPE: dict[str, Rule] = {"int": _number(int_rule(), _WHAT["int"]), "float": _number(float_rule(), _WHAT["float"]),
                             "bool": validate_bool, "str": str_rule}  # fmt: skip


def rule_of(field: dataclasses.Field) -> Rule | None:
    """The rule of a config's key: its field's check (:func:`alphafeat.options.opt`), refusing
    text for a number (a field annotated ``int`` or ``float``, or either ``| None``); without a
    check, its annotated type's."""
    kind = str(field.type).replace(" ", "")
    base = kind.removesuffix("|None")
    o = field.metadata.get(KEY)
    if o is not None and o.check is not None:
        return _number(o.check, _WHAT[base]) if base in _WHAT else o.check
    if base in _BY_TYPE:
        return optional(_BY_TYPE[base]) if base != kind else _BY_TYPE[base]
    return None


def check_fields(cfg: Any, prefix: str) -> dict[str, Any]:
    """Every field of the dataclass ``cfg`` checked by its rule (:func:`rule_of`):
    ``{name: checked value}``. UsageError naming ``prefix + name`` (``train.epochs``)."""
    values = {}
    for f in dataclasses.fields(cfg):
        rule = rule_of(f)
        v = getattr(cfg, f.name)
        values[f.name] = v if rule is None else rule(v, option=prefix + f.name)
    return values


def build(cls: type[T], d: Any, where: str) -> T:
    """``cls(**d)``, unchecked; UsageError naming ``where`` (``model``, ``backtest``) when ``d`` is not
    a dict or holds keys that are not fields of ``cls``."""
    if not isinstance(d, dict):
        raise UsageError(where, "expected an object of keys and values", d)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    bad = sorted(set(d) - set(names))
    if bad:
        raise UsageError(where, f"unknown key(s) {', '.join(bad)}; known: {', '.join(names)}")
    return cls(**d)
