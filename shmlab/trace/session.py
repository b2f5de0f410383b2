"""``trace()``: the context manager that records a block, for this process and its family.

On entry: a trace directory under TMPDIR; strace attached to this process and all its
threads (``syscalls``: ``"auto"`` tries and says why not in ``tr.limits``, ``True`` raises,
``False`` skips); the Python-level recorder in this process (fork children inherit it) and,
through a generated ``sitecustomize.py`` put first on ``PYTHONPATH`` with
``SHMLAB_TRACE_DIR``, in every new interpreter the block starts (spawn, forkserver, a
manager daemon). On exit: the recorder stopped, strace detached, ``os.environ`` as it was,
every process's events read into the ``Trace``, the directory removed (``keep=True`` keeps it).

Note [Recording in a new interpreter]
A spawn or forkserver child is a fresh ``python``: it inherits the environment, not the
profile hook. Python imports ``sitecustomize`` at start-up from the first ``sys.path`` entry
that has one, so the trace directory, first on ``PYTHONPATH``, hands it ours: it loads
``hops.py`` and ``recorder.py`` by file path (not ``import shmlab``, which would import numpy
into every child, the manager daemon too), starts the recorder, then imports the
``sitecustomize`` it hides, if any, so a site's own set-up still runs. A forkserver started
before the block is an interpreter that never saw the variable: its children are not
recorded, and ``tr.limits`` says so.

Mirrors: nothing in torch.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import sys
import tempfile
import threading
import time

from ..messages import N_
from ..messages import tr as tr_  # `tr` names the Trace being recorded, as in the notebooks
from . import recorder as _recorder
from . import strace as _strace
from .model import Event, ProcessInfo, StraceUnavailable, Trace, TraceError

ENV_DIR = "SHMLAB_TRACE_DIR"
HERE = os.path.dirname(os.path.abspath(__file__))
SITECUSTOMIZE = '''\
# Written by shmlab.trace: records this interpreter's hops (Note [Recording in a new
# interpreter] in shmlab/trace/session.py), then runs the sitecustomize it hides.
import os as _os
import sys as _sys


def _shmlab_trace_start():
    import importlib.util
    directory = _os.environ.get({env!r})
    if not directory or not _os.path.isdir(directory):
        return
    for name, path in (("_shmlab_trace_hops", {hops!r}), ("_shmlab_trace_recorder", {rec!r})):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        _sys.modules[name] = module
        spec.loader.exec_module(module)
    _sys.modules["_shmlab_trace_recorder"].start_in_new_interpreter(directory)


def _shmlab_trace_chain():
    here = _os.path.dirname(_os.path.abspath(__file__))
    saved = list(_sys.path)
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    mine = _sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (the one this file hides, if any)
    except ImportError:
        if mine is not None:
            _sys.modules["sitecustomize"] = mine
    finally:
        _sys.path[:] = saved


try:
    _shmlab_trace_start()
except Exception as exc:  # a broken trace must not break the traced program
    print(f"shmlab.trace: not recording this process: {{exc!r}}", file=_sys.stderr)
_shmlab_trace_chain()
'''
ALWAYS = [  # N_: in the chosen language when a trace starts (shmlab.messages)
    N_("C++ inside torch: only the Python-visible calls and their system calls are seen "
       "(MapAllocator, libshm and the refcount's atomics run in C++)"),
    N_("the receiver's first use of the memory is a plain load or store (no call, no system "
       "call): the trace shows the mapping (mmap) and the rebuild's end, not the first touch"),
    N_("a spawn or forkserver child is recorded from the end of its preparation (its parent's "
       "main module re-imported as __mp_main__) on: Python-level hops at that module's top "
       "level are not recorded (its system calls are)"),
    N_("code that runs while a module is imported is not recorded at Python level (the hook "
       "steps aside during imports: Note [No hook while importing] in shmlab.trace.recorder)"),
    N_("torch's file_system refcount lives in the segment's header and changes by atomic "
       "instructions inside C++: the changes made when a process maps or closes the segment "
       "are invisible; seen are the _shared_incref/_shared_decref calls on that same count "
       "(the +1 that keeps the segment alive while a message is in flight) and the last "
       "closer's unlink"),
]


if not hasattr(threading, "setprofile_all_threads"):  # before Python 3.12
    ALWAYS.append(N_("threads already running when the block starts (e.g. a resource_sharer "
                     "listener from an earlier put) are not hooked before Python 3.12: their "
                     "system calls are traced, their Python-level hops are not"))


def write_sitecustomize(directory: str) -> None:
    text = SITECUSTOMIZE.format(env=ENV_DIR, hops=os.path.join(HERE, "hops.py"),
                                rec=os.path.join(HERE, "recorder.py"))
    with open(os.path.join(directory, "sitecustomize.py"), "w", encoding="utf-8") as f:
        f.write(text)


def child_environ(directory: str, base: dict) -> dict:
    """``base`` plus what makes new interpreters record into ``directory``."""
    env = dict(base)
    env[ENV_DIR] = directory
    env["PYTHONPATH"] = os.pathsep.join(p for p in (directory, base.get("PYTHONPATH")) if p)
    return env


@contextlib.contextmanager
def trace(syscalls="auto", keep: bool = False):
    """Record the block: ``with trace() as tr: ...``; ``tr`` is filled at the block's end
    (``tr.poll()`` reads events while it runs)."""
    if syscalls not in ("auto", True, False):
        raise ValueError(f"syscalls must be 'auto', True or False, not {syscalls!r}")
    tr = Trace(limits=[tr_(line) for line in ALWAYS])
    directory = tempfile.mkdtemp(prefix="shmlab-trace-")
    saved = {k: os.environ.get(k) for k in (ENV_DIR, "PYTHONPATH")}
    proc, log = None, os.path.join(directory, "strace.log")
    try:
        write_sitecustomize(directory)
        tr.limits += started_before()
        t0 = time.monotonic()
        if syscalls:
            proc = _attach(syscalls, log, tr)
        tr.overhead["attach_s"] = round(time.monotonic() - t0, 4)
        os.environ.update(child_environ(directory, os.environ))
        live = Collector(directory, os.getpid(), log if proc else None)
        tr._poll = live.poll
        rec = _recorder.start(directory)
        tr.running = True
        try:
            yield tr
        finally:
            rec.stop()
            _restore(saved)
            if proc is not None:
                _strace.stop(proc)
            fill(tr, Collector(directory, os.getpid(), log if proc else None), proc is not None)
            tr._poll = live.poll
            tr.running = False  # after fill(): a live view then redraws from tr.events
    finally:
        tr.running = False
        if proc is not None:
            _strace.stop(proc)
        _restore(saved)
        if keep:
            tr.overhead["directory"] = directory
        else:
            shutil.rmtree(directory, ignore_errors=True)


def _attach(syscalls, log: str, tr: Trace):
    try:
        return _strace.attach(os.getpid(), log)
    except StraceUnavailable as exc:
        if syscalls is True:
            raise
        tr.limits.insert(0, tr_("strace not attached: {reason}", reason=exc))
    except TraceError as exc:
        if syscalls is True:
            raise
        tr.limits.insert(0, tr_("strace not attached: {reason}", reason=exc))
    return None


def _restore(saved: dict) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def started_before() -> list[str]:
    """Limits from processes that were already running: a forkserver, managers."""
    out = []
    fs = sys.modules.get("multiprocessing.forkserver")
    pid = getattr(getattr(fs, "_forkserver", None), "_forkserver_pid", None)
    if pid:
        out.append(tr_("forkserver started before tracing is not traced (pid {pid}): its "
                       "children are recorded neither at Python level nor by strace", pid=pid))
    for pid, argv in _managers():
        out.append(tr_("manager pid {pid} ({argv}) started before tracing: its own system "
                       "calls are not traced (the messages sent to it are)", pid=pid, argv=argv))
    return out


def _managers():
    me = os.getuid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != me:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if "torch_shm_manager" in argv or "shmlab.manager" in argv:
            yield int(entry), argv[:80]


class Collector:
    """Reads the trace directory: the processes' JSON lines and strace's log, incrementally."""

    def __init__(self, directory: str, main_pid: int | None, log: str | None):
        self.directory, self.main_pid, self.log = directory, main_pid, log
        self.offsets: dict[str, int] = {}
        self.headers: dict[int, dict] = {}
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{main_pid}/task")]
        except (OSError, TypeError):
            tids = []  # a command that has ended (the CLI): its first line names it
        self.reader = _strace.Reader(main_pid, tids)

    def poll(self) -> list[Event]:
        events = []
        for path in sorted(glob.glob(os.path.join(self.directory, "*.jsonl"))):
            for line in self._more(path).splitlines():
                item = json.loads(line)
                if "process" in item:
                    self.headers[item["process"]] = item
                else:
                    events.append(Event(**item))
        if self.log and os.path.exists(self.log):
            events += self.reader.events(self._more(self.log))
        return sorted(events, key=lambda e: e.t)

    def _more(self, path: str) -> str:
        """The complete lines added to ``path`` since the last read."""
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
        except OSError:
            return ""
        end = data.rfind(b"\n") + 1
        self.offsets[path] = self.offsets.get(path, 0) + end
        return data[:end].decode("utf-8", errors="replace")


def fill(tr: Trace, collector: Collector, with_strace: bool) -> None:
    """The whole trace into ``tr``: events (segments inherited), processes, overhead."""
    events = inherit_segments(name_threads(collector.poll()))
    tr.events = events
    tr.processes = processes(collector, events)
    tr.overhead.update({
        "python_events": sum(e.layer == "python" for e in events),
        "syscall_events": sum(e.layer == "syscall" for e in events),
        "strace": with_strace})


def name_threads(events: list[Event]) -> list[Event]:
    """A system call's thread name, from the Python-level events of the same thread."""
    from dataclasses import replace
    names = {(e.pid, e.tid): e.thread for e in events if e.thread}
    return [replace(e, thread=names.get((e.pid, e.tid), "")) if not e.thread else e
            for e in events]


