"""The ``passive`` execution model's decision step as one Triton kernel: one lane per environment.

:func:`alphamodel.backtest.execution.passive_step` walks the ``stride`` rows of a decision with
~100 elementwise torch operations a row (N environments at once); this kernel does the same
arithmetic with each environment's state in registers, looping over the rows inside one launch.
It is that function, operation for operation, in float32 (``ttf_ns`` float64), the rows' equity
changes summed in chunks of ``ROW_CHUNK`` rows as the torch path sums them; see
:mod:`alphamodel.backtest.execution` for the rules (activation by ``ts_recv`` plus latency,
post-only rejection, queue ahead at activation, trades and the level's size change by the queue
model, partial fills, the far side, timeouts that cancel or cross, the close at a segment's
end, maker and taker fees, the fill statistics and markouts). Differences from the torch path:

* ``power:N``: ``x**N`` is repeated multiplication for a whole ``N`` in 1..8, else
  ``exp2(N log2 x)``; ``log``'s ``log1p(x)`` is ``log(u) x / (u - 1)``, ``u = 1 + x``
  (Goldberg's, a few ulp): both within float32 rounding of torch's ``pow`` / ``log1p``;
* on a GPU the compiler may contract a multiply and an add (FMA): rounding, not rules.

Inputs: the book's rows (T,) (``bid``, ``ask``, ``bid_sz``, ``ask_sz``, ``vol_bid``,
``vol_ask``, ``mid``, ``half_spread`` float32 ticks / contracts; ``ts``, ``end`` int64), the
activation row of a decision at each row ``act`` (T,) int64, the state (a dict of (N,) tensors
named as :class:`alphamodel.backtest.execution.ExecState`'s fields: float32, int64 ``t o_t o_act
o_age p_t p_act``, bool ``o_hit p_on``, float64 ``ttf_ns``) and the targets ``q`` (N,) float32.
The new state is written to fresh tensors (views of three packed buffers): nothing the caller
holds is modified.

Runs on CUDA tensors, or on CPU tensors through Triton's interpreter when ``TRITON_INTERPRET=1``
is set before triton is first imported (the tests do that on a machine without a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from alphamodel.errors import UsageError
from alphamodel.ops.triton.checks import on_device

__all__ = ["F32", "I64", "BOOL", "KINDS", "check_device", "interpreted", "passive_kernel", "step"]

#: State fields by dtype, in the order of the kernel's arguments and of the packed outputs.
F32 = ("pos", "fee_m", "fee_t", "acc", "pnl", "turnover", "entries", "closed", "wins", "o_side", "o_px", "o_qty",
       "o_ahead", "o_tgt", "p_tgt", "p_bid", "p_ask", "n_orders", "n_rejected", "n_filled", "n_timeouts",
       "qty_ordered", "qty_maker", "qty_taker", "ttf_rows", "mk1", "mk10", "mk100")
I64 = ("t", "o_t", "o_act", "o_age", "p_t", "p_act")
BOOL = ("o_hit", "p_on")
#: Queue models by their kernel code (:func:`alphamodel.backtest.queue.parse_queue`'s kinds).
KINDS = {"riskaverse": 0, "power": 1, "log": 2, "through": 3}
_INF = tl.constexpr(float("inf"))


def interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` at its import)."""
    return bool(getattr(passive_kernel, "interpret", False)) or type(passive_kernel).__name__ == "InterpretedFunction"


def check_device(t: torch.Tensor, option: str = "--fill") -> None:
    """UsageError (naming ``option``) unless ``t`` is on a CUDA device, or the interpreter runs."""
    if not (t.is_cuda or interpreted()):
        raise UsageError(option, "the passive Triton kernel needs a CUDA device (or TRITON_INTERPRET=1 for its "
                         "interpreter); the torch path runs on a CPU", str(t.device))


@triton.jit
def _sign(x):
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))


