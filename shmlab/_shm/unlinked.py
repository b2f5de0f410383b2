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
from .segment import check_size, create, new_name, shm_unlink


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
    """Receiver side of file_descriptor: dup the received fd, keep the dup, map it.

    Note [A received file smaller than its message claims]
    The size travels beside the fd, so a forged or corrupted message can claim more bytes
    than the file holds. mmap does not mind, but the first touch past the end of the file
    kills the process with SIGBUS. torch's MapAllocator ftruncates the file up to the
    claimed size instead; shmlab refuses, because growing it would silently allocate memory
    in the sender's segment, without posix_fallocate (so a full /dev/shm would still SIGBUS
    later), on the word of a message that is already wrong. The sender sizes every segment
    exactly when it creates it, so a real message never trips this check.
    """
    size = check_size(size, minimum=1)  # empty storages travel without an fd
    have = os.fstat(fd).st_size
    if have < size:
        raise ValueError(f"the received shared-memory file holds {have:,} bytes, but its "
                         f"message claims {size:,}: the message was forged or corrupted "
                         "(mapping it would end in SIGBUS on the first touch past the end)")
    own = os.dup(fd)
    try:
        return own, Mapping(own, size)
    except BaseException:
        os.close(own)
        raise
