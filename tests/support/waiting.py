"""Waiting for other processes: poll until a condition holds; join children, or kill them."""

from __future__ import annotations

import time

import psutil


def wait_for(predicate, timeout: float = 10.0, what: str | None = None):
    """Return ``predicate()``'s first truthy value, polling every 20 ms; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"gave up after {timeout} s waiting for {what or predicate}")


def stop(*procs, timeout: float = 30.0) -> None:
    """Join each multiprocessing child; one still running after ``timeout`` s is killed."""
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()


def alive(pid: int) -> bool:
    """``pid`` runs: it exists and is not a zombie (a dead child nobody has reaped yet)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
