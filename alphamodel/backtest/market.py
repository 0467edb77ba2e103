"""The market a backtest trades in, read from an alphafeat cache: the only code that knows the
cache's column names for the backtest (top of book ``bid_px_00`` / ``ask_px_00``, ``realized_vol_*``,
``ofi_integrated`` / ``ofi_l01``, ``tb_label``, the planted-signal sidecar).

:class:`Market` holds the flattened top of book in ticks (see :mod:`alphamodel.backtest.env`
for how the environment fills against it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from alphafeat.cache import META_KEY
from alphafeat.errors import InputError
from alphafeat.synth.planted import SIGNAL_SUFFIX, asof, asof_events, planted_path, read_drift, read_planted
from alphamodel.backtest.config import ORACLE_BAND, ORACLE_MARGINS, ORACLE_NAMES, TICK_VALUE, BacktestConfig
from alphamodel.backtest.execution import Book
from alphamodel.data.cache import CacheData
from alphamodel.errors import CacheError, DataError

__all__ = ["PASSIVE_COLUMNS", "Market", "Rows", "column", "ffill_quotes", "load_market", "market_from_arrays",
           "planted_drift_rows", "planted_rows"]


@dataclass
class Market:
    """Flattened top of book on one device.

    mid, half_spread : (T,) float32 ticks. end : (T,) int64, the last row of each row's segment.
    seg_start, seg_end : (S,) int64 first / last row of each segment. tick : index points per
    tick. tick_value : USD per tick per contract (ES 12.50). book : the same rows with the touch's
    prices, sizes and traded volume for the execution models (:class:`~alphamodel.backtest.execution.Book`;
    None until :func:`load_market` sets it).
    """

    mid: torch.Tensor
    half_spread: torch.Tensor
    end: torch.Tensor
    seg_start: torch.Tensor
    seg_end: torch.Tensor
    tick: float = 0.25
    tick_value: float = 12.5
    book: Book | None = None

    @property
    def device(self) -> torch.device:
        return self.mid.device


def ffill_quotes(bid: np.ndarray, ask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Forward-fill missing (NaN) bid/ask within one segment, then back-fill its start; float64."""
    out = []
    for x in (bid, ask):
        x = np.asarray(x, np.float64).copy()
        ok = np.isfinite(x)
        if not ok.any():
            out.append(x)
            continue
        idx = np.where(ok, np.arange(x.size), 0)
        np.maximum.accumulate(idx, out=idx)
        x = x[idx]
        first = int(np.argmax(ok))
        x[:first] = x[first]
        out.append(x)
    return out[0], out[1]


def market_from_arrays(bids: list[np.ndarray], asks: list[np.ndarray], tick: float, tick_value: float = 12.5,
                       device: torch.device | str = "cpu", paths: list | None = None) -> Market:
    """Build a :class:`Market` from per-segment bid/ask arrays (index points, NaN = empty side);
    ``paths``: the segments' files, to name them in errors.

    Raises
    ------
    alphamodel.errors.DataError
        A segment (its file, or its index in ``bids``) has no valid quote on one side.
    """
    mids, hss, ends, starts = [], [], [], []
    off = 0
    for k, (b, a) in enumerate(zip(bids, asks)):
        b, a = ffill_quotes(b, a)
        if b.size == 0 or not (np.isfinite(b).all() and np.isfinite(a).all()):
            raise DataError("no valid bid or ask quote" if paths else f"segment {k}: no valid bid or ask quote",
                            paths[k] if paths else None)
        mids.append((a + b) / 2 / tick)
        hss.append(np.maximum(a - b, 0.0) / 2 / tick)
        ends.append(np.full(b.size, off + b.size - 1, np.int64))
        starts.append(off)
        off += b.size
    dev = torch.device(device)
    f32 = dict(dtype=torch.float32, device=dev)
    return Market(torch.as_tensor(np.concatenate(mids), **f32), torch.as_tensor(np.concatenate(hss), **f32),
                  torch.as_tensor(np.concatenate(ends), device=dev),
                  torch.as_tensor(np.array(starts, np.int64), device=dev),
                  torch.as_tensor(np.array([e[-1] for e in ends], np.int64), device=dev), tick, tick_value)


