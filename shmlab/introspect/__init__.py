"""Read-only probes of shared memory in use: open fds, /dev/shm segments, manager daemons, limits.

The same probes read real torch (``torch_*`` files, ``torch_shm_manager``), shmlab (``shmlab_*``
files, ``python -m shmlab.manager``) and the stdlib (``psm_*`` files). Nothing here writes,
signals or unlinks: widgets, notebooks and tests only look.

Note [psutil, and /proc where psutil has nothing]
psutil answers the per-process questions (rlimit, cmdline, unix sockets). Two it cannot:
- fd kinds: ``Process.open_files()`` skips sockets, pipes and deleted files, the very fds the
  file_descriptor strategy keeps (``/dev/shm/torch_... (deleted)``), and takes ~24 ms for
  1,000 fds; a ``readlink`` of each ``/proc/<pid>/fd/<n>`` takes ~6 ms (2-CPU VM, idle).
- a fast process table: ``process_iter(["name"])`` takes ~5 ms for 74 processes; one pass over
  ``/proc/*/stat`` takes ~1 ms and serves the family, the managers and "creator alive?".
  (benchmarks/introspect_refresh.py measures both.)
A process may exit, or an fd close, between listing and reading: whatever vanished in between
is skipped, so a refresh never raises for it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections import Counter, namedtuple
from dataclasses import dataclass

import psutil

SHM_DIR = "/dev/shm"
FD_KINDS = ("shm-deleted", "shm-named", "socket", "pipe", "file", "other")
# torch_<pid>_<rand>_<n> and shmlab_<pid>_<rand>_<n> carry the creator's pid; psm_<hex> does not.
_SEGMENT_RE = re.compile(r"(?:(torch|shmlab)_(\d+)_[0-9A-Za-z]+_\d+|psm_[0-9a-f]+)")
_HEADER = 64  # file_system segments: [0:4) int32 refcount | [4:64) pad | [64:) data
_BOOT = psutil.boot_time()  # whole seconds: /proc/stat's btime has no finer resolution
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class FdInfo:
    fd: int
    kind: str  # one of FD_KINDS
    target: str  # what /proc/<pid>/fd/<fd> points at, e.g. "socket:[1234]"


@dataclass(frozen=True)
class ShmSegment:
    name: str
    path: str
    owner: str  # 'torch' | 'shmlab' | 'stdlib'
    size: int  # bytes; a file_system segment is nbytes + 64 (the header)
    creator_pid: int | None  # from the name; None for psm_ (its name has no pid)
    creator_alive: bool | None
    age_s: float  # since the file's last metadata change: for a segment, its creation
    refcount: int | None  # header int32 of torch_/shmlab_ files >= 64 bytes, else None
    leaked: bool | None  # creator dead, file still there; None when unknowable (psm_)


@dataclass(frozen=True)
class ManagerInfo:
    pid: int
    kind: str  # 'torch' | 'shmlab'
    ppid: int
    sid: int  # a daemon that called setsid() leads its own session: sid == pid
    pgid: int
    socket_path: str | None  # <dir>/manager.sock; None if not listening yet or not ours


@dataclass(frozen=True)
class Limits:
    nofile_soft: int  # RLIMIT_NOFILE; -1 (resource.RLIM_INFINITY) means unlimited
    nofile_hard: int
    shm_total: int  # bytes in /dev/shm
    shm_free: int  # bytes an unprivileged process may still allocate there


@dataclass(frozen=True)
class Snapshot:
    time: float  # time.time() when taken
    fds: dict[int, dict[str, int]]  # pid -> fd_counts(pid), for every watched live process
    segments: list[ShmSegment]
    managers: list[ManagerInfo]
    limits: Limits  # of this process


# One row of the process table. state 'Z' is a zombie: dead, it only waits to be reaped;
# name is the kernel's comm (at most 15 characters); started is in epoch seconds.
_Proc = namedtuple("_Proc", "ppid state name started")


def _kind(target: str, fd_dir: int, fd: str) -> str:
    if target.startswith("socket:"):
        return "socket"
    if target.startswith("pipe:"):
        return "pipe"
    if target.startswith(SHM_DIR + "/"):
        return "shm-deleted" if target.endswith(" (deleted)") else "shm-named"
    if not target.startswith("/") or target.startswith(("/dev/", "/memfd:")):
        return "other"  # anon_inode:[eventfd], /dev/null, memfd: not files on a disk
    # Only paths are left. One stat through the fd (deleted files too) tells a regular
    # file from a directory; few fds get here, so the refresh stays cheap.
    return "file" if stat.S_ISREG(os.stat(fd, dir_fd=fd_dir).st_mode) else "other"


def _links(pid: int) -> list[tuple[int, str, str]]:
    """(fd, kind, target) for every open fd of ``pid``."""
    try:
        fd_dir = os.open(f"/proc/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(pid) from None
    except PermissionError:
        raise psutil.AccessDenied(pid) from None
    mine = str(fd_dir) if pid == os.getpid() else None  # our handle on the folder: not theirs
    found = []
    try:
        try:
            names = os.listdir(fd_dir)
        except (FileNotFoundError, ProcessLookupError):
            raise psutil.NoSuchProcess(pid) from None  # it exited after we opened the folder
        for name in names:
            try:  # relative to fd_dir: no walk of /proc/<pid>/fd per fd (~25% faster)
                if name != mine:
                    target = os.readlink(name, dir_fd=fd_dir)
                    found.append((int(name), _kind(target, fd_dir, name), target))
            except (FileNotFoundError, ProcessLookupError):
                continue  # closed, or the process exited, since listdir: not open any more
    finally:
        os.close(fd_dir)
    return found


def open_fds(pid: int | None = None) -> list[FdInfo]:
    """Every open fd of ``pid`` (default: this process), classified; raises psutil.NoSuchProcess."""
    return [FdInfo(*link) for link in _links(os.getpid() if pid is None else pid)]


def fd_counts(pid: int | None = None) -> dict[str, int]:
    """How many fds of each kind ``pid`` holds, plus 'total'; every kind is present."""
    counts = Counter(kind for _, kind, _ in _links(os.getpid() if pid is None else pid))
    return {**{kind: counts[kind] for kind in FD_KINDS}, "total": sum(counts.values())}


def _proc_table() -> dict[int, _Proc]:
    """pid -> _Proc for every process we can see: one read of /proc/<pid>/stat each."""
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
            table[int(entry)] = _Proc(int(f[1]), f[0].decode(), name, _BOOT + int(f[19]) / _TICK)
    return table


def _family(root: int, table: dict[int, _Proc]) -> list[int]:
    if root not in table:
        raise psutil.NoSuchProcess(root)
    children: dict[int, list[int]] = {}
    for pid, proc in sorted(table.items()):
        if proc.state != "Z":  # a zombie holds no fds any more: its line has ended
            children.setdefault(proc.ppid, []).append(pid)
    family = [root]
    for pid in family:  # breadth first: the list grows while we walk it
        family.extend(children.get(pid, ()))
    return family


def process_family(pid: int | None = None) -> list[int]:
    """``pid`` (default: this process) first, then all its live descendants, breadth first."""
    return _family(os.getpid() if pid is None else pid, _proc_table())


def _refcount(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None  # unlinked since we listed it, or another user's 0600 file
    try:
        raw = os.pread(fd, 4, 0)  # an aligned int32: one copy, never half an update
    finally:
        os.close(fd)  # hold nothing: an inspector must not keep a segment alive
    return int.from_bytes(raw, "little", signed=True) if len(raw) == 4 else None


def _alive(pid: int, since: float, table: dict[int, _Proc]) -> bool:
    proc = table.get(pid)
    # Pids get reused: a process that started after the file existed cannot have made it.
    # One second of slack absorbs clock steps and the coarse clocks both times come from.
    return proc is not None and proc.state != "Z" and proc.started <= since + 1.0


def _segments(shm_dir: str, table: dict[int, _Proc]) -> list[ShmSegment]:
    now, found = time.time(), []
    with os.scandir(shm_dir) as entries:
        for entry in entries:
            match = _SEGMENT_RE.fullmatch(entry.name)
            try:
                if not match or not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # unlinked between the listing and the stat
            owner, creator = match.group(1) or "stdlib", match.group(2)
            pid = int(creator) if creator else None
            alive = None if pid is None else _alive(pid, st.st_ctime, table)
            headed = owner != "stdlib" and st.st_size >= _HEADER
            found.append(ShmSegment(
                entry.name, entry.path, owner, st.st_size, pid, alive,
                age_s=max(0.0, now - st.st_ctime),
                refcount=_refcount(entry.path) if headed else None,
                leaked=None if alive is None else not alive))  # fmt: skip
    return sorted(found, key=lambda s: s.name)


def shm_segments(dir: str = SHM_DIR) -> list[ShmSegment]:
    """The torch_/shmlab_/psm_ files in ``dir``, each with its creator, refcount and leak state."""
    return _segments(dir, _proc_table())


# A process's kind never changes while it lives, so it is asked once per (pid, start, name).
# "Not a manager" is remembered only for processes older than a second: a younger one may be
# a fork that has not exec'd yet (torch forks, then execs torch_shm_manager).
_kinds: dict[tuple[int, float, str], str | None] = {}


def _manager_kind(pid: int, proc: _Proc) -> str | None:
    if proc.name.startswith("torch_shm_manag"):  # comm is cut at 15 characters
        return "torch"
    if not proc.name.startswith("python"):
        return None  # only a Python interpreter can be running shmlab.manager
    key = (pid, proc.started, proc.name)
    if key not in _kinds:
        argv = psutil.Process(pid).cmdline()
        hit = any(a == "shmlab.manager" or a.endswith("shmlab/manager.py") for a in argv)
        if not hit and time.time() - proc.started < 1.0:
            return None
        _kinds[key] = "shmlab" if hit else None
    return _kinds[key]


def _managers(table: dict[int, _Proc]) -> list[ManagerInfo]:
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


def managers() -> list[ManagerInfo]:
    """Running torch_shm_manager and shmlab.manager daemons, with session and socket."""
    return _managers(_proc_table())


def events(manager: ManagerInfo | str | os.PathLike) -> list[dict]:
    """A shmlab manager's ``<dir>/events.jsonl``; ``manager``: its ManagerInfo, dir or socket."""
    path = manager.socket_path if isinstance(manager, ManagerInfo) else os.fspath(manager)
    if path is None:
        return []
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    try:
        with open(os.path.join(folder, "events.jsonl"), "rb") as log:
            lines = log.read().splitlines(keepends=True)
    except FileNotFoundError:
        return []  # torch's manager keeps no log; a shmlab one removes its dir on exit
    found = []
    for line in lines:
        if not line.endswith(b"\n"):
            break  # the daemon is mid-write: the line is whole on the next read
        try:
            found.append(json.loads(line))
        except ValueError:
            continue  # a damaged line must not blank the whole timeline
    return found


def limits(pid: int | None = None) -> Limits:
    """RLIMIT_NOFILE of ``pid`` (default: this process) and the size and free space of /dev/shm."""
    soft, hard = psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE)  # prlimit(2) for other pids
    vfs = os.statvfs(SHM_DIR)
    return Limits(soft, hard, vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize)


def snapshot(pids: list[int] | None = None, shm_dir: str = SHM_DIR) -> Snapshot:
    """One refresh for the widgets: fd counts of ``pids`` (default: this process and all its
    descendants), the segments in ``shm_dir``, the managers and this process's limits."""
    table = _proc_table()  # one process table shared by every probe below
    watched = _family(os.getpid(), table) if pids is None else list(pids)
    fds = {}
    for pid in watched:
        try:
            fds[pid] = fd_counts(pid)
        except (psutil.Error, OSError):
            continue  # exited since we listed it, or not ours to look at: nothing to count
    return Snapshot(time.time(), fds, _segments(shm_dir, table), _managers(table), limits())
