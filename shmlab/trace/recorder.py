"""The Python-level recorder: a profile hook that writes each hop as one JSON line.

``Recorder(directory).start()`` installs ``sys.setprofile`` and ``threading.setprofile`` (on
3.12+ ``threading.setprofile_all_threads``, so threads already running are seen too); the hook
asks ``hops.lookup`` once per code object whether it is a hop (the answer is cached by code
object, so every later call costs one dictionary lookup) and, for a hop, writes
``{"t", "pid", "tid", "thread", "layer": "python", "name", "lib", "detail", "segment", "fd",
"duration"}`` to ``<directory>/<pid>.jsonl``. A fork child inherits the hook with the rest of
the interpreter: the file is chosen by ``os.getpid()`` at each write, so the child writes its
own. Nothing is installed at import: without tracing, nothing is slower.

Note [One clock for every process]
Times are ``time.time()``: CLOCK_REALTIME, the clock ``strace -ttt`` prints, the same in every
process of the machine, so Python-level events and system calls of all processes sort into
one timeline. A duration is the difference of two such readings (microseconds apart at most
where the clock is stepped, which a trace of a second does not meet in practice).

Mirrors: nothing in torch (torch has no tracer of its own sharing path; torch.profiler sees one
process's operators and, with ``with_stack``, its Python calls, not the handoff across processes
or its system calls).
"""

from __future__ import annotations

import builtins
import functools
import json
import os
import sys
import threading
import time

try:
    from . import hops
except ImportError:  # loaded by file path in a new interpreter (session.py)
    import _shmlab_trace_hops as hops  # type: ignore[no-redef]

_NOT_A_HOP = (None,)


