"""What every ``precompute`` process pays whatever its rows (imports, worker start-up, numba's
cached kernels, the collector), kept from growing back."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import time

import joblib
import numpy as np
import pytest
from conftest import PROJECT

from alphafeat.plan import make_plan

DATA = PROJECT / "data"


def _no_workers(*args: object, **kw: object) -> None:
    raise AssertionError("the plan started worker processes")


def test_pipeline_import_loads_neither_databento_nor_pandas() -> None:
    """A segment worker imports alphafeat.precompute: databento's package (pandas, aiohttp, its
    HTTP clients; ~0.35 s) is loaded only where the plan builds its InstrumentMap."""
    code = "import sys, alphafeat.precompute; print(sorted({'databento', 'pandas', 'joblib'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=PROJECT,
                         env=dict(os.environ, PYTHONPATH=str(PROJECT)), check=True)  # fmt: skip
    assert out.stdout.strip() == "[]"


def test_plan_of_one_session_or_of_kept_scans_starts_no_workers(tmp_path, monkeypatch) -> None:
    """``--jobs N`` starts worker processes in the plan only for scans that pay for them: not for
    the trades file of one session, nor for scans kept by an earlier run."""
    one = sorted(DATA.glob("glbx-mdp3-20240306.*.dbn.zst"))
    if len(one) != 2:
        pytest.skip("data/ has no embedded sample")
    kept = tmp_path / "pre"
    ref = make_plan(sorted(DATA.glob("*.dbn.zst")), survey_dir=kept)  # one process: keeps the scans
    monkeypatch.setattr(joblib, "Parallel", _no_workers)
    assert [s.relpath for s in make_plan(one, jobs=2).segments] == [ref.segments[0].relpath]
    shutil.rmtree(kept / "plan")  # the kept scans, not the kept plan
    again = make_plan(sorted(DATA.glob("*.dbn.zst")), jobs=2, survey_dir=kept)  # three sessions, scans kept
    assert again.schedule == ref.schedule and again.segments == ref.segments
    with pytest.raises(AssertionError, match="worker processes"):  # three sessions, nothing kept: workers
        make_plan(sorted(DATA.glob("*.dbn.zst")), jobs=2)


def test_reruns_load_neither_databento_nor_pandas_nor_a_numba_kernel(tmp_path) -> None:
    """A rerun with nothing changed, then one with other horizons (relabelled, the triple
    barrier kept), in a fresh process: the plan is the kept one (no databento, whose package
    loads pandas), the partition is read and written without pyarrow's pandas conversions, the
    new horizons come from numpy: no numba kernel is loaded (~0.3-0.6 s of each rerun)."""
    one = sorted(DATA.glob("glbx-mdp3-20240306.*.dbn.zst"))
    if len(one) != 2:
        pytest.skip("data/ has no embedded sample")
    code = f"""
