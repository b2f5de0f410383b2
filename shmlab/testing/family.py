"""A producer and a consumer of one library, driven command by command, and what they leave.

It checks what torch_shm_manager promises (and shmlab.manager with it): after a family
dies, every file it made and its manager are gone within the grace period (2 s) plus
scheduling slack. The stress tool kills families at random points; the
file_system and fault tests run the same steps one by one, beside torch.

Each member is a holder child (``shmlab.demo.holder``) behind an ``Actor``; the two share
one Queue for the tensors. ``fam.ask("producer", "share", 2, 1024)`` runs one command of
the holder's table and returns its reply.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import psutil

from .. import _shm
from ..demo import holder
from ..demo.actor import Actor, ActorDied, ActorError
from ..demo.libs import load
from ..introspect import SHM_DIR

RECLAIM_LIMIT_S = 3.0  # the promise: grace (2 s) + 1 s, from the last exit to the last removal
PREFIX = {"shmlab": _shm.PREFIX, "torch": "torch"}  # names: <prefix>_<creator pid>_<rand>_<n>
child_managers = holder.child_managers  # manager daemons started by a pid (via introspect)


class Family:
    """A producer and a consumer of one library, started here, commanded through Actors."""

    def __init__(self, lib: str, strategy: str, method: str = "fork",
                 consumer_method: str | None = None):
        self.lib, self.strategy, self.prefix = lib, strategy, PREFIX[lib]
        load(lib)  # import before forking, so children start at once
        ctx = multiprocessing.get_context(method)
        cctx = multiprocessing.get_context(consumer_method or method)
        self.data = cctx.Queue()  # from the stricter context: usable by both kinds of child
        self.procs = {role: Actor(holder.commands, lib, self.data, strategy, ctx=c,
                                  name=f"{lib}-{role}")
                      for role, c in (("producer", ctx), ("consumer", cctx))}
        self.exited: dict[str, float] = {}
        self.managers: set[int] = set()
        self._pids: dict[str, int] = {}

    @property
    def pids(self) -> dict[str, int]:
        """Each member's pid, once it is ready (its library loaded, its strategy set)."""
        if not self._pids:
            self._pids = {role: actor.ready(90) for role, actor in self.procs.items()}
        return self._pids

    # commands
    def send(self, role: str, cmd: str, *args) -> None:
        """Send a command without waiting for its reply (``reply`` takes them in order)."""
        self.pids  # noqa: B018 - a kill "before share" still means after the member is ready
        self.procs[role].send(cmd, *args)

    def reply(self, role: str, timeout: float = 30):
        out = self.procs[role].reply(timeout)
        if isinstance(out, dict):
            self.managers.update(out.get("managers") or ())
        return out

    def ask(self, role: str, cmd: str, *args, timeout: float = 30, check: bool = True):
        """Run one command; with ``check=False`` a member's error comes back as
        ``{"error": [type name, message]}`` instead of raising ActorError."""
        self.send(role, cmd, *args)
        try:
            return self.reply(role, timeout)
        except ActorDied:
            raise
        except ActorError as exc:
            if check:
                raise
            return {"error": [exc.type, exc.message]}

    # ends of life
    def kill(self, *roles: str) -> None:
        """SIGKILL the members named (all at once, then reap them)."""
        self.pids  # noqa: B018 - "before share" still means after the member is ready
        for role in roles:
            os.kill(self.procs[role].pid, signal.SIGKILL)
        for role in roles:
            self._joined(role)

    def finish(self, *roles: str, timeout: float = 30) -> None:
        """Ask members to exit normally (they release what they hold on the way out)."""
        for role in roles:
            try:
                self.ask(role, "exit", timeout=timeout)
            except ActorDied:  # it died on the way out (torch can abort there)
                pass
        for role in roles:
            self._joined(role, timeout)

    def _joined(self, role: str, timeout: float = 30) -> None:
        if self.procs[role].join(timeout) is None:
            raise TimeoutError(f"{self.lib} {role} did not exit within {timeout} s")
        self.exited.setdefault(role, time.monotonic())

    @property
    def last_exit(self) -> float | None:
        """When the last member that has exited did (the family may live on: in_flight)."""
        return max(self.exited.values(), default=None)

    # what it left
    def files(self) -> list[str]:
        """Our members' files in /dev/shm, by the name pattern (their pids are in the names).

        One listdir (~10 us): ``introspect.shm_segments()`` reads every process's stat too
        (~2 ms), too slow for ``wait_reclaimed``, which polls this every 5 ms.
        """
        mine = tuple(f"{self.prefix}_{pid}_" for pid in self.pids.values())
        try:
            return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(mine))
        except FileNotFoundError:
            return []

    def live_managers(self) -> list[int]:
        """The managers we have seen that still run (a zombie has stopped serving)."""
        alive = []
        for pid in sorted(self.managers):
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    def close(self) -> None:
        """Kill whatever still runs (a failed test must not leave members behind)."""
        for actor in self.procs.values():
            actor.kill()
        self.data.close()
        self.data.join_thread()


def wait_reclaimed(families: list[Family], deadline_s: float = 6.0, poll_s: float = 0.005
                   ) -> list[dict]:
    """Watch each exited family's files and managers until all are gone or `deadline_s`
    after its last exit. Per family: reclaim_s (last exit -> last file gone; None if it left
    no file), managers_s (-> last manager gone), files_left, managers_left."""
    out = [{"files_at_exit": f.files(), "managers_at_exit": f.live_managers(), "reclaim_s": None,
            "managers_s": None} for f in families]
    pending = set(range(len(families)))
    while pending:
        now = time.monotonic()
        for i in sorted(pending):
            fam, rec = families[i], out[i]
            files, mgrs = fam.files(), fam.live_managers()
            if not files and rec["reclaim_s"] is None and rec["files_at_exit"]:
                rec["reclaim_s"] = now - fam.last_exit
            if not mgrs and rec["managers_s"] is None and rec["managers_at_exit"]:
                rec["managers_s"] = now - fam.last_exit
            if (not files and not mgrs) or now - fam.last_exit > deadline_s:
                rec["files_left"], rec["managers_left"] = files, mgrs
                pending.discard(i)
        time.sleep(poll_s)
    return out
