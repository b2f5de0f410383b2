"""Worker functions that run in child processes, for notebooks, labs and tests.

They live in the package because a ``spawn`` or ``forkserver`` child re-imports the function
by name: a function defined in a notebook cell lives in ``__main__`` and cannot be found there.
Each worker takes ``lib`` ("torch" or "shmlab") so one scenario runs on both side by side;
only ``.numpy()`` is used on tensors, which both give as a zero-copy view.
"""

from __future__ import annotations

import gc
import os
import resource


def load(lib: str):
    """(tensor library, its multiprocessing module) for "torch" or "shmlab"."""
    if lib == "torch":
        import torch
        import torch.multiprocessing as mp

        torch.set_num_threads(1)  # children on a 2-core machine: no thread oversubscription
        return torch, mp
    if lib == "shmlab":
        import shmlab
        import shmlab.multiprocessing as mp

        return shmlab, mp
    raise ValueError(f"lib must be 'torch' or 'shmlab', got {lib!r}")


def new_tensor(lib: str, values):
    """A private (not yet shared) float32 tensor of ``values`` in either library."""
    import numpy as np

    arr = np.asarray(values, dtype=np.float32)
    tlib, _ = load(lib)
    return tlib.from_numpy(arr.copy())


def fd_count() -> int:
    """Open fds of this process (what `ls /proc/self/fd | wc -l` shows)."""
    return len(os.listdir("/proc/self/fd"))


def shm_fd_count() -> int:
    """Open fds of this process that point at shared memory (/dev/shm/..., deleted or not)."""
    from .introspect import fd_counts

    counts = fd_counts()
    return counts["shm-deleted"] + counts["shm-named"]


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


# -- live widgets: fd monitor and leak-cleanup scenarios (shmlab.widgets, 09_live_dashboard) --


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


# --- notebooks 01 (what is torch.multiprocessing) and 02 (the sharing-strategy API) --------


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


def parent_with_sleeping_child(lib: str, method: str | None = None, seconds: float = 60.0):
    """Be the *parent* in the abrupt-exit demo: start one daemonic child that sleeps for
    ``seconds``, print its pid, and wait. Run it as its own process and SIGKILL it:

        python -c "from shmlab.workers import parent_with_sleeping_child as p; p('torch')"

    A normal exit would terminate the daemonic child (multiprocessing's atexit handler);
    SIGKILL runs no handler, so the child lives on as an orphan. ``seconds`` bounds how
    long a forgotten orphan can outlive the demo.
    """
    import time

    _, mp = load(lib)
    child = mp.get_context(method).Process(target=time.sleep, args=(seconds,), daemon=True)
    child.start()
    print(child.pid, flush=True)
    child.join()


# --- A steerable child: notebooks 04 and 05 ------------------------------------------------
#
# Note [Why one long-lived actor instead of one worker per step]
# A notebook step wants to stop *between* two actions of a child (after it made a tensor,
# before it sends it) and look at /dev/shm, /proc/<pid>/fd and the refcount header. A child
# that runs one command at a time and answers each one gives those pauses. It also keeps
# the notebook fast under `spawn`: every spawned child imports torch again (seconds), so a
# notebook starts a few actors once and reuses them for every step.


