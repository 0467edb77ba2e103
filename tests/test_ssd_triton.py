"""Mamba2's SSD scan with ``ssd_impl="triton"`` (alphamodel.ops.triton.ssd_triton) against the torch scan
(:func:`alphamodel.nn.mamba2.ssd_chunked` in float64, itself tested against the sequential
recurrence in tests/test_model_ssd.py): outputs, final state and every gradient, with groups,
padding, a carried state and masks; the custom ops under ``torch.compile``; size and device errors.
The block's convolution and SiLU as Triton kernels (alphamodel.ops.triton.conv_triton) against
:func:`alphamodel.nn.mamba2.causal_conv` in float64, forward and backward.

Without CUDA the kernels run in Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1`` set
before triton is imported, as tests/test_cfc_triton.py does). Skipped when triton is not installed.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import alphafeat.errors
from alphamodel.errors import UsageError
from alphamodel.nn.mamba2 import Mamba2, ssd_chunked
from alphamodel.nn.model import AlphaModel, ModelConfig

CUDA = torch.cuda.is_available()
if not CUDA and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton's first import (see the module docstring)

pytest.importorskip("triton", reason="triton is not installed (pip install triton; CUDA builds of torch bring it)")

DEVICE = torch.device("cuda" if CUDA else "cpu")


@pytest.fixture(scope="module")
def kernels():
    """alphamodel.ops.triton.ssd_triton; without a GPU, its kernels in Triton's interpreter."""
    from alphamodel.ops.triton import cfc_triton, ssd_triton

    if not CUDA and not cfc_triton.interpreted():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set (no GPU to compile for)")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # exact float32 products on both sides (CUDA)
    yield ssd_triton
    torch.backends.cuda.matmul.allow_tf32 = tf32


def scan_inputs(b: int, L: int, h: int, p: int, g: int, n: int, seed: int, init: bool) -> list[torch.Tensor]:
    """x, dt (> 0), A (< 0), B, C, D and an initial state (or None), float32 on DEVICE."""
    gen = torch.Generator().manual_seed(seed)
    t = [torch.randn(b, L, h, p, generator=gen), torch.rand(b, L, h, generator=gen) * 0.5 + 0.01,
         -torch.rand(h, generator=gen) * 1.5 - 0.1, torch.randn(b, L, g, n, generator=gen),
         torch.randn(b, L, g, n, generator=gen), torch.randn(h, generator=gen),
         torch.randn(b, h, p, n, generator=gen) if init else None]
    return [None if v is None else v.to(DEVICE) for v in t]


def pack(x, B, C):
    """x (b, L, H, P), B and C (b, L, G, N) laid out as the block's convolution writes them: one xbc."""
    return torch.cat([x.flatten(2), B.flatten(2), C.flatten(2)], dim=-1)


def scan(kernels, x, dt, A, B, C, D, q, s0=None):
    """``ssd_scan`` on x, B and C packed into one xbc."""
    return kernels.ssd_scan(pack(x, B, C), dt, A, D, B.shape[-1], B.shape[-2], q, s0)


def reference_scan(x, dt, A, B, C, D, q, s0):
    """The torch scan in float64 with the block's step and skip: ``ssd_chunked(x dt, A dt, B, C) + D x``."""
    x, dt, A, B, C, D = (t.double() for t in (x, dt, A, B, C, D))
    y, final = ssd_chunked(x * dt.unsqueeze(-1), A * dt, B, C, q, None if s0 is None else s0.double())
    return y + x * D.unsqueeze(-1), final


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest difference relative to the reference's largest magnitude (at least 1)."""
    return float((got.detach().double() - want.detach()).abs().max() / want.detach().abs().max().clamp(min=1.0))


@pytest.mark.parametrize(("L", "h", "g", "q", "p", "n", "init"), [
    (100, 4, 2, 32, 16, 16, True), (64, 2, 1, 16, 16, 16, False), (48, 4, 4, 16, 16, 16, True),
    (40, 2, 1, 16, 32, 64, True), (20, 2, 1, 16, 32, 128, False)])  # states of 2048 and 4096 elements:
    # the pass from chunk to chunk in one block and in two
