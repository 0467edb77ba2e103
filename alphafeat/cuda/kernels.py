"""CUDA kernels (numba-cuda) computing the same features as :mod:`alphafeat.features`.

Layout: all features of a segment live in one device matrix ``out`` of shape
``(n_features, n)``, rows in :func:`alphafeat.features.feature_specs` order, so the result is
copied back to the host once. Conventions (empty levels, row 0, NaN handling) are those of
:mod:`alphafeat.features`; tests hold the two paths equal.

Pipeline (:func:`run_features`):

1. :func:`rowwise_kernel` — one thread per row: mid, spread, microprice, imbalances, OFI per
   level, signed volume, log_dt, tick return.
2. :func:`last_valid_coef_kernel` + scan — the index of the last finite observation of each
   EMA input (mid, squared tick return, spread), itself a linear recurrence with
   ``a in {0, 1}`` (exact in float64).
3. :func:`ema_coef_kernel` — one thread per (series, row): the coefficients ``a_i, b_i`` of
   each EMA ``x_i = a_i x_{i-1} + b_i`` (Zumbach–Müller and trade rate), and a started flag.
4. :func:`device_linear_scan` — chunked parallel scan: each thread composes its block of
   ``CHUNK`` rows into ``(A, B)`` (phase 1), the block carries are scanned by the same
   algorithm recursively (phase 2), each thread replays its block from its carry (phase 3).
   Exact up to floating-point reassociation.
5. :func:`finalize_kernel` — NaN before each EMA's first finite observation.
"""

from __future__ import annotations

import math

import numpy as np
from numba import config, cuda

#: Rows per thread in the chunked scan (also the size below which one thread scans a series).
CHUNK = 64
#: Threads per block of every launch.
THREADS = 256

_N_HEAD = 5


#: Under the simulator each CUDA thread is a Python thread: launch few and let each loop.
SIM_THREADS = 16