class Recorder:
    def __init__(self, directory: str):
        self.directory = directory
        self._codes: dict = {}  # code object -> hop tuple, or _NOT_A_HOP
        self._open: dict[int, tuple] = {}  # id(frame) or id(builtin) -> (t0, hop, locals)
        self._fds: dict[int, int] = {}  # pid -> this process's file (a fork child: its own)
        self.count = 0
        self.active = False

    # -- installing ------------------------------------------------------------------------
    def start(self) -> None:
        self.active = True
        self._pause_during_imports()
        sys.setprofile(self._hook)
        if hasattr(threading, "setprofile_all_threads"):  # 3.12+: running threads too
            threading.setprofile_all_threads(self._hook)
        else:
            threading.setprofile(self._hook)

    def stop(self) -> None:
        self.active = False
        if getattr(builtins.__import__, "_shmlab_trace", None) is self:
            builtins.__import__ = builtins.__import__.__wrapped__
        if hasattr(threading, "setprofile_all_threads"):
            threading.setprofile_all_threads(None)
        else:
            threading.setprofile(None)
        sys.setprofile(None)
        fd = self._fds.pop(os.getpid(), -1)
        if fd >= 0:
            os.close(fd)

    def _pause_during_imports(self) -> None:
        """Note [No hook while importing]
        A module imported inside the block (``import torch`` when a spawn child unpickles
        its first tensor) runs hundreds of thousands of calls, and a Python-level hook on
        each one costs seconds; no hop runs at import time. So the hook steps aside while
        ``__import__`` runs (the ``import`` statement and pickle's ``find_class`` both call
        it) and comes back when it returns."""
        if getattr(builtins.__import__, "_shmlab_trace", None) is self:
            return
        original, hook = builtins.__import__, self._hook

        @functools.wraps(original)
        def __import__(*args, **kwargs):
            if sys.getprofile() != hook:
                return original(*args, **kwargs)
            sys.setprofile(None)
            try:
                return original(*args, **kwargs)
            finally:
                sys.setprofile(hook)

        __import__._shmlab_trace = self
        builtins.__import__ = __import__

    # -- the hook ----------------------------------------------------------------------------
    def _hook(self, frame, event, arg):
        if not self.active:  # a thread that outlived the block: unhook it
            sys.setprofile(None)
            return
        if event == "call":
            hop = self._codes.get(frame.f_code)
            if hop is None:
                hop = self._codes[frame.f_code] = hops.lookup(frame.f_code) or _NOT_A_HOP
            if hop is not _NOT_A_HOP:
                self._enter(frame, hop)
        elif event == "return":
            hop = self._codes.get(frame.f_code)
            if hop is not None and hop is not _NOT_A_HOP and hop[2] == "span":
                self._leave(id(frame), arg)
        elif event == "c_call":
            self._c_call(frame, arg)
        elif event == "c_return" or event == "c_exception":
            if id(arg) in self._open:
                self._leave(id(arg), None)

    def _enter(self, frame, hop) -> None:
        name, lib, mode, reader = hop
        args = dict(frame.f_locals)
        if mode == "mark":
            self._emit(time.time(), name, lib, reader, args, None, None)
        else:
            self._open[id(frame)] = (time.time(), name, lib, reader, args)

    def _c_call(self, frame, builtin) -> None:
        name = getattr(builtin, "__name__", None)
        hop = hops.C_HOPS.get(name)
        if hop is None:
            if name != "loads" or getattr(builtin, "__module__", None) != "_pickle" \
                    or frame.f_code.co_qualname != "Queue.get":
                return
            hop = hops.C_LOADS
        self._open[id(builtin)] = (time.time(), hop[0], hop[1], hop[2], dict(frame.f_locals))

    def _leave(self, key: int, ret) -> None:
        opened = self._open.pop(key, None)
        if opened is None:
            return
        t0, name, lib, reader, args = opened
        self._emit(t0, name, lib, reader, args, ret, time.time() - t0)

    def _emit(self, t, name, lib, reader, args, ret, duration) -> None:
        try:
            segment, fd, detail = reader(args, ret)
        except Exception as exc:  # a reader must never break the traced code
            segment, fd, detail = None, None, f"(could not read: {exc!r})"
        thread = threading.current_thread()
        line = json.dumps({"t": t, "pid": os.getpid(), "tid": threading.get_native_id(),
                           "thread": thread.name, "layer": "python", "name": name,
                           "lib": lib, "detail": detail, "segment": segment, "fd": fd,
                           "duration": duration})
        self._write(line)

    def _write(self, line: str) -> None:
        # No lock: a fork child must never inherit one held by another thread (the feeder
        # thread writes while the main thread forks). Each process has its own fd (a fork
        # child opens its own file at its first write; two threads racing to open both
        # write a header, and one fd wins), and one os.write per line on O_APPEND keeps
        # lines whole.
        pid = os.getpid()
        fd = self._fds.get(pid)
        if fd is None:
            try:
                fd = os.open(os.path.join(self.directory, f"{pid}.jsonl"),
                             os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
                os.write(fd, (json.dumps({"process": pid, "ppid": os.getppid(),
                                          "argv": sys.argv, "t": time.time()}) + "\n").encode())
            except OSError:
                fd = -1  # the trace is over (its directory is gone): stop recording
                self.active = False
            mine, fd = fd, self._fds.setdefault(pid, fd)
            if mine != fd and mine >= 0:
                os.close(mine)
        if fd >= 0:
            try:
                os.write(fd, (line + "\n").encode())
                self.count += 1
            except OSError:
                self._fds[pid] = -1


_recorder: Recorder | None = None


def start(directory: str) -> Recorder:
    """Start this process's recorder (one per process); a second call returns the first."""
    global _recorder
    if _recorder is None or _recorder.directory != directory:
        _recorder = Recorder(directory)
    _recorder.start()
    return _recorder


def start_in_new_interpreter(directory: str) -> None:
    """What the generated sitecustomize calls (Note [Recording in a new interpreter] in
    session.py). A multiprocessing child (spawn, or a forkserver's) first re-imports the
    parent's main module (``spawn.prepare``): often ``import torch``, tens of thousands of
    calls the hook would slow down for nothing, so its recorder starts when ``prepare``
    returns, just before the child unpickles its Process object and arguments. Any other
    interpreter (the command line's own, a manager daemon) records from the start."""
    argv = " ".join(getattr(sys, "orig_argv", sys.argv))
    if "--multiprocessing-fork" not in argv and "multiprocessing.forkserver" not in argv:
        start(directory)
        return
    import multiprocessing.spawn as spawn
    prepare = spawn.prepare

    def prepare_then_record(data):
        try:
            prepare(data)
        finally:
            if os.path.isdir(directory):  # a forkserver outlives the block that started it
                start(directory)

    spawn.prepare = prepare_then_record


def stop() -> None:
    global _recorder
    if _recorder is not None:
        _recorder.stop()
        _recorder = None
