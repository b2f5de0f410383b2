"""Crash one side of a tensor hand-off and watch the segment: its memory, its file, its fds.

Notebook 12, claims C12.20 - C12.23. Three cases, each under both strategies, each on torch and
on shmlab (``CASES``):

* ``consumer dies``: the consumer C received the tensor and holds it; C is SIGKILLed; then the
  producer P drops its own reference; then P ends.
* ``producer dies``: C is at work (it already took a small tensor from P); P puts the tensor
  on the queue (the message is in the pipe) and is SIGKILLed before C takes it; then C takes
  the message and drops what it got; then C ends.
* ``never received``: P puts the tensor on the queue and drops it; nobody ever calls ``get``;
  then P ends.

Each scenario ends its last process with SIGKILL *after* that process let go of everything: a
clean exit would free nothing a kill does not, and a kill makes the end one exact moment to time the
manager's reclaim from (a clean exit closes the manager socket somewhere during interpreter
teardown, which on a loaded machine can take longer than the 2 s grace).

``run(pair, case)`` returns the timeline: a ``look()`` after every action. A look is read from
the outside, by path, from ``/dev/shm``, the header, ``/proc/<pid>/fd`` and ``/proc/<pid>/maps``
of P and C only (so it costs a few ms, not a scan of the machine), and never keeps the segment
alive: it opens the file only long enough to read four bytes.

Mirrors: nothing (teaching aid). It drives torch/multiprocessing/reductions.py (what each
strategy pickles), CPython's multiprocessing/resource_sharer.py (the fd of a message in
flight) and torch/lib/libshm/manager.cpp (the reclaim after the last client), through the
holders of ``shmlab.testing.family``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from .._shm import read_refcount
from ..introspect import managers, mapped_by, open_fds, process_table
from ..testing import family

CASES = ("consumer dies", "producer dies", "never received")
RECLAIM_WAIT_S = 15.0  # longest we wait for a manager's reclaim on a loaded machine


@dataclass
class Pair:
    """One producer P and one consumer C (holder actors) on one queue, under one strategy."""

    lib: str
    strategy: str
    P: object
    C: object
    path: str = ""  # the segment: /dev/shm/<name> (under file_descriptor, already unlinked)
    manager: int | None = None  # file_system: the manager daemon P's allocation started
    timeline: list = field(default_factory=list)

    @property
    def pids(self) -> dict[int, str]:
        return {self.P.pid: "P", self.C.pid: "C"}


def start(session, lib: str, strategy: str) -> Pair:
    """Two holders of ``lib`` under ``strategy`` sharing a new queue, both started. They take the
    family's commands too (``share``, then a flushed ``put``: the message is in the pipe)."""
    q = session.queue()
    P, C = (session.actor(family.commands, lib, q, strategy) for _ in "PC")
    pair = Pair(lib, strategy, P, C)
    pair.P.ready(), pair.C.ready()
    return pair


def fds_on(path: str, pid: int) -> int:
    """How many fds of ``pid`` point at ``path`` (an unlinked file's fds too); 0 if it is gone."""
    try:
        return sum(fd.target.removesuffix(" (deleted)") == path for fd in open_fds(pid))
    except Exception:  # noqa: BLE001 - psutil.NoSuchProcess: a dead process holds nothing
        return 0


def look(pair: Pair, moment: str) -> dict:
    """The segment now: file in /dev/shm?, refcount (file_system), fds and mappings by P and C,
    MiB still allocated (0 once nobody can reach it), and whether P's manager still runs."""
    table = {pid: s for pid, s in process_table().items() if pid in pair.pids}
    path, name = pair.path, os.path.basename(pair.path)  # (read only: no count is taken)
    fds = {who: fds_on(path, pid) for pid, who in pair.pids.items() if pid in table}
    mappers = [pair.pids[p] for p in mapped_by([path], table=table)[path]]
    file = name in os.listdir("/dev/shm")
    mib = 0.0
    for probe in ([path] if file else []) + [f"/proc/{p}/fd/{fd.fd}" for p in table
                                              for fd in _fds(p) if fd.target.startswith(path)]:
        try:
            mib = os.stat(probe).st_blocks * 512 / 2**20  # tmpfs pages still allocated
            break
        except OSError:
            continue
    state = {"moment": moment, "file": file, "refcount": _refcount(path) if file else None,
             "fds": fds, "mapped by": mappers, "MiB": round(mib, 2)}
    if pair.manager is not None:
        state["manager alive"] = any(m.pid == pair.manager for m in managers())
    pair.timeline.append(state)
    return state


def _refcount(path: str) -> int | None:
    return read_refcount("/" + os.path.basename(path))


def _fds(pid: int) -> list:
    try:
        return open_fds(pid)
    except Exception:  # noqa: BLE001 - it exited meanwhile
        return []


def _learn_segment(pair: Pair, actor) -> None:
    """The segment's path (from the actor's own fds or its file_system handle), its manager."""
    if pair.strategy == "file_descriptor":
        links = actor("fds")["links"]
        pair.path = links[0]["link"].removesuffix(" (deleted)")
    else:
        pair.manager = next((m.pid for m in managers() if m.ppid == actor.pid), None)


def _wait(predicate, timeout: float = RECLAIM_WAIT_S) -> float | None:
    """Seconds until ``predicate()`` is true, or None after ``timeout``."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            return None
        time.sleep(0.02)
    return round(time.monotonic() - t0, 2)


def _in_flight(pair: Pair) -> float | None:
    """Wait until P's feeder thread has pickled the message: a dup of the fd in P
    (file_descriptor) or the sender's in-flight count on the header (file_system)."""
    if pair.strategy == "file_descriptor":
        return _wait(lambda: fds_on(pair.path, pair.P.pid) >= 2, 10)
    return _wait(lambda: _refcount(pair.path) == 2, 10)


