"""Count the fds a file_descriptor sender holds per shared tensor, message by message.

Notebook 12, claims C12.27 - C12.29 (notebook 04's C12.7 showed one unreceived message pinning
one segment; here: N tensors, each fd counted, and when each one goes away).

The notebook writes the experiment (a producer P shares N tensors under ``file_descriptor`` and
puts each on the queue twice, ``2N`` messages; the consumer C takes the first ``K``, one message
of each of K tensors). ``look()`` is what it calls after every step: from the outside, the fds P
and C hold on each segment (``/proc/<pid>/fd``), P's sockets, and the MiB still allocated.

Who holds what (CPython multiprocessing/resource_sharer.py, torch reductions.py):

* P's storage keeps the fd ``shm_open`` returned (MapAllocator KEEPFD): one per tensor, for as
  long as the tensor lives in P;
* pickling for a Queue makes ``DupFd``: ``os.dup(fd)``, registered with ``resource_sharer``,
  whose listener thread (one AF_UNIX socket per process, made at the first message) keeps the
  dup until a receiver connects and asks for it; it is closed right after ``sendfds``: one
  per *message*, not per tensor, so a tensor put twice costs two;
* C ``dup``s what arrives (``_new_shared_fd_cpu``) and closes the received fd: one per storage
  it holds, however often that storage arrived (the cache by ``fd_id``);
* a message nobody receives keeps its dup, and so the segment's memory, until P exits.

Mirrors: nothing (teaching aid); it counts what CPython's resource_sharer.py and torch's
reductions.py (``reduce_storage``'s fd branch, ``rebuild_storage_fd``) hold.
"""

from __future__ import annotations

import os

from ..introspect import fd_counts
from .crashes import Pair, fds_on


def _mib(path: str, pids) -> float:
    """MiB allocated for the unlinked segment at ``path``, through any fd on it; 0 if none."""
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd") if os.path.isdir(f"/proc/{pid}") else ():
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").removesuffix(" (deleted)") == path:
                    return os.stat(f"/proc/{pid}/fd/{fd}").st_blocks * 512 / 2**20
            except OSError:
                continue
    return 0.0


def look(pair: Pair, paths: list[str], moment: str) -> dict:
    """P's and C's fds on each segment, P's sockets, and the MiB still allocated in all."""
    pids = [pid for pid in (pair.P.pid, pair.C.pid) if os.path.isdir(f"/proc/{pid}")]
    p = [fds_on(path, pair.P.pid) for path in paths]
    c = [fds_on(path, pair.C.pid) for path in paths]
    sockets = fd_counts(pair.P.pid)["socket"] if pair.P.pid in pids else None
    state = {"moment": moment, "P fds per tensor": p, "C fds per tensor": c,
             "P sockets": sockets, "MiB": round(sum(_mib(x, pids) for x in paths), 2)}
    pair.timeline.append(state)
    return state
