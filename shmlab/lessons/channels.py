"""Workers that receive tensors through each multiprocessing channel and report what arrived.

These are the child halves of the experiments in notebooks 01, 02, 04 and 09 (Process
arguments, Queue, Pipe, Pool, DataLoader workers), written once for both libraries. They live
in the package because a ``spawn`` or ``forkserver`` child re-imports its target by module and
name: a function defined in a notebook cell lives in ``__main__``. ``report_start`` reads
``PARENT_MARK``, a global a parent may set on this module at run time (fork copies it).
"""

from __future__ import annotations

import gc
import os
import resource
from multiprocessing.reduction import ForkingPickler

from ..harness.libs import fd_count, load


def write_then_watch(arg_t, inq, conn, done, go, results, value: float = 1.0):
    """One child, three channels: a tensor as a Process argument, one from a Queue, one
    from a Pipe. Write ``value`` at [0] of each, signal ``done``, wait for ``go``, then
    report [1] of each (which the parent wrote meanwhile).
    """
    tensors = {"args": arg_t, "queue": inq.get(timeout=30), "pipe": conn.recv()}
    for t in tensors.values():
        t.numpy().reshape(-1)[0] = value
    done.set()
    go.wait(30)
    results.put({k: float(t.numpy().reshape(-1)[1]) for k, t in tensors.items()})
    conn.close()


def pool_write(t, value: float = 1.0) -> float:
    """Pool task: write ``value`` at [0] of a tensor that came through the pool's task queue."""
    t.numpy().reshape(-1)[0] = value
    return float(t.numpy().reshape(-1)[1])


def describe_views(inq, results):
    """Report how tensors arrived: offsets, shapes, strides, and which share a storage."""
    items = inq.get(timeout=30)
    ptrs = [t.untyped_storage().data_ptr() for t in items]
    results.put([
        {
            "offset": t.storage_offset(),
            "shape": tuple(t.shape),
            "stride": tuple(t.stride()),
            "storage_nbytes": t.untyped_storage().nbytes(),
            "same_storage_as_first": ptrs[i] == ptrs[0],
            "values": t.numpy().tolist(),
        }
        for i, t in enumerate(items)
    ])


def share_both_ways(arg_t, inq, done, go, results, value: float = 1.0):
    """Receive a tensor as a Process argument and one from a Queue; report whether each
    arrived in shared memory; write ``value`` at [0] of each, signal ``done``, wait for
    ``go``, then report [1] of each (which the parent wrote meanwhile).
    """
    got = {"args": arg_t, "queue": inq.get(timeout=60)}
    arrived_shared = {k: bool(t.is_shared()) for k, t in got.items()}
    for t in got.values():
        t.numpy().reshape(-1)[0] = value  # the parent reads this at [0]
    done.set()
    go.wait(60)
    results.put({
        "is_shared": arrived_shared,
        "seen": {k: float(t.numpy().reshape(-1)[1]) for k, t in got.items()},
    })


def report_strategy(lib: str, results):
    """Report (lib, pid, this process's sharing strategy): fork children inherit the
    parent's choice with its memory; spawn and forkserver children import the module fresh.
    """
    _, mp = load(lib)
    results.put((lib, os.getpid(), mp.get_sharing_strategy()))


def report_start(results):
    """Report what this child got from its parent: pid, ppid, whether torch is already
    imported here, and a mark the parent set on this module at run time (fork copies the
    parent's memory, so it is there; spawn and forkserver children import the module fresh).
    """
    import sys

    results.put({"pid": os.getpid(), "ppid": os.getppid(),
                 "torch imported": "torch" in sys.modules,
                 "parent's run-time mark": globals().get("PARENT_MARK")})


def hold_and_count(lib: str, inq, results, n: int):
    """Receive ``n`` tensors and keep them; report fd counts before, holding, after release."""
    load(lib)
    gc.collect()
    before = fd_count()
    held = [inq.get(timeout=60) for _ in range(n)]
    holding = fd_count()
    del held
    gc.collect()
    results.put({"before": before, "holding": holding, "after": fd_count()})


