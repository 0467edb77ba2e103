"""Slow, plain-Python references for alphamodel.backtest.execution (one environment, float64),
and a small queue-reactive market generator for the execution tests.

Written from the rules in the module docstring of alphamodel.backtest.execution, branch by
branch (a buy and a sell spelled out apart), not from its tensor code.
"""

from __future__ import annotations

import math

import numpy as np


def random_market(rng: np.random.Generator, T: int, segs: int = 1, p_move: float = 0.5) -> dict[str, np.ndarray]:
    """A queue-reactive top of book: each row one event (trade at the bid / ask, add, cancel,
    or, with a two-tick spread, a new level inside it); a level that empties moves the price
    one tick away. Prices in ticks, sizes in contracts, ts in ns; ``segs`` segments of ~T/segs."""
    bid, ask, bsz, asz, vb, va, ts = (np.zeros(T) for _ in range(7))
    ends = np.zeros(T, np.int64)
    cuts = np.linspace(0, T, segs + 1).astype(int)
    now = 1_700_000_000_000_000_000
    for a, b_ in zip(cuts[:-1], cuts[1:]):
        B, A = 4000.0, 4001.0
        sb, sa = float(rng.integers(1, 15)), float(rng.integers(1, 15))
        for r in range(a, b_):
            now += int(rng.exponential(2e6)) + 1
            vol_b = vol_a = 0.0
            if A - B > 1 and rng.random() < p_move:
                if rng.random() < 0.5:
                    B, sb = B + 1, float(rng.integers(1, 10))
                else:
                    A, sa = A - 1, float(rng.integers(1, 10))
            else:
                e = rng.integers(0, 6)
                x = float(rng.integers(1, 8))
                if e == 0:  # sell market order hits the bid
                    vol_b = min(x, sb)
                    sb -= vol_b
                elif e == 1:
                    vol_a = min(x, sa)
                    sa -= vol_a
                elif e == 2:
                    sb += x
                elif e == 3:
                    sa += x
                elif e == 4:
                    sb -= min(x, sb)
                else:
                    sa -= min(x, sa)
                if sb <= 0:
                    B, sb = B - 1, float(rng.integers(1, 15))
                if sa <= 0:
                    A, sa = A + 1, float(rng.integers(1, 15))
            if r == a:  # a segment's first row carries no trades (the previous row is another segment's)
                vol_b = vol_a = 0.0
            bid[r], ask[r], bsz[r], asz[r], vb[r], va[r], ts[r] = B, A, sb, sa, vol_b, vol_a, now
        ends[a:b_] = b_ - 1
        now += 3_600_000_000_000
    return {"bid": bid, "ask": ask, "bid_sz": bsz, "ask_sz": asz, "vol_bid": vb, "vol_ask": va,
            "ts": ts.astype(np.int64), "end": ends}


def random_walk_market(rng: np.random.Generator, T: int, segs: int = 1, p_move: float = 0.3) -> dict[str, np.ndarray]:
    """A driftless random walk of a one-tick book: with probability ``p_move`` a row sweeps one
    side (its whole size trades) and the book shifts a tick that way (fresh sizes); else a small
    trade, an add or a cancel that empties nothing. A resting order there fills mostly when the
    price moves through it: adverse selection."""
    out = {k: np.zeros(T) for k in ("bid", "ask", "bid_sz", "ask_sz", "vol_bid", "vol_ask")}
    ts, ends = np.zeros(T, np.int64), np.zeros(T, np.int64)
    cuts = np.linspace(0, T, segs + 1).astype(int)
    now = 1_700_000_000_000_000_000
    for a, b_ in zip(cuts[:-1], cuts[1:]):
        B, sb, sa = 4000.0, float(rng.integers(5, 30)), float(rng.integers(5, 30))
        for r in range(a, b_):
            now += int(rng.exponential(2e6)) + 1
            vb = va = 0.0
            u = rng.random()
            if u < p_move / 2 and r > a:  # sellers sweep the bid: the book ticks down
                vb, B = sb, B - 1
                sb, sa = float(rng.integers(5, 30)), float(rng.integers(5, 30))
            elif u < p_move and r > a:
                va, B = sa, B + 1
                sb, sa = float(rng.integers(5, 30)), float(rng.integers(5, 30))
            else:
                e, x = rng.integers(0, 6), float(rng.integers(1, 4))
                if e == 0 and r > a:
                    vb = min(x, sb - 1)
                    sb -= vb
                elif e == 1 and r > a:
                    va = min(x, sa - 1)
                    sa -= va
                elif e == 2:
                    sb += x
                elif e == 3:
                    sa += x
                elif e == 4:
                    sb -= min(x, sb - 1)
                else:
                    sa -= min(x, sa - 1)
            out["bid"][r], out["ask"][r], out["bid_sz"][r], out["ask_sz"][r] = B, B + 1, sb, sa
            out["vol_bid"][r], out["vol_ask"][r], ts[r] = vb, va, now
        ends[a:b_] = b_ - 1
        now += 3_600_000_000_000
    return {**out, "ts": ts, "end": ends}


