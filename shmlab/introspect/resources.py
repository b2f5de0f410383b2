"""How much more a process may open and allocate: RLIMIT_NOFILE and free space in /dev/shm."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from .._shm import SHM_DIR


@dataclass(frozen=True)
class Limits:
    nofile_soft: int  # RLIMIT_NOFILE; -1 (resource.RLIM_INFINITY) means unlimited
    nofile_hard: int
    shm_total: int  # bytes in /dev/shm
    shm_free: int  # bytes an unprivileged process may still allocate there


def limits(pid: int | None = None) -> Limits:
    """RLIMIT_NOFILE of ``pid`` (default: this process) and the size and free space of /dev/shm."""
    soft, hard = psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE)  # prlimit(2) for other pids
    vfs = os.statvfs(SHM_DIR)
    return Limits(soft, hard, vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize)
