"""Speed of the synthetic ES generator (alphafeat.synth), one process, one core.

Two measurements at the given scale (default ``busy``, about 1.8 M MBP-10 records a session):

* ``simulate``: :func:`alphafeat.synth.simulate_session` for one session, i.e. the order-level
  book simulation of every instrument with its MBO and MBP-10 records (numba), fresh buffers.
* ``generate``: the whole :func:`alphafeat.synth.generate` call for ``--sessions`` consecutive
  sessions writing the mbp-10, trades and definition files (no report): simulation, merging the
  instruments by ``ts_recv``, trades, DBN metadata, zstd at ``--level`` (default: the fast level
  of big sets, single threaded) and the writes. Everything runs in this one process.
* ``generate --jobs N`` (with ``--jobs`` > 1): the same call over N worker processes (joblib,
  one session each); its rate is per second of wall time (the workers' CPU time is not this
  process's), beside the one-process run of the same sessions.

The issue's target is at least 1 M MBP-10 records per second per core when generating
(``target_1M_per_core_met`` in the JSON line: the one-process ``generate`` rate per CPU second).

Rates are MBP-10 records per second of CPU time of this process (``time.process_time``: all
its threads, user + system; zstd and numba are single threaded here, so this is per core) and
per second of wall time (lower on a loaded machine). Numba compilation is excluded (a warm-up
call loads or builds the cache first). Prints a table and one JSON line.

    python bench/synth.py [--scale busy] [--day 2024-01-09] [--sessions 3] [--level 1] [--jobs 4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
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
    ap.add_argument("--jobs", type=int, default=1, help="also run generate over this many processes")
    args = ap.parse_args()
    day = datetime.date.fromisoformat(args.day)
    schemas = ("mbp-10", "trades", "definition")
    with tempfile.TemporaryDirectory() as d:  # compile (or load the numba cache) of every kernel
        synth.generate(d, start=day, sessions=1, seed=0, scale="quiet", schemas=schemas, report=False)
    sess, sim_w, sim_c = _timed(lambda: synth.simulate_session(day, 1, synth.SCALES[args.scale], None, 0))
    n_sim = sum(r.mbp.shape[0] for r in sess.runs.values())
    del sess

    def run_generate(jobs: int) -> tuple[int, float, float]:
        summary: list[dict[str, Any]] = []
        with tempfile.TemporaryDirectory() as d:
            _, w, c = _timed(
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
                    jobs=jobs,
                )
            )
        return sum(s["mbp10_records"] for s in summary), w, c

    n_gen, gen_w, gen_c = run_generate(1)
    res: dict[str, Any] = {
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
        "target_1M_per_core_met": n_gen / gen_c >= 1e6,
    }
    rows = [
        ("simulate, 1 session", n_sim, sim_c, sim_w),
        (f"generate, {args.sessions} sessions (zstd {args.level})", n_gen, gen_c, gen_w),
    ]
    if args.jobs > 1:
        n_par, par_w, _ = run_generate(args.jobs)
        res.update(generate_jobs=args.jobs, generate_jobs_wall_s=round(par_w, 3),
                   generate_jobs_mbp10_per_wall_s=round(n_par / par_w), jobs_speedup=round(gen_w / par_w, 2))
        rows.append((f"generate, --jobs {args.jobs} (wall only)", n_par, math.nan, par_w))
    t = Table(title=f"alphafeat.synth, scale {args.scale} (MBP-10 records/s)")
    for col in ("stage", "MBP-10 records", "CPU s", "per CPU s (per core)", "wall s", "per wall s"):
        t.add_column(col, justify="right")
    for name, n, c, w in rows:
        t.add_row(name, f"{n:,}", f"{c:.2f}", f"{n / c:,.0f}" if c == c else "-", f"{w:.2f}", f"{n / w:,.0f}")
    Console().print(t)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
