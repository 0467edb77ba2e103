"""The model beside its baselines on generated sessions, per horizon with intervals.

Generates ``--sessions`` sessions with ``alphafeat synth`` (unless ``--cache`` is given),
builds the cache with ``alphafeat precompute``, runs ``alphamodel train`` (walk-forward folds,
baselines on the same rows, session-bootstrap intervals) and prints the pooled table (model,
base rate, logistic on all features, LightGBM, MLP, the generator's ceiling; the lift over the
best baseline with its paired 95% interval) and one JSON line with the evaluation records.

    python bench/evaluate.py --sessions 24 --scale normal --jobs 16 --work /tmp/eval24 \\
        --config alphamodel/configs/synth-normal-gpu.json --device cuda
    python bench/evaluate.py --cache /tmp/x/cache20 --config alphamodel/configs/synth-quiet-cpu.json
    python bench/evaluate.py --sessions 24 --scale quiet --signal-kind history --signal 16 --work /tmp/h24 \\
        --config alphamodel/configs/synth-quiet-cpu.json
    python bench/evaluate.py --sessions 160 --scale quiet --signal-kind history --signal 16 --jobs 16 \\
        --work /tmp/h160 --config alphamodel/configs/synth-quiet-cpu.json --device cuda --set threads=12

Extra options of the training config can be given as ``--set key=value`` (``train`` keys) and
``--set model.key=value`` (``model`` keys, e.g. ``--set 'model.ema_rows=[32,128,512,2048]'``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from alphafeat.cache import MANIFEST
from alphafeat.errors import AlphafeatError
from alphafeat.validation import SignalKind
from alphamodel.config import read_config
from alphamodel.nn.model import ModelConfig
from alphamodel.supervised.train import train
from cli.alphamodel import print_summary


def build_cache(args: argparse.Namespace) -> Path:
    work = Path(args.work)
    syn, cache = work / "synth", work / "cache"
    if not (syn / "synth-report.json").is_file():
        subprocess.run([sys.executable, "-m", "cli.alphafeat", "synth", "--start", args.start, "--sessions",
                        str(args.sessions), "--scale", args.scale, "--out", str(syn), "--jobs", str(args.jobs),
                        "--seed", str(args.seed), "--signal", str(args.signal), "--signal-kind", args.signal_kind],
                       check=True)
    if not (cache / MANIFEST).is_file():
        subprocess.run([sys.executable, "-m", "cli.alphafeat", "precompute", "--input", str(syn), "--out", str(cache),
                        "--instrument-mode", "front-month", "--jobs", str(args.jobs), "-q"], check=True)
    return cache


def parse_value(v: str) -> object:
    try:
        return json.loads(v)
    except ValueError:
        return v


def train_options(device: str, sets: list[str]) -> dict:
    """``train`` keys laid over the config file's: ``device``, then each ``--set key=value``
    (``model.KEY=value`` ones are left to :func:`model_options`)."""
    out: dict = {"device": device}
    for kv in sets:
        k, _, v = kv.partition("=")
        if not k.startswith("model."):
            out[k] = parse_value(v)
    return out


def model_options(mc: ModelConfig, sets: list[str]) -> ModelConfig:
    """``mc`` with each ``--set model.KEY=value`` laid over it (checked as a config file's)."""
    over = {kv.partition("=")[0][len("model."):]: parse_value(kv.partition("=")[2])
            for kv in sets if kv.startswith("model.")}
    return ModelConfig.from_dict({**dataclasses.asdict(mc), **over}) if over else mc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", help="an existing cache (else one is generated under --work)")
    ap.add_argument("--work", default="bench-evaluate", help="directory for generated data, cache, outputs")
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--scale", default="quiet", choices=("quiet", "normal", "busy", "full"))
    ap.add_argument("--start", default="2024-03-04")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--signal", type=float, default=1.0, help="alphafeat synth --signal (strength)")
    ap.add_argument("--signal-kind", default=str(SignalKind.BOTH), choices=[str(k) for k in SignalKind],
                    help="alphafeat synth --signal-kind (history: a signal only the order flow's past shows)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--config", help="JSON {model: {...}, train: {...}} (alphamodel/configs/)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--set", action="append", default=[],
                    help="train key=value or model.key=value (JSON value), repeatable")
    ap.add_argument("--out", help="training output directory (default WORK/train)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    cache = Path(args.cache) if args.cache else build_cache(args)
    mc, tc = read_config(args.config, train_options(args.device, args.set))
    mc = model_options(mc, args.set)
    out = Path(args.out or Path(args.work) / "train")
    t0 = time.perf_counter()
    s = train(cache, out, mc, tc, progress=False)
    print_summary(s)
    rows = [r for r in s["evaluation"] if r["fold"] == "all"]
    print(json.dumps({"bench": "evaluate", "cache": str(cache), "sessions": s["rows"]["sessions"],
                      "rows": s["rows"]["total"], "test_rows_pooled": s["rows"]["test_pooled"],
                      "folds": [{k: f[k] for k in ("fold", "train", "val", "test", "best_epoch")} for f in s["folds"]],
                      "context": s["context"], "seconds": time.perf_counter() - t0, "device": s["device"],
                      "lift": [{k: h[k] for k in ("horizon", "best_baseline", "lift", "lift_ci_low", "lift_ci_high")}
                               for h in s["horizons"]],
                      "evaluation_pooled": rows, "warnings": s["warnings"]}))


if __name__ == "__main__":
    try:
        main()
    except AlphafeatError as e:  # a bad cache, config or option: one line, as alphamodel train says it
        sys.exit(f"error: {e}")
