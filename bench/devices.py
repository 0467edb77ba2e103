"""CPU vs CUDA on the same inputs: both caches written by ``alphafeat precompute``, compared.

Usage: python bench/devices.py --input PATH [PATH ...] [--workdir DIR]

Prints a table and one JSON line: rows, seconds per device and the largest relative
difference between the two caches over all float columns. Each device first runs once into a
scratch cache (Numba's kernels compiled or loaded, the inputs decoded into the shared
predecoded cache); the timed run then writes a new cache (a rerun into the same one would
find every partition current and write nothing): predecoded records to book, features,
labels and Arrow partitions. ``--jobs N``: processes for the CPU segments (precompute --jobs).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from alphafeat.cache import compare
from alphafeat.instruments import InstrumentMode
from alphafeat.pipeline import PrecomputeConfig, precompute


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--input", nargs="+", required=True)
    ap.add_argument("--mode", default="front-month")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="alphafeat-devices-"))
    res: dict = {"inputs": args.input}
    for dev in ("cpu", "cuda"):

        def cfg(out: Path, dev: str = dev) -> PrecomputeConfig:
            return PrecomputeConfig(
                inputs=[Path(p) for p in args.input],
                out=out,
                instrument_mode=InstrumentMode.parse(args.mode),
                device=dev,
                jobs=args.jobs,
            )

        precompute(cfg(work / f"{dev}-warm"))  # compiles or loads the kernels, fills the predecoded cache
        t = time.perf_counter()
        s = precompute(cfg(work / dev))
        res[f"{dev}_seconds"] = round(time.perf_counter() - t, 3)
        res["rows"] = s.rows
    res.update(compare(work / "cpu", work / "cuda"))
    print(f"{'rows':>10} {'cpu s':>8} {'cuda s':>8} {'max rel err':>12} mismatches")
    print(
        f"{res['rows']:>10} {res['cpu_seconds']:>8} {res['cuda_seconds']:>8} {res['max_rel_err']:>12.3g} "
        f"{res['mismatches'] or 'none'}"
    )
    print(json.dumps(res))


if __name__ == "__main__":
    main()
