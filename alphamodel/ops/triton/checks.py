"""What the Triton kernels (:mod:`~alphamodel.ops.triton.cfc_triton`,
:mod:`~alphamodel.ops.triton.ssd_triton`, :mod:`~alphamodel.ops.triton.conv_triton`) need of
their sizes and tensors, checked the same way by the kernels and by the model's config."""

from __future__ import annotations

import contextlib

import torch

from alphamodel.errors import UsageError

__all__ = ["TILE_SIZE", "check_groups", "check_tiles", "is_tile_size", "on_device", "dot_precision"]

#: What the Triton CfC and SSD scans need of their sizes (``tl.dot`` tiles): the problem of a size that is not.
TILE_SIZE = "expected a power of two >= 16"


def is_tile_size(v: int) -> bool:
    """Whether ``v`` can be a size of the Triton CfC or SSD scan (:func:`alphamodel.nn.cfc.check_triton`):
    a power of two >= 16."""
    return v >= 16 and not v & (v - 1)


def check_tiles(sizes: dict[str, int], what: str) -> None:
    """UsageError naming the first of ``sizes`` (option name -> value) that is not a tile size
    (:func:`is_tile_size`), as needed by ``what`` (e.g. ``"ssd_impl 'triton'"``)."""
    for name, v in sizes.items():
        if not is_tile_size(v):
            raise UsageError(name, f"{TILE_SIZE} with {what} (its tl.dot tiles)", v)


def check_groups(heads: int, groups: int) -> None:
    """UsageError (option ``ngroups``) unless ``groups`` of B and C divide the ``heads`` of x."""
    if heads % groups:
        raise UsageError("ngroups", f"expected a divisor of the {heads} heads", groups)


def dot_precision(w: torch.Tensor) -> str:
    """``tl.dot`` input precision: exact float32 products ("ieee") unless torch allows TF32 on
    CUDA; 16-bit products ignore it (Triton's default, "tf32")."""
    exact = w.dtype == torch.float32 and not (w.is_cuda and torch.get_float32_matmul_precision() != "highest")
    return "ieee" if exact else "tf32"


def on_device(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """The kernels launch on the current CUDA device: make it ``t``'s."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()
