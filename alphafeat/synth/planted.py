"""The planted-signal sidecar: what an oracle trader would know about the front month's next
mid move, written beside a generated session's DBN files (``--signal-file``).

File ``glbx-mdp3-YYYYMMDD.signal.arrow`` (Arrow IPC, zstd buffers), one row per book event of
the session's leading outright (the generator's front month), in event order:

* ``ts_recv`` int64 ns, non-decreasing (events can share a ts_recv);
* ``p_up`` float64: the probability that the next mid move is up under the true model, known
  right after the event: ``1/2 + 1/2 clip(s_B I + s_H tanh(F / H0), -1, 1)`` with I the
  level-1 queue imbalance of the book after the event and F the signed-flow state decayed as
  the next event decays it (:func:`alphafeat.synth.kernels._planted`). It is exactly the
  up-probability the simulator draws the next mid move with, **less the bridge term**: the
  bridge steers the path to the session's pre-drawn close, which no trader knows (without it
  the mid is a martingale to an observer, see :mod:`alphafeat.synth`), so an oracle using it
  would know the day's close; it is left out.

Schema metadata ``alphafeat_planted`` (JSON): ``instrument_id``, ``raw_symbol``, ``session``,
``signal``, ``signal_kind``, ``formula``.

:func:`asof` joins it to other rows by ``ts_recv`` without looking ahead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

__all__ = ["SIGNAL_SUFFIX", "asof", "planted_path", "read_planted", "write_planted"]

#: Name suffix of a session's sidecar.
SIGNAL_SUFFIX = "signal.arrow"
_META = "alphafeat_planted"


def planted_path(folder: str | os.PathLike[str], session: str) -> Path:
    """The sidecar of session ``session`` (``YYYY-MM-DD``) in ``folder``."""
    return Path(folder) / f"glbx-mdp3-{session.replace('-', '')}.{SIGNAL_SUFFIX}"


def write_planted(path: Path, ts_recv: np.ndarray, p_up: np.ndarray, meta: dict) -> None:
    """Write the sidecar atomically (temporary file, then rename). ``ts_recv`` int64 ns (n,),
    ``p_up`` float64 (n,), ``meta`` JSON-able. Same inputs, same bytes."""
    import pyarrow as pa

    table = pa.table({"ts_recv": pa.array(ts_recv, pa.int64()), "p_up": pa.array(p_up, pa.float64())})
    table = table.replace_schema_metadata({_META: json.dumps(meta, sort_keys=True)})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        opts = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema, options=opts) as w:
            w.write_table(table)
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def read_planted(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(ts_recv int64 (n,), p_up float64 (n,), meta dict)`` of a sidecar.

    Raises
    ------
    alphafeat.errors.InputError
        An unreadable file or one without the two columns, naming the path.
    """
    import pyarrow as pa

    from alphafeat.errors import InputError

    try:
        with pa.memory_map(str(path)) as src:
            table = pa.ipc.open_file(src).read_all()
        meta = json.loads((table.schema.metadata or {}).get(_META.encode(), b"{}"))
        ts = table.column("ts_recv").to_numpy().astype(np.int64)
        p = table.column("p_up").to_numpy().astype(np.float64)
    except (OSError, KeyError, ValueError, pa.ArrowException) as e:
        raise InputError(path, f"not a planted-signal file ({e})") from None
    return ts, p, meta


def asof(ts_rows: np.ndarray, ts_recv: np.ndarray, values: np.ndarray) -> np.ndarray:
    """As-of join: for each row time in ``ts_rows`` (int64 ns) the last of ``values`` whose
    ``ts_recv`` (int64 ns, non-decreasing) is at or before it; NaN before the first.

    Never looks ahead: a value stamped after a row's time is never given to that row. Among
    values sharing one ts_recv the last is taken (everything stamped at that nanosecond has
    been received by then). Returns float64 (len(ts_rows),).
    """
    i = np.searchsorted(ts_recv, ts_rows, side="right") - 1
    out = np.asarray(values, np.float64)[np.maximum(i, 0)] if len(values) else np.zeros(len(ts_rows))
    return np.where(i >= 0, out, np.nan)
