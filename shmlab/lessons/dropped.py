"""A live process whose connection to its manager drops: is its segment reclaimed under it?

Notebook 12, claim C12.29: the one rule in which shmlab's manager differs from torch's.
``commands(lib)`` is an actor table (``shmlab.harness.actor``): ``make`` shares one
``file_system`` tensor and notes which socket the library opened to its manager; ``cut``
closes that socket under the library's feet, as a raw-socket experiment (or a bug) would,
while the process lives on and keeps the tensor. ``run(actor)`` then watches the segment's file for
longer than the grace, and SIGKILLs the actor afterwards (freeing the tensor through a closed
socket is not something to ask torch to do: it writes its dealloc message to a dead fd).

Mirrors: torch/lib/libshm/manager.cpp (a client is a connected socket: the last POLLHUP starts
the 2 s grace) beside ``shmlab.manager.liveness`` (a member is a live process, see its Note
[A dropped connection is not a dead process]).

    name     arguments   reply
    make     -           {"name": bare segment name, "sockets": [fd, ...] opened for it}
    cut      -           the fds closed
"""

from __future__ import annotations

import os
import stat
import time

from ..harness.holder import segment
from ..harness.libs import load
from .trackers import watch_gone


def _sockets() -> set[int]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.stat(int(fd)).st_mode):
                found.add(int(fd))
        except OSError:  # the listing's own fd, closed by now
            continue
    return found


def commands(lib: str) -> dict:
    tlib, mp = load(lib)
    mp.set_sharing_strategy("file_system")
    held = {}

    def make():
        before = _sockets()
        held["t"] = tlib.zeros(1024).share_memory_()  # the first allocation: manager + socket
        held["sockets"] = sorted(_sockets() - before)
        return {"name": segment(held["t"], "file_system")[1], "sockets": held["sockets"]}

    def cut():
        for fd in held["sockets"]:
            os.close(fd)  # no BYE, no goodbye of any kind: the socket just closes
        return held["sockets"]

    return {"make": make, "cut": cut}


def run(actor, watch_s: float = 4.0) -> dict:
    """On an actor of ``commands``: make, cut, watch the file for ``watch_s`` (longer than the
    2 s grace) while the process lives; then SIGKILL it and watch again. Seconds until the file
    went, None if it stayed ("already gone" after the kill if it went before)."""
    made = actor("make")
    actor("cut")
    cut_at = time.monotonic()
    while_alive = watch_gone([made["name"]], cut_at, timeout=watch_s)[made["name"]]
    lived = actor.is_alive()
    killed_at = time.monotonic()
    actor.kill()
    after_kill = (watch_gone([made["name"]], killed_at)[made["name"]]
                  if while_alive is None else "already gone")
    return {**made, "gone while it lived (s after the cut)": while_alive,
            "process alive throughout": lived, "gone after its SIGKILL (s)": after_kill}