def inherit_segments(events: list[Event]) -> list[Event]:
    """A Python-level hop without a segment of its own (reduce_storage, rebuild_storage_fd)
    takes the one of a step inside it, or around it, on the same thread."""
    from dataclasses import replace
    timed = [e for e in events if e.segment]
    out = []
    for e in events:
        if e.segment is None and e.layer == "python":
            inner = next((o for o in timed if o.tid == e.tid and o.pid == e.pid
                          and e.t <= o.t <= e.end), None)
            outer = inner or next((o for o in timed if o.tid == e.tid and o.pid == e.pid
                                   and o.layer == "python" and o.t <= e.t <= o.end), None)
            if outer is not None:
                e = replace(e, segment=outer.segment)
        out.append(e)
    return out


def processes(collector: Collector, events: list[Event]) -> dict[int, ProcessInfo]:
    reader, headers = collector.reader, collector.headers
    seen = list(dict.fromkeys([collector.main_pid, *(e.pid for e in events),
                               *reader.parent, *reader.argv]))
    out, children = {}, 0
    for pid in seen:
        head = headers.get(pid, {})
        argv = reader.argv.get(pid) or head.get("argv") or []
        ppid = reader.parent.get(pid) or head.get("ppid")
        if pid == collector.main_pid:
            label, ppid = "main", os.getppid()
        else:
            label = _label(argv)
            if label == "forkserver" and ppid in out and out[ppid].label == "forkserver":
                label = None  # forked by the server: its argv is the server's
            if label is None:
                children += 1
                label = f"child {children}"
        out[pid] = ProcessInfo(pid=pid, ppid=ppid, label=label, argv=list(argv))
    return out


def _label(argv: list[str]) -> str | None:
    text = " ".join(argv)
    if "torch_shm_manager" in text or "shmlab.manager" in text:
        return "manager"
    for role in ("resource_tracker", "forkserver"):
        if role in text:
            return role
    return None
