"""Windows of K snapshots read from a memory-mapped alphafeat cache.

Each cache file (one instrument in one trading session: a *segment*) is memory-mapped with
``pyarrow.memory_map``; its columns are zero-copy numpy views, and a batch of windows is
gathered from them with fancy indexing — the cache is never materialised as one matrix.

Samples and their spans (for the purged splits of :mod:`alphafeat.splits`, AFML ch. 7): row
``t`` of a segment is a sample with ``t0 = ts_recv[t]`` (its features are known) and
``t1 = ts_recv[min(t + h_max, n - 1)]`` (its longest label is known; labels never cross the
segment's end). When the cache carries ``t1_h{h}`` columns they are used instead.

Model inputs per row (``feature_names``): every feature column of the cache except raw price
levels, which are replaced by their distance to the mid in ticks (``microprice-mid``,
``ema_mid_1s-mid`` ...) so that inputs are stationary. A fixed-window fractionally
differenced log mid (``fracdiff_log_mid``, AFML ch. 5) is a price level too: its weights sum
to ``c = sum_k w_k`` (about 0.07 for d = 0.4 and 282 terms), so it carries ``c * log(mid)``,
which identifies the session and contract rather than predicting anything (on a 3-session
sample its AUC at h = 100 was 0.26 on the training block and 0.63 on validation). It enters
as ``fracdiff_log_mid-level`` = ``fracdiff - c * log(mid)``, the weighted sum of past log
returns (``c`` from the column's ``fracdiff_d`` and ``window`` parameters; dropped if they
are missing). Book columns, timestamps, ids and any label column are never inputs. Inputs
are z-scored with statistics fitted on the training rows only (NaN read as 0 after scaling;
clipped to +-``clip``). The step fed to the CfC is
``dt = ts_recv[t] - ts_recv[t-1]`` in seconds (0 at a segment start).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numba
import numpy as np
import pyarrow as pa

from alphafeat.cache import MANIFEST, read_manifest
from alphamodel.errors import CacheError, DataError, UsageError

log = logging.getLogger(__name__)

__all__ = ["Segment", "CacheData", "Normaliser", "Batch"]

_NOT_INPUT_PREFIX = ("label", "t1", "tb_", "barrier", "bid_", "ask_", "ts_", "instrument_id", "raw_symbol")
_NOT_INPUT_SOURCE = ("DBN", "DBN symbology", "book")
DT_MAX_S = 3600.0
#: Suffix of an input that is a column minus its price-level part (see the module docstring).
LEVEL_SUFFIX = "-level"


def fracdiff_weight_sum(d: float, window: int) -> float:
    """``sum_{k<window} w_k`` of the fractional-difference weights ``w_0 = 1``,
    ``w_k = -w_(k-1) (d - k + 1) / k`` (AFML snippet 5.3): the coefficient of a constant level."""
    w, total = 1.0, 1.0
    for k in range(1, int(window)):
        w = -w * (d - k + 1) / k
        total += w
    return total


@dataclass
class Segment:
    """One memory-mapped cache file.

    Attributes: ``path``; ``session`` (YYYY-MM-DD); ``n`` rows; ``ts`` int64 ns (n,);
    ``cols`` name -> zero-copy numpy column (n,); ``labels`` list of float32 (n,) per
    horizon; ``t1`` list of int64 ns (n,) per horizon (the end time of each label; ``ts`` itself
    where the label runs past the segment end); ``dt`` float32 seconds (n,); ``table`` the
    pyarrow table of the file (all its columns; it owns the mapped buffers).
    """

    path: Path
    session: str
    n: int
    ts: np.ndarray
    cols: dict[str, np.ndarray]
    labels: list[np.ndarray]
    t1: list[np.ndarray]
    dt: np.ndarray
    table: pa.Table | None = None


@dataclass
class Normaliser:
    """Per-feature ``(x - mean) / std``, NaN -> 0, clipped to +-clip. Fitted on train rows."""

    names: list[str]
    mean: np.ndarray
    std: np.ndarray
    clip: float = 10.0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x: (..., F) float64 -> float32 (..., F)."""
        z = (x - self.mean) / self.std
        z = np.nan_to_num(z, nan=0.0, posinf=self.clip, neginf=-self.clip)
        return np.clip(z, -self.clip, self.clip).astype(np.float32)

    def to_dict(self) -> dict:
        return {"names": self.names, "mean": self.mean.tolist(), "std": self.std.tolist(), "clip": self.clip}

    @classmethod
    def from_dict(cls, d: dict) -> Normaliser:
        return cls(list(d["names"]), np.asarray(d["mean"], float), np.asarray(d["std"], float), float(d["clip"]))


