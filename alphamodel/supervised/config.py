"""The training config: :class:`TrainConfig` and the rule of each of its keys."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from alphafeat.options import opt, optional
from alphafeat.validation import Device, validate_bool, validate_int
from alphamodel.enums import Baseline, Context, HorizonWeighting, validate_baselines
from alphamodel.errors import UsageError
from alphamodel.rules import SIZE, build, check_fields, float_rule, int_rule

__all__ = ["BASELINES", "TrainConfig"]

#: Baselines fitted beside the model (see :mod:`alphamodel.supervised.baselines`; declared as
#: :class:`alphamodel.enums.Baseline`).
BASELINES: tuple[str, ...] = tuple(str(b) for b in Baseline)



@dataclass
class TrainConfig:
    """Training parameters: each key's meaning, rule and default are declared once, on its field
    (:func:`alphafeat.options.opt`); ``alphamodel train --help`` and ``docs/cli.md`` show those the
    command line sets, a config file's ``train`` section may set any. Cosine decay of the
    learning rate to ``min_lr_frac * lr`` after ``warmup_steps``; ``folds`` walk-forward folds
    over sessions in ``folds + 2`` blocks; ``baselines`` among :data:`BASELINES`.
    """

    window: int = opt(64, check=int_rule(1, "a number of snapshots"), help="K, snapshots per window")
    burn_in: int = opt(16, check=int_rule(0, "a number of snapshots"), cli=False,
                       help="positions at the start of a window without carried state that do not count in the loss")
    context: str = opt("stateful", enum=Context,
                       help="stateful: carry the state across consecutive windows of a session (in training and "
                            "scoring); window: each window starts from zero (scoring tiles the rows with windows "
                            "that overlap by burn_in)")
    batch_size: int = opt(32, check=SIZE, help="windows per optimiser step")
    epochs: int = opt(12, check=SIZE, help="epochs per fold, at most (early stopping on validation)")
    steps_per_epoch: int = opt(20, check=SIZE, help="optimiser steps per epoch")
    lr: float = opt(2e-3, check=float_rule(0.0, open_=True), cli=False, help="AdamW's learning rate")
    weight_decay: float = opt(0.1, check=float_rule(0.0), cli=False, help="AdamW's weight decay")
    warmup_steps: int = opt(10, check=int_rule(0), cli=False, help="steps of linear warm-up of the learning rate")
    min_lr_frac: float = opt(0.05, check=float_rule(0.0, 1.0), cli=False,
                             help="the cosine schedule decays to min_lr_frac * lr")
    patience: int = opt(4, check=SIZE, cli=False, help="epochs without validation improvement before stopping")
    folds: int = opt(3, check=int_rule(1, "a number of walk-forward folds"),
                     help="walk-forward folds over sessions (sessions in folds + 2 blocks)")
    embargo: float = opt(0.01, check=float_rule(0.0, 1.0, hi_open=True), cli=False,
                         help="fraction of all rows (AFML's pct_embargo): that many rows before each later block lose "
                              "their labels too")
    n_boot: int = opt(200, check=int_rule(2, "a number of bootstrap replicates"), cli=False,
                      help="bootstrap replicates of the intervals")
    baselines: tuple[str, ...] = opt(BASELINES, check=validate_baselines, cli=False,
                                     help="baselines fitted beside the model")
    horizon_weighting: str = opt("window", enum=HorizonWeighting, cli=False,
                                 help="loss weight per horizon: window (min(1, K/h)) or equal")
    seed: int = opt(0, check=int_rule(0), help="random seed")
    device: str = opt("auto", enum=Device, help="auto: cuda when a GPU is usable, else cpu")
    compile: bool = opt(False, check=validate_bool, help="torch.compile the Mamba2 blocks and the CfC cell")
    grad_clip: float = opt(1.0, check=float_rule(0.0), cli=False, help="gradient norm clip (0: none)")
    eval_batch_size: int = opt(128, check=SIZE, cli=False, help="streams scored at once")
    eval_piece: int = opt(2048, check=int_rule(1, "a number of rows"), cli=False,
                          help="stateful scoring: a run of rows is scored in pieces of this many rows, in parallel")
    eval_warmup: int = opt(1024, check=int_rule(0, "a number of rows"), cli=False,
                           help="stateful scoring: unscored rows of the same session before each piece, whose state "
                                "it carries")
    threads: int | None = opt(None, check=optional(SIZE), default_text="1 on CPU", help="CPU threads for torch")
    loader_threads: int = opt(2, check=int_rule(1, "a number of threads"), cli=False,
                              help="threads gathering the next batches from the memory-mapped cache while the model "
                                   "runs (loader_threads + 1 batches in flight)")
    baseline_max_rows: int = opt(200_000, check=SIZE, cli=False, help="training rows of each baseline")

    def checked(self) -> TrainConfig:
        """A copy with every key checked and normalised (each by its field's check).

        Raises
        ------
        alphamodel.errors.UsageError
            Naming the key (``train.epochs``), the value and what is allowed; also for
            ``burn_in`` >= ``window``.
        """
        v = check_fields(self, "train.")
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
