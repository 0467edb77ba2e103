"""``alphamodel``: train Mamba2 -> CfC -> multi-horizon heads on an alphafeat cache.

Subcommands
    train     walk-forward folds over sessions (purged, embargo); per-horizon AUC of the model and
              of its baselines (base rate, logistic regression, LightGBM, MLP, the generator's
              ceiling) on the same rows, with session-bootstrap 95% intervals
    backtest  a C51 trading policy on the encoder, walk-forward over sessions, per cost level,
              beside baselines (flat, long, OFI sign, logistic, direction heads)
    embed     per-row embeddings of a trained model, written beside the cache

``alphamodel train`` with no ``--cache`` builds the cache of the embedded default sample under
``OUT/cache`` (if absent) and trains a tiny model on it (about 15-60 s on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from alphafeat.commandline import Parser, add_command, console, option, run, stdout_console, verbose_parent
from alphafeat.errors import AlphafeatError, InputError
from alphafeat.options import add_options, given
from alphafeat.validation import Device, validate_enum, validate_path
from alphamodel.backtest.config import BacktestConfig
from alphamodel.errors import AlphamodelError
from alphamodel.supervised.config import TrainConfig


def _default_cache(out: Path, quiet: bool) -> Path:
    from alphafeat.cache import is_cache, read_manifest
    from alphafeat.precompute import DEFAULT_DATA_DIR, PrecomputeConfig, precompute

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


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise AlphamodelError("alphamodel needs PyTorch, which is not installed: pip install -e '.[model]' (without "
                              "a GPU, the CPU wheel first, as README.md's test command: pip install "
                              "'torch==2.13.0+cpu' --index-url https://download.pytorch.org/whl/cpu)") from e


def _train(args: argparse.Namespace) -> int:
    _need_torch()
    from alphamodel.config import read_config
    from alphamodel.errors import ConfigError, UsageError
    from alphamodel.supervised.checkpoint import check_device, resolve_device
    from alphamodel.supervised.train import train

    mc, tc = read_config(args.config, given(TrainConfig, args))  # ConfigError names the file and the key
    try:
        check_device(mc, resolve_device(tc.device))  # before a default cache is built
    except UsageError as e:  # cfc_impl comes from the config file
        raise ConfigError(args.config, e.option, e.problem) from None
    cache = args.cache or _default_cache(args.out, args.quiet)
    s = train(cache, args.out, mc, tc, progress=not args.quiet)

    print_summary(s)
    _say_replaced(args.out, s)
    return 0


def print_summary(s: dict) -> None:
    """The pooled test table of a ``summary.json``: the model and each baseline per horizon with
    95% session-bootstrap intervals, the generator's ceiling, and the lift over the best baseline."""
    models = []
    for r in s["evaluation"]:
        if r["fold"] == "all" and r["model"] not in models:
            models.append(r["model"])
    folds = len(s["folds"])
    unit = next((r["bootstrap_unit"] for r in s["evaluation"] if r["fold"] == "all" and r.get("bootstrap_unit")),
                "session")
    t = Table(title=f"alphamodel train -> {s['out']}: test blocks of {folds} walk-forward fold(s) pooled, "
                    f"{s['rows']['test_pooled']:,} rows; AUC with its 95% bootstrap interval, resampling by "
                    f"{unit}")
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
    con = stdout_console()
    con.print(t)
    needs = [(h["horizon"], h["sessions_needed"]) for h in s["horizons"] if h.get("sessions_needed") is not None]
    if needs:
        n_test = s.get("test_sessions", "?")
        con.print(f"sessions a result needs: the lift's 95% interval over {n_test} test session(s) excludes 0 at about "
                  + ", ".join(f"h{h}: " + ("never (centred on 0)" if v == float("inf") else "met" if
                                           isinstance(n_test, int) and v <= n_test else f"{v:,.0f}")
                              for h, v in needs)
                  + " sessions (its half-width shrinks as 1/sqrt(sessions))"
                  + ("" if unit == "session" else f"; the intervals resample by {unit}, too narrow, so these "
                     "counts are too low"), markup=False)
    if s.get("ceiling_note"):
        con.print(s["ceiling_note"], markup=False, soft_wrap=True)
    for w in s.get("warnings", []):
        console.print(f"warning: {w}", markup=False)  # plain text (pip extras in [] are not markup)
    con.print(f"context {s['context']}; last fold: best epoch {s['best_epoch']} of {s['epochs_run']}; "
                    f"{s['parameters']:,} parameters; {s['device']}; {s['seconds']:.1f} s; summary.json, loss.png, "
                    "auc.png, model.safetensors, config.json written")