@triton.jit
def _f(x, qn, KIND: tl.constexpr, IPOW: tl.constexpr):
    """The queue function: ``x**qn`` (power) or ``log1p(x)`` (log)."""
    if KIND == 2:
        u = 1.0 + x
        out = tl.where(u == 1.0, x, tl.log(u) * (x / (u - 1.0)))
    elif IPOW > 0:
        out = x
        for _ in tl.static_range(IPOW - 1):
            out = out * x
    else:
        out = tl.exp2(qn * tl.log2(x))
    return out


@triton.jit
def _depth(a1, prev, new, v, qn, KIND: tl.constexpr, IPOW: tl.constexpr):
    """:func:`alphamodel.backtest.queue.depth_update` (not ``through``)."""
    capped = tl.minimum(a1, new)
    if KIND == 0:
        out = capped
    else:
        chg = prev - new - v
        front, back = a1, prev - a1
        fb = _f(back, qn, KIND, IPOW)
        ff = _f(front, qn, KIND, IPOW)
        prob = fb / (fb + ff)
        prob = tl.where((prob == prob) & (tl.abs(prob) < _INF), prob, 1.0)
        est = front - (1.0 - prob) * chg + tl.minimum(back - prob * chg, 0.0)
        out = tl.maximum(tl.where(chg < 0, capped, tl.minimum(est, new)), 0.0)
    return out


@triton.jit
def _view(side, bid, ask, bsz, asz):
    buy = side > 0
    return tl.where(buy, bid, -ask), tl.where(buy, ask, -bid), tl.where(buy, bsz, asz)


