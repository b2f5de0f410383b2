"""Checks for lab 4: reclaim, the tracker, its grace period, and its loop under SIGKILL.

Mirrors: nothing in torch; the manager is ``torch_shm_manager`` (``torch/lib/libshm/manager.cpp``).
Each check runs in the notebook on the learner's objects, and in the grader's check process on
proxies of them (``remote.place``): which segments are gone is read in ``/dev/shm`` from
outside, and the manager loop with its SIGKILLed clients runs in a fork of the learner's
process (Note [The verdict outside the learner's process]).
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import socket
import struct
import tempfile
import time

from .._shm import SHM_DIR
from ..messages import tr
from .remote import place
from .report import Cases


def _names_set(*names) -> set[str]:
    """A set made next to the learner's code (a set is not plain data: Note [Only plain data
    crosses], in ``wire``)."""
    return set(names)


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
    token = secrets.token_hex(3)  # new on every run: no answer can know the names in advance
    return [f"shmlab_{os.getpid()}_lab4{tag}{token}_{i}" for i in range(k)]


def check_reclaim(reclaim):
    a, b, decoy = _names("r", 3)
    longer = a + "7"  # a's name is a prefix of it: somebody else's segment all the same
    with Cases(tr("Exercise 1: reclaim what was registered, and nothing else")) as c, \
            _segments(a, b, decoy, longer):
        gone = a + "_gone"  # registered, then freed by its owner
        done = reclaim(place(reclaim).run(_names_set, a, b, gone))
        c.check(not os.path.exists(f"{SHM_DIR}/{a}") and not os.path.exists(f"{SHM_DIR}/{b}"),
                tr("both registered segments are unlinked"),
                tr("os.unlink('/dev/shm/' + name)"))
        c.check(os.path.exists(f"{SHM_DIR}/{decoy}"), tr("a segment nobody registered survives"),
                tr("never unlink a file you did not register: it may belong to someone else"))
        c.check(os.path.exists(f"{SHM_DIR}/{longer}"), tr("so does {name}, whose name starts "
                                                          "with a registered one", name=longer),
                tr("a name is registered only if it is exactly that name: compare whole names "
                   "(or just unlink the registered ones)"))
        c.check(sorted(done or []) == sorted([a, b]),  # iterating a proxy reads each name
                tr("it returns the names it unlinked (not the one already gone)"),
                tr("a registered name may be gone already: skip FileNotFoundError"))



def _registered(tracker):
    """The tracker's registered names, sorted; or what it keeps instead of a set."""
    names = tracker.registered
    if isinstance(names, (set, frozenset)):
        return sorted(names)
    return f"a {type(names).__name__}, not a set"


def check_tracker(tracker_cls):
    a, b = _names("t", 2)
    with Cases(tr("Exercise 2: the tracker knows who is connected and what is registered")) \
            as c:
        at = place(tracker_cls)
        t = tracker_cls()
        c.check(not t.should_exit(now=0.0), tr("before any client came: keep serving"),
                tr("the manager starts for its first client: exit only after clients came and "
                   "went"))
        t.client_joined("c1", now=0.0)
        t.client_joined("c2", now=0.0)
        t.register("c1", a)
        t.register("c2", a)  # the same name twice (two holders of one segment): one entry
        c.check(at.run(_registered, t) == [a], tr(
                "register() records the name once ({registered})",
                registered=at.run(_registered, t)),
                tr("keep the names in the set attribute `registered`"))
        t.register("c1", b)  # only c1 holds b
        t.client_left("c1", now=1.0)
        c.check(not t.should_exit(now=5.0), tr("one client is still connected: keep serving"),
                tr("exit only when no client is left"))
        c.check(at.run(_registered, t) == sorted([a, b]), tr(
                "a client who leaves leaves its names registered ({registered})",
                registered=at.run(_registered, t)),
                tr("a client that dies without FREE leaves its segments behind: they are "
                   "exactly what the manager must reclaim later, so keep them"))
        t.client_left("c2", now=2.0)
        c.check(t.should_exit(now=2.0), tr("the last client left: time to clean"),
                tr("exit once every client that joined has left"))
        t.free(a)
        left = at.run(_registered, t)
        c.check(isinstance(left, list) and a not in left, tr("free() forgets a name"),
                tr("remove it from .registered"))
        t.free(a)  # a second FREE of the same name (its owner and a reclaim) is harmless
        t.free(b)
        c.check(at.run(_registered, t) == [], tr("a second free() of the same name is harmless"),
                tr("set.discard does not raise for a missing element"))


def check_grace(tracker_cls, grace=None):
    """``grace``: the period tried; by default two drawn at random, one under a second and
    one over it (a period written into the class instead of taken from its argument fails)."""
    if grace is None:
        for drawn in (random.uniform(0.1, 0.9), random.uniform(1.5, 30.0)):
            _check_grace(tracker_cls, round(drawn, 3))
    else:
        _check_grace(tracker_cls, grace)


