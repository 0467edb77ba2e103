"""Labels without leakage: multi-horizon direction and triple-barrier outcomes, with end times.

Every label is computed on one *segment* (one instrument in one trading session); the caller
passes one segment at a time, so no label crosses a session break or a roll. Each label
comes with its end time ``t1`` — when its outcome is known — which the purged splits of
:mod:`alphafeat.splits` use (López de Prado, *Advances in Financial Machine Learning*, 2018,
ch. 3 and 7).

Direction (reference-values.md, "Direction labels")
    For a horizon of ``h`` snapshots::

        y[t] = 1 if mid[t+h] > mid[t];  0 if mid[t+h] < mid[t];
               NaN on a tie, where either mid is NaN, or where t+h is past the segment end.
        t1[t] = ts[t+h]  (NaT-like -1 where t+h is past the segment end).

    For a horizon of ``s`` seconds the comparison is with the last mid at or before
    ``ts[t] + s`` (as-of), and ``t1[t] = ts[t] + s``; NaN where ``ts[t] + s`` is after the
    segment's last snapshot (the session ended or the data did, so the outcome is unknown).
    No smoothing, no threshold (unlike FI-2010 / DeepLOB).

Triple barrier (AFML ch. 3)
    From row t, the first row ``t+k`` (1 <= k <= h) whose price move reaches a barrier::

        p[t+k] - p[t] >= +upper[t]  -> +1 (profit taking)
        p[t+k] - p[t] <= -lower[t]  -> -1 (stop loss)

    touches are non-strict (``>=``/``<=``); widths are in price units (index points), so
    barriers on simple returns ``p[t+k]/p[t] - 1 >= w`` are ``upper = w * p[t]``. If neither
    is touched within h rows the label is 0 (timeout, vertical barrier) with ``t1 = ts[t+h]``.
    Where the vertical barrier lies past the segment end and no barrier was touched before
    the end, the label is **NaN** (outcome unknown: the session ended, or a roll), not 0.
    Rows with a NaN price or width, or a width that is not positive (e.g. a volatility
    barrier before any price move), are NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from alphafeat.errors import UsageError
from alphafeat.features import twin
from alphafeat.validation import Device, validate_enum, validate_horizon

_R = twin.load("cpu")  # the row code, shared with the CUDA kernel (alphafeat.cuda.kernels)

DEFAULT_HORIZONS: tuple[int, ...] = (30, 100, 300, 1000, 6000)

#: Value of an end time (ns) that is unknown (label past the end of its segment).
NO_TIME = np.int64(-1)


def _direction(mid: np.ndarray, nxt: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """float32 (n,): 1 where ``nxt > mid``, 0 where lower, NaN on a tie, a NaN (or inf - inf)
    difference or where not ``ok``."""
    y = np.full(mid.shape, np.nan, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        d = np.where(ok, nxt - mid, np.nan)
    y[d > 0] = 1.0
    y[d < 0] = 0.0
    return y


def direction_labels(
    mid: np.ndarray,
    horizons: Sequence[int] = DEFAULT_HORIZONS,
    ts: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Binary direction of the mid price ``h`` snapshots ahead, per horizon.

    Parameters
    ----------
    mid : np.ndarray, float64, shape (n,)
        Mid price (index points) of one segment; NaN where undefined.
    horizons : sequence of int
        Horizons in snapshots, each >= 1.
    ts : np.ndarray, int64, shape (n,), optional
        Snapshot times (ns since the epoch, ``ts_recv``). When given, the end times are
        returned too.

    Returns
    -------
    dict
        ``label_h{h}``: float32 (n,) with 1, 0 or NaN; with ``ts``, also ``t1_h{h}``: int64
        (n,) end time in ns, ``NO_TIME`` (-1) where t+h is past the segment end.

    Raises
    ------
    UsageError
        If a horizon is not a positive integer.

    Notes
    -----
    Whole-segment numpy (no numba kernel to load: a relabelled partition's new horizons,
    :func:`alphafeat.precompute.relabel.relabel_table`); the same values, bit for bit, as the row kernel
    :func:`_direction_h` that :class:`LabelStream` runs (the same float64 difference and the
    same comparisons; ``tests/test_segment.py``).
    """
    mid = np.asarray(mid, dtype=np.float64)
    n = mid.shape[0]
    out: dict[str, np.ndarray] = {}
    for h in horizons:
        h = validate_horizon(h, "horizons")
        m = max(n - h, 0)
        ok = np.arange(n) < m  # rows whose t + h is within the segment
        nxt = np.concatenate([mid[h:], mid[:n - m]])  # mid[t + h] where ok (the rest is not read)
        out[f"label_h{h}"] = _direction(mid, nxt, ok)  # NaN: a tie, a NaN mid, or past the end
        if ts is not None:
            t1 = np.full(n, NO_TIME, dtype=np.int64)
            t1[:m] = np.asarray(ts, dtype=np.int64)[h:]
            out[f"t1_h{h}"] = t1
    return out