import sys
from pathlib import Path
from alphafeat.precompute import PrecomputeConfig, precompute
import alphafeat.labels as lb
cfg = PrecomputeConfig(inputs={[str(p) for p in one]!r}, out=Path({str(tmp_path / "c")!r}), device="cpu")
same = precompute(cfg)
cfg.horizons = (30, 70, 6000)
other = precompute(cfg)
print(same.partitions_skipped, len(same.partitions), any(n.startswith("relabelled") for n in other.notes))
print(sorted({{"databento", "pandas"}} & set(sys.modules)), lb._direction_h.signatures, lb._tb_rows.signatures)
"""
    from alphafeat.precompute import PrecomputeConfig, precompute

    precompute(PrecomputeConfig(inputs=one, out=tmp_path / "c", device="cpu"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=PROJECT,
                         env=dict(os.environ, PYTHONPATH=str(PROJECT)), check=True)  # fmt: skip
    counts, loaded = out.stdout.strip().splitlines()
    assert counts == "1 1 True"
    assert loaded == "[] [] []"


def test_feature_stream_gives_the_kernel_one_layout(monkeypatch) -> None:
    """Every push (first, full, last partial) hands _run_chunk a C-contiguous result matrix, so
    numba loads one compiled version of it per process, not one per layout."""
    from test_features import random_book

    from alphafeat.features import FeatureParams, cpu
    from alphafeat.features.inputs import prepare
    from alphafeat.features.registry import make_plan as feature_plan

    book = random_book(25, 3)
    seen = []
    kernel = cpu._run_chunk

    def spy(mode, inp, kp, out, *rest):  # noqa: ANN001, ANN202
        seen.append((out.shape[1], out.flags.c_contiguous))
        return kernel(mode, inp, kp, out, *rest)

    monkeypatch.setattr(cpu, "_run_chunk", spy)
    stream = cpu.FeatureStream(feature_plan(FeatureParams()), 10)
    cols = prepare(book, FeatureParams())
    for a, b in ((0, 10), (10, 20), (20, 25)):  # no halo, then each led by the row before
        stream.push({k: v[max(a - 1, 0) : b] for k, v in cols.items()}, a > 0)
    assert {w for w, _ in seen} >= {10, 11, 6} and all(c for _, c in seen)


def test_cli_collector_threshold_is_restored() -> None:
    """commandline.run raises the young-generation threshold while a command runs and restores it."""
    from alphafeat.commandline import GC_THRESHOLD, Parser, run

    before = gc.get_threshold()
    during = []
    p = Parser(prog="x")
    p.set_defaults(func=lambda args: during.append(gc.get_threshold()) or 0)
    assert run(p, []) == 0
    assert during[0][0] == max(before[0], GC_THRESHOLD) and during[0][1:] == before[1:]
    assert gc.get_threshold() == before


def test_a_segment_computed_afresh_loads_no_pandas(tmp_path) -> None:
    """Computing and writing a partition (what each worker process does) builds its Arrow
    columns from buffers: no ``pa.array``, which loads pandas (~0.2 s per worker). Here a
    rerun with another feature set in a fresh process (the kept plan: no databento either)."""
    one = sorted(DATA.glob("glbx-mdp3-20240306.*.dbn.zst"))
    if len(one) != 2:
        pytest.skip("data/ has no embedded sample")
    code = f"""
import sys
from pathlib import Path
from alphafeat.precompute import PrecomputeConfig, precompute
cfg = PrecomputeConfig(inputs={[str(p) for p in one]!r}, out=Path({str(tmp_path / "c")!r}), device="cpu",
                       feature_set="default,flow")
