"""``alphamodel``: train Mamba2 -> CfC -> multi-horizon heads on an alphafeat cache.

Subcommands
    train   purged walk-forward training with per-horizon AUCs against baselines

``alphamodel train`` with no ``--cache`` builds the cache of the embedded default sample under
``OUT/cache`` (if absent) and trains a tiny model on it (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from alphafeat.errors import AlphafeatError, InputError
from alphafeat.validation import Device, validate_enum, validate_int, validate_path
from cli import Parser, console, option, run, verbose_parent


def _default_cache(out: Path, quiet: bool) -> Path:
    from alphafeat.cache import is_cache, read_manifest
    from alphafeat.pipeline import DEFAULT_DATA_DIR, PrecomputeConfig, precompute

    cache = out / "cache"
    if is_cache(cache):
        try:
            read_manifest(cache)
            return cache
        except AlphafeatError:
            pass  # an old format: rebuild below
    if not DEFAULT_DATA_DIR.is_dir():
        raise InputError(DEFAULT_DATA_DIR, "the embedded default sample is missing; pass --cache DIR")
    if not quiet:
        console.print(f"building the cache of the embedded sample in {cache} ...")
    precompute(PrecomputeConfig(inputs=[DEFAULT_DATA_DIR], out=cache, device="cpu"))
    return cache


#: ``alphamodel train`` options that set a TrainConfig key of the same name.
_TRAIN_OPTIONS = ("epochs", "window", "device", "seed", "batch_size", "steps_per_epoch", "threads")


def _train(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise AlphafeatError(
            "alphamodel needs PyTorch, which is not installed: pip install -e '.[model]'"
        ) from e
    from alphamodel.config import from_dict, read_config
    from alphamodel.model import ModelConfig
    from alphamodel.train import TrainConfig, train

    tcfg = {k: getattr(args, k) for k in _TRAIN_OPTIONS if getattr(args, k) is not None}
    if args.compile:
        tcfg["compile"] = True
    if args.config:
        mc, tc = read_config(args.config, tcfg)  # ConfigError names the file and the key
    else:
        mc, tc = ModelConfig(), from_dict(TrainConfig, tcfg, "train")
    cache = args.cache or _default_cache(args.out, args.quiet)
    s = train(cache, args.out, mc, tc, progress=not args.quiet)

    t = Table(title=f"alphamodel train -> {s['out']}  (test block, {s['rows']['test']:,} rows)")
    for col in ("horizon", "labels", "base rate", "AUC model", "AUC logistic (OFI/imbalance)"):
        t.add_column(col, justify="right")

    def f(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.4f}"

    for h in s["horizons"]:
        t.add_row(str(h["horizon"]), f"{h['n_test']:,}", f(h["base_rate_test"]), f(h["auc_model"]),
                  f(h["auc_logistic"]))
    Console().print(t)
    Console().print(f"best epoch {s['best_epoch']} of {s['epochs_run']}; {s['parameters']:,} parameters; "
                    f"{s['device']}; {s['seconds']:.1f} s; summary.json, loss.png, auc.png, "
                    "model.safetensors, config.json written")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``alphamodel`` argument parser; option values are checked by :mod:`alphafeat.validation`."""
    ap = Parser(prog="alphamodel", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-v", "--verbose", action="store_true", help="info logging; tracebacks of errors")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train on an alphafeat cache",
                       parents=[verbose_parent("info logging; tracebacks of errors")])
    path, size = option(validate_path), option(validate_int, lo=1)
    p.add_argument("--cache", type=path,
                   help="cache directory (default: build one from the embedded sample under OUT/cache)")
    p.add_argument("--out", default="out", type=path, help="output directory (default: ./out)")
    p.add_argument("--epochs", type=size)
    p.add_argument("--window", type=option(validate_int, lo=1, what="a number of snapshots"),
                   help="K, snapshots per window")
    p.add_argument("--device", type=option(validate_enum, enum=Device), metavar="{" + ",".join(Device) + "}")
    p.add_argument("--config", type=path, help="JSON file: {\"model\": {...ModelConfig}, \"train\": {...TrainConfig}}")
    p.add_argument("--seed", type=option(validate_int, lo=0))
    p.add_argument("--batch-size", dest="batch_size", type=size)
    p.add_argument("--steps-per-epoch", dest="steps_per_epoch", type=size)
    p.add_argument("--threads", type=size, help="CPU threads for torch")
    p.add_argument("--compile", action="store_true", help="torch.compile the Mamba2 blocks and the CfC cell")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_train)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for a usage error, 1 for a data error; one line)."""
    return run(build_parser(), argv, verbose_level=logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
