"""The oracle on a generated cache: PnL of trading on the true expected mid change over the
holding period (the planted-signal sidecar's ``drift_K``, K = the stride), per stride x fee x
fill mode (``--fills``: taker pays the spread, mid fills at the mid, an upper bound; passive rests
post-only behind the queue, the backtest's defaults) — what a signal strength leaves to a
perfect-knowledge trader.

For each stride, fee and fill: PnL per session (ticks, mean over the sessions), the daily
Sharpe and the PSR (:func:`alphamodel.backtest.metrics.sharpe_stats`) of ``oracle`` (sign of
drift_K), ``oracle-m0.5`` (only where |drift_K| >= 0.5 tick) and ``oracle-band`` (hysteresis:
enter beyond the round trip of the mode and fee, leave when drift_K turns against the position;
:func:`alphamodel.backtest.strategies.oracle_band`), every session a test session (nothing is
trained). Prints a table and one JSON line.

    python bench/oracle.py --cache DIR [--strides 10,50,200] [--costs 0,0.25] [--fills taker,mid,passive]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from alphafeat.validation import validate_costs
from alphamodel.backtest.config import ORACLE_BAND, ORACLE_MARGINS, ORACLE_NAMES, BacktestConfig, validate_fills
from alphamodel.backtest.market import load_market, planted_drift_rows
from alphamodel.backtest.metrics import sharpe_stats
from alphamodel.backtest.strategies import evaluate, oracle_band, rule
from alphamodel.data.cache import CacheData
from alphamodel.errors import AlphamodelError


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True)
    ap.add_argument("--strides", default="10,50,200")
    ap.add_argument("--costs", default="0,0.25")
    ap.add_argument("--fills", default="taker,mid", help="fill modes, comma-separated: taker, mid, passive")
    a = ap.parse_args()
    try:
        data = CacheData.open(a.cache)
    except AlphamodelError as e:
        raise SystemExit(str(e)) from None
    costs = validate_costs(a.costs, "--costs")
    fills = validate_fills(a.fills, "--fills")
    market = load_market(data, BacktestConfig(fills=fills, kelly=False), torch.device("cpu"))[0]
    tab = Table(title=f"oracle on {a.cache} ({len(data.segments)} sessions, every one a test session)")
    for c in ("stride", "K", "fill", "fee ticks/side", "strategy", "PnL/session", "trades/session", "daily Sharpe",
              "annual Sharpe", "PSR"):
        tab.add_column(c, justify="right")
    rows = []
    for stride in (int(x) for x in a.strides.split(",")):
        drift, k, _ = planted_drift_rows(data, stride)
        if k is None:
            raise SystemExit(f"{a.cache}: no oracle to report: no planted-signal sidecar (drift_K) beside its sources; "
                             "generate them with `alphafeat synth --signal-file`")
        d = torch.as_tensor(np.nan_to_num(drift), dtype=torch.float32)
        strategies = {n: rule(torch.where(d > m, 1.0, torch.where(d < -m, -1.0, 0.0)))
                      for n, m in zip(ORACLE_NAMES, ORACLE_MARGINS)}
        for fill in fills:
            cfg = BacktestConfig(stride=stride, fills=fills, costs=costs)
            band = {ORACLE_BAND: oracle_band(drift, market, cfg, fill)}
            ev = evaluate(strategies | band, market, np.arange(len(data.segments)), costs, cfg, fill)
            for (name, cost), r in ev.items():
                st = sharpe_stats(r["daily"])
                rows.append({"stride": stride, "k": k, "fill": fill, "cost_ticks": cost, "strategy": name,
                             "pnl_per_session": float(r["daily"].mean()), "sharpe_daily": st["sharpe_daily"],
                             "sharpe": st["sharpe"], "psr": st["psr"],
                             "trades_per_session": float(r["entries"].mean())})
                tab.add_row(str(stride), str(k), fill, f"{cost:g}", name, f"{r['daily'].mean():.1f}",
                            f"{r['entries'].mean():.1f}", f"{st['sharpe_daily']:.2f}", f"{st['sharpe']:.1f}",
                            f"{st['psr']:.3f}")
    Console(width=140).print(tab)
    print(json.dumps({"bench": "oracle", "cache": a.cache, "sessions": len(data.segments), "rows": rows}))


if __name__ == "__main__":
    main()
