"""CPU back end: numba ``njit`` kernels over blocks of rows, sequential or split into exact chunks.

Layout of the work
------------------
Rows are processed in blocks of :data:`BLOCK` rows. Within a block every feature is a loop
over a contiguous run of one output column (``out[c, b0:b1]``), the recurrences are loops
over contiguous coefficient rows, and the per-level book columns are read once into small
block-local arrays (empty levels masked once). Nothing is materialised at full size except
the output matrix itself.

Loops over a block avoid branches that depend on the data (``error_model="numpy"``: no
zero-division checks) so that LLVM can vectorise them:

* no libm call is left in the kernels. ``exp``, ``expm1``, ``log`` and ``log1p`` are our own
  branch-free float64 functions (:mod:`alphafeat.features._vmath`, inlined): Cody–Waite
  range reduction and polynomials (Taylor degree 13 for ``expm1`` of the reduced argument;
  fdlibm's minimax ``log`` kernel and ``log1p`` correction term; Muller, *Elementary
  Functions*, ch. 11), bits through int64 bit-casts, fused multiply-adds (``llvm.fma``),
  selects for the special values. Accuracy: under 1 ulp from the exact value, at most 1 ulp
  from libm on the whole float64 range (tests/test_fastmath.py); NaN, +-inf, +-0,
  subnormals and the overflow / underflow edges as libm. The CUDA path keeps libdevice,
  so CUDA and CPU differ by at most an ulp or two in these functions (well inside the
  1e-9 relative of the CUDA tests).
* ``exp(-dt/tau)`` and the 'linear' weight ``-expm1(-x)/x`` (``x = dt/tau``) of the common
  step ``dt = t_i - t_{i-1}``: one straight vectorised loop per distinct time constant fills
  both from one range reduction (:func:`vexp_expm1`; :func:`vexp` gives the same ``exp``);
  a Zumbach–Müller row whose last finite observation is older than the previous row (after
  a NaN run) gets its own factor in a patch-up pass (the same functions, scalar);
* ``log`` of the mid, of the spread and of the time step, and the post transforms
  ``log1p`` / signed ``log1p``, are vectorised loops over the block;
* ``log1p`` of integer-valued sizes, counts and flows, and ``log`` of the spread in ticks,
  come from tables filled with the same ``vlog1p`` / ``vlog``: a branch-free loop checks a
  block's column, which is then looked up (a scalar loop, cheaper still), or computed with
  the vectorised function when some value is not a table index (same values either way).
  Every CPU path (sequential, chunked modes, the skip-NaN carries of :func:`_z_at`, the
  window prefix of :func:`_fd_prefix`) gives the same value for the same argument;
* the coefficients ``(a_i, b_i)`` of every recurrence are built per block in vectorised
  loops, then one scan runs four recurrences side by side (their dependency chains overlap);
* fractional differencing accumulates ``w_k y_{i-k}`` for a block of rows, eight weights per
  pass (the sum of each row still runs k = 0, 1, ... as in the formula).

Sequential (one chunk): one pass, block by block (row-wise features, recurrences, post
transforms, fractional differencing). Chunked (k chunks, threads sharing the arrays; the
kernels release the GIL):

A. row-wise features of each chunk; per skip-NaN input, the chunk's last row with a finite
   value. Parent: for each chunk, the last finite row *before* it (``jprev``) -- the carry of
   the skip-NaN rule (the previous finite observation and its time are read at that row).
B. each recurrence ``x_i = a_i x_{i-1} + b_i`` composed over the chunk into ``(A, B)``.
   Parent: exact carries ``X_c = A_{c-1} X_{c-1} + B_{c-1}``, ``X_0 = 0``.
C. replay of the recurrences from ``X_c``, post-transforms (EMA masks, sqrt, z-scores,
   trend, logs) and fractional differencing; each chunk rebuilds the forward-filled log mid
   of the ``W - 1`` rows before it (the window overlap) from the mids of phase A.

With one chunk this is the sequential computation; with k chunks the only difference is the
association of the carries in B, so results agree to rounding (tests: 1e-12 relative).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from functools import lru_cache

import numpy as np

from alphafeat.arena import reserve
from alphafeat.cores import usable_cores
from alphafeat.errors import UsageError
from alphafeat.features.cpu_kernels import (
    LUT_N,
    Carry,
    Inputs,
    Kernel,
)
from alphafeat.features.cpu_kernels import (
    MODE_COMPOSE as _MODE_COMPOSE,
)
from alphafeat.features.cpu_kernels import (
    MODE_CONTINUE as _MODE_CONTINUE,
)
from alphafeat.features.cpu_kernels import (
    MODE_CONTINUE_SCAN as _MODE_CONTINUE_SCAN,
)
from alphafeat.features.cpu_kernels import (
    MODE_FUSED as _MODE_FUSED,
)
from alphafeat.features.cpu_kernels import (
    MODE_REPLAY as _MODE_REPLAY,
)
from alphafeat.features.cpu_kernels import (
    MODE_ROWWISE as _MODE_ROWWISE,
)
from alphafeat.features.cpu_kernels import (
    make_lut as _make_lut,
)
from alphafeat.features.cpu_kernels import (
    run_chunk as _run_chunk,
)
from alphafeat.features.declared import row_kernel
from alphafeat.features.registry import (
    K_DEV,
    K_FFILL,
    K_ZM,
    N_LF,
    Plan,
)

# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _lut() -> np.ndarray:
    """Row 0: ``vlog1p(k)``, row 1: ``vlog(k)``, k < :data:`LUT_N` (computed once, read-only)."""
    lut = _make_lut(LUT_N)
    lut.flags.writeable = False
    return lut


def _tau_tables(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct time constants of the plan, each series' index into them, and whether the
    'linear' weight is needed for each (a Zumbach–Müller series uses it)."""
    taus: list[float] = []
    tix = np.empty(plan.s_kind.shape[0], dtype=np.int64)
    for s, tau in enumerate(plan.s_tau):
        if plan.s_kind[s] == K_FFILL:  # no decay factor
            tix[s] = 0
            continue
        if float(tau) not in taus:
            taus.append(float(tau))
        tix[s] = taus.index(float(tau))
    nu = np.zeros(max(len(taus), 1), dtype=np.bool_)
    for s in range(plan.s_kind.shape[0]):
        if plan.s_kind[s] in (K_ZM, K_DEV) and plan.interp == 1:
            nu[tix[s]] = True
    return np.asarray(taus or [1.0], dtype=np.float64), tix, nu


