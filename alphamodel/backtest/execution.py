"""Execution models: how a target position becomes fills, for N environments at once (torch).

Every function here is elementwise over N environments (tensors of shape (N,)) gathering rows
of the market's arrays (:class:`Book`, shape (T,)); no Python per environment, so the same
code runs on a CPU or fused by ``torch.compile`` on a GPU; on a GPU a ``passive`` step runs as
one Triton kernel instead (:mod:`alphamodel.ops.triton.passive_triton`, the same arithmetic,
tested equal to this code). Prices are in ticks, sizes and volumes in contracts, fees in ticks
per contract (USD / tick value), times in ns.

Modes (:class:`FillModel`):

``taker``
    A decision at row ``t`` trades ``q - pos`` at once: a buy at ``ask[t]``, a sell at
    ``bid[t]``, plus the taker fee. This is :func:`alphamodel.env.env_step`'s accounting,
    reward for reward (a test holds them equal), except that a resize within the same sign
    (1 -> 2 contracts) pays for the contracts traded, not for closing and reopening the lot.
``mid``
    As ``taker`` at the mid (no spread paid, no adverse selection): an *upper bound*, the
    seed system's convention. ``PnL(mid) - PnL(taker) = sum |dq| * half_spread``.
``passive``
    A decision at row ``t`` whose target differs from the working order's posts a post-only
    limit order for ``target - pos`` at our own best of row ``t`` (join the bid to buy, the ask
    to sell). It takes effect (and the order it replaces is cancelled) at the first row ``a >
    t`` with ``ts[a] >= ts[t] + latency_ns`` (:func:`activation_rows`): no row before ``a``
    can fill it, and the old order still works until then. At ``a``:

    * its size is ``|target - pos[a]|`` on the side of ``target - pos[a]`` (fills of the old
      order in the meantime count); a post-only order that would cross (buy at or above
      ``ask[a]``) is rejected (no fill; counted);
    * queue ahead = the displayed size at its price if that is the best (``bid[a]`` for a
      buy); 0 if it is better than the best (it would be the new best); unknown (infinite) if
      it is worse: it stays so until the level comes back as the best, then it is the displayed
      size there (only top of book is known, so a level away from the touch is not tracked).

    From row ``a + 1`` on, per row ``r`` (a buy at ``P``; a sell mirrors it):

    * trades on row ``r`` at the bid (``vol_bid[r]``, at the best bid of row ``r - 1``) count
      for us where that bid was at or below ``P`` (at ``P``: they advance the queue; below:
      they traded through our price); what trades beyond the queue ahead fills us, in whole
      contracts (partial fills; a fractional Kelly-sized order fills its fraction with its
      last contract) (:func:`alphamodel.backtest.queue.advance_by_trades`);
    * the level's size change then moves the queue by the queue model (:mod:`.queue`); a bid
      below ``P`` means our level is empty (queue ahead 0); a bid above ``P`` says nothing
      about it (queue ahead kept);
    * if ``ask[r] <= P`` (the far side reached our price) the whole remainder fills;
    * every fill is at ``P`` and pays the maker fee;
    * after ``timeout`` such rows an unfilled remainder is cancelled (``on_timeout='cancel'``)
      or taken at that row's touch with the taker fee (``'cross'``).

    An unchanged target keeps the working order and its queue position.

In every mode the position is closed at the segment's last row at its touch with the taker
fee, and equity is marked to the mid every row: a decision's reward (ticks) is the change of
the marked-to-mid equity over its ``stride`` rows, costs included.

Per environment the state (:class:`ExecState`) also counts the fills for the metrics
(:func:`fill_summary`): orders, contracts ordered / filled passively / taken, rows and ns
from decision to fill (weighted by contracts), markouts at +1/+10/+100 rows (``side * qty *
(mid[r + k] - price)``, the row clamped to the segment's end; the closing trade at a
segment's end is not counted).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, fields

import numpy as np
import torch

from alphamodel.backtest.config import FILL_MODES as MODES
from alphamodel.backtest.config import ON_TIMEOUT
from alphamodel.backtest.queue import QTY_EPS, advance_by_trades, depth_update, parse_queue
from alphamodel.errors import UsageError

__all__ = ["MODES", "ON_TIMEOUT", "MARKOUT_ROWS", "FillModel", "Book", "book_from_arrays", "activation_rows",
           "ExecState", "ExecEnv", "ROW_CHUNK", "instant_step", "passive_decide", "passive_row", "passive_rows",
           "passive_step", "fill_summary"]

MARKOUT_ROWS = (1, 10, 100)
_MK = tuple(f"mk{k}" for k in MARKOUT_ROWS)


@dataclass(frozen=True)
class FillModel:
    """How orders fill (see the module docstring).

    mode : ``taker`` | ``mid`` | ``passive``. queue : ``riskaverse`` | ``power:N`` | ``log`` |
    ``through`` (passive only). latency_ns : >= 0, from a decision (or cancel) to its effect.
    timeout : rows an order works before ``on_timeout`` (``cancel`` | ``cross``), >= 1.
    """

    mode: str = "taker"
    queue: str = "riskaverse"
    latency_ns: int = 0
    timeout: int = 100
    on_timeout: str = "cancel"

    def checked(self) -> FillModel:
        """Self, every field checked.

        Raises
        ------
        alphamodel.errors.UsageError
            One line naming the option (``--fill``, ``--queue``, ``--latency-ns``,
            ``--timeout``, ``--on-timeout``) and what is allowed.
        """
        if self.mode not in MODES:
            raise UsageError("--fill", f"unknown fill mode (choose from {', '.join(MODES)})", self.mode)
        parse_queue(self.queue)
        if isinstance(self.latency_ns, bool) or not isinstance(self.latency_ns, (int, np.integer)) \
                or not 0 <= self.latency_ns <= 60_000_000_000:
            raise UsageError("--latency-ns", "expected a whole number of ns in [0, 6e10]", self.latency_ns)
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, np.integer)) or self.timeout < 1:
            raise UsageError("--timeout", "expected a whole number of rows >= 1", self.timeout)
        if self.on_timeout not in ON_TIMEOUT:
            raise UsageError("--on-timeout", f"choose from {', '.join(ON_TIMEOUT)}", self.on_timeout)
        return self

    @property
    def queue_model(self) -> tuple[str, float]:
        """``(kind, N)`` of :func:`alphamodel.backtest.queue.parse_queue`."""
        return parse_queue(self.queue)

    def label(self) -> str:
        """A short name for tables: ``taker``, ``mid (upper bound)``, ``passive riskaverse 0ns t100 cancel``."""
        if self.mode == "mid":
            return "mid (upper bound)"
        if self.mode == "taker":
            return "taker"
        return f"passive {self.queue} {self.latency_ns}ns t{self.timeout} {self.on_timeout}"


@dataclass
class Book:
    """Top of book and traded volume at the touch, flattened over segments (one device).

    bid, ask : (T,) float32 ticks. bid_sz, ask_sz : (T,) float32 displayed contracts at them.
    vol_bid, vol_ask : (T,) float32 contracts traded during row ``t``'s events at the best bid
    (sell aggressor) / ask (buy aggressor) in force before them (row ``t - 1``'s). From a cache:
    ``sell_volume`` / ``buy_volume``, all the aggressor volume since the previous row, which is at
    or through that touch unless a better quote arrived and traded within the row (rows are
    per event, so rarely). ts : (T,)
    int64 ns (``ts_recv``), non-decreasing within a segment. end : (T,) int64 last row of the
    row's segment. mid, half_spread : (T,) float32 ticks (a crossed quote: half spread 0).
    """

    bid: torch.Tensor
    ask: torch.Tensor
    bid_sz: torch.Tensor
    ask_sz: torch.Tensor
    vol_bid: torch.Tensor
    vol_ask: torch.Tensor
    ts: torch.Tensor
    end: torch.Tensor
    mid: torch.Tensor
    half_spread: torch.Tensor

    @property
    def device(self) -> torch.device:
        return self.bid.device


def book_from_arrays(bid, ask, bid_sz, ask_sz, vol_bid, vol_ask, ts, end, device: torch.device | str = "cpu"
                     ) -> Book:
    """A :class:`Book` from flat arrays (numpy or torch; prices in ticks, finite). The mid and
    half spread are computed in float64 and stored float32 (as :func:`alphamodel.env.market_from_arrays`)."""
    f64 = [np.asarray(torch.as_tensor(x).cpu(), np.float64) for x in (bid, ask)]
    dev = torch.device(device)
    f32 = lambda x: torch.as_tensor(np.asarray(torch.as_tensor(x).cpu(), np.float32), device=dev)  # noqa: E731
    i64 = lambda x: torch.as_tensor(np.asarray(torch.as_tensor(x).cpu(), np.int64), device=dev)  # noqa: E731
    return Book(f32(bid), f32(ask), f32(bid_sz), f32(ask_sz), f32(vol_bid), f32(vol_ask), i64(ts), i64(end),
                f32((f64[0] + f64[1]) / 2), f32(np.maximum(f64[1] - f64[0], 0.0) / 2))


def activation_rows(ts: torch.Tensor, end: torch.Tensor, latency_ns: int) -> torch.Tensor:
    """(T,) int64: for an order decided at row ``t``, the first row ``a > t`` of its segment with
    ``ts[a] >= ts[t] + latency_ns``; ``end[t] + 1`` where none (the order never works)."""
    rows = torch.arange(ts.numel(), device=ts.device)
    seg = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long, device=ts.device),
                                  (rows[1:] == end[:-1] + 1).long()]), 0)
    start = torch.zeros_like(seg).scatter_reduce(0, seg, rows, "amin", include_self=False)[seg]
    rel = ts - ts[start]
    span = int(rel.max().item()) + int(latency_ns) + 1 if rel.numel() else 1
    key = seg * span + rel  # sorted: segments in order, ts non-decreasing within each
    a = torch.searchsorted(key, key + int(latency_ns), side="left")
    return torch.minimum(torch.maximum(a, rows + 1), end + 1)


_F32 = ("pos", "fee_m", "fee_t", "acc", "pnl", "turnover", "entries", "closed", "wins",
        "o_side", "o_px", "o_qty", "o_ahead", "o_tgt", "p_tgt", "p_bid", "p_ask",
        "n_orders", "n_rejected", "n_filled", "n_timeouts", "qty_ordered", "qty_maker", "qty_taker", "ttf_rows", *_MK)
_I64 = ("t", "o_t", "o_act", "o_age", "p_t", "p_act")
_BOOL = ("o_hit", "p_on")
_COUNTERS = ("pnl", "turnover", "entries", "closed", "wins", "n_orders", "n_rejected", "n_filled", "n_timeouts",
             "qty_ordered", "qty_maker", "qty_taker", "ttf_rows", "ttf_ns", *_MK)


@dataclass
class ExecState:
    """Per-environment state, each field (N,).

    Core: ``t`` int64 row; ``pos`` contracts; ``fee_m``/``fee_t`` maker/taker fee ticks per
    contract; ``acc`` PnL of the open trade. Counters (since :meth:`clear`): ``pnl`` ticks,
    ``turnover`` contracts, ``entries``, ``closed``, ``wins``. Working order (passive): ``o_side``
    +1/-1, ``o_px`` ticks, ``o_qty`` remaining, ``o_ahead`` queue ahead, ``o_tgt`` its target,
    ``o_t`` decision row, ``o_act`` activation row, ``o_age`` rows worked, ``o_hit`` filled at
    least once. Pending order (decided, not yet in effect): ``p_on``, ``p_tgt``, ``p_bid``,
    ``p_ask`` (our best at the decision), ``p_t``, ``p_act``. Fill statistics: ``n_orders``
    (accepted), ``n_rejected`` (post-only), ``n_filled`` (orders with a fill), ``n_timeouts``,
    ``qty_ordered``, ``qty_maker`` (passive fills), ``qty_taker`` (taken: taker/mid trades and
    timeout crosses; closes at a segment's end not counted), ``ttf_rows`` / ``ttf_ns`` (float64)
    sums of contracts x rows / ns from decision to passive fill, ``mk1``/``mk10``/``mk100``
    markout sums (ticks x contracts).
    """

    t: torch.Tensor
    pos: torch.Tensor
    fee_m: torch.Tensor
    fee_t: torch.Tensor
    acc: torch.Tensor
    pnl: torch.Tensor
    turnover: torch.Tensor
    entries: torch.Tensor
    closed: torch.Tensor
    wins: torch.Tensor
    o_side: torch.Tensor
    o_px: torch.Tensor
    o_qty: torch.Tensor
    o_ahead: torch.Tensor
    o_tgt: torch.Tensor
    o_t: torch.Tensor
    o_act: torch.Tensor
    o_age: torch.Tensor
    o_hit: torch.Tensor
    p_on: torch.Tensor
    p_tgt: torch.Tensor
    p_bid: torch.Tensor
    p_ask: torch.Tensor
    p_t: torch.Tensor
    p_act: torch.Tensor
    n_orders: torch.Tensor
    n_rejected: torch.Tensor
    n_filled: torch.Tensor
    n_timeouts: torch.Tensor
    qty_ordered: torch.Tensor
    qty_maker: torch.Tensor
    qty_taker: torch.Tensor
    ttf_rows: torch.Tensor
    ttf_ns: torch.Tensor
    mk1: torch.Tensor
    mk10: torch.Tensor
    mk100: torch.Tensor

    @classmethod
    def zeros(cls, n: int, device: torch.device | str = "cpu") -> ExecState:
        """N flat environments at row 0, no order, zero fees and counters."""
        dev = torch.device(device)
        d = {k: torch.zeros(n, dtype=torch.float32, device=dev) for k in _F32}
        d.update({k: torch.zeros(n, dtype=torch.long, device=dev) for k in _I64})
        d.update({k: torch.zeros(n, dtype=torch.bool, device=dev) for k in _BOOL})
        d["ttf_ns"] = torch.zeros(n, dtype=torch.float64, device=dev)
        return cls(**d)

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def clear(self) -> None:
        """Zero the counters and fill statistics."""
        for k in _COUNTERS:
            setattr(self, k, torch.zeros_like(getattr(self, k)))

    def reset(self, mask: torch.Tensor, rows: torch.Tensor, fee_maker: torch.Tensor | None = None,
              fee_taker: torch.Tensor | None = None) -> None:
        """Environments where ``mask`` (N,) bool: at ``rows``, flat, no order (fees if given). The
        other order fields are read only while an order works or is pending, so they stay."""
        self.t = torch.where(mask, rows.to(self.t), self.t)
        self.pos = torch.where(mask, 0.0, self.pos)
        self.acc = torch.where(mask, 0.0, self.acc)
        self.o_qty = torch.where(mask, 0.0, self.o_qty)
        self.p_on = self.p_on & ~mask
        self.o_hit = self.o_hit & ~mask
        if fee_maker is not None:
            self.fee_m = torch.where(mask, fee_maker.to(self.fee_m), self.fee_m)
        if fee_taker is not None:
            self.fee_t = torch.where(mask, fee_taker.to(self.fee_t), self.fee_t)


# ---- taker / mid: trade at the decision row ------------------------------------------------
def instant_step(b: Book, s: dict, q: torch.Tensor, stride: int, at_mid: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                                        dict]:
    """One decision of N environments in ``taker`` (``at_mid=False``) or ``mid`` mode; pure.

    ``s``: :meth:`ExecState.as_dict`; ``q`` (N,) float target. Returns ``(reward (N,) ticks,
    done (N,) bool, new state dict)``. Arithmetic as :func:`alphamodel.env.env_step` (reward
    for reward where no position is resized within its sign), the taker fee ``fee_t``.
    """
    s = dict(s)
    t, p, fee, acc0 = s["t"], s["pos"], s["fee_t"], s["acc"]
    mid, hs = b.mid, b.half_spread
    end = b.end[t]
    t2 = torch.minimum(t + stride, end)
    hs_t = torch.zeros_like(p) if at_mid else hs[t]
    cost0 = hs_t + fee
    change = q != p
    resize = change & (torch.sign(q) == torch.sign(p)) & (p != 0)
    c_exit = torch.where(change, torch.where(resize, (p.abs() - q.abs()).clamp_min(0.0), p.abs()) * cost0, 0.0)
    c_entry = torch.where(change, torch.where(resize, (q.abs() - p.abs()).clamp_min(0.0), q.abs()) * cost0, 0.0)
    closed = change & (p != 0) & ~resize
    move = q * (mid[t2] - mid[t])
    acc = torch.where(change & ~resize, -c_entry, acc0 - c_exit - c_entry) + move
    done = t2 == end
    c_close = torch.where(done, q.abs() * ((torch.zeros_like(p) if at_mid else hs[t2]) + fee), 0.0)
    shut = done & (q != 0)
    s["wins"] = s["wins"] + (closed & (acc0 - c_exit > 0)).float() + (shut & (acc - c_close > 0)).float()
    s["closed"] = s["closed"] + closed.float() + shut.float()
    s["entries"] = s["entries"] + (change & (q != 0) & ~resize).float()
    reward = move - c_exit - c_entry - c_close
    dq = q - p
    s["turnover"] = s["turnover"] + dq.abs() + torch.where(done, q.abs(), 0.0)
    # fill statistics: every change is one order, filled at once at mid +- half spread
    s["n_orders"] = s["n_orders"] + change.float()
    s["n_filled"] = s["n_filled"] + change.float()
    s["qty_ordered"] = s["qty_ordered"] + dq.abs()
    s["qty_taker"] = s["qty_taker"] + dq.abs()
    for k, key in zip(MARKOUT_ROWS, _MK):
        s[key] = s[key] + dq * (mid[torch.minimum(t + k, end)] - mid[t]) - dq.abs() * hs_t
    zero = torch.zeros_like(q)
    s["t"], s["pos"], s["acc"] = t2, torch.where(done, zero, q), torch.where(done, zero, acc)
    s["pnl"] = s["pnl"] + reward
    return reward, done, s


# ---- passive ------------------------------------------------------------------------------
def _view(side: torch.Tensor, bid, ask, bsz, asz):
    """(near, far, near size) in the order's own orientation: a buy sees (bid, ask, bid size),
    a sell (-ask, -bid, ask size), so that a buy at ``P`` and a sell at ``-P`` read the same."""
    buy = side > 0
    return torch.where(buy, bid, -ask), torch.where(buy, ask, -bid), torch.where(buy, bsz, asz)


def passive_decide(b: Book, act: torch.Tensor, s: dict, q: torch.Tensor) -> dict:
    """Register decisions ``q`` (N,) at rows ``s['t']``: where the target differs from the
    pending order's (else the working order's, else the position), a new order (or a cancel,
    for ``q == pos``) is pending until row ``act[t]`` (:func:`activation_rows`)."""
    s = dict(s)
    t = s["t"]
    same = torch.where(s["p_on"], q == s["p_tgt"], torch.where(s["o_qty"] > 0, q == s["o_tgt"], q == s["pos"]))
    new = ~same
    s["p_on"] = s["p_on"] | new
    s["p_tgt"] = torch.where(new, q, s["p_tgt"])
    s["p_bid"] = torch.where(new, b.bid[t], s["p_bid"])
    s["p_ask"] = torch.where(new, b.ask[t], s["p_ask"])
    s["p_t"] = torch.where(new, t, s["p_t"])
    s["p_act"] = torch.where(new, act[t], s["p_act"])
    return s


def _activate(b: Book, s: dict, r: torch.Tensor, live: torch.Tensor, kind: str) -> dict:
    """Pending orders whose activation row is ``r`` replace the working order."""
    go = live & s["p_on"] & (r >= s["p_act"])
    want = s["p_tgt"] - s["pos"]
    side, qty = torch.sign(want), want.abs()
    qty = torch.where(qty < QTY_EPS, 0.0, qty)  # float residue of partial fills is no order
    px = torch.where(side > 0, s["p_bid"], s["p_ask"])
    near, far, nsz = _view(side, b.bid[r], b.ask[r], b.bid_sz[r], b.ask_sz[r])
    P = side * px
    reject = go & (qty > 0) & (far <= P)
    ok = go & (qty > 0) & ~reject
    inf = torch.full_like(qty, float("inf"))
    at_level = inf if kind == "through" else nsz
    ahead = torch.where(near < P, torch.zeros_like(qty), torch.where(near == P, at_level, inf))
    s["o_side"] = torch.where(go, side, s["o_side"])
    s["o_px"] = torch.where(go, px, s["o_px"])
    s["o_qty"] = torch.where(go, torch.where(ok, qty, 0.0), s["o_qty"])
    s["o_ahead"] = torch.where(go, ahead, s["o_ahead"])
    s["o_tgt"] = torch.where(go, s["p_tgt"], s["o_tgt"])
    s["o_t"] = torch.where(go, s["p_t"], s["o_t"])
    s["o_act"] = torch.where(go, r, s["o_act"])
    s["o_age"] = torch.where(go, torch.zeros_like(s["o_age"]), s["o_age"])
    s["o_hit"] = s["o_hit"] & ~go
    s["p_on"] = s["p_on"] & ~go
    s["n_orders"] = s["n_orders"] + ok.float()
    s["n_rejected"] = s["n_rejected"] + reject.float()
    s["qty_ordered"] = s["qty_ordered"] + torch.where(ok, qty, 0.0)
    return s


def _markouts(b: Book, s: dict, r: torch.Tensor, end: torch.Tensor, signed_qty: torch.Tensor, px: torch.Tensor
              ) -> None:
    for k, key in zip(MARKOUT_ROWS, _MK):
        s[key] = s[key] + signed_qty * (b.mid[torch.minimum(r + k, end)] - px)


def passive_row(b: Book, s: dict, r: torch.Tensor, live: torch.Tensor, kind: str, n: float, timeout: int,
                cross: bool) -> tuple[dict, torch.Tensor]:
    """Advance N environments through row ``r`` (N,) int64 (each past its decision row; rows
    where ``live`` (N,) bool is False change nothing). ``kind``/``n``: the queue model
    (:func:`alphamodel.backtest.queue.parse_queue`); ``cross``: ``on_timeout == 'cross'``.
    Returns ``(new state dict, equity change (N,) ticks)``."""
    s = dict(s)
    rp = (r - 1).clamp_min(0)
    mid, end = b.mid[r], b.end[r]
    pos0 = s["pos"]
    d = torch.where(live, pos0 * (mid - b.mid[rp]), 0.0)
    s = _activate(b, s, r, live, kind)
    # the working order, from the row after its activation
    side, px, qty = s["o_side"], s["o_px"], s["o_qty"]
    has = live & (qty > 0) & (r > s["o_act"])
    near, far, nsz = _view(side, b.bid[r], b.ask[r], b.bid_sz[r], b.ask_sz[r])
    nearp, _, nszp = _view(side, b.bid[rp], b.ask[rp], b.bid_sz[rp], b.ask_sz[rp])
    P = side * px
    v = torch.where(nearp <= P, torch.where(side > 0, b.vol_bid[r], b.vol_ask[r]), 0.0)
    a1, excess = advance_by_trades(s["o_ahead"], v)
    if kind == "through":
        a2 = torch.where(near < P, 0.0, a1)
    else:
        seen = torch.where((nearp == P), depth_update(a1, nszp, nsz, v, kind, n), torch.minimum(a1, nsz))
        a2 = torch.where(near < P, 0.0, torch.where(near == P, seen, a1))
    fill = torch.where(has, torch.where((far <= P) | (qty - excess < QTY_EPS), qty, torch.minimum(excess, qty)), 0.0)
    s["o_ahead"] = torch.where(has, a2, s["o_ahead"])
    d = d + side * fill * (mid - px) - s["fee_m"] * fill
    qty = qty - fill
    # an order filled to the end leaves the position at its target exactly (no float residue)
    pos = torch.where(has & (fill > 0) & (qty == 0), s["o_tgt"], pos0 + side * fill)
    hit = fill > 0
    s["n_filled"] = s["n_filled"] + (hit & ~s["o_hit"]).float()
    s["o_hit"] = s["o_hit"] | hit
    s["qty_maker"] = s["qty_maker"] + fill
    s["ttf_rows"] = s["ttf_rows"] + fill * (r - s["o_t"]).float()
    s["ttf_ns"] = s["ttf_ns"] + fill.double() * (b.ts[r] - b.ts[s["o_t"]]).double()
    _markouts(b, s, r, end, side * fill, px)
    # timeout: cancel, or take the remainder at this row's touch
    s["o_age"] = torch.where(has, s["o_age"] + 1, s["o_age"])
    tmo = has & (qty > 0) & (s["o_age"] >= timeout)
    taken = torch.where(tmo, qty, 0.0) if cross else torch.zeros_like(qty)
    if cross:
        touch = torch.where(side > 0, b.ask[r], b.bid[r])
        d = d + side * taken * (mid - touch) - s["fee_t"] * taken
        pos = torch.where(tmo, s["o_tgt"], pos)
        s["qty_taker"] = s["qty_taker"] + taken
        _markouts(b, s, r, end, side * taken, touch)
    qty = torch.where(tmo, 0.0, qty)
    s["n_timeouts"] = s["n_timeouts"] + tmo.float()
    # the segment's last row: everything closes at the touch with the taker fee
    at_end = live & (r == end)
    shut = torch.where(at_end, pos.abs(), 0.0)
    d = d - shut * (b.half_spread[r] + s["fee_t"])
    pos = torch.where(at_end, 0.0, pos)
    s["o_qty"] = torch.where(at_end, 0.0, qty)
    s["p_on"] = s["p_on"] & ~at_end
    s["turnover"] = s["turnover"] + fill + taken + shut
    # trades: one ends where the position's sign changes away from non-zero
    changed = torch.sign(pos) != torch.sign(pos0)
    ended = changed & (pos0 != 0)
    acc = s["acc"] + d
    s["wins"] = s["wins"] + (ended & (acc > 1e-4)).float()  # a float-rounding zero is no win
    s["closed"] = s["closed"] + ended.float()
    s["entries"] = s["entries"] + (changed & (pos != 0)).float()
    s["acc"] = torch.where(ended, 0.0, acc)
    s["pos"] = pos
    return s, d


#: Rows of a stride one call of :func:`passive_rows` walks (one compiled graph for all of them).
ROW_CHUNK = 8


def passive_rows(b: Book, s: dict, t: torch.Tensor, t2: torch.Tensor, k0: torch.Tensor, stride: int, rows: int,
                 kind: str, n: float, timeout: int, cross: bool) -> tuple[dict, torch.Tensor]:
    """:func:`passive_row` over rows ``t + k0 .. t + k0 + rows - 1`` (``k0`` a 0-d int64 tensor, so
    that a compiled version serves every chunk), those past ``t2`` or past ``stride`` not live.
    Returns ``(new state dict, equity change (N,) ticks)``."""
    reward = torch.zeros_like(s["pos"])
    for i in range(rows):
        k = k0 + i
        s, d = passive_row(b, s, torch.minimum(t + k, t2), (k <= stride) & (t + k <= t2), kind, n, timeout, cross)
        reward = reward + d
    return s, reward


def passive_step(b: Book, act: torch.Tensor, s: dict, q: torch.Tensor, stride: int, kind: str, n: float,
                 timeout: int, cross: bool, rows_fn=None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One decision of N environments in ``passive`` mode: :func:`passive_decide` at rows
    ``s['t']``, then :func:`passive_row` over the next ``stride`` rows, up to the segment's last
    row, :data:`ROW_CHUNK` rows a call of :func:`passive_rows` (or ``rows_fn``, e.g. its compiled
    version). Returns ``(reward (N,) ticks, done (N,) bool, new state dict)``; done environments
    are flat at their segment's last row."""
    rows_fn = rows_fn or passive_rows
    s = passive_decide(b, act, s, q)
    t = s["t"]
    end = b.end[t]
    t2 = torch.minimum(t + stride, end)
    reward = torch.zeros_like(q)
    for k0 in range(1, stride + 1, ROW_CHUNK):
        s, d = rows_fn(b, s, t, t2, torch.tensor(k0, device=t.device), stride, ROW_CHUNK, kind, n, timeout, cross)
        reward = reward + d
    s["t"] = t2
    s["pnl"] = s["pnl"] + reward
    return reward, t2 == end, s


class ExecEnv:
    """N environments on a :class:`Book` under a :class:`FillModel` (see the module docstring),
    with :class:`alphamodel.backtest.env.VecEnv`'s interface (``t``, ``pos``, ``fee``, ``pnl``,
    ``turnover``, ``entries``, ``closed``, ``wins``, ``reset``, ``step``, ``clear``).

    ``fee`` (N,) is the cost level, ticks per contract per side, paid by every fill; passive
    fills pay ``fee_maker`` and taken ones (taker, mid, timeout crosses, closes) ``fee_taker``
    ticks on top. ``step(target)`` trades towards ``target`` (N,) contracts at the current rows and
    holds for ``stride`` rows; it returns ``(reward (N,) ticks, done (N,) bool)``. ``state`` is an
    :class:`ExecState`. ``compile=True`` runs the step (passive: :func:`passive_rows`, a chunk of
    rows) through ``torch.compile``.

    ``kernel``: run a ``passive`` step as one Triton kernel
    (:func:`alphamodel.ops.triton.passive_triton.step`: a lane per environment looping over the
    stride's rows, the same arithmetic as :func:`passive_step`) instead of the torch path. None
    (default): on a CUDA book when triton is installed; True: always (on a CPU only under
    ``TRITON_INTERPRET=1``); False: never. ``compile`` then leaves the passive step alone.
    """

    def __init__(self, book: Book, n: int, stride: int, fill: FillModel | None = None, compile: bool = False,
                 fee_maker: float = 0.0, fee_taker: float = 0.0, kernel: bool | None = None) -> None:
        self.m = self.b = book
        self.n, self.stride = int(n), int(stride)
        self.fill = (fill or FillModel()).checked()
        self.kind, self.qn = self.fill.queue_model
        self.extra_m, self.extra_t = float(fee_maker), float(fee_taker)
        self.act = activation_rows(book.ts, book.end, self.fill.latency_ns) if self.fill.mode == "passive" else None
        self._kernel = self.fill.mode == "passive" and _use_kernel(book.device, kernel)
        if self._kernel:
            from alphamodel.ops.triton import passive_triton

            passive_triton.check_device(book.bid)
        fn = instant_step if self.fill.mode != "passive" else passive_rows
        self._fn = torch.compile(fn, dynamic=False) if compile and not self._kernel else fn
        self.state = ExecState.zeros(self.n, book.device)
        self.fee = torch.zeros(self.n, device=book.device)
        self.reset(torch.ones(self.n, dtype=torch.bool, device=book.device),
                   torch.zeros(self.n, dtype=torch.long, device=book.device), self.fee)

    def __getattr__(self, name: str):
        if name in ("t", "pos", "pnl", "turnover", "entries", "closed", "wins"):
            return getattr(self.state, name)
        raise AttributeError(name)

    def clear(self) -> None:
        """Zero the counters and fill statistics."""
        self.state.clear()

    def reset(self, mask: torch.Tensor, rows: torch.Tensor, fee: torch.Tensor | None = None) -> None:
        """Environments where ``mask`` (N,) bool: at ``rows`` (N,), flat, no order, cost level
        ``fee`` (N,) ticks if given."""
        if fee is not None:
            self.fee = torch.where(mask, fee.to(self.fee), self.fee)
        self.state.reset(mask, rows, self.fee + self.extra_m, self.fee + self.extra_t)

    def step(self, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.state.as_dict()
        q = target.to(self.state.pos.dtype)
        if self._kernel:
            from alphamodel.ops.triton import passive_triton

            reward, done, new = passive_triton.step(self.b, self.act, s, q, self.stride, self.kind, self.qn,
                                                    self.fill.timeout, self.fill.on_timeout == "cross", QTY_EPS,
                                                    MARKOUT_ROWS, ROW_CHUNK)
            self.state = ExecState(**new)
            return reward, done
        if self.fill.mode == "passive":
            reward, done, s = passive_step(self.b, self.act, s, q, self.stride, self.kind, self.qn, self.fill.timeout,
                                           self.fill.on_timeout == "cross", rows_fn=self._fn)
        else:
            reward, done, s = self._fn(self.b, s, q, self.stride, self.fill.mode == "mid")
        self.state = ExecState(**s)
        return reward, done


def _use_kernel(device: torch.device, kernel: bool | None) -> bool:
    """Whether :class:`ExecEnv` runs the passive step as the Triton kernel (see its ``kernel``)."""
    if kernel is not None:
        return bool(kernel)
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


def fill_summary(s: ExecState, mode: str, sl: slice | torch.Tensor | None = None) -> dict[str, float]:
    """Fill statistics of ``mode`` over the environments ``sl`` (all by default): ``orders``,
    ``fill_rate`` (contracts filled passively / ordered; ``taker`` and ``mid``: 1),
    ``filled_orders`` (share of orders with a fill), ``rejected``, ``timeouts``, ``ttf_rows`` /
    ``ttf_s`` (mean rows / seconds from decision to a passive fill, per contract; 0 in
    ``taker``/``mid``), ``contracts_taken``, ``markout_{1,10,100}`` (ticks per contract filled,
    passive and taken). NaN where undefined (no order, no fill)."""
    sl = slice(None) if sl is None else sl
    g = lambda k: float(getattr(s, k)[sl].double().sum())  # noqa: E731
    nan = float("nan")
    ordered, maker, taker, orders = g("qty_ordered"), g("qty_maker"), g("qty_taker"), g("n_orders")
    instant = mode != "passive"
    out = {"orders": orders, "contracts_ordered": ordered, "contracts_maker": maker, "contracts_taken": taker,
           "fill_rate": (1.0 if instant else maker / ordered) if ordered else nan,
           "filled_orders": g("n_filled") / orders if orders else nan,
           "rejected": g("n_rejected"), "timeouts": g("n_timeouts"),
           "ttf_rows": 0.0 if instant and orders else (g("ttf_rows") / maker if maker else nan),
           "ttf_s": 0.0 if instant and orders else (g("ttf_ns") / maker / 1e9 if maker else nan)}
    filled = maker + taker
    for k, key in zip(MARKOUT_ROWS, _MK):
        out[f"markout_{k}"] = g(key) / filled if filled else nan
    return out