@dataclass
class Rows:
    """Per-row arrays over the flattened cache (numpy, global row order): the segment, ts_recv
    (int64 ns), the Kelly volatility, the OFI the ofi-sign baseline reads, the triple-barrier
    label (-1 / 0 / +1 / NaN)."""

    seg: np.ndarray
    ts: np.ndarray
    rv: np.ndarray
    ofi: np.ndarray
    tb: np.ndarray  # -1 / 0 / +1 / NaN


def column(data: CacheData, k: int, name: str) -> np.ndarray | None:
    """Column ``name`` of segment ``k`` as float64 (T_k,), or None when the partition lacks it."""
    table = data.segments[k].table
    if name not in table.column_names:
        return None
    return table.column(name).to_numpy().astype(np.float64)


def load_market(data: CacheData, cfg: BacktestConfig, device: torch.device) -> tuple[Market, Rows, dict]:
    """The top of book of every segment as a :class:`Market` on ``device``, the per-row arrays
    the strategies read (:class:`Rows`), and notes on the columns found.

    Raises
    ------
    alphamodel.errors.CacheError
        A partition without ``bid_px_00`` / ``ask_px_00``; no ``realized_vol_*`` with Kelly sizing.
    alphamodel.errors.DataError
        No tick value for the cache's root and none in the config; a segment without quotes.
    """
    notes = {}
    need = ("bid_px_00", "ask_px_00")
    bids, asks = [], []
    for k, seg in enumerate(data.segments):
        cols = seg.table.column_names
        missing = [c for c in need if c not in cols]
        if missing:
            raise CacheError(seg.path, f"missing column(s) {', '.join(missing)} (the top of book the backtest "
                             "fills at; precompute keeps them)")
        bids.append(column(data, k, "bid_px_00"))
        asks.append(column(data, k, "ask_px_00"))
    root = next((p.split("=", 1)[1] for p in data.segments[0].path.parts if p.startswith("root=")), "")
    tick_value = cfg.tick_value or TICK_VALUE.get(root)
    if tick_value is None:
        raise DataError(f"no tick value known for root {root!r}; set tick_value in the config", data.root)
    market = market_from_arrays(bids, asks, data.tick, tick_value, device, [s.path for s in data.segments])
    market.book = _book(data, cfg, market, bids, asks)
    cols0 = data.segments[0].table.column_names
    rv_name = next((c for c in ("realized_vol_60s", "realized_vol_10s", "realized_vol_600s") if c in cols0),
                   next((c for c in cols0 if c.startswith("realized_vol_")), None))
    if cfg.kelly and rv_name is None:
        raise CacheError(data.root, "no realized_vol_* column for the Kelly sizing; pass --no-kelly")
    ofi_name = "ofi_integrated" if "ofi_integrated" in cols0 else ("ofi_l01" if "ofi_l01" in cols0 else None)
    if "tb_label" not in cols0:
        notes["aux_head"] = "the cache has no tb_label column: the K=3 trade-outcome head is off"
    notes["kelly_volatility"] = rv_name
    notes["ofi_sign_column"] = ofi_name
    if ofi_name is None:
        notes["ofi_sign"] = "the cache has no ofi_integrated / ofi_l01 column: the ofi-sign baseline is left out"
    n = [s.n for s in data.segments]
    cat = lambda name: np.concatenate([  # noqa: E731
        c if (c := column(data, k, name)) is not None else np.full(n[k], np.nan) for k in range(len(n))]) \
        if name else np.full(sum(n), np.nan)
    rows = Rows(np.repeat(np.arange(len(n)), n), np.concatenate([s.ts for s in data.segments]),
                 cat(rv_name), cat(ofi_name), cat("tb_label"))
    return market, rows, notes


