"""Running a test file's ``inprocess`` tests under numba's CUDA simulator (CI has no GPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
