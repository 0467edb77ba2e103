"""The fixed cost of ``alphafeat precompute``: Python's start, imports and plan before the first book record.

Each timed run is a fresh process of the command's own command line (``alphafeat precompute -q
--input INPUT --out <fresh>/out [EXTRA]``: a fresh parent folder each time, so no plan, scan or
book is kept in its ``.predecoded``), started through a small probe that notes, on the clock
every process shares (``time.monotonic``):

* ``start_s``: from this script starting the process to the probe's first line (the
  interpreter's start, ``site``);
* ``setup_s``: from there to the plan's start (``alphafeat.plan.make_plan``): importing the
  command line and the main job, parsing and checking the options;
* ``plan_s``: the plan (a plan kept by an earlier run is not used: the folder is fresh);
* ``segment_s``: from the plan's end to the first book record a segment decodes (the first
  chunk of ``alphafeat.dbn.RecordScanner`` holding an MBO / MBP-10 / MBP-1 record after the
  plan): the device's choice, the segment's set-up, its trades;
* ``first_record_s``: their sum, the fixed cost before the first book record (issue 41's goal:
  <= 0.4 s on the GPU host for one session);
* ``wall_s``: the whole command (unless ``--stop-at-first-record``).

The probe hooks only those two functions (wrapped as their modules load) and imports nothing
else before the command does. Runs with ``--jobs`` > 1 over several sessions decode in worker
processes, where the probe sees no record: give one session (the default input).

One more run under ``python -X importtime`` (per checkout) gives ``import_s`` (the sum of the
top-level cumulative import times: what the process spent importing, whoever asked), the
heaviest modules (``--top``). Which heavy libraries a run loaded (:data:`HEAVY`) is noted
by the probe at the first book record and at the command's end (``heavy_at_first_record``,
``heavy_at_exit``; a module imported lazily and never used does not count).

``--baseline DIR`` times another checkout of the project too (its packages first on
``PYTHONPATH``), the two alternating run by run, so that both come from the same minutes of
the same machine. A first run per checkout, not timed, fills numba's cache and the bytecode.

Usage::

    python bench/import_profile.py [--input PATH ...] [--synth SCALE] [--repeat 5] [--top 15]
                                   [--extra "--device cuda"] [--baseline DIR] [--stop-at-first-record]

The default input is one session of the embedded sample (``data/glbx-mdp3-20240306.*``);
``--synth full`` generates one full session (``alphafeat synth --sessions 1``, not timed) and
times that instead. Prints a table, then one JSON line (the last line).
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
HEAVY = ("pandas", "torch", "matplotlib", "dask", "distributed", "databento", "aiohttp", "scipy", "scipy.linalg",
         "requests", "pyarrow", "pyarrow.compute", "numba.cuda", "numba.np.arraymath", "joblib", "yaml",
         "rich.table", "importlib.metadata")  # fmt: skip
LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")
PARTS = ("start_s", "setup_s", "plan_s", "segment_s")
DEFAULT_INPUT = sorted((PROJECT / "data").glob("glbx-mdp3-20240306.*.dbn.zst"))

#: The probe a timed run starts: ``python -c PROBE STAMPS_FILE STOP ARG...`` runs ``alphafeat ARG...``
#: as the program's own command line, noting when the plan starts and ends and when the first
#: book record is decoded (written to STAMPS_FILE as JSON at each of those moments).
PROBE = r"""
import json, os, sys, time
stamps = {"start": time.monotonic()}
out, stop, HEAVY = sys.argv[1], sys.argv[2] == "1", sys.argv[3].split(",")
sys.argv = ["alphafeat", *sys.argv[4:]]

def dump():
    with open(out, "w") as fh:
        json.dump(stamps, fh)

def on_plan(mod):
    make = mod.make_plan
    def make_plan(*a, **k):
        stamps.setdefault("plan_start", time.monotonic())
        try:
            return make(*a, **k)
        finally:
            stamps.setdefault("plan_end", time.monotonic())
            dump()
    mod.make_plan = make_plan

def on_dbn(mod):
    book = {mod.SCHEMA_RTYPES[s] for s in mod.BOOK_SCHEMAS}
    scan = mod.RecordScanner.__iter__
    def records(self):
        for chunk in scan(self):
            if "plan_end" in stamps and "first_record" not in stamps and any(
                    rt in book and len(a) for rt, a in chunk.items()):
                stamps["first_record"] = time.monotonic()
                stamps["loaded"] = sorted(m for m in HEAVY if type(sys.modules.get(m)).__name__ == "module")
                dump()
                if stop:
                    os._exit(0)
            yield chunk
    mod.RecordScanner.__iter__ = records

