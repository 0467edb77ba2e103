"""CfC ``impl="triton"`` (alphamodel.ops.triton.cfc_triton) against the reference loop: states and every
gradient (u, dt, x0, all parameters), with padding masks and a carried state.

Without CUDA the kernels run in Triton's interpreter on CPU tensors: ``TRITON_INTERPRET=1`` must
be set before triton is imported (Triton reads it when it decorates kernels, its own library's
at import), which this module does when it is collected. With CUDA the same tests run the
compiled kernels, and the CUDA-only tests check n = 128 in float32, TF32 and under bf16
autocast, and a CUDA graph capture (``torch.compile`` runs with inductor there, with aot_eager
on CPU). Skipped when triton is not installed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import sys

import pytest
import torch

from alphamodel.errors import UsageError
from alphamodel.nn.cfc import CfC
from alphamodel.nn.model import AlphaModel, ModelConfig

CUDA = torch.cuda.is_available()
if not CUDA and "triton" not in sys.modules:
    # Triton reads TRITON_INTERPRET when it decorates a kernel, its own (tl.zeros, ...) at import
    # included: set before triton is first imported, for the rest of this test process.
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton", reason="triton is not installed (pip install triton; CUDA builds of torch bring it)")

DEVICE = torch.device("cuda" if CUDA else "cpu")
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (the compiled kernels)")


@pytest.fixture(scope="module")
def kernels():
    """alphamodel.ops.triton.cfc_triton; without a GPU, its kernels in Triton's interpreter."""
    from alphamodel.ops.triton import cfc_triton

    if not CUDA and not cfc_triton.interpreted():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set (no GPU to compile for)")
    return cfc_triton


def pair(n_in: int, n: int, bb: int, seed: int, **kw) -> tuple[CfC, CfC]:
    """The reference loop and the Triton scan with the same weights, on DEVICE."""
    torch.manual_seed(seed)
    loop = CfC(n_in, n, impl="loop", backbone_size=bb).to(DEVICE)
    tri = CfC(n_in, n, impl="triton", backbone_size=bb, **kw).to(DEVICE)
    tri.load_state_dict(loop.state_dict())
    return loop, tri


def inputs(b: int, t: int, n_in: int, n: int, seed: int, dt_max: float = 0.05) -> dict[str, torch.Tensor]:
    """u, dt (seconds), x0 and a mask with False positions (row 0 all masked: padding only)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) > 0.25
    mask[0] = False
    data = {"u": torch.randn(b, t, n_in, generator=g), "dt": torch.rand(b, t, generator=g) * dt_max,
            "x0": torch.randn(b, n, generator=g), "mask": mask, "w": torch.randn(b, t, n, generator=g)}
    return {k: v.to(DEVICE) for k, v in data.items()}


def outputs_and_grads(m: CfC, d: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32,
                      autocast: bool = False) -> list[torch.Tensor]:
    """[states, d/du, d/ddt, d/dx0, d/dparameters...] of sum(w * states), as float64."""
    u, dt, x0 = (d[k].to(dtype).requires_grad_() for k in ("u", "dt", "x0"))
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
        y = m(u, dt, x0, d["mask"])
    grads = torch.autograd.grad((y.float() * d["w"]).sum(), [u, dt, x0, *m.parameters()])
    return [t.detach().double() for t in (y, *grads)]


def max_err(got: list[torch.Tensor], want: list[torch.Tensor]) -> list[float]:
    """Largest difference of each pair, relative to the reference's largest magnitude (at least 1)."""
    return [float((a - b).abs().max() / b.abs().max().clamp(min=1.0)) for a, b in zip(got, want)]


