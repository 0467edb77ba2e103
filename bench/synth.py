"""Speed of the synthetic ES generator (alphafeat.synth), one process.

Measures, for one session at the given scale: the simulation (MBO book model + derived MBP-10
records, all instruments; numba, one core) in MBP-10 records per second, and the full
``generate`` call (simulation + zstd + writing the mbp-10, trades and definition files, no
report) at the fast zstd level. Prints a table and one JSON line.

    python bench/synth.py [--scale busy] [--day 2024-01-09] [--level 1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time

from rich.console import Console
from rich.table import Table

from alphafeat import synth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", default="busy", choices=sorted(synth.SCALES))
    ap.add_argument("--day", default="2024-01-09")
    ap.add_argument("--level", type=int, default=synth.FAST_ZSTD_LEVEL)
    args = ap.parse_args()
    day = datetime.date.fromisoformat(args.day)
    synth._simulate_session(day, 0, 1.0, None, 0)  # compile (or load the numba cache)
    t = time.perf_counter()
    sess = synth._simulate_session(day, 1, synth.SCALES[args.scale], None, 0)
    sim_s = time.perf_counter() - t
    n_mbp, n_mbo = int(sess.mbp.shape[0]), int(sess.mbo.shape[0])
    del sess
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        synth.generate(d, start=day, sessions=1, seed=1, scale=args.scale,
                       schemas=("mbp-10", "trades", "definition"), zstd_level=args.level, report=False)
        gen_s = time.perf_counter() - t
    res = {
        "bench": "synth", "scale": args.scale, "day": args.day, "zstd_level": args.level,
        "mbp10_records": n_mbp, "mbo_records": n_mbo,
        "simulate_s": round(sim_s, 3), "simulate_mbp10_per_s": round(n_mbp / sim_s),
        "generate_s": round(gen_s, 3), "generate_mbp10_per_s": round(n_mbp / gen_s),
    }
    t = Table(title=f"alphafeat.synth, one session, scale {args.scale}, one process")
    for col in ("stage", "seconds", "MBP-10 records", "MBP-10 records/s"):
        t.add_column(col, justify="right")
    t.add_row("simulate (MBO + MBP-10)", f"{sim_s:.2f}", f"{n_mbp:,}", f"{n_mbp / sim_s:,.0f}")
    t.add_row(f"generate (+ zstd {args.level}, write)", f"{gen_s:.2f}", f"{n_mbp:,}", f"{n_mbp / gen_s:,.0f}")
    Console().print(t)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