@dataclass
class Batch:
    """A batch of windows (numpy; the trainer moves them to torch).

    x (B, K, F) float32; dt (B, K) float32 seconds; y (B, K, H) float32 with NaN;
    mask (B, K) bool (positions that count in loss/metrics); rows (B, K) int64 global row ids
    (-1 on left padding).
    """

    x: np.ndarray
    dt: np.ndarray
    y: np.ndarray
    mask: np.ndarray
    rows: np.ndarray


@dataclass
class Window:
    """Rows ``[start, end)`` of segment ``seg``; positions ``[score_from, end-start)`` count."""

    seg: int
    start: int
    end: int
    score_from: int = 0


#: How :meth:`CacheData.batch` derives a model input from its cache column (``_put_feature``'s ``kind``).
_PLAIN, _MINUS_MID, _LEVEL = 0, 1, 2


@numba.njit(nogil=True, cache=True)
def _put_feature(col: np.ndarray, mid: np.ndarray, log_mid: np.ndarray, kind: int, coef: float,
                 starts: np.ndarray, length: int, sel: np.ndarray, off: int,
                 mean: float, std: float, clip: float, x: np.ndarray) -> None:  # pragma: no cover - numba
    """One input of the windows ``starts[i] .. starts[i] + length`` of one segment, normalised,
    into ``x[sel[i], off + k]`` (float32; ``x`` the input's own (B, K) plane) in one pass: the
    float64 operations of :meth:`CacheData.raw_features` followed by :class:`Normaliser`
    (``(v - mean) / std``, NaN -> 0, clipped to +-clip), so the same bits. ``log_mid[i, k]``:
    ``np.log`` of the mid at the window's row k (``_LEVEL`` inputs; numpy's log, as the reference)."""
    for i in range(starts.shape[0]):
        b, r0 = sel[i], starts[i]
        for k in range(length):
            r = r0 + k
            if kind == _MINUS_MID:
                v = (np.float64(col[r]) - mid[r]) / coef
            elif kind == _LEVEL:
                v = np.float64(col[r]) - coef * log_mid[i, k]
            else:
                v = np.float64(col[r])
            z = (v - mean) / std
            if z != z:
                z = 0.0
            elif z > clip:
                z = clip
            elif z < -clip:
                z = -clip
            x[b, off + k] = np.float32(z)


def _zero_copy(col: pa.ChunkedArray, path: Path, name: str) -> np.ndarray:
    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.int64())
    if pa.types.is_dictionary(col.type):
        raise CacheError(path, f"column {name!r} is not numeric")
    try:
        return col.to_numpy(zero_copy_only=col.null_count == 0)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise CacheError(path, f"column {name!r} cannot be read as numbers ({e})") from e


