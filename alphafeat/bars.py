"""Volume bars (López de Prado, AFML 2018, ch. 2.3.1.2): sample the book every V contracts.

A bar closes at the first snapshot where the cumulative traded volume (buy + sell) since
the previous bar's close reaches ``volume``; the bar is represented by that closing
snapshot (its book and times) with the trade flow of all snapshots in the bar summed, so
the features of :mod:`alphafeat.features` apply unchanged (their intervals become bars).
The volume of a bar can exceed ``volume`` (a snapshot's flow is not split); the excess does
not carry over. Snapshots after the last full bar are dropped (the bar is not complete).
"""

from __future__ import annotations

import numba
import numpy as np

from alphafeat.types import BookArrays
from alphafeat.validation import validate_float

__all__ = ["volume_bar_ends", "volume_bars"]


@numba.njit(cache=True)
def _ends(vol: np.ndarray, threshold: float) -> np.ndarray:
    out = np.empty(vol.shape[0], dtype=np.int64)
    k = 0
    acc = 0.0
    for i in range(vol.shape[0]):
        v = vol[i]
        if v == v:
            acc += v
        if acc >= threshold:
            out[k] = i
            k += 1
            acc = 0.0
    return out[:k]


def volume_bar_ends(book: BookArrays, volume: float) -> np.ndarray:
    """Row indices (int64, increasing) of the snapshots that close a volume bar of ``volume``
    contracts (buy + sell volume summed from the previous close, NaN counted as 0)."""
    volume = validate_float(volume, "volume", lo=0.0, lo_open=True)
    vol = np.asarray(book.buy_volume, dtype=np.float64) + np.asarray(book.sell_volume, dtype=np.float64)
    return _ends(np.ascontiguousarray(vol), float(volume))


def volume_bars(book: BookArrays, volume: float) -> BookArrays:
    """Sample one segment into volume bars of ``volume`` contracts.

    Parameters
    ----------
    book : BookArrays
        Snapshots of one instrument over one session, in time order.
    volume : float
        Contracts per bar (V > 0).

    Returns
    -------
    BookArrays
        One row per bar: the closing snapshot's ``ts_event``, ``ts_recv``, book levels and
        order counts, with ``buy_volume``, ``sell_volume`` and ``trade_count`` summed over
        the snapshots of the bar (from the row after the previous close through the close).
        ``depth`` is kept.
    """
    ends = volume_bar_ends(book, volume)
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64) if ends.size else ends

    def summed(x: np.ndarray) -> np.ndarray:
        x = np.nan_to_num(np.asarray(x, dtype=np.float64))
        if not ends.size:
            return x[:0]
        c = np.concatenate([[0.0], np.cumsum(x)])
        return c[ends + 1] - c[starts]

    take = lambda a: np.ascontiguousarray(np.asarray(a)[ends])  # noqa: E731
    return BookArrays(
        ts_event=take(book.ts_event),
        ts_recv=take(book.ts_recv),
        bid_px=take(book.bid_px),
        ask_px=take(book.ask_px),
        bid_sz=take(book.bid_sz),
        ask_sz=take(book.ask_sz),
        bid_ct=take(book.bid_ct),
        ask_ct=take(book.ask_ct),
        buy_volume=summed(book.buy_volume),
        sell_volume=summed(book.sell_volume),
        trade_count=summed(book.trade_count),
        depth=book.depth,
    )