def kernel_of(plan: Plan) -> Kernel:
    """The :class:`Kernel` record of ``plan`` (derived once per plan, kept in ``plan.derived``)."""
    kp = plan.derived.get("cpu_kernel")
    if kp is None:
        lut = _lut()
        taus, tix, tau_nu = _tau_tables(plan)
        kp = plan.derived["cpu_kernel"] = Kernel(
            plan.layout, plan.depth_w, plan.s_kind, plan.s_code, plan.s_tau, plan.s_scale, tix, taus, tau_nu,
            plan.p_int, plan.p_tau, plan.fd_w, lut[0], lut[1], float(plan.tick), float(plan.hawkes_mu),
            float(plan.hawkes_alpha), int(plan.interp), int(plan.n_out), int(plan.fd_col), int(plan.n_codes),
            int(plan.row_groups),
        )  # fmt: skip
    return kp


def inputs_of(cols: dict[str, np.ndarray]) -> Inputs:
    """:class:`Inputs` of the prepared columns (:func:`alphafeat.features.inputs.prepare`)."""
    return Inputs(cols["bid_px"], cols["ask_px"], cols["bid_sz"], cols["ask_sz"], cols["ts_recv"],
                  cols["buy_volume"], cols["sell_volume"], cols["trade_count"])  # fmt: skip


#: Result matrices (flat) of earlier calls; one is reused when no view of it is alive.
_OUT_POOL: list[np.ndarray] = []


_POOL_LOCK = threading.Lock()


