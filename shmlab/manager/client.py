"""This process's managers: start the daemon lazily, keep one client per manager, forget on fork.

Mirrors: torch/lib/libshm/core.cpp (start_manager, get_manager_socket, the `managers` map)

One connection per manager per process. `get_client()` with no handle returns this process's
default manager, starting `python -m shmlab.manager` on first use; `get_client(handle)`
connects to the manager a sender named in its pickle. A fork child inherits the parent's
default manager but opens its own connection, so the manager sees every process separately.
The connection itself (ManagerClient, ManagerError) is `connection.py`, watch and peek_status
`observer.py`; their names are re-exported here, so `shmlab.manager.client` is the one name
callers import.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import threading
import time

import shmlab

from .connection import ManagerClient, ManagerError, NotAManagerError
from .observer import peek_status, watch
from .protocol import DAEMON_MODULE

__all__ = ["ManagerClient", "ManagerError", "NotAManagerError", "get_client", "peek_status",
           "reset", "watch"]

START_TIMEOUT_S = 30.0  # a cold Python start on a loaded machine can take seconds

# -- the per-process table (torch: the `managers` map in core.cpp) -----------------------------
_lock = threading.Lock()
_clients: dict[bytes, ManagerClient] = {}
_default: bytes | None = None  # the first manager this process (or its fork parent) knew
_started: list[subprocess.Popen] = []  # managers we started, reaped once they exit

# Note [Forking while the first share is in flight] (the manager half; see storage.py)
# The first file_system share usually runs in a Queue's feeder thread, so the manager is
# started there while the main thread may fork (Process.start() right after q.put()). Popen
# opens two pipes in this process: its exec-error pipe (EOF once the manager has exec'd) and
# our handshake pipe. O_CLOEXEC, close_fds and pass_fds do not help: they act at exec, and a
# fork child that never execs keeps every fd. Measured (tests/core/fork_race.py): the child kept
# the error pipe's write end, so the feeder's `os.read` in Popen._execute_child waited for the
# child to exit, the child waited in q.get() for the message the feeder was pickling, and
# when the child was finally killed the manager's grace (nobody had connected for 2 s) was
# over: `ManagerError ... not answering (ENOENT)`, the message dropped.
# So a fork waits for a manager start in progress: `_start_lock` is held from Popen to the
# end of the handshake, and an os.register_at_fork `before` hook takes it too (released in
# the parent after the fork; the child gets a fresh one). A fork child therefore never holds
# a half-started manager's pipes; it sees no manager or a started one. This is what torch
# gets for free: its start_manager runs in C++ under the GIL, so the main thread cannot fork
# (or run at all) meanwhile. Only forks wait, once per process, for ~0.1-1 s; other threads
# keep running, by choice: a pure-Python start cannot hold the GIL, and stalling every thread
# would buy nothing but torch's timing. (So upstream's test_fs, which sleeps 0.05 s after the
# first put and expects the segment file, is early on shmlab; the port polls for it.)
# It is an RLock so that a fork from the starting thread itself cannot deadlock.
_start_lock = threading.RLock()


def get_client(handle: bytes | None = None) -> ManagerClient:
    """The client for `handle`, or for this process's default manager (started lazily)."""
    global _default
    with _lock:
        if handle is None:
            handle = _default if _default is not None else _start_manager()
        client = _clients.get(handle)
        if client is None or client.closed:
            client = _clients[handle] = ManagerClient(handle)
        if _default is None:
            _default = handle
        return client


def reset(handle: bytes | None = None) -> None:
    """Close and forget one manager's client (or all); the next allocation starts afresh."""
    global _default
    with _lock:
        for key in [handle] if handle is not None else list(_clients):
            client = _clients.pop(key, None)
            if client is not None:
                client.close()
        if handle is None or handle == _default:
            _default = None
        _started[:] = [p for p in _started if p.poll() is None]


def _start_manager() -> bytes:
    """Start `python -m shmlab.manager` and read its one handshake line (torch: start_manager)."""
    _started[:] = [p for p in _started if p.poll() is None]  # reap managers that exited
    env = dict(os.environ)  # make sure the daemon imports this very shmlab
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(shmlab.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    # stderr goes nowhere: an inherited pipe would keep e.g. subprocess.run(capture_output=True)
    # of our starter waiting until the daemon exits. Failures come back on the handshake line.
    with _start_lock:  # see Note [Forking while the first share is in flight]
        proc = subprocess.Popen([sys.executable, "-m", DAEMON_MODULE], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        try:
            line = _read_handshake(proc.stdout.fileno(), START_TIMEOUT_S)
        finally:
            proc.stdout.close()
    if line and not line.startswith("ERROR"):
        _started.append(proc)
        return line.encode()
    if not line:
        proc.kill()
    rc = proc.wait()
    raise ManagerError(
        f"could not start the shmlab manager ({line or f'no handshake, exit code {rc}'}). "
        f"Run `{sys.executable} -m {DAEMON_MODULE}` in a terminal to see why, check "
        "SHMLAB_MANAGER_GRACE and TMPDIR, or use the 'file_descriptor' strategy."
    )


def _read_handshake(fd: int, timeout: float) -> str:
    """Read up to the first newline (the socket path or `ERROR: ...`); '' on EOF or timeout."""
    data, deadline = b"", time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return ""
            chunk = os.read(fd, 1024)
            if not chunk:
                return ""
            data += chunk
    return data.decode(errors="replace").strip()


def _before_fork() -> None:
    _start_lock.acquire()  # wait for a manager start in progress (the Note above)


def _after_fork_in_parent() -> None:
    _start_lock.release()


def _after_fork_in_child() -> None:
    # The child must not talk over its parent's sockets (replies would go to the wrong reader)
    # nor keep them open (the manager would think the parent still lives). Close our copies;
    # the parent's connections are untouched. _default stays: fork children reuse the manager.
    global _lock, _start_lock
    _lock = threading.Lock()  # another thread may have held the old one at fork time
    _start_lock = threading.RLock()  # held by the forking thread, which the child does not run
    for client in _clients.values():
        if client._sock is not None:
            client._sock.close()
            client._sock = None
    _clients.clear()
    _started.clear()  # not our children: we could not wait for them


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
