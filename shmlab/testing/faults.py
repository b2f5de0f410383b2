"""Faults to throw at a running manager: stalls, observer floods, oversized STATUS, bad lines.

Mirrors: nothing in torch; these are the attacks a busy or hostile box makes on a manager, as
reusable functions, so tests and the stress tool (`python -m shmlab stress --faults ...`)
inject exactly the same faults.

Every function takes the manager's handle (its socket path, bytes or str) or its pid, works
on real sockets and real /dev/shm files, and returns what it did, so the caller can check the
one rule afterwards: **no live segment was unlinked**. Nothing here waits on the manager
without a timeout, and everything opened is closed by the caller through the returned object
(`close_all`), so a test can leave nothing behind.

    stall(pid, seconds)                  SIGSTOP the manager, sleep, SIGCONT (always)
    stall_later(pid, rng, lo, hi, ...)   a thread that does that at a random moment
    flood_observers(handle, n)           n WATCH connections that never read
    fill(handle, n)                      n real 64-byte segments registered on one connection
    free_flood(handle, nbytes)           nbytes of bad "FREE" lines, replies never read
    status_storm(handle, threads, s)     threads asking STATUS back to back for s seconds
    bad_lines(handle, rng)               a few connections sending floods of bad lines
    register_latency(handle, n)          n REGISTER round trips (seconds each) on a fresh conn

For the stress tool, `start(kind, handle, pid, rng)` begins one fault of KINDS against a live
family's manager in the background and returns a `Fault`; `fault.stop()` ends it, cleans up
everything it made and returns a record (what it did) to put beside the trial's figures.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import secrets
import signal
import socket
import threading
import time

from .._shm import PREFIX, SHM_DIR

KINDS = ("stall", "observers", "big_status", "bad_lines", "status_storm")
_made = itertools.count()  # makes every name of ours unique, whatever the random part says

TIMEOUT_S = 10.0  # no fault function waits on the manager longer than this per reply


def _path(handle: bytes | str) -> str:
    return handle.decode() if isinstance(handle, bytes) else handle


def connect(handle: bytes | str, timeout: float = TIMEOUT_S, rcvbuf: int | None = None):
    """A raw connection to the manager (optionally with a tiny receive buffer)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if rcvbuf is not None:  # set before connect: a small buffer fills after a few events
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect(_path(handle))
    return sock


def close_all(socks) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.close()


def readline(sock: socket.socket, buf: bytearray) -> bytes:
    """One reply line from `sock` ('' at end of file), keeping the rest in `buf`."""
    while b"\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


