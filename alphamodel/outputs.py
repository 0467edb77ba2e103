"""A run's output folder: files written aside, then moved in whole (``train`` and ``backtest``)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = ["staged_outputs", "save_tensors"]


@contextlib.contextmanager
def staged_outputs(out: str | os.PathLike[str]) -> Iterator[Path]:
    """A folder (``out/.partial-PID``) to write a run's files into. When the block ends without
    an error each is moved into ``out`` (``os.replace``: a reader sees the earlier file or the
    new one, never half of one; a folder of the same name is replaced); on an error nothing of
    them is kept, and ``out`` is removed again if this made it and it stays empty."""
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
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
