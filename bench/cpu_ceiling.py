"""CPU feature throughput beside the memory ceiling of the same host, side by side in one run.

The CPU path reads 352 bytes of book a row (``ts_recv``, 4 x 10 price/size levels, 3 trade
columns) and writes one float64 result per feature (69 with the default parameters, 552
bytes). ``_traffic`` moves exactly those bytes in the same blocked layout (a block of rows
read, then each result column written over the block) with one add per value: no
implementation of the features can be faster than it on this host. Printed, 1 core and
``--jobs`` threads (each thread its own segment, as precompute runs one session per worker):

* *ceiling*: ``_traffic`` into result matrices already touched (reused, as the CPU path's
  result pool does);
* *ceiling, fresh result matrix*: the same into a new matrix each call (first-touch page
  faults included, as a result that is kept forces);
* *features*: :func:`alphafeat.features.compute_features` (sequential fused path), each
  thread on its own book, best of ``--repeat`` after an untimed pass.

Ratios (features / ceiling) are taken in the same run. Usage::

    python bench/cpu_ceiling.py [--rows 1000000] [--jobs N] [--repeat 5]

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from features import _time, make_book  # noqa: E402

from alphafeat.features import FeatureParams, _prepare, compute_features  # noqa: E402
from alphafeat.features.cpu_kernels import BLOCK  # noqa: E402
from alphafeat.features.registry import make_plan  # noqa: E402


@numba.njit(nogil=True, error_model="numpy")
def _traffic(bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, cnt, out):  # pragma: no cover - timed
    """Read every input value of every row once, write every result value once (blocked)."""
    n = ts.shape[0]
    n_lv = bid_px.shape[1]
    s = np.empty(BLOCK)
    for b0 in range(0, n, BLOCK):
        b1 = min(b0 + BLOCK, n)
        for t in range(b1 - b0):
            i = b0 + t
            v = buy[i] + sell[i] + cnt[i] + ts[i]
            for m in range(n_lv):
                v += bid_px[i, m] + ask_px[i, m] + bid_sz[i, m] + ask_sz[i, m]
            s[t] = v
        for c in range(out.shape[0]):
            o = out[c, b0:b1]
            for t in range(b1 - b0):
                o[t] = s[t] + c


def _best(fn, repeat: int) -> float:
    fn()  # untimed: compile, first touch
    return _time(fn, repeat)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per segment (one segment per thread)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    p = FeatureParams()
    n_out = make_plan(p).n_out
    n, jobs = args.rows, args.jobs
    books = [make_book(n, seed) for seed in range(jobs)]
    cols = [_prepare(b, p) for b in books]
    outs = [np.empty((n_out, n)) for _ in range(jobs)]
    inputs = lambda c: (c["bid_px"], c["ask_px"], c["bid_sz"], c["ask_sz"], c["ts_recv"],  # noqa: E731
                        c["buy_volume"], c["sell_volume"], c["trade_count"])  # fmt: skip
    bytes_row = sum(v.nbytes for v in cols[0].values()) / n + 8 * n_out
    compute_features(make_book(5000, 1), p)  # compile / load

    def ceiling(k: int) -> None:
        _traffic(*inputs(cols[k]), outs[k])

    def ceiling_fresh(k: int) -> None:
        _traffic(*inputs(cols[k]), np.empty((n_out, n)))

    def features(k: int) -> None:
        compute_features(books[k], p)

    res: dict = {"rows_per_segment": n, "jobs": jobs, "cores": os.cpu_count(), "n_out": n_out,
                 "bytes_per_row": int(bytes_row)}  # fmt: skip
    cases = (("ceiling", ceiling), ("ceiling_fresh", ceiling_fresh), ("features", features))
    with ThreadPoolExecutor(jobs) as ex:
        for name, fn in cases:
            res[f"{name}_1core_Msnap_s"] = round(n / _best(lambda fn=fn: fn(0), args.repeat) / 1e6, 3)
            t = _best(lambda fn=fn: list(ex.map(fn, range(jobs))), args.repeat)
            res[f"{name}_{jobs}thr_Msnap_s_per_core"] = round(n / t / 1e6, 3)
    for where in ("1core", f"{jobs}thr"):
        suf = "_Msnap_s" if where == "1core" else "_Msnap_s_per_core"
        res[f"features_vs_ceiling_{where}"] = round(res[f"features_{where}{suf}"] / res[f"ceiling_{where}{suf}"], 3)
        res[f"features_vs_fresh_ceiling_{where}"] = round(
            res[f"features_{where}{suf}"] / res[f"ceiling_fresh_{where}{suf}"], 3
        )
    print(f"{n:,} rows a segment, {int(bytes_row)} bytes a row, {jobs} threads, best of {args.repeat}")
    print(f"{'M snapshots/s per core':34s} {'1 core':>9s} {f'{jobs} threads':>11s} {'GB/s (all)':>11s}")
    for label, name in (("ceiling (results reused)", "ceiling"), ("ceiling, fresh result matrix", "ceiling_fresh"),
                        ("features (compute_features)", "features")):  # fmt: skip
        one = res[f"{name}_1core_Msnap_s"]
        per = res[f"{name}_{jobs}thr_Msnap_s_per_core"]
        print(f"{label:34s} {one:9.3f} {per:11.3f} {per * jobs * bytes_row / 1e3:11.1f}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
