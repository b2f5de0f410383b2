"""Fixtures for the manager tests: real /dev/shm files to register, and a fresh client table.

Loaded as a plugin by conftest.py; nothing here is autouse.
"""

from __future__ import annotations

import os
import secrets

import pytest

from shmlab.manager import client as mc

GRACE = "0.3"  # seconds: managers started by the tests exit this long after their last client
SHM = "/dev/shm"


@pytest.fixture
def segment():
    """Make real /dev/shm files named like shmlab's (or any prefix); unlink survivors."""
    made: list[str] = []

    def make(prefix: str = "shmlab") -> str:
        name = f"{prefix}_{os.getpid()}_{secrets.randbelow(10**9)}_{len(made)}"
        fd = os.open(os.path.join(SHM, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.write(fd, bytes(64))  # a header's worth, like a real segment
        os.close(fd)
        made.append(name)
        return name

    yield make
    for name in made:
        try:
            os.unlink(os.path.join(SHM, name))
        except FileNotFoundError:
            pass


def exists(name: str) -> bool:
    return os.path.lexists(os.path.join(SHM, name))


@pytest.fixture
def fresh_client(monkeypatch):
    """The client module with an empty table and a short grace for managers it starts."""
    monkeypatch.setenv("SHMLAB_MANAGER_GRACE", GRACE)
    mc.reset()
    yield mc
    mc.reset()