def receive_until_failure(lib: str, nofile: int, inq, results, n: int):
    """Lower RLIMIT_NOFILE to ``nofile``, then receive ``n`` tensors holding each one.

    Reports how many arrived and the error (type and message) that stopped it, if any.
    """
    load(lib)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
    held, error = [], None
    try:
        for _ in range(n):
            held.append(inq.get(timeout=30))
    except Exception as exc:  # noqa: BLE001 - the point is to report whatever stopped us
        error = (type(exc).__name__, str(exc))
    count = len(held)
    del held
    gc.collect()
    results.put({"received": count, "error": error, "fds_after_release": fd_count()})


def echo(inq, outq):
    """Send back whatever arrives, until None: the far end of the handoff benchmark."""
    while True:
        item = inq.get()
        if item is None:
            return
        outq.put(item)
        del item  # hold nothing between round trips


def open_shared_fds(lib: str, n: int, go, opened, release):
    """Wait for ``go``, then hold ``n`` tensors shared with file_descriptor (one fd each), set
    ``opened``, and keep them until ``release``: an fd monitor sees the count rise, then fall."""
    tlib, mp = load(lib)
    mp.set_sharing_strategy("file_descriptor")
    go.wait(60)
    held = [tlib.zeros(256).share_memory_() for _ in range(n)]
    opened.set()
    release.wait(120)
    del held


def hold_received(lib: str, inq, n: int, ready):
    """Receive ``n`` tensors and hold them until a ``None`` arrives (or someone SIGKILLs us).

    We wait on the queue, not on an Event: a process killed while waiting on a
    multiprocessing Event leaves its Condition expecting a wake-up, and the next ``set()``
    would block forever.
    """
    load(lib)
    held = [inq.get(timeout=60) for _ in range(n)]
    ready.set()
    inq.get()
    del held


def share_with_receiver(lib: str, n: int, nbytes: int, info, release):
    """The leak scenario's sender: share ``n`` file_system tensors of ``nbytes`` with a receiver
    child, put ``{"sender", "receiver"}`` pids on ``info`` once it holds them all, then wait
    until ``release`` is set (we tell the receiver to let go, and both exit cleanly) or the
    receiver dies. SIGKILL the receiver and then us, as a scheduler kills a job: nobody gives
    its refcount back, every segment stays at refcount 2 with a dead creator (us), a leak the
    manager reclaims. (After that, never ``release.set()``: a process killed while waiting on
    a multiprocessing Event leaves it expecting a wake-up, and ``set()`` would block.)
    """
    tlib, mp = load(lib)
    mp.set_sharing_strategy("file_system")
    # Fork the receiver *before* our first file_system tensor: the child must not inherit our
    # connection to the manager (torch's libshm would share the socket with it).
    ctx = mp.get_context("fork")
    inq, ready = ctx.Queue(), ctx.Event()
    receiver = ctx.Process(target=hold_received, args=(lib, inq, n, ready))
    receiver.start()
    held = [tlib.zeros(max(1, nbytes // 4)) for _ in range(n)]
    for t in held:
        inq.put(t)
    if not ready.wait(120):
        receiver.kill()
    info.put({"sender": os.getpid(), "receiver": receiver.pid})
    while receiver.is_alive():
        if release.wait(0.05):
            inq.put(None)
            break
    receiver.join()
    del held


def collate_and_report(samples):
    """A DataLoader ``collate_fn`` that also says who collated the batch: the worker's pid and
    the sharing strategy *its* torch.multiprocessing uses to send the batch to the parent; and
    where the batch was born: ``default_collate`` in a worker allocates it in shared memory
    ("born shared"), so pickling it for the queue leaves it in place ("moved by pickling"
    False), whereas a private tensor of the same batch is copied into a new segment."""
    import torch
    import torch.multiprocessing
    from torch.utils.data import default_collate

    x, y = default_collate(samples)
    private = torch.stack([s[0] for s in samples])  # the same batch, made the ordinary way
    ptrs = (x.untyped_storage().data_ptr(), private.untyped_storage().data_ptr())
    born_shared = x.is_shared()
    for t in (x, private):  # what the worker's queue does with the batch next
        ForkingPickler.loads(ForkingPickler.dumps(t))  # (received at once: no dup is left)
    return x, y, {"pid": os.getpid(), "strategy": torch.multiprocessing.get_sharing_strategy(),
                  "born shared": born_shared,
                  "moved by pickling": ptrs[0] != x.untyped_storage().data_ptr(),
                  "private moved by pickling": ptrs[1] != private.untyped_storage().data_ptr()}
