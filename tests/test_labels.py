"""Direction labels against a plain loop; no label looks past the segment end."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alphafeat.labels import direction_labels


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
    with pytest.raises(ValueError, match="positive integer"):
        direction_labels(np.zeros(3), [0])
