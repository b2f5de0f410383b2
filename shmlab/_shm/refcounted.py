"""file_system segments: named in /dev/shm, with a header that counts the processes mapping them.

Mirrors: RefcountedMapAllocator (aten/src/ATen/MapAllocator.cpp), as THPStorage_shareFilename
and THPStorage_newSharedFilename use it.

``create_refcounted(name, size)`` makes the segment with a HEADER_SIZE-byte header in front of
the data, refcount 1; every ``attach_refcounted`` adds one, every ``decref`` takes one, and the
holder that brings it to 0 unlinks the name. A process that dies without its decref leaks the
file: that is what the manager daemon (shmlab.manager) is for.

Note [Refcount updates across processes]
torch keeps an std::atomic<int> at offset 0 and updates it with lock-free atomics. Python
has no atomic instructions, so shmlab takes an flock() on the segment for each update.
flock() belongs to the open file description, so it excludes other threads of this process
(each call opens its own) as well as other processes, and the kernel drops it if the holder
dies mid-update. Attach, close and the last closer's unlink all happen under the lock, so an
attach can never revive a segment whose count already reached 0.

Note [The fast path: update the count through the mapping we hold]
Measured (strace -c, 1000 x incref+decref+attach+decref): each update cost ~10 syscalls,
open, fstat x2-3, geteuid, flock, pread, pwrite, flock, close: 43 us an incref or decref
(p50, load ~6), four updates a round trip. The fast path below: 23 us. A process that holds
the segment (its creator, or a receiver that attached) already maps the header, so it reads
and writes the count as plain memory under the lock, and checks only that the name still
names *its* file (one fstat: same st_dev and st_ino as when it mapped). That is open, fstat,
flock, flock, close: 5 syscalls. Options not taken, and why:
  * keep the fd open: fastest (flock + memory), but file_system's point is "no fd per
    tensor" (the fd counts the labs and test_file_system assert would change);
  * fcntl byte-range locks: per *process*, so they would not exclude our own threads
    (OFD locks would, but need a per-thread fd: no cheaper than flock);
  * a real atomic (a C extension or an "atomics" package): one more dependency for the one
    line a learner must understand, and a holder dying mid-update is then nobody's problem
    only because atomics cannot be interrupted - a subtlety flock makes visible.
Callers without a mapping (labs, tests, the cuda model) take the checked, fd-only path.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
import struct

from .mapping import Mapping
from .segment import HEADER_SIZE, SHM_DIR, check_size, create, open_segment, shm_unlink

_REFCOUNT = struct.Struct("<i")  # the int32 at [0:4) of the header
_MAX_COUNT = 2**31 - 1  # torch's std::atomic<int> would wrap past this; we refuse instead


class RefcountedMapping(Mapping):
    """A mapped file_system segment that knows which file it maps (``file_id``).

    ``count`` is the header's int32 as memory: only ever read or written under the lock.
    """

    def __init__(self, fd: int, size: int, name: str, st: os.stat_result):
        super().__init__(fd, size)
        self.name, self.file_id = name, (st.st_dev, st.st_ino)
        self._count = ctypes.c_int32.from_address(self.addr)  # [0:4), native = little-endian

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


class _Locked:
    """Open ``name`` and hold an exclusive flock on it for the duration of a with-block.

    With ``held`` (our mapping of the segment) the count is read and written in memory, and
    the only check is that the name still names the file we mapped; without it, every check
    of _check_ours runs under the lock and the count goes through pread/pwrite.
    """

    def __init__(self, name: str, held: RefcountedMapping | None = None):
        self.name, self.held = name, held
        self.fd = _open_checked(name)

    def __enter__(self) -> _Locked:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            self.st = os.fstat(self.fd)  # under the lock, like every check
            if self.held is None:
                _check_ours(self.name, self.st)
            elif (self.st.st_dev, self.st.st_ino) != self.held.file_id:
                raise FileNotFoundError(  # ours was reclaimed and the name reused since
                    errno.ENOENT, f"{SHM_DIR}{self.name} is no longer the segment we map")
        except BaseException:
            os.close(self.fd)  # no mapping shares this fd yet, so this drops the flock too
            raise
        return self

    def __exit__(self, *exc) -> None:
        # Unlock explicitly: a mapping made from this fd (attach_refcounted) holds the open
        # file description, and with it the flock, alive after close() until munmap.
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)

    def count(self) -> int:
        if self.held is not None:
            return self.held.count
        return _REFCOUNT.unpack(os.pread(self.fd, 4, 0))[0]

    def set_count(self, value: int) -> None:
        if not 0 <= value <= _MAX_COUNT:
            raise ValueError(
                f"the refcount of {SHM_DIR}{self.name} would become {value}, outside "
                f"0..{_MAX_COUNT}: its header is corrupt, or it was released more often "
                "than it was attached. Nothing was changed")
        if self.held is not None:
            self.held.count = value
        else:
            os.pwrite(self.fd, _REFCOUNT.pack(value), 0)


def create_refcounted(name: str, size: int, data: memoryview | None = None) -> RefcountedMapping:
    """Create ``name`` with a header (refcount 1) and ``size`` data bytes; map it; keep no fd."""
    fd = create(name, HEADER_SIZE + size, data)
    try:
        mapping = RefcountedMapping(fd, HEADER_SIZE + size, name, os.fstat(fd))
        mapping.count = 1  # nobody else knows the name yet: no lock needed
        return mapping
    except BaseException:
        shm_unlink(name)
        raise
    finally:
        os.close(fd)  # the name is the handle: no fd is kept after mapping


def attach_refcounted(name: str, size: int) -> RefcountedMapping:
    """Map an existing segment, then count ourselves in (+1).

    The order is torch's (RefcountedMapAllocator::initializeAlloc runs after the mmap): if
    mapping fails (ENOMEM, RLIMIT_AS) the count was never touched, so nothing leaks. Every
    check happens under the lock, the file's before the mmap, the count's after it.
    """
    size = check_size(size)
    with _Locked(name) as seg:
        have = seg.st.st_size - HEADER_SIZE
        if have < size:  # mapping past the end of the file would SIGBUS on first touch
            raise ValueError(f"segment {name} holds {have:,} data bytes, fewer than the "
                             f"{size:,} the message claims: it was forged or corrupted")
        seg.held = RefcountedMapping(seg.fd, HEADER_SIZE + size, name, seg.st)
        count = seg.count()
        if count <= 0:  # its last user is closing it right now
            raise FileNotFoundError(errno.ENOENT, f"shared memory segment {name} is being freed")
        seg.set_count(count + 1)  # if this refuses, the mapping is dropped and unmapped
        return seg.held


def incref(name: str, held: RefcountedMapping | None = None) -> int:
    """One more holder (a message in flight counts as one). Returns the new count.

    ``held``: this process's mapping of the segment, if it has one (the fast path)."""
    with _Locked(name, held) as seg:
        count = seg.count() + 1
        seg.set_count(count)
        return count


def decref(name: str, held: RefcountedMapping | None = None) -> int:
    """One holder fewer; the holder that brings the count to 0 unlinks the name.

    A name that is gone returns 0 (someone reclaimed it: nothing left to release). Any
    other failure (a symlink or another user's file in its place, a damaged header) raises
    an exception that says what it found; storage's finalizer turns that into a warning.
    """
    try:
        with _Locked(name, held) as seg:
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
