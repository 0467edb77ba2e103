"""Context: the state carried across windows equals one long window; masked padding is neutral;
the fused CfC scan equals the reference loop (values and gradients)."""

from __future__ import annotations

import pytest
import torch

from alphamodel.nn.cfc import CfC
from alphamodel.nn.model import AlphaModel, ModelConfig


def _model(impl: str = "fused", seed: int = 0) -> AlphaModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_features=5, n_horizons=3, d_model=16, n_layers=2, d_state=8, headdim=8, chunk_size=8,
                      cfc_hidden=8, dropout=0.0, cfc_impl=impl)
    return AlphaModel(cfg).eval()


def _inputs(b: int = 3, L: int = 70, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, L, 5, generator=g), torch.rand(b, L, generator=g) * 0.05


@pytest.mark.parametrize("impl", ["fused", "loop"])
@torch.no_grad()
def test_stateful_windows_equal_one_long_window(impl):
    m = _model(impl)
    x, dt = _inputs()
    whole = m(x, dt)
    parts, state = [], None
    for a, b in ((0, 13), (13, 29), (29, 64), (64, 70)):  # uneven windows, not chunk multiples
        y, state = m(x[:, a:b], dt[:, a:b], state=state, return_state=True)
        parts.append(y)
    assert torch.allclose(torch.cat(parts, 1), whole, rtol=0, atol=1e-5)
    # without the carried state the later windows differ (the state matters)
    assert not torch.allclose(m(x[:, 29:64], dt[:, 29:64]), whole[:, 29:64], atol=1e-3)


@torch.no_grad()
def test_reset_zeroes_only_the_chosen_streams():
    m = _model()
    x, dt = _inputs()
    _, state = m(x[:, :20], dt[:, :20], return_state=True)
    state = state.reset(torch.tensor([True, False, False]))
    y = m(x[:, 20:40], dt[:, 20:40], state=state)
    fresh = m(x[:1, 20:40], dt[:1, 20:40])
    assert torch.allclose(y[:1], fresh, atol=1e-6)
    assert not torch.allclose(y[1:2], m(x[1:2, 20:40], dt[1:2, 20:40]), atol=1e-3)


@pytest.mark.parametrize("impl", ["fused", "loop"])
@torch.no_grad()
def test_masked_padding_does_not_change_real_rows(impl):
    m = _model(impl)
    x, dt = _inputs(L=40)
    ref = m(x, dt)
    g = torch.Generator().manual_seed(5)
    junk = torch.randn(3, 9, 5, generator=g) * 10  # large values: any leak would show
    junk_dt = torch.rand(3, 9, generator=g) * 100
    # left padding
    mask = torch.ones(3, 49, dtype=torch.bool)
    mask[:, :9] = False
    left = m(torch.cat([junk, x], 1), torch.cat([junk_dt, dt], 1), mask=mask)
    assert torch.allclose(left[:, 9:], ref, rtol=0, atol=1e-5)
    # right padding, and the state after it is the state after the last real row (CfC and SSM)
    mask = torch.ones(3, 49, dtype=torch.bool)
    mask[:, 40:] = False
    right, st = m(torch.cat([x, junk], 1), torch.cat([dt, junk_dt], 1), mask=mask, return_state=True)
    assert torch.allclose(right[:, :40], ref, rtol=0, atol=1e-5)
    _, st_ref = m(x, dt, return_state=True)
    assert torch.allclose(st.cfc, st_ref.cfc, atol=1e-5)
    assert torch.allclose(st.blocks[0][1], st_ref.blocks[0][1], atol=1e-5)
    # unmasked zero rows (the old padding) do move the outputs: the mask is what makes it neutral
    zeros = m(torch.cat([torch.zeros(3, 9, 5), x], 1), torch.cat([torch.zeros(3, 9), dt], 1))
    assert not torch.allclose(zeros[:, 9:], ref, atol=1e-4)


def test_fused_cfc_scan_equals_the_loop_with_gradients():
    torch.manual_seed(3)
    loop = CfC(6, 7, impl="loop").double()
    fused = CfC(6, 7, impl="fused", chunk=5).double()
    fused.load_state_dict(loop.state_dict())
    u = torch.randn(4, 23, 6, dtype=torch.float64, requires_grad=True)
    dt = torch.rand(4, 23, dtype=torch.float64) * 2
    mask = torch.rand(4, 23) > 0.2
    x0 = torch.randn(4, 7, dtype=torch.float64)
    a, b = loop(u, dt, x0, mask), fused(u, dt, x0, mask)
    assert torch.allclose(a, b, rtol=0, atol=1e-12)
    ga = torch.autograd.grad(a.square().sum(), [u, *loop.parameters()])
    gb = torch.autograd.grad(b.square().sum(), [u, *fused.parameters()])
    for p, q in zip(ga, gb):
        assert torch.allclose(p, q, rtol=0, atol=1e-10)
