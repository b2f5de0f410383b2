"""Two cleaners of /dev/shm side by side: Python's resource_tracker and torch_shm_manager.

Notebook 12, claims C12.24 - C12.26. ``launch()`` runs a fresh Python process (the root
of its own process family) that makes one segment of each kind and reports their names:

* ``psm_...``: a ``multiprocessing.shared_memory.SharedMemory``, which registers its name with
  the resource tracker (a process the creator starts on first use);
* ``torch_...``: a torch ``file_system`` tensor, registered with a ``torch_shm_manager``;
* ``shmlab_...``: the same with shmlab (its manager is ``python -m shmlab.manager``).

Then we SIGKILL the creator and time each file's disappearance (``watch_gone``). With
``family=True`` the creator forks a child, and the *child* makes the ``psm_`` segment: killing
the child alone is not enough for the tracker, which waits for EOF on its pipe, that is, for
every process holding the pipe's write end (the whole family).

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
import sys
import time

SIZE = 1 << 20  # bytes per segment


def _tracker_pid() -> int | None:
    from multiprocessing import resource_tracker

    return resource_tracker._resource_tracker._pid  # None until something registered


def _managed(lib: str) -> tuple[str, object]:
    """A file_system tensor of ``lib`` (its name in /dev/shm) and the tensor, kept alive."""
    from ..harness.holder import segment
    from ..harness.libs import load

    tlib, mp = load(lib)
    mp.set_sharing_strategy("file_system")
    t = tlib.zeros(SIZE // 4).share_memory_()
    return segment(t, "file_system")[1], t


def _psm() -> tuple[str, object]:
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(create=True, size=SIZE)  # registers with the tracker
    return shm.name, shm


def creator(family: bool = False) -> None:
    """The process we kill (run by ``launch``): import both libraries, wait for a line on
    stdin, make the segments, print one JSON line {"pid", "psm", "torch", "shmlab",
    "tracker before psm", "tracker", "managers", "child"}, then sleep until SIGKILLed (60 s at
    most, so a forgotten one ends by itself). Waiting first keeps the segments' lives short:
    they exist only while the experiment looks at them."""
    from ..harness.holder import child_managers
    from ..harness.libs import load

    load("torch"), load("shmlab")
    if not sys.stdin.readline():
        return  # our parent went away before it asked
    keep, report = [], {"pid": os.getpid(), "child": None}
    for lib in ("torch", "shmlab"):
        report[lib], t = _managed(lib)
        keep.append(t)
    report["tracker before psm"] = _tracker_pid()  # torch and shmlab started none
    if family:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()  # the root starts it: the child inherits the pipe
        r, w = os.pipe()
        if (pid := os.fork()) == 0:
            name, shm = _psm()
            os.write(w, name.encode())
            time.sleep(60)
            os._exit(0)
        report["child"], report["psm"] = pid, os.read(r, 100).decode()
    else:
        report["psm"], shm = _psm()
    report["tracker"], report["managers"] = _tracker_pid(), child_managers()
    print(json.dumps(report), flush=True)
    time.sleep(60)


def launch(family: bool = False) -> subprocess.Popen:
    """Start ``creator(family)`` in a new Python process, in a session of its own. It imports
    torch (seconds): start it early; ``report`` then has it make its segments."""
    code = f"from shmlab.lessons.trackers import creator; creator(family={family})"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


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


def kill(pid: int) -> float:
    """SIGKILL ``pid``; the time.monotonic() of the kill."""
    t = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    return t


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