def _prob(front: float, back: float, kind: str, n: float) -> float:
    try:
        f = (lambda x: math.log(1 + x)) if kind == "log" else (lambda x: math.pow(x, n))
        p = f(back) / (f(back) + f(front))
    except (ValueError, ZeroDivisionError):
        return 1.0
    return p if math.isfinite(p) else 1.0


def slow_passive(m: dict, start: int, targets: list[float], stride: int, queue: str = "riskaverse",
                 latency_ns: int = 0, timeout: int = 100, on_timeout: str = "cancel", fee_m: float = 0.0,
                 fee_t: float = 0.0) -> dict:
    """One environment from row ``start``, one target per decision, until its segment ends or
    the targets run out. Returns rewards, done flags, fills [(row, side, qty, price, kind)],
    counters and fill statistics (as ExecState's names)."""
    kind, n = (queue.split(":")[0], float(queue.split(":")[1])) if queue.startswith("power:") else (queue, 0.0)
    bid, ask, bsz, asz = (m[k].astype(float).tolist() for k in ("bid", "ask", "bid_sz", "ask_sz"))
    vb, va, ts, END = m["vol_bid"].tolist(), m["vol_ask"].tolist(), m["ts"].tolist(), m["end"].tolist()
    mid = [(b + a) / 2 for b, a in zip(bid, ask)]
    hs = [max(a - b, 0.0) / 2 for b, a in zip(bid, ask)]
    c = dict.fromkeys(("pnl", "turnover", "entries", "closed", "wins", "n_orders", "n_rejected", "n_filled",
                       "n_timeouts", "qty_ordered", "qty_maker", "qty_taker", "ttf_rows", "ttf_ns", "mk1", "mk10",
                       "mk100"), 0.0)
    fills, rewards, dones = [], [], []
    pos, acc, t = 0.0, 0.0, start
    order, pend = None, None

    def act_row(t):
        r = t + 1
        while r <= END[t] and ts[r] < ts[t] + latency_ns:
            r += 1
        return r

    def record(r, side, qty, px, how):
        fills.append((r, side, qty, px, how))
        for k in (1, 10, 100):
            c[f"mk{k}"] += side * qty * (mid[min(r + k, END[r])] - px)

    for q in targets:
        if pend is not None:
            same = q == pend["tgt"]
        elif order is not None and order["qty"] > 0:
            same = q == order["tgt"]
        else:
            same = q == pos
        if not same:
            pend = {"tgt": q, "bid": bid[t], "ask": ask[t], "t": t, "act": act_row(t)}
        end = END[t]
        t2 = min(t + stride, end)
        rew = 0.0
        for r in range(t + 1, t2 + 1):
            pos0 = pos
            d = pos * (mid[r] - mid[r - 1])
            if pend is not None and r >= pend["act"]:
                want = pend["tgt"] - pos
                order = None
                if abs(want) >= 1e-4:
                    buy = want > 0
                    px = pend["bid"] if buy else pend["ask"]
                    crosses = px >= ask[r] if buy else px <= bid[r]
                    if crosses:
                        c["n_rejected"] += 1
                    else:
                        best, size = (bid[r], bsz[r]) if buy else (ask[r], asz[r])
                        better = px > best if buy else px < best
                        worse = px < best if buy else px > best
                        ahead = 0.0 if better else (math.inf if worse or kind == "through" else size)
                        order = {"side": 1 if buy else -1, "px": px, "qty": abs(want), "ahead": ahead,
                                 "tgt": pend["tgt"], "t": pend["t"], "act": r, "age": 0, "hit": False}
                        c["n_orders"] += 1
                        c["qty_ordered"] += abs(want)
                pend = None
            elif order is not None and order["qty"] > 0 and r > order["act"]:
                o = order
                P, buy = o["px"], o["side"] > 0
                if buy:
                    v = vb[r] if bid[r - 1] <= P else 0.0
                    at_now, at_prev, empty = bid[r] == P, bid[r - 1] == P, bid[r] < P
                    size, prev, crossed = bsz[r], bsz[r - 1], ask[r] <= P
                else:
                    v = va[r] if ask[r - 1] >= P else 0.0
                    at_now, at_prev, empty = ask[r] == P, ask[r - 1] == P, ask[r] > P
                    size, prev, crossed = asz[r], asz[r - 1], bid[r] >= P
                a = o["ahead"] - v
                excess = max(-a, 0.0)
                excess = float(math.floor(excess + 1e-4))
                a = max(a, 0.0)
                if empty:
                    a = 0.0
                elif at_now and kind != "through":
                    if at_prev and kind in ("power", "log"):
                        chg = prev - size - v
                        if chg < 0:
                            a = min(a, size)
                        else:
                            p = _prob(a, prev - a, kind, n)
                            a = max(min(a - (1 - p) * chg + min(prev - a - p * chg, 0.0), size), 0.0)
                    else:
                        a = min(a, size)
                o["ahead"] = a
                fill = o["qty"] if crossed or o["qty"] - excess < 1e-4 else min(excess, o["qty"])
                if fill > 0:
                    d += o["side"] * fill * (mid[r] - P) - fee_m * fill
                    o["qty"] -= fill
                    pos = o["tgt"] if o["qty"] == 0 else pos + o["side"] * fill
                    c["n_filled"] += 0 if o["hit"] else 1
                    o["hit"] = True
                    c["qty_maker"] += fill
                    c["ttf_rows"] += fill * (r - o["t"])
                    c["ttf_ns"] += fill * (ts[r] - ts[o["t"]])
                    c["turnover"] += fill
                    record(r, o["side"], fill, P, "maker")
                o["age"] += 1
                if o["qty"] > 0 and o["age"] >= timeout:
                    c["n_timeouts"] += 1
                    if on_timeout == "cross":
                        touch = ask[r] if buy else bid[r]
                        x = o["qty"]
                        d += o["side"] * x * (mid[r] - touch) - fee_t * x
                        pos = o["tgt"]
                        c["qty_taker"] += x
                        c["turnover"] += x
                        record(r, o["side"], x, touch, "cross")
                    o["qty"] = 0.0
            if r == END[r]:
                x = abs(pos)
                d -= x * (hs[r] + fee_t)
                c["turnover"] += x
                if x:
                    fills.append((r, -np.sign(pos), x, mid[r] - np.sign(pos) * hs[r], "close"))
                pos, order, pend = 0.0, None, None
            sign0, sign1 = np.sign(pos0), np.sign(pos)
            acc += d
            if sign1 != sign0 and pos0 != 0:
                c["closed"] += 1
                c["wins"] += acc > 1e-4
                acc = 0.0
            if sign1 != sign0 and pos != 0:
                c["entries"] += 1
            rew += d
        t = t2
        c["pnl"] += rew
        rewards.append(rew)
        dones.append(t2 == end)
        if t2 == end:
            break
    return {"rewards": rewards, "dones": dones, "fills": fills, "pos": pos, **c}
