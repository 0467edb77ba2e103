"""Looking at a cache: rows per session, NaN rates, label balance, and PNG plots.

``alphafeat inspect CACHE [--plots DIR]`` prints the tables and writes

* ``feature_distributions.png`` — a histogram per feature (1st–99th percentile range),
* ``label_balance.png`` — share of up / down / NaN per label column,
* ``mid_rolls.png`` — the mid price over time, one colour per contract, with a dashed line
  where the kept contract changes (a roll) and a dotted one at each session start.

Rows whose book is crossed (``book_crossed``: the pre-open auction) or not yet complete
(``book_complete`` False: an MBO stream that started without a snapshot) are counted and left
out of the two plots of feature values and the mid: an auction book's spread is negative (down
to -94 ticks in the real ESH4 pre-open) and would squash the spread's histogram.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from alphafeat.cache import open_dataset, read_manifest

log = logging.getLogger(__name__)


@dataclass
class CacheReport:
    """What :func:`inspect_cache` found.

    Attributes
    ----------
    rows : list of (session, raw_symbol, rows)
        Rows per partition, in session order.
    nan_rate : dict column -> float
        Fraction of NaN (or null) values per float column, over the whole cache.
    label_balance : dict label column -> (up, down, nan) fractions
        For ``label_*`` columns; for ``tb_label`` the three are (+1, -1, NaN) and the timeout
        share is ``1 - sum``.
    plots : list of Path
        PNG files written.
    crossed : int
        Rows with a crossed book (``book_crossed``), left out of the plots.
    incomplete : int
        Rows whose book is not yet complete (``book_complete`` False), left out of the plots.
    plotted : int
        Rows in the feature and mid plots (neither crossed nor incomplete).
    """

    rows: list[tuple[str, str, int]] = field(default_factory=list)
    nan_rate: dict[str, float] = field(default_factory=dict)
    label_balance: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    plots: list[Path] = field(default_factory=list)
    crossed: int = 0
    incomplete: int = 0
    plotted: int = 0


def _feature_columns(manifest: dict) -> list[str]:
    return [c["name"] for c in manifest["columns"]
            if c["source"] not in ("DBN", "DBN symbology", "book", "trades", "alphafeat.labels", "AFML ch. 3")]


def inspect_cache(path: str | os.PathLike[str], plots_dir: str | os.PathLike[str] | None = None) -> CacheReport:
    """Summarise a cache and (optionally) write PNG plots into ``plots_dir``.

    Raises
    ------
    AlphafeatError
        If ``path`` is not a (current-format) alphafeat cache.
    """
    manifest = read_manifest(path)
    table = open_dataset(path).to_table()
    keys = [("session", "ascending"), ("ts_recv", "ascending")]
    table = table.sort_by(keys)
    rep = CacheReport()
    sess = table.column("session").to_pylist()
    syms = table.column("raw_symbol").cast(pa.string()).to_pylist()
    seen: dict[tuple[str, str], int] = {}
    for s, y in zip(sess, syms):
        seen[(s, y)] = seen.get((s, y), 0) + 1
    rep.rows = [(s, y, n) for (s, y), n in seen.items()]
    n = max(table.num_rows, 1)
    for name in table.schema.names:
        col = table.column(name)
        if pa.types.is_floating(col.type):
            rep.nan_rate[name] = float(pc.sum(pc.is_nan(col)).as_py() or 0) / n + col.null_count / n
    for name in table.schema.names:
        if name.startswith("label_") or name == "tb_label":
            y = table.column(name).to_numpy(zero_copy_only=False)
            hi, lo = (1.0, 0.0) if name.startswith("label_") else (1.0, -1.0)
            rep.label_balance[name] = (float(np.mean(y == hi)), float(np.mean(y == lo)), float(np.mean(np.isnan(y))))
    keep = _plotted_rows(table, rep)
    if plots_dir is not None:
        rep.plots = _plots(table, manifest, rep, Path(plots_dir), keep)
    return rep


def _plotted_rows(table: pa.Table, rep: CacheReport) -> np.ndarray:
    """bool (rows,): neither crossed nor incomplete; sets ``rep``'s three counts."""
    n = table.num_rows

    def flag(name: str, default: bool) -> np.ndarray:
        if name not in table.schema.names:
            return np.full(n, default)
        return table.column(name).to_numpy(zero_copy_only=False).astype(bool)

    crossed, complete = flag("book_crossed", False), flag("book_complete", True)
    rep.crossed, rep.incomplete = int(crossed.sum()), int((~complete).sum())
    keep = complete & ~crossed
    rep.plotted = int(keep.sum())
    return keep


