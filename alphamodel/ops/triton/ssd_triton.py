"""The chunked SSD scan (:func:`alphamodel.nn.mamba2.ssd_chunked`) of a Mamba2 block, with its step
``dt`` and skip ``D x``, as Triton kernels.

Per chunk of ``Q`` positions, head ``h`` (group ``g`` of its ``B``, ``C``), with ``u = x dt`` the
inputs times the step, ``acs`` the cumulative log decay ``A dt`` inside the chunk and ``S`` (P, N)
the state entering the chunk:

    y_l = sum_{s <= l} (C_l . B_s) exp(acs_l - acs_s) u_s  +  exp(acs_l) C_l S^T  +  D x_l

(Dao & Gu 2024, listing 1, steps 1 and 4; ``D`` as in their Mamba2 block). The forward is three
kernels: each chunk's own state ``sum_s exp(acs_end - acs_s) u_s B_s^T`` per (chunk, group)
(listing 1, step 2), its pass from chunk to chunk ``S_{z+1} = exp(acs_end_z) S_z + own_z`` per
(batch, head) (step 3), and the output per (chunk, group): ``C B^T`` once for the group's heads,
then per head the decay, the product with ``u``, the state's term and the skip. In torch
(``ssd_chunked``) the first term builds (Q, Q) decay and product tensors per head and position in
memory; that scan was over half of a training step (``bench/train.py``: docs/performance.md).
``u = x dt`` is formed in the kernels'
registers, not in memory.

The backward, with ``M = (C B^T) * decay``, ``e_l = exp(acs_l)``, ``w_s = exp(acs_end - acs_s)``,
``G`` the gradient of the state entering each chunk and ``R`` of each chunk's own state:

    G = (e dy)^T C                          (a kernel per (chunk, group))
    R_z = G_{z+1} ... passed back from chunk to chunk with d final; d initial  (per (batch, head))
    du = M^T dy + w (B R^T)        dx = du dt + D dy        d dt = sum_p du x        dD = sum dy x
    dM = dy u^T      d acs_l = sum_s (dM * M)_ls - sum_s (dM * M)_sl + sum_p (e dy)_lp (C S^T)_lp
                           - w_l sum_p (u B R^T)_lp  (+ their sum and d acs_end at the chunk's last)
    d(C B^T) = sum_heads dM * decay     dC = d(C B^T) B + sum_heads (e dy) S
                                        dB = d(C B^T)^T C + sum_heads (w u) R

``du``, ``d acs`` and ``dD`` in a kernel per (chunk, head); ``dC``, then ``dB`` (sums over the
group's heads) in a launch each per (chunk, group), each recomputing ``d(C B^T)``: so that none
holds the others' tiles (the two launches were faster than one for both in the step's profile:
docs/performance.md).

The forward and the backward are ``torch.library`` custom ops (``alphamodel::ssd_chunk_scan`` and
``_bwd``, fake tensors and autograd registered) as in :mod:`alphamodel.ops.triton.cfc_triton`, so
``torch.compile`` and CUDA graphs keep them. x, B, C, y and the gradients of x, B, C and y are
in the dtype of the convolution's output (bf16 under autocast: half the memory traffic of
float32; a faster step than with a float32 y: docs/performance.md), every other
tensor and all arithmetic in float32; on CUDA the products run in TF32
unless ``torch.get_float32_matmul_precision()`` is ``"highest"`` (then exact float32), as torch's
own matmuls; in the interpreter they are exact float32. ``Q``, ``P`` and ``N`` must be powers of
two >= 16 (``tl.dot`` tiles). Runs on CUDA, or on CPU tensors in Triton's interpreter
(``TRITON_INTERPRET=1`` set before triton is imported).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from alphamodel.errors import UsageError
from alphamodel.ops.triton.cfc_triton import check_device
from alphamodel.ops.triton.checks import check_groups, check_tiles, dot_precision, on_device

__all__ = ["ssd_chunk_scan", "ssd_chunk_scan_bwd", "ssd_scan"]


@triton.jit
def _rows(pid, L, Q: tl.constexpr):
    """Positions (Q,) int64 of chunk ``pid`` (= batch * chunks + chunk) in the (batch * L) rows."""
    nc = L // Q
    return ((pid // nc) * L + (pid % nc) * Q + tl.arange(0, Q)).to(tl.int64)


@triton.jit
def _state(pid, h, H: tl.constexpr, P: tl.constexpr, N: tl.constexpr):
    """Offsets (P, N) int64 of head ``h``'s state of chunk ``pid`` in a (batch, chunks, H, P, N) tensor."""
    base = (pid.to(tl.int64) * H + h) * P
    return (base + tl.arange(0, P)[:, None]) * N + tl.arange(0, N)[None, :]


