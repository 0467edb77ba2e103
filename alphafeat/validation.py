"""Every option's allowed values, and one ``validate_*`` per option.

In the style of ``databento.common.validation``: each function takes the value (as the CLI
gives it, a string, or as the Python API does, a typed value) and the option's name, and
returns the typed value or raises :class:`~alphafeat.errors.UsageError` whose one line names
the option, the value and what is allowed. The CLI (as argparse ``type=``, through
:func:`alphafeat.commandline.option`), the Python API (:func:`alphafeat.precompute.job.make_job`,
:func:`alphafeat.plan.make_plan`, :func:`alphafeat.synth.generate`) and alphamodel's config
loading (:mod:`alphamodel.config`) call the same functions; alphamodel's own enums are in
:mod:`alphamodel.enums`.

The enums are ``StrEnum`` s: a member equals its string (``Device.CPU == "cpu"``) and is
written to JSON as that string, so configs and manifests hold plain strings.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TypeVar

from alphafeat.errors import UsageError

__all__ = [
    "Barrier", "BarrierKind", "Compression", "Device", "Dtype", "InstrumentMode", "ModeKind", "OnError", "Predecoded",
    "RollRule", "Sample", "SampleKind", "Scale", "SignalKind", "StrEnum", "SynthSchema", "allowed_values", "env_count",
    "split_list",
    "validate_barrier", "validate_bool", "validate_costs",
    "validate_date", "validate_enum", "validate_float", "validate_horizon", "validate_horizons", "validate_horizons_s",
    "validate_instrument_mode", "validate_int", "validate_jobs", "validate_path", "validate_root", "validate_sample",
    "validate_scheduler", "validate_schemas", "validate_signal",
]  # fmt: skip



class StrEnum(str, Enum):
    """A str-valued enum (``enum.StrEnum`` of Python 3.11, here for 3.10): ``str()``,
    f-strings and JSON give the value."""

    __str__ = str.__str__
    __format__ = str.__format__


E = TypeVar("E", bound=StrEnum)


def _enum(name: str, doc: str, *values: str) -> type[StrEnum]:
    """A StrEnum of ``values``; member names are the values upper-cased, ``-`` as ``_``."""
    cls = StrEnum(name, [(v.upper().replace("-", "_"), v) for v in values], module=__name__)
    cls.__doc__ = doc
    return cls


Device = _enum("Device", "Where features (alphafeat) or the model (alphamodel) run.", "auto", "cpu", "cuda")
RollRule = _enum("RollRule", "Front-month rule (alphafeat.instruments).", "volume", "calendar")
OnError = _enum("OnError", "A bad input file stops the run, or is skipped with a warning.", "raise", "skip")
Compression = _enum("Compression", "Arrow IPC buffer compression of the cache.", "none", "lz4", "zstd")
Dtype = _enum("Dtype", "Storage of feature columns (computed in float64 either way).", "float32", "float64")
Predecoded = _enum("Predecoded", "Which segment books are kept for reruns (--predecoded).", "auto", "keep", "none")
Scale = _enum("Scale", "Activity level of alphafeat synth.", "quiet", "normal", "busy", "full")
SignalKind = _enum("SignalKind", "Where alphafeat synth plants the leading outright's predictability: the "
                   "current book, the order flow of the last minutes, or both.", "book", "history", "both")
SynthSchema = _enum("SynthSchema", "Schemas alphafeat synth writes.", "mbo", "mbp-10", "trades", "definition")
ModeKind = _enum("ModeKind", "--instrument-mode: every instrument, one id, or the front month of --root.",
                 "all", "id", "front-month")  # fmt: skip
SampleKind = _enum("SampleKind", "A row per book snapshot, or per volume bar.", "snapshot", "volume")
BookSchema = _enum("BookSchema", "--schema: the book schema a run uses (default: the richest per session).",
                   "mbo", "mbp-10", "mbp-1")
Preopen = _enum("Preopen", "--preopen: the crossed-book rows of an auction (the pre-open) are written, or not.",
                "keep", "drop")
BarrierKind = _enum("BarrierKind", "Triple-barrier width: K ticks, or K realised volatilities.", "ticks", "vol")


def allowed_values(enum: type[StrEnum]) -> str:
    """The members of ``enum`` as a message lists them: ``"a, b or c"``."""
    names = [str(m) for m in enum]
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]


def validate_enum(value: object, enum: type[E], option: str) -> E:
    """``value`` as a member of ``enum`` (a member, or its string); UsageError listing the members."""
    try:
        return enum(value)
    except ValueError:
        raise UsageError(option, f"expected {allowed_values(enum)}", value) from None


def validate_int(value: object, option: str, *, lo: int | None = None, hi: int | None = None,
                 what: str = "a whole number") -> int:
    """``value`` (an int, an integral float or a decimal string) as an int in ``[lo, hi]``.

    Booleans, fractions and other text are refused: UsageError naming ``option``.
    """
    if lo is not None and hi is not None:
        bounds = f" in [{lo}, {hi}]"
    else:
        bounds = f" >= {lo}" if lo is not None else (f" <= {hi}" if hi is not None else "")
    expected = f"expected {what}{bounds}"
    n = _as_int(value)
    if n is None or (lo is not None and n < lo) or (hi is not None and n > hi):
        raise UsageError(option, expected, value)
    return n


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return int(value.strip()) if re.fullmatch(r"\s*[-+]?\d+\s*", value) else None
    try:
        n = int(value)  # numpy integers too
    except (TypeError, ValueError, OverflowError):
        return None
    return n if n == value else None


def validate_float(value: object, option: str, *, lo: float | None = None, hi: float | None = None,
                   lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` (a real number or its decimal string) as a finite float within the bounds
    (``lo_open`` / ``hi_open``: the bound itself is excluded)."""
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi:g}")
    expected = "expected a number" + (f" {' and '.join(parts)}" if parts else "")
    x = None
    if not isinstance(value, bool):
        try:
            x = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            x = None
    ok = x is not None and x == x and abs(x) != float("inf")
    if ok and lo is not None:
        ok = x > lo if lo_open else x >= lo
    if ok and hi is not None:
        ok = x < hi if hi_open else x <= hi
    if not ok:
        raise UsageError(option, expected, value)
    return float(x)  # type: ignore[arg-type]


