"""What the processes of the ``alphafeat`` command set up (its own and its joblib workers'; a
library user's process is left as it is): numba's BLAS probe skipped, and workers that end with
the command."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys


class NoBlasProbe:
    """An import finder that fails the import of ``scipy.linalg`` while ``numba.np.arraymath``
    runs, and no other. numba imports that module at the first compiled call of a process (a
    cached kernel's too) and there probes ``scipy.linalg.cython_blas``, only to choose the inner
    product of a jitted ``np.convolve`` / ``np.correlate`` (BLAS, or a loop without it; no
    alphafeat kernel calls them). Importing scipy.linalg was a third of the first load of the
    cached kernels in every process that computes anything, and part of each worker's first
    scan (docs/performance.md). numba's other BLAS users (``np.dot``, ``np.linalg``) import it
    when they are compiled, as before. It reads importlib's private ``__spec__._initializing``:
    should that change, the hook stops firing and nothing else changes."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        arraymath = sys.modules.get("numba.np.arraymath")
        if name == "scipy.linalg" and getattr(getattr(arraymath, "__spec__", None), "_initializing", False):
            raise ModuleNotFoundError("scipy.linalg: numba's BLAS probe skipped by alphafeat's command", name=name)


def skip_blas_probe() -> None:
    """Put :class:`NoBlasProbe` first on ``sys.meta_path`` (once): in the command's process."""
    if not any(isinstance(f, NoBlasProbe) for f in sys.meta_path):
        sys.meta_path.insert(0, NoBlasProbe())


#: ``prctl(2)`` option: the signal a process gets when its parent ends (Linux).
_PR_SET_PDEATHSIG = 1


def worker_start() -> None:
    """joblib's initializer of the command's worker processes (plan scans, segments): the BLAS
    probe skipped (:func:`skip_blas_probe`), and SIGKILL when the command's process ends
    (``prctl(PR_SET_PDEATHSIG)``; Linux, elsewhere nothing): a command killed with ``kill -9``
    otherwise left its workers to finish their segment into a staging folder nobody commits and
    idle until loky's 300 s timeout, holding a session's memory and the command's stderr (a
    ``| tee`` waited for them)."""
    skip_blas_probe()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here
        pass


def stop_pool_workers() -> None:
    """Stop the worker processes of joblib's (loky's) reusable pool, if this process started
    one: SIGKILL to all of them at once (loky sends it one after another, waiting for each to be
    torn down, seconds for 16 that held a session's buffers or a CUDA context), then the pool shut
    down without waiting. A process that ends right after (:func:`cli.end_process`) leaves none
    behind idling for loky's 300 s timeout. Reads loky's private ``_executor`` and ``_processes``."""
    mod = sys.modules.get("joblib.externals.loky.reusable_executor")
    ex = getattr(mod, "_executor", None)
    if ex is None:
        return
    import psutil

    for pid in list(getattr(ex, "_processes", None) or ()):
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    ex.shutdown(wait=False, kill_workers=True)
