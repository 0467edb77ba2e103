"""Decode throughput on a large MBP-10 ``.dbn.zst``: prints a table and one JSON line.

Stages, one core each (records/s = records in the file / wall seconds):

* ``zstd decompressobj``: plain decompression, ``zstandard`` ``decompressobj`` (the baseline);
* ``zstd readinto``: plain decompression into a reused buffer (what the reader does);
* ``ours``: :class:`alphafeat.dbn.RecordScanner` decode + front-month instrument filter;
* ``book cold``: what ``alphafeat precompute`` does for a segment without a kept book, over
  the segments of the file's plan (:func:`alphafeat.plan.make_plan`, calendar rule: from the
  metadata when it has mappings and an end time; the segments of the ``--ids`` instruments
  when given): :func:`alphafeat.precompute.books.build_book` (each segment decodes its instrument's
  records of the file and builds its session's rows) and :func:`alphafeat.precompute.books.save_book`
  (the book kept as ``.npy``, as ``--predecoded keep`` does);
* ``book warm``: those kept books read back (:func:`alphafeat.precompute.books.load_book`, memory-mapped,
  sizes widened) and made resident (one byte of every 4 KiB page of every column read): what a
  rerun with other features starts from -- the warm/cold ratio is taken on this row;
* ``DBNStore.to_ndarray`` / ``DBNStore.to_df``: Databento's Python path;
* peak RSS of ``ours`` in a fresh process.

``--scaling K`` also reads K copies of the file (loky processes) and prints records/s:
``scan n_jobs=J`` for J = 1, 2 and all cores (decode + filter, workers return counts: the CPU
work), and ``build_book`` on all cores (the first segment's book built from each copy, workers
return row counts: decode + filter + book).

``--generate GB`` writes a file of about GB decompressed bytes with the project's generator
(``alphafeat.synth``, ``scale="full"`` sessions merged into one file), then re-executes itself
so that the timings run in a fresh process; ``--ids front`` (the default) keeps its
front-month contract.

Usage::

    python bench/decode.py --generate 2.0 [--scaling 8]    # writes /tmp/alphafeat-bench/mbp10_2.0g.dbn.zst
    python bench/decode.py --input FILE.dbn.zst --ids 17077 [--scaling 8] [--skip-df]
"""

from __future__ import annotations

import argparse
import dataclasses
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

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alphafeat.dbn import RecordScanner  # noqa: E402
from alphafeat.plan import make_plan  # noqa: E402
from alphafeat.precompute.books import build_book, kept_book, load_book, save_book  # noqa: E402

log = logging.getLogger("bench.decode")


def generate(path: Path, gbytes: float, jobs: int | None = None, seed: int = 0) -> Path:
    """A multi-GB MBP-10 v3 ``.dbn.zst`` made by the project's generator (:mod:`alphafeat.synth`).

    ``scale="full"`` sessions (about 4 M MBP-10 records each over all ES instruments: three
    outrights and their calendar spreads) from 2024-03-04 on, enough to pass ``gbytes`` of
    decompressed records, merged into one file in time order of sessions: one DBN header
    (``ES.FUT`` parent symbology, the union of the sessions' mappings) and the records of each
    session file in turn, zstd level 3 (multi-threaded writer; decompression is one thread).
    Realistic content matters: zstd decompresses repetitive book records much faster than
    random bytes.
    """
    import datetime as dt

    import databento_dbn as d
    import zstandard

    from alphafeat import synth
    from alphafeat.dbn import open_dbn

    n_sessions = max(1, int(np.ceil(gbytes * 1e9 / 368 / 3.5e6)))
    work = path.parent / (path.name + ".sessions")
    files = synth.generate(
        work, start=dt.date(2024, 3, 4), sessions=n_sessions, seed=seed, schemas=("mbp-10",),
        scale="full", jobs=jobs or os.cpu_count() or 1, report=False,
    )  # fmt: skip
    metas = [open_dbn(f).metadata for f in files]
    mappings: dict[str, list] = {}
    for m in metas:
        for raw, ivs in m.mappings.items():
            mappings.setdefault(raw, []).extend(ivs)

    class Iv:
        def __init__(self, iv: dict) -> None:
            self.start_date, self.end_date, self.symbol = iv["start_date"], iv["end_date"], iv["symbol"]

    class Mp:
        def __init__(self, raw: str, ivs: list[dict]) -> None:
            self.raw_symbol, self.intervals = raw, [Iv(iv) for iv in ivs]

    meta = d.Metadata(
        dataset="GLBX.MDP3", schema=d.Schema.MBP_10, start=metas[0].start, stype_in=d.SType.PARENT,
        stype_out=d.SType.INSTRUMENT_ID, symbols=["ES.FUT"], partial=[], not_found=[],
        mappings=[Mp(raw, ivs) for raw, ivs in sorted(mappings.items())], end=metas[-1].end, limit=None,
        ts_out=False, version=3,
    ).encode()  # fmt: skip
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f, zstandard.ZstdCompressor(level=3, threads=-1).stream_writer(f, closefd=False) as w:
        w.write(meta)
        for src in files:
            for chunk in RecordScanner(src):
                for arr in chunk.values():
                    w.write(arr.data)
    os.replace(tmp, path)
    shutil.rmtree(work, ignore_errors=True)
    return path


