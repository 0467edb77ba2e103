"""``alphafeat``: the data-engineering command line.

Subcommands
    precompute     DBN files -> features and labels -> Arrow cache (the main job)
    roll-schedule  the front-month contract per CME Globex session
    synth          synthetic ES DBN files (the embedded default sample, test data, benchmarks)
    features       the feature registry: name, unit, formula, source, parameters
    inspect        rows, NaN rates, label balance and PNG plots of a cache
    clean          remove a cache and its kept books
"""

from __future__ import annotations

import os

# numpy's and scipy's OpenBLAS (scipy loaded by numba) each start a thread per core that spins
# for a while: ~3 CPU-seconds per process on a 16-core host, in every worker. The pipeline does
# no linear algebra, so one BLAS thread (before numpy is imported; a value set by the user wins;
# worker processes inherit it).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from alphafeat import _command
from alphafeat import validation as val
from alphafeat.commandline import (
    Parser,
    add_command,
    console,
    end_process,
    option,
    progress_bar,
    run,
    stdout_console,
    verbose_parent,
)
from alphafeat.errors import InputError, UsageError

if TYPE_CHECKING:
    from rich.table import Table

_command.skip_blas_probe()  # in this process; in its worker processes: _precompute
_command.lean_kernel_loads()

_PATH = option(val.validate_path)
_JOBS = option(val.validate_jobs)


def _enum(enum: type) -> dict:
    """argparse keywords of an enum-valued option: checked by val.validate_enum, members in the help."""
    return {"type": option(val.validate_enum, enum=enum), "metavar": "{" + ",".join(enum) + "}"}


def _count(lo: int, what: str = "a whole number", hi: int | None = None) -> object:
    return option(val.validate_int, lo=lo, hi=hi, what=what)


def _table(*args: object, **kw: object) -> Table:
    """A ``rich.table.Table`` (imported here: not on the way to a job's first record)."""
    from rich.table import Table

    return Table(*args, **kw)


def _inputs(args: argparse.Namespace) -> list[Path]:
    """``--input`` paths, or the embedded default sample (precompute and roll-schedule alike)."""
    from alphafeat.precompute import DEFAULT_DATA_DIR

    if args.inputs:
        return list(args.inputs)
    if not DEFAULT_DATA_DIR.is_dir():
        raise InputError(DEFAULT_DATA_DIR, "the embedded default sample is missing; pass --input PATH "
                         "(or run `alphafeat synth --default` in a source checkout)")  # fmt: skip
    return [DEFAULT_DATA_DIR]


def _precompute(args: argparse.Namespace) -> int:
    from alphafeat.options import from_args
    from alphafeat.precompute import PrecomputeConfig, precompute
    from alphafeat.precompute.job import make_job

    cfg = from_args(PrecomputeConfig, args, inputs=_inputs(args))
    make_job(cfg, "cpu")  # every option checked before the progress bar starts: a bad one is one line
    workers = nullcontext()  # --jobs 1 starts none (and so does not import joblib: ~0.09 s)
    if cfg.jobs != 1:  # joblib's (loky) workers of the plan and the map: the BLAS probe skipped, ended with us
        import joblib

        workers = joblib.parallel_config("loky", initializer=_command.worker_start)
    with progress_bar(disable=args.quiet) as progress, workers:
        s = precompute(cfg, progress=progress)
    if getattr(args, "own_process", False):  # committed: a Ctrl-C now would only hide the summary
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    out = stdout_console()
    sched = _table(title="instrument per session")
    for col in ("session", "instrument_id", "raw_symbol", "schema", "expiration", "reason"):
        sched.add_column(col)
    have = {p.parent.name for p in s.partitions}  # session=YYYY-MM-DD
    why = " (a file skipped: below)" if s.skipped else ""
    for c in s.schedule:
        gone = f"session={c.session.isoformat()}" not in have  # its book file skipped, or no rows
        sched.add_row(c.session.isoformat(), str(c.instrument_id), c.raw_symbol,
                      s.schemas.get((c.session, c.instrument_id), ""), c.expiration.isoformat() if c.expiration else "",
                      c.reason + (f"; no partition this run{why}" if gone else ""))  # fmt: skip
    out.print(sched)
    t = _table(title=f"alphafeat precompute -> {s.out}", show_header=False)
    t.add_column("")
    t.add_column("", justify="right")
    stages = ", ".join(f"{k} {v:.1f}" for k, v in s.stage_seconds.items())
    for k, v in (("files", f"{s.files}"), ("book records (chosen contracts, their sessions)", f"{s.records:,}"),
                 ("rows (this run's sessions)", f"{s.rows:,}"),
                 ("partitions (already current)", f"{len(s.partitions)} ({s.partitions_skipped})"),
                 ("books from the predecoded folder", f"{s.books_predecoded}"),
                 ("predecoded folder (plan scans, kept books)", str(s.predecoded or "-")),
                 ("skipped files", f"{len(s.skipped)}"),
                 ("device", f"{s.device} ({s.device_reason})" if s.device_reason else s.device),
                 ("seconds", f"{s.seconds:.1f}"),
                 ("seconds per stage (summed over workers)", stages),
                 ("rows per second", f"{s.rows_per_second:,.0f}" if s.rows_computed else "- (nothing computed)"),
                 ("peak memory (largest process)", f"{s.peak_rss / 2**30:.2f} GiB"),
                 ("bytes per row in the cache", f"{s.bytes_per_row:.0f}" if s.cache_bytes else "-")):
        t.add_row(k, v)
    out.print(t)
    for note in s.notes:
        out.print(f"note: {note}", soft_wrap=True)
    for path, why in s.skipped:
        out.print(f"skipped: {path}: {why}", soft_wrap=True)
    return 0


