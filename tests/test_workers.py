"""Workers of the local map (joblib's loky) keep their segment buffers across segments.

loky compares a worker's memory after each task with the one after its first and replaces the
worker when it grew by 300 MB (a leak check). A precompute worker keeps a session's buffers
(:mod:`alphafeat.arena`) on purpose, so it was replaced after every segment: a new interpreter,
imports and numba's kernels for each. :func:`alphafeat.pipeline._keep_worker`, called by every
segment task, raises the check's margin. Here each task keeps 320 MB more than the one before,
as a worker whose first task was a plan scan does; three tasks on one worker. Without
``_keep_worker`` (``_pids(keep=False)``) two processes ran them here: loky replaced the worker.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

pytest.importorskip("psutil")  # loky's leak check needs it
from joblib.externals.loky import get_reusable_executor  # noqa: E402

from alphafeat.pipeline import _keep_worker  # noqa: E402


def _grow(keep: bool, held: list = []) -> int:  # noqa: B006  (the list lives as long as the worker)
    if keep:
        _keep_worker()
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
