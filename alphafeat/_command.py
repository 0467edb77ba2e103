"""What the processes of the ``alphafeat`` command set up (its own and its joblib workers'; a
library user's process is left as it is): numba's BLAS probe skipped, numba's cached kernels
loaded without its compiler's start-up, and workers that end with the command."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from importlib.machinery import PathFinder


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


class LeanKernelLoads:
    """An import finder that, as numba's modules ``numba.core.caching`` and
    ``numba.core.entrypoints`` load, makes a process load numba's cached CPU kernels without
    the compiler's start-up. numba's ``Cache.load_overload`` first refreshes the CPU target
    context: it imports and installs every typing and lowering registry numba has (unicode,
    lists, sets, dicts, random, linear algebra, jitclass...; ~250 modules' worth) and runs
    the ``numba_extensions`` entry points of every installed distribution, before reading
    machine code that needs none of it: about a third of a command's time before its first
    book record (docs/performance.md). Here a cached CPU kernel is loaded with numba's
    runtime (NRT, which its code may call) initialised and nothing else; a kernel that has to
    be compiled still gets the whole refresh (numba's compiler does it itself), and a cache
    that cannot be read falls back to a compile as before. numba's entry points (extensions
    that add types and lowerings for other libraries' objects: no alphafeat kernel takes
    one) are not run (and ``importlib.metadata``, which finds them, is loaded only if used:
    :meth:`lazy`), nor is PyYAML imported without a numba config file to read
    (:meth:`skip_yaml`), nor SciPy for the version check numba makes first thing (this
    project requires SciPy >= 1.10; numba's BLAS users import it as before). Reads numba's
    private ``Cache._load_overload``, ``_guard_against_spurious_io_errors``, ``rtsys`` and
    ``entrypoints._already_initialized``: should they move, the loads are numba's own again
    (:func:`_lean_loads` leaves a numba it does not recognise as it is)."""

    hooks = ("numba.core.caching", "numba.core.entrypoints")

    @classmethod
    def find_spec(cls, name: str, path: object = None, target: object = None) -> object:
        if name == "yaml":
            cls.skip_yaml()
        if name == "scipy" and _initializing("numba") and "numba.core" not in sys.modules:
            raise ModuleNotFoundError("scipy: numba's version check skipped (alphafeat's command)", name="scipy")
        if name == "importlib.metadata" and _initializing("numba.core.entrypoints"):
            return cls.lazy(name, path)
        if name not in cls.hooks:
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: object) -> None:
            run(module)
            _lean_loads(module)

        spec.loader.exec_module = exec_module
        return spec

    @staticmethod
    def lazy(name: str, path: object) -> object:
        """``name`` imported lazily (``importlib.util.LazyLoader``: executed at its first
        attribute access): ``importlib.metadata``, which numba's entry points module imports
        for the entry points that are not run here (~0.015 s: its ``email`` parsing)."""
        from importlib.util import LazyLoader

        spec = PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = LazyLoader(spec.loader)
        return spec

    @staticmethod
    def skip_yaml() -> None:
        """Fail the import of ``yaml`` by ``numba.core.config`` when there is no
        ``.numba_config.yaml`` in the working directory: numba imports PyYAML only to read that
        file (~0.01 s of every process). With the file there, numba reads it as before."""
        if _initializing("numba.core.config") and not os.path.isfile(".numba_config.yaml"):
            raise ModuleNotFoundError("yaml: not needed by numba without .numba_config.yaml (alphafeat's command)",
                                      name="yaml")  # fmt: skip


def _initializing(name: str) -> bool:
    """Whether module ``name`` is being executed (its import not finished): importlib's private
    ``__spec__._initializing``; False should it change (the hooks then do nothing)."""
    return getattr(getattr(sys.modules.get(name), "__spec__", None), "_initializing", False)


def _lean_loads(module: object) -> None:
    """:class:`LeanKernelLoads` on the numba module ``module`` just loaded (or already loaded)."""
    if module.__name__ == "numba.core.entrypoints" and hasattr(module, "_already_initialized"):
        module._already_initialized = True
        return
    cache = getattr(module, "Cache", None)
    full = getattr(cache, "load_overload", None)
    if full is None or getattr(full, "lean", False) or not hasattr(cache, "_load_overload"):
        return

    def load_overload(self: object, sig: object, target_context: object) -> object:
        from numba.core.cpu import CPUContext
        from numba.core.runtime import nrt

        if not isinstance(target_context, CPUContext) or not hasattr(self, "_guard_against_spurious_io_errors"):
            return full(self, sig, target_context)
        nrt.rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)
        return None  # the guard swallowed an I/O error: compiled instead, as numba does

    load_overload.lean = True
    cache.load_overload = load_overload


def lean_kernel_loads() -> None:
    """Put :class:`LeanKernelLoads` on ``sys.meta_path`` (once), or apply it to numba's modules
    already imported: in the command's process."""
    for name in LeanKernelLoads.hooks:
        if name in sys.modules:
            _lean_loads(sys.modules[name])
    if not any(f is LeanKernelLoads for f in sys.meta_path):
        sys.meta_path.insert(0, LeanKernelLoads)


#: ``prctl(2)`` option: the signal a process gets when its parent ends (Linux).
_PR_SET_PDEATHSIG = 1


def worker_start() -> None:
    """joblib's initializer of the command's worker processes (plan scans, segments): the BLAS
    probe skipped (:func:`skip_blas_probe`), lean kernel loads (:func:`lean_kernel_loads`), and
    SIGKILL when the command's process ends (``prctl(PR_SET_PDEATHSIG)``; Linux, elsewhere
    nothing): a command killed with ``kill -9``
    otherwise left its workers to finish their segment into a staging folder nobody commits and
    idle until loky's 300 s timeout, holding a session's memory and the command's stderr (a
    ``| tee`` waited for them)."""
    skip_blas_probe()
    lean_kernel_loads()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here
        pass


def stop_pool_workers() -> None:
    """Stop the worker processes of joblib's (loky's) reusable pool, if this process started
    one: SIGKILL to all of them at once (loky sends it one after another, waiting for each to be
    torn down, seconds for 16 that held a session's buffers or a CUDA context), then the pool shut
    down without waiting. A process that ends right after (:func:`alphafeat.commandline.end_process`) leaves none
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
