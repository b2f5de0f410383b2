"""Checks for lab 4: reclaim, the tracker, its grace period, and its loop under SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
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



def check_tracker(tracker_cls):
    (a,) = _names("t", 1)
    with Cases("Exercise 2: the tracker knows who is connected and what is registered") as c:
        t = tracker_cls()
        c.check(not t.should_exit(now=0.0), "before any client came: keep serving",
                "the manager starts for its first client: exit only after clients came and went")
        t.client_joined("c1", now=0.0)
        t.client_joined("c2", now=0.0)
        t.register("c1", a)
        t.register("c2", a)  # the same name twice (two holders of one segment): one entry
        c.check(t.registered == {a}, f"register() records the name once ({t.registered})",
                "keep the names in the set attribute `registered`")
        t.client_left("c1", now=1.0)
        c.check(not t.should_exit(now=5.0), "one client is still connected: keep serving",
                "exit only when no client is left")
        t.client_left("c2", now=2.0)
        c.check(t.should_exit(now=2.0), "the last client left: time to clean",
                "exit once every client that joined has left")
        t.free(a)
        c.check(a not in t.registered, "free() forgets a name", "remove it from .registered")
        t.free(a)  # a second FREE of the same name (its owner and a reclaim) is harmless
        c.check(t.registered == set(), "a second free() of the same name is harmless",
                "set.discard does not raise for a missing element")


def check_grace(tracker_cls, grace=0.5):
    with Cases("Exercise 3: the grace period, and a client who joins during it") as c:
        t = tracker_cls(grace)
        t.client_joined("c1", now=0.0)
        t.client_left("c1", now=2.0)
        c.check(not t.should_exit(now=2.0 + grace / 2), "inside the grace period: wait",
                "wait `grace` seconds after the last client left")
        c.check(t.should_exit(now=2.0 + grace + 0.01), "after the grace period: time to clean",
                "compare now - (time the last client left) with grace")
        t.client_joined("c2", now=2.0 + grace / 2)
        c.check(not t.should_exit(now=2.0 + grace + 0.01), "a client arriving in the grace "
                "period cancels the clean-up", "while anyone is connected, never exit")
        t.client_left("c2", now=2.0 + grace * 0.75)
        c.check(not t.should_exit(now=2.0 + grace + 0.01), "when that client leaves, the "
                "countdown starts again from its departure",
                "which departure does your countdown measure from, after a join?")
        c.check(t.should_exit(now=2.0 + grace * 1.75 + 0.01), "... and ends `grace` seconds "
                "after it", "measure from the moment the last client left")
        u = tracker_cls(grace)
        u.client_joined("a", now=0.0)
        u.client_joined("b", now=0.0)
        u.client_left("a", now=1.0)
        u.client_left("b", now=3.0)
        c.check(not u.should_exit(now=1.0 + grace + 0.01) and
                u.should_exit(now=3.0 + grace + 0.01), "with two clients, the countdown "
                "starts when the second one leaves", "a departure that leaves somebody "
                "connected starts no countdown")



def check_under_sigkill(serve, tracker_cls, reclaim, grace=1.0):
    names = _names("k", 3)
    (decoy,) = _names("d", 1)
    with Cases("Exercise 4: the manager loop reclaims SIGKILLed producers' segments") as c, \
            _segments(decoy):
        report = run_in_child(_serve_victims, serve, tracker_cls, reclaim, names, grace,
                              timeout=40)
        leaked = [n for n in names if os.path.exists(f"{SHM_DIR}/{n}")]
        for n in leaked:
            os.unlink(f"{SHM_DIR}/{n}")
        if report["raised"] == "NotImplementedError":
            raise NotImplementedError("serve")  # Cases says: not implemented yet
        if report["raised"]:
            print(report["raised"])
            c.check(False, "your serve raised " + report["raised"].strip().splitlines()[-1],
                    "the traceback above starts in the manager process: fix it there")
            return
        events = report["events"]
        print("  producer 1 registered 2 names, freed one and was SIGKILLed; producer 2 "
              f"joined in the grace period, registered 1 and was SIGKILLed.\n"
              f"  Your tracker heard: {events}")
        c.check(events.count("register") == 3, f"the 3 REGISTER lines reached "
                f"tracker.register ({events.count('register')})", "split what recv returns "
                "into lines; each is `REGISTER <name>` or `FREE <name>`")
        c.check("free" in events, "the FREE line reached tracker.free",
                "a name its owner unlinked itself must not stay registered")
        c.check(events.count("left") == 2, f"the EOF of each killed producer reached "
                f"tracker.client_left ({events.count('left')} of 2)", "a SIGKILLed client "
                "sends nothing: its socket reads b'' (EOF), as on a clean exit")
        c.check(not leaked, f"the {len(names) - 1} segments still registered were reclaimed "
                f"({len(leaked)} left)", "when tracker.should_exit(now) says so, reclaim the "
                "registered names; a socket closed but still in the selector breaks the next "
                "client that gets its fd number")
        c.check(os.path.exists(f"{SHM_DIR}/{decoy}"), "an unregistered file survived")
        c.check(sorted(report["returned"] or []) == sorted(names[1:]),
                f"serve returns what reclaim unlinked ({report['returned']})",
                "return reclaim(...)'s list as soon as you have reclaimed")
        took = report["after_s"]
        c.check(took is not None and grace - 0.05 <= took < grace + 2,
                f"it reclaimed {'never' if took is None else f'{took:.2f} s'} after the "
                f"last producer died (grace {grace} s)", "ask should_exit on every turn of "
                "the loop, before you wait for the next event")

def _recording(tracker_cls, events: list):
    """``tracker_cls`` with each event the loop reports appended to ``events``."""

    class Recording(tracker_cls):
        def client_joined(self, client, now):
            events.append("joined")
            return super().client_joined(client, now)

        def client_left(self, client, now):
            events.append("left")
            return super().client_left(client, now)

        def register(self, client, name):
            events.append("register")
            return super().register(client, name)

        def free(self, name):
            events.append("free")
            return super().free(name)

    return Recording



def _serve_victims(serve, tracker_cls, reclaim, names, grace):
    """The learner's loop, serving two producers that are SIGKILLed one after the other.

    Producer 1 registers names[0:2], frees names[0] and is killed; 0.1 s later (inside the
    grace period, once the loop has closed its socket, so its fd number is free again)
    producer 2 connects, registers names[2] and is killed.
    """
    import traceback

    events: list = []
    tracker = _recording(tracker_cls, events)(grace)
    path = os.path.join(tempfile.mkdtemp(prefix="shmlab-lab4-"), "manager.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    died_r, died_w = os.pipe()
    go_r, go_w = os.pipe()
    victims = [_fork_victim(path, names[:2], names[0], died_w, go_w, None),
               _fork_victim(path, names[2:], None, died_w, None, go_r)]
    for fd in (died_w, go_r, go_w):
        os.close(fd)
    returned, raised, done = None, "", None
    try:
        returned = serve(server, tracker, reclaim, time.monotonic() + 20)
        done = time.monotonic()
    except NotImplementedError:
        raised = "NotImplementedError"
    except Exception:
        raised = traceback.format_exc()
    finally:
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
            os.waitpid(victim, 0)
        died = os.read(died_r, 16)
        os.close(died_r)
        server.close()
        os.unlink(path)
        os.rmdir(os.path.dirname(path))
    last = struct.unpack("dd", died)[1] if len(died) == 16 else None
    took = None if done is None or last is None else done - last
    returned = list(returned) if isinstance(returned, (list, set, tuple)) else None
    return {"events": events, "returned": returned, "after_s": took, "raised": raised}


def _fork_victim(path, register, free, died_w, go_w, go_r) -> int:
    """A producer: (wait for ``go_r``,) connect, register and create, free one, die by SIGKILL."""
    pid = os.fork()
    if pid:
        return pid
    try:
        if go_r is not None:
            os.read(go_r, 1)  # producer 1 is dead
            time.sleep(0.1)  # the loop sees its EOF and closes its socket first
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.sendall("".join(f"REGISTER {n}\n" for n in register).encode())
        for n in register:
            _make(n)
        if free:
            os.unlink(f"{SHM_DIR}/{free}")  # released normally by its owner
            sock.sendall(f"FREE {free}\n".encode())
        time.sleep(0.1)  # let the manager read it all before the EOF
        os.write(died_w, struct.pack("d", time.monotonic()))  # CLOCK_MONOTONIC: system-wide
        if go_w is not None:
            os.write(go_w, b"!")
    finally:
        os.kill(os.getpid(), signal.SIGKILL)
    return pid  # never reached
