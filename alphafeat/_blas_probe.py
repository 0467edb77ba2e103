"""Skip numba's BLAS probe in the processes of ``alphafeat precompute`` (the command's and its
worker processes'; a library user's numba is left as it is)."""

from __future__ import annotations

import sys


class NoBlasProbe:
    """An import finder that fails the import of ``scipy.linalg`` while ``numba.np.arraymath``
    runs, and no other. numba imports that module at the first compiled call of a process (a
    cached kernel's too) and there probes ``scipy.linalg.cython_blas``, only to choose the inner
    product of a jitted ``np.convolve`` / ``np.correlate`` (BLAS, or a loop without it; no
    alphafeat kernel calls them). Importing scipy.linalg took ~0.24 s of every process that
    computes anything (a third of the first load of the cached kernels, 2-core machine; ~0.14 s
    of each worker's first scan). numba's other BLAS users (``np.dot``, ``np.linalg``) import it
    when they are compiled, as before. It reads importlib's private ``__spec__._initializing``:
    should that change, the hook stops firing and nothing else changes."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        arraymath = sys.modules.get("numba.np.arraymath")
        if name == "scipy.linalg" and getattr(getattr(arraymath, "__spec__", None), "_initializing", False):
            raise ModuleNotFoundError("scipy.linalg: numba's BLAS probe skipped by alphafeat's command", name=name)


def install() -> None:
    """Put :class:`NoBlasProbe` first on ``sys.meta_path`` (once). The command calls it in its
    own process and passes it to joblib as the initializer of its worker processes."""
    if not any(isinstance(f, NoBlasProbe) for f in sys.meta_path):
        sys.meta_path.insert(0, NoBlasProbe())
