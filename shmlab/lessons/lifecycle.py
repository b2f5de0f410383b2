"""Workers for the ends of a process's life: a parent that dies, children that must notice.

Mirrors: the guards torch.multiprocessing.spawn uses (``_prctl_pr_set_pdeathsig``) and
CPython's daemonic-children atexit handler, each shown as a worker notebooks 03 and 08 start.
"""

from __future__ import annotations

import gc
import os

from ..harness.libs import load, new_tensor


def parent_with_sleeping_child(lib: str, method: str | None = None, seconds: float = 60.0):
    """Be the *parent* in the abrupt-exit demo: start one daemonic child that sleeps for
    ``seconds``, print its pid, and wait. Run it as its own process and SIGKILL it:

        python -c "from shmlab.lessons.lifecycle import parent_with_sleeping_child as p; p('torch')"

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
