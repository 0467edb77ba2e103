"""One segment's CPU features on 1, 2, ... threads, side by side in one run.

The streamed CPU path of ``alphafeat precompute`` computes a segment's features block by block
(:class:`alphafeat.precompute.table.SegmentColumns`, :meth:`alphafeat.features.cpu.FeatureStream.push_block`):
with ``feature_threads`` > 1 the row-wise features of the coming pieces run on pool threads and
the recurrences on the calling thread, in row order. Here the book of the first session of
``--input`` (the plan's first segment, :func:`alphafeat.precompute.books.build_book`; built once,
untimed) is fed to ``SegmentColumns.add`` in blocks of ``alphafeat.precompute.books.BLOCK_ROWS`` rows
(each after the first led by its halo row, sizes as float64: what the reader thread hands
over), then ``mark_complete`` (which waits for the worker that stores the book columns and
labels). Per thread count, after one untimed pass (buffers touched, numba loaded): wall
seconds (median of ``--repeat``, min and max), CPU seconds over wall, the calling thread's
``features`` seconds, and whether every stored column equals that of 1 thread bit for bit.
Decode, the plan and the write are not in it (``bench/precompute.py`` times the whole run).

Usage::

    python bench/feature_threads.py --input DIR [--threads 1,2,3,4] [--repeat 3] [--features default]

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alphafeat.plan import make_plan  # noqa: E402
from alphafeat.precompute import PrecomputeConfig
from alphafeat.precompute.books import BLOCK_ROWS, build_book  # noqa: E402
from alphafeat.precompute.job import make_job
from alphafeat.precompute.table import SegmentColumns  # noqa: E402
from alphafeat.types import BookArrays  # noqa: E402

_COLS = ("ts_event", "ts_recv", "bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct",
         "buy_volume", "sell_volume", "trade_count")  # fmt: skip


def blocks(b: BookArrays) -> list[tuple[BookArrays, bool]]:
    """``b`` as the reader hands it over: BLOCK_ROWS new rows a block, each after the first led
    by the row before it (its halo), sizes as float64."""
    out = []
    for lo in range(0, len(b), BLOCK_ROWS):
        a = lo - 1 if lo else 0
        blk = BookArrays(*(getattr(b, k)[a : lo + BLOCK_ROWS] for k in _COLS), depth=b.depth)
        blk.bid_sz, blk.ask_sz = (np.asarray(x, dtype=np.float64) for x in (blk.bid_sz, blk.ask_sz))
        out.append((blk, lo > 0))
    return out


def one_pass(seg, job, parts: list[tuple[BookArrays, bool]], rows: int) -> tuple[float, float, float, dict]:
    """Wall and CPU seconds of feeding ``parts`` to a fresh SegmentColumns, its calling thread's
    feature seconds, and its stored columns (copies)."""
    t0, c0 = time.perf_counter(), time.process_time()
    cols = SegmentColumns(seg, job, rows + 1)
    for b, halo in parts:
        cols.add(b, halo)
    cols.mark_complete(0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stored = {k: cols.cols[k][: cols.rows].copy() for k in job.names}
    cols.table({})  # lets the worker and the feature threads go
    return wall, cpu, cols.seconds["features"], stored


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, type=Path, help="folder of DBN files (the first session is used)")
    ap.add_argument("--threads", default="1,2,3,4", help="feature thread counts (default 1,2,3,4)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--features", default="default", help="--features of the job (default: default)")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    plan = make_plan([args.input], jobs=os.cpu_count() or 1)
    seg = plan.segments[0]
    book = build_book(seg)[0]
    parts = blocks(book)
    job = make_job(PrecomputeConfig(inputs=[args.input], out=Path("unused"), device="cpu",
                                    feature_set=args.features), "cpu")  # fmt: skip
    res: dict = {"session": str(seg.session), "rows": len(book), "features": args.features,
                 "stored_features": len(job.names), "cores": os.cpu_count(), "by_threads": {}}  # fmt: skip
    ref = None
    for t in counts:
        jt = dataclasses.replace(job, feature_threads=t)
        one_pass(seg, jt, parts, len(book))  # untimed: buffers touched, kernels loaded
        runs = [one_pass(seg, jt, parts, len(book)) for _ in range(args.repeat)]
        walls = [r[0] for r in runs]
        if ref is None:
            ref = runs[0][3]
        same = all(np.array_equal(runs[0][3][k], ref[k], equal_nan=True) for k in ref)
        res["by_threads"][t] = {"seconds": round(statistics.median(walls), 3), "min_s": round(min(walls), 3),
                                "max_s": round(max(walls), 3), "cpu_per_wall": round(runs[0][1] / runs[0][0], 2),
                                "features_s": round(statistics.median(r[2] for r in runs), 3),
                                "equal_to_1_thread": same}  # fmt: skip
    base = res["by_threads"][counts[0]]["seconds"]
    print(f"{seg.raw_symbol} {seg.session}: {len(book):,} rows, --features {args.features}, {os.cpu_count()} cores")
    print(f"{'threads':>8} {'seconds':>9} {'min-max':>14} {'speed-up':>9} {'cpu/wall':>9} {'features s':>11} "
          f"{'bytes equal':>12}")  # fmt: skip
    for t, r in res["by_threads"].items():
        print(f"{t:>8} {r['seconds']:>9.3f} {r['min_s']:>6.3f}-{r['max_s']:<7.3f} {base / r['seconds']:>9.2f} "
              f"{r['cpu_per_wall']:>9.2f} {r['features_s']:>11.3f} {str(r['equal_to_1_thread']):>12}")  # fmt: skip
    line = json.dumps(res)
    print(line)
    if args.json_out:
        args.json_out.write_text(line + "\n")


if __name__ == "__main__":
    main()
