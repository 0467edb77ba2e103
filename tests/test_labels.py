"""Direction labels against a plain loop; no label looks past the segment end."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alphafeat.labels import direction_labels, direction_labels_seconds, triple_barrier


def slow_labels(mid, h):
    out = []
    for t in range(len(mid)):
        if t + h >= len(mid) or math.isnan(mid[t]) or math.isnan(mid[t + h]) or mid[t + h] == mid[t]:
            out.append(math.nan)
        else:
            out.append(1.0 if mid[t + h] > mid[t] else 0.0)
    return np.array(out)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.one_of(st.sampled_from([100.0, 100.25, 100.5, 99.75]), st.just(math.nan)), max_size=60),
    st.lists(st.integers(1, 70), min_size=1, max_size=4, unique=True),
)
def test_matches_slow_loop(mid, horizons):
    mid = np.array(mid, dtype=np.float64)
    got = direction_labels(mid, horizons)
    for h in horizons:
        np.testing.assert_array_equal(got[f"label_h{h}"], slow_labels(mid, h))


def test_values_and_end_of_data():
    y = direction_labels(np.array([1.0, 2.0, 2.0, 1.0]), [1, 3])
    np.testing.assert_array_equal(y["label_h1"], [1, np.nan, 0, np.nan])
    np.testing.assert_array_equal(y["label_h3"], [np.nan, np.nan, np.nan, np.nan])


def test_bad_horizon():
    with pytest.raises(ValueError, match="expected a whole number of snapshots >= 1"):
        direction_labels(np.zeros(3), [0])


def test_end_times():
    ts = np.array([10, 20, 30, 40], dtype=np.int64)
    y = direction_labels(np.array([1.0, 2.0, 2.0, 1.0]), [1, 3], ts=ts)
    np.testing.assert_array_equal(y["t1_h1"], [20, 30, 40, -1])
    np.testing.assert_array_equal(y["t1_h3"], [40, -1, -1, -1])


def slow_seconds(mid, ts, s):
    out, t1 = [], []
    for t in range(len(mid)):
        target = ts[t] + round(s * 1e9)
        if target > ts[-1]:
            out.append(math.nan)
            t1.append(-1)
            continue
        j = max(i for i in range(len(ts)) if ts[i] <= target)
        d = mid[j] - mid[t]
        out.append(math.nan if (d == 0 or math.isnan(d)) else float(d > 0))
        t1.append(target)
    return np.array(out), np.array(t1)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3_000_000_000), st.sampled_from([1.0, 1.25, 1.5])), min_size=1, max_size=40),
       st.sampled_from([0.5, 1.0, 2.5]))
def test_seconds_horizon_matches_slow_asof(rows, s):
    rows = sorted(rows)
    ts = np.array([r[0] for r in rows], dtype=np.int64)
    mid = np.array([r[1] for r in rows])
    got = direction_labels_seconds(mid, ts, [s])
    y, t1 = slow_seconds(mid, ts, s)
    np.testing.assert_array_equal(got[f"label_h{s:g}s"], y)
    np.testing.assert_array_equal(got[f"t1_h{s:g}s"], t1)


def test_triple_barrier_reference_afml():
    # reference-values.md: close = [100, 100.5, 101.2, 100.8, 99], sigma = 0.01, pt = sl = 1 sigma,
    # horizon 4 -> first touch at index 2 (upper), label +1. Simple returns, touches with >=.
    close = np.array([100, 100.5, 101.2, 100.8, 99.0])
    y, t1, k = triple_barrier(close, 0.01 * close, 0.01 * close, 4)
    assert y[0] == 1 and k[0] == 2 and t1[0] == 2


def slow_triple_barrier(p, up, dn, h):
    out = []
    for t in range(len(p)):
        res = math.nan
        for j in range(t + 1, min(t + h, len(p) - 1) + 1):
            if p[j] - p[t] >= up:
                res = 1.0
                break
            if p[j] - p[t] <= -dn:
                res = -1.0
                break
        else:
            res = 0.0 if t + h <= len(p) - 1 else math.nan
        out.append(res)
    return np.array(out)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([99.5, 99.75, 100.0, 100.25, 100.5]), min_size=1, max_size=50),
       st.integers(1, 10), st.sampled_from([0.25, 0.5]), st.sampled_from([0.25, 0.75]))
def test_triple_barrier_matches_slow_loop(p, h, up, dn):
    p = np.array(p)
    y, _, _ = triple_barrier(p, up, dn, h)
    np.testing.assert_array_equal(y, slow_triple_barrier(p, up, dn, h))


def test_triple_barrier_unknown_past_segment_end_not_timeout():
    p = np.array([100.0, 100.0, 100.0])
    y, t1, _ = triple_barrier(p, 1.0, 1.0, 5, ts=np.array([1, 2, 3]))
    assert np.isnan(y).all() and (t1 == -1).all()
    y, t1, _ = triple_barrier(p, 1.0, 1.0, 2, ts=np.array([1, 2, 3]))
    assert y[0] == 0 and t1[0] == 3 and np.isnan(y[1])


def test_triple_barrier_non_positive_width_has_no_barrier():
    # a zero width would make any move, even none (d = 0 >= 0), a profit take: such a row has
    # no barrier and an unknown label, as a NaN width (e.g. a volatility barrier before any move)
    p = np.array([100.0, 100.0, 100.25, 100.0, 99.75])
    w = np.array([0.0, -0.25, 0.25, np.nan, 0.25])
    y, t1, k = triple_barrier(p, w, 0.25, 2)
    assert np.isnan(y[:2]).all() and (k[:2] == -1).all() and (t1[:2] == -1).all()
    assert y[2] == -1 and k[2] == 3 and np.isnan(y[3])
    y, _, _ = triple_barrier(p, 0.25, w, 2)
    assert np.isnan(y[:2]).all() and y[2] == -1