s = precompute(cfg)
print(s.partitions_skipped, len(s.partitions), sorted({{"databento", "pandas"}} & set(sys.modules)))
"""
    from alphafeat.precompute import PrecomputeConfig, precompute

    precompute(PrecomputeConfig(inputs=one, out=tmp_path / "c", device="cpu"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=PROJECT,
                         env=dict(os.environ, PYTHONPATH=str(PROJECT)), check=True)  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == "0 1 []"


def test_cli_process_loads_a_kernel_without_scipy_linalg() -> None:
    """In the command's process the first cached kernel loads without numba's BLAS probe
    importing scipy.linalg (~0.24 s); numba's BLAS users still compile, importing it then."""
    code = """
import sys
import alphafeat.cli
from alphafeat.features.cpu import _lut
_lut()
print("scipy.linalg" in sys.modules)
import numba, numpy as np
print(numba.njit(lambda a: np.dot(a, a))(np.arange(3.0)), "scipy.linalg" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=PROJECT,
                         env=dict(os.environ, PYTHONPATH=str(PROJECT)), check=True)  # fmt: skip
    assert out.stdout.split() == ["False", "5.0", "True"]


_LEAN = """
import sys
import numpy as np
import alphafeat.cli
from alphafeat.zstd_frames import _walk_blocks
win = np.random.default_rng(5).integers(0, 256, 4096, dtype=np.uint8)
got = [_walk_blocks(win, k) for k in range(0, 64, 3)]
want = [_walk_blocks.py_func(win, k) for k in range(0, 64, 3)]
registries = ["numba.np.arraymath", "numba.typed.typedlist", "numba.np.linalg", "numba.experimental.jitclass.base"]
print(got == want, sum(_walk_blocks.stats.cache_hits.values()), sorted(m for m in registries if m in sys.modules))
import numba
print(numba.njit(lambda a: np.sort(a)[0])(np.array([3.0, 1.0])), "numba.np.arraymath" in sys.modules)
"""


def test_cli_process_loads_cached_kernels_without_numba_start_up() -> None:
    """In the command's process a cached CPU kernel is loaded without numba's target refresh
    (every typing and lowering registry numba has: ~0.1 s, a third of the time before the first
    book record) and computes what its Python function computes; a function compiled after it
    still gets the whole refresh (``alphafeat._command.LeanKernelLoads``)."""
    env = dict(os.environ, PYTHONPATH=str(PROJECT))
    warm = "import numpy as np; from alphafeat.zstd_frames import _walk_blocks; _walk_blocks(np.zeros(64, np.uint8), 0)"
    # a cold clone compiles and caches the kernel here, so the check below loads it from the cache
    subprocess.run([sys.executable, "-c", warm], timeout=300, cwd=PROJECT, env=env, check=True)
    out = subprocess.run([sys.executable, "-c", _LEAN], capture_output=True, text=True, timeout=300, cwd=PROJECT,
                         env=env, check=True)  # fmt: skip
    assert out.stdout.split("\n")[:2] == ["True 1 []", "1.0 True"], out.stdout + out.stderr


def _lean_load_in_worker() -> tuple[bool, bool]:
    """In a worker: load a cached kernel; whether numba's registries got imported, and whether
    the result is the Python function's."""
    from alphafeat.zstd_frames import _walk_blocks

    win = np.random.default_rng(6).integers(0, 256, 1024, dtype=np.uint8)
    same = _walk_blocks(win, 1) == _walk_blocks.py_func(win, 1)
    return "numba.np.arraymath" in sys.modules, same


def test_command_workers_load_cached_kernels_without_numba_start_up() -> None:
    """The command's joblib workers get the lean kernel loads through its initializer."""
    from alphafeat import _command

    with joblib.parallel_config("loky", initializer=_command.worker_start):
        lean = joblib.Parallel(2)(joblib.delayed(_lean_load_in_worker)() for _ in range(2))
    plain = joblib.Parallel(2)(joblib.delayed(_lean_load_in_worker)() for _ in range(2))
    assert lean == [(False, True)] * 2 and plain == [(True, True)] * 2


def _loads_scipy_linalg() -> bool:
    """In a worker: load a cached kernel; whether scipy.linalg got imported."""
    from alphafeat.features.cpu import _lut

    _lut()
    return "scipy.linalg" in sys.modules


def test_command_workers_load_a_kernel_without_scipy_linalg() -> None:
    """The command's joblib workers (plan scans, segments) get the same skip through joblib's
    initializer (``alphafeat/cli.py``: ``parallel_config("loky", initializer=worker_start)``);
    without it a worker imports scipy.linalg at its first kernel (the check can fail)."""
    from alphafeat import _command

    with joblib.parallel_config("loky", initializer=_command.worker_start):
        skipped = joblib.Parallel(2)(joblib.delayed(_loads_scipy_linalg)() for _ in range(2))
    plain = joblib.Parallel(2)(joblib.delayed(_loads_scipy_linalg)() for _ in range(2))
    assert skipped == [False, False] and plain == [True, True]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_command_workers_end_with_a_killed_command(tmp_path) -> None:
    """A command killed with SIGKILL takes its joblib workers with it (``worker_start``: a
    parent-death signal); they used to finish their segment and idle for loky's 300 s."""
    import signal

    import psutil

    pids = tmp_path / "pids"
    code = f"""
import os, time, joblib
from alphafeat import _command
def work(_):
    with open({str(pids)!r}, "a") as fh:
        fh.write(f"{{os.getpid()}}\\n")
    time.sleep(120)
with joblib.parallel_config("loky", initializer=_command.worker_start):
    joblib.Parallel(2)(joblib.delayed(work)(i) for i in range(2))
"""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT, env=dict(os.environ, PYTHONPATH=str(PROJECT)))
    try:
        deadline = time.monotonic() + 120
        while (not pids.exists() or len(pids.read_text().split()) < 2) and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = [int(p) for p in pids.read_text().split()]
        assert len(workers) == 2 and all(psutil.pid_exists(p) for p in workers)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 20
        while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in workers) \
                and time.monotonic() < deadline:  # fmt: skip
            time.sleep(0.1)
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in workers)
    finally:
        proc.kill()


def test_end_process_leaves_no_pool_workers(tmp_path) -> None:
    """``alphafeat.commandline.end_process`` (a command's own process ending at once) stops a pool the command
    started itself (``alphafeat synth``'s joblib workers had idled 300 s after it), with the
    command's status and nothing reported leaked."""
    import psutil

    code = """
import os, joblib
from alphafeat import commandline
pids = set(joblib.Parallel(2)(joblib.delayed(os.getpid)() for _ in range(8)))
print(*pids, flush=True)
commandline.end_process(3)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=PROJECT,
                         env=dict(os.environ, PYTHONPATH=str(PROJECT)))  # fmt: skip
    assert out.returncode == 3 and "leaked" not in out.stderr, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert pids and os.getpid() not in pids
    deadline = time.monotonic() + 20
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids) \
            and time.monotonic() < deadline:  # fmt: skip
        time.sleep(0.1)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_one_process_command_does_not_import_joblib(tmp_path) -> None:
    """``alphafeat precompute --jobs 1`` starts no worker and so does not import joblib (~0.09 s
    of every run, a fifth of a rerun with nothing changed); with ``--jobs 2`` it does. Both run
    as the program's own command line, which ends its process at once (``alphafeat.commandline.end_process``):
    the exit status is the command's, ``atexit`` handlers still run, loky's resource tracker
    reports nothing leaked, and the workers it no longer waits for are gone soon after."""
    import psutil

    def alive(pids: list[str]) -> bool:
        return any(psutil.pid_exists(int(p)) and psutil.Process(int(p)).status() != psutil.STATUS_ZOMBIE for p in pids)

    if not sorted(DATA.glob("*.dbn.zst")):
        pytest.skip("data/ has no embedded sample")
    code = """
