"""Mamba2's depthwise causal convolution and its SiLU (:func:`alphamodel.nn.mamba2.causal_conv`) as
Triton kernels, forward and backward.

Per sequence and channel ``c``, with ``f`` the ``K`` carried inputs (``state``) followed by the
window's ``L`` inputs ``x`` and ``w`` the ``K + 1`` taps (``nn.Conv1d(C, C, K + 1, groups=C)``):

    pre_t = b_c + sum_{j=0..K} w_{c,j} f_{t+j}          y_t = silu(pre_t) = pre_t sigmoid(pre_t)
    d pre_t = dy_t s_t (1 + pre_t (1 - s_t))           (s_t = sigmoid(pre_t))
    d f_r = sum_j w_{c,j} d pre_{r-j}      d w_{c,j} = sum_t d pre_t f_{t+j}      d b_c = sum_t d pre_t

Under ``torch.compile`` the torch form was a fifth of a training step (with the concatenation of
the carried inputs, the SiLU and the reduction for ``d w``; docs/performance.md). Here the forward
is one kernel over tiles of rows and channels that reads ``x`` as it lies (a strided slice of the
in-projection's output, without the concatenation); the backward is two: one program per (sequence,
channels) walks the rows, writes ``d pre`` and keeps the products for ``d w`` and ``d b`` per
element until the end (one partial per sequence, summed in torch: deterministic, no atomics); then
``d f`` over tiles from ``d pre``. Two to four taps (``2 <= d_conv <= 4``; Mamba2's default is 4).

``torch.library`` custom ops (``alphamodel::conv_silu`` and ``alphamodel::conv_silu_bwd``, fake
tensors and autograd registered) as in :mod:`alphamodel.ops.triton.ssd_triton`, so ``torch.compile`` and CUDA
graphs keep them. Sums in float32; ``y`` and ``d x`` in ``x``'s dtype (bf16 under autocast).
Runs on CUDA, or on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1`` set before
triton is imported).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from alphamodel.errors import UsageError
from alphamodel.ops.triton.cfc_triton import check_device
from alphamodel.ops.triton.checks import on_device

__all__ = ["conv_silu", "conv_silu_bwd", "causal_conv_silu"]

#: The taps the kernels hold (written out in them; ``d_conv`` 2 to 4, fewer than 4 padded with zeros).
TAPS = 4
#: Rows and channels per tile: forward, the backward's d pre pass and its d f pass (measured at
#: ``bench/train.py``'s sizes in bf16 against the compiled torch form: docs/performance.md).
FWD_TILE, DPRE_TILE, DF_TILE = (32, 128), (16, 128), (16, 128)


@triton.jit
def _f(x_ptr, st_ptr, s, r, cc, cmask, L, C, sxb, sxt, K: tl.constexpr):
    """Rows ``r`` (BT,) of ``f`` = [state; x] of sequence ``s``, channels ``cc`` (BC,), float32;
    zero outside [0, L + K)."""
    in_x = (r >= K) & (r < L + K)
    xv = tl.load(x_ptr + s * sxb + (r - K).to(tl.int64)[:, None] * sxt + cc[None, :],
                 mask=in_x[:, None] & cmask[None, :], other=0.0)
    in_s = (r >= 0) & (r < K)
    sv = tl.load(st_ptr + (s * K + r)[:, None] * C + cc[None, :], mask=in_s[:, None] & cmask[None, :], other=0.0)
    return xv.to(tl.float32) + sv.to(tl.float32)


@triton.jit
def _tap(w_ptr, cc, cmask, j: tl.constexpr):
    """Tap ``j`` (1, BC) float32 of the (C, 4) zero-padded taps."""
    return tl.load(w_ptr + cc * 4 + j, mask=cmask, other=0.0).to(tl.float32)[None, :]


@triton.jit
def _tile(pid, L, C, BT: tl.constexpr, BC: tl.constexpr):
    """Sequence, rows (BT,) and channels (BC,) of program ``(pid, program_id(1))`` over rows [0, L)."""
    nt = tl.cdiv(L, BT)
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    return (pid // nt).to(tl.int64), (pid % nt) * BT + tl.arange(0, BT), cc, cc < C


@triton.jit
def _conv_fwd_kernel(x_ptr, st_ptr, w_ptr, b_ptr, y_ptr, L, C, sxb, sxt,
                     K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """y (batch, L, C) for one tile of rows and channels."""
    s, t, cc, cmask = _tile(tl.program_id(0), L, C, BT, BC)
    pre = tl.load(b_ptr + cc, mask=cmask, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(4):
        pre += _tap(w_ptr, cc, cmask, j) * _f(x_ptr, st_ptr, s, t + j, cc, cmask, L, C, sxb, sxt, K)
    tl.store(y_ptr + (s * L + t)[:, None] * C + cc[None, :], (pre * tl.sigmoid(pre)).to(y_ptr.dtype.element_ty),
             mask=(t < L)[:, None] & cmask[None, :])


@triton.jit
def _conv_dpre_kernel(x_ptr, st_ptr, w_ptr, b_ptr, dy_ptr, dp_ptr, dw_ptr, db_ptr, L, C, sxb, sxt,
                      K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """d pre (batch, L, C) in dy's dtype and this sequence's partial d w (4, C), d b (C,) float32;
    one program per (sequence, channels), its rows in blocks of BT, sums kept per element until
    the end (a reduction across threads per block cost 2.5x)."""
    s = tl.program_id(0).to(tl.int64)
    cc = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = cc < C
    bias = tl.load(b_ptr + cc, mask=cmask, other=0.0).to(tl.float32)[None, :]
    w0, w1, w2, w3 = _tap(w_ptr, cc, cmask, 0), _tap(w_ptr, cc, cmask, 1), _tap(w_ptr, cc, cmask, 2), \
        _tap(w_ptr, cc, cmask, 3)
    a0 = tl.zeros((BT, BC), dtype=tl.float32)
    a1, a2, a3, ab = a0, a0, a0, a0
    for t0 in range(0, L, BT):
        t = t0 + tl.arange(0, BT)
        m = (t < L)[:, None] & cmask[None, :]
        f0 = _f(x_ptr, st_ptr, s, t, cc, cmask, L, C, sxb, sxt, K)
        f1 = _f(x_ptr, st_ptr, s, t + 1, cc, cmask, L, C, sxb, sxt, K)
        f2 = _f(x_ptr, st_ptr, s, t + 2, cc, cmask, L, C, sxb, sxt, K)
        f3 = _f(x_ptr, st_ptr, s, t + 3, cc, cmask, L, C, sxb, sxt, K)
        pre = bias + w0 * f0 + w1 * f1 + w2 * f2 + w3 * f3
        dy = tl.load(dy_ptr + (s * L + t)[:, None] * C + cc[None, :], mask=m, other=0.0).to(tl.float32)
        sig = tl.sigmoid(pre)
        dpre = dy * sig * (1.0 + pre * (1.0 - sig))
        tl.store(dp_ptr + (s * L + t)[:, None] * C + cc[None, :], dpre.to(dp_ptr.dtype.element_ty), mask=m)
        ab += dpre
        a0 += dpre * f0
        a1 += dpre * f1
        a2 += dpre * f2
        a3 += dpre * f3
    o = dw_ptr + s * 4 * C + cc
    tl.store(o, tl.sum(a0, axis=0), mask=cmask)
    tl.store(o + C, tl.sum(a1, axis=0), mask=cmask)
    tl.store(o + 2 * C, tl.sum(a2, axis=0), mask=cmask)
    tl.store(o + 3 * C, tl.sum(a3, axis=0), mask=cmask)
    tl.store(db_ptr + s * C + cc, tl.sum(ab, axis=0), mask=cmask)


@triton.jit
def _conv_df_kernel(dp_ptr, w_ptr, dx_ptr, dst_ptr, L, C, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """d f = sum_j w_j d pre_{r-j} for one tile of rows r of [state; x]: into d x and d state."""
    s, r, cc, cmask = _tile(tl.program_id(0), L + K, C, BT, BC)
    df = tl.zeros((BT, BC), dtype=tl.float32)
    for j in tl.static_range(4):
        t = r - j
        valid = (t >= 0) & (t < L)
        dp = tl.load(dp_ptr + (s * L + t)[:, None] * C + cc[None, :], mask=valid[:, None] & cmask[None, :], other=0.0)
        df += _tap(w_ptr, cc, cmask, j) * dp.to(tl.float32)
    in_x = (r >= K) & (r < L + K)
    tl.store(dx_ptr + (s * L + r - K)[:, None] * C + cc[None, :], df.to(dx_ptr.dtype.element_ty),
             mask=in_x[:, None] & cmask[None, :])
    tl.store(dst_ptr + (s * K + r)[:, None] * C + cc[None, :], df.to(dst_ptr.dtype.element_ty),
             mask=(r < K)[:, None] & cmask[None, :])


def _grid(bsz: int, rows: int, c: int, tile: tuple[int, int], loop: bool = False) -> tuple[int, int]:
    """Programs over (sequences x row tiles, channel tiles); ``loop``: one per sequence (it walks the rows)."""
    return bsz * (1 if loop else triton.cdiv(rows, tile[0])), triton.cdiv(c, tile[1])


def _taps(w: torch.Tensor) -> torch.Tensor:
    """(C, K + 1) taps as the kernels' (C, 4) float32, zero-padded."""
    return torch.nn.functional.pad(w.float(), (0, TAPS - w.shape[1])).contiguous()


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its channels are adjacent (the kernels take any batch and row strides)."""
    return x if x.stride(-1) == 1 else x.contiguous()


@torch.library.custom_op("alphamodel::conv_silu", mutates_args=())
def conv_silu(x: torch.Tensor, state: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y (batch, L, C) in x's dtype (module docstring). x (batch, L, C), any batch and row strides;
    state (batch, K, C) the carried inputs before x, in x's dtype; w (C, K + 1) taps, 1 <= K <= 3,
    and b (C,) (float32 parameters; read as float32). The op itself checks nothing: use
    :func:`causal_conv_silu`."""
    x = _unit_stride(x)
    bsz, L, c = x.shape
    y = x.new_empty(bsz, L, c)
    with on_device(x):
        _conv_fwd_kernel[_grid(bsz, L, c, FWD_TILE)](x, state.contiguous(), _taps(w), b.contiguous(), y, L, c,
                                                     x.stride(0), x.stride(1), K=w.shape[1] - 1, BT=FWD_TILE[0],
                                                     BC=FWD_TILE[1])
    return y


