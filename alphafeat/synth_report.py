"""Side-by-side statistics of the synthetic ES book and the real ESH4 MBO file.

``alphafeat synth --report`` calls :func:`compare`. Both books are rebuilt from MBO with
:func:`alphafeat.book.rebuild_mbo` (the same code path), over the same hour of the day: the
first hour of continuous trading after the 17:00 CT open (the real file,
``esh4-glbx-mdp3-20231225.mbo.dbn.zst``, holds the 2023-12-25 pre-open from 16:00 CT and the
first hour of the session opening at 17:00 CT = 23:00 UTC). The synthetic session is made on a
non-roll date with the event rate scaled so that the leading outright's book events per
second in that hour match the real file (the rate is a free parameter of the generator; the
comparison is about the shape of the book, not the amount of data).

Statistics (rows = book snapshots, one per ``F_LAST`` record that changed the book):
spread distribution (fraction of rows at 1, 2 and >= 3 ticks), level-1 size and order-count
medians, deeper (levels 2-10) size median, inter-event time quantiles (µs, between rows),
trade-size distribution (``T`` records: fraction of size 1, mean, 90th and 99th percentile,
contracts), mid changes per minute and per 100 rows. Each has a stated tolerance.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from alphafeat import synth
from alphafeat.book import RawBook, Trades, rebuild_mbo
from alphafeat.dbn import read_dbn

__all__ = ["REAL_FILE", "Row", "book_stats", "compare"]

logger = logging.getLogger(__name__)

#: The real file, relative to the project root.
REAL_FILE = Path("..") / "shared" / "data" / "real" / "esh4-glbx-mdp3-20231225.mbo.dbn.zst"
#: Start of the compared hour in the real file: 2023-12-25 23:00 UTC (17:00 CT), ns.
REAL_OPEN_NS = 1_703_545_200_000_000_000
#: Length of the compared window, ns.
WINDOW_NS = 3_600_000_000_000
#: Non-roll trade date of the synthetic session compared (front ESH4, share ~1).
SYNTH_DAY = datetime.date(2024, 1, 9)
TICK = 250_000_000


@dataclass
class Row:
    """One statistic: name, real and synthetic values, tolerance (text) and the verdict."""

    name: str
    real: float
    synth: float
    tolerance: str
    ok: bool


def book_stats(book: RawBook, trades: Trades, lo: int, hi: int) -> dict[str, float]:
    """Statistics of snapshot rows and trades with ``lo <= ts_recv < hi`` (ns)."""
    m = (book.ts_recv >= lo) & (book.ts_recv < hi)
    bp, ap = book.bid_px[m, 0], book.ask_px[m, 0]
    ok = (bp != synth.UNDEF_PRICE) & (ap != synth.UNDEF_PRICE) & (ap > bp)
    sp = np.rint((ap[ok] - bp[ok]) / TICK).astype(np.int64)
    deep = np.concatenate([book.bid_sz[m, 1:10].ravel(), book.ask_sz[m, 1:10].ravel()])
    l1 = np.concatenate([book.bid_sz[m, 0], book.ask_sz[m, 0]])
    c1 = np.concatenate([book.bid_ct[m, 0], book.ask_ct[m, 0]])
    dt = np.diff(book.ts_event[m]) / 1e3
    tm = (trades.ts_recv >= lo) & (trades.ts_recv < hi)
    ts = trades.size[tm].astype(np.float64)
    mid = (bp[ok].astype(np.float64) + ap[ok]) / 2
    changes = float(np.sum(np.diff(mid) != 0))
    minutes = (hi - lo) / 60e9
    q = np.quantile(dt, [0.1, 0.25, 0.5, 0.75, 0.9]) if dt.size else [math.nan] * 5
    return {
        "rows per second": m.sum() / ((hi - lo) / 1e9),
        "spread = 1 tick (fraction)": float(np.mean(sp == 1)),
        "spread = 2 ticks (fraction)": float(np.mean(sp == 2)),
        "spread >= 3 ticks (fraction)": float(np.mean(sp >= 3)),
        "level-1 size median (contracts)": float(np.median(l1[l1 > 0])),
        "level-1 order count median": float(np.median(c1[c1 > 0])),
        "levels 2-10 size median (contracts)": float(np.median(deep[deep > 0])),
        "inter-event p10 (us)": float(q[0]),
        "inter-event p25 (us)": float(q[1]),
        "inter-event p50 (us)": float(q[2]),
        "inter-event p75 (us)": float(q[3]),
        "inter-event p90 (us)": float(q[4]),
        "trades per minute": ts.size / minutes,
        "trade size = 1 (fraction)": float(np.mean(ts == 1)) if ts.size else math.nan,
        "trade size mean (contracts)": float(ts.mean()) if ts.size else math.nan,
        "trade size p90 (contracts)": float(np.quantile(ts, 0.9)) if ts.size else math.nan,
        "trade size p99 (contracts)": float(np.quantile(ts, 0.99)) if ts.size else math.nan,
        "mid changes per minute": changes / minutes,
        "mid changes per 100 rows": 100 * changes / max(1, int(ok.sum())),
    }


# name -> (kind, tolerance): "abs" absolute difference, "rel" relative difference,
# "factor" ratio within [1/x, x], "info" not judged (a consequence of the chosen scale).
TOLERANCES: dict[str, tuple[str, float]] = {
    "rows per second": ("rel", 0.25),
    "spread = 1 tick (fraction)": ("abs", 0.05),
    "spread = 2 ticks (fraction)": ("abs", 0.05),
    "spread >= 3 ticks (fraction)": ("abs", 0.03),
    "level-1 size median (contracts)": ("rel", 0.35),
    "level-1 order count median": ("rel", 0.5),
    "levels 2-10 size median (contracts)": ("rel", 0.35),
    "inter-event p10 (us)": ("factor", 5.0),
    "inter-event p25 (us)": ("factor", 3.0),
    "inter-event p50 (us)": ("factor", 3.0),
    "inter-event p75 (us)": ("factor", 3.0),
    "inter-event p90 (us)": ("factor", 3.0),
    "trades per minute": ("rel", 0.35),
    "trade size = 1 (fraction)": ("abs", 0.08),
    "trade size mean (contracts)": ("rel", 0.3),
    "trade size p90 (contracts)": ("rel", 0.5),
    "trade size p99 (contracts)": ("factor", 2.0),
    "mid changes per minute": ("rel", 0.4),
    "mid changes per 100 rows": ("rel", 0.4),
}


def _judge(kind: str, tol: float, real: float, syn: float) -> tuple[str, bool]:
    if kind == "abs":
        return f"± {tol:g}", abs(syn - real) <= tol
    if kind == "rel":
        return f"± {100 * tol:g} %", abs(syn - real) <= tol * abs(real)
    ok = real > 0 and syn > 0 and abs(math.log(syn / real)) <= math.log(tol)
    return f"x/÷ {tol:g}", ok


def real_stats(path: str | os.PathLike[str]) -> dict[str, float]:
    """Statistics of the real ESH4 file over its first hour after the 17:00 CT open."""
    _, recs = read_dbn(path)
    book, trades, _ = rebuild_mbo(recs[0xA0])
    return book_stats(book, trades, REAL_OPEN_NS, REAL_OPEN_NS + WINDOW_NS)


def synth_stats(rows_per_second: float, seed: int = 1) -> tuple[dict[str, float], float]:
    """Statistics of a synthetic session's leading outright over the same hour of the day.

    The scale is chosen so that the leading outright's event rate at profile multiplier 1
    (17:00-18:00 CT) is ``rows_per_second``. Returns the statistics and the scale used."""
    share = synth.volume_share(synth.front_by_volume(SYNTH_DAY), SYNTH_DAY)
    scale = rows_per_second / (synth.BASE_RATE * share)
    sess = synth._simulate_session(SYNTH_DAY, seed, scale, None, 0)
    run = sess.runs[sess.leader]
    book, trades, _ = rebuild_mbo(run.mbo)
    t0, _ = synth.session_bounds(SYNTH_DAY)
    lo = t0 + synth.OPEN_DELAY_NS
    return book_stats(book, trades, lo, lo + WINDOW_NS), scale


def compare(real_path: str | os.PathLike[str] = REAL_FILE, seed: int = 1) -> tuple[list[Row], dict[str, float]]:
    """Rows of the side-by-side table, and notes (the synthetic scale)."""
    real = real_stats(real_path)
    syn, scale = synth_stats(real["rows per second"], seed)
    rows = []
    for name, (kind, tol) in TOLERANCES.items():
        text, ok = _judge(kind, tol, real[name], syn[name])
        rows.append(Row(name, real[name], syn[name], text, bool(ok)))
    return rows, {"scale": scale, "day": SYNTH_DAY.toordinal()}
