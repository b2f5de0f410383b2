"""Create, name, map and unlink POSIX shared-memory segments: the OS calls under every storage.

Mirrors: aten/src/ATen/MapAllocator.cpp (MapAllocator, RefcountedMapAllocator) and
at::NewProcessWideShmHandle.

Two kinds of segment, one per sharing strategy:

* file_descriptor: ``create_unlinked(size)`` -> shm_open(O_CREAT|O_EXCL, 0600), size it,
  mmap(MAP_SHARED), shm_unlink at once. The fd is the only handle; when the last fd and
  mapping are gone the kernel frees the memory, so a crash cannot leak it.
* file_system: ``create_refcounted(name, size)`` -> the same, but the name stays in /dev/shm
  and a 64-byte header in front of the data counts the processes that map it. The last
  ``refcounted_close`` unlinks it. A process that dies without closing leaks the file: that
  is what the manager daemon (shmlab.manager) is for.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import itertools
import mmap
import os
import secrets
import struct
import weakref
from _posixshmem import shm_open, shm_unlink  # the same C wrappers shared_memory.py uses

PREFIX = "shmlab"
HEADER_SIZE = 64  # [0:4) int32 refcount | [4:64) padding | [64:) data  (as torch's)
_REFCOUNT = struct.Struct("<i")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value

# One counter per process: with the pid and a random part it makes names unique without
# asking anybody (at::NewProcessWideShmHandle does the same with an std::atomic).
_counter = itertools.count()


def new_name() -> str:
    """``/shmlab_<pid>_<random>_<counter>``, the shape of torch's ``/torch_<pid>_<rand>_<n>``."""
    return f"/{PREFIX}_{os.getpid()}_{secrets.randbits(32)}_{next(_counter)}"


class Mapping:
    """One mmap(MAP_SHARED) region, unmapped when nothing refers to it any more.

    Note [Why ctypes mmap and not the mmap module]
    Python's ``mmap.mmap(fd, ...)`` keeps a private dup() of the fd for as long as the map
    lives (until ``trackfd=False`` in 3.13). A receiver would then hold two fds per tensor
    where torch holds one, and the fd counts this lab teaches would be wrong. Mapping with
    libc directly keeps exactly the fds we own. Buffers handed out keep this object alive, so
    the memory is unmapped only after the last numpy view over it is gone.
    """

    def __init__(self, fd: int, size: int):
        addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {size} bytes failed: {os.strerror(err)}")
        self.addr, self.size = addr, size
        unmap = weakref.finalize(self, _libc.munmap, addr, size)
        unmap.atexit = False  # at exit the kernel unmaps; late readers must not fault

    def buffer(self, offset: int = 0) -> ctypes.Array:
        """A writable buffer over [offset, size) that keeps this mapping alive."""
        buf = (ctypes.c_ubyte * (self.size - offset)).from_address(self.addr + offset)
        buf._mapping = self
        return buf


def _open(name: str, flags: int) -> int:
    return shm_open(name, flags, 0o600)


def _fill(fd: int, size: int, data: memoryview | None) -> None:
    """Give the segment ``size`` bytes of real memory, optionally copying ``data`` in.

    Note [pwrite instead of fallocate + memcpy]
    torch sizes the file with ftruncate, reserves it with posix_fallocate (so a full
    /dev/shm raises ENOSPC now instead of SIGBUS on first touch), maps it and memcpys in,
    taking one page fault per 4 KiB page. When there is data to copy, pwrite() both
    allocates every page (failing with ENOSPC just the same) and copies, without faulting
    the pages in one by one: it is the faster way to move a private tensor into a fresh
    tmpfs segment. Without data, posix_fallocate reserves the pages as torch does.
    """
    os.ftruncate(fd, size)
    if data is None or len(data) == 0:
        os.posix_fallocate(fd, 0, size)
        return
    offset = size - len(data)  # data goes after the header, if any
    done = 0
    while done < len(data):  # pwrite may write less than asked; loop until all is in
        done += os.pwrite(fd, data[done:], offset + done)


def _create(name: str, size: int, data: memoryview | None) -> int:
    fd = _open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        _fill(fd, size, data)
    except BaseException as exc:
        os.close(fd)
        shm_unlink(name)  # leave nothing half-made behind
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise _no_space(name, size) from exc
        raise
    return fd


def _no_space(name: str, size: int) -> OSError:
    st = os.statvfs("/dev/shm")
    return OSError(
        errno.ENOSPC,
        f"unable to allocate shared memory for {name}: {size:,} bytes needed, "
        f"{st.f_bavail * st.f_frsize:,} free of {st.f_blocks * st.f_frsize:,} in /dev/shm. "
        "Free space there (look for leaked torch_*/shmlab_* files) or make it larger "
        "(docker run --shm-size=2g, or mount -o remount,size=... /dev/shm)",
    )


def create_unlinked(size: int, data: memoryview | None = None) -> tuple[int, Mapping]:
    """file_descriptor strategy: a new segment that only its fd names. Returns (fd, mapping).

    The caller owns the fd and must close it when the storage dies.
    """
    name = new_name()
    fd = _create(name, size, data)
    try:
        mapping = Mapping(fd, size)
    except BaseException:
        os.close(fd)
        raise
    finally:
        shm_unlink(name)  # unlink at once: /dev/shm stays empty, the fd link says "(deleted)"
    return fd, mapping


def map_fd(fd: int, size: int) -> tuple[int, Mapping]:
    """Receiver side of file_descriptor: dup the received fd, keep the dup, map it."""
    own = os.dup(fd)
    try:
        return own, Mapping(own, size)
    except BaseException:
        os.close(own)
        raise


# --- file_system: named, refcounted segments ----------------------------------------------
#
# Note [Refcount updates across processes]
# torch keeps an std::atomic<int> at offset 0 and updates it with lock-free atomics. Python
# has no atomic instructions, so shmlab takes an flock() on the segment for each update and
# reads/writes the count with pread/pwrite. flock() belongs to the open file description, so
# it excludes other threads of this process as well as other processes, and the kernel drops
# it if the holder dies mid-update. Attach, close and the last closer's unlink all happen
# under the lock, so an attach can never revive a segment whose count already reached 0.


class _Locked:
    """Open ``name`` and hold an exclusive flock on it for the duration of a with-block."""

    def __init__(self, name: str):
        self.fd = _open(name, os.O_RDWR)

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
    fd = _create(name, HEADER_SIZE + size, data)
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
        fd = _open(name, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return _REFCOUNT.unpack(os.pread(fd, 4, 0))[0]
    finally:
        os.close(fd)