@triton.jit
def _x_at(rows, h, H: tl.constexpr, P: tl.constexpr, G: tl.constexpr, N: tl.constexpr):
    """Offsets (Q, P) of head ``h``'s inputs x in the rows of ``xbc`` (batch * L, H P + 2 G N)."""
    return rows[:, None] * (H * P + 2 * G * N) + h * P + tl.arange(0, P)[None, :]


@triton.jit
def _b_at(rows, g, H: tl.constexpr, P: tl.constexpr, G: tl.constexpr, N: tl.constexpr):
    """Offsets (Q, N) of group ``g``'s B in the rows of ``xbc``; its C lies ``G N`` further."""
    return rows[:, None] * (H * P + 2 * G * N) + H * P + g * N + tl.arange(0, N)[None, :]


@triton.jit
def _y_at(rows, h, H: tl.constexpr, P: tl.constexpr):
    """Offsets (Q, P) of head ``h`` in a (batch * L, H, P) tensor (y, dy)."""
    return (rows[:, None] * H + h) * P + tl.arange(0, P)[None, :]


@triton.jit
def _load(ptr):
    """``tl.load(ptr)`` as float32 (xbc, and y's gradient, come in the convolution's dtype)."""
    return tl.load(ptr).to(tl.float32)


@triton.jit
def _decay(acs, Q: tl.constexpr):
    """exp(acs_l - acs_s) for s <= l, else 0: (Q, Q) float32."""
    cq = tl.arange(0, Q)
    diff = tl.where(cq[:, None] >= cq[None, :], acs[:, None] - acs[None, :], -float("inf"))
    return tl.exp(diff)


@triton.jit
def _to_end(acs, Q: tl.constexpr):
    """exp(acs_end - acs_s): (Q,) float32 decay from each position to its chunk's last."""
    cq = tl.arange(0, Q)
    return tl.exp(tl.sum(tl.where(cq == Q - 1, acs, 0.0)) - acs)