@numba.njit(cache=True, nogil=True)
def _direction_h(mid, ts, h, y, t1, a=0, b=-1):
    """Rows ``[a, b)`` (``b = -1``: to the end): ``y[t]`` 1 if ``mid[t+h] > mid[t]``, 0 if
    lower, NaN on a tie, a NaN mid or past the end of ``mid``; ``t1[t] = ts[t+h]`` or ``NO_TIME``."""
    n = mid.shape[0]
    if b < 0:
        b = n
    for t in range(a, b):
        j = t + h
        if j < n:
            d = mid[j] - mid[t]
            y[t] = 1.0 if d > 0.0 else (0.0 if d < 0.0 else np.nan)
            t1[t] = ts[j]
        else:
            y[t] = np.nan
            t1[t] = -1


def direction_labels_seconds(
    mid: np.ndarray, ts: np.ndarray, horizons_s: Sequence[float]
) -> dict[str, np.ndarray]:
    """Binary direction of the as-of mid ``s`` seconds ahead, per horizon.

    Parameters
    ----------
    mid : np.ndarray, float64, shape (n,)
        Mid price (index points) of one segment.
    ts : np.ndarray, int64, shape (n,)
        Snapshot times, ns since the epoch, non-decreasing.
    horizons_s : sequence of float
        Horizons in seconds (> 0).

    Returns
    -------
    dict
        ``label_h{s}s`` (float32, 1/0/NaN) and ``t1_h{s}s`` (int64 ns, ``NO_TIME`` where the
        horizon passes the segment's last snapshot). ``{s}`` is formatted with ``:g``.

    Raises
    ------
    UsageError
        If a horizon is not positive.
    """
    mid = np.asarray(mid, dtype=np.float64)
    ts = np.asarray(ts, dtype=np.int64)
    n = mid.shape[0]
    out: dict[str, np.ndarray] = {}
    for s in horizons_s:
        s = validate_horizon(s, "horizons_s", integer=False)
        target = ts + np.int64(round(s * 1e9))
        ok = target <= (ts[-1] if n else 0)
        j = np.searchsorted(ts, target, side="right") - 1  # last row at or before the target
        nxt = mid[np.clip(j, 0, max(n - 1, 0))] if n else mid
        name = f"{s:g}s"
        out[f"label_h{name}"] = _direction(mid, nxt, ok)
        out[f"t1_h{name}"] = np.where(ok, target, NO_TIME)
    return out


#: Rows per block of the CPU triple barrier's block extrema.
TB_BLOCK = _R.TB_BLOCK


@numba.njit(cache=True, nogil=True)
def _tb_extrema(price, bmax, bmin, a, b):
    """Fold rows ``[a, b)`` into the extrema of their ``TB_BLOCK``-row blocks (NaN left out;
    a block's entries must start at -inf / +inf)."""
    B = TB_BLOCK
    for j in range(a, b):
        x = price[j]
        if x == x:
            k = j // B
            if x > bmax[k]:
                bmax[k] = x
            if x < bmin[k]:
                bmin[k] = x


