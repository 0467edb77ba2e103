"""``alphamodel``: train Mamba2 -> CfC -> multi-horizon heads on an alphafeat cache.

Subcommands
    train   walk-forward folds over sessions (purged, embargo); per-horizon AUC of the model and of
            its baselines (base rate, logistic regression, LightGBM, MLP, the generator's
            ceiling) on the same rows, with session-bootstrap 95% intervals

``alphamodel train`` with no ``--cache`` builds the cache of the embedded default sample under
``OUT/cache`` (if absent) and trains a tiny model on it (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from alphafeat.errors import AlphafeatError
from cli import console, run


def _default_cache(out: Path, quiet: bool) -> Path:
    from alphafeat.cache import is_cache
    from alphafeat.pipeline import DEFAULT_DATA_DIR, PrecomputeConfig, precompute

    cache = out / "cache"
    if is_cache(cache):
        try:
            from alphafeat.cache import read_manifest

            read_manifest(cache)
            return cache
        except AlphafeatError:
            pass  # an old format: rebuild below
    if not DEFAULT_DATA_DIR.is_dir():
        raise AlphafeatError(f"{DEFAULT_DATA_DIR}: the embedded default sample is missing; pass --cache DIR")
    if not quiet:
        console.print(f"building the cache of the embedded sample in {cache} ...")
    precompute(PrecomputeConfig(inputs=[DEFAULT_DATA_DIR], out=cache, device="cpu"))
    return cache


def _train(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise AlphafeatError(
            "alphamodel needs PyTorch, which is not installed: pip install -e '.[model]'"
        ) from e
    from alphamodel.model import ModelConfig
    from alphamodel.train import TrainConfig, train

    model, tcfg = {}, {}
    if args.config:
        p = Path(args.config)
        try:
            cfg = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise AlphafeatError(f"{p}: cannot read the config ({e})") from e
        if not isinstance(cfg, dict):
            raise AlphafeatError(f"{p}: the config must be a JSON object with 'model' and/or 'train'")
        model, tcfg = dict(cfg.get("model", {})), dict(cfg.get("train", {}))
        bad = set(cfg) - {"model", "train"}
        if bad:
            raise AlphafeatError(f"{p}: unknown top-level keys {sorted(bad)} (use 'model' and 'train')")
    for key in ("epochs", "window", "device", "seed", "batch_size", "steps_per_epoch", "threads", "folds", "context"):
        v = getattr(args, key)
        if v is not None:
            tcfg[key] = v
    if args.compile:
        tcfg["compile"] = True
    try:
        mc, tc = ModelConfig.from_dict(model), TrainConfig.from_dict(tcfg)
    except (TypeError, ValueError) as e:
        raise AlphafeatError(f"{args.config or '--config'}: {e}") from e
    if tc.burn_in >= tc.window:
        tc.burn_in = tc.window // 4
    out = Path(args.out)
    cache = Path(args.cache) if args.cache else _default_cache(out, args.quiet)
    s = train(cache, out, mc, tc, progress=not args.quiet)

    print_summary(s)
    return 0


def print_summary(s: dict) -> None:
    """The pooled test table of a ``summary.json``: the model and each baseline per horizon with
    95% session-bootstrap intervals, the generator's ceiling, and the lift over the best baseline."""
    models = []
    for r in s["evaluation"]:
        if r["fold"] == "all" and r["model"] not in models:
            models.append(r["model"])
    folds = len(s["folds"])
    t = Table(title=f"alphamodel train -> {s['out']}: test blocks of {folds} walk-forward fold(s) pooled, "
                    f"{s['rows']['test_pooled']:,} rows; AUC with its 95% session-bootstrap interval")
    for col in ("horizon", "labels", "up", "model", "AUC", "95% interval", "lift vs best [95%]"):
        t.add_column(col, justify="right")

    def f(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    for h in s["horizons"]:
        first = True
        for m in models:
            r = next((r for r in s["evaluation"] if r["fold"] == "all" and r["horizon"] == h["horizon"]
                      and r["model"] == m), None)
            if r is None:
                continue
            ci = "" if r["auc_ci_low"] is None else f"[{f(r['auc_ci_low'])}, {f(r['auc_ci_high'])}]"
            lift = ""
            if m == "alphamodel":
                lift = ("n/a" if h["lift"] is None else f"{h['lift']:+.3f} [{h['lift_ci_low']:+.3f}, "
                        f"{h['lift_ci_high']:+.3f}] vs {h['best_baseline']}" if h["lift_ci_low"] is not None
                        else f"{h['lift']:+.3f} vs {h['best_baseline']}")
            t.add_row(str(h["horizon"]) if first else "", f"{h['n_test']:,}" if first else "",
                      f(h["base_rate_test"]) if first else "", m, f(r["auc"]), ci, lift,
                      end_section=m == models[-1])
            first = False
    con = Console() if Console().is_terminal else Console(width=140)
    con.print(t)
    for w in s.get("warnings", []):
        Console(stderr=True).print(f"warning: {w}")
    con.print(f"context {s['context']}; last fold: best epoch {s['best_epoch']} of {s['epochs_run']}; "
                    f"{s['parameters']:,} parameters; {s['device']}; {s['seconds']:.1f} s; summary.json, loss.png, "
                    "auc.png, model.safetensors, config.json written")


def build_parser() -> argparse.ArgumentParser:
    """The ``alphamodel`` argument parser."""
    ap = argparse.ArgumentParser(prog="alphamodel", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-v", "--verbose", action="store_true", help="info logging")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train on an alphafeat cache")
    p.add_argument("--cache", help="cache directory (default: build one from the embedded sample under OUT/cache)")
    p.add_argument("--out", default="out", help="output directory (default: ./out)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--window", type=int, help="K, snapshots per window")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"))
    p.add_argument("--config", help="JSON file: {\"model\": {...ModelConfig}, \"train\": {...TrainConfig}}")
    p.add_argument("--seed", type=int)
    p.add_argument("--batch-size", dest="batch_size", type=int)
    p.add_argument("--steps-per-epoch", dest="steps_per_epoch", type=int)
    p.add_argument("--threads", type=int, help="CPU threads for torch")
    p.add_argument("--folds", type=int, help="walk-forward folds over sessions (default 3)")
    p.add_argument("--context", choices=("stateful", "window"),
                   help="stateful: carry the state across consecutive windows of a session (default); "
                        "window: each window starts from zero")
    p.add_argument("--compile", action="store_true", help="torch.compile the Mamba2 blocks and the CfC cell")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_train)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (1 on a user error, printed as one line)."""
    return run(build_parser(), argv, verbose_level=logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
