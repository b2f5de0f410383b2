"""Bytes in private or shared memory: the storage under every shmlab.Tensor.

Mirrors: torch.UntypedStorage and torch/csrc/StorageSharing.cpp (shareFd, newSharedFd,
shareFilename, newSharedFilename, sharedIncref, sharedDecref).

A storage starts private (ordinary process memory). ``share_memory_()`` moves its bytes into
a shared segment *in place*: the storage object stays the same, every tensor over it now
reads and writes shared memory, and the private copy is dropped. That swap is what makes
``ForkingPickler.dumps(t)`` flip ``t.is_shared()`` from False to True as a side effect.
"""

from __future__ import annotations

import os
import warnings
import weakref

import numpy as np

from . import _shm
from ._shm import FILE_DESCRIPTOR, FILE_SYSTEM
from .manager.client import get_client

# Note [Forking while the first share is in flight]
# Everything the file_system path needs is imported here, at import time, never inside the
# functions below. A Queue pickles in its feeder thread; a lazy `import` there holds that
# module's import lock, and a main thread that forks meanwhile (Process.start() right after
# q.put(), as upstream's test_fs_sharing does) hands the child the lock held by a thread that
# does not exist in the child: its first receive of a file_system tensor then waits forever
# in `_lock_unlock_module`. (torch imports multiprocessing.resource_sharer eagerly for the
# same reason; reductions.py does too.) The other half, the manager started from the feeder
# thread, is Note [Forking while a manager starts] in client.py (shmlab/manager).


def _release(kind: str, fd: int, name: str | None, manager: bytes | None, pid: int,
             held=None) -> None:
    """Free what a shared storage holds; runs once, when the storage is collected.

    ``held``: the file_system mapping, so the count is updated through it (refcounted.py,
    Note [Who checks what, and when]).

    Note [Who releases after fork]
    A fork child inherits this finalizer with the storage. Closing the child's copy of an fd
    is right (fd tables are per process). Decrementing a file_system refcount is not: the
    child never counted itself in, so only the process that did (``pid``) may count itself
    out.
    """
    if kind == FILE_DESCRIPTOR and fd >= 0:
        os.close(fd)  # the storage owned this fd; the mapping itself goes with its last view
    elif kind == FILE_SYSTEM and os.getpid() == pid:
        try:
            left = _shm.decref(name, held)  # the last holder unlinks the name
        except (OSError, ValueError) as exc:
            # An exception escaping a finalizer only prints "Exception ignored in ...".
            # Say what happened instead, and keep the manager's registration: when this
            # process family exits, the manager reclaims the name if it is still our file.
            warnings.warn(f"could not release shared memory segment {name}: {exc}. This "
                          "process's count in it stays; the manager reclaims it when this "
                          f"process family exits, or remove {_shm.SHM_DIR}{name} by hand",
                          RuntimeWarning, stacklevel=2)
            return
        if left:
            return  # others hold it: the manager keeps the name (see Note [What a receiver
            # tells the manager] in client.py)
        try:
            get_client(manager).free(name.lstrip("/"))  # the file is gone: it may forget it
        except (OSError, RuntimeError):
            pass  # manager gone: nothing to tell; the segment itself is already released


# Note [Making the segment while the manager registers it]
# torch registers a new name with its manager and waits for "OK" before it creates the file
# (THManagedMapAllocator). The wait is what matters: the name must be known to the manager
# before any other process can attach it, so a name is never pickled before its "OK". Where
# the file is made does not: nobody else knows the name yet, and the REGISTER line, once
# sent, is served even if we die (Note [What a receiver tells the manager] in client.py). So
# the creator sends REGISTER, makes the segment while the Python daemon wakes up and
# answers, and only then waits for "OK": the two costs overlap instead of adding up. If the
# answer is not "OK" (or does not come), the file is unlinked at once, before the storage
# adopts it, and the storage stays private, as it did when the REGISTER came first.


