"""pytest plugin: fail any test that leaves shared memory or processes behind.

Every test is watched (autouse). After it ends, new files in /dev/shm named like torch's,
shmlab's or the stdlib's segments, new child processes of the test process, and new manager
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
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
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


def _family() -> set[int]:
    me = psutil.Process()
    return {me.pid} | {c.pid for c in me.children(recursive=True)}


def _foreign(pid: int | None, family: set[int]) -> bool:
    """A live process outside this test process's family: another program's, not a leak of ours.

    (A dead creator's file or an orphaned manager re-parented to init stays suspect.)
    """
    return pid is not None and pid > 1 and pid not in family and psutil.pid_exists(pid)


def _creator(name: str) -> int | None:
    parts = name.split("_")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None


def shm_files() -> set[str]:
    try:
        names = {n for n in os.listdir(SHM_DIR) if n.startswith(SHM_PREFIXES)}
    except FileNotFoundError:
        return set()
    family = _family()
    return {n for n in names if not _foreign(_creator(n), family)}


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


def snapshot() -> dict[str, set]:
    return {"shm": shm_files(), "children": child_pids(), "managers": manager_pids()}


def leftovers(before: dict[str, set]) -> dict[str, set]:
    now = snapshot()
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
    before = snapshot()
    yield
    deadline = time.monotonic() + GRACE_S
    left = leftovers(before)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = leftovers(before)
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
