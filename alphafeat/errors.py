"""Errors that reach the user as one line naming the file and the problem."""

from __future__ import annotations

import os


class AlphafeatError(Exception):
    """Base class of every error this package raises on purpose.

    The CLI prints ``str(error)`` as one line and exits non-zero; no traceback.
    """


class InputError(AlphafeatError):
    """A bad input file.

    Parameters
    ----------
    path : str or os.PathLike
        The file at fault.
    problem : str
        What is wrong, in words.
    offset : int, optional
        Byte offset in the DBN stream where it went wrong (for ``.zst`` files, of the
        decompressed stream, and the message says so).
    record : int, optional
        Index of the record (0-based, in file order) where it went wrong.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        problem: str,
        *,
        offset: int | None = None,
        record: int | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        self.offset = offset
        self.record = record
        where = []
        if offset is not None:
            # DBN offsets count the decompressed stream; say so where that differs from the file
            stream = " of the decompressed stream" if self.path.endswith((".zst", ".zstd")) else ""
            where.append(f"byte offset {offset}{stream}")
        if record is not None:
            where.append(f"record {record}")
        at = f" (at {', '.join(where)})" if where else ""
        super().__init__(f"{self.path}: {problem}{at}")


class SelectionError(AlphafeatError):
    """No instrument matches the requested selection (e.g. no outright of the root)."""
