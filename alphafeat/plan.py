"""Plan: one cheap pass over the inputs that gives the front-month schedule and the segments.

A *segment* is the unit of work, memory and resumption of :func:`alphafeat.precompute.precompute`:
one CME Globex trade session x one chosen instrument x the files that hold its records. The
plan reads, per file (in joblib processes where that pays: :func:`scan_jobs`):

* the DBN header (``databento_dbn.Metadata``: schema, start/end, symbol mappings) of every file;
* the records of trades and definition files (small), for traded volume and expirations;
* the records of a book file only when the metadata cannot answer: no symbol mappings (ids
  unknown), no ``end`` time, no trades file for the volume rule, or ``--instrument-mode all``.
  That scan keeps per (session, instrument) a record count, the trade volume of ``T``
  records and the first ``ts_recv``, plus in-band symbol mappings: a few kilobytes.

Scans are kept in ``<predecoded dir>/survey/`` keyed by the file's path, size, mtime, ctime and
inode (:func:`identity`), so a rerun plans without decoding; the plan itself is kept in
``<predecoded dir>/plan/`` (:func:`plan_key`: every input file's identity, the plan options
and a hash of the planning code), so a rerun over the same files plans without opening them
(nor building the symbology). Front-month selection itself is
:func:`alphafeat.instruments.front_month_schedule` (no look-ahead: a session's choice uses the
previous session's volume); this module is its only caller (``precompute``,
``roll-schedule`` and ``bench/`` all plan through :func:`make_plan`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from alphafeat import kept as kept_data
from alphafeat.dbn import BOOK_SCHEMAS, SCHEMA_RTYPES, DBNFile, open_dbn
from alphafeat.errors import InputError, SelectionError
from alphafeat.instruments import (
    CONTINUOUS_RE,
    MONTH_CODES,
    Choice,
    InstrumentMode,
    Symbology,
    front_month_schedule,
    is_candidate,
    outright_pattern,
    session_end_ns,
)
from alphafeat.plan_scan import file_range, groups_of, identity, run_surveys, scan_jobs, sessions_of, spawning_workers
from alphafeat.sources import BOOK_RANK, force_schema, foreign_files, richest
from alphafeat.validation import (
    ModeKind,
    OnError,
    RollRule,
    validate_book_schema,
    validate_enum,
    validate_instrument_mode,
    validate_int,
    validate_jobs,
    validate_root,
)

__all__ = ["Plan", "Segment", "discover", "make_plan", "session_bounds", "spawning_workers"]

log = logging.getLogger(__name__)

_ROOT_RE = re.compile(rf"^(.+?)[{MONTH_CODES}]\d{{1,2}}(?:-.*)?$")
#: Version of the plans kept on disk (:func:`plan_key`); bump to invalidate them.
PLAN_VERSION = 1
#: The modules whose code decides a plan: their source is hashed into :func:`plan_key`.
_PLAN_CODE = ("plan.py", "plan_scan.py", "sources.py", "instruments.py", "dbn.py", "types.py", "validation.py",
              "errors.py")


@dataclass(frozen=True)
class Segment:
    """One unit of work: a session of one instrument and the files holding its records.

    Attributes
    ----------
    session : datetime.date
        CME Globex trade date D = [D-1 16:00, D 16:00) America/Chicago.
    instrument_id : int
        The instrument kept (exchange id).
    raw_symbol : str
        Its symbol on that date (``ESH4``); ``id<N>`` when no mapping names it.
    root : str
        Product root of the partition path (``ES``).
    schema : str
        Book schema of the files (``mbo``, ``mbp-10`` or ``mbp-1``): the richest holding the
        instrument in the session (:mod:`alphafeat.sources`), or the one ``--schema`` forced.
    book_files, trade_files : tuple of str
        Resolved paths of the files whose time range overlaps the session, in start order.
    relpath : str
        Partition path in the cache (``root=ES/session=2024-03-06/ESH4.arrow``).
    """

    session: dt.date
    instrument_id: int
    raw_symbol: str
    root: str
    schema: str
    book_files: tuple[str, ...]
    trade_files: tuple[str, ...]
    relpath: str

    @property
    def bounds(self) -> tuple[int, int]:
        """``[start, end)`` of the session in ns since the epoch (UTC)."""
        return session_bounds(self.session)


@dataclass
class Plan:
    """What :func:`make_plan` returns.

    Attributes
    ----------
    schema : str
        The richest book schema of the run's segments (each segment names its own:
        :attr:`Segment.schema`).
    files : list of DBNFile
        Headers of the files used (book, then trades, then definition files).
    schedule : list of Choice
        The instrument of each session and why (front month: the roll schedule).
    segments : list of Segment
        One per schedule entry, in session order.
    skipped : list of (Path, str)
        Files left out with ``on_error="skip"`` and why (the problem and where in the file,
        without the path).
    notes : list of str
        Things the summary should say (e.g. which files had to be scanned to plan).
    scanned : int
        Book files whose records were read to plan (0 when the metadata sufficed).
    continuous : str or None
        The continuous symbol (``ES.v.0``) of a run over continuous-symbology files: its
        schedule holds every contract the mapping gives a session (two in a roll session).
    """

    schema: str
    files: list[DBNFile]
    schedule: list[Choice]
    segments: list[Segment]
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    scanned: int = 0
    continuous: str | None = None


def discover(inputs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Expand directories into their ``*.dbn`` / ``*.dbn.zst`` files (sorted, not recursive).

    Raises
    ------
    InputError
        For a path that does not exist, or a directory with no DBN file.
    """
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.name.endswith((".dbn", ".dbn.zst")))
            if not found:
                raise InputError(p, "directory holds no .dbn or .dbn.zst file")
            files.extend(found)
        elif p.exists():
            files.append(p)
        else:
            raise InputError(p, "no such file or directory")
    return files


