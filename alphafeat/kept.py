"""What a run keeps between runs in the predecoded folder (the plan's file scans and plans), as
JSON data with a format version: never a pickle, so that a folder others can write (the shared
filesystem a Dask cluster needs) holds data only, and reading it runs no code.

:func:`dump` writes ``{"format": ..., "format_version": ..., "data": ...}`` atomically; values
JSON has no type for are tagged objects: tuples, dicts with non-string keys, dates, paths,
bytes (base64), numpy arrays (dtype description, shape and base64 bytes; no object dtypes) and
numpy scalars, and the dataclasses and enums the caller names (by class name, field by field).
:func:`load` gives back what :func:`dump` wrote, or None, with a logged note, for a file of
another format or version, or one that cannot be read or decoded (the caller computes it again).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import json
import logging
import os
import uuid
from collections.abc import Iterable
from pathlib import Path, PurePath

import numpy as np

from alphafeat.errors import AlphafeatError

__all__ = ["FORMAT", "FORMAT_VERSION", "NotKept", "decode", "dump", "encode", "load"]

log = logging.getLogger(__name__)

#: The ``format`` of a kept file.
FORMAT = "alphafeat-kept"
#: The layout of :func:`encode`'s tags; bump to ignore the files kept by earlier layouts.
FORMAT_VERSION = 1
_TAG = "__kept__"


class NotKept(AlphafeatError):
    """A value :func:`encode` cannot keep, or data :func:`decode` did not write (:func:`dump` and
    :func:`load` catch it: nothing is kept, or the file is computed again)."""


def _dtype_descr(d: np.dtype) -> object:
    """A JSON description of numpy dtype ``d``: its string, or a structured dtype's names,
    formats, offsets and size (padding kept), or a sub-array's base and shape."""
    if d.hasobject:
        raise NotKept(f"numpy dtype {d} holds Python objects")
    if d.names:
        return {"names": list(d.names), "formats": [_dtype_descr(d.fields[n][0]) for n in d.names],
                "offsets": [d.fields[n][1] for n in d.names], "itemsize": d.itemsize}  # fmt: skip
    if d.subdtype is not None:
        return {"base": _dtype_descr(d.subdtype[0]), "shape": list(d.subdtype[1])}
    return d.str


def _dtype_of(descr: object) -> np.dtype:
    """The numpy dtype :func:`_dtype_descr` described; :class:`NotKept` for an object dtype."""
    if isinstance(descr, str):
        d = np.dtype(descr)
    elif "base" in descr:
        d = np.dtype((_dtype_of(descr["base"]), tuple(descr["shape"])))
    else:
        d = np.dtype({"names": descr["names"], "formats": [_dtype_of(f) for f in descr["formats"]],
                      "offsets": descr["offsets"], "itemsize": descr["itemsize"]})  # fmt: skip
    if d.hasobject:
        raise NotKept("an object dtype")
    return d


def encode(obj: object) -> object:
    """``obj`` as JSON-able data (tagged objects for the types JSON lacks); :class:`NotKept` for
    a type it cannot keep."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, tuple):
        return {_TAG: "tuple", "v": [encode(v) for v in obj]}
    if isinstance(obj, dict):
        return {_TAG: "dict", "v": [[encode(k), encode(v)] for k, v in obj.items()]}
    if isinstance(obj, dt.datetime | dt.date):
        return {_TAG: type(obj).__name__, "v": obj.isoformat()}
    if isinstance(obj, PurePath):
        return {_TAG: "path", "v": str(obj)}
    if isinstance(obj, bytes):
        return {_TAG: "bytes", "v": base64.b64encode(obj).decode()}
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        return {_TAG: "ndarray", "dtype": _dtype_descr(a.dtype), "shape": list(a.shape),
                "v": base64.b64encode(a.tobytes()).decode()}  # fmt: skip
    if isinstance(obj, np.generic):
        return {_TAG: "scalar", "dtype": _dtype_descr(obj.dtype), "v": encode(obj.item())}
    if isinstance(obj, enum.Enum):
        return {_TAG: "enum", "cls": type(obj).__name__, "v": encode(obj.value)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {_TAG: "dataclass", "cls": type(obj).__name__,
                "v": {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}  # fmt: skip
    raise NotKept(f"{type(obj).__name__} is not kept")


def decode(data: object, classes: dict[str, type]) -> object:
    """What :func:`encode` gave ``data`` for; dataclasses and enums only of ``classes`` (by
    name). :class:`NotKept`, ValueError, TypeError or KeyError for data it did not write."""
    if isinstance(data, list):
        return [decode(v, classes) for v in data]
    if not isinstance(data, dict):
        return data
    tag, v = data[_TAG], data.get("v")
    if tag == "tuple":
        return tuple(decode(x, classes) for x in v)
    if tag == "dict":
        return {decode(k, classes): decode(x, classes) for k, x in v}
    if tag in ("date", "datetime"):
        return (dt.date if tag == "date" else dt.datetime).fromisoformat(v)
    if tag == "path":
        return Path(v)
    if tag == "bytes":
        return base64.b64decode(v, validate=True)
    if tag == "ndarray":
        d = _dtype_of(data["dtype"])
        return np.frombuffer(base64.b64decode(v, validate=True), dtype=d).reshape(data["shape"]).copy()
    if tag == "scalar":
        return _dtype_of(data["dtype"]).type(v)
    cls = classes[data["cls"]]
    if tag == "enum" and issubclass(cls, enum.Enum):
        return cls(decode(v, classes))
    if tag == "dataclass" and dataclasses.is_dataclass(cls):
        return _dataclass(cls, {k: decode(x, classes) for k, x in v.items()})
    raise NotKept(f"unknown tag {tag!r}")


def _dataclass(cls: type, values: dict[str, object]) -> object:
    """An instance of dataclass ``cls`` with ``values`` (its init fields through ``__init__``,
    the others set after); :class:`NotKept` when they are not its fields."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if set(values) != set(fields):
        raise NotKept(f"{cls.__name__}: fields {sorted(values)} are not {sorted(fields)}")
    obj = cls(**{k: v for k, v in values.items() if fields[k].init})
    for k, v in values.items():
        if not fields[k].init:
            object.__setattr__(obj, k, v)
    return obj


def dump(path: Path, obj: object, what: str) -> None:
    """Keep ``obj`` at ``path`` (JSON, written to a temporary file and renamed); a write refused
    (disk full, ...) or a value that cannot be kept is logged and costs only the next run the
    work again."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    try:
        text = json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, "data": encode(obj)})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except (OSError, NotKept, TypeError, ValueError) as e:
        tmp.unlink(missing_ok=True)
        log.warning("%s: %s not kept (%s)", path, what, getattr(e, "strerror", None) or e)


def load(path: Path, classes: Iterable[type]) -> object | None:
    """What :func:`dump` kept at ``path``, or None when there is none; a file of another format
    or version, or one that cannot be read or decoded, is None too, with a logged note (it is
    computed again and replaced)."""
    if not path.is_file():
        return None
    try:
        kept = json.loads(path.read_text())
        if not isinstance(kept, dict) or kept.get("format") != FORMAT:
            log.info("%s: not a file alphafeat kept; ignored (computed again)", path)
            return None
        if kept.get("format_version") != FORMAT_VERSION:
            log.info("%s: kept in format version %r, not %d; ignored (computed again)", path,
                     kept.get("format_version"), FORMAT_VERSION)  # fmt: skip
            return None
        return decode(kept["data"], {c.__name__: c for c in classes})
    except (OSError, NotKept, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as e:
        log.info("%s: cannot be read (%s); ignored (computed again)", path, e)
        return None
