"""What the simulator and the writer of the synthetic market share: DBN v3 record layouts
(the reader's, :func:`alphafeat.dbn.record_dtype`) and the byte offsets the simulator writes
through int64 words, and a simulated session's runs (:class:`Session`)."""

from __future__ import annotations

import datetime
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from alphafeat.dbn import SCHEMA_RTYPES, record_dtype
from alphafeat.synth.calendar import Contract

__all__ = ["DEF_DTYPE", "F_LAST", "MBO_DTYPE", "MBO_SIZE", "MBO_W", "MBP10_DTYPE", "MBP_SIZE", "MBP_W", "PUBLISHER_ID",
           "TRADE_DTYPE", "UNDEF_PRICE", "Buffers", "InstrumentRun", "Session"]

#: Databento's null price (i64::MAX), 1e-9 fixed point.
UNDEF_PRICE = 2**63 - 1
#: Flag marking the last record of an event.
F_LAST = 0x80
#: GLBX.MDP3 publisher id.
PUBLISHER_ID = 1
MBP10_DTYPE = record_dtype(SCHEMA_RTYPES["mbp-10"], 3)
MBO_DTYPE = record_dtype(SCHEMA_RTYPES["mbo"], 3)
TRADE_DTYPE = record_dtype(SCHEMA_RTYPES["trades"], 3)
DEF_DTYPE = record_dtype(SCHEMA_RTYPES["definition"], 3)
MBO_SIZE = MBO_DTYPE.itemsize
MBP_SIZE = MBP10_DTYPE.itemsize

# Byte layout the numba kernel writes through int64 words of a record.
_EXPECTED_OFFSETS = {
    "ts_event": 8,
    "price": 16,
    "size": 24,
    "action": 28,
    "side": 29,
    "flags": 30,
    "depth": 31,
    "ts_recv": 32,
    "ts_in_delta": 40,
    "sequence": 44,
    "bid_px_00": 48,
    "ask_px_00": 56,
    "bid_sz_00": 64,
    "ask_sz_00": 68,
    "bid_ct_00": 72,
    "ask_ct_00": 76,
    "bid_px_01": 80,
}
assert MBP_SIZE == 368 and TRADE_DTYPE.itemsize == 48 and MBO_SIZE == 56
assert sys.byteorder == "little"  # the kernel writes records as little-endian int64 words
assert [
    MBO_DTYPE.fields[k][1]
    for k in ("ts_event", "order_id", "price", "size", "flags", "action", "side", "ts_recv", "ts_in_delta", "sequence")
] == [8, 16, 24, 32, 36, 38, 39, 40, 48, 52]
assert all(MBP10_DTYPE.fields[k][1] == v for k, v in _EXPECTED_OFFSETS.items())
assert TRADE_DTYPE.names == MBP10_DTYPE.names[: len(TRADE_DTYPE.names)]
MBO_W, MBP_W = MBO_SIZE // 8, MBP_SIZE // 8


class Buffers:
    """Grow-only record buffers reused by the sessions one process simulates: first touches of
    fresh memory (page faults, huge-page compaction) cost about as much as the simulation."""

    def __init__(self) -> None:
        self._bufs: dict[Any, np.ndarray] = {}

    def get(self, key: Any, dtype: np.dtype, n: int) -> np.ndarray:
        """An uninitialised array of ``n`` records of ``dtype`` (reuses the buffer of ``key``)."""
        nbytes = n * dtype.itemsize
        buf = self._bufs.get(key)
        if buf is None or buf.nbytes < nbytes:
            self._bufs.pop(key, None)
            # 1/8 headroom: a slightly bigger later session reuses the touched pages (pages
            # never written cost no memory)
            buf = np.empty(nbytes + nbytes // 8, np.uint8)
            self._bufs[key] = buf
        return buf[:nbytes].view(dtype)

    def clear(self) -> None:
        self._bufs.clear()


@dataclass
class InstrumentRun:
    n_mbo: int  # MBO records (``mbo`` holds them when they were written, else none)
    mbo: np.ndarray
    mbp: np.ndarray
    stats: np.ndarray
    crossed: bool
    saved: tuple[np.ndarray, ...] | None
    params: np.ndarray
    latent: np.ndarray | None = None  # leading outright: its mid (ticks), 1 s grid
    # leading outright, per book event: ts_recv (int64 ns) and the planted p_up after it (float64)
    planted: tuple[np.ndarray, np.ndarray] | None = None
    # leading outright with drift horizons: expected mid change (ticks) over each horizon (n, H)
    # (alphafeat.synth.simulator.drift_estimate), the mid (ticks) after each event and the
    # drift's reliability per horizon (H,)
    drift: np.ndarray | None = None
    mid: np.ndarray | None = None
    drift_reliability: np.ndarray | None = None


@dataclass
class Session:
    """The runs of every instrument of one session (records of all instruments are merged by
    ``ts_recv`` on demand: :func:`alphafeat.synth.writer.merged_chunks`)."""

    day: datetime.date
    contracts: list[Contract]
    runs: dict[str, InstrumentRun]
    leader: str
    bufs: Buffers | None = None

    def parts(self, kind: str) -> tuple[np.ndarray, ...]:
        """Per-instrument records of ``kind`` ("mbo" / "mbp") as 2-D int64 word arrays (a tuple:
        numba compiles and caches one kernel per tuple length; a ``numba.typed.List`` would
        compile its methods anew in every process, about 3 s)."""
        w = MBO_W if kind == "mbo" else MBP_W
        arrs = [getattr(r, kind) for r in self.runs.values()]
        return tuple(a.view(np.int64).reshape(a.shape[0], w) for a in arrs)
