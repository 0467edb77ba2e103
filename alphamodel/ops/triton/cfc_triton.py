"""The CfC scan of :class:`alphamodel.nn.cfc.CfC` (``impl="triton"``) as Triton kernels.

The recurrent half of the fused scan (:func:`alphamodel.nn.cfc._steps`) for all positions in one
kernel launch: each program owns ``block_b`` batch rows and walks the ``T`` positions in order,
keeping the state in registers (float32) and reading the weight tiles from L2 at each step.

    a_t = uw_t + x_{t-1} W_x^T ;  z_t = 1.7159 tanh(0.666 a_t) ;  [f|g|h] = z_t W_fgh^T + b_fgh
    s = sigmoid(-f dt_t / tau) ;  new = tanh(h) + s (tanh(g) - tanh(h)) ;  x_t = keep_t ? new : x_{t-1}

When a gradient is wanted the forward also writes ``z_t`` and the heads' pre-activations
``[f|g|h]_t`` (``bb + 3n`` values per position in the products' dtype: 1 GiB in bf16 for
B = 2048, T = 512, n = bb = 128). The backward keeps only the sequential chain in a kernel,
walking ``t`` backwards from those (the gates from ``f, g, h``, ``tanh(0.666 a) = z / 1.7159``)
with two weight products per step, ``d[f|g|h] W_fgh`` and ``da W_x`` (four with recomputation,
and half the weight tiles read); it writes ``da_t`` and ``d[f|g|h]_t`` for every position, and
the weight, bias and ``uw`` gradients are then large batched matrix products in torch
(``dW_x = da^T x_prev``, ``dW_fgh = d[f|g|h]^T z``). Both kernels are ``torch.library`` custom
ops (``alphamodel::cfc_scan`` and ``alphamodel::cfc_scan_bwd``, with fake tensors and autograd
registered), so ``torch.compile`` keeps them in its graph and a CUDA graph can capture them (no
host synchronisation, allocations through torch's caching allocator).

Dtypes: ``uw``, ``w_x``, ``w_fgh``, ``b_fgh`` share one dtype, float32 or bfloat16/float16 (under
autocast); the products then run in that dtype with float32 accumulation, and ``a``, the gate and
the state are float32. float32 products run in TF32 (``input_precision="tf32"``) unless
``torch.get_float32_matmul_precision()`` is ``"highest"`` (then ``"ieee"``, exact float32).
``dt``, ``x0``, ``inv_tau`` and the states are float32. ``n`` (units) and ``bb`` (backbone
width) must be powers of two >= 16 (``tl.dot``).

Runs on CUDA tensors, or on CPU tensors through Triton's interpreter when ``TRITON_INTERPRET=1``
is set before triton is first imported (Triton reads it when it decorates kernels: these, and
its own library's at import).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from alphamodel.errors import UsageError
from alphamodel.ops.triton.checks import dot_precision, on_device

__all__ = ["bwd_kernel", "cfc_scan", "cfc_scan_bwd", "check_device", "fwd_kernel", "interpreted", "scan"]


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
def _cell(x, u, wx_ptr, wfgh_ptr, bf, bg, bh, cn, cb, N: tl.constexpr, BB: tl.constexpr, PREC: tl.constexpr):
    """One step's backbone and heads from the state before it.

    x (R, N) float32 state, u (R, BB) float32 ``uw_t``, bf/bg/bh (N,) float32 biases. Returns
    z (R, BB) in the weights' dtype and the heads' pre-activations f, g, h (R, N) float32."""
    wd = wx_ptr.dtype.element_ty
    a = u + tl.dot(x.to(wd), _tile(wx_ptr, cn, cb, 1, N), input_precision=PREC)  # x W_x^T
    zc = (1.7159 * _tanh(0.666 * a)).to(wd)  # LeCun's tanh
    f = tl.dot(zc, _tile(wfgh_ptr, cb, cn, 1, BB), input_precision=PREC) + bf[None, :]
    g = tl.dot(zc, _tile(wfgh_ptr + N * BB, cb, cn, 1, BB), input_precision=PREC) + bg[None, :]
    h = tl.dot(zc, _tile(wfgh_ptr + 2 * N * BB, cb, cn, 1, BB), input_precision=PREC) + bh[None, :]
    return zc, f, g, h


@triton.jit
def _gates(f, g, h, dtt, it):
    """The time gate s = sigmoid(-f dt / tau), tanh(g) and tanh(h), all (R, N) float32."""
    return _sigmoid(-f * (dtt[:, None] * it[None, :])), _tanh(g), _tanh(h)


@triton.jit
def fwd_kernel(uw_ptr, dt_ptr, keep_ptr, x0_ptr, wx_ptr, wfgh_ptr, bfgh_ptr, it_ptr, y_ptr, z_ptr, fgh_ptr, B, T,
               N: tl.constexpr, BB: tl.constexpr, BLOCK_B: tl.constexpr, PREC: tl.constexpr,
               SAVE: tl.constexpr):
    """States y (B, T, N) float32 of the rows ``[pid * BLOCK_B, ...)``, and with SAVE what the
    backward reads: z (B, T, BB) and [f|g|h] (B, T, 3N) in the weights' dtype. Contiguous tensors."""
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    live = rows < B
    rows64 = rows.to(tl.int64)
    cn = tl.arange(0, N)
    cb = tl.arange(0, BB)
    wd = wx_ptr.dtype.element_ty
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
        zc, f, g, h = _cell(x, u, wx_ptr, wfgh_ptr, bf, bg, bh, cn, cb, N, BB, PREC)
        s, tg, th = _gates(f, g, h, dtt, it)
        x = tl.where(k[:, None], th + s * (tg - th), x)
        tl.store(y_ptr + bt[:, None] * N + cn[None, :], x, mask=live[:, None])
        if SAVE:
            tl.store(z_ptr + bt[:, None] * BB + cb[None, :], zc, mask=live[:, None])
            b3 = bt[:, None] * (3 * N) + cn[None, :]
            tl.store(fgh_ptr + b3, f.to(wd), mask=live[:, None])
            tl.store(fgh_ptr + b3 + N, g.to(wd), mask=live[:, None])
            tl.store(fgh_ptr + b3 + 2 * N, h.to(wd), mask=live[:, None])


