"""Feature throughput: CUDA path (transfers included) vs CPU path on all cores vs a plain
numpy/pandas vectorised version of the same features. Prints a table and one JSON line. Usage::

    python bench/features.py --rows 20000000 [--jobs N] [--skip-cuda] [--skip-pandas]
    python bench/features.py --input DIR_OR_FILES [...] [--root ES] [--jobs N] ...
    python bench/features.py --input DIR --stream [--jobs N] [--batch 16] [--json-out FILE]
        [--deadline S] [--build-jobs N] [--scratch DIR] [--roll-rule volume|calendar] ...

``--rows`` / ``--input`` (everything in memory): a random-walk 10-level ES-like book of
``--rows`` snapshots, or the front-month book rows of each session of DBN files (the plan and
segment books of ``alphafeat precompute``: :func:`alphafeat.plan.make_plan`,
:func:`alphafeat.precompute.books.build_book`; ``--roll-rule`` applies). Rows: CPU with ``--jobs`` threads over
exact chunks of each session (best of 2, after one untimed pass); CPU one core on up to
0.5 M rows; CUDA float64 results from
ordinary (pageable) input and float32 results, the sessions streamed
(``compute_features_cuda_many(books, p, dtype=...)``), both also with the input columns already in
page-locked memory (``alphafeat.cuda.pinned_empty``, no staging copy) (best of 3, after one
untimed full-size call); beside them the copy ceilings of the machine; numpy/pandas on ``--pandas-rows`` rows.

``--input ... --stream`` (a set larger than memory, e.g. a quarter: 63 sessions, ~280 M
front-month rows), ``--batch`` sessions at a time:

- *front-month schedule* (not a rate): the plan of ``alphafeat precompute``
  (:func:`alphafeat.plan.make_plan`, scans in ``--jobs`` processes), once over all sessions
  before the batches: candidates from the book files' metadata mappings, volumes from the
  trades files (book files are read only when the metadata cannot answer, e.g. the volume rule
  without trades files), :func:`alphafeat.instruments.front_month_schedule` (volume rule: most
  volume in the previous session; calendar rule for the first session). One segment per
  session: the chosen instrument and the files holding the session.
- *build books -> scratch* (untimed in the rates, its time printed): ``--build-jobs`` joblib
  processes, one per segment, :func:`alphafeat.precompute.books.build_book`: the chosen instrument's
  records decoded (filtered while decoding), its book read (MBP, chunk by chunk) or rebuilt
  (MBO) with the trade flow of the trades files, cut to the CME session -- the same columns
  ``load_sessions`` gives -- and the 8
  columns the features read saved as .npy in a scratch directory (/dev/shm when it has room).
  Saving and memory-mapping beats returning the arrays: the CPU workers and the parent read
  them without a pickle round trip. The parent never holds more than one batch (one session
  at a time); each batch's files are deleted after use.
- *CPU njit, N procs x 1 session (wall)*: ``--jobs`` joblib (loky) processes (warmed up
  untimed), one task per session of the batch; each memory-maps its book, runs
  ``compute_features(book, p)`` (sequential fused path, one core) and returns only a NaN count
  and a checksum. Seconds: the wall time of the batches (the slowest session of each batch
  sets it), summed; per core: rows / wall / ``--jobs``. *in those procs*: the seconds inside
  the workers (map + compute), summed; rows / those seconds = the rate of one core under full
  load.
- *CPU njit, N threads chunked, 1st/batch*: in the parent, ``compute_features(book, p,
  n_chunks=jobs, n_jobs=jobs)`` on the first session of each batch (its result is the CPU
  float64 reference for the CUDA check). *1 core, 1st session*: ``compute_features(book, p)``
  in the parent on the whole first session. CPU times include allocating the 69 result columns.
- *CUDA float64 / float32* (in the parent, the batch streamed): the float columns of the
  batch's books copied into one pinned arena (the layout ``alphafeat.book.to_book_arrays(...,
  buffer=pinned_buffer)`` writes; untimed, since the pipeline builds the book there directly;
  ``ts_recv`` stays in ordinary memory as there), then the whole batch through
  ``compute_features_cuda_many(books, p, dtype="float64")`` and ``dtype="float32"`` (each
  session submitted before the previous one's results are back, so copies in, kernels and
  copies out of neighbouring sessions overlap), each timed once, host columns to host results
  (transfers included). Device buffers and the three pinned result matrices are grown to the
  batch's largest session by an untimed pass first. The float64 results of the first session
  of each batch (an untimed call) are compared with the CPU's (``cuda_vs_cpu_max_rel``: the
  largest ``|g - r| / max(|r|, 1)``; ``cuda_vs_cpu_nan_mismatches``).
- *numpy/pandas vectorised, 1 core* (:func:`pandas_features`): the first
  ``min(rows, --pandas-rows)`` rows of the first session of each batch; ``pandas_rows`` says
  how many in all.

Progress goes to stderr after each batch, and the partial result to ``--json-out`` (so a run
stopped at a time limit still leaves numbers; ``complete`` says whether every session was
done). ``--deadline S`` starts no batch that would end past S seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alphafeat.devices import compute_features  # noqa: E402
from alphafeat.features import FeatureParams, cuda_available  # noqa: E402
from alphafeat.features.registry import frac_diff_weights  # noqa: E402
from alphafeat.types import LEVELS, BookArrays  # noqa: E402


def load_sessions(inputs: list, root: str = "ES", jobs: int = 1, rule: str = "volume") -> list[BookArrays]:
    """Front-month book rows of every session of the DBN files (or directories) ``inputs``, as
    ``alphafeat precompute`` makes them: the plan (:func:`alphafeat.plan.make_plan`: roll
    schedule and one segment per session, ``jobs`` processes for its scans), then each
    segment's book (:func:`alphafeat.precompute.books.build_book`: the chosen instrument's records of
    that session, MBP read or MBO rebuilt, trades from the trades files, else from the book
    stream)."""
    from alphafeat.plan import make_plan
    from alphafeat.precompute.books import build_book

    plan = make_plan(inputs, root=root, roll_rule=rule, jobs=jobs)
    books = [b for b in (build_book(seg)[0] for seg in plan.segments) if len(b)]
    if not books:
        raise SystemExit(f"no front-month book rows of {root} in {inputs}")
    return books


# ---- --input DIR --stream: a quarter of sessions, in batches ------------------------------------

#: The book columns the features read (``alphafeat.features._prepare``); only these go to scratch.
BOOK_COLS = ("ts_recv", "bid_px", "ask_px", "bid_sz", "ask_sz", "buy_volume", "sell_volume", "trade_count")
#: Pinned-buffer layout of the float columns (as ``alphafeat.book.to_book_arrays(..., buffer=...)``).
_PIN_COLS = BOOK_COLS[1:]


def _save_book(b: BookArrays, d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for k in BOOK_COLS:
        np.save(d / f"{k}.npy", np.ascontiguousarray(getattr(b, k)))
    (d / "depth").write_text(str(int(b.depth)))


def load_book(d: str | Path, mmap: bool = True) -> BookArrays:
    """A book saved by :func:`_save_book` (memory-mapped, copy-on-write); ``ts_event`` is
    ``ts_recv`` and the order counts are zero views: the features read neither."""
    d = Path(d)
    c = {k: np.load(d / f"{k}.npy", mmap_mode="c" if mmap else None) for k in BOOK_COLS}
    zero = np.broadcast_to(np.zeros(1), c["bid_px"].shape)
    return BookArrays(c["ts_recv"], c["ts_recv"], c["bid_px"], c["ask_px"], c["bid_sz"], c["ask_sz"], zero, zero,
                      c["buy_volume"], c["sell_volume"], c["trade_count"], int((d / "depth").read_text()))  # fmt: skip


def _build_segment(seg, out: str, max_rows: int | None) -> dict:
    """Worker: the book of one segment (:func:`alphafeat.precompute.books.build_book`: only the chosen
    instrument's records of the session's files decoded, MBP rows built chunk by chunk, MBO
    rebuilt; trades from the trades files, else from the book stream) saved as .npy under
    ``out`` (the first ``max_rows`` rows when given). Returns ``{"session", "rows", "dir",
    "build_s"}``."""
    from alphafeat.precompute.books import build_book

    t0 = time.perf_counter()
    sub = Path(out) / f"{seg.session}-{seg.instrument_id}"
    b, _, _ = build_book(seg)
    if max_rows and len(b) > max_rows:
        b = head(b, max_rows)
    if len(b):
        _save_book(b, sub)
    return {"session": str(seg.session), "rows": len(b), "dir": str(sub), "build_s": time.perf_counter() - t0}


def _cpu_task(d: str, p: FeatureParams) -> dict:
    """Worker: features of one saved session on this core (sequential fused path); returns
    only the row count, the NaN count of the 69 columns, a checksum and the times."""
    t0 = time.perf_counter()
    b = load_book(d)
    f = compute_features(b, p)
    t1 = time.perf_counter()
    nan = sum(int(np.count_nonzero(np.isnan(v))) for v in f.values())
    chk = float(sum(np.nansum(v[-64:]) for v in f.values()))
    return {"rows": len(b), "compute_s": t1 - t0, "check_s": time.perf_counter() - t1, "nan": nan, "checksum": chk}


def _warm_worker(p: FeatureParams) -> int:
    """Worker: load the compiled kernels (numba's cache) before a timed batch."""
    compute_features(make_book(2000, 1), p)
    time.sleep(0.3)  # so that each worker of the pool takes one of these tasks
    return os.getpid()


def _pinned_copies(books: list[BookArrays], threads: int = 8) -> list[BookArrays]:
    """``books`` with their float columns copied into one pinned arena (64-byte aligned pieces,
    the layout ``to_book_arrays(..., buffer=pinned_buffer)`` writes for one session) and
    ``ts_recv`` in ordinary memory, as the pipeline hands a session to the GPU. The arena is
    kept for the next batch (grown when too small)."""
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    from alphafeat.cuda.kernels import pinned_empty

    sizes = [[-(-getattr(b, k).nbytes // 64) * 64 for k in _PIN_COLS] for b in books]
    total = sum(map(sum, sizes))
    if _ARENA and _ARENA[0].nbytes < total:
        _ARENA.clear()
    if not _ARENA:
        _ARENA.append(pinned_empty(total, np.uint8))
    flat = _ARENA[0]
    out, jobs, a = [], [], 0
    for b, sz in zip(books, sizes, strict=True):
        dst = {}
        for k, nb in zip(_PIN_COLS, sz, strict=True):
            v = getattr(b, k)
            dst[k] = flat[a : a + v.nbytes].view(np.float64).reshape(v.shape)
            a += nb
            n = len(v)
            jobs += [(dst[k][n * i // threads : n * (i + 1) // threads], v[n * i // threads : n * (i + 1) // threads])
                     for i in range(threads)]  # fmt: skip
        ts = np.array(b.ts_recv)
        out.append(dataclasses.replace(b, ts_recv=ts, ts_event=ts, **dst))
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda ab: np.copyto(*ab), jobs))
    return out


#: The pinned arena of :func:`_pinned_copies` (one flat uint8 buffer).
_ARENA: list[np.ndarray] = []


def _scratch_root(segments: list, batch: int, want: str | None) -> str:
    """``want``, else /dev/shm when it can hold a batch of books (about 12x the compressed book
    files of the largest batch, a file shared by several sessions counted in equal shares), else
    the temp directory."""
    import shutil
    import tempfile

    if want:
        return want
    refs: dict[str, int] = {}
    for seg in segments:
        for f in seg.book_files:
            refs[f] = refs.get(f, 0) + 1
    sizes = [sum(os.path.getsize(f) / refs[f] for f in seg.book_files) for seg in segments]
    need = 1.5 * 12 * max(sum(sizes[i : i + batch]) for i in range(0, max(len(sizes), 1), batch))
    if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > need:
        return "/dev/shm"
    return tempfile.gettempdir()


def _rates(res: dict) -> None:
    """Fill the derived seconds / rates of ``res`` from its accumulators (in place)."""
    r = lambda x, k=3: round(x, k)  # noqa: E731
    acc = res["_acc"]
    for key in ("build", "cpu", "cpu_threads", "cpu_1core", "cuda", "cuda_f32", "pandas"):
        sec, rows = acc.get(f"{key}_s", 0.0), acc.get(f"{key}_rows", 0)
        if sec and rows:
            res[f"{key}_s"] = r(sec)
            res[f"{key}_rows"] = rows
            res[f"{key}_Msnap_s"] = r(rows / sec / 1e6)
    if acc.get("cpu_s"):
        res["cpu_Msnap_s_per_core"] = r(acc["cpu_rows"] / acc["cpu_s"] / 1e6 / res["jobs"])
        res["cpu_worker_compute_s"] = r(acc["cpu_worker_s"])
        res["cpu_worker_Msnap_s"] = r(acc["cpu_rows"] / acc["cpu_worker_s"] / 1e6)
        res["cpu_worker_check_s"] = r(acc["cpu_check_s"])
    for k in ("pin_copy_s", "cuda_warm_s", "schedule_s"):
        if k in acc:
            res[k] = r(acc[k])
    res["elapsed_s"] = r(time.perf_counter() - acc["t0"], 1)


def _public(res: dict) -> dict:
    return {k: v for k, v in res.items() if not k.startswith("_")}


def _write_json(path: str | None, res: dict) -> None:
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(_public(res), fh, indent=1, default=str)
        os.replace(tmp, path)


def stream_bench(
    inputs: list[str], p: FeatureParams, root: str, jobs: int, cuda: bool, *, batch: int = 16,
    build_jobs: int | None = None, scratch: str | None = None, rule: str = "volume", json_out: str | None = None,
    pandas: bool = True, pandas_rows: int = 2_000_000, deadline: float | None = None, max_rows: int | None = None,
) -> dict:  # fmt: skip
    """A data set larger than memory (e.g. a quarter of generated sessions), ``batch`` sessions
    at a time; see the module docstring for what each row measures. Progress to stderr after
    each batch; the partial result to ``json_out`` after each batch. ``deadline`` (seconds
    since the start): no batch is started that would end past it (the result says
    ``complete: false``)."""
    import shutil
    import signal
    import tempfile

    import joblib

    from alphafeat.plan import make_plan

    t_start = time.perf_counter()
    build_jobs = build_jobs or jobs
    plan = make_plan(inputs, root=root, roll_rule=rule, jobs=jobs)  # the loky pool of the later stages
    segments = plan.segments
    res: dict = {"_acc": {"t0": t_start}, "input": inputs, "cores": os.cpu_count(), "jobs": jobs,
                 "build_jobs": build_jobs, "batch": batch, "sessions_total": len(segments), "sessions": 0, "rows": 0,
                 "rows_per_session_max": 0, "batches": 0, "complete": False, "cuda_vs_cpu_max_rel": 0.0,
                 "cuda_vs_cpu_nan_mismatches": 0, "cuda_vs_cpu_rows": 0, "cpu_workers_nan": 0,
                 "cpu_workers_checksum": 0.0}  # fmt: skip
    acc = res["_acc"]
    if max_rows:
        res["max_rows_per_session"] = max_rows
    acc["schedule_s"] = time.perf_counter() - t_start
    how = f"{rule}, alphafeat.plan.make_plan ({plan.scanned} book file(s) scanned)"
    res["roll_rule"] = how
    res["schedule"] = {str(c.session): c.raw_symbol for c in plan.schedule}
    if plan.notes:
        res["plan_notes"] = plan.notes
    scratch_root = _scratch_root(segments, batch, scratch)
    work = Path(tempfile.mkdtemp(prefix="alphafeat-bench-", dir=scratch_root))
    res["scratch"] = str(work)
    log = lambda msg: print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    log(f"{len(segments)} sessions, schedule ({how}) in {acc['schedule_s']:.1f}s, scratch {work}")
    _rates(res)
    _write_json(json_out, res)

    def on_term(*_):
        raise SystemExit(143)  # so that the scratch directory is removed (finally below)

    prev_term = signal.signal(signal.SIGTERM, on_term)
    cuda_many = None
    try:
        if cuda:
            from alphafeat.cuda import compute_features_cuda_many as cuda_many

            compute_features(make_book(5000, 1), p, device="cuda")  # compile / load the kernels
        compute_features(make_book(5000, 1), p)  # fills numba's cache for the workers too
        compute_features(make_book(5000, 1), p, n_chunks=jobs, n_jobs=jobs)
        warmed = 0  # rows the CUDA pools (device buffers, pinned results) were sized for
        last_batch_s = 0.0
        for bi in range(0, len(segments), batch):
            if deadline and bi and time.perf_counter() - t_start + 1.15 * last_batch_s > deadline:
                log(f"deadline {deadline:.0f}s: stopping before batch {bi // batch + 1}")
                break
            tb = time.perf_counter()
            part = segments[bi : bi + batch]
            bdir = work / f"b{bi // batch}"
            # 1. build the batch's books in processes (untimed in the rates)
            t0 = time.perf_counter()
            built = joblib.Parallel(n_jobs=build_jobs)(
                joblib.delayed(_build_segment)(seg, str(bdir), max_rows) for seg in part
            )
            t_build = time.perf_counter() - t0
            sess = [s for s in built if s["rows"]]
            n_rows = sum(s["rows"] for s in sess)
            acc["build_s"] = acc.get("build_s", 0.0) + t_build
            acc["build_rows"] = acc.get("build_rows", 0) + n_rows
            if not sess:
                shutil.rmtree(bdir, ignore_errors=True)
                res["batches"] += 1
                continue
            # 2. CPU, all cores: one process per session, sequential fused path each (timed)
            for _ in range(5):  # every worker of the pool warm (a resized pool starts new ones)
                pids = joblib.Parallel(n_jobs=jobs)(joblib.delayed(_warm_worker)(p) for _ in range(2 * jobs))
                if len(set(pids)) >= jobs:
                    break
            t0 = time.perf_counter()
            outs = joblib.Parallel(n_jobs=jobs)(joblib.delayed(_cpu_task)(s["dir"], p) for s in sess)
            t_cpu = time.perf_counter() - t0
            acc["cpu_s"] = acc.get("cpu_s", 0.0) + t_cpu
            acc["cpu_rows"] = acc.get("cpu_rows", 0) + sum(o["rows"] for o in outs)
            acc["cpu_worker_s"] = acc.get("cpu_worker_s", 0.0) + sum(o["compute_s"] for o in outs)
            acc["cpu_check_s"] = acc.get("cpu_check_s", 0.0) + sum(o["check_s"] for o in outs)
            res["cpu_workers_nan"] += sum(o["nan"] for o in outs)
            res["cpu_workers_checksum"] += sum(o["checksum"] for o in outs)
            # the batch's first session in this process: threads (chunked), 1 core, pandas
            first = load_book(sess[0]["dir"])
            nf = len(first)
            if bi == 0:
                t0 = time.perf_counter()
                compute_features(first, p)
                acc["cpu_1core_s"], acc["cpu_1core_rows"] = time.perf_counter() - t0, nf
            t0 = time.perf_counter()
            ref = compute_features(first, p, n_chunks=jobs, n_jobs=jobs)
            acc["cpu_threads_s"] = acc.get("cpu_threads_s", 0.0) + time.perf_counter() - t0
            acc["cpu_threads_rows"] = acc.get("cpu_threads_rows", 0) + nf
            if pandas:
                bpd = head(first, min(nf, pandas_rows))
                t0 = time.perf_counter()
                with np.errstate(all="ignore"):
                    pandas_features(bpd, p)
                acc["pandas_s"] = acc.get("pandas_s", 0.0) + time.perf_counter() - t0
                acc["pandas_rows"] = acc.get("pandas_rows", 0) + len(bpd)
                del bpd
            # 3. CUDA in this process: the batch's books in a pinned arena (untimed), then streamed
            # through the device with float64 and with float32 results (timed, transfers
            # included); the first session checked against ref
            t_cuda = 0.0
            if cuda_many is not None:
                t0 = time.perf_counter()
                pins = _pinned_copies([first] + [load_book(s["dir"]) for s in sess[1:]])
                acc["pin_copy_s"] = acc.get("pin_copy_s", 0.0) + time.perf_counter() - t0
                big = max(sess, key=lambda s: s["rows"])
                if big["rows"] > warmed:  # grow the pools (device, 3 pinned results) once, untimed
                    t0 = time.perf_counter()
                    b = pins[sess.index(big)]
                    for dtype in ("float64", "float32"):
                        for _ in cuda_many([b, b, b], p, dtype=dtype):
                            pass
                    warmed = big["rows"]
                    acc["cuda_warm_s"] = acc.get("cuda_warm_s", 0.0) + time.perf_counter() - t0
                got = next(cuda_many(pins[:1], p))  # the check, untimed
                w, nd = _max_rel(got, ref)
                res["cuda_vs_cpu_max_rel"] = max(res["cuda_vs_cpu_max_rel"], w)
                res["cuda_vs_cpu_nan_mismatches"] += nd
                res["cuda_vs_cpu_rows"] += len(pins[0])
                del got
                n_pinned = sum(len(b) for b in pins)
                for key, dtype in (("cuda", "float64"), ("cuda_f32", "float32")):
                    t0 = time.perf_counter()
                    for got in cuda_many(pins, p, dtype=dtype):
                        del got
                    dt_ = time.perf_counter() - t0
                    t_cuda += dt_
                    acc[f"{key}_s"] = acc.get(f"{key}_s", 0.0) + dt_
                    acc[f"{key}_rows"] = acc.get(f"{key}_rows", 0) + n_pinned
                del pins
            del ref, first
            shutil.rmtree(bdir, ignore_errors=True)
            res["sessions"] += len(sess)
            res["rows"] += n_rows
            res["rows_per_session_max"] = max(res["rows_per_session_max"], *(s["rows"] for s in sess))
            res["batches"] += 1
            last_batch_s = time.perf_counter() - tb
            _rates(res)
            _write_json(json_out, res)
            log(f"batch {bi // batch + 1}/{-(-len(segments) // batch)}: {part[0].session}..{part[-1].session} "
                f"{len(sess)} sessions "
                f"{n_rows:,} rows | build {t_build:.1f}s | CPU {jobs} procs {t_cpu:.2f}s "
                f"({n_rows / t_cpu / 1e6:.1f} M/s) | CUDA f64+f32 {t_cuda:.2f}s "
                f"| batch {last_batch_s:.1f}s")  # fmt: skip
        res["complete"] = res["sessions"] > 0 and res["batches"] == -(-len(segments) // batch)
    finally:
        signal.signal(signal.SIGTERM, prev_term)
        shutil.rmtree(work, ignore_errors=True)
    _rates(res)
    _write_json(json_out, res)
    return res


STREAM_ROWS = (
    ("front-month schedule, all sessions (untimed)", "schedule"),
    ("build books -> scratch, {bj} procs (untimed)", "build"),
    ("CUDA float64 (pinned book, transfers incl.)", "cuda"),
    ("CUDA float32 results", "cuda_f32"),
    ("CPU njit, {j} procs x 1 session (wall)", "cpu"),
    ("CPU njit, in those procs (sum of seconds)", "cpu_worker"),
    ("CPU njit, {j} threads chunked, 1st/batch", "cpu_threads"),
    ("CPU njit, 1 core, 1st session", "cpu_1core"),
    ("numpy/pandas vectorised, 1 core", "pandas"),
)


def print_stream_table(res: dict) -> None:
    """The table of :func:`stream_bench`'s result."""
    print(f"{'path':46s} {'rows':>12s} {'seconds':>9s} {'M snapshots/s':>14s} {'per core':>9s}")
    for label, key in STREAM_ROWS:
        label = label.format(j=res["jobs"], bj=res["build_jobs"])
        if key == "schedule":
            print(f"{label:46s} {'':>12s} {res.get('schedule_s', float('nan')):9.2f} {'(not a rate)':>14s}")
            continue
        if key == "cpu_worker":
            if "cpu_worker_compute_s" in res:
                print(f"{label:46s} {res['cpu_rows']:12,d} {res['cpu_worker_compute_s']:9.2f} "
                      f"{'':>14s} {res['cpu_worker_Msnap_s']:9.3f}")  # fmt: skip
            continue
        if f"{key}_Msnap_s" not in res:
            continue
        cores = {"cpu": res["jobs"], "cpu_threads": res["jobs"], "cpu_1core": 1, "pandas": 1}.get(key)
        per = f"{res[key + '_Msnap_s'] / cores:9.3f}" if cores else ""
        print(f"{label:46s} {res[key + '_rows']:12,d} {res[key + '_s']:9.2f} {res[key + '_Msnap_s']:14.2f} {per}")


def head(b: BookArrays, n: int) -> BookArrays:
    """The first ``n`` rows of ``b``."""
    import dataclasses

    return dataclasses.replace(b, **{f.name: getattr(b, f.name)[:n] for f in dataclasses.fields(b)
                                     if isinstance(getattr(b, f.name), np.ndarray)})  # fmt: skip


def make_book(n: int, seed: int = 0) -> BookArrays:
    """Random-walk book: mid in ticks, spread 1-3 ticks, sizes 1-200, ~0.2 s mean step."""
    rng = np.random.default_rng(seed)
    mid = 18000 * 4 + np.cumsum(rng.integers(-1, 2, n, dtype=np.int64))
    spread = rng.integers(1, 4, n)
    lv = np.arange(LEVELS)
    bid_px = (mid[:, None] - lv) * 0.25
    ask_px = (mid + spread)[:, None] * 0.25 + lv * 0.25
    bid_sz = rng.integers(1, 200, (n, LEVELS)).astype(np.float64)
    ask_sz = rng.integers(1, 200, (n, LEVELS)).astype(np.float64)
    ts = 1_709_700_000 * 10**9 + np.cumsum(rng.exponential(2e8, n).astype(np.int64))
    trades = rng.random(n) < 0.2
    buy = np.where(trades & (rng.random(n) < 0.5), rng.integers(1, 20, n), 0).astype(np.float64)
    sell = np.where(trades & (buy == 0), rng.integers(1, 20, n), 0).astype(np.float64)
    cnt = (buy > 0).astype(np.float64) + (sell > 0)
    return BookArrays(ts, ts, bid_px, ask_px, bid_sz, ask_sz, np.ones((n, LEVELS)), np.ones((n, LEVELS)),
                      buy, sell, cnt)  # fmt: skip


def pandas_features(b: BookArrays, p: FeatureParams) -> dict[str, np.ndarray]:
    """The same feature families written with numpy / pandas vectorised operations
    (pandas ``ewm(times=...)`` for the EMAs, np.convolve for fractional differencing)."""
    f: dict[str, np.ndarray] = {}
    pb, pa, qb, qa = b.bid_px, b.ask_px, b.bid_sz, b.ask_sz
    mid = 0.5 * (pb[:, 0] + pa[:, 0])
    f["mid"] = mid
    f["spread_ticks"] = (pa[:, 0] - pb[:, 0]) / p.tick_size
    w = qb[:, 0] / (qb[:, 0] + qa[:, 0])
    f["microprice"] = w * pa[:, 0] + (1 - w) * pb[:, 0]
    f["imbalance_l1"] = (qb[:, 0] - qa[:, 0]) / (qb[:, 0] + qa[:, 0])
    f["imbalance_l10"] = (qb.sum(1) - qa.sum(1)) / (qb.sum(1) + qa.sum(1))
    pb0, pa0, qb0, qa0 = (np.vstack([x[:1], x[:-1]]) for x in (pb, pa, qb, qa))
    e = (pb >= pb0) * qb - (pb <= pb0) * qb0 - (pa <= pa0) * qa + (pa >= pa0) * qa0
    for m in range(p.ofi_levels):
        f[f"ofi_l{m + 1:02d}"] = e[:, m]
    f["ofi_integrated"] = e.sum(1) / ((qb + qa + qb0 + qa0).sum(1) / (4 * LEVELS))
    ld_b, ld_a = np.log1p(qb), np.log1p(qa)
    for m in range(p.depth_levels):
        f[f"log_depth_bid_l{m + 1:02d}"] = ld_b[:, m]
        f[f"log_depth_ask_l{m + 1:02d}"] = ld_a[:, m]
    wd = np.exp(-p.depth_weight_decay * np.arange(LEVELS))
    f["imbalance_weighted"] = ((qb - qa) @ wd) / ((qb + qa) @ wd)
    f["book_slope_bid"] = qb.sum(1) / (1 + (pb[:, 0] - pb[:, -1]) / p.tick_size)
    f["book_slope_ask"] = qa.sum(1) / (1 + (pa[:, -1] - pa[:, 0]) / p.tick_size)
    sv = b.buy_volume - b.sell_volume
    f["signed_volume"] = sv
    vol = b.buy_volume + b.sell_volume
    f["aggressor_imbalance"] = np.divide(sv, vol, out=np.zeros_like(sv), where=vol > 0)
    f["log1p_trade_count"] = np.log1p(b.trade_count)
    dt = np.diff(b.ts_recv, prepend=b.ts_recv[0]) / 1e9
    f["log_dt"] = np.log(np.maximum(dt, 1e-9))
    ret = np.diff(mid, prepend=np.nan) / p.tick_size
    f["tick_return"] = ret
    times = pd.to_datetime(b.ts_recv)
    s_mid, s_r2, s_sp = pd.Series(mid), pd.Series(ret * ret), pd.Series(f["spread_ticks"])
    s_lsp = pd.Series(np.log(f["spread_ticks"]))
    for tau in p.ema_taus_s:
        hl = pd.Timedelta(seconds=tau * np.log(2))
        f[f"ema_mid_{tau:g}s"] = s_mid.ewm(halflife=hl, times=times).mean().to_numpy()
        f[f"ema_ret2_{tau:g}s"] = s_r2.ewm(halflife=hl, times=times).mean().to_numpy()
        f[f"ema_spread_{tau:g}s"] = s_sp.ewm(halflife=hl, times=times).mean().to_numpy()
        f[f"ema_log_spread_{tau:g}s"] = s_lsp.ewm(halflife=hl, times=times).mean().to_numpy()
    tsec = (b.ts_recv - b.ts_recv[0]) / 1e9

    def decayed(x: np.ndarray, tau: float) -> np.ndarray:
        # sum_j exp(-(t_i - t_j)/tau) x_j, vectorised by rescaling; blocks of at most 600 tau
        # seconds keep exp in range (a session break or quiet hour would overflow a fixed row count)
        out = np.empty_like(x)
        carry, t_prev, lo = 0.0, tsec[0], 0
        while lo < len(x):
            hi = max(lo + 1, int(np.searchsorted(tsec, tsec[lo] + 600.0 * tau, side="right")))
            t = tsec[lo:hi]
            g = np.exp((t - t[0]) / tau)
            c = np.cumsum(x[lo:hi] * g) / g + carry * np.exp(-(t - t_prev) / tau)
            out[lo:hi] = c
            carry, t_prev, lo = c[-1], t[-1], hi
        return out

    for tau in p.ema_taus_s:
        lam = decayed(b.trade_count / tau, tau)
        f[f"trade_rate_{tau:g}s"] = lam
        f[f"log_trade_rate_{tau:g}s"] = np.log1p(lam)
    f["hawkes_buy"] = p.hawkes_mu + p.hawkes_alpha * decayed((b.buy_volume > 0) * 1.0, 1 / p.hawkes_beta)
    f["hawkes_sell"] = p.hawkes_mu + p.hawkes_alpha * decayed((b.sell_volume > 0) * 1.0, 1 / p.hawkes_beta)
    prop = decayed(sv, p.propagator_tau_s)
    f["propagator_flow"] = prop
    r2 = np.nan_to_num(ret * ret)
    var = {tau: decayed(r2 / tau, tau) for tau in p.vol_taus_s}
    for tau in p.vol_taus_s:
        f[f"realized_vol_{tau:g}s"] = np.sqrt(var[tau])
    ema = {tau: s_mid.ewm(halflife=pd.Timedelta(seconds=tau * np.log(2)), times=times).mean().to_numpy()
           for tau in p.vol_taus_s}  # fmt: skip
    for tau in p.vol_taus_s[1:]:
        f[f"mid_z_{tau:g}s"] = (mid - ema[tau]) / p.tick_size / np.sqrt(var[tau] * tau)
    tf, _, ts_ = p.vol_taus_s
    f["trend"] = (ema[tf] - ema[ts_]) / p.tick_size / np.sqrt(var[ts_] * ts_)
    wfd = frac_diff_weights(p.fracdiff_d, threshold=p.fracdiff_threshold)
    fd = np.convolve(np.log(mid), wfd, mode="full")[: len(mid)]
    fd[: len(wfd) - 1] = np.nan
    f["fracdiff_log_mid"] = fd
    f["slog_ofi_l01"] = np.sign(e[:, 0]) * np.log1p(np.abs(e[:, 0]))
    f["slog_signed_volume"] = np.sign(sv) * np.log1p(np.abs(sv))
    f["slog_propagator_flow"] = np.sign(prop) * np.log1p(np.abs(prop))
    return f


def _time(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _max_rel(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> tuple[float, int]:
    """Largest ``|g - r| / max(|r|, 1)`` over finite pairs, and the count of NaN mismatches."""
    worst, nan_diff = 0.0, 0
    for k, r in ref.items():
        g = got[k]
        nan_diff += int(np.count_nonzero(np.isnan(g) != np.isnan(r)))
        with np.errstate(invalid="ignore"):
            d = np.abs(g - r) / np.maximum(np.abs(r), 1.0)
        d = d[np.isfinite(d)]
        if d.size:
            worst = max(worst, float(d.max()))
    return worst, nan_diff


def cuda_bench(books: list[BookArrays], p: FeatureParams, cpu_ref: list[dict[str, np.ndarray]]) -> dict:
    """CUDA rows (float64 / float32 results, pageable / pinned input), the check against the
    CPU results and the copy ceilings of this machine."""
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    from numba import cuda

    from alphafeat.cuda import compute_features_cuda, compute_features_cuda_many, kernels, pinned_empty
    from alphafeat.features import _prepare
    from alphafeat.features.registry import make_plan

    res: dict = {}
    n = sum(len(b) for b in books)
    compute_features(make_book(5000, 1), p, device="cuda")  # compile / load the kernels

    def timed(key: str, bs: list[BookArrays], dtype: str) -> None:
        def run() -> None:  # the sessions streamed (compute_features_cuda_many)
            for got in compute_features_cuda_many(bs, p, dtype=dtype):
                del got

        run()  # first full-size pass: pinned pools, device buffers
        t = _time(run, repeat=3)
        res[f"{key}_s"] = round(t, 3)
        res[f"{key}_Msnap_s"] = round(n / t / 1e6, 2)

    timed("cuda", books, "float64")
    timed("cuda_f32", books, "float32")
    worst, nan_diff = 0.0, 0
    for b, ref in zip(books, cpu_ref, strict=True):  # every row, float64
        w, nd = _max_rel(compute_features_cuda(b, p), ref)
        worst, nan_diff = max(worst, w), nan_diff + nd
    res["cuda_vs_cpu_max_rel"] = worst
    res["cuda_vs_cpu_nan_mismatches"] = nan_diff
    # the same with the input columns already in page-locked memory (no staging copy)
    read = ("ts_recv", "bid_px", "ask_px", "bid_sz", "ask_sz", "buy_volume", "sell_volume", "trade_count")
    pinned = []
    for b in books:
        kw = {}
        for k in read:
            v = getattr(b, k)
            kw[k] = pinned_empty(v.shape, v.dtype)
            kw[k][...] = v
        pinned.append(dataclasses.replace(b, **kw))
    timed("cuda_pinned", pinned, "float64")
    timed("cuda_pinned_f32", pinned, "float32")
    del pinned
    # (the time of each stage alone is not measured: benchmarks time public functions only; the
    # copy ceilings below bound the stages that move data)
    book = max(books, key=len)
    nb = len(book)
    # copy ceilings: pinned DMA each way and both at once, host copy into pinned memory
    cols = _prepare(book, p)
    nin = sum(v.nbytes for v in cols.values())
    nout = 8 * make_plan(p).n_out * nb
    pin_in, pin_out = pinned_empty(nin, np.uint8), pinned_empty(nout, np.uint8)
    dev_in, dev_out = cuda.device_array(nin, dtype=np.uint8), cuda.device_array(nout, dtype=np.uint8)
    s1, s2 = cuda.stream(), cuda.stream()

    def sync(*ss):
        for s in ss:
            s.synchronize()

    t_h2d = _time(lambda: (dev_in.copy_to_device(pin_in, stream=s1), sync(s1)), repeat=2)
    t_d2h = _time(lambda: (dev_out.copy_to_host(pin_out, stream=s2), sync(s2)), repeat=2)
    t_both = _time(lambda: (dev_in.copy_to_device(pin_in, stream=s1), dev_out.copy_to_host(pin_out, stream=s2),
                            sync(s1, s2)), repeat=2)  # fmt: skip
    src = cols["bid_px"].reshape(-1).view(np.uint8)
    th = kernels.COPY_THREADS
    with ThreadPoolExecutor(th) as ex:
        parts = [(src.nbytes * i // th, src.nbytes * (i + 1) // th) for i in range(th)]
        t_cp = _time(lambda: list(ex.map(lambda ab: np.copyto(pin_in[ab[0] : ab[1]], src[ab[0] : ab[1]]), parts)),
                     repeat=2)  # fmt: skip
    res.update(
        bytes_per_row_in=int(nin / nb),
        bytes_per_row_out=int(nout / nb),
        h2d_pinned_GBs=round(nin / t_h2d / 1e9, 1),
        d2h_pinned_GBs=round(nout / t_d2h / 1e9, 1),
        both_ways_GBs=round((nin + nout) / t_both / 1e9, 1),
        host_copy_GBs=round(src.nbytes / t_cp / 1e9, 1),
        d2h_bound_Msnap_s=round(nb / t_d2h / 1e6, 1),
        d2h_bound_f32_Msnap_s=round(2 * nb / t_d2h / 1e6, 1),
    )
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--skip-cuda", action="store_true")
    ap.add_argument("--skip-pandas", action="store_true")
    ap.add_argument("--pandas-rows", type=int, default=2_000_000, help="rows for the pandas version")
    ap.add_argument(
        "--input",
        nargs="+",
        metavar="DIR_OR_FILES",
        help="DBN files or directories: the front-month book rows of each session (instead of --rows)",
    )
    ap.add_argument("--root", default="ES", help="product root of the front month (with --input)")
    ap.add_argument(
        "--stream", action="store_true",
        help="with --input: sessions in batches (sets larger than memory); see the module docstring",
    )  # fmt: skip
    ap.add_argument("--batch", type=int, default=16, help="--stream: sessions per batch (default 16)")
    ap.add_argument("--build-jobs", type=int, help="--stream: processes building the books (default --jobs)")
    ap.add_argument("--scratch", help="--stream: where the books go (default /dev/shm if it has room, else TMPDIR)")
    ap.add_argument("--roll-rule", choices=("volume", "calendar"), default="volume", help="front-month rule (--input)")
    ap.add_argument("--json-out", help="--stream: the (partial) result as JSON, rewritten after every batch")
    ap.add_argument("--deadline", type=float, help="--stream: start no batch that would end past this many seconds")
    ap.add_argument("--max-rows-per-session", type=int, help=argparse.SUPPRESS)  # smoke tests (CUDA simulator)
    args = ap.parse_args()
    p = FeatureParams()
    if args.stream:
        if not args.input:
            ap.error("--stream needs --input")
        res = stream_bench(
            args.input, p, args.root, args.jobs, cuda=not args.skip_cuda and cuda_available(), batch=args.batch,
            build_jobs=args.build_jobs, scratch=args.scratch, rule=args.roll_rule, json_out=args.json_out,
            pandas=not args.skip_pandas, pandas_rows=args.pandas_rows, deadline=args.deadline,
            max_rows=args.max_rows_per_session,
        )  # fmt: skip
        print_stream_table(res)
        print(json.dumps(_public(res), default=str))
        return 0
    t0 = time.perf_counter()
    books = load_sessions(args.input, args.root, args.jobs, args.roll_rule) if args.input else [make_book(args.rows)]
    t_gen = time.perf_counter() - t0
    n = sum(len(b) for b in books)
    book = max(books, key=len)
    small = make_book(5000, 1)
    res: dict = {"rows": n, "cores": os.cpu_count(), "jobs": args.jobs, "gen_s": round(t_gen, 2)}
    if args.input:
        res.update(input=args.input, sessions=len(books), rows_per_session_max=len(book))
    # warm-up compiles (and fills numba's cache for the worker processes)
    compute_features(small, p)
    compute_features(small, p, n_chunks=args.jobs, n_jobs=args.jobs)
    cpu_ref: list = []

    def cpu_all() -> None:
        cpu_ref[:] = [compute_features(b, p, n_chunks=args.jobs, n_jobs=args.jobs) for b in books]

    cpu_all()  # untimed full-size pass (first touch of the result matrices), as for CUDA
    t_cpu = _time(cpu_all, repeat=2)
    res["cpu_s"] = round(t_cpu, 3)
    res["cpu_Msnap_s"] = round(n / t_cpu / 1e6, 2)
    res["cpu_Msnap_s_per_core"] = round(n / t_cpu / 1e6 / args.jobs, 3)
    n1 = min(len(book), 500_000)
    b1 = head(book, n1) if args.input else make_book(n1, 2)
    t1 = _time(lambda: compute_features(b1, p), repeat=3)
    res["cpu_1core_s"] = round(t1, 3)
    res["cpu_1core_Msnap_s"] = round(n1 / t1 / 1e6, 3)
    res["cpu_1core_rows"] = n1
    if not args.skip_cuda and cuda_available():
        res.update(cuda_bench(books, p, cpu_ref))
    cpu_ref.clear()
    if not args.skip_pandas:
        npd = min(len(book), args.pandas_rows)
        bpd = head(book, npd) if args.input else make_book(npd, 3)
        t_pd = _time(lambda: pandas_features(bpd, p))
        res["pandas_rows"] = npd
        res["pandas_s"] = round(t_pd, 3)
        res["pandas_Msnap_s"] = round(npd / t_pd / 1e6, 2)
    rows = [("CUDA (transfers incl.)", "cuda"), ("CUDA, float32 results", "cuda_f32"),
            ("CUDA, input already pinned", "cuda_pinned"), ("CUDA, pinned in, float32 out", "cuda_pinned_f32"),
            (f"CPU njit, {args.jobs} thread{'s' * (args.jobs > 1)}, chunked", "cpu"),
            (f"CPU njit, 1 core, {n1:,} rows", "cpu_1core"), ("numpy/pandas vectorised, 1 core", "pandas")]  # fmt: skip
    print(f"{'path':32s} {'seconds':>9s} {'M snapshots/s':>14s}")
    for label, key in rows:
        if f"{key}_Msnap_s" in res:
            print(f"{label:32s} {res.get(key + '_s', float('nan')):9.3f} {res[key + '_Msnap_s']:14.2f}")
    sys.stdout.flush()
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