def _end(pair: Pair, actor) -> dict:
    """SIGKILL the last process (its end is then one exact moment, and it holds no tensor by
    now, so a clean exit would free nothing a kill does not); seconds until the segment can no
    longer be reached (no file, no fd, no mapping), counted from the kill (a lower bound for the
    manager's grace) and from the reap (an upper bound); None if it is still there."""
    t0 = time.monotonic()
    actor.kill()
    t1 = time.monotonic()
    if _wait(lambda: not os.path.exists(pair.path)
             and not any(fds_on(pair.path, pid) for pid in pair.pids)) is None:
        return dict.fromkeys(("gone after the last end (s)", "gone after the reap (s)"))
    now = time.monotonic()
    return {"gone after the last end (s)": round(now - t0, 2),
            "gone after the reap (s)": round(now - t1, 2)}


def _make(pair: Pair, numel: int) -> None:
    h = pair.P("make", "t", 1, numel)
    if pair.strategy == "file_system":
        pair.path = f"/dev/shm/{h['name']}"
    _learn_segment(pair, pair.P)


def consumer_dies(pair: Pair, numel: int) -> dict:
    """C holds the tensor and is SIGKILLed; P drops it, then ends."""
    _make(pair, numel)
    pair.P("send", "t")
    pair.C("recv", "t", 1)
    look(pair, "C holds it")
    pair.C.kill()
    look(pair, "C SIGKILLed")
    pair.P("drop", "t")
    look(pair, "P dropped it")
    return _end(pair, pair.P)


def producer_dies(pair: Pair, numel: int) -> dict:
    """P's message is in the pipe when P is SIGKILLed; C takes it, drops it, ends.

    C first receives a small tensor from P, as a consumer that is already at work has: under
    file_system that makes C a client of P's manager, so the manager cannot finish its grace
    (and unlink) between P's death and C's receive, however slow the machine is."""
    pair.P("make", "warm-up", 1, 4)
    pair.P("send", "warm-up")
    pair.C("recv", "warm-up", 1)
    before = {link["link"] for link in pair.P("fds")["links"]}
    got = pair.P("share", 1, numel)["segments"][0]
    if got:  # file_system: (manager, name)
        pair.path = f"/dev/shm/{got[1]}"
        _learn_segment(pair, pair.P)
    else:  # file_descriptor: the fd that is new in P
        (link,) = {link["link"] for link in pair.P("fds")["links"]} - before
        pair.path = link.removesuffix(" (deleted)")
    pair.P("put", True)  # flushed: the message is in the pipe
    look(pair, "message in the pipe")
    pair.P.kill()
    look(pair, "P SIGKILLed")
    recv = pair.C("recv", "t", 1)
    look(pair, "C took the message")
    pair.C("drop", "t")
    look(pair, "C dropped it")
    return {"received": recv["received"], "error": recv["error"], **_end(pair, pair.C)}


def never_received(pair: Pair, numel: int) -> dict:
    """P puts the tensor on the queue and drops it; nobody takes it; P ends."""
    _make(pair, numel)
    pair.C.kill()  # C plays no part: nobody will ever call get()
    pair.P("send", "t")
    _in_flight(pair)
    look(pair, "message in the pipe")
    pair.P("drop", "t")
    look(pair, "P dropped it")
    return _end(pair, pair.P)


RUN = {"consumer dies": consumer_dies, "producer dies": producer_dies,
       "never received": never_received}


def run(pair: Pair, case: str, numel: int = 1 << 20) -> dict:
    """Play ``case`` on ``pair`` (a float32 tensor of ``numel``, 4 MiB by default); return
    {"timeline": [look, ...] with a last look once the segment is gone, "gone after the last
    end (s)" (from the SIGKILL of the last process), "gone after the reap (s)", and for
    "producer dies" what C's receive got}."""
    if case not in RUN:
        raise ValueError(f"case must be one of {CASES}, got {case!r}")
    result = RUN[case](pair, numel)
    if pair.manager is not None:  # it exits right after its reclaim
        _wait(lambda: all(m.pid != pair.manager for m in managers()), 10)
    look(pair, "after the last end")
    return {**result, "timeline": pair.timeline}


def observed(timeline) -> list[tuple]:
    """What a learner sees at each moment (no pids): compare torch's with shmlab's."""
    return [(s["moment"], s["file"], s["refcount"], tuple(sorted(s["fds"].items())),
             tuple(s["mapped by"]), s["MiB"], s.get("manager alive")) for s in timeline]


def freed_at(timeline) -> str:
    """The first moment at which nobody could reach the segment any more (memory freed)."""
    return next(s["moment"] for s in timeline if s["MiB"] == 0 and not s["file"])


def rows(timeline) -> list[list]:
    """One table row per look: moment, file, refcount, fds by P and C, mapped by, MiB, manager."""
    return [[s["moment"], "yes" if s["file"] else "no",
             "" if s["refcount"] is None else s["refcount"],
             " · ".join(f"{who} {n}" for who, n in s["fds"].items()) or "(both gone)",
             ", ".join(s["mapped by"]) or "nobody", s["MiB"],
             {True: "running", False: "exited", None: ""}[s.get("manager alive")]]
            for s in timeline]


HEAD = ["moment", "file in /dev/shm", "refcount", "fds on it", "mapped by", "MiB allocated",
        "manager"]