def _check_grace(tracker_cls, grace):
    with Cases(tr("Exercise 3: the grace period ({grace} s), and a client who joins during "
                  "it", grace=grace)) as c:
        t = tracker_cls(grace)
        t.client_joined("c1", now=0.0)
        t.client_left("c1", now=2.0)
        c.check(not t.should_exit(now=2.0 + grace / 2), tr("inside the grace period: wait"),
                tr("wait `grace` seconds after the last client left"))
        c.check(t.should_exit(now=2.0 + grace + 0.01), tr("after the grace period: time to "
                                                          "clean"),
                tr("compare now - (time the last client left) with grace"))
        t.client_joined("c2", now=2.0 + grace / 2)
        c.check(not t.should_exit(now=2.0 + grace + 0.01), tr("a client arriving in the grace "
                                                              "period cancels the clean-up"),
                tr("while anyone is connected, never exit"))
        t.client_left("c2", now=2.0 + grace * 0.75)
        c.check(not t.should_exit(now=2.0 + grace + 0.01), tr("when that client leaves, the "
                                                              "countdown starts again from its "
                                                              "departure"),
                tr("which departure does your countdown measure from, after a join?"))
        c.check(t.should_exit(now=2.0 + grace * 1.75 + 0.01), tr("... and ends `grace` seconds "
                                                                 "after it"),
                tr("measure from the moment the last client left"))
        u = tracker_cls(grace)
        u.client_joined("a", now=0.0)
        u.client_joined("b", now=0.0)
        u.client_left("a", now=1.0)
        u.client_left("b", now=3.0)
        c.check(not u.should_exit(now=1.0 + grace + 0.01) and
                u.should_exit(now=3.0 + grace + 0.01),
                tr("with two clients, the countdown starts when the second one leaves"),
                tr("a departure that leaves somebody connected starts no countdown"))



def check_under_sigkill(serve, tracker_cls, reclaim, grace=1.0):
    names = _names("k", 3)
    (decoy,) = _names("d", 1)
    with Cases(tr("Exercise 4: the manager loop reclaims SIGKILLed producers' segments")) \
            as c, \
            _segments(decoy):
        report = place(serve).run_in_child(_serve_victims, serve, tracker_cls, reclaim, names,
                                           grace, timeout=40)
        leaked = [n for n in names if os.path.exists(f"{SHM_DIR}/{n}")]
        for n in leaked:
            os.unlink(f"{SHM_DIR}/{n}")
        if report["raised"] == "NotImplementedError":
            raise NotImplementedError("serve")  # Cases says: not implemented yet
        if report["raised"]:
            print(report["raised"])
            c.check(False, tr("your serve raised {error}",
                              error=report["raised"].strip().splitlines()[-1]),
                    tr("the traceback above starts in the manager process: fix it there"))
            return
        events = report["events"]
        print("  " + tr("a silent client connected; producer 1 registered 2 names and freed "
                        "one; both were SIGKILLed; producer 2 joined in the grace period, "
                        "registered 1 and was SIGKILLed.") + "\n  "
              + tr("Your tracker heard: {events}", events=events))
        c.check(events.count("register") == 3, tr("the 3 REGISTER lines reached "
                                                  "tracker.register ({n})",
                                                  n=events.count("register")),
                tr("split what recv returns into lines; each is `REGISTER <name>` or "
                   "`FREE <name>`"))
        c.check("free" in events, tr("the FREE line reached tracker.free"),
                tr("a name its owner unlinked itself must not stay registered"))
        c.check(events.count("left") == 3, tr("the EOF of each killed client reached "
                                              "tracker.client_left ({n} of 3)",
                                              n=events.count("left")),
                tr("a SIGKILLed client sends nothing: its socket reads b'' (EOF), as on a "
                   "clean exit"))
        c.check("register" in events and "left" in events and
                events.index("register") < events.index("left"),
                tr("producer 1's REGISTER lines were heard while the silent client was still "
                   "connected"),
                tr("wait on every socket at once (the selector) and read only the one that is "
                   "ready: a recv on a client with nothing to say blocks the whole manager"))
        sockets = report["sockets"]
        c.check(sockets == 1, tr("when producer 2 joined, the loop held 1 client socket (its "
                                 "own; held {n})", n=sockets),
                tr("close a client's socket at its EOF (and unregister it): every dead "
                   "client's socket kept is an fd leaked"))
        c.check(not leaked, tr("the {n} segments still registered were reclaimed ({left} "
                               "left)", n=len(names) - 1, left=len(leaked)),
                tr("when tracker.should_exit(now) says so, reclaim the registered names; a "
                   "socket closed but still in the selector breaks the next client that gets "
                   "its fd number"))
        c.check(os.path.exists(f"{SHM_DIR}/{decoy}"), tr("an unregistered file survived"))
        c.check(sorted(report["returned"] or []) == sorted(names[1:]),
                tr("serve returns what reclaim unlinked ({returned})",
                   returned=report["returned"]),
                tr("return reclaim(...)'s list as soon as you have reclaimed"))
        took = report["after_s"]
        c.check(took is not None and grace - 0.05 <= took < grace + 2,
                tr("it reclaimed never after the last producer died (grace {grace} s)",
                   grace=grace) if took is None else
                tr("it reclaimed {took} s after the last producer died (grace {grace} s)",
                   took=f"{took:.2f}", grace=grace),
                tr("ask should_exit on every turn of the loop, before you wait for the next "
                   "event"))