def session_bounds(day: dt.date) -> tuple[int, int]:
    """``[start, end)`` of the CME session of trade date ``day``, ns since the epoch."""
    return session_end_ns(day - dt.timedelta(days=1)), session_end_ns(day)


def root_of(symbol: str) -> str:
    """Product root of a futures symbol (``ESH4`` -> ``ES``); the symbol itself otherwise."""
    m = _ROOT_RE.match(symbol)
    return m.group(1) if m else symbol


def _load_kept(kept: Path) -> object | None:
    """What :func:`_keep` kept at ``kept``, or None when there is none or it cannot be read
    (:func:`alphafeat.kept.load`: JSON data, never code)."""
    return kept_data.load(kept, (Plan, Segment, DBNFile, Choice))


def _keep(kept: Path, obj: object, what: str) -> None:
    """Keep ``obj`` at ``kept`` atomically (:func:`alphafeat.kept.dump`); a write refused (disk
    full, ...) is logged and costs only the next run the work again."""
    kept_data.dump(kept, obj, what)



def plan_key(files: Sequence[Path], options: Sequence[object]) -> str:
    """Key of a kept plan: each input file's :func:`identity` (a touched, rewritten or replaced
    file, or one added to or taken from an input folder, gives another key), the plan
    ``options``, :data:`PLAN_VERSION`, a hash of the planning code (:data:`_PLAN_CODE`) and the
    identity of the installed databento_dbn (its metadata decides the symbols).

    Raises
    ------
    OSError
        A file that cannot be stat'ed (the plan then reads it and names it).
    """
    import importlib.util

    here = Path(__file__).parent
    code = hashlib.sha256()
    for name in _PLAN_CODE:
        code.update((here / name).read_bytes())
    libs = []
    for mod in ("databento_dbn",):
        spec = importlib.util.find_spec(mod)
        origin = spec.origin if spec is not None else None
        libs.append([origin, os.stat(origin).st_mtime_ns if origin else None])
    key = [PLAN_VERSION, code.hexdigest(), libs, [identity(p) for p in files], [str(o) for o in options]]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]


