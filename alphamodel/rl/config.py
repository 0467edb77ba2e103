"""C51's hyper-parameters: :class:`C51Config` and the rule of each of its keys (no torch here:
the command line reads them before torch is imported)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from alphamodel.errors import UsageError
from alphamodel.rules import SIZE, Rule, build, check_fields, float_rule, int_rule

__all__ = ["C51_RULES", "C51Config"]


#: C51Config keys and their checks (:meth:`C51Config.checked`).
C51_RULES: dict[str, Rule] = {
    "n_atoms": int_rule(2, "a number of atoms"), "v_min": float_rule(), "v_max": float_rule(), "hidden": SIZE,
    "gamma": float_rule(0.0, 1.0), "n_step": SIZE, "lr": float_rule(0.0, open_=True), "batch_size": SIZE,
    "replay": SIZE, "target_every": SIZE, "aux_weight": float_rule(0.0),
}  # fmt: skip


@dataclass
class C51Config:
    """C51 hyper-parameters.

    n_atoms, v_min, v_max : the support (reward units after scaling). hidden : MLP width.
    gamma : per-decision discount. n_step : return horizon in decisions. lr : Adam.
    batch_size, replay : replay batch and capacity. target_every : steps between target-network
    copies. aux_weight : weight of the K=3 trade-outcome cross-entropy.
    """

    n_atoms: int = 51
    v_min: float = -20.0
    v_max: float = 20.0
    hidden: int = 128
    gamma: float = 0.99
    n_step: int = 3
    lr: float = 5e-4
    batch_size: int = 256
    replay: int = 200_000
    target_every: int = 100
    aux_weight: float = 0.5

    def checked(self) -> C51Config:
        """A copy with every key checked and normalised (:data:`C51_RULES`); UsageError naming
        the key (``c51.n_atoms``), also for ``v_min`` >= ``v_max``."""
        v = check_fields(self, C51_RULES, "c51.")
        if v["v_min"] >= v["v_max"]:
            raise UsageError("c51.v_min", f"expected a number below v_max={v['v_max']:g}", v["v_min"])
        return dataclasses.replace(self, **v)

    @classmethod
    def from_dict(cls, d: dict) -> C51Config:
        """Build from a dict, each key checked (:meth:`checked`; UsageError naming ``c51.KEY`` for
        an unknown key or a bad value)."""
        return build(cls, d, "c51").checked()
