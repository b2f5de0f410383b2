"""One refresh for the widgets: fd counts, segments, managers and limits, from one process table.

The partial-snapshot API: ``snapshot()`` probes every part, except those it is given. A caller
that refreshes often (``widgets._probe.Prober``) reads one ``process_table()``, passes it as
``table=`` and passes the slow, rarely changing parts (``managers=``, ``limits=``) it already
has; only the parts it leaves out are probed again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

from .._shm import SHM_DIR
from . import daemons, resources
from .daemons import ManagerInfo
from .fds import fd_counts
from .processes import ProcStat, process_family, process_table
from .resources import Limits
from .segments import ShmSegment, shm_segments


@dataclass(frozen=True)
class Snapshot:
    time: float  # time.time() when taken
    fds: dict[int, dict[str, int]]  # pid -> fd_counts(pid), for every watched live process
    segments: list[ShmSegment]
    managers: list[ManagerInfo]
    limits: Limits  # of this process


def snapshot(pids: list[int] | None = None, shm_dir: str = SHM_DIR, *,
             table: dict[int, ProcStat] | None = None,
             managers: list[ManagerInfo] | None = None,
             limits: Limits | None = None) -> Snapshot:
    """Fd counts of ``pids`` (default: this process and all its descendants), the segments in
    ``shm_dir``, the managers and this process's limits.

    Partial snapshots: ``table`` is a process_table() to use instead of a fresh one (default:
    one read, shared by every probe below); ``managers`` and ``limits``, when given, are put in
    the snapshot as they are instead of being probed again.
    """
    table = process_table() if table is None else table
    watched = process_family(table=table) if pids is None else list(pids)
    fds = {}
    for pid in watched:
        try:
            fds[pid] = fd_counts(pid)
        except (psutil.Error, OSError):
            continue  # exited since we listed it, or not ours to look at: nothing to count
    return Snapshot(
        time.time(), fds, shm_segments(shm_dir, table=table),
        daemons.managers(table=table) if managers is None else managers,
        resources.limits() if limits is None else limits)
