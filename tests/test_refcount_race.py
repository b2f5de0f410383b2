"""Refcount updates racing each other: threads of one process, and processes.

refcounted.py updates the header's count under an flock, either through the mapping a
holder already has (the fast path) or with pread/pwrite on a fresh fd. A lost update
shows as a final count other than the one expected; a missing lock fails these at once.
"""

from __future__ import annotations

import os
import threading

import pytest

from shmlab import _shm

N = 400  # updates per worker: enough to interleave many read-modify-writes


def _hammer(name: str, held, n: int = N) -> None:
    """n increments, then n decrements (never reaching 0: the creator holds one)."""
    for _ in range(n):
        _shm.incref(name, held)
    for _ in range(n):
        _shm.decref(name, held)
    for _ in range(n // 4):  # attach (+1 through a fresh mapping), release through it
        mapping = _shm.attach_refcounted(name, 8)
        _shm.incref(name, mapping)
        _shm.decref(name, mapping)
        _shm.decref(name, mapping)


@pytest.fixture
def segment():
    name = _shm.new_name()
    mapping = _shm.create_refcounted(name, 8)
    yield name, mapping
    if os.path.exists(f"{_shm.SHM_DIR}{name}"):
        os.unlink(f"{_shm.SHM_DIR}{name}")


def _counting_up_and_down(name, held, workers: int) -> None:
    peak = [0]

    def up_only():
        for _ in range(N):
            peak[0] = max(peak[0], _shm.incref(name, held))

    threads = [threading.Thread(target=up_only) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _shm.read_refcount(name) == 1 + workers * N  # no update lost
    for _ in range(workers * N):
        _shm.decref(name, held)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["held", "fd only", "mixed"])
def test_threads_lose_no_update(segment, path):
    name, mapping = segment
    helds = {"held": [mapping] * 4, "fd only": [None] * 4, "mixed": [mapping, None] * 2}[path]
    threads = [threading.Thread(target=_hammer, args=(name, h)) for h in helds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _shm.read_refcount(name) == 1
    _counting_up_and_down(name, helds[0], 4)
    assert _shm.read_refcount(name) == 1
    assert _shm.decref(name, mapping) == 0  # the creator is the last: the name goes
    assert not os.path.exists(f"{_shm.SHM_DIR}{name}")


@pytest.mark.timeout(120)
def test_processes_lose_no_update(segment):
    name, mapping = segment
    pids = []
    for i in range(3):  # fork children share the mapping (MAP_SHARED) and count through it
        pid = os.fork()
        if pid == 0:
            try:
                for _ in range(N):
                    _shm.incref(name, mapping if i != 1 else None)
                _hammer(name, mapping if i != 2 else None)
            finally:
                os._exit(0)
        pids.append(pid)
    _hammer(name, mapping)
    for pid in pids:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert _shm.read_refcount(name) == 1 + 3 * N  # every child's increments, none lost
    for _ in range(3 * N):
        _shm.decref(name, mapping)
    assert _shm.decref(name, mapping) == 0
    assert not os.path.exists(f"{_shm.SHM_DIR}{name}")


@pytest.mark.timeout(60)
def test_a_reused_name_is_not_ours_any_more(segment):
    name, mapping = segment
    os.unlink(f"{_shm.SHM_DIR}{name}")  # reclaimed (the manager, or by hand) ...
    other = _shm.create_refcounted(name, 8)  # ... and the name made again by someone else
    assert _shm.decref(name, mapping) == 0  # ours is gone: nothing released, nothing unlinked
    assert _shm.read_refcount(name) == 1
    with pytest.raises(FileNotFoundError):
        _shm.incref(name, mapping)
    assert _shm.decref(name, other) == 0
