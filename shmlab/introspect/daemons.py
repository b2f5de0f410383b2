"""Running shm manager daemons (torch_shm_manager and shmlab's), and a shmlab one's event log.

A daemon is found by its name or command line (``python -m shmlab.manager``), and its socket by
what psutil reads from /proc/net/unix.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import psutil

from ..manager.eventlog import LOG_NAME
from ..manager.protocol import DAEMON_MODULE
from .processes import ProcStat, process_table

# How a shmlab daemon's command line names it: `-m shmlab.manager`, or the script's path.
_SCRIPT = DAEMON_MODULE.replace(".", "/") + "/__main__.py"


@dataclass(frozen=True)
class ManagerInfo:
    pid: int
    kind: str  # 'torch' | 'shmlab'
    ppid: int
    sid: int  # a daemon that called setsid() leads its own session: sid == pid
    pgid: int
    socket_path: str | None  # <dir>/manager.sock; None if not listening yet or not ours


# A process's kind never changes while it lives, so it is asked once per (pid, start, name).
# "Not a manager" is remembered only for processes older than a second: a younger one may be
# a fork that has not exec'd yet (torch forks, then execs torch_shm_manager).
_kinds: dict[tuple[int, float, str], str | None] = {}


def _manager_kind(pid: int, proc: ProcStat) -> str | None:
    if proc.name.startswith("torch_shm_manag"):  # comm is cut at 15 characters
        return "torch"
    if not proc.name.startswith("python"):
        return None  # only a Python interpreter can be running shmlab.manager
    key = (pid, proc.started, proc.name)
    if key not in _kinds:
        argv = psutil.Process(pid).cmdline()
        hit = any(a == DAEMON_MODULE or a.endswith(_SCRIPT) for a in argv)
        if not hit and time.time() - proc.started < 1.0:
            return None
        _kinds[key] = "shmlab" if hit else None
    return _kinds[key]


def managers(*, table: dict[int, ProcStat] | None = None) -> list[ManagerInfo]:
    """Running torch_shm_manager and shmlab.manager daemons, with session and socket.

    ``table``: a process_table() to search instead of a fresh one.
    """
    table = process_table() if table is None else table
    found = []
    for pid, proc in sorted(table.items()):
        try:
            kind = proc.state != "Z" and _manager_kind(pid, proc)
            if not kind:
                continue
            # psutil matches the daemon's socket fds against /proc/net/unix to name them.
            unix = psutil.Process(pid).net_connections(kind="unix")
            paths = [c.laddr for c in unix if str(c.laddr).endswith("/manager.sock")]
            found.append(ManagerInfo(pid, kind, proc.ppid, os.getsid(pid), os.getpgid(pid),
                                     paths[0] if paths else None))  # fmt: skip
        except (psutil.Error, ProcessLookupError):
            continue  # exited while we looked, or not ours to look at
    for key in list(_kinds):  # a copy, and pop(): a widget thread may refresh meanwhile
        if key[0] not in table:
            _kinds.pop(key, None)  # forget processes that have exited
    return found


def events(manager: ManagerInfo | str | os.PathLike) -> list[dict]:
    """A shmlab manager's event log, oldest first: ``<dir>/events.jsonl.1`` (what was rotated
    out past --log-bytes, see shmlab/manager/eventlog.py), then ``<dir>/events.jsonl``.
    ``manager``: its ManagerInfo, dir or socket."""
    path = manager.socket_path if isinstance(manager, ManagerInfo) else os.fspath(manager)
    if path is None:
        return []
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    log = os.path.join(folder, LOG_NAME)
    # The current file first, then the rotated one: a rotation in between turns our current
    # file into the .1 we open next (same inode): read it once. Opened the other way round,
    # that rotation would hide the lines of the file rotated out meanwhile.
    current = _read(log)
    if current is None:
        return []  # torch's manager keeps no log; a shmlab one removes its dir on exit
    older = _read(log + ".1")
    if older is not None and older[0] == current[0]:
        older = None
    return _parse(older[1] if older else b"") + _parse(current[1])


def _read(path: str) -> tuple[int, bytes] | None:
    """(inode, contents) of a file, or None if it is not there."""
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_ino, f.read()
    except FileNotFoundError:
        return None


def _parse(data: bytes) -> list[dict]:
    found = []
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break  # the daemon is mid-write: the line is whole on the next read
        try:
            found.append(json.loads(line))
        except ValueError:
            continue  # a damaged line must not blank the whole timeline
    return found
