"""Probe in a helper process, so the widgets leave the kernel's GIL to the work they watch.

Note [Probing off the timed path]
A refresh reads /proc and /dev/shm: a few hundred syscalls and as many small Python objects,
most of a tick's cost. Done on the kernel's refresh thread it holds the kernel's GIL, and a
round trip that starts meanwhile waits for it: a running dashboard costs little of the wall
time but lengthens the trips it delays (docs/benchmarks.md, "Dashboard overhead: probing in the
kernel"). So the refresh thread only asks; a helper process (``serve`` below) does the
probing, on its own GIL and, on a machine with a core to spare, on its own core, and sends back
the Snapshot (under 1 KiB pickled). While it waits for the answer the refresh thread blocks in
recv(), GIL released; what stays in the kernel is unpickling the answer and drawing the views.

What the helper must not change is what the widgets show:
  * it watches the kernel's family (``Prober(root=kernel)``), hiding its own pid;
  * the kernel's end of the link is one socket fd the learner did not open: the helper takes
    it out of the kernel's counts (it knows its number) and fork children close their
    inherited copy at once (``os.register_at_fork``), so no child shows an extra socket and
    the helper still sees EOF when the kernel goes;
  * if the helper cannot start or dies, the Poller logs why and probes in-process again.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import weakref
from multiprocessing.connection import Connection
from pathlib import Path

# -c, not -m: running this module as __main__ would import it twice (the package imports it)
_MAIN = "import sys; from shmlab.widgets._helper import serve; serve(*map(int, sys.argv[1:]))"
_links: weakref.WeakSet = weakref.WeakSet()  # open RemoteProbers, for the fork hook below


def _close_in_fork_child() -> None:
    for link in list(_links):
        link.forget()


os.register_at_fork(after_in_child=_close_in_fork_child)


class RemoteProber:
    """Callable like Prober: the next Snapshot of this process's family, taken by a helper."""

    def __init__(self, timeout: float = 10.0):
        ours, theirs = socket.socketpair()
        package_root = str(Path(__file__).resolve().parents[2])  # import this very shmlab
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _MAIN, str(os.getpid()), str(theirs.fileno()),
                 str(ours.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the helper has its copy; ours would keep its EOF from coming
        self.conn, self.timeout = Connection(ours.detach()), timeout
        _links.add(self)

    def __call__(self):
        self.conn.send("probe")
        if not self.conn.poll(self.timeout):  # blocks in poll(2): the GIL is free meanwhile
            raise TimeoutError(f"the widgets' probe helper (pid {self.proc.pid}) gave no "
                               f"snapshot within {self.timeout:g} s")
        ok, value = self.conn.recv()
        if not ok:
            raise RuntimeError(f"the widgets' probe helper failed: {value}")
        return value

    def forget(self) -> None:
        """In a fork child: drop the inherited fd, without a word to the helper (not ours)."""
        try:
            os.close(self.conn.fileno())
        except OSError:
            pass
        _links.discard(self)

    def close(self) -> None:
        """EOF to the helper, which then exits; wait for it (SIGKILL if it does not)."""
        _links.discard(self)
        self.conn.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def serve(kernel: int, fd: int, kernel_fd: int) -> None:
    """The helper: answer each request with (True, snapshot) or (False, why), until EOF."""
    from ._probe import Prober  # here, not at the top: the kernel side never needs introspect

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the kernel, not for us
    conn = Connection(fd)
    prober = Prober(root=kernel, hide=frozenset({os.getpid()}))
    link = f"/proc/{kernel}/fd/{kernel_fd}"
    while True:
        try:
            conn.recv()
        except (EOFError, OSError):
            return  # the kernel closed the link, or exited
        try:
            snap = prober()
            counts = snap.fds.get(kernel)
            if counts is not None and os.readlink(link).startswith("socket:"):
                counts["socket"] -= 1  # the link to us: the widgets' fd, not the learner's
                counts["total"] -= 1
            reply = (True, snap)
        except Exception as exc:  # noqa: BLE001 - the kernel logs it in the widget
            reply = (False, f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except OSError:
            return
