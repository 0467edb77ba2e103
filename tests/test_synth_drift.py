"""The planted signal's expected mid change over the next K rows (``drift_K`` in the sidecar,
alphafeat.synth.planted): tested against what the simulated mid then does."""

import datetime

import numpy as np
import pytest
from joblib import Parallel, delayed

from alphafeat import synth
from alphafeat.errors import InputError
from alphafeat.synth import simulator as sim
from alphafeat.synth.planted import DRIFT_HORIZONS, DRIFT_PATHS, asof_events, read_drift, write_planted


def _sessions(days: list[datetime.date], scale: float, signal: synth.Signal) -> list[tuple[np.ndarray, np.ndarray]]:
    args = (11, scale, None, 0, None, False, signal, DRIFT_HORIZONS, DRIFT_PATHS)
    out = []
    for sess in Parallel(n_jobs=min(2, len(days)))(delayed(sim.simulate_session)(day, *args) for day in days):
        run = sess.runs[sess.leader]
        out.append((run.mid, run.drift))
    return out


def test_drift_predicts_the_mid_with_slope_one() -> None:
    """Realised mid change over K events regressed on drift_K: slope 1 within 3 standard errors
    and mean(realised - drift_K) within 3 standard errors of 0, for every stored K.

    The realised path also carries the bridge to the session's pre-drawn close, which drift_K
    leaves out (no trader knows the close): a drift of its own per session, so the slope is
    taken within sessions (session means removed) and the mean residual's standard error is
    the spread of the per-session means; the last 10 % of each session are left out, where the
    bridge saturates the up-probability's clip and the planted signal cannot act. The slope's
    standard error is that of non-overlapping windows (overlapping ones are not independent)."""
    days = [datetime.date(2024, 1, d) for d in (9, 10, 11)]
    runs = _sessions(days, 0.5, synth.Signal())
    for i, k in enumerate(DRIFT_HORIZONS):
        xs, ys, means = [], [], []
        for mid, drift in runs:
            n = int(0.9 * len(mid)) - k
            x, y = drift[:n:k, i], mid[k:n + k:k] - mid[:n:k]
            xs.append(x - x.mean())
            ys.append(y - y.mean())
            means.append(float(np.mean(mid[k:n + k] - mid[:n] - drift[:n, i])))
        x, y = np.concatenate(xs), np.concatenate(ys)
        slope = float(x @ y / (x @ x))
        se = float(np.sqrt(np.var(y - slope * x) / (x @ x)))
        assert abs(slope - 1.0) < 3 * se, (k, slope, se)
        m, m_se = np.mean(means), np.std(means, ddof=1) / np.sqrt(len(means))
        assert abs(m) < 3 * m_se + 1e-9, (k, m, m_se)
        if k <= 10:  # short horizons are measured precisely: the test has teeth there
            assert se < 0.2, (k, se)


def test_no_signal_no_drift() -> None:
    """--signal 0: the true model's expected change is exactly 0 at every horizon, but right
    after a lock (one event of a locked book, of random side: the next event undoes it)."""
    (mid, drift), = _sessions([datetime.date(2024, 1, 9)], 0.2, synth.Signal(0.0))
    assert drift.shape == (len(mid), len(DRIFT_HORIZONS))
    near = np.round(drift * 2) / 2
    assert np.allclose(drift, near, atol=1e-9) and set(np.unique(near).tolist()) <= {-0.5, 0.0, 0.5}
    assert np.mean(near != 0) < 0.01


def test_old_sidecar_without_drift_says_so(tmp_path) -> None:
    path = tmp_path / "glbx-mdp3-20240109.signal.arrow"
    write_planted(path, np.arange(3, dtype=np.int64), np.full(3, 0.5), {})
    with pytest.raises(InputError, match="without the drift_K columns.*--signal-file"):
        read_drift(path)
    write_planted(path, np.arange(3, dtype=np.int64), np.full(3, 0.5), {}, {10: np.ones(3), 1: np.zeros(3)})
    ts, dr = read_drift(path)
    assert sorted(dr) == [1, 10] and dr[10].tolist() == [1.0] * 3


def test_asof_events_matches_rows_to_their_own_event() -> None:
    ev = np.array([10, 20, 20, 20, 30], np.int64)
    rows = np.array([5, 10, 20, 20, 20, 20, 25, 30], np.int64)
    # three rows stamped 20 take the three events stamped 20 in order; a fourth gets the last
    assert asof_events(rows, ev).tolist() == [-1, 0, 1, 2, 3, 3, 3, 4]
    rng = np.random.default_rng(0)
    ev = np.sort(rng.integers(0, 200, 500))
    rows = np.sort(rng.integers(0, 200, 400))
    j = asof_events(rows, ev)
    ok = j >= 0
    assert np.all(ev[j[ok]] <= rows[ok])  # never an event stamped after the row
    assert np.all((ev <= rows[~ok][:, None]).sum(1) == 0) if (~ok).any() else True
