"""A plan pruned to some features (:func:`alphafeat.features.registry.prune_plan`) computes
those features bit for bit as the whole plan does, and runs fewer recurrences."""

from __future__ import annotations

import numpy as np
import pytest
from test_declared_feature import TOYS
from test_features import random_book

from alphafeat.features import FeatureParams, compute_features, feature_specs
from alphafeat.features.cpu import FeatureStream
from alphafeat.features.inputs import prepare
from alphafeat.features.registry import FEATURE_GROUPS, make_plan, prune_plan, registered, select_features


def _stream(plan, cols, n: int) -> np.ndarray:
    out = np.full((plan.n_out, n), 7.0)

    def take(i0, i1, res, which):
        for c in which:
            out[c, i0:i1] = res[c]

    s = FeatureStream(plan, 333, 2)
    s.push_block(cols, 0, take)
    s.close()
    return out


@pytest.mark.parametrize("declared", [(), TOYS], ids=["built-in", "with-toys"])
@pytest.mark.parametrize("want", ["fracdiff_log_mid", "trend", "mid_z_600s,realized_vol_10s", "flow", "vol", "ema",
                                  "default", "hawkes_buy,propagator_flow"])  # fmt: skip
def test_pruned_plan_gives_the_wanted_columns_bit_for_bit(want: str, declared) -> None:
    n = 4000
    book = random_book(n, 5)
    params = FeatureParams()
    with registered(*declared):
        names = [s.name for s in feature_specs(params)]
        wanted = select_features(want, params)[0] + [f.name for f in declared]
        cols = [names.index(w) for w in wanted]
        full = compute_features(book, params, device="cpu")
        plan = make_plan(params)
        pruned = prune_plan(plan, cols)
        got = _stream(pruned, prepare(book, params), n)
    for w, c in zip(wanted, cols):
        assert np.array_equal(got[c], full[w], equal_nan=True), w
    assert pruned.s_kind.shape[0] <= plan.s_kind.shape[0] and pruned.p_int.shape[0] <= plan.p_int.shape[0]
    if want in ("flow", "hawkes_buy,propagator_flow") and not declared:
        assert pruned.s_kind.shape[0] < plan.s_kind.shape[0] // 2 and pruned.fd_w.shape[0] == 1
    if want == "fracdiff_log_mid":
        assert pruned.fd_w.shape[0] == plan.fd_w.shape[0]


def test_a_wrong_series_index_would_be_seen() -> None:
    """The bit-for-bit check above can fail: a pruned plan whose z-score reads another series
    differs (guards the remapping of a post row's second and third series)."""
    n = 3000
    book = random_book(n, 3)
    params = FeatureParams()
    names = [s.name for s in feature_specs(params)]
    c = names.index("mid_z_600s")
    pruned = prune_plan(make_plan(params), [c, names.index("realized_vol_10s")])
    good = _stream(pruned, prepare(book, params), n)[c]
    bad = pruned.p_int.copy()
    row = int(np.flatnonzero(bad[:, 1] == c)[0])
    bad[row, 3] = (bad[row, 3] + 1) % pruned.s_kind.shape[0]
    import dataclasses

    wrong = dataclasses.replace(pruned, p_int=bad, derived={})
    assert not np.array_equal(_stream(wrong, prepare(book, params), n)[c], good, equal_nan=True)
    assert set(FEATURE_GROUPS) >= {"flow", "vol"}
