"""Shared test fixtures: where the public real data lives, and small helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from simulator import simulator_settings

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    simulator_settings()

PROJECT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT.parent / "shared" / "data"
REAL = SHARED_DATA / "real"
SAMPLES = SHARED_DATA / "dbn-samples"
ESH4_MBO = REAL / "esh4-glbx-mdp3-20231225.mbo.dbn.zst"
ESU4_MBP1 = REAL / "futures_mbp-1_2024-07-01T23-58_2024-07-02T00-02.dbn.zst"
ESU4_TRADES = REAL / "futures_trades_2024-07-01T23-58_2024-07-02T00-02.dbn.zst"

SKIP_REASON = "../shared/data is not present beside the project (a fresh clone without the shared data)"


def need(path: Path) -> Path:
    """Skip the calling test when a shared data file is absent."""
    if not path.exists():
        pytest.skip(SKIP_REASON)
    return path