class Hook:
    hooks = {"alphafeat.plan": on_plan, "alphafeat.dbn": on_dbn}
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in cls.hooks:
            return None
        from importlib.machinery import PathFinder
        spec = PathFinder.find_spec(name, path)
        run, hook = spec.loader.exec_module, cls.hooks[name]
        def exec_module(module):
            run(module)
            hook(module)
        spec.loader.exec_module = exec_module
        return spec

def at_exit():
    stamps["at_exit"] = sorted(m for m in HEAVY if type(sys.modules.get(m)).__name__ == "module")
    dump()

import atexit
atexit.register(at_exit)
sys.meta_path.insert(0, Hook)
from alphafeat.cli import main
main()
"""


def parse_importtime(text: str) -> list[tuple[str, int, int, int]]:
    """``(module, self_us, cumulative_us, depth)`` of every ``-X importtime`` line of ``text``."""
    rows = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            rows.append((m.group(4), int(m.group(1)), int(m.group(2)), (len(m.group(3)) - 1) // 2))
    return rows


def command_args(inputs: list[Path], out: Path, extra: list[str]) -> list[str]:
    """The arguments of ``alphafeat`` for a cold precompute of ``inputs`` into ``out``."""
    ins = [a for p in inputs for a in ("--input", str(p))]
    return ["precompute", "-q", *ins, "--out", str(out), *extra]


def _env(root: Path) -> dict[str, str]:
    """This environment with ``root`` first on ``PYTHONPATH`` and bytecode written as by default."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    return env


def _run(cmd: list[str], root: Path) -> tuple[float, float, str]:
    """(monotonic start, wall seconds, stderr) of ``cmd`` run from ``root``; exits on failure."""
    t0 = time.monotonic()
    res = subprocess.run(cmd, cwd=root, env=_env(root), capture_output=True, text=True)
    wall = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"failed ({res.returncode}) in {root}: {shlex.join(cmd)}\n{(res.stdout + res.stderr)[-3000:]}")
    return t0, wall, res.stderr


def timed_run(root: Path, args: list[str], scratch: Path, stop: bool) -> dict[str, float]:
    """One probed run of ``alphafeat ARGS`` from checkout ``root``: its parts (module docstring), seconds."""
    stamps_file = scratch / "stamps.json"
    stamps_file.unlink(missing_ok=True)
    probe = [sys.executable, "-c", PROBE, str(stamps_file), "1" if stop else "0", ",".join(HEAVY)]
    t0, wall, _ = _run([*probe, *args], root)
    s = json.loads(stamps_file.read_text()) if stamps_file.is_file() else {}
    if "first_record" not in s:
        raise SystemExit(f"no book record decoded in this process after the plan ({root}: {shlex.join(args)}): "
                         "give one session (workers decode elsewhere) and a fresh --out")  # fmt: skip
    got = {"start_s": s["start"] - t0, "setup_s": s["plan_start"] - s["start"],
           "plan_s": s["plan_end"] - s["plan_start"], "segment_s": s["first_record"] - s["plan_end"],
           "first_record_s": s["first_record"] - t0}  # fmt: skip
    if not stop:
        got["wall_s"] = wall
    got["loaded"] = s.get("loaded", [])
    got["at_exit"] = s.get("at_exit", ["(not noted: stopped at the first record)"] if stop else [])
    return got


def import_profile(root: Path, args: list[str], top: int) -> dict:
    """``-X importtime`` of one run of ``alphafeat ARGS`` from ``root``: the sum and the heaviest."""
    _, _, err = _run([sys.executable, "-X", "importtime", "-m", "alphafeat.cli", *args], root)
    rows = parse_importtime(err)
    return {
        "import_s": round(sum(c for _, _, c, d in rows if d == 0) / 1e6, 4),
        "top": [{"module": n, "self_ms": round(s / 1e3, 1), "cumulative_ms": round(c / 1e3, 1)}
                for c, s, n in sorted(((c, s, n) for n, s, c, _ in rows), reverse=True)[:top]],
    }  # fmt: skip


