"""Code a notebook writes, run in a child it started: the learner's own torch lines, by name.

An experiment's torch lines belong in the notebook, where the learner reads, changes and
re-runs them. But a ``spawn`` child cannot run a function defined in a cell: it unpickles a
function by module and name, and the notebook's ``__main__`` is not a module it can import.
So a notebook writes its child-side code to a small module with ``%%writefile``, in a folder
its ``Session`` put on ``sys.path`` before any child started, and asks a child to run it::

    %%writefile {session.code_dir}/nb04_receiver.py
    def receive(child, key):
        t = child.queue.get(timeout=60)   # unpickling maps the sender's segment
        child.kept[key] = t
        return t.shape

    import nb04_receiver
    receiver = session.worker("torch", q)          # an Actor running commands() below
    receiver.run(nb04_receiver.receive, "one")     # -> receive(child, "one") in the child

Every function a child runs takes the child's context first (``child``, like ``self``): the
library it was started for, the queue it shares with the notebook, and ``kept``, the tensors it
holds between two steps (so the notebook can look at fds and /dev/shm in between).

Note [Edit the cell, re-run the step]
A child imports the worker module once, then keeps it; a fork child even inherits the kernel's
copy. Re-running the ``%%writefile`` cell rewrites the file, and the next ``run`` must run the
new code without restarting the child (a spawn child re-imports torch: seconds). So ``run`` sends
the module's *name*, and the child compares the file's bytes with those it last loaded
(``fresh``): changed, it reloads the module first. The kernel does the same when it calls
``fresh`` itself, so an edited function can also run in the notebook. A worker started by a
``Session`` runs only modules written into its ``code_dir``, so torch and shmlab are never
reloaded.

Mirrors: nothing in torch. CPython's ``multiprocessing.spawn`` (``get_preparation_data`` sends
the parent's ``sys.path`` and working directory, so a spawn child finds the same modules) and
``importlib.reload``.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import importlib.util
import os
import sys

# module name -> digest of the source it was last loaded from, in this process
_loaded: dict[str, bytes] = {}


def _digest(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha1(f.read()).digest()
    except OSError:
        return None


def fresh(name: str):
    """The module ``name``, imported or reloaded so that it runs what its file holds now
    (Note [Edit the cell, re-run the step])."""
    module = sys.modules.get(name)
    if module is None:
        importlib.invalidate_caches()  # a file written after this process last looked
        module = importlib.import_module(name)
        stale = False
    else:  # met before here, or inherited from a fork: stale unless we loaded these bytes
        stale = _loaded.get(name) != _digest(_path(module, name))
    if stale:
        _drop_bytecode(_path(module, name))
        module = importlib.reload(module)
    _loaded[name] = _digest(_path(module, name))
    return module


def _drop_bytecode(path: str) -> None:
    # An edit of the same size within the same second as the last write looks unchanged to the
    # .pyc check (source mtime in whole seconds, and size): remove the cache so reload compiles.
    try:
        os.remove(importlib.util.cache_from_source(path))
    except (OSError, NotImplementedError, ValueError):
        pass  # no cache written (PYTHONDONTWRITEBYTECODE), or none to find


def _path(module, name: str) -> str:
    path = getattr(module, "__file__", None)
    if path is None:
        raise ValueError(f"{name!r} is not a module loaded from a file: write the worker "
                         "code with %%writefile into session.code_dir, then import it")
    return path


def function(module: str, qualname: str):
    """The function ``module.qualname``, from the module's current source."""
    obj = fresh(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def reference(fn) -> tuple[str, str]:
    """(module, qualname) of a worker function, refused with the fix if a child cannot
    import it: defined in a cell (``__main__``), or nested in another function."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not callable(fn) or module is None:
        raise TypeError(f"run() takes a function, got {fn!r}")
    if module == "__main__" or "<locals>" in qualname:
        raise ValueError(
            f"{qualname} is defined in a notebook cell (or inside a function), which a child "
            "cannot import: put it in a cell that starts with "
            "'%%writefile {session.code_dir}/<name>.py', run that cell, import <name>, "
            "and pass <name>.<function>")
    return module, qualname


def _check_written_here(name: str, code_dir: str) -> None:
    """Refuse a module the notebook did not write: ``run`` reloads what it runs, and reloading
    torch or shmlab in a child would reset their state (``shared_cache``, the strategy)."""
    importlib.invalidate_caches()
    spec = importlib.util.find_spec(name)
    origin = getattr(spec, "origin", None) or ""
    if not origin.startswith(os.path.join(code_dir, "")):
        raise ValueError(f"run() runs the functions this notebook wrote into session.code_dir; "
                         f"{name!r} is {origin or 'not a file'}: copy the function into a "
                         "%%writefile {session.code_dir}/<name>.py cell")


class Child:
    """What a worker function gets first: ``lib`` ("torch" or "shmlab"), ``tlib`` (that
    library), ``mp`` (its multiprocessing), ``queue`` (shared with the notebook, or None) and
    ``kept`` (anything the child holds between two steps, by key)."""

    def __init__(self, lib: str, queue=None, strategy: str | None = None):
        from .libs import load

        self.lib, self.queue, self.kept = lib, queue, {}
        self.tlib, self.mp = load(lib)
        if strategy is not None:
            self.mp.set_sharing_strategy(strategy)

    def __repr__(self) -> str:
        return f"<Child {self.lib} kept={sorted(self.kept)}>"


def commands(lib: str, queue=None, strategy: str | None = None,
             code_dir: str | None = None) -> dict:
    """The command table of a worker child (run by ``Actor``; ``Actor.run`` sends ``run``).

    run      MODULE, QUALNAME, ARGS   what ``MODULE.QUALNAME(child, *ARGS)`` returned; with
                                      ``code_dir``, only modules written there
    fds      -                        {"total", "shm", "links", "recvfds_calls"}: observation
    exit     -                        drops what the child kept
    """
    from .holder import FdArrivals, fd_report

    FdArrivals.install()  # count every fd that arrives over SCM_RIGHTS (observation only)
    child = Child(lib, queue, strategy)

    def run(module, qualname, args):
        if code_dir is not None:
            _check_written_here(module, code_dir)
        return function(module, qualname)(child, *args)

    def exit():
        child.kept.clear()
        gc.collect()

    return {"run": run, "fds": fd_report, "exit": exit}
