"""pytest plugin: fail any test that leaves shared memory, processes or temp files behind.

Every test is watched (autouse). After it ends, new files in /dev/shm named like torch's,
shmlab's or the stdlib's segments that this test made (Note [Whose /dev/shm file is it?]),
new child processes of the test process, new manager daemons (torch_shm_manager,
shmlab.manager) and new entries in TMPDIR (Note [A TMPDIR per run and per worker]) get a
short grace period to go away: managers legitimately linger ~2 s after their last client.
Whatever is still there then is killed or unlinked, so the next test starts clean, and the
test errors with a list of what leaked.

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

Note [One run per xdist worker]
Under pytest-xdist (`make test` runs the suite on several workers) each worker is a pytest
process of its own, running one test at a time beside the other workers' tests. Everything this
plugin knows is per process: the watcher (one per worker, watching that worker's family), the
children (that worker's descendants), and the manager daemons whose parent is in that family.
Only RUN_ENV is inherited: the controller sets it when it loads this plugin and every worker
starts with its value, so an orphaned manager (or an exec'd /dev/shm maker) started by worker
gw0's test would carry the marker that worker gw1's test calls its own, and be blamed there
and killed mid-use. So a worker appends its id (RUN_ID-gw0) at configure time, before any test
runs; a pytest nested inside its tests (pytester) inherits that value and is part of the same
run, as without xdist. test_harness.py's xdist tests prove it: two workers, one leaking a file,
a child and an orphaned manager while the other sleeps through it, and only the leaker fails.

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
must be learned while it lives: a watcher records the family's pids (with their start times,
so a reused pid is not mistaken for ours) at set-up, whenever a file appears in /dev/shm
(inotify wakes it within milliseconds of the shm_open), every POLL_S, and for every os.fork
of a family member: the fork child writes its own pid to the watcher's pipe before it runs a
line of the test's code (os.register_at_fork), so even a child that forks, makes a file and
exits within a millisecond is known. Each new file is judged when it is first seen.
Anything else is left alone: never reported, never unlinked.
What it cannot see: an exec'd child (Popen, spawn) that made a file and exited faster than
the watcher's reaction; a psm_ file whose creator closed it before it was seen; an orphan of
ours that was never seen in the family and carries no marker. Those leaks go unreported:
the price of never removing a file of someone else.
The watcher is a process of its own (support/leakwatch.py, exec'd once per session, a child
of pytest that is never counted as a leaked child), not a thread in the test process: a
thread listing /proc and /dev/shm there held a directory fd for a fraction of a millisecond
every POLL_S, which made tests that count this process's fds before and after an operation
fail about once in a hundred counts (and os.fork warn of a multi-threaded process on 3.12+).
So during a test this process opens no fd and runs no thread for the checker: it keeps the
watcher's control socket and the fork pipe's write end, the same two fds all session, says
"a test starts" at set-up and asks "which new files are provably ours?" at teardown.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from . import leakwatch
from .leakwatch import SHM_DIR

MANAGER_MARKERS = ("torch_shm_manager", "shmlab.manager")
# torch's manager waits 2 s after its last client; allow for a loaded 2-core machine.
GRACE_S = float(os.environ.get("SHMLAB_LEAKCHECK_GRACE", "6"))
RUN_ENV = "SHMLAB_LEAKCHECK_RUN"  # see Note [Whose orphaned manager is it?]
RUN_ID = os.environ.setdefault(RUN_ENV, f"{os.getpid()}-{secrets.token_hex(8)}")


def _family() -> set[int]:
    me = psutil.Process()
    return {me.pid} | {c.pid for c in me.children(recursive=True)}


# --- whose /dev/shm file is it? See Note [Whose /dev/shm file is it?] -------------------------


class Watcher:
    """The leakwatch process of this pytest session, and the two fds it leaves here.

    Started once, at the first watched test's set-up (so never where the plugin is disabled),
    as a fresh interpreter (subprocess, not a fork: no copy of pytest's state, no thread here).
    Here stay only the control socket and the fork pipe's write end, the same two fds from the
    first test to the last, so they cancel out of any fd count a test takes.
    """

    def __init__(self):
        self.owner = os.getpid()
        # O_CLOEXEC: fork children keep the write end (and announce themselves), exec'd ones
        # drop it (they carry RUN_ENV instead). Non-blocking: a full pipe never stalls a fork.
        forks_r, self.forks_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.ctrl, theirs = socket.socketpair()  # both ends non-inheritable
        try:
            self.proc = subprocess.Popen(
                [sys.executable, leakwatch.__file__, str(theirs.fileno()), str(forks_r),
                 str(self.owner), f"{RUN_ENV}={RUN_ID}"],
                pass_fds=(theirs.fileno(), forks_r), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, cwd="/")
            self.proc.wait(30)  # it forks the watcher and exits: the watcher is nobody's child
        finally:
            theirs.close()
            os.close(forks_r)
        self.ctrl.settimeout(60)  # a watcher that hangs fails the test instead of the run

    def ask(self, command: bytes):
        """Send one command, return the watcher's one-line answer (decoded JSON or "ok").

        On any failure this watcher is dropped (the next test starts a fresh one): a late
        answer must never be read as the answer to the next command."""
        try:
            self.ctrl.sendall(command)
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = self.ctrl.recv(65536)
                if not chunk:
                    raise RuntimeError("the leak watcher died: see its traceback above; "
                                       "tests/support/leakwatch.py")
                reply += chunk
        except BaseException:
            if self in _WATCHER:
                _WATCHER.remove(self)
                self.close()
            raise
        answer = reply.decode().strip()
        answer = answer if answer == "ok" else json.loads(answer)
        if isinstance(answer, dict):
            raise RuntimeError(f"the leak watcher failed: {answer['error']}")
        return answer

    def begin(self) -> None:
        self.ask(b"B")

    def poll(self) -> set[str]:
        return set(self.ask(b"P"))

    def end(self) -> None:
        self.ask(b"E")

    def close(self) -> None:
        """Hang up: EOF ends the watcher (not our child: nothing to reap). Twice is fine."""
        if os.getpid() != self.owner or self.forks_w is None:
            return  # a fork child of pytest exiting through sys.exit, or closed already
        self.ctrl.close()
        os.close(self.forks_w)
        self.forks_w = None


_WATCHER: list[Watcher] = []  # this process's one watcher, once started


def _watcher() -> Watcher:
    if not _WATCHER:
        _WATCHER.append(Watcher())
        atexit.register(_WATCHER[0].close)
    return _WATCHER[0]


def _announce_fork() -> None:
    """In a fork child of the test process (os.fork, as multiprocessing's fork does; a fork
    server's children are forked by an exec'd server, so they carry RUN_ENV): write our pid
    to the watcher's fork pipe, so that it knows us even if we exit within a millisecond, and
    close the control socket, which is the parent's conversation (and whose EOF tells the
    watcher that pytest is gone). The write end stays, for our own fork children."""
    for watcher in _WATCHER:
        with contextlib.suppress(OSError):  # full: the watcher reads it within POLL_S
            os.write(watcher.forks_w, struct.pack("i", os.getpid()))
        with contextlib.suppress(OSError):
            watcher.ctrl.close()


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


def _named_managers() -> list[int]:
    """The pids whose command line names a manager (MANAGER_MARKERS), whoever runs them.

    Every test looks twice, at set-up and at teardown, and almost never finds one: one read of
    /proc/<pid>/cmdline a process here; psutil (uids, exe, environ) only for the few it names.
    """
    markers = tuple(m.encode() for m in MANAGER_MARKERS)
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:  # gone, or not ours to read
            continue
        if any(m in cmdline for m in markers):
            pids.append(int(name))
    return pids


def manager_pids() -> set[int]:
    uid = os.getuid()
    family = None
    found = set()
    for pid in _named_managers():
        try:
            proc = psutil.Process(pid)
            if proc.uids().real != uid or not _is_manager(proc):
                continue
            family = _family() if family is None else family
            if _ours(proc, family):
                found.add(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
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


# Note [A TMPDIR per run and per worker]
# A manager makes its socket's directory in TMPDIR (shmlab-shm-dir-*, torch-shm-dir-*), and
# notebooks, labs and helpers make theirs there too. /tmp is shared by the whole machine, so
# "a new entry in /tmp" could be another run's or another xdist worker's. So each pytest
# process (the controller, then each worker inside the controller's) gets a TMPDIR of its
# own at configure time, before any test runs: every process a test starts inherits it, a
# new entry there is this worker's, and since a worker runs one test at a time, this test's.
# The names stay short: a UNIX socket's path must fit in 108 bytes. pytest's own temp roots
# (pytest-of-<user>) are pytest's to keep. At the end of the run the directory goes.
TMP_PREFIX = "slt"  # shmlab tests: slt-XXXXXXXX for a run, sltgw0-XXXXXXXX for a worker
_PRIVATE_TMP: list[tuple[int, str]] = []  # (owner pid, path) of this process's TMPDIR


def _private_tmpdir(tag: str) -> None:
    parent = tempfile.gettempdir()
    path = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{tag}-", dir=parent)  # short: see above
    # The parent's mode (/tmp's 1777): tests that drop to another uid must still reach a
    # socket in here once they open its own directory on purpose.
    os.chmod(path, os.stat(parent).st_mode & 0o7777)
    os.environ["TMPDIR"] = path
    tempfile.tempdir = None  # gettempdir() caches; the next call reads TMPDIR again
    _PRIVATE_TMP.append((os.getpid(), path))


# Kept on purpose, never a leak: torch's compile cache (one per user, reused by every run) and
# this process's own multiprocessing temp dir (util.get_temp_dir(): made once, removed at exit).
TMP_KEPT = ("pytest-of-", TMP_PREFIX, "torchinductor_")
# Left by torch and multiprocessing themselves, not by the code under test. torch (read in
# site-packages/torch): torch.multiprocessing.spawn gives each rank an error file that join()
# reads and never removes, so a failing rank leaves one; torchrun makes its log directory with
# mkdtemp and never removes it. multiprocessing: a process removes its pymp-* directory (and the
# resource sharer's socket in it) at exit, in a finalizer, so a SIGKILLed one cannot; the
# notebooks kill processes on purpose, and a kernel that does not exit within jupyter_client's
# shutdown wait is killed too (seen with notebooks 03 and 04: not yet explained). A test that
# triggers them is not blamed: they are removed and named at the end of the run (TORCH_LEFT).
TMP_TORCH_LEAVES = ("pytorch-errorfile-", "torchelastic_", "pymp-")
TORCH_LEFT: list[tuple[str, list[str]]] = []  # (test id, torch's own leftovers it triggered)


def _own_mp_tempdir() -> str | None:
    from multiprocessing import process

    tempdir = process.current_process()._config.get("tempdir")
    return os.path.basename(tempdir) if tempdir else None


def tmp_entries() -> set[str]:
    if not _PRIVATE_TMP:
        return set()
    try:
        names = os.listdir(_PRIVATE_TMP[-1][1])
    except FileNotFoundError:
        return set()
    return {n for n in names if not n.startswith(TMP_KEPT)} - {_own_mp_tempdir()}


def _remove_tmp(name: str) -> None:
    path = os.path.join(_PRIVATE_TMP[-1][1], name)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def snapshot(watch: Watcher | None = None) -> dict[str, set]:
    shm = watch.poll() if watch is not None else set()
    return {"shm": shm, "children": child_pids(), "managers": manager_pids(),
            "tmp": tmp_entries()}


def leftovers(before: dict[str, set], watch: Watcher | None = None) -> dict[str, set]:
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
    for name in left.get("tmp", set()):
        _remove_tmp(name)
    # Reap our own killed children so they do not linger as zombies.
    deadline = time.monotonic() + 2
    for child in psutil.Process().children():
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except (psutil.TimeoutExpired, psutil.NoSuchProcess, ChildProcessError):
            pass


# Note [POSIX semaphores are reported, not failed]
# multiprocessing's locks under spawn and forkserver are named POSIX semaphores,
# /dev/shm/sem.mp-<random>: the creator registers each with the resource tracker, unlinks it
# when the lock is collected, and the tracker unlinks what is left when the run ends. One that
# outlives a test is a leak for the length of the run, but its name carries no creator pid, so
# on a shared /dev/shm (xdist workers, other runs on the machine) the checker cannot tell it
# from another run's. So they are reported at the end of the run (SEM_LEFT), never failed.
SEM_PREFIX = "sem.mp-"
SEM_LEFT: list[tuple[str, list[str]]] = []  # (test id, its sem.mp-* names still there)


def _sems() -> set[str]:
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(SEM_PREFIX)}
    except FileNotFoundError:
        return set()


def _blamed(left: dict[str, set]) -> bool:
    """Something the test is blamed for is still there (torch's own leftovers are not)."""
    return any(v for k, v in left.items() if k != "tmp") or any(
        not n.startswith(TMP_TORCH_LEAVES) for n in left.get("tmp", ()))


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Fail the test if it leaves a /dev/shm segment, a child, a manager daemon or an entry
    in TMPDIR behind."""
    if request.node.get_closest_marker("allow_leaks"):
        yield
        return
    watch = _watcher()
    sems = _sems()
    before = snapshot()  # no shm entry: the watcher knows what was there
    watch.begin()
    try:
        yield
        deadline = time.monotonic() + GRACE_S
        left = leftovers(before, watch)
        while _blamed(left) and time.monotonic() < deadline:
            time.sleep(0.05)
            left = leftovers(before, watch)
    finally:
        watch.end()
    if sem_left := sorted(_sems() - sems):
        request.node.user_properties.append(("sem_left", sem_left))
    if torch_left := sorted(n for n in left.get("tmp", ()) if n.startswith(TMP_TORCH_LEAVES)):
        request.node.user_properties.append(("torch_left", torch_left))
        for name in torch_left:
            _remove_tmp(name)
        left["tmp"] -= set(torch_left)
        left = {k: v for k, v in left.items() if v}
    if not left:
        return
    lines = []
    for name in sorted(left.get("shm", ())):
        lines.append(f"  /dev/shm/{name}")
    for name in sorted(left.get("tmp", ())):
        lines.append(f"  $TMPDIR/{name}")
    for pid in sorted(left.get("children", set()) | left.get("managers", set())):
        lines.append(f"  process {_describe(pid)}")
    clean_up(left)
    pytest.fail(
        f"test left these behind after {GRACE_S:.0f} s (now removed):\n" + "\n".join(lines),
        pytrace=False,
    )


def pytest_runtest_logreport(report):
    """Collect what no_leaks reported but did not fail. It rides on the teardown report's
    user_properties: under xdist the report reaches the controller, whose summary prints it
    (a worker's own lists are never printed)."""
    if report.when != "teardown":
        return
    for key, names in report.user_properties:
        if key == "sem_left":
            SEM_LEFT.append((report.nodeid, names))
        elif key == "torch_left":
            TORCH_LEFT.append((report.nodeid, names))


def pytest_terminal_summary(terminalreporter):
    """Name the tests after which a multiprocessing semaphore was still in /dev/shm, and those
    that made torch leave files in TMPDIR."""
    if SEM_LEFT:
        terminalreporter.section("sem.mp-* left after a test (reported, not failed)")
        for nodeid, names in SEM_LEFT:
            terminalreporter.write_line(f"{nodeid}: {', '.join(names)}")
    if TORCH_LEFT:
        terminalreporter.section("torch's and multiprocessing's own leftovers in TMPDIR, removed "
                                 "(reported, not failed)")
        for nodeid, names in TORCH_LEFT:
            terminalreporter.write_line(f"{nodeid}: {', '.join(names)}")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "allow_leaks: the test manages leak checks itself (it must still clean up)"
    )
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is not None:
        _run_of_its_own(worker)
    _private_tmpdir(worker or "")


def pytest_unconfigure(config):
    import multiprocessing.util

    for owner, path in _PRIVATE_TMP:
        if owner == os.getpid():
            # At exit, after multiprocessing's own finalizer (priority -100) has removed this
            # process's pymp-* directory in there: removed now, that finalizer would fail.
            multiprocessing.util.Finalize(None, shutil.rmtree, args=(path,),
                                          kwargs={"ignore_errors": True}, exitpriority=-200)


def _run_of_its_own(worker: str) -> None:
    """An xdist worker is a run of its own: see Note [One run per xdist worker]."""
    global RUN_ID
    RUN_ID = os.environ[RUN_ENV] = f"{RUN_ID}-{worker}"
