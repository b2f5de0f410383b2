"""This process's connections to shm managers: one client per manager, started lazily.

Mirrors: torch/lib/libshm/core.cpp (start_manager, get_manager_socket, the `managers` map)
and socket.h (ClientSocket: register_allocation, register_deallocation)

Client side. Three parts, in this order:
  * ManagerClient: one UNIX-socket connection from this process to one manager, which keeps
    the manager serving while it is open: REGISTER, FREE, STATUS over it;
  * watch() and peek_status(): connections that observe a manager and never keep it alive
    (extensions: torch_shm_manager has no events and no STATUS);
  * the per-process table: `get_client()` with no handle returns this process's default
    manager, starting `python -m shmlab.manager` on first use; `get_client(handle)` connects
    to the manager a sender named in its pickle. A fork child inherits the parent's default
    manager but opens its own connection, so the manager sees every process separately.
What a handle must be before we talk to it is peer.py; the exceptions are errors.py; the
daemon at the other end is daemon.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

from .errors import ManagerError, NotAManagerError
from .peer import check_path, check_peer
from .protocol import DAEMON_MODULE, MAX_STATUS_PAGE, STATUS_PAGE, parse_name

__all__ = ["ManagerClient", "get_client", "peek_status", "reset", "watch"]

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

# Note [A request Ctrl-C cannot split]
# A KeyboardInterrupt is raised in the main thread at almost any point: between bytecodes
# where the interpreter checks for signals (calls, loop back-edges), and inside the one
# blocking call, the poll() in _wait(), that the signal interrupts. So it can cut a request
# anywhere:
# half a line sent, a reply read but not counted, `_owed` one off. From
# then on every answer would be taken for the wrong request. torch cannot be cut (its request
# runs in C++, which holds off Python's signal handler until it returns). We cannot hold off
# signals from every thread (signal.signal works only in the main thread, and deferring needs
# two system calls per request on the hot path), so we do the other thing: `_torn` is set
# before an exchange touches the stream and cleared once the stream is in step again, and a
# request that finds it set drops the connection and opens a fresh one first. Whatever the
# interrupt cut (a half line, an unread or uncounted reply) goes with the old connection.
# Dropping is safe for data: the manager serves every complete line of a closed connection,
# ignores a half one, and keeps a member that closed without BYE for as long as its process
# lives (liveness.py, Note [A dropped connection is not a dead process]), so nothing we
# registered can be reclaimed meanwhile. The cost on the hot path is a few attribute stores
# per request; an interrupted client pays one reconnect, on its next request.

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
# owed and skipped by the next request.

# Note [Wait only when the socket says so]
# A Python socket with a timeout polls before every send() and recv() (CPython's
# sock_call_ex: a poll(), then the send() or recv(); strace shows poll, then sendto or
# recvfrom), even when the line fits in the buffer or the reply is already there, as it
# often is: the manager answers while the creator makes the segment. A fresh file_system
# share makes three such calls (REGISTER out, "OK" in, later the FREE), and the timeout
# socket's settimeout() around the read added two ioctl()s. torch's client writes its
# blocking fd at once (no timeout: a stalled manager can block it for ever) and polls up to
# 1000 ms before each read of the "OK". So a ManagerClient's socket is non-blocking after
# connect(): it sends and reads at once, and polls, up to REPLY_TIMEOUT_S as before, only
# when the kernel answers EAGAIN (a full buffer: the manager is stalled; no reply yet, which
# costs one recv() more than polling first). MSG_NOSIGNAL: a manager gone away is an EPIPE,
# never a SIGPIPE. CPython ignores SIGPIPE at start-up, so this matters in a program that
# puts back the default action (a command-line tool piped into `head`) or handles it.


def _gone(handle: bytes, why: object) -> ManagerError:
    return ManagerError(
        f"the shmlab manager at {handle.decode(errors='replace')} is not answering ({why}): it "
        "exited, was killed or is stuck, so no new file_system segment can be registered with "
        "it (segments already mapped keep working). Fix: call shmlab.manager.client.reset(); "
        "the next file_system allocation starts a fresh manager."
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


def _connect_nonblocking(handle: bytes) -> socket.socket:
    """A ManagerClient's socket: connected and checked, then non-blocking for good (Note
    [Wait only when the socket says so])."""
    sock = _connect(handle)
    sock.setblocking(False)
    return sock


class ManagerClient:
    """This process's connection to one manager; thread-safe (a Queue feeder thread pickles)."""

    def __init__(self, handle: bytes):
        if not isinstance(handle, bytes):
            raise TypeError(f"manager handle must be bytes (a socket path), got {handle!r}")
        self.handle = handle
        # Reentrant: a garbage collection anywhere inside a request (register's while_waiting
        # makes a segment; any allocation can trigger one) can run a storage's finalizer on
        # this very thread, and its free() must not wait for ourselves. It must not touch the
        # stream either (the request may be half-way through a line or a reply): it leaves its
        # line in `_deferred`, sent when the outermost request is done.
        self._lock = threading.RLock()
        self._busy = 0  # requests of this thread in progress (nested through a finalizer)
        self._deferred: list[bytes] = []  # FREE lines from finalizers run inside a request
        self._buf = b""
        self._owed = 0  # replies to requests that timed out, still to come: skip them
        self._member = False  # this connection has sent REGISTER or FREE: the manager keeps us
        self._torn = False  # an exchange was cut (Ctrl-C): reconnect first (Note [A request ...])
        self._sock: socket.socket | None = _connect_nonblocking(handle)

    @property
    def closed(self) -> bool:
        return self._sock is None

    def register(self, name: str | bytes,
                 while_waiting: Callable[[], object] | None = None) -> None:
        """Tell the manager to reclaim `name` if this process family dies; waits for OK (1 s).

        `while_waiting`, if given, runs once the line is sent and before the reply is read,
        so its work overlaps the manager's (the creator makes the segment meanwhile: Note
        [Making the segment while the manager registers it] in storage.py). If it raises,
        the reply is left owed (skipped by the next request) and its exception goes on."""
        reply = self._request(f"REGISTER {os.getpid()} {_bare(name)}", while_waiting)
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
            if self._busy:  # a finalizer inside our own request, on this thread: see __init__
                self._deferred.append(line)
                return
            with self._one_exchange():  # a finalizer run while this line waits in _wait()
                self._free_locked(line)  # defers its own, instead of cutting in mid-line

    def _free_locked(self, line: bytes) -> None:
        try:
            self._in_step_locked()
        except ManagerError:
            return  # closed, or gone: nothing to tell
        self._torn = True  # see Note [A request Ctrl-C cannot split]
        try:
            self._send_locked(line)
            self._member = True
        except OSError:  # gone (see Note [When the manager is gone]) or stuck: a
            self._close_locked()  # half-sent line cannot be taken back, so close;
            # the manager keeps our segments while this process lives (liveness.py)
            return
        self._torn = False

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
        """Events from this client's manager, on a separate observer connection (`watch`)."""
        return watch(self.handle, timeout)

    def close(self) -> None:
        """Say BYE and close the connection (safe twice): this process has left."""
        with self._lock:
            # After a cut exchange a BYE could end up glued to half a line: close without it,
            # and the manager keeps this process's segments until it exits (liveness.py).
            if self._sock is not None and not self._torn:
                with contextlib.suppress(OSError):  # best effort: never block, never raise
                    self._sock.send(b"BYE\n", socket.MSG_NOSIGNAL)  # (non-blocking socket)
            self._close_locked()

    def _close_locked(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock, self._buf, self._owed, self._member = None, b"", 0, False
        self._torn = False

    def _in_step_locked(self) -> None:
        """Raise if closed; reconnect first if an exchange was cut (Note [A request ...])."""
        if self._torn:
            if self._sock is not None:
                self._sock.close()  # no BYE: we have not left, so the manager keeps us
            self._sock, self._buf, self._owed, self._member = None, b"", 0, False
            self._sock = _connect_nonblocking(self.handle)  # _gone if gone: stays torn, closed
            self._torn = False
        if self._sock is None:
            raise ManagerError("this ManagerClient is closed (by close(), or after its "
                               "manager stopped answering): get_client(handle) reconnects; "
                               "if that manager is gone, reset() starts a fresh one")

    def _request(self, line: str, during: Callable[[], object] | None = None) -> str:
        with self._lock, self._one_exchange():
            self._in_step_locked()
            self._torn = True  # until the stream is in step again (Note [A request ...])
            try:
                self._send_locked(line.encode() + b"\n")
            except OSError as exc:  # TimeoutError too: part of the line may be out, so the
                self._close_locked()  # stream is no longer ours to use (see free())
                raise _gone(self.handle, exc) from exc
            self._owed += 1  # ours, until it has come (see Note [A slow reply ...])
            if during is not None:
                self._torn = False  # in step while it runs: a whole line out, its reply owed
                during()  # (register's while_waiting) not under the OSError handling below
                self._torn = True
            deadline = time.monotonic() + REPLY_TIMEOUT_S  # its work is not the manager's delay
            try:
                while True:
                    reply = self._readline(deadline)
                    self._owed -= 1
                    if self._owed == 0:
                        self._torn = False
                        return reply
            except TimeoutError as exc:  # stalled or busy, not gone: stay connected
                self._torn = False  # `_owed` counts what is still to come: in step
                raise _slow(self.handle, line, exc) from exc
            except OSError as exc:  # end of file or reset: the manager is gone
                self._close_locked()
                raise _gone(self.handle, exc) from exc

    def _post(self, line: str) -> None:
        """Send a request whose answer we do not wait for: skipped like a late one (`_owed`)."""
        with self._lock, self._one_exchange():
            self._in_step_locked()
            self._torn = True
            try:
                self._send_locked(line.encode() + b"\n")
            except OSError as exc:  # as in _request: a half-sent line ends this connection
                self._close_locked()
                raise _gone(self.handle, exc) from exc
            self._owed += 1
            self._torn = False

    @contextlib.contextmanager
    def _one_exchange(self) -> Iterator[None]:
        """Mark a request in progress; when the outermost ends, however it ends, send the FREE
        lines finalizers left meanwhile (with the lock held, as everything here)."""
        self._busy += 1
        try:
            yield
        finally:
            while self._busy == 1 and self._deferred:  # still busy: a finalizer run while
                self._free_locked(self._deferred.pop(0))  # these are sent defers its line too
            self._busy -= 1

    def _send_locked(self, data: bytes) -> None:
        """Send all of `data`, waiting only while the socket's buffer is full (a stalled
        manager), REPLY_TIMEOUT_S at most (see Note [Wait only when the socket says so])."""
        view, deadline = memoryview(data), None
        while view:
            try:
                view = view[self._sock.send(view, socket.MSG_NOSIGNAL):]
            except BlockingIOError:
                if deadline is None:
                    deadline = time.monotonic() + REPLY_TIMEOUT_S
                _wait(self._sock, select.POLLOUT, deadline, "could not send within")

    def _readline(self, deadline: float) -> str:
        while b"\n" not in self._buf:
            try:
                chunk = self._sock.recv(4096)
            except BlockingIOError:  # not there yet: wait for it (Note [Wait only when ...])
                _wait(self._sock, select.POLLIN, deadline, "no reply within")
                continue
            if not chunk:
                raise ConnectionResetError("the manager closed the connection")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("ascii", "replace")


def _wait(sock: socket.socket, event: int, deadline: float, what: str) -> None:
    """Block until `sock` is ready for `event` (or hung up, which the next call reports), or
    raise TimeoutError at `deadline`."""
    left = deadline - time.monotonic()
    poller = select.poll()
    poller.register(sock, event)
    if left <= 0 or not poller.poll(left * 1000):
        raise TimeoutError(f"{what} {REPLY_TIMEOUT_S} s")


# -- observers: watch() and peek_status() (extensions; torch has no events and no STATUS) ------
# Both open connections of their own that never keep the manager alive (an observer is not a
# client; see Note [Who keeps the manager alive] in daemon.py).


def watch(handle: bytes, timeout: float | None = None) -> Iterator[dict]:
    """Subscribe now, then yield the manager's events (dicts) until it exits (end of file).

    An observer never keeps the manager alive. We send STATUS right after WATCH and wait for
    its answer, so when this returns no later event can be missed. `timeout` bounds each wait
    for an event (TimeoutError), so a widget or a test cannot hang on a quiet manager. The
    stream ends after the "exiting" event; one that ends without it means the manager died,
    or dropped us for falling 256 KiB behind (daemon_conn.py): watch() again to resubscribe.
    """
    sock = _connect(handle)
    reader = sock.makefile("rb")  # the fd really closes once both reader and sock are closed
    try:
        sock.sendall(b"WATCH\nSTATUS 0 0\n")  # the answer only marks "subscribed": no names
        early = []  # events that raced ahead of the STATUS answer
        for line in reader:
            if not line.startswith(b"{"):  # e.g. "ERR too many observers (64)"
                raise ManagerError(f"the manager refused WATCH: {line.decode(errors='replace')!r}")
            message = json.loads(line)
            if "event" not in message:
                break  # the STATUS answer: we are subscribed
            early.append(message)
        sock.settimeout(timeout)
    except ManagerError:
        reader.close()
        sock.close()
        raise
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


def peek_status(handle: bytes, max_names: int = STATUS_PAGE) -> dict:
    """STATUS on a fresh connection that is closed at once: for probes and widgets, which
    must not keep a manager alive (see Note [Who keeps the manager alive] in daemon.py).
    One page: "count" says how many names there are, "segments" holds the first
    `max_names` of them (at most MAX_STATUS_PAGE); ManagerClient.status() pages through all."""
    sock = _connect(handle)
    try:
        sock.sendall(f"STATUS 0 {max(0, min(max_names, MAX_STATUS_PAGE))}\n".encode())
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
START_TIMEOUT_S = 30.0  # a cold Python start on a loaded machine can take seconds

_lock = threading.Lock()
_clients: dict[bytes, ManagerClient] = {}
_default: bytes | None = None  # the first manager this process (or its fork parent) knew
_started: list[subprocess.Popen] = []  # managers we started, reaped once they exit

# Note [Forking while a manager starts]
# (The manager half of Note [Forking while the first share is in flight] in storage.py.)
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
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    # stderr goes nowhere: an inherited pipe would keep e.g. subprocess.run(capture_output=True)
    # of our starter waiting until the daemon exits. Failures come back on the handshake line.
    with _start_lock:  # see Note [Forking while a manager starts]
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
        f"Fix: run `{sys.executable} -m {DAEMON_MODULE}` in a terminal, which prints the "
        "whole reason (a bad SHMLAB_MANAGER_GRACE, an unusable TMPDIR, ...)."
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
