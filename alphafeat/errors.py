"""Errors that reach the user as one line naming the file or option and the problem.

One family: every error this package raises on purpose is an :class:`AlphafeatError`, of one
of four kinds, each carrying what it knows of where it went wrong:

==================  ====================================================  ==========  =========
class               what is at fault                                      carries     CLI exit
==================  ====================================================  ==========  =========
:class:`UsageError`  an option's or argument's value (``--horizons 0``)   ``option``  2
:class:`InputError`  an input file (cut, not DBN, unreadable)             ``path``,   1
                                                                          ``offset``,
                                                                          ``record``
:class:`DataError`   what the data holds (no rows, too few samples)       ``path``    1
:class:`CacheError`  a cache folder (not a cache, old format, foreign)    ``path``    1
==================  ====================================================  ==========  =========

:class:`UsageError` and :class:`DataError` are also ``ValueError`` s, so code that caught the
``ValueError`` s of earlier versions still does. ``exit_code`` is the CLI's exit status.
"""

from __future__ import annotations

import os

__all__ = ["AlphafeatError", "CacheError", "DataError", "InputError", "SelectionError", "UsageError"]


class AlphafeatError(Exception):
    """Base class of every error this package raises on purpose.

    The CLI prints ``str(error)`` as one line (the traceback only with ``-v``) and exits
    with ``exit_code``: 1 here and for data errors, 2 for usage errors.
    """

    exit_code = 1

    def __reduce__(self) -> tuple:
        """Pickled as its class, message and attributes (``path``, ``offset``, ``option``, ...),
        so that an error a worker process raises reaches the parent as itself: the default
        rebuilds it by calling the class with the message alone, which the subclasses'
        signatures refuse."""
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type[AlphafeatError], args: tuple, state: dict) -> AlphafeatError:
    """An error of ``cls`` with ``args`` and attributes ``state``, without calling its ``__init__``."""
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


def _show(value: object) -> str:
    """A value as an error line shows it: strings quoted, sequences comma-joined."""
    if isinstance(value, list | tuple):
        return repr(",".join(map(str, value)))
    return repr(str(value)) if isinstance(value, str) else repr(value)


class UsageError(AlphafeatError, ValueError):
    """A bad value of an option (CLI) or argument (Python API): exit status 2.

    Parameters
    ----------
    option : str
        The option as the user wrote it (``--horizons``) or the argument's name.
    problem : str
        What is allowed or wrong, in words (``expected whole numbers >= 1``).
    value : object, optional
        The value given; the message ends with ``got <value>``.
    """

    exit_code = 2
    _UNSET = object()

    def __init__(self, option: str, problem: str, value: object = _UNSET) -> None:
        self.option = option
        self.problem = problem if value is self._UNSET else f"{problem}, got {_show(value)}"
        self.value = None if value is self._UNSET else value
        super().__init__(f"{option}: {self.problem}" if option else self.problem)


def _where(path: str | os.PathLike[str] | None, problem: str) -> str:
    return f"{os.fspath(path)}: {problem}" if path is not None else problem


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
    decompressed : bool, optional
        Whether ``offset`` counts decompressed bytes (the reader knows: it decides by the
        file's magic); by default, whether the name ends in ``.zst`` / ``.zstd``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        problem: str,
        *,
        offset: int | None = None,
        record: int | None = None,
        decompressed: bool | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        self.offset = offset
        self.record = record
        where = []
        if offset is not None:
            # DBN offsets count the decompressed stream; say so where that differs from the file
            if decompressed is None:
                decompressed = self.path.endswith((".zst", ".zstd"))
            stream = " of the decompressed stream" if decompressed else ""
            where.append(f"byte offset {offset}{stream}")
        if record is not None:
            where.append(f"record {record}")
        at = f" (at {', '.join(where)})" if where else ""
        #: The message without the path: what is wrong and where in the file.
        self.detail = f"{problem}{at}"
        super().__init__(f"{self.path}: {self.detail}")


class DataError(AlphafeatError, ValueError):
    """The data cannot give what was asked (no rows for the instruments, too few samples for
    the folds); ``path`` names the file or folder where known."""

    def __init__(self, problem: str, path: str | os.PathLike[str] | None = None) -> None:
        self.path = os.fspath(path) if path is not None else None
        self.problem = problem
        super().__init__(_where(path, problem))


class SelectionError(DataError):
    """No instrument matches the requested selection (e.g. no outright of the root)."""


class CacheError(AlphafeatError):
    """A cache folder that cannot be read or written as asked (``path``: the folder or file)."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(_where(path, problem))
