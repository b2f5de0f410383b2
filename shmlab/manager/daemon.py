"""The shm manager daemon: unlink a process family's leftover segments after its last member goes.

Mirrors: torch/lib/libshm/manager.cpp (torch_shm_manager)

Daemon side (the client side is client.py). Run as `python -m shmlab.manager [--grace S]
[--max-clients N] [--max-observers N] [--log-bytes B] [--idle-timeout S]`; the first
file_system allocation of a process family starts it (`shmlab.manager.client`). It prints
one line on stdout, the socket path or `ERROR: ...`, then serves a text protocol, one line
per message:

    REGISTER <pid> <name>  -> OK | ERR <reason>     (the name is now ours to reclaim)
    FREE <pid> <name>      -> (no reply)            (dropped only if the segment is gone)
    STATUS [<off> [<n>]]   -> {"pid", "clients", "members", "observers", "grace_s", "count",
                               "offset", "segments": up to n (100; at most 1000) names, sorted
                               within the page, "next": the next offset or null}
    WATCH                  -> (first line only) every event from now on, one JSON line each;
                              STATUS still works on it, so its answer marks "subscribed"
    BYE                    -> (no reply) this process leaves: see liveness.py

The story torch's manager.cpp tells, and the Manager methods that tell it here, in order:
  1. main(): bind a socket in a fresh 0700 directory, print its path, serve;
  2. accept(): a process connects (SO_PEERCRED names it; another uid is refused);
  3. handle() -> register(): "REGISTER" makes a name ours to reclaim, answered "OK";
     handle() -> free(): "FREE" forgets a name whose file is gone (its last holder unlinked it);
  4. drop(): a connection closes; maybe_start_grace(): the last one gone starts the grace
     clock (torch: SHUTDOWN_TIMEOUT, 2 s), and anybody coming back stops it;
  5. serve(): poll, a turn() at a time, until the grace runs out with nobody back;
  6. shutdown(): unlink every name still registered, then exit.

Extensions around it (torch has none), each in its own section of Manager after the story:
  * liveness (liveness.py): a member leaves by BYE or by dying, not by closing a socket;
  * STATUS, a page at a time: status();
  * events: event() appends to <dir>/events.jsonl (bounded: eventlog.py) `{"t", "event",
    "pid", "name", "reason"}`, event one of started|joined|left|exited|registered|freed|
    refused|reclaimed|exiting, and queues it to WATCH observers;
  * service no peer can stall: buffered replies and back-pressure (daemon_conn.py), a budget
    of lines per turn (serve_lines, watch_conn), limits (max clients, max observers,
    MAX_SEGMENTS, MAX_BAD_LINES, a spare fd for a full fd table), every field of a line
    bounded (protocol.py), idle 'new' connections evicted (evict_idle), and a last guard
    around each line (Note [One peer's line cannot stop the reclaim]).
Lines of the story's methods that serve an extension say "extension".
"""

from __future__ import annotations

import contextlib
import itertools
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
import traceback
from collections import Counter

from .._shm import SHM_DIR
from .daemon_conn import CLIENT_HIGH_WATER, MAX_BAD_LINES, Conn, LineTooLong
from .eventlog import EventLog
from .liveness import Members
from .protocol import MAX_SEGMENTS, parse_options, parse_request, segment_exists

LINES_PER_TURN = 16  # see Note [Fair service]
ACCEPTS_PER_TURN = 16
LIVENESS_POLL_S = 0.1  # how often we look at members that left without BYE
FD_RESERVE = 64  # fds of our own: std streams, the listening socket, epoll, the log, the spare


# Note [Who keeps the manager alive]
# torch counts every connection as a client. We keep that for liveness (any open, non-WATCH
# connection keeps us serving, so a starter that connects and registers a moment later is
# safe), but the grace clock starts only when the last *client* (a connection that has sent
# REGISTER or FREE) has left AND no *member* is alive (see Note [A dropped connection is not
# a dead process] in liveness.py). So a widget that connects, asks STATUS and closes neither
# restarts the 2 s wait nor shows up as joined/left, and a WATCH observer never delays the
# reclaim: it sees the `reclaimed` and `exiting` events, then end-of-file.

