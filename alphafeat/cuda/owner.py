"""One GPU owner per device: the features of every segment's blocks, streamed, in bounded memory.

An :class:`Owner` is a thread that holds one device's CUDA context and all of its device
memory; segments (on any thread of the process) open an :class:`OwnerStream` each and push
their feature-input blocks (:func:`alphafeat.features.inputs.prepare` columns) in row order,
as they would to the CPU's :class:`alphafeat.features.cpu.FeatureStream`: each push after the
first led by the previous push's last row (the *halo*), the features of the new rows returned.
:class:`Owners` spreads segments over several devices (``cuda:0,1``: one owner each).
``precompute --device cuda`` reaches the owners from its worker processes through
:mod:`alphafeat.cuda.hub` (:meth:`OwnerStream.submit`: blocks in shared-memory slots, several
queued per stream); :func:`shared` gives a process's own (a Dask worker's segments).

How a block continues its segment exactly: the owner keeps, per open stream, a small *carry*
on the device (what the CPU stream's :class:`alphafeat.features.cpu.Carry` holds): the
recurrence states after the last row, the flag "a finite value was seen" per skip-NaN input
with a copy of that last finite row (its output column and ``ts_recv``, buy / sell volume,
trade count: the *ghost* rows the skip-NaN coefficients read), and the ``W - 1`` forward-filled
log mids the fractional difference reads before the block. Before a block's kernels
(:class:`alphafeat.cuda.kernels.DeviceSegment`, the same as the whole-segment path) the carry
is laid out in front of it on the device (:func:`load_prefix_kernel`): rows
``[0, N_LF)`` the ghost rows, then the window, the halo row last, so the kernels see a segment
whose earlier rows are exactly what they read; after them :func:`save_carry_kernel` takes the
new carry. The first block of a segment has no prefix (its row 0 is the segment's), so the
values are those of one call over the whole segment (``tests/test_cuda_owner.py``: blocks of
one row, blocks cutting every recurrence, NaN runs longer than a block).

Memory: per owner, :data:`SETS` sets of device buffers sized by the block (``block_rows``
plus the prefix; blocks take them in turn, each set on its own CUDA stream, so blocks of
different segments overlap on the device), one carry per *open* stream (reused after :meth:`OwnerStream.close`)
and, per open stream, one pinned host buffer of inputs and one of results (only the rows the
stream selects come back): GPU memory does not grow with the number of segments, only with
those open at once. Counted by :attr:`Owner.allocations`. A GPU that runs out of memory is an
:class:`~alphafeat.errors.AlphafeatError` naming the stream's segment (``where``).

Labels stay on the CPU (:class:`alphafeat.labels.LabelStream`): they look ahead, past the block.
"""

from __future__ import annotations

import collections
import functools
import math
import queue
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np
from numba import config, cuda

from alphafeat.cuda import kernels as K
from alphafeat.cuda.slots import IN_COLS, LEVEL_COLS
from alphafeat.errors import AlphafeatError, UsageError
from alphafeat.features.registry import N_LF, Plan

#: Rows of a block at most by default (the device buffers and pinned buffers are sized for it).
BLOCK_ROWS = 1 << 16
#: Device buffer sets of an owner, each with its CUDA stream: at most this many blocks in flight
#: (a block's kernels fill a small part of the device, so blocks of different segments can run
#: side by side; with two, 16 segments queued behind the owner: docs/performance.md, "--device cuda").
SETS = 4


def parse_devices(text: str, count: int | None = None) -> list[int]:
    """Device ids of ``--device``: ``cuda`` every visible device (``count``, default
    ``len(cuda.gpus)``), ``cuda:1`` or ``cuda:0,1`` those listed. ``UsageError`` otherwise."""
    if count is None:
        count = len(cuda.gpus)
    text = text.strip()
    if text == "cuda":
        return list(range(max(int(count), 1)))
    head, _, tail = text.partition(":")
    try:
        ids = [int(x) for x in tail.split(",")] if head == "cuda" and tail else None
    except ValueError:
        ids = None
    if not ids or len(set(ids)) != len(ids) or any(i < 0 or i >= count for i in ids):
        raise UsageError("--device", f"expected cuda or cuda:I[,J...] with ids below {count}", text)
    return ids


