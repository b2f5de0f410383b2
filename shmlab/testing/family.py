"""A producer and a consumer of one library, driven command by command, and what they leave.

It checks what torch_shm_manager promises (and shmlab.manager with it): after a family
dies, every file it made and its manager are gone within the grace period (2 s) plus
scheduling slack. The stress tool kills families at random points; the
file_system and fault tests run the same steps one by one, beside torch.

Each member is a holder child behind an ``Actor``: the keyed commands of
``shmlab.harness.holder`` plus the family's own (``commands``), which act on the tensors kept
under ``FAMILY``; the two share one Queue for the tensors. ``fam.ask("producer", "share", 2,
1024)`` runs one command and returns its reply.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import signal
import time

import psutil

from .. import _shm
from ..harness import holder
from ..harness.actor import Actor, ActorDied, ActorError
from ..harness.libs import load
from ..introspect import SHM_DIR

RECLAIM_LIMIT_S = 3.0  # the promise: grace (2 s) + 1 s, from the last exit to the last removal
PREFIX = {"shmlab": _shm.PREFIX, "torch": "torch"}  # names: <prefix>_<creator pid>_<rand>_<n>
FAMILY = "family"  # the key the family's commands keep their tensors under
child_managers = holder.child_managers  # manager daemons started by a pid (via introspect)
segment = holder.segment


class FamilyHolder(holder.Holder):
    """A holder with the family's commands, on the tensors under FAMILY in arrival order."""

    def share(self, n, size, mine=None):
        mine = self.tensors(FAMILY) if mine is None else mine
        for _ in range(n):
            mine.append(self.full(size, len(mine) + 1).share_memory_())
        return {"segments": [segment(t, self.strategy) for t in mine],
                "managers": child_managers()}

    def put(self, flush=True, last=None):
        mine = self.tensors(FAMILY)
        for t in mine[-last:] if last else mine:  # last=k: only the k newest (the stress rounds)
            self.dataq.put(t)
        if flush:  # only for a few messages: a full pipe (64 KiB) waits for the consumer
            self.dataq.close()
            self.dataq.join_thread()  # every message is in the pipe now: "in flight"
        return {}

    def get(self, n, timeout):
        mine = self.tensors(FAMILY)
        for _ in range(n):
            mine.append(self.dataq.get(timeout=timeout))
        return self.read()

    def read(self):
        mine = self.tensors(FAMILY)
        return {"values": [float(t.numpy().reshape(-1)[0]) if t.numel() else None
                           for t in mine],
                "segments": [segment(t, self.strategy) for t in mine],
                "own_managers": child_managers()}

    def fork_share(self):
        """Fork a grandchild that shares one tensor and reports which manager it used."""
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the grandchild: no multiprocessing machinery, report and leave
            code = 1
            try:
                os.close(rfd)  # (we never drop the parent's tensors here: that would free them)
                os.write(wfd, json.dumps(self.share(1, 4, mine=[])).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(wfd)
        with os.fdopen(rfd, "rb") as r:
            raw = r.read()
        os.waitpid(pid, 0)
        return json.loads(raw)

    def limit_fds(self, nofile):
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, self.nofile[1]))
        return self.fds()

    def reset_manager(self):
        """shmlab only: forget a dead manager, as its ManagerError says to."""
        from ..manager import client  # only here and below: a torch family never needs it

        client.reset()
        return {}

    def drop_manager(self):
        """shmlab only: hang up on every manager without BYE, as a connection cut by a fault
        would; this process lives on and the next request reconnects (``get_client``)."""
        from ..manager import client

        dropped = 0
        for c in list(client._clients.values()):
            with c._lock:  # no request of ours is half-way through it
                dropped += not c.closed
                c._close_locked()  # close() would say BYE first: "I left", which we did not
        return {"dropped": dropped}


def commands(lib: str, dataq, strategy: str | None = None) -> dict:
    """The holder's keyed table (``shmlab.harness.holder.commands``) plus the family's:

    =============  ========================  ===============================================
    name           arguments                 reply
    =============  ========================  ===============================================
    share          N, SIZE                   {"segments", "managers"}: N more tensors of SIZE
                                             float32, the k-th held full of k, shared
    put            FLUSH=True, LAST=None     {}; all of them (or the LAST newest) onto dataq
                                             (FLUSH: and close it, so only once)
    get            N, TIMEOUT                like ``read``, after taking N off dataq
    read           -                         {"values" ([0] each), "segments", "own_managers"}
    release        -                         {}; lets go of everything held (any key), gc
    fork_share     -                         ``share(1, 4)``'s reply, from a fork grandchild
    limit_fds      NOFILE                    like ``fds``, after setting the soft limit
    reset_manager  -                         {}; shmlab only: forget a dead manager
    drop_manager   -                         {"dropped"}; shmlab only: hang up on the
                                             managers without BYE (a cut connection)
    =============  ========================  ===============================================

    ``segments`` entries are (manager handle, bare name), or None under file_descriptor.
    """
    holder.FdArrivals.install()
    h = FamilyHolder(lib, dataq, strategy)
    return {**holder.table(h),
            "share": h.share, "put": h.put, "get": h.get, "read": h.read, "release": h.release,
            "fork_share": h.fork_share, "limit_fds": h.limit_fds,
            "reset_manager": h.reset_manager, "drop_manager": h.drop_manager}


class Family:
    """A producer and a consumer of one library, started here, commanded through Actors."""

    def __init__(self, lib: str, strategy: str, method: str = "fork",
                 consumer_method: str | None = None):
        self.lib, self.strategy, self.prefix = lib, strategy, PREFIX[lib]
        load(lib)  # import before forking, so children start at once
        ctx = multiprocessing.get_context(method)
        cctx = multiprocessing.get_context(consumer_method or method)
        self.data = cctx.Queue()  # from the stricter context: usable by both kinds of child
        self.procs = {role: Actor(commands, lib, self.data, strategy, ctx=c,
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
