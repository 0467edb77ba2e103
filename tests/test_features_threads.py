"""The CPU features of a segment on several threads give the bytes of one thread.

:meth:`alphafeat.features.cpu.FeatureStream.push_block` with ``threads > 1`` computes the
row-wise features (no state) of the coming pieces on pool threads and the recurrences, post
transforms and fractional difference on the calling thread, in row order. Every feature is then
computed by the same code on the same rows as by one sequential call, so the values must be
equal bit for bit (not to a tolerance): checked on a random book (with and without declared
features, odd piece and block sizes, more pieces than result buffers), and on the cache that
``precompute`` writes with 1 and with 3 threads (every feature, and feature sets whose stored
columns all come from one of the two stages).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from test_declared_feature import TOYS
from test_features import random_book

from alphafeat.features import FeatureParams, compute_features, feature_specs
from alphafeat.features.cpu import FeatureStream
from alphafeat.features.inputs import prepare
from alphafeat.features.registry import make_plan, registered
from alphafeat.precompute import PrecomputeConfig, books, precompute, run, table
from alphafeat.precompute import job as job_mod
from alphafeat.precompute.job import feature_threads

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("declared", [(), TOYS], ids=["built-in", "with-toys"])
def test_row_columns_are_what_the_row_stage_writes(declared) -> None:
    """The columns a threaded stream hands over from its pool threads are exactly those the
    row-wise stage writes, and exactly the features without state in the registry."""
    book = random_book(700, 3)
    with registered(*declared):
        specs = feature_specs(FeatureParams())
        stream = FeatureStream(make_plan(FeatureParams()), 700)
        out = np.full((len(specs), 700), 12345.0)
        stream._row_stage(prepare(book, FeatureParams()), False, out)
    written = {c for c in range(len(specs)) if not (out[c] == 12345.0).all()}
    assert stream.row_cols == {k for k, s in enumerate(specs) if not s.state}
    # besides: the row values of declared features with state, which their recurrence replaces
    stated = {k for k, s in enumerate(specs) if s.state and s.name in {f.name for f in declared}}
    assert written == stream.row_cols | stated
    assert stream.rest_cols == set(range(len(specs))) - stream.row_cols and stream.rest_cols


@pytest.mark.parametrize("declared", [(), TOYS], ids=["built-in", "with-toys"])
@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_push_block_equals_one_call_bit_for_bit(threads: int, declared) -> None:
    """push_block over random blocks in pieces of 97 rows: every column of every row handed
    over exactly once, final when handed over, equal to one compute_features call bit for bit;
    with threads, taken on the pool threads."""
    rng = np.random.default_rng(threads)
    n = 6000
    book = random_book(n, 5)
    main = threading.get_ident()
    with registered(*declared):
        ref = compute_features(book)
        cols = prepare(book, FeatureParams())
        stream = FeatureStream(make_plan(FeatureParams()), 97, threads)
        got = np.full((len(ref), n), -7.0)
        seen = np.zeros((len(ref), n), dtype=np.int64)
        pool, here = [], []  # the columns taken on pool threads, on this one
        cuts = [0, *np.sort(rng.choice(np.arange(1, n), 6, replace=False)).tolist(), n]
        for a, c in zip(cuts[:-1], cuts[1:]):
            lo = 1 if a > 0 else 0

            def take(i0, i1, out, which, a=a, lo=lo):
                r0, r1 = a - lo + i0, a - lo + i1  # segment rows
                for j in which:
                    got[j, r0:r1] = out[j]
                    seen[j, r0:r1] += 1
                (pool if threading.get_ident() != main else here).append(which)

            stream.push_block({k: v[a - lo : c] for k, v in cols.items()}, lo, take)
        stream.close()
    assert (seen == 1).all()
    for j, name in enumerate(ref):
        assert np.array_equal(got[j], ref[name], equal_nan=True), name
    if threads > 1:
        assert set(pool) == {stream.row_cols, stream.rest_cols} and not here
    else:
        assert set(here) == {stream.all_cols} and not pool


def test_push_block_threads_changing_block_to_block_bit_for_bit() -> None:
    """A stream of at most 4 threads whose blocks use 1, 3, 2, 4, 1, ... of them (as a segment
    does when other segments end and cores come free): every value equal to one
    compute_features call bit for bit, and each block on the threads it was given."""
    n = 6000
    book = random_book(n, 5)
    main = threading.get_ident()
    ref = compute_features(book)
    cols = prepare(book, FeatureParams())
    stream = FeatureStream(make_plan(FeatureParams()), 97, 4)
    got = np.full((len(ref), n), -7.0)
    cuts = list(range(0, n, 700)) + [n]
    uses = [1, 3, 2, 4, 1, 2, 4, 3, 1]
    for (a, c), use in zip(zip(cuts[:-1], cuts[1:]), uses * 2, strict=False):
        lo = 1 if a > 0 else 0
        where = set()

        def take(i0, i1, out, which, a=a, lo=lo, where=where):
            got[list(which), a - lo + i0 : a - lo + i1] = out[list(which)]
            where.add(threading.get_ident() == main)

        stream.push_block({k: v[a - lo : c] for k, v in cols.items()}, lo, take, use)
        assert where == ({True} if use == 1 else {False})
    stream.close()
    for j, name in enumerate(ref):
        assert np.array_equal(got[j], ref[name], equal_nan=True), name


def _cache(out: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, threads: int,
           inputs: list[Path], **kw) -> dict[str, bytes]:  # fmt: skip
    monkeypatch.setattr(run, "feature_threads", lambda cfg, segments: threads)
    with caplog.at_level("DEBUG", logger="alphafeat.precompute"):
        precompute(PrecomputeConfig(inputs=inputs, out=out, device="cpu", keep_books="none", **kw))
    assert f"on {threads} thread(s)" in caplog.text
    caplog.clear()
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.arrow"))}


@pytest.mark.parametrize(("features", "days"), [("all", "2024030"), ("ofi", "20240307"), ("vol", "20240307")])
def test_threaded_cache_equals_sequential_bytes(tmp_path, monkeypatch, caplog, features: str, days: str) -> None:
    """precompute with 3 feature threads writes the partitions of 1 thread byte for byte: every
    feature (float64, vol barrier: it reads a stored feature), and feature sets stored from one
    stage only (``ofi``: row-wise; ``vol``: recurrences); small blocks and pieces, so that a
    block holds many pieces and the result buffers are reused."""
    inputs = sorted(DATA.glob(f"*{days}*.dbn.zst"))
    if not inputs:
        pytest.skip("data/ has no embedded sample")
    kw = {"feature_set": features, "dtype": "float64", "barrier": "vol:1.5"}
    monkeypatch.setattr(books, "BLOCK_ROWS", 5000)
    monkeypatch.setattr(table, "_PIECE", 301)
    ref = _cache(tmp_path / "one", monkeypatch, caplog, 1, inputs, **kw)
    got = _cache(tmp_path / "three", monkeypatch, caplog, 3, inputs, **kw)
    assert ref and got == ref


def test_threads_changing_as_segments_end_keep_the_bytes(tmp_path, monkeypatch, caplog) -> None:
    """With segments sharing the cores, the run keeps the count of segments computing in its
    staging folder and a segment's blocks run on the threads that count leaves it
    (``live_threads``, 1 to MAX_FEATURE_THREADS, changing from block to block): the partitions
    equal those of 1 thread byte for byte."""
    import itertools

    from alphafeat.features.cpu import FeatureStream

    inputs = sorted(DATA.glob("*20240307*.dbn.zst"))
    if not inputs:
        pytest.skip("data/ has no embedded sample")
    monkeypatch.setattr(books, "BLOCK_ROWS", 1000)
    monkeypatch.setattr(table, "_PIECE", 301)
    ref = _cache(tmp_path / "one", monkeypatch, caplog, 1, inputs)
    monkeypatch.setattr(run, "segments_at_once", lambda cfg, segments: 2)  # as if another segment ran beside
    counts, set_in_flight = [], job_mod.set_in_flight
    monkeypatch.setattr(run, "set_in_flight", lambda staging, n: (counts.append(n), set_in_flight(staging, n)))
    monkeypatch.setattr(table, "live_threads", lambda job: next(cycle))
    cycle = itertools.cycle([1, 4, 2, 1, 3])
    used, push_block = [], FeatureStream.push_block

    def spy(self, cols, lo, take, threads=None):
        used.append(threads)
        return push_block(self, cols, lo, take, threads)

    monkeypatch.setattr(FeatureStream, "push_block", spy)
    got = _cache(tmp_path / "live", monkeypatch, caplog, 1, inputs)
    assert ref and got == ref
    assert len(used) >= 6 and set(used) == {1, 2, 3, 4} and counts == [2, 0]


def test_live_threads_follow_the_segments_in_flight(tmp_path, monkeypatch) -> None:
    """A segment's threads from the count of segments computing now (16 cores: 16 or 8 at once
    -> 1, 5 -> 2, 3 -> 4 at most), never below the job's share; the share where the count is
    missing (run committed), unreadable or not kept (one segment at a time, --scheduler)."""
    import dataclasses

    monkeypatch.setattr(job_mod, "usable_cores", lambda: 16)
    f = tmp_path / job_mod.IN_FLIGHT
    job = dataclasses.replace(job_mod.make_job(PrecomputeConfig(inputs=[], out=tmp_path / "c"), "cpu"),
                              feature_threads=1, in_flight=str(f))  # fmt: skip
    got = {}
    for n in (16, 8, 5, 3, 1):
        job_mod.set_in_flight(tmp_path, n)
        got[n] = job_mod.live_threads(job)
    assert got == {16: 1, 8: 1, 5: 2, 3: 4, 1: 4}
    assert job_mod.live_threads(dataclasses.replace(job, feature_threads=3)) == 4
    f.write_text("x")
    assert job_mod.live_threads(job) == 1
    f.unlink()
    assert job_mod.live_threads(job) == 1
    assert job_mod.live_threads(dataclasses.replace(job, in_flight=None, feature_threads=2)) == 2


@pytest.mark.parametrize(
    ("opts", "segments", "cores", "want"),
    [
        ({}, 1, 16, 4),  # one session on a big host: the most
        ({}, 8, 16, 4),  # --jobs 1: one segment at a time
        ({"jobs": 4}, 8, 16, 3),  # 4 cores a worker, one of them for its decode thread
        ({"jobs": 8}, 8, 16, 1),
        ({"jobs": 16}, 63, 16, 1),  # every core has a segment
        ({"jobs": -1}, 63, 16, 1),
        ({"jobs": 8}, 1, 16, 4),  # fewer segments than workers
        ({}, 1, 4, 3),
        ({}, 1, 2, 1),  # two cores: the decode thread has the other one
        ({"jobs": 2}, 3, 2, 1),
        ({"dask_local": 2}, 10, 16, 4),
        ({"dask_local": 8}, 10, 16, 1),
        ({"scheduler": "tcp://host:8786"}, 1, 16, 1),  # its workers' cores are not known here
    ],
)
def test_feature_threads_share_the_cores(monkeypatch, opts: dict, segments: int, cores: int, want: int) -> None:
    monkeypatch.setattr(job_mod, "usable_cores", lambda: cores)
    assert feature_threads(PrecomputeConfig(inputs=[], out=Path("x"), **opts), segments) == want


def test_usable_cores_follow_the_affinity_mask() -> None:
    """A process given one core (``taskset``-like affinity) counts one, not the machine's cores;
    the pipeline's share of cores reads the same count."""
    import os
    import subprocess
    import sys

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from alphafeat.cores import usable_cores; from alphafeat.precompute import PrecomputeConfig, job; "
            "print(usable_cores(), job.local_jobs(PrecomputeConfig(inputs=[], out='x', jobs=-1)))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert got == ["1", "1"]
