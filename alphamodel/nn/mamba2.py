"""Mamba2 block in pure PyTorch: chunked SSD (state-space duality), Dao & Gu (2024).

Reference: T. Dao and A. Gu, "Transformers are SSMs: Generalized Models and Efficient
Algorithms Through Structured State Space Duality", ICML 2024 (arXiv 2405.21060), listing 1
("SSD minimal") and the ``Mamba2Simple`` module of ``mamba_ssm``.

The selective state-space recurrence, per head (state ``h_t`` of shape (P, N)):

    h_t = exp(a_t) * h_{t-1} + x_t B_t^T          a_t = A * dt_t <= 0 (log decay)
    y_t = h_t C_t                                 (x_t already multiplied by dt_t)

:func:`ssd_chunked` evaluates it in chunks of ``Q`` positions: a quadratic (attention-like)
form inside each chunk, a linear recurrence over chunk states between chunks. It is exact
(no approximation) and equals the sequential loop to rounding. The decay ``A``, the step
``dt`` and the scan itself are computed in float32 (or float64 when given float64) even
under bf16 autocast.

An optional fast path (``mamba_ssm``'s Triton kernel) is used by :class:`Mamba2` when that
package imports and the input is on CUDA; this pure version is what CPU users and CI run.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from alphafeat.validation import validate_enum
from alphamodel.enums import SsdImpl
from alphamodel.errors import UsageError
from alphamodel.ops.triton.checks import check_groups

try:  # optional fast path; not a dependency
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as _triton_ssd  # type: ignore
except Exception:  # noqa: BLE001 - any import problem means "no fast path"
    _triton_ssd = None

__all__ = ["segsum", "ssd_chunked", "pad_chunks", "pass_states", "causal_conv", "RMSNormGated", "Mamba2"]


def segsum(a: torch.Tensor) -> torch.Tensor:
    """Stable segment sums: ``out[..., i, j] = sum_{k=j+1..i} a[..., k]`` for ``j <= i``, else ``-inf``.

    Parameters
    ----------
    a : torch.Tensor, shape (..., T)

    Returns
    -------
    torch.Tensor, shape (..., T, T); ``exp(out)`` is the lower-triangular decay matrix.
    """
    T = a.size(-1)
    x = a.unsqueeze(-1).expand(*a.shape, T)  # x[..., i, j] = a[..., i]
    strict = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), diagonal=-1)
    x = x.masked_fill(~strict, 0.0)
    out = torch.cumsum(x, dim=-2)
    lower = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), diagonal=0)
    return out.masked_fill(~lower, -math.inf)


def ssd_chunked(
    x: torch.Tensor,
    a: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD scan (Dao & Gu 2024, listing 1), exact, with padding, groups and a carried state.

    Parameters
    ----------
    x : torch.Tensor, shape (batch, L, H, P)
        Inputs already multiplied by the step ``dt`` (float32 or float64).
    a : torch.Tensor, shape (batch, L, H)
        Log decays ``A * dt`` (<= 0).
    B, C : torch.Tensor, shape (batch, L, G, N)
        Input and output projections of the state, per group of ``H / G`` heads (``G = H``:
        one per head; Mamba2's ``ngroups``). A group's ``C_l . B_s`` is computed once for its
        heads; the products are batched matmuls in head-major layouts (faster in training
        than the einsum form with B and C copied to every head: ``bench/train.py``,
        docs/performance.md).
    chunk_size : int
        Chunk length Q; L need not be a multiple (the tail is padded with ``a = 0, x = 0``,
        which leaves the state unchanged).
    initial_state : torch.Tensor, shape (batch, H, P, N), optional
        State before position 0 (e.g. the final state of the previous segment).

    Returns
    -------
    y : torch.Tensor, shape (batch, L, H, P)
    final_state : torch.Tensor, shape (batch, H, P, N), the state after position L-1.

    Within a chunk the decay from position s to l is ``exp(cumsum_l - cumsum_s)`` of the
    chunk's log decays (as ``mamba_ssm``'s kernels; the differences of a cumulative sum lose
    ~1 ulp of its magnitude, well inside float32's tolerance for chunks of 64-256); between
    chunks :func:`pass_states`. :func:`alphamodel.ops.triton.ssd_triton.ssd_scan` is the same scan with
    steps 1 and 4 as Triton kernels.
    """
    b, L, h, p = x.shape
    g, n = B.shape[-2], B.shape[-1]
    r = h // g
    x, a, B, C = pad_chunks(x, a, B, C, chunk_size)
    c, q = x.shape[1] // chunk_size, chunk_size
    # head-major layouts, so that every product below is one batched matmul over (b, c, g[, r])
    x = x.reshape(b, c, q, g, r, p).permute(0, 1, 3, 4, 2, 5).contiguous()  # (b, c, g, r, s, p)
    B = B.reshape(b, c, q, g, n).permute(0, 1, 3, 2, 4).contiguous()  # (b, c, g, s, n)
    C = C.reshape(b, c, q, g, n).permute(0, 1, 3, 2, 4).contiguous()  # (b, c, g, l, n)
    a_cs = torch.cumsum(a.reshape(b, c, q, g, r).permute(0, 1, 3, 4, 2), dim=-1)  # (b, c, g, r, l)

    # 1. within chunks: y_l = sum_{s<=l} (C_l . B_s) exp(a_{s+1..l}) x_s
    cb = torch.matmul(C, B.transpose(-1, -2))  # (b, c, g, l, s), once per group
    causal = torch.tril(torch.ones(q, q, dtype=torch.bool, device=x.device))
    decay = torch.exp((a_cs[..., :, None] - a_cs[..., None, :]).masked_fill(~causal, -math.inf))  # (b, c, g, r, l, s)
    y_diag = torch.matmul(cb.unsqueeze(3) * decay, x)  # (b, c, g, r, l, p)

    # 2. state at the end of each chunk, from that chunk's inputs: sum_s decay_s x_s B_s^T
    decay_states = torch.exp(a_cs[..., -1:] - a_cs)  # (b, c, g, r, s)
    states = torch.matmul((x * decay_states.unsqueeze(-1)).transpose(-1, -2), B.unsqueeze(3))  # (b, c, g, r, p, n)

    # 3. recurrence over chunks: the state entering each chunk
    states, final_state = pass_states(states.reshape(b, c, h, p, n), a_cs[..., -1].reshape(b, c, h), initial_state)
    states = states.reshape(b, c, g, r, p, n)

    # 4. contribution of the state entering each chunk: C_l states^T exp(a_cs_l)
    y_off = torch.matmul(C.unsqueeze(3), states.transpose(-1, -2)) * torch.exp(a_cs).unsqueeze(-1)  # (b, c, g, r, l, p)
    y = (y_diag + y_off).permute(0, 1, 4, 2, 3, 5).reshape(b, c * q, h, p)[:, :L]
    return y, final_state


