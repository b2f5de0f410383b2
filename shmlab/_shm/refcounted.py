"""file_system segments: named in /dev/shm, with a header that counts the processes mapping them.

Mirrors: RefcountedMapAllocator (aten/src/ATen/MapAllocator.cpp), as THPStorage_shareFilename
and THPStorage_newSharedFilename use it.

``create_refcounted(name, size)`` makes the segment with a HEADER_SIZE-byte header in front of
the data, refcount 1; every ``attach_refcounted`` adds one, every ``decref`` takes one, and the
holder that brings it to 0 unlinks the name. A process that dies without its decref leaks the
file: that is what the manager daemon (shmlab.manager) is for.

Note [Refcount updates across processes]
torch keeps an std::atomic<int> at offset 0 and updates it with lock-free atomics. Python
has no atomic instructions, so shmlab takes an flock() on the segment for each update and
reads/writes the count with pread/pwrite. flock() belongs to the open file description, so
it excludes other threads of this process as well as other processes, and the kernel drops
it if the holder dies mid-update. Attach, close and the last closer's unlink all happen
under the lock, so an attach can never revive a segment whose count already reached 0.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

from .mapping import Mapping
from .segment import HEADER_SIZE, create, open_segment, shm_unlink

_REFCOUNT = struct.Struct("<i")  # the int32 at [0:4) of the header


class _Locked:
    """Open ``name`` and hold an exclusive flock on it for the duration of a with-block."""

    def __init__(self, name: str):
        self.fd = open_segment(name, os.O_RDWR)

    def __enter__(self) -> _Locked:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        # Unlock explicitly: a mapping made from this fd (attach_refcounted) holds the open
        # file description, and with it the flock, alive after close() until munmap.
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)

    def count(self) -> int:
        return _REFCOUNT.unpack(os.pread(self.fd, 4, 0))[0]

    def set_count(self, value: int) -> None:
        os.pwrite(self.fd, _REFCOUNT.pack(value), 0)


def create_refcounted(name: str, size: int, data: memoryview | None = None) -> Mapping:
    """Create ``name`` with a header (refcount 1) and ``size`` data bytes; map it; keep no fd."""
    fd = create(name, HEADER_SIZE + size, data)
    try:
        os.pwrite(fd, _REFCOUNT.pack(1), 0)
        return Mapping(fd, HEADER_SIZE + size)
    except BaseException:
        shm_unlink(name)
        raise
    finally:
        os.close(fd)  # the name is the handle: no fd is kept after mapping


def attach_refcounted(name: str, size: int) -> Mapping:
    """Map an existing segment and count ourselves in (+1)."""
    with _Locked(name) as seg:
        count = seg.count()
        if count <= 0:  # its last user is closing it right now
            raise FileNotFoundError(errno.ENOENT, f"shared memory segment {name} is being freed")
        if os.fstat(seg.fd).st_size < HEADER_SIZE + size:
            raise ValueError(f"segment {name} holds fewer than {size} data bytes")
        seg.set_count(count + 1)
        return Mapping(seg.fd, HEADER_SIZE + size)


def incref(name: str) -> int:
    """One more holder (a message in flight counts as one). Returns the new count."""
    with _Locked(name) as seg:
        seg.set_count(seg.count() + 1)
        return seg.count()


def decref(name: str) -> int:
    """One holder fewer; the holder that brings the count to 0 unlinks the name."""
    try:
        with _Locked(name) as seg:
            count = seg.count() - 1
            seg.set_count(count)
            if count <= 0:
                shm_unlink(name)
            return count
    except FileNotFoundError:
        return 0  # already reclaimed (by the manager, or by hand): nothing left to release


def read_refcount(name: str) -> int | None:
    """The count in a segment's header, or None if it is gone (read-only, no lock)."""
    try:
        fd = open_segment(name, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return _REFCOUNT.unpack(os.pread(fd, 4, 0))[0]
    finally:
        os.close(fd)
