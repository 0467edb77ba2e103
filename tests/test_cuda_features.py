"""CUDA kernels == CPU features.

The ``test_inprocess_*`` tests need a CUDA device: a real GPU, or numba's simulator
(``NUMBA_ENABLE_CUDASIM=1`` set before numba is imported). A normal ``pytest`` run on a
machine without a GPU skips them in process and runs them instead through
``test_cuda_kernels_under_simulator``, which starts a second pytest in a subprocess with the
simulator switched on (small inputs, so it stays quick). On a GPU machine both run: the
in-process tests on the device, the subprocess under the simulator.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from simulator import passed_under_simulator
from test_features import PARAMS, perturb_after, random_book

from alphafeat.devices import compute_features
from alphafeat.features import FeatureParams, cuda_available, feature_specs

IN_SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
HAVE_DEVICE = IN_SIM or cuda_available()
REAL_GPU = HAVE_DEVICE and not IN_SIM
needs_device = pytest.mark.skipif(
    not HAVE_DEVICE, reason="no CUDA device (covered by test_cuda_kernels_under_simulator)"
)
N_INPROCESS = 15  # number of test_inprocess_* test items below (checked by the runner)


def rows(full: int, sim: int) -> int:
    """Row count: ``sim`` under the simulator (one Python thread per CUDA thread: slow), else ``full``."""
    return sim if IN_SIM else full


def assert_same(cpu: dict[str, np.ndarray], gpu: dict[str, np.ndarray]) -> None:
    assert list(cpu) == list(gpu)
    for name in cpu:
        assert gpu[name].dtype == np.float64 and gpu[name].shape == cpu[name].shape, name
        g, c = gpu[name], cpu[name]
        np.testing.assert_allclose(g, c, rtol=1e-9, atol=1e-9, equal_nan=True, err_msg=name)


@needs_device
@pytest.mark.parametrize("params", PARAMS, ids=["default", "previous", "next"])
def test_inprocess_cuda_equals_cpu(params: FeatureParams) -> None:
    book = random_book(rows(300, 60), 21)
    cpu = compute_features(book, params, device="cpu")
    gpu = compute_features(book, params, device="cuda")
    assert_same(cpu, gpu)
    assert np.isnan(cpu["mid"]).any()  # NaN handling was exercised


@needs_device
def test_inprocess_small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # chunk = 3: 200 rows -> 67 chunk maps per series, scanned by one block (simulator: 60
    # rows -> 20 maps over 4 threads, so each thread composes a run of five maps)
    from alphafeat.cuda import kernels

    monkeypatch.setattr(kernels, "CHUNK", 3)
    book = random_book(rows(200, 60), 22)
    assert_same(compute_features(book), compute_features(book, device="cuda"))


@needs_device
def test_inprocess_pipeline_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    # rows go through the copy/compute pipeline in steps of 19 (then 64), the first and the
    # last cut in quarters: the recurrences, the last-finite carries and the fracdiff window
    # cross the step boundaries exactly; a long one-sided run spans several steps
    from alphafeat.cuda import kernels

    book = random_book(150, 27)
    book.bid_px[40:120, 0] = np.nan
    p = FeatureParams(fracdiff_threshold=0.01)
    cpu = compute_features(book, p)
    monkeypatch.setattr(kernels, "MIN_STEP", 1)
    monkeypatch.setattr(kernels, "PIPE_ROWS", 37)
    monkeypatch.setattr(kernels, "CHUNK", 4)
    assert [h - lo for lo, h in kernels._step_bounds(150)[1]] == [4, 5, 5, 5] + [19] * 6 + [4, 4, 4, 5]
    first = compute_features(book, p, device="cuda")
    assert_same(cpu, first)
    monkeypatch.setattr(kernels, "PIPE_ROWS", 64)
    monkeypatch.setattr(kernels, "TARGET_STEPS", 2)
    assert [h - lo for lo, h in kernels._step_bounds(150)[1]] == [16, 16, 16, 16, 64, 5, 6, 5, 6]
    again = compute_features(book, p, device="cuda")  # `first` is alive: a new result buffer
    assert_same(cpu, again)
    assert_same(cpu, first)
    assert np.isfinite(cpu["fracdiff_log_mid"]).sum() > 50
    # the pinned result matrix is reused only once no view of the previous one is alive
    # (a short book: the simulator runs one Python thread per CUDA thread)
    ptr = first["mid"].__array_interface__["data"][0]
    del first, again
    short = random_book(24, 28)
    cpu_short = compute_features(short, p)
    r1 = compute_features(short, p, device="cuda")
    p1 = r1["mid"].__array_interface__["data"][0]
    r2 = compute_features(short, p, device="cuda")
    assert r2["mid"].__array_interface__["data"][0] != p1  # r1 alive: not overwritten
    assert_same(cpu_short, r1)
    del r1, r2
    assert compute_features(short, p, device="cuda")["mid"].__array_interface__["data"][0] in (ptr, p1)


@needs_device
def test_inprocess_streamed_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    # segments streamed through the device (each submitted before the previous one's results
    # are back, two device buffer sets in turn, staging slots shared across calls) equal one
    # CPU call each; all results held at once (new pinned matrices) and float32 results too
    from alphafeat.cuda import compute_features_cuda_many, kernels

    if REAL_GPU:  # several steps a segment (the simulator: one step, few rows, it is slow)
        monkeypatch.setattr(kernels, "MIN_STEP", 1)
        monkeypatch.setattr(kernels, "PIPE_ROWS", 4096)
    books = [random_book(rows(n_full, n_sim), 40 + k)
             for k, (n_full, n_sim) in enumerate([(30000, 30), (1, 1), (20000, 20)])]  # fmt: skip
    cpu = [compute_features(b) for b in books]
    got = list(compute_features_cuda_many(books))
    assert len(got) == len(books)
    for c, g in zip(cpu, got, strict=True):
        assert_same(c, g)
    mats = {g["mid"].__array_interface__["data"][0] for g in got}
    assert len(mats) == len(books)  # every held result in its own matrix
    for g64, g32 in zip(got, compute_features_cuda_many(iter(books), dtype="float32"), strict=True):
        for name in g64:
            assert g32[name].dtype == np.float32, name
            np.testing.assert_array_equal(g32[name], g64[name].astype(np.float32), err_msg=name)
    assert list(compute_features_cuda_many([])) == []


@needs_device
def test_inprocess_device_scan_matches_sequential() -> None:
    from numba import cuda

    from alphafeat.cuda.kernels import device_linear_scan

    rng = np.random.default_rng(5)
    a = rng.uniform(0.0, 1.0, (2, 150))
    a[0, 40] = 0.0  # a restart in the middle
    b = rng.normal(size=(2, 150))
    x_d = cuda.device_array((2, 150), dtype=np.float64)
    device_linear_scan(cuda.to_device(a), cuda.to_device(b), x_d, 4)
    x1 = cuda.device_array((2, 150), dtype=np.float64)
    device_linear_scan(cuda.to_device(a), cuda.to_device(b), x1, 1000)  # one chunk per series
    ref = np.empty_like(a)
    for s in range(2):
        v = 0.0
        for i in range(150):
            v = a[s, i] * v + b[s, i]
            ref[s, i] = v
    np.testing.assert_allclose(x_d.copy_to_host(), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(x1.copy_to_host(), ref, rtol=1e-12, atol=1e-12)


@needs_device
def test_inprocess_float32_results() -> None:
    # float32 on request: the float64 results rounded once
    from alphafeat.cuda import compute_features_cuda

    book = random_book(rows(300, 50), 28)
    f64 = compute_features(book, device="cuda")
    f32 = compute_features_cuda(book, dtype="float32")
    assert list(f32) == list(f64)
    for name in f64:
        assert f32[name].dtype == np.float32, name
        np.testing.assert_array_equal(f32[name], f64[name].astype(np.float32), err_msg=name)
    with pytest.raises(ValueError, match="float64 or float32"):
        compute_features_cuda(book, dtype="int32")


@needs_device
def test_inprocess_pinned_input() -> None:
    # columns in page-locked memory go to the device without the staging copy; same values
    import dataclasses

    from alphafeat.cuda import kernels, pinned_empty

    book = random_book(rows(300, 50), 29)
    cols = {}
    for f in dataclasses.fields(book):
        v = getattr(book, f.name)
        if isinstance(v, np.ndarray):
            cols[f.name] = pinned_empty(v.shape, v.dtype)
            cols[f.name][...] = v
            assert kernels.is_pinned(cols[f.name]) == REAL_GPU
            assert kernels.is_pinned(cols[f.name][1:]) == REAL_GPU
    assert not kernels.is_pinned(book.bid_px)
    pinned = dataclasses.replace(book, **cols)
    assert_same(compute_features(book), compute_features(pinned, device="cuda"))


@needs_device
def test_inprocess_no_look_ahead_and_tiny() -> None:
    book = random_book(rows(120, 64), 23)
    t = len(book) // 2
    a = compute_features(book, device="cuda")
    b = compute_features(perturb_after(book, t, 7), device="cuda")
    for name in a:
        np.testing.assert_array_equal(a[name][: t + 1], b[name][: t + 1], err_msg=name)
    one = random_book(1, 24)
    f = compute_features(one, device="cuda")
    assert list(f) == [s.name for s in feature_specs(FeatureParams())]
    assert math.isnan(f["tick_return"][0]) and f["trade_rate_1s"][0] == one.trade_count[0]
    assert_same(compute_features(one), f)


@needs_device
def test_inprocess_crossed_rows() -> None:
    """A crossed run (a pre-open auction book): the GPU equals the CPU, and moving the crossed
    rows' prices and sizes changes no feature of an uncrossed row (tests/test_preopen.py holds
    the CPU paths on the real ESH4 pre-open)."""
    from test_preopen import perturb_crossed

    from alphafeat.features.inputs import crossed_rows

    book = random_book(rows(200, 60), 29)
    lo, hi = len(book) // 4, len(book) // 2
    book.bid_px[lo:hi] = book.ask_px[lo:hi] + 0.25 * np.arange(1, 11)  # bid above ask, every level
    cpu = compute_features(book)
    gpu = compute_features(book, device="cuda")
    assert_same(cpu, gpu)
    x = crossed_rows(book.bid_px, book.ask_px)
    assert x.sum() > (hi - lo) // 2 and np.isnan(gpu["mid"][x]).all() and np.isfinite(gpu["ema_mid_60s"][hi:]).all()
    moved = compute_features(perturb_crossed(book, 3), device="cuda")
    keep = ~x
    for name in gpu:
        np.testing.assert_array_equal(moved[name][keep], gpu[name][keep], err_msg=name)


@needs_device
def test_inprocess_gpu_turn_frees_the_device_buffers(tmp_path) -> None:
    """Features computed in a turn (``gpu_turn``: segments of a run sharing the GPU) equal the
    CPU's (used inside the turn), and the process keeps no device buffer and no pinned host
    buffer after the turn."""
    from alphafeat.cuda import gpu_turn, kernels

    book = random_book(rows(400, 48), 31)
    with gpu_turn(tmp_path):
        gpu = {k: v.copy() for k, v in compute_features(book, device="cuda").items()}
        assert kernels.buffers()._dev and kernels.buffers()._host_out
    bufs = kernels.buffers()
    assert not bufs._dev and not bufs._views and not bufs._host_out and not bufs._host_in and not bufs._slots
    assert_same(compute_features(book), gpu)


@needs_device
def test_inprocess_direction_labels_cuda() -> None:
    from alphafeat.cuda import direction_labels_cuda
    from alphafeat.labels import direction_labels

    mid = compute_features(random_book(250, 26))["mid"]
    ref = direction_labels(mid, (1, 7, 30, 300))
    got = direction_labels_cuda(mid, (1, 7, 30, 300))
    assert list(ref) == list(got)
    for k in ref:
        assert got[k].dtype == np.float32
        np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
    assert np.isnan(got["label_h300"]).all() and np.isfinite(got["label_h1"]).any()


@needs_device
def test_inprocess_triple_barrier_cuda() -> None:
    # one GPU thread per row, the CPU's row code: identical labels, end times and touch rows,
    # on a tick-grid path (exact touches: the barriers are non-strict), NaN prices and widths
    from alphafeat.labels import triple_barrier

    rng = np.random.default_rng(31)
    n = rows(20000, 70)
    price = 5000.0 + 0.25 * np.cumsum(rng.integers(-1, 2, n))
    price[rng.random(n) < 0.05] = np.nan
    width = 0.25 * rng.integers(1, 4, n).astype(np.float64)
    width[rng.random(n) < 0.03] = np.nan
    ts = np.cumsum(rng.integers(1, 10**6, n)).astype(np.int64)
    for h, upper, lower, t in ((1, width, width, ts), (7, width, 0.5, None), (n + 5, 0.75, width, ts)):
        cpu = triple_barrier(price, upper, lower, h, ts=t)
        gpu = triple_barrier(price, upper, lower, h, ts=t, device="cuda")
        for c, g in zip(cpu, gpu, strict=True):
            assert c.dtype == g.dtype
            np.testing.assert_array_equal(g, c)
        assert {-1.0, 1.0} <= set(np.unique(cpu[0][np.isfinite(cpu[0])]).tolist())
    for m in (0, 1):
        for c, g in zip(triple_barrier(price[:m], 0.5, 0.5, 3), triple_barrier(price[:m], 0.5, 0.5, 3, device="cuda"),
                        strict=True):  # fmt: skip
            np.testing.assert_array_equal(g, c)
    with pytest.raises(ValueError, match="device"):
        triple_barrier(price, 0.5, 0.5, 3, device="tpu")


@needs_device
@pytest.mark.skipif(not REAL_GPU, reason="large input only on a real GPU")
def test_inprocess_large_on_gpu() -> None:
    book = random_book(1_000_000, 25)
    assert_same(compute_features(book), compute_features(book, device="cuda"))


#: The in-process tests that run in the first of two simulator processes, the rest in the second:
#: about 65 s each on the 2-core machine, side by side (the simulator's block runner spins on a core).
SIM_FIRST = "pipeline_steps or small_chunks or float32 or default or previous"


def test_cuda_kernels_under_simulator() -> None:
    """Run the in-process tests above in two subprocesses at once with NUMBA_ENABLE_CUDASIM=1
    (:data:`SIM_FIRST`, then the rest); every test but the real-GPU-only one must pass."""
    if IN_SIM:
        pytest.skip("already running under the simulator")
    passed = passed_under_simulator(__file__, SIM_FIRST, ("-rA",), timeout=900)
    assert passed == N_INPROCESS - 1  # everything but the real-GPU-only test ran (not skipped)
