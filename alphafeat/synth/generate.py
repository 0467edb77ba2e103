"""``generate``: simulate and write sessions (joblib over sessions), and the JSON report."""

from __future__ import annotations

import datetime
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import joblib
import numpy as np

from alphafeat.synth.calendar import SCALES, contracts_for, session_bounds, session_vol, trade_dates, trend_level
from alphafeat.synth.ceiling import AUC_HORIZONS, AUC_PATHS, AUC_STATES, auc_ceiling
from alphafeat.synth.params import P_BAD_TS, P_CROSSED_PREOPEN, P_LOCK, P_REPLENISH, Signal
from alphafeat.synth.planted import DRIFT_HORIZONS, DRIFT_PATHS, planted_path, write_planted
from alphafeat.synth.records import MBO_SIZE, MBP_SIZE, TRADE_DTYPE, Buffers, Session
from alphafeat.synth.simulator import simulate_session
from alphafeat.synth.writer import (
    FAST_ZSTD_LEVEL,
    ZSTD_LEVEL,
    definitions,
    merged_chunks,
    metadata_bytes,
    session_trades,
    write_atomic,
)
from alphafeat.validation import (
    Scale,
    SignalKind,
    validate_date,
    validate_enum,
    validate_int,
    validate_jobs,
    validate_schemas,
    validate_signal,
)

__all__ = ["DEFAULT_SAMPLE", "REPORT_NAME", "generate", "make_default_sample"]

logger = logging.getLogger(__name__)

#: Name of the JSON report written next to the data.
REPORT_NAME = "synth-report.json"

DEFAULT_SAMPLE = dict(
    start=datetime.date(2024, 3, 6),
    sessions=3,
    seed=20240306,
    schemas=("mbp-10", "trades"),
    scale="quiet",
)

#: The pool of the sessions simulated by this process through :func:`_session_job`.
_POOL = Buffers()


def _instruments(sess: Session) -> dict[str, dict[str, Any]]:
    """Per instrument of ``sess``, its counts for the report: events, records, trades, volume and
    rare cases (JSON-able)."""
    inst = {}
    c_ids = {c.symbol: c.instrument_id for c in sess.contracts}
    for sym, r in sess.runs.items():
        inst[sym] = {
            "instrument_id": c_ids[sym] if r.n_mbo else None,
            "events": int(r.stats[0]),
            "mbo_records": r.n_mbo,
            "mbp10_records": int(r.mbp.shape[0]),
            "trade_events": int(r.stats[3]),
            "traded_volume": int(r.stats[6]),
            "crossed_preopen": bool(r.crossed),
            "locked_events": int(r.stats[1]),
            "bad_ts_recv_events": int(r.stats[2]),
            "thin_book_row_fraction": round(float(r.stats[5]) / float(r.stats[4]) if r.stats[4] else 0.0, 6),
        }
    return inst


def _write_sidecar(out: Path, day: datetime.date, sess: Session, signal: Signal) -> str | None:
    """Write the planted-signal sidecar of ``sess``'s leading outright (p_up and drift_K,
    :mod:`alphafeat.synth.planted`) into ``out``; its path, or None without a leader."""
    lead = sess.runs.get(sess.leader)
    if lead is None or lead.planted is None:
        return None
    lc = next(c for c in sess.contracts if c.symbol == sess.leader)
    side = planted_path(out, day.isoformat())
    dr = {k: lead.drift[:, i] for i, k in enumerate(DRIFT_HORIZONS)} if lead.drift is not None else None
    rel = [round(float(r), 6) for r in lead.drift_reliability] if lead.drift_reliability is not None else None
    write_planted(side, lead.planted[0], lead.planted[1], {
        "instrument_id": lc.instrument_id, "raw_symbol": lc.symbol, "session": day.isoformat(),
        "signal": signal.strength, "signal_kind": signal.kind,
        "formula": "p_up = 1/2 + 1/2 clip(s_B I + s_H tanh(F / H0), -1, 1) after each event, bridge excluded "
                   f"(s_B={signal.book}, s_H={signal.history})",
        "drift_horizons": list(DRIFT_HORIZONS), "drift_paths": DRIFT_PATHS, "drift_unit": "ticks",
        "drift_reliability": rel}, dr)
    return str(side)


