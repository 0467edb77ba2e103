"""Make the DBN files a Databento user holds from generated (or real) ones, with databento-dbn.

Each helper reads records with :func:`alphafeat.dbn.read_dbn` (checked against Databento's own
decoder in ``test_dbn.py``), edits them with numpy and writes a new zstd DBN file whose
metadata is encoded by ``databento_dbn.Metadata``: continuous-symbology files (``ES.v.0``),
live recordings (mixed rtypes, in-band ``SymbolMappingMsg``, no schema), MBO with the
``F_LAST`` flag stripped, MBO cut to start mid-session without its snapshot.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace

import databento_dbn
import numpy as np
import zstandard

from alphafeat.dbn import read_dbn, record_dtype

MBO, MBP10, TRADES, DEF, SMAP = 0xA0, 0x0A, 0x00, 0x13, 0x16
UNDEF_TS = 2**64 - 1


def records(paths: list[Path], rtype: int) -> tuple[databento_dbn.Metadata, np.ndarray]:
    """The first file's metadata and the records of ``rtype`` of all ``paths``, in order."""
    parts, meta = [], None
    for p in paths:
        dbn, recs = read_dbn(p)
        meta = meta or dbn.metadata
        if rtype in recs:
            parts.append(recs[rtype])
    return meta, np.concatenate(parts)


def write(path: Path, recs: np.ndarray | bytes, *, schema: databento_dbn.Schema | None, start: int,
          end: int | None, stype_in: databento_dbn.SType | None, symbols: list[str],
          mappings: list | None = None, dataset: str = "GLBX.MDP3") -> Path:  # fmt: skip
    """A zstd DBN v3 file with this metadata and these record bytes."""
    meta = databento_dbn.Metadata(
        dataset=dataset, schema=schema, start=start, stype_in=stype_in,
        stype_out=databento_dbn.SType.INSTRUMENT_ID, symbols=symbols, partial=[], not_found=[],
        mappings=mappings or [], end=end, limit=None, ts_out=False, version=3,
    ).encode()  # fmt: skip
    data = recs if isinstance(recs, bytes) else recs.tobytes()
    path.write_bytes(zstandard.ZstdCompressor().compress(bytes(meta) + data))
    return path


