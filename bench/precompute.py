"""``alphafeat precompute`` at scale: time, peak memory and cache size beside plain ``zstd -d``.

Every figure comes from running the public command line (``python -m cli.alphafeat
precompute``) in a fresh process, as a user would; peak memory is the largest sum of the
resident set sizes of the command and all its children, sampled every 20 ms with psutil.

Rows (``--cases``, comma-separated; default all that the input allows):

* ``zstd``: ``zstd -d`` of the book files to /dev/null, one file, then all of them ``--jobs``
  at a time (``xargs -P``); the yardstick of the speed goals.
* ``cold1`` / ``coldN`` / ``coldN1``: one session, then every session with ``--jobs``, then every
  session with ``--jobs 1``, from scratch (no cache, nothing kept).
* ``warm``: a rerun with other horizons after a run that kept its books (``--predecoded keep``);
  ``same``: a rerun with nothing changed.
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
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

PROJECT = Path(__file__).resolve().parents[1]
#: Options added to every precompute run (``--extra``).
EXTRA: list[str] = []
CASES = ("zstd", "cold1", "coldN", "coldN1", "warm", "same", "bytes", "dask", "pandas")


def run_measured(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``; wall seconds and the peak of the summed RSS of its process tree."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=PROJECT)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        p = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                tree = [p, *p.children(recursive=True)]
                rss = 0
                for q in tree:
                    try:
                        rss += q.memory_info().rss
                    except psutil.Error:
                        pass
                peak[0] = max(peak[0], rss)
            except psutil.Error:
                return
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{out.decode()[-3000:]}")
    return {"seconds": round(wall, 3), "peak_rss_gb": round(peak[0] / 1e9, 3)}


def precompute(inputs: list[Path], out: Path, *args: str) -> dict:
    """One precompute run in a fresh process; its measured time and memory, and its manifest's
    run record (per-stage seconds, rows, bytes per row). ``EXTRA`` options are added."""
    cmd = [sys.executable, "-m", "cli.alphafeat", "precompute", "-q", "--out", str(out), "--input",
           *map(str, inputs), *EXTRA, *args]  # fmt: skip
    res = run_measured(cmd)
    run = json.loads((out / "_alphafeat.json").read_text())["run"]
    res.update(inside_s=run["seconds"], stage_seconds=run["stage_seconds"], rows=run["rows"],
               bytes_per_row=run["bytes_per_row"], books_predecoded=run["books_predecoded"])
    res["rows_per_s"] = round(res["rows"] / res["seconds"]) if res["seconds"] else 0
    res["cache_gb"] = round(sum(p.stat().st_size for p in out.rglob("*.arrow")) / 1e9, 3)
    return res


def zstd_time(files: list[Path], jobs: int) -> float:
    """Seconds of ``zstd -d -c FILE > /dev/null``, ``jobs`` files at a time."""
    t0 = time.perf_counter()
    if shutil.which("zstd"):
        subprocess.run(f"printf '%s\\n' {' '.join(map(str, files))} | xargs -P {jobs} -I F sh -c "
                       "'zstd -q -d -c F > /dev/null'", shell=True, check=True)  # fmt: skip
    else:  # no zstd binary: python-zstandard, the same library the reader uses
        from concurrent.futures import ThreadPoolExecutor

        import zstandard

        def one(f: Path) -> None:
            with open(f, "rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True) as r:
                while r.read(1 << 24):
                    pass

        with ThreadPoolExecutor(jobs) as ex:
            list(ex.map(one, files))
    return round(time.perf_counter() - t0, 3)


def sessions(inp: Path) -> dict[str, list[Path]]:
    """Date -> the files of that date (``glbx-mdp3-YYYYMMDD.*``), in date order."""
    out: dict[str, list[Path]] = {}
    for f in sorted(inp.glob("*.dbn.zst")):
        out.setdefault(f.name.split(".")[0][-8:], []).append(f)
    return out


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
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="--jobs of N-session runs (default: cores)")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--extra", default="--device cpu",
                    help="options added to every precompute run (default '--device cpu')")
    ap.add_argument("--scratch", type=Path, default=None, help="where caches are written (default: a temp folder)")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--pandas-worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pandas_worker:
        pandas_route(*map(Path, args.pandas_worker))
        return
    if args.generate:
        args.input.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "cli.alphafeat", "synth", "--start", "2024-03-04", "--sessions",
                        str(args.generate), "--scale", args.scale, "--jobs", str(args.jobs), "--out", str(args.input)],
                       check=True, cwd=PROJECT)  # fmt: skip
    cases = [c for c in args.cases.split(",") if c]
    EXTRA[:] = args.extra.split()
    by_day = sessions(args.input)
    days = list(by_day)
    first = by_day[days[0]]
    every = [f for fs in by_day.values() for f in fs]
    books = [f for f in every if ".mbp-10." in f.name or ".mbo." in f.name or ".mbp-1." in f.name]
    scratch = Path(tempfile.mkdtemp(prefix="bench-pre-", dir=args.scratch))
    res: dict = {"sessions": len(days), "jobs": args.jobs, "cores": os.cpu_count(), "extra": args.extra,
                 "input_bytes": sum(f.stat().st_size for f in every)}  # fmt: skip
    rows = []

    def fresh(name: str) -> Path:
        d = scratch / name
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(scratch / ".predecoded", ignore_errors=True)
        return d

    try:
        if "zstd" in cases:
            res["zstd_1"] = zstd_time(books[:1], 1)
            res["zstd_N"] = zstd_time(books, args.jobs)
            rows += [("zstd -d, first book file", res["zstd_1"], "", ""),
                     (f"zstd -d, {len(books)} book files, {args.jobs} at a time", res["zstd_N"], "", "")]
        if "cold1" in cases:
            precompute(first, fresh("warmup"), "--predecoded", "none")  # numba's cache filled, page cache warm
            r = res["cold1"] = precompute(first, fresh("c1"), "--predecoded", "none")
            rows.append(("precompute, 1 session, cold", r["seconds"], r["peak_rss_gb"], r["rows"]))
        if "coldN" in cases:
            r = res["coldN"] = precompute(every, fresh("cN"), "--predecoded", "none", "--jobs", str(args.jobs))
            rows.append((f"precompute, {len(days)} sessions, cold, --jobs {args.jobs}", r["seconds"],
                         r["peak_rss_gb"], r["rows"]))  # fmt: skip
        if "coldN1" in cases:
            r = res["coldN_jobs1"] = precompute(every, fresh("cN1"), "--predecoded", "none")
            rows.append((f"precompute, {len(days)} sessions, cold, --jobs 1", r["seconds"], r["peak_rss_gb"],
                         r["rows"]))  # fmt: skip
        if "warm" in cases or "same" in cases:
            out = fresh("w")
            r = res["keep"] = precompute(first, out, "--predecoded", "keep")
            rows.append(("precompute, 1 session, cold, keeping its book", r["seconds"], r["peak_rss_gb"], r["rows"]))
            r = res["warm"] = precompute(first, out, "--predecoded", "keep", "--horizons", "50,500")
            rows.append(("  rerun, other horizons (book kept)", r["seconds"], r["peak_rss_gb"], r["rows"]))
            r = res["same"] = precompute(first, out, "--predecoded", "keep", "--horizons", "50,500")
            rows.append(("  rerun, nothing changed", r["seconds"], r["peak_rss_gb"], r["rows"]))
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
    if "zstd_1" in res and "cold1" in res:
        res["cold1_over_zstd"] = round(res["cold1"]["seconds"] / res["zstd_1"], 2)
    if "zstd_N" in res and "coldN" in res:
        res["coldN_over_zstd"] = round(res["coldN"]["seconds"] / res["zstd_N"], 2)
    if "cold1" in res and "coldN_jobs1" in res:
        res["rss_N_over_1"] = round(res["coldN_jobs1"]["peak_rss_gb"] / res["cold1"]["peak_rss_gb"], 2)
    if "keep" in res and "warm" in res:
        res["warm_speedup"] = round(res["keep"]["seconds"] / res["warm"]["seconds"], 2)
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
