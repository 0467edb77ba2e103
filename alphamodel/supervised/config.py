"""The training config: :class:`TrainConfig` and the rule of each of its keys."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from alphafeat.validation import Device, validate_bool, validate_int
from alphamodel.enums import Baseline, Context, HorizonWeighting, validate_baselines
from alphamodel.errors import UsageError
from alphamodel.rules import SIZE, Rule, build, check_fields, enum_rule, float_rule, int_rule, optional

__all__ = ["BASELINES", "TRAIN_RULES", "TrainConfig"]

#: Baselines fitted beside the model (see :mod:`alphamodel.supervised.baselines`; declared as
#: :class:`alphamodel.enums.Baseline`).
BASELINES: tuple[str, ...] = tuple(str(b) for b in Baseline)



#: TrainConfig keys and their checks (:meth:`TrainConfig.checked`).
TRAIN_RULES: dict[str, Rule] = {
    "window": int_rule(1, "a number of snapshots"), "burn_in": int_rule(0, "a number of snapshots"),
    "context": enum_rule(Context), "batch_size": SIZE, "epochs": SIZE, "steps_per_epoch": SIZE,
    "lr": float_rule(0.0, open_=True), "weight_decay": float_rule(0.0), "warmup_steps": int_rule(0),
    "min_lr_frac": float_rule(0.0, 1.0), "patience": SIZE, "folds": int_rule(1, "a number of walk-forward folds"),
    "embargo": float_rule(0.0, 1.0, hi_open=True), "n_boot": int_rule(2, "a number of bootstrap replicates"),
    "baselines": validate_baselines, "horizon_weighting": enum_rule(HorizonWeighting), "seed": int_rule(0),
    "device": enum_rule(Device), "compile": validate_bool, "grad_clip": float_rule(0.0), "eval_batch_size": SIZE,
    "eval_piece": int_rule(1, "a number of rows"), "eval_warmup": int_rule(0, "a number of rows"),
    "threads": optional(SIZE), "loader_threads": int_rule(1, "a number of threads"), "baseline_max_rows": SIZE,
}  # fmt: skip


@dataclass
class TrainConfig:
    """Training parameters.

    window : K, snapshots per window.  burn_in : positions at the start of a window without
    carried state that do not count in the loss (context only).  context : ``"stateful"`` (the
    state is carried across consecutive windows of a session, in training and scoring) or
    ``"window"`` (each window starts from a zero state; scoring tiles the rows with windows
    that overlap by ``burn_in``).  batch_size, epochs, steps_per_epoch : optimisation length
    (per fold).  lr, weight_decay, warmup_steps, min_lr_frac : AdamW and schedule (cosine decay
    to ``min_lr_frac * lr``).  patience : epochs without validation improvement before stopping.
    folds : walk-forward folds (sessions in ``folds + 2`` blocks).  embargo : fraction of all
    rows (AFML's pct_embargo): that many rows before each later block lose their labels too.
    n_boot : bootstrap replicates of the intervals.
    baselines : which of :data:`BASELINES` to fit.  horizon_weighting : ``window``
    (w_h = min(1, K/h)) or ``equal``.  seed, device (auto|cpu|cuda), compile (torch.compile
    the blocks and the CfC scan), grad_clip, eval_batch_size (streams scored at once),
    eval_piece / eval_warmup (stateful scoring: a run of rows is scored in pieces of
    ``eval_piece`` rows, each preceded by up to ``eval_warmup`` unscored rows of the same
    session whose state it carries; pieces run in parallel), threads (CPU threads; None = 1 on
    CPU), loader_threads (threads gathering the next batches from the memory-mapped cache while
    the model runs; ``loader_threads + 1`` batches are in flight), baseline_max_rows (training
    rows of each baseline).
    """

    window: int = 64
    burn_in: int = 16
    context: str = "stateful"
    batch_size: int = 32
    epochs: int = 12
    steps_per_epoch: int = 20
    lr: float = 2e-3
    weight_decay: float = 0.1
    warmup_steps: int = 10
    min_lr_frac: float = 0.05
    patience: int = 4
    folds: int = 3
    embargo: float = 0.01
    n_boot: int = 200
    baselines: tuple[str, ...] = BASELINES
    horizon_weighting: str = "window"
    seed: int = 0
    device: str = "auto"
    compile: bool = False
    grad_clip: float = 1.0
    eval_batch_size: int = 128
    eval_piece: int = 2048
    eval_warmup: int = 1024
    threads: int | None = None
    loader_threads: int = 2
    baseline_max_rows: int = 200_000

    def checked(self) -> TrainConfig:
        """A copy with every key checked and normalised (:data:`TRAIN_RULES`).

        Raises
        ------
        alphamodel.errors.UsageError
            Naming the key (``train.epochs``), the value and what is allowed; also for
            ``burn_in`` >= ``window``.
        """
        v = check_fields(self, TRAIN_RULES, "train.")
        if v["burn_in"] >= v["window"]:
            raise UsageError("train.burn_in", f"expected a number of snapshots in [0, window={v['window']})",
                             v["burn_in"])  # fmt: skip
        return dataclasses.replace(self, **v)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """Build from a dict, each key checked (:meth:`checked`; UsageError naming ``train.KEY``
        for an unknown key or a bad value). A ``burn_in`` not given is lowered to
        ``window // 4`` when the default would not fit the window."""
        cfg = build(cls, d, "train")
        if "burn_in" not in d and "window" in d:
            window = validate_int(d["window"], "train.window", lo=1, what="a number of snapshots")
            if cfg.burn_in >= window:
                cfg = dataclasses.replace(cfg, burn_in=window // 4)
        return cfg.checked()
