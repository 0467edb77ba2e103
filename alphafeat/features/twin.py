"""Load :mod:`alphafeat.features._rows` compiled for one target (``'cpu'`` or ``'cuda'``).

The same source file is imported under two module names; its decorator depends on the name
(``numba.njit`` for ``_rows_cpu``, ``numba.cuda.jit(device=True)`` for ``_rows_cuda``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from alphafeat.errors import UsageError

_SOURCE = Path(__file__).with_name("_rows.py")


def load(target: str) -> ModuleType:
    """The row functions compiled for ``target`` (``'cpu'`` or ``'cuda'``), loaded once."""
    if target not in ("cpu", "cuda"):
        raise UsageError("target", "expected 'cpu' or 'cuda'", target)
    name = f"alphafeat.features._rows_{target}"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, _SOURCE)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
    return mod