# -- stalls -------------------------------------------------------------------------------------
def stall(pid: int, seconds: float) -> float:
    """SIGSTOP `pid` for `seconds`, then SIGCONT, even if we are interrupted. Returns seconds."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    return seconds


def stall_later(pid: int, rng: random.Random, lo: float = 0.5, hi: float = 3.0,
                within: float = 1.0) -> threading.Thread:
    """Start a thread that waits uniform(0, within) s, then stalls `pid` for uniform(lo, hi) s.

    The thread's `.at_s` and `.stall_s` say what it chose; join() it before checking.
    """
    at, length = rng.uniform(0.0, within), rng.uniform(lo, hi)

    def run():
        time.sleep(at)
        with contextlib.suppress(ProcessLookupError):  # the manager may be gone by then
            stall(pid, length)

    thread = threading.Thread(target=run, name=f"stall-{pid}", daemon=True)
    thread.at_s, thread.stall_s = at, length
    thread.start()
    return thread


# -- observers, big replies, bad lines ---------------------------------------------------------
def flood_observers(handle: bytes | str, n: int) -> list[socket.socket]:
    """n connections that send WATCH and never read (tiny receive buffers): close_all() them."""
    socks = []
    try:
        for _ in range(n):
            sock = connect(handle, rcvbuf=1024)
            sock.sendall(b"WATCH\n")
            socks.append(sock)
    except OSError:
        close_all(socks)
        raise
    return socks


def make_segment(tag: str = "fault") -> str:
    """A real 64-byte /dev/shm file with a shmlab name; the caller unlinks it (`unlink_all`)."""
    name = f"{PREFIX}_{os.getpid()}_{tag}{secrets.randbelow(10**9)}_{next(_made)}"
    fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.write(fd, bytes(64))
    finally:
        os.close(fd)
    return name


def unlink_all(names) -> int:
    """Unlink the files still there; returns how many were still there (= not reclaimed)."""
    left = 0
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))
            left += 1
    return left


def alive(names) -> int:
    """How many of `names` still exist in /dev/shm."""
    return sum(os.path.lexists(os.path.join(SHM_DIR, n)) for n in names)


def fill(handle: bytes | str, n: int, pid: int | None = None):
    """Make n real segments and REGISTER them, pipelined, on one new connection.

    Returns (sock, names): the connection is now a client that keeps the names alive; say
    `sock.sendall(b"BYE\\n")` before closing it to leave cleanly. Raises if any reply is
    not OK.
    """
    sock, buf = connect(handle), bytearray()  # first: an open connection keeps it serving
    names: list[str] = []
    try:
        names.extend(make_segment() for _ in range(n))
        pid = os.getpid() if pid is None else pid
        for i in range(0, n, 512):  # pipelined in batches, so no buffer ever fills
            batch = names[i:i + 512]
            sock.sendall(b"".join(f"REGISTER {pid} {nm}\n".encode() for nm in batch))
            for nm in batch:
                reply = readline(sock, buf)
                if reply != b"OK":
                    raise RuntimeError(f"REGISTER {nm} answered {reply!r}")
    except BaseException:
        sock.close()
        unlink_all(names)
        raise
    return sock, names


def free_flood(handle: bytes | str, nbytes: int) -> socket.socket:
    """Send `nbytes` of b"FREE\\n" (a bad line each) and never read; returns the connection."""
    sock = connect(handle, timeout=2.0)
    chunk = b"FREE\n" * 13108  # 64 KiB
    sent = 0
    with contextlib.suppress(OSError):  # the manager may close us: that is an answer too
        while sent < nbytes:
            sock.sendall(chunk[: nbytes - sent])
            sent += min(len(chunk), nbytes - sent)
    return sock


def status_storm(handle: bytes | str, threads: int = 2, seconds: float = 2.0) -> dict:
    """`threads` threads send STATUS back to back for `seconds`, reconnecting after an error
    (as a polling widget would); counts answers, errors and the slowest answer."""
    counts = {"answers": 0, "errors": 0, "slowest_s": 0.0}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run():
        while time.monotonic() < stop:
            t0, ok = time.monotonic(), False
            try:
                with connect(handle, timeout=max(0.1, stop - t0)) as sock:
                    buf = bytearray()
                    while time.monotonic() < stop:
                        t0 = time.monotonic()
                        sock.sendall(b"STATUS\n")
                        ok = readline(sock, buf).startswith(b"{")
                        if not ok:
                            break
                        with lock:
                            counts["answers"] += 1
                            counts["slowest_s"] = max(counts["slowest_s"], time.monotonic() - t0)
            except (OSError, ValueError):
                ok = False
            if not ok and time.monotonic() < stop:
                with lock:
                    counts["errors"] += 1

    pool = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(seconds + TIMEOUT_S)
    return counts


def register_latency(handle: bytes | str, n: int = 20, timeout: float = 1.0) -> list[float]:
    """n REGISTER round trips of names that need not exist; seconds each (inf: no answer in
    `timeout`). Says BYE afterwards, so the connection leaves cleanly."""
    out = []
    try:
        sock, buf = connect(handle, timeout=timeout), bytearray()
    except OSError:
        return [float("inf")] * n
    with sock:
        for i in range(n):
            t0 = time.monotonic()
            try:
                sock.sendall(f"REGISTER {os.getpid()} {PREFIX}_{os.getpid()}_lat_{i}\n".encode())
                ok = readline(sock, buf) == b"OK"
            except OSError:
                ok = False
            out.append(time.monotonic() - t0 if ok else float("inf"))
        with contextlib.suppress(OSError):
            sock.sendall(b"BYE\n")
    return out


def bad_lines(handle: bytes | str, rng: random.Random) -> tuple[list[socket.socket], int]:
    """1-4 connections, each sending one kind of garbage until the manager cuts it off:
    bad FREE lines (no reply), unknown commands (an ERR each, never read), or one line
    longer than MAX_LINE. Returns (connections, bytes sent); close_all() them."""
    socks, sent = [], 0
    for _ in range(rng.randint(1, 4)):
        what = rng.choice(("free", "unknown", "long"))
        if what == "free":
            socks.append(free_flood(handle, rng.randint(64 << 10, 2 << 20)))
            continue
        chunk = b"XYZZY 1 2\n" * 6554 if what == "unknown" else b"x" * 8192  # no newline
        try:
            sock = connect(handle, timeout=2.0)
        except OSError:
            continue
        socks.append(sock)
        with contextlib.suppress(OSError):  # cut off (or back-pressured): that is the point
            for _ in range(rng.randint(1, 16)):
                sock.sendall(chunk)
                sent += len(chunk)
    return socks, sent


# -- one fault in the background, for the stress tool -------------------------------------------
class Fault:
    """A fault running against one manager; stop() ends it and says what it did."""

    def __init__(self, kind: str, handle: bytes | str, pid: int, rng: random.Random):
        self.kind, self.record = kind, {"fault": kind}
        self._socks: list[socket.socket] = []
        self._names: list[str] = []
        self._thread: threading.Thread | None = None
        if kind == "stall":  # SIGSTOP 0.5-3 s, starting within the next 0.5 s
            self._thread = stall_later(pid, rng, 0.5, 3.0, within=0.5)
            self.record.update(at_s=round(self._thread.at_s, 3),
                               stall_s=round(self._thread.stall_s, 3))
        elif kind == "observers":  # 100-400 WATCH connections that never read
            self._socks = flood_observers(handle, rng.randint(100, 400))
            self.record["observers"] = len(self._socks)
        elif kind == "big_status":  # 4,000-9,000 extra names, then 20 unread 1000-name pages
            n = rng.randint(4000, 9000)
            self._thread = threading.Thread(target=self._big_status, args=(handle, n),
                                            daemon=True)
            self._thread.start()
            self.record["names"] = n
        elif kind == "bad_lines":  # floods of bad lines on 1-4 connections, in a thread
            self._thread = threading.Thread(target=self._bad_lines, args=(handle, rng),
                                            daemon=True)
            self._thread.start()
        elif kind == "status_storm":  # 0-4,000 extra names, 2-8 STATUS callers for 0.5-2 s
            n, threads, seconds = rng.randint(0, 4000), rng.randint(2, 8), rng.uniform(0.5, 2)
            self._thread = threading.Thread(target=self._storm, args=(handle, n, threads,
                                                                      seconds), daemon=True)
            self._thread.start()
            self.record.update(names=n, threads=threads, seconds=round(seconds, 3))
        else:
            raise ValueError(f"unknown fault {kind!r}: one of {KINDS}")

    def _fill(self, handle, n: int):
        """Register `n` names of ours (FREEd in stop()); the socket, or None on failure."""
        try:
            sock, names = fill(handle, n)
        except (OSError, RuntimeError) as exc:
            self.record["error"] = repr(exc)
            return None
        self._socks.append(sock)
        self._names.extend(names)
        return sock

    def _big_status(self, handle, n: int) -> None:
        sock = self._fill(handle, n)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.sendall(b"STATUS 0 1000\n" * 20)

    def _bad_lines(self, handle, rng: random.Random) -> None:
        try:
            socks, sent = bad_lines(handle, rng)
        except OSError as exc:
            self.record["error"] = repr(exc)
            return
        self._socks.extend(socks)
        self.record.update(connections=len(socks), bytes=sent)

    def _storm(self, handle, n: int, threads: int, seconds: float) -> None:
        if n and self._fill(handle, n) is None:  # names make every STATUS answer bigger
            return
        self.record.update(status_storm(handle, threads, seconds))

    def active(self) -> bool:
        """Is the fault still going on (a stall not over, a flood still being sent)?"""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> dict:
        """End the fault (SIGCONT is guaranteed by stall()), say BYE, unlink what we made."""
        if self._thread is not None:
            self._thread.join(timeout)
        if self.kind == "big_status" and self._socks:  # take our answers, or the manager
            with contextlib.suppress(OSError, ValueError):  # sees a hang-up, not a BYE
                buf = bytearray()
                self.record["pages"] = sum(readline(self._socks[0], buf).startswith(b"{")
                                           for _ in range(20))
        self.record["own_names_unlinked"] = unlink_all(self._names)  # ours, not the family's
        for sock in self._socks:
            with contextlib.suppress(OSError):  # FREE what is gone, so the registry shrinks;
                sock.sendall(b"".join(f"FREE {os.getpid()} {n}\n".encode() for n in self._names)
                             + b"BYE\n")  # BYE is harmless on an observer
        close_all(self._socks)
        return self.record


def start(kind: str, handle: bytes | str, pid: int, rng: random.Random) -> Fault:
    """Begin one fault of KINDS against the manager at `handle` (daemon pid `pid`)."""
    return Fault(kind, handle, pid, rng)