@dataclass
class CacheData:
    """An alphafeat cache opened for training.

    Parameters
    ----------
    root : path of the cache (``alphafeat precompute --out``).

    Attributes
    ----------
    horizons : list of int, from the manifest ``params.horizons``.
    tick : float, tick size in index points (manifest ``params.features.tick_size``).
    feature_names : list of str, model inputs (see module docstring).
    segments : list of Segment, in time order (first ``ts_recv``).
    offsets : np.ndarray int64 (n_segments + 1,): global row id of each segment's first row.
    label_keep : np.ndarray bool (N, H) or None: labels to keep (see :meth:`set_label_mask`).

    Raises
    ------
    CacheError
        Missing or bad cache: no manifest, no partition, a missing column (in any partition),
        no numeric input column, an unreadable file.
    DataError
        A cache without labels (``params.horizons`` empty).
    """

    root: Path
    horizons: list[int] = field(default_factory=list)
    tick: float = 0.25
    feature_names: list[str] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    manifest: dict = field(default_factory=dict)
    label_keep: np.ndarray | None = None
    level_coef: dict[str, float] = field(default_factory=dict)

    @classmethod
    def open(cls, root: str | os.PathLike[str]) -> CacheData:
        """Memory-map every partition of the cache at ``root``."""
        root = Path(root)
        if not root.exists():
            raise CacheError(root, f"no such cache directory (run `alphafeat precompute --out {root}`)")
        manifest = read_manifest(root)
        try:
            horizons = [int(h) for h in manifest["params"]["horizons"]]
        except (KeyError, TypeError, ValueError) as e:
            raise CacheError(root / MANIFEST, "no params.horizons in the manifest") from e
        if not horizons:
            raise DataError("the cache holds no labels (params.horizons is empty); "
                            "rerun alphafeat precompute with --horizons", root)
        tick = float(manifest.get("params", {}).get("features", {}).get("tick_size", 0.25))
        parts = manifest.get("partitions") or sorted(
            str(p.relative_to(root)) for p in root.rglob("*.arrow") if not p.name.startswith((".", "_"))
        )
        if not parts:
            raise CacheError(root, "the cache holds no partition (*.arrow)")
        specs = {c["name"]: c for c in manifest.get("columns", [])}
        self = cls(root=root, horizons=horizons, tick=tick, manifest=manifest)
        segs = [self._open_segment(root / rel, specs) for rel in parts]
        segs = [s for s in segs if s.n > 0]
        if not segs:
            raise CacheError(root, "every partition is empty")
        segs.sort(key=lambda s: (int(s.ts[0]), s.session, str(s.path)))
        self.segments = segs
        self.offsets = np.concatenate([[0], np.cumsum([s.n for s in segs])]).astype(np.int64)
        cols = segs[0].cols
        names = []
        for name in cols:
            spec = specs.get(name, {})
            unit = spec.get("unit", "")
            if name.startswith("fracdiff_"):
                par = spec.get("parameters", {})
                if "fracdiff_d" in par and "window" in par:
                    self.level_coef[name] = fracdiff_weight_sum(float(par["fracdiff_d"]), int(par["window"]))
                    names.append(name + LEVEL_SUFFIX)
                else:
                    log.warning("%s: no fracdiff_d/window parameters; a price level, not used as input", name)
                continue
            names.append(f"{name}-mid" if unit == "index points" and name != "mid" else name)
        self.feature_names = [n for n in names if n != "mid"]
        if not self.feature_names:
            raise CacheError(segs[0].path, "no numeric feature column to use as model input")
        for s in segs[1:]:
            lost = [c for c in cols if c not in s.cols]
            if lost:
                raise CacheError(s.path, f"missing input column(s) {', '.join(lost)} "
                                         f"(present in {segs[0].path.name})")
        log.info("cache %s: %d segments, %d rows, %d input features, horizons %s",
                 root, len(segs), self.n_rows, len(self.feature_names), horizons)
        return self

    def _open_segment(self, path: Path, specs: dict) -> Segment:
        if not path.is_file():
            raise CacheError(path, f"partition listed in {MANIFEST} is missing")
        try:
            table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
        except (pa.ArrowInvalid, OSError) as e:
            raise CacheError(path, f"not a readable Arrow IPC file ({e})") from e
        need = ["ts_recv", "mid"] + [f"label_h{h}" for h in self.horizons]
        missing = [c for c in need if c not in table.column_names]
        if missing:
            raise CacheError(path, f"missing column(s) {', '.join(missing)}")
        session = next((p.split("=", 1)[1] for p in path.parts if p.startswith("session=")), "")
        n = table.num_rows
        ts = _zero_copy(table.column("ts_recv"), path, "ts_recv").astype(np.int64, copy=False)
        cols: dict[str, np.ndarray] = {}
        for name in table.column_names:
            spec = specs.get(name, {})
            if name.startswith(_NOT_INPUT_PREFIX) or "label" in name or spec.get("source") in _NOT_INPUT_SOURCE:
                continue
            if "label" in str(spec.get("source", "")) or "label" in str(spec.get("unit", "")):
                continue
            typ = table.schema.field(name).type
            if not (pa.types.is_floating(typ) or pa.types.is_integer(typ)):
                continue
            cols[name] = _zero_copy(table.column(name), path, name)
        labels = [_zero_copy(table.column(f"label_h{h}"), path, f"label_h{h}") for h in self.horizons]
        t1 = [self._t1(table, ts, h) for h in self.horizons]
        dt = np.zeros(n, np.float32)
        if n > 1:
            dt[1:] = np.clip(np.diff(ts) / 1e9, 0.0, DT_MAX_S)
        return Segment(path, session, n, ts, cols, labels, t1, dt, table)

    @staticmethod
    def _t1(table: pa.Table, ts: np.ndarray, h: int) -> np.ndarray:
        """End time of ``label_h{h}``: the ``t1_h{h}`` column when present, else ``ts[t+h]``."""
        n = len(ts)
        name = f"t1_h{h}"
        if name in table.column_names:
            col = table.column(name)
            if pa.types.is_timestamp(col.type):
                col = col.cast(pa.int64())
            v = col.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            return np.where(v < 0, ts, v)  # -1: past the segment end (no outcome, label NaN)
        return ts[np.minimum(np.arange(n) + h, n - 1)] if n else ts.copy()

    # ---- global views -------------------------------------------------------------------
    @property
    def n_rows(self) -> int:
        return int(self.offsets[-1])

    def spans(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """``(t0, [t1_h per horizon])``: int64 ns arrays of shape (N,), in global row order."""
        t0 = np.concatenate([s.ts for s in self.segments])
        t1 = [np.concatenate([s.t1[j] for s in self.segments]) for j in range(len(self.horizons))]
        return t0, t1

    def set_label_mask(self, keep: np.ndarray | None) -> None:
        """Hide labels: ``keep`` (N, H) bool over global rows; False entries read as NaN.

        Used to purge single (row, horizon) labels whose span reaches into a later block,
        while the row stays usable as input context.
        """
        self.label_keep = None if keep is None else np.asarray(keep, bool)

    def raw_features(self, seg: int, idx: np.ndarray, names: list[str]) -> np.ndarray:
        """Raw (un-normalised) inputs of rows ``idx`` (any int shape S) of segment ``seg``: (*S, F) float64."""
        s = self.segments[seg]
        out = np.empty(idx.shape + (len(names),), np.float64)
        mid = s.cols["mid"][idx]
        for j, name in enumerate(names):
            kind, col, coef = self._input_of(s, name)
            if kind == _MINUS_MID:
                out[..., j] = (col[idx] - mid) / coef
            elif kind == _LEVEL:
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[..., j] = col[idx] - coef * np.log(mid)
            else:
                out[..., j] = col[idx]
        return out

    def _input_of(self, s: Segment, name: str) -> tuple[int, np.ndarray, float]:
        """How model input ``name`` derives from segment ``s``'s columns: ``(kind, column,
        coefficient)``; ``NAME-mid``: (column - mid) / tick; ``NAME-level``: column - coef *
        log(mid) (:data:`LEVEL_SUFFIX`); else the column itself."""
        if name.endswith("-mid"):
            return _MINUS_MID, s.cols[name[:-4]], float(self.tick)
        if name.endswith(LEVEL_SUFFIX):
            base = name[: -len(LEVEL_SUFFIX)]
            return _LEVEL, s.cols[base], float(self.level_coef[base])
        return _PLAIN, s.cols[name], 0.0

    def _inputs_into(self, xf: np.ndarray, seg: int, starts: np.ndarray, idx: np.ndarray, off: int,
                     sel: np.ndarray, norm: Normaliser) -> None:
        """``xf[:, sel, off:off + L]`` (feature-major, (F, B, K)) = ``norm(self.raw_features(seg,
        idx, norm.names))`` moved to the front axis (the same bits; ``idx = starts[:, None] +
        arange(L)``), written by one numba pass per input, each into its own contiguous plane,
        instead of float64 temporaries of the whole batch (the batch loader's time)."""
        s = self.segments[seg]
        mid, log_mid = s.cols["mid"], np.empty((0, 0))
        for j, name in enumerate(norm.names):
            kind, col, coef = self._input_of(s, name)
            if kind == _LEVEL and not log_mid.size:
                with np.errstate(invalid="ignore", divide="ignore"):
                    log_mid = np.log(mid[idx])
            _put_feature(col, mid, log_mid, kind, coef, starts, idx.shape[1], sel, off,
                         float(norm.mean[j]), float(norm.std[j]), float(norm.clip), xf[j])

    def labels(self, seg: int, idx: np.ndarray) -> np.ndarray:
        """Labels of rows ``idx`` (shape S): (*S, H) float32 with NaN."""
        s = self.segments[seg]
        y = np.stack([lab[idx] for lab in s.labels], axis=-1)
        if self.label_keep is not None:
            y = np.where(self.label_keep[idx + self.offsets[seg]], y, np.float32(np.nan))
        return y

    def rows_by_segment(self, rows: np.ndarray) -> list[np.ndarray]:
        """Split sorted global row ids into per-segment local indices."""
        rows = np.sort(np.asarray(rows, np.int64))
        cut = np.searchsorted(rows, self.offsets)
        return [rows[cut[k] : cut[k + 1]] - self.offsets[k] for k in range(len(self.segments))]

    def segment_of(self, rows: np.ndarray) -> np.ndarray:
        """The segment index, int64, of each global row id in ``rows``."""
        return np.searchsorted(self.offsets, np.asarray(rows, np.int64), side="right") - 1

    def sessions_of(self, rows: np.ndarray) -> list[str]:
        """The sorted distinct trading sessions (ISO dates) of the global row ids ``rows``."""
        return sorted({self.segments[int(k)].session for k in np.unique(self.segment_of(rows))})

    def segment_rows(self, segs: Iterable[int], drop_last: int = 0) -> np.ndarray:
        """Global row ids, int64, of the segments ``segs`` (in that order), each segment's last
        ``drop_last`` rows left out (``1``: the rows that have a next row)."""
        return np.concatenate([np.arange(self.offsets[s], self.offsets[s + 1] - drop_last) for s in segs])

    def gather(self, rows: np.ndarray, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Raw features (M, F) float64 and labels (M, H) float32 of sorted global ``rows``."""
        xs, ys = [], []
        for k, local in enumerate(self.rows_by_segment(rows)):
            if local.size:
                xs.append(self.raw_features(k, local, names))
                ys.append(self.labels(k, local))
        if not xs:
            return np.zeros((0, len(names))), np.zeros((0, len(self.horizons)), np.float32)
        return np.concatenate(xs), np.concatenate(ys)

    def fit_normaliser(self, rows: np.ndarray, names: list[str] | None = None, clip: float = 10.0,
                       max_rows: int = 2_000_000, seed: int = 0) -> Normaliser:
        """Mean and standard deviation of each input over ``rows`` (the training rows only).

        At most ``max_rows`` rows (a seeded random subset) are used. A feature that is
        constant or all-NaN there gets mean 0 / std 1 (or its mean / std 1).
        """
        names = list(names or self.feature_names)
        rows = np.asarray(rows, np.int64)
        if rows.size > max_rows:
            rows = np.random.default_rng(seed).choice(rows, max_rows, replace=False)
        x, _ = self.gather(np.sort(rows), names)
        with np.errstate(all="ignore"):
            mean = np.nanmean(x, axis=0) if len(x) else np.zeros(len(names))
            std = np.nanstd(x, axis=0) if len(x) else np.ones(len(names))
        mean = np.nan_to_num(mean)
        std = np.where(~np.isfinite(std) | (std < 1e-12), 1.0, std)
        return Normaliser(names, mean, std, clip)

    # ---- windows ------------------------------------------------------------------------
    def runs(self, rows: np.ndarray) -> list[tuple[int, int, int]]:
        """Contiguous runs ``(seg, start, end)`` of the given global rows within one segment."""
        out = []
        for k, local in enumerate(self.rows_by_segment(rows)):
            if local.size == 0:
                continue
            brk = np.flatnonzero(np.diff(local) != 1)
            starts = np.concatenate([[0], brk + 1])
            ends = np.concatenate([brk + 1, [local.size]])
            out.extend((k, int(local[a]), int(local[b - 1]) + 1) for a, b in zip(starts, ends))
        return out

    def eval_windows(self, rows: np.ndarray, window: int, burn_in: int) -> list[Window]:
        """Windows covering every given row exactly once as a scored position.

        Each run is tiled by windows of length ``window``; the first scores all its positions,
        the next ones score only positions ``>= burn_in`` (so every scored row after the first
        window of a run has at least ``burn_in`` rows of context). Shorter runs give shorter
        windows (left-padded in the batch).
        """
        if not 0 <= burn_in < window:
            raise UsageError("burn_in", f"expected a number of snapshots in [0, window={window})", burn_in)
        out = []
        for seg, a, b in self.runs(rows):
            done = a
            while done < b:
                e = min(done + (window if done == a else window - burn_in), b)
                s = max(a, e - window)
                out.append(Window(seg, s, e, done - s))
                done = e
        return out

    def batch(self, windows: list[Window], window: int, norm: Normaliser, score_from: int | None = None,
              pad: str = "left") -> Batch:
        """Gather windows into a padded batch of length ``window``.

        ``score_from`` overrides each window's own first scored position (training uses a
        fixed burn-in). ``pad``: ``"left"`` puts a short window's rows at the end (padding
        first), ``"right"`` at the start (padding after: a carried state continues into the
        real rows). Padded positions have ``rows == -1`` and are masked out of the model
        (:meth:`alphamodel.nn.model.AlphaModel.forward`'s ``mask``), so they are neutral.
        """
        B, K, F, H = len(windows), window, len(norm.names), len(self.horizons)
        xf = np.zeros((F, B, K), np.float32)  # feature-major: each input written contiguously
        dt = np.zeros((B, K), np.float32)
        y = np.full((B, K, H), np.nan, np.float32)
        mask = np.zeros((B, K), bool)
        rows = np.full((B, K), -1, np.int64)
        by_seg: dict[tuple[int, int], list[int]] = {}
        for i, w in enumerate(windows):
            by_seg.setdefault((w.seg, w.end - w.start), []).append(i)
        for (seg, length), members in by_seg.items():
            starts = np.array([windows[i].start for i in members], np.int64)
            idx = starts[:, None] + np.arange(length)[None, :]
            off = K - length if pad == "left" else 0
            pos = slice(off, off + length)
            sel = np.array(members)
            if length:
                self._inputs_into(xf, seg, starts, idx, off, sel, norm)
                dt[sel, pos] = self.segments[seg].dt[idx]
                y[sel, pos] = self.labels(seg, idx)
                rows[sel, pos] = idx + self.offsets[seg]
            for i in members:
                first = windows[i].score_from if score_from is None else score_from
                mask[i, off + first : off + length] = True
        return Batch(np.ascontiguousarray(xf.transpose(1, 2, 0)), dt, y, mask, rows)
