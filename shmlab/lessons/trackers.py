"""Two cleaners of /dev/shm side by side: Python's resource_tracker and torch_shm_manager.

Notebook 12, claims C12.24 - C12.26. The notebook writes and starts its creator
(``nb12_creator.py``: a fresh Python process, the root of its own process family) that makes
one segment of each kind and reports their names:

* ``psm_...``: a ``multiprocessing.shared_memory.SharedMemory``, which registers its name with
  the resource tracker (a process the creator starts on first use);
* ``torch_...``: a torch ``file_system`` tensor, registered with a ``torch_shm_manager``;
* ``shmlab_...``: the same with shmlab (its manager is ``python -m shmlab.manager``).

Then it SIGKILLs the creator and times each file's disappearance (``watch_gone``). The *child*
of the creator makes the ``psm_`` segment: killing the child alone is not enough for the
tracker, which waits for EOF on its pipe, that is, for every process holding the pipe's write
end (the whole family). ``report`` and ``finish`` talk to the creator; nothing here makes a
segment.

Note [Two triggers]
CPython 3.11 multiprocessing/resource_tracker.py: ``main(fd)`` reads REGISTER/UNREGISTER lines
from a pipe whose write end every process of the family inherits; the ``finally:`` after the
loop runs at EOF, warns "resource_tracker: There appear to be N leaked shared_memory objects to
clean up at shutdown" and ``shm_unlink``s each name still registered. No timer, no socket:
EOF is the only trigger. torch_shm_manager (torch/lib/libshm/manager.cpp) counts socket
connections instead, and unlinks what it was told about once no client has been connected for
SHUTDOWN_TIMEOUT = 2000 ms. torch never writes to the tracker's pipe: its segments are made in
C++ (MapAllocator.cpp, ``shm_open``), and nothing in torch/multiprocessing calls
``resource_tracker.register``, so a torch-only process never even starts a tracker.

Mirrors: CPython multiprocessing/resource_tracker.py and shared_memory.py; torch/lib/libshm.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time


def report(proc: subprocess.Popen) -> dict:
    """Tell the creator to make its segments; its report, once every segment exists."""
    proc.stdin.write("go\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError(f"the creator died before reporting: {proc.communicate()[1][-2000:]}")
    return json.loads(line)


def watch_gone(names, since: float, timeout: float = 15.0) -> dict:
    """{name: seconds from ``since`` (a time.monotonic()) until /dev/shm/<name> was gone}, None
    for a name still there after ``timeout``."""
    left, gone = set(names), {}
    while left and time.monotonic() - since < timeout:
        for name in [n for n in left if not os.path.exists(f"/dev/shm/{n}")]:
            gone[name] = round(time.monotonic() - since, 3)
            left.discard(name)
        time.sleep(0.005)
    return {**gone, **dict.fromkeys(left)}


def finish(proc: subprocess.Popen, timeout: float = 20.0) -> str:
    """Reap the creator and return everything its family wrote on stderr (the tracker's
    warning among it): the pipe closes once the tracker and the managers have exited. Safe to
    call again ("" then)."""
    if proc.stderr is None or proc.stderr.closed:
        return ""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its session: the family, not the daemons
        return proc.communicate()[1]