@contextmanager
def _remove_if_left_empty(folder: Path, created: bool) -> Iterator[None]:
    """Remove ``folder`` when the block fails (or is interrupted) and this run created it and
    left it empty."""
    try:
        yield
    except BaseException:
        if created and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        raise


def _synth(args: argparse.Namespace) -> int:
    import json

    from alphafeat import synth
    from alphafeat.precompute import DEFAULT_DATA_DIR

    if args.report:
        return _synth_report(args)
    if args.default:
        out = args.out or DEFAULT_DATA_DIR
        paths = synth.make_default_sample(out)
    else:
        missing = [o for o, v in (("--start", args.start), ("--out", args.out)) if not v]
        if missing:
            raise UsageError(" and ".join(missing), "required (or --default / --report)")
        out = args.out
        from alphafeat.synth.calendar import trade_dates

        first = trade_dates(args.start, 1)[0]
        if first != args.start:
            console.print(f"note: --start {args.start} is a {args.start:%A}: the first session is {first} "
                          "(sessions are weekdays)", soft_wrap=True)
        sessions: list[dict] = []
        created = not Path(out).exists()
        from alphafeat.precompute.workers import not_compiled
        from alphafeat.synth.kernels import simulate

        if not_compiled(simulate):
            console.print("first use in this environment: numba compiles the generator's kernels once (~1 min)",
                          soft_wrap=True)  # fmt: skip
        with progress_bar() as progress, _remove_if_left_empty(Path(out), created):
            task = progress.add_task("sessions", total=args.sessions)
            paths = synth.generate(
                out, start=args.start, sessions=args.sessions, seed=args.seed, schemas=args.schemas,
                scale=args.scale, jobs=args.jobs, zstd_level=args.zstd_level, signal=args.signal,
                signal_kind=args.signal_kind, signal_file=args.signal_file,
                progress=lambda k: progress.advance(task, k), summary=sessions,
            )
        paths += [Path(s["signal_file"]) for s in sessions if "signal_file" in s]  # --signal-file's sidecars
    for p in paths:
        print(p)
    rep = out / synth.REPORT_NAME
    if rep.is_file():
        r = json.loads(rep.read_text())
        wrote = "MBO records" if "mbp-10" not in args.schemas else \
            f"MBO records, {r['mbp10_records']:,} MBP-10 records from them"  # fmt: skip
        print(f"{r['mbo_records']:,} simulated {wrote}; report: {rep}")
        ci = r["auc_ceiling"].get("interval_95", {})
        print("AUC ceiling per label horizon (snapshots) of "
              f"{r['auc_ceiling']['instrument']} on {r['auc_ceiling']['session']}: "
              + ", ".join(f"h={h}: {v:.3f}" + (f" [{ci[h][0]:.3f}, {ci[h][1]:.3f}]" if h in ci else "")
                          for h, v in r["auc_ceiling"]["auc"].items()))
    return 0


