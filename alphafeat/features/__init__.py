"""Per-snapshot order-book features: registry, CPU (numba ``njit``, exact chunks) and CUDA paths.

One call of :func:`compute_features` handles one contiguous segment (one instrument, one
trading session, in time order): every difference and every recurrence starts fresh at row 0,
so state restarts at session breaks and rolls because the caller calls once per segment.

Modules: :mod:`~alphafeat.features.registry` (parameters, one spec per column with formula,
unit, source, parameters, minimum depth and implementations; the integer plan),
:mod:`~alphafeat.features._rows` (the per-row code of the CUDA kernels, also compilable with
``numba.njit``), :mod:`~alphafeat.features.cpu` (block-wise CPU kernels, sequential or
in exact chunks on joblib threads), :mod:`~alphafeat.features.scalar` (scalar helpers and reference-scale
functions). The CUDA drivers live in :mod:`alphafeat.cuda`, the choice of device in
:func:`alphafeat.devices.compute_features`; tests hold all paths equal.
``alphafeat features`` prints the table.

Adding a feature
----------------
Declare it once, as a :class:`~alphafeat.features.registry.Feature` (name, unit, formula,
source, parameters, the inputs it reads, a scalar ``row`` function of them, and the state it
carries: none or a :class:`~alphafeat.features.registry.Decay`), and
:func:`~alphafeat.features.registry.register` it. From that declaration come its column (after
the built-in ones) in every back end -- a row kernel generated from the declarations
(:mod:`alphafeat.features.declared`, ``numba.njit`` and ``numba.cuda.jit``), its state run by
the same exact linear scans as the built-in recurrences (chunked, streamed and on the GPU) --
and its entries in ``alphafeat features``, in ``--features`` and in the cache's columns
(``tests/test_declared_feature.py`` adds toy features that way, from the test alone).

Conventions (shared by the CPU and CUDA paths)
----------------------------------------------
Empty levels
    A level whose price is NaN is empty and its size counts as 0, whatever the size column
    holds. In OFI comparisons an empty bid level has price ``-inf`` and an empty ask level
    ``+inf``: a level that appears contributes ``+q`` (bid) / ``-q`` (ask), one that vanishes
    ``-q_prev`` (bid) / ``+q_prev`` (ask), one empty on both rows contributes 0.
Two-sided features
    ``mid``, ``spread_ticks``, ``microprice``, ``imbalance_l1`` and ``imbalance_l10`` are NaN
    when either best level (level 1) is empty; ``microprice`` and the imbalances are also NaN
    when their denominator (summed size) is 0.
Crossed rows
    A row whose best bid is above its best ask (an auction book that did not trade, e.g. the
    pre-open) is given to every back end as an empty book: prices NaN, sizes 0
    (:func:`alphafeat.features.inputs.prepare`). No feature of any row reads a crossed row's
    prices or sizes: the price features are NaN there, the recurrences skip those rows as NaN
    observations (EMAs hold, the forward-filled log mid holds) and the first uncrossed row after
    them sees the book appear. Each feature's ``crossed`` entry (``alphafeat features``) says
    what it does; ``tests/test_preopen.py`` holds it on the real ESH4 pre-open.
Row 0
    Differenced features (``ofi_lNN``, ``log_dt``, ``tick_return``) are NaN at row 0: there is
    no previous snapshot in the segment. ``signed_volume`` is defined at row 0 (volume since
    the start of the segment's data).
Time
    ``ts_recv`` (int64 ns) is the clock. Time steps are taken as exact int64 differences and
    converted to seconds by ``/ 1e9``; a negative step (out-of-order input) is clipped to 0.
Irregular EMAs (Zumbach & Müller 2001)
    ``EMA_n = mu EMA_{n-1} + (nu - mu) z_{n-1} + (1 - nu) z_n``, ``mu = exp(-dt/tau)``,
    ``nu = 1`` ('previous'), ``(1 - mu) tau/dt`` ('linear', evaluated as
    ``-expm1(-x)/x`` with ``x = dt/tau`` and its limit 1 at ``dt = 0``), ``mu`` ('next').
    The EMA starts at the first finite observation (``EMA = z``) and is NaN before it.
    Non-finite observations (NaN mid when a side is empty, NaN tick return) are skipped: the
    EMA holds its value on those rows and the next finite observation is combined with the
    last finite one (``z_{n-1}``) and the time elapsed since it. I.e. the EMA equals the
    Zumbach–Müller EMA of the subsequence of finite observations, held between them.
    With ``dt = 0`` every scheme gives ``mu = nu = 1``: the EMA is unchanged.
Trade-rate EMA
    ``lambda_i = exp(-dt_i/tau) lambda_{i-1} + count_i / tau`` with ``lambda_{-1} = 0`` and
    ``dt_0 = 0`` (trades/s); a NaN count counts as 0 trades.
Linear recurrences
    Every EMA is ``x_i = a_i x_{i-1} + b_i`` with ``x_{-1} = 0``: the coefficients are built
    per row (:func:`ema_coefficients`, :func:`trade_rate_coefficients`) and the state is
    produced by :func:`linear_scan`. Chunks compose exactly with
    ``(a, b) then (a', b') = (a' a, a' b + b')`` (:func:`scan_compose`). The same holds for
    the Hawkes sums, the propagator, the realised variances and the deviations
    ``mid - EMA(mid)`` (``d_i = mu d_{i-1} + nu (z_i - z_prev)``, exact rewrite of the
    Zumbach–Müller step) used by the z-scores and the trend.
Exact chunking
    The skip-NaN rule needs, besides the state, the last finite observation and its time:
    the chunk carry includes the index of that row. Windowed features (fractional
    differencing) read the window's rows before the chunk. See :mod:`alphafeat.features.cpu`.
No look-ahead
    Every value at row i uses rows <= i only.
"""

