"""Fixtures for the manager tests: real /dev/shm files to register, a fresh client table, and
manager daemons started by hand.

Loaded as a plugin by conftest.py; nothing here is autouse.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys

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


class Daemon:
    """`python -m shmlab.manager --grace GRACE *args`, read through its handshake line.

    With `hold`, a connection that never registers (`holder`, as a starter's) keeps it serving
    until wait(), so a slow moment of a loaded machine cannot run out the short grace first.
    """

    def __init__(self, *args: str, hold: bool = False):
        self.proc = subprocess.Popen([sys.executable, "-m", "shmlab.manager", "--grace", GRACE,
                                      *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.path = self.proc.stdout.readline().decode().strip()
        self.proc.stdout.close()
        self.dir = os.path.dirname(self.path)
        assert self.path.endswith("/manager.sock"), self.path
        self.holder = None
        if hold:
            self.holder = socket.socket(socket.AF_UNIX)
            self.holder.connect(self.path)

    def log(self) -> list[dict]:
        with open(os.path.join(self.dir, "events.jsonl")) as f:
            return [json.loads(line) for line in f]

    def ask(self, line: bytes) -> bytes:
        """One request on a connection of its own; its first answer."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(self.path)
            s.sendall(line)
            return s.recv(65536)

    def wait(self, timeout: float = 10) -> tuple[int, str]:
        """Let it go (the holder closes) and wait for its exit: (exit status, its stderr)."""
        if self.holder is not None:
            self.holder.close()
        rc = self.proc.wait(timeout)
        return rc, self.proc.stderr.read().decode()

    def stop(self) -> None:
        if self.holder is not None:
            self.holder.close()
        if self.proc.poll() is None:  # a failed test: do not wait for a grace that never comes
            self.proc.kill()
        self.proc.wait(10)
        self.proc.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)  # only left behind by a killed manager


@pytest.fixture
def manager_daemon():
    """Start Daemons (`manager_daemon(*args, hold=...)`); each is stopped and reaped after."""
    started: list[Daemon] = []

    def start(*args: str, hold: bool = False) -> Daemon:
        started.append(Daemon(*args, hold=hold))
        return started[-1]

    yield start
    for d in started:
        d.stop()
