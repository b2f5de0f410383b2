"""An empty tensor through a Queue, under each strategy: what travels, what is made, and
``is_shared()`` at both ends (C12.32, C12.33).

Mirrors: the empty branch of ``reduce_storage`` in torch/multiprocessing/reductions.py

    elif get_sharing_strategy() == "file_system":   # tested first: an empty storage gets a
        metadata = storage._share_filename_cpu_()   # segment like any other, header only
    elif storage.size() == 0:
        return (rebuild_storage_empty, (type(storage),))   # no fd, no file: "make an empty one"

and THPStorage_shareFilename, which maps ``nbytes + 64`` bytes: 64 for a 0-byte storage.

``send_empty(strategy, send, receive)``: a ``sender`` actor makes an empty float32 tensor,
pickles it the way a Queue does and puts it on the Queue a ``shmlab.harness.holder`` actor reads;
the report says what each end has and what appeared in /dev/shm.
"""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler

from .. import introspect
from ..harness.libs import load

REBUILDS = (b"rebuild_storage_empty", b"rebuild_storage_filename", b"rebuild_storage_fd")


def rebuild_of(t) -> str:
    """Which ``rebuild_storage_*`` the pickle of ``t`` names. The message is taken back here at
    once (a cache hit: under file_system that releases its in-flight count), so nothing is left
    waiting, as a real receiver would leave nothing."""
    payload = bytes(ForkingPickler.dumps(t))
    ForkingPickler.loads(payload)
    return next(name.decode() for name in REBUILDS if name in payload)


def _segments(lib: str, pid: int) -> dict:
    """The segments of ``lib`` that ``pid`` made, in /dev/shm: name -> (size, refcount)."""
    mine = f"{lib}_{pid}_"
    return {s.name: (s.size, s.refcount) for s in introspect.shm_segments()
            if s.name.startswith(mine)}


def sender(lib: str, dataq) -> dict:
    """The command table of the sending child (``shmlab.harness.actor``): the file_system half
    makes its segment (and starts its manager) there, never in the notebook's kernel.

    ====  ======================  =========================================================
    name  arguments               reply
    ====  ======================  =========================================================
    lib   -                       the library's name, "torch" or "shmlab"
    send  STRATEGY, SHARE_FIRST   {"pickle names", "sender before", "sender after"}: makes
                                  ``empty(0)`` (``share_memory_()`` first if SHARE_FIRST),
                                  puts it on dataq and keeps it
    drop  -                       None; lets go of it
    ====  ======================  =========================================================
    """
    tlib, mp = load(lib)
    held = []

    def send(strategy: str, share_first: bool) -> dict:
        mp.set_sharing_strategy(strategy)
        t = tlib.empty(0)
        if share_first:
            t.share_memory_()
        before, rebuild = t.is_shared(), rebuild_of(t)
        dataq.put(t)
        held.append(t)
        return {"pickle names": rebuild, "sender before": before, "sender after": t.is_shared()}

    return {"lib": lambda: lib, "send": send, "drop": held.clear, "exit": held.clear}


def send_empty(strategy: str, send, receive, share_first: bool = False) -> dict:
    """``send`` (a ``sender`` actor) puts ``empty(0)`` on the queue that ``receive`` (a
    ``shmlab.harness.holder`` actor) reads; what each end has, and what is in /dev/shm."""
    lib = send("lib")
    fds0 = receive("fds")["shm"]
    report = send("send", strategy, share_first)
    receive("recv", "empty", 1)
    new = _segments(lib, send.pid)
    mapped = introspect.mapped_by(f"{introspect.SHM_DIR}/{n}" for n in new)
    report.update({"receiver": receive("shared", "empty")[0],
                   "receiver new shm fds": receive("fds")["shm"] - fds0, "new files": new,
                   "receiver maps it": [receive.pid in p for p in mapped.values()]})
    receive("drop", "empty")
    send("drop")  # the last holder: a file_system segment's count reaches 0 and its name goes
    report["files left"] = sorted(n for n in _segments(lib, send.pid) if n in new)
    return report