def _session_job(
    day: datetime.date,
    seed: int,
    scale: float,
    contracts: tuple[str, ...] | None,
    schemas: tuple[str, ...],
    out: Path,
    level: int,
    mc: tuple[tuple[int, ...], int, dict[int, int]] | None,
    signal: Signal = Signal(),  # noqa: B008 (frozen dataclass)
    signal_file: bool = False,
) -> dict[str, Any]:
    """Simulate and write one session (and its planted-signal sidecar with ``signal_file``);
    returns the paths and a summary (JSON-able)."""
    t0, t1 = session_bounds(day)
    sess = simulate_session(day, seed, scale, contracts, mc[1] if mc else 0, _POOL, "mbo" in schemas, signal,
                            DRIFT_HORIZONS if signal_file else (), DRIFT_PATHS)
    stem = f"glbx-mdp3-{day:%Y%m%d}"
    counts: dict[str, int] = {}
    n_mbp = sum(r.mbp.shape[0] for r in sess.runs.values())
    n_mbo = sum(r.n_mbo for r in sess.runs.values())
    trades: np.ndarray | None = None
    if "mbp-10" in schemas and "trades" in schemas:  # the trades are collected as mbp-10 is merged
        n_tr = sum(int(r.stats[7]) for r in sess.runs.values())
        trades = np.empty(n_tr, TRADE_DTYPE) if sess.bufs is None else sess.bufs.get("trades", TRADE_DTYPE, n_tr)
    for schema in sorted(schemas, key=lambda s: s != "mbp-10"):  # mbp-10 first (files are independent)
        path = out / f"{stem}.{schema}.dbn.zst"
        header = metadata_bytes(schema, sess.contracts, t0, t1)
        if schema in ("mbp-10", "mbo"):  # merged chunk by chunk: no session-sized copy
            kind, n = ("mbp", n_mbp) if schema == "mbp-10" else ("mbo", n_mbo)
            size = MBP_SIZE if kind == "mbp" else MBO_SIZE
            chunks = merged_chunks(sess, kind, trades=trades if kind == "mbp" else None)
            write_atomic(path, header, chunks, n * size, level)
        else:
            if schema == "trades":
                recs = trades if trades is not None else session_trades(sess)
            else:
                recs = definitions(sess.contracts, day, t0)
            n = recs.shape[0]
            write_atomic(path, header, [recs.view(np.uint8).reshape(-1)], recs.nbytes, level)
        counts[schema] = int(n)
    paths = [str(out / f"{stem}.{schema}.dbn.zst") for schema in schemas]
    side = _write_sidecar(out, day, sess, signal) if signal_file else None
    counts = {schema: counts[schema] for schema in schemas}  # in the order of ``schemas``
    inst = _instruments(sess)
    res: dict[str, Any] = {
        "session": day.isoformat(),
        "paths": paths,
        "records": counts,
        "mbp10_records": int(n_mbp),
        "mbo_records": int(n_mbo),
        "leader": sess.leader,
        "instruments": inst,
    }
    if side:
        res["signal_file"] = side
    if mc:
        ci: dict[str, list[float]] = {}
        res["auc_ceiling"] = auc_ceiling(sess.runs[sess.leader], mc[0], mc[2], seed, interval=ci)
        res["auc_ceiling_interval"] = ci
    return res


