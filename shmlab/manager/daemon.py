"""The shm manager daemon: unlink a process family's leftover segments after its last member goes.

Mirrors: torch/lib/libshm/manager.cpp (torch_shm_manager)

Run as `python -m shmlab.manager [--grace S] [--max-clients N] [--max-observers N]
[--log-bytes B]`; the first file_system allocation of a process family starts it (see
`shmlab.manager.client`). It prints one line on stdout, the socket path or `ERROR: ...`, then
serves a text protocol, one line per message:

    REGISTER <pid> <name>  -> OK | ERR <reason>     (the name is now ours to reclaim)
    FREE <pid> <name>      -> (no reply)            (dropped only if the segment is gone)
    STATUS [<off> [<n>]]   -> {"pid", "clients", "members", "observers", "grace_s", "count",
                               "offset", "segments": up to n (100; at most 1000) names, sorted
                               within the page, "next": the next offset or null}
    WATCH                  -> (first line only) every event from now on, one JSON line each;
                              STATUS still works on it, so its answer marks "subscribed"
    BYE                    -> (no reply) this process leaves: see liveness.py

Every event is also appended to <dir>/events.jsonl (bounded: eventlog.py) as `{"t", "event",
"pid", "name", "reason"}` with event one of started|joined|left|exited|registered|freed|
refused|reclaimed|exiting. The parts: protocol.py (lines), conns.py (one connection's
buffers), liveness.py (which members live), eventlog.py (the log).
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import shutil
import socket
import struct
import sys
import tempfile
import time
from collections import Counter

from .._shm import SHM_DIR
from .conns import CLIENT_HIGH_WATER, Conn, LineTooLong
from .eventlog import EventLog
from .liveness import Members
from .protocol import parse_options, segment_exists
from .requests import Requests

LINES_PER_TURN = 16  # see Note [Fair service]
ACCEPTS_PER_TURN = 16
LIVENESS_POLL_S = 0.1  # how often we look at members that left without BYE


# Note [Who keeps the manager alive]
# torch counts every connection as a client. We keep that for liveness (any open, non-WATCH
# connection keeps us serving, so a starter that connects and registers a moment later is
# safe), but the grace clock starts only when the last *client* (a connection that has sent
# REGISTER or FREE) has left AND no *member* is alive (see Note [A dropped connection is not
# a dead process] in liveness.py). So a widget that connects, asks STATUS and closes neither
# restarts the 2 s wait nor shows up as joined/left, and a WATCH observer never delays the
# reclaim: it sees the `reclaimed` and `exiting` events, then end-of-file.

# Note [Fair service]
# One loop turn serves at most LINES_PER_TURN lines of each connection, then moves on; lines
# beyond that wait in the inbox (and we stop reading that socket), so a peer pipelining
# thousands of STATUS or garbage lines delays a REGISTER by at most one turn of everybody's
# budget. STATUS is bounded (one page, MAX_STATUS_PAGE names at most) and cheap: no sort of all
# names per call, just a slice of the registration order; so is every reply.


class Manager(Requests):
    def __init__(self, grace_s: float, max_clients: int, max_observers: int = 64,
                 log_bytes: int = 4 << 20):
        self.grace_s, self.max_clients, self.max_observers = grace_s, max_clients, max_observers
        self.dir = tempfile.mkdtemp(prefix="shmlab-shm-dir-")  # mode 0700: only we can enter
        self.path = os.path.join(self.dir, "manager.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.server.bind(self.path)  # fails if the path is over 107 bytes (long TMPDIR)
            self.server.listen(socket.SOMAXCONN)  # a burst of starters must not bounce
            self.log = EventLog(self.dir, log_bytes)
        except OSError:
            self.server.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.server.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.server, selectors.EVENT_READ)
        self.conns: dict[socket.socket, Conn] = {}
        self.kinds: Counter = Counter()  # how many connections of each kind are open
        self.members = Members()
        self.segments: dict[str, None] = {}  # registration order: STATUS pages slice it
        self.deadline: float | None = time.monotonic() + grace_s  # nobody came yet: grace runs
        # One fd held in reserve, so that with a full fd table we can still accept-and-refuse.
        self.spare_fd = os.open(os.devnull, os.O_RDONLY)

    def set_kind(self, conn: Conn, kind: str) -> None:
        self.kinds[conn.kind] -= 1
        self.kinds[kind] += 1
        conn.kind = kind

    # -- connections ----------------------------------------------------------------------
    def accept(self) -> None:
        try:
            sock, _ = self.server.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # EMFILE: our fd table is full. Left waiting, the caller
            os.close(self.spare_fd)  # would wake us forever; free the spare fd, take it, say no
            with contextlib.suppress(OSError):
                self.refuse_and_close(self.server.accept()[0], None, f"out of fds ({exc})")
            self.spare_fd = os.open(os.devnull, os.O_RDONLY)
            return
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)  # the kernel's word, not the peer's
        if uid != os.geteuid():
            self.refuse_and_close(sock, pid, f"peer uid {uid} is not our uid {os.geteuid()}")
        elif len(self.conns) >= self.max_clients:
            self.refuse_and_close(sock, pid, f"too many connections ({self.max_clients})")
        else:
            sock.setblocking(False)
            conn = self.conns[sock] = Conn(sock, pid)
            self.kinds["new"] += 1
            self.sel.register(sock, conn.mask, conn)

    def refuse_and_close(self, sock: socket.socket, pid: int | None, reason: str) -> None:
        self.event("refused", pid=pid, reason=reason)
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(f"ERR {reason}\n".encode())
        sock.close()

    def drop(self, conn: Conn, reason: str | None = None, broadcast: bool = True) -> None:
        if self.conns.pop(conn.sock, None) is None:
            return
        self.kinds[conn.kind] -= 1
        if reason:  # say why first: whoever sees the hang-up can already read the reason
            self.event("refused", pid=conn.pid, reason=reason, broadcast=broadcast)
        if conn.mask:
            self.sel.unregister(conn.sock)
        conn.sock.close()
        if conn.kind == "client":
            self.members.left(conn.pid, conn.said_bye)
            kept = not conn.said_bye and conn.pid in self.members.kept_alive()
            self.event("left", pid=conn.pid, reason="closed without BYE: kept while the "
                       "process lives" if kept else None)
            self.maybe_start_grace()

    def maybe_start_grace(self) -> None:
        if self.kinds["client"] == 0 and not self.members.kept_alive():
            if self.deadline is None:  # the last one: start the grace clock (torch: 2 s)
                self.deadline = time.monotonic() + self.grace_s
        else:
            self.deadline = None

    def watch_conn(self, conn: Conn) -> None:
        """Tell the selector what this connection waits for now (nothing: unregistered)."""
        mask = conn.wanted_mask()
        if mask != conn.mask:
            if not conn.mask:
                self.sel.register(conn.sock, mask, conn)
            elif not mask:
                self.sel.unregister(conn.sock)
            else:
                self.sel.modify(conn.sock, mask, conn)
            conn.mask = mask

    # -- lines in, replies out -----------------------------------------------------------
    def serve_lines(self, conn: Conn) -> None:
        """Up to LINES_PER_TURN lines of this connection (all of them once it hung up)."""
        budget = LINES_PER_TURN if not conn.eof else sys.maxsize
        while (budget > 0 and conn.sock in self.conns and not conn.doomed
               and len(conn.outbox) < CLIENT_HIGH_WATER):
            try:
                line = conn.next_line()
            except LineTooLong as exc:  # no honest client sends this: cut it off
                return self.drop(conn, str(exc))
            if line is None:
                break
            budget -= 1
            self.handle(conn, line)
        if conn.eof and conn.sock in self.conns:  # the peer closed or died
            self.drop(conn, "disconnected in the middle of a line" if conn.inbox else None)

    # -- main loop and shutdown -----------------------------------------------------------
    def serve(self) -> None:
        while True:
            for pid in self.members.prune():  # a member that left without BYE has died
                self.event("exited", pid=pid)
                self.maybe_start_grace()
            busy = any(c.has_line() and len(c.outbox) < CLIENT_HIGH_WATER
                       for c in self.conns.values())
            timeout = 0 if busy else None
            if self.members.kept_alive():
                timeout = LIVENESS_POLL_S if timeout is None else timeout
            elif self.deadline is not None and not (self.kinds["client"] or self.kinds["new"]):
                left = self.deadline - time.monotonic()
                if left <= 0:
                    return  # grace over and nobody came back
                timeout = left if timeout is None else min(timeout, left)
            self.turn(timeout)

    def turn(self, timeout: float | None) -> None:
        for key, mask in self.sel.select(timeout):
            if key.fileobj is self.server:
                for _ in range(ACCEPTS_PER_TURN):
                    self.accept()
            elif mask & selectors.EVENT_READ:
                key.data.receive()
        for conn in list(self.conns.values()):
            self.serve_lines(conn)
        for conn in list(self.conns.values()):
            if conn.doomed:  # closed after its last reply had its chance, quietly
                conn.flush()
                self.drop(conn, conn.doomed, broadcast=False)
            elif not conn.flush():  # the peer is gone: the same as a hang-up
                self.drop(conn)
            else:
                self.watch_conn(conn)

    def shutdown(self, crash: BaseException | None = None) -> None:
        # First the one job that matters, with nothing in between that could raise: unlink.
        # After a crash of our own, clients may still be using their segments: leave them.
        done: list[tuple[str, OSError | None]] = []
        for name in sorted(self.segments) if crash is None else ():
            if segment_exists(name):  # gone already = its last user unlinked it: fine
                try:
                    os.unlink(os.path.join(SHM_DIR, name))
                    done.append((name, None))
                except OSError as exc:
                    done.append((name, exc))
        try:  # then tell the log and the observers, then close everything, come what may
            give_up = time.monotonic() + 2.0  # observers get this long to take the last events
            for i, (name, exc) in enumerate(done):
                if exc is None:
                    self.event("reclaimed", pid=os.getpid(), name=name)
                else:
                    self.event("refused", pid=os.getpid(), name=name, reason=str(exc))
                if i % 256 == 255:  # let readers keep up, so only the silent fall behind
                    self.last_flush(give_up - time.monotonic())
            self.event("exiting", pid=os.getpid(), reason=crash and repr(crash))  # then EOF
            self.last_flush(max(0.5, give_up - time.monotonic()))
        finally:
            for sock in list(self.conns):
                with contextlib.suppress(OSError):
                    sock.close()
            with contextlib.suppress(OSError):
                self.server.close()
            self.members.close()
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def last_flush(self, within: float) -> None:
        """Give observers up to `within` seconds to take what is queued for them."""
        end = time.monotonic() + within
        behind = [c for c in self.conns.values() if c.outbox and not c.doomed]
        while behind:
            behind = [c for c in behind if c.flush() and c.outbox]
            if not behind or time.monotonic() >= end:
                return
            time.sleep(0.005)


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # one fd per client, plus ours
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (need if hard == resource.RLIM_INFINITY else min(need, hard), hard))


def main(argv: list[str] | None = None) -> int:
    try:
        os.setsid()  # own session and process group: Ctrl-C / a kernel interrupt miss us
    except PermissionError:
        pass  # already a group leader (run by hand from a shell): nothing to detach from
    os.chdir("/")  # a daemon should not keep its starter's working directory busy
    try:
        args = parse_options(sys.argv[1:] if argv is None else argv)
        _raise_fd_limit(2 * args.max_clients + 64)  # a socket and a pidfd per member
        manager = Manager(args.grace, args.max_clients, args.max_observers, args.log_bytes)
    except Exception as exc:  # the starter reads exactly one line: make it say why
        print(f"ERROR: {exc}", flush=True)
        return 1
    manager.event("started", pid=os.getpid(), reason=f"grace {manager.grace_s} s")
    try:
        print(manager.path, flush=True)
        handshake_ok = True
    except BrokenPipeError:  # the starter died before reading: nobody can ever find us
        handshake_ok = False
    devnull = os.open(os.devnull, os.O_WRONLY)  # the handshake pipe is done: let it close
    os.dup2(devnull, 1)
    os.close(devnull)
    if not handshake_ok:
        manager.shutdown()  # nothing registered yet: just remove our directory and go
        return 1
    try:
        manager.serve()
    except BaseException as exc:  # a bug or a signal: say so, reclaim nothing, re-raise
        manager.shutdown(crash=exc)
        raise
    manager.shutdown()
    return 0