@cuda.jit(cache=True)
def load_prefix_kernel(G, g_out, g_ts, g_f, win, cx, flag, out, ts, buy, sell, cnt, last, X):
    """Lay the carry out in front of a block that starts at row ``G``: ghost row c at row c
    (output column, ``ts``, buy, sell, count), the window into the scratch row from row
    ``N_LF``, the states and last-finite markers (ghost c + 1, 0: none) at row ``G - 1``."""
    NL = g_out.shape[0]
    R = g_out.shape[1]
    WW = win.shape[0]
    S = cx.shape[0]
    total = max(NL * R, max(WW, S))
    for idx in range(cuda.grid(1), total, cuda.gridsize(1)):
        if idx < NL * R:
            c = idx // R
            r = idx - c * R
            out[r, c] = g_out[c, r]
        if idx < NL:
            ts[idx] = g_ts[idx]
            buy[idx] = g_f[0, idx]
            sell[idx] = g_f[1, idx]
            cnt[idx] = g_f[2, idx]
            last[idx, G - 1] = idx + 1.0 if flag[idx] != 0 else 0.0
        if idx < WW:
            out[R - 1, NL + idx] = win[idx]
        if idx < S:
            X[idx, G - 1] = cx[idx]


@cuda.jit(cache=True)
def save_carry_kernel(G, m, out, ts, buy, sell, cnt, last, X, g_out, g_ts, g_f, win, cx, flag):
    """The carry after the block of rows ``[G, G + m)``: each skip-NaN input's last finite row
    (anywhere in the prefix or the block) copied to its ghost row, the last ``WW`` scratch
    values (NaN before the segment's row 0), the states of the last row."""
    NL = g_out.shape[0]
    R = g_out.shape[1]
    WW = win.shape[0]
    S = cx.shape[0]
    end = G + m - 1
    total = max(NL * R, max(WW, S))
    for idx in range(cuda.grid(1), total, cuda.gridsize(1)):
        if idx < NL * R:
            c = idx // R
            r = idx - c * R
            j = int(last[c, end]) - 1
            if j >= 0:
                g_out[c, r] = out[r, j]
                if r == 0:
                    g_ts[c] = ts[j]
                    g_f[0, c] = buy[j]
                    g_f[1, c] = sell[j]
                    g_f[2, c] = cnt[j]
            if r == 0:
                flag[c] = 1 if j >= 0 else 0
        if idx < WW:
            q = G + m - WW + idx
            win[idx] = out[R - 1, q] if q >= 0 else math.nan
        if idx < S:
            cx[idx] = X[idx, end]


@cuda.jit(cache=True)
def pack_rows_kernel(src, idx, dst, lo, m):
    """Thread (r, t): ``dst[r, lo + t] = src[idx[r], lo + t]`` (rounded to ``dst``'s dtype): the
    result rows a stream asked for, packed for one copy back."""
    for q in range(cuda.grid(1), idx.shape[0] * m, cuda.gridsize(1)):
        r = q // m
        i = lo + q - r * m
        dst[r, i] = src[idx[r], i]


def _shape_key(plan: Plan) -> tuple[int, int, int]:
    """``(n_out, window rows WW, recurrences S)`` of a plan: what its buffers' shapes depend on."""
    return int(plan.n_out), max(int(plan.fd_w.shape[0]) - 1, 1), int(plan.s_kind.shape[0])


class _Carry:
    """One open stream's carry on the device (see the module docstring)."""

    def __init__(self, alloc: Callable, key: tuple[int, int, int]) -> None:
        n_out, ww, S = key
        self.key = key
        self.g_out = alloc((N_LF, n_out + 1), np.float64)
        self.g_ts = alloc((N_LF,), np.int64)
        self.g_f = alloc((3, N_LF), np.float64)
        self.win = alloc((ww,), np.float64)
        self.cx = alloc((S,), np.float64)
        self.flag = alloc((N_LF,), np.int64)

    def args(self) -> tuple:
        return self.g_out, self.g_ts, self.g_f, self.win, self.cx, self.flag


