"""The GPU owner (:mod:`alphafeat.cuda.owner`): a segment's blocks on the device == the CPU.

As in ``tests/test_cuda_features.py``: the ``test_inprocess_*`` tests need a CUDA device (a
GPU, or numba's simulator set before numba is imported); without one, a plain ``pytest`` runs
them through ``test_owner_under_simulator`` in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``
(small books: the simulator runs a Python thread per CUDA thread).
"""

from __future__ import annotations

import gc
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from simulator import passed_under_simulator
from test_features import random_book

from alphafeat.errors import AlphafeatError, UsageError
from alphafeat.features import FeatureParams, compute_features, cuda_available, feature_specs

ROOT = Path(__file__).resolve().parents[1]
IN_SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
HAVE_DEVICE = IN_SIM or cuda_available()
needs_device = pytest.mark.skipif(not HAVE_DEVICE, reason="no CUDA device (see test_owner_under_simulator)")
N_INPROCESS = 8  # test_inprocess_* items below (checked by the runner)
#: The simulator runner's first subprocess takes these (about half the time); the other the rest.
SIM_FIRST = "precompute or blocks_cutting or out_of_memory"
#: a short fractional-difference window (a few dozen rows), so that blocks cut it
PARAMS = FeatureParams(fracdiff_threshold=0.02)


