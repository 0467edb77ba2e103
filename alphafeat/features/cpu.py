"""CPU back end: numba ``njit`` drivers, sequential or split into exact chunks.

A segment of n rows is cut into ``n_chunks`` contiguous chunks and processed in four
phases; each phase runs the chunks independently (in-process or in joblib worker processes
sharing memory-mapped arrays), and the parent combines small carries in between:

A. row-wise features of the chunk (rows i and i-1 only); per skip-NaN input, the chunk's
   last row with a finite value.
   Parent: for each chunk, the last finite row *before* it (``jprev``) -- the carry of the
   skip-NaN rule (the previous finite observation and its time are read at that row).
B. each recurrence ``x_i = a_i x_{i-1} + b_i`` composed over the chunk into ``(A, B)``.
   Parent: exact carries ``X_c = A_{c-1} X_{c-1} + B_{c-1}``, ``X_0 = 0``.
C. replay of the recurrences from ``X_c``, post-transforms (EMA masks, sqrt, z-scores,
   trend, logs) and the forward-filled log mid (scratch row).
D. fixed-window fractional differencing; each chunk reads the ``W - 1`` rows before it,
   written in phase C (the window overlap).

With one chunk this is the sequential computation; with k chunks the only difference is the
association of the carries in B, so results agree to rounding (tests: 1e-12 relative).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import numba
import numpy as np

from alphafeat.features import _twin
from alphafeat.features.registry import N_LF, Plan

R = _twin.load("cpu")

_INPUTS = ("bid_px", "ask_px", "bid_sz", "ask_sz", "ts_recv", "buy_volume", "sell_volume", "trade_count")


@numba.njit(cache=True, nogil=True)
def _phase_a(bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, cnt, tick, L, depth_w, out, lo, hi, lastf):
    for i in range(lo, hi):
        R.rowwise_row(bid_px, ask_px, bid_sz, ask_sz, ts, buy, sell, cnt, tick, L, depth_w, out, i)
    for k in range(N_LF):
        lastf[k] = -1
        for i in range(hi - 1, lo - 1, -1):
            if math.isfinite(R.z_input(k, i, out, L, buy, sell, cnt)):
                lastf[k] = i
                break


@numba.njit(cache=True, nogil=True)
def _phase_scan(
    mode, ts, buy, sell, cnt, L, out, lo, hi, jprev, x0,
    s_kind, s_code, s_tau, s_scale, interp, p_int, p_tau, tick, h_mu, h_alpha, ab,
):  # fmt: skip
    """mode 0: compose the chunk into ab[0] = A, ab[1] = B; mode 1: replay from x0 + post."""
    S = s_kind.shape[0]
    j = jprev.copy()
    x = x0.copy()
    A = np.ones(S)
    B = np.zeros(S)
    st = np.zeros(S, dtype=np.bool_)
    for i in range(lo, hi):
        for s in range(S):
            c = s_code[s]
            jj = j[c] if c < N_LF else -1
            a, b = R.coef(s_kind[s], c, s_tau[s], s_scale[s], interp, i, jj, out, L, ts, buy, sell, cnt)
            if mode == 0:
                A[s] = a * A[s]
                B[s] = a * B[s] + b
            else:
                x[s] = a * x[s] + b
        for c in range(N_LF):
            if math.isfinite(R.z_input(c, i, out, L, buy, sell, cnt)):
                j[c] = i
        if mode == 1:
            for s in range(S):
                st[s] = s_kind[s] == 3 or j[s_code[s]] >= 0
            R.post_row(x, st, p_int, p_tau, tick, h_mu, h_alpha, out, i)
    if mode == 0:
        ab[0, :] = A
        ab[1, :] = B


@numba.njit(cache=True, nogil=True)
def _phase_d(out, scratch, fd_col, w, lo, hi):
    y = out[scratch]
    for i in range(lo, hi):
        out[fd_col, i] = R.fracdiff_row(y, w, i)


# --------------------------------------------------------------------------------------------
# chunk tasks (run in-process or in a joblib worker)
# --------------------------------------------------------------------------------------------


def _open(arrs: dict) -> dict[str, np.ndarray]:
    """Materialise a task's arrays: in-process arrays pass through, paths are memory-mapped."""
    return {k: (np.load(v, mmap_mode="r+") if isinstance(v, str) else v) for k, v in arrs.items()}


