"""``--device cuda`` beside ``--device cpu`` in one call on a GPU host (issue 41's table).

Each case is the public command in a fresh process (:func:`bench.precompute.precompute`: wall
seconds, CPU seconds, peak summed RSS of the process tree), with the GPU's memory in use
sampled every 50 ms through NVML (``nvidia-ml-py``; ``nvidia-smi`` otherwise): the peak above
what was in use before the case (``gpu_peak_gb``). Cases, run ``--repeat`` times interleaved
(median, min-max); ``zstd -d`` of the same book files is the yardstick:

* ``N_cpu`` / ``N_cuda``: every session of ``--input`` with ``--jobs``;
* ``N_cuda_all`` / ``N_cpu_all``: the same with ``--features all`` (against ``N_cuda``);
* ``--gpu-rows R1,R2:S``: ``N_cuda`` again with the hub's blocks of R rows on the GPU side
  (``ALPHAFEAT_GPU_ROWS``), as ``N_cuda_rR``, and S slots per stream (``ALPHAFEAT_GPU_SLOTS``)
  where given, as ``N_cuda_rRsS``;
* ``--block-rows R1,R2``: ``N_cuda`` again with the workers' book blocks of R rows
  (``ALPHAFEAT_BLOCK_ROWS``; by default 8 Ki rows with 16 segments at once), as ``N_cuda_bR``;
* ``one_cpu`` / ``one_cuda``: the first session, ``--jobs 1``, with this process and its
  children pinned to ``--one-cores`` (``taskset``), beside ``zstd -d`` of its book file there.

A first run of each device (not timed) fills numba's caches. Prints a table, then one JSON line.

Usage::

    python bench/gpu_compare.py --input S16 [--jobs 16] [--repeat 2] [--one-cores 0,1] [--cases ...] [--extra OPTS]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import precompute as bench  # noqa: E402  (bench/precompute.py)

CASES = ("N_cpu", "N_cuda", "N_cuda_all", "one")
#: Where the GPU hub appends its owners' stats (``ALPHAFEAT_GPU_STATS``), read after each case.
STATS = Path(tempfile.gettempdir()) / "gpu-compare-hub-stats.jsonl"


class GpuMemory:
    """Peak GPU memory used (bytes, summed over devices) while the ``with`` block runs, above
    what was used when it started."""

    def __init__(self, period: float = 0.05) -> None:
        self.period, self.peak, self.base = period, 0, 0
        self._stop = threading.Event()
        self._read = self._reader()

    @staticmethod
    def _reader():  # noqa: ANN205
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            return lambda: sum(pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles)
        except Exception:  # noqa: BLE001
            if shutil.which("nvidia-smi") is None:
                return lambda: 0

            def smi() -> int:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True).stdout  # fmt: skip
                return sum(int(x) for x in out.split()) << 20

            return smi

    def __enter__(self) -> GpuMemory:
        self.base = self.peak = self._read()
        self._th = threading.Thread(target=self._loop, daemon=True)
        self._th.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, self._read())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._th.join()

    @property
    def gb(self) -> float:
        return round((self.peak - self.base) / 1e9, 3)


def measured(inputs: list[Path], out: Path, *args: str) -> dict:
    """:func:`bench.precompute.precompute` with the GPU memory peak (``gpu_peak_gb``)."""
    shutil.rmtree(out.parent, ignore_errors=True)
    out.parent.mkdir(parents=True)
    STATS.unlink(missing_ok=True)
    bench.ENV["ALPHAFEAT_GPU_STATS"] = str(STATS)
    with GpuMemory() as mem:
        try:
            res = bench.precompute(inputs, out, "--predecoded", "none", *args)
        except SystemExit as e:  # a failed case is reported, the others still run
            print(f"FAILED {' '.join(args)}: {str(e)[-1500:]}", flush=True)
            return {"seconds": float("nan"), "error": str(e)[-300:]}
        finally:  # its cache gone before the next case (16 sessions with every feature: ~40 GB)
            shutil.rmtree(out.parent, ignore_errors=True)
    res["gpu_peak_gb"] = mem.gb
    if STATS.exists():  # the hub's owners: seconds issuing, waiting for the device, idle
        res["hub"] = json.loads(STATS.read_text().splitlines()[-1])
    keys = ("seconds", "cpu_s", "peak_rss_gb", "peak_pss_gb", "gpu_peak_gb", "rows", "stage_seconds", "hub",
            "segment_cpu_s", "segments_s")
    print("case", " ".join(args), json.dumps({k: res.get(k) for k in keys}), flush=True)  # kept if cut short
    return res


@contextlib.contextmanager
def settings(**env: str | None) -> Iterator[None]:
    """The cases run in the ``with`` block see these environment settings (``ALPHAFEAT_GPU_ROWS``
    and the like; None: left unset), removed after."""
    env = {k: v for k, v in env.items() if v is not None}
    bench.ENV.update(env)
    try:
        yield
    finally:
        for k in env:
            bench.ENV.pop(k)


def summary(runs: list[dict]) -> dict:
    """The median run (by seconds) with the min and max seconds."""
    runs = [r for r in runs if "error" not in r] or runs[:1]
    secs = [r["seconds"] for r in runs]
    mid = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    return dict(mid, seconds_median=round(statistics.median(secs), 3), seconds_min=min(secs), seconds_max=max(secs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--one-cores", default="0,1")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--gpu-rows", default="", help="extra N_cuda cases with these hub block rows (ROWS or ROWS:SLOTS)")
    ap.add_argument("--block-rows", default="", help="extra N_cuda cases with these worker block rows")
    ap.add_argument("--extra", default="", help="options added to every precompute run (e.g. '--compression lz4')")
    args = ap.parse_args()
    bench.EXTRA[:] = args.extra.split()
    cases = set(args.cases.split(","))
    bench._adopt_orphans()
    by_day = bench.sessions(args.input)
    every = [f for fs in by_day.values() for f in fs]
    first = by_day[next(iter(by_day))]
    books1 = [f for f in first if ".mbp-10." in f.name or ".mbo." in f.name]
    books = [f for f in every if ".mbp-10." in f.name or ".mbo." in f.name]
    scratch = Path(tempfile.mkdtemp(prefix="gpu-compare-"))
    res: dict = {"sessions": len(by_day), "jobs": args.jobs, "repeat": args.repeat, "extra": args.extra}
    runs: dict[str, list[dict]] = {}
    jobs = ["--jobs", str(args.jobs)]
    try:
        # warm-up (not timed): numba's caches, both devices (the cuda run compiles no CPU feature kernel)
        for dev in ("cpu", "cuda"):
            measured(first, scratch / "warm" / "out", "--device", dev)
        for _ in range(max(1, args.repeat)):
            if "N_cuda" in cases:
                runs.setdefault("N_cuda", []).append(measured(every, scratch / "b" / "out", "--device", "cuda", *jobs))
            for r in filter(None, args.gpu_rows.split(",")):
                rows, _, slots = r.partition(":")
                with settings(ALPHAFEAT_GPU_ROWS=rows, ALPHAFEAT_GPU_SLOTS=slots or None):
                    runs.setdefault(f"N_cuda_r{rows}" + (f"s{slots}" if slots else ""), []).append(
                        measured(every, scratch / "b" / "out", "--device", "cuda", *jobs))
            for r in filter(None, args.block_rows.split(",")):
                with settings(ALPHAFEAT_BLOCK_ROWS=r):
                    runs.setdefault(f"N_cuda_b{r}", []).append(
                        measured(every, scratch / "b" / "out", "--device", "cuda", *jobs))
            if "N_cpu" in cases:
                runs.setdefault("N_cpu", []).append(measured(every, scratch / "a" / "out", "--device", "cpu", *jobs))
            if "N_cuda_all" in cases:
                runs.setdefault("N_cuda_all", []).append(
                    measured(every, scratch / "c" / "out", "--device", "cuda", "--features", "all", *jobs))
            if "N_cpu_all" in cases:
                runs.setdefault("N_cpu_all", []).append(
                    measured(every, scratch / "f" / "out", "--device", "cpu", "--features", "all", *jobs))
            runs.setdefault("zstd_N", []).append(bench.zstd_time(books, args.jobs))
        if "one" in cases:
            os.sched_setaffinity(0, {int(c) for c in args.one_cores.split(",")})  # children inherit it
            for _ in range(max(1, args.repeat)):
                runs.setdefault("one_zstd", []).append(bench.zstd_time(books1, 1))
                runs.setdefault("one_cpu", []).append(measured(first, scratch / "d" / "out", "--device", "cpu"))
                runs.setdefault("one_cuda", []).append(measured(first, scratch / "e" / "out", "--device", "cuda"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        for key, rs in runs.items():
            res[key] = summary(rs) if "zstd" not in key else dict(rs[0], seconds_all=[r["seconds"] for r in rs])
        head = ("case", "median s", "min-max", "CPU-s", "RSS GB", "PSS GB", "GPU GB", "rows")
        print("{:14s} {:>9s} {:>15s} {:>7s} {:>7s} {:>7s} {:>7s} {:>10s}".format(*head))
        for key, r in res.items():
            if not isinstance(r, dict):
                continue
            span = f"{r.get('seconds_min', '')}-{r.get('seconds_max', '')}" if "seconds_min" in r else \
                str(r.get("seconds_all", ""))  # fmt: skip
            print(f"{key:14s} {r.get('seconds_median', r['seconds']):9.3f} {span:>15s} {r.get('cpu_s', 0):7.1f} "
                  f"{r.get('peak_rss_gb', 0) or 0:7.2f} {r.get('peak_pss_gb', 0) or 0:7.2f} "
                  f"{r.get('gpu_peak_gb', 0) or 0:7.2f} {r.get('rows', '')!s:>10s}")
        line = json.dumps(res, default=str)
        if args.json_out:
            args.json_out.write_text(line)
        print(line)


if __name__ == "__main__":
    main()
