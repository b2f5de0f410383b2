"""The command table of a child that holds tensors: make, send, receive, look at and drop them.

It is the far end of every experiment in notebooks 04 and 05, and the base of every family the
stress tool kills (``shmlab.testing.family`` adds the family's commands). Start one with
``Actor(holder.commands, lib, dataq[, strategy], ctx=ctx)``. ``dataq`` is a Queue of the same
context: tensors travel on it between two holders, never in the commands (so what crosses is
exactly what a Queue carries).

Note [Why one long-lived holder instead of one worker per step]
A notebook step wants to stop *between* two actions of a child (after it made a tensor,
before it sends it) and look at /dev/shm, /proc/<pid>/fd and the refcount header. A child
that runs one command at a time and answers each one gives those pauses. It also keeps the
notebook fast under ``spawn``: every spawned child imports torch again (seconds), so a
notebook starts a few holders once and reuses them for every step.

Note [Counting the fds that arrive over SCM_RIGHTS]
Both libraries receive a file_descriptor tensor's fd the same way: ``DupFd.detach()`` ->
``reduction.recv_handle()`` -> ``reduction.recvfds()``, which ``recv_handle`` looks up in its
module at each call. Wrapping that one function is the only place that sees every arrival, of
either library, without changing either: /proc shows which fds a process has, not how they
came. ``commands()`` installs the wrapper once per process (``FdArrivals.install``); it only
counts, and ``fds`` reports the count.
"""

from __future__ import annotations

import gc
import os
import resource
from multiprocessing import reduction

from ..introspect import managers
from .libs import fd_count, load


def child_managers(pid: int | None = None) -> list[int]:
    """Manager daemons (torch's or shmlab's) whose parent is ``pid`` (default: us)."""
    pid = os.getpid() if pid is None else pid
    return [m.pid for m in managers() if m.ppid == pid]


class FdArrivals:
    """How many times this process received fds over SCM_RIGHTS (Note [Counting the fds])."""

    calls = 0
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        real = reduction.recvfds

        def counting_recvfds(sock, size):
            cls.calls += 1
            return real(sock, size)

        reduction.recvfds, cls._installed = counting_recvfds, True