def _shm_links() -> list[dict]:
    """This process's fds on /dev/shm: number, link text, and the inode they point at."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("/dev/shm/"):
                st = os.stat(int(fd))
                found.append({"fd": int(fd), "link": link, "ino": st.st_ino, "dev": st.st_dev})
        except OSError:  # the fd listing itself, closed meanwhile
            pass
    return sorted(found, key=lambda d: d["fd"])


def _handle(t, strategy: str) -> dict:
    """Where a shared tensor's bytes live; under file_system also its segment name.

    Only asked under file_system: ``_share_filename_cpu_()`` on an fd-shared storage would
    move it into a new named segment, which is not a question but a change.
    """
    s = t.untyped_storage()
    info = {"data_ptr": s.data_ptr(), "nbytes": s.nbytes(), "first": float(t.numpy()[0]),
            "name": None}
    if strategy == "file_system":  # (manager socket, b"/torch_..." or b"/shmlab_...", nbytes)
        manager, name, size = s._share_filename_cpu_()
        info.update(manager=manager, name=name.decode().lstrip("/"), size=size)
    return info


def actor(lib: str, conn, dataq):
    """Hold tensors in a child process and run one command at a time from ``conn``.

    Each command is a tuple ``(name, *args)`` and gets one reply: ``("ok", result)`` or
    ``("error", type name, message)``. Tensors travel only on ``dataq`` (a Queue of the
    same multiprocessing context), never on ``conn``. Commands:

      strategy NAME            set this process's sharing strategy; returns it
      nofile SOFT|None         set RLIMIT_NOFILE's soft limit (None: back to the original)
      make KEY COUNT NUMEL     COUNT new float32 tensors, the i-th full of i, moved to
                               shared memory with this process's strategy, and kept
      send KEY TIMES           put each tensor of KEY on dataq, TIMES times over
      recv KEY COUNT           take COUNT tensors off dataq and keep them; stops at the first
                               error and returns {"received", "error"}
      drop KEY                 forget the tensors of KEY (freed at once)
      handle KEY               where the first tensor of KEY lives (see _handle)
      attach KEY MANAGER NAME SIZE   map a file_system segment by its name alone
      ptrs KEY                 the data pointer of each tensor of KEY
      write KEY VALUE          write VALUE at [0] of the first tensor of KEY
      fds                      {"total", "shm", "links", "recvfds_calls"}
      exit                     reply, then return
    """
    import multiprocessing
    from multiprocessing import reduction

    tlib, mp = load(lib)
    held: dict[str, list] = {}
    original_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    received = {"calls": 0}
    real_recvfds = reduction.recvfds

    def counting_recvfds(sock, size):  # every fd that arrives over SCM_RIGHTS passes here
        received["calls"] += 1
        return real_recvfds(sock, size)

    reduction.recvfds = counting_recvfds

    def recv(key, count):
        got, error = held.setdefault(key, []), None
        try:
            for _ in range(count):
                got.append(dataq.get(timeout=60))
        except Exception as exc:  # noqa: BLE001 - the point is to report what stopped us
            error = (type(exc).__name__, str(exc))
        return {"received": len(got), "error": error}

    def nofile(soft):
        soft = original_nofile[0] if soft is None else soft
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, original_nofile[1]))
        return resource.getrlimit(resource.RLIMIT_NOFILE)

    def make(key, count, numel):
        import numpy as np

        ts = [tlib.from_numpy(np.full(numel, float(i), np.float32)) for i in range(count)]
        held[key] = [t.share_memory_() for t in ts]
        return _handle(held[key][0], mp.get_sharing_strategy())

    def send(key, times=1):
        for _ in range(times):
            for t in held[key]:
                dataq.put(t)
        return len(held[key]) * times

    def drop(key):  # tensors hold no cycles: the last reference going frees them at once
        held.pop(key, None)  # (no gc.collect(): with torch loaded it takes ~0.4 s)
        return sorted(held)

    def attach(key, manager, name, size):
        import numpy as np

        storage = tlib.UntypedStorage._new_shared_filename_cpu(manager, name, size)
        if lib == "torch":  # a float32 tensor over the whole storage, as the sender made it
            t = tlib.empty(0, dtype=tlib.float32).set_(storage)
        else:
            t = tlib.Tensor(storage, 0, (size // 4,), (1,), np.dtype("float32"))
        held[key] = [t]
        return {"data_ptr": storage.data_ptr(), "nbytes": storage.nbytes()}

    def ptrs(key):  # one data pointer per tensor held: equal pointers = one shared storage
        return [t.untyped_storage().data_ptr() for t in held[key]]

    def write(key, value):
        held[key][0].numpy().reshape(-1)[0] = value
        return value

    def fds():
        links = _shm_links()
        return {"total": fd_count(), "shm": len(links), "links": links,
                "recvfds_calls": received["calls"]}

    commands = {
        "strategy": lambda name: (mp.set_sharing_strategy(name), mp.get_sharing_strategy())[1],
        "nofile": nofile, "make": make, "send": send, "recv": recv, "drop": drop,
        "handle": lambda key: _handle(held[key][0], mp.get_sharing_strategy()),
        "attach": attach, "ptrs": ptrs, "write": write, "fds": fds, "exit": lambda: None,
    }
    parent = multiprocessing.parent_process()
    while True:
        try:
            # A fork child holds a copy of the notebook's end of the pipe too, so EOF alone
            # cannot tell us the notebook died: look at the parent once a second as well.
            while not conn.poll(1.0):
                if parent is not None and not parent.is_alive():
                    return
            name, *args = conn.recv()
        except EOFError:  # the notebook went away: nothing left to answer
            return
        try:
            reply = ("ok", commands[name](*args))
        except Exception as exc:  # noqa: BLE001 - report it; the notebook decides
            reply = ("error", type(exc).__name__, str(exc))
        conn.send(reply)
        if name == "exit":
            held.clear()
            gc.collect()
            return


# --- notebook 03 (start methods, CUDA sharing and its CPU model) ---------------------------


def report_start(results):
    """Report what this child got from its parent: pid, ppid, whether torch is already
    imported here, and a mark the parent set on this module at run time (fork copies the
    parent's memory, so it is there; spawn and forkserver children import the module fresh).
    """
    import sys

    results.put({"pid": os.getpid(), "ppid": os.getppid(),
                 "torch imported": "torch" in sys.modules,
                 "parent's run-time mark": globals().get("PARENT_MARK")})


def ipc_model_consumer(conn):
    """The consumer of ``shmlab.cuda_ipc_model``: one command per message on ``conn``, one
    reply each (``("ok", result)`` or ``("error", type name, message)``). Blocks arrive
    pickled in the message itself (``Block.__reduce__`` shares them) or as an ``IpcHandle``.

      recv KEY BLOCK|HANDLE  keep it as KEY; reply its handle, offset and first 4 float32
      write KEY VALUE        fill it with VALUE (the producer sees it)
      read KEY               its first 4 float32
      free KEY               release it (the producer's counter goes to 0)
      resend KEY             pickle it again, as if sending it on (raises, as in torch)
      exit                   release everything and return
    """
    from multiprocessing.reduction import ForkingPickler

    import numpy as np

    from shmlab import cuda_ipc_model as model

    held = {}
    try:
        while True:
            op, *args = conn.recv()
            try:
                if op == "exit":
                    conn.send(("ok", None))
                    return
                if op == "recv":
                    key, got = args
                    b = got if isinstance(got, model.Block) else model.rebuild_block(*got)
                    held[key] = b
                    result = (b.handle, b.offset, b.numpy(np.float32)[:4].tolist())
                elif op == "write":
                    held[args[0]].numpy(np.float32)[:] = args[1]
                    result = None
                elif op == "read":
                    result = held[args[0]].numpy(np.float32)[:4].tolist()
                elif op == "free":
                    result = held.pop(args[0]).free()
                elif op == "resend":
                    result = bytes(ForkingPickler.dumps(held[args[0]]))
                else:
                    raise ValueError(f"unknown command {op!r}")
                conn.send(("ok", result))
            except Exception as exc:  # noqa: BLE001 - reported to the parent, who decides
                conn.send(("error", type(exc).__name__, str(exc)))
    finally:
        held.clear()
        model.shutdown()  # fork/forkserver children leave with os._exit: no atexit


def cuda_consumer(inq, outq, release):
    """Real CUDA (tests/test_cuda.py, notebook 03 on a GPU): receive a CUDA tensor, report
    its device and the IPC fields it arrived with, add 1 in place (the producer sees it),
    then hold it until ``release`` is set, report its sum again and drop it.
    """
    import torch

    t = inq.get(timeout=120)
    t += 1
    torch.cuda.synchronize()
    outq.put({"device": str(t.device), "sum": float(t.sum()), "ptr": t.data_ptr()})
    release.wait(120)
    outq.put({"sum": float(t.sum())})  # still ours even if the producer dropped its tensor
    del t
    torch.cuda.synchronize()
    outq.put("released")


def cuda_resend(inq, outq):
    """Real CUDA: try to send a received CUDA tensor on; report the error message."""
    from multiprocessing.reduction import ForkingPickler

    t = inq.get(timeout=120)
    try:
        ForkingPickler.dumps(t)
        outq.put("sent")
    except RuntimeError as exc:
        outq.put(str(exc))
    del t


def cuda_in_fork_child(results):
    """Real CUDA, fork start method: touch CUDA in a child forked after the parent did."""
    import torch

    try:
        torch.zeros(1, device="cuda")
        results.put("ok")
    except RuntimeError as exc:
        results.put(str(exc))


def produce_then_exit(lib: str, outq, got, values):
    """Notebook 03, CPU tensors: make a tensor of ``values``, send it on ``outq``, wait until
    the consumer says it ``got`` it, drop our reference and exit. On CPU the consumer's
    tensor stays valid: its own fd (or name) keeps the shared memory alive.
    """
    t = new_tensor(lib, values)
    outq.put(t)
    got.wait(60)
    del t
    gc.collect()


# --- notebook 08 (when the parent dies) ----------------------------------------------------


def _guard(guard: str | None) -> None:
    """Arrange for this child to die with its parent. ``guard`` is None or "+"-joined steps:
    "ignore-sigint" (SIGINT ignored, as a background job inherits it), "pdeathsig:SIGNAME"
    (prctl PR_SET_PDEATHSIG through torch's own binding, which torch.multiprocessing.spawn
    calls with SIGINT), "watchdog" (a thread polls os.getppid() and exits when it changes).
    """
    import signal
    import threading
    import time

    for step in (guard.split("+") if guard else ()):
        if step == "ignore-sigint":
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        elif step.startswith("pdeathsig:"):
            from torch.multiprocessing import _prctl_pr_set_pdeathsig

            _prctl_pr_set_pdeathsig(getattr(signal, step.split(":", 1)[1]))
        elif step == "watchdog":
            parent = os.getppid()

            def watch(parent=parent):
                while os.getppid() == parent:
                    time.sleep(0.05)
                os._exit(3)  # re-parented: our parent is gone

            threading.Thread(target=watch, daemon=True).start()
        else:
            raise ValueError(f"unknown guard step {step!r}")


def guarded_sleep(seconds: float, guard: str | None = None, ready=None):
    """Set up ``guard`` (see ``_guard``), set ``ready`` (an Event) if given, sleep ``seconds``.

    Waiting for ``ready`` closes a race: a parent (thread) that dies before the child called
    prctl(PR_SET_PDEATHSIG) is never noticed.
    """
    import time

    _guard(guard)
    if ready is not None:
        ready.set()
    time.sleep(seconds)


def orphan_parent(guards=(None, None), method: str | None = None, seconds: float = 60.0,
                  linger: float | None = None, report=None, new_session: bool = False):
    """Be the parent that gets killed: start one daemonic child per entry of ``guards``
    (each sleeps ``seconds`` under its guard, see ``_guard``), wait until all are set up,
    report ``{"parent": pid, "children": [pid, ...]}`` (on the ``report`` queue, else as one
    JSON line on stdout), then wait for them (or, with ``linger``, sleep that long and exit
    normally). ``new_session`` calls setsid() first, so that os.killpg(our pid) reaches every
    orphan later. ``seconds`` bounds how long a forgotten orphan can outlive the demo.
    """
    import json
    import multiprocessing
    import time

    if new_session:
        os.setsid()

    if any(g and "pdeathsig" in g for g in guards):
        import torch.multiprocessing  # noqa: F401 - once here; fork children inherit it
    ctx = multiprocessing.get_context(method)
    ready = [ctx.Event() for _ in guards]
    kids = [ctx.Process(target=guarded_sleep, args=(seconds, g, r), daemon=True)
            for g, r in zip(guards, ready, strict=True)]
    for k in kids:
        k.start()
    for r in ready:
        r.wait(120)
    info = {"parent": os.getpid(), "children": [k.pid for k in kids]}
    if report is not None:
        report.put(info)
    else:
        print(json.dumps(info), flush=True)
    if linger is not None:
        time.sleep(linger)
        return  # normal exit: multiprocessing's atexit handler terminates daemonic children
    try:
        for k in kids:
            k.join()
    except KeyboardInterrupt:
        return  # SIGINT: exit as an uncaught KeyboardInterrupt would, minus the traceback


def fail_in_rank(i: int, rank: int, how: str):
    """A torch.multiprocessing.spawn worker: rank ``rank`` fails, the others sleep (and are
    stopped by the parent's join). ``how``: "raise" (an exception with a message) or a
    signal name such as "SIGKILL" (the process kills itself with it).
    """
    import signal
    import time

    if i != rank:
        time.sleep(60)
        return
    if how == "raise":
        raise ValueError(f"rank {i} could not read its shard")
    os.kill(os.getpid(), getattr(signal, how))

# --- notebooks 06 (Hogwild training) and 07 (beyond one machine) ---------------------------


def hogwild_step_and_watch(rank: int, model, x, y, lr: float, stepped, results):
    """Rank 0 takes one ``optimizer.step()`` on the batch (x, y) of the *shared* model and
    sets ``stepped``; every other rank waits for ``stepped``. Each then reports its pid, what
    identifies the memory behind each parameter (``parameter_report``) and the parameter
    values it sees: if the parameters are shared, all of them report rank 0's update.
    """
    import torch
    import torch.nn.functional as F

    from shmlab.examples.evidence import parameter_report

    torch.set_num_threads(1)
    if rank == 0:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)  # private to this process
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()  # the gradient is private to this process ...
        optimizer.step()  # ... the update goes into shared memory
        stepped.set()
    elif not stepped.wait(120):
        raise TimeoutError("rank 0 never stepped")
    results.put({
        "rank": rank, "pid": os.getpid(), "report": parameter_report(model),
        "values": {n: p.detach().numpy().copy() for n, p in model.named_parameters()},
    })


def count_up(counter, n: int, lock, barrier, results):
    """The lost-update race. ``counter`` is a shared tensor (torch or shmlab) of 2 integers.
    Phase 1: ``n`` times ``c[0] += 1`` with no lock. Phase 2: ``n`` times ``c[1] += 1``
    holding ``lock``. The barrier starts both phases in every process at once, so they overlap.
    """
    import time

    c = counter.numpy().reshape(-1)  # a zero-copy view of the shared memory
    barrier.wait(120)
    t0 = time.perf_counter()
    for _ in range(n):
        c[0] += 1  # read, add, write back: another process may write in between
    t1 = time.perf_counter()
    barrier.wait(120)
    t2 = time.perf_counter()
    for _ in range(n):
        with lock:  # the same three steps, now one process at a time
            c[1] += 1
    results.put({"pid": os.getpid(), "unlocked_s": t1 - t0,
                 "locked_s": time.perf_counter() - t2})


def sparse_lstsq_sgd(rank: int, w, cols, vals, y, lr: float, steps: int, seed: int,
                     go, results, record_every: int = 50):
    """Hogwild SGD with numpy on a shared ``shmlab.Tensor`` (or torch tensor) ``w``.

    The problem: minimise mean_i (x_i . w - y_i)^2 / 2, where row i of X is sparse: its
    nonzeros are ``cols[i]`` with values ``vals[i]`` (both (n, k) arrays, shared too). Each
    step takes one random row and updates only its k coordinates of ``w``, in place, with no
    lock: the sparse-update setting in which Hogwild's races rarely collide. ``go`` is an
    Event or a Barrier that starts every process at once. Reports the
    squared error seen every ``record_every`` steps (on a fixed probe of rows).
    """
    import time

    import numpy as np

    wv = w.numpy()  # the shared weight vector: every process writes into it
    C, V, Y = cols.numpy(), vals.numpy(), y.numpy()
    n = len(Y)
    rng = np.random.default_rng(seed + rank)
    probe = np.random.default_rng(seed).integers(0, n, 256)
    if go.wait(120) is False:  # an Event (False on timeout) or a Barrier (raises)
        raise TimeoutError("no go signal")
    curve, t0 = [], time.monotonic()
    for step in range(steps):
        i = rng.integers(n)
        c, v = C[i], V[i]
        r = v @ wv[c] - Y[i]  # residual of this row, reading the shared weights
        wv[c] -= lr * r * v  # write back only k coordinates: a sparse update
        if step % record_every == 0:
            err = (np.einsum("ij,ij->i", V[probe], wv[C[probe]]) - Y[probe]) ** 2
            curve.append((time.monotonic() - t0, step, float(err.mean() / 2)))
    results.put({"rank": rank, "pid": os.getpid(), "steps": steps, "curve": curve,
                 "time": time.monotonic() - t0})


def ddp_replica(rank: int, world: int, init_method: str, steps: int, batch: int, results):
    """A DDP rank that reports what it saw: its own batch labels, its parameters after DDP's
    start-up broadcast (each rank builds its model from a *different* seed), its local and
    all-reduced gradient, and its parameters after ``steps`` synchronous steps.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shmlab.examples.data import load_digits
    from shmlab.examples.model import make_model

    def flat(tensors):
        return torch.cat([t.detach().reshape(-1) for t in tensors]).numpy().copy()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        data = load_digits()
        local = make_model(seed=100 + rank)  # different on every rank, on purpose
        built = flat(local.parameters())
        model = DDP(local)  # broadcasts rank 0's parameters to every rank
        after_wrap = flat(model.parameters())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        labels, local_grad, reduced_grad = [], None, None
        for step in range(steps):
            start = (step * world + rank) * batch  # each rank its own, disjoint batch
            x, y = data.x_train[start:start + batch], data.y_train[start:start + batch]
            labels.append(y.tolist())
            optimizer.zero_grad()
            if step == 0:  # once, compute the gradient without DDP's all-reduce to compare
                with model.no_sync():
                    F.cross_entropy(model(x), y).backward()
                local_grad = flat(p.grad for p in model.parameters())
                optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()  # all-reduce (average) during backward
            if step == 0:
                reduced_grad = flat(p.grad for p in model.parameters())
            optimizer.step()
        results.put({"rank": rank, "pid": os.getpid(), "built": built, "after_wrap": after_wrap,
                     "labels": labels, "local_grad": local_grad, "reduced_grad": reduced_grad,
                     "final": flat(model.parameters())})
    finally:
        dist.destroy_process_group()


def collate_and_report(samples):
    """A DataLoader ``collate_fn`` that also says who collated the batch: the worker's pid and
    the sharing strategy *its* torch.multiprocessing uses to send the batch to the parent."""
    import torch.multiprocessing
    from torch.utils.data import default_collate

    x, y = default_collate(samples)
    return x, y, {"pid": os.getpid(), "strategy": torch.multiprocessing.get_sharing_strategy()}