def _synth_report(args: argparse.Namespace) -> int:
    """``alphafeat synth --report``: stylised facts of the default market beside the real ES files
    and the literature, and the book's shape beside the real ESH4 hour; the facts are added to
    ``<out>/synth-report.json`` (``data/`` unless --out) as ``stylised_facts``."""
    import json

    from alphafeat import synth
    from alphafeat.precompute import DEFAULT_DATA_DIR
    from alphafeat.synth import report
    from alphafeat.synth.generate import write_json

    real = args.real or Path(__file__).resolve().parents[1] / report.REAL_FILE
    if not real.is_file():
        raise InputError(real, "the real ESH4 MBO file is missing; pass --real PATH")
    sig = synth.Signal(args.signal, args.signal_kind)
    scale = max(synth.SCALES[str(args.scale)], synth.SCALES["normal"])
    with console.status("stylised facts: simulating and measuring sessions at scale "
                        f"{scale:g} and the AUC ceiling ..."):
        facts = report.stylised_facts(real, seed=args.seed or 1, signal=sig, scale=scale)
    t = _table(title=f"stylised facts: generated (scale {scale:g}, signal {sig.strength:g} {sig.kind}) vs real "
                    f"({real.name}) vs band")
    for col in ("figure", "generated", "real", "band", "verdict", "source"):
        t.add_column(col, justify="right" if col in ("generated", "real") else "left")
    for f in facts:
        t.add_row(f.name, f"{f.generated:.4g}", "" if f.real is None else f"{f.real:.4g}",
                  f"{f.band_low:.3g} - {f.band_high:.3g}", "pass" if f.passed else "FAIL", f.source)
    stdout_console().print(t)
    rows, notes = report.compare(real, seed=args.seed or 1)
    t = _table(title=f"book shape, synthetic vs real ({real.name}, first hour after the 17:00 CT open; "
                    f"synthetic scale {notes['scale']:.0f})")
    for col in ("statistic", "real", "synthetic", "tolerance", "verdict"):
        t.add_column(col, justify="left" if col == "statistic" else "right")
    for r in rows:
        t.add_row(r.name, f"{r.real:.4g}", f"{r.synth:.4g}", r.tolerance, "pass" if r.ok else "FAIL")
    stdout_console().print(t)
    out = args.out or DEFAULT_DATA_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / synth.REPORT_NAME
    rep = json.loads(path.read_text()) if path.is_file() else {}
    rep["stylised_facts"] = [f.record() for f in facts]
    rep["stylised_facts_setup"] = {
        "sessions": [d.isoformat() for d in report.FACT_DAYS], "scale": scale, "seed": args.seed or 1,
        "signal": sig.strength, "signal_kind": sig.kind, "real_file": real.name,
        "instrument": "the leading outright of each session (rebuilt from its MBO records)",
    }
    rep["book_shape_vs_real"] = [
        {"name": r.name, "real": r.real, "generated": r.synth, "tolerance": r.tolerance, "pass": r.ok} for r in rows
    ]
    write_json(path, rep)
    print(f"report: {path}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from alphafeat.inspection import inspect_cache

    plots = args.plots or args.cache / "_plots"
    rep = inspect_cache(args.cache, None if args.no_plots else plots)
    out = stdout_console()
    t = _table(title=f"rows per session: {args.cache}")
    for col in ("session", "raw_symbol", "rows"):
        t.add_column(col, justify="right")
    for s, y, n in rep.rows:
        t.add_row(s, y, f"{n:,}")
    out.print(t)
    t = _table(title="NaN rate per column (float columns with any NaN)")
    t.add_column("column")
    t.add_column("NaN rate", justify="right")
    for k, v in rep.nan_rate.items():
        if v > 0:
            t.add_row(k, f"{v:.2%}")
    out.print(t)
    t = _table(title="label balance")
    for col in ("label", "up (1; tb_label +1)", "down (0; tb_label -1)", "timeout (tb_label 0)", "NaN"):
        t.add_column(col, justify="right")
    for k, (u, d, n) in rep.label_balance.items():
        timeout = f"{1 - u - d - n:.1%}" if k == "tb_label" else ""
        t.add_row(k, f"{u:.1%}", f"{d:.1%}", timeout, f"{n:.1%}")
    out.print(t)
    out.print(f"crossed-book rows (pre-open auction): {rep.crossed:,}; incomplete-book rows: {rep.incomplete:,}"
              + ("; both left out of the feature and mid plots" if rep.plots else ""))
    for p in rep.plots:
        out.print(f"plot: {p}")
    return 0


def _clean(args: argparse.Namespace) -> int:
    from alphafeat.cache import clean_cache

    out = stdout_console()
    for p in clean_cache(args.cache, keep_predecoded=args.keep_predecoded):
        out.print(f"removed {p}")
    return 0


#: PrecomputeConfig's options of the DBN reading stage: precompute's and roll-schedule's.
READ_OPTIONS = ("roll_rule", "roll_days", "on_error", "schema", "predecoded_dir", "rebuild_predecoded", "jobs")


def _roll_schedule(args: argparse.Namespace) -> int:
    import shutil

    from alphafeat.plan import make_plan
    from alphafeat.precompute.config import default_predecoded_dir

    pre = args.predecoded_dir or (default_predecoded_dir(args.out) if args.out else None)
    if pre is not None and args.rebuild_predecoded and pre.is_dir():
        shutil.rmtree(pre)
    plan = make_plan(_inputs(args), root=args.root, roll_rule=args.roll_rule, roll_days=args.roll_days,
                     on_error=args.on_error, jobs=args.jobs, survey_dir=pre, schema=args.schema)
    sched = plan.schedule
    schemas = {(s.session, s.instrument_id): s.schema for s in plan.segments}
    out = stdout_console()
    t = _table(title=f"front month of {args.root} per session ({args.roll_rule} rule)")
    for col in ("session", "instrument_id", "raw_symbol", "schema", "expiration", "reason"):
        t.add_column(col)
    for c in sched:
        t.add_row(c.session.isoformat(), str(c.instrument_id), c.raw_symbol, schemas.get((c.session, c.instrument_id),
                  ""), c.expiration.isoformat() if c.expiration else "", c.reason)  # fmt: skip
    out.print(t)
    for note in plan.notes:
        out.print(f"note: {note}", soft_wrap=True)
    for path, reason in plan.skipped:
        out.print(f"skipped: {path}: {reason}")
    return 0


def _features(args: argparse.Namespace) -> int:
    import json

    from alphafeat.features import FeatureParams, feature_table
    from alphafeat.features.registry import FEATURE_GROUPS, select_features

    params = FeatureParams()
    rows = feature_table(params)
    members = {g: set(select_features(g, params)[0]) for g in ("default", *FEATURE_GROUPS)}
    for r in rows:  # the --features groups that store it (besides 'all')
        r["groups"] = [g for g, names in members.items() if r["name"] in names]
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    table = _table(title="alphafeat features (default parameters; groups: the --features groups holding each)")
    for col in ("name", "unit", "formula", "source", "parameters", "min_depth", "crossed rows", "groups"):
        table.add_column(col, overflow="fold", no_wrap=col == "name")
    for r in rows:
        params_ = ", ".join(f"{k}={v}" for k, v in r["parameters"].items())
        table.add_row(r["name"], r["unit"], r["formula"], r["source"], params_, str(r["min_depth"]), r["crossed"],
                      ", ".join(r["groups"]))
    stdout_console().print(table)
    return 0


def _precompute_options(p: argparse.ArgumentParser) -> None:
    """precompute's options: PrecomputeConfig's, each declared once on its field."""
    from alphafeat.options import add_options
    from alphafeat.precompute.config import PrecomputeConfig

    add_options(p, PrecomputeConfig)


def _roll_schedule_options(r: argparse.ArgumentParser) -> None:
    """roll-schedule's options: PrecomputeConfig's of the reading stage, and where plan scans are kept."""
    from alphafeat.options import add_options
    from alphafeat.precompute.config import PrecomputeConfig

    add_options(r, PrecomputeConfig, only=("inputs", "root"))
    r.add_argument("--out", default=None, type=_PATH,
                   help="cache directory whose .predecoded folder keeps plan scans (default: keep none)")
    add_options(r, PrecomputeConfig, only=READ_OPTIONS)


def build_parser() -> argparse.ArgumentParser:
    """The ``alphafeat`` argument parser; option values are checked by :mod:`alphafeat.validation`,
    precompute's and roll-schedule's as the fields of
    :class:`~alphafeat.precompute.config.PrecomputeConfig` declare them (:mod:`alphafeat.options`)."""
    ap = Parser(prog="alphafeat", description="The data-engineering command line (the main job: alphafeat "
                "precompute).")
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logging; tracebacks of errors")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = [verbose_parent("debug logging; tracebacks of errors")]

    p = add_command(sub, "precompute", "DBN files -> features and labels -> Arrow cache (the main job)",
                    parents=common, options=_precompute_options)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_precompute, prog=p.prog)

    r = add_command(sub, "roll-schedule", "print the front-month contract chosen per CME Globex session",
                    parents=common, options=_roll_schedule_options)
    r.set_defaults(func=_roll_schedule, prog=r.prog)

    s = add_command(sub, "synth", "synthetic ES DBN v3 files (the embedded default sample, test data, "
                    "benchmarks)", parents=common)
    s.add_argument("--default", action="store_true",
                   help="write the embedded default sample (into data/ unless --out)")
    s.add_argument("--start", type=option(val.validate_date),
                   help="first trade date, YYYY-MM-DD (required unless --default or --report)")
    s.add_argument("--sessions", type=_count(1, "a number of sessions"), default=1,
                   help="number of trading sessions (default 1)")
    s.add_argument("--out", type=_PATH, help="output directory")
    s.add_argument("--schemas", default="mbp-10,trades", type=option(val.validate_schemas),
                   help="any of mbo,mbp-10,trades,definition (default mbp-10,trades)")
    s.add_argument("--seed", type=_count(0), default=0, help="random seed (default 0; same seed, same bytes)")
    s.add_argument("--scale", default=val.Scale.QUIET, **_enum(val.Scale),
                   help="activity level (default quiet: the embedded sample's)")
    s.add_argument("--jobs", type=_JOBS, default=1, help="worker processes, one session each (default 1)")
    s.add_argument("--zstd-level", type=_count(1, hi=22), default=None,
                   help="zstd level 1-22 (default: 12 for quiet, 1 for bigger scales)")
    s.add_argument("--signal", type=option(val.validate_signal), default=1.0, metavar="STRENGTH",
                   help="strength of the planted predictability of the leading outright's mid, >= 0 "
                        "(default 1: ES-like, where no oracle wins at 1/4 tick; 0: none, a martingale mid; "
                        "--signal-kind history --signal 64: the tradable market of the tests and benches, where "
                        "the oracle wins at 1/4 tick in taker, mid and passive mode)")
    s.add_argument("--signal-kind", default=val.SignalKind.BOTH, **_enum(val.SignalKind),
                   help="book: visible in the current book (queue imbalance); history: only in the order "
                        "flow of the last minutes; both (default)")
    s.add_argument("--signal-file", action="store_true",
                   help="also write each session's planted signal of the front month (ts_recv, p_up per book "
                        "event) as glbx-mdp3-YYYYMMDD.signal.arrow: alphamodel backtest's oracle reads it")
    s.add_argument("--report", action="store_true",
                   help="stylised facts of the generated market (scale normal or --scale) beside the real ES "
                        "files and the literature, and the book's shape beside the real ESH4 hour; adds them "
                        "to <out>/synth-report.json (data/ unless --out)")
    s.add_argument("--real", default=None, type=_PATH, help="the real MBO file for --report "
                   "(default: ../shared/data/real/esh4-glbx-mdp3-20231225.mbo.dbn.zst)")
    s.set_defaults(func=_synth, prog=s.prog)

    f = add_command(sub, "features", "print the feature registry (name, unit, formula, source, parameters, "
                    "value on crossed-book rows such as the pre-open)",
                    parents=common)
    f.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    f.set_defaults(func=_features, prog=f.prog)
    i = add_command(sub, "inspect", "rows, NaN rates and label balance of a cache, and PNG plots", parents=common)
    i.add_argument("cache", type=_PATH, help="cache directory written by precompute")
    i.add_argument("--plots", default=None, type=_PATH, help="where to write PNG plots (default: CACHE/_plots)")
    i.add_argument("--no-plots", action="store_true", help="tables only")
    i.set_defaults(func=_inspect, prog=i.prog)
    c = add_command(sub, "clean", "remove a cache and its kept books (the predecoded folder its manifest names)",
                    parents=common)
    c.add_argument("cache", type=_PATH, help="cache directory written by precompute (refused without its manifest)")
    c.add_argument("--keep-predecoded", action="store_true",
                   help="keep a predecoded folder outside the cache (--predecoded-dir shared by other caches)")
    c.set_defaults(func=_clean, prog=c.prog)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for a usage error, 1 for a data error; one line).
    Without ``argv`` (the program's own command line) the process ends with the command
    (:func:`alphafeat.commandline.end_process`)."""
    status = run(build_parser, argv, verbose_level=logging.DEBUG, own_process=argv is None)
    if argv is None:
        end_process(status)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
