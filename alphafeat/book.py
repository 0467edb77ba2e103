"""Book snapshots from DBN records: rebuild from MBO, or pass MBP-10 / MBP-1 through.

Conventions (Databento MBO, https://databento.com/docs/schemas-and-data-formats/mbo):

* ``A`` adds an order; ``C`` cancels ``size`` contracts of it (a full cancel when that is all
  it has); ``M`` replaces its price and size (an unknown order id is treated as an add);
  ``R`` clears the book; ``T`` (trade), ``F`` (fill) and ``N`` do not change the book.
* A snapshot row is emitted at each record carrying ``F_LAST`` (0x80) when the book changed
  since the previous row. Trade and fill records never carry ``F_LAST`` in CME MBO, so in
  practice this is "every ``F_LAST`` record"; the rule only avoids duplicate rows where a
  pure trade/fill event would end with ``F_LAST``.
* Trades come from ``T`` records; their ``side`` is the aggressor: ``B`` a buyer lifted the
  ask (+1), ``A`` a seller hit the bid (-1), ``N`` unknown (0).

MBP-10 and MBP-1 records already carry the book: a row is emitted at each ``F_LAST`` record
that is not a trade or fill (those repeat the previous book), and trades are the ``T``
records of the same stream unless a trades file is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np

from alphafeat.arena import reserve
from alphafeat.types import LEVELS, PRICE_SCALE, UNDEF_PRICE, BookArrays

F_LAST = 0x80
F_TOB = 0x40
F_SNAPSHOT = 0x20
F_MBP = 0x10
F_BAD_TS_RECV = 0x08
F_MAYBE_BAD_BOOK = 0x04

_A, _B, _C, _F, _M, _N, _R, _T = (ord(c) for c in "ABCFMNRT")


@dataclass
class RawBook:
    """Book snapshots of one instrument before conversion to :class:`BookArrays`.

    Attributes
    ----------
    ts_event, ts_recv : np.ndarray, int64, shape (n,)
        Times (ns since the UNIX epoch) of the record that completed each snapshot.
    pos : np.ndarray, int64, shape (n,)
        Index of that record in the instrument's record stream (for ordering trades).
    bid_px, ask_px : np.ndarray, int64, shape (n, LEVELS)
        Level prices, 1e-9 fixed point; ``UNDEF_PRICE`` where the level is empty.
    bid_sz, ask_sz, bid_ct, ask_ct : np.ndarray, int64, shape (n, LEVELS)
        Level sizes (contracts) and order counts; 0 where empty.
    depth : int
        Levels the source carries (10 for MBO and MBP-10, 1 for MBP-1).
    last_unknown : int
        MBO: the last record that cancels or modifies an order the stream never added, at a
        price within the stored levels (-1: none); see :func:`book_complete_from`.
    """

    ts_event: np.ndarray
    ts_recv: np.ndarray
    pos: np.ndarray
    bid_px: np.ndarray
    ask_px: np.ndarray
    bid_sz: np.ndarray
    ask_sz: np.ndarray
    bid_ct: np.ndarray
    ask_ct: np.ndarray
    depth: int = LEVELS
    last_unknown: int = -1

    def __len__(self) -> int:
        return int(self.ts_recv.shape[0])

    def take(self, idx: np.ndarray | slice) -> RawBook:
        """Rows ``idx`` (an index array, boolean mask or slice) as a new RawBook."""
        return RawBook(
            self.ts_event[idx], self.ts_recv[idx], self.pos[idx],
            self.bid_px[idx], self.ask_px[idx], self.bid_sz[idx], self.ask_sz[idx],
            self.bid_ct[idx], self.ask_ct[idx], self.depth, self.last_unknown,
        )


@dataclass
class Trades:
    """Trades of one instrument, in stream order.

    Attributes
    ----------
    ts_event, ts_recv : np.ndarray, int64, shape (m,)
        Times in ns since the UNIX epoch.
    pos : np.ndarray, int64, shape (m,)
        Index in the instrument's book record stream, or -1 when the trades come from a
        separate trades file (then they are matched to snapshots by ``ts_recv``).
    price : np.ndarray, int64, shape (m,)
        1e-9 fixed point.
    size : np.ndarray, int64, shape (m,)
        Contracts.
    aggressor : np.ndarray, int8, shape (m,)
        +1 buyer-initiated, -1 seller-initiated, 0 unknown.
    """

    ts_event: np.ndarray
    ts_recv: np.ndarray
    pos: np.ndarray
    price: np.ndarray
    size: np.ndarray
    aggressor: np.ndarray

    def __len__(self) -> int:
        return int(self.ts_recv.shape[0])

    def take(self, idx: np.ndarray | slice) -> Trades:
        return Trades(
            self.ts_event[idx], self.ts_recv[idx], self.pos[idx],
            self.price[idx], self.size[idx], self.aggressor[idx],
        )


def _codes(field: np.ndarray) -> np.ndarray:
    """An ``S1`` character field as uint8 codes (a view, no copy)."""
    return np.ascontiguousarray(field).view(np.uint8)


def _aggressor(side_codes: np.ndarray) -> np.ndarray:
    out = np.zeros(side_codes.shape[0], dtype=np.int8)
    out[side_codes == _B] = 1
    out[side_codes == _A] = -1
    return out


# --------------------------------------------------------------------------------------
# MBO rebuild (numba)
# --------------------------------------------------------------------------------------


@numba.njit(cache=True)
def _find_level(px_arr, n, px, descending):
    """Binary search: index of ``px`` in the first ``n`` sorted prices, or insertion point."""
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) // 2
        v = px_arr[mid]
        if v == px:
            return mid, True
        if (v > px) if descending else (v < px):
            lo = mid + 1
        else:
            hi = mid
    return lo, False


@numba.njit(cache=True)
def _level_change(lpx, lsz, lct, n, px, dsz, dct, descending):
    """Add ``dsz`` contracts and ``dct`` orders at ``px``; returns the new level count.

    Levels are kept sorted best-first (bids descending, asks ascending). A level whose
    order count falls to 0 is removed. The arrays must have room for one more level.
    """
    i, found = _find_level(lpx, n, px, descending)
    if found:
        lsz[i] += dsz
        lct[i] += dct
        if lct[i] <= 0:
            for j in range(i, n - 1):
                lpx[j] = lpx[j + 1]
                lsz[j] = lsz[j + 1]
                lct[j] = lct[j + 1]
            return n - 1
        return n
    if dct <= 0:
        return n  # removing from a level that does not exist: nothing to do
    for j in range(n, i, -1):
        lpx[j] = lpx[j - 1]
        lsz[j] = lsz[j - 1]
        lct[j] = lct[j - 1]
    lpx[i] = px
    lsz[i] = dsz
    lct[i] = dct
    return n + 1


@numba.njit(cache=True)
def _grow(a):
    b = np.empty(a.shape[0] * 2, dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


@numba.njit(cache=True)
def _rebuild_mbo(action, side, price, size, order_id, flags, levels, undef):
    """Replay one instrument's MBO records; see the module docstring for the rules.

    Returns (rows, bid_px, bid_sz, bid_ct, ask_px, ask_sz, ask_ct, n_unknown, last_unknown) where
    ``rows`` holds the record index of each emitted snapshot, ``n_unknown`` counts cancels of
    order ids never seen (expected before the first snapshot of a partial file) and
    ``last_unknown`` is the last record (-1: none) that cancels or modifies an order never seen
    at a price within the ``levels`` best levels of its side.
    """
    n_rec = action.shape[0]
    n_last = 0
    for k in range(n_rec):
        if flags[k] & 0x80:
            n_last += 1
    rows = np.empty(n_last, dtype=np.int64)
    out_bpx = np.full((n_last, levels), undef, dtype=np.int64)
    out_apx = np.full((n_last, levels), undef, dtype=np.int64)
    out_bsz = np.zeros((n_last, levels), dtype=np.int64)
    out_asz = np.zeros((n_last, levels), dtype=np.int64)
    out_bct = np.zeros((n_last, levels), dtype=np.int64)
    out_act = np.zeros((n_last, levels), dtype=np.int64)

    cap = 1024
    bpx = np.empty(cap, dtype=np.int64)
    bsz = np.empty(cap, dtype=np.int64)
    bct = np.empty(cap, dtype=np.int64)
    apx = np.empty(cap, dtype=np.int64)
    asz = np.empty(cap, dtype=np.int64)
    act = np.empty(cap, dtype=np.int64)
    nb = 0
    na = 0
    # order id -> (price, size, side)
    orders = dict()
    orders[np.uint64(0)] = (np.int64(0), np.int64(0), np.uint8(0))
    del orders[np.uint64(0)]

    n_out = 0
    n_unknown = 0
    last_unknown = -1
    dirty = False
    for k in range(n_rec):
        a = action[k]
        if a == 65 or a == 67 or a == 77:  # 'A' 'C' 'M'
            oid = order_id[k]
            if a == 67:  # cancel
                if oid in orders:
                    opx, osz, osd = orders[oid]
                    dq = min(np.int64(size[k]), osz)
                    left = osz - dq
                    dct = -1 if left <= 0 else 0
                    if osd == 66:
                        nb = _level_change(bpx, bsz, bct, nb, opx, -dq, dct, True)
                    else:
                        na = _level_change(apx, asz, act, na, opx, -dq, dct, False)
                    if left <= 0:
                        del orders[oid]
                    else:
                        orders[oid] = (opx, left, osd)
                    dirty = True
                else:
                    n_unknown += 1
                    if _near(side[k], price[k], bpx, nb, apx, na, levels):
                        last_unknown = k
            else:  # add or modify: remove the old version (if any), insert the new one
                if oid in orders:
                    opx, osz, osd = orders[oid]
                    if osd == 66:
                        nb = _level_change(bpx, bsz, bct, nb, opx, -osz, -1, True)
                    else:
                        na = _level_change(apx, asz, act, na, opx, -osz, -1, False)
                    del orders[oid]
                elif a == 77 and _near(side[k], price[k], bpx, nb, apx, na, levels):
                    last_unknown = k  # a modify of an order never added
                sd = side[k]
                sz = np.int64(size[k])
                if (sd == 66 or sd == 65) and sz > 0 and price[k] != undef:
                    if sd == 66:
                        if nb + 1 >= bpx.shape[0]:
                            bpx = _grow(bpx)
                            bsz = _grow(bsz)
                            bct = _grow(bct)
                        nb = _level_change(bpx, bsz, bct, nb, price[k], sz, 1, True)
                    else:
                        if na + 1 >= apx.shape[0]:
                            apx = _grow(apx)
                            asz = _grow(asz)
                            act = _grow(act)
                        na = _level_change(apx, asz, act, na, price[k], sz, 1, False)
                    orders[oid] = (price[k], sz, sd)
                dirty = True
        elif a == 82:  # 'R' clear
            orders.clear()
            nb = 0
            na = 0
            dirty = True
        if (flags[k] & 0x80) and dirty:
            rows[n_out] = k
            for j in range(min(nb, levels)):
                out_bpx[n_out, j] = bpx[j]
                out_bsz[n_out, j] = bsz[j]
                out_bct[n_out, j] = bct[j]
            for j in range(min(na, levels)):
                out_apx[n_out, j] = apx[j]
                out_asz[n_out, j] = asz[j]
                out_act[n_out, j] = act[j]
            n_out += 1
            dirty = False
    return (
        rows[:n_out], out_bpx[:n_out], out_bsz[:n_out], out_bct[:n_out],
        out_apx[:n_out], out_asz[:n_out], out_act[:n_out], n_unknown, last_unknown,
    )


@numba.njit(cache=True)
def _near(sd, px, bpx, nb, apx, na, levels):
    """Whether price ``px`` on side ``sd`` lies within the ``levels`` best levels of the book
    (a side with fewer levels takes any price)."""
    if sd == 66:
        return nb < levels or px >= bpx[levels - 1]
    if sd == 65:
        return na < levels or px <= apx[levels - 1]
    return True


def group_last_flags(records: np.ndarray) -> np.ndarray:
    """Flags of MBO records with ``F_LAST`` set on the last record of every ``ts_recv`` group:
    for a stream in which no record carries it (older files, other venues, tools that strip
    flags), so that the book gets a row per group of records received together (one event
    or a few), the finest time at which the book is known to be consistent.

    Returns uint8 (m,): the records' flags, with F_LAST added at each group's last record.
    """
    flags = np.array(records["flags"], dtype=np.uint8)
    ts = np.asarray(records["ts_recv"])
    if len(ts):
        end = np.ones(len(ts), dtype=bool)
        end[:-1] = ts[1:] != ts[:-1]
        flags[end] |= F_LAST
    return flags


def book_complete_from(records: np.ndarray, last_unknown: int) -> tuple[bool, int]:
    """Whether an instrument's MBO stream starts with a snapshot, and the first record from
    which its rebuilt book is trustworthy.

    Rule: a stream whose first record is a clear (``R``) or carries ``F_SNAPSHOT`` is complete
    from the start. Otherwise (a recording that starts mid-session) orders resting before it
    are missing from the book; the book is trustworthy from the earlier of (a) the first clear
    or snapshot record later in the stream (the book is rebuilt from it) and (b) the record
    after ``last_unknown`` (:attr:`RawBook.last_unknown` of :func:`rebuild_mbo`): the last
    cancel or modify of an order the stream never added, at a price within the stored levels
    of its side, i.e. the last evidence that a missing order made the stored book wrong. With
    no such evidence the book counts as complete from the start (still flagged). The mark
    uses later records, so it is a data-quality mask for choosing rows, never a feature.

    Returns
    -------
    (snapshot, index) : (bool, int)
        ``snapshot`` True when the stream starts with a snapshot or clear; ``index`` the first
        trustworthy record (0 .. m).
    """
    n = len(records)
    if n == 0 or records["action"][0] == b"R" or records["flags"][0] & F_SNAPSHOT:
        return True, 0
    fresh = (_codes(records["action"]) == _R) | ((np.asarray(records["flags"]) & F_SNAPSHOT) != 0)
    first_fresh = int(np.argmax(fresh)) if fresh.any() else n
    return False, min(first_fresh, last_unknown + 1)


def rebuild_mbo(
    records: np.ndarray, levels: int = LEVELS, flags: np.ndarray | None = None
) -> tuple[RawBook, Trades, int]:
    """Rebuild a ``levels``-deep price book from one instrument's MBO records.

    Parameters
    ----------
    records : np.ndarray, structured (databento ``MBOMsg`` dtype), shape (m,)
        All MBO records of a single instrument, in stream order.
    levels : int
        Depth of the snapshots (default 10).
    flags : np.ndarray, uint8, shape (m,), optional
        Flags to use instead of the records' own (e.g. :func:`group_last_flags`).

    Returns
    -------
    (RawBook, Trades, int)
        Snapshots at every ``F_LAST`` record that changed the book, the ``T`` trades, and the
        number of cancels of unknown order ids (nonzero only when the stream starts mid-day
        without a snapshot).
    """
    action = _codes(records["action"])
    rows, bpx, bsz, bct, apx, asz, act, n_unknown, last_unknown = _rebuild_mbo(
        action,
        _codes(records["side"]),
        np.ascontiguousarray(records["price"]),
        np.ascontiguousarray(records["size"]),
        np.ascontiguousarray(records["order_id"]),
        np.ascontiguousarray(records["flags"] if flags is None else flags),
        levels,
        UNDEF_PRICE,
    )
    book = RawBook(
        records["ts_event"][rows].astype(np.int64),
        records["ts_recv"][rows].astype(np.int64),
        rows.astype(np.int64),
        bpx, apx, bsz, asz, bct, act, levels, int(last_unknown),
    )
    return book, _stream_trades(records, action), int(n_unknown)


def _stream_trades(records: np.ndarray, action: np.ndarray) -> Trades:
    t = np.flatnonzero(action == _T)
    tr = records[t]
    return Trades(
        tr["ts_event"].astype(np.int64),
        tr["ts_recv"].astype(np.int64),
        t.astype(np.int64),
        tr["price"].astype(np.int64),
        tr["size"].astype(np.int64),
        _aggressor(_codes(tr["side"])),
    )


def mbp_snapshots(records: np.ndarray) -> tuple[RawBook, Trades]:
    """Snapshots and trades from one instrument's MBP-10 or MBP-1 records.

    Parameters
    ----------
    records : np.ndarray, structured (databento ``MBP10Msg`` or ``MBP1Msg`` dtype), shape (m,)
        Records of a single instrument, in stream order.

    Returns
    -------
    (RawBook, Trades)
        A row for each ``F_LAST`` record whose action is not ``T``/``F``; ``depth`` is 10
        or 1 after the schema, deeper columns empty (``UNDEF_PRICE``, size 0).
    """
    names = records.dtype.names or ()
    depth = sum(1 for n in names if n.startswith("bid_px_"))
    action = _codes(records["action"])
    keep = ((records["flags"] & F_LAST) != 0) & (action != _T) & (action != _F)
    rows = np.flatnonzero(keep)
    sel = records[rows]
    m = rows.shape[0]
    arr = {}
    for side in ("bid", "ask"):
        px = np.full((m, LEVELS), UNDEF_PRICE, dtype=np.int64)
        sz = np.zeros((m, LEVELS), dtype=np.int64)
        ct = np.zeros((m, LEVELS), dtype=np.int64)
        for j in range(depth):
            px[:, j] = sel[f"{side}_px_{j:02d}"]
            sz[:, j] = sel[f"{side}_sz_{j:02d}"]
            ct[:, j] = sel[f"{side}_ct_{j:02d}"]
        arr[side] = (px, sz, ct)
    book = RawBook(
        sel["ts_event"].astype(np.int64), sel["ts_recv"].astype(np.int64), rows.astype(np.int64),
        arr["bid"][0], arr["ask"][0], arr["bid"][1], arr["ask"][1], arr["bid"][2], arr["ask"][2],
        depth,
    )
    return book, _stream_trades(records, action)


def trades_from_records(records: np.ndarray) -> Trades:
    """Trades from a trades-schema (``TradeMsg``) array of one instrument, matched by time."""
    return Trades(
        records["ts_event"].astype(np.int64),
        records["ts_recv"].astype(np.int64),
        np.full(records.shape[0], -1, dtype=np.int64),
        records["price"].astype(np.int64),
        records["size"].astype(np.int64),
        _aggressor(_codes(records["side"])),
    )


def to_book_arrays(
    book: RawBook, trades: Trades, *, buffer: Callable[[int], np.ndarray] | None = None
) -> BookArrays:
    """Convert to float index points and attach trade flow to each snapshot row.

    A trade belongs to the first snapshot at or after it: by stream position when the trade
    came from the book stream (``pos >= 0``), by ``ts_recv`` otherwise (a trade received at
    the same nanosecond as a snapshot counts in that snapshot). Trades after the last
    snapshot belong to no row. No row sees a trade that happened after it.

    Parameters
    ----------
    book, trades : RawBook, Trades
        One instrument's snapshots and trades.
    buffer : callable, optional
        ``buffer(nbytes)`` returns a uint8 array of at least ``nbytes``; the float columns
        (prices, sizes, counts, trade flow) are written into it instead of fresh arrays
        (e.g. :func:`alphafeat.cuda.kernels.pinned_buffer`: page-locked memory the GPU reads
        without a staging copy). Values are the same either way.

    Returns
    -------
    BookArrays
        Prices float64 index points (``x / 1e9``, NaN for ``UNDEF_PRICE``), sizes and counts
        float64, trade flow per row float64.
    """
    n = len(book)
    lv = book.bid_px.shape[1] if book.bid_px.ndim == 2 else LEVELS
    shapes = [(n, lv)] * 6 + [(n,)] * 3
    if buffer is None:
        out = [np.empty(sh) for sh in shapes]
    else:
        sizes = [-(-8 * int(np.prod(sh)) // 64) * 64 for sh in shapes]  # 64-byte aligned pieces
        flat = buffer(sum(sizes))
        starts = np.cumsum([0] + sizes)
        out = [flat[a : a + 8 * int(np.prod(sh))].view(np.float64).reshape(sh) for a, sh in zip(starts, shapes)]
    bid_px, ask_px, bid_sz, ask_sz, bid_ct, ask_ct, buy, sell, count = out

    def px(a: np.ndarray, dst: np.ndarray) -> np.ndarray:
        np.divide(a, PRICE_SCALE, out=dst)
        dst[a == UNDEF_PRICE] = np.nan
        return dst

    for dst, src in ((bid_sz, book.bid_sz), (ask_sz, book.ask_sz), (bid_ct, book.bid_ct), (ask_ct, book.ask_ct)):
        np.copyto(dst, src)
    buy[:], sell[:], count[:] = 0.0, 0.0, 0.0
    if len(trades) and n:
        if np.all(trades.pos >= 0):
            idx = np.searchsorted(book.pos, trades.pos, side="left")
        else:
            idx = np.searchsorted(book.ts_recv, trades.ts_recv, side="left")
        ok = idx < n
        idx, size, agg = idx[ok], trades.size[ok].astype(np.float64), trades.aggressor[ok]
        buy[:] = np.bincount(idx, weights=np.where(agg > 0, size, 0.0), minlength=n)
        sell[:] = np.bincount(idx, weights=np.where(agg < 0, size, 0.0), minlength=n)
        count[:] = np.bincount(idx, minlength=n)
    return BookArrays(
        ts_event=book.ts_event,
        ts_recv=book.ts_recv,
        bid_px=px(book.bid_px, bid_px),
        ask_px=px(book.ask_px, ask_px),
        bid_sz=bid_sz,
        ask_sz=ask_sz,
        bid_ct=bid_ct,
        ask_ct=ask_ct,
        buy_volume=buy,
        sell_volume=sell,
        trade_count=count,
        depth=book.depth,
    )


# --------------------------------------------------------------------------------------
# MBP-10 / MBP-1 records -> book rows of one session (numba, streamed chunk by chunk)
# --------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _mbp_rows(i64, u32, u8, off, depth, s0, s1, k0, ts_ev, ts_rc, bpx, apx, bsz, asz, bct, act, buy, sell, cnt, acc):
    """Rows of the records in ``[s0, s1)`` (ts_recv) into the outputs from row ``k0``; ``acc``
    carries the trade flow (buy, sell, count) not yet given to a row. Returns the next row."""
    o_ev, o_rc, o_sz, o_act, o_side, o_flags, o_px, o_lsz, lstep8, lstep4 = (
        off[0], off[1], off[2], off[3], off[4], off[5], off[6], off[7], off[8], off[9])
    k = k0
    undef = 9223372036854775807
    for r in range(i64.shape[0]):
        t = i64[r, o_rc]
        if t < s0 or t >= s1:
            continue
        a = u8[r, o_act]
        if a == 84:  # 'T': a trade; its side is the aggressor
            side = u8[r, o_side]
            q = float(u32[r, o_sz])
            if side == 66:  # 'B'
                acc[0] += q
            elif side == 65:  # 'A'
                acc[1] += q
            acc[2] += 1.0
            continue
        if (u8[r, o_flags] & 0x80) == 0 or a == 70:  # not F_LAST, or a fill
            continue
        ts_ev[k] = i64[r, o_ev]
        ts_rc[k] = t
        for j in range(bpx.shape[1]):
            if j < depth:
                pb = i64[r, o_px + j * lstep8]
                pa = i64[r, o_px + 1 + j * lstep8]
                bpx[k, j] = np.nan if pb == undef else pb / 1e9
                apx[k, j] = np.nan if pa == undef else pa / 1e9
                bsz[k, j] = u32[r, o_lsz + j * lstep4]
                asz[k, j] = u32[r, o_lsz + 1 + j * lstep4]
                bct[k, j] = u32[r, o_lsz + 2 + j * lstep4]
                act[k, j] = u32[r, o_lsz + 3 + j * lstep4]
            else:
                bpx[k, j] = np.nan
                apx[k, j] = np.nan
                bsz[k, j] = 0.0
                asz[k, j] = 0.0
                bct[k, j] = 0
                act[k, j] = 0
        buy[k] = acc[0]
        sell[k] = acc[1]
        cnt[k] = acc[2]
        acc[:] = 0.0
        k += 1
    return k


class MBPBookBuilder:
    """Book rows of one instrument over one session from MBP-10 / MBP-1 records fed in stream
    order, chunk by chunk (equal to :func:`mbp_snapshots` + :func:`to_book_arrays` on the
    session's rows and trades; ``tests/test_segment.py``).

    A row is emitted for each ``F_LAST`` record that is not a trade or fill and whose
    ``ts_recv`` lies in ``[start, end)``; trade flow comes from the ``T`` records of the same
    session in the stream (each goes to the first row after it) unless :meth:`finish` is given
    a trades file's records. Rows are written straight into the output columns, sized for
    ``capacity`` rows up front (untouched capacity is address space, not memory) and grown by
    copying only if the records outnumber it.

    Parameters
    ----------
    dtype : np.dtype
        The records' dtype (``record_dtype(0x0A or 0x01, version, ts_out)``).
    start, end : int
        Session bounds, ns since the epoch (UTC).
    capacity : int
        Rows to reserve (an upper bound of the records, e.g. from the files' sizes).
    sets : int
        Sets of columns used in turn by :meth:`keep_last` (>= 1), so that ``sets - 1`` blocks
        can be read (by other threads) while the next is built.
    """

    def __init__(self, dtype: np.dtype, start: int, end: int, capacity: int = 1 << 20, sets: int = 1) -> None:
        f = dtype.fields
        self.depth = sum(1 for n in dtype.names if n.startswith("bid_px_"))
        lvl = f["bid_px_01"][1] - f["bid_px_00"][1] if self.depth > 1 else 32
        self._off = np.array([f["ts_event"][1] // 8, f["ts_recv"][1] // 8, f["size"][1] // 4, f["action"][1],
                              f["side"][1], f["flags"][1], f["bid_px_00"][1] // 8, f["bid_sz_00"][1] // 4,
                              lvl // 8, lvl // 4], dtype=np.int64)  # fmt: skip
        self._itemsize = dtype.itemsize
        self.start, self.end = int(start), int(end)
        self._acc = np.zeros(3)
        self._cap = max(int(capacity), 1)
        self._set = 0
        self._cols = self._alloc(self._cap, 0)
        self._sets: list[list[np.ndarray] | None] = [self._cols] + [None] * (max(int(sets), 1) - 1)
        self.rows = 0
        self.records = 0  #: records of the session (``ts_recv`` in ``[start, end)``) consumed so far
        self.read = 0  #: records consumed so far, of any session
        self._taken = 0
        self._last_ts: int | None = None

    @staticmethod
    def _alloc(cap: int, which: int) -> list[np.ndarray]:
        """Column set ``which`` for ``cap`` rows, from this process's reserve when it is free."""
        return [reserve(f"mbp{which}:{c}", (cap, *shape), dt) for c, (shape, dt) in enumerate(_COLS)]

    def add(self, records: np.ndarray) -> int:
        """Consume one chunk of records (a contiguous structured array); returns rows emitted."""
        n = records.shape[0]
        self.read += n
        if n == 0:
            return 0
        ts = records["ts_recv"]
        self.records += int(np.count_nonzero((ts >= np.uint64(self.start)) & (ts < np.uint64(self.end))))
        cap = self._cols[0].shape[0]
        if self.rows + n > cap:  # more records than reserved: grow (copies the rows so far)
            new = self._alloc(max(2 * cap, self.rows + n), self._set)
            for dst, src in zip(new, self._cols):
                dst[: self.rows] = src[: self.rows]
            self._cols = self._sets[self._set] = new
        raw = np.ascontiguousarray(records).view(np.uint8).reshape(n, self._itemsize)
        k = _mbp_rows(raw.view(np.int64), raw.view(np.uint32), raw, self._off, self.depth, self.start, self.end,
                      self.rows, *self._cols, self._acc)  # fmt: skip
        emitted, self.rows = k - self.rows, k
        return emitted

    def take(self, trades: Trades | None = None) -> tuple[BookArrays, bool]:
        """The rows built since the last :meth:`take` as one block of a stream, for
        :class:`alphafeat.features.cpu.FeatureStream`: views of the columns and ``halo``, True
        when row 0 is the previous block's last row (every block but the first). With ``trades``
        (a trades file's, already cut to the session and sorted by ``ts_recv``), the new rows'
        flow is recomputed from the trades after the previous block's last row up to this
        block's last row, each going to the first row at or after it (as :meth:`finish`).
        Call :meth:`keep_last` once the block is used, before the next :meth:`add`."""
        halo = self._taken > 0
        lo = 1 if halo else 0
        c = [a[: self.rows] for a in self._cols]
        b = BookArrays(*c, depth=self.depth)
        if trades is not None and self.rows > lo:
            last = int(b.ts_recv[-1])
            i0 = 0 if self._last_ts is None else int(np.searchsorted(trades.ts_recv, self._last_ts, side="right"))
            i1 = int(np.searchsorted(trades.ts_recv, last, side="right"))
            new = BookArrays(*(a[lo:] for a in c), depth=self.depth)
            attach_trades(new, trades.take(slice(i0, i1)))
            self._last_ts = last
        self._taken += 1
        return b, halo

    def keep_last(self) -> None:
        """Start the next block with the last row of this one (the halo of the next take); with
        more than one column set, in the next set (the blocks taken last stay readable)."""
        if not self.rows:
            return
        if len(self._sets) > 1:  # the caller makes sure the next set's block is no longer read
            self._set = (self._set + 1) % len(self._sets)
            new = self._sets[self._set]
            if new is None or new[0].shape[0] < self._cols[0].shape[0]:
                new = self._sets[self._set] = self._alloc(self._cols[0].shape[0], self._set)
            for dst, src in zip(new, self._cols):
                dst[0] = src[self.rows - 1]
            self._cols = new
        else:
            for a in self._cols:
                a[0] = a[self.rows - 1]
        self.rows = 1

    def finish(self, trades: Trades | None = None) -> BookArrays:
        """The session's rows as :class:`BookArrays` (prices float64 index points, sizes float64,
        counts uint32), views of the reserved columns. With ``trades`` (a trades file's, any
        session: those in the session are used), the flow is recomputed from them, each trade
        going to the first row at or after its ``ts_recv``."""
        c = [a[: self.rows] for a in self._cols]
        self._cols = []
        b = BookArrays(*c, depth=self.depth)
        if trades is not None:
            t = trades.take((trades.ts_recv >= self.start) & (trades.ts_recv < self.end))
            attach_trades(b, t)
        return b


#: Trailing shape and dtype of each output column of :class:`MBPBookBuilder` (BookArrays order).
_COLS = (
    ((), np.int64), ((), np.int64), ((LEVELS,), np.float64), ((LEVELS,), np.float64), ((LEVELS,), np.float64),
    ((LEVELS,), np.float64), ((LEVELS,), np.uint32), ((LEVELS,), np.uint32), ((), np.float64), ((), np.float64),
    ((), np.float64),
)  # fmt: skip
def attach_trades(b: BookArrays, trades: Trades) -> None:
    """Set ``b``'s trade flow (in place) from ``trades`` matched by ``ts_recv``: each trade goes to
    the first row at or after it (as :func:`to_book_arrays`); trades after the last row to none."""
    n = len(b)
    b.buy_volume[:], b.sell_volume[:], b.trade_count[:] = 0.0, 0.0, 0.0
    if not len(trades) or not n:
        return
    idx = np.searchsorted(b.ts_recv, trades.ts_recv, side="left")
    ok = idx < n
    idx, size, agg = idx[ok], trades.size[ok].astype(np.float64), trades.aggressor[ok]
    b.buy_volume[:] = np.bincount(idx, weights=np.where(agg > 0, size, 0.0), minlength=n)
    b.sell_volume[:] = np.bincount(idx, weights=np.where(agg < 0, size, 0.0), minlength=n)
    b.trade_count[:] = np.bincount(idx, minlength=n)