class UntypedStorage:
    """A flat run of bytes, private or in shared memory (file_descriptor or file_system)."""

    def __init__(self, nbytes: int = 0):
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise TypeError(f"UntypedStorage(nbytes): nbytes must be an int >= 0, got {nbytes!r}")
        self._data = np.zeros(nbytes, dtype=np.uint8)  # private bytes until shared
        self._kind: str | None = None  # None | FILE_DESCRIPTOR | FILE_SYSTEM
        self._fd = -1  # file_descriptor: the fd this storage owns
        self._name: str | None = None  # file_system: "/shmlab_<pid>_<rand>_<n>"
        self._manager: bytes | None = None  # file_system: the manager's socket path
        self._held = None  # file_system: our mapping of the segment (counts go through it)
        self._finalizer: weakref.finalize | None = None

    @classmethod
    def _wrap(cls, data: np.ndarray) -> UntypedStorage:
        """A storage over existing uint8 bytes (no copy): how from_numpy shares memory."""
        self = cls.__new__(cls)
        cls.__init__(self, 0)
        self._data = data
        return self

    # --- what a learner inspects --------------------------------------------------------
    def nbytes(self) -> int:
        return int(self._data.size)

    size = nbytes  # torch.UntypedStorage.size() is the byte count too

    def is_shared(self) -> bool:
        return self._kind is not None

    def data_ptr(self) -> int:
        return int(self._data.ctypes.data) if self._data.size else 0

    def __len__(self) -> int:
        return self.nbytes()

    def __repr__(self) -> str:
        where = {None: "private", FILE_DESCRIPTOR: f"shared fd={self._fd}",
                 FILE_SYSTEM: f"shared {self._name}"}
        return f"shmlab.UntypedStorage({self.nbytes()} bytes, {where[self._kind]})"

    # --- moving into shared memory ------------------------------------------------------
    def share_memory_(self) -> UntypedStorage:
        """Move the bytes to shared memory with the current strategy; no-op if shared."""
        from .multiprocessing import get_sharing_strategy

        if not self.is_shared():
            if get_sharing_strategy() == FILE_SYSTEM:
                self._share_filename_cpu_()
            else:
                self._share_fd_cpu_()
        return self

    def _adopt(self, data, kind, fd=-1, name=None, manager=None, held=None) -> None:
        """Swap our bytes for shared ones (same object, new memory); free the old share."""
        old = self._finalizer
        self._data, self._kind, self._fd, self._name, self._manager = data, kind, fd, name, manager
        self._held = held
        self._finalizer = weakref.finalize(self, _release, kind, fd, name, manager, os.getpid(),
                                           held)
        if old is not None:
            old()  # e.g. an fd-shared storage re-shared by name drops its fd now

    def _share_fd_cpu_(self) -> tuple[int, int]:
        """file_descriptor: move into an unlinked segment; return (fd, nbytes). We keep the fd."""
        if self._kind != FILE_DESCRIPTOR:
            n = self.nbytes()
            if n == 0:  # nothing to map: torch returns fd -1 as well
                self._adopt(self._data, FILE_DESCRIPTOR)
            else:
                fd, mapping = _shm.create_unlinked(n, memoryview(self._data))
                self._adopt(np.frombuffer(mapping.buffer(), np.uint8), FILE_DESCRIPTOR, fd=fd)
        return self._fd, self.nbytes()

    @classmethod
    def _new_shared_fd_cpu(cls, fd: int, size: int) -> UntypedStorage:
        """Receiver: a storage over a received fd. We dup it and own the dup; fd stays yours."""
        if not isinstance(fd, int) or fd < 0:
            raise ValueError(f"_new_shared_fd_cpu needs an open fd, got {fd!r}")
        own, mapping = _shm.map_fd(fd, size)
        self = cls._wrap(np.frombuffer(mapping.buffer(), np.uint8))
        self._adopt(self._data, FILE_DESCRIPTOR, fd=own)
        return self

    def _share_filename_cpu_(self) -> tuple[bytes, bytes, int]:
        """file_system: move into a named, refcounted segment; return (manager, name, nbytes)."""
        if self._kind != FILE_SYSTEM:
            client = get_client()  # starts the manager daemon on first use
            name = _shm.new_name()
            made = []  # see Note [Making the segment while the manager registers it]
            try:
                client.register(name.lstrip("/"), lambda: made.append(
                    _shm.create_refcounted(name, self.nbytes(), memoryview(self._data))))
            except BaseException:
                if made:  # made, but not registered (refused, or no answer): count 1 -> 0,
                    _shm.decref(name, made[0])  # which unlinks it (nobody else knows the name)
                client.free(name.lstrip("/"))  # in case the manager registers it late
                raise
            mapping = made[0]
            data = np.frombuffer(mapping.buffer(_shm.HEADER_SIZE), np.uint8)
            self._adopt(data, FILE_SYSTEM, name=name, manager=client.handle, held=mapping)
        return self._manager, self._name.encode(), self.nbytes()

    @classmethod
    def _new_shared_filename_cpu(cls, manager: bytes, name: bytes, size: int) -> UntypedStorage:
        """Receiver: attach to a named segment (+1 on its refcount) and tell its manager."""
        name_s = name.decode() if isinstance(name, bytes) else str(name)
        client = get_client(manager)
        # The creator registered the name; we only join (Note [What a receiver tells the
        # manager] in client.py).
        client.join(name_s.lstrip("/"))
        try:
            mapping = _shm.attach_refcounted(name_s, size)
        except BaseException:
            client.free(name_s.lstrip("/"))
            raise
        self = cls._wrap(np.frombuffer(mapping.buffer(_shm.HEADER_SIZE), np.uint8))
        self._adopt(self._data, FILE_SYSTEM, name=name_s, manager=client.handle, held=mapping)
        return self

    def _shared_incref(self) -> UntypedStorage:
        """file_system: count one more holder (the sender does this for a message in flight)."""
        if self._kind == FILE_SYSTEM:
            _shm.incref(self._name, self._held)
        return self

    def _shared_decref(self) -> UntypedStorage:
        """file_system: count one holder fewer (the receiver releases the in-flight count)."""
        if self._kind == FILE_SYSTEM:
            _shm.decref(self._name, self._held)
        return self

    # --- plain pickle (torch.save-like): copies the bytes ---------------------------------
    def __reduce__(self):
        return (_storage_from_bytes, (self._data.tobytes(),))


def _storage_from_bytes(raw: bytes) -> UntypedStorage:
    return UntypedStorage._wrap(np.frombuffer(bytearray(raw), np.uint8))