@conv_silu.register_fake
def _(x, state, w, b):
    return x.new_empty(x.shape)


@torch.library.custom_op("alphamodel::conv_silu_bwd", mutates_args=())
def conv_silu_bwd(dy: torch.Tensor, x: torch.Tensor, state: torch.Tensor, w: torch.Tensor, b: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dstate, dw, db)`` shaped and typed as :func:`conv_silu`'s inputs (sums in float32), from
    dy (batch, L, C)."""
    x = _unit_stride(x)
    bsz, L, c = x.shape
    k = w.shape[1] - 1
    taps, dy = _taps(w), dy.contiguous()
    dpre, dx, dstate = torch.empty_like(dy), x.new_empty(bsz, L, c), torch.empty_like(state)
    dw = torch.empty(bsz, TAPS, c, dtype=torch.float32, device=x.device)
    db = torch.empty(bsz, c, dtype=torch.float32, device=x.device)
    with on_device(x):
        _conv_dpre_kernel[_grid(bsz, L, c, DPRE_TILE, loop=True)](
            x, state.contiguous(), taps, b.contiguous(), dy, dpre, dw, db, L, c, x.stride(0), x.stride(1), K=k,
            BT=DPRE_TILE[0], BC=DPRE_TILE[1])
        _conv_df_kernel[_grid(bsz, L + k, c, DF_TILE)](dpre, taps, dx, dstate, L, c, K=k, BT=DF_TILE[0],
                                                       BC=DF_TILE[1])
    return dx, dstate, dw[:, : k + 1].sum(0).T.contiguous().to(w.dtype), db.sum(0).to(b.dtype)


@conv_silu_bwd.register_fake
def _(dy, x, state, w, b):
    return (x.new_empty(x.shape), torch.empty_like(state), torch.empty_like(w), torch.empty_like(b))


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return conv_silu_bwd(dy, *ctx.saved_tensors)


conv_silu.register_autograd(_backward, setup_context=_setup)


def causal_conv_silu(x: torch.Tensor, state: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``F.silu(causal_conv(cat([state, x], 1), w, b))`` of :mod:`alphamodel.nn.mamba2` by the kernels.

    x (batch, L, C) (a strided view, e.g. a slice of the in-projection's output, is read as it
    lies); state (batch, K, C) the last ``K`` inputs of the previous window (zeros at a stream's
    start; cast to x's dtype); w (C, 1, K + 1) and b (C,) of ``nn.Conv1d(C, C, K + 1, groups=C)``,
    two to four taps. Returns (batch, L, C) in x's dtype, differentiable in all four (the
    gradients of w and b in their dtypes). Raises UsageError (option ``ssd_impl``, which selects
    these kernels in :class:`alphamodel.nn.mamba2.Mamba2`) off CUDA unless Triton's interpreter runs,
    and (option ``d_conv``) for other numbers of taps.
    """
    check_device(x, "ssd_impl")
    if not 2 <= w.shape[-1] <= TAPS:
        raise UsageError("d_conv", f"expected 2 to {TAPS} taps with the Triton convolution", w.shape[-1])
    return conv_silu(x, state.to(x.dtype), w[:, 0], b)
