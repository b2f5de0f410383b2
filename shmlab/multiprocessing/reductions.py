"""Reducers that turn tensors into shared-memory handles when multiprocessing pickles them.

Mirrors: torch/multiprocessing/reductions.py

The path of ``queue.put(t)``, five functions deep:
  1. ``reduce_tensor(t)``      -> (rebuild_tensor, (Tensor, storage, (offset, shape, strides)))
  2. ``reduce_storage(s)``     -> picks the strategy (the one place that does); file_descriptor:
  3. ``UntypedStorage._share_fd_cpu_()``   moves the bytes to shared memory, keeps the fd
  4. ``_shm.create_unlinked()``            shm_open + pwrite + mmap + shm_unlink
  5. ``_shm.Mapping``                      the mmap(MAP_SHARED) call itself
and on the other side ``rebuild_storage_fd`` -> ``UntypedStorage._new_shared_fd_cpu`` ->
``_shm.map_fd``. The fd itself travels in a ``multiprocessing.reduction.DupFd``: SCM_RIGHTS
over a UNIX socket.
"""

import errno
import multiprocessing
import os
import reprlib
import resource
import threading
import weakref
from multiprocessing import reduction
from multiprocessing.util import register_after_fork

from .._shm import FILE_SYSTEM, SHM_DIR
from ..manager.errors import NotAManagerError
from ..storage import UntypedStorage
from ..tensor import Tensor

try:
    # Load resource_sharer now, as torch does: Queue pickles in a feeder thread, and a fork
    # that overlaps a half-done first import would hand the child a broken module.
    import multiprocessing.resource_sharer  # noqa: F401
except ImportError:
    pass


class StorageWeakRef:
    """A weak reference to a storage, usable as a cache value (torch's holds a C pointer)."""

    __slots__ = ("ref", "__weakref__")

    def __init__(self, storage: UntypedStorage):
        self.ref = weakref.ref(storage)

    def expired(self) -> bool:
        return self.ref() is None


class SharedCache(dict):
    """Dictionary from shared-memory handles to StorageWeakRef.

    Finding the storage we already have for a handle is what makes two views of one storage
    arrive as views of one storage, and a tensor sent back to its sender arrive as the
    sender's own storage. Dead entries are purged when the dict outgrows ``limit``, and the
    limit follows the live count (max(128, 2 x live)) so the purge stays amortised O(1).
    """

    def __init__(self):
        self.limit = 128
        # fork copies the lock in whatever state it is in; give the child a fresh one.
        self._after_fork()
        register_after_fork(self, SharedCache._after_fork)

    def _after_fork(self):
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            return dict.get(self, key)

    def __setitem__(self, key, storage_ref):
        with self.lock:
            dict.__setitem__(self, key, storage_ref)
            if len(self) > self.limit:
                self.free_dead_references()

    def free_dead_references(self):
        live = 0
        for key, storage_ref in list(self.items()):
            if storage_ref.expired():
                del self[key]
            else:
                live += 1
        self.limit = max(128, live * 2)


# mapping from handles to StorageWeakRef objects
shared_cache = SharedCache()


def rebuild_tensor(cls, storage, metadata):
    # The metadata comes from another process: Tensor() checks it against the storage we
    # attached (tensor.py, _check_view), so a forged or corrupted message fails here, saying
    # so, instead of a numpy() that maps past the storage later.
    if not (isinstance(cls, type) and issubclass(cls, Tensor)):
        raise TypeError(f"cannot rebuild a received tensor as {cls!r}, which is not a "
                        "shmlab.Tensor class: the message was forged or corrupted")
    try:
        offset, shape, strides, dtype = metadata
        return cls(storage, offset, shape, strides, dtype)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise type(exc)(f"cannot rebuild a received tensor from metadata {reprlib.repr(metadata)}: "
                         f"{exc}. "
                         "A real sender's view always fits its storage, so the message was "
                         "forged or corrupted; nothing was read past the storage") from exc


def reduce_tensor(tensor):
    # The whole storage travels, never just the viewed bytes: a slice arrives as a view of
    # the same memory, at the same offset and strides.
    metadata = (tensor.storage_offset(), tensor.shape, tensor.stride(), tensor.dtype)
    return (rebuild_tensor, (type(tensor), tensor.untyped_storage(), metadata))


def fd_id(fd):
    # (inode, device) names the shared-memory object itself, whatever number the fd has in
    # this process: two fds for one segment give the same id. (macOS can't do this for shm
    # fds, which is why it only has file_system.)
    stat = os.fstat(fd)
    return (stat.st_ino, stat.st_dev)


def storage_from_cache(cls, key):
    storage_ref = shared_cache.get(key)
    return None if storage_ref is None else storage_ref.ref()


