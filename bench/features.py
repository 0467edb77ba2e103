"""Feature throughput: CUDA path (transfers included) vs CPU path on all cores (exact chunks, threads)
vs a plain numpy/pandas vectorised version of the same features.

Input: a random-walk 10-level ES-like book of ``--rows`` snapshots built in memory, or with
``--input`` the front-month book rows of each session of real or generated DBN files (built
with alphafeat's reader, roll schedule and book code, as ``alphafeat precompute`` does; one
call per session). Prints a table and one JSON line. Usage::

    python bench/features.py --rows 20000000 [--jobs N] [--skip-cuda] [--skip-pandas]
    python bench/features.py --input DIR_OR_FILES [...] [--root ES] [--jobs N] ...

The CUDA rows: float64 results from ordinary (pageable) input, as the pipeline calls it; float32
results (``compute_features_cuda(..., dtype="float32")``); and both with the input columns
already in page-locked memory (``alphafeat.cuda.pinned_empty``, no staging copy). Beside them:
the copy ceilings measured on the same machine and the time of each stage run alone.
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

from alphafeat.features import FeatureParams, compute_features, cuda_available  # noqa: E402
from alphafeat.features.registry import frac_diff_weights  # noqa: E402
from alphafeat.types import LEVELS, BookArrays  # noqa: E402


def load_sessions(
    inputs: list, root: str = "ES", jobs: int = 1, rule: str = "volume", buffer=None
) -> list[BookArrays]:
    """Front-month book rows of every session of the DBN files (or directories) ``inputs``:
    the roll schedule of :func:`alphafeat.reader.roll_schedule` (volume rule), each chosen
    instrument's book rebuilt (MBO) or read (MBP-10 / MBP-1) with trades from the trades
    files (else from the book stream), cut per CME session -- as the pipeline does."""
    from alphafeat import book as bk
    from alphafeat.dbn import SCHEMA_RTYPES
    from alphafeat.instruments import session_dates
    from alphafeat.pipeline import _by_instrument, build_book, discover
    from alphafeat.reader import roll_schedule

    schedule, rr = roll_schedule(discover(inputs), root=root, rule=rule, n_jobs=jobs)
    files = sorted(rr.files, key=lambda f: (int(f.dbn.metadata.start), str(f.path)))
    wanted = {c.instrument_id for c in schedule}
    book_parts: dict[int, list[np.ndarray]] = {}
    trade_parts: dict[int, list[np.ndarray]] = {}
    schema = None
    for f in files:
        if f.dbn.schema in ("mbo", "mbp-10", "mbp-1"):
            schema, parts, rt = f.dbn.schema, book_parts, SCHEMA_RTYPES[f.dbn.schema]
        elif f.dbn.schema == "trades":
            parts, rt = trade_parts, SCHEMA_RTYPES["trades"]
        else:
            continue
        arr = f.arrays.get(rt)
        if arr is None or not len(arr):
            continue
        for iid, sel in _by_instrument(arr).items():
            if iid in wanted:
                parts.setdefault(iid, []).append(sel)
    books: list[BookArrays] = []
    built: dict[int, tuple] = {}
    for c in schedule:
        iid = c.instrument_id
        if iid not in book_parts:
            continue
        if iid not in built:
            trade_recs = np.concatenate(trade_parts[iid]) if iid in trade_parts else None
            raw, trades, _ = build_book(schema, np.concatenate(book_parts[iid]), trade_recs)
            built[iid] = (raw, trades, session_dates(raw.ts_recv), session_dates(trades.ts_recv))
        raw, trades, sess, tsess = built[iid]
        in_seg = sess == np.datetime64(c.session)
        if in_seg.any():
            seg_trades = trades.take(tsess == np.datetime64(c.session))
            books.append(bk.to_book_arrays(raw.take(in_seg), seg_trades, buffer=buffer))
    if not books:
        raise SystemExit(f"no front-month book rows of {root} in {inputs}")
    return books


def stream_bench(inputs: list[str], p: FeatureParams, root: str, jobs: int, cuda: bool) -> dict:
    """A data set larger than memory (e.g. a quarter of generated sessions), one session at a
    time: the session's files are read, its front-month book built (calendar roll rule, as a
    session alone has no previous session's volume), and timed on the CPU path (``jobs``
    threads) and, with ``cuda``, on the CUDA path as the pipeline runs it (book built in a
    pinned buffer, :func:`alphafeat.cuda.kernels.pinned_buffer`), float64 and float32
    results. Every CUDA result is compared with the CPU's. Times are summed over sessions."""
    from alphafeat.dbn import open_dbn
    from alphafeat.instruments import session_dates
    from alphafeat.pipeline import discover

    groups: dict = {}
    for f in discover(inputs):
        day = session_dates(np.array([open_dbn(f).metadata.start], dtype=np.int64))[0]
        groups.setdefault(day, []).append(f)
    buffer = None
    if cuda:
        from alphafeat.cuda import compute_features_cuda
        from alphafeat.cuda.kernels import pinned_buffer as buffer

        compute_features(make_book(5000, 1), p, device="cuda")  # compile / load the kernels
    compute_features(make_book(5000, 1), p, n_chunks=jobs, n_jobs=jobs)
    t = {"read": 0.0, "cpu": 0.0, "cuda": 0.0, "cuda_f32": 0.0}
    res: dict = {"sessions": 0, "rows": 0, "rows_per_session_max": 0, "cuda_vs_cpu_max_rel": 0.0,
                 "cuda_vs_cpu_nan_mismatches": 0}  # fmt: skip
    for day, files in sorted(groups.items()):
        t0 = time.perf_counter()
        books = load_sessions(files, root, jobs=1, rule="calendar", buffer=buffer)
        t["read"] += time.perf_counter() - t0
        for b in books:
            res["sessions"] += 1
            res["rows"] += len(b)
            res["rows_per_session_max"] = max(res["rows_per_session_max"], len(b))
            if res["sessions"] == 1:
                b1 = head(b, min(len(b), 500_000))
                t1 = _time(lambda b1=b1: compute_features(b1, p), repeat=3)
                res.update(cpu_1core_s=round(t1, 3), cpu_1core_Msnap_s=round(len(b1) / t1 / 1e6, 3))
            t0 = time.perf_counter()
            ref = compute_features(b, p, n_chunks=jobs, n_jobs=jobs)
            t["cpu"] += time.perf_counter() - t0
            if cuda:
                for key, dtype in (("cuda", "float64"), ("cuda_f32", "float32")):
                    t0 = time.perf_counter()
                    got = compute_features_cuda(b, p, dtype=dtype)
                    t[key] += time.perf_counter() - t0
                    if dtype == "float64":
                        w, nd = _max_rel(got, ref)
                        res["cuda_vs_cpu_max_rel"] = max(res["cuda_vs_cpu_max_rel"], w)
                        res["cuda_vs_cpu_nan_mismatches"] += nd
                    del got
            del ref
        log_line = f"{day}: {sum(len(b) for b in books):,} rows"
        print(log_line, file=sys.stderr, flush=True)
        del books
    for key, sec in t.items():
        if key != "read" and not sec:
            continue
        res[f"{key}_s"] = round(sec, 3)
        res[f"{key}_Msnap_s"] = round(res["rows"] / sec / 1e6, 2)
    res["cpu_Msnap_s_per_core"] = round(res["cpu_Msnap_s"] / jobs, 3)
    return res


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
        # sum_j exp(-(t_i - t_j)/tau) x_j, vectorised by rescaling (blocks keep exp in range)
        out = np.empty_like(x)
        blk = max(1, int(500 * tau / max(np.median(dt[1:]) if len(dt) > 1 else 1.0, 1e-9)))
        carry, t_prev = 0.0, tsec[0]
        for lo in range(0, len(x), blk):
            t = tsec[lo : lo + blk]
            g = np.exp((t - t[0]) / tau)
            c = np.cumsum(x[lo : lo + blk] * g) / g + carry * np.exp(-(t - t_prev) / tau)
            out[lo : lo + blk] = c
            carry, t_prev = c[-1], t[-1]
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
    CPU results, the copy ceilings of this machine and the time of each stage alone."""
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    from numba import cuda

    from alphafeat.cuda import compute_features_cuda, kernels, pinned_empty
    from alphafeat.features import _prepare
    from alphafeat.features.registry import make_plan

    res: dict = {}
    n = sum(len(b) for b in books)
    compute_features(make_book(5000, 1), p, device="cuda")  # compile / load the kernels

    def timed(key: str, bs: list[BookArrays], dtype: str) -> None:
        run = lambda: [compute_features_cuda(b, p, dtype=dtype) for b in bs] and None  # noqa: E731
        run()  # first full-size call: pinned pools, device buffers
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
    # each stage alone, on the largest session (the others left out of run_features)
    book = max(books, key=len)
    nb = len(book)
    stages = {"fill": "host copies into pinned slots", "h2d": "DMA in", "compute": "kernels", "d2h": "DMA out"}
    for st in stages:
        kernels._SKIP.update(set(stages) - {st})
        try:
            t = _time(lambda: compute_features_cuda(book, p), repeat=2)
        finally:
            kernels._SKIP.clear()
        res[f"stage_{st}_alone_Msnap_s"] = round(nb / t / 1e6, 1)
    # copy ceilings: pinned DMA each way and both at once, host copy into pinned memory
    cols = _prepare(book, p)
    nin = sum(v.nbytes for v in cols.values())
    nout = 8 * make_plan(p).n_out * nb
    pin_in, pin_out = kernels._pinned_flat(nin), kernels._pinned_flat(nout)
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
        help="with --input: one session at a time (sets larger than memory), CPU and CUDA only",
    )  # fmt: skip
    args = ap.parse_args()
    p = FeatureParams()
    if args.stream:
        if not args.input:
            ap.error("--stream needs --input")
        res = stream_bench(args.input, p, args.root, args.jobs, cuda=not args.skip_cuda and cuda_available())
        res.update(input=args.input, cores=os.cpu_count(), jobs=args.jobs)
        print(f"{'path':40s} {'seconds':>9s} {'M snapshots/s':>14s}")
        for label, key in (
            ("read + book (1 core, not in the rates)", "read"), ("CUDA float64 (pinned book, transfers incl.)", "cuda"),
            ("CUDA float32 results", "cuda_f32"), (f"CPU njit, {args.jobs} threads", "cpu"),
            ("CPU njit, 1 core, 0.5M rows of session 1", "cpu_1core"),
        ):  # fmt: skip
            if f"{key}_s" in res:
                print(f"{label:40s} {res[key + '_s']:9.3f} {res[key + '_Msnap_s']:14.2f}")
        print(json.dumps(res))
        return 0
    t0 = time.perf_counter()
    books = load_sessions(args.input, args.root, args.jobs) if args.input else [make_book(args.rows)]
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

    t_cpu = _time(cpu_all, repeat=2)
    res["cpu_s"] = round(t_cpu, 3)
    res["cpu_Msnap_s"] = round(n / t_cpu / 1e6, 2)
    res["cpu_Msnap_s_per_core"] = round(n / t_cpu / 1e6 / args.jobs, 3)
    n1 = min(len(book), 500_000)
    b1 = head(book, n1) if args.input else make_book(n1, 2)
    t1 = _time(lambda: compute_features(b1, p), repeat=3)
    res["cpu_1core_s"] = round(t1, 3)
    res["cpu_1core_Msnap_s"] = round(n1 / t1 / 1e6, 3)
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
            (f"CPU njit, {args.jobs} threads", "cpu"),
            ("CPU njit, 1 core, 0.5M rows", "cpu_1core"), ("numpy/pandas vectorised, 1 core", "pandas")]  # fmt: skip
    print(f"{'path':32s} {'seconds':>9s} {'M snapshots/s':>14s}")
    for label, key in rows:
        if f"{key}_Msnap_s" in res:
            print(f"{label:32s} {res.get(key + '_s', float('nan')):9.3f} {res[key + '_Msnap_s']:14.2f}")
    sys.stdout.flush()
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