def _frozen(plan: Plan) -> dict:
    """``plan`` as data :func:`alphafeat.kept.encode` keeps (a header's ``databento_dbn.Metadata`` as its
    encoded bytes)."""
    files = [dataclasses.replace(f, metadata=None) for f in plan.files]
    return {"plan": dataclasses.replace(plan, files=files), "metadata": [f.metadata.encode() for f in plan.files]}


def _thawed(kept: object) -> Plan | None:
    """The plan :func:`_frozen` kept (None when ``kept`` is not one)."""
    import databento_dbn

    if not isinstance(kept, dict) or not isinstance(kept.get("plan"), Plan):
        return None
    plan = kept["plan"]
    policy = databento_dbn.VersionUpgradePolicy.AS_IS
    try:
        files = [dataclasses.replace(f, metadata=databento_dbn.Metadata.decode(m, policy))
                 for f, m in zip(plan.files, kept["metadata"], strict=True)]  # fmt: skip
    except Exception:  # databento_dbn's decoder refused it: plan again
        return None
    return dataclasses.replace(plan, files=files)


def _headers(files: list[Path], on_error: str, skipped: list) -> list[DBNFile]:
    """The header of each file; a bad one raises, or is skipped with ``on_error="skip"``."""
    out = []
    for p in files:
        try:
            out.append(open_dbn(p))
        except InputError as e:
            if on_error != "skip":
                raise
            log.warning("skipping %s", e)
            skipped.append((p, e.detail))
    if not out:
        raise InputError(files[0], "every input file was skipped (--on-error skip)")
    return out


def infer_schema(f: DBNFile, rtypes: Sequence[int]) -> str:
    """The schema of a live recording (no schema in its metadata) from the rtypes it holds: its
    deepest book data (mbo, mbp-10, mbp-1), else trades, else definitions.

    Raises
    ------
    InputError
        Naming the file and the rtypes found when it holds none of these.
    """
    for schema in (*BOOK_SCHEMAS, "trades", "definition"):
        if SCHEMA_RTYPES[schema] in rtypes:
            return schema
    found = ", ".join(f"0x{rt:02X}" for rt in rtypes) or "none"
    raise InputError(f.path, f"a live recording (no schema in its metadata) with no mbo, mbp-10, mbp-1, trades or "
                             f"definition records (rtypes found: {found})")  # fmt: skip


def _classify(headers: list[DBNFile]) -> tuple[list[DBNFile], list[DBNFile], list[DBNFile]]:
    book, trades, defs = [], [], []
    for f in headers:
        if f.schema in BOOK_SCHEMAS:
            book.append(f)
        elif f.schema == "trades":
            trades.append(f)
        elif f.schema == "definition":
            defs.append(f)
        else:
            raise InputError(
                f.path, f"schema {f.schema!r} is not supported (need mbo, mbp-10, mbp-1, trades or definition)"
            )
    if not book:
        first = (trades + defs)[0]
        raise InputError(
            first.path, f"schema {first.schema!r} is not book data; give at least one mbo, mbp-10 or mbp-1 file"
        )
    key = lambda f: (int(f.metadata.start), str(f.path))  # noqa: E731
    return sorted(book, key=key), sorted(trades, key=key), defs


def _continuous(f: DBNFile, survey: dict | None) -> str | None:
    """The continuous symbol (``ES.v.0``) a file was requested with, or None: from the
    metadata's stype_in and symbols, or the in-band mappings' input symbols (live)."""
    syms = [str(x) for x in (f.metadata.symbols or [])] + list((f.metadata.mappings or {}).keys())
    if survey is not None and survey.get("maps") is not None:
        syms += [bytes(x).rstrip(b"\x00").decode() for x in np.unique(survey["maps"]["stype_in_symbol"])]
    cont = [x for x in syms if CONTINUOUS_RE.fullmatch(x)]
    if cont:
        return cont[0]
    stype = getattr(f.metadata, "stype_in", None)
    return "continuous" if stype is not None and str(stype) == "continuous" else None