def _out_buffer(shape: tuple[int, int]) -> np.ndarray:
    """float64 result matrix of ``shape``.

    The matrix of an earlier call is reused only when nothing refers to it any more (its
    reference count is back to the pool's own), so results the caller keeps are never
    overwritten; fresh memory is paid for in page faults on first touch (a large part of the
    time on some hosts). At most one matrix is kept; :func:`release_buffers` drops it.
    """
    size = int(np.prod(shape))
    with _POOL_LOCK:
        for buf in _OUT_POOL:
            # references: the pool list, the loop variable, getrefcount's argument
            if sys.getrefcount(buf) <= 3 and buf.size >= size:
                return buf[:size].reshape(shape)
        _OUT_POOL.clear()
        buf = np.empty(size)
        _OUT_POOL.append(buf)
        return buf.reshape(shape)


def release_buffers() -> None:
    """Drop the result matrix kept for reuse."""
    with _POOL_LOCK:
        _OUT_POOL.clear()


def _bounds(n: int, k: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, n, k + 1).round().astype(np.int64)
    return [(int(edges[c]), int(edges[c + 1])) for c in range(k) if edges[c + 1] > edges[c]]


def compute_cpu(cols: dict[str, np.ndarray], plan: Plan, n_chunks: int = 1, n_jobs: int | None = 1) -> np.ndarray:
    """All features as a float64 matrix ``(n_out, n)``.

    ``cols``: contiguous input columns (:func:`alphafeat.features.inputs.prepare`). ``n_chunks``:
    number of contiguous chunks (>= 1); ``n_jobs``: worker threads for the chunks (1:
    in-process, None or -1: all cores; joblib's threading backend, the kernels release the
    GIL). Results equal the sequential ones to rounding, on any split. The declared features
    (:func:`alphafeat.features.registry.register`) are filled by their generated row kernel
    (:func:`alphafeat.features.declared.row_kernel`) between the row-wise stage and the
    recurrences.
    """
    n = int(cols["ts_recv"].shape[0])
    n_chunks = max(1, min(int(n_chunks), max(n, 1)))
    if n_jobs is None or n_jobs < 0:
        n_jobs = usable_cores()
    n_jobs = max(1, min(int(n_jobs), n_chunks))
    if n == 0:
        return np.empty((plan.n_out, 0))
    out = _out_buffer((plan.n_out, n))
    inp = inputs_of(cols)
    kp = kernel_of(plan)
    declared = row_kernel(plan, "cpu")
    S = plan.s_kind.shape[0]
    no_cz, no_ct, no_y = np.zeros(N_LF), np.zeros(N_LF, dtype=np.int64), np.zeros(1)

    def chunk(mode: int, lo: int, hi: int, jprev: np.ndarray, x0: np.ndarray):
        lastf = np.full(N_LF, -1, dtype=np.int64)
        ab = np.empty((2, S))
        _run_chunk(mode, inp, kp, out, lo, hi, 0, Carry(x0, jprev, no_cz, no_ct, no_y), lastf, ab)
        if mode == _MODE_ROWWISE and declared is not None:
            declared(inp, out, lo, hi)
        return lastf if mode == _MODE_ROWWISE else ab

    none = np.full(N_LF, -1, dtype=np.int64)
    if n_chunks == 1:
        if declared is None:
            chunk(_MODE_FUSED, 0, n, none, np.zeros(S))
        else:  # the same operations, the row-wise stage (and the declared rows) first
            chunk(_MODE_ROWWISE, 0, n, none, np.zeros(S))
            chunk(_MODE_REPLAY, 0, n, none, np.zeros(S))
        return out
    bounds = _bounds(n, n_chunks)
    if n_jobs == 1:
        run = lambda tasks: [chunk(*t) for t in tasks]  # noqa: E731
    else:
        from joblib import Parallel, delayed

        par = Parallel(n_jobs=n_jobs, backend="threading")
        run = lambda tasks: par(delayed(chunk)(*t) for t in tasks)  # noqa: E731
    zero = np.zeros(S)
    lastf = run([(_MODE_ROWWISE, lo, hi, none, zero) for lo, hi in bounds])
    jprev = np.full((len(bounds), N_LF), -1, dtype=np.int64)
    for c in range(1, len(bounds)):
        jprev[c] = np.where(lastf[c - 1] >= 0, lastf[c - 1], jprev[c - 1])
    x0 = np.zeros((len(bounds), S))
    if len(bounds) > 1:
        abs_ = run([(_MODE_COMPOSE, lo, hi, jprev[c], zero) for c, (lo, hi) in enumerate(bounds[:-1])])
        for c in range(1, len(bounds)):
            A, B = abs_[c - 1]
            x0[c] = A * x0[c - 1] + B
    run([(_MODE_REPLAY, lo, hi, jprev[c], x0[c]) for c, (lo, hi) in enumerate(bounds)])
    return out