def _sockets() -> int:
    """Sockets this process holds open."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return n


def _recording(tracker_cls, events: list, sockets: list, heard_w: int, left_w: int):
    """``tracker_cls`` with each event the loop reports appended to ``events``, the sockets
    the loop holds at each join appended to ``sockets``, and a byte written to ``heard_w``
    at each REGISTER and to ``left_w`` at each departure (the victims wait for them, so the
    order of events does not depend on how the scheduler treats a loaded machine)."""

    class Recording(tracker_cls):
        def client_joined(self, client, now):
            events.append("joined")
            sockets.append(_sockets())
            return super().client_joined(client, now)

        def client_left(self, client, now):
            events.append("left")
            result = super().client_left(client, now)
            _signal(left_w)
            return result

        def register(self, client, name):
            events.append("register")
            result = super().register(client, name)
            _signal(heard_w)
            return result

        def free(self, name):
            events.append("free")
            return super().free(name)

    return Recording


def _signal(fd: int) -> None:
    """One byte for a victim that waits for it (gone already: nobody waits any more)."""
    with contextlib.suppress(OSError):
        os.write(fd, b"!")


def _serve_victims(serve, tracker_cls, reclaim, names, grace):
    """The learner's loop, serving a silent client and two producers, all SIGKILLed.

    The silent client connects first. Producer 1 then registers names[0:2] and frees
    names[0]; the silent client is killed once the loop has heard a REGISTER (or after 3 s),
    producer 1 after its FREE. Once the loop has seen both leave (so their sockets are closed
    and their fd numbers free again), inside the grace period, producer 2 connects, registers
    names[2] and is killed.
    """
    import traceback

    events: list = []
    sockets: list = []
    heard_r, heard_w = os.pipe()
    left_r, left_w = os.pipe()
    os.set_blocking(heard_w, False)
    os.set_blocking(left_w, False)
    tracker = _recording(tracker_cls, events, sockets, heard_w, left_w)(grace)
    path = os.path.join(tempfile.mkdtemp(prefix="shmlab-lab4-"), "manager.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    base = _sockets()
    died_r, died_w = os.pipe()
    ready_r, ready_w = os.pipe()
    victims = [_fork_silent(path, ready_w, heard_r),
               _fork_victim(path, names[:2], names[0], died_w, ready_r, 1),
               _fork_victim(path, names[2:], None, died_w, left_r, 2)]
    for fd in (died_w, ready_r, ready_w, heard_r, left_r):
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
        for fd in (died_r, heard_w, left_w):
            os.close(fd)
        server.close()
        os.unlink(path)
        os.rmdir(os.path.dirname(path))
    last = struct.unpack("dd", died)[1] if len(died) == 16 else None
    took = None if done is None or last is None else done - last
    returned = list(returned) if isinstance(returned, (list, set, tuple)) else None
    held = sockets[2] - base if len(sockets) > 2 else None
    return {"events": events, "returned": returned, "after_s": took, "raised": raised,
            "sockets": held}


def _wait_for(fd: int, count: int, timeout: float) -> None:
    """Read ``count`` bytes from ``fd``, or give up after ``timeout`` seconds."""
    import select

    end = time.monotonic() + timeout
    while count > 0 and (left := end - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            got = os.read(fd, count)
            if not got:
                return
            count -= len(got)


def _fork_silent(path, ready_w, heard_r) -> int:
    """A client that connects, says nothing, and is SIGKILLed once the loop heard producer 1
    (or 3 s later: a loop that waits on this client alone hears nothing meanwhile)."""
    pid = os.fork()
    if pid:
        return pid
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        os.write(ready_w, b"!")
        _wait_for(heard_r, 1, 3.0)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)
    return pid  # never reached


def _fork_victim(path, register, free, died_w, go_r, go_count) -> int:
    """A producer: wait for ``go_count`` bytes on ``go_r`` (producer 1: the silent client is
    connected; producer 2: two clients have left), connect, register and create, free one,
    die by SIGKILL."""
    pid = os.fork()
    if pid:
        return pid
    try:
        _wait_for(go_r, go_count, 5.0)
        time.sleep(0.05)  # the loop accepts the silent client / closes the sockets first
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
    finally:
        os.kill(os.getpid(), signal.SIGKILL)
    return pid  # never reached
