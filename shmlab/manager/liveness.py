"""Which processes that registered through the manager are still alive, pid reuse included.

Mirrors: nothing in torch/lib/libshm: torch_shm_manager counts connections only (see Note
[A dropped connection is not a dead process]). The tools are Linux's: SO_PEERCRED (who is
on the other end, in the kernel's word), pidfd_open(2) (a handle on *that* process, which
becomes readable when it exits and can never point at a newer process with the same pid),
and the start time in /proc/<pid>/stat (field 22) where no pidfd can be had (an old kernel,
a full fd table).
"""

from __future__ import annotations

import contextlib
import os
import select

# Note [A dropped connection is not a dead process]
# torch_shm_manager decides "my family is gone" from its sockets alone: when the last
# connection closes (POLLHUP), it waits SHUTDOWN_TIMEOUT (2 s) and unlinks everything it was
# told about. A closed socket is not a dead process, though: a client that timed out and
# closed, a connection we cut for misbehaving, a fork child that closed an inherited copy.
# torch gets away with it because its client never closes on a timeout (socket.h throws and
# keeps the fd). We make the rule explicit instead of relying on that:
#   * every process that ever sent REGISTER or FREE is a *member*, named by SO_PEERCRED's
#     pid (never by the pid written in the line, which is the peer's say-so);
#   * a member leaves in one of two ways only: it says BYE (ManagerClient.close() does), or
#     it is dead: its pidfd is readable, or /proc/<pid> is gone, a zombie, or started at a
#     different time than when we first saw it (the pid was reused by a newer process);
#   * the grace period starts only when no client connection is open AND no member is alive.
# So a stalled manager, a dropped or cut connection, a slow reply: none of them can free a
# live segment. The price is the other way round: a process that closes its socket without
# BYE and lives on (a raw-socket experiment) keeps the manager, and its segments, until it
# exits. Leaking a file for a while is better than unlinking a user's data.


# Note [Asking a pidfd without a ceiling]
# select() takes fd numbers below FD_SETSIZE (1024) only: with ~510 members connected our
# pidfds pass that number and select() raises ValueError, out of the daemon's loop. poll()
# has no such ceiling, and a poll object costs no fd (it is a list handed to one syscall),
# so we ask each pidfd on its own, at no timeout. We do not register pidfds with the
# daemon's selector instead: a pidfd stays readable forever once its process exits, so each
# one would have to be unregistered at the right moment or the loop spins, and the daemon
# only needs the answer for members with no connection open, which it already polls every
# LIVENESS_POLL_S (0.1 s): a wake-up on exit would save at most that.
def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ..." - comm may contain spaces and parentheses: split after the last ")"
    fields = stat[stat.rfind(b")") + 2:].split()
    if not fields or fields[0] in (b"Z", b"X"):  # a zombie has exited: its memory is gone
        return None
    return int(fields[19])  # field 22 of the whole line: starttime


class Member:
    """One process that registered through us: its pid, start time and (if we got one) pidfd."""

    def __init__(self, pid: int):
        self.pid, self.start = pid, start_time(pid)
        self.pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):  # ENOSYS, EMFILE, no os.pidfd_open
            self.pidfd = os.pidfd_open(pid)
        self.open_conns = 0  # client connections of this process open now
        self.kept = False  # a connection ended without BYE: keep it until the process is dead

    def alive(self) -> bool:
        if self.start is None:
            return False  # gone (or a zombie) the moment we first looked
        if self.pidfd is not None:  # readable = exited; immune to pid reuse
            return not _readable(self.pidfd)
        return start_time(self.pid) == self.start  # a new start time = someone else's pid

    def close(self) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None


class Members:
    """The processes that keep the manager serving (besides open client connections)."""

    def __init__(self):
        self.by_pid: dict[int, Member] = {}

    def joined(self, pid: int) -> Member:
        """A connection of `pid` became a client (its first REGISTER or FREE)."""
        member = self.by_pid.get(pid)
        if member is not None and not member.alive():  # an old process's pid, reused
            self.forget(pid)
            member = None
        if member is None:
            member = self.by_pid[pid] = Member(pid)
        member.open_conns += 1
        return member

    def left(self, pid: int, said_bye: bool) -> None:
        """A client connection of `pid` closed; `said_bye`: it sent BYE first."""
        member = self.by_pid.get(pid)
        if member is None:
            return
        member.open_conns -= 1
        if said_bye:
            member.kept = False  # BYE speaks for the whole process
        else:
            member.kept = True
        if member.open_conns <= 0 and not member.kept:
            self.forget(pid)

    def forget(self, pid: int) -> None:
        member = self.by_pid.pop(pid, None)
        if member is not None:
            member.close()

    def prune(self) -> list[int]:
        """Forget members that are dead and have no connection open; return their pids."""
        dead = [m.pid for m in self.by_pid.values() if m.open_conns <= 0 and not m.alive()]
        for pid in dead:
            self.forget(pid)
        return dead

    def kept_alive(self) -> list[int]:
        """Pids with no connection open that still hold us (alive, never said BYE)."""
        return [m.pid for m in self.by_pid.values() if m.open_conns <= 0 and m.kept]

    def close(self) -> None:
        for pid in list(self.by_pid):
            self.forget(pid)
