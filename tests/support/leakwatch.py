"""The leak checker's watcher: a process of its own that learns whose /dev/shm files are whose.

Mirrors: nothing (test harness). support.leakcheck starts it once per pytest session, as
``python leakwatch.py CTRL_FD FORKS_FD ROOT_PID RUN_ENV=RUN_ID`` (an exec'd interpreter, not a
fork of pytest), and drives it over the CTRL_FD socket, one command byte, one reply line:

    B  a test starts: remember /dev/shm as it is, and begin watching ROOT_PID's family  -> ok
    P  which files that appeared since B are provably the test's own?                   -> JSON
    E  the test has ended: stop watching                                                -> ok

EOF on CTRL_FD (pytest exited) ends it. Why a process, and what makes a file "ours":
Note [Whose /dev/shm file is it?] in support/leakcheck.py. Everything that reads /proc or
/dev/shm lives here, so the test process opens no fd and runs no thread on our behalf.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import struct
import sys

SHM_DIR = "/dev/shm"
SHM_PREFIXES = ("torch_", "shmlab_", "psm_")
# How often a watched family is recorded even when no file appears and nobody forks.
POLL_S = 0.05  # inotify and the fork pipe wake it sooner; it costs a little CPU while a test is
# watched (docs/benchmarks.md, "The leak checker's cost"), none between tests


def shm_names() -> set[str]:
    """Every torch_/shmlab_/psm_ file in /dev/shm now, whoever made it."""
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(SHM_PREFIXES)}
    except FileNotFoundError:
        return set()


def _creator(name: str) -> int | None:
    parts = name.split("_")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/<pid>/stat after the command name (state first), or None if there is no pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): a pid and its start time name one
    process, where a pid alone may have been reused."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


# A kernel without CONFIG_PROC_CHILDREN has no children files: ask psutil instead (slower).
_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _descendants(root: int) -> set[int]:
    """``root`` and every live descendant (zombies too) but this watcher, from
    /proc/<pid>/task/<tid>/children: a few small reads per member instead of psutil's scan of
    every process on the machine."""
    if not _CHILDREN_FILES:
        import psutil

        found = {root} | {c.pid for c in psutil.Process(root).children(recursive=True)}
        return found - {os.getpid()}
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # exited meanwhile
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                continue
    return found - {os.getpid()}  # a child of pytest too, but it makes no files


def _descends_from(pid: int, root: int) -> bool:
    """``pid`` is ``root`` or has it among its ancestors now (a zombie still has a parent)."""
    seen = set()
    while pid > 1 and pid not in seen:
        if pid == root:
            return True
        seen.add(pid)
        fields = _stat_fields(pid)
        if fields is None:
            return False
        pid = int(fields[1])
    return False


def _carries_marker(pid: int, marker: bytes) -> bool:
    """``pid``'s environment names this run (RUN_ENV=RUN_ID), as every process a test execs does."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False  # gone, a zombie, or not ours to read


def _uses(pid: int, path: str) -> bool:
    """``pid`` holds an fd on ``path`` or maps it (how a psm_ file, whose name has no pid,
    shows who made it: SharedMemory keeps its fd and mapping while it lives)."""
    targets = {path, path + " (deleted)"}
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):  # closed since the listing
                if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                    return True
        with open(f"/proc/{pid}/maps") as maps:
            return any(line.split(maxsplit=5)[-1].rstrip("\n") in targets for line in maps)
    except OSError:
        return False


_IN_CREATE, _IN_MOVED_TO = 0x100, 0x80


