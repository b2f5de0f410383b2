"""file_descriptor segments: unlinked at birth, so the fd is their only handle and none can leak.

Mirrors: MapAllocator with ALLOCATOR_MAPPED_SHAREDMEM | EXCLUSIVE | KEEPFD | UNLINK
(aten/src/ATen/MapAllocator.cpp), as THPStorage_shareFd asks for it.

``create_unlinked(size)`` -> shm_open(O_CREAT|O_EXCL, 0600), size it, mmap(MAP_SHARED),
shm_unlink at once. When the last fd and mapping are gone the kernel frees the memory, so a
crash cannot leak it.
"""

from __future__ import annotations

import os

from .mapping import Mapping
from .segment import create, new_name, shm_unlink


def create_unlinked(size: int, data: memoryview | None = None) -> tuple[int, Mapping]:
    """file_descriptor strategy: a new segment that only its fd names. Returns (fd, mapping).

    The caller owns the fd and must close it when the storage dies.
    """
    name = new_name()
    fd = create(name, size, data)
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