def row_columns(plan: Plan) -> frozenset[int]:
    """Columns the row-wise stage leaves final (no state: a function of rows i and i - 1,
    declared rows included): every output column but the post-transform targets and the
    fractional difference, which the recurrence stage writes."""
    rest = {int(c) for c in plan.p_int[:, 1]} | {int(plan.fd_col)}
    return frozenset(c for c in range(plan.n_out) if c not in rest)


def _rows_of(cols: dict[str, np.ndarray], i0: int, i1: int) -> dict[str, np.ndarray]:
    """Rows ``[i0, i1)`` of ``cols`` led by their halo row ``i0 - 1`` when ``i0 > 0``."""
    a = i0 - 1 if i0 > 0 else 0
    return {k: v[a:i1] for k, v in cols.items()}


#: Row-wise pieces a threaded stream computes ahead per pool thread (its result matrices: this
#: many per pool thread, and two more whose results are being taken).
_AHEAD = 2


class FeatureStream:
    """The CPU features of one segment computed block by block as its rows arrive.

    Each :meth:`push` runs the sequential kernel over the new rows, continuing from the carries
    of the rows before (a :class:`Carry`: recurrence states, the skip-NaN rule's last finite
    row, value and time per input, the fractional-difference window): the same operations in
    the same order as one :func:`compute_cpu` call over the whole segment, so the values are
    identical (``tests/test_segment.py``), while memory is one block's result matrix.

    :meth:`push_block` pushes a block in pieces; with ``threads > 1`` it splits each piece's
    work by feature along the kernel's own stages: the row-wise features (no state, the
    columns of :func:`row_columns`) of the coming pieces on ``threads - 1`` pool threads, the
    recurrences, post transforms and fractional difference (which carry state from piece to
    piece and read the row-wise mid, spread, return and signed volume) on the calling thread,
    piece by piece in order; the caller's copies of the results on the pool threads. Every
    feature is computed by the same code on the same rows as in one :meth:`push` (the kernels
    release the GIL), so the values are identical whatever the thread count
    (``tests/test_features_threads.py``).

    Parameters
    ----------
    plan : Plan
        :func:`alphafeat.features.registry.make_plan` of the feature parameters.
    max_rows : int
        Most new rows one push (one piece of :meth:`push_block`) may bring (the result
        matrices are allocated once for them).
    threads : int
        Most threads :meth:`push_block` computes on (1: the calling thread only); each call
        may use fewer (its ``threads``). The pool threads start at the first call using them.
    """

    def __init__(self, plan: Plan, max_rows: int, threads: int = 1) -> None:
        S = plan.s_kind.shape[0]
        W = plan.fd_w.shape[0]
        self.plan = plan
        self.rows = 0  # segment rows pushed so far
        self.carry = Carry(np.zeros(S), np.full(N_LF, -1, dtype=np.int64), np.zeros(N_LF),
                           np.zeros(N_LF, dtype=np.int64), np.full(max(W - 1, 1), np.nan))  # fmt: skip
        self.max_rows = int(max_rows)
        # one flat buffer; each push views its start as a C-contiguous (n_out, rows) matrix, so the
        # kernel has one compiled form (a column slice of a wider matrix would be another: a second
        # cached version for numba to load in every process)
        self.out = reserve("features:stream", (plan.n_out * (self.max_rows + 1),), np.float64)
        self._kernel = kernel_of(plan)
        self._declared = row_kernel(plan, "cpu")
        self.threads = max(1, int(threads))
        self.row_cols = row_columns(plan)
        self.rest_cols = frozenset(range(plan.n_out)) - self.row_cols
        self.all_cols = frozenset(range(plan.n_out))
        # the row-wise stage's carry: read by the kernel (copied), never changed
        self._still = Carry(np.zeros(S), np.full(N_LF, -1, dtype=np.int64), np.zeros(N_LF),
                            np.zeros(N_LF, dtype=np.int64), np.zeros(1))  # fmt: skip
        self._pool = None  # the pool threads and their result buffers, made at the first threaded push_block
        self._ring: list[np.ndarray] = []

    def close(self) -> None:
        """Let the pool threads go (a threaded stream)."""
        if self._pool is not None:
            self._pool.shutdown()

    def push(self, cols: dict[str, np.ndarray], halo: bool) -> np.ndarray:
        """Features of the new rows of ``cols`` as a float64 view ``(n_out, m)``, valid until
        the next push.

        ``cols``: contiguous input columns (:func:`alphafeat.features.inputs.prepare`) of the new
        rows, preceded when ``halo`` by the last row of the previous push (the row-wise
        differences read it). The first push has no halo.
        """
        n = self._check(cols, halo)
        out = self._matrix(self.out, n)
        if n - halo <= 0:
            return out[:, :0]
        if self._declared is None:
            return self._continue(_MODE_CONTINUE, cols, halo, out)
        self._row_stage(cols, halo, out)  # row-wise stage, declared rows, then the rest
        return self._continue(_MODE_CONTINUE_SCAN, cols, halo, out)

    def push_block(self, cols: dict[str, np.ndarray], lo: int,
                   take: Callable[[int, int, np.ndarray, frozenset[int]], None], threads: int | None = None) -> None:
        """Push rows ``lo`` on of ``cols`` (row ``lo - 1`` is the halo when ``lo > 0``; ``lo`` is
        0 only for the first push) in pieces of at most ``max_rows`` rows, on ``threads`` threads
        (default and at most the stream's ``threads``; it may change from block to block).

        For each piece ``[i0, i1)`` of ``cols``, ``take(i0, i1, out, which)`` gets its features,
        ``out`` a float64 view ``(n_out, i1 - i0)`` valid during the call, of which the columns
        in ``which`` are final: with one thread, one call per piece with :attr:`all_cols`, in
        order; with more, on the pool threads in any order, one call with :attr:`row_cols`
        (after the piece's row-wise stage) and one with :attr:`rest_cols` (after its
        recurrences, which run on the calling thread in row order). Every call is done when
        this returns.
        """
        n = int(cols["ts_recv"].shape[0])
        spans = [(i0, min(i0 + self.max_rows, n)) for i0 in range(lo, n, self.max_rows)]
        use = self.threads if threads is None else max(1, min(int(threads), self.threads))
        if use == 1:
            for i0, i1 in spans:
                take(i0, i1, self.push(_rows_of(cols, i0, i1), i0 > 0), self.all_cols)
            return
        from concurrent.futures import wait

        pool, ring = self._threaded(use)
        rows, rest = [], []  # per piece: its row-wise stage, the take of its other columns
        try:
            for j, (i0, i1) in enumerate(spans):
                # row-wise stages ahead, each in the buffer of the piece len(ring) before, taken by now
                while len(rows) < min(j + len(ring) - 1, len(spans)):
                    k = len(rows)
                    if k >= len(ring):
                        rest[k - len(ring)].result()
                    rows.append(pool.submit(self._rows_piece, cols, spans[k], ring[k % len(ring)], take))
                rows[j].result()
                piece = _rows_of(cols, i0, i1)
                out = self._matrix(ring[j % len(ring)], self._check(piece, i0 > 0))
                new = self._continue(_MODE_CONTINUE_SCAN, piece, i0 > 0, out)
                rest.append(pool.submit(take, i0, i1, new, self.rest_cols))
        finally:
            wait(rows + rest)  # nothing of the block is read after this returns
        for f in rest:
            f.result()

    def _threaded(self, use: int) -> tuple[object, list[np.ndarray]]:
        """The pool (``threads - 1`` threads, made once) and the result buffers of a push_block
        on ``use`` threads: :data:`_AHEAD` pieces ahead per pool thread used."""
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="features-rows")
            self._ring = [reserve(f"features:ring{k}", self.out.shape, np.float64)
                          for k in range(_AHEAD * (self.threads - 1) + 2)]  # fmt: skip
        return self._pool, self._ring[: _AHEAD * (use - 1) + 2]

    def _rows_piece(self, cols: dict[str, np.ndarray], span: tuple[int, int], buf: np.ndarray,
                    take: Callable[[int, int, np.ndarray, frozenset[int]], None]) -> None:
        """A pool thread's part of :meth:`push_block`: the row-wise stage of one piece into ``buf``."""
        i0, i1 = span
        lo = 1 if i0 > 0 else 0
        out = self._matrix(buf, i1 - i0 + lo)
        self._row_stage(_rows_of(cols, i0, i1), i0 > 0, out)
        take(i0, i1, out[:, lo:], self.row_cols)

    def _matrix(self, buf: np.ndarray, n: int) -> np.ndarray:
        """The start of the flat ``buf`` as a C-contiguous ``(n_out, n)`` matrix."""
        return buf[: self.plan.n_out * n].reshape(self.plan.n_out, n)

    def _check(self, cols: dict[str, np.ndarray], halo: bool) -> int:
        """Rows of ``cols`` (halo included); UsageError on a halo out of place or too many rows."""
        n = int(cols["ts_recv"].shape[0])
        if halo != (self.rows > 0):
            raise UsageError("halo", "FeatureStream.push: the first push has no halo row, every later push has one")
        if n - halo > self.max_rows:
            raise UsageError("cols", f"FeatureStream.push: {n - halo} rows, more than max_rows = {self.max_rows}")
        return n

    def _row_stage(self, cols: dict[str, np.ndarray], halo: bool, out: np.ndarray) -> None:
        """The row-wise features and declared rows of the new rows of ``cols`` into ``out``
        (they read rows i and i - 1 only: no carry, any thread, any order)."""
        n = out.shape[1]
        lo = 1 if halo else 0
        lastf, ab = np.empty(N_LF, np.int64), np.empty((2, self.plan.s_kind.shape[0]))
        _run_chunk(_MODE_ROWWISE, inputs_of(cols), self._kernel, out, lo, n, 0, self._still, lastf, ab)
        if self._declared is not None:
            self._declared(inputs_of(cols), out, lo, n)

    def _continue(self, mode: int, cols: dict[str, np.ndarray], halo: bool, out: np.ndarray) -> np.ndarray:
        """Kernel ``mode`` (fused, or the stages after the row-wise one) over the new rows of
        ``cols`` into ``out``, continuing the carry; returns the new rows' columns."""
        n = out.shape[1]
        lo = 1 if halo else 0
        g0 = self.rows - lo  # segment row of array row 0
        far = np.int64(2**62)  # a last finite row before the arrays: "seen, not the previous row"
        cj = self.carry.cj
        jloc = np.where(cj >= 0, np.maximum(cj - g0, 0), -1)
        jloc = np.where((cj >= 0) & (cj < g0), far, jloc).astype(np.int64)
        io = self.carry._replace(cj=jloc)
        lastf, ab = np.empty(N_LF, np.int64), np.empty((2, self.plan.s_kind.shape[0]))
        _run_chunk(mode, inputs_of(cols), self._kernel, out, lo, n, g0, io, lastf, ab)
        self.carry = io._replace(cj=np.where((jloc >= 0) & (jloc < far) & (jloc >= lo), jloc + g0, cj))
        self.rows += n - lo
        return out[:, lo:]
