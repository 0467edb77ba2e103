"""Speed of the synthetic ES generator (alphafeat.synth), one process, one core.

Two measurements at the given scale (default ``busy``, about 1.8 M MBP-10 records a session):

* ``simulate``: :func:`alphafeat.synth._simulate_session` for one session, i.e. the order-level
  book simulation of every instrument with its MBO and MBP-10 records (numba), fresh buffers.
* ``generate``: the whole :func:`alphafeat.synth.generate` call for ``--sessions`` consecutive
  sessions writing the mbp-10, trades and definition files (no report): simulation, merging the
  instruments by ``ts_recv``, trades, DBN metadata, zstd at ``--level`` (default: the fast level
  of big sets, single threaded) and the writes. Everything runs in this one process.

Rates are MBP-10 records per second of CPU time of this process (``time.process_time``: all
its threads, user + system; zstd and numba are single threaded here, so this is per core) and
per second of wall time (lower on a loaded machine). Numba compilation is excluded (a warm-up
call loads or builds the cache first). Prints a table and one JSON line.

    python bench/synth.py [--scale busy] [--day 2024-01-09] [--sessions 3] [--level 1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from alphafeat import synth


def _timed(fn: Any) -> tuple[Any, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", default="busy", choices=sorted(synth.SCALES))
    ap.add_argument("--day", default="2024-01-09")
    ap.add_argument("--sessions", type=int, default=3, help="sessions of the generate() run")
    ap.add_argument("--level", type=int, default=synth.FAST_ZSTD_LEVEL)
    args = ap.parse_args()
    day = datetime.date.fromisoformat(args.day)
    schemas = ("mbp-10", "trades", "definition")
    with tempfile.TemporaryDirectory() as d:  # compile (or load the numba cache) of every kernel
        synth.generate(d, start=day, sessions=1, seed=0, scale="quiet", schemas=schemas, report=False)
    sess, sim_w, sim_c = _timed(lambda: synth._simulate_session(day, 1, synth.SCALES[args.scale], None, 0))
    n_sim = sum(r.mbp.shape[0] for r in sess.runs.values())
    del sess
    summary: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        _, gen_w, gen_c = _timed(
            lambda: synth.generate(
                d,
                start=day,
                sessions=args.sessions,
                seed=1,
                scale=args.scale,
                schemas=schemas,
                zstd_level=args.level,
                report=False,
                summary=summary,
            )
        )
    n_gen = sum(s["mbp10_records"] for s in summary)
    res = {
        "bench": "synth",
        "scale": args.scale,
        "day": args.day,
        "zstd_level": args.level,
        "simulate_mbp10_records": n_sim,
        "simulate_wall_s": round(sim_w, 3),
        "simulate_cpu_s": round(sim_c, 3),
        "simulate_mbp10_per_cpu_s": round(n_sim / sim_c),
        "simulate_mbp10_per_wall_s": round(n_sim / sim_w),
        "generate_sessions": args.sessions,
        "generate_mbp10_records": n_gen,
        "generate_wall_s": round(gen_w, 3),
        "generate_cpu_s": round(gen_c, 3),
        "generate_mbp10_per_cpu_s": round(n_gen / gen_c),
        "generate_mbp10_per_wall_s": round(n_gen / gen_w),
    }
    t = Table(title=f"alphafeat.synth, scale {args.scale}, one process (MBP-10 records/s)")
    for col in ("stage", "MBP-10 records", "CPU s", "per CPU s (per core)", "wall s", "per wall s"):
        t.add_column(col, justify="right")
    t.add_row(
        "simulate, 1 session",
        f"{n_sim:,}",
        f"{sim_c:.2f}",
        f"{n_sim / sim_c:,.0f}",
        f"{sim_w:.2f}",
        f"{n_sim / sim_w:,.0f}",
    )
    t.add_row(
        f"generate, {args.sessions} sessions (zstd {args.level})",
        f"{n_gen:,}",
        f"{gen_c:.2f}",
        f"{n_gen / gen_c:,.0f}",
        f"{gen_w:.2f}",
        f"{n_gen / gen_w:,.0f}",
    )
    Console().print(t)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
