"""The lock in a file_system segment's header: a process-shared, robust pthread mutex.

Mirrors: the std::atomic<int> refcount of RefcountedMapAllocator (aten/src/ATen/MapAllocator.cpp),
which Python cannot have; this is what shmlab puts in its place.

Note [A lock in the memory both processes map]
torch moves a segment's count with one atomic instruction on memory every holder maps.
Python has no atomic instructions, so a read-modify-write of the count needs a lock, and the
cheapest lock two processes can share is one in that same memory: a pthread mutex made
PTHREAD_PROCESS_SHARED (it may live in shared memory and be taken from any process that
maps it) and PTHREAD_MUTEX_ROBUST (if its holder dies, the kernel hands it to the next
taker with EOWNERDEAD instead of leaving everyone waiting forever). Taking it when nobody
holds it is a compare-and-swap in user space: no system call, ~2 us from Python through
ctypes, where an flock() costs five system calls (open, flock, fstat, flock, close: ~15 us)
because flock needs a file descriptor and file_system keeps none.
A holder that dies mid-update leaves the count whole: the update is one 4-byte store, done
or not done. So EOWNERDEAD only needs pthread_mutex_consistent() before we go on.

The header is [0:4) int32 refcount | [4:8) MAGIC | [8:64) the mutex | [64:) data (a mutex
is 40 bytes on x86-64 and 48 on arm64 with glibc). The creator sets the lock up before the
name leaves the process and writes MAGIC last; a file without MAGIC was not made by
create_refcounted (by hand, by an older shmlab, or garbage), and its bytes at [8:64) are
not a lock we may wait on, so it is refused before anyone locks it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time
import warnings

from .mapping import _libc

MAGIC = b"SHML"  # at [4:8): "this header holds a lock that create_refcounted set up"
MAGIC_OFFSET, LOCK_OFFSET, LOCK_SPACE = 4, 8, 56
LOCK_WARN_S = 10.0  # a holder keeps it for microseconds; 10 s means a stopped or stuck one
WAIT_SLICE_S = 0.1  # how long one wait lasts before signals (Ctrl-C) get their turn
_FUTEX_TID_MASK = 0x3FFFFFFF  # linux/futex.h: the owner's thread id in a robust futex word

_PTHREAD_PROCESS_SHARED = 1
_PTHREAD_MUTEX_ROBUST = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


for _fn, _args in {
    "pthread_mutexattr_init": [ctypes.c_void_p],
    "pthread_mutexattr_setpshared": [ctypes.c_void_p, ctypes.c_int],
    "pthread_mutexattr_setrobust": [ctypes.c_void_p, ctypes.c_int],
    "pthread_mutex_init": [ctypes.c_void_p, ctypes.c_void_p],
    "pthread_mutex_trylock": [ctypes.c_void_p],
    "pthread_mutex_timedlock": [ctypes.c_void_p, ctypes.POINTER(_Timespec)],
    "pthread_mutex_unlock": [ctypes.c_void_p],
    "pthread_mutex_consistent": [ctypes.c_void_p],
}.items():
    getattr(_libc, _fn).argtypes, getattr(_libc, _fn).restype = _args, ctypes.c_int
_trylock, _unlock = _libc.pthread_mutex_trylock, _libc.pthread_mutex_unlock


def _check(err: int, what: str) -> None:
    if err:  # pthread functions return the error number; they do not set errno
        raise OSError(err, f"{what} failed: {os.strerror(err)}")


def _make_attr() -> ctypes.Array:
    """The attributes every header lock is made with: process-shared and robust."""
    attr = ctypes.create_string_buffer(64)  # pthread_mutexattr_t is 4 bytes; room to spare
    _check(_libc.pthread_mutexattr_init(attr), "pthread_mutexattr_init")
    _check(_libc.pthread_mutexattr_setpshared(attr, _PTHREAD_PROCESS_SHARED),
           "pthread_mutexattr_setpshared")
    _check(_libc.pthread_mutexattr_setrobust(attr, _PTHREAD_MUTEX_ROBUST),
           "pthread_mutexattr_setrobust")
    return attr


# Made once, at import, and kept: pthread_mutex_init only reads it, and a new segment is on
# the path of every first share (four ctypes calls fewer each time; a fork child's copy is
# as good as ours, it is plain memory).
_ATTR = _make_attr()


def set_up(header_addr: int) -> None:
    """Make the lock at [8:64) of a new header, then mark the header ready (MAGIC)."""
    _check(_libc.pthread_mutex_init(header_addr + LOCK_OFFSET, _ATTR), "pthread_mutex_init")
    ctypes.memmove(header_addr + MAGIC_OFFSET, MAGIC, len(MAGIC))


def is_set_up(header_addr: int) -> bool:
    return ctypes.string_at(header_addr + MAGIC_OFFSET, len(MAGIC)) == MAGIC


# The C unlock itself, called straight from a ``finally``: a Python function in between would
# start with a check for pending signals, and a KeyboardInterrupt raised there would leave
# the lock held by a thread that lives on, which no robust mutex recovers.
release = _unlock


class HeaderLock:
    """The mutex in one mapped header: ``acquire()``, then ``release(lock.mutex)`` in a finally.

    Note [A lock that a Ctrl-C cannot leave held]
    A KeyboardInterrupt (Jupyter's "interrupt kernel") is raised between two bytecodes, so it
    can land just after pthread_mutex_lock returned and before we know we hold the lock. So
    ``acquire`` asks the lock itself on the way out of an exception: a robust mutex's first
    int holds its owner's thread id (the kernel's robust-futex ABI), and if that is us, it
    unlocks before the exception goes on. The wait is in slices of WAIT_SLICE_S, so a
    Ctrl-C during it is raised within one slice.

    Note [Waiting for a stopped holder]
    A holder that dies is no reason to wait: the kernel hands its lock over (EOWNERDEAD). A
    holder that lives, stopped (SIGSTOP, a debugger) or slow, will release the lock once it
    runs again, so the wait never gives up: giving up would fail a share in a Queue's feeder
    thread, which prints the error and drops the message, and a delay is better than a lost
    tensor. After LOCK_WARN_S a RuntimeWarning says once who holds the lock, so a wait that
    looks like a hang explains itself. (torch has no lock to wait for: its count is an
    std::atomic<int> in the header, updated with one atomic instruction.)
    """

    __slots__ = ("name", "mutex")

    def __init__(self, header_addr: int, name: str):
        # Only the address: a reference back to the mapping would make a cycle, and the
        # mapping would then be unmapped by the cyclic collector, late, not by its last user.
        self.name, self.mutex = name, ctypes.c_void_p(header_addr + LOCK_OFFSET)

    def acquire(self) -> None:
        try:
            err = _trylock(self.mutex)  # the usual case: free, taken without a system call
            if err == errno.EBUSY:
                err = self._wait()
            if err == errno.EOWNERDEAD:  # its holder died holding it; the count is whole
                err = _libc.pthread_mutex_consistent(self.mutex)
        except BaseException:
            if self._held_by_me():
                _libc.pthread_mutex_consistent(self.mutex)  # EINVAL if it already was: fine
                _unlock(self.mutex)
            raise
        if err:
            raise self._error(err)

    def _held_by_me(self) -> bool:
        word = ctypes.c_uint32.from_address(self.mutex.value).value
        return word & _FUTEX_TID_MASK == threading.get_native_id()

    def _wait(self) -> int:
        """Wait for the lock as long as its holder lives (Note [Waiting for a stopped holder])."""
        warn_at = time.monotonic() + LOCK_WARN_S
        while True:
            # timedlock takes a CLOCK_REALTIME instant; short slices keep a clock step harmless
            until = time.time() + WAIT_SLICE_S
            when = _Timespec(int(until), min(int(until % 1 * 1e9), 999_999_999))
            err = _libc.pthread_mutex_timedlock(self.mutex, ctypes.byref(when))
            if err != errno.ETIMEDOUT:
                return err
            if warn_at is not None and time.monotonic() >= warn_at:
                warn_at = None
                warnings.warn(self._still_waiting(), RuntimeWarning, stacklevel=4)

    def _still_waiting(self) -> str:
        owner = ctypes.c_uint32.from_address(self.mutex.value).value & _FUTEX_TID_MASK
        return (f"the lock in the header of /dev/shm{self.name} has been held for "
                f"{LOCK_WARN_S:g} s by thread {owner}: that process is stopped (SIGSTOP, a "
                "debugger) or stuck. Still waiting (a dead holder would have handed it "
                "over): resume or end that process")

    def _error(self, err: int) -> OSError:
        return OSError(err, f"cannot take the lock in the header of /dev/shm{self.name}: "
                       f"{os.strerror(err)}. Nothing was changed")
