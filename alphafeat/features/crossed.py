"""What each feature does on crossed-book rows (the pre-open auction): the texts of
:attr:`alphafeat.features.registry.FeatureSpec.crossed`, shown by ``alphafeat features``.

The kernels see a crossed row (best bid above best ask) as an empty book -- prices NaN, sizes 0
(:func:`alphafeat.features.inputs.prepare`) -- so no crossed price or size reaches any feature
of any row; what follows from that differs per feature. A leaf module (no imports).
"""

from __future__ import annotations

from collections.abc import Iterable

#: NaN on every crossed row (a text starting with it promises that; tests/test_preopen.py checks).
X_NAN = "NaN on crossed rows (their book counts as empty)"
X_DEPTH = "0 on crossed rows (their book counts as empty)"
X_FLOW = "reads no book price or size: computed on crossed rows as on any row"
X_OFI = ("crossed rows count as an empty book: the levels vanish on the first crossed row and appear on the "
         "first uncrossed row after them (+q bid, -q ask, as after any empty book)")
X_OFI_INT = X_OFI + "; NaN from the second crossed row of a run on (zero depth)"
X_RET = "NaN on crossed rows and on the first uncrossed row after them (its previous mid is NaN)"
X_EMA = ("crossed rows are skipped as NaN observations: the EMA holds through them and resumes from the last "
         "uncrossed observation")
X_RV = "a crossed row's return is NaN and counts 0: the sum only decays through crossed rows"
X_Z = (X_NAN + "; the EMA and variance states hold (or decay) through them and resume from the last uncrossed "
       "mid")
X_FD = "the forward-filled log mid holds its last uncrossed value through crossed rows"
X_DECLARED = "reads crossed rows as an empty book (prices NaN, sizes 0)"


def declared_crossed(inputs: Iterable[str]) -> str:
    """``FeatureSpec.crossed`` of a declared feature: :data:`X_FLOW` when it reads only the
    trade flow and the time step, else :data:`X_DECLARED`."""
    flow = {"buy_volume", "sell_volume", "trade_count", "dt_s", "signed_volume", "log_dt", "aggressor_imbalance",
            "log1p_trade_count", "slog_signed_volume"}
    return X_FLOW if set(inputs) <= flow else X_DECLARED