def front_month_ids(path: Path) -> list[int]:
    """Instrument ids of the front month (most outright volume, ``alphafeat.synth.front_by_volume``)
    of each session of a file written by :func:`generate`, from the file's symbology."""
    import datetime as dt

    from alphafeat import synth
    from alphafeat.dbn import open_dbn

    ids: set[int] = set()
    for raw, ivs in open_dbn(path).metadata.mappings.items():
        for iv in ivs:
            day = iv["start_date"]
            while day < iv["end_date"]:
                if day.weekday() < 5 and synth.front_by_volume(day) == raw:
                    ids.add(int(iv["symbol"]))
                day += dt.timedelta(days=1)
    return sorted(ids)


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


def _warm(path: Path) -> None:
    """Load the scanner's numba kernels (first chunk only)."""
    sc = RecordScanner(path, chunk_bytes=1 << 16)
    next(iter(sc), None)
    sc.close()


def _peak_rss_kb() -> int:
    """Peak resident set of this process, KiB: ``VmHWM`` of ``/proc/self/status`` (Linux: the
    high-water mark of this process's own memory map, reset by ``exec``), else ``ru_maxrss``
    (which on Linux survives ``exec``: a spawned child would report its parent's peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _ours_rss(path: str, ids: list[int] | None, q: mp.Queue) -> None:
    base = _peak_rss_kb()
    _ours(Path(path), ids)
    q.put((base, _peak_rss_kb()))


def _touch_pages(arr: np.ndarray) -> int:
    """Read one byte of every 4 KiB page of ``arr`` (a memory map becomes resident)."""
    return int(_page_sum(arr.reshape(-1).view(np.uint8)))


@numba.njit(nogil=True, cache=True)
def _page_sum(flat: np.ndarray) -> np.uint64:
    s = np.uint64(0)
    for i in range(0, flat.shape[0], 4096):
        s += np.uint64(flat[i])
    return s


def _book_pages(b) -> int:
    """One byte of every 4 KiB page of every column of a book (a memory map becomes resident)."""
    return sum(_touch_pages(np.ascontiguousarray(v)) for v in vars(b).values() if isinstance(v, np.ndarray))


def _build_rows(seg) -> int:
    """Worker: the rows of one segment's book (decode + filter + book; the book is dropped)."""
    return len(build_book(seg)[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", type=Path)
    ap.add_argument("--generate", type=float, metavar="GB", help="write a synthetic file of this many GB decompressed")
    ap.add_argument(
        "--ids", default="front",
        help="instrument ids kept: comma-separated, 'all', or 'front' (the front month of a --generate file)",
    )  # fmt: skip
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
            generate(path, args.generate)
            # time in a fresh process: generating leaves this one with a large, fragmented heap
            # and worker pools, which slowed every stage after it (ours most) on the GPU host
            log.info("generated; timing in a fresh process")
            sys.stdout.flush()
            sys.stderr.flush()
            os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    if path is None:
        ap.error("--input or --generate is required")
    if args.ids == "all":
        ids = None
    elif args.ids == "front":
        ids = front_month_ids(path)
    else:
        ids = [int(i) for i in args.ids.split(",")]
    log.info("%s: keeping instrument ids %s", path, ids if ids is not None else "all")
    _warm(path)  # load the numba kernels once
    _page_sum(np.zeros(8, np.uint8))
    rows: dict[str, dict] = {}

    def row(name: str, seconds: float, records: int, **extra: object) -> None:
        rows[name] = {"seconds": round(seconds, 3), "records_per_s": round(records / seconds), **extra}
        log.info("%-26s %8.2f s %12.0f rec/s", name, seconds, records / seconds)

    t, (n_rec, kept) = _timed(lambda: _ours(path, ids))  # also brings the file into the page cache
    t_dobj, nbytes = _timed(lambda: _zstd_decompressobj(path))
    row("zstd decompressobj", t_dobj, n_rec, bytes=nbytes)
    t_ri, t_ours = np.inf, np.inf
    for _ in range(2):  # interleaved, best of two: the ratio is what matters
        t_ri = min(t_ri, _timed(lambda: _zstd_readinto(path))[0])
        t_ours = min(t_ours, _timed(lambda: _ours(path, ids))[0])
    row("zstd readinto", t_ri, n_rec)
    row("ours (decode + filter)", t_ours, n_rec, kept=kept)
    q: mp.Queue = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_ours_rss, args=(str(path), ids, q))
    proc.start()
    base_kb, peak_kb = q.get()
    proc.join()
    plan = make_plan([path], roll_rule="calendar")
    segs = [s for s in plan.segments if ids is None or s.instrument_id in ids] or plan.segments
    log.info("%d segment(s): %s", len(segs), ", ".join(f"{s.session} {s.raw_symbol}" for s in segs))
    pre_dir = Path(tempfile.mkdtemp(prefix="alphafeat-predecoded-"))
    try:
        books = [kept_book(s, pre_dir) for s in segs]

        def cold() -> int:
            n = 0
            for seg, d in zip(segs, books, strict=True):
                b = build_book(seg)[0]
                n += len(b)
                if len(b):
                    save_book(b, d)
            return n

        build_book(segs[0])  # load the book kernels (numba) untimed
        t_cold, book_rows = _timed(cold)
        row("book cold (build + save)", t_cold, n_rec, segments=len(segs), rows=book_rows)
        t_warm = np.inf
        for _ in range(2):  # best of two, in a fresh mapping each time
            t_warm = min(t_warm, _timed(lambda: [_book_pages(load_book(d)) for d in books if d.is_dir()])[0])
        row("book warm (load_book)", t_warm, n_rec, rows=book_rows)
        if args.scaling:
            copies = [pre_dir / f"copy{i}.dbn.zst" for i in range(args.scaling)]
            for c in copies:
                os.link(path, c) if path.stat().st_dev == pre_dir.stat().st_dev else shutil.copy(path, c)
            from joblib import Parallel, delayed

            for jobs in sorted({1, 2, os.cpu_count() or 1}):
                with Parallel(n_jobs=jobs) as par:  # decode + filter only (workers return counts)
                    par(delayed(_warm)(path) for _ in range(jobs))  # start the workers, load the kernels
                    t_j, _ = _timed(lambda p=par: p(delayed(_ours)(c, ids) for c in copies))
                row(f"scan n_jobs={jobs}", t_j, n_rec * len(copies), files=len(copies))
            jobs = os.cpu_count() or 1  # decode + filter + book of the first segment of each copy
            one = [dataclasses.replace(segs[0], book_files=(str(c),)) for c in copies]
            with Parallel(n_jobs=jobs) as par:
                par(delayed(_build_rows)(s) for s in one[:jobs])  # start the workers, load the kernels
                t_j, _ = _timed(lambda p=par: p(delayed(_build_rows)(s) for s in one))
            row(f"build_book n_jobs={jobs}", t_j, n_rec * len(copies), files=len(copies))
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
        "book_rows": book_rows,
        "warm_vs_cold": round(t_cold / t_warm, 1),
        "peak_rss_ours_mb": round(peak_kb / 1024, 1),
        "rss_after_imports_mb": round(base_kb / 1024, 1),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
