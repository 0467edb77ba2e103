"""Planted predictability: the best possible AUC per label horizon under the true model.

:func:`auc_ceiling` runs Monte-Carlo continuations of saved states of the leading outright
(its whole state: the book, the slow signed flow of the history signal, the running metaorder),
so it covers every kind of planted signal (book, history, both) and none (``--signal 0``:
then the mid is a martingale and the ceiling is 1/2 at every horizon). :func:`ceiling_estimate`
turns path outcomes into a bias-corrected AUC, :func:`ceiling_interval` gives a bootstrap
interval over the saved states.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from alphafeat.cores import usable_cores
from alphafeat.synth.kernels import CMBP, ET, FREM, IA, IB, NFST, NST, borrow, step
from alphafeat.synth.records import MBO_W, MBP_W, InstrumentRun

__all__ = ["AUC_HORIZONS", "AUC_PATHS", "AUC_STATES", "auc_ceiling", "ceiling_estimate", "ceiling_interval"]

#: Label horizons (snapshots) of the AUC ceiling, saved states and paths per state.
AUC_HORIZONS = (30, 100, 300, 1000, 6000)
AUC_STATES = 192
#: Monte-Carlo paths per state and horizon (nested: a path serves every horizon up to its own).
AUC_PATHS = {30: 512, 100: 256, 300: 128, 1000: 64, 6000: 32}
#: Bootstrap resamples of the saved states behind :func:`ceiling_interval`.
BOOTSTRAP = 200


@numba.njit(cache=True, nogil=True)
def _mc_outcomes(rng_own, p, s_st, s_fst, horizons, n_steps, out):
    """Monte-Carlo continuations of saved states under the true model (nothing written).

    Path ``r`` of state ``i`` runs ``n_steps[r]`` events; ``out[i, r, h]`` = sign of the mid
    change after ``horizons[h]`` events (every event changes the book, so events = snapshots)
    for the horizons within ``n_steps[r]`` (others are left alone). Releases the GIL."""
    ref_own = np.zeros(1)
    dm_own = np.zeros((1, MBO_W), np.int64)
    dp_own = np.zeros((1, MBP_W), np.int64)
    st_own = np.zeros(NST, np.int64)
    fst_own = np.zeros(NFST)
    ref, dm, dp, st, fst, p = (
        borrow(ref_own),
        borrow(dm_own),
        borrow(dp_own),
        borrow(st_own),
        borrow(fst_own),
        borrow(p),
    )
    rng = borrow(rng_own)
    nh = horizons.shape[0]
    for i in range(s_st.shape[0]):
        for r in range(n_steps.shape[0]):
            st[:] = s_st[i]
            fst[:] = s_fst[i]
            for x in range(ET, CMBP + 1):  # no event context, nothing written
                st[x] = 0
            fst[FREM] = 0.0  # no bridge: the close the mid is bridged to is not known
            m0 = st[IB] + st[IA]
            h = 0
            for e in range(1, n_steps[r] + 1):
                step(rng, p, ref, 0, st, fst, dm, dp)
                if h < nh and e == horizons[h]:
                    d = st[IB] + st[IA] - m0
                    out[i, r, h] = 1 if d > 0 else (-1 if d < 0 else 0)
                    h += 1
    # the owners stay alive to here (the borrowed views do not hold them)
    st_own[0] = ref_own[0] + dm_own[0, 0] + dp_own[0, 0] + fst_own[0]




def soft_auc(score: np.ndarray, w_pos: np.ndarray, w_neg: np.ndarray) -> float:
    """AUC of ``score`` when item i is positive with weight ``w_pos[i]`` and negative with
    ``w_neg[i]`` (ties in score count one half)."""
    order = np.argsort(score, kind="stable")
    s, wp, wn = score[order], w_pos[order], w_neg[order]
    uniq, start = np.unique(s, return_index=True)
    gp = np.add.reduceat(wp, start) if s.size else np.zeros(0)
    gn = np.add.reduceat(wn, start) if s.size else np.zeros(0)
    below = np.concatenate([[0.0], np.cumsum(gn)[:-1]])
    num = float(np.sum(gp * (below + 0.5 * gn)))
    den = float(gp.sum() * gn.sum())
    return num / den if den > 0 else float("nan")


def ceiling_estimate(up: np.ndarray, down: np.ndarray) -> float:
    """Best possible AUC from Monte-Carlo outcomes: ``up[i, r]`` / ``down[i, r]`` (bool) say
    whether path ``r`` from state ``i`` ended up / down (neither: a tie, no label).

    With ``a_i``, ``b_i`` the probabilities of up and down from state ``i``, the Bayes score
    ranks states by ``a_i / (a_i + b_i)`` and its AUC over the states is exactly
    ``1/2 + sum_{i<j} |a_i b_j - a_j b_i| / (2 D)``, ``D = sum_{i != j} a_i b_j``. ``D`` is
    estimated without bias from the path frequencies; ``|.|`` is not: the plug-in
    ``|a^_i b^_j - a^_j b^_i|`` is biased up by the paths' noise (by ``+c var`` to first
    order) and the split-half ``(Z_B sign Z_A)`` (score from half A, labels from half B, the
    usual held-out AUC) is biased down (by ``-2 c var_half = -4 c var``); ``(2 plug-in +
    split) / 3`` cancels the first-order terms. Near AUC 1/2 (no signal) the expansion fails:
    the plug-in's bias is then of the order of the noise's s.d., so this estimate stays above
    1/2 while the split-half is unbiased there (:func:`ceiling_interval` spans both).
    ``tests/test_synth.py`` checks it against the exact value on known probabilities and for
    convergence in the number of paths."""
    return _estimates(up, down)[0]


def _estimates(up: np.ndarray, down: np.ndarray) -> tuple[float, float]:
    """(bias-corrected estimate, split-half held-out estimate) of :func:`ceiling_estimate`."""
    h = up.shape[1] // 2
    a, b = up.mean(1), down.mean(1)
    d = float(a.sum() * b.sum() - np.sum(a * b))
    if d <= 0:
        return float("nan"), float("nan")

    def z(ap: np.ndarray, bp: np.ndarray) -> np.ndarray:  # Z[i, j] = a_i b_j - a_j b_i
        m = np.outer(ap, bp)
        return m - m.T

    plug = np.abs(z(a, b)).sum() / 2.0  # each unordered pair twice in the matrix
    z_a = z(up[:, :h].mean(1), down[:, :h].mean(1))
    z_b = z(up[:, h:].mean(1), down[:, h:].mean(1))
    split = (z_b * np.sign(z_a) + z_a * np.sign(z_b)).sum() / 4.0  # both halves as the score
    return float(0.5 + (2.0 * plug + split) / 3.0 / (2.0 * d)), float(0.5 + split / (2.0 * d))


def auc_ceiling(
    run: InstrumentRun,
    horizons: Sequence[int],
    paths: dict[int, int] | int,
    seed: int,
    threads: int | None = None,
    interval: dict[str, list[float]] | None = None,
) -> dict[str, float]:
    """Best possible AUC per label horizon for the leading outright, by Monte-Carlo.

    From each saved state (evenly spaced over the session's events), ``paths[h]`` continuations
    (nested: the paths of a longer horizon serve the shorter ones too) are simulated under the
    true model with fresh randomness, and :func:`ceiling_estimate` turns their outcomes into
    the AUC of the Bayes score ``P(up | state, no tie)`` over the states. The state includes
    everything the model uses (also the decayed signed flow and the running metaorder), so the
    value bounds any model on observable features from above; the continuations move the mid
    without the bridge towards the session's close, which no model can know (given the past,
    the bridged mid is such a walk). The states run in ``threads`` threads
    (default: all cores) in blocks seeded by ``(seed, block)``: the result does not depend on
    the thread count. ``interval`` (a dict) receives the 95 % bootstrap interval per horizon
    (:func:`ceiling_interval`). Its accuracy (bias from the paths' noise plus the spread from the
    sampled states) is checked in ``tests/test_synth.py`` (doubling the paths moves it < 0.015).
    """
    assert run.saved is not None
    hs = np.asarray(sorted(horizons), np.int64)
    if isinstance(paths, int):
        paths = {int(h): paths for h in hs}
    k = max(paths.values())
    # path r runs to the longest horizon that uses it
    n_steps = np.array([max([int(h) for h in hs if r < paths[int(h)]] or [0]) for r in range(k)], np.int64)
    s_st, s_fst = run.saved
    out = np.zeros((s_st.shape[0], k, hs.shape[0]), np.int8)
    block = 8
    blocks = list(range(0, s_st.shape[0], block))

    def work(lo: int) -> None:
        rng = np.random.default_rng(np.random.SeedSequence([seed, 9_999, lo]))
        hi = lo + block
        _mc_outcomes(rng, run.params, s_st[lo:hi], s_fst[lo:hi], hs, n_steps, out[lo:hi])

    threads = threads or usable_cores()
    if threads > 1 and len(blocks) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(work, blocks))
    else:
        for lo in blocks:
            work(lo)
    res: dict[str, float] = {}
    ci: dict[str, list[float]] = {}
    for j, h in enumerate(hs):
        o = out[:, : paths[int(h)], j]
        res[str(int(h))] = round(ceiling_estimate(o > 0, o < 0), 4)
        ci[str(int(h))] = [round(v, 4) for v in ceiling_interval(o > 0, o < 0, seed)]
    if interval is not None:
        interval.update(ci)
    return res


def ceiling_interval(up: np.ndarray, down: np.ndarray, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Interval of the AUC ceiling from :data:`BOOTSTRAP` resamples of the states (rows of
    ``up`` / ``down``, bool, states x paths, drawn with replacement; a state drawn twice pairs
    with itself at zero weight): from the lower ``(1 - level) / 2`` quantile of the split-half
    held-out estimate (biased down where there is signal, unbiased at 1/2) to the upper quantile
    of the bias-corrected :func:`ceiling_estimate` (biased up near 1/2). It spans the spread from
    the sampled states, the paths' noise of each state and both estimators' biases."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 4_242]))
    n = up.shape[0]
    comb, split = [], []
    for _ in range(BOOTSTRAP):
        i = rng.integers(0, n, n)
        c, s = _estimates(up[i], down[i])
        if np.isfinite(c):
            comb.append(c)
            split.append(s)
    if not comb:
        return float("nan"), float("nan")
    return float(np.quantile(split, (1 - level) / 2)), float(np.quantile(comb, (1 + level) / 2))
