"""Which processes use a file: those that map it (/proc/<pid>/maps) and those that hold an fd.

A named /dev/shm segment is safe to remove only when nobody uses it. ``ls`` cannot say that:
a process may have mapped the file and closed its fd (torch's file_system strategy does
exactly that), so the mapping is the only trace. ``mapped_by`` reads every process's maps,
``held_by`` every process's fd links. Processes we may not read (another user's, without
root) are skipped, so an unprivileged caller sees only its own users.
"""

from __future__ import annotations

import os

import psutil

from .fds import open_fds
from .processes import ProcStat, process_table

_DELETED = " (deleted)"


def _mapped_paths(pid: int) -> set[str]:
    """The file paths ``pid`` maps, without the ' (deleted)' mark of unlinked files."""
    with open(f"/proc/{pid}/maps", "rb") as maps:
        raw = maps.read()
    found = set()
    for line in raw.splitlines():
        # "start-end perms offset dev inode path": the path is the 6th field and may hold spaces.
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(b"/"):
            path = fields[5].decode(errors="replace")
            found.add(path[: -len(_DELETED)] if path.endswith(_DELETED) else path)
    return found


def mapped_by(paths, *, table: dict[int, ProcStat] | None = None) -> dict[str, list[int]]:
    """path -> the pids that map it now, for each of ``paths`` (absolute paths, e.g. from
    ``shm_segments()``); a path nobody maps gets ``[]``. ``table``: a process_table() to use."""
    wanted = {os.fspath(p): [] for p in paths}
    table = process_table() if table is None else table
    for pid, proc in sorted(table.items()):
        if proc.state == "Z" or not wanted:
            continue  # a zombie has unmapped everything already
        try:
            hits = _mapped_paths(pid) & wanted.keys()
        except OSError:
            continue  # exited since the table was read, or not ours to read
        for path in hits:
            wanted[path].append(pid)
    return wanted


def held_by(paths, *, table: dict[int, ProcStat] | None = None) -> dict[str, list[int]]:
    """path -> the pids holding an open fd on it now (a deleted file's fd still counts)."""
    wanted = {os.fspath(p): [] for p in paths}
    table = process_table() if table is None else table
    for pid, proc in sorted(table.items()):
        if proc.state == "Z" or not wanted:
            continue
        try:
            targets = {fd.target.removesuffix(_DELETED) for fd in open_fds(pid)}
        except (psutil.Error, OSError):
            continue
        for path in targets & wanted.keys():
            wanted[path].append(pid)
    return wanted