@triton.jit
def _states_kernel(xbc_ptr, dt_ptr, acs_ptr, st_ptr, L,
                   H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, Q: tl.constexpr,
                   PREC: tl.constexpr):
    """The chunk's own state ``sum_s exp(acs_end - acs_s) x_s dt_s B_s^T`` (P, N) for each head of
    group ``program_id(1)`` in chunk ``program_id(0)``."""
    pid, g = tl.program_id(0), tl.program_id(1)
    rows = _rows(pid, L, Q)
    bm = _load(xbc_ptr + _b_at(rows, g, H, P, G, N))
    for j in range(H // G):
        h = g * (H // G) + j
        at = rows * H + h
        w = _to_end(tl.load(acs_ptr + at), Q) * tl.load(dt_ptr + at)
        xw = _load(xbc_ptr + _x_at(rows, h, H, P, G, N)) * w[:, None]
        tl.store(st_ptr + _state(pid, h, H, P, N), tl.dot(tl.trans(xw), bm, input_precision=PREC))


@triton.jit
def _pass_kernel(st_ptr, acs_ptr, init_ptr, fin_ptr, L, H: tl.constexpr, PN: tl.constexpr, Q: tl.constexpr,
                 BLOCK: tl.constexpr, HAS_INIT: tl.constexpr):
    """``S_0`` = the initial state (or 0), ``S_{z+1} = exp(acs_end_z) S_z + own_z`` for batch
    ``program_id(0) // H``, head ``% H``, elements ``program_id(1)`` (a block of the P N): the
    chunks' own states in ``st_ptr`` are replaced by the states entering them (each read before it
    is written); the last ``S`` goes to ``fin_ptr``."""
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // H, bh % H
    e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    if HAS_INIT:
        s = tl.load(init_ptr + bh * PN + e)
    else:
        s = tl.zeros((BLOCK,), dtype=tl.float32)
    nc = L // Q
    for z in range(nc):
        at = ((b * nc + z) * H + h) * PN + e
        own = tl.load(st_ptr + at)
        tl.store(st_ptr + at, s)
        s = tl.exp(tl.load(acs_ptr + (b * L + z * Q + Q - 1) * H + h)) * s + own
    tl.store(fin_ptr + bh * PN + e, s)


@triton.jit
def _fwd_kernel(xbc_ptr, dt_ptr, acs_ptr, s_ptr, d_ptr, y_ptr, L,
                H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, Q: tl.constexpr,
                PREC: tl.constexpr):
    """y (batch, L, H, P) of the chunk ``program_id(0)``, heads of group ``program_id(1)``."""
    pid, g = tl.program_id(0), tl.program_id(1)
    rows = _rows(pid, L, Q)
    bc = _b_at(rows, g, H, P, G, N)
    cm = _load(xbc_ptr + bc + G * N)
    cb = tl.dot(cm, tl.trans(_load(xbc_ptr + bc)), input_precision=PREC)  # (Q, Q), once per group
    for j in range(H // G):
        h = g * (H // G) + j
        at = rows * H + h
        acs = tl.load(acs_ptr + at)
        x = _load(xbc_ptr + _x_at(rows, h, H, P, G, N))
        y = tl.dot(cb * _decay(acs, Q), x * tl.load(dt_ptr + at)[:, None], input_precision=PREC)
        s = tl.load(s_ptr + _state(pid, h, H, P, N))
        y += tl.exp(acs)[:, None] * tl.dot(cm, tl.trans(s), input_precision=PREC)
        tl.store(y_ptr + _y_at(rows, h, H, P), (y + tl.load(d_ptr + h) * x).to(y_ptr.dtype.element_ty))


@triton.jit
def _dstate_kernel(dy_ptr, xbc_ptr, acs_ptr, ds_ptr, L,
                   H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, Q: tl.constexpr,
                   PREC: tl.constexpr):
    """G = (e dy)^T C (P, N), the output's gradient of the state entering chunk ``program_id(0)``,
    for each head of group ``program_id(1)``."""
    pid, g = tl.program_id(0), tl.program_id(1)
    rows = _rows(pid, L, Q)
    cm = _load(xbc_ptr + _b_at(rows, g, H, P, G, N) + G * N)
    for j in range(H // G):
        h = g * (H // G) + j
        ed = _load(dy_ptr + _y_at(rows, h, H, P)) * tl.exp(tl.load(acs_ptr + rows * H + h))[:, None]
        tl.store(ds_ptr + _state(pid, h, H, P, N), tl.dot(tl.trans(ed), cm, input_precision=PREC))


@triton.jit
def _pass_bwd_kernel(ds_ptr, ent_ptr, acs_ptr, dfin_ptr, dlast_ptr, dinit_ptr, L, H: tl.constexpr,
                     PN: tl.constexpr, Q: tl.constexpr, BLOCK: tl.constexpr):
    """The backward of :func:`_pass_kernel` for batch ``program_id(0) // H``, head ``% H``,
    elements ``program_id(1)``: from the gradients ``G`` of the entering states (in ``ds_ptr``) and
    of the final one, the gradients of the chunks' own states (replacing ``G`` in ``ds_ptr``), of
    the initial state, and the block's part of each chunk's ``d acs_end`` (``dlast_ptr``, (batch,
    chunks, H, PN / BLOCK))."""
    bh = tl.program_id(0).to(tl.int64)
    b, h, k0 = bh // H, bh % H, tl.program_id(1)
    e = k0 * BLOCK + tl.arange(0, BLOCK)
    r = tl.load(dfin_ptr + bh * PN + e)  # the gradient of the state after chunk z
    nc = L // Q
    for k in range(nc):
        z = nc - 1 - k
        at = ((b * nc + z) * H + h) * PN + e
        entering = tl.load(ds_ptr + at)
        tl.store(ds_ptr + at, r)
        dec = tl.exp(tl.load(acs_ptr + (b * L + z * Q + Q - 1) * H + h))
        tl.store(dlast_ptr + ((b * nc + z) * H + h) * (PN // BLOCK) + k0, dec * tl.sum(r * tl.load(ent_ptr + at)))
        r = entering + dec * r
    tl.store(dinit_ptr + bh * PN + e, r)


@triton.jit
def _bwd_heads_kernel(dy_ptr, xbc_ptr, dt_ptr, acs_ptr, s_ptr, r_ptr, dlast_ptr, d_ptr,
                      dxbc_ptr, ddt_ptr, dacs_ptr, dd_ptr, L,
                      H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, Q: tl.constexpr,
                      PREC: tl.constexpr, PARTS: tl.constexpr):
    """dx (into ``dxbc``), d dt, d acs and the chunk's part of dD of one head in one chunk (module
    docstring). Programs run head-fastest (``program_id(0) = chunk * H + head``), so that the heads
    of a chunk, which read the same B and C, run side by side and share them through L2."""
    pid, h = tl.program_id(0) // H, tl.program_id(0) % H
    g = h // (H // G)
    rows = _rows(pid, L, Q)
    cq = tl.arange(0, Q)
    bc = _b_at(rows, g, H, P, G, N)
    bm, cm = _load(xbc_ptr + bc), _load(xbc_ptr + bc + G * N)
    at = rows * H + h
    acs, dt = tl.load(acs_ptr + at), tl.load(dt_ptr + at)
    m = tl.dot(cm, tl.trans(bm), input_precision=PREC) * _decay(acs, Q)
    sp = _state(pid, h, H, P, N)
    t = tl.dot(bm, tl.trans(tl.load(r_ptr + sp)), input_precision=PREC)  # (Q, P): B R^T
    w = _to_end(acs, Q)
    xy = _x_at(rows, h, H, P, G, N)
    dy, x = _load(dy_ptr + _y_at(rows, h, H, P)), _load(xbc_ptr + xy)
    u = x * dt[:, None]
    du = tl.dot(tl.trans(m), dy, input_precision=PREC) + w[:, None] * t
    tl.store(dxbc_ptr + xy, (du * dt[:, None] + tl.load(d_ptr + h) * dy).to(dxbc_ptr.dtype.element_ty))
    tl.store(ddt_ptr + at, tl.sum(du * x, axis=1))
    pm = tl.dot(dy, tl.trans(u), input_precision=PREC) * m  # dM * M
    ed = dy * tl.exp(acs)[:, None]
    off = tl.sum(ed * tl.dot(cm, tl.trans(tl.load(s_ptr + sp)), input_precision=PREC), axis=1)
    gw = tl.sum(u * t, axis=1) * w  # from w_s = exp(acs_end - acs_s) of the own state
    end = tl.sum(gw) + tl.sum(tl.load(dlast_ptr + (pid * H + h) * PARTS + tl.arange(0, PARTS)))
    tl.store(dacs_ptr + at, tl.sum(pm, axis=1) - tl.sum(pm, axis=0) + off - gw + tl.where(cq == Q - 1, end, 0.0))
    tl.store(dd_ptr + pid * H + h, tl.sum(dy * x))


@triton.jit
def _bwd_group_kernel(dy_ptr, xbc_ptr, dt_ptr, acs_ptr, s_ptr, r_ptr, dxbc_ptr, L,
                      H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, Q: tl.constexpr,
                      PREC: tl.constexpr, DC: tl.constexpr):
    """dC (``DC``) or dB (into ``dxbc``) of group ``program_id(1)`` in chunk ``program_id(0)``: the
    sums over the group's heads (module docstring). Both need ``d(C B^T)``; computing it in each of
    two launches keeps two (Q, N) accumulators and two products a head per program, not three."""
    pid, g = tl.program_id(0), tl.program_id(1)
    rows = _rows(pid, L, Q)
    dcb = tl.zeros((Q, Q), dtype=tl.float32)
    acc = tl.zeros((Q, N), dtype=tl.float32)
    for j in range(H // G):
        h = g * (H // G) + j
        at = rows * H + h
        acs = tl.load(acs_ptr + at)
        dy = _load(dy_ptr + _y_at(rows, h, H, P))
        u = _load(xbc_ptr + _x_at(rows, h, H, P, G, N)) * tl.load(dt_ptr + at)[:, None]
        dcb += tl.dot(dy, tl.trans(u), input_precision=PREC) * _decay(acs, Q)
        sp = _state(pid, h, H, P, N)
        if DC:
            acc += tl.dot(dy * tl.exp(acs)[:, None], tl.load(s_ptr + sp), input_precision=PREC)
        else:
            acc += tl.dot(u * _to_end(acs, Q)[:, None], tl.load(r_ptr + sp), input_precision=PREC)
    bc = _b_at(rows, g, H, P, G, N)
    out = dxbc_ptr.dtype.element_ty
    if DC:
        tl.store(dxbc_ptr + bc + G * N, (acc + tl.dot(dcb, _load(xbc_ptr + bc), input_precision=PREC)).to(out))
    else:
        tl.store(dxbc_ptr + bc, (acc + tl.dot(tl.trans(dcb), _load(xbc_ptr + bc + G * N),
                                              input_precision=PREC)).to(out))


#: Elements of a (P, N) state per program of the pass from chunk to chunk and its backward, at
#: most (a larger state runs in blocks of this size): a whole state of bench/train.py's size
#: (32 x 64) per program; blocks of 512 or 1024 ran slower, in a microbenchmark of the pass and
#: in the step (bench/train.py: docs/performance.md).
_BLOCK = 2048


def _sizes(xbc: torch.Tensor, dt: torch.Tensor, d_state: int, ngroups: int, chunk_size: int, num_warps: int
           ) -> tuple[tuple[int, ...], dict]:
    """``(b, L, h, p, n, chunks)`` and the kernels' size and launch arguments."""
    b, L, w = xbc.shape
    h = dt.shape[-1]
    p = (w - 2 * ngroups * d_state) // h
    kw = {"H": h, "G": ngroups, "P": p, "N": d_state, "Q": chunk_size, "PREC": dot_precision(dt),
          "num_warps": num_warps}
    return (b, L, h, p, d_state, L // chunk_size), kw


@torch.library.custom_op("alphamodel::ssd_chunk_scan", mutates_args=())
def ssd_chunk_scan(xbc: torch.Tensor, dt: torch.Tensor, acs: torch.Tensor, D: torch.Tensor,
                   initial_state: torch.Tensor | None, d_state: int, ngroups: int, chunk_size: int, num_warps: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, final, entering)`` (module docstring): y (batch, L, H, P) in xbc's dtype; the state after the
    last position (batch, H, P, N); the state entering each chunk (batch, L / chunk_size, H, P, N),
    which the backward reads. xbc (batch, L, H P + 2 G N) the inputs x (H, P), then B (G, N), then C
    (G, N) of each position, any float dtype (read as float32); dt (batch, L, H) steps; acs (batch,
    L, H) the cumulative ``A dt`` inside each chunk; D (H,); ``initial_state`` (batch, H, P, N) or
    None (zeros); N = ``d_state``, G = ``ngroups``. All contiguous, all but xbc float32; L a
    multiple of ``chunk_size``; H a multiple of G; ``num_warps`` per program. The op itself checks
    none of this: :func:`ssd_scan` prepares its inputs and checks sizes and device."""
    (b, L, h, p, n, nc), kw = _sizes(xbc, dt, d_state, ngroups, chunk_size, num_warps)
    entering, final, y = dt.new_empty(b, nc, h, p, n), dt.new_empty(b, h, p, n), xbc.new_empty(b, L, h, p)
    grid, block = (b * nc, ngroups), min(_BLOCK, p * n)
    init = initial_state is not None
    with on_device(xbc):
        _states_kernel[grid](xbc, dt, acs, entering, L, **kw)
        _pass_kernel[(b * h, p * n // block)](entering, acs, initial_state if init else final, final, L, H=h,
                                              PN=p * n, Q=chunk_size, BLOCK=block, HAS_INIT=init, num_warps=4)
        _fwd_kernel[grid](xbc, dt, acs, entering, D, y, L, **kw)
    return y, final, entering


@ssd_chunk_scan.register_fake
def _(xbc, dt, acs, D, initial_state, d_state, ngroups, chunk_size, num_warps):
    (b, L, h, p, n, nc), _ = _sizes(xbc, dt, d_state, ngroups, chunk_size, num_warps)
    return xbc.new_empty(b, L, h, p), dt.new_empty(b, h, p, n), dt.new_empty(b, nc, h, p, n)


@torch.library.custom_op("alphamodel::ssd_chunk_scan_bwd", mutates_args=())
def ssd_chunk_scan_bwd(dy: torch.Tensor, dfinal: torch.Tensor, xbc: torch.Tensor, dt: torch.Tensor,
                       acs: torch.Tensor, D: torch.Tensor, entering: torch.Tensor, d_state: int, ngroups: int,
                       chunk_size: int, num_warps: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(d xbc, ddt, dacs, dD, d initial_state)`` of :func:`ssd_chunk_scan`, shaped as its
    inputs, from dy (batch, L, H, P) and d final (batch, H, P, N); ``entering`` its third output."""
    (b, L, h, p, n, nc), kw = _sizes(xbc, dt, d_state, ngroups, chunk_size, num_warps)
    dxbc, ddt, dacs, _, dinit = _bwd_empty(xbc, dt, acs, D, dfinal)
    block = min(_BLOCK, p * n)
    parts = p * n // block
    ds, dlast, dd = torch.empty_like(entering), dt.new_empty(b, nc, h, parts), dt.new_empty(b * nc, h)
    dy, grid = dy.contiguous(), (b * nc, ngroups)
    with on_device(xbc):
        _dstate_kernel[grid](dy, xbc, acs, ds, L, **kw)
        _pass_bwd_kernel[(b * h, parts)](ds, entering, acs, dfinal.contiguous(), dlast, dinit, L, H=h, PN=p * n,
                                         Q=chunk_size, BLOCK=block, num_warps=4)
        _bwd_heads_kernel[(b * nc * h,)](dy, xbc, dt, acs, entering, ds, dlast, D, dxbc, ddt, dacs, dd, L,
                                         PARTS=parts, **kw)
        for dc in (True, False):
            _bwd_group_kernel[grid](dy, xbc, dt, acs, entering, ds, dxbc, L, DC=dc, **kw)
    return dxbc, ddt, dacs, dd.sum(0), dinit


def _bwd_empty(*like: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The backward's outputs, uninitialised (the kernels write every element; dD is summed)."""
    return tuple(torch.empty_like(t) for t in like)


@ssd_chunk_scan_bwd.register_fake
def _(dy, dfinal, xbc, dt, acs, D, entering, d_state, ngroups, chunk_size, num_warps):
    return _bwd_empty(xbc, dt, acs, D, dfinal)


def _setup(ctx, inputs, output) -> None:
    xbc, dt, acs, D, initial_state, *sizes = inputs
    ctx.save_for_backward(xbc, dt, acs, D, output[2])
    ctx.mark_non_differentiable(output[2])
    ctx.sizes, ctx.init = sizes, initial_state is not None


def _backward(ctx, dy: torch.Tensor, dfinal: torch.Tensor | None, _) -> tuple[torch.Tensor | None, ...]:
    xbc, dt, acs, D, entering = ctx.saved_tensors
    if dfinal is None:
        dfinal = entering.new_zeros(entering[:, 0].shape)
    *grads, dinit = ssd_chunk_scan_bwd(dy, dfinal, xbc, dt, acs, D, entering, *ctx.sizes)
    return (*grads, dinit if ctx.init else None, None, None, None, None)


ssd_chunk_scan.register_autograd(_backward, setup_context=_setup)


def ssd_scan(xbc: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, D: torch.Tensor, d_state: int, ngroups: int = 1,
             chunk_size: int = 64, initial_state: torch.Tensor | None = None, num_warps: int = 4
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD scan of a Mamba2 block with its skip: ``ssd_chunked(x dt, A dt, B, C) + D x``
    (:func:`alphamodel.nn.mamba2.ssd_chunked`, same results in float32; tests/test_ssd_triton.py),
    reading x, B and C where the block's convolution wrote them.

    xbc (batch, L, H P + 2 G N): per position x (H heads of P), then B, then C (G groups of N =
    ``d_state``, G = ``ngroups``), in any float dtype (bf16 under autocast; read as float32, its
    gradient in its dtype); dt (batch, L, H) steps >= 0; A (H,) log decay rates <= 0 (``A dt`` the
    log decay of a step); D (H,) skip weights; ``initial_state`` (batch, H, P, N) or None;
    ``num_warps`` per program of the kernels. Returns ``(y (batch, L, H, P) in xbc's dtype, final
    state (batch, H, P, N) float32)``, with gradients for every tensor argument (y's may come in
    any float dtype). Raises UsageError for tensors off
    CUDA (unless Triton's interpreter runs, option ``ssd_impl``), for G (``ngroups``) not a divisor
    of H, for a width of xbc that is not H P + 2 G N, and for ``chunk_size``, P (``headdim``) or N
    (``d_state``) not a power of two >= 16.
    """
    check_device(xbc, "ssd_impl")
    b, L, w = xbc.shape
    h = dt.shape[-1]
    check_groups(h, ngroups)
    p, rest = divmod(w - 2 * ngroups * d_state, h)
    if rest or p <= 0:
        raise UsageError("headdim", f"expected xbc's width {w} to be {h} heads x headdim + 2 x {ngroups} groups "
                         f"x {d_state} (d_state)", w)
    check_tiles({"chunk_size": chunk_size, "headdim": p, "d_state": d_state}, "ssd_impl 'triton'")
    pad = (-L) % chunk_size  # at the end, dt 0: no step, no input
    xbc, dt = F.pad(xbc, (0, 0, 0, pad)).contiguous(), F.pad(dt.float(), (0, 0, 0, pad)).contiguous()
    c, q = xbc.shape[1] // chunk_size, chunk_size
    acs = torch.cumsum((dt * A.float()).reshape(b, c, q, h), dim=2).reshape(b, c * q, h)
    init = None if initial_state is None else initial_state.float().contiguous()
    y, final, _ = ssd_chunk_scan(xbc, dt, acs, D.float().contiguous(), init, d_state, ngroups, q, num_warps)
    return y[:, :L], final
