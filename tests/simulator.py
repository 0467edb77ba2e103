"""Running a test file's ``inprocess`` tests under numba's CUDA simulator (CI has no GPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: GIL switch interval (s) under the simulator: it runs every CUDA thread as a Python thread
#: while its block manager polls them in a loop, and at Python's default (5 ms) a launch waits
#: on that loop: one feature call on 300 rows took 31-106 s, 8.5-9.2 s at this interval.
SWITCH_INTERVAL = 1e-4


def simulator_settings() -> None:
    """This process's settings for numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``): the
    switch interval above, and ``cuda.shared.array`` made safe between threads. The simulator
    keys a block's shared arrays by the caller's line and creates one on a miss by get, then
    set (numba-cuda 0.30, ``FakeCUDAShared.array``): threads switched between the two got arrays
    of their own and a block-wide scan read another thread's (seen as a wrong ``ema_mid_1s`` in
    1 of 6 runs at this interval). Here the miss is one ``dict.setdefault``."""
    import numpy as np
    from numba.cuda.simulator import kernelapi

    sys.setswitchinterval(SWITCH_INTERVAL)
    plain = kernelapi.FakeCUDAShared.array

    def array(self, shape, dtype, alignment=None):  # noqa: ANN001, ANN202
        if shape == 0 or alignment is not None:  # dynamic shared memory, or the simulator's error
            return plain(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        got = self._allocations.get(key)
        return got if got is not None else self._allocations.setdefault(key, np.empty(shape, dtype))

    kernelapi.FakeCUDAShared.array = array


def passed_under_simulator(test_file: str, first: str, flags: tuple[str, ...] = (), timeout: int = 600) -> int:
    """Run the ``inprocess`` tests of ``test_file`` with ``NUMBA_ENABLE_CUDASIM=1`` in two pytest
    subprocesses at once (those matching the ``-k`` expression ``first``, then the rest: the
    simulator's block runner spins on a core, so two cores halve the time); asserts that each
    exits 0 and returns how many tests passed in all."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *flags, test_file]
    procs = [subprocess.Popen(cmd + ["-k", f"inprocess and {sel}({first})"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
             for sel in ("", "not ")]
    passed = 0
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, out[-6000:]
            m = re.search(r"(\d+) passed", out)
            assert m is not None, out[-3000:]
            passed += int(m.group(1))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return passed
