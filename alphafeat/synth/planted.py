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
* ``drift_K`` float64 for K in :data:`DRIFT_HORIZONS` (files written since these columns were
  added; older files have none, :func:`read_drift` says so): the expected change of the mid,
  in ticks, over the next K events of the leading outright, under the same true model (bridge
  excluded), known right after the event. Estimated by Monte-Carlo continuations of the whole
  simulator state (:data:`DRIFT_PATHS` paths per event,
  :func:`alphafeat.synth.simulator._drift_paths`): on each path the sum of the expected steps
  (:func:`alphafeat.synth.simulator._lead_drift`: what the next event moves the mid by on
  average: the move or fill probability x (2 u - 1) x the ticks a move covers), a realised-
  minus-expected control variate, then the best linear predictor of the true drift given every
  horizon's estimate (:func:`alphafeat.synth.simulator.drift_estimate`: the Monte-Carlo noise
  measured from the paths, so that regressing the realised change on it gives slope 1,
  ``tests/test_synth_drift.py``; ``drift_reliability`` in the metadata: the share of the true
  drift's variance it carries, about 0.95 at K = 10 and 0.75-0.8 at K = 200 on quiet sessions).
  One event of the front month is one row of its cache (each writes one MBP-10 record with
  F_LAST), so K events = K rows of the backtest's stride.

Schema metadata ``alphafeat_planted`` (JSON): ``instrument_id``, ``raw_symbol``, ``session``,
``signal``, ``signal_kind``, ``formula`` and, with the drift columns, ``drift_horizons``,
``drift_paths``, ``drift_reliability`` (per horizon) and ``drift_unit`` (``"ticks"``).

:func:`asof` joins it to other rows by ``ts_recv`` without looking ahead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

__all__ = ["DRIFT_HORIZONS", "DRIFT_PATHS", "SIGNAL_SUFFIX", "asof", "asof_events", "drift_column", "planted_path",
           "read_drift", "read_planted", "write_planted"]

#: Name suffix of a session's sidecar.
SIGNAL_SUFFIX = "signal.arrow"
_META = "alphafeat_planted"
#: Horizons (events = rows of the front month's cache) of the ``drift_K`` columns: the
#: backtest's strides (default 200).
DRIFT_HORIZONS = (1, 10, 50, 100, 200)
#: Monte-Carlo paths per event behind the drift columns.
DRIFT_PATHS = 8


def drift_column(k: int) -> str:
    """Name of the column of the expected mid change over ``k`` events."""
    return f"drift_{k}"


def planted_path(folder: str | os.PathLike[str], session: str) -> Path:
    """The sidecar of session ``session`` (``YYYY-MM-DD``) in ``folder``."""
    return Path(folder) / f"glbx-mdp3-{session.replace('-', '')}.{SIGNAL_SUFFIX}"


def write_planted(path: Path, ts_recv: np.ndarray, p_up: np.ndarray, meta: dict,
                  drift: dict[int, np.ndarray] | None = None) -> None:
    """Write the sidecar atomically (temporary file, then rename). ``ts_recv`` int64 ns (n,),
    ``p_up`` float64 (n,), ``meta`` JSON-able, ``drift``: horizon -> float64 (n,) ticks (the
    ``drift_K`` columns). Same inputs, same bytes."""
    import pyarrow as pa

    cols = {"ts_recv": pa.array(ts_recv, pa.int64()), "p_up": pa.array(p_up, pa.float64())}
    for k in sorted(drift or {}):
        cols[drift_column(k)] = pa.array(np.asarray(drift[k], np.float64), pa.float64())
    table = pa.table(cols)
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


def read_drift(path: str | os.PathLike[str]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """``(ts_recv int64 (n,), {K: drift_K float64 (n,) ticks})`` of a sidecar.

    Raises
    ------
    alphafeat.errors.InputError
        An unreadable file, or one written before the drift columns (one line naming the path
        and how to get them: ``alphafeat synth --signal-file`` again).
    """
    import pyarrow as pa

    from alphafeat.errors import InputError

    try:
        with pa.memory_map(str(path)) as src:
            table = pa.ipc.open_file(src).read_all()
        ts = table.column("ts_recv").to_numpy().astype(np.int64)
    except (OSError, KeyError, ValueError, pa.ArrowException) as e:
        raise InputError(path, f"not a planted-signal file ({e})") from None
    out = {int(n[len("drift_"):]): table.column(n).to_numpy().astype(np.float64)
           for n in table.column_names if n.startswith("drift_") and n[len("drift_"):].isdigit()}
    if not out:
        raise InputError(path, "planted-signal file without the drift_K columns (the expected mid change over K "
                               "rows; written by an older alphafeat): generate it again with "
                               "`alphafeat synth --signal-file`")
    return ts, out


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


def asof_events(ts_rows: np.ndarray, ts_recv: np.ndarray) -> np.ndarray:
    """Index of each row's own event: rows (int64 ns, non-decreasing, one per event of the
    front month, as its cache's rows are) matched to events (``ts_recv`` non-decreasing) by
    time and, among those sharing one ts_recv, by order: the j-th row stamped t gets the j-th
    event stamped t (at most the last one stamped t); -1 before the first event. int64 (n,).

    Several events often share a ts_recv (the feed's latency can bunch them); :func:`asof`
    gives all their rows the last one's values, which for ``drift_K`` misaligns the horizon
    (the realised change from the row would include moves the value already counts as past).
    Never looks ahead: a row gets no event stamped after it."""
    tr = np.asarray(ts_rows, np.int64)
    te = np.asarray(ts_recv, np.int64)
    lo = np.searchsorted(te, tr, side="left")
    hi = np.searchsorted(te, tr, side="right") - 1
    if tr.size == 0:
        return hi
    start = np.r_[0, np.flatnonzero(np.diff(tr) != 0) + 1]
    rank = np.arange(tr.size) - np.repeat(start, np.diff(np.r_[start, tr.size]))
    return np.where(hi >= 0, np.minimum(lo + rank, hi), -1)