def synth_session(scale: str, where: Path) -> list[Path]:
    """One generated session of ``scale`` (``alphafeat synth --sessions 1``) under ``where``."""
    _run([sys.executable, "-m", "alphafeat.cli", "synth", "--start", "2024-03-04", "--sessions", "1", "--scale", scale,
          "--out", str(where)], PROJECT)  # fmt: skip
    return sorted(where.glob("*.dbn.zst"))


def _stat(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}


def report(res: dict) -> None:
    """The table of ``res`` (the JSON of :func:`main`) on stdout."""
    for who, r in res["checkouts"].items():
        print(f"{who}: {r['root']}")
        print(f"  {'part':<16} {'median s':>9} {'min':>7} {'max':>7}")
        for k in (*PARTS, "first_record_s", "wall_s"):
            if k in r["runs"]:
                st = r["runs"][k]
                print(f"  {k:<16} {st['median']:>9.3f} {st['min']:>7.3f} {st['max']:>7.3f}")
        print(f"  heavy modules loaded at the first book record: {', '.join(r['heavy_at_first_record']) or 'none'}; "
              f"at the end: {', '.join(r['heavy_at_exit']) or 'none'}")  # fmt: skip
        imp = r["imports"]
        print(f"  imports (sum of top-level -X importtime, one run): {imp['import_s']:.3f} s")
        print(f"  {'module':46s} {'self ms':>9s} {'cumul ms':>9s}")
        for t in imp["top"]:
            print(f"  {t['module']:46s} {t['self_ms']:9.1f} {t['cumulative_ms']:9.1f}")
    if "ratio_median" in res:
        print("this / baseline (medians): " + ", ".join(f"{k} {v}" for k, v in res["ratio_median"].items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--input", type=Path, nargs="+", default=None, help="DBN files or folders (default: one session of data/)"
    )
    ap.add_argument("--synth", default=None, metavar="SCALE", help="time one generated session of SCALE instead")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per checkout (default 5)")
    ap.add_argument("--top", type=int, default=15, help="modules of largest cumulative import time to list")
    ap.add_argument("--extra", default="", help="more precompute options, one string")
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout to time beside this one")
    ap.add_argument("--stop-at-first-record", action="store_true", help="end each run at its first book record")
    args = ap.parse_args(argv)
    if args.baseline and not (args.baseline / "alphafeat").is_dir():
        ap.error(f"--baseline {args.baseline}: not a checkout of this project (no alphafeat/ folder there)")
    roots = {"this": PROJECT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    scratch = Path(tempfile.mkdtemp(prefix="import-profile-"))
    try:
        inputs = synth_session(args.synth, scratch / "input") if args.synth else (args.input or DEFAULT_INPUT)
        extra = shlex.split(args.extra)
        cmd = lambda tag: command_args(inputs, scratch / tag / "out", extra)  # noqa: E731
        for who, root in roots.items():  # warm-up: numba's cache, bytecode, page cache
            timed_run(root, cmd(f"warm-{who}"), scratch, False)
        runs: dict[str, list[dict]] = {who: [] for who in roots}
        for i in range(args.repeat):
            for who in list(roots) if i % 2 == 0 else list(roots)[::-1]:
                runs[who].append(timed_run(roots[who], cmd(f"{who}{i}"), scratch, args.stop_at_first_record))
        imports = {who: import_profile(root, cmd(f"imp-{who}"), args.top) for who, root in roots.items()}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    res = {"bench": "import_profile", "input": [str(p) for p in inputs] if not args.synth else f"synth {args.synth}",
           "extra": args.extra, "repeat": args.repeat, "cores": os.cpu_count(), "checkouts": {}}  # fmt: skip
    for who, root in roots.items():
        keys = [k for k in runs[who][0] if k not in ("loaded", "at_exit")]
        res["checkouts"][who] = {"root": str(root), "runs": {k: _stat([r[k] for r in runs[who]]) for k in keys},
                                 "heavy_at_first_record": runs[who][-1]["loaded"],
                                 "heavy_at_exit": runs[who][-1]["at_exit"], "imports": imports[who]}  # fmt: skip
    if args.baseline:
        this, base = res["checkouts"]["this"]["runs"], res["checkouts"]["baseline"]["runs"]
        res["ratio_median"] = {k: round(this[k]["median"] / base[k]["median"], 3) for k in this}
    report(res)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
