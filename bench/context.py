"""Context ablation: the same model trained with 1, 16, 64, 256 rows of context and with the
state carried across windows (stateful), on the same cache, folds and rows.

Each setting runs ``alphamodel train`` (walk-forward folds; the model's pooled test AUC with
its session-bootstrap interval); the first run also fits the baselines, whose best AUC per
horizon is the reference. Window K with ``context="window"``: every window starts from a
zero state and scoring tiles the rows with windows overlapping by ``burn_in = K // 4`` (K = 1:
a per-row model); ``stateful``: windows of ``--stateful-window`` rows with the state carried
through each session (truncated back-propagation). Prints a table and one JSON line.

    python bench/context.py --cache CACHE --config alphamodel/configs/synth-quiet-cpu.json \\
        [--contexts 1,16,64,256,stateful] [--set folds=1] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evaluate import model_options, train_options  # noqa: E402

from alphamodel.config import read_config  # noqa: E402
from alphamodel.supervised.config import TrainConfig  # noqa: E402
from alphamodel.supervised.train import train  # noqa: E402


def setting(name: str, base: TrainConfig, stateful_window: int) -> dict:
    """The ``train`` keys of one context setting, laid over the configured ``base``."""
    if name == "stateful":
        return dict(context="stateful", window=stateful_window, burn_in=min(base.burn_in, stateful_window // 4))
    k = int(name)
    # the same number of positions per scoring batch for every K (K = 1 would otherwise crawl)
    eb = max(base.eval_batch_size, 16384 // k)
    return dict(context="window", window=k, burn_in=k // 4, eval_batch_size=eb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--config", help="JSON {model: {...}, train: {...}}")
    ap.add_argument("--contexts", default="1,16,64,256,stateful")
    ap.add_argument("--stateful-window", dest="stateful_window", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--set", action="append", default=[], help="train key=value (JSON value), repeatable")
    ap.add_argument("--work", default="bench-context")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    options = train_options(args.device, args.set)
    base = read_config(args.config, options)[1]
    results, ref = [], {}
    for i, name in enumerate(args.contexts.split(",")):
        change = setting(name, base, args.stateful_window)
        if i:
            change["baselines"] = []
        mc, tc = read_config(args.config, {**options, **change})
        mc = model_options(mc, args.set)
        t0 = time.perf_counter()
        s = train(args.cache, Path(args.work) / f"ctx-{name}", mc, tc, progress=False)
        recs = {r["horizon"]: r for r in s["evaluation"] if r["fold"] == "all" and r["model"] == "alphamodel"}
        if i == 0:
            for h in s["horizons"]:
                if h["best_baseline"]:
                    r = next(r for r in s["evaluation"] if r["fold"] == "all" and r["horizon"] == h["horizon"]
                             and r["model"] == h["best_baseline"])
                    ref[h["horizon"]] = r
        results.append({"context": name, "window": tc.window, "seconds": time.perf_counter() - t0,
                        "auc": {h: [r["auc"], r["auc_ci_low"], r["auc_ci_high"]] for h, r in recs.items()}})
    hs = sorted(ref or results[0]["auc"])

    def f(v: list) -> str:
        return "n/a" if v[0] is None else f"{v[0]:.3f} [{v[1]:.3f},{v[2]:.3f}]"

    print(f"context ablation on {args.cache}: pooled test AUC [95% session-bootstrap interval]")
    print(f"{'context':>10} {'K':>4} " + " ".join(f"{'h=' + str(h):>21}" for h in hs) + f" {'seconds':>8}")
    for r in results:
        print(f"{r['context']:>10} {r['window']:>4} " + " ".join(f"{f(r['auc'][h]):>21}" for h in hs)
              + f" {r['seconds']:>8.0f}")
    if ref:
        print(f"{'best base':>10} {'':>4} " + " ".join(
            f"{f([ref[h]['auc'], ref[h]['auc_ci_low'], ref[h]['auc_ci_high']]):>21}" for h in hs)
            + "  (" + ", ".join(f"h={h}: {ref[h]['model']}" for h in hs) + ")")
    print(json.dumps({"bench": "context", "cache": args.cache, "results": results,
                      "best_baseline": {h: {k: ref[h][k] for k in ("model", "auc", "auc_ci_low", "auc_ci_high")}
                                        for h in ref}}))


if __name__ == "__main__":
    main()
