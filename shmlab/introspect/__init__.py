"""Read-only probes of shared memory in use: open fds, /dev/shm segments, manager daemons, limits.

The same probes read real torch (``torch_*`` files, ``torch_shm_manager``), shmlab (``shmlab_*``
files, ``python -m shmlab.manager``) and the stdlib (``psm_*`` files). Nothing here writes,
signals or unlinks, with one exception the user asks for by name: ``doctor.clean`` removes the
leaked segments a diagnosis marked ``cleanable`` (``python -m shmlab doctor --clean``).

    fds.py        open_fds, fd_counts, FD_KINDS, FdInfo
    processes.py  process_table, process_family, ProcStat, alive_since, orphaned
    segments.py   shm_segments, ShmSegment
    daemons.py    managers, events, ManagerInfo
    resources.py  limits, Limits
    maps.py       mapped_by, held_by: which processes map a file or hold an fd on it
    snapshots.py  snapshot, Snapshot: all of the above in one refresh, or only some parts
    checks.py     the doctor's machine checks: Finding, versions, strategy, fd limit, /dev/shm
    leaks.py      the doctor's leak checks: leaked segments, orphaned managers, deleted fds
    doctor.py     the doctor's diagnosis and report (the command line: shmlab.tools.doctor)

Note [psutil, and /proc where psutil has nothing]
psutil answers the per-process questions (rlimit, cmdline, unix sockets). Two it cannot:
- fd kinds: ``Process.open_files()`` skips sockets, pipes and deleted files, the very fds the
  file_descriptor strategy keeps (``/dev/shm/torch_... (deleted)``), and is slower than a
  ``readlink`` of each ``/proc/<pid>/fd/<n>``.
- a fast process table: one pass over ``/proc/*/stat`` is faster than
  ``process_iter(["name"])`` and serves the family, the managers and "creator alive?".
  (benchmarks/introspect_refresh.py measures both; the figures: docs/benchmarks.md,
  "Reading /proc".)
A process may exit, or an fd close, between listing and reading: whatever vanished in between
is skipped, so a refresh never raises for it.
"""

from .._shm import SHM_DIR
from .daemons import ManagerInfo, events, managers
from .fds import FD_KINDS, FdInfo, fd_counts, open_fds
from .maps import held_by, mapped_by
from .processes import ProcStat, alive_since, orphaned, process_family, process_table
from .resources import Limits, limits
from .segments import ShmSegment, shm_segments
from .snapshots import Snapshot, snapshot

__all__ = [
    "FD_KINDS", "SHM_DIR", "FdInfo", "Limits", "ManagerInfo", "ProcStat", "ShmSegment",
    "Snapshot", "alive_since", "events", "fd_counts", "held_by", "limits", "managers",
    "mapped_by", "open_fds", "orphaned", "process_family", "process_table", "shm_segments",
    "snapshot",
]