def validate_bool(value: object, option: str) -> bool:
    """``value`` as a bool: True/False only (a config file's ``1`` or ``"yes"`` is refused)."""
    if not isinstance(value, bool):
        raise UsageError(option, "expected true or false", value)
    return value


def validate_path(value: object, option: str) -> Path:
    """``value`` (str or path-like) as a ``Path`` with ``~`` expanded; it need not exist."""
    if isinstance(value, str) and not value.strip():
        raise UsageError(option, "expected a path", value)
    try:
        return Path(os.fspath(value)).expanduser()  # type: ignore[arg-type]
    except TypeError:
        raise UsageError(option, "expected a path (str or os.PathLike)", value) from None


def validate_jobs(value: object, option: str = "--jobs") -> int:
    """Worker processes: ``>= 1``, or ``-1`` for all the cores the process may use
    (:func:`alphafeat.cores.usable_cores`)."""
    n = _as_int(value)
    if n is None or not (n >= 1 or n == -1):
        raise UsageError(option, "expected a number of processes >= 1, or -1 for all the cores it may use", value)
    return n


def validate_horizon(value: object, option: str = "horizon", *, integer: bool = True) -> int | float:
    """One label horizon: a whole number of snapshots >= 1 (``integer``), or seconds > 0."""
    if integer:
        return validate_int(value, option, lo=1, what="a whole number of snapshots")
    return validate_float(value, option, lo=0.0, lo_open=True)


