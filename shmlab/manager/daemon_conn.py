"""One accepted connection as the daemon sees it: an inbox of lines, an outbox of replies.

Mirrors: ClientSession in torch/lib/libshm/manager.cpp (a socket and a pid), plus the
buffering torch does not need (its only reply is a 2-byte "OK").

Daemon side: only daemon.py uses it. An extension around torch's story (see daemon.py).

Note [Replies are buffered, nobody is dropped for reading slowly]
The manager is one thread serving everybody, so it never blocks on one peer; and it must not
cut off a peer whose reply does not fit the socket buffer at once either, because a cut client
(the family's only one, say) costs the family every segment, and one STATUS answer of 8,000
names is enough to fill a buffer. So:
  * every reply or event is appended to the connection's outbox and sent when the socket is
    writable (the loop asks selectors for EVENT_WRITE while the outbox is not empty);
  * a client whose outbox passes CLIENT_HIGH_WATER is simply not read from until it has
    taken its replies (back-pressure): it is slow, not dead, so it keeps its membership and
    our memory stays bounded by one high-water mark and one reply per client;
  * an observer cannot be back-pressured (events happen anyway), so past OBSERVER_MAX its
    connection is closed after the loop turn, quietly: no event is broadcast about it (an
    event about a dropped observer would go to the other observers, which may be slow too,
    and so on: a recursion that 400 silent observers turn into a crash);
  * the inbox holds at most one recv() beyond the lines not yet served, because we stop
    reading while complete lines are waiting (see Note [Fair service] in daemon.py).
"""

from __future__ import annotations

import selectors
import socket
import time

from .eventlog import RateLimit
from .protocol import MAX_LINE

CLIENT_HIGH_WATER = 64 << 10  # bytes of unsent replies before we stop reading a client
OBSERVER_MAX = 256 << 10  # bytes of unsent events before an observer is dropped
MAX_BAD_LINES = 32  # bad lines from one connection before it is closed
RECV_BYTES = 65536


class LineTooLong(ValueError):
    pass


class Conn:
    """kind: 'new' until it REGISTERs/FREEs ('client') or WATCHes ('observer')."""

    def __init__(self, sock: socket.socket, pid: int):
        self.sock, self.pid, self.kind = sock, pid, "new"
        self.inbox, self.outbox = bytearray(), bytearray()
        self.mask = selectors.EVENT_READ  # what the selector watches for us now
        self.eof = False  # the peer hung up; serve what it sent, then drop it
        self.gone = False  # a send failed: the peer cannot read replies any more
        self.pending = False  # the last receive() got data
        self.said_bye = False
        self.bad_lines = 0
        self.refusals = RateLimit()
        self.doomed: str | None = None  # close after this turn, for this reason (log only)
        # When it connected or last finished a line: one clock for the silent and for the
        # one trickling a line that never ends (see Note [Who may be evicted] in daemon.py).
        self.heard = time.monotonic()
        self.spoke = False  # it has sent one complete line at least

    # -- input ----------------------------------------------------------------------------
    def has_line(self) -> bool:
        return b"\n" in self.inbox

    def receive(self) -> bool:
        """Read what is there; False when the peer has hung up (or the socket failed)."""
        self.pending = False
        try:
            data = self.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.inbox += data
        self.pending = True
        return True

    def next_line(self) -> bytes | None:
        """The next complete line (without b"\\r\\n"), None if only part of one is here."""
        end = self.inbox.find(b"\n")
        if end > MAX_LINE or (end < 0 and len(self.inbox) > MAX_LINE):
            raise LineTooLong(f"line longer than {MAX_LINE} bytes")
        if end < 0:
            return None
        line = bytes(self.inbox[:end]).rstrip(b"\r")
        del self.inbox[:end + 1]
        self.heard, self.spoke = time.monotonic(), True
        return line

    # -- output ---------------------------------------------------------------------------
    def queue(self, text: str) -> None:
        if self.gone:
            return
        self.outbox += text.encode() + b"\n"
        if self.kind == "observer" and len(self.outbox) > OBSERVER_MAX and not self.doomed:
            self.doomed = f"observer not reading its events ({OBSERVER_MAX} bytes behind)"

    def flush(self) -> bool:
        """Send what the socket takes now; False if the peer is gone."""
        while self.outbox:
            try:
                sent = self.sock.send(self.outbox)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            del self.outbox[:sent]
        return True

    def wanted_mask(self) -> int:
        """Read unless lines are waiting or a client is too far behind; write while owed."""
        mask = 0
        if not self.eof and not self.has_line() and (
                self.kind == "observer" or len(self.outbox) < CLIENT_HIGH_WATER):
            mask |= selectors.EVENT_READ
        if self.outbox:
            mask |= selectors.EVENT_WRITE
        return mask
