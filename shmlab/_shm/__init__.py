"""The OS layer: create, name, map and unlink POSIX shared-memory segments under every storage.

Mirrors: aten/src/ATen/MapAllocator.cpp (MapAllocator, RefcountedMapAllocator) and
at::NewProcessWideShmHandle.

    segment.py     constants (SHM_DIR, PREFIX, HEADER_SIZE, strategy names), names, shm_open
    mapping.py     Mapping: libc mmap(MAP_SHARED) / munmap
    unlinked.py    file_descriptor segments: create_unlinked, map_fd
    refcounted.py  file_system segments: create/attach_refcounted, incref/decref, read_refcount
    headerlock.py  the lock in a file_system header (a process-shared, robust pthread mutex)

One kind of segment per sharing strategy; the names below are the whole public surface.
"""

from .mapping import Mapping
from .refcounted import attach_refcounted, create_refcounted, decref, incref, read_refcount
from .segment import (
    FILE_DESCRIPTOR,
    FILE_SYSTEM,
    HEADER_SIZE,
    PREFIX,
    SHM_DIR,
    name_pattern,
    new_name,
)
from .unlinked import create_unlinked, map_fd

__all__ = [
    "FILE_DESCRIPTOR", "FILE_SYSTEM", "HEADER_SIZE", "PREFIX", "SHM_DIR", "Mapping",
    "attach_refcounted", "create_refcounted", "create_unlinked", "decref", "incref",
    "map_fd", "name_pattern", "new_name", "read_refcount",
]
