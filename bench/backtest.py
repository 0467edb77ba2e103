"""Walk-forward backtest table on generated markets: folds x costs, C51 beside baselines.

Generates ``--sessions`` synthetic ES sessions (:func:`alphafeat.synth.generate`, seeded),
builds their front-month cache (:func:`alphafeat.precompute.precompute`), then runs
:func:`alphamodel.backtest.backtest` (an encoder trained per fold on its training sessions,
the C51 policy, baselines, every cost level) and prints the aggregate table (mean +- SD
across folds per strategy and cost), the per-fold Sharpe table and one JSON line with the
tidy results. ``--cache`` skips the generation. Times are wall seconds of each public call.

The generator writes its planted signal beside the DBN files (``signal_file=True``), so the
table has the ``oracle`` strategies (the true model's p_up, no look-ahead) beside ``hindsight``
(look-ahead sign of the next stride's move, a looser upper bound).

``--signal`` / ``--signal-kind`` set the generated market's planted signal (the tradable market
of the tests and benches: ``--signal-kind history --signal 64``, :data:`alphafeat.synth.TRADABLE_SIGNAL`);
``--config JSON`` sets further :class:`~alphamodel.backtest.BacktestConfig` keys (e.g.
``'{"reward_scale": 4, "kelly": false}'``; the options win where both set a key).

    python bench/backtest.py [--sessions 22] [--folds 4] [--device cuda] [--fill taker,mid,passive] [--work DIR]
    python bench/backtest.py --cache DIR [--folds 4] [--config '{"reward_scale": 4}'] ...
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from alphafeat.validation import validate_costs
from alphamodel.backtest import BacktestConfig, backtest
from alphamodel.backtest.config import validate_fills
from alphamodel.cli import print_backtest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=22)
    ap.add_argument("--scale", default="quiet", choices=("quiet", "normal", "busy", "full"))
    ap.add_argument("--cache", help="an existing cache (skips generation)")
    ap.add_argument("--work", help="directory for the generated data, cache and outputs (default: a temp dir)")
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--embargo", type=int, default=1)
    ap.add_argument("--costs", default="0,0.0625,0.125,0.25,0.5")
    ap.add_argument("--stride", type=int, default=200)
    ap.add_argument("--envs", type=int, default=256)
    ap.add_argument("--policy-steps", type=int, default=1500)
    ap.add_argument("--encoder-epochs", type=int, default=4)
    ap.add_argument("--encoder-steps", type=int, default=40)
    ap.add_argument("--fine-tune", action="store_true")
    ap.add_argument("--fill", default="taker", help="fill modes, comma-separated (taker,mid,passive)")
    ap.add_argument("--no-signal-file", action="store_true",
                    help="generate without the planted-signal sidecar (no oracle; its Monte-Carlo drift is most of "
                         "the generation's time)")
    ap.add_argument("--signal", type=float, default=1.0, help="planted signal strength of the generated market")
    ap.add_argument("--signal-kind", default="both", choices=("book", "history", "both"))
    ap.add_argument("--config", default="{}", help="JSON object of further BacktestConfig keys")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    try:
        extra = json.loads(a.config)
    except ValueError as e:
        ap.error(f"--config: not a JSON object ({e})")
    if not isinstance(extra, dict):
        ap.error("--config: not a JSON object")
    work = Path(a.work or tempfile.mkdtemp(prefix="alphamodel-backtest-"))
    work.mkdir(parents=True, exist_ok=True)
    times = {}
    cache = Path(a.cache) if a.cache else work / "cache"
    if not a.cache:
        from alphafeat import synth
        from alphafeat.precompute import PrecomputeConfig, precompute

        t = time.perf_counter()
        # one process per session: the sidecar's drift_K is a Monte-Carlo per event (its cost:
        # docs/performance.md, Backtest)
        synth.generate(work / "dbn", start=datetime.date(2024, 1, 8), sessions=a.sessions, seed=a.seed,
                       scale=a.scale, report=False, signal_file=not a.no_signal_file, signal=a.signal,
                       signal_kind=a.signal_kind,
                       jobs=max(1, min(a.sessions, os.cpu_count() or 1)))
        times["generate_s"] = time.perf_counter() - t
        t = time.perf_counter()
        precompute(PrecomputeConfig(inputs=[work / "dbn"], out=cache, device="cpu"))
        times["precompute_s"] = time.perf_counter() - t
    cfg = BacktestConfig.from_dict({**extra, **dict(
        folds=a.folds, embargo=a.embargo, costs=validate_costs(a.costs, "--costs"), stride=a.stride, envs=a.envs,
        policy_steps=a.policy_steps, fine_tune=a.fine_tune, encoder_epochs=a.encoder_epochs,
        encoder_steps=a.encoder_steps, device=a.device, seed=a.seed, fills=validate_fills(a.fill, "--fill"))})
    t = time.perf_counter()
    s = backtest(cache, work / "out", None, cfg, progress=True)
    times["backtest_s"] = time.perf_counter() - t

    def f(x, d=2):
        return "n/a" if x is None else f"{x:.{d}f}"

    print_backtest(s)  # the terminal table of `alphamodel backtest`: fill mode, pooled PnL, PBO, K=3 verdict
    con = Console(width=160)
    per = Table(title="annualised Sharpe per fold (rows: strategy, fill @ cost)")
    per.add_column("strategy, fill @ cost")
    for k in range(len(s["folds"])):
        per.add_column(f"fold {k} ({', '.join(s['folds'][k]['test_sessions'])})", justify="right")
    for r in s["aggregate"]:  # one row per strategy x fill mode x cost
        rs = {x["fold"]: x["sharpe"] for x in s["results"] if x["strategy"] == r["strategy"]
              and x["cost_ticks"] == r["cost_ticks"] and x["fill"] == r["fill"]}
        per.add_row(f"{r['strategy']}, {r['fill']} @ {r['cost_ticks']:g}",
                    *(f(rs.get(k)) for k in range(len(s["folds"]))))
    con.print(per)
    for x in s["aux_head"]:
        if x.get("available"):
            con.print(f"fold {x['fold']}: trade-outcome head accuracy {x['test_accuracy']:.3f}, balanced "
                      f"{x['test_balanced_accuracy']:.3f}, majority rate {x['test_majority_rate']:.3f}, predicted "
                      f"balance {', '.join(f'{v:.2f}' for v in x['test_predicted_balance'])}")
    con.print(f"oracle: {s['notes']['oracle']}")
    print(json.dumps({"bench": "backtest", "cache": str(cache), "sessions": len({d for f in s["folds"]
                      for d in f["train_sessions"] + f["test_sessions"]}), "times": times, "device": s["device"],
                      "config": s["config"], "results": s["results"], "pooled": s["pooled"], "pbo": s["pbo"],
                      "aux_head_verdict": s["aux_head_verdict"]}))


if __name__ == "__main__":
    main()
