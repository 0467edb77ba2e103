"""How alphamodel's config dataclasses check themselves: one rule per key, each a
``validate_*`` of :mod:`alphafeat.validation` or :mod:`alphamodel.enums`.

Each config (:class:`~alphamodel.nn.model.ModelConfig`,
:class:`~alphamodel.supervised.config.TrainConfig`, :class:`~alphamodel.rl.config.C51Config`,
:class:`~alphamodel.backtest.config.BacktestConfig`) holds its own table of rules and calls
:func:`check_fields` in its ``checked()`` and :func:`build` in its ``from_dict()``, so a bad
value is one line naming the key, the value and what is allowed, before anything is read or
trained. Keys without a rule are checked by their annotated type (``int``, ``float``, ``bool``,
``str``, ``... | None``).

Keys are named as the config file holds them: ``train.epochs``, ``model.d_model`` (a train
config has ``model`` and ``train`` sections); ``stride``, ``c51.n_atoms`` (a backtest config is
one object of BacktestConfig keys, its ``c51`` an object of C51Config keys).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from alphafeat.validation import validate_bool, validate_enum, validate_float, validate_int
from alphamodel.errors import UsageError

__all__ = ["SIZE", "Rule", "build", "check_fields", "enum_rule", "float_rule", "int_rule", "optional", "str_rule"]

T = TypeVar("T")
#: A key's check: ``rule(value, key name) -> the checked, normalised value`` (UsageError otherwise).
Rule = Callable[[Any, str], Any]


def _number(rule: Rule, what: str) -> Rule:
    """``rule`` for a number in a config: text (``"3"``) is the wrong type there."""

    def check(v: Any, o: str) -> Any:
        if isinstance(v, str):
            raise UsageError(o, f"expected {what}, not text", v)
        return rule(v, o)

    return check


def int_rule(lo: int | None = None, what: str = "a whole number") -> Rule:
    """A whole number ``>= lo`` (not text)."""
    return _number(lambda v, o: validate_int(v, o, lo=lo, what=what), what)


def float_rule(lo: float | None = None, hi: float | None = None, open_: bool = False, hi_open: bool | None = None
               ) -> Rule:
    """A number in ``[lo, hi]``; ``open_`` excludes both bounds, ``hi_open`` the upper one alone."""
    h = open_ if hi_open is None else hi_open
    return _number(lambda v, o: validate_float(v, o, lo=lo, hi=hi, lo_open=open_, hi_open=h), "a number")


def optional(rule: Rule) -> Rule:
    """``rule``, or None."""
    return lambda v, o: None if v is None else rule(v, o)


def enum_rule(enum: type) -> Rule:
    """A member of ``enum`` (or its string)."""
    return lambda v, o: validate_enum(v, enum, o)


def str_rule(v: Any, o: str) -> str:
    """Any string."""
    if not isinstance(v, str):
        raise UsageError(o, "expected a string", v)
    return v


#: A size: a whole number >= 1.
SIZE = int_rule(1)
_BY_TYPE: dict[str, Rule] = {"int": int_rule(), "float": float_rule(), "bool": validate_bool, "str": str_rule}


def _rule(field: dataclasses.Field, rules: dict[str, Rule]) -> Rule | None:
    if field.name in rules:
        return rules[field.name]
    kind = str(field.type).replace(" ", "")
    if kind.endswith("|None") and kind[:-5] in _BY_TYPE:
        return optional(_BY_TYPE[kind[:-5]])
    return _BY_TYPE.get(kind)


def check_fields(cfg: Any, rules: dict[str, Rule], prefix: str) -> dict[str, Any]:
    """Every field of the dataclass ``cfg`` checked by its rule in ``rules`` (else by its annotated
    type): ``{name: checked value}``. UsageError naming ``prefix + name`` (``train.epochs``)."""
    values = {}
    for f in dataclasses.fields(cfg):
        rule = _rule(f, rules)
        v = getattr(cfg, f.name)
        values[f.name] = v if rule is None else rule(v, prefix + f.name)
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
