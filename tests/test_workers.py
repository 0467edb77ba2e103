"""Workers of the local map (joblib's loky) keep their segment buffers across segments.

loky compares a worker's memory after each task with the one after its first and replaces the
worker when it grew by 300 MB (a leak check). A precompute worker keeps a session's buffers
(:mod:`alphafeat.arena`) on purpose, so it was replaced after every segment: a new interpreter,
imports and numba's kernels for each. :func:`alphafeat.precompute.workers.keep_worker`, called by every
segment task, raises the check's margin. Here each task keeps 320 MB more than the one before,
as a worker whose first task was a plan scan does; three tasks on one worker. Without
``keep_worker`` (``_pids(keep=False)``) two processes ran them here: loky replaced the worker.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

pytest.importorskip("psutil")  # loky's leak check needs it
from joblib.externals.loky import get_reusable_executor  # noqa: E402

from alphafeat.precompute.workers import keep_worker  # noqa: E402


def _grow(keep: bool, held: list = []) -> int:  # noqa: B006  (the list lives as long as the worker)
    if keep:
        keep_worker()
    held.append(np.ones(320 << 20, dtype=np.uint8))  # touched: resident
    time.sleep(1.1)  # loky checks at most once a second
    return os.getpid()


def _pids(keep: bool) -> set[int]:
    ex = get_reusable_executor(max_workers=1, kill_workers=True, reuse=False)
    try:
        return {f.result() for f in [ex.submit(_grow, keep) for _ in range(3)]}
    finally:
        ex.shutdown(wait=True, kill_workers=True)


def test_workers_are_not_replaced_for_kept_buffers() -> None:
    assert len(_pids(keep=True)) == 1, "the worker was replaced: another process ran a later task"


def _errors() -> list:
    from alphafeat import errors as af
    from alphamodel import errors as am

    return [
        af.AlphafeatError("plain"),
        af.UsageError("--horizons", "expected whole numbers >= 1", [0, 3]),
        af.UsageError("--device", "no usable GPU"),
        af.InputError("/data/x.mbo.dbn.zst", "truncated record", offset=2041, record=17),
        af.InputError("/data/y.dbn", "not DBN", offset=0, decompressed=False),
        af.DataError("no rows", "/cache"),
        af.SelectionError("no outright of NQ"),
        af.CacheError("/cache", "not a cache"),
        am.UsageError("--epochs", "expected >= 1", 0),
        am.ConfigError("run.toml", "epochs", "expected >= 1"),
        am.TrainingError("the loss became NaN"),
    ]


def test_errors_survive_a_pickle_round_trip() -> None:
    """Every error of the family pickles as itself: class, message, exit code and the
    attributes that say where (path, offset, record, option, value), as a worker process
    returns it to the parent."""
    import pickle

    for err in _errors():
        got = pickle.loads(pickle.dumps(err))
        assert type(got) is type(err) and str(got) == str(err) and got.args == err.args, err
        assert got.__dict__ == err.__dict__ and got.exit_code == err.exit_code, err
    e = pickle.loads(pickle.dumps(_errors()[3]))
    assert (e.path, e.offset, e.record, e.problem) == ("/data/x.mbo.dbn.zst", 2041, 17, "truncated record")
    assert e.detail == "truncated record (at byte offset 2041 of the decompressed stream, record 17)"
    u = pickle.loads(pickle.dumps(_errors()[1]))
    assert (u.option, u.value) == ("--horizons", [0, 3])


def _raise_input_error() -> None:
    from alphafeat.errors import InputError

    raise InputError("/data/x.mbo.dbn.zst", "truncated record", offset=2041, record=17)


def test_an_error_raised_in_a_worker_process_reaches_the_parent_as_itself() -> None:
    from alphafeat.errors import InputError

    ex = get_reusable_executor(max_workers=1, kill_workers=True, reuse=False)
    try:
        with pytest.raises(InputError) as e:
            ex.submit(_raise_input_error).result()
    finally:
        ex.shutdown(wait=True, kill_workers=True)
    assert (e.value.path, e.value.offset, e.value.record) == ("/data/x.mbo.dbn.zst", 2041, 17)


def test_a_failed_segment_comes_back_holding_its_error(tmp_path) -> None:
    """map_one returns a segment whose input is gone as a SegmentFailure holding the
    InputError itself (the map goes on; the parent raises it or, with --on-error skip, notes it)."""
    import datetime as dt

    from alphafeat.errors import InputError
    from alphafeat.plan import Segment
    from alphafeat.precompute import PrecomputeConfig
    from alphafeat.precompute.job import make_job
    from alphafeat.precompute.workers import SegmentFailure, map_one

    seg = Segment(session=dt.date(2024, 3, 6), instrument_id=1, raw_symbol="ESH4", root="ES", schema="mbp-10",
                  book_files=(str(tmp_path / "gone.dbn"),), trade_files=(),
                  relpath="root=ES/session=2024-03-06/ESH4.arrow")  # fmt: skip
    job = make_job(PrecomputeConfig(inputs=[], out=tmp_path / "c"), "cpu")
    got = map_one(seg, str(tmp_path), {}, job, None, False, None)
    assert isinstance(got, SegmentFailure) and isinstance(got.error, InputError)
    assert got.relpath == seg.relpath and got.error.path == str(tmp_path / "gone.dbn")
