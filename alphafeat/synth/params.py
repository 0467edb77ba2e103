"""The synthetic market's parameters: the planted signal (:class:`Signal`), the order flow, the
book's shape, the rare cases and the event times (see :mod:`alphafeat.synth` for the model)."""

from __future__ import annotations

from dataclasses import dataclass

from alphafeat.validation import SignalKind, validate_enum, validate_signal

__all__ = ["DEFAULT_SIGNAL", "OPEN_DELAY_NS", "SIGNAL_KINDS", "TRADABLE_SIGNAL", "Signal"]




#: Kinds of planted predictability (``--signal-kind``).
SIGNAL_KINDS = tuple(k.value for k in SignalKind)


#: Weight of the level-1 queue imbalance ``(Qb - Qa) / (Qb + Qa)`` in the leader's up-move
#: probability ``u = 1/2 + 1/2 clip(s_B I + s_H tanh(F / H0) + bridge)`` at strength 1.
SIGNAL_BOOK = 0.5


#: Weight of the slow signed-flow term at strength 1 (F: signed traded volume decayed by
#: ``exp(-1 / HISTORY_EVENTS)`` per book event, about the last minutes of trading).
SIGNAL_HISTORY = 0.015


#: Events over which the history signal's signed flow decays (e-folding), and its scale H0
#: (contracts).
HISTORY_EVENTS, HISTORY_SCALE = 600.0, 100.0


#: Default strength of the planted signal (``--signal``).
DEFAULT_SIGNAL = 1.0


#: Strength kappa of a non-leading instrument's response to order-flow imbalance (0 = none, < 1).
OFI_STRENGTH = 0.5


#: Weights of level-1 queue imbalance, signed-flow and reference-gap terms in a non-leading
#: instrument's signal (the first two scaled by the signal strength, at most 1).
W_IMB, W_FLOW, W_REF = 0.35, 0.35, 0.6


#: Size targets (contracts) of level 1 and of deeper levels.
T_LEVEL1, T_DEEP = 60.0, 55.0


#: Probability that a book event is a marketable order (outrights; the spread).
P_TRADE, P_TRADE_SPREAD = 0.07, 0.04


#: Share of limit add / cancel / modify events at level 1 (the rest decays geometrically
#: with ratio 0.8 over levels 2-10).
P_LEVEL0 = 0.35


#: Probability that a level-1 event on a best level holding a single order cancels it (quote
#: flicker; non-leading instruments), and that a marketable order clears the whole best level
#: (plus 0.05 |gap|).
P_FLICKER, P_SWEEP = 0.1, 0.05


#: Probability that an event opens a level inside a spread wider than one tick (non-leading
#: instruments; the leader's is :data:`FILL_PER_ACTIVITY` times the profile multiplier, at
#: most :data:`FILL_MAX`).
P_FILL = 0.2


FILL_PER_ACTIVITY, FILL_MAX = 0.12, 0.9


#: Probability that a mid move of the leader leaves a two-tick spread (a half move; the other
#: half comes with the next fill), times the profile's widening factor.
P_WIDEN = 0.25


#: Probability that a mid move of the leader cascades over further levels (1 + Geometric(1/2)
#: more ticks in one event): the jumps of the return tails.
P_JUMP = 0.05


#: Probability that the last order of a best level that goes is filled by a marketable order
#: (else cancelled).
P_MOVE_TRADE = 0.7


#: Share of the leader's marketable orders (those that do not move the mid) that follow the
#: running metaorder, and the tail exponent of metaorder lengths (Lillo & Farmer 2004: trade
#: signs decay as a power law with exponent alpha - 1).
META_SHARE, META_ALPHA = 0.9, 1.5


#: Stochastic activity: the event rate is multiplied by ``exp(x - VOL_SD^2 / 2)``, x an
#: Ornstein-Uhlenbeck process over 1-minute steps with stationary s.d. VOL_SD and time constant
#: VOL_TAU_MIN minutes (volatility clustering).
VOL_SD, VOL_TAU_MIN = 0.35, 45.0


