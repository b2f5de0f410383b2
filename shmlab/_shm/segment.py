"""Name, create and size a POSIX shared-memory segment; the layout constants live here, once.

Mirrors: aten/src/ATen/MapAllocator.cpp (at::NewProcessWideShmHandle, and the shm_open +
ftruncate + posix_fallocate part of MapAllocator's constructor).

Every other module (storage, multiprocessing, the manager, introspect, labs) imports these
constants from here rather than spelling "/dev/shm", 64 or "file_system" again.
"""

from __future__ import annotations

import errno
import itertools
import operator
import os
import secrets
from _posixshmem import shm_open, shm_unlink  # the same C wrappers shared_memory.py uses

SHM_DIR = "/dev/shm"  # where shm_open("/name") puts "name" on Linux (a tmpfs)
PREFIX = "shmlab"  # torch's segments start with "torch", the stdlib's with "psm"
HEADER_SIZE = 64  # file_system: [0:4) int32 refcount | [4:64) MAGIC and lock (headerlock.py) | data

# The two sharing strategies are named after the two kinds of segment they use (as in torch):
FILE_DESCRIPTOR = "file_descriptor"  # unlinked.py: unlinked at once, the fd is the handle
FILE_SYSTEM = "file_system"  # refcounted.py: the name is the handle, a header counts users


def name_pattern(prefix: str = PREFIX) -> str:
    """The regex of what new_name() makes, ``<prefix>_<pid>_<random>_<counter>``.

    Group 1 is the creator's pid; ``prefix`` may itself be a group, e.g. "(torch|shmlab)"
    (torch's names have the same shape). Introspection parses names with it.
    """
    return rf"{prefix}_(\d+)_[0-9A-Za-z]+_\d+"


# One counter per process: with the pid and a random part it makes names unique without
# asking anybody (at::NewProcessWideShmHandle does the same with an std::atomic).
_counter = itertools.count()


def new_name() -> str:
    """``/shmlab_<pid>_<random>_<counter>``, the shape of torch's ``/torch_<pid>_<rand>_<n>``."""
    return f"/{PREFIX}_{os.getpid()}_{secrets.randbits(32)}_{next(_counter)}"


def check_size(size, minimum: int = 0) -> int:
    """A byte count that came in a message, as an int >= ``minimum``; TypeError/ValueError if not.

    Sizes travel inside pickles, so a forged or corrupted one must be refused before it
    reaches mmap (where -1 becomes 2**64 - 1) or a refcount is touched.
    """
    if isinstance(size, bool) or not hasattr(type(size), "__index__"):
        raise TypeError(f"segment size must be an int number of bytes, got "
                        f"{type(size).__name__} {size!r}")
    size = operator.index(size)
    if size < minimum:
        raise ValueError(f"segment size must be >= {minimum} bytes, got {size}: the message "
                         "that carried it was forged or corrupted")
    return size


def open_segment(name: str, flags: int) -> int:
    """shm_open(name, flags, 0600): only our uid may ever open our segments."""
    return shm_open(name, flags, 0o600)


def fill(fd: int, size: int, data: memoryview | None) -> None:
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


def create(name: str, size: int, data: memoryview | None) -> int:
    """A new segment (O_CREAT|O_EXCL) of ``size`` bytes; returns its fd. On any failure
    nothing is left behind, and a full /dev/shm says how to make room."""
    try:
        fd = open_segment(name, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    except OSError as exc:  # ENOSPC here means no inode is left: nothing was created
        if exc.errno == errno.ENOSPC:
            raise _no_space(name, size) from exc
        raise
    try:
        fill(fd, size, data)
    except BaseException as exc:
        os.close(fd)
        shm_unlink(name)  # leave nothing half-made behind
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise _no_space(name, size) from exc
        raise
    return fd


def _no_space(name: str, size: int) -> OSError:
    """ENOSPC, saying which of the two limits of a tmpfs ran out and how to raise it.

    A tmpfs limits its bytes (size=) and, separately, its number of files (nr_inodes=):
    thousands of small leaked segments can use up the files long before the bytes.
    """
    st = os.statvfs(SHM_DIR)
    free = f"{st.f_bavail * st.f_frsize:,} free of {st.f_blocks * st.f_frsize:,}"
    if st.f_files and st.f_favail == 0:
        return OSError(
            errno.ENOSPC,
            f"unable to create shared memory segment {name}: no inode left in {SHM_DIR} "
            f"(all {st.f_files:,} are in use, one per file; its space has {free} bytes). "
            "Remove leaked torch_*/shmlab_* files there, or allow more files "
            f"(mount -o remount,nr_inodes=... {SHM_DIR})",
        )
    return OSError(
        errno.ENOSPC,
        f"unable to allocate shared memory for {name}: {size:,} bytes needed, "
        f"{free} in {SHM_DIR}. "
        "Free space there (look for leaked torch_*/shmlab_* files) or make it larger "
        f"(docker run --shm-size=2g, or mount -o remount,size=... {SHM_DIR})",
    )
