"""examples/model.ipynb runs top to bottom on the embedded sample's cache: it trains, reads the
evaluation table, backtests and reads the results (tiny settings; nbclient, as a user's Jupyter)."""

from __future__ import annotations

import json

import nbformat
import pytest
from conftest import PROJECT
from nbclient import NotebookClient

pytest.importorskip("torch")
from alphafeat.precompute import DEFAULT_DATA_DIR, PrecomputeConfig, precompute  # noqa: E402


def test_model_notebook_executes(tmp_path, monkeypatch):
    if not any(DEFAULT_DATA_DIR.glob("*.dbn.zst")):
        pytest.skip("data/ has no embedded sample")
    cache, work = tmp_path / "cache", tmp_path / "work"
    precompute(PrecomputeConfig(inputs=[DEFAULT_DATA_DIR], out=cache, device="cpu"))
    nb = nbformat.read(PROJECT / "examples" / "model.ipynb", as_version=4)
    monkeypatch.setenv("ALPHAFEAT_CACHE", str(cache))
    monkeypatch.setenv("ALPHAMODEL_OUT", str(work))
    monkeypatch.setenv("PYTHONPATH", str(PROJECT))
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "3 sessions: 2024-03-06 ESH4" in text and "model.safetensors" in text
    assert "alphamodel" in text and "logistic" in text and "lift_ci_low" in text  # the evaluation tables
    assert "c51" in text and "hindsight" in text  # the results table
    assert "in sample" in text  # the backtest names the model's in-sample folds
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the AUC intervals and one equity curve
    ev = json.loads((work / "model" / "summary.json").read_text())["evaluation"]
    assert {r["model"] for r in ev} >= {"alphamodel", "logistic"}
    res = json.loads((work / "backtest" / "summary.json").read_text())["results"]
    assert {r["cost_ticks"] for r in res} == {0.0, 0.25}
    assert all(r["sharpe"] is None for r in res)  # one test session a fold: no daily Sharpe, as the notebook says