def _check_symbology(book: list[DBNFile], surveys: dict[Path, dict]) -> str | None:
    """The continuous symbol of a run of continuous-symbology book files, None for raw /
    parent symbology; a mix of the two is refused (one line naming a file of each)."""
    kinds = {f.path: _continuous(f, surveys.get(f.path)) for f in book}
    cont = [f for f in book if kinds[f.path]]
    if cont and len(cont) < len(book):
        other = next(f for f in book if not kinds[f.path])
        raise InputError(other.path, f"raw or parent symbology mixed with the continuous-symbology file {cont[0].path} "
                                     f"({kinds[cont[0].path]}): the continuous file already chose the contract of "
                                     "each date; give one kind of file per run")  # fmt: skip
    return kinds[cont[0].path] if cont else None



def _mapped_ids(f: DBNFile) -> set[int] | None:
    """Instrument ids the metadata maps (None when it maps none: unknown)."""
    ids = set()
    for ivs in (f.metadata.mappings or {}).values():
        for iv in ivs:
            try:
                ids.add(int(iv["symbol"]))
            except ValueError:
                pass
    return ids or None


def _check_overlaps(files: list[DBNFile]) -> None:
    """Two files of one schema whose time ranges overlap and that map a common instrument (or
    whose instruments are unknown) would double that instrument's records: refuse them.

    Raises
    ------
    InputError
        Naming both files (a file given twice under two names, or a copy).
    """
    spans = []
    for f in files:
        start, end = file_range(f)
        if end is not None:
            spans.append((start, end, f, _mapped_ids(f)))
    spans.sort(key=lambda x: x[0])
    for i, (_s0, e0, f0, ids0) in enumerate(spans):
        for s1, _e1, f1, ids1 in spans[i + 1 :]:
            if s1 >= e0:
                break
            if f0.schema == f1.schema and (ids0 is None or ids1 is None or ids0 & ids1):
                raise InputError(f1.path, f"{f1.schema} data overlaps {f0.path} in time and instruments: the same "
                                          "records would be read twice (a file given twice under two names, or a "
                                          "copy?); give each period once")  # fmt: skip



def _overlaps(f: DBNFile, groups: dict | None, day: dt.date, iid: int | None = None) -> bool:
    if groups is not None:
        d = (day - dt.date(1970, 1, 1)).days
        return any(k[0] == d and (iid is None or k[1] == iid) for k in groups)
    s0, s1 = session_bounds(day)
    start, end = file_range(f)
    return start < s1 and (end is None or end > s0)  # no end time (a live recording): open-ended


