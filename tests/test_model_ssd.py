"""Chunked SSD (Dao & Gu 2024) against a slow sequential recurrence; the Mamba2 block."""

from __future__ import annotations

import pytest
import torch

from alphamodel.nn.mamba2 import Mamba2, ssd_chunked


def ssd_sequential(x, a, B, C, h0=None):
    """Reference: h_t = exp(a_t) h_{t-1} + x_t B_t^T ; y_t = h_t C_t, one position at a time."""
    b, L, H, P = x.shape
    N = B.shape[-1]
    h = torch.zeros(b, H, P, N, dtype=x.dtype) if h0 is None else h0.clone()
    ys = []
    for t in range(L):
        h = torch.exp(a[:, t])[:, :, None, None] * h + x[:, t, :, :, None] * B[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", h, C[:, t]))
    return torch.stack(ys, dim=1), h


def inputs(dtype, b=2, L=37, H=3, P=4, N=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, L, H, P, generator=g, dtype=dtype)
    dt = torch.rand(b, L, H, generator=g, dtype=dtype) * 0.5 + 0.01
    A = -torch.rand(H, generator=g, dtype=dtype) * 3 - 0.1
    B = torch.randn(b, L, H, N, generator=g, dtype=dtype)
    C = torch.randn(b, L, H, N, generator=g, dtype=dtype)
    h0 = torch.randn(b, H, P, N, generator=g, dtype=dtype)
    return x * dt[..., None], A * dt, B, C, h0


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("chunk", [1, 8, 16, 64])  # 37 is not a multiple: padding is exercised
def test_chunked_equals_sequential(dtype, tol, chunk):
    x, a, B, C, h0 = inputs(dtype)
    for init in (None, h0):
        y_ref, h_ref = ssd_sequential(x, a, B, C, init)
        y, h = ssd_chunked(x, a, B, C, chunk_size=chunk, initial_state=init)
        scale = max(1.0, float(y_ref.abs().max()))
        assert float((y - y_ref).abs().max()) <= tol * scale
        assert float((h - h_ref).abs().max()) <= tol * max(1.0, float(h_ref.abs().max()))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("groups", [1, 2])
def test_grouped_B_C_equal_per_head_copies(dtype, tol, groups):
    """B and C shared by groups of heads (Mamba2's ngroups) == the sequential scan with each
    head given its group's B and C."""
    x, a, B, C, h0 = inputs(dtype, H=4)
    Bg, Cg = B[:, :, :groups], C[:, :, :groups]
    rep = 4 // groups
    y_ref, h_ref = ssd_sequential(x, a, Bg.repeat_interleave(rep, 2), Cg.repeat_interleave(rep, 2), h0)
    y, h = ssd_chunked(x, a, Bg, Cg, chunk_size=16, initial_state=h0)
    assert float((y - y_ref).abs().max()) <= tol * max(1.0, float(y_ref.abs().max()))
    assert float((h - h_ref).abs().max()) <= tol * max(1.0, float(h_ref.abs().max()))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_two_halves_with_carried_state_equal_the_whole(dtype, tol):
    x, a, B, C, _ = inputs(dtype, L=50)
    y_all, h_all = ssd_chunked(x, a, B, C, chunk_size=16)
    y1, h1 = ssd_chunked(x[:, :23], a[:, :23], B[:, :23], C[:, :23], chunk_size=16)
    y2, h2 = ssd_chunked(x[:, 23:], a[:, 23:], B[:, 23:], C[:, 23:], chunk_size=16, initial_state=h1)
    scale = max(1.0, float(y_all.abs().max()))
    assert float((torch.cat([y1, y2], 1) - y_all).abs().max()) <= tol * scale
    assert float((h2 - h_all).abs().max()) <= tol * max(1.0, float(h_all.abs().max()))


def test_gradients_match_the_reference_float64():
    x, a, B, C, h0 = inputs(torch.float64, b=1, L=21, H=2, P=3, N=4)
    w = torch.randn(1, 21, 2, 3, dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in (x, a, B, C, h0)]
    y, h = ssd_chunked(*leaves[:4], chunk_size=8, initial_state=leaves[4])
    g1 = torch.autograd.grad((y * w).sum() + h.sum(), leaves)
    leaves2 = [t.clone().requires_grad_(True) for t in (x, a, B, C, h0)]
    y, h = ssd_sequential(*leaves2[:4], leaves2[4])
    g2 = torch.autograd.grad((y * w).sum() + h.sum(), leaves2)
    for u, v in zip(g1, g2):
        assert torch.allclose(u, v, rtol=1e-9, atol=1e-10)


@torch.no_grad()
def test_mamba2_block_is_causal_and_finite():
    torch.manual_seed(0)
    m = Mamba2(16, d_state=8, headdim=8, chunk_size=8).double()
    u = torch.randn(2, 30, 16, dtype=torch.float64)
    y = m(u)
    assert y.shape == u.shape and torch.isfinite(y).all()
    u2 = u.clone()
    u2[:, 20:] += 10.0  # change the future
    y2 = m(u2)
    assert torch.allclose(y[:, :20], y2[:, :20], atol=1e-12)
    assert not torch.allclose(y[:, 20:], y2[:, 20:])


@torch.no_grad()
def test_mamba2_scan_stays_float32_under_bf16_autocast():
    torch.manual_seed(0)
    m = Mamba2(16, d_state=8, headdim=8, chunk_size=8)
    u = torch.randn(2, 24, 16)
    ref = m(u)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(u)
    assert y.dtype == torch.bfloat16
    assert float((y.float() - ref).abs().max()) < 0.1 * float(ref.abs().max())


@pytest.mark.parametrize("k", [0, 1, 3])
def test_causal_conv_equals_depthwise_conv1d(k: int) -> None:
    """The written-out causal convolution equals ``F.conv1d(..., groups=C)`` (float64, and its
    gradients), and under bf16 inputs it accumulates in float32 (closer to the float64 result)."""
    import torch.nn.functional as F

    from alphamodel.nn.mamba2 import causal_conv

    g = torch.Generator().manual_seed(k)
    full = torch.randn(3, 17 + k, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 1, k + 1, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    got, ref = causal_conv(full, w, b), F.conv1d(full.mT, w, b, groups=5).mT
    assert got.shape == ref.shape == (3, 17, 5)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    gy = torch.randn(got.shape, generator=g, dtype=torch.float64)
    for a, r in zip(torch.autograd.grad(got, (full, w, b), gy), torch.autograd.grad(ref, (full, w, b), gy)):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)
    low = causal_conv(full.detach().bfloat16(), w.detach(), b.detach())
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), causal_conv(full.detach().bfloat16().double(), w.detach(), b.detach()),
                               rtol=8e-3, atol=8e-3)
