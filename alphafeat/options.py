"""Each option declared once: a config dataclass's field carries its rule, its help and its flag.

A field declared with :func:`opt` holds an :class:`Option` in its metadata. From it

* :func:`add_options` builds the argparse options of a command (flag from the field's name,
  ``type=`` its check, ``--help`` its help with ``(default: X)`` generated from the field's
  default, never written by hand),
* :func:`from_args` builds the dataclass from the parsed arguments,
* :func:`check_fields` checks a dataclass built in Python (or read from a config file) by the
  same rules, so a bad value is the same one line naming the option whichever way it came,
* :func:`render_cli_md` writes the markdown reference of whole command lines (``docs/cli.md``:
  ``python -m alphafeat.options --write docs/cli.md``).

A check is one of :mod:`alphafeat.validation`'s ``validate_*`` (with its keywords bound,
``functools.partial(validate_int, lo=1)``), called as ``check(value, option=NAME)``: it returns
the typed value or raises :class:`~alphafeat.errors.UsageError` naming the option. On the
command line that error is argparse's one line (``argument --jobs: expected ...``), exit 2.

Example::

    @dataclass
    class Config:
        jobs: int = opt(1, help="worker processes", check=validate_jobs)
        device: str = opt("auto", help="where it runs", enum=Device)

    p = Parser(prog="x")
    add_options(p, Config)
    cfg = from_args(Config, p.parse_args(["--jobs", "2"]))   # Config(jobs=2, device='auto')
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from alphafeat.errors import UsageError
from alphafeat.validation import validate_enum

__all__ = ["Option", "add_options", "argparse_type", "as_text", "check_fields", "fields_of", "from_args", "given",
           "help_text", "opt", "option_name", "optional", "reference", "render_cli_md", "render_fields_md"]  # fmt: skip

#: The key of a field's metadata holding its :class:`Option`.
KEY = "alphafeat.option"

Check = Callable[..., Any]


class _Unset:
    """The ``cli_default`` of an option whose command-line default is the field's."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


@dataclasses.dataclass(frozen=True)
class Option:
    """What :func:`opt` records of one option (see there)."""

    help: str
    check: Check | None = None
    flag: str | None = None
    metavar: str | None = None
    cli: bool = True
    nargs: str | int | None = None
    negate: bool = False
    cli_default: Any = UNSET
    default_text: str | None = None


