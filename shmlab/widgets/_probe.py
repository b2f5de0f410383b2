"""One refresh's data for the widgets: ``introspect.snapshot()``, with slow-changing parts cached.

Note [Caching the slow parts of a snapshot]
``introspect.snapshot()`` asks everything every time. Two of its parts change rarely but cost
as much as the rest: ``limits()`` (prlimit through psutil, statvfs of /dev/shm) and
``managers()`` (a cmdline and the unix sockets of each daemon). At 4 Hz, under load, they were
about 40% of a refresh. The widgets need fds and files every tick, limits every few seconds,
and managers once a second, or at once when the kernel's family changes: a new daemon is first
a child of the process that started it, and LeakCleanup must see it before it is re-parented
(that link is how it knows the daemon is ours). So each tick reads one process table and asks
introspect's partial snapshot for the rest, handing it the managers and limits still fresh.
"""

from __future__ import annotations

import time

from .. import introspect


class Prober:
    """Callable: the next ``introspect.Snapshot``, reusing managers/limits while still fresh."""

    def __init__(self, managers_every_s: float = 1.0, limits_every_s: float = 5.0,
                 root: int | None = None, hide: frozenset[int] = frozenset()):
        # root: whose family to watch (default: this process); hide: pids left out of it,
        # i.e. the probing helper process itself (_helper.py), which is not the learner's.
        self.every = {"managers": managers_every_s, "limits": limits_every_s}
        self.root, self.hide = root, hide
        self._cached: dict[str, tuple[float, object]] = {}
        self._family: list[int] = []

    def _fresh(self, key: str, make, force: bool = False):
        now = time.monotonic()
        hit = self._cached.get(key)
        if force or hit is None or now - hit[0] >= self.every[key]:
            hit = self._cached[key] = (now, make())
        return hit[1]

    def __call__(self) -> introspect.Snapshot:
        table = introspect.process_table()  # one table for the whole tick
        family = [p for p in introspect.process_family(self.root, table=table)
                  if p not in self.hide]
        changed, self._family = family != self._family, family
        return introspect.snapshot(
            family, table=table,
            managers=self._fresh("managers", lambda: introspect.managers(table=table),
                                 force=changed),
            limits=self._fresh("limits", lambda: introspect.limits(self.root)))
