"""``alphafeat precompute`` at scale: time, peak memory and cache size beside plain ``zstd -d``.

Every figure comes from running the public command line (``python -m alphafeat.cli
precompute``) in a fresh process, as a user would; peak memory is the largest sum of the
resident set sizes of the command and all its children, sampled every 20 ms with psutil; CPU
seconds are user + system time of the command and its children (``getrusage``). The command runs
with Python's default of writing bytecode (``PYTHONDONTWRITEBYTECODE`` is removed from its
environment, as a user's shell does not set it); the first, warm-up run writes it.

Rows (``--cases``, comma-separated; default all that the input allows):

* ``zstd``: ``zstd -d`` of the book files to /dev/null, one file, then all of them ``--jobs``
  at a time (``xargs -P``); the yardstick of the speed goals. Also ``zstd -d`` writing its output
  file (what the command does by default) into the scratch folder, the same file system as the
  cache, one file and ``--jobs`` at a time: writing costs what it costs the cache.
* ``cold1`` / ``coldN`` / ``coldN1``: one session, then every session with ``--jobs``, then every
  session with ``--jobs 1``, from scratch (no cache, nothing kept). ``--repeat K`` runs ``zstd``,
  ``cold1`` and ``coldN`` K times each, interleaved, and reports the median with min and max
  (hosts whose fresh memory is costly to touch vary run to run).
* ``warm``: after a run that kept its books (``--predecoded keep``), a rerun with other horizons
  (the partitions are relabelled: their features kept, labels recomputed), then one with
  other features (``warm_features``: the stored features kept, the added ones computed from the
  kept books); ``same``: a rerun with nothing changed. ``--repeat K`` runs each rerun K times,
  interleaved (horizons 50,500 and 60,600 in turn, so each relabels; features default,flow and
  default,ofi in turn, so each adds features), median reported; ``start`` is what each run
  pays before its work: python's start and the imports of a run. A first run without a cache
  fills numba's cache, so that no case measures the kernels' compilation.
* ``bytes``: bytes per row of the default cache, of ``--features all`` and of each compression.
* ``dask``: every session on a Dask LocalCluster of 1, then 2 workers.
* ``pandas``: what a user writes in an afternoon (``databento``'s ``to_df`` -> 12 pandas
  features and 5 labels -> Parquet) on the first session, one process.

Usage::

    python bench/precompute.py --input DIR [--jobs N] [--cases zstd,cold1,...] [--json-out F]
    python bench/precompute.py --generate 8 --scale full --input DIR   # writes DIR first

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
from alphafeat.cores import usable_cores  # noqa: E402  (the project, run from its checkout)

#: Options added to every precompute run (``--extra``).
EXTRA: list[str] = []
CASES = ("zstd", "cold1", "coldN", "coldN1", "warm", "same", "bytes", "dask", "pandas")


#: The environment of measured commands: Python writes (and so reuses) bytecode, as by default.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _adopt_orphans() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux ``PR_SET_CHILD_SUBREAPER``):
    worker processes a command leaves dying as it exits (:func:`alphafeat.commandline.end_process`) are then this
    process's children, waited for before the next case and counted in its CPU seconds."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap() -> float:
    """Wait for every child process (orphans adopted included); returns the seconds waited."""
    t0 = time.perf_counter()
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return time.perf_counter() - t0


def run_measured(cmd: list[str]) -> dict:
    """Run ``cmd``; wall seconds (until its process exits), CPU seconds of it and of its workers
    (reaped: ``reaped_s``, how long after its exit the last of them was gone; ~5 s after a run
    that replaced partitions, whose detached ``sleep`` frees their blocks: ``alphafeat.cache``)
    and the peak of the summed RSS of its process tree; every fifth sample also the summed PSS
    (``peak_pss_gb``: shared memory, such as the GPU hub's slots that a worker and the parent
    both map, counted once). Dirty pages of the case before (a cache, ``zstd -d``'s files) are
    written back first."""
    os.sync()
    c0 = _child_cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV, cwd=PROJECT)
    peak = [0, 0]
    done = threading.Event()

    def sample() -> None:
        p = psutil.Process(proc.pid)
        k = 0
        while not done.is_set():
            try:
                tree = [p, *p.children(recursive=True)]
                rss = pss = 0
                for q in tree:
                    try:
                        rss += q.memory_info().rss
                        pss += q.memory_full_info().pss if k % 5 == 0 else 0
                    except (psutil.Error, AttributeError):
                        pass
                peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
            except psutil.Error:
                return
            k += 1
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()  # its workers may hold the pipe a moment after it exits
    proc.wait()
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    reaped = _reap()
    reader.join()
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{out[0].decode()[-3000:]}")
    return {"seconds": round(wall, 3), "cpu_s": round(_child_cpu() - c0, 3), "peak_rss_gb": round(peak[0] / 1e9, 3),
            "peak_pss_gb": round(peak[1] / 1e9, 3), "reaped_s": round(reaped, 3)}


def precompute(inputs: list[Path], out: Path, *args: str) -> dict:
    """One precompute run in a fresh process; its measured time and memory, and its manifest's
    run record (per-stage seconds, rows, bytes per row). ``EXTRA`` options are added."""
    cmd = [sys.executable, "-m", "alphafeat.cli", "precompute", "-q", "--out", str(out), "--input",
           *map(str, inputs), *EXTRA, *args]  # fmt: skip
    res = run_measured(cmd)
    run = json.loads((out / "_alphafeat.json").read_text())["run"]
    res.update(inside_s=run["seconds"], stage_seconds=run["stage_seconds"], rows=run["rows"],
               segment_cpu_s=run.get("segment_cpu_s"), segments_s=run.get("segments_s"),
               bytes_per_row=run["bytes_per_row"], books_predecoded=run["books_predecoded"])
    res["rows_per_s"] = round(res["rows"] / res["seconds"]) if res["seconds"] else 0
    res["cache_gb"] = round(sum(p.stat().st_size for p in out.rglob("*.arrow")) / 1e9, 3)
    return res


def zstd_time(files: list[Path], jobs: int, to: Path | None = None) -> dict:
    """Wall and CPU seconds of ``zstd -d -c FILE > /dev/null`` (or, with ``to``, of ``zstd -d
    FILE -o to/NAME``, the output deleted after), ``jobs`` files at a time; after ``sync``, as
    :func:`run_measured`."""
    os.sync()
    c0 = _child_cpu() + time.process_time()  # the python-zstandard fallback runs here
    t0 = time.perf_counter()
    if shutil.which("zstd"):
        dest = "> /dev/null" if to is None else f"> {to}/$(basename F).dbn"
        subprocess.run(f"printf '%s\\n' {' '.join(map(str, files))} | xargs -P {jobs} -I F sh -c "
                       f"'zstd -q -d -c F {dest}'", shell=True, check=True)  # fmt: skip
    else:  # no zstd binary: python-zstandard, the same library the reader uses
        from concurrent.futures import ThreadPoolExecutor

        import zstandard

        def one(f: Path) -> None:
            with open(f, "rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True) as r:
                while r.read(1 << 24):
                    pass

        with ThreadPoolExecutor(jobs) as ex:
            list(ex.map(one, files))
    res = {"seconds": round(time.perf_counter() - t0, 3), "cpu_s": round(_child_cpu() + time.process_time() - c0, 3)}
    if to is not None:
        for f in to.glob("*.dbn"):
            f.unlink()
    return res


def sessions(inp: Path) -> dict[str, list[Path]]:
    """Date -> the files of that date (``glbx-mdp3-YYYYMMDD.*``), in date order."""
    out: dict[str, list[Path]] = {}
    for f in sorted(inp.glob("*.dbn.zst")):
        out.setdefault(f.name.split(".")[0][-8:], []).append(f)
    return out


def median(runs: list[dict]) -> tuple[dict, str]:
    """The median run by seconds (the lower middle one of an even count), with ``runs``,
    ``min_s`` and ``max_s`` when there are several; and the table's note of the spread."""
    runs = sorted(runs, key=lambda r: r["seconds"])
    r = dict(runs[(len(runs) - 1) // 2])
    if len(runs) == 1:
        return r, ""
    r.update(runs=len(runs), min_s=runs[0]["seconds"], max_s=runs[-1]["seconds"])
    return r, f" (median of {len(runs)}: {runs[0]['seconds']}-{runs[-1]['seconds']})"


def pandas_route(book: Path, trades: Path, out: Path) -> None:
    """A user's afternoon: ``DBNStore.to_df`` -> 12 features, 5 labels -> Parquet (one session)."""
    import databento as db
    import numpy as np

    df = db.DBNStore.from_file(book).to_df()
    tr = db.DBNStore.from_file(trades).to_df()
    front = df["symbol"].value_counts().index[0]
    df = df[(df["symbol"] == front) & (df["action"] != "T") & (df["action"] != "F")]
    tr = tr[tr["symbol"] == front]
    f = df[["ts_event"]].copy()
    bid, ask = df["bid_px_00"], df["ask_px_00"]
    bq, aq = df["bid_sz_00"].astype(float), df["ask_sz_00"].astype(float)
    f["mid"] = (bid + ask) / 2
    f["spread"] = (ask - bid) / 0.25
    f["microprice"] = (bid * aq + ask * bq) / (bq + aq)
    f["imbalance"] = (bq - aq) / (bq + aq)
    f["ofi"] = (np.where(bid >= bid.shift(), bq, 0) - np.where(bid <= bid.shift(), bq.shift(), 0)
                - np.where(ask <= ask.shift(), aq, 0) + np.where(ask >= ask.shift(), aq.shift(), 0))
    f["ret"] = f["mid"].diff() / 0.25
    f["ema_fast"] = f["mid"].ewm(span=100).mean()
    f["ema_slow"] = f["mid"].ewm(span=6000).mean()
    f["vol"] = f["ret"].rolling(1000).std()
    signed = np.where(tr["side"] == "B", 1.0, np.where(tr["side"] == "A", -1.0, 0.0)) * tr["size"].to_numpy()
    cum = np.concatenate([[0.0], np.cumsum(signed)])
    f["flow"] = np.diff(cum[np.searchsorted(tr.index.values, df.index.values, side="right")], prepend=0.0)
    f["depth"] = sum(df[f"bid_sz_0{k}"] + df[f"ask_sz_0{k}"] for k in range(10))
    f["trade_rate"] = f["flow"].abs().rolling(1000).mean()
    for h in (30, 100, 300, 1000, 6000):
        d = f["mid"].shift(-h) - f["mid"]
        f[f"label_h{h}"] = np.where(d > 0, 1.0, np.where(d < 0, 0.0, np.nan))
    f.to_parquet(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, type=Path, help="folder of generated (or real) DBN files")
    ap.add_argument("--generate", type=int, default=0, help="first write this many sessions into --input")
    ap.add_argument("--scale", default="full", help="generator scale for --generate (default full)")
    ap.add_argument("--jobs", type=int, default=usable_cores(),
                    help="--jobs of N-session runs (default: cores)")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--extra", default="--device cpu",
                    help="options added to every precompute run (default '--device cpu')")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of zstd, cold1, coldN and of the warm reruns each (median reported)")
    ap.add_argument("--scratch", type=Path, default=None, help="where caches are written (default: a temp folder)")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--pandas-worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scratch is not None and not args.scratch.is_dir():
        ap.error(f"--scratch {args.scratch}: no such directory")
    if args.pandas_worker:
        pandas_route(*map(Path, args.pandas_worker))
        return
    if args.generate:
        args.input.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "alphafeat.cli", "synth", "--start", "2024-03-04", "--sessions",
                        str(args.generate), "--scale", args.scale, "--jobs", str(args.jobs), "--out", str(args.input)],
                       check=True, cwd=PROJECT)  # fmt: skip
    cases = [c for c in args.cases.split(",") if c]
    EXTRA[:] = args.extra.split()
    _adopt_orphans()
    by_day = sessions(args.input)
    days = list(by_day)
    first = by_day[days[0]]
    every = [f for fs in by_day.values() for f in fs]
    books = [f for f in every if ".mbp-10." in f.name or ".mbo." in f.name or ".mbp-1." in f.name]
    scratch = Path(tempfile.mkdtemp(prefix="bench-pre-", dir=args.scratch))
    res: dict = {"sessions": len(days), "jobs": args.jobs, "cores": usable_cores(), "extra": args.extra,
                 "input_bytes": sum(f.stat().st_size for f in every)}  # fmt: skip
    rows = []

    def fresh(name: str) -> Path:
        d = scratch / name
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(scratch / ".predecoded", ignore_errors=True)
        return d

    try:
        if {"cold1", "coldN", "warm", "same"} & set(cases):
            precompute(first, fresh("warmup"), "--predecoded", "none")  # numba's cache filled, page cache warm
        reps: dict[str, list[dict]] = {}
        for _ in range(max(1, args.repeat)):  # interleaved, so that a slow spell of the host hits every case
            if "zstd" in cases:
                reps.setdefault("zstd_1", []).append(zstd_time(books[:1], 1))
                reps.setdefault("zstd_N", []).append(zstd_time(books, args.jobs))
                reps.setdefault("zstd_file_1", []).append(zstd_time(books[:1], 1, scratch))
                reps.setdefault("zstd_file_N", []).append(zstd_time(books, args.jobs, scratch))
            if "cold1" in cases:
                reps.setdefault("cold1", []).append(precompute(first, fresh("c1"), "--predecoded", "none"))
            if "coldN" in cases:
                reps.setdefault("coldN", []).append(
                    precompute(every, fresh("cN"), "--predecoded", "none", "--jobs", str(args.jobs)))
        names = {"zstd_1": "zstd -d > /dev/null, first book file",
                 "zstd_N": f"zstd -d > /dev/null, {len(books)} book files, {args.jobs} at a time",
                 "zstd_file_1": "zstd -d to a file, first book file",
                 "zstd_file_N": f"zstd -d to files, {len(books)} book files, {args.jobs} at a time",
                 "cold1": "precompute, 1 session, cold",
                 "coldN": f"precompute, {len(days)} sessions, cold, --jobs {args.jobs}"}  # fmt: skip
        for key, runs in reps.items():
            res[key], spread = median(runs)
            rows.append((names[key] + spread, res[key]["seconds"], res[key].get("peak_rss_gb", ""),
                         res[key].get("rows", "")))  # fmt: skip
        if "coldN1" in cases:
            r = res["coldN_jobs1"] = precompute(every, fresh("cN1"), "--predecoded", "none")
            rows.append((f"precompute, {len(days)} sessions, cold, --jobs 1", r["seconds"], r["peak_rss_gb"],
                         r["rows"]))  # fmt: skip
        if "warm" in cases or "same" in cases:
            out = fresh("w")
            r = res["keep"] = precompute(first, out, "--predecoded", "keep")
            rows.append(("precompute, 1 session, cold, keeping its book", r["seconds"], r["peak_rss_gb"], r["rows"]))
            warm, same = [], []
            for k in range(max(1, args.repeat)):  # each rerun after the first relabels from the one before
                h = ("50,500", "60,600")[k % 2]
                warm.append(precompute(first, out, "--predecoded", "keep", "--horizons", h))
                same.append(precompute(first, out, "--predecoded", "keep", "--horizons", h))
            res["warm"], spread = median(warm)
            r = res["warm"]
            rows.append(("  rerun, other horizons (book kept)" + spread, r["seconds"], r["peak_rss_gb"], r["rows"]))
            res["same"], spread = median(same)
            r = res["same"]
            rows.append(("  rerun, nothing changed" + spread, r["seconds"], r["peak_rss_gb"], r["rows"]))
            r = res["start"] = run_measured([sys.executable, "-c", "import alphafeat.cli, alphafeat.precompute"])
            rows.append(("  (of each: python start and the imports of a run)", r["seconds"], r["peak_rss_gb"], ""))
            feats = []
            for k in range(max(1, args.repeat)):  # each adds features the one before did not store
                feats.append(precompute(first, out, "--predecoded", "keep", "--horizons", h,
                                        "--features", ("default,flow", "default,ofi")[k % 2]))  # fmt: skip
            res["warm_features"], spread = median(feats)
            r = res["warm_features"]
            rows.append(("  rerun, other features (book kept)" + spread, r["seconds"], r["peak_rss_gb"], r["rows"]))
        if "bytes" in cases:
            for label, extra in (("default", []), ("all", ["--features", "all"]),
                                 ("default lz4", ["--compression", "lz4"]), ("default zstd", ["--compression", "zstd"]),
                                 ("all zstd", ["--features", "all", "--compression", "zstd"])):  # fmt: skip
                r = precompute(first, fresh("b"), "--predecoded", "none", *extra)
                res[f"bytes_per_row_{label.replace(' ', '_')}"] = r["bytes_per_row"]
                rows.append((f"bytes per row, {label}", "", "", r["bytes_per_row"]))
        if "dask" in cases:
            for w in (1, 2):
                r = res[f"dask_{w}"] = precompute(every, fresh("d"), "--predecoded", "none", "--dask-local", str(w))
                rows.append((f"precompute, {len(days)} sessions, Dask LocalCluster {w} worker(s)", r["seconds"],
                             r["peak_rss_gb"], r["rows"]))  # fmt: skip
        if "pandas" in cases:
            book = next(f for f in first if ".mbp-10." in f.name)
            trades = next(f for f in first if ".trades." in f.name)
            r = res["pandas"] = run_measured([sys.executable, __file__, "--input", str(args.input), "--pandas-worker",
                                              str(book), str(trades), str(scratch / "p.parquet")])  # fmt: skip
            rows.append(("pandas route (to_df, 12 features, 5 labels, Parquet), 1 session", r["seconds"],
                         r["peak_rss_gb"], ""))  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for n in ("1", "N"):
        if f"zstd_{n}" in res and f"cold{n}" in res:
            ours = res[f"cold{n}"]
            res[f"cold{n}_over_zstd"] = round(ours["seconds"] / res[f"zstd_{n}"]["seconds"], 2)
            res[f"cold{n}_over_zstd_file"] = round(ours["seconds"] / res[f"zstd_file_{n}"]["seconds"], 2)
            res[f"cold{n}_cpu_over_zstd_cpu"] = round(ours["cpu_s"] / max(res[f"zstd_{n}"]["cpu_s"], 1e-9), 2)
    if "cold1" in res and "coldN_jobs1" in res:
        res["rss_N_over_1"] = round(res["coldN_jobs1"]["peak_rss_gb"] / res["cold1"]["peak_rss_gb"], 2)
    if "keep" in res and "warm" in res:
        res["warm_speedup"] = round(res["keep"]["seconds"] / res["warm"]["seconds"], 2)
        res["warm_features_speedup"] = round(res["keep"]["seconds"] / res["warm_features"]["seconds"], 2)
    if "pandas" in res and "cold1" in res:
        res["pandas_over_cold1"] = round(res["pandas"]["seconds"] / res["cold1"]["seconds"], 2)
        res["cold1_rss_over_pandas"] = round(res["cold1"]["peak_rss_gb"] / res["pandas"]["peak_rss_gb"], 2)
    if "dask_1" in res and "dask_2" in res:
        res["dask_speedup_2_over_1"] = round(res["dask_1"]["seconds"] / res["dask_2"]["seconds"], 2)
    print(f"{'case':<72} {'seconds':>9} {'peak GB':>8} {'rows / B per row':>16}")
    for name, s, gb, n in rows:
        print(f"{name:<72} {s!s:>9} {gb!s:>8} {n!s:>16}")
    line = json.dumps(res)
    print(line)
    if args.json_out:
        args.json_out.write_text(line + "\n")


if __name__ == "__main__":
    main()
