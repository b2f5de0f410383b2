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
import stat
import struct

from .mapping import Mapping
from .segment import HEADER_SIZE, SHM_DIR, check_size, create, open_segment, shm_unlink

_REFCOUNT = struct.Struct("<i")  # the int32 at [0:4) of the header
_MAX_COUNT = 2**31 - 1  # torch's std::atomic<int> would wrap past this; we refuse instead


def _open_ours(name: str) -> int:
    """shm_open(name, O_RDWR) and make sure it is a segment of this user, or raise saying why.

    torch maps whatever file it can open. Root can open anyone's file, and a file made by
    another user is one that user controls (its size, its header, its unlinking), so shmlab
    counts itself only into regular files of its own uid, as the manager unlinks only those.
    """
    try:
        fd = open_segment(name, os.O_RDWR)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # glibc's shm_open passes O_NOFOLLOW
            raise OSError(errno.ELOOP, f"{SHM_DIR}{name} is a symbolic link, not a shmlab "
                          "segment: somebody replaced the segment, and shm_open does not follow "
                          "links. Nothing was changed; remove the link by hand") from exc
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{SHM_DIR}{name} is not a regular file, so not a "
                      "shmlab segment; nothing was changed")
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(
            errno.EPERM, f"{SHM_DIR}{name} belongs to uid {st.st_uid}, not to this process's "
            f"uid {os.geteuid()}: shmlab shares segments only between processes of one user "
            "(torch would attach). Run both sides as the same user, or use the "
            "'file_descriptor' strategy, which passes the memory itself, not a name.")
    return fd


class _Locked:
    """Open ``name`` and hold an exclusive flock on it for the duration of a with-block."""

    def __init__(self, name: str):
        self.name = name
        self.fd = _open_ours(name)

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
        size = os.fstat(self.fd).st_size
        if size < HEADER_SIZE:  # a raw struct.error would say nothing useful
            raise ValueError(
                f"{SHM_DIR}{self.name} holds {size} bytes, less than the {HEADER_SIZE}-byte "
                "header every shmlab segment starts with: it is not a shmlab segment (or it "
                "was truncated). Nothing was changed; remove it if no process uses it")
        return _REFCOUNT.unpack(os.pread(self.fd, 4, 0))[0]

    def set_count(self, value: int) -> None:
        if not 0 <= value <= _MAX_COUNT:
            raise ValueError(
                f"the refcount of {SHM_DIR}{self.name} would become {value}, outside "
                f"0..{_MAX_COUNT}: its header is corrupt, or it was released more often "
                "than it was attached. Nothing was changed")
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
    """Map an existing segment, then count ourselves in (+1).

    The order is torch's (RefcountedMapAllocator::initializeAlloc runs after the mmap): if
    mapping fails (ENOMEM, RLIMIT_AS) the count was never touched, so nothing leaks. Every
    check happens before either step, under the lock.
    """
    size = check_size(size)
    with _Locked(name) as seg:
        count = seg.count()
        if count <= 0:  # its last user is closing it right now
            raise FileNotFoundError(errno.ENOENT, f"shared memory segment {name} is being freed")
        have = os.fstat(seg.fd).st_size - HEADER_SIZE
        if have < size:
            raise ValueError(f"segment {name} holds {have:,} data bytes, fewer than the "
                             f"{size:,} the message claims: it was forged or corrupted")
        mapping = Mapping(seg.fd, HEADER_SIZE + size)
        seg.set_count(count + 1)  # if this refuses, the mapping is dropped and unmapped
        return mapping


def incref(name: str) -> int:
    """One more holder (a message in flight counts as one). Returns the new count."""
    with _Locked(name) as seg:
        seg.set_count(seg.count() + 1)
        return seg.count()


def decref(name: str) -> int:
    """One holder fewer; the holder that brings the count to 0 unlinks the name.

    A name that is gone returns 0 (someone reclaimed it: nothing left to release). Any
    other failure (a symlink or another user's file in its place, a damaged header) raises
    an exception that says what it found; storage's finalizer turns that into a warning.
    """
    try:
        with _Locked(name) as seg:
            count = seg.count() - 1
            seg.set_count(count)
            if count == 0:
                shm_unlink(name)
            return count
    except FileNotFoundError:
        return 0  # already reclaimed (by the manager, or by hand): nothing left to release


def read_refcount(name: str) -> int | None:
    """The count in a segment's header, or None if it is gone or has no header (no lock)."""
    try:
        fd = open_segment(name, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        raw = os.pread(fd, 4, 0)
        return _REFCOUNT.unpack(raw)[0] if len(raw) == 4 else None
    finally:
        os.close(fd)
