"""CUDA kernels (numba-cuda) computing the same features as :mod:`alphafeat.features`.

The per-row formulas are :mod:`alphafeat.features._rows` compiled with
``numba.cuda.jit(device=True)`` (the CPU path compiles the same file with ``numba.njit``).
All features of a segment live in one device matrix ``out`` of shape ``(n_out + 1, n)``,
rows in :func:`alphafeat.features.feature_specs` order plus one scratch row (the
forward-filled log mid), so each step's results go back from one matrix in one 2-D copy.

Pipeline (:func:`submit_features`, :func:`run_features`), in steps (:func:`_step_bounds`) on
three streams kept between calls: host threads fill a pinned staging slot with step k+1 while
the DMA engine sends step k, the kernels compute it and the other copy engine brings back the
results of the step before, one 2-D copy a step (input columns already in page-locked memory
skip the staging copy). Calls alternate between two sets of device buffers, so a segment
submitted before the previous one's results are back overlaps with it (segments streamed by
:func:`alphafeat.cuda.compute_features_cuda_many`). Per step:

1. :func:`rowwise_kernel` -- one thread per row: every row-wise feature.
2. The last finite row of each skip-NaN input: a linear recurrence with ``a in {0, 1}``
   (exact in float64), scanned by the three scan kernels below in mode :data:`MODE_LAST`.
3. The recurrences ``x_i = a_i x_{i-1} + b_i`` (EMAs, decayed sums, deviations), mode
   :data:`MODE_REC`: the coefficients are computed inside the scan kernels
   (:func:`alphafeat.features._rows.coef`), never stored.
   Scan (:func:`_scan`): :func:`scan_compose_kernel` -- thread (series, chunk) composes its
   ``CHUNK`` rows into ``(A, B)``; :func:`scan_carry_kernel` -- one block per series scans
   the chunk maps from the state before the step (one segment per thread, then a
   Hillis-Steele scan in shared memory); :func:`scan_replay_kernel` -- each thread replays its
   chunk from its carry and writes the states. Three launches per scan at any length.
4. :func:`post_kernel` -- one thread per row: outputs from the states (masks, sqrt,
   z-scores, trend, logs).
5. :func:`fracdiff_kernel` -- blocks of rows with their window in shared memory: the
   fixed-window fractional difference (the window reaches into earlier steps on the device).
6. float32 results only: :func:`cast_kernel` rounds the step's columns once, on the device.

Declared features (:func:`alphafeat.features.registry.register`) are computed by the kernel
:func:`alphafeat.features.declared.row_kernel` generates from their declarations, right after
:func:`rowwise_kernel` (a stateful one's recurrence then runs with the others in step 3).

Device buffers, pinned host buffers, streams and events are kept between calls in one
:class:`Buffers` object per process (:func:`buffers`; grow only; :func:`release_buffers` drops
them); the module holds no other mutable state.

:func:`direction_labels_kernel` computes the direction labels of :mod:`alphafeat.labels`.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
import warnings

import numpy as np
from numba import config, cuda

from alphafeat.cores import usable_cores
from alphafeat.errors import UsageError
from alphafeat.features.declared import row_kernel
from alphafeat.features.registry import N_LF, Plan
from alphafeat.features.twin import load as _load_rows

R = _load_rows("cuda")

#: Rows per thread in the chunked scan (also the size below which one thread scans a series).
CHUNK = 64
#: Threads per block of every launch.
THREADS = 256
#: Under the simulator each CUDA thread is a Python thread: launch few and let each loop.
SIM_THREADS = 16
#: Threads of :func:`scan_carry_kernel` under the simulator (each barrier there polls every
#: thread; 4 still scan runs of several chunk maps across the block).
SIM_CARRY_THREADS = 4
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
def rowwise_kernel(bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, cnt, tick, L, depth_w, out, lo, hi):
    """One thread per row i in ``[lo, hi)``: every row-wise feature into ``out[:, i]``."""
    for i in range(lo + cuda.grid(1), hi, cuda.gridsize(1)):
        R.rowwise_row(bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, cnt, tick, L, depth_w, out, i)


@cuda.jit(cache=True)
def post_kernel(X, last, s_kind, s_code, p_int, p_tau, tick, h_mu, h_alpha, out, lo, hi):
    """One thread per row in ``[lo, hi)``: output columns from the recurrence states."""
    S = X.shape[0]
    for i in range(lo + cuda.grid(1), hi, cuda.gridsize(1)):
        x = cuda.local.array(MAX_SERIES, np.float64)
        st = cuda.local.array(MAX_SERIES, np.int8)
        for s in range(S):
            x[s] = X[s, i]
            st[s] = 1 if (s_kind[s] == 3 or last[s_code[s], i] >= 1.0) else 0
        R.post_row(x, st, p_int, p_tau, tick, h_mu, h_alpha, out, i)


#: Doubles of the shared-memory tile of :func:`fracdiff_kernel` (window - 1 + threads).
FD_TILE = 4096


@cuda.jit(cache=True)
def fracdiff_kernel(out, scratch, fd_col, w, lo, hi):
    """Fixed-window fractional difference of the scratch row for rows ``[lo, hi)``.

    Each block takes tiles of ``blockDim`` consecutive rows; the tile's window (``W - 1``
    rows before it and the tile) is loaded into shared memory once, coalesced, and each
    thread sums ``w_k y_{i-k}`` for k = 0, 1, ... from there (the CPU order). Windows larger
    than the tile fall back to reading global memory.
    """
    y = out[scratch]
    W = w.shape[0]
    T = cuda.blockDim.x
    tid = cuda.threadIdx.x
    tile = cuda.shared.array(FD_TILE, np.float64)
    use_sh = W - 1 + T <= FD_TILE
    for t0 in range(lo + cuda.blockIdx.x * T, hi, cuda.gridDim.x * T):
        if use_sh:
            base = t0 - (W - 1)
            for q in range(tid, W - 1 + T, T):
                r = base + q
                tile[q] = y[r] if (r >= 0 and r < hi) else 0.0
            cuda.syncthreads()
        i = t0 + tid
        if i < hi:
            if i < W - 1:
                out[fd_col, i] = math.nan
            elif use_sh:
                acc = 0.0
                q = W - 1 + tid
                for k in range(W):
                    acc += w[k] * tile[q - k]
                out[fd_col, i] = acc
            else:
                out[fd_col, i] = R.fracdiff_row(y, w, i)
        if use_sh:
            cuda.syncthreads()


@cuda.jit(cache=True)
def cast_kernel(out, out32, lo, hi):
    """Thread (c, t): ``out32[c, lo + t] = float32(out[c, lo + t])`` for the rows ``[lo, hi)``."""
    m = hi - lo
    for idx in range(cuda.grid(1), out32.shape[0] * m, cuda.gridsize(1)):
        c = idx // m
        i = lo + idx - c * m
        out32[c, i] = out[c, i]


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
def triple_barrier_kernel(price, upper, lower, h, ts, y, t1, k):
    """One thread per row t: :func:`alphafeat.features._rows.triple_barrier_row`."""
    for t in range(cuda.grid(1), price.shape[0], cuda.gridsize(1)):
        R.triple_barrier_row(price, upper, lower, h, ts, y, t1, k, t)


# --------------------------------------------------------------------------------------------
# linear scans x_i = a_i x_{i-1} + b_i, chunked: compose, carry, replay
# --------------------------------------------------------------------------------------------

#: Coefficients read from the arrays ``a, b`` (:func:`device_linear_scan`).
MODE_ARRAYS = 0
#: Series k: ``(0, i + 1)`` where skip-NaN input k is finite at row i, else ``(1, 0)``; the
#: state minus 1 is the last row <= i where it is finite (-1: none).
MODE_LAST = 1
#: Series s: the coefficients of recurrence s of the plan (:func:`alphafeat.features._rows.coef`).
MODE_REC = 2
#: Threads of the block that scans one series' chunk maps (:func:`scan_carry_kernel`).
CARRY_THREADS = 256


@cuda.jit(device=True, cache=True)
def _ab(mode, s, i, t, a, b, out, L, ts, buy, sell, cnt, last, s_kind, s_code, s_tau, s_scale, interp):
    """``(a, b)`` of series ``s`` at row ``i`` (``t``: the row's index in ``a, b``)."""
    if mode == 0:
        return a[s, t], b[s, t]
    if mode == 1:
        z = R.z_input(s, i, out, L, buy, sell, cnt)
        if z == z and z - z == 0.0:  # finite
            return 0.0, i + 1.0
        return 1.0, 0.0
    c = s_code[s]
    j = -1
    if c < last.shape[0] and i > 0:
        j = int(last[c, i - 1]) - 1
    return R.coef(s_kind[s], c, s_tau[s], s_scale[s], interp, i, j, out, L, ts, buy, sell, cnt)


@cuda.jit(cache=True)
def scan_compose_kernel(
    mode, a, b, out, L, ts, buy, sell, cnt, last, s_kind, s_code, s_tau, s_scale, interp, lo, m, chunk, A, B
):
    """Thread (s, k): compose rows ``lo + [k chunk, (k+1) chunk)`` (within ``m``) of series s
    into one map ``x -> A x + B``."""
    nc = A.shape[1]
    for idx in range(cuda.grid(1), A.shape[0] * nc, cuda.gridsize(1)):
        s = idx // nc
        k = idx - s * nc
        t0 = k * chunk
        acc_a = 1.0
        acc_b = 0.0
        for t in range(t0, min(t0 + chunk, m)):
            ai, bi = _ab(mode, s, lo + t, t, a, b, out, L, ts, buy, sell, cnt, last, s_kind, s_code, s_tau,
                         s_scale, interp)  # fmt: skip
            acc_a = ai * acc_a
            acc_b = ai * acc_b + bi
        A[s, k] = acc_a
        B[s, k] = acc_b


@cuda.jit(cache=True)
def scan_carry_kernel(A, B, x, lo, Y):
    """Block per series s: ``Y[s, k]`` = the state entering chunk k, from the state before the
    step (``x[s, lo - 1]``, 0 if ``lo = 0``) through the chunk maps ``(A, B)``.

    Each thread composes a run of consecutive chunk maps, the runs' maps are scanned across
    the block (Hillis-Steele, in shared memory), each thread replays its run from there.
    """
    sh_a = cuda.shared.array(CARRY_THREADS, np.float64)
    sh_b = cuda.shared.array(CARRY_THREADS, np.float64)
    T = cuda.blockDim.x
    tid = cuda.threadIdx.x
    nc = A.shape[1]
    per = (nc + T - 1) // T
    k0 = min(tid * per, nc)
    k1 = min(k0 + per, nc)
    for s in range(cuda.blockIdx.x, A.shape[0], cuda.gridDim.x):
        ca = 1.0
        cb = 0.0
        for k in range(k0, k1):
            ca = A[s, k] * ca
            cb = A[s, k] * cb + B[s, k]
        sh_a[tid] = ca
        sh_b[tid] = cb
        cuda.syncthreads()
        d = 1
        while d < T:
            pa = 1.0
            pb = 0.0
            if tid >= d:
                pa = sh_a[tid - d]
                pb = sh_b[tid - d]
            cuda.syncthreads()
            if tid >= d:  # (runs before) then (own): x -> ca (pa x + pb) + cb
                cb = ca * pb + cb
                ca = ca * pa
                sh_a[tid] = ca
                sh_b[tid] = cb
            cuda.syncthreads()
            d *= 2
        v = x[s, lo - 1] if lo > 0 else 0.0
        if tid > 0:
            v = sh_a[tid - 1] * v + sh_b[tid - 1]
        for k in range(k0, k1):
            Y[s, k] = v
            v = A[s, k] * v + B[s, k]
        cuda.syncthreads()  # the next series reuses the shared arrays


@cuda.jit(cache=True)
def scan_replay_kernel(
    mode, a, b, out, L, ts, buy, sell, cnt, last, s_kind, s_code, s_tau, s_scale, interp, lo, m, chunk, Y, x
):
    """Thread (s, k): replay chunk k of series s from its carry ``Y[s, k]``; writes
    ``x[s, lo + t]`` for its rows t."""
    nc = Y.shape[1]
    for idx in range(cuda.grid(1), Y.shape[0] * nc, cuda.gridsize(1)):
        s = idx // nc
        k = idx - s * nc
        t0 = k * chunk
        v = Y[s, k]
        for t in range(t0, min(t0 + chunk, m)):
            ai, bi = _ab(mode, s, lo + t, t, a, b, out, L, ts, buy, sell, cnt, last, s_kind, s_code, s_tau,
                         s_scale, interp)  # fmt: skip
            v = ai * v + bi
            x[s, lo + t] = v


def _carry_cfg(S: int, stream) -> tuple:
    if config.ENABLE_CUDASIM:
        return 1, SIM_CARRY_THREADS, stream
    return S, CARRY_THREADS, stream


def _scan(bufs: Buffers, mode: int, S: int, lo: int, m: int, x, args: tuple, chunk: int, stream) -> None:
    """Rows ``[lo, lo + m)`` of S series into ``x[:, lo:lo + m]``, continuing from
    ``x[:, lo - 1]``. ``args``: the coefficient arguments of :func:`_ab` after ``t``; the chunk
    maps in device buffers of ``bufs``."""
    nc = (m + chunk - 1) // chunk
    A = bufs.dev(f"scanA{mode}", (S, nc))
    B = bufs.dev(f"scanB{mode}", (S, nc))
    Y = bufs.dev(f"scanY{mode}", (S, nc))
    scan_compose_kernel[_cfg(S * nc, stream)](mode, *args, lo, m, chunk, A, B)
    scan_carry_kernel[_carry_cfg(S, stream)](A, B, x, lo, Y)
    scan_replay_kernel[_cfg(S * nc, stream)](mode, *args, lo, m, chunk, Y, x)


def _dummies(bufs: Buffers):
    """Placeholder device arrays for the arguments a scan mode does not read."""
    f2 = bufs.dev("dummy_f2", (1, 1))
    f1 = bufs.dev("dummy_f1", (1,))
    i1 = bufs.dev("dummy_i1", (1,), np.int64)
    return f2, f1, i1


def device_linear_scan(a, b, x, chunk: int | None = None, stream=0) -> None:
    """``x[s, i] = a[s, i] x[s, i-1] + b[s, i]`` from ``x[s, -1] = 0`` for every series s.

    ``a``, ``b``, ``x``: device float64 arrays of shape (S, n) (views allowed). Chunked
    parallel scan (:func:`scan_compose_kernel`, :func:`scan_carry_kernel`,
    :func:`scan_replay_kernel`); ``chunk``: rows per thread (default :data:`CHUNK`).
    """
    chunk = max(1, CHUNK if chunk is None else int(chunk))
    S, n = a.shape
    if n == 0 or S == 0:
        return
    bufs = buffers()
    with bufs.lock:
        f2, f1, i1 = _dummies(bufs)
        args = (a, b, f2, i1, i1, f1, f1, f1, f2, i1, i1, f1, f1, 0)
        _scan(bufs, MODE_ARRAYS, S, 0, n, x, args, chunk, stream)


# --------------------------------------------------------------------------------------------
# buffers kept between calls
# --------------------------------------------------------------------------------------------

#: Most rows per step of the copy / compute pipeline of :func:`run_features`.
PIPE_ROWS = 1 << 21
#: Fewest rows per step (a step costs about 1 ms of launches and copy calls on the host).
MIN_STEP = 1 << 18
#: Steps a call aims at between those bounds (more steps: more overlap, more overhead).
TARGET_STEPS = 8
#: Steps a call aims at when an earlier call is still in flight (:func:`submit_features`).
OVERLAPPED_STEPS = 2
#: Pinned staging slots of the input pipeline (host threads fill one while the DMA reads another).
N_SLOTS = 3
#: Host threads copying the input columns into the pinned staging slots (12 gave the fastest
#: pipeline of 6, 8 and 12 on a 16-core host: docs/performance.md).
COPY_THREADS = 12
#: Bytes of one piece of a staging copy (one task of a copy thread).
COPY_PIECE = 8 << 20

class Buffers:
    """What the device path keeps between calls, in one object (:func:`buffers`): device
    buffers by name (flat, grow only) and the views handed out of them, pinned result and input
    matrices, pinned staging slots, the copy threads, the streams and events of the pipeline
    and the device copies of the plans' small arrays. ``lock`` serialises the calls."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._dev: dict[str, object] = {}
        self._views: dict[tuple, object] = {}
        self._host_out: list[np.ndarray] = []
        self._host_in: list[np.ndarray] = []
        self._slots: dict[str, np.ndarray] = {}
        self._exec = None
        self._streams: dict = {}
        self._plans: dict[bytes, dict] = {}
        #: device arrays allocated so far (flat buffers, plan arrays): tests count them
        self.allocations = 0

    def dev(self, name: str, shape: tuple[int, ...], dtype=np.float64):
        """A device array of ``shape`` carved from the pooled flat buffer ``name`` (grow only; the
        device is synchronised before a buffer is replaced, since work in flight may use it). The
        views are kept too (slicing a device array costs Python time on every step)."""
        key = (name, shape, np.dtype(dtype))
        view = self._views.get(key)
        if view is not None:
            return view
        size = int(np.prod(shape))
        buf = self._dev.get(name)
        if buf is None or buf.size < size or buf.dtype != np.dtype(dtype):
            if buf is not None:
                cuda.synchronize()
            self._dev.pop(name, None)
            for k in [k for k in self._views if k[0] == name]:
                del self._views[k]
            buf = None
            buf = self._dev[name] = cuda.device_array(max(size, 1), dtype=dtype)
            self.allocations += 1
        if len(self._views) > 4096:
            self._views.clear()
        view = self._views[key] = buf[:size].reshape(shape) if len(shape) > 1 else buf[:size]
        return view

    def release(self) -> None:
        """Drop every buffer, stream and event (after the work in flight is done)."""
        with self.lock:
            if self._streams:
                cuda.synchronize()
            self._streams.clear()
            self._plans.clear()
            self._views.clear()
            self._dev.clear()
            self._host_out.clear()
            self._host_in.clear()
            self._slots.clear()

    def _pooled(self, pool: list[np.ndarray], nbytes: int, size: int = 2) -> np.ndarray:
        """A pinned uint8 buffer of at least ``nbytes`` from ``pool`` (at most ``size`` kept).

        A buffer handed out earlier is reused only when nothing refers to it any more (no view of
        it is alive: its reference count is back to the pool's own), so arrays a caller keeps are
        never overwritten; otherwise a new one is allocated (allocating and pinning gigabytes
        costs far more than a copy).
        """
        with self.lock:
            for buf in pool:
                # references: the pool list, the loop variable, getrefcount's argument
                if sys.getrefcount(buf) <= 3 and buf.nbytes >= nbytes:
                    return buf
            pool[:] = [buf for buf in pool if sys.getrefcount(buf) > 3]  # too small and unused: give back
            buf = _pinned_flat(nbytes)
            pool.append(buf)
            if len(pool) > size:
                del pool[0]
            return buf

    def result_buffer(self, shape: tuple[int, int], dtype=np.float64) -> np.ndarray:
        """Pinned host matrix for the results (from the pool :meth:`_pooled` describes; three
        kept: the results a caller holds, those in flight and the next call's)."""
        dtype = np.dtype(dtype)
        nbytes = dtype.itemsize * int(np.prod(shape))
        return self._pooled(self._host_out, nbytes, size=3)[:nbytes].view(dtype).reshape(shape)

    def pinned_buffer(self, nbytes: int) -> np.ndarray:
        """A pinned uint8 host buffer for input columns, from a pool of two (see :meth:`_pooled`)."""
        return self._pooled(self._host_in, int(nbytes))

    def executor(self):
        """The copy threads (created on first use)."""
        if self._exec is None:
            from concurrent.futures import ThreadPoolExecutor

            self._exec = ThreadPoolExecutor(max_workers=max(1, min(COPY_THREADS, usable_cores())))
        return self._exec

    def slots(self, cols: dict[str, np.ndarray], rows: int) -> list[dict[str, np.ndarray]]:
        """``N_SLOTS`` pinned staging slots of ``rows`` rows of every column of ``cols``."""
        per_row = {k: v.dtype.itemsize * int(np.prod(v.shape[1:])) for k, v in cols.items()}
        need = rows * sum(per_row.values())
        slots = []
        for q in range(N_SLOTS):
            buf = self._slots.get(f"slot{q}")
            if buf is None or buf.nbytes < need:
                if buf is not None:
                    cuda.synchronize()  # a copy in flight may still read it
                self._slots.pop(f"slot{q}", None)
                buf = self._slots[f"slot{q}"] = _pinned_flat(need)
            views, off = {}, 0
            for k, v in cols.items():
                nb = rows * per_row[k]
                views[k] = buf[off : off + nb].view(v.dtype).reshape((rows, *v.shape[1:]))
                off += nb
            slots.append(views)
        return slots

    def streams(self) -> dict:
        """The streams and events kept between calls (created on first use, in the current
        context): ``{"h2d", "comp", "d2h": streams, "ev_in": one event per staging slot, "free":
        {set k: (event after the last kernel, event after the last copy back) of the call that
        used device buffer set k last}}``."""
        st = self._streams
        if not st:
            st.update(h2d=cuda.stream(), comp=cuda.stream(), d2h=cuda.stream(),
                      ev_in=[cuda.event() for _ in range(N_SLOTS)], free={}, calls=0, slot=0)  # fmt: skip
        return st

    def plan_arrays(self, plan: Plan, stream) -> dict:
        """The plan's small arrays on the device, uploaded once per distinct plan (a device
        allocation and free per call could stall the pipeline)."""
        names = ("layout", "depth_w", "s_kind", "s_code", "s_tau", "s_scale", "p_int", "p_tau", "fd_w")
        host = {k: np.ascontiguousarray(getattr(plan, k)) for k in names}
        key = b"".join(k.encode() + v.dtype.str.encode() + v.tobytes() for k, v in host.items())
        got = self._plans.get(key)
        if got is None:
            if len(self._plans) >= 8:
                self._plans.clear()
            got = self._plans[key] = {k: cuda.to_device(v, stream=stream) for k, v in host.items()}
            self.allocations += len(got)
            stream.synchronize()
        return got


@functools.cache
def buffers() -> Buffers:
    """The process's :class:`Buffers` (created on first use; one CUDA context per process)."""
    return Buffers()


def release_buffers() -> None:
    """Drop the device and pinned host buffers, streams and events kept between calls (after
    the work in flight is done), back to the driver at once (numba's deferred deallocations
    flushed: numba frees pinned host memory through the same queue as device memory, ten
    allocations or a fifth of the GPU's memory late). A pinned result a caller still holds is
    freed with its last view, at the next flush."""
    buffers().release()
    deallocations = getattr(cuda.current_context(), "deallocations", None)  # (not under the simulator)
    if deallocations is not None:
        deallocations.clear()


def total_memory() -> int:
    """Bytes of memory of this process's GPU (``cuMemGetInfo``'s total; 2**62 under the simulator)."""
    total = cuda.current_context().get_memory_info().total
    return int(min(total, 2**62))


def _pinned_flat(nbytes: int) -> np.ndarray:
    """Pinned uint8 host buffer (plain array under the simulator or if pinning fails)."""
    if not config.ENABLE_CUDASIM:
        try:
            return cuda.pinned_array(max(nbytes, 1), dtype=np.uint8)
        except Exception:
            pass
    return np.empty(max(nbytes, 1), dtype=np.uint8)


def pinned_empty(shape, dtype=np.float64) -> np.ndarray:
    """An uninitialised array in page-locked host memory (a plain array under the simulator).

    Input columns in such memory (or views of it) go to the device without the staging copy
    of :func:`run_features`: a reader that writes its columns here saves one host pass.
    """
    shape = (shape,) if np.isscalar(shape) else tuple(shape)
    dtype = np.dtype(dtype)
    flat = _pinned_flat(int(np.prod(shape)) * dtype.itemsize)
    return flat[: int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)


def is_pinned(v: np.ndarray) -> bool:
    """True if ``v`` lies in page-locked memory that numba allocated (``cuda.pinned_array``,
    ``cuda.mapped_array``, :func:`pinned_empty`, or a view of one of these)."""
    if config.ENABLE_CUDASIM:
        return False
    from numba.cuda.cudadrv import driver

    kinds = tuple(getattr(driver, k) for k in ("PinnedMemory", "MappedMemory", "MappedOwnedPointer")
                  if hasattr(driver, k))  # fmt: skip
    o = v
    for _ in range(64):
        if isinstance(o, kinds):
            return True
        o = getattr(o, "base", None)
        if o is None:
            return False
    return False


def pinned_buffer(nbytes: int) -> np.ndarray:
    """A pinned uint8 host buffer of at least ``nbytes`` for input columns (a plain array under
    the simulator), from a pool of two: reused once no view of it is alive (see
    :meth:`Buffers._pooled`). ``alphafeat.book.to_book_arrays(..., buffer=pinned_buffer)`` builds a
    session's book in it, so :func:`run_features` sends it without a staging copy."""
    return buffers().pinned_buffer(nbytes)


def _fill_async(ex, slot: dict[str, np.ndarray], cols: dict[str, np.ndarray], lo: int, hi: int) -> list:
    """Start copying rows ``[lo, hi)`` of the columns into the pinned slot, in pieces of about
    :data:`COPY_PIECE` bytes on the copy threads (numpy releases the GIL); the futures."""
    rows = hi - lo
    futs = []
    for k, v in cols.items():
        dst = slot[k]
        parts = max(1, min(4 * COPY_THREADS, rows * (v.nbytes // max(len(v), 1)) // COPY_PIECE))
        for p in range(parts):
            a = rows * p // parts
            b = rows * (p + 1) // parts
            futs.append(ex.submit(np.copyto, dst[a:b], v[lo + a : lo + b]))
    return futs


def _step_bounds(n: int, overlapped: bool = False) -> tuple[int, list[tuple[int, int]]]:
    """The pipeline's steps over n rows: ``(largest step, [(lo, hi), ...])``.

    About :data:`TARGET_STEPS` steps of ``step`` rows (within :data:`MIN_STEP` and
    :data:`PIPE_ROWS`); the first and the last are cut in quarters, so that the pipeline
    fills (host copy of the first step) and drains (results of the last) in less time.
    ``overlapped`` (an earlier call is still in flight and hides this one's fill and drain):
    about :data:`OVERLAPPED_STEPS` steps, none cut (each step costs host time: launches, copies).
    """
    target = OVERLAPPED_STEPS if overlapped else TARGET_STEPS
    step = max(1, min(n, PIPE_ROWS, max(MIN_STEP, -(-n // target))))
    edges = list(range(0, n, step)) + [n]
    bounds = list(zip(edges[:-1], edges[1:], strict=True))
    if overlapped:
        return step, bounds
    out: list[tuple[int, int]] = []
    for q, (lo, hi) in enumerate(bounds):
        if (q == 0 or q == len(bounds) - 1) and len(bounds) > 2 and hi - lo >= 4:
            cut = [lo + (hi - lo) * r // 4 for r in range(5)]
            out += list(zip(cut[:-1], cut[1:], strict=True))
        else:
            out.append((lo, hi))
    return step, out


def to_device_rows(dst, src: np.ndarray, lo: int, hi: int, stream) -> None:
    """``dst[lo:hi] = src`` (device array, rows of a C-contiguous host array), one async copy.

    Issued through the driver on a byte view of ``dst``'s memory: slicing a device array
    costs tens of microseconds of Python, and a call makes hundreds of these copies.
    """
    if config.ENABLE_CUDASIM:
        dst[lo:hi].copy_to_device(np.ascontiguousarray(src), stream=stream)
        return
    from numba.cuda.cudadrv import driver

    row = dst.strides[0]
    nbytes = (hi - lo) * row
    driver.host_to_device(dst.gpu_data.view(lo * row, lo * row + nbytes), src, nbytes, stream)


def to_host_2d(back, host: np.ndarray, src_lo: int, dst_lo: int, width: int, rows: int, stream) -> None:
    """``host[k, dst_lo:dst_lo + width] = back[k, src_lo:src_lo + width]`` for k < ``rows``: one
    asynchronous 2-D copy (``cuMemcpy2DAsync``: ``rows`` rows of ``width`` items, each side with
    its own row pitch; ``back`` and ``host`` of one dtype), instead of one copy per row."""
    if config.ENABLE_CUDASIM:
        for k in range(rows):
            back[k, src_lo : src_lo + width].copy_to_host(host[k, dst_lo : dst_lo + width], stream=stream)
        return
    from numba.cuda.cudadrv import driver

    b = driver.binding
    item = back.dtype.itemsize
    p = b.CUDA_MEMCPY2D()
    p.srcMemoryType = b.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcDevice = driver.device_pointer(back.gpu_data) + src_lo * item
    p.srcPitch = back.strides[0]
    p.dstMemoryType = b.CUmemorytype.CU_MEMORYTYPE_HOST
    p.dstHost = host.ctypes.data + dst_lo * item
    p.dstPitch = host.strides[0]
    p.WidthInBytes = width * item
    p.Height = rows
    driver.driver.cuMemcpy2DAsync(p, driver._stream_handle(stream))


class Pending:
    """Results of :func:`submit_features` in flight on the device.

    :meth:`result` waits for them and returns the pinned host matrix ``(n_out, n)``. Until
    then the call's input columns are kept alive here (the device reads them asynchronously).
    """

    def __init__(self, host: np.ndarray, done, cols: dict[str, np.ndarray] | None) -> None:
        self._host, self._done, self._cols = host, done, cols

    def result(self) -> np.ndarray:
        """The results (blocks until the device has sent them back)."""
        if self._done is not None:
            self._done.synchronize()
            self._done = self._cols = None
        return self._host


def run_features(cols: dict[str, np.ndarray], plan: Plan, chunk: int | None = None, dtype=np.float64) -> np.ndarray:
    """Compute every feature on the device; returns the pinned host matrix ``(n_out, n)``.

    ``submit_features(...).result()``: see :func:`submit_features`.
    """
    return submit_features(cols, plan, chunk, dtype).result()


def submit_features(
    cols: dict[str, np.ndarray], plan: Plan, chunk: int | None = None, dtype=np.float64, overlapped: bool = False
) -> Pending:
    """Start computing every feature on the device; :meth:`Pending.result` gives the pinned
    host matrix ``(n_out, n)``.

    ``cols``: contiguous host columns (``ts_recv`` int64 ns; ``bid_px, ask_px, bid_sz,
    ask_sz`` float64 (n, L); ``buy_volume, sell_volume, trade_count`` float64 (n,)).
    ``chunk``: rows per scan thread (default :data:`CHUNK`). ``dtype``: float64 (default) or
    float32; float32 results are the float64 ones rounded once on the device (half the bytes
    to copy back).

    The rows go through in steps (:func:`_step_bounds`) on three streams: host threads copy
    step k+1 into a pinned staging slot (columns already in page-locked memory, see
    :func:`is_pinned`, are sent from where they are) while the DMA engine sends step k and the
    kernels compute it, and the results of each step come back (one 2-D copy) while the next
    is computed. Every input row goes to the device once, every result comes back once.
    Recurrences carry exactly from one step to the next (the scans start from the state and
    the last finite row before the step), fractional differencing reads the window of earlier
    steps on the device, so the steps change nothing in the values.

    The streams are kept between calls and consecutive calls use two sets of device buffers
    in turn, so a call made before the previous one's results are back overlaps with it: its
    input copies run while the previous segment is computed and its results copied back
    (:func:`compute_features_cuda_many` streams a sequence of segments this way). On the
    device a call waits only for the call two before it, the last one that used the same
    buffers: its copies in wait for that call's kernels, its kernels for that call's copies
    back. ``overlapped``: such a call is in flight, so this one needs no quick pipeline fill
    and drain: fewer, larger steps (:func:`_step_bounds`), less host time per row.
    """
    chunk = max(1, CHUNK if chunk is None else int(chunk))
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise UsageError("dtype", "expected float64 or float32", str(dtype))
    n = int(cols["ts_recv"].shape[0])
    n_out = plan.n_out
    S = int(plan.s_kind.shape[0])
    if S > MAX_SERIES:
        raise UsageError("features", f"the plan has {S} recurrences, the kernels hold at most {MAX_SERIES}")
    bufs = buffers()
    with bufs.lock:
        if n == 0:
            return Pending(np.empty((n_out, 0), dtype=dtype), None, None)
        st = bufs.streams()
        s_h2d, s_comp, s_d2h = st["h2d"], st["comp"], st["d2h"]
        ev_in = st["ev_in"]
        k_set = st["calls"] % 2  # device buffer set of this call
        st["calls"] += 1
        prev = st["free"].get(k_set)
        if prev is not None:  # the set's last user: its kernels read the inputs, its copies the results
            prev[0].wait(s_h2d)
            prev[1].wait(s_comp)
        host = bufs.result_buffer((n_out, n), dtype)
        step, bounds = _step_bounds(n, overlapped)
        n_steps = len(bounds)
        d = {k: bufs.dev(f"in_{k}/{k_set}", v.shape, v.dtype) for k, v in cols.items()}
        out = bufs.dev(f"out/{k_set}", (n_out + 1, n))
        back = out if dtype == np.float64 else bufs.dev(f"out32/{k_set}", (n_out, n), np.float32)
        dv = DeviceSegment(bufs, plan, d, out, bufs.dev(f"last/{k_set}", (N_LF, n)),
                            bufs.dev(f"X/{k_set}", (S, n)), chunk, s_comp)  # fmt: skip
        staged = {} if config.ENABLE_CUDASIM else {k: v for k, v in cols.items() if not is_pinned(v)}
        slots = bufs.slots(staged, step) if staged else None
        slot_of = [(st["slot"] + q) % N_SLOTS for q in range(n_steps)]
        st["slot"] += n_steps
        ev_done = cuda.event()
        fills: dict[int, list] = {}

        def start_fill(q: int) -> None:
            if slots is None or q >= n_steps:
                return
            ev_in[slot_of[q]].synchronize()  # the slot's previous DMA (this call's or an earlier one's) is done
            fills[q] = _fill_async(bufs.executor(), slots[slot_of[q]], staged, *bounds[q])

        start_fill(0)
        for q, (lo, hi) in enumerate(bounds):
            m = hi - lo
            slot = slot_of[q]
            start_fill(q + 1)  # the copy threads run one step ahead
            # ---- host -> device ----------------------------------------------------------
            for f in fills.pop(q, ()):
                f.result()
            for k, v in cols.items():
                to_device_rows(d[k], slots[slot][k][:m] if k in staged else v[lo:hi], lo, hi, s_h2d)
            ev_in[slot].record(s_h2d)
            ev_in[slot].wait(s_comp)
            # ---- kernels -----------------------------------------------------------------
            dv.step(lo, hi)
            if back is not out:
                cast_kernel[_cfg(n_out * m, s_comp)](out, back, lo, hi)
            ev_done.record(s_comp)
            # ---- device -> host, one 2-D copy --------------------------------------------
            ev_done.wait(s_d2h)
            to_host_2d(back, host, lo, lo, hi - lo, host.shape[0], s_d2h)
        inputs_read, done = cuda.event(), cuda.event()
        inputs_read.record(s_comp)
        done.record(s_d2h)
        st["free"][k_set] = (inputs_read, done)
        return Pending(host, done, cols)


class DeviceSegment:
    """The device arrays of one call and the kernels of one step (:meth:`step`), all derived
    from the plan: the input columns ``d``, the result matrix ``out`` (``n_out + 1`` rows: the
    last is the forward-filled log mid), ``last`` (last finite row + 1 per skip-NaN input) and
    ``X`` (recurrence states), on the compute stream ``stream``."""

    def __init__(self, bufs: Buffers, plan: Plan, d: dict, out, last, X, chunk: int, stream) -> None:
        small = bufs.plan_arrays(plan, stream)
        f2, _, _ = _dummies(bufs)
        self.bufs, self.plan, self.d, self.out, self.last, self.X = bufs, plan, d, out, last, X
        self.small, self.chunk, self.stream = small, chunk, stream
        self.rows_in = (d["bid_px"], d["ask_px"], d["bid_sz"], d["ask_sz"], d["ts_recv"], d["buy_volume"],
                        d["sell_volume"], d["trade_count"])  # fmt: skip
        # coefficient arguments of both scans (see _ab)
        self.coef_args = (f2, f2, out, small["layout"], d["ts_recv"], d["buy_volume"], d["sell_volume"],
                          d["trade_count"], last, small["s_kind"], small["s_code"], small["s_tau"], small["s_scale"],
                          plan.interp)  # fmt: skip
        self.declared = row_kernel(plan, "cuda")

    def step(self, lo: int, hi: int) -> None:
        """Every feature of rows ``[lo, hi)`` (the rows before already computed on the device)."""
        p, sm, out, s_comp, m = self.plan, self.small, self.out, self.stream, hi - lo
        rowwise_kernel[_cfg(m, s_comp)](*self.rows_in, p.tick, sm["layout"], sm["depth_w"], out, lo, hi)
        if self.declared is not None:
            self.declared[_cfg(m, s_comp)](*self.rows_in, out, lo, hi)
        _scan(self.bufs, MODE_LAST, N_LF, lo, m, self.last, self.coef_args, self.chunk, s_comp)
        _scan(self.bufs, MODE_REC, int(p.s_kind.shape[0]), lo, m, self.X, self.coef_args, self.chunk, s_comp)
        post_kernel[_cfg(m, s_comp)](
            self.X, self.last, sm["s_kind"], sm["s_code"], sm["p_int"], sm["p_tau"], p.tick, p.hawkes_mu,
            p.hawkes_alpha, out, lo, hi,
        )  # fmt: skip
        fracdiff_kernel[_cfg(m, s_comp)](out, p.n_out, p.fd_col, sm["fd_w"], lo, hi)


def triple_barrier_device(
    price: np.ndarray, upper: np.ndarray, lower: np.ndarray, h: int, ts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The triple barrier on the device (:func:`triple_barrier_kernel`): ``(label float64,
    t1 int64, touch index int64)``, each (n,), as :func:`alphafeat.labels.triple_barrier`
    computes them before its float32 cast. Inputs: contiguous float64 / int64 (n,)."""
    n = int(price.shape[0])
    y = np.empty(n, dtype=np.float64)
    t1 = np.empty(n, dtype=np.int64)
    k = np.empty(n, dtype=np.int64)
    if n == 0:
        return y, t1, k
    with buffers().lock, warnings.catch_warnings():
        # a short segment launches a small grid; numba's low-occupancy warning is noise here
        warnings.filterwarnings("ignore", message=".*Grid size .* low occupancy")
        d_in = [cuda.to_device(a) for a in (price, upper, lower, ts)]
        d_out = [cuda.device_array(n, dtype=a.dtype) for a in (y, t1, k)]
        triple_barrier_kernel[_grid(n)](d_in[0], d_in[1], d_in[2], int(h), d_in[3], *d_out)
        for dev, host in zip(d_out, (y, t1, k), strict=True):
            dev.copy_to_host(host)
    return y, t1, k


def direction_labels_device(mid: np.ndarray, horizons: np.ndarray) -> np.ndarray:
    """Direction labels on the device: float32 ``(len(horizons), n)``."""
    n = int(mid.shape[0])
    H = int(horizons.shape[0])
    host = pinned_empty((H, n), np.float32)
    if n == 0 or H == 0:
        return host
    d_mid = cuda.to_device(np.ascontiguousarray(mid, dtype=np.float64))
    d_h = cuda.to_device(np.ascontiguousarray(horizons, dtype=np.int64))
    y = cuda.device_array((H, n), dtype=np.float32)
    direction_labels_kernel[_grid(H * n)](d_mid, d_h, y)
    y.copy_to_host(host)
    return host
