"""Watch a segment from the outside while one side of a tensor hand-off crashes.

Notebook 12, claims C12.20 - C12.23. The notebook writes the three cases itself (``CASES``:
a consumer SIGKILLed while it holds the tensor, a producer SIGKILLed with its message in the
pipe, a message never received), each under both strategies, on torch and on shmlab; what it
takes from here only looks.

``look(pair, moment)`` appends what a learner sees to ``pair.timeline``. A look is read from
the outside, by path, from ``/dev/shm``, the header, ``/proc/<pid>/fd`` and ``/proc/<pid>/maps``
of P and C only (so it costs a few ms, not a scan of the machine), and never keeps the segment
alive: it opens the file only long enough to read four bytes. ``rows``, ``observed`` and
``freed_at`` read a timeline back.

Mirrors: nothing (teaching aid). What it observes is torch/multiprocessing/reductions.py (what
each strategy pickles), CPython's multiprocessing/resource_sharer.py (the fd of a message in
flight) and torch/lib/libshm/manager.cpp (the reclaim after the last client).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .._shm import read_refcount
from ..introspect import managers, mapped_by, open_fds, process_table

CASES = ("consumer dies", "producer dies", "never received")


@dataclass
class Pair:
    """One producer P and one consumer C (actors) on one queue, under one strategy."""

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
