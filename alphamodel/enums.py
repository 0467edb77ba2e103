"""alphamodel's options with a fixed set of values, as :class:`~alphafeat.validation.StrEnum` s
(a member equals its string, so configs and checkpoints hold plain strings), and their
``validate_*``.

Checked with :func:`alphafeat.validation.validate_enum` (one line naming the option, the value
and what is allowed); :class:`~alphafeat.validation.Device` is shared with alphafeat and stays
there.
"""

from __future__ import annotations

from alphafeat.errors import UsageError
from alphafeat.validation import StrEnum, allowed_values, split_list, validate_enum

__all__ = ["Baseline", "CfcImpl", "Context", "HorizonWeighting", "SsdImpl", "validate_baselines"]


def _enum(name: str, doc: str, *values: str) -> type[StrEnum]:
    """A StrEnum of ``values``; member names are the values upper-cased."""
    cls = StrEnum(name, [(v.upper().replace("-", "_"), v) for v in values], module=__name__)
    cls.__doc__ = doc
    return cls


HorizonWeighting = _enum("HorizonWeighting", "alphamodel's loss weight per horizon: min(1, K/h), or equal.",
                         "window", "equal")  # fmt: skip
Context = _enum("Context", "alphamodel's context: the state carried across a session's windows, or each window alone.",
                "stateful", "window")  # fmt: skip
CfcImpl = _enum("CfcImpl", "alphamodel's CfC scan: the fused chunked scan, the Triton kernels (CUDA), or the "
                "reference loop over the cell.", "fused", "triton", "loop")  # fmt: skip
SsdImpl = _enum("SsdImpl", "alphamodel's Mamba2 scan: the chunked scan in torch, or its output half as Triton "
                "kernels (CUDA).", "chunked", "triton")  # fmt: skip
Baseline = _enum("Baseline", "Baselines alphamodel train fits beside the model (alphamodel.supervised.baselines).",
                 "base_rate", "logistic", "lightgbm", "mlp")  # fmt: skip


def validate_baselines(value: object, option: str = "baselines") -> tuple[str, ...]:
    """Baselines of ``alphamodel train`` (:class:`Baseline`): ``"logistic,mlp"`` or a sequence of
    names, distinct; none is allowed (the model alone). UsageError naming ``option`` otherwise."""
    try:
        out = tuple(str(validate_enum(b, Baseline, option)) for b in split_list(value, option))
    except UsageError:
        out = None
    if out is None or len(set(out)) != len(out):
        raise UsageError(option, f"expected distinct names of {allowed_values(Baseline)}, comma-separated", value)
    return out
