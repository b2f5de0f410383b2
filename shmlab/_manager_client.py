"""Talk to the shm manager daemon: start it lazily, register and free segment names.

Mirrors: torch/lib/libshm/core.cpp (start_manager, get_manager_socket, THManagedMapAllocator)

One connection per manager per process. `get_client()` with no handle returns this process's
default manager, starting `python -m shmlab.manager` on first use; `get_client(handle)`
connects to the manager a sender named in its pickle. A fork child inherits the parent's
default manager but opens its own connection, so the manager sees every process separately.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

from ._manager_protocol import parse_name

REPLY_TIMEOUT_S = 1.0  # torch's ClientSocket waits 1000 ms for the manager's "OK"
START_TIMEOUT_S = 30.0  # a cold Python start on a loaded machine can take seconds
CONNECT_TIMEOUT_S = 5.0  # how long a full listen queue may keep us waiting

# Note [When the manager is gone]
# A killed manager (SIGKILL, OOM killer) cannot be brought back under the same handle: the
# handle is its socket path, already pickled into messages in flight, and a fresh daemon would
# not know the names the old one had registered. So, like torch, we do NOT restart silently:
#   * segments already mapped keep working (file_system keeps no fd; nothing gets unlinked);
#   * `free()` is best effort and stays silent (a finalizer must not raise);
#   * `register()`, `status()` and connecting raise ManagerError, which says what to do next:
#     `reset()` forgets the dead manager so the next allocation starts a fresh one (names the
#     old one held will not be reclaimed: remove /dev/shm/shmlab_* of dead processes by hand).
# A restart would hide exactly the fact the lab teaches: the leak cleaner is no longer watching.


class ManagerError(RuntimeError):
    """The manager could not be started, reached, or refused a request."""


def _gone(handle: bytes, why: object) -> ManagerError:
    return ManagerError(
        f"the shmlab manager at {handle.decode(errors='replace')} is not answering ({why}); it "
        "exited, was killed or is stuck. Segments already mapped keep working, but no new "
        "file_system segment can be registered with it. Next: call "
        "shmlab._manager_client.reset() so the next allocation starts a fresh manager, or use "
        "the 'file_descriptor' strategy."
    )


def _bare(name: str | bytes) -> str:
    """'/shmlab_1_2_3' or b'shmlab_1_2_3' -> 'shmlab_1_2_3'; ValueError for anything else."""
    if isinstance(name, bytes):
        name = name.decode("ascii", "replace")
    if not isinstance(name, str):
        raise TypeError(f"segment name must be str or bytes, got {type(name).__name__}")
    return parse_name(name)


def _connect(handle: bytes) -> socket.socket:
    # A UNIX socket whose listen queue is full answers EAGAIN at once instead of waiting
    # (a burst of processes connecting together): try again for a while before giving up.
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(REPLY_TIMEOUT_S)
        try:
            sock.connect(handle.decode())
            return sock
        except BlockingIOError as exc:
            sock.close()
            if time.monotonic() > deadline:
                raise _gone(handle, exc) from exc
            time.sleep(0.01)
        except OSError as exc:
            sock.close()
            raise _gone(handle, exc) from exc


class ManagerClient:
    """This process's connection to one manager; thread-safe (a Queue feeder thread pickles)."""

    def __init__(self, handle: bytes):
        if not isinstance(handle, bytes):
            raise TypeError(f"manager handle must be bytes (a socket path), got {handle!r}")
        self.handle = handle
        self._lock = threading.Lock()
        self._buf = b""
        self._sock: socket.socket | None = _connect(handle)

    @property
    def closed(self) -> bool:
        return self._sock is None

    def register(self, name: str | bytes) -> None:
        """Tell the manager to reclaim `name` if this process family dies; waits for OK (1 s)."""
        reply = self._request(f"REGISTER {os.getpid()} {_bare(name)}")
        if reply != "OK":
            raise ManagerError(f"the manager refused to register {name!r}: {reply}")

    def free(self, name: str | bytes) -> None:
        """Tell the manager we let go of `name` (no reply; silent if the manager is gone)."""
        line = f"FREE {os.getpid()} {_bare(name)}\n".encode()
        with self._lock:
            if self._sock is not None:
                try:
                    self._sock.sendall(line)
                except OSError:
                    self._close_locked()  # see Note [When the manager is gone]

    def status(self) -> dict:
        """The manager's STATUS: pid, clients, observers, segments, grace_s."""
        return json.loads(self._request("STATUS"))

    def watch(self, timeout: float | None = None) -> Iterator[dict]:
        """Events from this client's manager, on a separate observer connection."""
        return watch(self.handle, timeout)

    def close(self) -> None:
        """Close the connection (safe twice). The manager counts us as gone."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock, self._buf = None, b""

    def _request(self, line: str) -> str:
        with self._lock:
            if self._sock is None:
                raise ManagerError("this ManagerClient is closed (by close(), or after its "
                                   "manager stopped answering): get_client(handle) reconnects; "
                                   "if that manager is gone, reset() starts a fresh one")
            try:
                self._sock.sendall(line.encode() + b"\n")
                return self._readline(REPLY_TIMEOUT_S)
            except OSError as exc:  # includes TimeoutError; a late reply would desync us
                self._close_locked()
                raise _gone(self.handle, exc) from exc

    def _readline(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply within {timeout} s")
            self._sock.settimeout(left)
            chunk = self._sock.recv(4096)
            if not chunk:
                raise ConnectionResetError("the manager closed the connection")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("ascii", "replace")


def watch(handle: bytes, timeout: float | None = None) -> Iterator[dict]:
    """Subscribe now, then yield the manager's events (dicts) until it exits (end of file).

    An observer never keeps the manager alive. We send STATUS right after WATCH and wait for
    its answer, so when this returns no later event can be missed. `timeout` bounds each wait
    for an event (TimeoutError), so a widget or a test cannot hang on a quiet manager.
    """
    sock = _connect(handle)
    reader = sock.makefile("rb")  # the fd really closes once both reader and sock are closed
    try:
        sock.sendall(b"WATCH\nSTATUS\n")
        early = []  # events that raced ahead of the STATUS answer
        for line in reader:
            message = json.loads(line)
            if "event" not in message:
                break  # the STATUS answer: we are subscribed
            early.append(message)
        sock.settimeout(timeout)
    except OSError as exc:
        reader.close()
        sock.close()
        raise _gone(handle, exc) from exc
    return _follow(sock, reader, early)


def _follow(sock: socket.socket, reader, early: list[dict]) -> Iterator[dict]:
    try:
        yield from early
        for line in reader:
            yield json.loads(line)
    finally:
        reader.close()
        sock.close()


def peek_status(handle: bytes) -> dict:
    """STATUS on a fresh connection that is closed at once: for probes and widgets, which
    must not keep a manager alive (see Note [Who keeps the manager alive] in manager.py)."""
    sock = _connect(handle)
    try:
        sock.sendall(b"STATUS\n")
        with sock.makefile("rb") as reader:
            line = reader.readline()
    except OSError as exc:
        raise _gone(handle, exc) from exc
    finally:
        sock.close()
    if not line.startswith(b"{"):  # e.g. "ERR too many connections"
        raise ManagerError(f"the manager refused STATUS: {line.decode(errors='replace')!r}")
    return json.loads(line)


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
# fork child that never execs keeps every fd. Measured (tests/fork_race.py): the child kept
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
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    # stderr goes nowhere: an inherited pipe would keep e.g. subprocess.run(capture_output=True)
    # of our starter waiting until the daemon exits. Failures come back on the handshake line.
    with _start_lock:  # see Note [Forking while the first share is in flight]
        proc = subprocess.Popen([sys.executable, "-m", "shmlab.manager"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env)
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
        f"Run `{sys.executable} -m shmlab.manager` in a terminal to see why, check "
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
