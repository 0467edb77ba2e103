"""The example notebook runs top to bottom on a cache made from the embedded sample."""

from __future__ import annotations

import nbformat
import pytest
from conftest import PROJECT
from nbclient import NotebookClient

from alphafeat.precompute import DEFAULT_DATA_DIR, PrecomputeConfig, precompute


def test_explore_notebook_executes(tmp_path, monkeypatch):
    if not any(DEFAULT_DATA_DIR.glob("*.dbn.zst")):
        pytest.skip("data/ has no embedded sample")
    cache = tmp_path / "cache"
    precompute(PrecomputeConfig(inputs=[DEFAULT_DATA_DIR], out=cache, device="cpu"))
    nb = nbformat.read(PROJECT / "examples" / "explore.ipynb", as_version=4)
    monkeypatch.setenv("ALPHAFEAT_CACHE", str(cache))
    monkeypatch.setenv("PYTHONPATH", str(PROJECT))
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "ESH4" in text and "ESM4" in text and "up_share_when_bid_heavy" in text
    shares = ["".join(o.get("text", "") for o in c.get("outputs", [])) for c in nb.cells
              if c.cell_type == "code" and "up_share" in c.source]  # fmt: skip
    assert len(shares) == 2 and all("NaN" not in t and "nan" not in t for t in shares)  # NaN labels left out
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 3
    assert sorted(p.name for p in (cache / "_plots").iterdir()) == [
        "feature_distributions.png", "label_balance.png", "mid_rolls.png"]
