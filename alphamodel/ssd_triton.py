"""The chunked SSD scan (:func:`alphamodel.mamba2.ssd_chunked`) with its per-position work as Triton kernels.

Per chunk of ``Q`` positions, head ``h`` (group ``g`` of its ``B``, ``C``), with ``acs`` the
cumulative log decay inside the chunk and ``S`` (P, N) the state entering the chunk:

    y_l = sum_{s <= l} (C_l . B_s) exp(acs_l - acs_s) x_s  +  exp(acs_l) C_l S^T

(Dao & Gu 2024, listing 1, steps 1 and 4). In torch (``ssd_chunked``) the first term builds
(Q, Q) decay and product tensors per head and position in memory, forward and backward; on
the H200 that scan was 102 ms of a 187 ms training step (batch 2048 x 512, d_model 128, 4
layers: the step without it 85 ms, ``bench/train.py``). Here one program per (batch, chunk,
group) keeps them in registers: ``C B^T`` once for the group's heads, then per head the decay,
the product with ``x`` and the state's term. The backward recomputes the same tiles in two
kernels, one per (chunk, head) for ``dx``, ``d acs`` and ``dS`` (the gradient of the state
entering each chunk), one per (chunk, group) for ``dB`` and ``dC``, the sums over the group's heads:

    M = (C B^T) * decay            dx = M^T dy          dM = dy x^T
    d(C B^T) = sum_heads dM * decay     dC = d(C B^T) B + sum_heads (e dy) S     dB = d(C B^T)^T C
    d acs_l = sum_s (dM * M)_ls - sum_s (dM * M)_sl + sum_p (e dy)_lp (C S^T)_lp     dS = (e dy)^T C

with ``e_l = exp(acs_l)`` and ``*`` elementwise. Each chunk's own state (listing 1, step 2) is a
kernel per (chunk, group) too (:func:`ssd_chunk_states`; in torch it wrote ``x`` times its decay
and a permuted copy to memory, forward and backward); the pass of the states from chunk to chunk
(:func:`alphamodel.mamba2.pass_states`) stays in torch: its tensors are (P, N) per chunk and head,
not per position.

The forward and the backward are ``torch.library`` custom ops (``alphamodel::ssd_chunk_scan``,
``alphamodel::ssd_chunk_states`` and their ``_bwd``, fake tensors and autograd registered) as in
:mod:`alphamodel.cfc_triton`, so ``torch.compile`` and CUDA graphs keep them. float32 throughout;
on CUDA the products run in TF32 unless ``torch.get_float32_matmul_precision()`` is ``"highest"``
(then exact float32), as torch's own matmuls; in the interpreter they are exact float32.
``Q``, ``P`` and ``N`` must be powers of two >= 16 (``tl.dot`` tiles). Runs on CUDA, or on CPU
tensors in Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is imported).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from alphamodel.cfc_triton import _on, _precision, check_device

__all__ = ["ssd_chunk_scan", "ssd_chunk_scan_bwd", "ssd_chunk_states", "ssd_chunk_states_bwd", "ssd_scan"]


@triton.jit
def _rows(pid, L, Q: tl.constexpr):
    """Positions (Q,) int64 of chunk ``pid`` (= batch * chunks + chunk) in the (batch * L) rows."""
    nc = L // Q
    return ((pid // nc) * L + (pid % nc) * Q + tl.arange(0, Q)).to(tl.int64)


@triton.jit
def _decay(acs, Q: tl.constexpr):
    """exp(acs_l - acs_s) for s <= l, else 0: (Q, Q) float32."""
    cq = tl.arange(0, Q)
    diff = tl.where(cq[:, None] >= cq[None, :], acs[:, None] - acs[None, :], -float("inf"))
    return tl.exp(diff)


@triton.jit
def _fwd_kernel(x_ptr, acs_ptr, b_ptr, c_ptr, s_ptr, y_ptr, L,
                H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, Q: tl.constexpr,
                PREC: tl.constexpr):
    """y (batch, L, H, P) of the chunk ``program_id(0)``, heads of group ``program_id(1)``."""
    pid, g = tl.program_id(0), tl.program_id(1)
    rows = _rows(pid, L, Q)
    cn, cp = tl.arange(0, N), tl.arange(0, P)
    bc = (rows[:, None] * G + g) * N + cn[None, :]
    cm = tl.load(c_ptr + bc)
    cb = tl.dot(cm, tl.trans(tl.load(b_ptr + bc)), input_precision=PREC)  # (Q, Q), once per group
    for j in range(H // G):
        h = g * (H // G) + j
        acs = tl.load(acs_ptr + rows * H + h)
        xy = (rows[:, None] * H + h) * P + cp[None, :]
        y = tl.dot(cb * _decay(acs, Q), tl.load(x_ptr + xy), input_precision=PREC)
        s = tl.load(s_ptr + ((pid * H + h) * P + cp[:, None]) * N + cn[None, :])  # (P, N)
        y += tl.exp(acs)[:, None] * tl.dot(cm, tl.trans(s), input_precision=PREC)
        tl.store(y_ptr + xy, y)


@triton.jit
def _bwd_heads_kernel(dy_ptr, x_ptr, acs_ptr, b_ptr, c_ptr, s_ptr, dx_ptr, dacs_ptr, ds_ptr, L,
                      H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, Q: tl.constexpr,
                      PREC: tl.constexpr):
    """dx, d acs and dS of one head in one chunk (module docstring). Programs run head-fastest
    (``program_id(0) = chunk * H + head``), so that the heads of a chunk, which read the same B and
    C, run side by side and share them through L2."""
    pid, h = tl.program_id(0) // H, tl.program_id(0) % H
    g = h // (H // G)
    rows = _rows(pid, L, Q)
    cn, cp = tl.arange(0, N), tl.arange(0, P)
    bc = (rows[:, None] * G + g) * N + cn[None, :]
    cm = tl.load(c_ptr + bc)
    acs = tl.load(acs_ptr + rows * H + h)
    m = tl.dot(cm, tl.trans(tl.load(b_ptr + bc)), input_precision=PREC) * _decay(acs, Q)
    xy = (rows[:, None] * H + h) * P + cp[None, :]
    dy = tl.load(dy_ptr + xy)
    tl.store(dx_ptr + xy, tl.dot(tl.trans(m), dy, input_precision=PREC))
    pm = tl.dot(dy, tl.trans(tl.load(x_ptr + xy)), input_precision=PREC) * m  # dM * M
    sp = ((pid * H + h) * P + cp[:, None]) * N + cn[None, :]
    ed = dy * tl.exp(acs)[:, None]
    off = tl.sum(ed * tl.dot(cm, tl.trans(tl.load(s_ptr + sp)), input_precision=PREC), axis=1)
    tl.store(dacs_ptr + rows * H + h, tl.sum(pm, axis=1) - tl.sum(pm, axis=0) + off)
    tl.store(ds_ptr + sp, tl.dot(tl.trans(ed), cm, input_precision=PREC))


@triton.jit
def _bwd_group_kernel(dy_ptr, x_ptr, acs_ptr, b_ptr, c_ptr, s_ptr, db_ptr, dc_ptr, L,
                      H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, Q: tl.constexpr,
                      PREC: tl.constexpr):
    """dB and dC of group ``program_id(1)`` in chunk ``program_id(0)``: the sums over the group's
    heads (module docstring); apart from the per-head kernel, so that neither holds the other's tiles."""
    pid, g = tl.program_id(0), tl.program_id(1)
    rows = _rows(pid, L, Q)
    cn, cp = tl.arange(0, N), tl.arange(0, P)
    dcb = tl.zeros((Q, Q), dtype=tl.float32)
    dc = tl.zeros((Q, N), dtype=tl.float32)
    for j in range(H // G):
        h = g * (H // G) + j
        acs = tl.load(acs_ptr + rows * H + h)
        xy = (rows[:, None] * H + h) * P + cp[None, :]
        dy = tl.load(dy_ptr + xy)
        dcb += tl.dot(dy, tl.trans(tl.load(x_ptr + xy)), input_precision=PREC) * _decay(acs, Q)
        s = tl.load(s_ptr + ((pid * H + h) * P + cp[:, None]) * N + cn[None, :])
        dc += tl.dot(dy * tl.exp(acs)[:, None], s, input_precision=PREC)
    bc = (rows[:, None] * G + g) * N + cn[None, :]
    tl.store(dc_ptr + bc, dc + tl.dot(dcb, tl.load(b_ptr + bc), input_precision=PREC))
    tl.store(db_ptr + bc, tl.dot(tl.trans(dcb), tl.load(c_ptr + bc), input_precision=PREC))


@triton.jit
def _to_end(acs, Q: tl.constexpr):
    """exp(acs_end - acs_s): (Q,) float32 decay from each position to its chunk's last."""
    cq = tl.arange(0, Q)
    return tl.exp(tl.sum(tl.where(cq == Q - 1, acs, 0.0)) - acs)


@triton.jit
def _states_kernel(x_ptr, acs_ptr, b_ptr, st_ptr, L,
                   H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, Q: tl.constexpr,
                   PREC: tl.constexpr):
    """The chunk's own state ``sum_s exp(acs_end - acs_s) x_s B_s^T`` (P, N) for each head of group
    ``program_id(1)`` in chunk ``program_id(0)``."""
    pid, g = tl.program_id(0), tl.program_id(1)
    rows = _rows(pid, L, Q)
    cn, cp = tl.arange(0, N), tl.arange(0, P)
    bm = tl.load(b_ptr + (rows[:, None] * G + g) * N + cn[None, :])
    for j in range(H // G):
        h = g * (H // G) + j
        acs = tl.load(acs_ptr + rows * H + h)
        w = _to_end(acs, Q)
        xw = tl.load(x_ptr + (rows[:, None] * H + h) * P + cp[None, :]) * w[:, None]
        tl.store(st_ptr + ((pid * H + h) * P + cp[:, None]) * N + cn[None, :],
                 tl.dot(tl.trans(xw), bm, input_precision=PREC))


@triton.jit
def _states_bwd_kernel(ds_ptr, x_ptr, acs_ptr, b_ptr, dx_ptr, dacs_ptr, db_ptr, L,
                       H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, Q: tl.constexpr,
                       PREC: tl.constexpr):
    """dx, d acs and dB of :func:`_states_kernel` from d states (the docstring of
    :func:`ssd_chunk_states`), per (chunk, group)."""
    pid, g = tl.program_id(0), tl.program_id(1)
    rows = _rows(pid, L, Q)
    cn, cp, cq = tl.arange(0, N), tl.arange(0, P), tl.arange(0, Q)
    bc = (rows[:, None] * G + g) * N + cn[None, :]
    bm = tl.load(b_ptr + bc)
    db = tl.zeros((Q, N), dtype=tl.float32)
    for j in range(H // G):
        h = g * (H // G) + j
        acs = tl.load(acs_ptr + rows * H + h)
        w = _to_end(acs, Q)
        xy = (rows[:, None] * H + h) * P + cp[None, :]
        x = tl.load(x_ptr + xy)
        ds = tl.load(ds_ptr + ((pid * H + h) * P + cp[:, None]) * N + cn[None, :])  # (P, N)
        t = tl.dot(bm, tl.trans(ds), input_precision=PREC)  # (Q, P): B_s dS^T
        tl.store(dx_ptr + xy, w[:, None] * t)
        gw = tl.sum(x * t, axis=1) * w  # d acs from w_s = exp(acs_end - acs_s)
        tl.store(dacs_ptr + rows * H + h, tl.where(cq == Q - 1, tl.sum(gw), 0.0) - gw)
        db += tl.dot(x * w[:, None], ds, input_precision=PREC)
    tl.store(db_ptr + bc, db)


def _grid(x: torch.Tensor, g: int, q: int) -> tuple[int, int]:
    return x.shape[0] * (x.shape[1] // q), g


@torch.library.custom_op("alphamodel::ssd_chunk_scan", mutates_args=())
def ssd_chunk_scan(x: torch.Tensor, acs: torch.Tensor, B: torch.Tensor, C: torch.Tensor, states: torch.Tensor,
                   chunk_size: int, num_warps: int) -> torch.Tensor:
    """y (batch, L, H, P) float32 (module docstring). x (batch, L, H, P) (inputs times the step);
    acs (batch, L, H) cumulative log decays inside each chunk; B, C (batch, L, G, N); states
    (batch, L / chunk_size, H, P, N) the state entering each chunk. All float32 and contiguous;
    L a multiple of ``chunk_size``; H a multiple of G; ``num_warps`` per program. The op itself
    checks none of this: :func:`ssd_scan` prepares its inputs and checks sizes and device."""
    b, L, h, p = x.shape
    g, n = B.shape[-2:]
    y = torch.empty_like(x)
    with _on(x):
        _fwd_kernel[_grid(x, g, chunk_size)](x, acs, B, C, states, y, L, H=h, G=g, P=p, N=n, Q=chunk_size,
                                             PREC=_precision(x), num_warps=num_warps)
    return y


@ssd_chunk_scan.register_fake
def _(x, acs, B, C, states, chunk_size, num_warps):
    return torch.empty_like(x)


@torch.library.custom_op("alphamodel::ssd_chunk_scan_bwd", mutates_args=())
def ssd_chunk_scan_bwd(dy: torch.Tensor, x: torch.Tensor, acs: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                       states: torch.Tensor, chunk_size: int, num_warps: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dacs, dB, dC, dstates)``, shaped as :func:`ssd_chunk_scan`'s inputs, from dy (batch, L, H, P)."""
    b, L, h, p = x.shape
    g, n = B.shape[-2:]
    dx, dacs, dB, dC, ds = _bwd_empty(x, acs, B, C, states)
    dy = dy.contiguous()
    kw = {"H": h, "G": g, "P": p, "N": n, "Q": chunk_size, "PREC": _precision(x), "num_warps": num_warps}
    with _on(x):
        _bwd_heads_kernel[(_grid(x, 1, chunk_size)[0] * h,)](dy, x, acs, B, C, states, dx, dacs, ds, L, **kw)
        _bwd_group_kernel[_grid(x, g, chunk_size)](dy, x, acs, B, C, states, dB, dC, L, **kw)
    return dx, dacs, dB, dC, ds


def _bwd_empty(x, acs, B, C, states) -> tuple[torch.Tensor, ...]:
    """The backward's outputs, uninitialised (every element is written by the kernel)."""
    return tuple(torch.empty_like(t) for t in (x, acs, B, C, states))


@ssd_chunk_scan_bwd.register_fake
def _(dy, x, acs, B, C, states, chunk_size, num_warps):
    return _bwd_empty(x, acs, B, C, states)


def _setup(ctx, inputs, output) -> None:
    x, acs, B, C, states, chunk_size, num_warps = inputs
    ctx.save_for_backward(x, acs, B, C, states)
    ctx.launch = (chunk_size, num_warps)


def _backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    return (*ssd_chunk_scan_bwd(dy, *ctx.saved_tensors, *ctx.launch), None, None)


ssd_chunk_scan.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("alphamodel::ssd_chunk_states", mutates_args=())
def ssd_chunk_states(x: torch.Tensor, acs: torch.Tensor, B: torch.Tensor, chunk_size: int, num_warps: int
                     ) -> torch.Tensor:
    """Each chunk's own final state (batch, L / chunk_size, H, P, N) float32: ``sum_s exp(acs_end -
    acs_s) x_s B_s^T`` over its positions (Dao & Gu 2024, listing 1, step 2). x (batch, L, H, P),
    acs (batch, L, H), B (batch, L, G, N) as :func:`ssd_chunk_scan`'s. Backward, with ``w_s =
    exp(acs_end - acs_s)`` and ``T = B dS^T``: ``dx = w T``, ``dB = sum_heads (w x) dS``,
    ``d acs_s = -w_s sum_p (x T)_sp`` plus their sum at the chunk's last position. Unchecked, as
    :func:`ssd_chunk_scan`."""
    b, L, h, p = x.shape
    g, n = B.shape[-2:]
    out = x.new_empty(b, L // chunk_size, h, p, n)
    with _on(x):
        _states_kernel[_grid(x, g, chunk_size)](x, acs, B, out, L, H=h, G=g, P=p, N=n, Q=chunk_size,
                                                PREC=_precision(x), num_warps=num_warps)
    return out


@ssd_chunk_states.register_fake
def _(x, acs, B, chunk_size, num_warps):
    b, L, h, p = x.shape
    return x.new_empty(b, L // chunk_size, h, p, B.shape[-1])


@torch.library.custom_op("alphamodel::ssd_chunk_states_bwd", mutates_args=())
def ssd_chunk_states_bwd(ds: torch.Tensor, x: torch.Tensor, acs: torch.Tensor, B: torch.Tensor, chunk_size: int,
                         num_warps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dacs, dB)`` of :func:`ssd_chunk_states` from d states (batch, L / chunk_size, H, P, N)."""
    b, L, h, p = x.shape
    g, n = B.shape[-2:]
    dx, dacs, dB = (torch.empty_like(t) for t in (x, acs, B))
    with _on(x):
        _states_bwd_kernel[_grid(x, g, chunk_size)](ds.contiguous(), x, acs, B, dx, dacs, dB, L, H=h, G=g, P=p, N=n,
                                                    Q=chunk_size, PREC=_precision(x), num_warps=num_warps)
    return dx, dacs, dB


@ssd_chunk_states_bwd.register_fake
def _(ds, x, acs, B, chunk_size, num_warps):
    return tuple(torch.empty_like(t) for t in (x, acs, B))


def _states_setup(ctx, inputs, output) -> None:
    x, acs, B, chunk_size, num_warps = inputs
    ctx.save_for_backward(x, acs, B)
    ctx.launch = (chunk_size, num_warps)


def _states_backward(ctx, ds: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    return (*ssd_chunk_states_bwd(ds, *ctx.saved_tensors, *ctx.launch), None, None)


ssd_chunk_states.register_autograd(_states_backward, setup_context=_states_setup)


def ssd_scan(x: torch.Tensor, a: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int = 64,
             initial_state: torch.Tensor | None = None, num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`alphamodel.mamba2.ssd_chunked` (same arguments, shapes and results, float32) with
    the chunk states, the within-chunk and the state-output terms as Triton kernels.

    x (batch, L, H, P) inputs times the step ``dt``; a (batch, L, H) log decays ``A dt <= 0``; B, C
    (batch, L, G, N); ``initial_state`` (batch, H, P, N) or None; ``num_warps`` per program of the
    kernels. Each chunk's own state by :func:`ssd_chunk_states` (Triton), its pass from chunk to
    chunk by :func:`alphamodel.mamba2.pass_states` (torch: tensors per chunk, not per position).
    Raises UsageError for tensors off CUDA (unless Triton's interpreter runs, option
    ``ssd_impl``), for ``chunk_size``, P (``headdim``) or N (``d_state``) not a power of two >= 16,
    and for G (``ngroups``) not a divisor of H.
    """
    from alphamodel.config import check_tiles
    from alphamodel.mamba2 import pad_chunks, pass_states

    check_device(x, "ssd_impl")
    b, L, h, p = x.shape
    g, n = B.shape[-2:]
    check_tiles({"chunk_size": chunk_size, "headdim": p, "d_state": n}, "ssd_impl 'triton'")
    x, a, B, C = pad_chunks(x.float(), a.float(), B.float(), C.float(), chunk_size)
    c, q = x.shape[1] // chunk_size, chunk_size
    acs = torch.cumsum(a.reshape(b, c, q, h), dim=2)  # (b, c, q, h)
    x, B, C, flat = x.contiguous(), B.contiguous(), C.contiguous(), acs.reshape(b, c * q, h)
    states = ssd_chunk_states(x, flat, B, q, num_warps)
    entering, final = pass_states(states, acs[:, :, -1], initial_state)
    y = ssd_chunk_scan(x, flat, B, C, entering.contiguous(), q, num_warps)
    return y[:, :L], final
