"""The fixed cost of ``alphafeat precompute``: what every process pays whatever its rows.

Each figure is the wall time of a fresh process (median, min and max of ``--repeat`` runs,
interleaved), with Python writing bytecode as by default (``PYTHONDONTWRITEBYTECODE`` removed):

* ``python``: the interpreter alone (``python -c pass``);
* ``import``: ``import cli.alphafeat, alphafeat.precompute`` (what a segment worker imports too);
* ``cold``: ``alphafeat precompute -q --input INPUT`` into a fresh folder (nothing kept): on
  the embedded sample (3 sessions, 29 k rows) nearly all of it is fixed cost;
* ``same``: a rerun with nothing changed (every partition current);
* ``coldJ``: ``cold`` with ``--jobs J`` (``--jobs``; 0 leaves it out).

``--baseline DIR`` runs every case on another checkout too (its ``cli`` and ``alphafeat`` on
``PYTHONPATH``), alternating with this one, so that their ratio comes from one run. A first
run per checkout, not timed, fills numba's cache and the bytecode.

Usage::

    python bench/fixed_cost.py [--input DIR] [--repeat 9] [--jobs 2] [--baseline ../main-before]

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str], root: Path) -> float:
    """Wall seconds of ``cmd`` run from ``root`` with ``root`` first on ``PYTHONPATH``."""
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=root, env={**ENV, "PYTHONPATH": str(root)}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        tail = (out.stdout + out.stderr)[-3000:]
        raise SystemExit(f"failed ({out.returncode}) in {root}: {' '.join(cmd)}\n{tail}")
    return wall


def cases(inp: Path, jobs: int, scratch: Path) -> dict[str, object]:
    """Case name -> a function of (root, run index) giving the command to time."""
    py = sys.executable

    def precompute(tag: str, *extra: str, fresh: bool = True):  # noqa: ANN202
        def cmd(root: Path, i: int) -> list[str]:
            out = scratch / f"{root.name}-{abs(hash(str(root)))}-{tag}" / "out"
            if fresh:
                shutil.rmtree(out.parent, ignore_errors=True)
            return [py, "-m", "cli.alphafeat", "precompute", "-q", "--input", str(inp), "--out", str(out), *extra]

        return cmd

    got = {
        "python": lambda root, i: [py, "-c", "pass"],
        "import": lambda root, i: [py, "-c", "import cli.alphafeat, alphafeat.precompute"],
        "cold": precompute("cold"),
        "same": precompute("same", fresh=False),
    }
    if jobs:
        got[f"cold{jobs}"] = precompute(f"cold{jobs}", "--jobs", str(jobs))
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", type=Path, default=PROJECT / "data", help="DBN files or folder (default data/)")
    ap.add_argument("--repeat", type=int, default=9, help="timed runs per case and checkout (default 9)")
    ap.add_argument("--jobs", type=int, default=2, help="--jobs of the coldJ case (0: no such case)")
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout to time beside this one")
    args = ap.parse_args()
    if args.baseline and not (args.baseline / "cli").is_dir():
        ap.error(f"--baseline {args.baseline}: not a checkout of this project (no cli/ folder there)")
    roots = [PROJECT] + ([args.baseline.resolve()] if args.baseline else [])
    with tempfile.TemporaryDirectory(prefix="fixed_cost_") as tmp:
        todo = cases(args.input.resolve(), args.jobs, Path(tmp))
        for root in roots:  # warm-up: numba's cache, bytecode, page cache; 'same' gets its cache
            for name in ("cold", "same"):
                timed(todo[name](root, -1), root)
        times: dict[tuple[str, str], list[float]] = {}
        for i in range(args.repeat):
            for name, cmd in todo.items():
                for root in roots if i % 2 == 0 else roots[::-1]:
                    times.setdefault((name, str(root)), []).append(timed(cmd(root, i), root))
    res = {"input": str(args.input), "repeat": args.repeat, "cores": os.cpu_count(), "cases": {}}
    rows = []
    for (name, root), ts in times.items():
        stat = {"median": round(statistics.median(ts), 3), "min": round(min(ts), 3), "max": round(max(ts), 3)}
        res["cases"].setdefault(name, {})["this" if root == str(PROJECT) else "baseline"] = stat
        rows.append((name, "this" if root == str(PROJECT) else "baseline", stat))
    print(f"{'case':<8} {'checkout':<9} {'median s':>9} {'min':>7} {'max':>7}")
    for name, who, st in rows:
        print(f"{name:<8} {who:<9} {st['median']:>9.3f} {st['min']:>7.3f} {st['max']:>7.3f}")
    if args.baseline:
        res["ratio_median"] = {n: round(c["this"]["median"] / c["baseline"]["median"], 3)
                               for n, c in res["cases"].items()}  # fmt: skip
        print("this / baseline (medians): " + ", ".join(f"{n} {r}" for n, r in res["ratio_median"].items()))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