# Note [Who may be evicted]
# Our fds are finite (RLIMIT_NOFILE, raised to the hard limit at start), so connections are
# capped (default_max_clients), and a cap is a way to deny service: 1,000 connections that
# never speak would keep every real client out. So a *new* connection (it has not yet sent
# REGISTER, FREE or WATCH) is evicted after idle_timeout_s (30 s) if it never finished a line,
# or if it has been in the middle of one that long (Conn.heard: when it connected or last
# finished a line); one that asked STATUS and waits quietly is left alone (a ManagerClient
# used for STATUS first may REGISTER minutes later, on the same socket). And when the table
# is full, the longest-idle new connection makes room for the newcomer instead of the newcomer
# being refused: a real client sends REGISTER right after connecting, so it is not the
# longest-idle one. Evicting a new connection costs no data: it holds no name and no
# membership. It can cost a request, though: a ManagerClient that has only asked STATUS so
# far and is evicted to admit a newcomer finds its next REGISTER refused (the manager looks
# gone to it; get_client() reconnects). Only a table full of connections reaches that case.
# We never evict a client or an observer:
#   * a client's names would not be lost at once (liveness.py keeps a member that closed
#     without BYE while its process lives), but its *next* REGISTER would meet a closed socket:
#     the client reports the manager gone, a segment then goes unregistered and leaks when its
#     process is killed, or a share fails. And a client that is silent or stopped half-way
#     through a line (SIGSTOP, a debugger, a loaded box) is slow, not hostile;
#   * clients are bounded anyway: one per connection, the table sized from the fd limit, and
#     a member process costs one pidfd more, which default_max_clients leaves room for, one
#     per connection (past that, pidfd_open fails and liveness falls back to /proc start
#     times: just as safe);
#   * observers are capped on their own (max_observers) and dropped when they stop reading.
# So the cap can only be reached by clients the fd limit admits, never by idle strangers.

# Note [One peer's line cannot stop the reclaim]
# Every field of a line is checked before use (Note [Every field bounded] in protocol.py), and
# a bad line answers ERR to its sender alone. If handling a line still raises, that is a bug of
# ours, but letting it out of serve() would end the daemon, and with it the reclaim of every
# family's segments: one peer's line would leak every other peer's files. So serve_lines()
# guards the handling of one line, and only that: the exception is written to the event log
# (a "refused" event with the traceback: the bug stays visible), the peer gets
# `ERR internal error` (a FREE, which never has a reply, gets none), and the loop goes on.
# Exception only: KeyboardInterrupt and SystemExit still end the daemon, and a failure
# anywhere else in the loop (accepting, the selector, liveness) still crashes it loudly.

# Note [Fair service]
# One loop turn serves at most LINES_PER_TURN lines of each connection, then moves on; lines
# beyond that wait in the inbox (and we stop reading that socket), so a peer pipelining
# thousands of STATUS or garbage lines delays a REGISTER by at most one turn of everybody's
# budget. A turn touches only the connections it has to: those the selector woke, those with
# lines left from their budget (`carry`) and the observers (events are queued to them from
# any line); with 2,000 clients connected, walking all of them every turn made each REGISTER
# cost O(clients). STATUS is bounded (one page, MAX_STATUS_PAGE names at most) and cheap: no
# sort of all names per call, just a slice of the registration order; so is every reply.


