"""Plain containers passed between stages. Arrays only; no per-record Python objects."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Number of book levels carried through the pipeline (MBP-10 depth).
LEVELS = 10

#: Databento's null price (``i64::MAX``) marking an empty level, in 1e-9 fixed point.
UNDEF_PRICE = np.int64(2**63 - 1)
#: Databento's null timestamp (``u64::MAX``), e.g. a symbol mapping's open end in live data.
UNDEF_TIMESTAMP = 2**64 - 1

#: Fixed-point scale of DBN prices: 1 index point = 1e9 units. Prices are converted by
#: dividing by it (``x / 1e9`` is the double nearest the exact value, so 5000.25 stays exact;
#: ``x * 1e-9`` is one bit off for about 5 % of ES prices).
PRICE_SCALE = 1e9


@dataclass
class BookArrays:
    """Book snapshots of one instrument over one trading session, in time order.

    Attributes
    ----------
    ts_event : np.ndarray, int64, shape (n,)
        Matching-engine time of the record that completed the snapshot, ns since the UNIX epoch.
    ts_recv : np.ndarray, int64, shape (n,)
        Capture-server receive time of that record, ns since the UNIX epoch. Features use this
        clock (it is when the snapshot became known).
    bid_px, ask_px : np.ndarray, float64, shape (n, LEVELS)
        Level prices in index points (DBN fixed point x 1e-9); NaN where the level is empty
        (``UNDEF_PRICE`` in DBN). Level 0 is the best price.
    bid_sz, ask_sz : np.ndarray, float64, shape (n, LEVELS)
        Level sizes in contracts; 0 where the level is empty.
    bid_ct, ask_ct : np.ndarray, float64, shape (n, LEVELS)
        Number of orders at each level; 0 where empty (NaN where the source has no counts).
    buy_volume, sell_volume : np.ndarray, float64, shape (n,)
        Contracts traded with a buy (resp. sell) aggressor in ``(ts_recv[i-1], ts_recv[i]]``
        (for row 0: since the start of the session's data).
    trade_count : np.ndarray, float64, shape (n,)
        Number of trades in the same interval.
    depth : int
        Levels the source really carries (10 for MBO and MBP-10, 1 for MBP-1); deeper
        columns are NaN (prices) and 0 (sizes).
    complete_from : int
        First row from which the book is trustworthy; -1 (the default): every row (an MBO
        stream that started with a snapshot, or MBP); MBO only otherwise, see
        :func:`alphafeat.book.book_complete_from`; rows before it are stored with
        ``book_complete`` False.
    """

    ts_event: np.ndarray
    ts_recv: np.ndarray
    bid_px: np.ndarray
    ask_px: np.ndarray
    bid_sz: np.ndarray
    ask_sz: np.ndarray
    bid_ct: np.ndarray
    ask_ct: np.ndarray
    buy_volume: np.ndarray
    sell_volume: np.ndarray
    trade_count: np.ndarray
    depth: int = LEVELS
    complete_from: int = -1

    def __len__(self) -> int:
        return int(self.ts_recv.shape[0])
