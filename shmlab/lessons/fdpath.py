"""Which channel carries a shared tensor's fd, for each start method and after start-up.

Notebook 04 (claims C12.1 and C12.7). ``traced()`` wraps, in this process only, the places
where CPython's multiprocessing can let an fd go, and records each call; ``fd_path`` starts
one child with a shared tensor as its ``Process`` argument under one start method and says
which of those places the fd went through. ``segment_bytes`` measures one segment's memory
through whatever still holds it, in any process.

Mirrors: CPython multiprocessing/popen_fork.py (nothing pickled), popen_spawn_posix.py
(``duplicate_for_child`` -> ``util.spawnv_passfds``), popen_forkserver.py + forkserver.py
(``duplicate_for_child`` -> ``reduction.sendfds`` to the server), resource_sharer.py
(``DupFd`` outside start-up: a listener thread, one UNIX connection per fd).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from multiprocessing import popen_forkserver, popen_spawn_posix, reduction, resource_sharer, util

from ..harness.libs import new_tensor
from . import channels


@contextlib.contextmanager
def traced():
    """Record, until the block ends, every pickled start-up object (``reduction.dump``),
    ``duplicate_for_child`` fd, ``pass_fds`` list of a fork+exec, ``sendfds`` list
    (SCM_RIGHTS) and ``resource_sharer`` registration in this process."""
    seen = {"pickled": [], "duplicate_for_child": [], "pass_fds": [], "sendfds": [],
            "resource_sharer": 0}
    sharer = resource_sharer._resource_sharer  # the process-wide listener of DupFd

    def wrap(owner, name, record):
        original = getattr(owner, name)

        def traced_call(*args, **kwargs):
            record(*args)
            return original(*args, **kwargs)
        setattr(owner, name, traced_call)
        return owner, name, original

    def dup_for_child(popen, fd):
        seen["duplicate_for_child"].append(fd)

    def registered(*_):
        seen["resource_sharer"] += 1

    patches = [
        wrap(reduction, "dump", lambda obj, *_: seen["pickled"].append(type(obj).__name__)),
        wrap(popen_spawn_posix.Popen, "duplicate_for_child", dup_for_child),
        wrap(popen_forkserver.Popen, "duplicate_for_child", dup_for_child),
        wrap(util, "spawnv_passfds", lambda path, args, fds: seen["pass_fds"].append(list(fds))),
        wrap(reduction, "sendfds", lambda sock, fds: seen["sendfds"].append(list(fds))),
        wrap(sharer, "register", registered),
    ]
    try:
        yield seen
    finally:
        for owner, name, original in reversed(patches):
            if owner is sharer:
                del sharer.register  # back to the class's method
            else:
                setattr(owner, name, original)


def fd_path(method: str, lib: str = "torch", value: float = 5.0) -> dict:
    """Start one ``method`` child with a shared tensor as its Process argument; the child
    writes ``value`` at [0]. Report what ``traced()`` saw, the storage's fd, the exit code
    and what the parent reads back at [0]."""
    t = new_tensor(lib, [0.0, 0.0]).share_memory_()
    fd = storage_fd(t)
    if method == "forkserver":  # start the server first: its own launch is not the child's
        from multiprocessing import forkserver
        forkserver.ensure_running()
    ctx = multiprocessing.get_context(method)
    with traced() as seen:
        p = ctx.Process(target=channels.pool_write, args=(t, value), daemon=True)
        p.start()
        p.join(120)
    return {**seen, "fd": fd, "exitcode": p.exitcode, "seen": float(t.numpy()[0])}


def storage_fd(t) -> int:
    """The fd a file_descriptor-shared tensor's storage keeps (torch or shmlab)."""
    storage = t.untyped_storage()
    if hasattr(storage, "_share_fd_cpu_"):  # torch
        return storage._share_fd_cpu_()[0]
    return storage.fd  # shmlab


def after_start_up(lib: str = "torch") -> dict:
    """Pickle a shared tensor outside any Process start-up, as ``Queue.put``'s feeder thread
    does, then receive it here: the fd goes through ``resource_sharer``."""
    from multiprocessing.reduction import ForkingPickler

    t = new_tensor(lib, [0.0, 0.0]).share_memory_()
    with traced() as seen:
        msg = ForkingPickler.dumps(t)
        back = ForkingPickler.loads(msg)  # connects to the listener: SCM_RIGHTS over AF_UNIX
    address = resource_sharer._resource_sharer._address
    back.numpy()[0] = 3.0
    return {**seen, "address": address, "unix": isinstance(address, str) and
            os.path.exists(address), "message bytes": len(msg), "seen": float(t.numpy()[0])}


def fds_on(ino: int) -> int:
    """How many of this process's fds point at the file with inode ``ino``."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.stat(f"/proc/self/fd/{name}").st_ino == ino
    return count


def pending_dups() -> int:
    """fds ``resource_sharer`` holds for messages nobody has received yet."""
    return len(resource_sharer._resource_sharer._cache)


def settled_fds_on(ino: int, timeout: float = 5.0) -> int:
    """``fds_on(ino)`` once it reaches 0 or ``timeout`` passes: resource_sharer's thread closes
    its dup just *after* sending it, so right after a receive the count can still be 1."""
    import time

    deadline = time.monotonic() + timeout
    while (n := fds_on(ino)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return n


def segment_bytes(ino: int, dev: int) -> int:
    """Bytes of memory the segment ``(ino, dev)`` still has (its tmpfs pages, ``st_blocks``),
    read through any fd or mapping that some process we may read holds on it; 0 once none
    does: the kernel frees an unlinked segment with its last reference.

    One segment's memory, unlike ``/dev/shm``'s used space (statvfs), which moves whenever
    any other program on the machine makes or drops shared memory.
    """
    where = f"{os.major(dev):02x}:{os.minor(dev):02x} {ino} "  # as /proc/<pid>/maps writes it
    pids = [str(os.getpid())] + [p for p in os.listdir("/proc") if p.isdigit()]  # us first
    for pid in pids:
        for path in _references(pid, where):
            with contextlib.suppress(OSError):  # closed, unmapped or exited meanwhile
                st = os.stat(path)
                if (st.st_ino, st.st_dev) == (ino, dev):
                    return st.st_blocks * 512
    return 0


def _references(pid: str, where: str):
    """Paths through which ``pid`` reaches shared memory: its /dev/shm fds, then its mappings of the
    file ``where`` ("dev inode ") names (a mapping outlives a closed fd: map_files/)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or another user's process
        fds = []
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                yield f"/proc/{pid}/fd/{fd}"  # only shm fds are stat'ed: never a slow file
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/maps") as maps:
            hits = [line.split()[0] for line in maps if where in line]
        for span in hits:
            yield f"/proc/{pid}/map_files/{span}"