class Manager:
    """One daemon: its listening socket, its connections, the names it will reclaim."""

    def __init__(self, grace_s: float, max_clients: int, max_observers: int = 64,
                 log_bytes: int = 4 << 20, idle_timeout_s: float = 30.0):
        self.grace_s, self.max_clients, self.max_observers = grace_s, max_clients, max_observers
        self.idle_timeout_s = idle_timeout_s
        self.next_sweep = 0.0  # when evict_idle() walks the connections next
        self.dir = tempfile.mkdtemp(prefix="shmlab-shm-dir-")  # mode 0700: only we can enter
        self.path = os.path.join(self.dir, "manager.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.server.bind(self.path)  # fails if the path is over 107 bytes (long TMPDIR)
            self.server.listen(socket.SOMAXCONN)  # a burst of starters must not bounce
            self.log = EventLog(self.dir, log_bytes)
        except OSError as exc:
            self.server.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            if len(os.fsencode(self.path)) >= 108:  # sizeof(sun_path) on Linux, NUL included
                raise OSError(f"{exc}: the socket path {self.path!r} "
                              f"is {len(os.fsencode(self.path))} bytes, and a UNIX socket's "
                              "path must fit in 107; set TMPDIR to a shorter directory "
                              "(e.g. TMPDIR=/tmp)") from exc
            raise
        self.server.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.server, selectors.EVENT_READ)
        self.conns: dict[socket.socket, Conn] = {}
        self.observers: dict[Conn, None] = {}  # the 'observer' conns, in order: event() sends
        self.carry: dict[Conn, None] = {}  # conns with lines left for the next turn
        self.kinds: Counter = Counter()  # how many connections of each kind are open
        self.members = Members()
        self.segments: dict[str, None] = {}  # registration order: STATUS pages slice it
        self.deadline: float | None = time.monotonic() + grace_s  # nobody came yet: grace runs
        # One fd held in reserve, so that with a full fd table we can still accept-and-refuse.
        self.spare_fd = os.open(os.devnull, os.O_RDONLY)

    # == torch's story: connect, REGISTER, FREE, leave, grace, unlink ----------------------

    def accept(self) -> None:
        try:
            sock, _ = self.server.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # extension: EMFILE, our fd table is full. Left waiting, the
            os.close(self.spare_fd)  # caller would wake us forever: free the spare, take, refuse
            with contextlib.suppress(OSError):
                self.refuse_and_close(self.server.accept()[0], None, f"out of fds ({exc})")
            self.spare_fd = os.open(os.devnull, os.O_RDONLY)
            return
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)  # the kernel's word, not the peer's
        if uid != os.geteuid():
            self.refuse_and_close(sock, pid, f"peer uid {uid} is not our uid {os.geteuid()}")
        elif len(self.conns) >= self.max_clients and not self.evict_one_new():
            self.refuse_and_close(sock, pid, f"too many connections ({self.max_clients})")
        else:
            sock.setblocking(False)
            conn = self.conns[sock] = Conn(sock, pid)
            self.kinds["new"] += 1
            self.sel.register(sock, conn.mask, conn)

    def handle(self, conn: Conn, line: bytes) -> None:
        """One complete line from `conn`: queue its reply (daemon_conn.py sends it later)."""
        try:
            cmd, pid, arg = parse_request(line)
            if cmd == "WATCH" and conn.kind != "new":  # a client must not stop counting
                raise ValueError("WATCH must be the first line of a connection")
        except ValueError as exc:  # extension: a bad line is refused, and costs the peer
            conn.bad_lines += 1
            self.refused(conn, str(exc))
            if not line.startswith(b"FREE"):  # FREE gets no reply, good or bad (like torch)
                conn.queue(f"ERR {exc}")
            if conn.bad_lines >= MAX_BAD_LINES:
                conn.doomed = f"{MAX_BAD_LINES} bad lines: closed"
            return
        if cmd in ("REGISTER", "FREE"):  # torch's two requests
            conn.said_bye = False  # extension: registering again after a BYE: back as a member
            if conn.kind == "new":
                self.set_kind(conn, "client")
                self.members.joined(conn.pid)  # extension: liveness.py
                self.deadline = None
                self.event("joined", pid=conn.pid)
            (self.register if cmd == "REGISTER" else self.free)(conn, pid, arg)
        elif cmd == "STATUS":  # extensions from here on: status() and the sections below
            conn.queue(self.status(*arg))
        elif cmd == "BYE":
            conn.said_bye = True
        else:  # WATCH
            if self.kinds["observer"] >= self.max_observers:
                conn.queue(f"ERR too many observers ({self.max_observers})")
                conn.doomed = f"too many observers ({self.max_observers})"
            else:
                self.set_kind(conn, "observer")

    def register(self, conn: Conn, pid: int, name: str) -> None:
        if len(self.segments) >= MAX_SEGMENTS and name not in self.segments:
            self.refused(conn, "too many segments", name=name)
            conn.queue(f"ERR too many segments ({MAX_SEGMENTS})")
            return
        self.segments[name] = None
        self.event("registered", pid=pid, name=name)
        conn.queue("OK")

    def free(self, conn: Conn, pid: int, name: str) -> None:
        if name not in self.segments:
            self.refused(conn, "FREE of a name never registered", name=name)
        elif segment_exists(name):
            # One process let go, but the file is still there: another process may hold it
            # (torch: "object still exists"). Keep it; the reclaim at exit will decide.
            self.event("freed", pid=pid, name=name, reason="still exists, kept registered")
        else:
            del self.segments[name]
            self.event("freed", pid=pid, name=name)

    def drop(self, conn: Conn, reason: str | None = None, broadcast: bool = True) -> None:
        if self.conns.pop(conn.sock, None) is None:
            return
        self.observers.pop(conn, None)
        self.carry.pop(conn, None)
        self.kinds[conn.kind] -= 1
        if reason:  # say why first: whoever sees the hang-up can already read the reason
            self.event("refused", pid=conn.pid, reason=reason, broadcast=broadcast)
        if conn.mask:
            self.sel.unregister(conn.sock)
        conn.sock.close()
        if conn.kind == "client":
            self.members.left(conn.pid, conn.said_bye)  # extension: leaving is BYE or death
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

    def serve(self) -> None:
        while True:
            for pid in self.members.prune():  # extension: a member gone without BYE died
                self.event("exited", pid=pid)
                self.maybe_start_grace()
            busy = any(c.has_line() and len(c.outbox) < CLIENT_HIGH_WATER
                       for c in self.carry)
            timeout = 0 if busy else None
            if self.members.kept_alive():
                timeout = LIVENESS_POLL_S if timeout is None else timeout
            elif self.deadline is not None and not (self.kinds["client"] or self.kinds["new"]):
                left = self.deadline - time.monotonic()
                if left <= 0:
                    return  # grace over and nobody came back
                timeout = left if timeout is None else min(timeout, left)
            if self.kinds["new"]:  # extension: Note [Who may be evicted]
                now = time.monotonic()
                if now >= self.next_sweep:  # a walk of every conn: at most 10 per timeout
                    self.next_sweep = now + max(self.evict_idle(), self.idle_timeout_s / 10)
                wait = max(self.next_sweep - now, 0.0)
                timeout = wait if timeout is None else min(timeout, wait)
            self.turn(timeout)

    def turn(self, timeout: float | None) -> None:
        touched, self.carry = self.carry, {}  # see Note [Fair service]
        for key, mask in self.sel.select(timeout):
            if key.fileobj is self.server:
                for _ in range(ACCEPTS_PER_TURN):
                    self.accept()
                continue
            if mask & selectors.EVENT_READ:
                key.data.receive()
            touched[key.data] = None
        for conn in list(touched):
            self.serve_lines(conn)
        touched.update(self.observers)  # the lines just served may have queued them events
        for conn in list(touched):
            if conn.sock not in self.conns:
                continue
            if conn.doomed:  # closed after its last reply had its chance, quietly
                conn.flush()
                self.drop(conn, conn.doomed, broadcast=False)
            elif not conn.flush():  # the peer is gone: serve what it sent, then drop it
                self.hung_up(conn)
            else:
                self.watch_conn(conn)
                if conn.has_line():  # its budget ran out: serve the rest next turn
                    self.carry[conn] = None

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

    # == extension: STATUS, a page at a time -----------------------------------------------

    def status(self, offset: int, limit: int) -> str:
        page = sorted(itertools.islice(self.segments, offset, offset + limit))
        end = offset + len(page)
        return json.dumps({"pid": os.getpid(), "clients": self.kinds["client"],
                           "members": len(self.members.kept_alive()),
                           "observers": self.kinds["observer"], "grace_s": self.grace_s,
                           "count": len(self.segments), "offset": offset, "segments": page,
                           "next": end if end < len(self.segments) else None})

    # == extension: events, logged and queued to WATCH observers (never sent from here) ----

    def event(self, kind: str, pid: int | None = None, name=None, reason=None,
              broadcast: bool = True) -> None:
        line = json.dumps({"t": time.time(), "event": kind, "pid": pid, "name": name,
                           "reason": reason})
        self.log.write(line)
        for conn in self.observers if broadcast else ():
            if not conn.doomed:
                conn.queue(line)

    def refused(self, conn: Conn, reason: str, name=None) -> None:
        """A "refused" event, at most a burst and then a few a second per connection."""
        if conn.refusals.allow():
            more = conn.refusals.take_suppressed()
            self.event("refused", pid=conn.pid, name=name,
                       reason=f"{reason} (+{more} more refused, not logged)" if more else reason)

    # == extension: connection kinds, and refusing at the door -----------------------------
    # A connection is 'new' until REGISTER/FREE make it a client or WATCH an observer
    # (see Note [Who keeps the manager alive]).

    def set_kind(self, conn: Conn, kind: str) -> None:
        self.kinds[conn.kind] -= 1
        self.kinds[kind] += 1
        conn.kind = kind
        if kind == "observer":
            self.observers[conn] = None

    def refuse_and_close(self, sock: socket.socket, pid: int | None, reason: str) -> None:
        self.event("refused", pid=pid, reason=reason)
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(f"ERR {reason}\n".encode())
        sock.close()

    # == extension: service no peer can stall (Note [Fair service], daemon_conn.py) --------

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
            try:
                self.handle(conn, line)
            except Exception as exc:  # noqa: BLE001 - Note [One peer's line cannot stop the reclaim]
                self.internal_error(conn, line, exc)
        if conn.eof and conn.sock in self.conns:  # the peer closed or died
            self.drop(conn, "disconnected in the middle of a line" if conn.inbox else None)

    def hung_up(self, conn: Conn) -> None:
        """A reply could not be sent: the peer has closed. The complete lines it sent before
        closing still count (a REGISTER names a file it made and may have died holding), even
        past this turn's budget: read them all, serve them with nobody to answer, drop it."""
        conn.gone = True  # replies are thrown away from now on
        while conn.receive():
            if not conn.pending:  # EAGAIN: nothing more readable, and no end of file either
                break
        conn.eof = True  # serve_lines: no budget once the peer is gone, then drop
        self.serve_lines(conn)

    def internal_error(self, conn: Conn, line: bytes, exc: Exception) -> None:
        """A bug of ours met `line`: log it with its traceback, answer ERR, keep serving."""
        trace = "".join(traceback.format_exception(exc))[-2000:]
        self.event("refused", pid=conn.pid, reason=f"internal error on {line[:40]!r}: {trace}")
        if conn.sock in self.conns and not line.startswith(b"FREE"):  # FREE has no reply
            conn.queue("ERR internal error")

    def evict_idle(self) -> float:
        """Drop new connections that never finished a line, or sit in the middle of one, for
        idle_timeout_s; return the seconds until the next may be due (Note [Who may be
        evicted])."""
        now, due = time.monotonic(), self.idle_timeout_s
        for conn in [c for c in self.conns.values()
                     if c.kind == "new" and not (c.spoke and not c.inbox)]:
            left = conn.heard + self.idle_timeout_s - now
            if left <= 0:
                self.drop(conn, f"{'in the middle of a line' if conn.inbox else 'silent'} "
                          f"for {self.idle_timeout_s:g} s: evicted")
            else:
                due = min(due, left)
        return max(due, 0.01)

    def evict_one_new(self) -> bool:
        """The table is full: evict the longest-idle new connection, if any, for a newcomer."""
        idle = [c for c in self.conns.values() if c.kind == "new"]
        if not idle:
            return False
        self.drop(min(idle, key=lambda c: c.heard), "evicted to admit a newcomer "
                  f"({self.max_clients} connections open)")
        return True

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

    def last_flush(self, within: float) -> None:
        """Give observers up to `within` seconds to take what is queued for them."""
        end = time.monotonic() + within
        behind = [c for c in self.conns.values() if c.outbox and not c.doomed]
        while behind:
            behind = [c for c in behind if c.flush() and c.outbox]
            if not behind or time.monotonic() >= end:
                return
            time.sleep(0.005)


