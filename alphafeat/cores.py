"""The CPU cores this process may use."""

from __future__ import annotations

import os

__all__ = ["usable_cores"]


def usable_cores() -> int:
    """CPU cores this process may run on: those of its CPU affinity mask (``taskset``, a Slurm
    job's or ``docker --cpuset-cpus`` cpuset; ``os.process_cpu_count`` from Python 3.13, else
    ``os.sched_getaffinity``), where the platform has one, else every core of the machine
    (``os.cpu_count()``, which oversubscribes a process given fewer); at least 1. A cgroup CPU
    quota (``docker --cpus``) is not seen: give ``--jobs`` there."""
    count = getattr(os, "process_cpu_count", None)
    if count is not None:
        return max(1, count() or 1)
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