from __future__ import annotations

import numpy as np

from alphafeat.errors import UsageError
from alphafeat.features.inputs import prepare
from alphafeat.features.registry import (
    INTERPOLATIONS,
    FeatureParams,
    FeatureSpec,
    feature_specs,
    frac_diff_weights,
    make_plan,
)
from alphafeat.features.scalar import (
    ema_coefficients,
    frac_diff_expanding,
    frac_diff_ffd,
    hawkes_intensity,
    irregular_ema,
    linear_scan,
    microprice,
    ofi_step,
    scan_compose,
    stoikov_imbalance,
    trade_rate_coefficients,
    trade_rate_ema,
)
from alphafeat.types import BookArrays

__all__ = [
    "INTERPOLATIONS",
    "FeatureParams",
    "FeatureSpec",
    "compute_features",
    "compute_features_chunked",
    "cuda_available",
    "ema_coefficients",
    "feature_specs",
    "feature_table",
    "frac_diff_expanding",
    "frac_diff_ffd",
    "frac_diff_weights",
    "hawkes_intensity",
    "irregular_ema",
    "linear_scan",
    "microprice",
    "ofi_step",
    "scan_compose",
    "stoikov_imbalance",
    "trade_rate_coefficients",
    "trade_rate_ema",
]


def compute_features(
    book: BookArrays,
    params: FeatureParams = FeatureParams(),  # noqa: B008 (frozen dataclass, immutable)
    device: str = "cpu",
    n_chunks: int = 1,
    n_jobs: int | None = 1,
) -> dict[str, np.ndarray]:
    """Compute the feature set on one contiguous segment of book snapshots, on the CPU (on a GPU:
    :func:`alphafeat.devices.compute_features`, which lies above :mod:`alphafeat.cuda`).

    Parameters
    ----------
    book : BookArrays
        Snapshots of one instrument over one session, in time order (n rows). Reads
        ``ts_recv`` (int64 ns), ``bid_px/ask_px`` (float64 index points, NaN = empty level),
        ``bid_sz/ask_sz`` (float64 contracts), ``buy_volume/sell_volume/trade_count``.
    params : FeatureParams
        Feature parameters (see :class:`FeatureParams`).
    device : str
        ``'cpu'`` only (numba njit); kept so that calls naming it work. ``'cuda'`` and ``'auto'``:
        :func:`alphafeat.devices.compute_features`.
    n_chunks : int
        CPU only: split the segment into this many contiguous chunks with exact carries
        (results equal the sequential ones to rounding, 1e-12 relative).
    n_jobs : int or None
        CPU only: worker threads for the chunks (joblib threading backend; the kernels
        release the GIL; 1: in-process; None or -1: all cores).

    Returns
    -------
    dict[str, np.ndarray]
        float64 arrays of shape (n,), keys ``[s.name for s in feature_specs(params)]`` in that
        order. Units, formulas and sources: :func:`feature_specs`; conventions (empty levels,
        row 0, NaN handling): module docstring. Each call restarts every recurrence at row 0.
    """
    if device != "cpu":
        raise UsageError("device", "expected 'cpu' (GPUs: alphafeat.devices.compute_features)", device)
    from alphafeat.features.cpu import compute_cpu

    names = [s.name for s in feature_specs(params)]
    out = compute_cpu(prepare(book, params), make_plan(params), n_chunks=n_chunks, n_jobs=n_jobs)
    return {name: out[k] for k, name in enumerate(names)}


def compute_features_chunked(
    book: BookArrays,
    params: FeatureParams = FeatureParams(),  # noqa: B008
    n_chunks: int | None = None,
    n_jobs: int | None = None,
) -> dict[str, np.ndarray]:
    """CPU features of one segment split into ``n_chunks`` exact chunks over ``n_jobs``
    threads (defaults: one chunk per core, all cores). Same result as
    :func:`compute_features` on the CPU, within 1e-12 relative."""
    from alphafeat.cores import usable_cores

    cores = usable_cores()
    return compute_features(book, params, "cpu", n_chunks or cores, n_jobs if n_jobs is not None else cores)


def feature_table(params: FeatureParams = FeatureParams()) -> list[dict]:  # noqa: B008
    """The registry as a list of dicts (one per column): name, unit, formula, source,
    parameters, min_depth, description, cpu, cuda, inputs, state (declared features included)."""
    import dataclasses

    return [dataclasses.asdict(s) for s in feature_specs(params)]


def cuda_available() -> bool:
    """True when numba can use a CUDA GPU (``numba.cuda.is_available()``); False on any error.

    Under ``NUMBA_ENABLE_CUDASIM=1`` this reports the simulator as available.
    """
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:
        return False
