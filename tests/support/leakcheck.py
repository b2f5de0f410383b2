"""pytest plugin: fail any test that leaves shared memory or processes behind.

Every test is watched (autouse). After it ends, new files in /dev/shm named like torch's,
shmlab's or the stdlib's segments that this test made (Note [Whose /dev/shm file is it?]),
new child processes of the test process, and new manager
daemons (torch_shm_manager, shmlab.manager) get a short grace period to go away: managers
legitimately linger ~2 s after their last client. Whatever is still there then is killed or
unlinked, so the next test starts clean, and the test errors with a list of what leaked.

Long-lived helpers that multiprocessing starts once and keeps by design (the forkserver and
the resource tracker) are not leaks.

Note [Whose orphaned manager is it?]
Several test runs share a machine (and this venv), and a manager outlives its starter by
design, re-parented to init (or the nearest subreaper). "A manager of this venv whose parent
is gone" therefore named other runs' managers too: a run blamed, and killed, managers of a
run next to it. So this plugin puts a marker in its environment (RUN_ENV, one value per
session; a nested pytest inherits it), every process the tests start inherits it, and a
manager counts as ours if its parent is in this test's process family or, once orphaned, if
its environment carries our marker (/proc/<pid>/environ, readable for our own uid). A test
that starts a manager with an environment of its own (env={...} without the marker) and
orphans it is not caught; one whose starter still runs is.

Note [Whose /dev/shm file is it?]
/dev/shm is shared by every program of the machine: other test runs, a learner's notebooks
(notebook 05 leaves its "lonely" file on purpose, notebook 11's runbook makes one). Counting
"a new torch_/shmlab_/psm_ file whose creator is dead" as this test's leak blamed them, and
unlinking it broke them: the unsafe cleaning notebook 11's runbook warns about. So a file is
this test's leak only if it is provably ours:
  1. it appeared during the test (it was not in /dev/shm at set-up), and
  2. its creator (the pid in torch_<pid>_... / shmlab_<pid>_...) was a member of this test's
     process family (the test process and its descendants), or, still alive, descends from
     the test process or carries our RUN_ENV marker in its environment (an orphan that was
     exec'd, as spawn children and Popen are). A psm_ name has no pid: it is ours if a family
     member holds an fd on it or maps it when it is seen.
A creator usually exits before the test ends (a child that leaks and quits), so membership
must be learned while it lives: a Watch thread records the family's pids (with their start
times, so a reused pid is not mistaken for ours) at set-up, whenever a file appears in
/dev/shm (inotify wakes it within milliseconds of the shm_open), every POLL_S, and for every
os.fork of a family member: the fork child writes its own pid to the watcher's pipe before it
runs a line of the test's code (os.register_at_fork), so even a child that forks, makes a
file and exits within a millisecond is known. Each new file is judged when it is first seen.
Anything else is left alone: never reported, never unlinked.
What it cannot see: an exec'd child (Popen, spawn) that made a file and exited faster than
the watcher's reaction; a psm_ file whose creator closed it before it was seen; an orphan of
ours that was never seen in the family and carries no marker. Those leaks go unreported:
the price of never removing a file of someone else.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import select
import signal
import struct
import sys
import threading
import time

import psutil
import pytest

SHM_DIR = "/dev/shm"
SHM_PREFIXES = ("torch_", "shmlab_", "psm_")
MANAGER_MARKERS = ("torch_shm_manager", "shmlab.manager")
# torch's manager waits 2 s after its last client; allow for a loaded 2-core machine.
GRACE_S = float(os.environ.get("SHMLAB_LEAKCHECK_GRACE", "6"))
RUN_ENV = "SHMLAB_LEAKCHECK_RUN"  # see Note [Whose orphaned manager is it?]
RUN_ID = os.environ.setdefault(RUN_ENV, f"{os.getpid()}-{secrets.token_hex(8)}")
# How often the watcher records the test's process family even when no file appears.
POLL_S = 0.05  # ~1 % of a core idle (measured); inotify and the fork pipe (below) wake it sooner


def _family() -> set[int]:
    me = psutil.Process()
    return {me.pid} | {c.pid for c in me.children(recursive=True)}


def _creator(name: str) -> int | None:
    parts = name.split("_")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None


def shm_names() -> set[str]:
    """Every torch_/shmlab_/psm_ file in /dev/shm now, whoever made it."""
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(SHM_PREFIXES)}
    except FileNotFoundError:
        return set()


# --- whose /dev/shm file is it? See Note [Whose /dev/shm file is it?] -------------------------


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


def _descendants(root: int) -> set[int]:
    """``root`` and every live descendant (zombies too), from /proc/<pid>/task/<tid>/children:
    a few small reads per member instead of psutil's scan of every process on the machine."""
    if not _CHILDREN_FILES:
        return {root} | {c.pid for c in psutil.Process(root).children(recursive=True)}
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
    return found


