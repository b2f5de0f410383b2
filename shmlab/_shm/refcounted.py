"""file_system segments: named in /dev/shm, with a header that counts the processes mapping them.

Mirrors: RefcountedMapAllocator (aten/src/ATen/MapAllocator.cpp), as THPStorage_shareFilename
and THPStorage_newSharedFilename use it.

``create_refcounted(name, size)`` makes the segment with a HEADER_SIZE-byte header in front of
the data, refcount 1; every ``attach_refcounted`` adds one, every ``decref`` takes one, and the
holder that brings it to 0 unlinks the name. A process that dies without its decref leaks the
file: that is what the manager daemon (shmlab.manager) is for.

Note [Refcount updates across processes]
torch keeps an std::atomic<int> at offset 0 and updates it with lock-free atomics. Python
has no atomic instructions, so shmlab reads and writes the count under a lock that lives in
the header itself, next to the count: a process-shared robust mutex (headerlock.py, Note [A
lock in the memory both processes map]). It excludes other threads of this process as well
as other processes, and if a holder dies mid-update the next taker gets it back. Attach,
close and the last closer's unlink all happen under the lock, so an attach can never revive
a segment whose count already reached 0.

Note [Who checks what, and when]
The lock is in the memory, so every update needs a mapping of the header. A holder (the
creator, or a receiver that attached) has one, and its updates touch no file at all (the
timings are in docs/benchmarks.md). The name is looked at only where it matters: ``incref``
(a message is about to send a receiver to that name, so it must still name our file: one
lstat) and the decref that reaches 0 (the unlink must remove our file, not whatever has the
name now).
Callers without a mapping (labs, tests, the cuda model) open the name, check the file
(_check_ours), map just the header for the update and unmap it again: the slow path, which
no storage takes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct

from . import headerlock
from .mapping import Mapping
from .segment import HEADER_SIZE, SHM_DIR, check_size, create, open_segment, shm_unlink

_REFCOUNT = struct.Struct("<i")  # the int32 at [0:4) of the header
_MAX_COUNT = 2**31 - 1  # torch's std::atomic<int> would wrap past this; we refuse instead


class RefcountedMapping(Mapping):
    """A mapped file_system segment that knows which file it maps (``file_id``).

    ``count`` is the header's int32 as memory, ``lock`` the mutex beside it. Every update
    in this module reads and writes the count under the lock (create_refcounted's first
    write excepted: nobody else knows the name yet). Nothing checks that a caller holds it:
    reading ``count`` without the lock is for observation only.
    """

    def __init__(self, fd: int, size: int, name: str, st: os.stat_result):
        super().__init__(fd, size)
        self.name, self.file_id = name, (st.st_dev, st.st_ino)
        self._count = ctypes.c_int32.from_address(self.addr)  # [0:4), native = little-endian
        self.lock = headerlock.HeaderLock(self.addr, name)  # [8:64)

    @property
    def count(self) -> int:
        return self._count.value

    @count.setter
    def count(self, value: int) -> None:
        self._count.value = value


def _open_checked(name: str) -> int:
    """shm_open(name, O_RDWR), saying clearly when the name is a symbolic link."""
    try:
        return open_segment(name, os.O_RDWR)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # glibc's shm_open passes O_NOFOLLOW
            raise OSError(errno.ELOOP, f"{SHM_DIR}{name} is a symbolic link, not a shmlab "
                          "segment: somebody replaced the segment, and shm_open does not follow "
                          "links. Nothing was changed; remove the link by hand") from exc
        raise


def _check_ours(name: str, st: os.stat_result) -> None:
    """Refuse anything but a regular file of our own uid, saying why.

    torch maps whatever file it can open. Root can open anyone's file, and a file made by
    another user is one that user controls (its size, its header, its unlinking), so shmlab
    counts itself only into regular files of its own uid, as the manager unlinks only those.
    """
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, f"{SHM_DIR}{name} is not a regular file, so not a "
                      "shmlab segment; nothing was changed")
    if st.st_uid != os.geteuid():
        raise PermissionError(
            errno.EPERM, f"{SHM_DIR}{name} belongs to uid {st.st_uid}, not to this process's "
            f"uid {os.geteuid()}: shmlab shares segments only between processes of one user "
            "(torch would attach). Run both sides as the same user, or use the "
            "'file_descriptor' strategy, which passes the memory itself, not a name.")
    if st.st_size < HEADER_SIZE:  # a raw struct.error would say nothing useful
        raise ValueError(
            f"{SHM_DIR}{name} holds {st.st_size} bytes, less than the {HEADER_SIZE}-byte "
            "header every shmlab segment starts with: it is not a shmlab segment (or it "
            "was truncated). Nothing was changed; remove it if no process uses it")


def _map_checked(name: str, size: int | None = None) -> RefcountedMapping:
    """Open ``name``, check it is one of our segments, map it (header only if size is None).

    The order is torch's (RefcountedMapAllocator::initializeAlloc runs after the mmap): if
    mapping fails (ENOMEM, RLIMIT_AS) no count was touched, so nothing leaks. No fd is kept.
    """
    fd = _open_checked(name)
    try:
        st = os.fstat(fd)
        _check_ours(name, st)
        have = st.st_size - HEADER_SIZE
        if size is not None and have < size:  # mapping past the end would SIGBUS on touch
            raise ValueError(f"segment {name} holds {have:,} data bytes, fewer than the "
                             f"{size:,} the message claims: it was forged or corrupted")
        mapping = RefcountedMapping(fd, HEADER_SIZE + (size or 0), name, st)
    finally:
        os.close(fd)  # the mapping keeps the memory; file_system keeps no fd
    if not headerlock.is_set_up(mapping.addr):
        raise ValueError(f"{SHM_DIR}{name} has no lock in its {HEADER_SIZE}-byte header, so it "
                         "was not made by shmlab's create_refcounted (by hand, or by an older "
                         "shmlab): it is not a shmlab segment. Nothing was changed; remove it "
                         "if no process uses it")
    return mapping


def _set_count(seg: RefcountedMapping, value: int) -> None:
    if not 0 <= value <= _MAX_COUNT:
        raise ValueError(
            f"the refcount of {SHM_DIR}{seg.name} would become {value}, outside "
            f"0..{_MAX_COUNT}: its header is corrupt, or it was released more often "
            "than it was attached. Nothing was changed")
    seg.count = value


def _check_alive(seg: RefcountedMapping) -> None:
    """Under the lock: refuse to count into a segment whose count already reached 0.

    (Below 0 is a damaged header: _set_count refuses it, saying so.)"""
    if seg.count == 0:  # its last user is closing it right now (or died doing so)
        raise FileNotFoundError(errno.ENOENT, f"shared memory segment {seg.name} is being freed")


def _names_our_file(seg: RefcountedMapping) -> bool:
    """Does the name still name the file we map? False if it is gone or another file now.

    A symbolic link in its place is refused with ELOOP, as shm_open refuses to follow one.
    """
    try:
        st = os.lstat(SHM_DIR + seg.name)
    except FileNotFoundError:
        return False  # reclaimed (by the manager, or by hand)
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, f"{SHM_DIR}{seg.name} is a symbolic link, not a shmlab "
                      "segment: somebody replaced the segment. Nothing was changed; remove "
                      "the link by hand")
    return (st.st_dev, st.st_ino) == seg.file_id


def create_refcounted(name: str, size: int, data: memoryview | None = None) -> RefcountedMapping:
    """Create ``name`` with a header (refcount 1, the lock) and ``size`` data bytes; map it."""
    fd = create(name, HEADER_SIZE + size, data)
    try:
        mapping = RefcountedMapping(fd, HEADER_SIZE + size, name, os.fstat(fd))
        mapping.count = 1  # nobody else knows the name yet: no lock needed
        headerlock.set_up(mapping.addr)
        return mapping
    except BaseException:
        shm_unlink(name)
        raise
    finally:
        os.close(fd)  # the name is the handle: no fd is kept after mapping


def attach_refcounted(name: str, size: int) -> RefcountedMapping:
    """Map an existing segment, then count ourselves in (+1) under its lock."""
    mapping = _map_checked(name, check_size(size))
    mapping.lock.acquire()
    try:  # (not `with`: see Note [A lock that a Ctrl-C cannot leave held] in headerlock.py)
        _check_alive(mapping)
        _set_count(mapping, mapping.count + 1)  # if this refuses, the mapping is unmapped
    finally:
        headerlock.release(mapping.lock.mutex)
    return mapping


def incref(name: str, held: RefcountedMapping | None = None) -> int:
    """One more holder (a message in flight counts as one). Returns the new count.

    ``held``: this process's mapping of the segment, if it has one (no file is opened)."""
    if held is not None and not _names_our_file(held):
        raise FileNotFoundError(  # a receiver sent to this name would find another file
            errno.ENOENT, f"{SHM_DIR}{name} is no longer the segment we map")
    seg = held if held is not None else _map_checked(name)
    seg.lock.acquire()
    try:
        _check_alive(seg)  # a holder has a count; a caller without a mapping may not
        _set_count(seg, seg.count + 1)
        return seg.count
    finally:
        headerlock.release(seg.lock.mutex)


def decref(name: str, held: RefcountedMapping | None = None) -> int:
    """One holder fewer; the holder that brings the count to 0 unlinks the name.

    A name that is gone returns 0 (someone reclaimed it: nothing left to release). Any
    other failure (a symlink or another user's file in its place, a damaged header) raises
    an exception that says what it found; storage's finalizer turns that into a warning.
    """
    try:
        seg = held if held is not None else _map_checked(name)
    except FileNotFoundError:
        return 0  # already reclaimed (by the manager, or by hand): nothing left to release
    seg.lock.acquire()
    try:
        count = seg.count - 1
        if count == 0 and not _names_our_file(seg):
            seg.count = 0  # ours was reclaimed (and the name maybe reused): unlink nothing
            return 0
        _set_count(seg, count)
        if count == 0:
            shm_unlink(name)
        return count
    finally:
        headerlock.release(seg.lock.mutex)


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
