"""Decode throughput on a large MBP-10 ``.dbn.zst`` (issue 3): prints a table and one JSON line.

Stages, one core each (records/s = records in the file / wall seconds):

* ``zstd decompressobj``: plain decompression, ``zstandard`` ``decompressobj`` (the baseline);
* ``zstd readinto``: plain decompression into a reused buffer (what the reader does);
* ``ours``: :class:`alphafeat.dbn.RecordScanner` decode + front-month instrument filter;
* ``ours cold``: the same, written to the predecoded cache (``.npy``, fsync'ed);
* ``ours warm``: predecoded entry memory-mapped, the book columns summed (every page read);
* ``DBNStore.to_ndarray`` / ``DBNStore.to_df``: Databento's Python path;
* peak RSS of ``ours`` in a fresh process.

``--scaling K`` also reads K copies of the file with ``read_files`` at n_jobs 1, 2 and all
cores (loky processes, each file decoded into a fresh predecoded cache) and prints records/s.

Usage::

    python bench/decode.py --generate 1.0           # writes /tmp/alphafeat-bench/mbp10_1.0g.dbn.zst
    python bench/decode.py --input FILE.dbn.zst --ids 17077 [--scaling 8] [--skip-df]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alphafeat import predecoded  # noqa: E402
from alphafeat.dbn import RecordScanner, record_dtype  # noqa: E402
from alphafeat.reader import read_files  # noqa: E402

log = logging.getLogger("bench.decode")
MBP10 = 0x0A
GEN_IDS = {17077: "ESH4", 5602: "ESM4", 42140: "ESH4-ESM4"}


def generate(path: Path, n_records: int, seed: int = 0, block: int = 500_000) -> Path:
    """Random MBP-10 v3 records (ESH4 80 %, ESM4 10 %, the spread 10 %) under ``ES.FUT``."""
    import datetime as dt

    import databento_dbn as d
    import zstandard

    class Iv:
        def __init__(self, sym: str) -> None:
            self.start_date, self.end_date, self.symbol = dt.date(2024, 3, 5), dt.date(2024, 3, 8), sym

    class Mp:
        def __init__(self, raw: str, iid: int) -> None:
            self.raw_symbol, self.intervals = raw, [Iv(str(iid))]

    start = 1_709_679_600 * 10**9
    meta = d.Metadata(
        dataset="GLBX.MDP3", schema=d.Schema.MBP_10, start=start, stype_in=d.SType.PARENT,
        stype_out=d.SType.INSTRUMENT_ID, symbols=["ES.FUT"], partial=[], not_found=[],
        mappings=[Mp(s, i) for i, s in GEN_IDS.items()], end=None, limit=None, ts_out=False, version=3,
    ).encode()  # fmt: skip
    rng = np.random.default_rng(seed)
    dtype = record_dtype(MBP10, 3)
    ids = np.array(list(GEN_IDS), dtype=np.uint32)
    t, px = start, 5_100_000_000_000
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f, zstandard.ZstdCompressor(level=1, threads=-1).stream_writer(f, closefd=False) as w:
        w.write(meta)
        left = n_records
        while left:
            n = min(block, left)
            left -= n
            a = np.zeros(n, dtype)
            a["length"], a["rtype"], a["publisher_id"] = dtype.itemsize // 4, MBP10, 1
            a["instrument_id"] = ids[np.searchsorted([0.8, 0.9], rng.random(n))]
            ts = t + np.cumsum(rng.integers(1, 20_000, n))
            t = int(ts[-1])
            a["ts_event"], a["ts_recv"] = ts, ts + rng.integers(50_000, 150_000, n)
            p = px + np.cumsum(rng.integers(-1, 2, n)) * 250_000_000
            px = int(p[-1])
            a["price"], a["size"] = p, rng.integers(1, 10, n)
            a["action"] = np.array([b"A", b"C", b"T"])[rng.integers(0, 3, n)]
            a["side"], a["flags"], a["sequence"] = b"B", 0x80, np.arange(n)
            for lvl in range(10):
                a[f"bid_px_{lvl:02d}"] = p - lvl * 250_000_000
                a[f"ask_px_{lvl:02d}"] = p + (lvl + 1) * 250_000_000
                for k in ("bid_sz", "ask_sz"):
                    a[f"{k}_{lvl:02d}"] = rng.integers(1, 60, n)
                for k in ("bid_ct", "ask_ct"):
                    a[f"{k}_{lvl:02d}"] = rng.integers(1, 15, n)
            w.write(a.tobytes())
    os.replace(tmp, path)
    return path


def _timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    r = fn()
    return time.perf_counter() - t, r


def _zstd_decompressobj(path: Path) -> int:
    import zstandard

    n = 0
    with open(path, "rb") as f:
        obj = zstandard.ZstdDecompressor().decompressobj()
        while data := f.read(1 << 20):
            n += len(obj.decompress(data))
    return n


def _zstd_readinto(path: Path) -> int:
    import zstandard

    buf = memoryview(bytearray(4 << 20))
    n = 0
    with open(path, "rb") as f:
        r = zstandard.ZstdDecompressor().stream_reader(f, read_size=1 << 17, read_across_frames=True)
        while k := r.readinto(buf):
            n += k
    return n


def _ours(path: Path, ids: list[int] | None) -> tuple[int, int]:
    sc = RecordScanner(path, instrument_ids=ids)
    kept = 0
    for chunk in sc:
        kept += sum(len(a) for a in chunk.values())
    return sc.records, kept


def _ours_rss(path: str, ids: list[int] | None, q: mp.Queue) -> None:
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _ours(Path(path), ids)
    q.put((base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


def _touch(arr: np.ndarray) -> float:
    """Sum the book columns (reads every page of a memory map)."""
    s = float(arr["ts_recv"].sum(dtype=np.float64))
    for lvl in range(10):
        s += float(arr[f"bid_px_{lvl:02d}"].sum(dtype=np.float64)) + float(arr[f"ask_sz_{lvl:02d}"].sum())
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", type=Path)
    ap.add_argument("--generate", type=float, metavar="GB", help="write a synthetic file of this many GB decompressed")
    ap.add_argument("--ids", default="17077", help="front-month instrument ids kept (comma-separated; 'all')")
    ap.add_argument("--skip-df", action="store_true", help="skip DBNStore.to_df (slow)")
    ap.add_argument("--skip-databento", action="store_true", help="skip both DBNStore stages")
    ap.add_argument("--scaling", type=int, default=0, metavar="K", help="also time K copies at n_jobs 1, 2, all")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = args.input
    if args.generate:
        path = Path(tempfile.gettempdir()) / "alphafeat-bench" / f"mbp10_{args.generate}g.dbn.zst"
        if not path.exists():
            log.info("generating %s", path)
            generate(path, int(args.generate * 1e9 / 368))
    if path is None:
        ap.error("--input or --generate is required")
    ids = None if args.ids == "all" else [int(i) for i in args.ids.split(",")]
    RecordScanner(path, chunk_bytes=1 << 16).close()  # load the numba kernels once
    rows: dict[str, dict] = {}

    def row(name: str, seconds: float, records: int, **extra: object) -> None:
        rows[name] = {"seconds": round(seconds, 3), "records_per_s": round(records / seconds), **extra}
        log.info("%-26s %8.2f s %12.0f rec/s", name, seconds, records / seconds)

    t, (n_rec, kept) = _timed(lambda: _ours(path, ids))
    t_dobj, nbytes = _timed(lambda: _zstd_decompressobj(path))
    row("zstd decompressobj", t_dobj, n_rec, bytes=nbytes)
    t_ri, _ = _timed(lambda: _zstd_readinto(path))
    row("zstd readinto", t_ri, n_rec)
    t_ours, _ = _timed(lambda: _ours(path, ids))
    row("ours (decode + filter)", t_ours, n_rec, kept=kept)
    q: mp.Queue = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_ours_rss, args=(str(path), ids, q))
    proc.start()
    base_kb, peak_kb = q.get()
    proc.join()
    pre_dir = Path(tempfile.mkdtemp(prefix="alphafeat-predecoded-"))
    try:
        t_cold, pre = _timed(lambda: predecoded.decode_to_cache(path, pre_dir, ids))
        row("ours cold (-> predecoded)", t_cold, n_rec)
        del pre
        t_warm, _ = _timed(lambda: _touch(predecoded.load(pre_dir, path, ids).arrays[MBP10]))
        row("ours warm (predecoded)", t_warm, n_rec)
        if args.scaling:
            copies = [pre_dir / f"copy{i}.dbn.zst" for i in range(args.scaling)]
            for c in copies:
                os.link(path, c) if path.stat().st_dev == pre_dir.stat().st_dev else shutil.copy(path, c)
            for jobs in sorted({1, 2, os.cpu_count() or 1}):
                cdir = pre_dir / f"scaling{jobs}"  # cold: decode + write .npy; workers return locations
                t_j, _ = _timed(lambda j=jobs, c=cdir: read_files(copies, instrument_ids=ids, n_jobs=j, cache_dir=c))
                row(f"scaling n_jobs={jobs}", t_j, n_rec * len(copies), files=len(copies))
    finally:
        shutil.rmtree(pre_dir, ignore_errors=True)
    if not args.skip_databento:
        import databento

        store = databento.DBNStore.from_file(path)
        t_nd, _ = _timed(lambda: store.to_ndarray())
        row("DBNStore.to_ndarray", t_nd, n_rec)
        if not args.skip_df:
            t_df, _ = _timed(lambda: store.to_df())
            row("DBNStore.to_df", t_df, n_rec)
    summary = {
        "file": str(path),
        "compressed_bytes": path.stat().st_size,
        "decompressed_bytes": nbytes,
        "records": n_rec,
        "kept": kept,
        "stages": rows,
        "ours_vs_zstd_decompressobj": round(t_dobj / t_ours, 3),
        "ours_vs_zstd_readinto": round(t_ri / t_ours, 3),
        "ours_vs_to_ndarray": (
            round(rows["DBNStore.to_ndarray"]["seconds"] / t_ours, 2) if "DBNStore.to_ndarray" in rows else None
        ),
        "warm_vs_cold": round(t_cold / t_warm, 1),
        "peak_rss_ours_mb": round(peak_kb / 1024, 1),
        "rss_after_imports_mb": round(base_kb / 1024, 1),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
