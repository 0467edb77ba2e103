"""Import-time profile of ``alphafeat precompute``: what a run imports before its first book record.

Runs ``python -X importtime -m cli.alphafeat precompute -q --input INPUT --out <fresh>/out`` (a
cold run: a fresh parent folder each time, so no plan or scan is kept in its ``.predecoded``;
numba's cache warmed by one untimed run first) ``--repeat`` times and
reports, from the last run's ``-X importtime`` lines:

* ``import_s``: the cumulative import time of every top-level import (the sum of the lines at
  nesting depth 0: what the process spent importing, whoever asked);
* ``heavy``: which of pandas, torch, matplotlib, dask, distributed, databento, aiohttp, scipy
  the run imported;
* the modules of largest cumulative time (``--top``);

and the wall time of the whole command (median, min and max of ``--repeat`` runs, each in a
fresh process, without ``-X importtime``, whose own bookkeeping costs time).

Usage::

    python bench/import_profile.py [--input data] [--repeat 5] [--top 15] [--extra "--device cpu"]

Prints a table, then one JSON line (the last line).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "torch", "matplotlib", "dask", "distributed", "databento", "aiohttp", "scipy", "requests")
LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def parse_importtime(text: str) -> list[tuple[str, int, int, int]]:
    """``(module, self_us, cumulative_us, depth)`` of every ``-X importtime`` line of ``text``."""
    rows = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            rows.append((m.group(4), int(m.group(1)), int(m.group(2)), (len(m.group(3)) - 1) // 2))
    return rows


def command(inp: Path, out: Path, extra: list[str], importtime: bool) -> list[str]:
    """The precompute command line (``-X importtime`` first when asked)."""
    flags = ["-X", "importtime"] if importtime else []
    return [sys.executable, *flags, "-m", "cli.alphafeat", "precompute", "-q", "--input", str(inp), "--out", str(out),
            *extra]  # fmt: skip


def run(cmd: list[str]) -> tuple[float, str]:
    """Wall seconds and stderr of ``cmd`` (PYTHONPATH = this checkout); exits on failure."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT), os.environ.get("PYTHONPATH")) if p)}
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=PROJECT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"failed ({res.returncode}): {shlex.join(cmd)}\n{(res.stdout + res.stderr)[-3000:]}")
    return wall, res.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", type=Path, default=PROJECT / "data")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--extra", default="", help="more precompute options, one string")
    args = ap.parse_args(argv)
    extra = shlex.split(args.extra)
    scratch = Path(tempfile.mkdtemp(prefix="import-profile-"))
    try:
        run(command(args.input, scratch / "warm" / "out", extra, False))  # numba's cache, bytecode
        walls = []
        for k in range(args.repeat):
            walls.append(run(command(args.input, scratch / f"w{k}" / "out", extra, False))[0])
        _, err = run(command(args.input, scratch / "imp" / "out", extra, True))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows = parse_importtime(err)
    total = sum(c for _, _, c, d in rows if d == 0)
    seen = {name.split(".")[0] for name, *_ in rows}
    top = sorted(((c, s, name) for name, s, c, _ in rows), reverse=True)[: args.top]
    print(f"{'module':48s} {'self ms':>9s} {'cumul ms':>9s}")
    for c, s, name in top:
        print(f"{name:48s} {s / 1e3:9.1f} {c / 1e3:9.1f}")
    print(f"imports (sum of top-level cumulative): {total / 1e6:.3f} s")
    print(f"command wall: median {statistics.median(walls):.3f} s (min {min(walls):.3f}, max {max(walls):.3f}, "
          f"{len(walls)} runs)")  # fmt: skip
    print("heavy modules imported:", sorted(m for m in HEAVY if m in seen) or "none")
    print(json.dumps({
        "bench": "import_profile", "input": str(args.input), "extra": args.extra, "import_s": round(total / 1e6, 4),
        "wall_median_s": round(statistics.median(walls), 4), "wall_min_s": round(min(walls), 4),
        "wall_max_s": round(max(walls), 4), "repeat": len(walls), "heavy": sorted(m for m in HEAVY if m in seen),
        "top": [{"module": n, "self_ms": round(s / 1e3, 1), "cumulative_ms": round(c / 1e3, 1)} for c, s, n in top],
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
