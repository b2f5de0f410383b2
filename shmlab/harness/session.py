"""The notebook helper: one object owns what a notebook starts, and takes it all down.

A notebook that teaches tensor sharing starts children (actors, Processes, Pools), and their
``file_system`` allocations start manager daemons that outlive them by a 2-second grace period.
Without help, each notebook carried ~130 lines of set-up and teardown to track them. Here:

    session = Session(os.environ.get("SHMLAB_START_METHOD") or None)
    receiver = session.holder("torch", session.queue())   # an Actor, tracked
    session.our_files(), session.our_managers()            # what *this* notebook made
    session.close()                                        # strategies back, children gone,
                                                           # managers' grace waited out
``close()`` is safe to call twice and is registered with ``atexit``, so a kernel restart or
exit cleans up too.

Mirrors: multiprocessing.util._exit_function (the atexit hook that terminates and joins a
process's children), widened to one notebook's children, pools and manager daemons.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import multiprocessing
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from shmlab import introspect
from shmlab.harness.libs import LIBS, load
from shmlab.harness.show import markdown_table, show_table, show_widget
from shmlab.harness.watch import alive
from shmlab.messages import tr

__all__ = ["LIBS", "Session", "load", "markdown_table", "our_files",
           "show_table", "show_widget", "side_by_side", "training_kernel", "versions"]

def side_by_side(scenario, libs=LIBS) -> dict:
    """Run ``scenario(lib)`` for every lib at once, one thread each; return {lib: result}.

    Each thread drives its own children, so torch and shmlab wait on their children in
    parallel: half the wall time on a 2-core machine. The first exception is re-raised.
    """
    with ThreadPoolExecutor(len(libs)) as pool:
        futures = {lib: pool.submit(scenario, lib) for lib in libs}
        return {lib: f.result() for lib, f in futures.items()}


def our_files(pids) -> list[str]:
    """torch_/shmlab_ files in /dev/shm whose name says one of `pids` created them."""
    pids = set(pids)
    return sorted(s.name for s in introspect.shm_segments()
                  if s.owner in LIBS and s.creator_pid in pids)


def versions() -> str:
    """One line for a notebook's first cell: torch, shmlab and Python versions, CPU count."""
    import platform

    import torch

    import shmlab

    return tr("torch {torch}, shmlab {shmlab}, Python {python}, {cpus} CPUs",
              torch=torch.__version__, shmlab=shmlab.__version__,
              python=platform.python_version(), cpus=os.cpu_count())


def training_kernel() -> None:
    """Set this kernel up for the training notebooks (06, 07): one torch thread (the worker
    processes get the cores), and torch._dynamo imported once here, so that fork children
    inherit it instead of each importing it again when they create an optimizer (seconds)."""
    import torch

    torch.set_num_threads(1)
    importlib.import_module("torch._dynamo")


