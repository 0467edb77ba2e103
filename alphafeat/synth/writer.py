"""DBN v3 files of the synthetic market: record layouts, the k-way merge of instruments by
``ts_recv``, instrument definitions, metadata headers and atomic zstd writes.

Record layouts are the reader's (:func:`alphafeat.dbn.record_dtype`, i.e. ``databento_dbn``'s
``_dtypes``, the same dtypes ``databento.DBNStore.to_ndarray`` returns); the metadata header is
``databento_dbn.Metadata(...).encode()``. The simulator writes whole records as int64 words at
the byte offsets checked below.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace

import databento_dbn as dbn
import numba
import numpy as np
import zstandard

from alphafeat.instruments import third_friday
from alphafeat.synth.calendar import CT, UTC, Contract, ns_of, parse_outright
from alphafeat.synth.records import DEF_DTYPE, F_LAST, MBO_W, MBP_W, PUBLISHER_ID, TRADE_DTYPE, Session

__all__ = ["FAST_ZSTD_LEVEL", "SCHEMAS", "ZSTD_LEVEL", "merged_chunks"]

#: Fixed zstd compression level (output bytes depend only on the arguments).
ZSTD_LEVEL = 12
#: zstd level of big sets (scales other than quiet) unless given. This module's level 1 is
#: zstd's fast strategy with a 128 KiB window, a 4096-entry hash table and 5-byte matches
#: (:data:`_FAST_PARAMS`): on MBP-10 records about as small as libzstd's level 1 and faster.
FAST_ZSTD_LEVEL = 1

#: Schemas the generator writes, with their ``databento_dbn`` enum.
SCHEMAS = {
    "mbo": dbn.Schema.MBO,
    "mbp-10": dbn.Schema.MBP_10,
    "trades": dbn.Schema.TRADES,
    "definition": dbn.Schema.DEFINITION,
}

#: Bytes per chunk of merged records handed to zstd: big chunks cut the per-call overhead of
#: the streaming compressor (about 10 % faster than 1 MiB chunks; the frame is the same).
_CHUNK_BYTES = 1 << 24


@numba.njit(cache=True)
def _merge_rows(parts, col, pos, out, trades, nt):
    """Next rows of the k-way merge of the parts (each non-decreasing in word ``col``, ts_recv;
    equal keys keep part order, as a stable sort of the concatenation), copied into ``out``.

    ``pos[p]``: the next row of part ``p`` (advanced; the merge resumes from it). The best part
    is copied in runs: while its key stays below those of the parts before it and at most those
    after it. With rows in ``trades`` (kind mbp-10), each 'T' record also goes to
    ``trades[nt]`` as TradeMsg words (:func:`_trade_into`). Returns (rows copied, nt)."""
    k = len(parts)
    m = out.shape[0]
    w = out.shape[1]
    want = trades.shape[0] > 0
    big = np.iinfo(np.int64).max
    i = 0
    while i < m:
        best = -1
        bt = np.int64(0)
        for p in range(k):
            if pos[p] < parts[p].shape[0]:
                t = parts[p][pos[p], col]
                if best < 0 or t < bt:
                    best = p
                    bt = t
        if best < 0:
            break
        lo = big  # keys of earlier parts: the run's keys must stay strictly below
        hi = big  # keys of later parts: at most equal
        lo_set = False
        for q in range(k):
            if q != best and pos[q] < parts[q].shape[0]:
                t = parts[q][pos[q], col]
                if q < best:
                    if t < lo:
                        lo = t
                        lo_set = True
                elif t < hi:
                    hi = t
        src = parts[best]
        r = pos[best]
        end = src.shape[0]
        while i < m and r < end:
            t = src[r, col]
            if t > hi or (lo_set and t >= lo):
                break
            if r > 0 and t < src[r - 1, col]:
                raise ValueError("records of an instrument are not in ts_recv order")
            for b in range(w):
                out[i, b] = src[r, b]
            if want and _trade_into(src, r, trades, nt):
                nt += 1
            r += 1
            i += 1
        pos[best] = r
    return i, nt


@numba.njit(cache=True, inline="always")
def _trade_into(src, r, out, m):
    """When MBP-10 record ``src[r]`` (int64 words) is a trade (action 'T'), write its TradeMsg
    (first 6 words, length 12, rtype 0, F_LAST set) to ``out[m]`` and return True."""
    if ((src[r, 3] >> 32) & 0xFF) != 84:  # action 'T'
        return False
    for b in range(6):
        out[m, b] = src[r, b]
    out[m, 0] = (out[m, 0] & ~np.int64(0xFFFF)) | 12  # length 48 // 4, rtype 0
    out[m, 3] |= np.int64(F_LAST) << 48
    return True


def merged_chunks(
    sess: Session, kind: str, rows: int = 0, trades: np.ndarray | None = None
) -> Iterator[np.ndarray]:
    """The records of ``kind`` ("mbo" / "mbp") of every instrument of ``sess`` merged by
    ``ts_recv`` (stable: instrument order breaks ties), as consecutive byte chunks (one reused
    buffer).

    Merged and copied in one pass (:func:`_merge_rows`; no merged order is stored). With
    ``trades`` (kind "mbp", :data:`TRADE_DTYPE`, one per MBP-10 'T' record: the sum of the
    runs' ``stats[7]``) the pass also fills it with the TradeMsg of each 'T' record."""
    w = MBO_W if kind == "mbo" else MBP_W
    rows = rows or max(1, _CHUNK_BYTES // (8 * w))
    parts = sess.parts(kind)
    n = sum(p.shape[0] for p in parts)
    m = min(rows, max(n, 1))
    if sess.bufs is None:
        buf = np.empty((m, w), np.int64)
    else:  # reused by the next files (their pages are already touched)
        buf = sess.bufs.get("chunk", np.dtype(np.int64), m * w).reshape(m, w)
    tw = TRADE_DTYPE.itemsize // 8
    tr = np.zeros((0, tw), np.int64) if trades is None else trades.view(np.int64).reshape(-1, tw)
    pos = np.zeros(len(parts), np.int64)
    done = 0
    nt = 0
    while done < n:
        got, nt = _merge_rows(parts, 5 if kind == "mbo" else 4, pos, buf, tr, nt)
        done += got
        yield buf[:got].view(np.uint8).reshape(-1)
    if nt != tr.shape[0]:
        raise RuntimeError(f"{nt} trade records merged, {tr.shape[0]} expected")


def session_trades(sess: Session) -> np.ndarray:
    """TradeMsg records equal to the merged MBP-10 'T' records (F_LAST set), from a merge pass
    whose MBP-10 chunks are dropped."""
    out = np.empty(sum(int(r.stats[7]) for r in sess.runs.values()), TRADE_DTYPE)
    for _ in merged_chunks(sess, "mbp", trades=out):
        pass
    return out


def definitions(cons: Sequence[Contract], day: datetime.date, t0: int) -> np.ndarray:
    """One InstrumentDefMsg per contract (null fields set to DBN's sentinels)."""
    out = np.zeros(len(cons), DEF_DTYPE)
    for name in DEF_DTYPE.names:
        if DEF_DTYPE[name].kind in "iu":
            out[name] = np.iinfo(DEF_DTYPE[name]).max
    for i, c in enumerate(cons):
        r = out[i : i + 1]
        year, month = parse_outright(c.legs[0] if c.is_spread else c.symbol, day)
        exp_day = third_friday(year, month)
        act = exp_day - datetime.timedelta(days=7 * 65)
        r["length"] = DEF_DTYPE.itemsize // 4
        r["rtype"] = 0x13
        r["publisher_id"] = PUBLISHER_ID
        r["instrument_id"] = c.instrument_id
        r["raw_instrument_id"] = c.instrument_id
        r["ts_event"] = t0
        r["ts_recv"] = t0
        r["min_price_increment"] = c.tick
        r["display_factor"] = 1_000_000_000
        r["expiration"] = c.expiration_ns
        r["activation"] = ns_of(datetime.datetime(act.year, act.month, act.day, 17, 0, tzinfo=CT))
        r["unit_of_measure_qty"] = 50_000_000_000
        r["min_price_increment_amount"] = c.tick * 50
        r["underlying_id"] = 0
        r["market_depth_implied"] = 2
        r["market_depth"] = 10
        r["market_segment_id"] = 64
        r["max_trade_vol"] = 3000
        r["min_lot_size"] = 1
        r["min_lot_size_block"] = 1
        r["min_lot_size_round_lot"] = 1
        r["min_trade_vol"] = 1
        r["contract_multiplier"] = 50
        r["appl_id"] = 310
        r["maturity_year"] = year
        r["channel_id"] = 0
        r["leg_count"] = 0
        r["leg_index"] = 0
        r["leg_instrument_id"] = 0
        r["leg_underlying_id"] = 0
        for f in (
            "leg_ratio_price_numerator",
            "leg_ratio_price_denominator",
            "leg_ratio_qty_numerator",
            "leg_ratio_qty_denominator",
        ):
            r[f] = 0
        r["currency"] = b"USD"
        r["settl_currency"] = b"USD"
        r["secsubtype"] = b"SP" if c.is_spread else b""
        r["raw_symbol"] = c.symbol.encode()
        r["group"] = b"ES"
        r["exchange"] = b"XCME"
        r["asset"] = b"ES"
        r["cfi"] = b"FMIXSX" if c.is_spread else b"FFIXSX"
        r["security_type"] = b"FUT"
        r["unit_of_measure"] = b"IPNT"
        r["instrument_class"] = b"S" if c.is_spread else b"F"
        r["match_algorithm"] = b"F"
        r["underlying_product"] = 5
        r["security_update_action"] = b"A"
        r["maturity_month"] = month
        r["user_defined_instrument"] = b"N"
        r["contract_multiplier_unit"] = 127
        r["flow_schedule_type"] = 127
        r["leg_instrument_class"] = b""
        r["leg_side"] = b""
    return out


def metadata_bytes(schema: str, cons: Sequence[Contract], t0: int, t1: int) -> bytes:
    first = datetime.datetime.fromtimestamp(t0 // 1_000_000_000, UTC).date()
    last = datetime.datetime.fromtimestamp((t1 - 1) // 1_000_000_000, UTC).date()
    end_date = last + datetime.timedelta(days=1)
    mappings = [
        SimpleNamespace(
            raw_symbol=c.symbol,
            intervals=[SimpleNamespace(start_date=first, end_date=end_date, symbol=str(c.instrument_id))],
        )
        for c in cons
    ]
    md = dbn.Metadata(
        dataset="GLBX.MDP3",
        schema=SCHEMAS[schema],
        start=t0,
        stype_in=dbn.SType.PARENT,
        stype_out=dbn.SType.INSTRUMENT_ID,
        symbols=["ES.FUT"],
        partial=[],
        not_found=[],
        mappings=mappings,
        end=t1,
        limit=None,
        ts_out=False,
        version=3,
    )
    return bytes(md.encode())


_FAST_PARAMS = dict(
    window_log=17,
    hash_log=12,
    chain_log=12,
    search_log=1,
    min_match=5,
    target_length=1,
    strategy=zstandard.STRATEGY_FAST,
)


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """Single-threaded zstd compressor of ``level`` (level 1: :data:`_FAST_PARAMS`). Frames
    carry the XXH64 content checksum, as Databento's files do: a reader detects corrupt data
    (zstd alone cannot: a damaged block often still decodes)."""
    if level == FAST_ZSTD_LEVEL:
        return zstandard.ZstdCompressor(
            compression_params=zstandard.ZstdCompressionParameters(**_FAST_PARAMS, threads=0, write_checksum=1)
        )
    return zstandard.ZstdCompressor(level=level, threads=0, write_checksum=True)


def write_atomic(
    path: Path, header: bytes, chunks: Iterable[np.ndarray], nbytes: int, level: int = ZSTD_LEVEL
) -> None:
    """Write ``header`` and the record bytes ``chunks`` (``nbytes`` in all) as one zstd frame
    (single threaded; the bytes do not depend on how the records are chunked)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    cctx = _compressor(level)
    try:
        with open(tmp, "wb") as fh:
            cobj = cctx.compressobj(size=len(header) + nbytes)
            fh.write(cobj.compress(header))
            done = 0
            for data in chunks:
                fh.write(cobj.compress(data))
                done += data.nbytes
            if done != nbytes:
                raise RuntimeError(f"{path.name}: {done} record bytes written, {nbytes} announced")
            fh.write(cobj.flush())
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise
