"""Segments of a run that share a GPU take turns (:func:`alphafeat.cuda.gpu_turn`): at most
total memory // SLOT_BYTES at once, each freeing its device and pinned host memory after; a GPU that still
runs out of memory is one line naming the segment, not numba's traceback."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from pathlib import Path

import pytest

from alphafeat import cuda as cuda_pkg
from alphafeat.cuda import SLOT_BYTES, gpu_turn
from alphafeat.errors import AlphafeatError
from alphafeat.plan import make_plan
from alphafeat.precompute import PrecomputeConfig, books
from alphafeat.precompute.job import make_job
from alphafeat.precompute.relabel import added_features
from alphafeat.validation import validate_instrument_mode

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize(("memory", "most"), [(2 * SLOT_BYTES + 5, 2), (SLOT_BYTES // 2, 1)])
def test_turns_bound_the_segments_on_the_gpu(tmp_path, monkeypatch, memory: int, most: int) -> None:
    """Six segments (threads; flock locks conflict between open files of one process too) on a
    GPU of ``memory`` bytes: never more than ``most`` in a turn at once, each turn freeing the
    device memory once, and every segment gets one."""
    from alphafeat.cuda import kernels

    monkeypatch.setattr(kernels, "total_memory", lambda: memory)
    freed = []
    monkeypatch.setattr(kernels, "release_buffers", lambda: freed.append(1))
    now, peak, done, lock = [0], [0], [], threading.Lock()

    def segment(i: int) -> None:
        with gpu_turn(tmp_path):
            with lock:
                now[0] += 1
                peak[0] = max(peak[0], now[0])
            time.sleep(0.05)
            with lock:
                now[0] -= 1
        done.append(i)

    threads = [threading.Thread(target=segment, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(done) == list(range(6)) and peak[0] == most and len(freed) == 6


def test_out_of_memory_on_the_gpu_is_one_line(tmp_path, monkeypatch) -> None:
    """numba-cuda's CudaAPIError CUDA_ERROR_OUT_OF_MEMORY in a segment's whole-book GPU
    features becomes the AlphafeatError line naming the partition and --device cpu: a rerun
    that adds features to a kept book (``device_features``). A fresh segment's blocks go to the
    GPU owner, whose out-of-memory line ``tests/test_cuda_owner.py`` tests."""

    class CudaAPIError(Exception):  # numba.cuda.cudadrv.driver's, by name (no GPU needed here)
        pass

    def oom(*a, **k):
        raise CudaAPIError("[<CUresult.CUDA_ERROR_OUT_OF_MEMORY: 2>] Call to cuMemAlloc results in "
                           "CUDA_ERROR_OUT_OF_MEMORY")  # fmt: skip

    turns = []
    monkeypatch.setattr(cuda_pkg, "compute_features_cuda", oom)
    monkeypatch.setattr(cuda_pkg, "gpu_turn", lambda d: turns.append(d) or contextlib.nullcontext())
    inputs = sorted(DATA.glob("*20240307*.dbn.zst"))
    if not inputs:
        pytest.skip("data/ has no embedded sample")
    plan = make_plan(inputs, mode=validate_instrument_mode("front-month"), root="ES", roll_rule="volume",
                     roll_days=8, on_error="raise", jobs=1, survey_dir=None)  # fmt: skip
    job = make_job(PrecomputeConfig(inputs=inputs, out=tmp_path / "c", device="cpu"), "cpu")
    job = dataclasses.replace(job, device="cuda")
    seg = plan.segments[0]
    book, _, _ = books.build_book(seg)
    with pytest.raises(AlphafeatError) as e:
        added_features(book, job, ["ofi_l01"], seg.relpath, gpu_locks=str(tmp_path))
    line = str(e.value)
    assert "\n" not in line and seg.relpath in line and "ran out of memory" in line
    assert "--device cpu" in line
    assert turns == [str(tmp_path)]