def make_plan(
    inputs: Sequence[str | os.PathLike[str]],
    *,
    mode: InstrumentMode | None = None,
    root: str = "ES",
    roll_rule: str = "volume",
    roll_days: int = 8,
    on_error: str = "raise",
    jobs: int = 1,
    survey_dir: str | os.PathLike[str] | None = None,
    schema: str | None = None,
) -> Plan:
    """The schedule and the segments of a run over DBN files (module docstring).

    Parameters
    ----------
    inputs : sequence of path
        DBN files or directories (:func:`discover`): book files of one or more schemas,
        optional trades and definition files (:mod:`alphafeat.sources`: per session the
        richest book schema; in front-month mode files of other roots or venues left out with
        a note).
    mode : InstrumentMode
        ``front-month`` (default), ``id=N`` or ``all``.
    root : str
        Product root of the front month (``ES``); calendar spreads never qualify.
    roll_rule : {"volume", "calendar"}
        :func:`alphafeat.instruments.front_month_schedule`.
    roll_days : int
        Calendar-rule margin in days.
    on_error : {"raise", "skip"}
        A bad file stops the plan, or is listed in ``Plan.skipped`` and left out.
    jobs : int
        joblib processes for the scans (-1: all cores).
    survey_dir : path, optional
        Where scans and plans are kept between runs (module docstring); None keeps none.
    schema : {"mbo", "mbp-10", "mbp-1"}, optional
        Use the book files of this schema only (``--schema``); None: the richest per session.

    Returns
    -------
    Plan

    Raises
    ------
    UsageError
        A bad value of an option (named, e.g. ``--roll-days: expected ... got -1``).
    InputError
        A bad or unsupported file (named, with the byte offset where it helps).
    SelectionError
        No candidate of ``root``, or no record of ``id=N``.
    """
    mode = validate_instrument_mode(mode or ModeKind.FRONT_MONTH)
    root, roll_days = validate_root(root), validate_int(roll_days, "--roll-days", lo=0, what="a number of days")
    roll_rule = validate_enum(roll_rule, RollRule, "--roll-rule").value
    on_error = validate_enum(on_error, OnError, "--on-error").value
    jobs = validate_jobs(jobs)
    schema = validate_book_schema(schema)
    # absolute, links kept as given (errors name the path the user gave); a path given twice is read once
    files = list(dict.fromkeys(Path(os.path.abspath(p)) for p in discover(inputs)))
    store = None if survey_dir is None else str(Path(survey_dir) / "survey")
    kept = None
    if survey_dir is not None:
        try:
            key = plan_key(files, [mode, root, roll_rule, roll_days, on_error, schema])
            kept = Path(survey_dir) / "plan" / f"{key}.json"
        except OSError:  # a file that cannot be stat'ed: the plan names it
            kept = None
        plan = None if kept is None else _thawed(_load_kept(kept))
        if plan is not None:
            return plan
    plan = _make_plan(files, mode, root, roll_rule, roll_days, on_error, jobs, store, schema)
    if kept is not None and not plan.skipped:  # a plan that left out a file is made again each time
        _keep(kept, _frozen(plan), "plan")
    return plan


def _make_plan(files: list[Path], mode: InstrumentMode, root: str, roll_rule: str, roll_days: int, on_error: str,
               jobs: int, store: str | None, forced: str | None) -> Plan:  # fmt: skip
    """The body of :func:`make_plan` (options checked, files discovered, no kept plan)."""
    skipped: list[tuple[Path, str]] = []
    headers, live, surveys, (book, trades, defs), notes = _inputs(files, mode, root, on_error, jobs, store, forced,
                                                                  skipped)  # fmt: skip
    continuous = _check_symbology(book, surveys)
    _check_overlaps(book)
    _check_overlaps(trades)
    schema = richest(f.schema for f in book)
    no_maps = [f for f in book if not f.metadata.mappings or file_range(f)[1] is None]
    need_volume = mode.kind == "front-month" and roll_rule == "volume" and not trades and not continuous
    scan_book = book if (need_volume or mode.kind != "front-month") else no_maps
    tasks = [(f, True) for f in trades + defs] + [(f, False) for f in scan_book]
    tasks = [t for t in tasks if t[0].path not in surveys]
    n_scan = scan_jobs(jobs, tasks, book)
    surveys.update(run_surveys(tasks, n_scan, store, on_error, skipped))
    dropped = {p for p, _ in skipped}
    book = [f for f in book if f.path not in dropped]
    trades = [f for f in trades if f.path not in dropped]
    defs = [f for f in defs if f.path not in dropped]
    if not book:
        raise InputError(skipped[0][0], "every book file was skipped (--on-error skip)")
    symbology = Symbology.build(
        [f.metadata for f in book + trades + defs],
        [s["defs"] for s in surveys.values() if s["defs"] is not None],
        [s["maps"] for s in surveys.values() if s["maps"] is not None],
    )
    groups = {f.path: groups_of(surveys[f.path], f.schema) for f in book if f.path in surveys}
    schedule = _schedule(mode, root, roll_rule, roll_days, continuous, symbology, book, trades, groups, surveys)
    cont_root = CONTINUOUS_RE.fullmatch(continuous).group("root") if continuous and continuous != "continuous" else root
    segments = _segments(schedule, mode, cont_root if continuous else None, root, book, trades, groups)
    schema = richest(s.schema for s in segments) if segments else schema
    notes += _notes(mode, scan_book, need_volume, headers, live, dropped, continuous, schedule)
    return Plan(schema, book + trades + defs, schedule, segments, skipped, notes, len(scan_book), continuous)


