"""The backtest's config: :class:`BacktestConfig`, the rule of each of its keys, and the
constants its results are named by."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import partial
from typing import Any

from alphafeat import errors as af
from alphafeat.options import opt, optional
from alphafeat.validation import Device, split_list, validate_bool, validate_costs
from alphamodel.errors import UsageError
from alphamodel.rl.config import C51Config
from alphamodel.rules import SIZE, build, check_fields, float_rule, int_rule

__all__ = ["DEFAULT_COSTS", "FILL_MODES", "MAX_COST_TICKS", "MAX_FEE_USD", "NOT_TRIALS", "ON_TIMEOUT",
           "ORACLE_BAND", "ORACLE_BAND_EXIT", "ORACLE_MARGINS", "ORACLE_NAMES", "ORACLE_STRATEGIES", "QUEUE_KINDS",
           "RESULT_COLUMNS", "TICK_VALUE",
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
#: The ``oracle-band`` strategy (:func:`alphamodel.backtest.strategies.band_directions`): the same
#: drift_K with hysteresis, so that it does not churn. Per session, from flat: long where drift_K
#: exceeds the entry band, short below minus it; a long is kept until drift_K falls below
#: ``-ORACLE_BAND_EXIT`` (then flat, or short if below minus the entry band), a short likewise.
#: The entry band is the round trip of the decision's row at its cost level
#: (:func:`alphamodel.backtest.strategies.round_trip`: two fees, plus the spread in ``taker`` mode);
#: the exit band is 0 ticks: the exit's cost is paid sooner or later (at the latest at the
#: session's close), so a position is worth keeping while its expected change is not negative.
ORACLE_BAND = "oracle-band"
#: Exit band of ``oracle-band``, ticks (see :data:`ORACLE_BAND`).
ORACLE_BAND_EXIT = 0.0
#: Every oracle strategy (upper references on generated data, never trials).
ORACLE_STRATEGIES = (*ORACLE_NAMES, ORACLE_BAND)
NOT_TRIALS = ("hindsight", *ORACLE_STRATEGIES)
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


def _on_timeout(value: Any, option: str) -> str:
    """What an unfilled passive order does at its timeout: one of :data:`ON_TIMEOUT`."""
    if value not in ON_TIMEOUT:
        raise UsageError(option, f"expected one of {', '.join(ON_TIMEOUT)}", value)
    return value


def _c51(value: Any, option: str) -> C51Config:
    """The ``c51`` key of a backtest config: a C51Config, or an object of its keys."""
    return value.checked() if isinstance(value, C51Config) else C51Config.from_dict(value)


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
    per-fold encoder when no model is given; encoder_jobs : processes training them at once;
    mode_threads : threads running a fold's fill modes at once.
    tick_value : USD per tick (None: from the root).
    fills : execution models evaluated (``taker``, ``mid``, ``passive``; the policy is trained in
    each). queue, latency_ns, timeout, on_timeout : the ``passive`` model
    (:mod:`alphamodel.backtest.execution`). fee_maker, fee_taker : exchange fees, USD per
    contract per side, paid by passive / taken fills on top of the cost level.

    Each key is checked by its field's check (:meth:`checked`, :meth:`from_dict`, and
    :func:`alphamodel.backtest.run.backtest` before anything is read).
    """

    folds: int | None = opt(None, check=optional(int_rule(2, "a number of walk-forward folds")),
                            default_text="as many as the sessions allow, 2 to 5", help="walk-forward folds")
    embargo: int = opt(0, check=int_rule(0, "a number of sessions"),
                       help="whole sessions dropped from training right before each test block")
    costs: tuple[float, ...] = opt(DEFAULT_COSTS, check=partial(validate_costs, hi=MAX_COST_TICKS),
                                   help=f"fee levels evaluated, ticks per contract per side, each in [0, "
                                        f"{MAX_COST_TICKS:g}], comma-separated")
    stride: int = opt(200, check=int_rule(1, "a number of rows"), help="rows between decisions")
    envs: int = opt(64, check=SIZE, help="parallel training environments")
    policy_steps: int = opt(400, check=SIZE,
                            help="C51 training steps per fold (environment steps, each with one learning step)")
    fine_tune: bool = opt(False, check=validate_bool,
                          help="also fine-tune the encoder with the C51 loss (strategy c51-finetune)")
    finetune_steps: int = opt(60, check=SIZE, cli=False, help="steps of the fine-tune path")
    kelly: bool = opt(True, check=validate_bool, negate=True, help="unit position size (no Kelly sizing)")
    kelly_k: float = opt(2.0, check=float_rule(0.0, open_=True), cli=False,
                         help="Kelly sizing: contracts = clip(kelly_k * edge / variance, 0, kelly_max)")
    kelly_max: float = opt(2.0, check=float_rule(0.0, open_=True), cli=False,
                           help="Kelly sizing: the largest position, contracts")
    fee_max: float = opt(0.5, check=float_rule(0.0, MAX_COST_TICKS), cli=False,
                         help="training fees drawn from [0, fee_max] ticks")
    threshold: float = opt(0.05, check=float_rule(0.0, 0.5, hi_open=True), cli=False,
                           help="probability margin of the logistic and direction-head rules")
    reward_scale: float = opt(1.0, check=float_rule(0.0, open_=True), cli=False,
                              help="rewards are divided by it before the C51 support")
    encoder_epochs: int = opt(3, check=SIZE, cli=False, help="epochs of the per-fold encoder when no model is given")
    encoder_steps: int = opt(20, check=SIZE, cli=False, help="steps per epoch of the per-fold encoder")
    encoder_jobs: int = opt(1, check=SIZE, cli=False, help="processes training the per-fold encoders at once")
    mode_threads: int | None = opt(None, check=optional(SIZE), cli=False,
                                   default_text="one per fill mode on a GPU, 1 on a CPU",
                                   help="threads training and evaluating a fold's fill modes at once (same results)")
    device: str = opt("auto", enum=Device, help="auto: cuda when a GPU is usable, else cpu")
    seed: int = opt(0, check=int_rule(0), help="random seed")
    tick_value: float | None = opt(None, check=optional(float_rule(0.0, open_=True)), cli=False,
                                   default_text="from the product root", help="USD per tick")
    plots: bool = opt(True, check=validate_bool, cli=False, help="write the equity PNGs")
    c51: C51Config = opt(check=_c51, cli=False, default_factory=C51Config, default_text="the c51 keys' defaults",
                         help="C51's hyper-parameters, an object of the c51 keys")
    fills: tuple[str, ...] = opt(("taker",), check=validate_fills, flag="--fill",
                                 help="fill modes, comma-separated: taker (buy at the ask, sell at the bid), mid (at "
                                      "the mid: an upper bound), passive (post-only at our best, queue, latency, "
                                      "timeout); the policy is trained in each")
    queue: str = opt("riskaverse", check=validate_queue,
                     help="passive queue model: riskaverse, power:N, log (hftbacktest's), through")
    latency_ns: int = opt(0, check=int_rule(0, "a whole number of ns"),
                          help="passive: ns from a decision or cancel to its effect (0: the next row)")
    timeout: int = opt(100, check=int_rule(1, "a number of rows"), help="passive: rows an order works before "
                       "--on-timeout")
    on_timeout: str = opt("cancel", check=_on_timeout, metavar="{cancel,cross}",
                          help="passive: cancel, or cross (take at that row's touch, taker fee)")
    fee_maker: float = opt(0.0, check=float_rule(0.0, MAX_FEE_USD),
                           help="exchange fee of a passive fill, USD per contract per side, on top of the cost")
    fee_taker: float = opt(0.0, check=float_rule(0.0, MAX_FEE_USD),
                           help="exchange fee of a taken fill, USD per contract per side, on top of the cost")

    def checked(self) -> BacktestConfig:
        """A copy with every key checked and normalised (each by its field's check).

        Raises
        ------
        alphamodel.errors.UsageError
            Naming the key (``stride``, ``costs``, ``c51.n_atoms``), the value and what is allowed.
        """
        return dataclasses.replace(self, **check_fields(self, ""))

    @classmethod
    def from_dict(cls, d: dict) -> BacktestConfig:
        """Build from a dict (``c51`` a dict of C51Config keys), each key checked; UsageError
        naming the key for an unknown key or a bad value."""
        return build(cls, d, "backtest").checked()
