"""CUDA kernels (numba-cuda) computing the same features as :mod:`alphafeat.features`.

The per-row formulas are :mod:`alphafeat.features._rows` compiled with
``numba.cuda.jit(device=True)`` (the CPU path compiles the same file with ``numba.njit``).
All features of a segment live in one device matrix ``out`` of shape ``(n_out + 1, n)``,
rows in :func:`alphafeat.features.feature_specs` order plus one scratch row (the
forward-filled log mid), so the result goes back to the host in one copy.

Pipeline (:func:`run_features`):

1. :func:`rowwise_kernel` -- one thread per row: every row-wise feature.
2. :func:`last_finite_coef_kernel` + scan -- the last finite row of each skip-NaN input, a
   linear recurrence with ``a in {0, 1}`` (exact in float64).
3. :func:`coef_kernel` -- one thread per (series, row): ``a_i, b_i`` of each recurrence.
4. :func:`device_linear_scan` -- chunked parallel scan: each thread composes its block of
   ``CHUNK`` rows into ``(A, B)`` (phase 1), the block carries are scanned by the same
   algorithm recursively (phase 2), each thread replays its block from its carry (phase 3).
5. :func:`post_kernel` -- one thread per row: outputs from the states (masks, sqrt,
   z-scores, trend, logs).
6. :func:`fracdiff_kernel` -- one thread per row: the fixed-window fractional difference.

:func:`direction_labels_kernel` computes the direction labels of :mod:`alphafeat.labels`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import config, cuda

from alphafeat.features import _twin
from alphafeat.features.registry import N_LF, Plan

R = _twin.load("cuda")

#: Rows per thread in the chunked scan (also the size below which one thread scans a series).
CHUNK = 64
#: Threads per block of every launch.
THREADS = 256
#: Under the simulator each CUDA thread is a Python thread: launch few and let each loop.
SIM_THREADS = 16
#: Most recurrences a plan may hold (size of the per-thread local arrays of post_kernel).
MAX_SERIES = 32


def _grid(n_items: int) -> tuple[int, int]:
    """Launch configuration (blocks, threads) covering ``n_items`` work items.

    On a GPU: one thread per item. Under the simulator: one block of ``SIM_THREADS``; every
    kernel loops over its items with a grid stride, so both launches compute the same.
    """
    if config.ENABLE_CUDASIM:
        return 1, max(1, min(SIM_THREADS, n_items))
    return max(1, (n_items + THREADS - 1) // THREADS), THREADS


def _cfg(n_items: int, stream=0) -> tuple:
    """``(blocks, threads, stream)`` launch configuration (see :func:`_grid`)."""
    return (*_grid(n_items), stream)


@cuda.jit(cache=True)
def rowwise_kernel(bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, cnt, tick, L, depth_w, out):
    """One thread per row i: every row-wise feature into ``out[:, i]``."""
    for i in range(cuda.grid(1), ts.shape[0], cuda.gridsize(1)):
        R.rowwise_row(bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, cnt, tick, L, depth_w, out, i)


@cuda.jit(cache=True)
def last_finite_coef_kernel(out, L, buy, sell, cnt, a, b):
    """Thread (k, i): ``s_i = i + 1 if z_k(i) finite else s_{i-1}``; after the scan
    ``s_i - 1`` is the last row <= i where input k is finite (-1: none)."""
    n = out.shape[1]
    for idx in range(cuda.grid(1), a.shape[0] * n, cuda.gridsize(1)):
        k = idx // n
        i = idx - k * n
        z = R.z_input(k, i, out, L, buy, sell, cnt)
        if z == z and z - z == 0.0:  # finite
            a[k, i] = 0.0
            b[k, i] = i + 1.0
        else:
            a[k, i] = 1.0
            b[k, i] = 0.0


@cuda.jit(cache=True)
def coef_kernel(out, L, ts, buy, sell, cnt, last, s_kind, s_code, s_tau, s_scale, interp, a, b):
    """Thread (s, i): the coefficients of recurrence s at row i."""
    n = ts.shape[0]
    for idx in range(cuda.grid(1), a.shape[0] * n, cuda.gridsize(1)):
        s = idx // n
        i = idx - s * n
        c = s_code[s]
        j = -1
        if c < last.shape[0] and i > 0:
            j = int(last[c, i - 1]) - 1
        ai, bi = R.coef(s_kind[s], c, s_tau[s], s_scale[s], interp, i, j, out, L, ts, buy, sell, cnt)
        a[s, i] = ai
        b[s, i] = bi


@cuda.jit(cache=True)
def post_kernel(X, last, s_kind, s_code, p_int, p_tau, tick, h_mu, h_alpha, out):
    """One thread per row: output columns from the recurrence states."""
    n = X.shape[1]
    S = X.shape[0]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        x = cuda.local.array(MAX_SERIES, np.float64)
        st = cuda.local.array(MAX_SERIES, np.int8)
        for s in range(S):
            x[s] = X[s, i]
            st[s] = 1 if (s_kind[s] == 3 or last[s_code[s], i] >= 1.0) else 0
        R.post_row(x, st, p_int, p_tau, tick, h_mu, h_alpha, out, i)


@cuda.jit(cache=True)
def fracdiff_kernel(out, scratch, fd_col, w):
    """One thread per row: fixed-window fractional difference of the scratch row."""
    y = out[scratch]
    for i in range(cuda.grid(1), out.shape[1], cuda.gridsize(1)):
        out[fd_col, i] = R.fracdiff_row(y, w, i)


@cuda.jit(cache=True)
def direction_labels_kernel(mid, hs, y):
    """Thread (h, t): 1 if mid[t+h] > mid[t], 0 if lower, NaN on a tie, NaN mid or past the end."""
    n = mid.shape[0]
    for idx in range(cuda.grid(1), hs.shape[0] * n, cuda.gridsize(1)):
        k = idx // n
        t = idx - k * n
        h = hs[k]
        v = math.nan
        if t + h < n:
            d = mid[t + h] - mid[t]
            if d > 0:
                v = 1.0
            elif d < 0:
                v = 0.0
        y[k, t] = v


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


def device_linear_scan(a, b, x, chunk: int | None = None, stream=0) -> None:
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
        sequential_scan_kernel[_cfg(S, stream)](a, b, x)
        return
    m = (n + chunk - 1) // chunk
    A = cuda.device_array((S, m), dtype=np.float64, stream=stream)
    B = cuda.device_array((S, m), dtype=np.float64, stream=stream)
    X = cuda.device_array((S, m), dtype=np.float64, stream=stream)
    compose_kernel[_cfg(S * m, stream)](a, b, A, B, chunk)
    device_linear_scan(A, B, X, chunk, stream)
    replay_kernel[_cfg(S * m, stream)](a, b, X, x, chunk)



#: Pinned host staging buffers of the inputs, reused between calls (grow only).
_POOL: dict[str, np.ndarray] = {}


def _staged(name: str, v: np.ndarray) -> np.ndarray:
    """``v`` copied into a pinned buffer from the pool (plain array under the simulator)."""
    if config.ENABLE_CUDASIM:
        return v
    buf = _POOL.get(name)
    if buf is None or buf.nbytes < v.nbytes:
        buf = _POOL[name] = cuda.pinned_array(max(v.nbytes, 1), dtype=np.uint8)
    view = buf[: v.nbytes].view(v.dtype).reshape(v.shape)
    np.copyto(view, v)
    return view


def _host_buffer(shape: tuple[int, ...], dtype=np.float64) -> np.ndarray:
    """Fresh pinned host buffer for the single device-to-host copy (plain array if unavailable)."""
    if int(np.prod(shape)) > 0 and not config.ENABLE_CUDASIM:
        try:
            return cuda.pinned_array(shape, dtype=dtype)
        except Exception:
            pass
    return np.empty(shape, dtype=dtype)


def run_features(cols: dict[str, np.ndarray], plan: Plan, chunk: int | None = None) -> np.ndarray:
    """Compute every feature on the device; returns the host matrix ``(n_out, n)``.

    ``cols``: contiguous host columns (``ts_recv`` int64 ns; ``bid_px, ask_px, bid_sz,
    ask_sz`` float64 (n, L); ``buy_volume, sell_volume, trade_count`` float64 (n,)). Each is
    copied to the device once through a pinned staging buffer; the result comes back once
    into a pinned host buffer. ``chunk``: rows per scan thread (default :data:`CHUNK`).
    """
    chunk = CHUNK if chunk is None else int(chunk)
    n = int(cols["ts_recv"].shape[0])
    n_out = plan.n_out
    host = _host_buffer((n_out, n))
    if n == 0:
        return host
    S = int(plan.s_kind.shape[0])
    if S > MAX_SERIES:
        raise ValueError(f"plan has {S} recurrences, the kernels hold at most {MAX_SERIES}")
    stream = cuda.stream()
    d = {k: cuda.to_device(_staged(k, v), stream=stream) for k, v in cols.items()}
    small = {
        k: cuda.to_device(np.ascontiguousarray(getattr(plan, k)), stream=stream)
        for k in ("layout", "depth_w", "s_kind", "s_code", "s_tau", "s_scale", "p_int", "p_tau", "fd_w")
    }
    out = cuda.device_array((n_out + 1, n), dtype=np.float64, stream=stream)
    L = small["layout"]
    buy, sell, cnt, ts = d["buy_volume"], d["sell_volume"], d["trade_count"], d["ts_recv"]
    rowwise_kernel[_cfg(n, stream)](
        d["bid_px"], d["ask_px"], d["bid_sz"], d["ask_sz"], ts, buy, sell, cnt, plan.tick, L, small["depth_w"], out
    )
    a = cuda.device_array((N_LF, n), dtype=np.float64, stream=stream)
    b = cuda.device_array((N_LF, n), dtype=np.float64, stream=stream)
    last = cuda.device_array((N_LF, n), dtype=np.float64, stream=stream)
    last_finite_coef_kernel[_cfg(N_LF * n, stream)](out, L, buy, sell, cnt, a, b)
    device_linear_scan(a, b, last, chunk, stream)
    del a, b
    a = cuda.device_array((S, n), dtype=np.float64, stream=stream)
    b = cuda.device_array((S, n), dtype=np.float64, stream=stream)
    X = cuda.device_array((S, n), dtype=np.float64, stream=stream)
    coef_kernel[_cfg(S * n, stream)](
        out, L, ts, buy, sell, cnt, last, small["s_kind"], small["s_code"], small["s_tau"], small["s_scale"],
        plan.interp, a, b,
    )  # fmt: skip
    device_linear_scan(a, b, X, chunk, stream)
    post_kernel[_cfg(n, stream)](
        X, last, small["s_kind"], small["s_code"], small["p_int"], small["p_tau"], plan.tick, plan.hawkes_mu,
        plan.hawkes_alpha, out,
    )  # fmt: skip
    fracdiff_kernel[_cfg(n, stream)](out, n_out, plan.fd_col, small["fd_w"])
    out[:n_out].copy_to_host(host, stream=stream)
    stream.synchronize()
    return host


def direction_labels_device(mid: np.ndarray, horizons: np.ndarray) -> np.ndarray:
    """Direction labels on the device: float32 ``(len(horizons), n)``."""
    n = int(mid.shape[0])
    H = int(horizons.shape[0])
    host = _host_buffer((H, n), np.float32)
    if n == 0 or H == 0:
        return host
    d_mid = cuda.to_device(np.ascontiguousarray(mid, dtype=np.float64))
    d_h = cuda.to_device(np.ascontiguousarray(horizons, dtype=np.int64))
    y = cuda.device_array((H, n), dtype=np.float32)
    direction_labels_kernel[_grid(H * n)](d_mid, d_h, y)
    y.copy_to_host(host)
    return host