def _cell(x: float | None, d: int = 2, sd: float | None = None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.{d}f}" + (f" +- {sd:.{d}f}" if sd is not None else "")


def _pbo_lines(s: dict, con) -> None:
    """The summary's PBO per fill mode and cost, one line each."""
    for mode, by_cost in s.get("pbo", {}).items():
        for c, p in by_cost.items():
            if p.get("pbo") is not None:
                con.print(f"PBO at cost {c}, {mode} fills: {p['pbo']:.2f} over {p['trials']} strategies x "
                          f"{p['sessions']} test sessions ({p['splits']} CSCV splits of {p['blocks']} blocks; 0.5 = no "
                          "better than chance)", markup=False)
            else:
                con.print(f"PBO at cost {c}, {mode} fills: n/a ({p.get('note', '')})", markup=False)


def _head_lines(s: dict, con) -> None:
    """The K=3 trade-outcome head per fold and its verdict."""
    for a in s["aux_head"]:
        if a.get("available"):
            lo, hi = a["balanced_accuracy_ci"]
            con.print(f"fold {a['fold']}: K=3 trade-outcome head accuracy {a['test_accuracy']:.3f}, balanced "
                      f"{a['test_balanced_accuracy']:.3f} [{lo:.3f}, {hi:.3f}] vs chance 0.333, majority rate "
                      f"{a['test_majority_rate']:.3f} ({a['test_decisions']} test decisions; train "
                      f"balance stop/timeout/profit {', '.join(f'{x:.2f}' for x in a['train_balance'])})")
    head = s.get("aux_head_verdict", {})
    if head.get("available"):
        con.print(f"K=3 head over folds {head['folds']}: {head['note']}", markup=False)


def _pooled_cells(p: dict) -> list[str]:
    """PnL per session, its interval and the sessions the interval needs, of a pooled row."""
    ci = p.get("pnl_ci") or [None, None]
    pnl = "n/a" if p.get("pnl_per_session") is None else f"{p['pnl_per_session']:.2f}"
    ci_s = f"[{ci[0]:.1f}, {ci[1]:.1f}]" if ci[0] is not None else "n/a"
    need = p.get("sessions_needed")
    need_s = "n/a" if need is None else ("never (0)" if need == float("inf") else
                                         "met" if need <= p.get("sessions", 0) else f"{need:,.0f}")
    return [pnl, ci_s, need_s]


def print_backtest(s: dict) -> None:
    """The table of a backtest's ``summary.json``: per strategy x fill mode x cost the PnL per
    session pooled over every test session with its 95% interval and the sessions that interval
    needs, the Sharpe over the folds with enough test sessions (mean +- SD), the DSR, the trading
    counts and, beyond ``taker``, the fill statistics; the header names the fill modes
    (``config.fills``) and the cost unit, the line below it what a fill pays in each mode."""
    fills = list(s["config"].get("fills", ["taker"]))
    k, n, m = s.get("folds_reporting_sharpe", len(s["folds"])), len(s["folds"]), s.get("min_sharpe_sessions", 0)
    t = Table(title=f"alphamodel backtest -> {s['out']}\nfills: {', '.join(fills)}; cost in ticks per contract per "
                    f"side (1 tick = {s['tick_value_usd']:g} USD); PnL per session (ticks) pooled over "
                    f"{s.get('test_sessions', '?')} test sessions of {n} folds with its 95% bootstrap interval; Sharpe "
                    f"over the {k} of {n} folds with >= {m} test sessions (mean +- SD)", caption=s["notes"]["fills"])
    cols = ["strategy", "fill", "cost", "PnL/session", "95% interval", "sessions needed", "Sharpe (ann.)", "DSR",
            "win rate", "trades/sess", "turnover/sess", "max DD"]
    if fills != ["taker"]:
        cols += ["fill rate", "rows to fill", "markout +1/+10/+100"]
    for col in cols:
        t.add_column(col, justify="right", no_wrap=True)
    pooled = {(p["strategy"], p.get("fill", "taker"), p["cost_ticks"]): p for p in s.get("pooled", [])}

    def g(row: dict, x: str, d: int = 2) -> str:
        a = row.get(f"fill_{x}_mean")
        return "n/a" if a is None else f"{a:.{d}f}"

    for r in s["aggregate"]:
        fill = r.get("fill", "taker")
        cells = [_cell(r[x + "_mean"], d, r[x + "_sd"]) for x, d in (
            ("sharpe", 2), ("deflated_sharpe", 2), ("win_rate", 2), ("trades_per_session", 1), ("turnover", 1),
            ("max_drawdown", 1))]
        if fills != ["taker"]:
            cells += [g(r, "fill_rate"), g(r, "ttf_rows", 1), "/".join(g(r, f"markout_{h}") for h in (1, 10, 100))]
        t.add_row(r["strategy"], fill + (" (bound)" if fill == "mid" else ""), f"{r['cost_ticks']:g}",
                  *_pooled_cells(pooled.get((r["strategy"], fill, r["cost_ticks"]), {})), *cells)
    Console(width=max(Console().width, 160 if fills == ["taker"] else 220)).print(t)
    c = s["config"]
    if c.get("fee_maker") or c.get("fee_taker"):
        tv = s["tick_value_usd"]
        console.print(f"fees: maker {c['fee_maker']:g} USD = {c['fee_maker'] / tv:.4g} ticks, taker {c['fee_taker']:g} "
                      f"USD = {c['fee_taker'] / tv:.4g} ticks per contract per side", markup=False, soft_wrap=True)
    console.print(f"Sharpe: {s['notes']['sharpe']}; DSR: {s['notes']['deflated_sharpe']}; sessions needed: for the "
                  "PnL interval to exclude 0 (its half-width shrinks as 1/sqrt(sessions))", soft_wrap=True,
                  markup=False)
    con = stdout_console()
    _pbo_lines(s, con)
    _head_lines(s, con)