def split_list(value: object, option: str) -> list:
    """The items of ``value``: a comma-separated string (stripped; ``""`` is none) or an iterable;
    UsageError naming ``option`` for anything else."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",")] if value.strip() else []
    if isinstance(value, Iterable):
        return list(value)
    raise UsageError(option, "expected a comma-separated list", value)


def validate_horizons(value: object, option: str = "--horizons") -> tuple[int, ...]:
    """Label horizons in snapshots: ``"30,100"`` or a sequence; each a whole number >= 1, distinct,
    at least one. ``0``, negatives, fractions, words and repeats are refused."""
    expected = "expected distinct whole numbers of snapshots >= 1, comma-separated"
    items = split_list(value, option)
    out = tuple(_as_int(h) for h in items)
    if not out or any(h is None or h < 1 for h in out) or len(set(out)) != len(out):
        raise UsageError(option, expected, value)
    return out  # type: ignore[return-value]


def validate_horizons_s(value: object, option: str = "horizons_s") -> tuple[float, ...]:
    """Label horizons in seconds: each a number > 0, distinct (may be none)."""
    out = tuple(validate_horizon(h, option, integer=False) for h in split_list(value, option))
    if len(set(out)) != len(out):
        raise UsageError(option, "expected distinct numbers of seconds > 0", value)
    return out


def validate_costs(value: object, option: str = "--costs", *, hi: float = 10.0) -> tuple[float, ...]:
    """Cost levels in ticks per contract per side (alphamodel backtest): ``"0,0.0625,0.25"`` or a
    sequence; each a number in ``[0, hi]``, distinct, at least one."""
    expected = f"expected distinct numbers of ticks in [0, {hi:g}], comma-separated"
    try:
        out = tuple(validate_float(c, option, lo=0.0, hi=hi) for c in split_list(value, option))
    except UsageError:
        out = ()
    if not out or len(set(out)) != len(out):
        raise UsageError(option, expected, value)
    return out


@dataclass(frozen=True)
class InstrumentMode:
    """``all`` | ``id=N`` | ``front-month``; ``str()`` gives the CLI form back."""

    kind: ModeKind
    instrument_id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", validate_enum(self.kind, ModeKind, "instrument mode"))
        if (self.kind == ModeKind.ID) != (self.instrument_id is not None):
            raise UsageError("instrument mode", "expected an instrument_id with id (and only with id)",
                             self.instrument_id)

    @classmethod
    def parse(cls, text: str) -> InstrumentMode:
        """The CLI form; UsageError on anything else (as :func:`validate_instrument_mode`)."""
        return validate_instrument_mode(text)

    def __str__(self) -> str:
        return f"id={self.instrument_id}" if self.kind == ModeKind.ID else str(self.kind)


def validate_instrument_mode(value: object, option: str = "--instrument-mode") -> InstrumentMode:
    """``all``, ``front-month`` or ``id=N`` (N a whole number >= 0); an InstrumentMode is kept."""
    if isinstance(value, InstrumentMode):
        value = str(value)
    t = value.strip() if isinstance(value, str) else None
    if t in (ModeKind.ALL, ModeKind.FRONT_MONTH):
        return InstrumentMode(ModeKind(t))
    n = _as_int(t[3:]) if t is not None and t.startswith("id=") else None
    if n is None or n < 0:
        raise UsageError(option, "expected all, id=N (N an instrument_id >= 0) or front-month", value)
    return InstrumentMode(ModeKind.ID, n)


def _kind_number(value: object, option: str, kinds: type[E], expected: str) -> tuple[E, float]:
    """Parse ``KIND:K`` with K > 0 (``volume:50``, ``ticks:4``)."""
    kind, _, k = value.partition(":") if isinstance(value, str) else ("", "", "")
    try:
        return kinds(kind.strip()), validate_float(k, option, lo=0.0, lo_open=True)
    except (ValueError, UsageError):
        raise UsageError(option, expected, value) from None


@dataclass(frozen=True)
class Sample:
    """``snapshot`` (a row per book snapshot) or ``volume:V`` (a row per V-contract volume bar)."""

    kind: SampleKind
    volume: float = 0.0

    def __str__(self) -> str:
        return f"volume:{self.volume:g}" if self.kind == SampleKind.VOLUME else str(self.kind)


def validate_sample(value: object, option: str = "--sample") -> Sample:
    """``snapshot`` or ``volume:V`` with V > 0 contracts."""
    if isinstance(value, Sample):
        return value
    if isinstance(value, str) and value.strip() == SampleKind.SNAPSHOT:
        return Sample(SampleKind.SNAPSHOT)
    kind, v = _kind_number(value, option, SampleKind, "expected snapshot or volume:V with V > 0 contracts")
    if kind != SampleKind.VOLUME:
        raise UsageError(option, "expected snapshot or volume:V with V > 0 contracts", value)
    return Sample(kind, v)


@dataclass(frozen=True)
class Barrier:
    """Triple-barrier widths: ``ticks:K`` (K ticks each side) or ``vol:K`` (K realised vols)."""

    kind: BarrierKind
    k: float

    def __str__(self) -> str:
        return f"{self.kind}:{self.k:g}"


def validate_barrier(value: object, option: str = "--barrier") -> Barrier | None:
    """``ticks:K`` or ``vol:K`` with K > 0; None (or an empty string) for no triple barrier."""
    if value is None or value == "":
        return None
    if isinstance(value, Barrier):
        return value
    return Barrier(*_kind_number(value, option, BarrierKind, "expected ticks:K or vol:K with K > 0"))


def validate_date(value: object, option: str) -> dt.date:
    """A calendar date, ``YYYY-MM-DD`` (or a ``datetime.date``)."""
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value).strip())
    except ValueError:
        raise UsageError(option, "expected a date YYYY-MM-DD", value) from None


def validate_schemas(value: object, option: str = "--schemas") -> tuple[SynthSchema, ...]:
    """Synthetic schemas, comma-separated, at least one, each once: any of mbo, mbp-10, trades, definition."""
    items = split_list(value, option)
    try:
        out = tuple(SynthSchema(s) for s in items)
    except ValueError:
        out = ()
    if not out or len(set(out)) != len(out):
        raise UsageError(option, f"expected distinct schemas among {allowed_values(SynthSchema)}, comma-separated",
                         value)
    return out


def validate_signal(value: object, option: str = "--signal") -> float:
    """Strength of alphafeat synth's planted predictability: a finite number >= 0 (0: a
    martingale mid, no predictability; 1: the default)."""
    try:
        return validate_float(value, option, lo=0.0)
    except UsageError:
        raise UsageError(option, "expected a signal strength >= 0 (0: none, 1: the default)", value) from None


def validate_root(value: object, option: str = "--root") -> str:
    """A product root: letters and digits (``ES``, ``NQ``, ``6E`` is ``6E``)."""
    if not (isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9]+", value)):
        raise UsageError(option, "expected a product root of letters and digits (ES, NQ)", value)
    return value


def validate_scheduler(value: object, option: str = "--scheduler") -> str | None:
    """A Dask scheduler address (``tcp://host:8786``, ``host:8786``); None for no cluster."""
    if value is None:
        return None
    if not (isinstance(value, str) and re.fullmatch(r"(\w+://)?[^\s/:]+(:\d+)?/?", value)):
        raise UsageError(option, "expected a scheduler address such as tcp://host:8786", value)
    return value


def validate_book_schema(value: object, option: str = "--schema") -> str | None:
    """The forced book schema: ``mbo``, ``mbp-10`` or ``mbp-1``; None (or ``auto``): the
    richest per session (:mod:`alphafeat.sources`)."""
    if value is None or value == "auto":
        return None
    return validate_enum(value, BookSchema, option).value


def validate_preopen(value: object, option: str = "--preopen") -> str:
    """What precompute does with the crossed-book rows of an auction: ``keep`` (written, flagged
    in ``book_crossed``) or ``drop`` (not written)."""
    return validate_enum(value, Preopen, option).value


def env_count(name: str, default: int) -> int:
    """A positive integer from the environment variable ``name`` (settings for measurements,
    such as ``ALPHAFEAT_GPU_ROWS``), or ``default`` where unset. ``UsageError`` naming the
    variable otherwise."""
    text = os.environ.get(name, "")
    try:
        value = int(text) if text else default
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(name, "expected a positive integer", text)
    return value