@triton.jit
def passive_kernel(bid_p, ask_p, bsz_p, asz_p, vb_p, va_p, ts_p, end_p, mid_p, hs_p, act_p, q_p,
                   pos_p, fee_m_p, fee_t_p, acc_p, pnl_p, turnover_p, entries_p, closed_p, wins_p,
                   o_side_p, o_px_p, o_qty_p, o_ahead_p, o_tgt_p, p_tgt_p, p_bid_p, p_ask_p,
                   n_orders_p, n_rejected_p, n_filled_p, n_timeouts_p, qty_ordered_p, qty_maker_p, qty_taker_p,
                   ttf_rows_p, mk1_p, mk10_p, mk100_p,
                   t_p, o_t_p, o_act_p, o_age_p, p_t_p, p_act_p, o_hit_p, p_on_p, ttf_ns_p,
                   out_f, out_i, out_b, out_d, n, stride, timeout, qn, qty_eps,
                   KIND: tl.constexpr, IPOW: tl.constexpr, CROSS: tl.constexpr, CHUNK: tl.constexpr,
                   MK1: tl.constexpr, MK2: tl.constexpr, MK3: tl.constexpr, BLOCK: tl.constexpr):
    """One decision of ``BLOCK`` environments a program (see the module docstring). ``out_f``
    (len(F32) + 1, n) float32 (the last row: the reward), ``out_i`` (len(I64), n) int64,
    ``out_b`` (len(BOOL) + 1, n) uint8 (the last row: done), ``out_d`` (1, n) float64."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    q = tl.load(q_p + i, mask=m, other=0.0)
    pos = tl.load(pos_p + i, mask=m, other=0.0)
    fee_m = tl.load(fee_m_p + i, mask=m, other=0.0)
    fee_t = tl.load(fee_t_p + i, mask=m, other=0.0)
    acc = tl.load(acc_p + i, mask=m, other=0.0)
    pnl = tl.load(pnl_p + i, mask=m, other=0.0)
    turnover = tl.load(turnover_p + i, mask=m, other=0.0)
    entries = tl.load(entries_p + i, mask=m, other=0.0)
    closed = tl.load(closed_p + i, mask=m, other=0.0)
    wins = tl.load(wins_p + i, mask=m, other=0.0)
    o_side = tl.load(o_side_p + i, mask=m, other=0.0)
    o_px = tl.load(o_px_p + i, mask=m, other=0.0)
    o_qty = tl.load(o_qty_p + i, mask=m, other=0.0)
    o_ahead = tl.load(o_ahead_p + i, mask=m, other=0.0)
    o_tgt = tl.load(o_tgt_p + i, mask=m, other=0.0)
    p_tgt = tl.load(p_tgt_p + i, mask=m, other=0.0)
    p_bid = tl.load(p_bid_p + i, mask=m, other=0.0)
    p_ask = tl.load(p_ask_p + i, mask=m, other=0.0)
    n_orders = tl.load(n_orders_p + i, mask=m, other=0.0)
    n_rejected = tl.load(n_rejected_p + i, mask=m, other=0.0)
    n_filled = tl.load(n_filled_p + i, mask=m, other=0.0)
    n_timeouts = tl.load(n_timeouts_p + i, mask=m, other=0.0)
    qty_ordered = tl.load(qty_ordered_p + i, mask=m, other=0.0)
    qty_maker = tl.load(qty_maker_p + i, mask=m, other=0.0)
    qty_taker = tl.load(qty_taker_p + i, mask=m, other=0.0)
    ttf_rows = tl.load(ttf_rows_p + i, mask=m, other=0.0)
    mk1 = tl.load(mk1_p + i, mask=m, other=0.0)
    mk10 = tl.load(mk10_p + i, mask=m, other=0.0)
    mk100 = tl.load(mk100_p + i, mask=m, other=0.0)
    t = tl.load(t_p + i, mask=m, other=0)
    o_t = tl.load(o_t_p + i, mask=m, other=0)
    o_act = tl.load(o_act_p + i, mask=m, other=0)
    o_age = tl.load(o_age_p + i, mask=m, other=0)
    p_t = tl.load(p_t_p + i, mask=m, other=0)
    p_act = tl.load(p_act_p + i, mask=m, other=0)
    o_hit = tl.load(o_hit_p + i, mask=m, other=0) != 0
    p_on = tl.load(p_on_p + i, mask=m, other=0) != 0
    ttf_ns = tl.load(ttf_ns_p + i, mask=m, other=0.0)

    # passive_decide: a target unlike the pending (else working, else held) one is a new order
    same = tl.where(p_on, q == p_tgt, tl.where(o_qty > 0, q == o_tgt, q == pos))
    new = m & ~same
    bid_t = tl.load(bid_p + t, mask=m, other=0.0)
    ask_t = tl.load(ask_p + t, mask=m, other=0.0)
    p_on = p_on | new
    p_tgt = tl.where(new, q, p_tgt)
    p_bid = tl.where(new, bid_t, p_bid)
    p_ask = tl.where(new, ask_t, p_ask)
    p_t = tl.where(new, t, p_t)
    p_act = tl.where(new, tl.load(act_p + t, mask=m, other=0), p_act)
    end = tl.load(end_p + t, mask=m, other=0)
    t2 = tl.minimum(t + stride, end)

    # the previous row's touch (row t for the first row of the stride)
    pbid, pask = bid_t, ask_t
    pbsz = tl.load(bsz_p + t, mask=m, other=0.0)
    pasz = tl.load(asz_p + t, mask=m, other=0.0)
    pmid = tl.load(mid_p + t, mask=m, other=0.0)
    reward = tl.zeros([BLOCK], dtype=tl.float32)
    part = tl.zeros([BLOCK], dtype=tl.float32)
    for k in range(1, stride + 1):
        r = t + k
        live = m & (r <= t2)
        bid = tl.load(bid_p + r, mask=live, other=0.0)
        ask = tl.load(ask_p + r, mask=live, other=0.0)
        bsz = tl.load(bsz_p + r, mask=live, other=0.0)
        asz = tl.load(asz_p + r, mask=live, other=0.0)
        mid = tl.load(mid_p + r, mask=live, other=0.0)
        pos0 = pos
        d = tl.where(live, pos0 * (mid - pmid), 0.0)

        # _activate: a pending order whose activation row is r replaces the working order
        go = live & p_on & (r >= p_act)
        want = p_tgt - pos
        side = _sign(want)
        qty = tl.abs(want)
        qty = tl.where(qty < qty_eps, 0.0, qty)
        px = tl.where(side > 0, p_bid, p_ask)
        near, far, nsz = _view(side, bid, ask, bsz, asz)
        P = side * px
        reject = go & (qty > 0) & (far <= P)
        ok = go & (qty > 0) & ~reject
        if KIND == 3:
            at_level = tl.full([BLOCK], _INF, tl.float32)
        else:
            at_level = nsz
        ahead = tl.where(near < P, 0.0, tl.where(near == P, at_level, _INF))
        o_side = tl.where(go, side, o_side)
        o_px = tl.where(go, px, o_px)
        o_qty = tl.where(go, tl.where(ok, qty, 0.0), o_qty)
        o_ahead = tl.where(go, ahead, o_ahead)
        o_tgt = tl.where(go, p_tgt, o_tgt)
        o_t = tl.where(go, p_t, o_t)
        o_act = tl.where(go, r, o_act)
        o_age = tl.where(go, 0, o_age)
        o_hit = o_hit & ~go
        p_on = p_on & ~go
        n_orders = n_orders + ok.to(tl.float32)
        n_rejected = n_rejected + reject.to(tl.float32)
        qty_ordered = qty_ordered + tl.where(ok, qty, 0.0)

        # the working order, from the row after its activation
        side, px, qty = o_side, o_px, o_qty
        has = live & (qty > 0) & (r > o_act)
        near, far, nsz = _view(side, bid, ask, bsz, asz)
        nearp, _farp, nszp = _view(side, pbid, pask, pbsz, pasz)
        P = side * px
        vb = tl.load(vb_p + r, mask=live, other=0.0)
        va = tl.load(va_p + r, mask=live, other=0.0)
        v = tl.where(nearp <= P, tl.where(side > 0, vb, va), 0.0)
        a = o_ahead - v
        a1 = tl.maximum(a, 0.0)
        excess = tl.floor(tl.maximum(-a, 0.0) + qty_eps)
        if KIND == 3:
            a2 = tl.where(near < P, 0.0, a1)
        else:
            seen = tl.where(nearp == P, _depth(a1, nszp, nsz, v, qn, KIND, IPOW), tl.minimum(a1, nsz))
            a2 = tl.where(near < P, 0.0, tl.where(near == P, seen, a1))
        fill = tl.where(has, tl.where((far <= P) | (qty - excess < qty_eps), qty, tl.minimum(excess, qty)), 0.0)
        o_ahead = tl.where(has, a2, o_ahead)
        d = d + side * fill * (mid - px) - fee_m * fill
        qty = qty - fill
        pos = tl.where(has & (fill > 0) & (qty == 0), o_tgt, pos0 + side * fill)
        hit = fill > 0
        n_filled = n_filled + (hit & ~o_hit).to(tl.float32)
        o_hit = o_hit | hit
        qty_maker = qty_maker + fill
        ttf_rows = ttf_rows + fill * (r - o_t).to(tl.float32)
        dts = tl.load(ts_p + r, mask=hit, other=0) - tl.load(ts_p + o_t, mask=hit, other=0)
        ttf_ns = ttf_ns + fill.to(tl.float64) * dts.to(tl.float64)
        sq = side * fill
        mk1 = mk1 + sq * (tl.load(mid_p + tl.minimum(r + MK1, end), mask=hit, other=0.0) - px)
        mk10 = mk10 + sq * (tl.load(mid_p + tl.minimum(r + MK2, end), mask=hit, other=0.0) - px)
        mk100 = mk100 + sq * (tl.load(mid_p + tl.minimum(r + MK3, end), mask=hit, other=0.0) - px)

        # timeout: cancel, or take the remainder at this row's touch
        o_age = tl.where(has, o_age + 1, o_age)
        tmo = has & (qty > 0) & (o_age >= timeout)
        if CROSS:
            taken = tl.where(tmo, qty, 0.0)
            touch = tl.where(side > 0, ask, bid)
            d = d + side * taken * (mid - touch) - fee_t * taken
            pos = tl.where(tmo, o_tgt, pos)
            qty_taker = qty_taker + taken
            sq = side * taken
            mk1 = mk1 + sq * (tl.load(mid_p + tl.minimum(r + MK1, end), mask=tmo, other=0.0) - touch)
            mk10 = mk10 + sq * (tl.load(mid_p + tl.minimum(r + MK2, end), mask=tmo, other=0.0) - touch)
            mk100 = mk100 + sq * (tl.load(mid_p + tl.minimum(r + MK3, end), mask=tmo, other=0.0) - touch)
        else:
            taken = tl.zeros([BLOCK], dtype=tl.float32)
        qty = tl.where(tmo, 0.0, qty)
        n_timeouts = n_timeouts + tmo.to(tl.float32)

        # the segment's last row: everything closes at the touch with the taker fee
        at_end = live & (r == end)
        shut = tl.where(at_end, tl.abs(pos), 0.0)
        d = d - shut * (tl.load(hs_p + r, mask=at_end, other=0.0) + fee_t)
        pos = tl.where(at_end, 0.0, pos)
        o_qty = tl.where(at_end, 0.0, qty)
        p_on = p_on & ~at_end
        turnover = turnover + fill + taken + shut
        changed = _sign(pos) != _sign(pos0)
        ended = changed & (pos0 != 0)
        acc = acc + d
        wins = wins + (ended & (acc > 1e-4)).to(tl.float32)
        closed = closed + ended.to(tl.float32)
        entries = entries + (changed & (pos != 0)).to(tl.float32)
        acc = tl.where(ended, 0.0, acc)
        # the torch path sums a chunk's rows, then the chunks
        part = part + d
        flush = (k % CHUNK == 0) | (k == stride)
        reward = tl.where(flush, reward + part, reward)
        part = tl.where(flush, 0.0, part)
        pbid, pask, pbsz, pasz, pmid = bid, ask, bsz, asz, mid

    pnl = pnl + reward
    f = out_f + i
    tl.store(f, pos, mask=m)
    tl.store(f + n, fee_m, mask=m)
    tl.store(f + 2 * n, fee_t, mask=m)
    tl.store(f + 3 * n, acc, mask=m)
    tl.store(f + 4 * n, pnl, mask=m)
    tl.store(f + 5 * n, turnover, mask=m)
    tl.store(f + 6 * n, entries, mask=m)
    tl.store(f + 7 * n, closed, mask=m)
    tl.store(f + 8 * n, wins, mask=m)
    tl.store(f + 9 * n, o_side, mask=m)
    tl.store(f + 10 * n, o_px, mask=m)
    tl.store(f + 11 * n, o_qty, mask=m)
    tl.store(f + 12 * n, o_ahead, mask=m)
    tl.store(f + 13 * n, o_tgt, mask=m)
    tl.store(f + 14 * n, p_tgt, mask=m)
    tl.store(f + 15 * n, p_bid, mask=m)
    tl.store(f + 16 * n, p_ask, mask=m)
    tl.store(f + 17 * n, n_orders, mask=m)
    tl.store(f + 18 * n, n_rejected, mask=m)
    tl.store(f + 19 * n, n_filled, mask=m)
    tl.store(f + 20 * n, n_timeouts, mask=m)
    tl.store(f + 21 * n, qty_ordered, mask=m)
    tl.store(f + 22 * n, qty_maker, mask=m)
    tl.store(f + 23 * n, qty_taker, mask=m)
    tl.store(f + 24 * n, ttf_rows, mask=m)
    tl.store(f + 25 * n, mk1, mask=m)
    tl.store(f + 26 * n, mk10, mask=m)
    tl.store(f + 27 * n, mk100, mask=m)
    tl.store(f + 28 * n, reward, mask=m)
    g = out_i + i
    tl.store(g, t2, mask=m)
    tl.store(g + n, o_t, mask=m)
    tl.store(g + 2 * n, o_act, mask=m)
    tl.store(g + 3 * n, o_age, mask=m)
    tl.store(g + 4 * n, p_t, mask=m)
    tl.store(g + 5 * n, p_act, mask=m)
    h = out_b + i
    tl.store(h, o_hit.to(tl.uint8), mask=m)
    tl.store(h + n, p_on.to(tl.uint8), mask=m)
    tl.store(h + 2 * n, (t2 == end).to(tl.uint8), mask=m)
    tl.store(out_d + i, ttf_ns, mask=m)


def _ipow(kind: str, qn: float) -> int:
    """``qn`` when the power model's exponent is a whole number in 1..8 (repeated products), else 0."""
    return int(qn) if kind == "power" and qn == int(qn) and 1 <= qn <= 8 else 0