@triton.jit
def bwd_kernel(gy_ptr, z_ptr, fgh_ptr, dt_ptr, keep_ptr, wx_ptr, wfgh_ptr, it_ptr,
               da_ptr, dfgh_ptr, dx0_ptr, dtau_ptr, ddt_ptr, B, T,
               N: tl.constexpr, BB: tl.constexpr, BLOCK_B: tl.constexpr, PREC: tl.constexpr,
               NEED_DDT: tl.constexpr):
    """The chain of the scan's backward for the rows ``[pid * BLOCK_B, ...)``, t = T-1 .. 0,
    from the forward's z and [f|g|h] (no recomputation: two weight products per step).

    Writes da (B, T, BB) and d[f|g|h] (B, T, 3N) in the weights' dtype, dx0 (B, N) float32,
    this program's part of d(1/tau) (N,) at ``dtau_ptr[pid]``, and d dt (B, T) float32 when
    NEED_DDT."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    live = rows < B
    rows64 = rows.to(tl.int64)
    cn = tl.arange(0, N)
    cb = tl.arange(0, BB)
    wd = wx_ptr.dtype.element_ty
    it = tl.load(it_ptr + cn)
    dx = tl.zeros((BLOCK_B, N), dtype=tl.float32)  # d loss / d x_t from the positions after t
    dtau = tl.zeros((BLOCK_B, N), dtype=tl.float32)
    for i in range(T):
        bt = rows64 * T + (T - 1 - i)
        dx += tl.load(gy_ptr + bt[:, None] * N + cn[None, :], mask=live[:, None], other=0.0)
        b3 = bt[:, None] * (3 * N) + cn[None, :]
        f = tl.load(fgh_ptr + b3, mask=live[:, None], other=0.0).to(tl.float32)
        g = tl.load(fgh_ptr + b3 + N, mask=live[:, None], other=0.0).to(tl.float32)
        h = tl.load(fgh_ptr + b3 + 2 * N, mask=live[:, None], other=0.0).to(tl.float32)
        lt = tl.load(z_ptr + bt[:, None] * BB + cb[None, :], mask=live[:, None], other=0.0).to(tl.float32) / 1.7159
        dtt = tl.load(dt_ptr + bt, mask=live, other=0.0)
        k = tl.load(keep_ptr + bt, mask=live, other=0) != 0
        s, tg, th = _gates(f, g, h, dtt, it)
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
        da = dz * (1.7159 * 0.666) * tl.maximum(1.0 - lt * lt, 0.0)  # |lt| <= 1 (z rounded in bf16)
        dx = tl.dot(da.to(wd), _tile(wx_ptr, cb, cn, N, 1), input_precision=PREC) + tl.where(k[:, None], 0.0, dx)
        tl.store(da_ptr + bt[:, None] * BB + cb[None, :], da.to(wd), mask=live[:, None])
        tl.store(dfgh_ptr + b3, df.to(wd), mask=live[:, None])
        tl.store(dfgh_ptr + b3 + N, dg.to(wd), mask=live[:, None])
        tl.store(dfgh_ptr + b3 + 2 * N, dh.to(wd), mask=live[:, None])
    tl.store(dx0_ptr + rows64[:, None] * N + cn[None, :], dx, mask=live[:, None])
    tl.store(dtau_ptr + pid * N + cn, tl.sum(dtau, axis=0))


_INTERPRETED = not isinstance(fwd_kernel, triton.runtime.JITFunction)  # fixed at import


def interpreted() -> bool:
    """True when the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` at import).
    (A constant: torch.compile need not look at the kernel objects.)"""
    return _INTERPRETED


def check_device(t: torch.Tensor, option: str) -> None:
    """UsageError (naming ``option``) unless the kernels can run on ``t``'s device: CUDA, or the
    CPU in Triton's interpreter."""
    if t.device.type != "cuda" and not interpreted():
        raise UsageError(option, "'triton' runs on CUDA tensors (or on CPU with TRITON_INTERPRET=1 set before triton "
                         "is imported)", str(t.device))


def _programs(batch: int, block_b: int) -> int:
    return triton.cdiv(batch, block_b)


@torch.library.custom_op("alphamodel::cfc_scan", mutates_args=())
def cfc_scan(uw: torch.Tensor, dt: torch.Tensor, keep: torch.Tensor, x0: torch.Tensor, w_x: torch.Tensor,
             w_fgh: torch.Tensor, b_fgh: torch.Tensor, inv_tau: torch.Tensor, block_b: int, num_warps: int,
             num_stages: int, save: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, z, fgh)``: all states (B, T, n) float32 of the scan and, with ``save``, what its
    backward reads: z (B, T, bb) and the heads' pre-activations [f|g|h] (B, T, 3n) in uw's dtype
    (else two empty tensors). uw (B, T, bb); dt (B, T) float32 seconds; keep (B, T) bool;
    x0 (B, n) float32; w_x (bb, n); w_fgh (3n, bb); b_fgh (3n,); inv_tau (n,) float32."""
    b, t, bb = uw.shape
    n = x0.shape[1]
    y, z, fgh = _fwd_empty(uw, n, save)
    with on_device(uw):
        fwd_kernel[(_programs(b, block_b),)](
            uw.contiguous(), dt.contiguous(), keep.contiguous().view(torch.uint8), x0.contiguous(),
            w_x.contiguous(), w_fgh.contiguous(), b_fgh.contiguous(), inv_tau.contiguous(), y, z, fgh, b, t,
            N=n, BB=bb, BLOCK_B=block_b, PREC=dot_precision(w_x), SAVE=save, num_warps=num_warps,
            num_stages=num_stages)
    return y, z, fgh


def _fwd_empty(uw: torch.Tensor, n: int, save: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward's outputs, uninitialised (every element is written by the kernel)."""
    b, t, bb = uw.shape
    y = uw.new_empty(b, t, n, dtype=torch.float32)
    if not save:
        return y, uw.new_empty(0), uw.new_empty(0)
    return y, uw.new_empty(b, t, bb), uw.new_empty(b, t, 3 * n)


@cfc_scan.register_fake
def _(uw, dt, keep, x0, w_x, w_fgh, b_fgh, inv_tau, block_b, num_warps, num_stages, save):
    return _fwd_empty(uw, x0.shape[1], save)


@torch.library.custom_op("alphamodel::cfc_scan_bwd", mutates_args=())
def cfc_scan_bwd(gy: torch.Tensor, z: torch.Tensor, fgh: torch.Tensor, dt: torch.Tensor, keep: torch.Tensor,
                 w_x: torch.Tensor, w_fgh: torch.Tensor, inv_tau: torch.Tensor, block_b: int, num_warps: int,
                 num_stages: int, need_ddt: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward's sequential chain: ``(da, dfgh, dx0, dtau_parts, ddt)``.

    gy (B, T, n) the gradient of the states; z, fgh from :func:`cfc_scan` (``save``); the rest as
    there. da (B, T, bb) and dfgh (B, T, 3n) in z's dtype; dx0 (B, n) float32; dtau_parts
    (programs, n) float32 to sum over axis 0; ddt (B, T) float32 ((0,) without need_ddt)."""
    b, t, bb = z.shape
    n = w_x.shape[1]
    da, dfgh, dx0, parts, ddt = _bwd_empty(z, n, block_b, need_ddt)
    with on_device(z):
        bwd_kernel[(_programs(b, block_b),)](
            gy.contiguous(), z.contiguous(), fgh.contiguous(), dt.contiguous(), keep.contiguous().view(torch.uint8),
            w_x.contiguous(), w_fgh.contiguous(), inv_tau.contiguous(), da, dfgh, dx0, parts, ddt, b, t,
            N=n, BB=bb, BLOCK_B=block_b, PREC=dot_precision(w_x), NEED_DDT=need_ddt, num_warps=num_warps,
            num_stages=num_stages)
    return da, dfgh, dx0, parts, ddt


def _bwd_empty(z: torch.Tensor, n: int, block_b: int, need_ddt: bool) -> tuple[torch.Tensor, ...]:
    """The backward's outputs, uninitialised (every element is written by the kernel)."""
    b, t, bb = z.shape
    f32 = {"dtype": torch.float32, "device": z.device}
    return (z.new_empty(b, t, bb), z.new_empty(b, t, 3 * n), torch.empty(b, n, **f32),
            torch.empty(_programs(b, block_b), n, **f32), torch.empty((b, t) if need_ddt else (0,), **f32))


@cfc_scan_bwd.register_fake
def _(gy, z, fgh, dt, keep, w_x, w_fgh, inv_tau, block_b, num_warps, num_stages, need_ddt):
    return _bwd_empty(z, w_x.shape[1], block_b, need_ddt)


def _setup(ctx, inputs, output) -> None:
    uw, dt, keep, x0, w_x, w_fgh, b_fgh, inv_tau, block_b, num_warps, num_stages, save = inputs
    y, z, fgh = output
    ctx.save_for_backward(dt, keep, x0, w_x, w_fgh, inv_tau, y, z, fgh)
    ctx.launch = (block_b, num_warps, num_stages)
    ctx.b_fgh_dtype = b_fgh.dtype
    ctx.mark_non_differentiable(z, fgh)
    ctx.set_materialize_grads(False)


def _backward(ctx, gy: torch.Tensor | None, *_: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """Gradients of :func:`cfc_scan`'s tensor inputs: the chain in :func:`cfc_scan_bwd`, then
    dW_x = da^T x_prev, dW_fgh = dfgh^T z, db_fgh = sum dfgh, d(1/tau) = sum of the parts."""
    dt, keep, x0, w_x, w_fgh, inv_tau, y, z, fgh = ctx.saved_tensors
    if z.numel() == 0 and y.numel() > 0:
        raise RuntimeError("alphamodel::cfc_scan ran with save=False: no backward (call scan(), which sets it)")
    gy = torch.zeros_like(y) if gy is None else gy
    need_ddt = ctx.needs_input_grad[1]
    da, dfgh, dx0, parts, ddt = cfc_scan_bwd(gy, z, fgh, dt, keep, w_x, w_fgh, inv_tau, *ctx.launch, need_ddt)
    bb, n = w_x.shape
    x_prev = torch.cat([x0[:, None].to(w_x.dtype), y[:, :-1].to(w_x.dtype)], dim=1).reshape(-1, n)
    d_wx = da.reshape(-1, bb).t() @ x_prev
    d_wfgh = dfgh.reshape(-1, 3 * n).t() @ z.reshape(-1, bb)
    d_bfgh = dfgh.sum(dim=(0, 1), dtype=torch.float32).to(ctx.b_fgh_dtype)
    return (da, ddt if need_ddt else None, None, dx0, d_wx, d_wfgh, d_bfgh, parts.sum(0), None, None, None, None)


cfc_scan.register_autograd(_backward, setup_context=_setup)


def scan(uw: torch.Tensor, dt: torch.Tensor, keep: torch.Tensor, x0: torch.Tensor, w_x: torch.Tensor,
         w_fgh: torch.Tensor, b_fgh: torch.Tensor, inv_tau: torch.Tensor, block_b: int = 16,
         num_warps: int = 8, num_stages: int | None = None) -> torch.Tensor:
    """The CfC scan (states (B, T, n) float32), differentiable in uw, dt, x0, the weights and
    inv_tau; arguments as :func:`cfc_scan`. The forward keeps z and [f|g|h] for the backward
    (``bb + 3n`` values of uw's dtype per position) only when a gradient is wanted.

    Launch: ``block_b`` (a power of two >= 16) batch rows per program, ``num_warps`` warps,
    ``num_stages`` software-pipeline stages of the loop over positions (None: 2 for 16-bit
    weights, 1 for float32, whose weight tiles would not fit twice in shared memory). At n = bb
    = 128 for sm_90 (``python bench/cfc_triton_regs.py``, Triton 3.9 and its ptxas, no GPU):
    bf16 16 x 8 x 2 uses no spill forward or backward (x 1: 184 bytes backward; 4 warps or 32
    rows spill more); float32 needs 74 / 90 KB of shared memory at 1 stage, 270 / 328 KB at 2
    (more than the 228 KB of an H100/H200)."""
    tensors = (uw, dt, x0, w_x, w_fgh, b_fgh, inv_tau)
    save = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    stages = num_stages or (2 if w_x.element_size() == 2 else 1)
    return cfc_scan(uw, dt, keep, x0, w_x, w_fgh, b_fgh, inv_tau, block_b, num_warps, stages, save)[0]