def shm_links() -> list[dict]:
    """This process's fds on /dev/shm: number, link text, and the inode they point at."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("/dev/shm/"):
                st = os.stat(int(fd))
                found.append({"fd": int(fd), "link": link, "ino": st.st_ino, "dev": st.st_dev})
        except OSError:  # the fd listing itself, closed meanwhile
            pass
    return sorted(found, key=lambda d: d["fd"])


def fd_report() -> dict:
    """The ``fds`` reply of a holder or worker child: its fd total, its fds on /dev/shm and how
    many times it called ``recvfds`` (Note [Counting the fds that arrive over SCM_RIGHTS])."""
    links = shm_links()
    return {"total": fd_count(), "shm": len(links), "links": links,
            "recvfds_calls": FdArrivals.calls}


def describe(t, strategy: str) -> dict:
    """Where a shared tensor's bytes live; under file_system also its segment name.

    Only asked under file_system: ``_share_filename_cpu_()`` on an fd-shared storage would
    move it into a new named segment, which is not a question but a change.
    """
    s = t.untyped_storage()
    info = {"data_ptr": s.data_ptr(), "nbytes": s.nbytes(), "first": float(t.numpy()[0]),
            "name": None}
    if strategy == "file_system":  # (manager socket, b"/torch_..." or b"/shmlab_...", nbytes)
        manager, name, size = s._share_filename_cpu_()
        info.update(manager=manager, name=name.decode().lstrip("/"), size=size)
    return info


def segment(t, strategy: str) -> tuple[str, str] | None:
    """(manager handle, bare name) of a file_system tensor, or None (file_descriptor)."""
    if strategy != "file_system":
        return None
    manager, name, _ = t.untyped_storage()._share_filename_cpu_()  # see describe(): a question
    return manager.decode(), name.decode().lstrip("/")


class Holder:
    """What one holder child keeps: tensors by key, and the limits it started with."""

    def __init__(self, lib: str, dataq, strategy: str | None):
        self.lib, self.dataq = lib, dataq
        self.tlib, self.mp = load(lib)
        if strategy is not None:
            self.mp.set_sharing_strategy(strategy)
        self.held: dict[str, list] = {}
        self.nofile = resource.getrlimit(resource.RLIMIT_NOFILE)  # to set it back

    strategy = property(lambda self: self.mp.get_sharing_strategy())

    def tensors(self, key: str) -> list:  # the list under key, made if new
        return self.held.setdefault(key, [])

    def full(self, numel: int, value: float):
        """A new private float32 tensor of ``numel`` elements, all ``value``."""
        import numpy as np

        return self.tlib.from_numpy(np.full(numel, float(value), np.float32))

    # -- keyed commands (notebooks 04 and 05) ----------------------------------------------
    def set_strategy(self, name):
        self.mp.set_sharing_strategy(name)
        return self.strategy

    def set_nofile(self, soft):
        soft = self.nofile[0] if soft is None else soft
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, self.nofile[1]))
        return resource.getrlimit(resource.RLIMIT_NOFILE)

    def make(self, key, count, numel):
        self.held[key] = [self.full(numel, i).share_memory_() for i in range(count)]
        return describe(self.held[key][0], self.strategy)

    def send(self, key, times=1):
        for _ in range(times):
            for t in self.held[key]:
                self.dataq.put(t)
        return len(self.held[key]) * times

    def recv(self, key, count):
        got, error = self.tensors(key), None
        try:
            for _ in range(count):
                got.append(self.dataq.get(timeout=60))
        except Exception as exc:  # noqa: BLE001 - the point is to report what stopped us
            error = (type(exc).__name__, str(exc))
        return {"received": len(got), "error": error}

    def drop(self, key):  # tensors hold no cycles: the last reference going frees them at once
        self.held.pop(key, None)  # (no gc.collect(): with torch loaded it takes ~0.4 s)
        return sorted(self.held)

    def attach(self, key, manager, name, size):
        import numpy as np

        storage = self.tlib.UntypedStorage._new_shared_filename_cpu(manager, name, size)
        if self.lib == "torch":  # a float32 tensor over the whole storage, as the sender made it
            t = self.tlib.empty(0, dtype=self.tlib.float32).set_(storage)
        else:
            t = self.tlib.Tensor(storage, 0, (size // 4,), (1,), np.dtype("float32"))
        self.held[key] = [t]
        return {"data_ptr": storage.data_ptr(), "nbytes": storage.nbytes()}

    def handle(self, key):
        return describe(self.held[key][0], self.strategy)

    def ptrs(self, key):  # equal pointers: one shared storage
        return [t.untyped_storage().data_ptr() for t in self.held[key]]

    def shared(self, key):  # notebook 13: is_shared() at this end, and the bytes behind it
        return [(t.is_shared(), t.untyped_storage().nbytes()) for t in self.held[key]]

    def write(self, key, value):
        for t in self.held[key]:
            t.numpy().reshape(-1)[0] = value
        return value

    def fds(self):
        return fd_report()

    def release(self):  # "exit": let go of everything held before the child ends
        self.held.clear()
        gc.collect()
        return {}


def commands(lib: str, dataq, strategy: str | None = None) -> dict:
    """The holder's command table (run in the child by ``Actor``; ``strategy``: set it first).

    Keyed commands (notebooks 04 and 05); KEY names a list of tensors held here:

    =============  ========================  ===============================================
    name           arguments                 reply
    =============  ========================  ===============================================
    strategy       NAME                      the sharing strategy now in force
    nofile         SOFT or None              getrlimit(NOFILE), soft limit set (None: reset)
    make           KEY, COUNT, NUMEL         ``handle KEY``; makes COUNT float32
                                             tensors, the i-th full of i, shared, kept
    send           KEY, TIMES=1              how many were put on dataq (each, TIMES over)
    recv           KEY, COUNT                {"received", "error"}; keeps what came before
                                             the first error
    drop           KEY                       the keys still held (freed at once, no gc)
    handle         KEY                       {"data_ptr", "nbytes", "first", "name"} of the
                                             first (+ "manager", "size" under file_system)
    attach         KEY, MANAGER, NAME, SIZE  {"data_ptr", "nbytes"}; maps a file_system
                                             segment by its name alone
    ptrs           KEY                       the data pointer of each tensor of KEY
    shared         KEY                       (is_shared(), nbytes) of each tensor of KEY
    write          KEY, VALUE                VALUE, written at [0] of each tensor of KEY
    fds            -                         {"total", "shm", "links", "recvfds_calls"}
    =============  ========================  ===============================================

    exit           -                         None; then everything held is let go

    ``shmlab.testing.family.commands`` adds the stress family's commands to this table.
    """
    FdArrivals.install()
    return table(Holder(lib, dataq, strategy))


def table(h: Holder) -> dict:
    """The keyed commands of a holder ``h`` (a subclass adds its own to this dict)."""
    return {
        "strategy": h.set_strategy, "nofile": h.set_nofile, "make": h.make, "send": h.send,
        "recv": h.recv, "drop": h.drop, "handle": h.handle, "attach": h.attach,
        "ptrs": h.ptrs, "shared": h.shared, "write": h.write, "fds": h.fds, "exit": h.release,
    }
