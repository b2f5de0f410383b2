"""Watch a manager from outside: its event stream (WATCH) and one-off STATUS peeks.

Mirrors: nothing in torch/lib/libshm (torch_shm_manager has no events and no STATUS).

Both open connections of their own that never keep the manager alive (an observer is not a
client; see Note [Who keeps the manager alive] in daemon.py). ManagerClient, the connection
that does, is connection.py.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

from .connection import _connect, _gone
from .peer import ManagerError
from .protocol import MAX_STATUS_PAGE, STATUS_PAGE


def watch(handle: bytes, timeout: float | None = None) -> Iterator[dict]:
    """Subscribe now, then yield the manager's events (dicts) until it exits (end of file).

    An observer never keeps the manager alive. We send STATUS right after WATCH and wait for
    its answer, so when this returns no later event can be missed. `timeout` bounds each wait
    for an event (TimeoutError), so a widget or a test cannot hang on a quiet manager. The
    stream ends after the "exiting" event; one that ends without it means the manager died,
    or dropped us for falling 256 KiB behind (conns.py): watch() again to resubscribe.
    """
    sock = _connect(handle)
    reader = sock.makefile("rb")  # the fd really closes once both reader and sock are closed
    try:
        sock.sendall(b"WATCH\nSTATUS 0 0\n")  # the answer only marks "subscribed": no names
        early = []  # events that raced ahead of the STATUS answer
        for line in reader:
            if not line.startswith(b"{"):  # e.g. "ERR too many observers (64)"
                raise ManagerError(f"the manager refused WATCH: {line.decode(errors='replace')!r}")
            message = json.loads(line)
            if "event" not in message:
                break  # the STATUS answer: we are subscribed
            early.append(message)
        sock.settimeout(timeout)
    except ManagerError:
        reader.close()
        sock.close()
        raise
    except OSError as exc:
        reader.close()
        sock.close()
        raise _gone(handle, exc) from exc
    return _follow(sock, reader, early)


def _follow(sock: socket.socket, reader, early: list[dict]) -> Iterator[dict]:
    try:
        yield from early
        for line in reader:
            yield json.loads(line)
    finally:
        reader.close()
        sock.close()


def peek_status(handle: bytes, max_names: int = STATUS_PAGE) -> dict:
    """STATUS on a fresh connection that is closed at once: for probes and widgets, which
    must not keep a manager alive (see Note [Who keeps the manager alive] in daemon.py).
    One page: "count" says how many names there are, "segments" holds the first
    `max_names` of them (at most MAX_STATUS_PAGE); ManagerClient.status() pages through all."""
    sock = _connect(handle)
    try:
        sock.sendall(f"STATUS 0 {max(0, min(max_names, MAX_STATUS_PAGE))}\n".encode())
        with sock.makefile("rb") as reader:
            line = reader.readline()
    except OSError as exc:
        raise _gone(handle, exc) from exc
    finally:
        sock.close()
    if not line.startswith(b"{"):  # e.g. "ERR too many connections"
        raise ManagerError(f"the manager refused STATUS: {line.decode(errors='replace')!r}")
    return json.loads(line)