@numba.njit(cache=True, nogil=True)
def _tb_rows(price, upper, lower, h, ts, out_y, out_t1, out_k, bmax, bmin, a, b):
    """Rows ``[a, b)`` of the triple barrier over ``price`` (its length is the segment end so
    far). A row whose vertical barrier lies within ``price`` gets its final value whatever rows
    come later.

    Rows are done last to first. A row whose price and widths equal the next row's reuses that
    row's outcome (its own first step moves the price by 0, which touches nothing, and every
    later step is one the next row saw): its touch if within its own vertical barrier, else a
    timeout at ``t + h`` (NaN past the end). Other rows search forward with the row code's
    search (:func:`alphafeat.features._rows.barrier_touch`), whole blocks skipped where their
    extrema touch no barrier. The same outcome as the row code, row by row."""
    n = price.shape[0]
    for t in range(b - 1, a - 1, -1):
        if not _R.barrier_start(price, upper, lower, out_y, out_t1, out_k, t):
            continue
        if t + 1 < b and price[t + 1] == price[t] and upper[t + 1] == upper[t] and lower[t + 1] == lower[t]:
            j = out_k[t + 1]
            y = out_y[t + 1]
            if not ((y == 1.0 or y == -1.0) and j <= t + h):
                j = -1  # no touch within this row's window: a timeout (unknown past the end)
        else:
            j, y = _R.barrier_touch(price, upper, lower, h, t, bmax, bmin, True)
        _R.barrier_outcome(ts, out_y, out_t1, out_k, t, h, n, j, y)


def _triple_barrier_blocked(price, upper, lower, h, ts, out_y, out_t1, out_k):  # noqa: ANN001
    """The row code (:func:`alphafeat.features._rows.triple_barrier_row`) on every row, with
    whole blocks of ``TB_BLOCK`` rows skipped where their extrema touch no barrier. Exact:
    ``x -> x - p0`` is monotone in floating point, so ``max(x) - p0 < up`` means every
    ``x - p0 < up`` (NaN prices never touch; they are left out of the extrema); a row like
    the next reuses its outcome (:func:`_tb_rows`). Identical results; a search costs
    ~h/TB_BLOCK + 2 TB_BLOCK steps at most, and most rows need none."""
    n = price.shape[0]
    nb = (n + TB_BLOCK - 1) // TB_BLOCK
    bmax, bmin = np.full(nb, -np.inf), np.full(nb, np.inf)
    _tb_extrema(price, bmax, bmin, 0, n)
    _tb_rows(price, upper, lower, h, ts, out_y, out_t1, out_k, bmax, bmin, 0, n)


