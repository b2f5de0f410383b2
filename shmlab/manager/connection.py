"""One connection to a manager daemon: REGISTER, FREE and STATUS over it, or WATCH its events.

Mirrors: torch/lib/libshm/socket.h (ClientSocket: register_allocation, register_deallocation)

A ManagerClient is one UNIX-socket connection from this process to one manager; `watch()` and
`peek_status()` open connections of their own that never keep the manager alive. Which
manager a process talks to, and starting one, is `client.py`'s business.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Iterator

from .protocol import DAEMON_MODULE, parse_name

REPLY_TIMEOUT_S = 1.0  # torch's ClientSocket waits 1000 ms for the manager's "OK"
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
        "shmlab.manager.client.reset() so the next allocation starts a fresh manager, or use "
        "the 'file_descriptor' strategy."
    )


class NotAManagerError(ManagerError):
    """The handle does not lead to a shmlab manager: nothing was sent over it."""


def _not_a_manager(handle: bytes, why: object) -> NotAManagerError:
    return NotAManagerError(
        f"{handle.decode(errors='replace')!r} is not a shmlab manager's socket ({why}), so "
        "nothing was sent to it: the manager handle in this message was forged or corrupted, "
        "or its path now belongs to something else. Check what the sender pickled, or use "
        "the 'file_descriptor' strategy, which needs no manager."
    )


# Note [Checking a handle before talking to it]
# A handle arrives inside a pickle, and REGISTER lines name our pid and our segments: they must
# reach a shmlab manager of our own user and nothing else. Before connecting, the path must be a
# socket owned by our uid; after connecting, SO_PEERCRED names the process listening there, which
# must have our uid and run `python -m shmlab.manager` (the daemon checks our uid the same way).
# A path that does not exist is let through to connect(), whose error says the manager is gone.
def _check_path(handle: bytes) -> None:
    try:
        st = os.lstat(handle)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL byte
        raise _not_a_manager(handle, exc) from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise _not_a_manager(handle, "not a socket")
    if st.st_uid != os.geteuid():
        raise _not_a_manager(handle, f"owned by uid {st.st_uid}, not by us ({os.geteuid()})")


def _check_peer(sock: socket.socket, handle: bytes) -> None:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    if uid != os.geteuid():
        raise _not_a_manager(handle, f"the process listening there runs as uid {uid}")
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:  # pid 0 (another pid namespace) or already gone
        argv = []
    script = DAEMON_MODULE.replace(".", "/") + "/__main__.py"
    if not any(a == DAEMON_MODULE or a.endswith(script) for a in argv):
        raise _not_a_manager(handle, f"the process listening there, pid {pid}, is not "
                                     f"`python -m {DAEMON_MODULE}`")


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
    _check_path(handle)  # see Note [Checking a handle before talking to it]
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(REPLY_TIMEOUT_S)
        try:
            sock.connect(handle)  # bytes: a forged handle need not be valid UTF-8
            _check_peer(sock, handle)
            return sock
        except BlockingIOError as exc:
            sock.close()
            if time.monotonic() > deadline:
                raise _gone(handle, exc) from exc
            time.sleep(0.01)
        except OSError as exc:
            sock.close()
            raise _gone(handle, exc) from exc
        except NotAManagerError:
            sock.close()
            raise


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
    must not keep a manager alive (see Note [Who keeps the manager alive] in daemon.py)."""
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
