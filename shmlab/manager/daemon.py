"""The shm manager daemon: unlink a process family's leftover segments after its last client goes.

Mirrors: torch/lib/libshm/manager.cpp (torch_shm_manager)

Run as `python -m shmlab.manager [--grace SECONDS] [--max-clients N]`; the first file_system
allocation of a process family starts it (see `shmlab.manager.client`). It prints one line on
stdout, the socket path or `ERROR: ...`, then serves a text protocol, one line per message:

    REGISTER <pid> <name>  -> OK | ERR <reason>     (the name is now ours to reclaim)
    FREE <pid> <name>      -> (no reply)            (dropped only if the segment is gone)
    STATUS                 -> {"pid":..,"clients":..,"observers":..,"segments":[..],"grace_s":..}
    WATCH                  -> (first line only) every event from now on, one JSON line each;
                              STATUS still works on it, so its answer marks "subscribed"

Every event is also appended to <dir>/events.jsonl as `{"t", "event", "pid", "name", "reason"}`
with event one of started|joined|left|registered|freed|refused|reclaimed|exiting.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import shutil
import socket
import struct
import sys
import tempfile
import time

from .._shm import SHM_DIR
from .protocol import MAX_LINE, parse_options, parse_request, segment_exists

MAX_SEGMENTS = 1 << 18  # a runaway client must not grow our memory without bound


class Conn:
    """One accepted connection. kind: 'new' until it REGISTERs/FREEs ('client') or WATCHes."""

    def __init__(self, sock: socket.socket, pid: int):
        self.sock, self.pid, self.kind, self.buf = sock, pid, "new", bytearray()


# Note [Who keeps the manager alive]
# torch counts every connection as a client. We keep that for liveness (any open, non-WATCH
# connection keeps us serving, so a starter that connects and registers a moment later is
# safe), but the grace clock starts only when the last *client* (a connection that has sent
# REGISTER or FREE) leaves. So a widget that connects, asks STATUS and closes neither restarts
# the 2 s wait nor shows up as joined/left, and a WATCH observer never delays the reclaim: it
# sees the `reclaimed` and `exiting` events, then end-of-file.


class Manager:
    def __init__(self, grace_s: float, max_clients: int):
        self.grace_s, self.max_clients = grace_s, max_clients
        self.dir = tempfile.mkdtemp(prefix="shmlab-shm-dir-")  # mode 0700: only we can enter
        self.path = os.path.join(self.dir, "manager.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.server.bind(self.path)  # fails if the path is over 107 bytes (long TMPDIR)
            self.server.listen(socket.SOMAXCONN)  # a burst of starters must not bounce
            self.log = open(os.path.join(self.dir, "events.jsonl"), "a", buffering=1)
        except OSError:
            self.server.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.server.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.server, selectors.EVENT_READ)
        self.conns: dict[socket.socket, Conn] = {}
        self.segments: set[str] = set()
        self.deadline = time.monotonic() + grace_s  # nobody has connected yet: grace runs
        # One fd held in reserve, so that with a full fd table we can still accept-and-refuse.
        self.spare_fd = os.open(os.devnull, os.O_RDONLY)

    # -- events ---------------------------------------------------------------------------
    def event(self, kind: str, pid: int | None = None, name=None, reason=None) -> None:
        line = json.dumps({"t": time.time(), "event": kind, "pid": pid, "name": name,
                           "reason": reason})
        with contextlib.suppress(OSError):  # a full TMPDIR must not stop the cleaner
            self.log.write(line + "\n")
        for conn in [c for c in self.conns.values() if c.kind == "observer"]:
            self.send(conn, line)

    def count(self, kind: str) -> int:
        return sum(1 for c in self.conns.values() if c.kind == kind)

    def send(self, conn: Conn, text: str) -> None:
        # Never block on a peer that does not read: a reply that does not fit is its loss.
        data = (text + "\n").encode()
        try:
            if conn.sock.send(data) == len(data):
                return
        except OSError:
            pass
        self.drop(conn, "not reading its replies")

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
            self.conns[sock] = Conn(sock, pid)
            self.sel.register(sock, selectors.EVENT_READ)

    def refuse_and_close(self, sock: socket.socket, pid: int | None, reason: str) -> None:
        self.event("refused", pid=pid, reason=reason)
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(f"ERR {reason}\n".encode())
        sock.close()

    def drop(self, conn: Conn, reason: str | None = None) -> None:
        if conn.sock not in self.conns:
            return
        del self.conns[conn.sock]
        self.sel.unregister(conn.sock)
        conn.sock.close()
        if reason:
            self.event("refused", pid=conn.pid, reason=reason)
        if conn.kind == "client":
            self.event("left", pid=conn.pid)
            if self.count("client") == 0:  # the last one: start the grace clock (torch: 2 s)
                self.deadline = time.monotonic() + self.grace_s

    def readable(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except OSError:
            data = b""
        if not data:  # the peer closed or died; a half line it left is simply discarded
            self.drop(conn, "disconnected in the middle of a line" if conn.buf else None)
            return
        conn.buf += data
        while conn.sock in self.conns:  # a reply may have failed and dropped it
            line, sep, rest = conn.buf.partition(b"\n")
            if len(line) > MAX_LINE:  # no honest client sends this: cut it off
                self.drop(conn, f"line longer than {MAX_LINE} bytes")
                return
            if not sep:  # half a line: wait for the rest
                return
            conn.buf = bytearray(rest)
            self.handle(conn, bytes(line).rstrip(b"\r"))

    # -- the protocol ---------------------------------------------------------------------
    def handle(self, conn: Conn, line: bytes) -> None:
        try:
            cmd, pid, name = parse_request(line)
            if cmd == "WATCH" and conn.kind != "new":  # a client must not stop counting
                raise ValueError("WATCH must be the first line of a connection")
        except ValueError as exc:
            self.event("refused", pid=conn.pid, reason=str(exc))
            if not line.startswith(b"FREE"):  # FREE gets no reply, good or bad (like torch)
                self.send(conn, f"ERR {exc}")
            return
        if cmd == "STATUS":
            self.send(conn, json.dumps({"pid": os.getpid(), "clients": self.count("client"),
                                        "observers": self.count("observer"),
                                        "segments": sorted(self.segments),
                                        "grace_s": self.grace_s}))
        elif cmd == "WATCH":
            conn.kind = "observer"
        else:
            if conn.kind == "new":
                conn.kind = "client"
                self.event("joined", pid=conn.pid)
            (self.register if cmd == "REGISTER" else self.free)(conn, pid, name)

    def register(self, conn: Conn, pid: int, name: str) -> None:
        if len(self.segments) >= MAX_SEGMENTS and name not in self.segments:
            self.event("refused", pid=pid, name=name, reason="too many segments")
            self.send(conn, f"ERR too many segments ({MAX_SEGMENTS})")
            return
        self.segments.add(name)
        self.event("registered", pid=pid, name=name)
        self.send(conn, "OK")

    def free(self, conn: Conn, pid: int, name: str) -> None:
        if name not in self.segments:
            self.event("refused", pid=pid, name=name, reason="FREE of a name never registered")
        elif segment_exists(name):
            # One process let go, but the file is still there: another process may hold it
            # (torch: "object still exists"). Keep it; the reclaim at exit will decide.
            self.event("freed", pid=pid, name=name, reason="still exists, kept registered")
        else:
            self.segments.discard(name)
            self.event("freed", pid=pid, name=name)

    # -- main loop and shutdown -----------------------------------------------------------
    def serve(self) -> None:
        while True:
            timeout = None
            if self.count("client") == 0 and self.count("new") == 0:
                timeout = self.deadline - time.monotonic()
                if timeout <= 0:
                    return  # grace over and nobody came back
            for key, _ in self.sel.select(timeout):
                if key.fileobj is self.server:
                    self.accept()
                elif key.fileobj in self.conns:
                    self.readable(self.conns[key.fileobj])

    def shutdown(self, crash: BaseException | None = None) -> None:
        # After a crash of our own, clients may still be using their segments: leave them.
        for name in sorted(self.segments) if crash is None else ():
            if segment_exists(name):  # gone already = its last user unlinked it: fine
                try:
                    os.unlink(os.path.join(SHM_DIR, name))
                    self.event("reclaimed", pid=os.getpid(), name=name)
                except OSError as exc:
                    self.event("refused", pid=os.getpid(), name=name, reason=str(exc))
        self.event("exiting", pid=os.getpid(), reason=crash and repr(crash))  # then EOF
        for sock in self.conns:
            sock.close()
        self.server.close()
        with contextlib.suppress(OSError):
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


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
        _raise_fd_limit(args.max_clients + 64)
        manager = Manager(args.grace, args.max_clients)
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