def _inotify(path: str) -> int | None:
    """An inotify fd that becomes readable when a file is created in ``path`` (None: poll only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, path.encode(), _IN_CREATE | _IN_MOVED_TO) < 0:
            os.close(fd)
            return None
        return fd
    except (OSError, AttributeError):
        return None


class Watch:
    """For one test at a time: every process seen in ROOT's family, and the new /dev/shm files
    proven ours.

    It wakes when a file appears in /dev/shm (inotify), when a process of the family forks
    (the fork child writes its pid to the fork pipe before it runs the test's code, see
    leakcheck._announce_fork), and every POLL_S, so it judges a file while its creator usually
    still lives and knows the family's pids even after they exited.
    """

    def __init__(self, root: int, forks_r: int, marker: bytes):
        self.root, self.forks_r, self.marker = root, forks_r, marker
        self.watching = False
        self.before: set[str] = set()
        self.members: dict[int, set[int | None]] = {}  # pid -> start times seen in the family
        self.ours: set[str] = set()
        self.theirs: set[str] = set()  # new, but not provably ours: left alone

    def begin(self) -> None:
        self._drain_forks()  # announced before this test: not its family (unless still alive)
        self.before = shm_names()  # there when the test started: never this test's leak
        self.members, self.ours, self.theirs = {}, set(), set()
        self.watching = True
        self._record_family()

    def _drain_forks(self) -> list[int]:
        with contextlib.suppress(BlockingIOError, OSError):
            data = os.read(self.forks_r, 65536)
            return [pid for (pid,) in struct.iter_unpack("i", data[: len(data) // 4 * 4])]
        return []

    def _record(self, pid: int) -> None:
        self.members.setdefault(pid, set()).add(_start_time(pid))

    def _record_family(self) -> None:
        for pid in self._drain_forks():
            self._record(pid)  # perhaps exited already: its start time reads None
        for pid in _descendants(self.root):
            if pid not in self.members:
                self._record(pid)

    def _is_ours(self, name: str) -> bool:
        pid = _creator(name)
        if pid is None:  # psm_: judged by who uses it now
            return any(_uses(m, os.path.join(SHM_DIR, name)) for m in _descendants(self.root))
        started = _start_time(pid)
        if started is None:  # the creator has exited: was it one of ours?
            return pid in self.members
        if started in self.members.get(pid, ()) or _descends_from(pid, self.root):
            return True
        return _carries_marker(pid, self.marker)  # an orphan of ours that was exec'd

    def poll(self) -> set[str]:
        """Judge the files that appeared since the last poll; return the ones proven ours."""
        if not self.watching:
            self._drain_forks()
            return set()
        names = shm_names()  # listed first: each creator existed before this line ...
        self._record_family()  # ... so a live one is in the family read here
        for name in names - self.before - self.ours - self.theirs:
            (self.ours if self._is_ours(name) else self.theirs).add(name)
        self.ours &= names  # a name unlinked and made again is judged again
        self.theirs &= names
        return set(self.ours)


def _end(watch: Watch) -> str:
    watch.poll()  # drain the fork pipe
    watch.watching = False
    return "ok"


COMMANDS = {  # one byte from the plugin -> the one-line answer
    b"B": lambda watch: (watch.begin(), "ok")[1],
    b"P": lambda watch: json.dumps(sorted(watch.poll())),
    b"E": _end,
}


def serve(ctrl: socket.socket, watch: Watch, root_gone=None) -> None:
    """Answer the plugin's commands until it hangs up (or pytest is gone); watch in between."""
    inotify = _inotify(SHM_DIR)
    wake = [ctrl, watch.forks_r] + [fd for fd in (inotify, root_gone) if fd is not None]
    while True:
        # Idle between tests: sleep until a command (or a fork to drain); watching: POLL_S.
        ready = select.select(wake, [], [], POLL_S if watch.watching else None)[0]
        if inotify in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(inotify, 65536)  # the events only wake us up
        if root_gone in ready or (root_gone is None and _start_time(watch.root) is None):
            return  # pytest is gone (the socket's EOF says so too, unless a child kept it)
        if ctrl not in ready:
            with contextlib.suppress(Exception):  # a process vanishing mid-read: next round
                watch.poll()
            continue
        command = ctrl.recv(1)
        if not command:
            return  # EOF: pytest exited
        if command not in COMMANDS:
            reply = json.dumps({"error": f"unknown command {command!r}"})
        for _ in range(3):  # a process vanishing mid-read: try again
            try:
                reply = COMMANDS[command](watch)
                break
            except Exception as exc:  # noqa: BLE001 - reported to the plugin after 3 tries
                reply = json.dumps({"error": repr(exc)})
        ctrl.sendall(reply.encode() + b"\n")


def _gone(root: int):
    """Something that becomes readable when pytest (``root``) exits: a pidfd, where we get one."""
    with contextlib.suppress(OSError, AttributeError):
        return os.pidfd_open(root)
    return None


def main(argv: list[str]) -> None:
    ctrl_fd, forks_r, root, marker = int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
    # Be nobody's child: the process pytest started exits at once (the plugin reaps it) and
    # its fork child watches. A child of pytest would show up wherever a test or a notebook
    # Session lists the test process's children ("children left: [the watcher]").
    if os.fork():
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for pytest: it stops us (EOF)
    os.set_blocking(forks_r, False)
    serve(socket.socket(fileno=ctrl_fd), Watch(root, forks_r, marker.encode()), _gone(root))


if __name__ == "__main__":
    main(sys.argv)
