"""One protocol for every child a demo starts: a command loop in the child, a proxy in the parent.

Mirrors: CPython multiprocessing/managers.py (``Server.serve_client`` runs named methods and
sends back ``('#RETURN', result)`` or ``('#ERROR', exc)``; ``BaseProxy._callmethod`` is the
parent's side). Nothing in torch: it only drives the mirror.

    with Actor(holder.commands, "torch", dataq, ctx="spawn") as child:
        child("make", "a", 1, 1000)        # runs commands["make"]("a", 1, 1000) in the child
        child("nofile", 16, timeout=5)     # ... and returns what it returned

The command table convention
----------------------------
A *table* is a module-level function (spawn and forkserver children import it by name) that
runs in the child and returns ``{name: callable}``; ``Actor(table, *args)`` calls
``table(*args)`` there. A callable takes the command's arguments and returns its reply.
Arguments and replies travel pickled by multiprocessing's ForkingPickler, so tensors may be
among them (they arrive as views of the same shared memory). One name is the loop's own:
``exit`` is answered ``None`` and stops the loop. If the table has an ``exit`` entry, the loop
calls it with no arguments on its way out, however it ended (``exit``, the parent's death,
EOF): that is where a table lets go of what it holds. A table that raised while being built
answers the first command with that error.

Every module that defines a table documents it as a table: name, arguments, reply.

The wire (a duplex Pipe): parent -> child ``(seq, name, args)``; child -> parent
``(seq, "ok", reply)`` or ``(seq, "error", type name, message, traceback text, exception or
None)``. Message 0 is the child's "ready" (its pid), sent once the table is built. Sequence
numbers let the parent drop the late reply of a command that timed out.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import traceback
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler

PARENT_POLL_S = 1.0  # how often an idle child checks that its parent still lives
DEATH_POLL_S = 0.05  # how often a waiting parent checks that its child still lives


class ActorError(RuntimeError):
    """The child's command raised. ``.type`` (name), ``.message``, ``.traceback`` (text, from
    the child), ``.exception`` (the child's exception itself, when it could be pickled)."""

    def __init__(self, command: str, type: str, message: str, traceback: str = "",
                 exception: BaseException | None = None, pid: int | None = None):
        super().__init__(f"{command!r} in pid {pid} raised {type}: {message}")
        self.command, self.type, self.message = command, type, message
        self.traceback, self.exception, self.pid = traceback, exception, pid

    def __reduce__(self):
        return type(self), (self.command, self.type, self.message, self.traceback, None,
                            self.pid)


class ActorDied(ActorError):
    """The child exited, or its pipe closed, before it answered. ``.exitcode`` (-9: SIGKILL)."""

    def __init__(self, command: str, pid: int | None, exitcode: int | None):
        super().__init__(command, "ActorDied", f"exit code {exitcode}", pid=pid)
        self.exitcode = exitcode
        self.args = (f"the child (pid {pid}) exited before it answered {command!r} "
                     f"(exit code {exitcode}; -9 is SIGKILL)",)

    def __reduce__(self):
        return type(self), (self.command, self.pid, self.exitcode)


# -- the child --------------------------------------------------------------------------------
def _parent_gone(parent, ppid: int) -> bool:
    # A fork child holds a copy of the parent's end of the pipe, so EOF alone cannot tell us
    # the parent died. parent_process() watches the parent's sentinel; a changed ppid says we
    # were re-parented (to init or a subreaper) even where a sibling keeps that sentinel open.
    return (parent is not None and not parent.is_alive()) or os.getppid() != ppid


def _next_command(conn):
    """The next (seq, name, args), or None when the parent is gone (EOF or dead)."""
    parent, ppid = multiprocessing.parent_process(), os.getppid()
    try:
        while not conn.poll(PARENT_POLL_S):
            if _parent_gone(parent, ppid):
                return None
        return conn.recv()
    except (EOFError, OSError):
        return None


def _portable(exc: Exception) -> Exception | None:
    """``exc`` if the parent can unpickle it (many exception classes cannot be), else None."""
    try:
        ForkingPickler.loads(ForkingPickler.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure means: send the text only
        return None
    return exc


def _error(seq: int, exc: Exception) -> tuple:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    # Drop the frames: they hold the command's locals (tensors!) alive for as long as the
    # exception lives, and a tensor must be freed when its table lets go of it.
    exc.__traceback__ = None
    return (seq, "error", type(exc).__name__, str(exc), tb, _portable(exc))


def _send(conn, reply: tuple) -> None:
    try:
        conn.send(reply)
    except Exception:  # noqa: BLE001 - the reply (or the exception in it) cannot be pickled
        if reply[1] == "ok":
            exc = TypeError(f"the reply could not be pickled: {reply[2]!r:.200}")
            reply = _error(reply[0], exc)
        conn.send(reply[:5] + (None,))  # the exception's text still goes


def _run(commands: dict, seq: int, name: str, args: tuple) -> tuple:
    try:
        if name not in commands:
            raise KeyError(f"unknown command {name!r}; this table has {sorted(commands)}")
        return (seq, "ok", commands[name](*args))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, who decides
        return _error(seq, exc)


def serve(conn, commands: dict) -> None:
    """Run ``commands[name](*args)`` for each message on ``conn`` and answer it, until ``exit``,
    EOF or the parent's death; then call ``commands["exit"]()`` if the table has one."""
    try:
        while (msg := _next_command(conn)) is not None:
            seq, name, args = msg
            if name == "exit":
                _send(conn, (seq, "ok", None))
                return
            reply = _run(commands, seq, name, args)
            del msg, args  # hold nothing between commands: arguments may be tensors ...
            _send(conn, reply)
            del reply  # ... and so may replies; a table decides what it keeps
    finally:
        if "exit" in commands:
            commands["exit"]()


def _child(conn, table, args) -> None:
    """The child's whole life: build the table, say ready (seq 0), serve."""
    try:
        commands = table(*args)
    except Exception as exc:  # noqa: BLE001 - the parent's first call raises it
        _send(conn, _error(0, exc))
        return
    _send(conn, (0, "ok", os.getpid()))
    serve(conn, commands)


# -- the parent -------------------------------------------------------------------------------
class Actor:
    """A child process running ``serve(table(*args))``; calling the actor runs one command.

    ``ctx``: a multiprocessing context or a start-method name (None: the default context).
    The child is daemonic: it cannot outlive a parent that exits normally, and it stops by
    itself within a second of a parent that was killed.
    """

    def __init__(self, commands, *args, ctx=None, name: str | None = None):
        if ctx is None or isinstance(ctx, str):
            ctx = multiprocessing.get_context(ctx)
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(theirs, commands, args), daemon=True,
                                 name=name or f"{commands.__module__}.{commands.__qualname__}")
        self._proc.start()
        theirs.close()  # the child's copy is the only one left: its death closes the pipe
        self.pid: int = self._proc.pid
        self.name = self._proc.name
        self._sent, self._expect = 1, 0  # seq 0 is the ready message, already "sent"
        self._names = {0: "start"}

    def __repr__(self) -> str:
        return f"<Actor {self.name} pid={self.pid} exitcode={self._proc.exitcode}>"

    @property
    def exitcode(self) -> int | None:
        return self._proc.exitcode

    def is_alive(self) -> bool:
        return self._proc.is_alive()

    def __call__(self, command: str, *args, timeout: float | None = 90.0):
        """Run one command in the child and return its reply (``timeout`` None: no limit)."""
        self.send(command, *args)
        return self.reply(timeout)

    def run(self, fn, *args, timeout: float | None = 90.0):
        """Run ``fn(child, *args)`` in the child, where ``fn`` is a function of a module the
        child can import (a worker module a notebook wrote: ``shmlab.harness.workers``), and
        return what it returned. The child runs the module's current source."""
        from .workers import reference

        return self("run", *reference(fn), args, timeout=timeout)

    def send(self, command: str, *args) -> None:
        """Send a command without waiting; ``reply()`` answers them in the order sent."""
        seq, self._sent = self._sent, self._sent + 1
        self._names[seq] = command
        try:
            self._conn.send((seq, command, args))
        except (BrokenPipeError, ConnectionResetError):
            raise self._died(command) from None

    def ready(self, timeout: float | None = 90.0) -> int:
        """Wait until the child has built its table (a spawn child imports first); its pid."""
        if self._expect == 0:
            self._take(timeout)
        return self.pid

    def reply(self, timeout: float | None = 90.0):
        """The reply to the oldest command not answered yet (the ready message on the way)."""
        if self._sent - max(self._expect, 1) <= 0:  # (seq 0, the ready message, is no command)
            raise RuntimeError(f"{self}: no command is waiting for a reply")
        self.ready(timeout)
        return self._take(timeout)

    def _take(self, timeout: float | None):
        """Read the reply numbered ``self._expect``: its result, or raise what it says."""
        seq = self._expect
        command = self._names.pop(seq, "?")
        self._expect += 1  # answered or, on timeout, abandoned: a late reply is dropped
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not self._wait(deadline, command):
                raise TimeoutError(f"{self.name} (pid {self.pid}) did not answer {command!r} "
                                   f"within {timeout} s")
            try:
                got, status, *rest = self._conn.recv()
            except (EOFError, OSError):
                raise self._died(command) from None
            if got < seq:
                continue  # the late reply of a command that timed out
            if status == "ok":
                return rest[0]
            raise ActorError(command, *rest, pid=self.pid)

    def _wait(self, deadline: float | None, command: str) -> bool:
        """True once a reply (or EOF) can be read, False at the deadline; ActorDied as soon as
        the child has exited without one. Not EOF alone, nor the sentinel: a grandchild forked
        by the child (a fork_share, a manager on its way to exec) holds copies of both."""
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if wait([self._conn, self._proc.sentinel], DEATH_POLL_S if left is None
                    else min(DEATH_POLL_S, left)):
                if self._conn.poll(0):
                    return True
            if self._proc.exitcode is not None and not self._conn.poll(0):  # waitpid(WNOHANG)
                raise self._died(command)
            if left == 0.0:
                return False

    def _died(self, command: str) -> ActorDied:
        self._expect = self._sent  # nothing more will be answered
        self._proc.join(5)
        return ActorDied(command, self.pid, self._proc.exitcode)

    # -- ends of life --------------------------------------------------------------------------
    def join(self, timeout: float | None = None) -> int | None:
        """Wait for the child to end by itself (told to, or killed from elsewhere); its exit
        code, None if it still runs after ``timeout``."""
        self._proc.join(timeout)
        return self._proc.exitcode

    def exit(self, timeout: float = 30.0) -> None:
        """Ask the child to exit (its table lets go first); SIGKILL it if it does not answer
        and exit within ``timeout``. Safe to call twice, and on a child that already died."""
        if self._proc.exitcode is None and not self._conn.closed:
            try:
                self("exit", timeout=timeout)
                self._proc.join(timeout)
            except (ActorError, TimeoutError, OSError):
                pass  # dead already, or stuck: kill() decides
        self.kill()

    def kill(self) -> None:
        """SIGKILL the child (if it still runs), reap it and close our end of the pipe."""
        if self._proc.exitcode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            # Not join(): it waits for the child's sentinel pipe to close, and a grandchild that
            # inherited its write end (a torch_shm_manager the child started) keeps it open, so
            # join() would time out and leave a zombie. Reap by pid: SIGKILL ends it at once.
            self._proc._popen.poll(0)
        self._conn.close()

    def __enter__(self) -> Actor:
        return self

    def __exit__(self, *exc) -> None:
        self.exit()