def triple_barrier(
    price: np.ndarray,
    upper: np.ndarray | float,
    lower: np.ndarray | float,
    horizon: int,
    ts: np.ndarray | None = None,
    device: str = "cpu",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Triple-barrier outcome of each row (AFML ch. 3; conventions in the module docstring).

    Parameters
    ----------
    price : np.ndarray, float64, shape (n,)
        Price path of one segment (e.g. mid, index points).
    upper, lower : float or np.ndarray float64 shape (n,)
        Profit-taking and stop-loss distances from ``price[t]``, price units, > 0 (a row
        whose width is NaN or <= 0 has no barrier: NaN label).
    horizon : int
        Vertical barrier in snapshots (>= 1).
    ts : np.ndarray, int64, shape (n,), optional
        Snapshot times in ns; default ``arange(n)`` (then ``t1`` is a row index).
    device : str
        ``'cpu'`` (numba, one row after another) or ``'cuda'`` (one GPU thread per row,
        :func:`alphafeat.cuda.kernels.triple_barrier_device`); the same row code
        (:func:`alphafeat.features._rows.triple_barrier_row`), only comparisons of the same
        differences, so both give identical results.

    Returns
    -------
    (label, t1, touch_index)
        label float32 (n,): +1 profit, -1 stop, 0 timeout, NaN unknown; t1 int64 (n,): time of
        the touch or the vertical barrier, ``NO_TIME`` where unknown; touch_index int64 (n,)
        the row index of that event, -1 where unknown.

    Raises
    ------
    UsageError
        If the horizon is not a positive integer, or the device is unknown.
    """
    validate_horizon(horizon, "horizon")
    if validate_enum(device, Device, "device") == Device.AUTO:
        raise UsageError("device", "expected cpu or cuda", device)
    price = np.ascontiguousarray(price, dtype=np.float64)
    n = price.shape[0]
    up = np.broadcast_to(np.asarray(upper, dtype=np.float64), (n,)).copy()
    dn = np.broadcast_to(np.asarray(lower, dtype=np.float64), (n,)).copy()
    tt = np.arange(n, dtype=np.int64) if ts is None else np.ascontiguousarray(ts, dtype=np.int64)
    if device == "cuda":
        from alphafeat.cuda.kernels import triple_barrier_device

        y, t1, k = triple_barrier_device(price, up, dn, int(horizon), tt)
    else:
        y = np.empty(n, dtype=np.float64)
        t1 = np.empty(n, dtype=np.int64)
        k = np.empty(n, dtype=np.int64)
        _triple_barrier_blocked(price, up, dn, int(horizon), tt, y, t1, k)
    return y.astype(np.float32), t1, k


class LabelStream:
    """Direction and triple-barrier labels of one segment computed while its rows arrive.

    :meth:`update` labels the rows whose every horizon already lies within the rows seen (their
    labels cannot change); :meth:`finish` labels the rest at the segment end. The values equal
    :func:`direction_labels` and :func:`triple_barrier` on the whole segment (the same row
    code on the same inputs). Outputs come from the process's reserve
    (:func:`alphafeat.arena.reserve`), so reuse them before the next segment's stream.

    Parameters
    ----------
    horizons : sequence of int
        Direction horizons in rows.
    barrier_horizon : int or None
        Vertical barrier of the triple barrier in rows; None for no triple barrier.
    capacity : int
        Rows the segment can have at most.
    """

    def __init__(self, horizons: Sequence[int], barrier_horizon: int | None, capacity: int) -> None:
        from alphafeat.arena import reserve

        for h in horizons:
            validate_horizon(h, "horizons")
        if barrier_horizon is not None:
            validate_horizon(barrier_horizon, "barrier_horizon")
        self.horizons = [int(h) for h in horizons]
        self.bh = None if barrier_horizon is None else int(barrier_horizon)
        cap = max(int(capacity), 1)
        self.y = {h: reserve(f"lab:y{k}", (cap,), np.float32) for k, h in enumerate(self.horizons)}
        self.t1 = {h: reserve(f"lab:t{k}", (cap,), np.int64) for k, h in enumerate(self.horizons)}
        if self.bh is not None:
            nb = cap // TB_BLOCK + 1
            self.tb = (reserve("lab:tby", (cap,), np.float64), reserve("lab:tbt", (cap,), np.int64),
                       reserve("lab:tbk", (cap,), np.int64))  # fmt: skip
            self.bmax = reserve("lab:bmax", (nb,), np.float64)
            self.bmin = reserve("lab:bmin", (nb,), np.float64)
            self.bmax[:] = -np.inf
            self.bmin[:] = np.inf
        self.done = 0  # rows labelled
        self.seen = 0  # rows folded into the block extrema
        self.reach = max([*self.horizons, self.bh or 0])

    def update(self, mid: np.ndarray, ts: np.ndarray, width: np.ndarray | None, final: bool = False) -> None:
        """Label what the rows so far decide: ``mid`` float64 (NaN where crossed or one-sided),
        ``ts`` int64 ns and ``width`` (barrier half-width per row, index points) of every row
        of the segment seen so far; ``final``: the segment ends here."""
        n = mid.shape[0]
        b = n if final else max(n - self.reach, self.done)
        if b <= self.done:
            return
        a = self.done
        for h in self.horizons:
            _direction_h(mid, ts, h, self.y[h], self.t1[h], a, b)
        if self.bh is not None:
            _tb_extrema(mid, self.bmax, self.bmin, self.seen, n)
            self.seen = n
            _tb_rows(mid, width, width, self.bh, ts, *self.tb, self.bmax, self.bmin, a, b)
        self.done = b

    def finish(self, mid: np.ndarray, ts: np.ndarray, width: np.ndarray | None) -> dict[str, np.ndarray]:
        """Label the remaining rows; returns ``label_h{h}`` (float32), ``t1_h{h}`` (int64 ns,
        ``NO_TIME`` past the end) and ``tb_label`` (float32) / ``tb_t1`` when a barrier is set."""
        self.update(mid, ts, width, final=True)
        n = mid.shape[0]
        out: dict[str, np.ndarray] = {}
        for h in self.horizons:
            out[f"label_h{h}"] = self.y[h][:n]
            out[f"t1_h{h}"] = self.t1[h][:n]
        if self.bh is not None:
            out["tb_label"] = self.tb[0][:n].astype(np.float32)
            out["tb_t1"] = self.tb[1][:n]
        return out
