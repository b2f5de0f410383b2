"""One refresh's data for the widgets: ``introspect.snapshot()``, with slow-changing parts cached.

Note [An adapter over introspect]
``introspect.snapshot()`` asks everything every time. Two of its parts change rarely but cost
as much as the rest: ``limits()`` (prlimit through psutil, statvfs of /dev/shm) and
``managers()`` (a cmdline and the unix sockets of each daemon). At 4 Hz, under load, they were
about 40% of a refresh. The widgets need fds and files every tick, limits every few seconds,
and managers once a second, or at once when the kernel's family changes: a new daemon is first
a child of the process that started it, and LeakCleanup must see it before it is re-parented
(that link is how it knows the daemon is ours). introspect has no public way to ask for part
of a snapshot, so this adapter builds one from its per-table helpers (one process table per
tick, as ``snapshot()`` does) and falls back to ``snapshot()`` if they are ever renamed.
"""

from __future__ import annotations

import os
import time

import psutil

from .. import introspect

_HELPERS = ("_proc_table", "_family", "_segments", "_managers")


class Prober:
    """Callable: the next ``introspect.Snapshot``, reusing managers/limits while still fresh."""

    def __init__(self, managers_every_s: float = 1.0, limits_every_s: float = 5.0):
        self.every = {"managers": managers_every_s, "limits": limits_every_s}
        self._cached: dict[str, tuple[float, object]] = {}
        self._family: list[int] = []
        self.partial = all(hasattr(introspect, name) for name in _HELPERS)

    def _fresh(self, key: str, make, force: bool = False):
        now = time.monotonic()
        hit = self._cached.get(key)
        if force or hit is None or now - hit[0] >= self.every[key]:
            hit = self._cached[key] = (now, make())
        return hit[1]

    def __call__(self) -> introspect.Snapshot:
        if not self.partial:
            return introspect.snapshot()
        table = introspect._proc_table()
        fds, family = {}, introspect._family(os.getpid(), table)
        changed, self._family = family != self._family, family
        for pid in family:
            try:
                fds[pid] = introspect.fd_counts(pid)
            except psutil.Error:
                continue  # exited since the table was read: nothing to count
        return introspect.Snapshot(
            time.time(), fds, introspect._segments(introspect.SHM_DIR, table),
            self._fresh("managers", lambda: introspect._managers(table), force=changed),
            self._fresh("limits", introspect.limits))
