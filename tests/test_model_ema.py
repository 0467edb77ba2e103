"""The input EMA bank (alphamodel/ema.py): equal to the row-by-row recursion, fitted statistics,
neutral padding, carried state; the model with a bank keeps stateful windows == one long window."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from alphafeat.errors import UsageError
from alphamodel.nn.ema import InputEMA
from alphamodel.nn.model import AlphaModel, ModelConfig


def _numpy_ema(x: np.ndarray, T: float) -> np.ndarray:
    """Independent reference: e_t = lam e_(t-1) + (1 - lam) x_t along axis 1, from zero."""
    lam = math.exp(-1.0 / T)
    e = np.zeros(x.shape[0::2])
    out = np.empty_like(x)
    for t in range(x.shape[1]):
        e = lam * e + (1 - lam) * x[:, t]
        out[:, t] = e
    return out


def test_chunked_bank_equals_the_recursion_with_masks_and_state():
    g = torch.Generator().manual_seed(0)
    bank = InputEMA(3, [4, 30, 600], chunk=16)
    x = torch.randn(2, 70, 3, generator=g, dtype=torch.float64)
    mask = torch.rand(2, 70, generator=g) > 0.2
    s0 = torch.randn(2, 3, 3, generator=g, dtype=torch.float64)
    y, e = bank(x, s0, mask)
    yr, er = bank.reference(x, s0, mask)
    assert torch.allclose(y, yr, atol=1e-10) and torch.allclose(e, er, atol=1e-10)
    # without mask and state: the plain EMA of numpy, times the white-noise gain (before a fit)
    y, _ = bank(x)
    lam = math.exp(-1 / 600)
    ref = np.clip(_numpy_ema(x.numpy(), 600) * math.sqrt((1 + lam) / (1 - lam)), -10, 10)
    assert np.allclose(y.numpy().reshape(2, 70, 3, 3)[..., 2], ref, atol=1e-9)


def test_bank_stays_float32_under_bf16_autocast():
    bank = InputEMA(2, [8, 2048])
    x = torch.randn(2, 100, 2, generator=torch.Generator().manual_seed(4))
    ref, _ = bank(x)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        y, e = bank(x)
    assert y.dtype == torch.float32 and e.dtype == torch.float32
    assert torch.allclose(y, ref, atol=1e-6)


def test_masked_rows_are_neutral_and_the_state_carries():
    g = torch.Generator().manual_seed(1)
    bank = InputEMA(2, [8, 256])
    x = torch.randn(1, 50, 2, generator=g)
    ref, e_ref = bank(x)
    padded = torch.cat([x[:, :20], 100 * torch.randn(1, 7, 2, generator=g), x[:, 20:]], 1)
    mask = torch.ones(1, 57, dtype=torch.bool)
    mask[:, 20:27] = False
    y, e = bank(padded, None, mask)
    assert torch.allclose(torch.cat([y[:, :20], y[:, 27:]], 1), ref, atol=1e-5)
    assert torch.allclose(e, e_ref, atol=1e-6)
    a, st = bank(x[:, :33])
    b, st = bank(x[:, 33:], st)
    assert torch.allclose(torch.cat([a, b], 1), ref, atol=1e-5) and torch.allclose(st, e_ref, atol=1e-6)


def test_fit_standardises_the_outputs_and_persistent_inputs_stay_off_the_clip():
    g = torch.Generator().manual_seed(2)
    L = 20_000
    noise = torch.randn(L, generator=g)
    level = torch.cumsum(torch.randn(L, generator=g), 0) / 40  # a slow, persistent input
    runs = [torch.stack([noise, level], -1)]
    bank = InputEMA(2, [16, 512])
    before, _ = bank(runs[0][None])
    assert (before[0, :, 3].abs() >= 10).float().mean() > 0.3  # persistent input at the clip unfitted
    bank.fit(runs)
    y, _ = bank(runs[0][None])
    assert torch.allclose(y[0].mean(0), torch.zeros(4), atol=0.05)
    assert torch.allclose(y[0].std(0), torch.ones(4), atol=0.05)
    assert (y[0].abs() >= 10).float().mean() < 1e-3


def _model(seed: int = 0, encoder: bool = False) -> AlphaModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_features=5, n_horizons=3, d_model=16, n_layers=2, d_state=8, headdim=8, chunk_size=8,
                      cfc_hidden=8, dropout=0.0, ema_rows=(4.0, 64.0), ema_encoder=encoder)
    m = AlphaModel(cfg).eval()
    with torch.no_grad():  # give the bank's part of the heads a say (it starts at zero)
        m.heads.weight[:, -m.ema.n_out :] = torch.randn(3, m.ema.n_out) * 0.3
    return m


@pytest.mark.parametrize("encoder", [False, True])
@torch.no_grad()
def test_model_with_bank_stateful_windows_equal_one_long_window_and_padding_is_neutral(encoder):
    m = _model(encoder=encoder)
    assert m.embed.in_features == (15 if encoder else 5)  # 5 inputs + 5 x 2 averages
    g = torch.Generator().manual_seed(3)
    x, dt = torch.randn(3, 70, 5, generator=g), torch.rand(3, 70, generator=g) * 0.05
    whole, st_whole = m(x, dt, return_state=True)
    parts, state = [], None
    for a, b in ((0, 13), (13, 29), (29, 64), (64, 70)):
        y, state = m(x[:, a:b], dt[:, a:b], state=state, return_state=True)
        parts.append(y)
    assert torch.allclose(torch.cat(parts, 1), whole, rtol=0, atol=1e-5)
    assert torch.allclose(state.ema, st_whole.ema, atol=1e-6)
    # the bank's state matters: dropping it changes the later windows
    no_ema = type(state)(state.blocks, state.cfc, None)
    _, mid = m(x[:, :40], dt[:, :40], return_state=True)
    cut = type(mid)(mid.blocks, mid.cfc, torch.zeros_like(mid.ema))
    assert not torch.allclose(m(x[:, 40:], dt[:, 40:], state=cut), whole[:, 40:], atol=1e-4)
    assert no_ema.detach().ema is None
    # left padding with junk, masked, leaves the real rows' logits unchanged
    mask = torch.ones(3, 79, dtype=torch.bool)
    mask[:, :9] = False
    junk = torch.randn(3, 9, 5, generator=g) * 10
    left = m(torch.cat([junk, x], 1), torch.cat([torch.rand(3, 9, generator=g), dt], 1), mask=mask)
    assert torch.allclose(left[:, 9:], whole, rtol=0, atol=1e-5)
    # reset zeroes the bank's state of the chosen streams only
    r = st_whole.reset(torch.tensor([True, False, False]))
    assert (r.ema[0] == 0).all() and torch.equal(r.ema[1:], st_whole.ema[1:])
    # scores: the forward's logits and the embedding they read, in one pass
    logits, seq, _ = m.scores(x, dt)
    assert torch.allclose(logits, whole, atol=1e-6)
    assert torch.allclose(seq, m.embedding(x, dt)[0], rtol=0, atol=0)


def test_ema_rows_config_is_checked():
    assert ModelConfig.from_dict({"ema_rows": [32, 128]}).ema_rows == (32.0, 128.0)
    assert ModelConfig.from_dict({}).ema_rows == ()
    for bad in ("32", [0], [-5], [32, "x"], 7):
        with pytest.raises(UsageError, match="ema_rows"):
            ModelConfig.from_dict({"ema_rows": bad})


def test_dt_range_reaches_the_mamba2_blocks():
    m = AlphaModel(ModelConfig(n_features=3, dt_min=1e-4, dt_max=2e-4))
    for blk in m.blocks:
        dt = torch.nn.functional.softplus(blk.mixer.dt_bias)
        assert ((dt >= 1e-4 * (1 - 1e-4)) & (dt <= 2e-4 * (1 + 1e-4))).all()
    with pytest.raises(UsageError, match="dt_min"):
        ModelConfig.from_dict({"dt_min": 0})