def opt(default: Any = dataclasses.MISSING, *, help: str, check: Check | None = None,
        enum: type[Enum] | None = None, flag: str | None = None, metavar: str | None = None, cli: bool = True,
        nargs: str | int | None = None, negate: bool = False, default_factory: Callable[[], Any] | None = None,
        cli_default: Any = UNSET, default_text: str | None = None) -> Any:  # fmt: skip
    """A dataclass field that is an option: ``dataclasses.field(default=...)`` with an
    :class:`Option` in its metadata.

    Parameters
    ----------
    default, default_factory
        The field's default (as ``dataclasses.field``); none: a required field.
    help : str
        What the option does, in words, without its default (added by :func:`help_text`).
    check : callable, optional
        ``check(value, option=NAME)`` -> the typed value, or UsageError naming ``NAME``: a
        ``validate_*`` of :mod:`alphafeat.validation` (``functools.partial`` binds its keywords).
        With ``nargs`` it checks each item.
    enum : StrEnum class, optional
        The allowed values: the check is ``validate_enum`` and the metavar ``{a,b,c}``.
    flag : str, optional
        The option's flag (default ``--`` and the field's name with ``-`` for ``_``); also the
        name errors give, for an option off the command line (``cli=False``) too (without one,
        the field's name).
    metavar : str, optional
        The value's name in ``--help``.
    cli : bool
        Whether :func:`add_options` adds it (False: a Python and config-file option only).
    nargs : optional
        argparse's ``nargs`` (the values are extended over repeated flags).
    negate : bool
        A bool field that defaults to True, set False by the flag ``--no-NAME``.
    cli_default : optional
        The command line's default where it differs from the field's (a required field's).
    default_text : str, optional
        How ``--help`` words the default, where its value says too little (``None`` meaning
        "as many as the sessions allow").
    """
    if enum is not None:
        check = check or functools.partial(validate_enum, enum=enum)
        metavar = metavar or "{" + ",".join(str(m.value) for m in enum) + "}"
    meta = {KEY: Option(help, check, flag, metavar, cli, nargs, negate, cli_default, default_text)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def optional(check: Check) -> Check:
    """``check`` of a value that may also be None (an option whose default is "none given")."""

    def check_optional(value: Any, option: str) -> Any:
        return None if value is None else check(value, option=option)

    return check_optional


def as_text(check: Check) -> Check:
    """``check`` of an option kept as its text: the checked value's ``str()`` (``volume:50.0``
    -> ``volume:50``; None kept)."""

    def check_text(value: Any, option: str) -> Any:
        v = check(value, option=option)
        return None if v is None else str(v)

    return check_text


def fields_of(cls: Any) -> list[tuple[dataclasses.Field, Option]]:
    """The fields of the dataclass (or instance) ``cls`` declared with :func:`opt`, in order."""
    return [(f, f.metadata[KEY]) for f in dataclasses.fields(cls) if KEY in f.metadata]


def option_name(f: dataclasses.Field, o: Option) -> str:
    """The option's name in errors and ``--help``: its own flag, or ``--`` and the field's name
    with ``-`` for ``_`` (``--no-NAME`` for a negated bool); off the command line (``cli=False``,
    no flag) the field's name."""
    if o.flag:
        return o.flag
    if not o.cli:
        return f.name
    return ("--no-" if o.negate else "--") + f.name.replace("_", "-")


def _default(f: dataclasses.Field, o: Option) -> Any:
    """The command line's default of the field (MISSING: none)."""
    if o.cli_default is not UNSET:
        return o.cli_default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _show(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, (list, tuple)):
        return ",".join(_show(v) for v in value)
    return str(value)


def help_text(f: dataclasses.Field, o: Option) -> str:
    """The option's help: its words and ``(default: X)``, X the field's default (or its
    ``default_text``); a flag's (a bool) has none, nor has an option without a default."""
    if o.default_text is not None:
        return f"{o.help} (default: {o.default_text})"
    d = _default(f, o)
    if d is dataclasses.MISSING or d is None or isinstance(d, bool):
        return o.help
    return f"{o.help} (default: {_show(d) if _show(d) else 'none'})"


def argparse_type(check: Check, **kw: Any) -> Callable[[str], Any]:
    """``check(text, option="", **kw)`` as an argparse ``type=``: its UsageError becomes
    argparse's one-line error (``argument --horizons: expected ..., got '0'``), exit 2."""

    def convert(text: str) -> Any:
        try:
            return check(text, option="", **kw)
        except UsageError as e:
            raise argparse.ArgumentTypeError(e.problem) from None

    name = getattr(check, "__name__", None) or getattr(getattr(check, "func", None), "__name__", "value")
    convert.__name__ = name.removeprefix("validate_")
    return convert


def _selected(cls: Any, only: Iterable[str] | None, skip: Iterable[str]) -> list[tuple[dataclasses.Field, Option]]:
    fields = [(f, o) for f, o in fields_of(cls) if o.cli]
    names = {f.name for f, _ in fields}
    unknown = sorted((set(only or ()) | set(skip)) - names)
    if unknown:  # a programming error: a misspelt name would silently drop an option
        raise UsageError("add_options", f"no command-line option field(s) {', '.join(unknown)} in {cls.__name__}")
    if only is not None:
        order = list(only)
        fields = sorted((x for x in fields if x[0].name in order), key=lambda x: order.index(x[0].name))
    return [(f, o) for f, o in fields if f.name not in set(skip)]


def add_options(parser: argparse.ArgumentParser, cls: Any, *, only: Iterable[str] | None = None,
                skip: Iterable[str] = (), defaults: bool = True) -> list[str]:  # fmt: skip
    """Add the command-line options of the dataclass ``cls`` to ``parser``: one per field
    declared with :func:`opt` (``cli=True``), ``dest`` the field's name.

    ``only`` (in that order) or ``skip`` (field names) choose among them. ``defaults=False``: an
    option not given is None (:func:`given` leaves it out), for values laid over a config file;
    ``--help`` still names the field's default. Returns the field names added.
    """
    added = []
    for f, o in _selected(cls, only, skip):
        d = _default(f, o) if defaults else None
        kw: dict[str, Any] = {"dest": f.name, "help": help_text(f, o).replace("%", "%%")}
        if o.negate or f.type in (bool, "bool"):  # a flag
            kw.update(action="store_false" if o.negate else "store_true", default=d)
        else:
            flag = option_name(f, o)
            kw.update(default=None if d is dataclasses.MISSING else d,
                      metavar=o.metavar or flag.lstrip("-").upper().replace("-", "_"))
            if o.check is not None:
                kw["type"] = argparse_type(o.check)
            if o.nargs is not None:
                kw.update(nargs=o.nargs, action="extend")
        parser.add_argument(option_name(f, o), **kw)
        added.append(f.name)
    return added


def given(cls: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The values of ``cls``'s command-line option fields in ``args`` that are not None (with
    ``defaults=False``: the options given)."""
    return {f.name: getattr(args, f.name) for f, o in fields_of(cls)
            if o.cli and getattr(args, f.name, None) is not None}  # fmt: skip


def from_args(cls: Any, args: argparse.Namespace, **fixed: Any) -> Any:
    """``cls`` built from the parsed ``args`` (:func:`given`), with ``fixed`` (values the
    command sets itself) over them; the fields not given keep their defaults."""
    return cls(**{**given(cls, args), **fixed})


def check_fields(obj: Any, *, key: str | None = None, skip: Iterable[str] = ()) -> Any:
    """A copy of the dataclass ``obj`` with each field declared with :func:`opt` checked by its
    check and normalised (``"3"`` -> 3, enum strings as members, paths as ``Path``).

    ``key``: errors name ``KEY + field`` (a config file's ``train.epochs``); else the option's
    flag (:func:`option_name`), as the command line does. ``skip``: fields left unchecked.

    Raises
    ------
    alphafeat.errors.UsageError
        The first bad value, naming the option, the value and what is allowed.
    """
    values = {}
    for f, o in fields_of(obj):
        if o.check is None or f.name in set(skip):
            continue
        name = f"{key}{f.name}" if key is not None else option_name(f, o)
        v = getattr(obj, f.name)
        if o.nargs is not None:
            if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
                raise UsageError(name, "expected a list", v)
            values[f.name] = [o.check(x, option=name) for x in v]  # a list, as argparse gives
        else:
            values[f.name] = o.check(v, option=name)
    return dataclasses.replace(obj, **values)


# -- the markdown reference ---------------------------------------------------------------------------------------

#: Width of the usage lines in the reference (not the terminal's: the file must not depend on it).
USAGE_WIDTH = 100


def _usage(parser: argparse.ArgumentParser) -> str:
    old = parser.formatter_class
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=USAGE_WIDTH)  # type: ignore[assignment]
    try:
        return parser.format_usage().strip()
    finally:
        parser.formatter_class = old


def _cell(text: str | None) -> str:
    """``text`` on one line of a table: ``|`` escaped, and ``<`` (``<out parent>`` is no HTML tag)."""
    return " ".join((text or "").replace("%%", "%").split()).replace("|", "\\|").replace("<", "&lt;")


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    if hasattr(parser, "complete"):  # alphafeat.commandline.Parser: its deferred options too
        parser.complete()
    # argparse lists a parser's options only in its ``_actions`` (as sphinx-argparse reads them)
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def _signature(a: argparse.Action) -> str:
    names = ", ".join(a.option_strings) if a.option_strings else (a.metavar or a.dest)
    if a.option_strings and a.nargs != 0:
        names += " " + (a.metavar if isinstance(a.metavar, str) else a.dest.upper())
        if a.nargs in ("+", "*"):
            names += " ..."
    return names


def _section(parser: argparse.ArgumentParser, level: int) -> list[str]:
    out = [f"{'#' * level} `{parser.prog}`", ""]
    if parser.description:
        out += [_cell(parser.description).replace("\\|", "|"), ""]
    out += ["```text", _usage(parser), "```", ""]
    rows, subs = [], []
    for a in _actions(parser):
        if isinstance(a, argparse._SubParsersAction):
            subs = [(name, p) for name, p in a.choices.items()]
            continue
        sig = _signature(a).replace("|", "\\|")  # a pipe splits a table cell, code span or not (GFM)
        rows.append(f"| `{sig}` | {_cell(a.help)} |")
    if rows:
        out += ["| option | what it does |", "| --- | --- |", *rows, ""]
    for _, p in subs:
        out += _section(p, level + 1)
    return out


def _field_default(f: dataclasses.Field, o: Option) -> str:
    """A key's default as a JSON config file writes it (``true``, ``null``, ``[1, 2]``; text bare)."""
    if o.default_text is not None:
        return o.default_text
    d = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if d is dataclasses.MISSING:
        return "(required)"
    if isinstance(d, (bool, type(None), list, tuple)):
        return json.dumps(d, default=str)
    return _show(d)


def render_fields_md(title: str, cls: Any, note: str = "") -> list[str]:
    """A section of the reference for the keys of a config file: each field of ``cls``
    declared with :func:`opt` (its name, default and help), whether or not the command line has
    it."""
    rows = [f"| `{f.name}` | {_cell(_field_default(f, o))} | {_cell(o.help)} |" for f, o in fields_of(cls)]
    out = [f"### {title}", ""] + ([note, ""] if note else [])
    return out + ["| key | default | what it is |", "| --- | --- | --- |", *rows, ""]


def render_cli_md(parsers: Sequence[argparse.ArgumentParser],
                  configs: Sequence[tuple[str, Any, str]] = ()) -> str:  # fmt: skip
    """The markdown reference of command lines: for each parser and each of its commands a
    section with its description, usage and a table of its options (help and default as
    ``--help`` gives them); then, for each ``(title, config class, note)`` of ``configs``, the
    keys a config file may set (:func:`render_fields_md`). The same parsers give the same text
    whatever the terminal."""
    out = ["# Command-line reference", "",
           "Generated from the parsers and configs by `python -m alphafeat.options --write docs/cli.md`; do not "
           "edit by hand.", ""]  # fmt: skip
    for p in parsers:
        out += _section(p, 2)
    if configs:
        out += ["## Config-file keys", ""]
        for title, cls, note in configs:
            out += render_fields_md(title, cls, note)
    return "\n".join(out).rstrip() + "\n"


#: The modules whose ``build_parser()`` (and ``config_sections()``, where it has one) docs/cli.md describes.
COMMAND_MODULES = ("alphafeat.cli", "alphamodel.cli")


def reference(modules: Sequence[str] = COMMAND_MODULES) -> str:
    """:func:`render_cli_md` of the command lines of ``modules``: each module's
    ``build_parser()``, and the config sections its ``config_sections()`` gives, if any."""
    mods = [importlib.import_module(m) for m in modules]
    configs = [c for m in mods if hasattr(m, "config_sections") for c in m.config_sections()]
    return render_cli_md([m.build_parser() for m in mods], configs)


def main(argv: list[str] | None = None) -> int:
    """``python -m alphafeat.options [--write PATH] [MODULE ...]``: the reference of the
    command lines of MODULEs (default :data:`COMMAND_MODULES`; :func:`reference`) on stdout, or
    written to PATH."""
    ap = argparse.ArgumentParser(prog="python -m alphafeat.options", description=main.__doc__)
    ap.add_argument("modules", nargs="*", default=list(COMMAND_MODULES), help="modules with a build_parser()")
    ap.add_argument("--write", type=Path, default=None, metavar="PATH", help="write the reference to PATH")
    args = ap.parse_args(argv)
    text = reference(args.modules)
    if args.write is None:
        sys.stdout.write(text)
    else:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
