"""Run one reproduction in a child process, so a crash, a signal or a hang never hits the kernel.

``in_child(fn, *args)`` forks (torch is imported once, in the kernel; a fork child starts in
milliseconds), runs ``fn`` there with the child's stderr captured, and returns an Outcome: the
value ``fn`` returned, or the exception it raised (type and torch's own message), or the
signal that killed it. ``run_python(code)`` runs a fresh interpreter instead, for the errors
that only a fresh ``__main__`` shows (spawn's re-import of the main module). ``Scene(fn,
*args)`` keeps a situation staged by ``fn`` alive in a fork child, in the background, until
``stop()``.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field


@dataclass
class Outcome:
    """What happened in the child: ``error`` is '' when ``fn`` returned normally."""

    error: str  # the exception's type name, 'signal SIGBUS', 'exit code 1', or ''
    message: str  # the exception's message (torch's own words), or the stderr tail
    value: object = None  # what fn returned (when error == '')
    stderr: str = ""  # what the child printed on stderr
    seconds: float = 0.0
    details: dict = field(default_factory=dict)  # e.g. torch's exit_code / signal_name
    causes: list = field(default_factory=list)  # "Type: message" of each __cause__, root first

    @property
    def text(self) -> str:
        """Everything the learner would read in the traceback: causes, then the error."""
        return "\n".join([*self.causes, f"{self.error}: {self.message}"])

    def headline(self) -> list[str]:
        """The lines worth reading: the message's first line, and a worker's original error
        (DataLoader re-raises it under 'Caught ... in DataLoader worker process N')."""
        lines = [ln for ln in self.message.strip().splitlines() if ln.strip()] or [""]
        if "Original Traceback" in self.message:
            return [lines[0], "... " + lines[-1].strip()]
        return lines

    @property
    def failed(self) -> bool:
        return bool(self.error)

    def show(self, lines: int = 12) -> Outcome:
        """Print the outcome as a learner reads it: a ❌ and the real message, or a ✅."""
        if not self.failed:
            print(f"✅ no error ({self.seconds:.1f} s): {self.value}")
            return self
        for cause in self.causes:  # as Python prints them: the direct cause first
            print(f"❌ {cause}\n   (the above exception was the direct cause of:)")
        text = self.headline()
        print(f"❌ {self.error} ({self.seconds:.1f} s):")
        for line in text[:lines] + (["..."] if len(text) > lines else []):
            print(f"    {line}")
        return self


_FACTS = ("exit_code", "signal_name", "error_index", "error_pid", "reason")


def _child(conn, fn, args, err_path) -> None:
    fd = os.open(err_path, os.O_WRONLY)
    os.dup2(fd, 2)  # the child's stderr (and its own children's) goes to the file
    os.close(fd)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - the child's last one
    try:
        conn.send(("", "", fn(*args), {}, []))
    except BaseException as exc:  # noqa: BLE001 - every error is the point here
        traceback.print_exc()
        # torch.multiprocessing's ProcessExitedException says *how* a rank died: keep that.
        facts = {k: getattr(exc, k) for k in _FACTS if hasattr(exc, k)}
        causes, cause = [], exc.__cause__
        while cause is not None:  # DataLoader raises its famous message as a cause
            causes.insert(0, f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__
        conn.send((type(exc).__name__, str(exc), None, facts, causes))


def in_child(fn, *args, timeout: float = 60.0) -> Outcome:
    """Run ``fn(*args)`` in a fork child; an Outcome says how it ended. Hangs are killed."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    with tempfile.NamedTemporaryFile("r", prefix="shmlab-errors-", suffix=".txt") as err:
        start = time.monotonic()
        proc = ctx.Process(target=_child, args=(send, fn, args, err.name))
        proc.start()
        send.close()
        got = recv.recv() if recv.poll(timeout) else None
        proc.join(5 if got else 0)
        if proc.is_alive():
            proc.kill()  # hung past its timeout: say so instead of hanging the notebook
            proc.join()
        recv.close()
        seconds, stderr = time.monotonic() - start, err.read()
    if got is not None:
        return Outcome(got[0], got[1], got[2], stderr, seconds, got[3], got[4])
    if proc.exitcode is not None and proc.exitcode < 0:
        name = signal.Signals(-proc.exitcode).name
        return Outcome(f"signal {name}", stderr[-2000:], None, stderr, seconds)
    return Outcome("timeout" if got is None and seconds >= timeout else
                   f"exit code {proc.exitcode}", stderr[-2000:], None, stderr, seconds)


def run_python(code: str, *, timeout: float = 60.0, name: str = "main.py",
               files: dict[str, str] | None = None) -> Outcome:
    """Run ``code`` as the ``__main__`` script of a fresh interpreter, in a temporary folder
    that also holds ``files`` (name -> text). ``name="-c"`` passes it as ``python -c code``:
    a ``__main__`` with no file to import, as a notebook kernel's cells are."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shmlab-errors-") as folder:
        for other, text in (files or {}).items():
            with open(os.path.join(folder, other), "w") as f:
                f.write(text)
        argv = [sys.executable, "-c", code]
        if name != "-c":
            path = os.path.join(folder, name)
            with open(path, "w") as f:
                f.write(code)
            argv = [sys.executable, path]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=folder)
    seconds = time.monotonic() - start
    if proc.returncode == 0 and "Traceback" not in proc.stderr:
        return Outcome("", "", proc.stdout.strip(), proc.stderr, seconds)
    error, message = last_exception(proc.stderr) or (f"exit code {proc.returncode}", "")
    return Outcome(error, message, proc.stdout.strip(), proc.stderr, seconds)


_EXC_LINE = re.compile(r"^((?:\w+\.)*\w*(?:Error|Exception|Exit)): ?(.*)$")


def last_exception(text: str) -> tuple[str, str] | None:
    """(type, message) of the last exception a traceback in ``text`` ends with; the message
    keeps its following lines (multiprocessing's bootstrapping error spans ten)."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        match = _EXC_LINE.match(lines[i])
        if match:
            rest = [ln.strip() for ln in lines[i + 1:] if not ln.startswith("Traceback")]
            return match.group(1), "\n".join([match.group(2), *rest]).strip()
    return None


# --- a situation kept alive in the background ----------------------------------------------------
def _stage(send, stop, scene, args) -> None:
    # terminate() (a daemonic child at the kernel's exit) must still run the scene's teardown
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        scene(send.send, stop, *args)  # sends its facts once set up, returns after stop
    except Exception as exc:  # noqa: BLE001 - the parent raises it with the reason
        send.send({"error": f"{type(exc).__name__}: {exc}"})


class Scene:
    """Run ``scene(report, stop, *args)`` in a fork child; ``facts`` is what it reported once
    set up. ``stop()`` (or leaving the ``with``) tears it down and waits for it."""

    def __init__(self, scene, *args, timeout: float = 30.0):
        ctx = multiprocessing.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        self._stop = ctx.Event()
        self.proc = ctx.Process(target=_stage, args=(send, self._stop, scene, args), daemon=True)
        self.proc.start()
        send.close()
        self.facts = recv.recv() if recv.poll(timeout) else {"error": "timed out setting up"}
        recv.close()
        if "error" in self.facts:
            self.stop()
            raise RuntimeError(f"{scene.__name__}: {self.facts['error']}")

    def stop(self) -> None:
        self._stop.set()
        self.proc.join(20)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
