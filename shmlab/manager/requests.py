"""What each request does: REGISTER, FREE, STATUS, WATCH, BYE (and what a bad line costs).

Mirrors: the body of the poll loop in torch/lib/libshm/manager.cpp (register a name on an
AllocInfo, free_used_object on a free one), plus STATUS, WATCH and BYE, which torch lacks.

A mixin of `daemon.Manager`: the loop (daemon.py) hands each complete line to `handle`; these
methods only queue replies and events (conns.py sends them), so none of them can block or
recurse, whatever the peer does.
"""

from __future__ import annotations

import itertools
import json
import os
import time

from .conns import MAX_BAD_LINES, Conn
from .protocol import parse_request, segment_exists

MAX_SEGMENTS = 1 << 18  # a runaway client must not grow our memory without bound


class Requests:
    """The request handlers of `daemon.Manager` (which owns segments, members and kinds)."""

    # -- events: logged, and queued to observers (never sent from here: no recursion) ----
    def event(self, kind: str, pid: int | None = None, name=None, reason=None,
              broadcast: bool = True) -> None:
        line = json.dumps({"t": time.time(), "event": kind, "pid": pid, "name": name,
                           "reason": reason})
        self.log.write(line)
        if broadcast and self.kinds["observer"]:
            for conn in self.conns.values():
                if conn.kind == "observer" and not conn.doomed:
                    conn.queue(line)

    def refused(self, conn: Conn, reason: str, name=None) -> None:
        """A "refused" event, at most a burst and then a few a second per connection."""
        if conn.refusals.allow():
            more = conn.refusals.take_suppressed()
            self.event("refused", pid=conn.pid, name=name,
                       reason=f"{reason} (+{more} more refused, not logged)" if more else reason)

    def handle(self, conn: Conn, line: bytes) -> None:
        try:
            cmd, pid, arg = parse_request(line)
            if cmd == "WATCH" and conn.kind != "new":  # a client must not stop counting
                raise ValueError("WATCH must be the first line of a connection")
        except ValueError as exc:
            conn.bad_lines += 1
            self.refused(conn, str(exc))
            if not line.startswith(b"FREE"):  # FREE gets no reply, good or bad (like torch)
                conn.queue(f"ERR {exc}")
            if conn.bad_lines >= MAX_BAD_LINES:
                conn.doomed = f"{MAX_BAD_LINES} bad lines: closed"
            return
        if cmd == "STATUS":
            conn.queue(self.status(*arg))
        elif cmd == "BYE":
            conn.said_bye = True
        elif cmd == "WATCH":
            if self.kinds["observer"] >= self.max_observers:
                conn.queue(f"ERR too many observers ({self.max_observers})")
                conn.doomed = f"too many observers ({self.max_observers})"
            else:
                self.set_kind(conn, "observer")
        else:
            conn.said_bye = False  # registering again after a BYE: back as a member
            if conn.kind == "new":
                self.set_kind(conn, "client")
                self.members.joined(conn.pid)
                self.deadline = None
                self.event("joined", pid=conn.pid)
            (self.register if cmd == "REGISTER" else self.free)(conn, pid, arg)

    def status(self, offset: int, limit: int) -> str:
        page = sorted(itertools.islice(self.segments, offset, offset + limit))
        end = offset + len(page)
        return json.dumps({"pid": os.getpid(), "clients": self.kinds["client"],
                           "members": len(self.members.kept_alive()),
                           "observers": self.kinds["observer"], "grace_s": self.grace_s,
                           "count": len(self.segments), "offset": offset, "segments": page,
                           "next": end if end < len(self.segments) else None})

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