def _utc(ts: np.ndarray) -> np.ndarray:
    return (np.asarray(ts, dtype=np.int64) // (86400 * 10**9)).astype("datetime64[D]")


def continuous(path: Path, book: list[Path], switch: dt.date, old: int, new: int,
               symbol: str = "ES.v.0") -> tuple[Path, np.ndarray]:  # fmt: skip
    """A continuous-symbology file of ``symbol`` as Databento delivers it: the records of
    instrument ``old`` on UTC dates before ``switch`` and of ``new`` from ``switch`` on (the
    mapping changes at UTC midnight, inside a CME session). Returns (path, records)."""
    meta, recs = records(book, MBP10)
    day = _utc(recs["ts_recv"])
    keep = np.where(day < np.datetime64(switch), recs["instrument_id"] == old, recs["instrument_id"] == new)
    recs = recs[keep]
    first = dt.date.fromisoformat(str(day[0]))
    last = dt.date.fromisoformat(str(day[-1])) + dt.timedelta(days=1)
    ivs = [SimpleNamespace(start_date=first, end_date=switch, symbol=str(old)),
           SimpleNamespace(start_date=switch, end_date=last, symbol=str(new))]  # fmt: skip
    maps = [SimpleNamespace(raw_symbol=symbol, intervals=ivs)]
    write(path, recs, schema=databento_dbn.Schema.MBP_10, start=int(meta.start), end=int(recs["ts_recv"][-1]) + 1,
          stype_in=databento_dbn.SType.CONTINUOUS, symbols=[symbol], mappings=maps)  # fmt: skip
    return path, recs


def live(path: Path, book: Path, trades: Path, definition: Path, end_ts: int = UNDEF_TS) -> tuple[Path, dict]:
    """A Databento Live recording of one session: no schema and no mappings in the metadata;
    one in-band SymbolMappingMsg per instrument (raw symbol out, ``end_ts`` undefined as live
    sends it), then the definitions, then MBP-10 and trades records interleaved by ``ts_recv``
    (a trade before the book update it caused). Returns (path, {rtype: records})."""
    meta, mbp = records([book], MBP10)
    _, trd = records([trades], TRADES)
    _, defs = records([definition], DEF)
    t0 = int(mbp["ts_recv"][0])
    m = np.zeros(len(defs), dtype=record_dtype(SMAP, 3))
    m["length"], m["rtype"], m["publisher_id"] = m.dtype.itemsize // 4, SMAP, 1
    m["instrument_id"] = defs["instrument_id"]
    m["ts_event"], m["start_ts"], m["end_ts"] = t0, t0, end_ts
    m["stype_in"], m["stype_out"] = 4, 1  # parent in, raw symbol out (DBN SType codes)
    m["stype_in_symbol"] = b"ES.FUT"
    m["stype_out_symbol"] = defs["raw_symbol"]
    # market records in ts_recv order, a trade before a book record of the same ts_recv
    keys = np.concatenate([mbp["ts_recv"].astype(np.int64) * 2 + 1, trd["ts_recv"].astype(np.int64) * 2])
    blobs = [bytes(r) for r in mbp.view(np.dtype((np.void, mbp.dtype.itemsize)))] + \
        [bytes(r) for r in trd.view(np.dtype((np.void, trd.dtype.itemsize)))]  # fmt: skip
    order = np.argsort(keys, kind="stable")
    body = m.tobytes() + defs.tobytes() + b"".join(blobs[i] for i in order)
    write(path, body, schema=None, start=int(meta.start), end=None, stype_in=databento_dbn.SType.PARENT,
          symbols=["ES.FUT"])  # fmt: skip
    return path, {MBP10: mbp, TRADES: trd, DEF: defs, SMAP: m}


def strip_flags(path: Path, mbo: Path, flag: int = 0x80) -> tuple[Path, np.ndarray]:
    """The MBO file with ``flag`` (F_LAST) cleared on every record (other metadata kept)."""
    meta, recs = records([mbo], MBO)
    recs = recs.copy()
    recs["flags"] &= np.uint8(0xFF ^ flag)
    return _rewrite(path, meta, recs), recs


def cut(path: Path, mbo: Path, start_ns: int) -> tuple[Path, np.ndarray]:
    """The MBO file's records with ``ts_recv >= start_ns`` only: it starts mid-session, without
    the opening snapshot (a recording started late)."""
    meta, recs = records([mbo], MBO)
    recs = recs[recs["ts_recv"].astype(np.int64) >= start_ns]
    return _rewrite(path, meta, recs, start=start_ns), recs


def _rewrite(path: Path, meta: databento_dbn.Metadata, recs: np.ndarray, start: int | None = None) -> Path:
    maps = [SimpleNamespace(raw_symbol=k, intervals=[SimpleNamespace(**iv) for iv in v])
            for k, v in (meta.mappings or {}).items()]  # fmt: skip
    return write(path, recs, schema=meta.schema, start=start or int(meta.start), end=int(meta.end),
                 stype_in=meta.stype_in, symbols=list(meta.symbols), mappings=maps)  # fmt: skip


def rename(path: Path, src: Path, rtype: int, symbol: str, instrument_id: int, dataset: str = "GLBX.MDP3") -> Path:
    """``src``'s records of ``rtype`` as those of another instrument: every record's id set to
    ``instrument_id``, the metadata's symbols and mapping naming ``symbol`` (e.g. the real
    ESU4 file as an NQU4 one), the venue ``dataset``; schema and time range kept."""
    meta, recs = records([src], rtype)
    recs = recs.copy()
    recs["instrument_id"] = instrument_id
    ivs = [SimpleNamespace(**{**iv, "symbol": str(instrument_id)}) for v in (meta.mappings or {}).values() for iv in v]
    return write(path, recs, schema=meta.schema, start=int(meta.start), end=int(meta.end), stype_in=meta.stype_in,
                 symbols=[symbol], mappings=[SimpleNamespace(raw_symbol=symbol, intervals=ivs[:1])],
                 dataset=dataset)  # fmt: skip