import atexit, sys
import psutil
import alphafeat.cli
atexit.register(lambda: print("joblib" in sys.modules, *(p.pid for p in psutil.Process().children())))
sys.argv = ["alphafeat", "precompute", "--out", sys.argv[1], "--jobs", sys.argv[2], "-q"]
alphafeat.cli.main()
"""
    got = []
    for jobs in ("1", "2"):
        cmd = [sys.executable, "-c", code, str(tmp_path / f"c{jobs}"), jobs]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=PROJECT,
                             env=dict(os.environ, PYTHONPATH=str(PROJECT)))  # fmt: skip
        assert out.returncode == 0 and "leaked" not in out.stderr and "Warning" not in out.stderr, out.stderr
        assert (tmp_path / f"c{jobs}" / "_alphafeat.json").is_file()
        imported, *pids = out.stdout.split("\n")[-2].split()
        got.append(imported)
        deadline = time.monotonic() + 20
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pids)
        assert len(pids) >= (2 if jobs == "2" else 0)  # the workers (and loky's resource tracker)
    assert got == ["False", "True"]


def test_a_cold_precompute_imports_no_heavy_library(tmp_path) -> None:
    """A cold ``alphafeat precompute`` of the embedded sample (plan, symbology, segments, cache;
    nothing kept) in a fresh process imports none of pandas, databento (its package imports
    pandas, aiohttp, requests), torch, matplotlib, dask, nor numba.cuda (``--device auto``
    probes no GPU while the CPU is its choice: ~0.2 s): the symbology comes from
    ``databento_dbn``'s metadata (:class:`alphafeat.instruments.InstrumentMap`), the rest is
    imported where it is used (``bench/import_profile.py`` measures what is left). Nor does it
    load numba's registries (its cached kernels load without them: ``numba.np.arraymath`` and
    with it ``scipy.linalg``), nor SciPy or PyYAML (numba's checks at import); pyarrow is not
    loaded before the first book record (it is imported where a partition is written), nor
    rich's table and progress modules (the bar starts after a delay, the tables at the end)."""
    if not any(DATA.glob("*.dbn.zst")):
        pytest.skip("data/ has no embedded sample")
    heavy = ["aiohttp", "dask", "databento", "distributed", "matplotlib", "numba.cuda", "numba.np.arraymath", "pandas",
             "requests", "scipy", "torch", "yaml"]  # fmt: skip
    code = f"""
import sys
from alphafeat.cli import main
from alphafeat import dbn
at_first = []
scan = dbn.RecordScanner.__iter__
def records(self):
    for chunk in scan(self):
        if not at_first and any(rt == dbn.SCHEMA_RTYPES["mbp-10"] and len(a) for rt, a in chunk.items()):
            at_first.append(sorted(m for m in ("pyarrow", "pyarrow.compute", "joblib", "rich.table", "rich.progress")
                                   if m in sys.modules))
        yield chunk
dbn.RecordScanner.__iter__ = records
rc = main(["precompute", "-q", "--jobs", "1", "--input", {str(DATA)!r}, "--out", {str(tmp_path / "fresh" / "out")!r}])
print(rc, sorted(m for m in {heavy!r} if m in sys.modules), at_first[0], "pyarrow" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=PROJECT,
                         env=dict(os.environ, PYTHONPATH=str(PROJECT)), check=True)  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == "0 [] [] True", out.stdout[-2000:] + out.stderr[-2000:]
    assert len(list((tmp_path / "fresh" / "out").rglob("*.arrow"))) == 3  # the sample's three sessions


def test_the_later_progress_bar_shows_what_was_done_before_it_started(monkeypatch) -> None:
    """:class:`alphafeat.commandline.LaterBar` records tasks and advances until rich's bar
    starts (after ``BAR_DELAY``), then hands them over; a job that ends sooner shows its
    final state; a failed one leaves no bar running."""
    from alphafeat import commandline

    monkeypatch.setattr(commandline, "BAR_DELAY", 0.05)
    bar = commandline.LaterBar()
    t = bar.add_task("segments", total=5)
    bar.advance(t)
    bar.advance(t, 2)
    assert bar.bar is None
    deadline = time.monotonic() + 10
    while bar.bar is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bar.bar is not None and bar.bar.tasks[0].completed == 3 and bar.bar.tasks[0].total == 5
    assert bar.bar.tasks[0].start_time == bar._tasks[0].started  # elapsed from the task's start
    bar.advance(t)
    assert bar.bar.tasks[0].completed == 4
    bar.stop()
    assert not bar.bar.live.is_started

    monkeypatch.setattr(commandline, "BAR_DELAY", 60)
    quick = commandline.LaterBar()
    quick.advance(quick.add_task("segments", total=2), 2)
    quick.stop()  # ended before the delay: shown once, at its end
    assert quick.bar is not None and quick.bar.tasks[0].completed == 2 and not quick.bar.live.is_started
    assert quick.bar.tasks[0].finished and quick.bar.tasks[0].finished_time < 1  # its own clock, not the bar's
    failed = commandline.LaterBar()
    failed.add_task("segments", total=2)
    failed.stop(failed=True)
    failed._timer.join(5)
    assert failed.bar is None and not failed._timer.is_alive()
