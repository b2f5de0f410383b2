"""Checks for lab 3: the 64-byte refcount header, attach/close, and safe updates."""

from __future__ import annotations

import _posixshmem
import contextlib
import fcntl
import os

from .. import _shm
from .._shm import SHM_DIR
from .report import Cases, fd_count, run_in_child


def _count(name: str):
    return _shm.read_refcount(name)


def _remove(name: str) -> None:
    """Remove the check's own segment, whatever the learner's code did to it."""
    try:
        os.unlink(f"{SHM_DIR}{name}")
    except FileNotFoundError:
        pass


@contextlib.contextmanager
def _removed(name: str):
    try:
        yield
    finally:
        _remove(name)


def check_attach_close(attach, close):
    name = _shm.new_name()
    with Cases("Exercise 1: attach and close on the refcount header") as c, _removed(name):
        creator = _shm.create_refcounted(name, 16)  # count 1, as the creator holds it
        creator_buf = creator.buffer(_shm.HEADER_SIZE)
        creator_buf[0] = 42
        fds_before = fd_count()
        m = attach(name, 16)
        c.check(_count(name) == 2, f"attach: 1 -> 2 (got {_count(name)})",
                "read the int32 at offset 0, add 1, write it back")
        c.check(bytes(memoryview(m)[_shm.HEADER_SIZE:_shm.HEADER_SIZE + 1]) == b"\x2a",
                "the attached mapping sees the creator's byte at offset 64",
                "map HEADER_SIZE + size bytes; the data starts after the 64-byte header")
        close(name, m)
        c.check(_count(name) == 1, f"close: 2 -> 1 (got {_count(name)})",
                "subtract 1 from the count")
        left = fd_count() - fds_before
        c.check(left == 0, f"after attach and close, no fd is left open ({left} left)",
                "the mapping keeps its own reference to the segment: the fd you opened to "
                "map it is yours to close, in attach and in close, on every path")
        c.check(os.path.exists(f"{SHM_DIR}{name}"), "the file stays while the creator holds it",
                "unlink only when the count reaches 0")
        m2 = attach(name, 16)
        _shm.decref(name)  # the creator lets go: count 2 -> 1
        close(name, m2)
        unlinked = not os.path.exists(f"{SHM_DIR}{name}")
        _remove(name)
        c.check(unlinked, "the last closer unlinks the name",
                "when your decrement brings the count to 0, shm_unlink(name)")
        del m, m2


def check_concurrent_updates(incref, decref):
    name = _shm.new_name()
    with Cases("Exercise 2: refcount updates that are safe across processes") as c, \
            _removed(name):
        _shm.create_refcounted(name, 8)
        n = 2000
        run_in_child(_hammer_both, incref, name, n, timeout=60)
        c.check(_count(name) == 1 + 2 * n,
                f"two processes x {n} increments at once: {1 + 2 * n} expected, "
                f"got {_count(name)}",
                "two read-modify-writes interleaved and one update was lost: what keeps "
                "another process out between your read and your write?")
        for _ in range(2 * n):
            decref(name)
        c.check(_count(name) == 1, "decref brings it back to 1")
        with _watching_unlink(decref) as unlinks:
            decref(name)
        unlinked = not os.path.exists(f"{SHM_DIR}{name}")
        c.check(unlinked, "the decrement to 0 unlinks", "when the count reaches 0, shm_unlink")
        c.check(unlinks == [True], f"it unlinks while holding the lock (shm_unlink calls, "
                f"locked or not: {unlinks})", "between your LOCK_EX and LOCK_UN: otherwise "
                "an attach can slip in after the count hit 0 and before the name is gone")


@contextlib.contextmanager
def _watching_unlink(fn):
    """Swap ``shm_unlink`` in ``fn``'s globals for one that records whether the lock is held.

    flock locks belong to an open file description: a second open() of the file gets its own,
    so a non-blocking LOCK_EX on it fails exactly when somebody (the learner's fd) holds it.
    """
    names, seen = fn.__globals__, []
    real = names.get("shm_unlink")

    def shm_unlink(name):
        probe = os.open(f"{SHM_DIR}{name}", os.O_RDONLY)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append(False)  # we got it: nobody held the lock
        except BlockingIOError:
            seen.append(True)
        finally:
            os.close(probe)
        return _posixshmem.shm_unlink(name)

    names["shm_unlink"] = shm_unlink
    try:
        yield seen
    finally:
        if real is None:
            names.pop("shm_unlink", None)
        else:
            names["shm_unlink"] = real


def _hammer_both(incref, name, n):
    pid = os.fork()  # two processes updating one counter at the same time
    for _ in range(n):
        incref(name)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)




def check_in_flight(send_handle, receive_handle, close):
    name = _shm.new_name()
    with Cases("Exercise 3: the count a message holds while it is in flight") as c, \
            _removed(name):
        _shm.create_refcounted(name, 8)
        message = send_handle(name)
        c.check(_count(name) == 2, f"sending: 1 -> 2 (got {_count(name)})",
                "incref before the message leaves: the sender may drop its own reference "
                "before the receiver attaches")
        _shm.decref(name)  # the sender drops its tensor at once: the message keeps it alive
        c.check(os.path.exists(f"{SHM_DIR}{name}"), "the segment survives its sender",
                "that is what the in-flight count is for")
        m = receive_handle(message, 8)
        c.check(_count(name) == 1, f"received: attach +1, release the in-flight count -1 "
                f"(got {_count(name)})", "attach, then decref once for the message")
        close(name, m)
        unlinked = not os.path.exists(f"{SHM_DIR}{name}")
        c.check(unlinked, "the receiver, the last holder, unlinks on close")
        del m