class Session:
    """What one notebook started, and the one call that takes it down: ``close()``.

    Attributes: ``ctx`` (the multiprocessing context of every child), ``libs`` and ``mp``
    ({lib: module}), ``strategies`` (the sharing strategies when the session began, put back by
    ``close``), ``pids`` (this kernel and every process seen in its family).
    """

    def __init__(self, start_method: str | None = None, libs=LIBS):
        self.ctx = multiprocessing.get_context(start_method)
        loaded = {lib: load(lib) for lib in libs}
        self.libs = {lib: tlib for lib, (tlib, _) in loaded.items()}
        self.mp = {lib: mp for lib, (_, mp) in loaded.items()}
        self.strategies = {lib: mp.get_sharing_strategy() for lib, mp in self.mp.items()}
        self.pids = {os.getpid()}
        self.manager_pids: set[int] = set()  # remembered once seen: they outlive their parent
        self._children, self._pools, self._queues, self._widgets = [], [], [], []
        self._groups: list[int] = []
        # The folder for the worker modules this notebook writes (%%writefile), first on
        # sys.path now, before any child starts: fork children inherit sys.path, spawn
        # children are sent it (Note [Edit the cell, re-run the step] in workers.py).
        self.code_dir = tempfile.mkdtemp(prefix="shmlab-nb-code-")
        sys.path.insert(0, self.code_dir)
        self._ipython = _ipython()
        if self._ipython is not None:  # an edited worker module is fresh in the kernel too
            self._ipython.events.register("pre_run_cell", self._refresh_workers)
        self._dirs_before = set(_socket_dirs())
        self.removed_dirs: list[str] = []  # close(): socket directories of killed processes
        self.closed = False
        atexit.register(self.close)

    @property
    def start_method(self) -> str:
        return self.ctx.get_start_method()

    def __repr__(self) -> str:
        return (f"Session(start method {self.start_method!r}, {len(self._children)} children, "
                f"{len(self._pools)} pools, strategies {self.strategies})")

    # --- starting and tracking -------------------------------------------------------------
    def track(self, obj):
        """Remember a child (anything with ``.pid``, or a pid), to take it down in close()."""
        if isinstance(obj, int):
            self.pids.add(obj)
        else:
            self._children.append(obj)
            if getattr(obj, "pid", None):
                self.pids.add(obj.pid)
        return obj

    def actor(self, commands, *args, name=None):
        """A tracked ``shmlab.harness.actor.Actor(commands, *args)`` in this session's context."""
        from shmlab.harness.actor import Actor

        return self.track(Actor(commands, *args, ctx=self.ctx, name=name))

    def worker(self, lib: str, queue=None, strategy: str | None = None, name=None):
        """A tracked child that runs the notebook's worker functions (``Actor.run``) for `lib`,
        with `queue` (one of this session's) as ``child.queue``; ``strategy``: set it first."""
        from shmlab.harness import workers

        return self.actor(workers.commands, lib, queue, strategy, self.code_dir, name=name)

    def holder(self, lib: str, dataq, strategy: str | None = None, name=None):
        """A tensor-holding actor (``shmlab.harness.holder``) for `lib` on the queue `dataq`."""
        from shmlab.harness import holder

        return self.actor(holder.commands, lib, dataq, strategy, name=name)

    def process(self, target, *args, ctx=None, daemon=True, **kwargs):
        """Start and track a ``Process(target, args, kwargs)`` (a daemon unless told not)."""
        p = (ctx or self.ctx).Process(target=target, args=args, kwargs=kwargs, daemon=daemon)
        p.start()
        return self.track(p)

    def pool(self, processes: int, ctx=None, **kwargs):
        """A tracked ``Pool``; close() terminates it. Its workers' pids join ``pids``."""
        pool = (ctx or self.ctx).Pool(processes, **kwargs)
        self._pools.append(pool)
        self._see_family()
        return pool

    def queue(self, ctx=None):
        """A tracked ``Queue`` (closed in close(), so its feeder thread does not linger)."""
        q = (ctx or self.ctx).Queue()
        self._queues.append(q)
        return q

    def track_group(self, pgid: int) -> None:
        """A process group to SIGKILL in close(), orphans included (a parent that led it)."""
        self._groups.append(pgid)

    def widget(self, make, **kwargs):
        """``show_widget(make, **kwargs)``, and stop the widget in close(): its refresh thread
        ends, its last picture stays (closing it would blank the output, and JupyterLab would
        show "model not found" where the learner was told to look)."""
        w = show_widget(make, **kwargs)
        if w is not None:
            self._widgets.append(w)
        return w

    # --- looking ---------------------------------------------------------------------------
    def _see_family(self) -> None:
        self.pids.update(introspect.process_family())

    def our_files(self) -> list[str]:
        """torch_/shmlab_ files in /dev/shm made by this kernel or a process it started."""
        self._see_family()
        return our_files(self.pids)

    def our_managers(self) -> list:
        """The manager daemons (introspect.ManagerInfo) our processes started."""
        self._see_family()
        alive = introspect.managers()
        self.manager_pids.update(m.pid for m in alive if m.ppid in self.pids)
        return [m for m in alive if m.pid in self.manager_pids]

    def side_by_side(self, scenario) -> dict:
        """``side_by_side(scenario)`` over this session's libraries."""
        return side_by_side(scenario, tuple(self.libs))

    # --- taking down -----------------------------------------------------------------------
    def restore_strategies(self) -> None:
        """Put every library's sharing strategy back to what it was when the session began."""
        for lib, strategy in self.strategies.items():
            self.mp[lib].set_sharing_strategy(strategy)

    def _stop_children(self) -> None:
        for pgid in self._groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # nobody left in the group
        for w in self._widgets:
            try:
                (getattr(w, "stop", None) or w.close)()  # a live view: stop; else close
            except Exception:  # noqa: BLE001, S110 - a widget that is already closed
                pass
        for pool in self._pools:
            pool.terminate()
            pool.join()
        for child in self._children:
            _stop(child)
        for q in self._queues:
            q.close()
            q.join_thread()
        self._widgets, self._pools, self._children, self._queues = [], [], [], []
        self._groups = []

    def children(self) -> list[int]:
        """Live processes of ours: every pid tracked or seen in this kernel's family (orphans
        included), less this kernel, the managers and multiprocessing's own helpers."""
        skip = {os.getpid()} | {m.pid for m in self.our_managers()} | _mp_helpers()
        return sorted(pid for pid in self.pids - skip if alive(pid))

    def leftovers(self) -> dict:
        """{"files": [...], "managers": [pid, ...], "children": [pid, ...]} still here."""
        return {"files": self.our_files(), "managers": [m.pid for m in self.our_managers()],
                "children": self.children()}

    def close(self, timeout: float = 30.0) -> dict:
        """Restore the strategies, stop widgets, actors, pools and processes, then wait (up to
        `timeout` s) for our files, managers and children to go (the managers' 2 s grace).
        Returns ``leftovers()``; safe to call again."""
        self.our_managers()  # remember the managers while their parents are still alive
        self.restore_strategies()
        self._stop_children()
        gc.collect()
        deadline = time.monotonic() + timeout
        while any(self.leftovers().values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._remove_code_dir()
        self._remove_dead_socket_dirs()
        self.closed = True
        atexit.unregister(self.close)
        return self.leftovers()

    def _remove_dead_socket_dirs(self) -> None:
        """A manager removes its socket's directory when it exits, and multiprocessing its
        pymp-* directory (the fd strategy's resource sharer listens there); a SIGKILLed one
        cannot (the notebooks kill some on purpose). Remove those that appeared during this
        session and hold a socket that nothing is bound to (/proc/net/unix) or accepts on, so
        nothing of ours is left in TMPDIR. This kernel's own pymp-* directory stays."""
        bound = _bound_unix_paths()
        mine = multiprocessing.current_process()._config.get("tempdir")
        for path in sorted(set(_socket_dirs()) - self._dirs_before - {mine}):
            if not any(p.startswith(path + os.sep) for p in bound) and _dead_socket_dir(path):
                shutil.rmtree(path, ignore_errors=True)
                self.removed_dirs.append(path)

    def worker_modules(self) -> list[str]:
        """The names of the imported modules this notebook wrote into ``code_dir``."""
        return sorted(name for name, module in list(sys.modules.items())
                      if (getattr(module, "__file__", None) or "").startswith(
                          self.code_dir + os.sep))

    def _refresh_workers(self, *_cell_info) -> None:
        """Before each cell: reload the worker modules whose file a re-run ``%%writefile``
        changed, so ``module.function`` in the kernel is the code the children will run."""
        from shmlab.harness import workers

        for name in self.worker_modules():
            try:
                workers.fresh(name)
            except Exception:  # noqa: BLE001 - a broken edit: the step that runs it says why
                pass

    def _remove_code_dir(self) -> None:
        if self._ipython is not None:
            try:
                self._ipython.events.unregister("pre_run_cell", self._refresh_workers)
            except ValueError:
                pass  # unregistered already (close() called twice)
        if self.code_dir in sys.path:
            sys.path.remove(self.code_dir)
        for name in self.worker_modules():  # forget them: the files are going
            del sys.modules[name]
        shutil.rmtree(self.code_dir, ignore_errors=True)

    def report(self, left: dict | None = None) -> None:
        """Print what close() left (nothing, normally) and the strategies now in force."""
        left = self.leftovers() if left is None else left
        now = ", ".join(f"{lib} {mp.get_sharing_strategy()}" for lib, mp in self.mp.items())
        print(tr("strategies restored: {now}", now=now))
        print(tr("left in /dev/shm: {files} | managers left: {managers} | child processes "
                 "left: {children}", files=left["files"] or tr("nothing"),
                 managers=left["managers"] or tr("none"),
                 children=left["children"] or tr("none")))
        if self.removed_dirs:
            print(tr("removed {n} socket directories of killed processes (a SIGKILLed manager "
                     "or child cannot remove its own): {dirs}", n=len(self.removed_dirs),
                     dirs=", ".join(os.path.basename(d) for d in self.removed_dirs)))


# torch's and shmlab's managers', and multiprocessing's (util.get_temp_dir()), in TMPDIR
SOCKET_DIR_PREFIXES = ("torch-shm-dir-", "shmlab-shm-dir-", "pymp-")


def _socket_dirs() -> list[str]:
    tmp = tempfile.gettempdir()
    try:
        return [os.path.join(tmp, n) for n in os.listdir(tmp) if n.startswith(SOCKET_DIR_PREFIXES)]
    except OSError:
        return []


def _bound_unix_paths() -> set[str]:
    """The paths of the UNIX sockets bound in this network namespace (/proc/net/unix's last
    column): a live manager's socket is among them, without our connecting to it."""
    try:
        with open("/proc/net/unix") as f:
            next(f)  # the header
            return {parts[7] for parts in map(str.split, f) if len(parts) >= 8}
    except OSError:
        return set()  # then _nobody_listens() decides alone


def _dead_socket_dir(path: str) -> bool:
    """``path`` holds a socket and none accepts a connection: its owner is dead. A directory
    with no socket yet may be a live process's, about to bind: kept. A socket of a process in
    another network namespace is missing from our /proc/net/unix but still accepts (a
    path-named socket is found through the file system), so it is kept too."""
    try:
        entries = [e for e in os.scandir(path)
                   if stat.S_ISSOCK(e.stat(follow_symlinks=False).st_mode)]
    except OSError:
        return False
    for entry in entries:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(entry.path)
            return False  # someone answered
        except OSError:
            pass  # ECONNREFUSED: a socket file that nothing listens on any more
        finally:
            sock.close()
    return bool(entries)


def _ipython():
    """The IPython shell this runs in (a notebook's kernel), or None."""
    shell = sys.modules.get("IPython")
    return shell.get_ipython() if shell is not None else None


def _mp_helpers() -> set:
    """multiprocessing's long-lived helpers (fork server, resource tracker): not ours to stop."""
    from multiprocessing import forkserver, resource_tracker

    return {getattr(forkserver._forkserver, "_forkserver_pid", None),
            getattr(resource_tracker._resource_tracker, "_pid", None)}


def _stop(child) -> None:
    """Take one child down: an Actor politely (it has exit()), a Process by join, then kill."""
    if hasattr(child, "exit"):
        child.exit()
        return
    if isinstance(child, int):
        return
    child.join(5)
    if child.exitcode is None:
        child.kill()
        child.join(10)
