"""Checks for lab 4: the manager's cleanup loop, first alone, then under SIGKILL."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import tempfile
import time

from .._shm import SHM_DIR
from .report import Cases, run_in_child


def _make(name: str) -> None:
    os.close(os.open(f"{SHM_DIR}/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))


@contextlib.contextmanager
def _segments(*names):
    for n in names:
        _make(n)
    try:
        yield names
    finally:
        for n in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{SHM_DIR}/{n}")


def _names(tag: str, k: int) -> list[str]:
    return [f"shmlab_{os.getpid()}_lab4{tag}_{i}" for i in range(k)]


def check_reclaim(reclaim):
    a, b, decoy = _names("r", 3)
    with Cases("Exercise 1: reclaim what was registered, and nothing else") as c, \
            _segments(a, b, decoy):
        gone = f"shmlab_{os.getpid()}_lab4r_gone"  # registered, then freed by its owner
        done = reclaim({a, b, gone})
        c.check(not os.path.exists(f"{SHM_DIR}/{a}") and not os.path.exists(f"{SHM_DIR}/{b}"),
                "both registered segments are unlinked", "os.unlink('/dev/shm/' + name)")
        c.check(os.path.exists(f"{SHM_DIR}/{decoy}"), "a segment nobody registered survives",
                "never unlink a file you did not register: it may belong to someone else")
        c.check(sorted(done or []) == sorted([a, b]),
                "it returns the names it unlinked (not the one already gone)",
                "a registered name may be gone already: skip FileNotFoundError")


def check_tracker(tracker_cls, grace=0.5):
    (a,) = _names("t", 1)
    with Cases("Exercise 2: the tracker notices the last client leave, then waits") as c, \
            _segments(a):
        t = tracker_cls(grace)
        t.client_joined("c1", now=0.0)
        t.client_joined("c2", now=0.0)
        t.register("c1", a)
        t.client_left("c1", now=1.0)
        c.check(not t.should_exit(now=5.0), "one client is still connected: keep serving",
                "exit only when no client is left")
        t.client_left("c2", now=2.0)
        c.check(not t.should_exit(now=2.0 + grace / 2), "inside the grace period: wait",
                "wait `grace` seconds after the last client left")
        c.check(t.should_exit(now=2.0 + grace + 0.01), "after the grace period: time to clean",
                "compare now - (time the last client left) with grace")
        t.client_joined("c3", now=2.0 + grace / 2)
        c.check(not t.should_exit(now=2.0 + grace + 0.01), "a client arriving in the grace "
                "period cancels the clean-up", "while anyone is connected, never exit")
        t.client_left("c3", now=2.0 + grace * 0.75)
        c.check(not t.should_exit(now=2.0 + grace + 0.01), "when that client leaves, the "
                "countdown starts again from its departure",
                "which departure does your countdown measure from, after a join?")
        c.check(t.should_exit(now=2.0 + grace * 1.75 + 0.01), "... and ends `grace` seconds "
                "after it", "measure from the moment the last client left")
        t.free(a)
        c.check(a not in t.registered, "free() forgets a name", "remove it from .registered")


def check_under_sigkill(tracker_cls, reclaim, grace=0.5):
    names = _names("k", 3)
    (decoy,) = _names("d", 1)
    with Cases("Exercise 3: a SIGKILLed producer's segments are reclaimed") as c, \
            _segments(decoy):
        report = run_in_child(_manager_and_victim, tracker_cls, reclaim, names, grace,
                              timeout=30)
        leaked = [n for n in names if os.path.exists(f"{SHM_DIR}/{n}")]
        for n in leaked:
            os.unlink(f"{SHM_DIR}/{n}")
        c.check(report["killed"], "the producer was killed with SIGKILL after registering")
        c.check(not leaked, f"all {len(names)} of its segments were reclaimed",
                "reclaim when should_exit says so, and unlink every registered name")
        c.check(os.path.exists(f"{SHM_DIR}/{decoy}"), "an unregistered file survived")
        took = report["reclaim_after_s"]
        c.check(took is not None and grace <= took < grace + 2,
                f"reclaimed {took if took is None else round(took, 2)} s after the last "
                f"client left (grace {grace} s)", "wait the grace period, not less, not forever")


def _manager_and_victim(tracker_cls, reclaim, names, grace):
    """A tiny manager (socket + selector + the learner's tracker) and a producer it serves."""
    tracker = tracker_cls(grace)  # before the fork: if it raises, no producer is left behind
    path = os.path.join(tempfile.mkdtemp(prefix="shmlab-lab4-"), "manager.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    victim = os.fork()
    if victim == 0:  # the producer: register, create, then hang until killed
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        for n in names:
            sock.sendall(f"REGISTER {n}\n".encode())
            _make(n)
        sock.sendall(b"READY\n")
        time.sleep(60)
        os._exit(0)
    sel, left_at, reclaimed_at, killed = selectors.DefaultSelector(), None, None, False
    sel.register(server, selectors.EVENT_READ)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and reclaimed_at is None:
            now = time.monotonic()
            if tracker.should_exit(now=now):
                reclaim(set(tracker.registered))
                reclaimed_at = time.monotonic()
            for key, _ in sel.select(timeout=0.02):
                if key.fileobj is server:
                    conn, _ = server.accept()
                    sel.register(conn, selectors.EVENT_READ)
                    tracker.client_joined(conn.fileno(), now=now)
                    continue
                data = key.fileobj.recv(4096)
                if not data:  # EOF: the client is gone, however it died
                    tracker.client_left(key.fileobj.fileno(), now=now)
                    left_at = now
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                    continue
                for line in data.decode().splitlines():
                    word, _, name = line.partition(" ")
                    if word == "REGISTER":
                        tracker.register(key.fileobj.fileno(), name)
                    elif word == "READY" and not killed:
                        os.kill(victim, signal.SIGKILL)
                        killed = True
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        os.waitpid(victim, 0)
        server.close()
        os.unlink(path)
        os.rmdir(os.path.dirname(path))
    took = None if left_at is None or reclaimed_at is None else reclaimed_at - left_at
    return {"killed": killed, "reclaim_after_s": took}