def test_triton_scan_equals_the_torch_scan_with_gradients(kernels, L, h, g, q, p, n, init):
    inputs = scan_inputs(2, L, h, p, g, n, seed=L + h, init=init)
    leaves = [t for t in inputs if t is not None]
    for t in leaves:
        t.requires_grad_()
    x, dt, A, B, C, D, s0 = inputs
    y, final = scan(kernels, x, dt, A, B, C, D, q, s0)
    want_y, want_final = reference_scan(*inputs[:6], q, s0)
    assert y.shape == want_y.shape and final.shape == want_final.shape and y.dtype == torch.float32
    assert rel_err(y, want_y) < 1e-5 and rel_err(final, want_final) < 1e-5
    gen = torch.Generator().manual_seed(1)
    wy, wf = (torch.randn(t.shape, generator=gen, dtype=torch.float64).to(DEVICE) for t in (y, final))
    got = torch.autograd.grad((y * wy.float()).sum() + (final * wf.float()).sum(), leaves)
    want = torch.autograd.grad((want_y * wy).sum() + (want_final * wf).sum(), leaves)
    errs = [rel_err(u, v) for u, v in zip(got, want)]
    assert max(errs) < 1e-5, errs
    assert all(float(u.abs().max()) > 0 for u in got)  # every input's gradient reaches it


def test_triton_scan_without_the_final_state_in_the_loss(kernels):
    """Only y in the loss (the final state's gradient is absent): the same gradients as the reference."""
    inputs = scan_inputs(1, 48, 2, 16, 1, 16, seed=9, init=False)
    leaves = [t.requires_grad_() for t in inputs[:6]]
    got = torch.autograd.grad(scan(kernels, *leaves, 16)[0].square().sum(), leaves)
    want = torch.autograd.grad(reference_scan(*leaves, 16, None)[0].square().sum(), leaves)
    errs = [rel_err(u, v) for u, v in zip(got, want)]
    assert max(errs) < 1e-5, errs


def test_triton_scan_reads_bf16_inputs(kernels):
    """x, B and C in bfloat16 (the convolution's output under autocast): the values of the float64
    scan of the same (rounded) inputs, y and the gradient of xbc in bfloat16 to its rounding."""
    x, dt, A, B, C, D, s0 = scan_inputs(2, 64, 2, 16, 1, 16, seed=11, init=True)
    xbc = pack(x, B, C).bfloat16().requires_grad_()
    y, final = kernels.ssd_scan(xbc, dt, A, D, 16, 1, 16, s0)
    ref = xbc.detach().double().requires_grad_()
    xr, Br, Cr = ref[..., :32].unflatten(2, (2, 16)), ref[..., 32:48, None], ref[..., 48:, None]
    want_y, want_final = reference_scan(xr, dt, A, Br.mT, Cr.mT, D, 16, s0)
    assert y.dtype == torch.bfloat16 and rel_err(y, want_y) < 1e-2 and rel_err(final, want_final) < 1e-5
    (got,) = torch.autograd.grad((y.float() * y.float()).sum() + final.sum(), xbc)
    (want,) = torch.autograd.grad((want_y * want_y).sum() + want_final.sum(), ref)
    assert got.dtype == torch.bfloat16 and rel_err(got, want) < 1e-2


def test_mamba2_triton_equals_chunked_with_state_and_mask(kernels):
    """The block with ``ssd_impl="triton"``: the outputs, carried states and parameter gradients
    of the chunked block, over two consecutive windows with padding (masked) in the first."""
    torch.manual_seed(0)
    ref = Mamba2(32, d_state=16, headdim=16, chunk_size=16).to(DEVICE)
    tri = copy.deepcopy(ref)
    tri.ssd_impl = "triton"
    u = torch.randn(3, 40, 32, device=DEVICE)
    mask = torch.ones(3, 40, dtype=torch.bool, device=DEVICE)
    mask[1, :7] = False
    outs = []
    for m in (ref, tri):
        y1, st = m(u[:, :20], mask=mask[:, :20], return_state=True)
        y2, st2 = m(u[:, 20:], state=st, return_state=True)
        loss = (y1 * u[:, :20]).sum() + (y2 * u[:, 20:]).sum() + st2[1].sum()
        outs.append([y1, y2, st2[1], *torch.autograd.grad(loss, list(m.parameters()))])
    errs = [rel_err(a, b.double()) for a, b in zip(outs[1], outs[0])]
    assert max(errs) < 1e-4, errs


