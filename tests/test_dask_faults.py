"""Faults on the map: a Dask worker killed (SIGKILL) in the middle of a run.

A LocalCluster of two worker processes (each under a nanny that starts a new one when it dies)
serves ``precompute(scheduler=...)``; a worker plugin makes a worker kill itself:

* once, after its first segment's partition is staged (the result never reaches the client):
  Dask runs the segment again on a worker; the run completes and the cache is byte-identical
  to a run without faults;
* at every segment, with the scheduler allowing no failure: the run stops with one line naming
  the segment, the cache stays as the previous complete run left it (every byte, the
  manifest too), and a rerun completes it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import pytest
from conftest import PROJECT

from alphafeat.cache import MANIFEST
from alphafeat.errors import AlphafeatError
from alphafeat.precompute import PrecomputeConfig, precompute

DATA = PROJECT / "data"

distributed = pytest.importorskip("distributed")


class Killer(distributed.WorkerPlugin):
    """Wraps the worker's segment entry (``run_segment`` as ``map_one`` calls it) so that the
    process kills itself: ``when="after"``, once per run (a flag file made with O_EXCL), after the
    segment's partition is staged; ``when="before"``, at every segment. Plugins are given to the
    nanny's new worker processes too."""

    def __init__(self, flag: str, when: str) -> None:
        self.flag, self.when = flag, when

    def setup(self, worker: object) -> None:
        import alphafeat.precompute.workers as mod

        inner = mod.run_segment
        flag, when = self.flag, self.when

        def run_segment(*args: object, **kw: object) -> object:
            if when == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            out = inner(*args, **kw)
            try:
                os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return out
            os.kill(os.getpid(), signal.SIGKILL)  # staged, never reported
            return out

        mod.run_segment = run_segment


def _files(root: Path) -> dict[str, bytes]:
    out = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.arrow"))}
    man = json.loads((root / MANIFEST).read_text())
    man.pop("run")
    out[MANIFEST] = json.dumps(man, sort_keys=True).encode()
    return out


def _cluster(tmp_path: Path, plugin: Killer, allowed_failures: int) -> tuple[object, object]:
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": allowed_failures,
                          "temporary-directory": str(tmp_path / "dask")}):  # fmt: skip
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                           silence_logs=logging.ERROR)  # fmt: skip
    client = distributed.Client(cluster)
    client.register_plugin(plugin)
    return cluster, client


def test_a_killed_worker_is_retried_or_stops_the_run_leaving_the_cache(tmp_path) -> None:
    if len(list(DATA.glob("*.dbn.zst"))) != 6:
        pytest.skip("data/ has no embedded sample")
    ref, out = tmp_path / "ref" / "cache", tmp_path / "run" / "cache"
    precompute(PrecomputeConfig(inputs=[DATA], out=ref, device="cpu"))

    # one worker dies after staging its first partition: the segment runs again, the run completes
    flag = tmp_path / "killed-once"
    cluster, client = _cluster(tmp_path, Killer(str(flag), "after"), allowed_failures=3)
    try:
        s = precompute(PrecomputeConfig(inputs=[DATA], out=out, device="cpu", scheduler=cluster.scheduler_address))
    finally:
        client.close()
        cluster.close()
    assert flag.exists() and len(s.partitions) == 3
    complete = _files(out)
    assert complete == _files(ref)

    # every worker dies at its segment, no failure allowed: one line, the cache as the last run left it
    cluster, client = _cluster(tmp_path, Killer(str(flag), "before"), allowed_failures=0)
    try:
        with pytest.raises(AlphafeatError) as err:
            precompute(PrecomputeConfig(inputs=[DATA], out=out, device="cpu", horizons=(30, 70),
                                        scheduler=cluster.scheduler_address))  # fmt: skip
    finally:
        client.close()
        cluster.close()
    line = str(err.value)
    assert "\n" not in line and "worker" in line and "session=" in line, line
    assert _files(out) == complete
    assert not [p for p in out.rglob("*") if ".staging" in p.name or p.name.endswith(".tmp")]

    # a rerun (no cluster) completes it
    s = precompute(PrecomputeConfig(inputs=[DATA], out=out, device="cpu", horizons=(30, 70)))
    assert len(s.partitions) == 3
    man = json.loads((out / MANIFEST).read_text())
    assert man["params"]["horizons"] == [30, 70] and _files(out) != complete
