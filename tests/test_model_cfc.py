"""CfC cell (Hasani et al. 2022, eq. 10) against the closed form computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from alphamodel.nn.cfc import CfC, CfCCell


def by_hand(cell: CfCCell, u: np.ndarray, x: np.ndarray, dt: float) -> np.ndarray:
    """x' = s g + (1 - s) h, s = sigmoid(-f dt / tau), with numpy and the cell's weights."""
    W = cell.backbone.weight.detach().double().numpy()
    b = cell.backbone.bias.detach().double().numpy()
    z = 1.7159 * np.tanh(0.666 * (W @ np.concatenate([u, x]) + b))
    Wf = cell.fgh.weight.detach().double().numpy()
    bf = cell.fgh.bias.detach().double().numpy()
    n = cell.hidden_size
    out = Wf @ z + bf
    f, g, h = out[:n], np.tanh(out[n : 2 * n]), np.tanh(out[2 * n :])
    tau = np.exp(cell.log_tau.detach().double().numpy())
    s = 0.5 * (1.0 + np.tanh(-0.5 * f * dt / tau))  # sigmoid(-f dt / tau), without overflow
    return s * g + (1 - s) * h, g, h


@torch.no_grad()
def test_scalar_time_step_equals_closed_form():
    torch.manual_seed(0)
    cell = CfCCell(3, 4).double()
    u = np.array([0.3, -1.2, 0.5])
    x = np.array([0.1, 0.0, -0.4, 0.9])
    for dt in (0.0, 0.05, 1.0, 30.0):
        got = cell(torch.tensor(u)[None], torch.tensor(x)[None], torch.tensor([[dt]], dtype=torch.float64)).numpy()[0]
        assert np.allclose(got, by_hand(cell, u, x, dt)[0], rtol=0, atol=1e-14)
    # at dt = 0 the gate is exactly 1/2 (sigma(0)) whatever f is; for a long step it picks g or h
    got0 = cell(torch.tensor(u)[None], torch.tensor(x)[None], torch.zeros(1, 1, dtype=torch.float64)).numpy()[0]
    _, g, h = by_hand(cell, u, x, 0.0)
    assert np.allclose(got0, 0.5 * (g + h), atol=1e-15)


def test_per_sample_time_steps_are_not_mixed_across_the_batch():
    torch.manual_seed(1)
    cell = CfCCell(3, 5).double()
    u = torch.randn(4, 3, dtype=torch.float64)
    x = torch.randn(4, 5, dtype=torch.float64)
    dt = torch.tensor([[0.001], [0.1], [2.0], [50.0]], dtype=torch.float64)
    batched = cell(u, x, dt)
    for i in range(4):
        one = cell(u[i : i + 1], x[i : i + 1], dt[i : i + 1])
        assert torch.allclose(batched[i], one[0], atol=1e-15)
    assert torch.allclose(cell(u, x, dt[:, 0]), batched)  # a (B,) step is read as (B, 1)
    with pytest.raises(ValueError):
        cell(u, x, torch.ones(4, 4, dtype=torch.float64))  # would broadcast wrongly
    with pytest.raises(ValueError):
        cell(u, x, torch.ones(1, 1, dtype=torch.float64).expand(1, 1).repeat(2, 1))


def test_sequence_and_trainable_time_constants():
    torch.manual_seed(2)
    net = CfC(3, 6).double()
    u = torch.randn(2, 7, 3, dtype=torch.float64)
    dt = torch.rand(2, 7, dtype=torch.float64)
    y = net(u, dt)
    x = torch.zeros(2, 6, dtype=torch.float64)
    for t in range(7):  # the loop by hand
        x = net.cell(u[:, t], x, dt[:, t : t + 1])
        assert torch.allclose(y[:, t], x, atol=1e-15)
    y.sum().backward()
    assert net.cell.log_tau.grad is not None and float(net.cell.log_tau.grad.abs().sum()) > 0
    tau = torch.exp(net.cell.log_tau.detach())
    assert math.log(1e-3) - 1e-9 <= float(torch.log(tau).min()) and float(torch.log(tau).max()) <= math.log(10) + 1e-9
