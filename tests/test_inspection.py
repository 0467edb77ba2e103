"""alphafeat inspect: the numbers agree with pandas on the same cache; plots are written."""

from __future__ import annotations

import pandas as pd
import pyarrow.dataset as pads
import pytest
from conftest import ESU4_MBP1, ESU4_TRADES, need

from alphafeat.inspection import inspect_cache
from alphafeat.precompute import PrecomputeConfig, precompute
from cli.alphafeat import main


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    out = tmp_path_factory.mktemp("insp") / "cache"
    precompute(PrecomputeConfig(inputs=[need(ESU4_MBP1), need(ESU4_TRADES)], out=out, device="cpu",
                                feature_set="default,ofi"))
    return out


def test_report_matches_pandas(cache, tmp_path):
    rep = inspect_cache(cache, tmp_path / "plots")
    df = pads.dataset(str(cache), format="ipc", partitioning="hive").to_table().to_pandas()
    assert sum(n for _, _, n in rep.rows) == len(df)
    for col in ("ofi_l01", "label_h30", "ofi_l05"):
        assert rep.nan_rate[col] == pytest.approx(df[col].isna().mean())
    up, down, nan = rep.label_balance["label_h100"]
    assert up == pytest.approx((df["label_h100"] == 1).mean())
    assert down == pytest.approx((df["label_h100"] == 0).mean())
    assert up + down + nan == pytest.approx(1.0)
    assert [p.name for p in rep.plots] == ["feature_distributions.png", "label_balance.png", "mid_rolls.png"]
    assert all(p.stat().st_size > 10_000 for p in rep.plots)
    assert isinstance(df, pd.DataFrame)


def test_cli_inspect(cache, tmp_path, capsys):
    assert main(["inspect", str(cache), "--plots", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "label_h30" in out and "ESU4" in out
    assert main(["inspect", str(tmp_path)]) == 1
    assert "not an alphafeat cache" in capsys.readouterr().err
    (tmp_path / "f").write_text("x")
    assert main(["inspect", str(tmp_path / "f")]) == 1
    assert "is a file, not a cache directory" in capsys.readouterr().err