def test_triton_scan_under_torch_compile(kernels):
    """The custom op traces without a graph break (fullgraph), gives the eager values, and passes
    torch's checks of its registration (schema, autograd, fake tensors), with and without an
    initial state."""
    inputs = scan_inputs(2, 32, 2, 16, 1, 16, seed=3, init=True)

    def run(f):
        leaves = [t.clone().requires_grad_() for t in inputs]
        y, final = f(kernels, *leaves[:6], 16, leaves[6])
        return [y, final, *torch.autograd.grad((y * y).sum() + final.sum(), leaves)]

    eager = run(scan)
    compiled = run(torch.compile(scan, backend="inductor" if CUDA else "aot_eager", fullgraph=True))
    assert max(rel_err(c, e.double()) for c, e in zip(compiled, eager)) < (1e-5 if CUDA else 1e-6)
    x, dt, A, B, C, D, s0 = inputs
    acs = torch.cumsum((dt * A).reshape(2, 2, 16, 2), dim=2).reshape(2, 32, 2)
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    xbc = pack(x, B, C)
    for init in (s0, None):
        args = [t.contiguous().requires_grad_() for t in (xbc, dt, acs, D)]
        init = None if init is None else init.clone().requires_grad_()
        result = torch.library.opcheck(kernels.ssd_chunk_scan, (*args, init, 16, 1, 16, 4), test_utils=checks)
        assert set(result.values()) == {"SUCCESS"}


@pytest.mark.parametrize("L, c, k, dtype", [(37, 200, 3, torch.float32), (2, 130, 3, torch.float32),
                                             (9, 40, 1, torch.float32), (40, 64, 2, torch.bfloat16)])
def test_triton_conv_silu_equals_the_torch_conv(kernels, L, c, k, dtype):
    """``causal_conv_silu`` on a strided slice (as the in-projection's output) with a carried
    state: output and the gradients of input, state, taps and bias equal ``silu(causal_conv)``
    in float64 (float32 to 1e-5; bf16 input to its rounding). Windows shorter than the taps,
    not a multiple of the row block, channels not a multiple of the channel block."""
    from alphamodel.nn.mamba2 import causal_conv
    from alphamodel.ops.triton.conv_triton import causal_conv_silu

    gen = torch.Generator().manual_seed(L)
    wide, state = torch.randn(3, L, c + 50, generator=gen), torch.randn(3, k, c, generator=gen)
    w, b = torch.randn(c, 1, k + 1, generator=gen) * 0.5, torch.randn(c, generator=gen) * 0.1
    dy = torch.randn(3, L, c, generator=gen)

    def grads(f, dtype):
        leaves = [t.to(DEVICE, dtype if i < 2 else t.dtype if dtype == torch.float64 else torch.float32)
                  .requires_grad_() for i, t in enumerate((wide, state, w, b))]
        y = f(leaves[0][:, :, 10 : 10 + c], *leaves[1:])
        return [y, *torch.autograd.grad((y.double() * dy.to(DEVICE).double()).sum(), leaves)]

    want = grads(lambda x, s, w, b: F.silu(causal_conv(torch.cat([s, x], 1), w, b)), torch.float64)
    got = grads(causal_conv_silu, dtype)
    errs = [rel_err(g, r) for g, r in zip(got, want)]
    assert max(errs) < (1e-5 if dtype == torch.float32 else 3e-2), errs
    assert got[0].dtype == dtype and got[1][:, :, :10].abs().max() == 0  # only the slice has a gradient