@pytest.mark.parametrize(("b", "t", "n", "bb"), [(32, 8, 16, 32), (20, 12, 32, 16)])
def test_triton_scan_equals_the_loop_with_gradients(kernels, b, t, n, bb):
    loop, tri = pair(5, n, bb, seed=b + t)
    d = inputs(b, t, 5, n, seed=t)
    want, got = outputs_and_grads(loop, d), outputs_and_grads(tri, d)
    assert len(got) == 4 + len(list(tri.parameters()))
    assert max(max_err(got, want)) < 1e-5
    # a row of padding only leaves the state where it was: x0 at every position, exactly
    assert torch.equal(got[0][0], d["x0"][0].double().expand(t, n))
    assert float(got[0].abs().max()) > 0.1 and all(float(g.abs().max()) > 0 for g in got)  # not all zeros
    with torch.no_grad():  # the forward that keeps nothing for a backward
        assert torch.allclose(tri(d["u"], d["dt"], d["x0"], d["mask"]).double(), got[0], rtol=0, atol=1e-6)


def test_triton_scan_under_torch_compile(kernels):
    """The custom ops trace without a graph break (fullgraph) and give the eager values."""
    _, tri = pair(5, 16, 16, seed=4)
    d = inputs(16, 6, 5, 16, seed=5)
    eager = outputs_and_grads(tri, d)
    compiled = copy.deepcopy(tri)
    compiled.forward = torch.compile(compiled.forward, backend="aot_eager" if not CUDA else "inductor",
                                     fullgraph=True)
    # aot_eager runs the same ops (exact); inductor may fuse the elementwise ops around the kernels
    assert max(max_err(outputs_and_grads(compiled, d), eager)) < (1e-5 if CUDA else 1e-6)
    # the op's registration: schema, autograd, fake tensors (what torch.compile relies on)
    g = torch.Generator().manual_seed(6)
    args = [torch.randn(s, generator=g).to(DEVICE) * 0.2 for s in ((16, 2, 16), (16, 2), (16, 16), (16, 16),
                                                                    (48, 16), (48,), (16,))]
    uw, dt, x0, w_x, w_fgh, b_fgh, inv_tau = (a.requires_grad_() for a in args)
    keep = torch.tensor([[True, False]] * 16, device=DEVICE)
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    result = torch.library.opcheck(kernels.cfc_scan, (uw, dt.abs(), keep, x0, w_x, w_fgh, b_fgh, inv_tau.abs(),
                                                      16, 8, 1, True), test_utils=checks)
    assert set(result.values()) == {"SUCCESS"}


def test_triton_scan_sizes_and_missing_triton_are_usage_errors(kernels, monkeypatch):
    for kw, name in [({"hidden_size": 24}, "hidden_size"), ({"backbone_size": 8}, "backbone_size"),
                     ({"block_b": 12}, "block_b")]:
        args = {"input_size": 4, "hidden_size": 16, "impl": "triton", **kw}
        with pytest.raises(UsageError, match=f"^{name}: expected a power of two >= 16 with impl 'triton'"):
            CfC(**args)
    with pytest.raises(UsageError, match="model.cfc_hidden: expected a power of two >= 16"):
        ModelConfig(n_features=3, cfc_hidden=24, cfc_impl="triton").checked()
    with pytest.raises(UsageError, match="^hidden_size: expected a power of two"):
        AlphaModel(ModelConfig(n_features=3, cfc_hidden=24, cfc_impl="triton"))
    tri = CfC(4, 16, impl="triton")
    monkeypatch.setattr(kernels, "interpreted", lambda: False)
    with pytest.raises(UsageError, match="^impl: 'triton' runs on CUDA tensors.*got 'cpu'"):
        tri(torch.randn(2, 3, 4), torch.rand(2, 3))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(UsageError, match="^impl: 'triton' needs the triton package"):
        CfC(4, 16, impl="triton")


@needs_cuda
@pytest.mark.parametrize(("precision", "slack"), [("fp32", 1e-4), ("tf32", 5e-3), ("bf16-autocast", 1e-2)])
def test_triton_scan_on_cuda_at_model_size(kernels, precision, slack):
    """n = bb = 128, B = T = 64: no less accurate than the loop in the same precision (both
    against the loop in float64): within 2x its error + ``slack`` (relative to the largest value;
    float32 products exact, in TF32, or bf16 under autocast)."""
    before = torch.get_float32_matmul_precision()  # (allow_tf32 is not readable in every torch)
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        _check_at_model_size(precision == "bf16-autocast", slack)
    finally:
        torch.set_float32_matmul_precision(before)


