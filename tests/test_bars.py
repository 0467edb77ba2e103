"""Volume bars (AFML ch. 2) against a plain-Python loop."""

from __future__ import annotations

import numpy as np
import pytest
from test_features import random_book

from alphafeat.bars import volume_bars
from alphafeat.features import compute_features


def _slow_bars(vol: list[float], v: float) -> list[tuple[int, int]]:
    bars, acc, start = [], 0.0, 0
    for i, x in enumerate(vol):
        acc += x
        if acc >= v:
            bars.append((start, i))
            acc, start = 0.0, i + 1
    return bars


@pytest.mark.parametrize("v", [1.0, 7.0, 25.0])
def test_volume_bars_match_loop(v: float) -> None:
    book = random_book(300, 9)
    bars = volume_bars(book, v)
    ref = _slow_bars(list(book.buy_volume + book.sell_volume), v)
    assert len(bars) == len(ref) > 0
    ends = [e for _, e in ref]
    np.testing.assert_array_equal(bars.ts_recv, book.ts_recv[ends])
    np.testing.assert_array_equal(bars.bid_px, book.bid_px[ends])
    for k in ("buy_volume", "sell_volume", "trade_count"):
        np.testing.assert_array_equal(getattr(bars, k), [getattr(book, k)[s : e + 1].sum() for s, e in ref])
    assert (bars.buy_volume + bars.sell_volume >= v).all()
    f = compute_features(bars)  # the same features apply
    assert f["mid"].shape == (len(ref),)


def test_volume_bars_bad_and_empty() -> None:
    book = random_book(10, 1)
    with pytest.raises(ValueError):
        volume_bars(book, 0.0)
    assert len(volume_bars(book, 1e9)) == 0
