"""The process table, read once from /proc/*/stat: families, liveness, start times.

One table serves a whole refresh (the family, the managers, "is the creator alive?"), so every
probe that needs it takes it as ``table=``; see Note [psutil, and /proc where psutil has
nothing] in introspect/__init__.py for why it is not psutil.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import psutil

# The epoch time of boot, to the microsecond. /proc/stat's btime (psutil.boot_time()) is cut to
# whole seconds, which made every start time up to a second early: a process started 1.5 s after
# a file could read as started 0.6 s after it, inside the one-second slack of alive_since().
_BOOT = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
_TICK = os.sysconf("SC_CLK_TCK")


class ProcStat(NamedTuple):
    """One row of the process table, from /proc/<pid>/stat."""

    ppid: int
    state: str  # 'Z' is a zombie: dead, it only waits to be reaped
    name: str  # the kernel's comm: at most 15 characters
    started: float  # epoch seconds


def process_table() -> dict[int, ProcStat]:
    """pid -> ProcStat for every process we can see: one read of /proc/<pid>/stat each."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:  # os.open/os.read: half the cost of open(), which builds a file object
            fd = os.open(f"/proc/{entry}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # exited between listdir and open
        try:
            raw = os.read(fd, 1024)
        except OSError:
            continue  # exited between open and read
        finally:
            os.close(fd)
        # "pid (name) state ppid ... starttime" (field 22, in clock ticks since boot);
        # rpartition because the name itself may contain ")".
        head, _, rest = raw.rpartition(b")")
        f = rest.split()
        if len(f) > 19:
            name = head.partition(b"(")[2].decode(errors="replace")
            table[int(entry)] = ProcStat(int(f[1]), f[0].decode(), name,
                                         _BOOT + int(f[19]) / _TICK)
    return table


def process_family(pid: int | None = None, *, table: dict[int, ProcStat] | None = None
                   ) -> list[int]:
    """``pid`` (default: this process) first, then all its live descendants, breadth first.

    ``table``: a process_table() to read instead of a fresh one (one table per refresh).
    """
    root = os.getpid() if pid is None else pid
    table = process_table() if table is None else table
    if root not in table:
        raise psutil.NoSuchProcess(root)
    children: dict[int, list[int]] = {}
    for child, proc in sorted(table.items()):
        if proc.state != "Z":  # a zombie holds no fds any more: its line has ended
            children.setdefault(proc.ppid, []).append(child)
    family = [root]
    for member in family:  # breadth first: the list grows while we walk it
        family.extend(children.get(member, ()))
    return family


def alive_since(pid: int, since: float, table: dict[int, ProcStat]) -> bool:
    """Is ``pid`` a live process that already ran at ``since`` (epoch seconds)?"""
    proc = table.get(pid)
    # Pids get reused: a process that started after the file existed cannot have made it.
    # One second of slack absorbs clock steps and the coarse clocks both times come from.
    return proc is not None and proc.state != "Z" and proc.started <= since + 1.0


# What an orphan's new parent is usually called: the kernel hands it to the nearest
# "subreaper" (prctl PR_SET_CHILD_SUBREAPER: systemd --user, a container's init) or to pid 1.
SUBREAPERS = frozenset({"systemd", "init", "tini", "dumb-init", "docker-init", "catatonit",
                        "s6-svscan", "runit", "containerd-shim"})


def orphaned(pid: int, table: dict[int, ProcStat]) -> bool:
    """Has ``pid``'s parent died, so that init or a subreaper adopted it? (False if ``pid``
    itself is not in ``table``.)

    Linux keeps no record of the first parent, so this reads the signs: the parent is pid 1
    (or 0), is missing, started after its child (a reused pid), or is one of SUBREAPERS.
    """
    proc = table.get(pid)
    if proc is None:
        return False
    parent = table.get(proc.ppid)
    if proc.ppid <= 1 or parent is None:
        return True
    return parent.started > proc.started + 1.0 or parent.name in SUBREAPERS
