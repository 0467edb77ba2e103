"""Feature throughput: CUDA path (transfers included) vs CPU path on all cores (exact chunks, threads)
vs a plain numpy/pandas vectorised version of the same features.

Input: a random-walk 10-level ES-like book of ``--rows`` snapshots built in memory.
Prints a table and one JSON line. Usage::

    python bench/features.py --rows 20000000 [--jobs N] [--skip-cuda] [--skip-pandas]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--skip-cuda", action="store_true")
    ap.add_argument("--skip-pandas", action="store_true")
    ap.add_argument("--pandas-rows", type=int, default=2_000_000, help="rows for the pandas version")
    args = ap.parse_args()
    p = FeatureParams()
    n = args.rows
    t0 = time.perf_counter()
    book = make_book(n)
    t_gen = time.perf_counter() - t0
    small = make_book(5000, 1)
    res: dict = {"rows": n, "cores": os.cpu_count(), "jobs": args.jobs, "gen_s": round(t_gen, 2)}
    # warm-up compiles (and fills numba's cache for the worker processes)
    compute_features(small, p)
    compute_features(small, p, n_chunks=args.jobs, n_jobs=args.jobs)
    t_cpu = _time(lambda: compute_features(book, p, n_chunks=args.jobs, n_jobs=args.jobs), repeat=2)
    res["cpu_s"] = round(t_cpu, 3)
    res["cpu_Msnap_s"] = round(n / t_cpu / 1e6, 2)
    res["cpu_Msnap_s_per_core"] = round(n / t_cpu / 1e6 / args.jobs, 3)
    n1 = min(n, 500_000)
    b1 = make_book(n1, 2)
    t1 = _time(lambda: compute_features(b1, p), repeat=3)
    res["cpu_1core_s"] = round(t1, 3)
    res["cpu_1core_Msnap_s"] = round(n1 / t1 / 1e6, 3)
    if not args.skip_cuda and cuda_available():
        from numba import cuda

        from alphafeat.cuda import kernels
        from alphafeat.features import _prepare
        from alphafeat.features.registry import make_plan

        compute_features(small, p, device="cuda")
        compute_features(book, p, device="cuda")  # first full-size call: pinned pools, allocations
        t_gpu = _time(lambda: compute_features(book, p, device="cuda"), repeat=3)
        res["cuda_s"] = round(t_gpu, 3)
        res["cuda_Msnap_s"] = round(n / t_gpu / 1e6, 2)
        # transfer ceilings: pinned DMA each way, pageable H2D, host copy into pinned memory
        cols = _prepare(book, p)
        plan = make_plan(p)
        nin = sum(v.nbytes for v in cols.values())
        pin = kernels._pinned_flat(nin)
        dev = cuda.device_array(nin, dtype=np.uint8)
        off, views = 0, []
        for v in cols.values():
            views.append((v.reshape(-1).view(np.uint8), pin[off : off + v.nbytes]))
            off += v.nbytes
        t = time.perf_counter()
        for src, dst in views:
            np.copyto(dst, src)
        res["host_copy_1thread_GBs"] = round(nin / (time.perf_counter() - t) / 1e9, 1)
        cuda.synchronize()
        t = time.perf_counter()
        dev.copy_to_device(pin)
        cuda.synchronize()
        res["h2d_pinned_GBs"] = round(nin / (time.perf_counter() - t) / 1e9, 1)
        one = cols["bid_px"]
        d1 = cuda.device_array(one.shape, dtype=one.dtype)
        t = time.perf_counter()
        d1.copy_to_device(one)
        cuda.synchronize()
        res["h2d_pageable_GBs"] = round(one.nbytes / (time.perf_counter() - t) / 1e9, 1)
        del dev, d1, pin
        nout = 8 * plan.n_out * n
        hostm = kernels._pinned_flat(nout)
        devm = cuda.device_array(nout, dtype=np.uint8)
        cuda.synchronize()
        t = time.perf_counter()
        devm.copy_to_host(hostm)
        cuda.synchronize()
        t_d2h = time.perf_counter() - t
        res["d2h_pinned_GBs"] = round(nout / t_d2h / 1e9, 1)
        res["d2h_alone_s"] = round(t_d2h, 3)
        res["d2h_bound_Msnap_s"] = round(n / t_d2h / 1e6, 1)
        del devm, hostm
        res["bytes_per_row_in"] = int(nin / n)
        res["bytes_per_row_out"] = 8 * plan.n_out
        ref = compute_features(b1, p)
        got = compute_features(b1, p, device="cuda")
        res["cuda_vs_cpu_max_rel"] = float(
            max(np.nanmax(np.abs(got[k] - ref[k]) / np.maximum(np.abs(ref[k]), 1.0)) for k in ref)
        )
    if not args.skip_pandas:
        npd = min(n, args.pandas_rows)
        bpd = make_book(npd, 3)
        t_pd = _time(lambda: pandas_features(bpd, p))
        res["pandas_rows"] = npd
        res["pandas_s"] = round(t_pd, 3)
        res["pandas_Msnap_s"] = round(npd / t_pd / 1e6, 2)
    rows = [("CUDA (transfers incl.)", "cuda"), (f"CPU njit, {args.jobs} threads", "cpu"),
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