def step(book, act: torch.Tensor, s: dict[str, torch.Tensor], q: torch.Tensor, stride: int, kind: str, qn: float,
         timeout: int, cross: bool, qty_eps: float, markouts: tuple[int, int, int], chunk: int, block: int = 32,
         num_warps: int = 1) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """One decision of N environments in ``passive`` mode (see the module docstring): ``(reward
    (N,) float32 ticks, done (N,) bool, new state dict)`` — the state's fields, ``t`` moved to
    the stride's last row; ``pnl`` includes the reward. ``book``: an object with the rows' tensors
    (``bid``, ``ask``, ``bid_sz``, ``ask_sz``, ``vol_bid``, ``vol_ask``, ``ts``, ``end``,
    ``mid``, ``half_spread``); ``kind``/``qn``: the queue model; ``qty_eps``: contracts below
    which a quantity is rounding; ``markouts``: the three markout horizons, rows; ``chunk``: rows
    per partial sum of the reward; ``block`` environments per program, ``num_warps`` warps."""
    n = q.numel()
    dev = q.device
    out_f = torch.empty(len(F32) + 1, n, dtype=torch.float32, device=dev)
    out_i = torch.empty(len(I64), n, dtype=torch.long, device=dev)
    out_b = torch.empty(len(BOOL) + 1, n, dtype=torch.bool, device=dev)
    out_d = torch.empty(1, n, dtype=torch.float64, device=dev)
    if n:
        b = book
        c = lambda x, dt: x if x.dtype == dt and x.is_contiguous() else x.to(dt).contiguous()  # noqa: E731
        f32 = [c(s[k], torch.float32) for k in F32]
        i64 = [c(s[k], torch.long) for k in I64]
        bools = [c(s[k], torch.bool).view(torch.uint8) for k in BOOL]
        with on_device(q):
            passive_kernel[(triton.cdiv(n, block),)](
                b.bid, b.ask, b.bid_sz, b.ask_sz, b.vol_bid, b.vol_ask, b.ts, b.end, b.mid, b.half_spread, act,
                c(q, torch.float32), *f32, *i64, *bools, c(s["ttf_ns"], torch.float64),
                out_f, out_i, out_b.view(torch.uint8), out_d, n, int(stride), int(timeout), float(qn), float(qty_eps),
                KIND=KINDS[kind], IPOW=_ipow(kind, qn), CROSS=bool(cross), CHUNK=int(chunk), MK1=int(markouts[0]),
                MK2=int(markouts[1]), MK3=int(markouts[2]), BLOCK=block, num_warps=num_warps)
    new = {k: out_f[j] for j, k in enumerate(F32)}
    new.update({k: out_i[j] for j, k in enumerate(I64)})
    new.update({k: out_b[j] for j, k in enumerate(BOOL)})
    new["ttf_ns"] = out_d[0]
    return out_f[len(F32)], out_b[len(BOOL)], new