def _inputs(files: list[Path], mode: InstrumentMode, root: str, on_error: str, jobs: int, store: str | None,
            forced: str | None, skipped: list) -> tuple[list[DBNFile], list[DBNFile], dict[Path, dict],
                                                         tuple[list, list, list], list[str]]:  # fmt: skip
    """Step 1 of :func:`_make_plan`: the headers (a live recording's schema inferred from its
    records), the live recordings as read (no schema), their scans, the book, trades and
    definition files used (of schema ``forced``; in front-month mode, files of other roots or
    venues left out, named) and the notes so far."""
    headers = _headers(files, on_error, skipped)
    live = [f for f in headers if f.schema is None]  # live recordings: the schema comes from the records
    surveys = run_surveys([(f, False) for f in live], jobs, store, on_error, skipped)
    headers = [f if f.schema else dataclasses.replace(f, schema=infer_schema(f, surveys[f.path]["rtypes"]))
               for f in headers if f.schema or f.path in surveys]  # fmt: skip
    book, trades, defs = _classify(headers)
    book, notes = force_schema(book, forced)
    if mode.kind == "front-month":  # files of other roots or venues are left out, named
        kept, foreign = foreign_files(book + trades + defs, root)
        notes += foreign
        used = {f.path for f in kept}
        book, trades, defs = ([f for f in group if f.path in used] for group in (book, trades, defs))
    return headers, live, surveys, (book, trades, defs), notes


def _schedule(mode: InstrumentMode, root: str, roll_rule: str, roll_days: int, continuous: str | None,
              symbology: Symbology, book: list[DBNFile], trades: list[DBNFile], groups: dict[Path, dict],
              surveys: dict[Path, dict]) -> list[Choice]:  # fmt: skip
    """Step 2 of :func:`_make_plan`: the instruments chosen per session (front month, ``id=N`` or
    all; a continuous file's mapped contracts).

    Raises
    ------
    SelectionError
        No instrument matches the mode, or no outright contract of ``root`` is present.
    """
    present = _present(book, groups, symbology)
    if continuous:  # name each instrument by its contract (definitions, in-band mappings), else by its id
        present = {k: (v if not CONTINUOUS_RE.fullmatch(v) else f"id{k[1]}") for k, v in present.items()}
    if mode.kind == "id":
        present = {k: v for k, v in present.items() if k[1] == mode.instrument_id}
    if not present:
        raise SelectionError(_no_match(mode, "/".join(sorted({f.schema for f in book}, key=BOOK_RANK.index)), book,
                                       groups))  # fmt: skip
    if mode.kind != "front-month":
        order = (lambda x: (x[0][0], _first_seen(book, groups, *x[0]), x[0][1])) if continuous else None  # noqa: E731
        return [Choice(d, i, s, None, str(mode)) for (d, i), s in sorted(present.items(), key=order)]
    cand: dict[dt.date, dict[int, str]] = {}
    for (day, iid), sym in present.items():
        mapped = symbology.mapped(iid, day - dt.timedelta(days=1)) or symbology.mapped(iid, day) or sym
        if is_candidate(sym, root) or (continuous and is_candidate(mapped, root)):
            cand.setdefault(day, {})[iid] = sym
    if not cand:
        found = sorted(set(present.values()))
        raise SelectionError(
            f"no outright contract of root {root!r} (a whole symbol matching "
            f"{outright_pattern(root).pattern}) in the inputs; symbols found: {', '.join(found[:20]) or 'none'}"
        )
    if continuous:  # the file's mapping chose the contract of each date: keep every one, drop no record
        return [Choice(d, i, s, symbology.expiration(s, root, d), f"{continuous}: the mapped contract")
                for d in sorted(cand)
                for i, s in sorted(cand[d].items(), key=lambda x: (_first_seen(book, groups, d, x[0]), x[0]))]
    volume = _volume(trades if trades else book, surveys)
    return front_month_schedule(cand, volume, symbology, root, roll_days, rule=roll_rule)