#: ``alphamodel backtest`` options that set a BacktestConfig key of the same name.
_BACKTEST_OPTIONS = ("folds", "embargo", "costs", "stride", "envs", "policy_steps", "device", "seed", "fills", "queue",
                     "latency_ns", "timeout", "on_timeout", "fee_maker", "fee_taker")


def _backtest(args: argparse.Namespace) -> int:
    _need_torch()
    from alphamodel.backtest import backtest
    from alphamodel.config import read_backtest_config

    cfg = read_backtest_config(args.config, given(BacktestConfig, args))  # ConfigError names the file and the key
    out = args.out
    if not args.cache and cfg.folds:  # refused before the embedded sample's cache is built
        from alphafeat.plan import make_plan
        from alphafeat.precompute import DEFAULT_DATA_DIR
        from alphamodel.backtest.walkforward import check_fold_count

        if DEFAULT_DATA_DIR.is_dir():
            check_fold_count(len({seg.session for seg in make_plan([DEFAULT_DATA_DIR]).segments}), cfg.folds,
                             cfg.embargo)
    cache = args.cache or _default_cache(out, args.quiet)
    if not args.quiet and not args.cache:
        from alphafeat.cache import read_manifest
        from alphamodel.backtest.walkforward import default_folds

        n = len(read_manifest(cache)["partitions"])
        k = cfg.folds or default_folds(n, cfg.embargo)
        console.print(f"embedded default sample: {n} sessions -> {k} walk-forward folds "
                      f"(expanding window, at least 2; the first session only trains)")
    s = backtest(cache, out, args.model, cfg, progress=not args.quiet)
    print_backtest(s)
    con = stdout_console()
    n_pbo = sum(1 for p in s["plots"] if p.startswith("pbo_"))
    con.print(f"{s['seconds']:.1f} s on {s['device']}; summary.json, {len(s['plots']) - n_pbo} equity PNGs, "
              f"{n_pbo} PBO logit PNGs, "
              "policy_fold*.safetensors + policy_config.json written. " + s["notes"]["oracle"])
    if "ofi_sign" in s["notes"]:
        con.print(s["notes"]["ofi_sign"])
    if "model" in s["notes"]:  # --model: whether the walk-forward is out of sample depends on it
        console.print(f"note: {s['notes']['model']}", soft_wrap=True, markup=False)
    _say_replaced(out, s)
    return 0


def _say_replaced(out: Path, s: dict) -> None:
    """The note of a run into a folder that held an earlier run's files (train and backtest)."""
    if s.get("replaced"):
        console.print(f"note: {out}: replaced the earlier run's {', '.join(s['replaced'])}", soft_wrap=True,
                      markup=False)  # fmt: skip
    if s.get("left_from_earlier"):
        console.print(f"note: {out}: left in place from an earlier run, not part of this one: "
                      f"{', '.join(s['left_from_earlier'])}", soft_wrap=True, markup=False)  # fmt: skip