def generate(
    out_dir: str | os.PathLike[str],
    *,
    start: datetime.date,
    sessions: int,
    seed: int = 0,
    schemas: tuple[str, ...] = ("mbp-10", "trades"),
    scale: str = "quiet",
    contracts: tuple[str, ...] | None = None,
    jobs: int = 1,
    zstd_level: int | None = None,
    report: bool = True,
    progress: Callable[[int], None] | None = None,
    summary: list[dict[str, Any]] | None = None,
    signal: float = 1.0,
    signal_kind: str = "both",
    signal_file: bool = False,
) -> list[Path]:
    """Write synthetic ES.FUT DBN v3 files, one per trading session and schema.

    Parameters
    ----------
    out_dir : path
        Directory to write into (created if missing).
    start : datetime.date
        First trade date; weekend dates are skipped (the next weekday is used).
    sessions : int
        Number of trading sessions (weekdays) to generate, >= 1.
    seed : int
        Non-negative seed; the same arguments give byte-identical files (any ``jobs``).
    schemas : tuple of str
        Any of ``"mbo"``, ``"mbp-10"``, ``"trades"``, ``"definition"``.
    scale : str
        A key of :data:`SCALES`: ``"quiet"`` (about 35k MBP-10 records per session over all
        instruments), ``"normal"`` (x10 the events), ``"busy"`` (x100; 2.6 M MBP-10 records on
        2024-01-09), ``"full"`` (x300, ES-like): multiplies every event rate (records per event
        fall a little with the scale: the mid moves in fewer of them, see
        :data:`alphafeat.synth.calendar.P_MOVE_MAX`).
    contracts : tuple of str, optional
        Raw symbols (outrights ``ESM4``, spreads ``ESH4-ESM4``); default: the three nearest
        quarterly outrights and the calendar spreads of neighbours, chosen per session.
    jobs : int
        Worker processes (joblib, one session per task); 1 runs in this process.
    zstd_level : int, optional
        zstd level; default :data:`ZSTD_LEVEL` for ``quiet`` and :data:`FAST_ZSTD_LEVEL`
        otherwise (compression dominates the run time of big sets at high levels).
    report : bool
        Also write ``synth-report.json`` (parameters, per-session counts and rare cases, and
        the AUC ceiling per label horizon from :func:`auc_ceiling` on the first session); the
        stylised facts an earlier ``alphafeat synth --report`` added there are kept (:func:`write_report`).
    progress : callable, optional
        Called with 1 after each session is written.
    summary : list, optional
        Receives one dict per session (record counts per schema and instrument, rare cases).
    signal : float
        Strength of the planted predictability of the leading outright's mid (``--signal``):
        1 the default (see :mod:`alphafeat.synth`), 0 none (a martingale mid).
    signal_kind : str
        ``"book"``, ``"history"`` or ``"both"`` (:class:`alphafeat.synth.Signal`).
    signal_file : bool
        Also write each session's planted-signal sidecar ``glbx-mdp3-YYYYMMDD.signal.arrow``
        (:mod:`alphafeat.synth.planted`: ts_recv and p_up of the front month per book event;
        what ``alphamodel backtest``'s ``oracle`` trades on). The DBN files are the same bytes
        with or without it; it is not among the returned paths.

    Returns
    -------
    list[Path]
        Paths written, per session in the order of ``schemas`` (the report not included).

    Raises
    ------
    UsageError
        A bad argument (named as its CLI option: ``--sessions``, ``--signal-kind``, ...; a bad
        raw symbol in ``contracts`` as ``contracts``), before anything is written.
    """
    start, sessions = validate_date(start, "--start"), validate_int(sessions, "--sessions", lo=1)
    seed, scale = validate_int(seed, "--seed", lo=0), validate_enum(scale, Scale, "--scale").value
    schemas, jobs = tuple(s.value for s in validate_schemas(schemas)), validate_jobs(jobs)
    if zstd_level is not None:
        zstd_level = validate_int(zstd_level, "--zstd-level", lo=1, hi=22)
    sig = Signal(validate_signal(signal), validate_enum(signal_kind, SignalKind, "--signal-kind").value)
    if contracts is not None:
        contracts = tuple(contracts)
        contracts_for(start, contracts)  # a bad raw symbol: UsageError before anything is written
    level = zstd_level if zstd_level is not None else (ZSTD_LEVEL if scale == "quiet" else FAST_ZSTD_LEVEL)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    days = trade_dates(start, sessions)
    mc = (AUC_HORIZONS, AUC_STATES, AUC_PATHS)
    tasks = [
        (d, seed, SCALES[scale], contracts, tuple(schemas), out, level, mc if (report and i == 0) else None, sig,
         bool(signal_file))
        for i, d in enumerate(days)
    ]
    results: list[dict[str, Any]] = []
    if jobs <= 1 or len(tasks) == 1:
        try:
            for t in tasks:
                results.append(_session_job(*t))
                if progress:
                    progress(1)
        finally:
            _POOL.clear()  # worker processes keep theirs for their next sessions
    else:
        par = joblib.Parallel(n_jobs=jobs, backend="loky", return_as="generator")
        for r in par(joblib.delayed(_session_job)(*t) for t in tasks):
            results.append(r)
            if progress:
                progress(1)
    written = [Path(p) for r in results for p in r["paths"]]
    if summary is not None:
        summary.extend(results)
    if report:
        rep = {
            "generator": "alphafeat.synth",
            "start": start.isoformat(),
            "sessions": sessions,
            "seed": seed,
            "scale": scale,
            "schemas": list(schemas),
            "zstd_level": level,
            "model": {
                "signal": sig.strength,
                "signal_kind": sig.kind,
                "signal_weight_book": sig.book,
                "signal_weight_history": sig.history,
                "session_vol": round(session_vol(SCALES[scale], trend_level(days[0])), 6),
                "rare_case_rates": {
                    "crossed_preopen_per_outright_session": P_CROSSED_PREOPEN,
                    "locked_book_per_event_at_one_tick_spread": P_LOCK,
                    "bad_ts_recv_per_event": P_BAD_TS,
                    "tail_level_not_replenished": 1.0 - P_REPLENISH,
                },
            },
            "auc_ceiling": {
                "horizons_snapshots": list(AUC_HORIZONS),
                "instrument": results[0]["leader"],
                "session": results[0]["session"],
                "states": AUC_STATES,
                "paths_per_state": AUC_PATHS,
                "auc": results[0].get("auc_ceiling", {}),
                "interval_95": results[0].get("auc_ceiling_interval", {}),
                "method": "Monte-Carlo continuations under the true model, bias-corrected estimator, "
                "bootstrap interval over the states (see synth.auc_ceiling, synth.ceiling_estimate, "
                "synth.ceiling_interval)",
            },
            "mbp10_records": sum(r["mbp10_records"] for r in results),
            "mbo_records": sum(r["mbo_records"] for r in results),
            "sessions_detail": [
                {k: v for k, v in r.items() if k not in ("paths", "auc_ceiling", "auc_ceiling_interval")}
                for r in results
            ],
        }
        for s in rep["sessions_detail"]:
            s["files"] = [Path(p).name for p in next(r["paths"] for r in results if r["session"] == s["session"])]
        write_report(out / REPORT_NAME, rep)
        logger.info("AUC ceiling per horizon: %s", rep["auc_ceiling"]["auc"])
    return written


#: Sections of ``synth-report.json`` that ``alphafeat synth --report`` adds: measurements of the
#: generator on sessions of its own (not of the files written), kept when the files are rewritten.
REPORT_SECTIONS = ("stylised_facts", "stylised_facts_setup", "book_shape_vs_real")


def write_report(path: Path, rep: dict) -> None:
    """Write ``rep`` as the JSON report at ``path`` atomically, keeping the :data:`REPORT_SECTIONS`
    of the report already there (a rerun of ``alphafeat synth --default`` must not drop the
    stylised facts that ``--report`` measured; rerun ``--report`` after changing the generator).
    An unreadable earlier report is replaced whole."""
    try:
        old = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        old = {}
    write_json(path, {**rep, **{k: old[k] for k in REPORT_SECTIONS if isinstance(old, dict) and k in old}})


def write_json(path: Path, obj: dict) -> None:
    """Write ``obj`` as indented JSON at ``path`` atomically (a temporary file renamed over it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def make_default_sample(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write the project's default sample: ``generate(out_dir, **DEFAULT_SAMPLE)``."""
    return generate(out_dir, **DEFAULT_SAMPLE)  # type: ignore[arg-type]
