"""One connection to a manager daemon: REGISTER, FREE and STATUS over it, or WATCH its events.

Mirrors: torch/lib/libshm/socket.h (ClientSocket: register_allocation, register_deallocation)

A ManagerClient is one UNIX-socket connection from this process to one manager (observer.py's
`watch()` and `peek_status()` open connections of their own that never keep it alive). Which
manager a process talks to, and starting one, is `client.py`'s business.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator

from .peer import ManagerError, NotAManagerError, check_path, check_peer
from .protocol import MAX_STATUS_PAGE, parse_name

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

# Note [A slow reply is not "I left"]
# A request that gets no answer within REPLY_TIMEOUT_S raises ManagerError, as torch's does,
# but the connection stays open: closing it would tell the manager "this process left", and
# with the family's only client gone a stalled manager (SIGSTOP 2.2 s) would wake up, start
# its grace period and unlink segments that are still in use. Replies come back in the order
# of the requests (one line per REGISTER or STATUS, none for FREE or BYE), so we count the
# answers we stopped waiting for (`_owed`) and skip that many lines before reading the next
# answer: a late "OK" is never taken for the answer to a later request. torch keeps the fd
# too, but reads its late "OK" as the next answer (every answer is "OK", so it gets away with
# it). Only end of file or a reset closes the connection here; close() says BYE first, so
# the manager knows the difference between "left" and "dropped" (see liveness.py).

# Note [What a receiver tells the manager]
# torch's client sends a line for every attach and every close, and its C++ manager spends
# microseconds on each. Ours is Python: every line wakes it for a parse, an event and a log
# write, on the same cores the tensors are moving on, and a receiver's two lines per tensor
# were the largest cost of an already-shared file_system send after the refcount lock
# (docs/benchmarks.md). So a client sends only the lines that change what the manager knows:
#   * a new name: the creator's REGISTER, which waits for "OK" before the name is pickled;
#   * a process joining: its first line on a connection makes it a member (liveness.py);
#   * the FREE of the holder whose decref unlinked the file: the manager forgets the name.
# A receiver's REGISTER of a name its creator already registered, and the FREE of a holder
# that leaves others behind ("still exists, kept registered"), change nothing, so they are
# not sent. The one a receiver does send, `join(name)`, need not wait either: it cannot be
# overtaken (one connection's lines are served in order, an open connection alone holds off
# the reclaim, and lines sent before we die are still served), so its "OK" is counted as
# owed and skipped by the next request. (It used to be sent for every attach, its answer
# read at once without waiting: two ioctl()s to make the socket non-blocking and back, and a
# recv(), ~15 us a receive. The socket now keeps one timeout, REPLY_TIMEOUT_S.)


def _gone(handle: bytes, why: object) -> ManagerError:
    return ManagerError(
        f"the shmlab manager at {handle.decode(errors='replace')} is not answering ({why}); it "
        "exited, was killed or is stuck. Segments already mapped keep working, but no new "
        "file_system segment can be registered with it. Next: call "
        "shmlab.manager.client.reset() so the next allocation starts a fresh manager, or use "
        "the 'file_descriptor' strategy."
    )


def _slow(handle: bytes, line: str, why: object) -> ManagerError:
    return ManagerError(
        f"the shmlab manager at {handle.decode(errors='replace')} is not answering "
        f"{line.split()[0]} ({why}); it is stuck or very busy. The connection stays open and "
        "the manager keeps this process's segments while it lives, so the next request may "
        "well work. If it never recovers, shmlab.manager.client.reset() starts a fresh one."
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
    check_path(handle)  # see Note [Checking a handle before talking to it]
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(REPLY_TIMEOUT_S)
        try:
            sock.connect(handle)  # bytes: a forged handle need not be valid UTF-8
            check_peer(sock, handle)
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
        self._owed = 0  # replies to requests that timed out, still to come: skip them
        self._member = False  # this connection has sent REGISTER or FREE: the manager keeps us
        self._sock: socket.socket | None = _connect(handle)

    @property
    def closed(self) -> bool:
        return self._sock is None

    def register(self, name: str | bytes) -> None:
        """Tell the manager to reclaim `name` if this process family dies; waits for OK (1 s)."""
        reply = self._request(f"REGISTER {os.getpid()} {_bare(name)}")
        if reply != "OK":
            raise ManagerError(f"the manager refused to register {name!r}: {reply}")
        self._member = True

    def join(self, name: str | bytes) -> None:
        """A receiver attaching `name`, which its creator registered: become a member if we
        are not one yet, without waiting (see Note [What a receiver tells the manager])."""
        if not self._member:
            self._post(f"REGISTER {os.getpid()} {_bare(name)}")
            self._member = True

    def free(self, name: str | bytes) -> None:
        """Tell the manager we let go of `name` (no reply; silent if the manager is gone)."""
        line = f"FREE {os.getpid()} {_bare(name)}\n".encode()
        with self._lock:
            if self._sock is not None:
                try:
                    self._send_locked(line)
                    self._member = True
                except OSError:  # gone (see Note [When the manager is gone]) or stuck: a
                    self._close_locked()  # half-sent line cannot be taken back, so close;
                    # the manager keeps our segments while this process lives (liveness.py)

    def status(self, max_names: int | None = None) -> dict:
        """The manager's STATUS: pid, clients, members, observers, grace_s, count and
        segments: every registered name, sorted (or the first `max_names`), fetched a page
        at a time so no single answer is large (not atomic across pages)."""
        names: set[str] = set()
        offset = 0
        while True:
            want = MAX_STATUS_PAGE if max_names is None else min(MAX_STATUS_PAGE,
                                                                 max_names - len(names))
            page = json.loads(self._request(f"STATUS {offset} {max(want, 0)}"))
            names.update(page["segments"])
            offset = page["next"]
            if offset is None or (max_names is not None and len(names) >= max_names):
                break
        page["segments"] = sorted(names)
        return page

    def watch(self, timeout: float | None = None) -> Iterator[dict]:
        """Events from this client's manager, on a separate observer connection."""
        from .observer import watch  # observer.py imports this module

        return watch(self.handle, timeout)

    def close(self) -> None:
        """Say BYE and close the connection (safe twice): this process has left."""
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):  # best effort: never block, never raise
                    self._sock.setblocking(False)
                    self._sock.send(b"BYE\n")
            self._close_locked()

    def _close_locked(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock, self._buf, self._owed, self._member = None, b"", 0, False

    def _request(self, line: str) -> str:
        with self._lock:
            if self._sock is None:
                raise ManagerError("this ManagerClient is closed (by close(), or after its "
                                   "manager stopped answering): get_client(handle) reconnects; "
                                   "if that manager is gone, reset() starts a fresh one")
            deadline = time.monotonic() + REPLY_TIMEOUT_S
            try:
                self._send_locked(line.encode() + b"\n")
            except OSError as exc:  # TimeoutError too: part of the line may be out, so the
                self._close_locked()  # stream is no longer ours to use (see free())
                raise _gone(self.handle, exc) from exc
            try:
                self._owed += 1  # ours, until it has come (see Note [A slow reply ...])
                while True:
                    reply = self._readline(deadline)
                    self._owed -= 1
                    if self._owed == 0:
                        return reply
            except TimeoutError as exc:  # stalled or busy, not gone: stay connected
                raise _slow(self.handle, line, exc) from exc
            except OSError as exc:  # end of file or reset: the manager is gone
                self._close_locked()
                raise _gone(self.handle, exc) from exc

    def _post(self, line: str) -> None:
        """Send a request whose answer we do not wait for: skipped like a late one (`_owed`)."""
        with self._lock:
            if self._sock is None:
                raise ManagerError("this ManagerClient is closed: get_client(handle) reconnects")
            try:
                self._send_locked(line.encode() + b"\n")
            except OSError as exc:  # as in _request: a half-sent line ends this connection
                self._close_locked()
                raise _gone(self.handle, exc) from exc
            self._owed += 1

    def _send_locked(self, data: bytes) -> None:
        self._sock.sendall(data)  # under the socket's REPLY_TIMEOUT_S: a full buffer can't hang us

    def _readline(self, deadline: float) -> str:
        try:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no reply within {REPLY_TIMEOUT_S} s")
                self._sock.settimeout(left)
                chunk = self._sock.recv(4096)
                if not chunk:
                    raise ConnectionResetError("the manager closed the connection")
                self._buf += chunk
        finally:
            if self._sock is not None:
                self._sock.settimeout(REPLY_TIMEOUT_S)  # what _send_locked counts on
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("ascii", "replace")
