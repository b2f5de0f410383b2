"""Refcount updates racing each other: threads of one process, and processes.

refcounted.py updates the header's count under the lock beside it (headerlock.py), either
through the mapping a holder already has or through a mapping of the header made for the
one update. A lost update shows as a final count other than the one expected; a missing
lock fails the processes' test at once. The lock's own failure modes are at the end: a
holder killed inside it, and one stopped inside it (waited for, however long; the
Queue end of that is test_stopped_holder.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from shmlab import _shm
from shmlab._shm import headerlock

N = 400  # updates per worker: enough to interleave many read-modify-writes


def _hammer(name: str, held, n: int = N) -> None:
    """n increments, then n decrements (never reaching 0: the creator holds one)."""
    for _ in range(n):
        _shm.incref(name, held)
    for _ in range(n):
        _shm.decref(name, held)
    for _ in range(n // 4):  # attach (+1 through a fresh mapping), release through it
        mapping = _shm.attach_refcounted(name, 8)
        _shm.incref(name, mapping)
        _shm.decref(name, mapping)
        _shm.decref(name, mapping)


@pytest.fixture
def segment():
    name = _shm.new_name()
    mapping = _shm.create_refcounted(name, 8)
    yield name, mapping
    if os.path.exists(f"{_shm.SHM_DIR}{name}"):
        os.unlink(f"{_shm.SHM_DIR}{name}")


def _counting_up_and_down(name, held, workers: int) -> None:
    peak = [0]

    def up_only():
        for _ in range(N):
            peak[0] = max(peak[0], _shm.incref(name, held))

    threads = [threading.Thread(target=up_only) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _shm.read_refcount(name) == 1 + workers * N  # no update lost
    for _ in range(workers * N):
        _shm.decref(name, held)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["held", "fd only", "mixed"])
def test_threads_lose_no_update(segment, path):
    name, mapping = segment
    helds = {"held": [mapping] * 4, "fd only": [None] * 4, "mixed": [mapping, None] * 2}[path]
    threads = [threading.Thread(target=_hammer, args=(name, h)) for h in helds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _shm.read_refcount(name) == 1
    _counting_up_and_down(name, helds[0], 4)
    assert _shm.read_refcount(name) == 1
    assert _shm.decref(name, mapping) == 0  # the creator is the last: the name goes
    assert not os.path.exists(f"{_shm.SHM_DIR}{name}")


@pytest.mark.timeout(120)
def test_processes_lose_no_update(segment):
    name, mapping = segment
    pids = []
    for i in range(3):  # fork children share the mapping (MAP_SHARED) and count through it
        pid = os.fork()
        if pid == 0:
            try:
                for _ in range(N):
                    _shm.incref(name, mapping if i != 1 else None)
                _hammer(name, mapping if i != 2 else None)
            finally:
                os._exit(0)
        pids.append(pid)
    _hammer(name, mapping)
    for pid in pids:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert _shm.read_refcount(name) == 1 + 3 * N  # every child's increments, none lost
    for _ in range(3 * N):
        _shm.decref(name, mapping)
    assert _shm.decref(name, mapping) == 0
    assert not os.path.exists(f"{_shm.SHM_DIR}{name}")


@pytest.mark.timeout(60)
def test_a_reused_name_is_not_ours_any_more(segment):
    name, mapping = segment
    os.unlink(f"{_shm.SHM_DIR}{name}")  # reclaimed (the manager, or by hand) ...
    other = _shm.create_refcounted(name, 8)  # ... and the name made again by someone else
    assert _shm.decref(name, mapping) == 0  # ours is gone: nothing released, nothing unlinked
    assert _shm.read_refcount(name) == 1
    with pytest.raises(FileNotFoundError):
        _shm.incref(name, mapping)
    assert _shm.decref(name, other) == 0


def _hold_the_lock_then(mapping, then) -> int:
    """A fork child takes the segment's lock, says so on a pipe, then does ``then()``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            mapping.lock.acquire()
            os.write(w, b"x")
            then()
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"x"
    os.close(r)
    return pid


@pytest.mark.timeout(60)
def test_a_holder_killed_inside_the_lock_does_not_lock_the_others_out(segment):
    # PTHREAD_MUTEX_ROBUST: the kernel hands a dead holder's lock to the next taker
    # (EOWNERDEAD), as it drops a dead process's flock. A plain mutex would hang here.
    name, mapping = segment
    pid = _hold_the_lock_then(mapping, lambda: signal.pause())
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert _shm.incref(name, mapping) == 2  # through our mapping
    assert _shm.decref(name) == 1  # through a fresh one: the lock is whole again
    assert _shm.decref(name, mapping) == 0 and not os.path.exists(f"{_shm.SHM_DIR}{name}")


@pytest.mark.timeout(60)
def test_a_holder_stopped_inside_the_lock_is_waited_for_with_a_warning_not_given_up(
        segment, monkeypatch):
    # Note [Waiting for a stopped holder]: a live holder will release the lock, so the wait
    # never gives up (a give-up in a feeder thread dropped the message); it says once why.
    name, mapping = segment
    monkeypatch.setattr(headerlock, "LOCK_WARN_S", 0.3)

    def stop_then_release():
        os.kill(os.getpid(), signal.SIGSTOP)
        headerlock.release(mapping.lock.mutex)  # resumed: let go, then exit normally

    pid = _hold_the_lock_then(mapping, stop_then_release)
    resume = threading.Timer(1.0, os.kill, (pid, signal.SIGCONT))  # > 3 x LOCK_WARN_S
    resume.start()
    try:
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match=r"held for 0.3 s by thread \d+: that process "
                          "is stopped .* Still waiting"):
            assert _shm.incref(name, mapping) == 2  # waited, then counted
        assert time.monotonic() - start >= 0.9
    finally:
        resume.join()
        os.kill(pid, signal.SIGKILL)  # (already gone, normally)
        os.waitpid(pid, 0)
    assert _shm.decref(name) == 1 and _shm.decref(name, mapping) == 0


@pytest.mark.timeout(60)
def test_a_ctrl_c_just_as_the_wait_takes_the_lock_does_not_leave_it_held(segment):
    # Note [A lock that a Ctrl-C cannot leave held]: the signal comes during the wait, the
    # holder goes within the same wait slice, the wait takes the lock (EOWNERDEAD), and the
    # KeyboardInterrupt is raised right after: the lock must not stay ours.
    name, mapping = segment
    pid = _hold_the_lock_then(mapping, lambda: time.sleep(0.25))  # then dies holding it
    signal.signal(signal.SIGALRM, _interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.22)
    returned = []
    try:
        with pytest.raises(KeyboardInterrupt):
            returned.append(_shm.incref(name, mapping))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        os.waitpid(pid, 0)
    assert returned == []  # interrupted inside incref, before it counted
    other = []
    t = threading.Thread(target=lambda: other.append(_shm.incref(name, mapping)))
    t.start()  # another thread: a lock we still held would keep it waiting 10 s
    t.join(5)
    assert other == [2], other  # the interrupted incref changed nothing; the lock was free
    assert _shm.decref(name, mapping) == 1


def _interrupt(signum, frame):
    raise KeyboardInterrupt