def _check_at_model_size(autocast: bool, slack: float) -> None:
    loop, tri = pair(32, 128, 128, seed=7)
    d = inputs(64, 64, 32, 128, seed=8, dt_max=0.01)
    truth = outputs_and_grads(copy.deepcopy(loop).double(), d, torch.float64)  # (no TF32 in float64)
    ref = max_err(outputs_and_grads(loop, d, autocast=autocast), truth)
    got = max_err(outputs_and_grads(tri, d, autocast=autocast), truth)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g <= 2 * r + slack, (i, g, r)


@needs_cuda
def test_triton_scan_in_a_cuda_graph(kernels):
    """Forward and backward captured once, replayed on new inputs: the eager values."""
    _, tri = pair(32, 128, 128, seed=9)
    d = inputs(64, 32, 32, 128, seed=10)
    static = {k: v.clone() for k, v in d.items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outputs_and_grads(tri, static)  # warm-up: the kernels compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = outputs_and_grads(tri, static)
    fresh = inputs(64, 32, 32, 128, seed=11)
    with torch.no_grad():  # u, dt and x0 are leaves that require grad after the capture
        for k, v in fresh.items():
            static[k].copy_(v)
    graph.replay()
    torch.cuda.synchronize()
    assert max(max_err(captured, outputs_and_grads(tri, fresh))) < 1e-6



@pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without CUDA")
def test_triton_training_off_cuda_is_refused_and_a_saved_triton_model_loads_as_fused(tmp_path):
    import dataclasses

    import numpy as np

    from alphamodel.data.cache import Normaliser
    from alphamodel.supervised.checkpoint import load_model, save_model
    from alphamodel.supervised.config import TrainConfig
    from alphamodel.supervised.train import train

    cfg = ModelConfig(n_features=3, d_model=16, headdim=8, cfc_hidden=16, cfc_impl="triton")
    with pytest.raises(UsageError, match="^model.cfc_impl: 'triton' runs on CUDA"):
        train(tmp_path / "no-cache", tmp_path / "out", cfg, TrainConfig(device="cpu"), progress=False)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    model = AlphaModel(cfg)
    norm = Normaliser(["a", "b", "c"], np.zeros(3), np.ones(3), 5.0)
    (tmp_path / "m").mkdir()
    save_model(tmp_path / "m", model, norm, {"model": dataclasses.asdict(cfg), "normaliser": norm.to_dict()})
    loaded, _, meta = load_model(tmp_path / "m", "cpu")
    assert meta["model"]["cfc_impl"] == "triton" and loaded.cfc.impl == "fused"
    x, dt = torch.randn(2, 5, 3), torch.rand(2, 5) * 0.01
    with torch.no_grad():
        want = AlphaModel(dataclasses.replace(cfg, cfc_impl="loop"))
        want.load_state_dict(loaded.state_dict())
        assert torch.allclose(loaded(x, dt), want.eval()(x, dt), atol=1e-5)


@pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without CUDA")
def test_cli_triton_config_off_cuda_is_one_line_naming_the_file(tmp_path, capsys):
    """``alphamodel train --config F`` with ``cfc_impl: "triton"`` on a CPU: exit 1, one line
    naming the file and the key, before the default cache is built."""
    from cli.alphamodel import main

    cfg = tmp_path / "triton.json"
    cfg.write_text(json.dumps({"model": {"cfc_impl": "triton", "cfc_hidden": 16}}))
    rc = main(["train", "-q", "--config", str(cfg), "--out", str(tmp_path / "out"), "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(cfg) in err and "model.cfc_impl" in err and "CUDA" in err
    assert not (tmp_path / "out" / "cache").exists()
