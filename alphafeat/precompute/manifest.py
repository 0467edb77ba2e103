"""What a run records: each partition's schema metadata and fingerprint
(:func:`segment_metadata`), whether a partition on disk is current or can be relabelled
(:func:`reuse_key`, :func:`reusable`), the cache's manifest before and after the run, and the
summary's closing notes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np

import alphafeat
from alphafeat.cache import FORMAT_VERSION, CacheWriter
from alphafeat.dbn import file_identity
from alphafeat.features import FeatureParams, feature_specs
from alphafeat.instruments import session_end_ns
from alphafeat.plan import Plan, Segment
from alphafeat.precompute.books import is_kept, kept_book
from alphafeat.precompute.config import PrecomputeConfig
from alphafeat.precompute.job import Job
from alphafeat.precompute.relabel import can_relabel
from alphafeat.precompute.table import column_array, column_specs, is_label, min_depth
from alphafeat.types import LEVELS

__all__ = ["LABEL_OPTIONS", "common_metadata", "earlier_manifest", "keep_or_prune", "partition_stats", "reusable",
           "reuse_key", "segment_metadata", "source_rows", "schedule_rows"]


#: Options that change only the label columns of a partition (a rerun that changes only these
#: relabels the partitions on disk: :func:`~alphafeat.precompute.relabel.relabel_table`); the compression
#: is rewritten too.
LABEL_OPTIONS = ("horizons", "horizons_s", "barrier", "barrier_horizon", "compression")


def reuse_key(meta: dict) -> str:
    """What a partition's rows and book columns were computed from: its schema metadata without
    the label options, the stored feature set, the label and feature columns and the fingerprint
    (JSON text). Equal keys: the same rows and book columns, and every feature of the partition
    has the bytes a fresh run would store (the feature parameters are in the key)."""
    params = meta.get("params") or {}
    try:
        names = {s.name for s in feature_specs(FeatureParams(**_tuples(params.get("features") or {})))}
    except (TypeError, ValueError):
        return json.dumps(meta, sort_keys=True)  # unreadable parameters: equal to nothing but itself
    m = {k: v for k, v in meta.items() if k not in ("fingerprint", "columns", "params")}
    m["params"] = {k: v for k, v in params.items() if k not in (*LABEL_OPTIONS, "feature_set")}
    m["columns"] = [c for c in meta.get("columns") or [] if not is_label(str(c.get("name", "")))
                    and c.get("name") not in names]  # fmt: skip
    return json.dumps(m, sort_keys=True)


def _tuples(d: dict) -> dict:
    """JSON lists back to tuples (the form of FeatureParams' fields)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def segment_metadata(common: dict, seg: Segment, schedule: list[dict], sources: list[tuple[int, dict]]) -> dict:
    """Schema metadata of one partition and its fingerprint.

    It holds what the partition was computed from and nothing later: the roll schedule up to
    its session and the source files that start before its session ends (a later file cannot
    change an earlier session, so adding one leaves earlier partitions current), and the book
    schema its rows were built from (``book_schema``: a folder may hold several).
    """
    end = session_end_ns(seg.session)
    day = seg.session.isoformat()
    meta = dict(
        common,
        session=day,
        instrument_id=seg.instrument_id,
        book_schema=seg.schema,
        schedule=[c for c in schedule if c["session"] <= day],
        sources=[e for start, e in sources if start < end],
    )
    meta["fingerprint"] = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()
    return meta


def reusable(old: dict | None, meta: dict, seg: Segment, job: Job, pre: str | None) -> bool:
    """Whether the partition on disk (metadata ``old``) can be relabelled into this run's
    (:func:`~alphafeat.precompute.relabel.relabel_table`): the same rows and book columns (:func:`reuse_key`), labels
    computable from its columns, and the features it lacks computable from the segment's
    kept book (not for volume bars, whose rows are not the book's)."""
    if old is None or not can_relabel(job) or reuse_key(old) != reuse_key(json.loads(json.dumps(meta))):
        return False  # (json: as the file holds it)
    missing = set(job.names) - {c.get("name") for c in old.get("columns") or []}
    return not missing or (pre is not None and not job.bar_volume and is_kept(kept_book(seg, pre)))


def keep_or_prune(rel: str, writer: CacheWriter, others: dict[str, list[str]], prune: bool) -> None:
    """A skipped segment's partition left by an earlier run (``rel``): listed with the earlier
    partitions, or with ``prune`` deleted at commit, so that the manifest always lists every
    partition on disk; ``others["skipped"]`` names it for its own note."""
    if not (writer.out / rel).is_file():
        return
    others["skipped"].append(rel)
    if prune:
        others["pruned"].append(rel)
        writer.drop.append(rel)
    else:
        others["earlier"].append(rel)  # the writer's list too: kept at commit


def earlier_manifest(out: Path) -> dict:
    """The cache's manifest before this run ({} when none or unreadable)."""
    from alphafeat.cache import MANIFEST

    try:
        return json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def partition_stats(path: Path) -> tuple[int, int]:
    """Rows and crossed-book rows of a partition file (memory-mapped; one column read)."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as src:
        table = pa.ipc.open_file(src).read_all()
        return table.num_rows, int(column_array(table, "book_crossed", np.bool_).sum())


def first_few(items: list[str], k: int) -> str:
    """The first ``k`` of ``items`` for a note, comma-separated, `` ...`` when there are more."""
    return ", ".join(items[:k]) + (" ..." if len(items) > k else "")


def _depth_of(schema: str) -> int:
    return 1 if schema == "mbp-1" else LEVELS


def _schema_notes(cfg: PrecomputeConfig, job: Job, plan: Plan) -> list[str]:
    """Which book schema each session used, when the run used more than one; which sessions'
    input carries fewer levels than the depth features need."""
    by: dict[str, list[str]] = {}
    for s in plan.segments:
        by.setdefault(s.schema, []).append(f"{s.session} {s.raw_symbol}")
    notes = []
    if len(by) > 1:
        notes.append("book schema per session (the richest holding it; --schema forces one): "
                     + "; ".join(f"{k}: {first_few(v, 4)}" for k, v in by.items()))  # fmt: skip
    for schema, sessions in by.items():
        depth = _depth_of(schema)
        if depth < LEVELS:
            limited = [n for n, need in min_depth(cfg.features).items() if depth < need and n in job.names]
            where = "" if len(by) == 1 else f" ({first_few(sessions, 4)})"
            notes.append(f"{schema} input{where} carries {depth} book level(s): depth features "
                         f"{', '.join(limited) or '(none stored)'} are NaN and deeper book columns empty")
    return notes


def _selection(cfg: PrecomputeConfig) -> str:
    """How the run chose its instrument of each session, in words (the manifest's ``selection_rule``)."""
    mode = cfg.instrument_mode
    selection = (f"front month of {cfg.root}: most traded volume in the previous session; first session: "
                 f"nearest expiration more than {cfg.roll_days} days ahead (calendar rule)")  # fmt: skip
    if mode.kind != "front-month":
        selection = str(mode)
    elif cfg.roll_rule == "calendar":
        selection = f"front month of {cfg.root}: nearest expiration more than {cfg.roll_days} days ahead"
    return selection


def common_metadata(cfg: PrecomputeConfig, job: Job, plan: Plan) -> dict:
    """What every partition's metadata and the manifest hold of the run: versions, the
    selection and session rules, the options and the columns (:func:`column_specs`)."""
    return {
        "format_version": FORMAT_VERSION,
        "package_version": alphafeat.__version__,
        "instrument_mode": str(cfg.instrument_mode),
        "root": cfg.root,
        "selection_rule": _selection(cfg),
        "session_rule": "CME Globex trade date D = [D-1 16:00, D 16:00) America/Chicago",
        "params": {
            "features": dataclasses.asdict(cfg.features),
            "feature_set": list(job.names),
            "book_levels": job.book_levels,
            "dtype": job.dtype,
            "compression": job.compression,
            "horizons": list(cfg.horizons),
            "horizons_s": list(cfg.horizons_s),
            "barrier": cfg.barrier,
            "barrier_horizon": cfg.barrier_horizon,
            "roll_days": cfg.roll_days,
            "roll_rule": cfg.roll_rule,
            "sample": cfg.sample,
            "preopen": cfg.preopen,
        },
        "columns": column_specs(job),
    }


def schedule_rows(plan: Plan) -> list[dict]:
    """The plan's roll schedule as JSON rows (session, instrument, symbol, expiration, reason,
    and the book schema of its segment: ``mbo``, ``mbp-10`` or ``mbp-1``)."""
    schemas = {(s.session, s.instrument_id): s.schema for s in plan.segments}
    return [
        {"session": c.session.isoformat(), "instrument_id": c.instrument_id, "raw_symbol": c.raw_symbol,
         "expiration": c.expiration.isoformat() if c.expiration else None, "reason": c.reason,
         "schema": schemas.get((c.session, c.instrument_id))}
        for c in plan.schedule
    ]  # fmt: skip


def source_rows(plan: Plan) -> list[tuple[int, dict]]:
    """The plan's files as ``(start ns, JSON row)``: path, size, mtime, schema, DBN version."""
    sources = []
    for f in plan.files:
        path, size, mtime_ns = file_identity(f.path)
        sources.append((int(f.metadata.start), {"path": path, "size": size, "mtime_ns": mtime_ns,
                                                "schema": f.schema, "dbn_version": f.version}))  # fmt: skip
    return sources


def other_partition_notes(others: dict[str, list[str]], recomputed: list[str]) -> list[str]:
    """Notes on the cache's partitions this run did not write itself: those of other sessions
    kept, replaced or pruned, and those recomputed (``others``: :meth:`CacheWriter.others`,
    with ``skipped`` of :func:`keep_or_prune`, whose partitions have a note of their own)."""
    notes = []
    for key, what in (("earlier", "kept {n} partition(s) of sessions not in this run, from an earlier run with "
                                  "the same options (manifest: earlier_partitions; --prune deletes them)"),
                      ("replaced", "replaced {n} partition(s) of sessions this run recomputed for another "
                                   "instrument (manifest: replaced)"),
                      ("pruned", "--prune: deleted {n} partition(s) of sessions not in this run (manifest: "
                                 "pruned)")):  # fmt: skip
        listed = [r for r in others[key] if r not in others["skipped"]]  # those have a note of their own
        if listed:
            notes.append(what.format(n=len(listed)) + f": {first_few(listed, 5)}")
    recomputed = [r for r in recomputed if r not in others["skipped"]]
    if recomputed:
        notes.append(f"recomputed {len(recomputed)} partition(s) written earlier with other options or "
                     f"inputs (each replaced when this run commits): {first_few(recomputed, 3)}")
    return notes


def relabel_note(relabelled: list[str], changes: set[str], job: Job) -> list[str]:
    """The note on the partitions this run relabelled (none without any)."""
    if not relabelled:
        return []
    done = {"labels": "label columns of changed options recomputed from their mid",
            "features added": "features they lack computed from the kept books",
            "features dropped": "features no longer asked for dropped",
            "compression": f"rewritten with --compression {job.compression}"}  # fmt: skip
    what = [v for k, v in done.items() if k in changes] or ["rewritten"]
    return [f"relabelled {len(relabelled)} partition(s) written earlier with other label, "
            "feature or output options (their book columns and the stored features still asked "
            f"for kept): {'; '.join(what)}: {first_few(sorted(relabelled), 3)}"]  # fmt: skip


def data_notes(cfg: PrecomputeConfig, job: Job, plan: Plan, skipped: list[str], n_crossed: int,
               min_rows: int) -> list[str]:  # fmt: skip
    """Notes on what the data gave: partitions of failed inputs (``skipped``), crossed books,
    shallow input, label horizons longer than the shortest session (``min_rows``)."""
    notes = []
    if skipped:
        fate = ("deleted (--prune; manifest: pruned)" if cfg.prune else "kept, with the data of the input as it "
                "was then (manifest: earlier_partitions; --prune deletes them)")  # fmt: skip
        notes.append(f"--on-error skip: {len(skipped)} partition(s) of an earlier run for "
                     f"sessions whose input failed in this run {fate}: "
                     f"{', '.join(skipped[:5])}")  # fmt: skip
    if n_crossed and cfg.preopen == "drop":
        notes.append(f"--preopen drop: {n_crossed:,} snapshot{'s' if n_crossed > 1 else ''} with a crossed book "
                     "(bid above ask, e.g. pre-open) not written")
    elif n_crossed:
        notes.append(f"{n_crossed:,} snapshot{'s have' if n_crossed > 1 else ' has'} a crossed book "
                     "(bid above ask, e.g. pre-open): flagged in book_crossed, with NaN labels and NaN price "
                     "features (--preopen drop leaves them out)")
    notes += _schema_notes(cfg, job, plan)
    unit = "bars" if job.bar_volume else "snapshots"
    long = [h for h in cfg.horizons if h >= min_rows]
    if long:
        notes.append(f"label horizons {long} ({unit}) reach past the end of a session of {min_rows:,} "
                     f"{unit}: those labels are NaN there")
    return notes
