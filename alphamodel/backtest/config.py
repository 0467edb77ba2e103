"""The backtest's config: :class:`BacktestConfig`, the rule of each of its keys, and the
constants its results are named by."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from alphafeat import errors as af
from alphafeat.validation import Device, split_list, validate_bool, validate_costs
from alphamodel.errors import UsageError
from alphamodel.rl.config import C51Config
from alphamodel.rules import SIZE, Rule, build, check_fields, enum_rule, float_rule, int_rule, optional

__all__ = ["BACKTEST_RULES", "DEFAULT_COSTS", "FILL_MODES", "MAX_COST_TICKS", "MAX_FEE_USD", "NOT_TRIALS",
           "ON_TIMEOUT", "ORACLE_MARGINS", "ORACLE_NAMES", "QUEUE_KINDS", "RESULT_COLUMNS", "TICK_VALUE",
           "BacktestConfig", "parse_queue", "validate_fills", "validate_queue"]

#: Highest fee level of a backtest, ticks per contract per side.
MAX_COST_TICKS = 10.0
DEFAULT_COSTS = (0.0, 0.0625, 0.125, 0.25, 0.5)
RESULT_COLUMNS = ("strategy", "fold", "cost_ticks", "sharpe", "deflated_sharpe", "win_rate", "trades_per_session",
                  "turnover", "max_drawdown", "pnl_ticks")
#: USD per tick per contract by product root (CME contract specs); others need tick_value.
TICK_VALUE = {"ES": 12.5, "MES": 1.25, "NQ": 5.0, "MNQ": 0.5}
#: Margins (ticks) of the ``oracle`` strategies, which trade on the true model's expected mid
#: change over the holding period (the planted-signal sidecar's ``drift_K`` at K = the stride,
#: :func:`alphamodel.backtest.market.planted_drift_rows`): long where it is above the margin,
#: short below minus it, else flat. ``oracle`` (0): the sign of the expected change, the most
#: expected mid gain per decision before costs; ``oracle-m0.5``: only where the expected change
#: covers half a tick, the round trip of a 1/4-tick fee per side (at the default signal strength
#: and stride 200 its SD is about 0.3 tick: it trades rarely).
ORACLE_MARGINS = (0.0, 0.5)
ORACLE_NAMES = tuple("oracle" if m == 0 else f"oracle-m{m:g}" for m in ORACLE_MARGINS)
NOT_TRIALS = ("hindsight", *ORACLE_NAMES)
#: Execution models (:mod:`alphamodel.backtest.execution`): ``mid`` is an upper bound.
FILL_MODES = ("taker", "mid", "passive")
#: Queue models of ``passive`` (:mod:`alphamodel.backtest.queue`).
QUEUE_KINDS = ("riskaverse", "power:N", "log", "through")
#: What an unfilled passive order does at its timeout.
ON_TIMEOUT = ("cancel", "cross")
#: Highest exchange fee per contract per side, USD.
MAX_FEE_USD = 100.0


def parse_queue(spec: Any, option: str = "--queue") -> tuple[str, float]:
    """``'riskaverse'`` / ``'power:N'`` / ``'log'`` / ``'through'`` -> ``(kind, N)`` (N = 0
    unless power; N a number in (0, 100]).

    Raises
    ------
    alphamodel.errors.UsageError
        An unknown model or a bad exponent, naming ``option``.
    """
    s = str(spec).strip().lower()
    if s in ("riskaverse", "log", "through"):
        return s, 0.0
    if s.startswith("power:"):
        try:
            n = float(s.split(":", 1)[1])
        except ValueError:
            n = math.nan
        if math.isfinite(n) and 0 < n <= 100:
            return "power", n
        raise UsageError(option, "the exponent of power:N must be a number in (0, 100], e.g. power:2", spec)
    raise UsageError(option, f"unknown queue model (choose from {', '.join(QUEUE_KINDS)})", spec)


def validate_fills(value: Any, option: str = "--fill") -> tuple[str, ...]:
    """Fill modes, ``"taker,passive"`` or a sequence: distinct members of :data:`FILL_MODES`."""
    try:
        out = tuple(str(v).strip() for v in split_list(value, option))
    except af.UsageError:
        out = ()
    if not out or len(set(out)) != len(out) or any(m not in FILL_MODES for m in out):
        raise UsageError(option, f"expected distinct fill modes from {', '.join(FILL_MODES)}, comma-separated", value)
    return out


def validate_queue(value: Any, option: str = "--queue") -> str:
    """A queue model (:func:`parse_queue`) in its canonical spelling (``power:2``)."""
    kind, n = parse_queue(value, option)
    return f"power:{n:g}" if kind == "power" else kind


def _on_timeout(v: Any, o: str) -> str:
    if v not in ON_TIMEOUT:
        raise UsageError(o, f"expected one of {', '.join(ON_TIMEOUT)}", v)
    return v


def _c51(v: Any, o: str) -> C51Config:
    """The ``c51`` key of a backtest config: a C51Config, or an object of its keys."""
    return v.checked() if isinstance(v, C51Config) else C51Config.from_dict(v)


#: BacktestConfig keys and their checks (the command line's options by the same validate_*).
BACKTEST_RULES: dict[str, Rule] = {
    "folds": optional(int_rule(2, "a number of walk-forward folds")), "embargo": int_rule(0, "a number of sessions"),
    "costs": lambda v, o: validate_costs(v, o, hi=MAX_COST_TICKS), "stride": int_rule(1, "a number of rows"),
    "envs": SIZE, "policy_steps": SIZE, "fine_tune": validate_bool, "finetune_steps": SIZE,
    "kelly": validate_bool, "kelly_k": float_rule(0.0, open_=True), "kelly_max": float_rule(0.0, open_=True),
    "fee_max": float_rule(0.0, MAX_COST_TICKS), "threshold": float_rule(0.0, 0.5, hi_open=True),
    "reward_scale": float_rule(0.0, open_=True), "encoder_epochs": SIZE, "encoder_steps": SIZE,
    "device": enum_rule(Device), "seed": int_rule(0), "tick_value": optional(float_rule(0.0, open_=True)),
    "plots": validate_bool, "c51": _c51, "fills": validate_fills, "queue": validate_queue,
    "latency_ns": int_rule(0, "a whole number of ns"), "timeout": int_rule(1, "a number of rows"),
    "on_timeout": _on_timeout, "fee_maker": float_rule(0.0, MAX_FEE_USD), "fee_taker": float_rule(0.0, MAX_FEE_USD),
}  # fmt: skip


@dataclass
class BacktestConfig:
    """Backtest parameters.

    folds : walk-forward folds (None: as many as the sessions allow, at most 5, at least 2).
    embargo : whole sessions dropped from training right before each test block.
    costs : fee levels evaluated, ticks per contract per side (each in [0, 10]).
    stride : rows between decisions. envs : parallel training environments.
    policy_steps : environment steps of C51 training per fold (each with one learning step).
    fine_tune, finetune_steps : the fine-tune path and its steps. kelly, kelly_k, kelly_max :
    sizing (see :mod:`alphamodel.backtest.metrics`). fee_max : training fees drawn from [0, fee_max].
    threshold : probability margin of the logistic / direction-head rules. reward_scale :
    rewards are divided by it before the C51 support. encoder_epochs, encoder_steps : the
    per-fold encoder when no model is given. tick_value : USD per tick (None: from the root).
    fills : execution models evaluated (``taker``, ``mid``, ``passive``; the policy is trained in
    each). queue, latency_ns, timeout, on_timeout : the ``passive`` model
    (:mod:`alphamodel.backtest.execution`). fee_maker, fee_taker : exchange fees, USD per
    contract per side, paid by passive / taken fills on top of the cost level.

    Each key is checked by :data:`BACKTEST_RULES` (:meth:`checked`, :meth:`from_dict`, and
    :func:`alphamodel.backtest.run.backtest` before anything is read).
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
    fills: tuple[str, ...] = ("taker",)
    queue: str = "riskaverse"
    latency_ns: int = 0
    timeout: int = 100
    on_timeout: str = "cancel"
    fee_maker: float = 0.0
    fee_taker: float = 0.0

    def checked(self) -> BacktestConfig:
        """A copy with every key checked and normalised (:data:`BACKTEST_RULES`).

        Raises
        ------
        alphamodel.errors.UsageError
            Naming the key (``stride``, ``costs``, ``c51.n_atoms``), the value and what is allowed.
        """
        return dataclasses.replace(self, **check_fields(self, BACKTEST_RULES, ""))

    @classmethod
    def from_dict(cls, d: dict) -> BacktestConfig:
        """Build from a dict (``c51`` a dict of C51Config keys), each key checked; UsageError
        naming the key for an unknown key or a bad value."""
        return build(cls, d, "backtest").checked()
