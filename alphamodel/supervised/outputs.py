"""A run's output folder: files written aside, then moved in whole (``train`` and ``backtest``)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["Staged", "staged_outputs", "save_tensors"]


@dataclass(frozen=True)
class Staged:
    """Where a run writes (``dir``) and what ``out`` held before it (``earlier``: names, those
    starting with a dot left out)."""

    dir: Path
    earlier: frozenset[str]

    def replacing(self, *also: str) -> list[str]:
        """Names written so far (and ``also``, still to be written) that replace an earlier run's."""
        return sorted(({p.name for p in self.dir.iterdir()} | set(also)) & self.earlier)

    def left_over(self, *also: str) -> list[str]:
        """Names of the earlier run's that this run neither wrote so far nor will (``also``)."""
        return sorted(self.earlier - {p.name for p in self.dir.iterdir()} - set(also))


@contextlib.contextmanager
def staged_outputs(out: str | os.PathLike[str]) -> Iterator[Staged]:
    """A folder (``out/.partial-PID``, :attr:`Staged.dir`) to write a run's files into. When the
    block ends without an error each is moved into ``out`` (``os.replace``: a reader sees the
    earlier file or the new one, never half of one; a folder of the same name is replaced; an
    earlier run's other files are left, :meth:`Staged.left_over` names them); on an error
    nothing of them is kept, and ``out`` is removed again if this made it and it stays empty."""
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    earlier = frozenset(p.name for p in out.iterdir() if not p.name.startswith("."))
    tmp = out / f".partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield Staged(tmp, earlier)
        for p in sorted(tmp.iterdir()):
            dst = out / p.name
            if dst.is_dir():
                shutil.rmtree(dst)
            os.replace(p, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, fmt: str) -> None:
    """``safetensors.torch.save_file`` with ``{"format": fmt}`` metadata, readable by others like
    the run's other files (safetensors creates its files with mode 0600)."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": fmt})
    os.chmod(path, 0o644)
