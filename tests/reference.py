"""Independent slow reference implementations used as oracles by the tests."""

from __future__ import annotations

import heapq

import numpy as np

from alphafeat.types import UNDEF_PRICE


def slow_rebuild(records: np.ndarray, levels: int = 10, unknown: list | None = None):
    """Plain-Python MBO replay (dicts of orders and levels), written independently.

    Rules (Databento MBO): A adds; C removes ``size`` from the order (all of it ends the
    order); M replaces price/size (unknown id = add); R clears; T/F/N leave the book. A row
    at every F_LAST record that follows a book change.
    Returns a list of (record index, bids[(px, sz, ct)], asks[(px, sz, ct)]). ``unknown``, when
    given, receives the index of every cancel or modify of an order id not resting in the book
    at a price within the ``levels`` best levels of its side (or any price when the side has
    fewer levels).
    """

    def near(side, px):
        if side not in lv:
            return True
        best = heapq.nlargest(levels, lv[side]) if side == b"B" else heapq.nsmallest(levels, lv[side])
        return len(best) < levels or (px >= best[-1] if side == b"B" else px <= best[-1])

    orders: dict[int, tuple[int, int, bytes]] = {}
    lv = {b"B": {}, b"A": {}}

    def level_add(side, px, sz, ct):
        s, c = lv[side].get(px, (0, 0))
        s, c = s + sz, c + ct
        if c <= 0:
            lv[side].pop(px, None)
        else:
            lv[side][px] = (s, c)

    rows = []
    dirty = False
    for k, r in enumerate(records.tolist()):
        rec = dict(zip(records.dtype.names, r))
        act, oid = rec["action"], rec["order_id"]
        if unknown is not None and act in (b"C", b"M") and oid not in orders and near(rec["side"], rec["price"]):
            unknown.append(k)
        if act == b"C":
            if oid in orders:
                px, sz, side = orders.pop(oid)
                q = min(rec["size"], sz)
                if sz - q > 0:
                    orders[oid] = (px, sz - q, side)
                    level_add(side, px, -q, 0)
                else:
                    level_add(side, px, -sz, -1)
                dirty = True
        elif act in (b"A", b"M"):
            if oid in orders:
                px, sz, side = orders.pop(oid)
                level_add(side, px, -sz, -1)
            if rec["side"] in (b"A", b"B") and rec["size"] > 0 and rec["price"] != UNDEF_PRICE:
                orders[oid] = (rec["price"], rec["size"], rec["side"])
                level_add(rec["side"], rec["price"], rec["size"], 1)
            dirty = True
        elif act == b"R":
            orders.clear()
            lv[b"B"].clear()
            lv[b"A"].clear()
            dirty = True
        if rec["flags"] & 0x80 and dirty:
            bids = [(p, *lv[b"B"][p]) for p in heapq.nlargest(levels, lv[b"B"])]
            asks = [(p, *lv[b"A"][p]) for p in heapq.nsmallest(levels, lv[b"A"])]
            rows.append((k, bids, asks))
            dirty = False
    return rows