def _notes(mode: InstrumentMode, scan_book: list[DBNFile], need_volume: bool, headers: list[DBNFile],
           live: list[DBNFile], dropped: set[Path], continuous: str | None,
           schedule: list[Choice]) -> list[str]:  # fmt: skip
    """Step 3 of :func:`_make_plan`: what the summary says of the book files whose records were
    read, of the live recordings and of a continuous run."""
    notes = []
    if scan_book:
        why = "no symbol mappings or end time in the metadata"
        if need_volume:
            why = "no trades file for the volume rule"
        elif mode.kind != "front-month":
            why = f"instrument mode {mode}"
        notes.append(f"planning read the records of {len(scan_book)} book file(s): {why}")
    for f in live:
        if f.path not in dropped:
            notes.append(f"{f.path}: a live recording (no schema in its metadata): read by rtype, schema "
                         f"{next(h.schema for h in headers if h.path == f.path)} inferred from its records, "
                         "in-band symbol mappings used")  # fmt: skip
    if continuous:
        notes += _continuous_notes(continuous, schedule)
    return notes


def _volume(files: list[DBNFile], surveys: dict[Path, dict]) -> dict[tuple[dt.date, int], float]:
    """Traded contracts per (session, instrument) from the scans of ``files`` (trades files, or
    book files without them): of book files, those of the richest schema holding the pair (two
    schemas of one session would count its trades twice)."""
    by: dict[tuple[dt.date, int], tuple[int, float]] = {}  # (schema rank, volume)
    epoch = dt.date(1970, 1, 1)
    for f in files:
        rank = BOOK_RANK.index(f.schema) if f.schema in BOOK_RANK else -1
        for (d, iid), (_, v, _) in (groups_of(surveys[f.path], f.schema) if f.path in surveys else {}).items():
            key = (epoch + dt.timedelta(days=int(d)), int(iid))
            r, have = by.get(key, (rank, 0.0))
            if rank < r:
                r, have = rank, 0.0
            if rank == r:
                by[key] = (r, have + v)
    return {k: v for k, (_, v) in by.items()}


def _continuous_notes(continuous: str, schedule: list[Choice]) -> list[str]:
    """What the summary says of a continuous run: which contracts the roll sessions hold."""
    held: dict[dt.date, list[str]] = {}
    for c in schedule:
        held.setdefault(c.session, []).append(c.raw_symbol if c.raw_symbol == f"id{c.instrument_id}"
                                              else f"{c.raw_symbol} (id {c.instrument_id})")  # fmt: skip
    rolls = [f"{d}: {' then '.join(v)}" for d, v in sorted(held.items()) if len(v) > 1]
    roll = f"; sessions holding a roll: {'; '.join(rolls)}" if rolls else ""
    notes = [f"continuous symbology {continuous}: every session keeps the contract(s) the mapping gives it "
             f"(schedule above), no record dropped{roll}"]
    if any(c.raw_symbol == f"id{c.instrument_id}" for c in schedule):
        notes.append(f"{continuous}: contracts named by instrument id; give the definition file to name them")
    return notes


def _first_seen(book: list[DBNFile], groups: dict[Path, dict], day: dt.date, iid: int) -> int:
    """When the instrument's records start in the session (ns): the first ``ts_recv`` of a
    scan, else the start of its mapping interval (a continuous file's roll at UTC midnight)."""
    d = (day - dt.date(1970, 1, 1)).days
    first = [g[(d, iid)][2] for g in groups.values() if (d, iid) in g]
    s0 = session_bounds(day)[0]
    for f in book:
        for ivs in (f.metadata.mappings or {}).values():
            for iv in ivs:
                if iv["symbol"] == str(iid) and iv["start_date"] <= day and iv["end_date"] >= day:
                    start = dt.datetime.combine(iv["start_date"], dt.time(), dt.timezone.utc)
                    first.append(max(s0, int(start.timestamp()) * 10**9))
    return min(first, default=s0)