def _embed(args: argparse.Namespace) -> int:
    _need_torch()
    from alphamodel.supervised.embed import write_embeddings

    path = write_embeddings(args.cache, args.model, args.out, args.device)
    stdout_console().print(f"embeddings written to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``alphamodel`` argument parser; option values are checked by :mod:`alphafeat.validation`,
    train's and backtest's as the fields of :class:`~alphamodel.supervised.config.TrainConfig` and
    :class:`~alphamodel.backtest.config.BacktestConfig` declare them (:mod:`alphafeat.options`)."""
    ap = Parser(prog="alphamodel", description="Train Mamba2 -> CfC -> multi-horizon heads on an alphafeat cache, "
                "and backtest a C51 trading policy on it. 'alphamodel train' with no --cache builds the cache of "
                "the embedded default sample under OUT/cache (if absent) and trains a tiny model on it (about "
                "15-60 s on 2 CPU cores).")  # fmt: skip
    ap.add_argument("-v", "--verbose", action="store_true", help="info logging; tracebacks of errors")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = add_command(sub, "train", "walk-forward folds over sessions (purged, embargo): per-horizon AUC of the "
                    "model and of its baselines on the same rows, with session-bootstrap 95%% intervals",
                    parents=[verbose_parent("info logging; tracebacks of errors")])
    path = option(validate_path)
    p.add_argument("--cache", type=path,
                   help="cache directory (default: build one from the embedded sample under OUT/cache)")
    p.add_argument("--out", default="out", type=path, help="output directory (default: ./out)")
    add_options(p, TrainConfig, defaults=False)  # each declared once, on its field; not given: the config's
    p.add_argument("--config", type=path, help="JSON file: {\"model\": {...ModelConfig}, \"train\": {...TrainConfig}}")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_train, prog=p.prog)

    b = add_command(sub, "backtest", "a C51 trading policy on the encoder, walk-forward over sessions, per cost "
                    "level, beside baselines (flat, long, OFI sign, logistic, direction heads)",
                    parents=[verbose_parent("info logging; tracebacks of errors")])
    b.add_argument("--cache", type=path,
                   help="cache directory (default: build one from the embedded sample under OUT/cache)")
    b.add_argument("--model", type=path, help="an `alphamodel train` output directory (default: train a small "
                                              "encoder per fold on its training sessions)")
    b.add_argument("--out", default="out-backtest", type=path, help="output directory (default: ./out-backtest)")
    add_options(b, BacktestConfig, defaults=False)  # each declared once, on its field; not given: the config's
    b.add_argument("--config", type=path, help="JSON file of BacktestConfig keys (with 'c51': {...C51Config keys})")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    b.set_defaults(func=_backtest, prog=b.prog)

    e = add_command(sub, "embed", "write per-row embeddings of a trained model beside the cache",
                    parents=[verbose_parent("info logging; tracebacks of errors")])
    e.add_argument("cache", type=path, help="cache directory")
    e.add_argument("--model", required=True, type=path, help="an `alphamodel train` output directory")
    e.add_argument("--out", type=path, help="output directory (default: CACHE-embeddings beside the cache)")
    e.add_argument("--device", default=Device.CPU, type=option(validate_enum, enum=Device),
                   metavar="{" + ",".join(Device) + "}", help="where the model runs (default: cpu)")
    e.set_defaults(func=_embed, prog=e.prog)
    return ap


def config_sections() -> list[tuple[str, type, str]]:
    """The config files' sections for ``docs/cli.md`` (:func:`alphafeat.options.reference`):
    ``(title, config class, note)``. Imports the model's module (torch)."""
    from alphamodel.nn.model import ModelConfig
    from alphamodel.rl.config import C51Config

    return [("`alphamodel train --config FILE`: `model`", ModelConfig,
             'The object `{"model": {...}, "train": {...}}`; either may be left out.'),
            ("`alphamodel train --config FILE`: `train`", TrainConfig,
             "The command line's options are laid over the file's."),
            ("`alphamodel backtest --config FILE`", BacktestConfig,
             "One object of these keys; `c51` an object of the keys below. The command line's options are laid "
             "over the file's."),
            ("`alphamodel backtest --config FILE`: `c51`", C51Config, "")]


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for a usage error, 1 for a data error; one line)."""
    return run(build_parser, argv, verbose_level=logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