#: Cache columns the ``passive`` fill model reads beside the top of book: the touch's displayed
#: sizes and the traded volume by aggressor side since the previous row (seller-initiated trades
#: hit the bid, buyer-initiated ones the ask).
PASSIVE_COLUMNS = ("bid_sz_00", "ask_sz_00", "sell_volume", "buy_volume")


def _book(data: CacheData, cfg: BacktestConfig, market: Market, bids: list, asks: list) -> Book:
    """The execution models' :class:`~alphamodel.backtest.execution.Book` of the market: prices in
    ticks (quotes carried as :func:`ffill_quotes`), mid and half spread the market's; sizes and
    volumes read only for ``passive`` (zeros otherwise).

    Raises
    ------
    alphamodel.errors.CacheError
        ``passive`` asked of a partition without :data:`PASSIVE_COLUMNS`.
    """
    dev = market.device
    filled = [ffill_quotes(b, a) for b, a in zip(bids, asks)]
    f32 = lambda x: torch.as_tensor(np.concatenate(x) if isinstance(x, list) else x, dtype=torch.float32,  # noqa: E731
                                    device=dev)
    n = [s.n for s in data.segments]
    cols = {c: [np.zeros(k) for k in n] for c in PASSIVE_COLUMNS}
    if "passive" in cfg.fills:
        for k, seg in enumerate(data.segments):
            missing = [c for c in PASSIVE_COLUMNS if c not in seg.table.column_names]
            if missing:
                raise CacheError(seg.path, f"missing column(s) {', '.join(missing)}: --fill passive needs the touch's "
                                 "sizes and the traded volume by aggressor side per row (precompute writes them)")
            for c in PASSIVE_COLUMNS:
                cols[c][k] = np.nan_to_num(column(data, k, c))
    ts = torch.as_tensor(np.concatenate([s.ts for s in data.segments]), dtype=torch.long, device=dev)
    return Book(f32([b / data.tick for b, _ in filled]), f32([a / data.tick for _, a in filled]),
                f32(cols["bid_sz_00"]), f32(cols["ask_sz_00"]), f32(cols["sell_volume"]), f32(cols["buy_volume"]),
                ts, market.end, market.mid, market.half_spread)


def _sidecar(data: CacheData, k: int) -> tuple[Path | None, dict]:
    """The planted-signal sidecar of segment ``k`` beside its partition's sources (None when
    there is none) and the partition's metadata."""
    seg = data.segments[k]
    try:
        meta = json.loads((seg.table.schema.metadata or {})[META_KEY])
    except (KeyError, ValueError, AttributeError):
        meta = {}
    folders = sorted({str(Path(e["path"]).parent) for e in meta.get("sources", []) if "path" in e})
    return next((q for f in folders if (q := planted_path(f, seg.session)).is_file()), None), meta


def _sidecars(data: CacheData) -> tuple[list[tuple[int, Path, tuple]], list[str], list[str]]:
    """The segments whose planted-signal sidecar (:func:`_sidecar`) is of their own instrument, as
    ``(k, path, read_planted(path))``; and the sessions with no sidecar, and with one of another
    instrument (the generator's leading outright on a roll day where the cache's front month
    differs)."""
    found, missing, other = [], [], []
    for k, seg in enumerate(data.segments):
        path, meta = _sidecar(data, k)
        if path is None:
            missing.append(seg.session)
            continue
        planted = read_planted(path)
        if meta.get("instrument_id") is not None and planted[2].get("instrument_id") != meta.get("instrument_id"):
            other.append(seg.session)
            continue
        found.append((k, path, planted))
    return found, missing, other


