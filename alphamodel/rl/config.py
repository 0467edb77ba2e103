"""C51's hyper-parameters: :class:`C51Config` and the rule of each of its keys (no torch here:
the command line reads them before torch is imported)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from alphafeat.options import opt
from alphamodel.errors import UsageError
from alphamodel.rules import SIZE, build, check_fields, float_rule, int_rule

__all__ = ["C51Config"]


@dataclass
class C51Config:
    """C51 hyper-parameters (Bellemare et al. 2017): each key's meaning, rule and default are
    declared once, on its field (:func:`alphafeat.options.opt`); a backtest config's ``c51``
    object sets them.
    """

    n_atoms: int = opt(51, check=int_rule(2, "a number of atoms"), cli=False, help="atoms of the support")
    v_min: float = opt(-20.0, check=float_rule(), cli=False, help="lowest atom (reward units after scaling)")
    v_max: float = opt(20.0, check=float_rule(), cli=False, help="highest atom (reward units after scaling)")
    hidden: int = opt(128, check=SIZE, cli=False, help="MLP width")
    gamma: float = opt(0.99, check=float_rule(0.0, 1.0), cli=False, help="per-decision discount")
    n_step: int = opt(3, check=SIZE, cli=False, help="return horizon in decisions")
    lr: float = opt(5e-4, check=float_rule(0.0, open_=True), cli=False, help="Adam's learning rate")
    batch_size: int = opt(256, check=SIZE, cli=False, help="replay batch")
    replay: int = opt(200_000, check=SIZE, cli=False, help="replay capacity")
    target_every: int = opt(100, check=SIZE, cli=False, help="steps between target-network copies")
    aux_weight: float = opt(0.5, check=float_rule(0.0), cli=False,
                            help="weight of the K=3 trade-outcome cross-entropy")

    def checked(self) -> C51Config:
        """A copy with every key checked and normalised (each by its field's check); UsageError naming
        the key (``c51.n_atoms``), also for ``v_min`` >= ``v_max``."""
        v = check_fields(self, "c51.")
        if v["v_min"] >= v["v_max"]:
            raise UsageError("c51.v_min", f"expected a number below v_max={v['v_max']:g}", v["v_min"])
        return dataclasses.replace(self, **v)

    @classmethod
    def from_dict(cls, d: dict) -> C51Config:
        """Build from a dict, each key checked (:meth:`checked`; UsageError naming ``c51.KEY`` for
        an unknown key or a bad value)."""
        return build(cls, d, "c51").checked()
