"""alphamodel's errors: :class:`AlphamodelError` and its kinds, one family with alphafeat's.

Each is also the matching :mod:`alphafeat.errors` class (an ``alphamodel`` usage error is an
``alphafeat.errors.UsageError``), so the CLI and callers handle both packages alike: one line,
exit status 2 for usage errors and 1 for the rest.

==========================  ==================================================  ===========
class                        what is at fault                                   CLI exit
==========================  ==================================================  ===========
:class:`UsageError`          an option's or argument's value (``--epochs 0``)   2
:class:`ConfigError`         a value in a ``--config`` file (names file, key)   1
:class:`CacheError`          the cache (missing, no partition, bad column)      1
:class:`DataError`           what the cache holds (too few rows for a window)   1
:class:`TrainingError`       a run that went wrong (the loss became NaN)        1
==========================  ==================================================  ===========
"""

from __future__ import annotations

import os

from alphafeat import errors as af

__all__ = ["AlphamodelError", "CacheError", "ConfigError", "DataError", "TrainingError", "UsageError"]


class AlphamodelError(af.AlphafeatError):
    """Base class of every error alphamodel raises on purpose (an AlphafeatError too)."""


class UsageError(AlphamodelError, af.UsageError):
    """A bad value of an option or argument (``option``, ``value``): exit status 2."""


class ConfigError(AlphamodelError, af.InputError):
    """A bad value in a config file: ``path`` the file, ``option`` the key (``train.epochs``)."""

    def __init__(self, path: str | os.PathLike[str], option: str, problem: str) -> None:
        self.option = option
        super().__init__(path, f"{option}: {problem}" if option else problem)


class CacheError(AlphamodelError, af.CacheError):
    """A cache that cannot be read as asked (``path``: the folder or file)."""


class DataError(AlphamodelError, af.DataError):
    """The cache cannot give what training needs (``path`` where known)."""


class TrainingError(AlphamodelError):
    """Training that cannot give a result: the loss or the model's scores not finite (the
    message names the step and the last finite loss)."""