def _book(n: int, seed: int, start_nan: bool = True):
    """A random book whose mid is NaN over a run longer than the blocks (the skip-NaN carries
    reach back past several blocks) and, with ``start_nan``, over its first rows."""
    b = random_book(n, seed)
    if start_nan:
        b.bid_px[: min(3, n), 0] = np.nan
    else:  # a finite mid over the first rows
        k = min(6, n)
        b.bid_px[:k, 0], b.ask_px[:k, 0] = 4500.0 + 0.25 * np.arange(k), 4500.5 + 0.25 * np.arange(k)
        b.bid_sz[:k, 0], b.ask_sz[:k, 0] = 5.0, 7.0
    b.bid_px[n // 3 : n // 3 + 11, 0] = np.nan
    return b


def _blocks(n: int, sizes: list[int]) -> list[tuple[int, int]]:
    """``[(a, b), ...]`` covering ``[0, n)`` with the sizes in turn."""
    out, a, k = [], 0, 0
    while a < n:
        b = min(n, a + sizes[k % len(sizes)])
        out.append((a, b))
        a, k = b, k + 1
    return out


def _streamed(owner, plan, cols: dict[str, np.ndarray], spans, where: str = "seg") -> np.ndarray:
    """The owner's features of every row, pushing the blocks ``spans`` (each after the first
    led by its halo row)."""
    n = cols["ts_recv"].shape[0]
    res = np.full((plan.n_out, n), -7.0)  # poisoned: every row must be written
    with owner.open(plan, where) as st:
        for a, b in spans:
            lo = a - 1 if a > 0 else 0
            res[:, a:b] = st.push({k: v[lo:b] for k, v in cols.items()}, a > 0)
    return res


def _cpu(book, params: FeatureParams) -> np.ndarray:
    feats = compute_features(book, params, device="cpu")
    return np.stack([feats[s.name] for s in feature_specs(params)])


def _same(got: np.ndarray, ref: np.ndarray, rtol: float = 1e-9) -> None:
    names = [s.name for s in feature_specs(PARAMS)]
    for k, name in enumerate(names):
        np.testing.assert_allclose(got[k], ref[k], rtol=rtol, atol=rtol, equal_nan=True, err_msg=name)


@needs_device
def test_inprocess_blocks_cutting_every_recurrence_equal_the_cpu() -> None:
    """Blocks of one row at the session start and in the middle, blocks shorter than the
    fractional difference's window (7 rows) and cutting the mid's NaN run (rows 8-18: the
    skip-NaN carries reach back over several blocks), then one whole block, and float32 results,
    on one owner whose device sets take the blocks in turn: the CPU's values (1e-9; float32: the float64
    ones rounded once, within one float32 ulp)."""
    from alphafeat.cuda.owner import Owner
    from alphafeat.features.inputs import prepare
    from alphafeat.features.registry import make_plan

    n = 24
    book = _book(n, 3, start_nan=False)  # the window's rows before row 0 decide the first rows
    ref = _cpu(book, PARAMS)
    fd = [s.name for s in feature_specs(PARAMS)].index("fracdiff_log_mid")
    assert np.isnan(ref[0, 8:19]).all() and np.isfinite(ref[fd]).sum() > 5 and PARAMS_WINDOW() == 7
    assert np.isfinite(ref[0, :6]).all() and np.isnan(ref[fd, :6]).all()
    plan, cols = make_plan(PARAMS), prepare(book, PARAMS)
    owner = Owner(block_rows=24)
    try:
        cut = [(0, 1), (1, 2), (2, 3), (3, 5), (5, 12), (12, 13), (13, 24)]
        _same(_streamed(owner, plan, cols, cut), ref)
        _same(_streamed(owner, plan, cols, [(0, n)]), ref)
    finally:
        owner.close()
    owner32 = Owner(block_rows=24, dtype="float32")
    try:
        got = _streamed(owner32, plan, cols, [(0, 10), (10, 24)])
        # one float32 ulp: a float64 result one libdevice rounding away can round the other way
        np.testing.assert_allclose(got, ref.astype(np.float32), rtol=2**-23, atol=1e-30, equal_nan=True)
    finally:
        owner32.close()


def PARAMS_WINDOW() -> int:  # noqa: N802
    """Rows of the fractional difference's window under :data:`PARAMS`."""
    from alphafeat.features.registry import make_plan

    return int(make_plan(PARAMS).fd_w.shape[0])


@needs_device
def test_inprocess_interleaved_segments_and_bounded_allocations() -> None:
    """Three segments on three threads push to one owner at once (their blocks interleave on
    the device, each continuing its own carry): each equals the CPU. Then more segments, two
    open at a time, one of each pair asking for some rows only: no device array is allocated
    any more but the selection's row list, and no pinned buffer after the first pair (the
    sets, the carries and the host buffers of closed streams are reused)."""
    from alphafeat.cuda.owner import Owner
    from alphafeat.features.inputs import prepare
    from alphafeat.features.registry import make_plan

    plan = make_plan(PARAMS)
    books = [_book(n, 10 + k) for k, n in enumerate((10, 8, 9))]
    owner = Owner(block_rows=16)
    got: dict[int, np.ndarray] = {}
    try:
        def run(k: int) -> None:
            cols = prepare(books[k], PARAMS)
            got[k] = _streamed(owner, plan, cols, _blocks(len(books[k]), [5]), f"segment {k}")

        threads = [threading.Thread(target=run, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k, b in enumerate(books):
            _same(got[k], _cpu(b, PARAMS))
        before = owner.allocations
        assert before > 0 and owner.open_streams == 0
        select = [40, 3, 0, 3]  # rows in any order, one twice: only those come back
        for rnd in range(2):
            pair = [_book(8, 30 + 2 * rnd + j) for j in range(2)]
            streams = [owner.open(plan, f"round {rnd} segment {j}", select if j else None) for j in range(2)]
            for j, st in enumerate(streams):
                cols = prepare(pair[j], PARAMS)
                res = np.empty((len(select) if j else plan.n_out, len(pair[j])))
                for a, b in _blocks(len(pair[j]), [5]):
                    lo = a - 1 if a > 0 else 0
                    res[:, a:b] = st.push({k: v[lo:b] for k, v in cols.items()}, a > 0)
                ref = _cpu(pair[j], PARAMS)
                if j:
                    np.testing.assert_allclose(res, ref[select], rtol=1e-9, atol=1e-9, equal_nan=True)
                else:
                    _same(res, ref)
            for st in streams:
                st.close()
        after_first = (owner.allocations, owner.pinned_allocations)  # the selection's row list and buffers
        assert after_first[0] == before + 1
        for rnd in range(2):  # and again: nothing more
            with owner.open(plan, "again", select) as st:
                st.push(prepare(_book(5, 60 + rnd), PARAMS), False)
        assert (owner.allocations, owner.pinned_allocations) == after_first
    finally:
        owner.close()


@needs_device
def test_inprocess_out_of_memory_is_one_line_naming_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device allocation that fails with CUDA's out-of-memory error: the push raises one
    AlphafeatError line naming the segment; the owner serves the next stream."""
    from alphafeat.cuda import owner as ow
    from alphafeat.features.inputs import prepare
    from alphafeat.features.registry import make_plan

    class CudaAPIError(Exception):  # numba-cuda's error, as the owner recognises it (by name)
        pass

    plan = make_plan(PARAMS)
    book = _book(9, 5)
    cols = prepare(book, PARAMS)
    owner = ow.Owner(block_rows=16)
    try:
        real = ow.Owner.alloc

        def fail(self, shape, dtype):  # noqa: ANN001, ANN202
            raise CudaAPIError("[2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY")

        monkeypatch.setattr(ow.Owner, "alloc", fail)
        with pytest.raises(AlphafeatError) as err, owner.open(plan, "root=ES/session=2024-03-06/ESH4.arrow") as st:
            st.push(cols, False)
        line = str(err.value)
        assert "\n" not in line and "session=2024-03-06/ESH4.arrow" in line and "out of memory" in line, line
        monkeypatch.setattr(ow.Owner, "alloc", real)
        _same(_streamed(owner, plan, cols, _blocks(9, [5])), _cpu(book, PARAMS))
    finally:
        owner.close()


@needs_device
def test_inprocess_pushes_out_of_place_are_usage_errors() -> None:
    from alphafeat.cuda.owner import Owner
    from alphafeat.features.inputs import prepare
    from alphafeat.features.registry import make_plan

    plan = make_plan(PARAMS)
    cols = prepare(_book(10, 6), PARAMS)
    owner = Owner(block_rows=4)
    try:
        with owner.open(plan) as st:
            with pytest.raises(UsageError, match="halo"):
                st.push({k: v[:3] for k, v in cols.items()}, True)
            with pytest.raises(UsageError, match="block_rows"):
                st.push(cols, False)
    finally:
        owner.close()


@needs_device
def test_inprocess_two_devices_one_owner_each() -> None:
    """``cuda:0,1``: one owner per device, each new segment on the one with the fewest open
    (the simulator has one device: both owners use it, each with its own thread, buffers and
    carries); every segment equals the CPU."""
    from numba import cuda

    from alphafeat.cuda.owner import Owners, parse_devices
    from alphafeat.features.inputs import prepare
    from alphafeat.features.registry import make_plan

    if not IN_SIM and len(cuda.gpus) < 2:
        pytest.skip("one GPU here (the simulator stands in for two)")

    assert parse_devices("cuda:0,1", count=2) == [0, 1] and parse_devices("cuda", count=3) == [0, 1, 2]
    for bad in ("cuda:2", "cuda:0,0", "cuda:x", "gpu"):
        with pytest.raises(UsageError):
            parse_devices(bad, count=2)
    plan = make_plan(PARAMS)
    books = [_book(n, 50 + n) for n in (8, 7, 6)]
    with Owners([0, 1], block_rows=8) as owners:
        streams = [owners.open(plan, f"segment {k}") for k in range(2)]
        assert [owners.owners.index(s.owner) for s in streams] == [0, 1]
        for k, st in enumerate(streams):
            cols = prepare(books[k], PARAMS)
            res = np.empty((plan.n_out, len(books[k])))
            for a, b in _blocks(len(books[k]), [5]):
                lo = a - 1 if a > 0 else 0
                res[:, a:b] = st.push({c: v[lo:b] for c, v in cols.items()}, a > 0)
            _same(res, _cpu(books[k], PARAMS))
            st.close()
        _same(_streamed(owners, plan, prepare(books[2], PARAMS), _blocks(6, [6])), _cpu(books[2], PARAMS))
        assert all(o.allocations > 0 for o in owners.owners)


def _slot_fds() -> int:
    """This process's open descriptors of hub slots (anonymous shared memory)."""
    fds = Path("/proc/self/fd")
    return sum("alphafeat-gpu-slot" in os.readlink(f) for f in fds.iterdir() if f.exists()) if fds.is_dir() else 0


def _through_hub(hub, cols: dict[str, np.ndarray], pieces: list[int], select: list[int], where: str = "seg"):
    """A worker's :class:`alphafeat.cuda.hub.HubStream` over ``cols``, handed in ``pieces``
    rows a call: the selected result rows of every row, checked to come back in row order."""
    from alphafeat.cuda.hub import HubStream

    n = cols["ts_recv"].shape[0]
    res = np.full((len(select), n), -7.0)  # poisoned: every row must be written
    seen = [0]

    def store(out: np.ndarray, k0: int, k1: int) -> None:
        assert k0 == seen[0] and out.shape == (len(select), k1 - k0)
        res[:, k0:k1] = out
        seen[0] = k1

    st = HubStream(hub.address, PARAMS, select, where, store)
    try:
        for a, b in _blocks(n, pieces):
            st.add({k: v[:b] for k, v in cols.items()}, a)  # rows before a: already handed over
        st.finish()
    finally:
        st.close()
    assert seen[0] == n
    return res


@needs_device
def test_inprocess_hub_slots_equal_the_cpu_and_stay_bounded(tmp_path, monkeypatch) -> None:
    """The hub (the parent's side) and a worker's HubStream (here on threads of one process):
    slots of 5 rows on the GPU side, handed rows 1, 3 and 11 at a time (a slot filled across
    calls, several slots in one call, the halo row copied from the slot before), two segments at
    once: each equals the CPU (the selected rows, in any order, one twice). More segments after:
    no slot and no device array more (the slots of closed streams are reused). Then a hub of
    three slots a stream (``ALPHAFEAT_GPU_SLOTS``) equals the CPU too; closed, it has written
    its stats and removed its socket's folder."""
    from alphafeat.cuda.hub import SLOTS, Hub
    from alphafeat.features.inputs import prepare

    names = [s.name for s in feature_specs(PARAMS)]
    select = [names.index("fracdiff_log_mid"), 0, 3, 0, len(names) - 1]
    books = [_book(n, 70 + n) for n in (23, 19)]
    with Hub([0], rows=5) as hub:
        got: dict[int, np.ndarray] = {}

        def run(k: int) -> None:
            got[k] = _through_hub(hub, prepare(books[k], PARAMS), [1, 3, 11], select, f"segment {k}")

        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k, b in enumerate(books):
            np.testing.assert_allclose(got[k], _cpu(b, PARAMS)[select], rtol=1e-9, atol=1e-9, equal_nan=True)
        made, allocs = hub.slots_made, hub.owners.owners[0].allocations
        assert made == 2 * SLOTS
        for seed in range(3):
            b = _book(12, 90 + seed)
            res = _through_hub(hub, prepare(b, PARAMS), [12], select)
            np.testing.assert_allclose(res, _cpu(b, PARAMS)[select], rtol=1e-9, atol=1e-9, equal_nan=True)
        assert (hub.slots_made, hub.owners.owners[0].allocations) == (made, allocs)
        assert _slot_fds() == 2 * made  # the hub's (each slot's and its mapping's), not the closed streams'
    monkeypatch.setenv("ALPHAFEAT_GPU_SLOTS", "3")
    monkeypatch.setenv("ALPHAFEAT_GPU_STATS", str(tmp_path / "stats.jsonl"))
    with Hub([0], rows=5) as hub:
        b = _book(16, 97)
        res = _through_hub(hub, prepare(b, PARAMS), [16], select)
        np.testing.assert_allclose(res, _cpu(b, PARAMS)[select], rtol=1e-9, atol=1e-9, equal_nan=True)
        assert hub.slots_made == hub.n_slots == 3
        folder = Path(hub.address[0]).parent
        assert folder.is_dir()
    assert _slot_fds() == 0  # nothing left: the memory goes with the last mapping
    stats = json.loads((tmp_path / "stats.jsonl").read_text())
    assert stats["rows_per_block"] == 5 and stats["owners"][0]["rows"] >= 16
    assert not folder.exists()  # its socket's own folder (in multiprocessing's, an exit left one)


@needs_device
def test_inprocess_hub_out_of_memory_is_one_line_naming_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device allocation failing with CUDA's out-of-memory error in the parent: the worker's
    HubStream raises one AlphafeatError line naming its segment."""
    from alphafeat.cuda import owner as ow
    from alphafeat.cuda.hub import Hub
    from alphafeat.features.inputs import prepare

    class CudaAPIError(Exception):  # numba-cuda's error, as the owner recognises it (by name)
        pass

    def fail(self, shape, dtype):  # noqa: ANN001, ANN202
        raise CudaAPIError("[2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY")

    cols = prepare(_book(9, 5), PARAMS)
    with Hub([0], rows=4) as hub:
        monkeypatch.setattr(ow.Owner, "alloc", fail)
        with pytest.raises(AlphafeatError) as err:
            _through_hub(hub, cols, [9], [0, 1], "root=ES/session=2024-03-06/ESH4.arrow")
    line = str(err.value)
    assert "\n" not in line and "session=2024-03-06/ESH4.arrow" in line and "out of memory" in line, line


def _tiny_session(path: Path, n: int = 40, day: int = 0) -> Path:
    """An MBP-10 file of one session (``day`` sessions after the first): ``n`` records of a
    random walk (instrument 17077)."""
    import zstandard
    from test_dbn import _mbp10, _metadata

    r = _mbp10(n)
    rng = np.random.default_rng(1)
    walk = np.cumsum(rng.integers(-2, 3, n)) * 250_000_000
    for lvl in range(10):
        r[f"bid_px_{lvl:02d}"] = 4_500_000_000_000 + walk - lvl * 250_000_000
        r[f"ask_px_{lvl:02d}"] = 4_500_250_000_000 + walk + lvl * 250_000_000
        r[f"bid_sz_{lvl:02d}"] = rng.integers(1, 50, n)
    r["ts_event"] = r["ts_event"] + np.cumsum(rng.integers(0, 10**9, n)).astype(np.uint64) + day * 86_400 * 10**9
    r["ts_recv"] = r["ts_event"] + 100
    path.write_bytes(zstandard.ZstdCompressor().compress(_metadata() + r.tobytes()))
    return path


@needs_device
def test_inprocess_precompute_cuda_equals_the_cpu_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``precompute --device cuda --jobs 2``: two sessions on two worker processes hand their
    blocks to this process's GPU hub (here blocks of 16 rows on the GPU side) and the cache holds
    the CPU path's values: every column equal (NaN where NaN; float64 within 1e-9, float32
    within its rounding); likewise ``--features all`` with a vol barrier in this process; the
    owners are stopped and the slots closed after; no segment's columns outlive their run
    without the cyclic garbage collector (a worker runs segment after segment: a reference
    cycle through the hub's stream kept each one's ~1 GB until a collection)."""
    import pyarrow as pa

    from alphafeat.cuda import owner
    from alphafeat.precompute import PrecomputeConfig, precompute
    from alphafeat.precompute.table import SegmentColumns

    monkeypatch.setenv("ALPHAFEAT_GPU_ROWS", "16")  # the hub's blocks on the GPU side: 2-3 a session
    stats = tmp_path / "hub.jsonl"
    monkeypatch.setenv("ALPHAFEAT_GPU_STATS", str(stats))
    real = owner.parse_devices
    # cuda:0,1: the simulator as two GPUs (with --jobs 1, one segment at a time: the simulator's
    # kernels are not safe on two owners' threads at once)
    monkeypatch.setattr(owner, "parse_devices", lambda text: real(text, count=2 if ":" in text else None))
    two = "cuda:0,1" if IN_SIM else "cuda"  # on one real GPU, a second owner of device 1 cannot start
    files = [_tiny_session(tmp_path / f"tiny{k}.mbp-10.dbn.zst", 40 - 9 * k, k) for k in range(2)]
    tables = {}
    # two worker processes; then in this process, on two GPUs (cuda:0,1), every feature (a
    # selection of every result row) with a vol barrier (its widths read a feature: the labels
    # wait for the GPU's results)
    for opts in ({"jobs": 2}, {"jobs": 1, "feature_set": "all", "barrier": "vol:2"}):
        for device in ("cpu", "cuda" if opts["jobs"] == 2 else two):
            out = tmp_path / f"{device[:4]}{opts['jobs']}" / "out"
            gc.collect()
            gc.disable()  # a segment's columns must go by reference counting, not wait for a collection
            try:
                s = precompute(PrecomputeConfig(inputs=files, out=out, device=device, instrument_mode="id=17077",
                                                **opts))
                assert not [o for o in gc.get_objects() if isinstance(o, SegmentColumns)]
            finally:
                gc.enable()
            assert s.device == device[:4] and s.rows == 71
            for part in sorted(out.rglob("*.arrow")):
                with pa.memory_map(str(part)) as src:
                    tables[device[:4], opts["jobs"], part.relative_to(out)] = pa.ipc.open_file(src).read_all()
    hubs = [json.loads(line) for line in stats.read_text().splitlines()]
    assert [len(h["owners"]) for h in hubs] == [1, 2 if IN_SIM else 1]  # the visible GPU; then those named
    assert all(o["blocks"] > 1 for o in hubs[1]["owners"])  # each served a session (and its warm-up)
    assert not owner.shared_running()
    assert len(tables) == 8 and _slot_fds() == 0
    for key in [k for k in tables if k[0] == "cpu"]:
        _same_table(tables[key], tables[("cuda", *key[1:])])


def _same_table(cpu, gpu) -> None:
    assert cpu.schema == gpu.schema
    for name in cpu.schema.names:
        x, y = (t.column(name).to_numpy(zero_copy_only=False) for t in (cpu, gpu))
        if x.dtype.kind == "f":
            tol = 1e-6 if x.dtype == np.float32 else 1e-9
            np.testing.assert_allclose(y, x, rtol=tol, atol=tol, equal_nan=True, err_msg=name)
        else:
            assert np.array_equal(x, y, equal_nan=x.dtype.kind in "mM"), name


def test_device_auto_takes_the_gpu_only_where_it_measured_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--device auto``: the CPU while no case has measured the GPU faster; with a measured
    threshold (here 2 workers), the GPU where one is usable and this machine's threads map the
    segments with that many ``--jobs``; the CPU without a GPU, with one worker, on a Dask
    cluster; the reason is the summary's."""
    from alphafeat.precompute import PrecomputeConfig, config

    def cfg(**kw: object) -> PrecomputeConfig:
        return PrecomputeConfig(inputs=[ROOT / "data"], out=ROOT / "cache", **kw)

    probes = []

    def available(answer: bool):  # noqa: ANN202
        return lambda: probes.append(answer) or answer

    assert config.choose_device(cfg(device="cpu")) == ("cpu", "--device cpu")
    monkeypatch.setattr(config, "cuda_available", available(True))
    dev, why = config.choose_device(cfg(device="auto", jobs=16))
    assert config.AUTO_GPU_MIN_JOBS is None and dev == "cpu" and "not measured faster" in why
    assert probes == []  # the GPU not probed (numba.cuda's import, the driver's start) for nothing
    monkeypatch.setattr(config, "AUTO_GPU_MIN_JOBS", 2)
    assert config.choose_device(cfg(device="auto", jobs=16))[0] == "cuda"
    monkeypatch.setattr(config, "cuda_available", available(False))
    assert config.choose_device(cfg(device="auto", jobs=16)) == ("cpu", "auto: no usable CUDA GPU")
    with pytest.raises(AlphafeatError, match="no usable CUDA GPU"):
        config.choose_device(cfg(device="cuda"))
    monkeypatch.setattr(config, "cuda_available", available(True))
    assert config.choose_device(cfg(device="cuda", jobs=1)) == ("cuda", "--device cuda")
    assert config.choose_device(cfg(device="cuda:1, 0")) == ("cuda", "--device cuda:1,0")  # these GPUs
    for bad in ("cuda:x", "cuda:0,0", "cuda:", "gpu"):
        with pytest.raises(UsageError, match="--device"):
            config.check_config(cfg(device=bad))
    dev, why = config.choose_device(cfg(device="auto", jobs=1))
    assert dev == "cpu" and "--jobs 1" in why
    dev, why = config.choose_device(cfg(device="auto", jobs=4, dask_local=2))
    assert dev == "cpu" and "Dask" in why


def test_owner_under_simulator() -> None:
    """The in-process tests above under NUMBA_ENABLE_CUDASIM=1, in two subprocesses at once
    (:data:`SIM_FIRST`, then the rest): all must pass."""
    if IN_SIM:
        pytest.skip("already running under the simulator")
    passed = passed_under_simulator(__file__, SIM_FIRST, ("-x",))
    assert passed == N_INPROCESS
