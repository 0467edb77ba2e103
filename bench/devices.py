"""CPU vs CUDA on the same inputs: both caches written by ``alphafeat precompute``, compared.

Usage: python bench/devices.py --input PATH [PATH ...] [--workdir DIR] [--devices cpu,cuda]

Prints a table and one JSON line: rows, seconds per device and the largest relative
difference between the two caches over all float columns. Both caches store every feature and
book level in float64 (``feature_set="all"``, ``dtype="float64"``), so the comparison sees the
devices' results, not the float32 rounding of storage. Each device first runs once into a
scratch cache (Numba's kernels compiled or loaded; plan scans, and the books that
``--predecoded auto`` keeps, go to the shared ``.predecoded`` folder of the work dir); the
timed run then writes a new cache (a rerun into the same one would find every partition
current and write nothing): plan, then per segment decode and book (or a kept book),
features, labels and Arrow partitions. ``--jobs N``: processes for the segments (precompute
--jobs). Without a usable CUDA GPU only the CPU run is made (and nothing is compared).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from alphafeat.cache import compare
from alphafeat.features import cuda_available
from alphafeat.instruments import InstrumentMode
from alphafeat.precompute import PrecomputeConfig, precompute


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--input", nargs="+", required=True)
    ap.add_argument("--mode", default="front-month")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--devices", default="cpu,cuda", help="comma-separated devices to run (default cpu,cuda)")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="alphafeat-devices-"))
    res: dict = {"inputs": args.input}
    devices = [d for d in args.devices.split(",") if d]
    if "cuda" in devices and not cuda_available():
        devices.remove("cuda")
        res["note"] = "no usable CUDA GPU: CPU only"
    for dev in devices:

        def cfg(out: Path, dev: str = dev) -> PrecomputeConfig:
            return PrecomputeConfig(
                inputs=[Path(p) for p in args.input],
                out=out,
                instrument_mode=InstrumentMode.parse(args.mode),
                device=dev,
                feature_set="all",
                dtype="float64",
                jobs=args.jobs,
            )

        precompute(cfg(work / f"{dev}-warm"))  # compiles or loads the kernels, fills the predecoded cache
        t = time.perf_counter()
        s = precompute(cfg(work / dev))
        res[f"{dev}_seconds"] = round(time.perf_counter() - t, 3)
        res["rows"] = s.rows
    if {"cpu", "cuda"} <= set(devices):
        res.update(compare(work / "cpu", work / "cuda"))
    print(f"{'rows':>10} {'cpu s':>8} {'cuda s':>8} {'max rel err':>12} mismatches")
    cell = lambda k: f"{res[k]}" if k in res else "-"  # noqa: E731
    err = f"{res['max_rel_err']:.3g}" if "max_rel_err" in res else "-"
    mism = (res["mismatches"] or "none") if "mismatches" in res else "-"
    print(f"{res['rows']:>10} {cell('cpu_seconds'):>8} {cell('cuda_seconds'):>8} {err:>12} {mism}")
    if "note" in res:
        print(res["note"])
    print(json.dumps(res, default=str))


if __name__ == "__main__":
    main()