def pad_chunks(x: torch.Tensor, a: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int
               ) -> tuple[torch.Tensor, ...]:
    """``x, a, B, C`` of :func:`ssd_chunked` padded at the end to a multiple of ``chunk_size``
    positions with ``a = 0, x = 0`` (which leave the state unchanged); UsageError unless the
    groups of ``B`` divide the heads of ``x``."""
    check_groups(x.shape[2], B.shape[2])
    pad = (-x.shape[1]) % chunk_size
    if not pad:
        return x, a, B, C
    return (F.pad(x, (0, 0, 0, 0, 0, pad)), F.pad(a, (0, 0, 0, pad)), F.pad(B, (0, 0, 0, 0, 0, pad)),
            F.pad(C, (0, 0, 0, 0, 0, pad)))


def pass_states(states: torch.Tensor, last: torch.Tensor, initial_state: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD state entering each chunk, and after the last, from each chunk's own part.

    ``states`` (batch, c, H, P, N): per chunk, ``sum_s exp(acs_end - acs_s) x_s B_s^T`` over its
    positions; ``last`` (batch, c, H): the chunk's total log decay; ``initial_state`` (batch, H,
    P, N) or None (zeros). Returns ``(entering (batch, c, H, P, N), final (batch, H, P, N))``:
    ``S_0 = initial``, ``S_{z+1} = exp(last_z) S_z + states_z``. A loop over the c chunks (a
    window's few: ``window / chunk_size``), which ``torch.compile`` fuses; it trained faster than
    the quadratic ``segsum`` form of listing 1 (``bench/train.py``: docs/performance.md)."""
    s = states.new_zeros(states[:, 0].shape) if initial_state is None else initial_state.to(states.dtype)
    decay = torch.exp(last)
    entering = []
    for z in range(states.shape[1]):
        entering.append(s)
        s = decay[:, z, :, None, None] * s + states[:, z]
    return torch.stack(entering, 1), s


class RMSNormGated(nn.Module):
    """Gated RMSNorm of Mamba2: ``rmsnorm(y * silu(z)) * weight`` (norm after the gate).

    Input shapes (..., D); computed in float32 (float64 for float64 input), returned in ``y``'s dtype.
    """

    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, y: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        dtype = y.dtype
        work = torch.float64 if dtype == torch.float64 else torch.float32
        y = y.to(work)
        if z is not None:
            y = y * F.silu(z.to(work))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(work)).to(dtype)


def causal_conv(full: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Depthwise causal convolution as shifted multiply-adds accumulated in float32 (at least),
    channels last.

    ``full`` (batch, L + k, C): the ``k`` carried inputs, then the window's; ``w`` (C, 1, k + 1),
    ``b`` (C,) as in ``nn.Conv1d(C, C, k + 1, groups=C)``. Returns (batch, L, C) in ``full``'s
    dtype, equal to ``F.conv1d(full.mT, w, b, groups=C).mT`` (tested). Written out because
    ``torch.compile`` fuses it into one kernel forward and one backward, where the depthwise
    convolution kernels took a sizeable share of a training step's GPU time; channels last,
    so that the weights' gradient is a sum over contiguous rows of C channels (in the channels-
    first form that reduction was an eighth of a step; ``bench/train.py`` side by side:
    docs/performance.md)
    """
    k = w.shape[-1] - 1
    L = full.shape[1] - k
    acc = torch.promote_types(full.dtype, torch.float32)
    f, ww = full.to(acc), w[:, 0].to(acc)
    y = b.to(acc) + ww[:, 0] * f[:, :L]
    for j in range(1, k + 1):
        y = y + ww[:, j] * f[:, j : j + L]
    return y.to(full.dtype)


class Mamba2(nn.Module):
    """One Mamba2 mixer (Dao & Gu 2024, fig. 6 "Mamba-2 block"), causal, pure PyTorch.

    in-projection -> [z | x B C | dt]; causal depthwise conv + SiLU on (x, B, C); selective
    SSD scan with ``A = -exp(A_log)``, ``dt = softplus(dt + dt_bias)`` in float32; skip ``D x``;
    gated RMSNorm with ``z``; out-projection.

    Parameters
    ----------
    d_model : int
        Width of the residual stream.
    d_state : int
        State size N per head.
    headdim : int
        Head width P; ``d_inner = expand * d_model`` must be a multiple of it.
    expand, d_conv, ngroups : int
        Inner expansion, conv kernel width, groups sharing B and C.
    chunk_size : int
        SSD chunk length Q.
    use_triton : bool
        With ``ssd_impl="chunked"``, use ``mamba_ssm``'s Triton scan on CUDA float32 input when that
        optional package imports (default True).
    ssd_impl : str
        ``"chunked"`` (:func:`ssd_chunked`) or ``"triton"`` (:func:`alphamodel.ops.triton.ssd_triton.ssd_scan`
        and the convolution with its SiLU as :func:`alphamodel.ops.triton.conv_triton.causal_conv_silu` when
        ``2 <= d_conv <= 4``, CUDA; float64 input runs the torch forms).
    dt_min, dt_max : float
        Range of the initial step ``softplus(dt_bias)`` (log-uniform), as in ``mamba_ssm``.

    Shapes: ``forward(u)`` takes (batch, L, d_model) and returns (batch, L, d_model); with
    ``return_state=True`` also the final state ``(conv_state, ssm_state)``: the last
    ``d_conv - 1`` conv inputs (batch, conv_dim, d_conv - 1) and the SSM state (batch, H, P, N)
    in float32.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        headdim: int = 32,
        expand: int = 2,
        d_conv: int = 4,
        ngroups: int = 1,
        chunk_size: int = 64,
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        use_triton: bool = True,
        ssd_impl: str = "chunked",
    ) -> None:
        super().__init__()
        self.d_model, self.d_state, self.headdim = d_model, d_state, headdim
        self.d_inner = expand * d_model
        if self.d_inner % headdim:
            raise UsageError("headdim", f"expected a divisor of expand * d_model = {self.d_inner}", headdim)
        self.nheads = self.d_inner // headdim
        if self.nheads % ngroups:
            raise UsageError("ngroups", f"expected a divisor of nheads = {self.nheads}", ngroups)
        self.ngroups, self.chunk_size, self.use_triton = ngroups, chunk_size, use_triton
        self.ssd_impl = validate_enum(ssd_impl, SsdImpl, "ssd_impl")
        self.ssd_warps = 4  # warps per program of the Triton scan (ssd_impl "triton")
        self.conv_dim = self.d_inner + 2 * ngroups * d_state
        self._widths = [self.d_inner, self.conv_dim, self.nheads]  # z | x B C | dt
        self.in_proj = nn.Linear(d_model, sum(self._widths), bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim, padding=d_conv - 1)
        dt = torch.exp(torch.rand(self.nheads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.A_log = nn.Parameter(torch.log(torch.empty(self.nheads).uniform_(1.0, 16.0)))
        self.D = nn.Parameter(torch.ones(self.nheads))
        self.norm = RMSNormGated(self.d_inner)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

    def forward(
        self, u: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None, return_state: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """(batch, L, d_model) -> (batch, L, d_model).

        ``state``: ``(conv_state (batch, conv_dim, d_conv - 1), ssm_state (batch, H, P, N))``, the
        state after the previous window of the same stream (from ``return_state=True``); with it
        two consecutive windows give the outputs of one long window (tests/test_model_ssd.py).
        ``mask`` (batch, L) bool: False positions (padding) are neutral — their conv input is zero
        (as the conv's own zero padding) and their step ``dt`` is 0 (decay 1, no input), so the
        state passes through them unchanged and real positions get the outputs they would get
        without the padding. Padding at the end of a window is neutral for its real positions
        but not for a carried conv state (the trainer resets a stream whose window ends padded).
        """
        bsz, L, _ = u.shape
        if self.ssd_impl == SsdImpl.TRITON:  # three products from slices of the one weight: their
            # gradients need no concatenation into one (batch, L, d_inner + conv_dim + nheads) tensor
            z, xbc, dt = (F.linear(u, w) for w in torch.split(self.in_proj.weight, self._widths))
        else:
            z, xbc, dt = torch.split(self.in_proj(u), self._widths, dim=-1)
        if mask is not None:
            xbc = xbc * mask.unsqueeze(-1).to(xbc.dtype)
        k = self.conv1d.kernel_size[0] - 1
        conv_state, ssm_state = state if state is not None else (None, None)
        if conv_state is None:
            conv_state = xbc.new_zeros(bsz, self.conv_dim, k)
        carried = conv_state.to(xbc.dtype).transpose(1, 2)  # (b, k, conv_dim)
        w, b = self.conv1d.weight, self.conv1d.bias
        if self.ssd_impl == SsdImpl.TRITON and u.dtype != torch.float64 and 0 < k < 4:  # the kernels hold 2-4 taps
            from alphamodel.ops.triton.conv_triton import causal_conv_silu

            new_conv = (xbc[:, L - k :] if L >= k else torch.cat([carried, xbc], 1)[:, -k:]).transpose(1, 2)
            xbc = causal_conv_silu(xbc, carried, w, b)
        else:
            full = torch.cat([carried, xbc], dim=1)  # (b, k + L, conv_dim)
            xbc = F.silu(causal_conv(full, w, b))
            new_conv = full[:, full.shape[1] - k :].transpose(1, 2)  # (b, conv_dim, k)
        with torch.autocast(device_type=u.device.type, enabled=False):
            scan_dtype = torch.float64 if u.dtype == torch.float64 else torch.float32
            dt = F.softplus(dt.to(scan_dtype) + self.dt_bias.to(scan_dtype))  # (b, L, H), float32
            if mask is not None:
                dt = dt * mask.unsqueeze(-1).to(scan_dtype)
            A = -torch.exp(self.A_log.to(scan_dtype))  # (H,)
            if self.ssd_impl == SsdImpl.TRITON and scan_dtype == torch.float32:
                from alphamodel.ops.triton.ssd_triton import ssd_scan

                # x, B and C read from the convolution's output, x times dt and the skip D x in the kernels
                y, new_ssm = ssd_scan(xbc, dt, A, self.D, self.d_state, self.ngroups, self.chunk_size, ssm_state,
                                      self.ssd_warps)
            else:
                y, new_ssm = self._torch_scan(xbc, dt, A, ssm_state)
            y = y.reshape(bsz, L, self.d_inner)
        out = self.out_proj(self.norm(y, z))  # under autocast the projection runs in bf16
        if return_state:
            return out, (new_conv, new_ssm)
        return out

    def _torch_scan(self, xbc: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, ssm_state: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The scan with its skip, ``ssd_chunked(x dt, A dt, B, C) + D x`` (or ``mamba_ssm``'s kernel),
        in ``dt``'s dtype: y (batch, L, H, P) and the final state (batch, H, P, N)."""
        bsz, L, _ = xbc.shape
        x, Bm, Cm = torch.split(xbc.to(dt.dtype), [self.d_inner, self.ngroups * self.d_state,
                                                    self.ngroups * self.d_state], dim=-1)
        xh = x.reshape(bsz, L, self.nheads, self.headdim)
        Bg, Cg = (t.reshape(bsz, L, self.ngroups, self.d_state) for t in (Bm, Cm))
        if self.use_triton and _triton_ssd is not None and xbc.is_cuda and dt.dtype == torch.float32:
            # mamba_ssm's kernel: the same scan (x times dt inside), carried state in and out
            y, final = _triton_ssd(xh, dt, A, Bg, Cg, self.chunk_size, initial_states=ssm_state,
                                   return_final_states=True)
        else:
            y, final = ssd_chunked(xh * dt.unsqueeze(-1), A * dt, Bg, Cg, self.chunk_size, ssm_state)
        return y + xh * self.D.to(dt.dtype).unsqueeze(-1), final
