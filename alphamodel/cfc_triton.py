"""The CfC scan of :class:`alphamodel.cfc.CfC` (``impl="triton"``) as Triton kernels.

The recurrent half of the fused scan (:func:`alphamodel.cfc._steps`) for all positions in one
kernel launch: each program owns ``block_b`` batch rows and walks the ``T`` positions in order,
keeping the state in registers (float32) and reading the weight tiles from L2 at each step.

    a_t = uw_t + x_{t-1} W_x^T ;  z_t = 1.7159 tanh(0.666 a_t) ;  [f|g|h] = z_t W_fgh^T + b_fgh
    s = sigmoid(-f dt_t / tau) ;  new = tanh(h) + s (tanh(g) - tanh(h)) ;  x_t = keep_t ? new : x_{t-1}

The backward keeps only the sequential chain in a kernel (walking ``t`` backwards, recomputing
``a, z, f, g, h`` from the saved ``x_{t-1}`` and ``uw_t``); it writes ``da_t``, ``d[f|g|h]_t``
and ``z_t`` for every position, and the weight, bias and ``uw`` gradients are then large
batched matrix products in torch. Both kernels are ``torch.library`` custom ops
(``alphamodel::cfc_scan`` and ``alphamodel::cfc_scan_bwd``, with fake tensors and autograd
registered), so ``torch.compile`` keeps them in its graph and a CUDA graph can capture them (no
host synchronisation, allocations through torch's caching allocator).

Dtypes: ``uw``, ``w_x``, ``w_fgh``, ``b_fgh`` share one dtype, float32 or bfloat16/float16 (under
autocast); the products then run in that dtype with float32 accumulation, and ``a``, the gate and
the state are float32. float32 products follow ``torch.backends.cuda.matmul.allow_tf32``
(``"tf32"`` when set, else ``"ieee"``, exact float32). ``dt``, ``x0``, ``inv_tau`` and the states
are float32. ``n`` (units) and ``bb`` (backbone width) must be powers of two >= 16 (``tl.dot``).

Runs on CUDA tensors, or on CPU tensors through Triton's interpreter when ``TRITON_INTERPRET=1``
is set before triton is first imported (Triton reads it when it decorates kernels: these, and
its own library's at import).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

__all__ = ["cfc_scan", "cfc_scan_bwd", "interpreted", "scan"]


@triton.jit
def _tanh(x):
    """tanh from one exp (no tl.tanh on every Triton version): sign(x) (1 - e) / (1 + e), e = exp(-2|x|)."""
    e = tl.exp(-2.0 * tl.abs(x))
    r = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -r, r)


@triton.jit
def _sigmoid(x):
    """1 / (1 + exp(-x)) without overflow: from e = exp(-|x|)."""
    e = tl.exp(-tl.abs(x))
    return tl.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def _tile(ptr, rows, cols, stride_r, stride_c):
    """Load a weight tile ``ptr[rows[:, None] * stride_r + cols[None, :] * stride_c]``."""
    return tl.load(ptr + rows[:, None] * stride_r + cols[None, :] * stride_c)


@triton.jit
def _cell(x, u, dtt, it, wx_ptr, wfgh_ptr, bf, bg, bh, cn, cb,
          N: tl.constexpr, BB: tl.constexpr, PREC: tl.constexpr):
    """One step's recomputable values from the state before it.

    x (R, N) float32 state, u (R, BB) float32 ``uw_t``, dtt (R,) float32, it (N,) float32
    ``1/tau``, bf/bg/bh (N,) float32 biases. Returns ``lt`` = tanh(0.666 a) and z (R, BB), f,
    s = the gate, tanh(g), tanh(h) (R, N), all float32."""
    wd = wx_ptr.dtype.element_ty
    a = u + tl.dot(x.to(wd), _tile(wx_ptr, cn, cb, 1, N), input_precision=PREC)  # x W_x^T
    lt = _tanh(0.666 * a)  # LeCun's tanh: z = 1.7159 tanh(0.666 a)
    zc = (1.7159 * lt).to(wd)
    f = tl.dot(zc, _tile(wfgh_ptr, cb, cn, 1, BB), input_precision=PREC) + bf[None, :]
    g = tl.dot(zc, _tile(wfgh_ptr + N * BB, cb, cn, 1, BB), input_precision=PREC) + bg[None, :]
    h = tl.dot(zc, _tile(wfgh_ptr + 2 * N * BB, cb, cn, 1, BB), input_precision=PREC) + bh[None, :]
    s = _sigmoid(-f * (dtt[:, None] * it[None, :]))
    return lt, zc, f, s, _tanh(g), _tanh(h)


@triton.jit
def _fwd_kernel(uw_ptr, dt_ptr, keep_ptr, x0_ptr, wx_ptr, wfgh_ptr, bfgh_ptr, it_ptr, y_ptr, B, T,
                N: tl.constexpr, BB: tl.constexpr, BLOCK_B: tl.constexpr, PREC: tl.constexpr):
    """States y (B, T, N) float32 of the rows ``[pid * BLOCK_B, ...)``; all tensors contiguous."""
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    live = rows < B
    rows64 = rows.to(tl.int64)
    cn = tl.arange(0, N)
    cb = tl.arange(0, BB)
    x = tl.load(x0_ptr + rows64[:, None] * N + cn[None, :], mask=live[:, None], other=0.0)
    bf = tl.load(bfgh_ptr + cn).to(tl.float32)
    bg = tl.load(bfgh_ptr + N + cn).to(tl.float32)
    bh = tl.load(bfgh_ptr + 2 * N + cn).to(tl.float32)
    it = tl.load(it_ptr + cn)
    for t in range(T):
        bt = rows64 * T + t
        u = tl.load(uw_ptr + bt[:, None] * BB + cb[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        dtt = tl.load(dt_ptr + bt, mask=live, other=0.0)
        k = tl.load(keep_ptr + bt, mask=live, other=0) != 0
        _, _, _, s, tg, th = _cell(x, u, dtt, it, wx_ptr, wfgh_ptr, bf, bg, bh, cn, cb, N, BB, PREC)
        x = tl.where(k[:, None], th + s * (tg - th), x)
        tl.store(y_ptr + bt[:, None] * N + cn[None, :], x, mask=live[:, None])


@triton.jit
def _bwd_kernel(gy_ptr, y_ptr, uw_ptr, dt_ptr, keep_ptr, x0_ptr, wx_ptr, wfgh_ptr, bfgh_ptr, it_ptr,
                da_ptr, dfgh_ptr, z_ptr, dx0_ptr, dtau_ptr, ddt_ptr, B, T,
                N: tl.constexpr, BB: tl.constexpr, BLOCK_B: tl.constexpr, PREC: tl.constexpr,
                NEED_DDT: tl.constexpr):
    """The chain of the scan's backward for the rows ``[pid * BLOCK_B, ...)``, t = T-1 .. 0.

    Writes da (B, T, BB) and d[f|g|h] (B, T, 3N) in the weights' dtype, z (B, T, BB) in that
    dtype, dx0 (B, N) float32, this program's part of d(1/tau) (N,) at ``dtau_ptr[pid]``, and
    d dt (B, T) float32 when NEED_DDT."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    live = rows < B
    rows64 = rows.to(tl.int64)
    cn = tl.arange(0, N)
    cb = tl.arange(0, BB)
    wd = wx_ptr.dtype.element_ty
    x0 = tl.load(x0_ptr + rows64[:, None] * N + cn[None, :], mask=live[:, None], other=0.0)
    bf = tl.load(bfgh_ptr + cn).to(tl.float32)
    bg = tl.load(bfgh_ptr + N + cn).to(tl.float32)
    bh = tl.load(bfgh_ptr + 2 * N + cn).to(tl.float32)
    it = tl.load(it_ptr + cn)
    dx = tl.zeros((BLOCK_B, N), dtype=tl.float32)  # d loss / d x_t from the positions after t
    dtau = tl.zeros((BLOCK_B, N), dtype=tl.float32)
    for i in range(T):
        t = T - 1 - i
        bt = rows64 * T + t
        bn = bt[:, None] * N + cn[None, :]
        dx += tl.load(gy_ptr + bn, mask=live[:, None], other=0.0).to(tl.float32)
        later = (t * N + cn[None, :]) >= N  # t > 0, as a tile: x_{t-1} is y[:, t-1], else x0
        xp = tl.where(later, tl.load(y_ptr + bn - N, mask=live[:, None] & later, other=0.0), x0)
        u = tl.load(uw_ptr + bt[:, None] * BB + cb[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        dtt = tl.load(dt_ptr + bt, mask=live, other=0.0)
        k = tl.load(keep_ptr + bt, mask=live, other=0) != 0
        lt, zc, f, s, tg, th = _cell(xp, u, dtt, it, wx_ptr, wfgh_ptr, bf, bg, bh, cn, cb, N, BB, PREC)
        dn = tl.where(k[:, None], dx, 0.0)  # d new; a masked step passes dx straight to x_{t-1}
        dc = dn * (tg - th) * s * (1.0 - s)  # d of the gate's argument c = -f dt / tau
        df = -dc * (dtt[:, None] * it[None, :])
        dg = dn * s * (1.0 - tg * tg)
        dh = dn * (1.0 - s) * (1.0 - th * th)
        dtau += -dc * f * dtt[:, None]
        if NEED_DDT:
            tl.store(ddt_ptr + bt, tl.sum(-dc * f * it[None, :], axis=1), mask=live)
        dz = tl.dot(df.to(wd), _tile(wfgh_ptr, cn, cb, BB, 1), input_precision=PREC)
        dz += tl.dot(dg.to(wd), _tile(wfgh_ptr + N * BB, cn, cb, BB, 1), input_precision=PREC)
        dz += tl.dot(dh.to(wd), _tile(wfgh_ptr + 2 * N * BB, cn, cb, BB, 1), input_precision=PREC)
        da = dz * (1.7159 * 0.666) * (1.0 - lt * lt)
        dx = tl.dot(da.to(wd), _tile(wx_ptr, cb, cn, N, 1), input_precision=PREC) + tl.where(k[:, None], 0.0, dx)
        bb_off = bt[:, None] * BB + cb[None, :]
        tl.store(da_ptr + bb_off, da.to(wd), mask=live[:, None])
        tl.store(z_ptr + bb_off, zc, mask=live[:, None])
        b3 = bt[:, None] * (3 * N) + cn[None, :]
        tl.store(dfgh_ptr + b3, df.to(wd), mask=live[:, None])
        tl.store(dfgh_ptr + b3 + N, dg.to(wd), mask=live[:, None])
        tl.store(dfgh_ptr + b3 + 2 * N, dh.to(wd), mask=live[:, None])
    tl.store(dx0_ptr + rows64[:, None] * N + cn[None, :], dx, mask=live[:, None])
    tl.store(dtau_ptr + pid * N + cn, tl.sum(dtau, axis=0))


_INTERPRETED = not isinstance(_fwd_kernel, triton.runtime.JITFunction)  # fixed at import


def interpreted() -> bool:
    """True when the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` at import).
    (A constant: torch.compile need not look at the kernel objects.)"""
    return _INTERPRETED


def _precision(w: torch.Tensor) -> str:
    """``tl.dot`` input precision: exact float32 products ("ieee") unless torch allows TF32 on
    CUDA; 16-bit products ignore it (Triton's default, "tf32")."""
    exact = w.dtype == torch.float32 and not (w.is_cuda and torch.backends.cuda.matmul.allow_tf32)
    return "ieee" if exact else "tf32"


def _programs(batch: int, block_b: int) -> int:
    return triton.cdiv(batch, block_b)


def _on(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """The kernels launch on the current CUDA device: make it ``t``'s."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


@torch.library.custom_op("alphamodel::cfc_scan", mutates_args=())
def cfc_scan(uw: torch.Tensor, dt: torch.Tensor, keep: torch.Tensor, x0: torch.Tensor, w_x: torch.Tensor,
             w_fgh: torch.Tensor, b_fgh: torch.Tensor, inv_tau: torch.Tensor, block_b: int, num_warps: int,
             num_stages: int) -> torch.Tensor:
    """All states (B, T, n) float32 of the scan. uw (B, T, bb); dt (B, T) float32 seconds; keep
    (B, T) bool; x0 (B, n) float32; w_x (bb, n); w_fgh (3n, bb); b_fgh (3n,); inv_tau (n,) float32."""
    b, t, bb = uw.shape
    n = x0.shape[1]
    y = torch.empty(b, t, n, dtype=torch.float32, device=uw.device)
    with _on(uw):
        _fwd_kernel[(_programs(b, block_b),)](
            uw.contiguous(), dt.contiguous(), keep.contiguous().view(torch.uint8), x0.contiguous(),
            w_x.contiguous(), w_fgh.contiguous(), b_fgh.contiguous(), inv_tau.contiguous(), y, b, t,
            N=n, BB=bb, BLOCK_B=block_b, PREC=_precision(w_x), num_warps=num_warps, num_stages=num_stages)
    return y


@cfc_scan.register_fake
def _(uw, dt, keep, x0, w_x, w_fgh, b_fgh, inv_tau, block_b, num_warps, num_stages):
    return uw.new_empty(*uw.shape[:2], x0.shape[1], dtype=torch.float32)


@torch.library.custom_op("alphamodel::cfc_scan_bwd", mutates_args=())
def cfc_scan_bwd(gy: torch.Tensor, y: torch.Tensor, uw: torch.Tensor, dt: torch.Tensor, keep: torch.Tensor,
                 x0: torch.Tensor, w_x: torch.Tensor, w_fgh: torch.Tensor, b_fgh: torch.Tensor,
                 inv_tau: torch.Tensor, block_b: int, num_warps: int, num_stages: int, need_ddt: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward's sequential chain: ``(da, dfgh, z, dx0, dtau_parts, ddt)``.

    gy (B, T, n) the gradient of the states, y (B, T, n) the states; the rest as :func:`cfc_scan`.
    da (B, T, bb), dfgh (B, T, 3n) and z (B, T, bb) in uw's dtype; dx0 (B, n) float32;
    dtau_parts (programs, n) float32 to sum over axis 0; ddt (B, T) float32 ((0,) without need_ddt)."""
    b, t, bb = uw.shape
    n = x0.shape[1]
    da, dfgh, z, dx0, parts, ddt = _bwd_empty(uw, n, block_b, need_ddt)
    with _on(uw):
        _bwd_kernel[(_programs(b, block_b),)](
            gy.contiguous(), y.contiguous(), uw.contiguous(), dt.contiguous(), keep.contiguous().view(torch.uint8),
            x0.contiguous(), w_x.contiguous(), w_fgh.contiguous(), b_fgh.contiguous(), inv_tau.contiguous(),
            da, dfgh, z, dx0, parts, ddt, b, t,
            N=n, BB=bb, BLOCK_B=block_b, PREC=_precision(w_x), NEED_DDT=need_ddt, num_warps=num_warps,
            num_stages=num_stages)
    return da, dfgh, z, dx0, parts, ddt


def _bwd_empty(uw: torch.Tensor, n: int, block_b: int, need_ddt: bool) -> tuple[torch.Tensor, ...]:
    """The backward's outputs, uninitialised (every element is written by the kernel)."""
    b, t, bb = uw.shape
    f32 = {"dtype": torch.float32, "device": uw.device}
    return (uw.new_empty(b, t, bb), uw.new_empty(b, t, 3 * n), uw.new_empty(b, t, bb),
            torch.empty(b, n, **f32), torch.empty(_programs(b, block_b), n, **f32),
            torch.empty((b, t) if need_ddt else (0,), **f32))


@cfc_scan_bwd.register_fake
def _(gy, y, uw, dt, keep, x0, w_x, w_fgh, b_fgh, inv_tau, block_b, num_warps, num_stages, need_ddt):
    return _bwd_empty(uw, x0.shape[1], block_b, need_ddt)


def _setup(ctx, inputs, output) -> None:
    *tensors, block_b, num_warps, num_stages = inputs
    ctx.save_for_backward(*tensors, output)
    ctx.launch = (block_b, num_warps, num_stages)


def _backward(ctx, gy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """Gradients of :func:`cfc_scan`'s tensor inputs: the chain in :func:`cfc_scan_bwd`, then
    dW_x = da^T x_prev, dW_fgh = dfgh^T z, db_fgh = sum dfgh, d(1/tau) = sum of the parts."""
    uw, dt, keep, x0, w_x, w_fgh, b_fgh, inv_tau, y = ctx.saved_tensors
    need_ddt = ctx.needs_input_grad[1]
    da, dfgh, z, dx0, parts, ddt = cfc_scan_bwd(gy, y, uw, dt, keep, x0, w_x, w_fgh, b_fgh, inv_tau,
                                                *ctx.launch, need_ddt)
    bb, n = w_x.shape
    x_prev = torch.cat([x0[:, None].to(w_x.dtype), y[:, :-1].to(w_x.dtype)], dim=1).reshape(-1, n)
    d_wx = da.reshape(-1, bb).t() @ x_prev
    d_wfgh = dfgh.reshape(-1, 3 * n).t() @ z.reshape(-1, bb)
    d_bfgh = dfgh.sum(dim=(0, 1), dtype=torch.float32).to(b_fgh.dtype)
    return (da, ddt if need_ddt else None, None, dx0, d_wx, d_wfgh, d_bfgh, parts.sum(0), None, None, None)


cfc_scan.register_autograd(_backward, setup_context=_setup)


def scan(uw: torch.Tensor, dt: torch.Tensor, keep: torch.Tensor, x0: torch.Tensor, w_x: torch.Tensor,
         w_fgh: torch.Tensor, b_fgh: torch.Tensor, inv_tau: torch.Tensor, block_b: int = 16,
         num_warps: int = 8, num_stages: int = 1) -> torch.Tensor:
    """The CfC scan (states (B, T, n) float32), differentiable in uw, dt, x0, the weights and
    inv_tau; arguments as :func:`cfc_scan`. Launch: ``block_b`` (a power of two >= 16) batch rows
    per program, ``num_warps`` warps, ``num_stages`` software-pipeline stages of the loop over
    positions (1: none; 2 fits bf16 at n = 128 on sm_90, while float32 needs 1: compiled for
    sm_90 with Triton 3.9, the float32 backward asks 565 KB of shared memory at 2 stages).

    At n = bb = 128, bf16, sm_90 (``python bench/cfc_triton_regs.py``: Triton 3.9 and its ptxas,
    no GPU): 16 rows x 8 warps x 1 stage uses 216 registers and no spills forward, 255 registers
    and 496 bytes of spill stores backward; 4 warps spill more (48 / 1244 bytes), 32 rows more
    again (320 / 1796)."""
    return cfc_scan(uw, dt, keep, x0, w_x, w_fgh, b_fgh, inv_tau, block_b, num_warps, num_stages)
