"""Optimiser parameter groups by role: weight decay on the weights of Linear and conv layers only.

As nanoGPT's ``configure_optimizers`` (minGPT's whitelist of module types) and Mamba's
``_no_weight_decay`` flag: a parameter decays when it is the ``weight`` of a module of a type
in :data:`DECAY_MODULES`, unless it carries ``_no_weight_decay = True``. Everything else --
biases, norm gains (RMSNormGated), the SSM's ``A_log``, ``D`` and ``dt_bias``, the CfC's
``log_tau`` -- does not decay. The choice is by module type, never by a parameter's name or
shape, so a new layer is classed by what it is.
"""

from __future__ import annotations

from torch import nn

__all__ = ["DECAY_MODULES", "decayed_parameters", "param_groups"]

#: Module types whose ``weight`` decays.
DECAY_MODULES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def decayed_parameters(model: nn.Module) -> list[str]:
    """Names (as ``model.named_parameters()`` gives them) of the parameters that decay."""
    owners = {id(m.weight) for m in model.modules() if isinstance(m, DECAY_MODULES)}
    return [n for n, p in model.named_parameters()
            if id(p) in owners and not getattr(p, "_no_weight_decay", False)]  # fmt: skip


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: the :func:`decayed_parameters` with ``weight_decay``, the rest with 0.

    Each parameter is in exactly one group (a shared one once).
    """
    decay = set(decayed_parameters(model))
    groups: dict[bool, list[nn.Parameter]] = {True: [], False: []}
    for name, p in model.named_parameters():  # no duplicates: named_parameters drops shared ones
        groups[name in decay].append(p)
    return [{"params": groups[True], "weight_decay": weight_decay}, {"params": groups[False], "weight_decay": 0.0}]