def _task(phase: str, arrs: dict, plan: Plan, lo: int, hi: int, jprev=None, x0=None):
    a = _open(arrs)
    out = a["out"]
    L = plan.layout
    if phase == "A":
        lastf = np.empty(N_LF, dtype=np.int64)
        _phase_a(a["bid_px"], a["ask_px"], a["bid_sz"], a["ask_sz"], a["ts_recv"], a["buy_volume"],
                 a["sell_volume"], a["trade_count"], plan.tick, L, plan.depth_w, out, lo, hi, lastf)  # fmt: skip
        return lastf
    if phase in ("B", "C"):
        S = plan.s_kind.shape[0]
        ab = np.empty((2, S))
        _phase_scan(0 if phase == "B" else 1, a["ts_recv"], a["buy_volume"], a["sell_volume"], a["trade_count"],
                    L, out, lo, hi, jprev, x0 if x0 is not None else np.zeros(S), plan.s_kind, plan.s_code,
                    plan.s_tau, plan.s_scale, plan.interp, plan.p_int, plan.p_tau, plan.tick, plan.hawkes_mu,
                    plan.hawkes_alpha, ab)  # fmt: skip
        return ab
    _phase_d(out, plan.n_out, plan.fd_col, plan.fd_w, lo, hi)
    return None


def _bounds(n: int, k: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, n, k + 1).round().astype(np.int64)
    return [(int(edges[c]), int(edges[c + 1])) for c in range(k) if edges[c + 1] > edges[c]]


def _tmpdir(nbytes: int) -> str:
    """A temp directory for shared arrays: /dev/shm when it has room, else the system one."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and shutil.disk_usage(shm).free > 1.2 * nbytes:
            return tempfile.mkdtemp(prefix="alphafeat-", dir=shm)
    except OSError:
        pass
    return tempfile.mkdtemp(prefix="alphafeat-")


def compute_cpu(cols: dict[str, np.ndarray], plan: Plan, n_chunks: int = 1, n_jobs: int | None = 1) -> np.ndarray:
    """All features as a float64 matrix ``(n_out + 1, n)`` (last row: scratch).

    ``cols``: contiguous input columns (:func:`alphafeat.features._prepare`). ``n_chunks``:
    number of contiguous chunks (>= 1); ``n_jobs``: joblib worker processes (1: in-process,
    None or -1: all cores). Results equal the sequential ones to rounding, on any split.
    """
    n = int(cols["ts_recv"].shape[0])
    n_chunks = max(1, min(int(n_chunks), max(n, 1)))
    if n_jobs is None or n_jobs < 0:
        n_jobs = os.cpu_count() or 1
    n_jobs = max(1, min(int(n_jobs), n_chunks))
    shape = (plan.n_out + 1, n)
    if n == 0:
        return np.empty(shape)
    bounds = _bounds(n, n_chunks)
    tmp = None
    if n_jobs == 1:
        arrs: dict = {**cols, "out": np.empty(shape)}
        run = lambda tasks: [_task(*t) for t in tasks]  # noqa: E731
    else:
        from joblib import Parallel, delayed

        nbytes = 8 * shape[0] * n + sum(v.nbytes for v in cols.values())
        tmp = _tmpdir(nbytes)
        arrs = {}
        for k, v in cols.items():
            path = os.path.join(tmp, f"{k}.npy")
            m = np.lib.format.open_memmap(path, mode="w+", dtype=v.dtype, shape=v.shape)
            m[...] = v
            del m
            arrs[k] = path
        arrs["out"] = os.path.join(tmp, "out.npy")
        np.lib.format.open_memmap(arrs["out"], mode="w+", dtype=np.float64, shape=shape)
        par = Parallel(n_jobs=n_jobs, backend="loky")
        run = lambda tasks: par(delayed(_task)(*t) for t in tasks)  # noqa: E731
    try:
        lastf = run([("A", arrs, plan, lo, hi) for lo, hi in bounds])
        jprev = np.full((len(bounds), N_LF), -1, dtype=np.int64)
        for c in range(1, len(bounds)):
            jprev[c] = np.where(lastf[c - 1] >= 0, lastf[c - 1], jprev[c - 1])
        S = plan.s_kind.shape[0]
        x0 = np.zeros((len(bounds), S))
        if len(bounds) > 1:
            abs_ = run([("B", arrs, plan, lo, hi, jprev[c]) for c, (lo, hi) in enumerate(bounds[:-1])])
            for c in range(1, len(bounds)):
                A, B = abs_[c - 1]
                x0[c] = A * x0[c - 1] + B
        run([("C", arrs, plan, lo, hi, jprev[c], x0[c]) for c, (lo, hi) in enumerate(bounds)])
        run([("D", arrs, plan, lo, hi) for lo, hi in bounds])
        out = arrs["out"]
        if isinstance(out, str):
            out = np.load(out, mmap_mode="r+").view(np.ndarray)  # the mapping outlives the unlink
        return out
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
