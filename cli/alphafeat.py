"""``alphafeat``: the data-engineering command line.

Subcommands
    precompute   DBN files -> features and labels -> Arrow cache (the main job)
    synth        write synthetic ES DBN files (the embedded default sample and test data)
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from alphafeat.errors import AlphafeatError

console = Console(stderr=True)


def _precompute(args: argparse.Namespace) -> int:
    from alphafeat.instruments import InstrumentMode
    from alphafeat.pipeline import DEFAULT_DATA_DIR, PrecomputeConfig, precompute

    if args.input:
        inputs = [Path(p) for p in args.input]
    else:
        if not DEFAULT_DATA_DIR.is_dir():
            raise AlphafeatError(
                f"{DEFAULT_DATA_DIR}: the embedded default sample is missing; pass --input PATH "
                "(or run `alphafeat synth --default` in a source checkout)"
            )
        inputs = [DEFAULT_DATA_DIR]
    horizons = tuple(int(h) for h in args.horizons.split(",")) if args.horizons else None
    cfg = PrecomputeConfig(
        inputs=inputs,
        out=Path(args.out),
        instrument_mode=InstrumentMode.parse(args.instrument_mode),
        root=args.root,
        device=args.device,
    )
    if horizons:
        cfg.horizons = horizons
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=False, disable=args.quiet,
    ) as progress:
        s = precompute(cfg, progress=progress)

    out = Console()
    sched = Table(title="instrument per session")
    for col in ("session", "instrument_id", "raw_symbol", "expiration", "reason"):
        sched.add_column(col)
    for c in s.schedule:
        sched.add_row(c.session.isoformat(), str(c.instrument_id), c.raw_symbol,
                      c.expiration.isoformat() if c.expiration else "", c.reason)
    out.print(sched)
    t = Table(title=f"alphafeat precompute -> {s.out}")
    cols = ("files", "records read", "snapshots", "snapshots kept", "rows written", "partitions (current)",
            "device", "seconds")
    for col in cols:
        t.add_column(col, justify="right")
    t.add_row(str(s.files), f"{s.records:,}", f"{s.snapshots:,}", f"{s.snapshots_kept:,}",
              f"{s.rows:,}", f"{len(s.partitions)} ({s.partitions_skipped})", s.device, f"{s.seconds:.1f}")
    out.print(t)
    for note in s.notes:
        out.print(f"note: {note}")
    return 0


def _synth(args: argparse.Namespace) -> int:
    from alphafeat import synth
    from alphafeat.pipeline import DEFAULT_DATA_DIR

    if args.default:
        out = Path(args.out) if args.out else DEFAULT_DATA_DIR
        paths = synth.make_default_sample(out)
    else:
        if not args.out or not args.start:
            raise AlphafeatError("alphafeat synth: --start and --out are required (or --default)")
        try:
            start = dt.date.fromisoformat(args.start)
        except ValueError as e:
            raise AlphafeatError(f"--start: expected YYYY-MM-DD, got {args.start!r}") from e
        paths = synth.generate(
            Path(args.out), start=start, sessions=args.sessions, seed=args.seed,
            schemas=tuple(s.strip() for s in args.schemas.split(",")), scale=args.scale,
        )
    for p in paths:
        print(p)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from alphafeat.inspection import inspect_cache

    plots = Path(args.plots) if args.plots else Path(args.cache) / "_plots"
    rep = inspect_cache(args.cache, None if args.no_plots else plots)
    out = Console()
    t = Table(title=f"rows per session: {args.cache}")
    for col in ("session", "raw_symbol", "rows"):
        t.add_column(col, justify="right")
    for s, y, n in rep.rows:
        t.add_row(s, y, f"{n:,}")
    out.print(t)
    t = Table(title="NaN rate per column (float columns with any NaN)")
    t.add_column("column")
    t.add_column("NaN rate", justify="right")
    for k, v in rep.nan_rate.items():
        if v > 0:
            t.add_row(k, f"{v:.2%}")
    out.print(t)
    t = Table(title="label balance")
    for col in ("label", "up / +1", "down / -1", "NaN"):
        t.add_column(col, justify="right")
    for k, (u, d, n) in rep.label_balance.items():
        t.add_row(k, f"{u:.1%}", f"{d:.1%}", f"{n:.1%}")
    out.print(t)
    for p in rep.plots:
        out.print(f"plot: {p}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``alphafeat`` argument parser."""
    ap = argparse.ArgumentParser(prog="alphafeat", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("precompute", help="DBN -> features and labels -> Arrow cache")
    p.add_argument("--instrument-mode", default="front-month",
                   help="all | id=N | front-month (default: front-month)")
    p.add_argument("--input", nargs="+", action="extend", metavar="PATH",
                   help="DBN files or directories (default: the embedded sample in data/)")
    p.add_argument("--out", default="cache", help="cache directory (default: ./cache)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--root", default="ES", help="product root for front-month (default: ES)")
    p.add_argument("--horizons", default=None,
                   help="label horizons in snapshots, comma-separated (default: 30,100,300,1000,6000)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_precompute)

    s = sub.add_parser("synth", help="write synthetic ES DBN v3 files")
    s.add_argument("--default", action="store_true",
                   help="write the embedded default sample (into data/ unless --out)")
    s.add_argument("--start", help="first trade date, YYYY-MM-DD")
    s.add_argument("--sessions", type=int, default=1)
    s.add_argument("--out", help="output directory")
    s.add_argument("--schemas", default="mbp-10,trades")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--scale", default="quiet", choices=("quiet", "normal", "busy"))
    s.set_defaults(func=_synth)
    i = sub.add_parser("inspect", help="rows, NaN rates and label balance of a cache, and PNG plots")
    i.add_argument("cache", help="cache directory written by precompute")
    i.add_argument("--plots", default=None, help="where to write PNG plots (default: CACHE/_plots)")
    i.add_argument("--no-plots", action="store_true", help="tables only")
    i.set_defaults(func=_inspect)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (1 on a user error, printed as one line)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    try:
        return args.func(args)
    except AlphafeatError as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        console.print("interrupted; no partial cache was left behind")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
