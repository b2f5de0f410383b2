"""Map a segment's fd into memory with libc mmap(MAP_SHARED), and unmap it when unused.

Mirrors: the mmap/munmap calls of aten/src/ATen/MapAllocator.cpp (MapAllocator::close).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


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