def _plots(table: pa.Table, manifest: dict, rep: CacheReport, out: Path, keep: np.ndarray) -> list[Path]:
    """The three PNGs; the feature and mid plots show the rows ``keep`` only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []

    feats = [c for c in _feature_columns(manifest) if c in table.schema.names]
    ncol = 6
    nrow = max(1, -(-len(feats) // ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(3 * ncol, 2.2 * nrow))
    for ax, name in zip(np.ravel(axes), feats):
        x = table.column(name).to_numpy(zero_copy_only=False)[keep]
        x = x[np.isfinite(x)]
        if x.size:
            lo, hi = np.percentile(x, [1, 99])
            ax.hist(x[(x >= lo) & (x <= hi)] if hi > lo else x, bins=50, color="steelblue")
        ax.set_title(name, fontsize=8)
        ax.tick_params(labelsize=6)
    for ax in np.ravel(axes)[len(feats):]:
        ax.axis("off")
    fig.suptitle(f"feature distributions (1st-99th percentile); {_left_out(rep)}")
    fig.tight_layout()
    paths.append(out / "feature_distributions.png")
    fig.savefig(paths[-1], dpi=80)
    plt.close(fig)

    names = list(rep.label_balance)
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(names)), 3.5))
    up = np.array([rep.label_balance[k][0] for k in names])
    down = np.array([rep.label_balance[k][1] for k in names])
    nan = np.array([rep.label_balance[k][2] for k in names])
    ax.bar(names, up, label="up (1; tb_label +1)", color="tab:green")
    ax.bar(names, down, bottom=up, label="down (0; tb_label -1)", color="tab:red")
    ax.bar(names, 1 - up - down - nan, bottom=up + down, label="timeout (tb)", color="tab:gray")
    ax.bar(names, nan, bottom=1 - nan, label="NaN", color="lightgray")
    ax.set_ylabel("share of rows")
    ax.set_title("label balance per horizon")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    ax.tick_params(axis="x", labelsize=7, rotation=30)
    fig.tight_layout()
    paths.append(out / "label_balance.png")
    fig.savefig(paths[-1], dpi=80)
    plt.close(fig)

    ts = table.column("ts_recv").cast(pa.int64()).to_numpy()[keep]
    mid = table.column("mid").to_numpy(zero_copy_only=False)[keep]
    sym = np.array(table.column("raw_symbol").cast(pa.string()).to_pylist())[keep]
    sess = np.array(table.column("session").to_pylist())[keep]
    t = ts.astype("datetime64[ns]")
    fig, ax = plt.subplots(figsize=(10, 4))
    for s in dict.fromkeys(sym):
        m = sym == s
        ax.plot(t[m], mid[m], ".", ms=1, label=s)
    starts = np.flatnonzero(np.r_[True, sess[1:] != sess[:-1]])
    for k in starts[1:]:
        ax.axvline(t[k], color="gray", ls=":", lw=0.8)
    rolls = [k for k in starts[1:] if sym[k] != sym[k - 1]] if np.isfinite(mid).any() else []
    for k in rolls:
        ax.axvline(t[k], color="black", ls="--", lw=1.2)
        ax.annotate(f"roll -> {sym[k]}", (t[k], np.nanmax(mid)), fontsize=7, rotation=90, va="top")
    ax.set_ylabel("mid (index points)")
    ax.set_title(f"mid price; dotted: session start, dashed: roll; {_left_out(rep)}", fontsize=9)
    ax.legend(markerscale=8, fontsize=7)
    fig.autofmt_xdate()
    fig.tight_layout()
    paths.append(out / "mid_rolls.png")
    fig.savefig(paths[-1], dpi=80)
    plt.close(fig)
    log.info("wrote %s", ", ".join(str(p) for p in paths))
    return paths


def _left_out(rep: CacheReport) -> str:
    """What the plots leave out, in words."""
    return f"left out: {rep.crossed:,} crossed-book rows, {rep.incomplete:,} incomplete-book rows"