def planted_drift_rows(data: CacheData, stride: int) -> tuple[np.ndarray, int | None, str]:
    """The true model's expected mid change over the holding period per cache row: the sidecar's
    ``drift_K`` (ticks; :mod:`alphafeat.synth.planted`) at K = ``stride`` rows, or the stored K
    nearest to it; float64 (T,), NaN where unknown. Each row is joined to its own event
    (:func:`alphafeat.synth.planted.asof_events`: by ts_recv, then order among events sharing
    it; never an event stamped after the row). Returns (drift, the K used or None, a note).

    Segments without a sidecar, of another instrument than the sidecar's, or whose sidecar
    predates the drift columns (the note gives the reader's one line) stay NaN."""
    out = np.full(data.n_rows, np.nan)
    found, old = [], []
    used: set[int] = set()
    with_sidecar, missing, other = _sidecars(data)
    for k, path, _ in with_sidecar:
        seg = data.segments[k]
        try:
            ts, drift = read_drift(path)
        except InputError as e:
            old.append(str(e))
            continue
        kk = min(drift, key=lambda h: (abs(h - stride), -h))
        used.add(kk)
        j = asof_events(seg.ts, ts)
        out[data.offsets[k]:data.offsets[k + 1]] = np.where(j >= 0, drift[kk][np.maximum(j, 0)], np.nan)
        found.append(seg.session)
    kk = max(used) if used else None
    if not found:
        note = (f"oracle not available: no planted-signal sidecar with the drift_K columns (glbx-mdp3-YYYYMMDD."
                f"{SIGNAL_SUFFIX}, written by `alphafeat synth --signal-file`) beside the cache's sources")
        note += f"; {old[0]}" if old else "; 'hindsight' (look-ahead) is reported as an upper bound instead"
        return out, None, note
    k_note = f"K = {kk} rows = the stride" if kk == stride else f"K = {kk} rows, the stored horizon nearest the " \
        f"stride {stride}"
    note = (f"the generator's true model's expected mid change over the holding period (drift_K, {k_note}; bridge "
            f"to the close excluded: no trader knows it) joined to each row's own event for {len(found)} of "
            f"{len(data.segments)} segments; oracle: long where it is above the margin, short below minus it, "
            f"margins {list(ORACLE_MARGINS)} ticks ({', '.join(ORACLE_NAMES)}); {ORACLE_BAND}: the same with "
            f"hysteresis, entering beyond the round trip (two fees, plus the spread in taker mode), leaving when it "
            f"turns against the position; upper references, not trials")
    for what, ss in (("no sidecar", missing), ("a sidecar of another instrument than the cache's front month", other)):
        if ss:
            note += f"; {what} for {', '.join(ss)} (flat there)"
    if old:
        note += f"; {len(old)} sidecar(s) without drift_K (flat there): {old[0]}"
    return out, kk, note


def planted_rows(data: CacheData) -> tuple[np.ndarray, str]:
    """The generator's planted ``p_up`` per cache row (float64 (T,), NaN where unknown) and a
    note saying where it came from.

    For each segment, the sidecar ``glbx-mdp3-YYYYMMDD.signal.arrow`` of its session is looked
    up beside the DBN files the partition was computed from (its metadata's ``sources``) and
    joined as of the row's ts_recv (:func:`alphafeat.synth.planted.asof`: the last value at or
    before it, never a later one). A segment whose instrument is not the sidecar's (the
    generator's leading outright, e.g. a roll day where the cache's front month differs) or
    with no sidecar stays NaN.
    """
    out = np.full(data.n_rows, np.nan)
    with_sidecar, missing, other = _sidecars(data)
    found = []
    for k, _, (ts, p_up, _) in with_sidecar:
        out[data.offsets[k]:data.offsets[k + 1]] = asof(data.segments[k].ts, ts, p_up)
        found.append(data.segments[k].session)
    if not found:
        note = (f"oracle not available: no planted-signal sidecar (glbx-mdp3-YYYYMMDD.{SIGNAL_SUFFIX}, written by "
                "`alphafeat synth --signal-file`) beside the cache's sources; 'hindsight' (sign of the mid's move "
                "over the next stride, look-ahead) is reported as an upper bound instead")
    else:
        note = (f"p_up of the generator's true model (bridge to the close excluded: no trader knows it) joined as "
                f"of ts_recv for {len(found)} of {len(data.segments)} segments")
        if missing:
            note += f"; no sidecar for {', '.join(missing)} (flat there)"
        if other:
            note += f"; sidecar of another instrument than the cache's front month on {', '.join(other)} (flat there)"
    return out, note