def test_triton_conv_under_torch_compile(kernels):
    """The conv's custom ops trace without a graph break and pass torch's registration checks; five
    taps (more than the kernels hold) are a UsageError."""
    from alphamodel.ops.triton.conv_triton import causal_conv_silu, conv_silu

    gen = torch.Generator().manual_seed(5)
    x, s = torch.randn(2, 20, 48, generator=gen).to(DEVICE), torch.randn(2, 3, 48, generator=gen).to(DEVICE)
    w, b = torch.randn(48, 1, 4, generator=gen).to(DEVICE), torch.randn(48, generator=gen).to(DEVICE)

    def run(f):
        leaves = [t.clone().requires_grad_() for t in (x, s, w, b)]
        y = f(*leaves)
        return [y, *torch.autograd.grad((y * y).sum(), leaves)]

    with pytest.raises(UsageError, match="^d_conv: expected 2 to 4 taps with the Triton convolution, got 5"):
        causal_conv_silu(x, s, torch.zeros(48, 1, 5, device=DEVICE), b)
    eager = run(causal_conv_silu)
    compiled = run(torch.compile(causal_conv_silu, backend="inductor" if CUDA else "aot_eager", fullgraph=True))
    assert max(rel_err(c, e.double()) for c, e in zip(compiled, eager)) < 1e-6
    args = [t.clone().requires_grad_() for t in (x, s, w[:, 0], b)]
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    assert set(torch.library.opcheck(conv_silu, tuple(args), test_utils=checks).values()) == {"SUCCESS"}


def test_triton_scan_sizes_are_usage_errors(kernels):
    with pytest.raises(UsageError, match="^headdim: expected a power of two >= 16 with ssd_impl 'triton'"):
        scan(kernels, *scan_inputs(1, 32, 2, 8, 1, 16, seed=4, init=False)[:6], 16)
    with pytest.raises(UsageError, match="^chunk_size: expected a power of two >= 16"):
        scan(kernels, *scan_inputs(1, 32, 2, 16, 1, 16, seed=4, init=False)[:6], 8)
    with pytest.raises(UsageError, match="^ngroups: expected a divisor of the 2 heads, got 3"):
        scan(kernels, *scan_inputs(1, 32, 2, 16, 3, 16, seed=4, init=False)[:6], 16)
    x, dt, A, B, C, D, _ = scan_inputs(1, 32, 2, 16, 1, 16, seed=4, init=False)
    with pytest.raises(UsageError, match="^headdim: expected xbc's width 63 to be 2 heads x headdim"):
        kernels.ssd_scan(pack(x, B, C)[..., 1:], dt, A, D, 16)
    with pytest.raises(UsageError, match="^model.headdim: expected a power of two >= 16 with ssd_impl"):
        ModelConfig(n_features=3, d_model=12, headdim=12, ssd_impl="triton").checked()
    with pytest.raises(alphafeat.errors.UsageError, match="^model.ssd_impl: expected chunked or triton"):
        ModelConfig.from_dict({"ssd_impl": "fast"})


@pytest.mark.skipif(CUDA, reason="checks the refusal on a machine without CUDA")
def test_triton_ssd_off_cuda_is_refused_and_a_saved_model_loads_as_chunked(tmp_path, capsys):
    import numpy as np

    from alphamodel.data.cache import Normaliser
    from alphamodel.supervised.checkpoint import load_model, save_model
    from alphamodel.supervised.config import TrainConfig
    from alphamodel.supervised.train import train
    from cli.alphamodel import main

    cfg = ModelConfig(n_features=3, d_model=16, headdim=16, ssd_impl="triton")
    with pytest.raises(UsageError, match="^model.ssd_impl: 'triton' runs on CUDA"):
        train(tmp_path / "no-cache", tmp_path / "out", cfg, TrainConfig(device="cpu"), progress=False)
    model = AlphaModel(cfg)
    norm = Normaliser(["a", "b", "c"], np.zeros(3), np.ones(3), 5.0)
    (tmp_path / "m").mkdir()
    save_model(tmp_path / "m", model, norm, {"model": dataclasses.asdict(cfg), "normaliser": norm.to_dict()})
    loaded, _, meta = load_model(tmp_path / "m", "cpu")
    assert meta["model"]["ssd_impl"] == "triton" and all(b.mixer.ssd_impl == "chunked" for b in loaded.blocks)
    conf = tmp_path / "triton.json"
    conf.write_text(json.dumps({"model": {"ssd_impl": "triton"}}))
    rc = main(["train", "-q", "--config", str(conf), "--out", str(tmp_path / "out2"), "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(conf) in err and "model.ssd_impl" in err and "CUDA" in err