#: Stochastic volatility: the leader's move probability is multiplied by ``exp(y - SV_SD^2 / 2)``
#: (mean 1, so the session's variance and the bridge are unchanged on average), y an OU process
#: over 1-minute steps with s.d. SV_SD and time constant SV_TAU_MIN minutes (fat-tailed,
#: clustered returns at every scale: Clark 1973, Andersen & Bollerslev 1997).
SV_SD, SV_TAU_MIN = 0.8, 30.0


#: Probability that a limit-add event modifies (grows) a resting order instead of adding one,
#: and that a reduce event shrinks an order ('M') instead of cancelling it.
P_MODIFY_UP, P_MODIFY_DOWN = 0.15, 0.45


#: Rare cases: crossed pre-open per outright and session; a locked book per event at a
#: one-tick spread (for one event); F_BAD_TS_RECV per event (besides the opening snapshot,
#: whose records all carry F_SNAPSHOT | F_BAD_TS_RECV as Databento's do); a missing tail level
#: below 10 is refilled with probability P_REPLENISH per event (else the book stays thin).
P_CROSSED_PREOPEN, P_LOCK, P_BAD_TS, P_REPLENISH = 0.25, 2e-4, 1e-4, 0.9


#: Continuous trading starts this long after the session open (the snapshot and the pre-open
#: with its uncrossing trade come first), ns.
OPEN_DELAY_NS = 60_000_000_000


#: Burst structure of event times: mean events per burst, probability of a short gap, mean
#: short and long gap inside a burst (ns).
BURST_MEAN, BURST_P_SHORT, BURST_SHORT_NS, BURST_LONG_NS = 5.0, 0.7, 50_000.0, 4_000_000.0


#: A non-leading outright re-quotes (a level opens inside a wide spread, else its stale best
#: level is pulled) when its fair value is more than this many ticks from its mid.
FOLLOW_TICKS = 1.0


@dataclass(frozen=True)
class Signal:
    """The planted predictability of the leading outright's mid.

    Attributes
    ----------
    strength : float
        Multiplier of the default weights (:data:`SIGNAL_BOOK`, :data:`SIGNAL_HISTORY`), >= 0;
        0: the mid is a martingale (no predictability at any horizon from anything observable).
    kind : str
        ``"book"`` (the level-1 queue imbalance: visible in the current book), ``"history"``
        (signed traded volume over about the last :data:`HISTORY_EVENTS` events: visible only
        in the order flow's history) or ``"both"``.
    """

    strength: float = DEFAULT_SIGNAL
    kind: str = "both"

    def __post_init__(self) -> None:
        """Checks both as the CLI does (:func:`alphafeat.validation.validate_signal`, a
        :class:`~alphafeat.validation.SignalKind`): UsageError naming ``--signal`` or
        ``--signal-kind``."""
        object.__setattr__(self, "strength", validate_signal(self.strength, "--signal"))
        object.__setattr__(self, "kind", validate_enum(self.kind, SignalKind, "--signal-kind").value)

    @property
    def book(self) -> float:
        """Weight of the queue-imbalance term."""
        return self.strength * SIGNAL_BOOK if self.kind in ("book", "both") else 0.0

    @property
    def history(self) -> float:
        """Weight of the slow signed-flow term."""
        return self.strength * SIGNAL_HISTORY if self.kind in ("history", "both") else 0.0


#: The "tradable market" of the tests and benches (``alphafeat synth --signal-kind history
#: --signal 64``): a planted signal strong enough that the oracle trading on the true expected
#: mid change over its holding period with hysteresis (``oracle-band``) also wins after a
#: 1/4-tick fee per side in ``taker``, ``mid`` and ``passive`` mode (stride 200, 50 quiet
#: sessions: docs/performance.md, Backtest). It is only in the order flow's history, not in the
#: current book. The default (:data:`DEFAULT_SIGNAL`, kind ``both``) stays ES-like: there no
#: oracle wins at 1/4 tick.
TRADABLE_SIGNAL = Signal(64.0, "history")
