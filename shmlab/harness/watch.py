"""Watch processes from the outside: is it alive, when is it gone, who is its parent now.

Notebook 08 kills parents and looks at what happens to their children; these are the few
probes it needs, in one place. A zombie counts as dead: it only waits for its (new) parent to
reap it, and runs no code.
"""

from __future__ import annotations

import os
import signal
import time

import psutil


def alive(pid: int) -> bool:
    """Running (a zombie is dead: it only waits for its new parent to reap it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids, timeout: float) -> float | None:
    """Seconds until none of `pids` is alive, or None if some still are after `timeout`."""
    t0 = time.monotonic()
    while any(alive(pid) for pid in pids):
        if time.monotonic() - t0 > timeout:
            return None
        time.sleep(0.02)
    return round(time.monotonic() - t0, 2)


def parent_of(pid: int) -> str:
    """"<ppid> (<its name>)", or "gone"."""
    try:
        pp = psutil.Process(pid).ppid()
        return f"{pp} ({psutil.Process(pp).name()})"
    except psutil.NoSuchProcess:
        return "gone"


def wait_exit(p, timeout: float = 30.0) -> int | None:
    """Reap the Process `p`. Not p.join(timeout): that waits on a pipe its orphans inherited."""
    deadline = time.monotonic() + timeout
    while p.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return p.exitcode


def kill_group(p) -> None:
    """SIGKILL the whole process group that `p` leads (orphans included); reap `p`."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nobody left in the group
    wait_exit(p)