def _no_match(mode: InstrumentMode, schema: str, book: list[DBNFile], groups: dict[Path, dict]) -> str:
    """One line for a selection that matches nothing: the files and the instrument ids present."""
    names = ", ".join(str(f.path) for f in book)
    ids = sorted({int(k[1]) for g in groups.values() for k in g})
    have = ", ".join(map(str, ids[:30])) + (f" and {len(ids) - 30} more" if len(ids) > 30 else "") if ids else "none"
    what = f"instrument_id {mode.instrument_id} has no" if mode.kind == "id" else "no instrument has"
    return f"--instrument-mode {mode}: {what} {schema} records in {names}; instrument ids present: {have}"


def _segments(schedule: list[Choice], mode: InstrumentMode, cont_root: str | None, root: str,
              book: list[DBNFile], trades: list[DBNFile], groups: dict[Path, dict]) -> list[Segment]:  # fmt: skip
    """One segment per schedule entry, from the book files of the richest schema holding its
    instrument in its session; two entries whose symbols would share a partition path (e.g.
    ids without a known contract) get the instrument id in its name."""
    rel = {}
    for c in schedule:
        sroot = root if mode.kind == "front-month" else root_of(c.raw_symbol)
        if cont_root and re.fullmatch(r"id\d+", c.raw_symbol):  # a contract of a continuous file not named
            sroot = cont_root
        rel[c] = (sroot, re.sub(r"[^A-Za-z0-9_.-]", "_", c.raw_symbol))
    seen: dict[tuple, int] = {}
    for c in schedule:
        key = (c.session, *rel[c])
        seen[key] = seen.get(key, 0) + 1
    segments = []
    for c in schedule:
        sroot, safe = rel[c]
        if seen[(c.session, sroot, safe)] > 1:
            safe = f"{safe}-id{c.instrument_id}"
        held = [f for f in book if _overlaps(f, groups.get(f.path), c.session, c.instrument_id)]
        schema = richest(f.schema for f in held) if held else richest(f.schema for f in book)
        segments.append(Segment(
            c.session, c.instrument_id, c.raw_symbol, sroot, schema,
            tuple(str(f.path) for f in held if f.schema == schema),
            tuple(str(f.path) for f in trades if _overlaps(f, None, c.session)),
            f"root={sroot}/session={c.session.isoformat()}/{safe}.arrow",
        ))  # fmt: skip
    return segments


def _present(book: list[DBNFile], groups: dict[Path, dict], symbology: Symbology) -> dict[tuple[dt.date, int], str]:
    """(session, instrument_id) -> raw symbol of the instruments with book data in each session:
    from the scan where a file was scanned, else from its metadata's symbol mappings."""
    out: dict[tuple[dt.date, int], str] = {}
    epoch = dt.date(1970, 1, 1)
    for f in book:
        g = groups.get(f.path)
        if g is not None:
            for (d, iid), (_, _, first) in g.items():
                utc = dt.datetime.fromtimestamp(first // 10**9, dt.timezone.utc).date()
                sym = symbology.resolve(int(iid), utc) or f"id{iid}"
                out.setdefault((epoch + dt.timedelta(days=int(d)), int(iid)), sym)
            continue
        for day in sessions_of(f):
            for sym, ivs in (f.metadata.mappings or {}).items():
                for iv in ivs:  # the session spans UTC dates day-1 and day
                    if iv["start_date"] <= day and iv["end_date"] > day - dt.timedelta(days=1):
                        try:
                            iid = int(iv["symbol"])
                        except ValueError:
                            continue
                        utc = max(iv["start_date"], day - dt.timedelta(days=1))
                        out.setdefault((day, iid), symbology.resolve(iid, utc) or sym)
    return out
