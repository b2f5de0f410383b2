"""One traced handoff, for tests/observing/test_trace.py: ``python trace_scene.py LIB
STRATEGY METHOD SYSCALLS OUT`` puts one 1 MiB tensor on a Queue inside ``trace()``, a child
(METHOD: fork, spawn, forkserver) gets it, reads it, drops it and answers; the trace goes
to OUT as JSON. Run in a process of its own: a file_system sender stays a client of its
manager until it exits, which a test process must not become.
"""

import os
import sys

from shmlab.trace import trace


def receive(q, done, lib, strategy):
    mp = _mp(lib)
    mp.set_sharing_strategy(strategy)
    t = q.get()
    first = float(t[0]) if lib == "torch" else float(t.numpy()[0])  # no threads after fork
    del t
    done.put(first)


def _mp(lib):
    if lib == "torch":
        import torch.multiprocessing as mp
    else:
        import shmlab.multiprocessing as mp
    return mp


def _tensor(lib):
    if lib == "torch":
        import torch
        return torch.full((256 * 1024,), 7.0)
    import numpy as np

    import shmlab
    return shmlab.from_numpy(np.full(256 * 1024, 7.0, dtype=np.float32))


def main(lib, strategy, method, syscalls, out):
    mp = _mp(lib)
    mp.set_sharing_strategy(strategy)
    ctx = mp.get_context(method)
    t = _tensor(lib)
    syscalls = {"true": True, "false": False}.get(syscalls, syscalls)
    with trace(syscalls=syscalls) as tr:
        q, done = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=receive, args=(q, done, lib, strategy))
        p.start()
        q.put(t)
        assert done.get(timeout=60) == 7.0
        p.join(60)
        del t
        import gc
        gc.collect()
    tr.overhead["child_pid"] = p.pid
    tr.overhead["main_pid"] = os.getpid()
    with open(out, "w") as f:
        f.write(tr.to_json())


if __name__ == "__main__":
    main(*sys.argv[1:6])