def _fd_limit_error(exc: BaseException) -> OSError:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unprivileged process may raise its soft limit up to the hard one, not beyond.
    target = 65536 if hard == resource.RLIM_INFINITY else hard
    return OSError(
        errno.EMFILE,
        f"Too many open files: this process reached its open-file limit (RLIMIT_NOFILE "
        f"soft={soft}, hard={hard}) while receiving a shared tensor ({exc}). Under the "
        "'file_descriptor' strategy every live received storage holds one fd. Fix: raise "
        f"the limit (`ulimit -n {target}` in the shell, or "
        "resource.setrlimit(resource.RLIMIT_NOFILE, ...)), or call "
        "shmlab.multiprocessing.set_sharing_strategy('file_system') in the sending process.",
    )


def _is_fd_exhaustion(exc: BaseException) -> bool:
    # Two faces of one problem: EMFILE when opening the socket or dup()ing the fd, and
    # "received 0 items of ancdata" when the kernel drops the SCM_RIGHTS fd (MSG_CTRUNC)
    # because the receiver has no free fd slot for it.
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return True
    return isinstance(exc, RuntimeError) and "items of ancdata" in str(exc)


def _sender_gone(what: str) -> str:
    return (f"{what}: the process that sent this tensor exited before the message was "
            "received. Keep the sender (and the tensor) alive until every receiver has "
            "taken what it sent, e.g. with an Event or by joining the consumers first.")


def rebuild_storage_fd(cls, df, size):
    try:
        fd = df.detach()  # connect to the sender, receive the fd over SCM_RIGHTS
    except (OSError, RuntimeError) as exc:
        if _is_fd_exhaustion(exc):
            raise _fd_limit_error(exc) from exc
        if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)):
            # Under file_descriptor the sender's resource-sharer thread hands the fd over on
            # request; with the sender dead there is nobody left to ask.
            raise ConnectionRefusedError(
                errno.ECONNREFUSED, _sender_gone("cannot fetch the shared-memory fd")) from exc
        raise
    try:  # fd is ours for the length of this call only: closed in finally, on every path
        storage = storage_from_cache(cls, fd_id(fd))
        if storage is not None:
            return storage
        try:
            storage = cls._new_shared_fd_cpu(fd, size)  # dups fd; the storage owns the dup
        except OSError as exc:
            if _is_fd_exhaustion(exc):
                raise _fd_limit_error(exc) from exc
            raise
        shared_cache[fd_id(fd)] = StorageWeakRef(storage)
        return storage
    finally:
        os.close(fd)


def rebuild_storage_filename(cls, manager, handle, size):
    storage = storage_from_cache(cls, handle)
    if storage is not None:
        return storage._shared_decref()  # we hold it already: just release the in-flight count
    try:
        storage = cls._new_shared_filename_cpu(manager, handle, size)  # +1 for us
    except NotAManagerError:
        raise  # a bad handle, not a reclaimed segment: its own message says so
    except (OSError, RuntimeError) as exc:
        name = handle.decode() if isinstance(handle, bytes) else str(handle)
        if os.path.exists(os.path.join(SHM_DIR, name.lstrip("/"))):
            raise  # the segment is there: the problem is elsewhere (say, its manager)
        raise FileNotFoundError(errno.ENOENT, _sender_gone(
            f"shared memory segment {name} is gone (its manager reclaimed it)")) from exc
    shared_cache[handle] = StorageWeakRef(storage)
    return storage._shared_decref()  # -1: the sender's in-flight count is handed over


def rebuild_storage_empty(cls):
    return cls()


def reduce_storage(storage):
    # The one place the strategy is read: at pickling time, in the sending process.
    from . import get_sharing_strategy

    if get_sharing_strategy() == FILE_SYSTEM:
        metadata = storage._share_filename_cpu_()  # (manager handle, name, nbytes)
        cache_key = metadata[1]
        rebuild = rebuild_storage_filename
        storage._shared_incref()  # held for the message in flight; the receiver releases it
    elif storage.nbytes() == 0:
        # Empty storages cannot be mmapped: they travel as "make an empty one".
        return (rebuild_storage_empty, (type(storage),))
    else:
        fd, size = storage._share_fd_cpu_()
        df = multiprocessing.reduction.DupFd(fd)  # a dup, sent over SCM_RIGHTS on request
        cache_key = fd_id(fd)
        metadata = (df, size)
        rebuild = rebuild_storage_fd

    shared_cache[cache_key] = StorageWeakRef(storage)
    return (rebuild, (type(storage),) + metadata)


def init_reductions():
    """Teach multiprocessing's pickler about shmlab's types (safe to call more than once)."""
    reduction.register(UntypedStorage, reduce_storage)
    reduction.register(Tensor, reduce_tensor)
