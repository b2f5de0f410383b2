"""The manager's event log: one JSON line per event, bounded on disk, rate-limited per peer.

Mirrors: nothing in torch (torch_shm_manager logs nothing); the size cap mirrors
logging.handlers.RotatingFileHandler with backupCount=1.

The log is for learners and widgets (`introspect.events()` reads it), so it must never be a
way to fill the disk: past `max_bytes` the file is renamed to events.jsonl.1 (replacing the
previous one) and a fresh events.jsonl is started. On disk: at most twice `max_bytes`.
"""

from __future__ import annotations

import contextlib
import os
import time

LOG_NAME = "events.jsonl"


class EventLog:
    """Append-only lines with one rotation; every OSError is swallowed (see `write`)."""

    def __init__(self, folder: str, max_bytes: int):
        self.path = os.path.join(folder, LOG_NAME)
        self.max_bytes = max_bytes
        self.file = open(self.path, "a", buffering=1)  # noqa: SIM115 - kept open on purpose
        self.size = self.file.tell()

    def write(self, line: str) -> None:
        # A full TMPDIR (or a rotation that fails) must not stop the cleaner: drop the line.
        with contextlib.suppress(OSError, ValueError):  # ValueError: the file was closed
            if self.size + len(line) + 1 > self.max_bytes:
                self._rotate()
            self.file.write(line + "\n")
            self.size += len(line) + 1

    def _rotate(self) -> None:
        self.file.close()
        os.replace(self.path, self.path + ".1")  # readers holding the old file keep reading it
        self.file = open(self.path, "a", buffering=1)  # noqa: SIM115
        self.size = 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()


class RateLimit:
    """A token bucket: `burst` events at once, then `per_s` a second; counts what it held back.

    One per connection for its "refused" events: a peer sending garbage as fast as it can
    gets its first `burst` refusals logged, then a few a second, each carrying how many were
    suppressed since the last one, so the log stays honest without growing with the flood.
    """

    def __init__(self, burst: int = 32, per_s: float = 2.0):
        self.burst, self.per_s = burst, per_s
        self.tokens, self.last = float(burst), time.monotonic()
        self.suppressed = 0

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.per_s)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self) -> int:
        n, self.suppressed = self.suppressed, 0
        return n