def _grid(n_items: int) -> tuple[int, int]:
    """Launch configuration (blocks, threads) covering ``n_items`` work items.

    On a GPU: one thread per item. Under the simulator: one block of ``SIM_THREADS``; every
    kernel loops over its items with a grid stride, so both launches compute the same.
    """
    if config.ENABLE_CUDASIM:
        return 1, max(1, min(SIM_THREADS, n_items))
    return max(1, (n_items + THREADS - 1) // THREADS), THREADS


@cuda.jit(device=True, cache=True)
def _ofi_level(pb0, qb0, pa0, qa0, pb1, qb1, pa1, qa1):
    if math.isnan(pb0):
        pb0 = -math.inf
        qb0 = 0.0
    if math.isnan(pb1):
        pb1 = -math.inf
        qb1 = 0.0
    if math.isnan(pa0):
        pa0 = math.inf
        qa0 = 0.0
    if math.isnan(pa1):
        pa1 = math.inf
        qa1 = 0.0
    e = 0.0
    if pb1 >= pb0:
        e += qb1
    if pb1 <= pb0:
        e -= qb0
    if pa1 <= pa0:
        e -= qa1
    if pa1 >= pa0:
        e += qa0
    return e


@cuda.jit(device=True, cache=True)
def _rowwise_row(bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, tick, n_ofi, out, i):
    n_lv = bid_px.shape[1]
    c_sv = _N_HEAD + n_ofi
    pb = bid_px[i, 0]
    pa = ask_px[i, 0]
    two_sided = not (math.isnan(pb) or math.isnan(pa))
    if two_sided:
        out[0, i] = 0.5 * (pb + pa)
        out[1, i] = (pa - pb) / tick
        qb = bid_sz[i, 0]
        qa = ask_sz[i, 0]
        tot = qb + qa
        if tot > 0.0:
            w = qb / tot
            out[2, i] = w * pa + (1.0 - w) * pb
            out[3, i] = (qb - qa) / tot
        else:
            out[2, i] = math.nan
            out[3, i] = math.nan
        sb = 0.0
        sa = 0.0
        for m in range(min(n_lv, 10)):
            if not math.isnan(bid_px[i, m]):
                sb += bid_sz[i, m]
            if not math.isnan(ask_px[i, m]):
                sa += ask_sz[i, m]
        tot = sb + sa
        if tot > 0.0:
            out[4, i] = (sb - sa) / tot
        else:
            out[4, i] = math.nan
    else:
        for c in range(_N_HEAD):
            out[c, i] = math.nan
    for m in range(n_ofi):
        if i == 0:
            out[_N_HEAD + m, i] = math.nan
        else:
            out[_N_HEAD + m, i] = _ofi_level(
                bid_px[i - 1, m],
                bid_sz[i - 1, m],
                ask_px[i - 1, m],
                ask_sz[i - 1, m],
                bid_px[i, m],
                bid_sz[i, m],
                ask_px[i, m],
                ask_sz[i, m],
            )
    out[c_sv, i] = buy[i] - sell[i]
    if i == 0:
        out[c_sv + 1, i] = math.nan
        out[c_sv + 2, i] = math.nan
    else:
        dt = (ts[i] - ts[i - 1]) / 1e9
        out[c_sv + 1, i] = math.log(max(dt, 1e-9))
        pb0 = bid_px[i - 1, 0]
        pa0 = ask_px[i - 1, 0]
        if two_sided and not (math.isnan(pb0) or math.isnan(pa0)):
            out[c_sv + 2, i] = (0.5 * (pb + pa) - 0.5 * (pb0 + pa0)) / tick
        else:
            out[c_sv + 2, i] = math.nan


@cuda.jit(cache=True)
def rowwise_kernel(bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, tick, n_ofi, out):
    """One thread per row i: row-wise features into ``out[0 : 8 + n_ofi, i]``."""
    for i in range(cuda.grid(1), ts.shape[0], cuda.gridsize(1)):
        _rowwise_row(bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, tick, n_ofi, out, i)


@cuda.jit(device=True, cache=True)
def _ema_input(out, q, i, c_ret):
    """Observation z_i of EMA quantity q: 0 mid, 1 tick_return^2, 2 spread_ticks."""
    if q == 0:
        return out[0, i]
    if q == 1:
        r = out[c_ret, i]
        return r * r
    return out[1, i]


@cuda.jit(cache=True)
def last_valid_coef_kernel(out, c_ret, a, b):
    """Thread (q, i): coefficients of ``s_i = i + 1 if z_i finite else s_{i-1}``, ``s_-1 = 0``.

    ``a``, ``b`` have shape (3, n); after the scan ``s_i - 1`` is the last finite row <= i.
    """
    n = out.shape[1]
    for idx in range(cuda.grid(1), 3 * n, cuda.gridsize(1)):
        q = idx // n
        i = idx - q * n
        z = _ema_input(out, q, i, c_ret)
        if math.isfinite(z):
            a[q, i] = 0.0
            b[q, i] = i + 1.0
        else:
            a[q, i] = 1.0
            b[q, i] = 0.0


@cuda.jit(device=True, cache=True)
def _ema_coef_item(out, c_ret, ts, counts, last, tau0, tau1, interp, a, b, started, s, i):
    q = s // 2
    tau = tau0 if s % 2 == 0 else tau1
    if q == 3:
        dt = 0.0
        if i > 0:
            dt = max(ts[i] - ts[i - 1], 0) / 1e9
        a[s, i] = math.exp(-dt / tau)
        c = counts[i]
        b[s, i] = c / tau if math.isfinite(c) else 0.0
        started[s, i] = 1
        return
    j = -1
    if i > 0:
        j = int(last[q, i - 1]) - 1
    z = _ema_input(out, q, i, c_ret)
    if not math.isfinite(z):
        a[s, i] = 1.0
        b[s, i] = 0.0
        started[s, i] = 1 if j >= 0 else 0
    elif j < 0:
        a[s, i] = 0.0
        b[s, i] = z
        started[s, i] = 1
    else:
        x = (max(ts[i] - ts[j], 0) / 1e9) / tau
        mu = math.exp(-x)
        if interp == 0:
            nu = 1.0
        elif interp == 1:
            nu = -math.expm1(-x) / x if x > 0.0 else 1.0
        else:
            nu = mu
        a[s, i] = mu
        b[s, i] = (nu - mu) * _ema_input(out, q, j, c_ret) + (1.0 - nu) * z
        started[s, i] = 1


@cuda.jit(cache=True)
def ema_coef_kernel(out, c_ret, ts, counts, last, tau0, tau1, interp, a, b, started):
    """Thread (series, i): EMA coefficients. Series ``s = 2*q + k`` (q quantity, k tau index).

    q = 0, 1, 2: Zumbach–Müller EMA of mid, tick_return^2, spread_ticks, skipping non-finite
    observations (``last`` holds 1 + the last finite row <= i, 0 if none); q = 3: trade rate.
    """
    n = ts.shape[0]
    for idx in range(cuda.grid(1), 8 * n, cuda.gridsize(1)):
        s = idx // n
        i = idx - s * n
        _ema_coef_item(out, c_ret, ts, counts, last, tau0, tau1, interp, a, b, started, s, i)


@cuda.jit(cache=True)
def sequential_scan_kernel(a, b, x):
    """Thread s scans series s alone: ``x[s, i] = a[s, i] x[s, i-1] + b[s, i]``, x_-1 = 0."""
    for s in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        v = 0.0
        for i in range(a.shape[1]):
            v = a[s, i] * v + b[s, i]
            x[s, i] = v


@cuda.jit(cache=True)
def compose_kernel(a, b, A, B, chunk):
    """Phase 1, thread (s, k): compose rows ``[k*chunk, (k+1)*chunk)`` of series s."""
    m = A.shape[1]
    n = a.shape[1]
    for idx in range(cuda.grid(1), A.shape[0] * m, cuda.gridsize(1)):
        s = idx // m
        k = idx - s * m
        lo = k * chunk
        hi = min(lo + chunk, n)
        acc_a = 1.0
        acc_b = 0.0
        for i in range(lo, hi):
            acc_a = a[s, i] * acc_a
            acc_b = a[s, i] * acc_b + b[s, i]
        A[s, k] = acc_a
        B[s, k] = acc_b


@cuda.jit(cache=True)
def replay_kernel(a, b, X, x, chunk):
    """Phase 3, thread (s, k): replay block k from the carry ``X[s, k-1]`` (0 for k = 0)."""
    m = X.shape[1]
    n = a.shape[1]
    for idx in range(cuda.grid(1), X.shape[0] * m, cuda.gridsize(1)):
        s = idx // m
        k = idx - s * m
        lo = k * chunk
        hi = min(lo + chunk, n)
        v = 0.0
        if k > 0:
            v = X[s, k - 1]
        for i in range(lo, hi):
            v = a[s, i] * v + b[s, i]
            x[s, i] = v


def device_linear_scan(a, b, x, chunk: int | None = None) -> None:
    """``x[s, i] = a[s, i] x[s, i-1] + b[s, i]`` from ``x[s, -1] = 0`` for every series s.

    ``a``, ``b``, ``x``: device float64 arrays of shape (S, n). Chunked parallel scan; the
    block carries (themselves a linear recurrence) are scanned recursively. ``chunk``: rows
    per thread (default :data:`CHUNK`, at least 2).
    """
    chunk = max(2, CHUNK if chunk is None else int(chunk))
    S, n = a.shape
    if n == 0:
        return
    if n <= chunk:
        sequential_scan_kernel[_grid(S)](a, b, x)
        return
    m = (n + chunk - 1) // chunk
    A = cuda.device_array((S, m), dtype=np.float64)
    B = cuda.device_array((S, m), dtype=np.float64)
    X = cuda.device_array((S, m), dtype=np.float64)
    compose_kernel[_grid(S * m)](a, b, A, B, chunk)
    device_linear_scan(A, B, X, chunk)
    replay_kernel[_grid(S * m)](a, b, X, x, chunk)


@cuda.jit(cache=True)
def finalize_kernel(x, started):
    """NaN where an EMA has not seen a finite observation yet."""
    n = x.shape[1]
    for idx in range(cuda.grid(1), x.shape[0] * n, cuda.gridsize(1)):
        s = idx // n
        i = idx - s * n
        if started[s, i] == 0:
            x[s, i] = math.nan


def run_features(
    cols: dict[str, np.ndarray],
    tick: float,
    n_ofi: int,
    taus: tuple[float, float],
    interp: int,
    n_features: int,
    chunk: int | None = None,
) -> np.ndarray:
    """Compute every feature on the device; returns the host matrix (n_features, n).

    ``cols``: contiguous host columns (``ts_recv`` int64 ns; ``bid_px, ask_px, bid_sz,
    ask_sz`` float64 (n, L); ``buy_volume, sell_volume, trade_count`` float64 (n,)). Each is
    copied to the device once; the result is copied back once into a pinned host buffer
    (a plain array under the simulator). ``chunk``: rows per scan thread (default
    :data:`CHUNK`, read at call time).
    """
    chunk = CHUNK if chunk is None else int(chunk)
    n = cols["ts_recv"].shape[0]
    host = _host_buffer((n_features, n))
    if n == 0:
        return host
    d = {k: cuda.to_device(v) for k, v in cols.items()}
    out = cuda.device_array((n_features, n), dtype=np.float64)
    n_row = _N_HEAD + n_ofi + 3
    c_ret = n_row - 1
    rowwise_kernel[_grid(n)](
        d["bid_px"],
        d["ask_px"],
        d["bid_sz"],
        d["ask_sz"],
        d["ts_recv"],
        d["buy_volume"],
        d["sell_volume"],
        float(tick),
        n_ofi,
        out,
    )
    # last finite observation of mid, tick_return^2, spread
    a3 = cuda.device_array((3, n), dtype=np.float64)
    b3 = cuda.device_array((3, n), dtype=np.float64)
    last = cuda.device_array((3, n), dtype=np.float64)
    last_valid_coef_kernel[_grid(3 * n)](out, c_ret, a3, b3)
    device_linear_scan(a3, b3, last, chunk)
    # EMA coefficients and scans (8 series: 4 quantities x 2 taus), written into `out`
    a8 = cuda.device_array((8, n), dtype=np.float64)
    b8 = cuda.device_array((8, n), dtype=np.float64)
    started = cuda.device_array((8, n), dtype=np.int8)
    ema_coef_kernel[_grid(8 * n)](
        out,
        c_ret,
        d["ts_recv"],
        d["trade_count"],
        last,
        float(taus[0]),
        float(taus[1]),
        interp,
        a8,
        b8,
        started,
    )
    x8 = out[n_row : n_row + 8]
    device_linear_scan(a8, b8, x8, chunk)
    finalize_kernel[_grid(8 * n)](x8, started)
    out.copy_to_host(host)
    cuda.synchronize()
    return host


def _host_buffer(shape: tuple[int, int]) -> np.ndarray:
    """Pinned host buffer for the single device-to-host copy (plain array if unavailable)."""
    if shape[1] > 0:
        try:
            return cuda.pinned_array(shape, dtype=np.float64)
        except Exception:
            pass
    return np.empty(shape, dtype=np.float64)
