"""Which input files a run uses: a Databento download folder as it comes.

A download folder commonly holds several book schemas (MBO, MBP-10, MBP-1) for overlapping
periods beside trades and definition files, and sometimes files of other products or venues.
The plan (:func:`alphafeat.plan.make_plan`) takes, per session and instrument, the book data of
the richest schema that holds it (:data:`BOOK_RANK`: MBO, then MBP-10, then MBP-1) or the one
``--schema`` forces (:func:`force_schema`); trades and definition files are used whatever the
book schema. In front-month mode, files whose symbols all belong to other roots, or whose
venue (DBN ``dataset``) is not that of the root's book files, are left out with a note naming
them (:func:`foreign_files`). Overlapping files of one schema stay refused
(``alphafeat.plan._check_overlaps``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

from alphafeat.dbn import BOOK_SCHEMAS, DBNFile
from alphafeat.errors import DataError, InputError
from alphafeat.instruments import CONTINUOUS_RE, MONTH_CODES

__all__ = ["BOOK_RANK", "file_roots", "force_schema", "foreign_files", "richest", "symbol_root"]

#: Book schemas from the richest: a session is built from the first one that holds it.
BOOK_RANK: tuple[str, ...] = BOOK_SCHEMAS
_OUTRIGHT_OR_SPREAD = re.compile(rf"^([A-Za-z0-9]+?)[{MONTH_CODES}]\d{{1,2}}(?:-.*)?$")
_PARENT = re.compile(r"^([A-Za-z0-9]+)\.(FUT|OPT|SPOT|MINI)$")


def richest(schemas: Iterable[str]) -> str:
    """The richest book schema among ``schemas`` (:data:`BOOK_RANK`); ``DataError`` if none."""
    have = set(schemas)
    for s in BOOK_RANK:
        if s in have:
            return s
    raise DataError(f"no book schema among {sorted(have)}")


def force_schema(book: Sequence[DBNFile], schema: str | None) -> tuple[list[DBNFile], list[str]]:
    """The book files of ``schema`` (None: all of them) and the note naming those left out.

    Raises
    ------
    InputError
        No book file of ``schema`` (naming the first book file and the schemas found).
    """
    if schema is None:
        return list(book), []
    kept = [f for f in book if f.schema == schema]
    left = [f for f in book if f.schema != schema]
    if not kept:
        found = ", ".join(sorted({str(f.schema) for f in book}))
        raise InputError(book[0].path, f"--schema {schema}: no {schema} book file among the inputs (book schemas "
                                       f"found: {found})")  # fmt: skip
    notes = [f"--schema {schema}: {f.schema} book file not used: {f.path}" for f in left]
    return kept, notes


def symbol_root(symbol: str) -> str | None:
    """The product root of a symbol: ``ESH4``, ``ESH4-ESM4`` -> ``ES``; ``ES.FUT`` (parent) and
    ``ES.v.0`` (continuous) -> ``ES``; None when the symbol names no root (``ALL_SYMBOLS``, an
    instrument id)."""
    for pattern in (CONTINUOUS_RE, _PARENT, _OUTRIGHT_OR_SPREAD):
        m = pattern.fullmatch(symbol)
        if m:
            return m.group(1)
    return None


def file_roots(f: DBNFile) -> set[str] | None:
    """The roots of the symbols a file was requested with and maps (metadata ``symbols`` and
    ``mappings``); None when one of them names no root, or there are none (unknown)."""
    syms = [str(s) for s in (f.metadata.symbols or [])] + [str(s) for s in (f.metadata.mappings or {})]
    roots = {symbol_root(s) for s in syms}
    if not syms or None in roots:
        return None
    return {r for r in roots if r is not None}


def foreign_files(files: Sequence[DBNFile], root: str) -> tuple[list[DBNFile], list[str]]:
    """``files`` less those of other roots or venues, and one note per file left out.

    A file is of another root when every symbol of its metadata has a root and none is
    ``root`` (:func:`file_roots`; a file whose symbols are unknown is kept). Of the rest, the
    venue is the ``dataset`` most of the book files hold; a file of another dataset is left
    out. When no book file of ``root`` remains, nothing is left out (the plan then says that
    no contract of ``root`` was found, listing the symbols).
    """
    notes: list[str] = []
    keep: list[DBNFile] = []
    for f in files:
        roots = file_roots(f)
        if roots is not None and root not in roots:
            notes.append(f"skipped {f.path}: its symbols are of root {', '.join(sorted(roots))}, not {root}")
        else:
            keep.append(f)
    book = [f for f in keep if f.schema in BOOK_SCHEMAS]
    if not book:
        return list(files), []
    venue = Counter(str(f.metadata.dataset) for f in book).most_common(1)[0][0]
    out = []
    for f in keep:
        if str(f.metadata.dataset) != venue:
            notes.append(f"skipped {f.path}: venue {f.metadata.dataset}, not {venue} (that of the {root} book files)")
        else:
            out.append(f)
    return out, notes