# A kernel without CONFIG_PROC_CHILDREN has no children files: ask psutil instead (slower).
_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


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


def _carries_marker(pid: int) -> bool:
    """``pid``'s environment names this run (RUN_ENV=RUN_ID), as every process a test execs does."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{RUN_ENV}={RUN_ID}".encode() in f.read().split(b"\0")
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


class Watch(threading.Thread):
    """For one test: every process seen in its family, and the new /dev/shm files proven ours.

    It wakes when a file appears in /dev/shm (inotify), when a process of the family forks
    (the fork child writes its pid to a pipe, see _announce_fork), and every POLL_S, so it
    judges a file while its creator usually still lives and knows the family's pids even
    after they exited.
    """

    def __init__(self, root: int | None = None):
        super().__init__(name="leakcheck-watch", daemon=True)
        self.root = os.getpid() if root is None else root
        self.before = shm_names()  # there when the test started: never this test's leak
        self.members: dict[int, set[int | None]] = {}  # pid -> start times seen in the family
        self.ours: set[str] = set()
        self.theirs: set[str] = set()  # new, but not provably ours: left alone
        self._lock = threading.Lock()  # the thread and the teardown both poll
        self._done = threading.Event()
        self._inotify = _inotify(SHM_DIR)
        # O_CLOEXEC: fork children keep the write end (and announce themselves), exec'd ones
        # drop it (they carry RUN_ENV instead). Non-blocking: a full pipe never stalls a fork.
        self._forks_r, self._forks_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._record_family()

    def _record(self, pid: int) -> None:
        self.members.setdefault(pid, set()).add(_start_time(pid))

    def _record_family(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            data = os.read(self._forks_r, 65536)
            for (pid,) in struct.iter_unpack("i", data[: len(data) // 4 * 4]):
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
        return _carries_marker(pid)  # an orphan of ours that was exec'd (spawn, Popen)

    def poll(self) -> set[str]:
        """Judge the files that appeared since the last poll; return the ones proven ours."""
        with self._lock:
            names = shm_names()  # listed first: each creator existed before this line ...
            self._record_family()  # ... so a live one is in the family read here
            for name in names - self.before - self.ours - self.theirs:
                (self.ours if self._is_ours(name) else self.theirs).add(name)
            self.ours &= names  # a name unlinked and made again is judged again
            self.theirs &= names
            return set(self.ours)

    def run(self) -> None:
        wake = [self._forks_r] + ([self._inotify] if self._inotify is not None else [])
        while not self._done.is_set():
            ready = select.select(wake, [], [], POLL_S)[0]
            if self._inotify in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._inotify, 65536)  # the events only wake us up
            with contextlib.suppress(Exception):  # a process vanishing mid-read: next round
                self.poll()

    def stop(self) -> None:
        self._done.set()
        self.join(5)
        for fd in (self._inotify, self._forks_r, self._forks_w):
            if fd is not None:
                os.close(fd)
        self._inotify = self._forks_r = self._forks_w = None


_IN_CREATE, _IN_MOVED_TO = 0x100, 0x80
_WATCHES: list[Watch] = []  # the running one (at most one), for _announce_fork


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


def _announce_fork() -> None:
    """In a fork child of a watched test (os.fork, as multiprocessing's fork does; a fork
    server's children are forked by an exec'd server, so they carry RUN_ENV): write our pid
    to the watcher's pipe, so that it knows us even if we exit within a millisecond, and close
    its other fds, which the thread that used them did not bring along. The write end stays,
    for our own fork children."""
    for watch in _WATCHES:
        with contextlib.suppress(OSError):  # full, or the test ended: nothing to tell
            os.write(watch._forks_w, struct.pack("i", os.getpid()))
        for fd in (watch._inotify, watch._forks_r):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        watch._inotify = watch._forks_r = None


os.register_at_fork(after_in_child=_announce_fork)


def _is_manager(proc: psutil.Process) -> bool:
    """A torch_shm_manager or shmlab manager run from *this* environment (sys.prefix)."""
    try:
        cmd = proc.cmdline()
        if not any(m in " ".join(cmd) for m in MANAGER_MARKERS):
            return False
        # torch execs its manager by absolute path inside site-packages, shmlab starts it with
        # the venv's python: either way a manager of another checkout's venv is not ours.
        path = cmd[0] if cmd and os.path.isabs(cmd[0]) else proc.exe()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return path.startswith(sys.prefix)


def _ours(proc: psutil.Process, family: set[int]) -> bool:
    """Started by this test run: a child of its family, or an orphan carrying its marker."""
    if proc.ppid() in family:
        return True
    try:
        return proc.environ().get(RUN_ENV) == RUN_ID
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return False


def manager_pids() -> set[int]:
    uid = os.getuid()
    family = _family()
    found = set()
    for proc in psutil.process_iter(["uids"]):
        try:
            if (proc.info["uids"] and proc.info["uids"].real == uid and _is_manager(proc)
                    and _ours(proc, family)):
                found.add(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _persistent_helper_pids() -> set[int]:
    """Processes multiprocessing starts once per interpreter and keeps on purpose."""
    pids = set()
    try:
        from multiprocessing import forkserver, resource_tracker

        pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if pid:
            pids.add(pid)
        pid = getattr(resource_tracker._resource_tracker, "_pid", None)
        if pid:
            pids.add(pid)
    except Exception:  # noqa: BLE001 - best effort; a missing helper is simply not exempt
        pass
    return pids


def child_pids() -> set[int]:
    me = psutil.Process()
    pids = set()
    for child in me.children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                pids.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return pids - _persistent_helper_pids()


def snapshot(watch: Watch | None = None) -> dict[str, set]:
    shm = watch.poll() if watch is not None else set()
    return {"shm": shm, "children": child_pids(), "managers": manager_pids()}


def leftovers(before: dict[str, set], watch: Watch | None = None) -> dict[str, set]:
    now = snapshot(watch)
    return {k: now[k] - before[k] for k in now if now[k] - before[k]}


def _describe(pid: int) -> str:
    try:
        p = psutil.Process(pid)
        return f"{pid} {' '.join(p.cmdline())[:120]!r}"
    except psutil.NoSuchProcess:
        return f"{pid} (gone)"


def clean_up(left: dict[str, set]) -> None:
    for pid in left.get("children", set()) | left.get("managers", set()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for name in left.get("shm", set()):
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            pass
    # Reap our own killed children so they do not linger as zombies.
    deadline = time.monotonic() + 2
    for child in psutil.Process().children():
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except (psutil.TimeoutExpired, psutil.NoSuchProcess, ChildProcessError):
            pass


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Fail the test if it leaves a /dev/shm segment, a child or a manager daemon behind."""
    if request.node.get_closest_marker("allow_leaks"):
        yield
        return
    watch = Watch()
    before = snapshot()  # no shm entry: the watch knows what was there (watch.before)
    watch.start()
    _WATCHES.append(watch)
    try:
        yield
        deadline = time.monotonic() + GRACE_S
        left = leftovers(before, watch)
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = leftovers(before, watch)
    finally:
        _WATCHES.clear()  # first: a fork from now on must not write to the fds stop() closes
        watch.stop()
    if not left:
        return
    lines = []
    for name in sorted(left.get("shm", ())):
        lines.append(f"  /dev/shm/{name}")
    for pid in sorted(left.get("children", set()) | left.get("managers", set())):
        lines.append(f"  process {_describe(pid)}")
    clean_up(left)
    pytest.fail(
        f"test left these behind after {GRACE_S:.0f} s (now removed):\n" + "\n".join(lines),
        pytrace=False,
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "allow_leaks: the test manages leak checks itself (it must still clean up)"
    )
