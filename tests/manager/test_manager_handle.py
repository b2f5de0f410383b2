"""A manager handle from a pickle is a path: it must lead to a shmlab manager, or be refused.

A receiver connects to whatever socket path the sender's message names. Before sending
anything over it, shmlab checks that the path is a socket of our own user and that the
process listening there is a shmlab manager (SO_PEERCRED, then its command line), so a forged
handle can neither feed our REGISTER lines to an unrelated service nor pass for a manager
that reclaimed the segment.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest

from shmlab.manager.errors import ManagerError, NotAManagerError
from shmlab.multiprocessing import reductions
from shmlab.storage import UntypedStorage


class Service:
    """An unrelated UNIX-socket service of our own user that records what it is sent."""

    def __init__(self, path: str):
        self.path, self.received = path, b""
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen()
        self.server.settimeout(5)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(3)  # longer than the client's 1 s wait for a reply
            try:
                while chunk := conn.recv(4096):
                    self.received += chunk
            except OSError:
                pass

    def close(self) -> None:
        self.thread.join(10)
        self.server.close()


def rebuild(handle) -> BaseException:
    name = f"/shmlab_{os.getpid()}_1_2".encode()  # no such segment either
    with pytest.raises((ManagerError, FileNotFoundError, TypeError)) as info:
        reductions.rebuild_storage_filename(UntypedStorage, handle, name, 16)
    return info.value


@pytest.mark.timeout(60)
def test_an_unrelated_socket_receives_nothing_and_the_error_says_why(tmp_path):
    service = Service(str(tmp_path / "service.sock"))
    try:
        error = rebuild(service.path.encode())
    finally:
        service.close()
    assert b"REGISTER" not in service.received, service.received
    assert isinstance(error, NotAManagerError), repr(error)
    assert "not a shmlab manager" in str(error) and "reclaimed" not in str(error)


@pytest.mark.timeout(60)
def test_a_handle_that_is_not_a_socket_is_not_called_reclaimed(tmp_path):
    plain = tmp_path / "manager.sock"
    plain.write_text("")
    error = rebuild(str(plain).encode())
    assert isinstance(error, NotAManagerError), repr(error)
    assert "not a socket" in str(error) and "reclaimed" not in str(error)


@pytest.mark.timeout(60)
def test_a_handle_of_the_wrong_type_is_refused_as_such():
    error = rebuild("/tmp/x/manager.sock")  # str, not bytes
    assert isinstance(error, TypeError) and "reclaimed" not in str(error)