class _Set:
    """One of the owner's sets of device buffers (rows: the prefix and a block) with its
    CUDA stream and its own :class:`alphafeat.cuda.kernels.Buffers` (scan scratch, plan arrays)."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.bufs = K.Buffers()
        self.stream = cuda.stream()
        self._segs: dict[tuple, tuple] = {}

    def arrays(self, plan: Plan, levels: int) -> tuple[int, dict, object, object]:
        """``(prefix rows G, input arrays, the DeviceSegment, a result matrix (n_out, C) of the
        owner's dtype)`` for ``plan`` and books of ``levels`` levels (made once per distinct
        plan); the result matrix takes the rows a stream selects, or the float32 results."""
        n_out, ww, S = _shape_key(plan)
        G = N_LF + ww
        key = (id(plan), levels, self.owner.dtype.str)
        got = self._segs.get(key)
        if got is None:
            C = G + self.owner.block_rows
            a = self.owner.alloc
            d = {k: a((C, levels) if k in ("bid_px", "ask_px", "bid_sz", "ask_sz") else (C,),
                      np.int64 if k == "ts_recv" else np.float64) for k in IN_COLS}  # fmt: skip
            out, last, X = a((n_out + 1, C), np.float64), a((N_LF, C), np.float64), a((S, C), np.float64)
            dv = K.DeviceSegment(self.bufs, plan, d, out, last, X, K.CHUNK, self.stream)
            out32 = a((n_out, C), self.owner.dtype)
            self._prime_scans(plan, C)
            if len(self._segs) >= 8:
                self._segs.clear()
            got = self._segs[key] = (G, d, dv, out32, plan)  # the plan kept: its id stays unique
        return got[:4]

    def _prime_scans(self, plan: Plan, C: int) -> None:
        """The scan scratch at its largest (a block of C rows), so that no later block grows it."""
        nc = (C + K.CHUNK - 1) // K.CHUNK
        for mode, S in ((K.MODE_LAST, N_LF), (K.MODE_REC, int(plan.s_kind.shape[0]))):
            for name in ("scanA", "scanB", "scanY"):
                self.bufs.dev(f"{name}{mode}", (S, nc))


class _Job:
    """One block of one stream, in flight through the owner: its inputs ``host_in`` (rows
    ``[0, n)``) and where its results go (``host_out``), both page-locked host memory."""

    def __init__(self, stream: OwnerStream, n: int, halo: bool, host_in: dict[str, np.ndarray],
                 host_out: np.ndarray) -> None:  # fmt: skip
        self.stream, self.n, self.halo = stream, n, halo
        self.host_in, self.host_out = host_in, host_out
        self.future: Future = Future()
        self.done = None  # the CUDA event after its copy back


class Owner:
    """The thread that owns one device: every CUDA call of the streams it serves runs on it.

    Parameters
    ----------
    device : int
        CUDA device id (ignored under the simulator, which has one).
    block_rows : int
        Most new rows one push may bring (the buffers are sized for it).
    dtype : float64 or float32
        The results' dtype (float32: the float64 results rounded once on the device).
    sets : int
        Device buffer sets (at least 2), each on its own CUDA stream: blocks in flight at most.

    :attr:`allocations` counts the device arrays allocated so far (the sets' buffers, scan
    scratch, plan arrays, carries): it stops growing once as many streams as will be open at
    once have been open. :meth:`close` stops the thread (after the blocks queued).
    """

    def __init__(self, device: int = 0, block_rows: int = BLOCK_ROWS, dtype: str | np.dtype = "float64",
                 sets: int = SETS) -> None:  # fmt: skip
        self.device = int(device)
        self.block_rows = max(1, int(block_rows))
        self.sets = max(2, int(sets))
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
            raise UsageError("dtype", "expected float64 or float32", str(self.dtype))
        self._allocs = 0
        self._free: dict[tuple, list[_Carry]] = {}
        self._host_free: dict[tuple, list[tuple[dict, np.ndarray]]] = {}
        self._selected: dict[tuple[int, ...], object] = {}
        self.pinned_allocations = 0
        self._q: queue.Queue = queue.Queue()
        self._sets: list[_Set] = []
        self._jobs = 0
        self._open = 0
        #: seconds on the owner's thread issuing blocks (copies, launches), waiting for the device,
        #: waiting for work; blocks and rows computed (what bounds the hub: docs/performance.md)
        self.stats = {"issue_s": 0.0, "sync_s": 0.0, "idle_s": 0.0, "blocks": 0, "rows": 0}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"gpu-owner-{self.device}", daemon=True)
        self._thread.start()

    # -- called from any thread ------------------------------------------------------------

    @property
    def allocations(self) -> int:
        """Device arrays allocated so far (by this owner and its sets' buffers)."""
        return self._allocs + sum(s.bufs.allocations for s in self._sets)

    @property
    def open_streams(self) -> int:
        """Streams opened and not yet closed."""
        return self._open

    def open(self, plan: Plan, where: str = "", select: Sequence[int] | None = None) -> OwnerStream:
        """A stream for one segment's blocks (``where`` names it in errors); ``select``: the
        result rows it wants, in that order (default every one): only those come back."""
        stream = OwnerStream(self, plan, where, select)
        with self._lock:
            self._open += 1
        return stream

    def close(self) -> None:
        """Finish the queued blocks and stop the thread (idempotent)."""
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()

    def call(self, fn: Callable, *args: object) -> object:
        """``fn(*args)`` on the owner's thread (with its CUDA context); its result or exception."""
        fut: Future = Future()
        self._q.put((fn, args, fut))
        return fut.result()

    # -- on the owner's thread -------------------------------------------------------------

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype):
        """A device array (counted in :attr:`allocations`)."""
        self._allocs += 1
        return cuda.device_array(shape, dtype=dtype)

    def _loop(self) -> None:
        """Take jobs off the queue: a block is issued on the next set's stream, up to
        :attr:`sets` blocks in flight (the oldest waited for and handed back before its set is
        used again, or when the queue is empty), so that blocks of different segments overlap
        on the device (one's copies beside another's kernels, small kernels side by side);
        anything else is a call, run once nothing is in flight."""
        broken = None
        if not config.ENABLE_CUDASIM:
            try:
                cuda.select_device(self.device)
            except Exception as e:  # noqa: BLE001  (every job gets it: no push waits forever)
                broken = AlphafeatError(f"--device cuda: device {self.device} cannot be used ({e})")
        # a short block launches small grids: numba's low-occupancy warning is noise here
        warnings.filterwarnings("ignore", message=".*Grid size .* low occupancy")
        flight: collections.deque[_Job] = collections.deque()
        st = self.stats
        while True:
            t0 = time.perf_counter()
            try:
                item = self._q.get(block=not flight)
            except queue.Empty:
                self._finish(flight.popleft())
                continue
            finally:
                st["idle_s"] += time.perf_counter() - t0
            if item is None:
                while flight:
                    self._finish(flight.popleft())
                return
            if broken is not None:
                (item.future if isinstance(item, _Job) else item[2]).set_exception(broken)
                continue
            if isinstance(item, _Job):
                while len(flight) >= self.sets:  # the next set's last block is done first
                    self._finish(flight.popleft())
                t0 = time.perf_counter()
                try:
                    self._issue(item)
                except BaseException as e:  # noqa: BLE001  (handed to the pushing thread)
                    item.future.set_exception(e)
                    continue
                finally:
                    st["issue_s"] += time.perf_counter() - t0
                st["blocks"] += 1
                st["rows"] += item.n - item.halo
                flight.append(item)
                continue
            fn, args, fut = item
            while flight:
                self._finish(flight.popleft())
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)

    def _finish(self, job: _Job) -> None:
        """Wait for ``job``'s copy back and hand its results to the pushing thread."""
        try:
            t0 = time.perf_counter()
            job.done.synchronize()
            self.stats["sync_s"] += time.perf_counter() - t0
            job.future.set_result(None)
        except BaseException as e:  # noqa: BLE001
            job.future.set_exception(e)

    def _carry(self, plan: Plan) -> _Carry:
        """A carry for a new stream of ``plan``'s shape (a closed stream's, or a new one)."""
        key = _shape_key(plan)
        free = self._free.setdefault(key, [])
        return free.pop() if free else _Carry(self.alloc, key)

    def host_buffers(self, rows: int, like: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Pinned input buffers (``block_rows + 1`` rows of each column of ``like``) and a pinned
        result matrix ``(rows, block_rows)`` for a stream: a closed stream's, or new ones."""
        key = (int(rows), self.dtype.str, tuple((k, like[k].shape[1:], like[k].dtype.str) for k in IN_COLS))
        free = self._host_free.setdefault(key, [])
        if free:
            return free.pop()
        n_in = self.block_rows + 1  # a block and its halo row
        self.pinned_allocations += len(IN_COLS) + 1
        host_in = {k: K.pinned_empty((n_in, *like[k].shape[1:]), like[k].dtype) for k in IN_COLS}
        host_out = K.pinned_empty((int(rows), self.block_rows), self.dtype)
        return host_in, host_out

    def warm(self, plan: Plan, levels: int, select: Sequence[int]) -> None:
        """One block of two (empty-book) rows of ``plan`` through this owner, results dropped:
        its CUDA context, kernels and buffers for books of ``levels`` levels made before the
        first segment's block needs them. Call it from another thread than the owner's."""
        cols = {k: np.zeros((2, levels) if k in LEVEL_COLS else (2,), np.int64 if k == "ts_recv" else np.float64)
                for k in IN_COLS}  # fmt: skip
        for k in ("bid_px", "ask_px"):
            cols[k][:] = np.nan
        with self.open(plan, "warm-up", select or None) as st:
            st.submit(cols, np.empty((len(select) or plan.n_out, 2)), 2, False).result()

    def pin(self, arr: np.ndarray) -> object:
        """Page-lock the host memory of ``arr`` (e.g. a shared-memory mapping) for this owner's
        device copies (``cuMemHostRegister``, in the owner's context: call it through
        :meth:`call`); unlocked when the returned object is dropped (None under the simulator)."""
        if config.ENABLE_CUDASIM:
            return None
        from numba.cuda.cudadrv import driver

        self.pinned_allocations += 1
        return cuda.current_context().mempin(arr, driver.host_pointer(arr), driver.host_memory_size(arr), mapped=False)

    def _rows_on_device(self, select: tuple[int, ...]):
        """The device copy of a stream's selected rows (one per distinct selection)."""
        got = self._selected.get(select)
        if got is None:
            got = self._selected[select] = self.alloc((len(select),), np.int64)
            got.copy_to_device(np.asarray(select, dtype=np.int64))
        return got

    def _release(self, stream: OwnerStream) -> None:
        """A closed stream's carry and host buffers back to the pools."""
        with self._lock:
            self._open -= 1
        if stream.carry is not None:
            self._free.setdefault(stream.carry.key, []).append(stream.carry)
        if stream.host_in:
            key = (int(stream.host_out.shape[0]), self.dtype.str,
                   tuple((k, v.shape[1:], v.dtype.str) for k, v in stream.host_in.items()))  # fmt: skip
            self._host_free.setdefault(key, []).append((stream.host_in, stream.host_out))

    def _issue(self, job: _Job) -> None:
        """The block's copies in, kernels and copy back, queued on the next set's stream."""
        st = job.stream
        if not self._sets:
            self._sets = [_Set(self) for _ in range(self.sets)]
        sx = self._sets[self._jobs % self.sets]
        self._jobs += 1
        levels = int(job.host_in["bid_px"].shape[1])
        G, d, dv, out32 = sx.arrays(st.plan, levels)
        if st.carry is None:
            st.carry = self._carry(st.plan)
        m = job.n - job.halo
        lo = G if job.halo else 0
        row0 = lo - 1 if job.halo else 0
        s = sx.stream
        if st.last_done is not None:  # the stream's block before (another set's stream) has left its carry
            st.last_done.wait(s)
        for k in IN_COLS:
            K.to_device_rows(d[k], job.host_in[k][: job.n], row0, row0 + job.n, s)
        if job.halo:
            load_prefix_kernel[_cfg(_items(st.carry), s)](G, *st.carry.args(), dv.out, d["ts_recv"], d["buy_volume"],
                                                         d["sell_volume"], d["trade_count"], dv.last, dv.X)  # fmt: skip
        dv.step(lo, lo + m)
        save_carry_kernel[_cfg(_items(st.carry), s)](lo, m, dv.out, d["ts_recv"], d["buy_volume"], d["sell_volume"],
                                                    d["trade_count"], dv.last, dv.X, *st.carry.args())  # fmt: skip
        back, k = dv.out, int(job.host_out.shape[0])
        if st.select is not None:  # the rows asked for (rounded once to float32 if so), packed
            pack_rows_kernel[_cfg(k * m, s)](dv.out, self._rows_on_device(st.select), out32, lo, m)
            back = out32
        elif self.dtype == np.float32:
            K.cast_kernel[_cfg(k * m, s)](dv.out, out32, lo, lo + m)
            back = out32
        K.to_host_2d(back, job.host_out, lo, 0, m, k, s)
        job.done = st.last_done = cuda.event()
        job.done.record(s)


def _items(carry: _Carry) -> int:
    """Work items of the carry kernels."""
    return max(carry.g_out.size, carry.win.size, carry.cx.size)


def _cfg(n_items: int, stream) -> tuple:
    """``(blocks, threads, stream)`` of a grid-stride launch over ``n_items``."""
    if config.ENABLE_CUDASIM:
        return 1, max(1, min(K.SIM_THREADS, n_items)), stream
    return max(1, (n_items + K.THREADS - 1) // K.THREADS), K.THREADS, stream


class OwnerStream:
    """One segment's blocks through an :class:`Owner` (from :meth:`Owner.open`).

    :meth:`push` as :meth:`alphafeat.features.cpu.FeatureStream.push`: the block's input
    columns (the first push without a halo, every later one led by the previous push's last
    row), the features of its new rows back. One push at a time per stream (it waits for its
    results); segments on other threads push to the same owner meanwhile. :meth:`close` (or
    the ``with`` block's end) gives the carry and buffers back to the owner.
    """

    def __init__(self, owner: Owner, plan: Plan, where: str, select: Sequence[int] | None = None) -> None:
        self.owner, self.plan, self.where = owner, plan, where
        self.rows = 0
        self.carry: _Carry | None = None
        self.last_done = None  # the CUDA event after its last block (the next one's stream waits for it)
        self.select = None if select is None else tuple(int(r) for r in select)
        n = int(plan.n_out)
        if self.select is not None and (not 0 < len(self.select) <= n or not all(0 <= r < n for r in self.select)):
            raise UsageError("select", f"OwnerStream: 1 to {n} rows among 0..{n - 1}", str(self.select))
        self.host_in: dict[str, np.ndarray] = {}
        self.host_out = np.empty((n if self.select is None else len(self.select), 0), owner.dtype)
        self._closed = False

    def __enter__(self) -> OwnerStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def push(self, cols: dict[str, np.ndarray], halo: bool) -> np.ndarray:
        """Features of the new rows of ``cols`` as a view ``(n_out, m)`` of the owner's dtype
        (``(len(select), m)``, the selected rows in order, with ``select``), valid until the
        next push. ``UsageError`` on a halo out of place or too many rows;
        ``AlphafeatError`` naming the segment when the GPU runs out of memory."""
        n = int(cols["ts_recv"].shape[0])
        if self._closed:
            raise UsageError("stream", "OwnerStream.push after close")
        if halo != (self.rows > 0):
            raise UsageError("halo", "OwnerStream.push: the first push has no halo row, every later push has one")
        m = n - halo
        if m > self.owner.block_rows:
            raise UsageError("cols", f"OwnerStream.push: {m} rows, more than block_rows = {self.owner.block_rows}")
        if m <= 0:
            return self.host_out[:, :0]
        self._stage(cols, n)
        try:
            self.submit(self.host_in, self.host_out, n, halo).result()
        except Exception as e:
            raise oom_line(e, self.where, m) from None
        return self.host_out[:, :m]

    def submit(self, host_in: dict[str, np.ndarray], host_out: np.ndarray, n: int, halo: bool) -> Future:
        """Queue a block whose ``n`` input rows (the halo row first when ``halo``) lie in the
        page-locked columns ``host_in`` (:data:`IN_COLS`, as :meth:`push` takes them) and whose
        results go to ``host_out`` (page-locked, ``(rows, >= n - halo)``): returns at once, a
        Future set when the results are there. Blocks of one stream are computed in the order
        submitted, each continuing the one before (several may be queued: the device orders
        them); the caller keeps both buffers untouched until the Future is done. ``UsageError``
        as :meth:`push`."""
        if self._closed:
            raise UsageError("stream", "OwnerStream.submit after close")
        if halo != (self.rows > 0):
            raise UsageError("halo", "OwnerStream.push: the first push has no halo row, every later push has one")
        m = n - halo
        if m > self.owner.block_rows or m > host_out.shape[1]:
            raise UsageError("cols", f"OwnerStream.push: {m} rows, more than block_rows = {self.owner.block_rows}")
        self.rows += m
        job = _Job(self, n, halo, host_in, host_out)
        self.owner._q.put(job)
        return job.future

    def _stage(self, cols: dict[str, np.ndarray], n: int) -> None:
        """Copy the block's columns into this stream's pinned input buffers (made at the first push)."""
        if not self.host_in:  # pinned in the owner's context
            self.host_in, self.host_out = self.owner.call(self.owner.host_buffers, self.host_out.shape[0], cols)
        for k in IN_COLS:
            v = cols[k]
            if v.shape[1:] != self.host_in[k].shape[1:]:
                raise UsageError("cols", f"OwnerStream.push: {k} of shape {v.shape}, the stream's first had "
                                 f"{self.host_in[k].shape[1:]} per row")  # fmt: skip
            np.copyto(self.host_in[k][:n], v)

    def close(self) -> None:
        """Give the carry back to the owner (idempotent)."""
        if not self._closed:
            self._closed = True
            self.owner.call(self.owner._release, self)
            self.carry, self.host_in, self.last_done = None, {}, None


def oom_line(e: Exception, where: str, m: int) -> Exception:
    """A GPU out of memory as one line naming the segment; other errors as they are."""
    if type(e).__name__ == "CudaAPIError" and "OUT_OF_MEMORY" in str(e):
        return AlphafeatError(f"{where or 'a segment'}: --device cuda: the GPU ran out of memory for a block of "
                              f"{m:,} rows (block buffers, one carry per open segment); use --device cpu or fewer "
                              "segments at once")  # fmt: skip
    return e


class Owners:
    """One :class:`Owner` per device (``devices``: ids from :func:`parse_devices`); each new
    stream goes to the owner with the fewest streams open (of those, the one that has opened
    fewest so far: streams one after another alternate)."""

    def __init__(self, devices: Sequence[int], block_rows: int = BLOCK_ROWS, dtype: str | np.dtype = "float64") -> None:
        self.owners = [Owner(d, block_rows, dtype) for d in devices]
        self._opened = [0] * len(self.owners)
        self._lock = threading.Lock()

    def open(self, plan: Plan, where: str = "", select: Sequence[int] | None = None) -> OwnerStream:
        """A stream on the least busy device (:meth:`Owner.open`)."""
        with self._lock:
            k = min(range(len(self.owners)), key=lambda i: (self.owners[i].open_streams, self._opened[i]))
            self._opened[k] += 1
            return self.owners[k].open(plan, where, select)

    def close(self) -> None:
        for o in self.owners:
            o.close()

    def __enter__(self) -> Owners:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Serialises :func:`shared`'s first call: numba-cuda's driver set-up (``cuda.gpus``, module
#: loading) is not thread-safe, and two owners of one device would load its kernels at once.
_SHARED_LOCK = threading.Lock()


def shared() -> Owners:
    """This process's owners, one per visible device, blocks of up to :data:`BLOCK_ROWS` rows
    (made by the first call, once, whichever thread makes it): every segment on this
    process's threads shares them. :func:`release_shared` stops them."""
    with _SHARED_LOCK:
        return _made()


@functools.cache
def _made() -> Owners:
    return Owners(parse_devices("cuda"), BLOCK_ROWS)


def shared_running() -> bool:
    """Whether this process's owners are made and not yet released."""
    return _made.cache_info().currsize > 0


def release_shared() -> None:
    """Stop this process's owners, if made (their device memory goes with their buffers); a
    later :func:`shared` makes new ones."""
    with _SHARED_LOCK:
        if _made.cache_info().currsize:
            _made().close()
        _made.cache_clear()