def raise_fd_limit() -> int:
    """Raise our soft RLIMIT_NOFILE to the hard limit (any process may); return the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:  # the kernel caps fds at fs.nr_open anyway
        with open("/proc/sys/fs/nr_open") as f:
            hard = int(f.read())
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return hard
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))
        return hard
    return soft


def default_max_clients(nofile: int) -> int:
    """Connections our fd limit can hold: a socket and a pidfd each, after our own fds."""
    return max(1, (nofile - FD_RESERVE) // 2)


def main(argv: list[str] | None = None) -> int:
    try:
        os.setsid()  # own session and process group: Ctrl-C / a kernel interrupt miss us
    except PermissionError:
        pass  # already a group leader (run by hand from a shell): nothing to detach from
    os.chdir("/")  # a daemon should not keep its starter's working directory busy
    try:
        args = parse_options(sys.argv[1:] if argv is None else argv)
        nofile = raise_fd_limit()  # then the table is what the limit holds, unless told
        max_clients = args.max_clients or default_max_clients(nofile)
        manager = Manager(args.grace, max_clients, args.max_observers, args.log_bytes,
                          args.idle_timeout)
    except Exception as exc:  # the starter reads exactly one line: make it say why
        print(f"ERROR: {exc}", flush=True)
        return 1
    manager.event("started", pid=os.getpid(), reason=f"grace {manager.grace_s} s, at most "
                  f"{manager.max_clients} connections")
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
