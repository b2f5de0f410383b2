"""The receiver's ``SharedCache``, watched: when it purges, how its limit moves, and its lock
after fork (C12.34, C12.35).

Mirrors: ``SharedCache`` in torch/multiprocessing/reductions.py (shmlab's twin in
shmlab.multiprocessing.reductions has the same code):

    __setitem__:            insert; if len(self) > self.limit: self.free_dead_references()
    free_dead_references:   drop every expired weak reference; limit = max(128, 2 * live)
    __init__:               register_after_fork(self, SharedCache._after_fork)  # a new Lock

``fill`` inserts weak references to real storages into a fresh cache of the real class, with a
subclass that only records each purge (it calls the real method). ``FixedLimit`` is the
counterfactual, a limit that never moves (Mirrors: nothing): a purge at every insert once the
cache is full of live storages. ``lock_after_fork`` holds a cache's lock in a thread, forks
twice (a multiprocessing child, a bare ``os.fork()``) and asks each child about its lock.
"""

from __future__ import annotations

import json
import os
import threading
import warnings

from ..harness.libs import load


def _reductions(lib: str):
    load(lib)
    if lib == "torch":
        import torch.multiprocessing.reductions as red
    else:
        import shmlab.multiprocessing.reductions as red
    return red


def watched(lib: str, fixed: bool = False):
    """A fresh cache of ``lib``'s real SharedCache class, recording every purge in ``.purges``:
    (entries scanned, live entries kept, the new limit). ``fixed``: the limit stays 128."""
    base = _reductions(lib).SharedCache

    class Watched(base):
        def free_dead_references(self):
            scanned = len(self)
            super().free_dead_references()
            if fixed:
                self.limit = 128
            self.purges.append((scanned, len(self), self.limit))

    cache = Watched()
    cache.purges = []
    return cache


def fill(lib: str, n: int, keep_every: int = 1, fixed: bool = False) -> dict:
    """Insert ``n`` storages' weak references, keeping every ``keep_every``-th storage alive
    (the others die at once, as received tensors do when dropped)."""
    red, (tlib, _) = _reductions(lib), load(lib)
    cache, alive = watched(lib, fixed), []
    at = []  # the insert (1-based) at which each purge ran
    for i in range(n):
        storage = tlib.UntypedStorage(4)
        if i % keep_every == 0:
            alive.append(storage)
        before = len(cache.purges)
        cache[i] = red.StorageWeakRef(storage)
        del storage
        if len(cache.purges) > before:
            at.append(i + 1)
    scanned = sum(p[0] for p in cache.purges)
    return {"purged at": at, "purges": cache.purges, "limit": cache.limit, "len": len(cache),
            "live": len(alive), "scanned per insert": scanned / n}


# --- the lock after fork ------------------------------------------------------------------------
def _ask(lib: str, parent_lock: int) -> dict:
    """In the child: is this the parent's lock object, is it held, can we take it?"""
    lock = _reductions(lib).shared_cache.lock
    got = lock.acquire(timeout=0.5)
    if got:
        lock.release()
    return {"same object": id(lock) == parent_lock, "acquired": got}


def _mp_child(lib: str, parent_lock: int, conn) -> None:
    conn.send(_ask(lib, parent_lock))


def _bare_fork(lib: str, parent_lock: int) -> dict:
    r, w = os.pipe()
    with warnings.catch_warnings():  # 3.12+: "use of fork() may lead to deadlocks" - the point
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        try:
            os.write(w, json.dumps(_ask(lib, parent_lock)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        raw = f.read()
    os.waitpid(pid, 0)
    return json.loads(raw)


def lock_after_fork(lib: str) -> dict:
    """Fork while another thread holds ``lib``'s ``shared_cache.lock``; what each child sees."""
    import multiprocessing

    lock = _reductions(lib).shared_cache.lock
    held, done = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            done.wait(30)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    held.wait(10)
    try:
        ctx = multiprocessing.get_context("fork")
        parent_end, child_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_mp_child, args=(lib, id(lock), child_end), daemon=True)
        p.start()
        got = parent_end.recv() if parent_end.poll(60) else None
        p.join(30)
        if p.is_alive():  # never answered: take it down rather than leave it
            p.kill()
            p.join()
        parent_end.close()
        child_end.close()
        result = {"held in the parent": lock.locked(), "multiprocessing child": got,
                  "os.fork() child": _bare_fork(lib, id(lock))}
    finally:
        done.set()
        thread.join(30)
    return result
